"""Chrome trace of the estimated timeline: valid Trace Event Format, one event per executed
instruction (counted by hand from the HLO below)."""

from __future__ import annotations

import json

import pytest

import jaxmove
from jaxmove.cli import main
from jaxmove.report.trace import chrome_trace

# ENTRY runs: negate, exponential (2 kernels) and a while with trip count 3 whose body runs
# add + negate (2 kernels) and whose condition runs compare (1 kernel) 3 + 1 = 4 times.
# parameter / constant / tuple / get-tuple-element launch nothing.
HLO = """\
HloModule traced, entry_computation_layout={(f32[256]{0})->(s32[], f32[256]{0})}

%body (p: (s32[], f32[256])) -> (s32[], f32[256]) {
  %p = (s32[], f32[256]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %v = f32[256]{0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %v1 = f32[256]{0} negate(%v)
  ROOT %t = (s32[], f32[256]{0}) tuple(%i1, %v1)
}

%cond (p: (s32[], f32[256])) -> pred[] {
  %p = (s32[], f32[256]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[256]) -> (s32[], f32[256]) {
  %x = f32[256]{0} parameter(0)
  %a = f32[256]{0} negate(%x)
  %b = f32[256]{0} exponential(%a)
  %zero = s32[] constant(0)
  %t0 = (s32[], f32[256]{0}) tuple(%zero, %b)
  ROOT %loop = (s32[], f32[256]{0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
}
"""


@pytest.fixture(scope="module")
def hlo_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("hlo") / "traced.hlo"
    p.write_text(HLO)
    return p


def _check_format(trace: dict) -> list[dict]:
    """Trace Event Format: complete events have name, ph, numeric ts/dur (us), pid, tid."""
    assert isinstance(trace["traceEvents"], list)
    xs = []
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M")
        assert isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert isinstance(e["name"], str) and isinstance(e["tid"], int)
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
            assert e["ts"] >= 0 and e["dur"] >= 0
            xs.append(e)
    return xs


def test_one_event_per_executed_instruction(hlo_path, tmp_path):
    out = tmp_path / "t.json"
    assert main(["analyze", str(hlo_path), "--hardware", "h100-sxm", "--trace", str(out)]) == 0
    trace = json.loads(out.read_text())
    xs = [e for e in _check_format(trace) if e["pid"] == 1]
    names = sorted(e["name"] for e in xs)
    # a, b, the while block; 3 x (i1, v1); 4 x lt
    assert names == sorted(["a", "b", "loop"] + ["i1", "v1"] * 3 + ["lt"] * 4)
    loop = next(e for e in xs if e["name"] == "loop")
    inner = [e for e in xs if e["name"] in ("i1", "v1", "lt")]
    # nested inside the while's block, in order: lt, i1, v1, lt, ..., lt
    eps = 1e-6
    assert all(loop["ts"] - eps <= e["ts"] and e["ts"] + e["dur"] <= loop["ts"] + loop["dur"] + eps
               for e in inner)
    order = [e["name"] for e in sorted(inner, key=lambda e: e["ts"])]
    assert order[0] == "lt" and order[-1] == "lt"
    # the stream's events do not overlap and follow the schedule: a before b before the loop
    top = sorted([e for e in xs if e["name"] in ("a", "b", "loop")], key=lambda e: e["ts"])
    assert [e["name"] for e in top] == ["a", "b", "loop"]
    assert top[0]["ts"] + top[0]["dur"] <= top[1]["ts"] + eps


def test_trace_needs_times(hlo_path):
    report = jaxmove.analyze(str(hlo_path))
    with pytest.raises(ValueError, match="hardware"):
        chrome_trace(report)
    assert main(["analyze", str(hlo_path), "--trace", "/dev/null"]) == 2


def test_zoo_trace_counts_kernels():
    report = jaxmove.analyze("gpt-tiny-decode", hardware="h100-sxm")
    xs = _check_format(chrome_trace(report))
    # no loops in this program: one event per ENTRY instruction that launches a kernel
    free = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}
    kernels = [i for i in report.module.entry.instructions if i.opcode not in free]
    assert len(xs) == len(kernels)
    assert {e["name"] for e in xs} == {i.name for i in kernels}
