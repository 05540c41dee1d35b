"""Computations written in place (``calls={ ... }``, ``to_apply={ ... }``), as XLA's parser
accepts them (hlo_parser.cc reads a '{' after a kHloComputation attribute as a nested
instruction list; hlo_cost_analysis_test.cc ``NestedFusionFeedsMultipleUsers`` is written so).

Each is parsed as a computation of its own, named ``INSTRUCTION.KEY``; the checks compare with
the same module written with named computations, and with bytes counted by hand.
"""

from __future__ import annotations

import pytest

from jaxmove.hlo import HloParseError, parse_module
from jaxmove.passes.pipeline import analyze_module

T = "bf16[64,16,512,512]{2,3,1,0:T(8,128)(2,1)}"
S = "bf16[]{:T(256)}"

# hlo_cost_analysis_test.cc, FusionCostAnalysis.NestedFusionFeedsMultipleUsers (verbatim)
XLA_TEXT = f"""
HloModule temp, is_scheduled=true

fused_computation.1 {{
  tmp_0 = {T} parameter(0)
  tmp_1 = {T} fusion({T} tmp_0), kind=kLoop, calls=
  {{
    tmp_0 = {T} parameter(0)
    ROOT tmp_4 = {T} add({T} tmp_0, {T} tmp_0)
  }}
  tmp_2 = {S} constant(0)
  tmp_3 = {T} reduce-window({T} tmp_1, {S} tmp_2), window={{size=1x1x1x1023 pad=0_0x0_0x0_0x511_511}}, to_apply=
  {{
    tmp_0 = {S} parameter(0)
    tmp_1 = {S} parameter(1)
    ROOT tmp_2 = {S} add({S} tmp_0, {S} tmp_1)
  }}
  ROOT tmp_4 = {T} divide({T} tmp_0, {T} tmp_3)
}}

ENTRY temp {{
  tmp_0 = {T} parameter(0)
  ROOT result = {T} fusion(tmp_0), kind=kLoop, calls=fused_computation.1
}}
"""

NAMED_TEXT = f"""
HloModule temp, is_scheduled=true

inner {{
  tmp_0 = {T} parameter(0)
  ROOT tmp_4 = {T} add(tmp_0, tmp_0)
}}

sum {{
  tmp_0 = {S} parameter(0)
  tmp_1 = {S} parameter(1)
  ROOT tmp_2 = {S} add(tmp_0, tmp_1)
}}

fused_computation.1 {{
  tmp_0 = {T} parameter(0)
  tmp_1 = {T} fusion(tmp_0), kind=kLoop, calls=inner
  tmp_2 = {S} constant(0)
  tmp_3 = {T} reduce-window(tmp_1, tmp_2), window={{size=1x1x1x1023 pad=0_0x0_0x0_0x511_511}}, to_apply=sum
  ROOT tmp_4 = {T} divide(tmp_0, tmp_3)
}}

ENTRY temp {{
  tmp_0 = {T} parameter(0)
  ROOT result = {T} fusion(tmp_0), kind=kLoop, calls=fused_computation.1
}}
"""


def test_xla_text_parses_into_named_computations():
    m = parse_module(XLA_TEXT, "nested.hlo")
    assert list(m.computations) == ["tmp_1.calls", "tmp_3.to_apply", "fused_computation.1", "temp"]
    assert m.entry.name == "temp"
    fc = m.computations["fused_computation.1"]
    assert fc.by_name["tmp_1"].called_computations == ("tmp_1.calls",)
    assert fc.by_name["tmp_3"].called_computations == ("tmp_3.to_apply",)
    inner = m.computations["tmp_1.calls"]
    assert [i.opcode for i in inner.instructions] == ["parameter", "add"]
    assert inner.root.name == "tmp_4" and inner.line == 7
    assert [i.opcode for i in m.computations["tmp_3.to_apply"].instructions] == \
        ["parameter", "parameter", "add"]
    # the instruction after the inline body is still in fused_computation.1
    assert fc.by_name["tmp_2"].opcode == "constant" and fc.root.opcode == "divide"


def test_same_numbers_as_named_computations():
    # 2^28 bf16 elements (64*16*512*512; T(8,128) divides 512 x 512: no padding) = 2^29 bytes;
    # the fusion reads its parameter once and writes its result once. (XLA's test expects
    # 1,610,612,736 = 3 x 2^29: it charges the parameter once per use.)
    a = analyze_module(parse_module(XLA_TEXT))
    b = analyze_module(parse_module(NAMED_TEXT))
    ra = [r for r in a.rows if r.instr.name == "result"][0]
    rb = [r for r in b.rows if r.instr.name == "result"][0]
    assert ra.total == rb.total
    assert ra.total.hbm_read_bytes == 1 << 29 and ra.total.hbm_write_bytes == 1 << 29


def test_one_line_inline_computation_is_not_taken_by_the_fast_path():
    text = ("HloModule m\n\nENTRY e {\n  p = f32[8]{0} parameter(0)\n"
            "  ROOT r = f32[8]{0} fusion(p), kind=kLoop, calls={ x = f32[8]{0} parameter(0) "
            "ROOT n = f32[8]{0} negate(x) }\n}\n")
    m = parse_module(text)
    assert m.entry.root.called_computations == ("r.calls",)
    assert [i.opcode for i in m.computations["r.calls"].instructions] == ["parameter", "negate"]
    row = [r for r in analyze_module(m).rows if r.instr.name == "r"][0]
    assert row.total.hbm_read_bytes == 32 and row.total.hbm_write_bytes == 32 and row.total.flops == 8


def test_nested_inline_computations_and_unique_names():
    text = """HloModule m
r.calls {
  q = f32[4] parameter(0)
  ROOT c = f32[4] copy(q)
}
ENTRY e {
  p = f32[4] parameter(0)
  r = f32[4] fusion(p), kind=kLoop, calls={
    a = f32[4] parameter(0)
    ROOT f = f32[4] fusion(a), kind=kLoop, calls={
      b = f32[4] parameter(0)
      ROOT n = f32[4] negate(b)
    }
  }
  ROOT s = f32[4] fusion(r), kind=kLoop, calls=r.calls
}
"""
    m = parse_module(text)
    # 'r.calls' is taken by the named computation above: the inline one becomes r.calls.1
    assert m.entry.by_name["r"].called_computations == ("r.calls.1",)
    assert m.computations["r.calls.1"].root.called_computations == ("f.calls",)
    assert m.computations["f.calls"].root.opcode == "negate"
    assert m.entry.by_name["s"].called_computations == ("r.calls",)


@pytest.mark.parametrize("value, what", [
    ("{}", "has no instructions"),
    ("{\n    x = f32[4] parameter(0)\n", "expected '}' closing computation"),
    ("{ x = f32[4] parameter(0) ROOT y = f32[4] negate(x) ROOT z = f32[4] negate(x) }",
     "second ROOT"),
])
def test_bad_inline_computations_are_positioned_errors(value, what):
    text = ("HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n"
            f"  ROOT r = f32[4] fusion(p), kind=kLoop, calls={value}\n}}\n")
    with pytest.raises(HloParseError, match=what) as e:
        parse_module(text, "bad.hlo")
    assert e.value.line >= 4


def test_fast_path_knows_the_same_keys():
    # the fast path's regex leaves exactly these keys' '{' values to the general code
    import re
    from jaxmove.hlo import fastpath
    from jaxmove.hlo.parser import _INLINE_KEYS
    names = re.match(r"\(\?:([a-z_|]+)\)", fastpath._F_INLINE).group(1).split("|")
    assert set(names) == _INLINE_KEYS
