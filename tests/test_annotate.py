"""Annotated HLO, attribution and aggregation (jaxmove annotate, analyze --by).

Expected figures are counted by hand from the HLO below (f32 = 4 bytes): they are not
read from jaxmove's output.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest

import jaxmove
from jaxmove.cli import main
from jaxmove.hlo import parse_module
from jaxmove.report.annotate import annotate
from jaxmove.report.attribution import aggregate, attribute, display_path, split_name_stack

from .conftest import corpus_file

HLO = """\
HloModule annotate_me, entry_computation_layout={(f32[8,16]{1,0}, f32[16,4]{1,0})->f32[8,4]{1,0}}

%fused_dot (p0: f32[8,16], p1: f32[16,4]) -> f32[8,4] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,4]{1,0} parameter(1)
  ROOT %d = f32[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (p: (s32[], f32[64])) -> (s32[], f32[64]) {
  %p = (s32[], f32[64]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %v = f32[64]{0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %v1 = f32[64]{0} negate(%v), metadata={op_name="jit(f)/while/body/neg" source_file="/src/loop.py" source_line=7}
  ROOT %t = (s32[], f32[64]{0}) tuple(%i1, %v1)
}

%cond (p: (s32[], f32[64])) -> pred[] {
  %p = (s32[], f32[64]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[8,16], w: f32[16,4], s: f32[64]) -> (f32[8,4], f32[64]) {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[16,4]{1,0} parameter(1)
  %s = f32[64]{0} parameter(2)
  %neg = f32[8,16]{1,0} negate(%x), metadata={op_name="jit(f)/Dense_0/neg" source_file="/src/model.py" source_line=12}
  %fus = f32[8,4]{1,0} fusion(%neg,
      %w), kind=kOutput, calls=%fused_dot,
      metadata={op_name="jit(f)/transpose(jvp(Block_0))/attn/dot_general" source_file="/src/model.py" source_line=20}
  %zero = s32[] constant(0)
  %t0 = (s32[], f32[64]{0}) tuple(%zero, %s)
  %loop = (s32[], f32[64]{0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %res = f32[64]{0} get-tuple-element(%loop), index=1
  ROOT %out = (f32[8,4]{1,0}, f32[64]{0}) tuple(%fus, %res)
}
"""

_FIELD = re.compile(r'([a-z_]+)=("(?:[^"\\]|\\.)*"|\S+)')


def _fields(comment: str) -> dict[str, str]:
    return {k: (json.loads(v) if v.startswith('"') else v) for k, v in _FIELD.findall(comment)}


def _comments(text: str) -> dict[str, dict[str, str]]:
    """Instruction name -> annotation fields, read from the annotated text by position:
    a comment at the end of the instruction's line, or a ``// %name:`` line before it."""
    module = parse_module(text)
    lines = text.split("\n")
    out: dict[str, dict[str, str]] = {}
    for m in re.finditer(r"^\s*// %([\w.\-]+): (.*)$", text, re.M):
        out[m.group(1)] = _fields(m.group(2))
    for instr in module.instructions():
        line = lines[instr.line - 1]
        if instr.name not in out and "  // " in line:
            out[instr.name] = _fields(line.split("  // ", 1)[1])
    return out


def _same_instructions(a, b) -> None:
    assert list(a.computations) == list(b.computations)
    for name, ca in a.computations.items():
        cb = b.computations[name]
        assert [(i.name, i.opcode, str(i.shape), i.operands, i.attrs, i.literal, i.is_root) for i in ca] == \
               [(i.name, i.opcode, str(i.shape), i.operands, i.attrs, i.literal, i.is_root) for i in cb]


@pytest.fixture(scope="module")
def hand_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("hlo") / "annotate_me.hlo"
    path.write_text(HLO)
    return jaxmove.analyze(str(path)), path


def test_annotated_text_parses_to_the_same_instructions(hand_report):
    report, path = hand_report
    text = annotate(report)  # reads the hlo: source file
    _same_instructions(parse_module(HLO), parse_module(text))


def test_annotation_figures_hand_counted(hand_report):
    report, _ = hand_report
    c = _comments(annotate(report, HLO))
    # negate f32[8,16]: reads 512 B, writes 512 B, 128 flops (one per element).
    assert c["neg"]["x"] == "1" and c["neg"]["hbm_read_bytes"] == "512"
    assert c["neg"]["hbm_write_bytes"] == "512" and c["neg"]["flops"] == "128"
    assert c["neg"]["src"] == "/src/model.py:12" and c["neg"]["op_name"] == "jit(f)/Dense_0/neg"
    # dot fusion [8,16]x[16,4]: reads 512 + 256 B, writes 8*4*4 = 128 B, 2*8*4*16 = 1024 flops.
    # It spans three lines, so its comment is a line of its own before it.
    assert re.search(r"^  // %fus: ", annotate(report, HLO), re.M)
    assert c["fus"]["hbm_read_bytes"] == "768" and c["fus"]["hbm_write_bytes"] == "128"
    assert c["fus"]["flops"] == "1024" and c["fus"]["role"] != ""
    # while body negate f32[64], 5 trips: 5 x 256 B read and written, 5 x 64 flops.
    assert c["v1"]["x"] == "5"
    assert c["v1"]["hbm_read_bytes"] == "1280" and c["v1"]["hbm_write_bytes"] == "1280"
    assert c["v1"]["flops"] == "320"
    # the condition's compare runs n + 1 = 6 times
    assert c["lt"]["x"] == "6"
    # fused computations' instructions have no row and get no comment
    assert "d" not in c and "p0" not in c


def test_attribution_module_path_and_source(hand_report):
    report, _ = hand_report
    fus = report.module.entry.by_name["fus"]
    att = attribute(report.module, fus)
    assert att.module_path == "Block_0/attn"        # jit(f) dropped, transpose(jvp(.)) unwrapped
    assert att.name_stack == "jit(f)/transpose(jvp(Block_0))/attn"
    assert att.primitive == "dot_general"
    assert att.source_key == "/src/model.py:20"
    assert split_name_stack("a/b(c/d)/e") == ["a", "b(c/d)", "e"]


def test_aggregate_by_source_and_module(hand_report):
    report, _ = hand_report
    by_src = {g.key: g for g in aggregate(report, "source")}
    # /src/model.py: neg (512+512) + fus (768+128); the loop line: 1280 + 1280
    assert by_src["/src/model.py:12"].total.hbm_bytes == 1024
    assert by_src["/src/model.py:20"].total.hbm_bytes == 896
    assert by_src["/src/loop.py:7"].total.hbm_bytes == 2560
    by_mod = {g.key: g for g in aggregate(report, "module")}
    assert by_mod["Block_0/attn"].flops == 1024
    assert by_mod["Dense_0"].flops == 128
    assert by_mod["while/body"].flops == 320
    by_kind = {g.key: g for g in aggregate(report, "fusion_kind")}
    assert by_kind["kOutput"].instructions == 1


def test_stack_frame_source(corpus_dir):
    path = corpus_file("jax__source_mapper_test__HLO_EXAMPLE_stackframes.hlo")
    module = jaxmove.parse_file(path)
    att = attribute(module, module.entry.root)
    # FileLocations 1: file 1 "<embedded module>", function 1 "main", line 153 (read from the file)
    assert (att.source.file, att.source.line, att.source.function) == ("<embedded module>", 153, "main")


@pytest.fixture(scope="module")
def gpt2_decode(gpt2_small_decode):
    program = gpt2_small_decode               # jaxmove.resolve_program("gpt2-small-decode") (conftest)
    return program, jaxmove.analyze(program)


def test_gpt2_decode_annotation_parses_and_equals_json(gpt2_decode):
    program, report = gpt2_decode
    text = annotate(report, program.hlo_text)
    _same_instructions(parse_module(program.hlo_text), parse_module(text))
    comments = _comments(text)
    rows = report.to_json()["instructions"]
    assert len(rows) > 100
    for row in rows:
        c = comments[row["name"]]
        assert int(c["x"]) == row["multiplicity"], row["name"]
        assert int(c["flops"]) == row["flops"], row["name"]
        assert int(c["hbm_read_bytes"]) == row["hbm_read_bytes"], row["name"]
        assert int(c["hbm_write_bytes"]) == row["hbm_write_bytes"], row["name"]
        assert c["role"] == row["role"], row["name"]
        paths = dict(p.split(":") for p in c["paths"].split(",")) if "paths" in c else {}
        assert {k: int(v) for k, v in paths.items()} == row["by_path"], row["name"]
        if row.get("source"):  # annotate shows the path as the tables do (display_path)
            file, _, line = row["source"].rpartition(":")
            assert c["src"] == f"{display_path(file)}:{line}", row["name"]


def test_cli_annotate_and_by(tmp_path, hand_report):
    _, path = hand_report
    out = tmp_path / "a.hlo"
    assert main(["annotate", str(path), "-o", str(out)]) == 0
    _same_instructions(parse_module(HLO), parse_module(out.read_text()))
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["analyze", str(path), "--by", "opcode", "--json"]) == 0
    d = json.loads(buf.getvalue())
    # the groups partition the JSON instructions: sums per opcode match, computed here
    want: dict[str, list[int]] = {}
    for r in d["instructions"]:
        s = want.setdefault(r["opcode"], [0, 0, 0, 0])
        for k, f in enumerate(("flops", "hbm_read_bytes", "hbm_write_bytes")):
            s[k] += r[f]
        s[3] += 1
    got = {g["key"]: [g["flops"], g["hbm_read_bytes"], g["hbm_write_bytes"], g["instructions"]]
           for g in d["by_opcode"]}
    assert got == want
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["analyze", str(path), "--by", "role", "--json"]) == 0
    d = json.loads(buf.getvalue())
    assert set(d["by_role"]["activations"]) >= {"read_bytes", "write_bytes", "instructions"}


def test_cli_by_table(capsys, hand_report):
    _, path = hand_report
    assert main(["analyze", str(path), "--by", "source"]) == 0
    out = capsys.readouterr().out
    assert "/src/loop.py:7" in out and "by source" in out


def test_annotate_needs_text_for_captured_programs(gpt2_decode):
    _, report = gpt2_decode
    with pytest.raises(ValueError, match="HLO text"):
        annotate(report)


def test_quiet_opcodes_match_report():
    from jaxmove.report import report as rep
    from jaxmove.report.columns import QUIET_OPCODES
    assert QUIET_OPCODES is rep._QUIET
    assert Path(rep.__file__).is_file()


def test_time_columns_equal_json():
    program = jaxmove.resolve_program("gpt-tiny-decode")
    report = jaxmove.analyze(program, hardware="h100-sxm")
    comments = _comments(annotate(report, program.hlo_text))
    for row in report.to_json()["instructions"]:
        c = comments[row["name"]]
        assert float(c["est_time_s"]) == row["est_time_s"], row["name"]
        assert c["bound"] == row["bound"], row["name"]
        if row["arithmetic_intensity"] is not None:
            assert float(c["intensity"]) == row["arithmetic_intensity"], row["name"]


INLINE = """\
HloModule inline_operand

ENTRY main {
  p0 = f32[256,256] parameter(0)
  ROOT r = f16[256,256] convert(f32[256,256] negate(p0))
}
"""


def test_unnamed_inline_operand_is_annotated(tmp_path):
    """An unnamed instruction written inline as an operand (XLA's parser accepts it; jaxmove
    names it ``negate.anon1``) gets a comment line of its own; annotate was an internal error."""
    path = tmp_path / "inline.hlo"
    path.write_text(INLINE)
    text = annotate(jaxmove.analyze(str(path)))
    _same_instructions(parse_module(INLINE), parse_module(text))
    anon = re.search(r"^  // %negate\.anon1 \(the unnamed negate written inline on the next line\): (.*)$",
                     text, re.M)
    assert anon is not None, text
    f = _fields(anon.group(1))
    # negate f32[256,256]: 256*256*4 = 262144 B read and written, one flop per element
    assert f["hbm_read_bytes"] == "262144" and f["hbm_write_bytes"] == "262144" and f["flops"] == "65536"
    r = _comments(text)["r"]
    # convert to f16: reads 262144 B, writes 256*256*2 = 131072 B
    assert r["hbm_read_bytes"] == "262144" and r["hbm_write_bytes"] == "131072"
    out = tmp_path / "out.hlo"
    assert main(["annotate", str(path), "-o", str(out)]) == 0
    assert parse_module(out.read_text()).entry.root.name == "r"


@pytest.mark.parametrize("text", [HLO, INLINE], ids=["hand", "inline"])
def test_annotating_annotated_text_replaces_its_comments(tmp_path, text):
    """annotate of its own output gives the same text (its header and comments are replaced;
    a user trial saw a second comment stacked on every line)."""
    first = tmp_path / "a1.hlo"
    src = tmp_path / "src.hlo"
    src.write_text(text)
    first.write_text(annotate(jaxmove.analyze(str(src))))
    second = annotate(jaxmove.analyze(str(first)))
    assert second == first.read_text()
    assert second.count("// jaxmove annotate") == 1
