"""Result shapes of the data-movement opcodes checked as XLA's shape inference does.

Found by a new user's review: HLO that XLA's verifier rejects was analysed with numbers taken
from the declared (wrong) result shape: a slice past its operand's end, a dynamic-slice whose
``dynamic_slice_sizes`` are not its shape, a dynamic-update-slice whose update is larger than
its buffer (1 KiB "written" into a 512 B buffer), a concatenation whose result is wider than
its operands (1.25 KiB written for 768 B of data), a broadcast or transpose whose dimensions
do not map, a device in two replica groups. Each case below is one hand-made module: the
wrong one is an error at the instruction's line and column, the corrected one parses and its
bytes are counted by hand from its shapes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import jaxmove
from jaxmove.hlo import HloParseError, parse_module


def _module(params: str, body: str, root_shape: str) -> str:
    """One entry computation: ``params`` as 'name: shape' pairs, then ``body`` lines."""
    lines = ["HloModule m", "", "%add (x: f32[], y: f32[]) -> f32[] {",
             "  %x = f32[] parameter(0)", "  %y = f32[] parameter(1)",
             "  ROOT %s = f32[] add(%x, %y)", "}", "",
             f"ENTRY %main ({params}) -> {root_shape} {{"]
    for k, p in enumerate(params.split(", ")):
        name, shape = p.split(": ")
        lines.append(f"  %{name} = {shape} parameter({k})")
    lines += ["  " + b for b in textwrap.dedent(body).strip().splitlines()]
    lines.append("}")
    return "\n".join(lines) + "\n"


ROOT_LINE = 11  # the body line after one parameter (the instruction under test) in _module's text

# (id, params, wrong body, corrected body, root shape, message part)
CASES = [
    ("slice_out_of_bounds", "a: f32[16,8]",
     "ROOT %s = f32[40,8]{1,0} slice(%a), slice={[0:40], [0:8]}",
     "ROOT %s = f32[4,8]{1,0} slice(%a), slice={[4:8], [0:8]}", "f32[4,8]",
     "range [0:40] of dimension 0 does not lie in [0:16]"),
    ("slice_result_mismatch", "a: f32[16,8]",
     "ROOT %s = f32[4,8]{1,0} slice(%a), slice={[0:8], [0:8]}",
     "ROOT %s = f32[4,8]{1,0} slice(%a), slice={[0:8:2], [0:8]}", "f32[4,8]",
     "gives dimensions [8,8]"),
    ("slice_rank", "a: f32[16,8]",
     "ROOT %s = f32[4]{0} slice(%a), slice={[0:4]}",
     "ROOT %s = f32[4,1]{1,0} slice(%a), slice={[0:4], [7:8]}", "f32[4,1]",
     "needs 2 ranges"),
    ("dynamic_slice_sizes_too_large", "a: f32[16,8], i: s32[]",
     "ROOT %d = f32[40,8]{1,0} dynamic-slice(%a, %i, %i), dynamic_slice_sizes={40,8}",
     "ROOT %d = f32[2,8]{1,0} dynamic-slice(%a, %i, %i), dynamic_slice_sizes={2,8}", "f32[2,8]",
     "must give one size in [0, n] per dimension"),
    ("dynamic_slice_result_mismatch", "a: f32[16,8], i: s32[]",
     "ROOT %d = f32[4,8]{1,0} dynamic-slice(%a, %i, %i), dynamic_slice_sizes={2,8}",
     "ROOT %d = f32[4,8]{1,0} dynamic-slice(%a, %i, %i), dynamic_slice_sizes={4,8}", "f32[4,8]",
     "gives dimensions [2,8]"),
    ("dus_update_too_large", "a: f32[16,8], u: f32[32,8], i: s32[]",
     "ROOT %d = f32[16,8]{1,0} dynamic-update-slice(%a, %u, %i, %i)",
     None, "f32[16,8]", "update f32[32,8] does not fit in operand f32[16,8]"),
    ("dus_result_mismatch", "a: f32[16,8], u: f32[1,8], i: s32[]",
     "ROOT %d = f32[8,8]{1,0} dynamic-update-slice(%a, %u, %i, %i)",
     "ROOT %d = f32[16,8]{1,0} dynamic-update-slice(%a, %u, %i, %i)", "f32[16,8]",
     "gives dimensions [16,8]"),
    ("concatenate_sum", "a: f32[16,8], b: f32[16,4]",
     "ROOT %c = f32[16,20]{1,0} concatenate(%a, %b), dimensions={1}",
     "ROOT %c = f32[16,12]{1,0} concatenate(%a, %b), dimensions={1}", "f32[16,12]",
     "gives dimensions [16,12]"),
    ("concatenate_other_dims", "a: f32[16,8], b: f32[12,4]",
     "ROOT %c = f32[16,12]{1,0} concatenate(%a, %b), dimensions={1}",
     None, "f32[16,12]", "operand 'b' f32[12,4] does not match"),
    ("broadcast_size", "a: f32[16]",
     "ROOT %b = f32[16,8]{1,0} broadcast(%a), dimensions={1}",
     "ROOT %b = f32[16,8]{1,0} broadcast(%a), dimensions={0}", "f32[16,8]",
     "maps to dimension 1 of result f32[16,8]{1,0}, which has size 8"),
    ("broadcast_missing_dim", "a: f32[16]",
     "ROOT %b = f32[8,16]{1,0} broadcast(%a), dimensions={2}",
     "ROOT %b = f32[8,16]{1,0} broadcast(%a), dimensions={1}", "f32[8,16]",
     "which does not exist"),
    ("transpose_result", "a: f32[16,8]",
     "ROOT %t = f32[8,16]{1,0} transpose(%a), dimensions={0,1}",
     "ROOT %t = f32[8,16]{1,0} transpose(%a), dimensions={1,0}", "f32[8,16]",
     "gives dimensions [16,8]"),
    ("transpose_not_permutation", "a: f32[16,8]",
     "ROOT %t = f32[8,16]{1,0} transpose(%a), dimensions={1,1}",
     None, "f32[8,16]", "is not a permutation of the 2 dimensions"),
    ("replica_groups_overlap", "a: f32[16,8]",
     "ROOT %r = f32[16,8]{1,0} all-reduce(%a), replica_groups={{0,1},{1,2}}, to_apply=%add",
     "ROOT %r = f32[16,8]{1,0} all-reduce(%a), replica_groups={{0,1},{2,3}}, to_apply=%add",
     "f32[16,8]", "device 1 appears in groups 0 and 1"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_wrong_shape_is_an_error_at_its_instruction(case):
    _, params, wrong, right, root_shape, message = case
    text = _module(params, wrong, root_shape)
    line = ROOT_LINE + params.count(", ")  # one parameter line each
    assert text.splitlines()[line - 1].strip() == wrong
    with pytest.raises(HloParseError) as e:
        parse_module(text, "case.hlo")
    assert e.value.line == line, str(e.value)
    assert message in str(e.value), str(e.value)
    if right is not None:
        parse_module(_module(params, right, root_shape), "case.hlo")  # the corrected one parses


def _analyze(params, body, root_shape, tmp_path):
    p = tmp_path / "ok.hlo"
    p.write_text(_module(params, body, root_shape))
    return jaxmove.analyze(str(p))


def test_corrected_concatenate_counts_its_operands_and_result(tmp_path):
    r = _analyze("a: f32[16,8], b: f32[16,4]",
                 "ROOT %c = f32[16,12]{1,0} concatenate(%a, %b), dimensions={1}", "f32[16,12]", tmp_path)
    assert r.totals.hbm_read_bytes == (16 * 8 + 16 * 4) * 4  # both operands, f32
    assert r.totals.hbm_write_bytes == 16 * 12 * 4


def test_corrected_slice_reads_its_window(tmp_path):
    r = _analyze("a: f32[16,8]", "ROOT %s = f32[4,8]{1,0} slice(%a), slice={[4:8], [0:8]}",
                 "f32[4,8]", tmp_path)
    assert r.totals.hbm_read_bytes == 4 * 8 * 4  # rows 4..7: a 4 x 8 f32 window
    assert r.totals.hbm_write_bytes == 4 * 8 * 4


def test_dynamic_dimensions_are_not_compared():
    # a bounded dynamic result (<=16) is not checked against the static sizes
    parse_module(_module("a: f32[16,8], i: s32[]",
                         "ROOT %d = f32[<=16,8]{1,0} dynamic-slice(%a, %i, %i), dynamic_slice_sizes={16,8}",
                         "f32[<=16,8]"), "dyn.hlo")


def test_cli_exit_2_one_line(tmp_path):
    _, params, wrong, _, root_shape, message = CASES[0]
    p = tmp_path / "bad.hlo"
    p.write_text(_module(params, wrong, root_shape))
    r = subprocess.run([sys.executable, "-P", "-m", "jaxmove.cli", "analyze", str(p)],
                       capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"jaxmove: error: {p}:{ROOT_LINE}:") and message in r.stderr
