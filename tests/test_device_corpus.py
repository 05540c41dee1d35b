"""A slice of the device corpus (benchmarks/device_corpus.py): real TPU / GPU programs of the
zoo, compiled without the device, must be accepted by jaxmove, and together contain every
opcode, custom-call target and layout kind the full corpus run saw
(benchmarks/device_corpus_coverage.json, written by that run).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from jaxmove.hlo import parse_module

from . import device_compile  # noqa: F401  (sets JAX_PLATFORMS / libtpu sharing before jax starts)

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _corpus():
    spec = importlib.util.spec_from_file_location("device_corpus", BENCH / "device_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def coverage():
    p = BENCH / "device_corpus_coverage.json"
    if not p.is_file():
        pytest.skip(f"{p} not found: run python benchmarks/device_corpus.py")
    return json.loads(p.read_text())


@pytest.fixture(scope="module")
def slice_records(coverage, tmp_path_factory):
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install jaxmove[tpu])")
    dc = _corpus()
    out = []
    tmp = tmp_path_factory.mktemp("device_corpus")
    for preset, size, target, plan, *rest in coverage["slice"]:  # rest: a dtype / scan --set dict
        extra = rest[0] if rest else None
        try:
            text, _secs = dc.compile_program(preset, size, target, plan, extra)
        except Exception as e:  # noqa: BLE001 - a target this machine cannot compile for
            pytest.skip(f"cannot compile {preset}/{size} for {target}: {type(e).__name__}: {e}")
        path = tmp / f"{dc.key_of(preset, size, target, plan, extra)}.hlo"
        path.write_text(text)
        out.append(((preset, size, target, plan), dc.analyse_text(path)))
    return out


def test_slice_is_accepted(slice_records):
    rejected = [(k, r["rejection"]) for k, r in slice_records if r.get("rejection")]
    assert not rejected


@pytest.mark.parametrize("kind", ["opcodes", "custom_call_targets", "layout_kinds"])
def test_slice_covers_what_the_full_run_saw(coverage, slice_records, kind):
    seen = set().union(*(set(r["coverage"].get(kind, ())) for _k, r in slice_records))
    missing = set(coverage[kind]) - seen
    assert not missing, (f"the corpus slice no longer contains these {kind} of the full run: "
                         f"{sorted(missing)}; rerun benchmarks/device_corpus.py to refresh the slice")


def test_no_new_unmodeled_instructions(coverage, slice_records):
    # the bar is zero; what the full run still left unmodeled is listed in device_corpus.md
    new = {w for _k, r in slice_records for w in (r.get("unmodeled_by") or {})} - set(coverage["unmodeled"])
    assert not new, f"unmodeled in the slice but not in the full run's list: {sorted(new)}"


# ---- corpus findings, as hand-written regressions ------------------------------------------

def test_combined_collective_permute_is_accepted_and_sends_every_operand():
    # XLA:GPU's CollectivePermuteCombiner: one collective-permute-start of two buffers (once
    # rejected: "takes 1 or 4 operands"); each device sends both: 2 x 256 bytes
    from jaxmove.passes.collectives import collective_info
    m = parse_module("""HloModule m, num_partitions=4
ENTRY e {
  a = f32[16,4]{1,0} parameter(0)
  b = f32[16,4]{1,0} parameter(1)
  s = ((f32[16,4]{1,0}, f32[16,4]{1,0}), (f32[16,4]{1,0}, f32[16,4]{1,0})) collective-permute-start(a, b), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  ROOT d = (f32[16,4]{1,0}, f32[16,4]{1,0}) collective-permute-done(s)
}
""")
    start = m.entry.by_name["s"]
    info = collective_info(start, m.entry, m)
    assert info.wire_bytes == 2 * 16 * 4 * 4


# XLA:TPU v5p offloads a scatter-add to the SparseCore (mixtral-8x7b-train, tiny, on tpu-v5p):
# ``call-start`` (an async-start wrapping a call, async_execution_thread="sparsecore") of a
# computation with execution_thread="sparsecore", after a PrepareAsyncCallStart / Done sync flag.
# Once unmodeled (4 opcodes / targets, 12 instructions); the shapes below follow that program.
_SPARSECORE = """HloModule sc, is_scheduled=true

%add.f (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}, execution_thread="sparsecore"

%scatter.fused (p0: f32[256,1024], p1: s32[256,2], p2: f32[256]) -> f32[256,1024] {
  %p0 = f32[256,1024]{1,0:T(8,128)} parameter(0)
  %p1 = s32[256,2]{1,0} parameter(1)
  %p2 = f32[256]{0:T(256)} parameter(2)
  ROOT %sc = f32[256,1024]{1,0:T(8,128)} scatter(%p0, %p1, %p2), update_window_dims={}, inserted_window_dims={0,1}, scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, indices_are_sorted=true, to_apply=%add.f
}, execution_thread="sparsecore"

%offload (q0: f32[256,1024], q1: s32[256,2], q2: f32[256], q3: token[]) -> f32[256,1024] {
  %q3 = token[] parameter(3)
  %q0 = f32[256,1024]{1,0:T(8,128)} parameter(0)
  %q1 = s32[256,2]{1,0} parameter(1)
  %q2 = f32[256]{0:T(256)} parameter(2)
  ROOT %f = f32[256,1024]{1,0:T(8,128)} fusion(%q0, %q1, %q2), kind=kCustom, calls=%scatter.fused
}, execution_thread="sparsecore"

ENTRY %main (x: f32[256,1024], i: s32[256,2], u: f32[256]) -> f32[256,1024] {
  %x = f32[256,1024]{1,0:T(8,128)} parameter(0)
  %i = s32[256,2]{1,0} parameter(1)
  %u = f32[256]{0:T(256)} parameter(2)
  %prep = s32[]{:S(2)} custom-call(), custom_call_target="PrepareAsyncCallStart"
  %ready = token[] custom-call(%prep), custom_call_target="PrepareAsyncCallDone"
  %start = ((f32[256,1024]{1,0:T(8,128)}, s32[256,2]{1,0}, f32[256]{0:T(256)}, token[]), f32[256,1024]{1,0:T(8,128)}, u32[]{:S(8)}) call-start(%x, %i, %u, %ready), async_execution_thread="sparsecore", to_apply=%offload
  ROOT %done = f32[256,1024]{1,0:T(8,128)} call-done(%start)
}
"""


def test_sparsecore_async_call_carries_its_callees_traffic(tmp_path):
    import jaxmove
    p = tmp_path / "sc.hlo"
    p.write_text(_SPARSECORE)
    r = jaxmove.analyze(str(p), hardware="tpu-v5p")
    assert not r.unmodeled
    # the scatter-add of 256 scalars, in place: reads the 256 f32 elements it adds to, the
    # 256 x 2 s32 indices and the 256 f32 updates; writes the 256 elements back
    reads, writes = 256 * 4 + 256 * 2 * 4 + 256 * 4, 256 * 4
    assert (r.totals.hbm_read_bytes, r.totals.hbm_write_bytes) == (reads, writes) == (4096, 1024)
    moving = {(row.computation, row.instr.name) for row in r.rows if row.total.hbm_bytes}
    assert moving == {("offload", "f")}  # the start / done pair and the sync flags move nothing
    # the same work as a synchronous call: the same bytes
    sync = (_SPARSECORE.replace("call-start(%x, %i, %u, %ready), async_execution_thread=\"sparsecore\",",
                                "call(%x, %i, %u, %ready),")
            .replace("  %start = ((f32[256,1024]{1,0:T(8,128)}, s32[256,2]{1,0}, f32[256]{0:T(256)}, token[]), "
                     "f32[256,1024]{1,0:T(8,128)}, u32[]{:S(8)})", "  %start = f32[256,1024]{1,0:T(8,128)}")
            .replace("call-done(%start)", "copy(%start)"))
    q = tmp_path / "sync.hlo"
    q.write_text(sync)
    s = jaxmove.analyze(str(q), hardware="tpu-v5p")
    assert s.totals.hbm_read_bytes - 256 * 1024 * 4 == reads  # less the copy's read of the result
    # time: the callee runs on its own queue from the start; the program waits at the done, so
    # the program's time is the scatter fusion's (the flag wait launches no TPU kernel)
    t = r.times
    fused = t.rows[("offload", "f")].per_execution_s
    assert fused > 0 and t.est_time_s == pytest.approx(fused)
    assert ("main", "start", 0.0, pytest.approx(fused)) in t.timeline
