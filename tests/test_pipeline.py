"""The one pipeline: every pass run in order, one branch choice that every column follows,
and rules that raise Unmodeled (only that is turned into an unmodeled row)."""

from __future__ import annotations

import pytest

import jaxmove
from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import run_pipeline

# Branch 'copy_branch' moves the most HBM bytes (a 16 MiB copy: 2 x 4 Mi f32); branch
# 'dot_branch' does the most FLOPs on few bytes (a 1024^3 f32 dot: 2 x 1024^3 = 2.1 GFLOP
# on 12 MiB). On h100-sxm the dot takes longer (2.1e9 / 67e12 FLOP/s = 32 us (f32 as tf32,
# 495e12: 4.3 us) vs 16.8 MB / 3.35e12 B/s = 5 us), so a per-pass "slowest branch" would pick
# the dot while the byte totals pick the copy. There is one choice: the totals'.
HLO = """HloModule branches

copy_branch {
  p = (f32[2048,2048], f32[1024,1024]) parameter(0)
  a = f32[2048,2048] get-tuple-element(p), index=0
  ROOT c = f32[2048,2048] copy(a)
}

dot_branch {
  p = (f32[2048,2048], f32[1024,1024]) parameter(0)
  b = f32[1024,1024] get-tuple-element(p), index=1
  d = f32[1024,1024] dot(b, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT r = f32[2048,2048] pad(d, f32[] constant(0)), padding=0_1024x0_1024
}

ENTRY main {
  i = s32[] parameter(0)
  a = f32[2048,2048] parameter(1)
  b = f32[1024,1024] parameter(2)
  t = (f32[2048,2048], f32[1024,1024]) tuple(a, b)
  ROOT c = f32[2048,2048] conditional(i, t, t), branch_computations={copy_branch, dot_branch}
}
"""


@pytest.fixture(scope="module")
def results():
    from jaxmove.hardware import load_spec
    return run_pipeline(parse_module(HLO, "<branches>"), spec=load_spec("h100-sxm"))


def test_one_branch_choice(results):
    a = results.analysis
    assert a.branches == {("main", "c"): "copy_branch"}
    # the totals are the copy branch's: read and write 2048^2 x 4 bytes once
    assert a.totals.hbm_read_bytes >= 2048 * 2048 * 4 and a.totals.flops == 0
    # the time follows the same branch: the program time is the copy's time, not the dot's
    times = results.times
    copy_t = times.rows[("copy_branch", "c")].per_execution_s
    dot_t = times.rows[("dot_branch", "d")].per_execution_s
    assert dot_t > copy_t  # the case where a 'slowest branch' rule would disagree
    assert times.est_time_s == pytest.approx(copy_t + sum(
        r.per_execution_s for (c, n), r in times.rows.items() if c == "main"), rel=1e-9)


def test_excess_and_reuse_count_the_same_branch(results):
    # the dot branch's rows never reach the excess ledger or the reuse total
    ex = results.excess
    assert all(i.computation != "dot_branch" for cause in ex.causes for i in cause.instructions)
    assert all(c != "dot_branch" for c, _ in ex.per_instruction)


def test_report_is_built_from_the_pipeline(tmp_path):
    p = tmp_path / "b.hlo"
    p.write_text(HLO)
    rep = jaxmove.analyze(str(p), hardware="h100-sxm")
    assert rep.analysis.branches == {("main", "c"): "copy_branch"}
    assert rep.times is not None and rep.reuse is not None and rep.excess is not None


def test_only_unmodeled_becomes_an_unmodeled_row(monkeypatch):
    """A rule raising Unmodeled lists the row as unmodeled; a builtin exception is a bug and
    propagates (it is not turned into data)."""
    from jaxmove.errors import Unmodeled
    from jaxmove.passes import pipeline

    module = parse_module(HLO, "<branches>")

    def no_model(instr, module):
        if instr.opcode == "dot":
            raise Unmodeled("planted: no model")
        return real(instr, module)

    real = pipeline.instruction_flops
    monkeypatch.setattr(pipeline, "instruction_flops", no_model)
    a = pipeline.analyze_module(module)
    (row,) = [r for r in a.rows if r.instr.opcode == "dot"]
    assert row.unmodeled and "planted: no model" in row.unmodeled[0]

    def bug(instr, module):
        if instr.opcode == "dot":
            raise KeyError("planted bug")
        return real(instr, module)

    monkeypatch.setattr(pipeline, "instruction_flops", bug)
    with pytest.raises(KeyError, match="planted bug"):
        pipeline.analyze_module(module)
