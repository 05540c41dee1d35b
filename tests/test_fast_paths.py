"""The shortcuts taken for speed answer what the general code answers.

* computation headers in XLA's one-line form are read by one regex (``parser._HEADER``);
  any other form goes through the general code: both read the same computations;
* attributes of fast-path lines are split on first use (``Instruction.attrs``): the same
  dict as the general parser's, and ``called_computations`` / ``names_computations`` agree;
* plain fused computations (``traffic._PlainFusion``) skip the footprint analysis: each
  parameter with a user is read in full, one without users not at all (hand counts below),
  and on every fused computation of the corpus the shortcut and ``_FusionAnalysis`` agree;
* rows of opcodes that move and compute nothing are filled without the passes: the same
  traffic, flops and cost the passes give them.
"""

from __future__ import annotations

import re

import pytest

from jaxmove.hlo import HloParseError, parse_module
from jaxmove.hlo.ir import CALLED_COMPUTATION_ATTRS
from jaxmove.passes.cost import Cost
from jaxmove.passes.flops import instruction_flops
from jaxmove.passes.pipeline import _NOTHING_TO_COST, analyze_module
from jaxmove.passes.traffic import _FusionAnalysis, _PlainFusion, instruction_traffic

from .conftest import corpus_files

_HEADER_BRACE = re.compile(r"^((?:ENTRY\s+)?%?\S+\s*\(.*\)\s*->\s*.*\S)(\s+\{\s*)$", re.M)


def _general_headers(text: str) -> str:
    """The same module with a comment before each header's '{': the one-line header regex
    declines it, so the general code reads every header (same lines and names expected)."""
    return _HEADER_BRACE.sub(r"\1 /* h */\2", text)


def _digest(module):
    return [(c.name, c.is_entry, c.line, c.root.name, [p.name for p in c.parameters],
             [(i.name, i.opcode, str(i.shape), i.operands, i.attrs, i.line, i.column,
               i.called_computations) for i in c.instructions])
            for c in module.computations.values()]


def test_header_fast_path_agrees_with_general_code(corpus_dir):
    checked = 0
    for f in corpus_files():
        text = f.read_text()
        general = _general_headers(text)
        if general == text:
            continue
        checked += 1
        assert _digest(parse_module(text)) == _digest(parse_module(general)), f.name
    assert checked > 0


def test_header_forms_the_regex_declines_still_parse():
    # comment inside a header, attributes after a signature, no signature at all
    text = """HloModule m
add /* c */ (x: f32[], y: f32[]) -> f32[] {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
%helper (p: f32[4]) -> f32[4], execution_thread="main" {
  p = f32[4] parameter(0)
  ROOT n = f32[4] negate(p)
}
ENTRY main {
  a = f32[4] parameter(0)
  c = f32[] constant(0)
  ROOT r = f32[] reduce(a, c), dimensions={0}, to_apply=add
}
"""
    m = parse_module(text)
    assert list(m.computations) == ["add", "helper", "main"] and m.entry.name == "main"
    assert (m.computations["add"].line, m.computations["helper"].line, m.entry.line) == (2, 7, 11)
    with pytest.raises(HloParseError, match="undefined operand 'z'"):
        parse_module(text.replace("reduce(a, c)", "reduce(a, z)"))


def test_broken_layout_before_body_is_still_an_error():
    # 'f32[]{' with no blank: the general code reads '{' as an unclosed layout (line 2)
    text = "HloModule m\nENTRY e (p: f32[]) -> f32[]{\n  ROOT p = f32[] parameter(0)\n}\n"
    with pytest.raises(HloParseError, match="layout") as ei:
        parse_module(text, "t.hlo")
    assert ei.value.line == 2


def test_lazily_split_attributes_match_the_general_parser(corpus_dir):
    for f in corpus_files():
        text = f.read_text()
        fast = parse_module(text)
        # a comment after each instruction line sends it through the general parser
        slow = parse_module("\n".join(ln + " // c" if " = " in ln else ln for ln in text.split("\n")))
        for c in fast.computations.values():
            for i in c.instructions:
                j = slow.computations[c.name].by_name[i.name]
                assert i.called_computations == j.called_computations, (f.name, i.name)
                assert i.names_computations() == bool(set(j.attrs) & set(CALLED_COMPUTATION_ATTRS))
                assert i.attrs == j.attrs, (f.name, i.name)


def _fusion_reads(text: str) -> dict[int, int]:
    a = analyze_module(parse_module(text))
    row = next(r for r in a.rows if r.instr.opcode == "fusion")
    return {acc.operand: acc.nbytes for acc in row.traffic.reads}


_ADD = """add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
"""


def test_plain_fusion_reads_used_parameters_in_full_and_unused_ones_not_at_all():
    # p0 f32[64] (256 B) and p1 bf16[32] (64 B) are used; p2 f32[128] (512 B) is not
    text = """HloModule t
fused {
  p0 = f32[64]{0} parameter(0)
  p1 = bf16[32]{0} parameter(1)
  p2 = f32[128]{0} parameter(2)
  c = f32[32]{0} convert(p1)
  x0 = f32[64]{0} exponential(p0)
  ROOT e = (f32[64]{0}, f32[32]{0}) tuple(x0, c)
}
ENTRY e {
  a = f32[64]{0} parameter(0)
  b = bf16[32]{0} parameter(1)
  d = f32[128]{0} parameter(2)
  ROOT f = (f32[64]{0}, f32[32]{0}) fusion(a, b, d), kind=kLoop, calls=fused
}
"""
    assert _PlainFusion.of(parse_module(text).computations["fused"]) is not None
    assert _fusion_reads(text) == {0: 64 * 4, 1: 32 * 2}


def test_dead_value_sends_the_fusion_to_the_footprint_analysis():
    # p1 only feeds a convert nobody uses: p1 is not read at all (0 bytes); nor through a
    # reduce nobody uses (a reduce needs of its operand the share of its result that is read:
    # none); through a live reduce, in full (64 bytes)
    text = """HloModule t
fused {
  p0 = f32[64]{0} parameter(0)
  p1 = bf16[32]{0} parameter(1)
  c = f32[32]{0} convert(p1)
  ROOT e = f32[64]{0} exponential(p0)
}
ENTRY e {
  a = f32[64]{0} parameter(0)
  b = bf16[32]{0} parameter(1)
  ROOT f = f32[64]{0} fusion(a, b), kind=kLoop, calls=fused
}
"""
    assert _PlainFusion.of(parse_module(text).computations["fused"]) is None
    assert _fusion_reads(text) == {0: 64 * 4}
    reduced = text.replace("HloModule t\n", "HloModule t\n" + _ADD, 1).replace(
        "  ROOT e = f32[64]{0} exponential(p0)",
        "  z = f32[] constant(0)\n  r = f32[] reduce(c, z), dimensions={0}, to_apply=add\n"
        "  ROOT e = f32[64]{0} exponential(p0)")
    assert _PlainFusion.of(parse_module(reduced).computations["fused"]) is None  # r is dead
    assert _fusion_reads(reduced) == {0: 64 * 4}
    live = reduced.replace("  ROOT e = f32[64]{0} exponential(p0)",
                           "  e = f32[64]{0} exponential(p0)\n  ROOT t = (f32[64]{0}, f32[]) tuple(e, r)")
    live = live.replace("ROOT f = f32[64]{0} fusion", "ROOT f = (f32[64]{0}, f32[]) fusion")
    assert _fusion_reads(live) == {0: 64 * 4, 1: 32 * 2}


def test_plain_shortcut_agrees_with_footprint_analysis_on_the_corpus(corpus_dir):
    plain = 0
    for f in corpus_files():
        m = parse_module(f.read_text())
        for c in m.computations.values():
            pf = _PlainFusion.of(c)
            if pf is None:
                continue
            plain += 1
            fa = _FusionAnalysis(m, c)
            assert [pf.demand_elems(p) for p in c.parameters] == \
                   [fa.demand_elems(p) for p in c.parameters], (f.name, c.name)
            consts = [i for i in c.instructions if i.opcode == "constant"]  # (read by the fusion)
            assert [pf.demand_elems(i) for i in consts] == [fa.demand_elems(i) for i in consts], \
                (f.name, c.name)
            assert [i for i, _ in pf.root_leaves] == [i for i, _ in fa.root_leaves]
            assert not fa.inplace
    assert plain > 0


def test_rows_filled_without_passes_are_what_the_passes_give(corpus_dir):
    seen = set()
    for f in corpus_files():
        m = parse_module(f.read_text())
        for r in analyze_module(m).rows:
            if r.instr.opcode not in _NOTHING_TO_COST:
                continue
            seen.add(r.instr.opcode)
            comp = m.computations[r.computation]
            t = instruction_traffic(r.instr, comp, m)
            fc = instruction_flops(r.instr, m)
            assert not t.reads and not t.writes and not t.unmodeled and not t.notes
            assert (fc.flops, fc.transcendentals, fc.unmodeled) == (0, 0, ())
            assert r.per_execution == Cost() and r.collective is None
    assert {"parameter", "get-tuple-element", "tuple"} <= seen
