"""``--by`` groups count what the program totals count: a conditional's costliest branch only
(a user trial: the groups of a corpus module with a conditional summed to twice its totals,
one group above the whole program)."""

from __future__ import annotations

import json

import pytest

import jaxmove
from jaxmove.cli import main
from jaxmove.hardware import load_spec
from jaxmove.report.attribution import aggregate, uncounted_computations

# on_true negates f32[1024] (4 KiB read + 4 KiB written); on_false negates f32[16] twice
HLO = """HloModule cond

on_true {
  a = f32[1024]{0} parameter(0)
  ROOT n = f32[1024]{0} negate(a)
}

on_false {
  b = f32[1024]{0} parameter(0)
  s = f32[16]{0} slice(b), slice={[0:16]}
  m = f32[16]{0} negate(s)
  ROOT p = f32[1024]{0} pad(m, f32[] constant(0)), padding=0_1008
}

ENTRY e {
  pr = pred[] parameter(0)
  x = f32[1024]{0} parameter(1)
  ROOT c = f32[1024]{0} conditional(pr, x, x), true_computation=on_true, false_computation=on_false
}
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("cond") / "cond.hlo"
    path.write_text(HLO)
    return jaxmove.analyze(str(path)), path


@pytest.mark.parametrize("by", ["source", "module", "opcode", "fusion_kind", "role"])
def test_groups_sum_to_the_totals(report, by):
    rep, _ = report
    assert uncounted_computations(rep.analysis) == {"on_false"}
    t = rep.totals
    groups = aggregate(rep, by)
    assert sum(g.total.hbm_read_bytes for g in groups) == t.hbm_read_bytes
    assert sum(g.total.hbm_write_bytes for g in groups) == t.hbm_write_bytes
    # the costliest branch: negate f32[1024], 4096 B each way
    assert t.hbm_read_bytes >= 4096 and t.hbm_write_bytes >= 4096


def test_text_table_says_which_branch(report, capsys):
    _, path = report
    assert main(["analyze", str(path), "--by", "opcode"]) == 0
    out = capsys.readouterr().out
    assert "'c' counts 'on_true', not 'on_false'" in " ".join(out.split())
    assert main(["analyze", str(path), "--by", "opcode", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert sum(g["hbm_read_bytes"] for g in d["by_opcode"]) == d["totals"]["hbm_read_bytes"]


# both branches read and write f32[1024] once (4 KiB each way); on_true all-reduces it over 8
# devices as well (a user trial: the tie went to the branch without the collective, so the
# totals said device_to_device 0 B while the collectives table listed the all-reduce)
HLO_COLLECTIVE = """HloModule cond_ar, replica_count=8

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

on_true {
  a = f32[1024]{0} parameter(0)
  ROOT r = f32[1024]{0} all-reduce(a), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add
}

on_false {
  b = f32[1024]{0} parameter(0)
  ROOT n = f32[1024]{0} negate(b)
}

ENTRY e {
  pr = pred[] parameter(0)
  x = f32[1024]{0} parameter(1)
  ROOT c = f32[1024]{0} conditional(pr, x, x), true_computation=on_true, false_computation=on_false
}
"""


@pytest.mark.parametrize("order", ["true_first", "false_first"])
def test_a_branch_that_all_reduces_is_the_costlier_at_equal_hbm_bytes(tmp_path, order):
    text = HLO_COLLECTIVE
    if order == "false_first":   # (the branches' order must not decide)
        text = text.replace("true_computation=on_true, false_computation=on_false",
                            "true_computation=on_false, false_computation=on_true")
    path = tmp_path / "cond_ar.hlo"
    path.write_text(text)
    rep = jaxmove.analyze(str(path))
    t = rep.totals
    assert t.hbm_read_bytes == t.hbm_write_bytes == 4096
    # ring all-reduce: 2 (n - 1) / n of the buffer per device (NCCL's bus bandwidth formula)
    assert t.device_to_device_bytes == 2 * 7 * 4096 // 8
    assert rep.analysis.branches[("e", "c")] == "on_true"


def test_the_time_sums_count_the_branch_the_totals_take(tmp_path):
    """on_false reduces f32[4,262144] (5 MiB of HBM), on_true all-reduces f32[262144] (2 MiB of
    HBM, 1.75 MiB on the wire): the totals take on_false, and the time's network sum must not
    count on_true's all-reduce (it did: "network-bound ... network 37.6 us" over totals of 0 B
    device_to_device, a user trial)."""
    text = HLO_COLLECTIVE.replace("replica_count=8", "replica_count=8").replace(
        """on_false {
  b = f32[1024]{0} parameter(0)
  ROOT n = f32[1024]{0} negate(b)
}""", """on_false {
  b = f32[1024]{0} parameter(0)
  bb = f32[4096,1024]{1,0} broadcast(b), dimensions={1}
  ROOT n = f32[1024]{0} reduce(bb, f32[] constant(0)), dimensions={0}, to_apply=add
}""")
    path = tmp_path / "cond_time.hlo"
    path.write_text(text)
    rep = jaxmove.analyze(str(path), hardware="h100-sxm")
    assert rep.analysis.branches[("e", "c")] == "on_false", "the test needs on_false the costlier"
    assert rep.totals.device_to_device_bytes == 0
    assert rep.times.network_time_s == 0
    assert rep.times.memory_time_s == pytest.approx(rep.totals.hbm_bytes / load_spec("h100-sxm").hbm_bytes_per_s)
