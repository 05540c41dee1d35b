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
    for preset, size, target, plan in coverage["slice"]:
        try:
            text, _secs = dc.compile_program(preset, size, target, plan)
        except Exception as e:  # noqa: BLE001 - a target this machine cannot compile for
            pytest.skip(f"cannot compile {preset}/{size} for {target}: {type(e).__name__}: {e}")
        path = tmp / f"{dc.key_of(preset, size, target, plan)}.hlo"
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
