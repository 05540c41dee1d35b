"""``--by`` groups count what the program totals count: a conditional's costliest branch only
(a user trial: the groups of a corpus module with a conditional summed to twice its totals,
one group above the whole program)."""

from __future__ import annotations

import json

import pytest

import jaxmove
from jaxmove.cli import main
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
