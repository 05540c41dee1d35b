"""Typed results at the edges (issue 10): the Report's typed reuse / times / measurement, the
per-module memo caches, the one access -> Cost field mapping, custom-call kinds.

Figures are hand-counted from the HLO below: one kLoop fusion over f32[1024] (4096 bytes in,
4096 out) computing exp (1024 transcendentals) then negate (1024 flops).
"""

from __future__ import annotations

import copy
import os
import pickle
from dataclasses import dataclass

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

import jaxmove  # noqa: E402
from jaxmove._perf import slots_constructor  # noqa: E402
from jaxmove.measure.profile import InstructionTiming, ProfileJoin  # noqa: E402
from jaxmove.measure.run import Measurement  # noqa: E402
from jaxmove.passes import flops  # noqa: E402
from jaxmove.passes.cost import ACCESS_SLOTS, FIELD_INDEX, N_FIELDS, Cost, access_fields, from_values  # noqa: E402
from jaxmove.passes.memo import ModuleMemo, memo_of  # noqa: E402
from jaxmove.passes.reuse import ReuseAnalysis  # noqa: E402
from jaxmove.passes.timing import TimeEstimate  # noqa: E402
from jaxmove.report.columns import row_measured_s, row_reuse, row_time  # noqa: E402

HLO = """HloModule m, entry_computation_layout={(f32[1024]{0})->f32[1024]{0}}

fused {
  p = f32[1024]{0} parameter(0)
  e = f32[1024]{0} exponential(p)
  ROOT n = f32[1024]{0} negate(e)
}

ENTRY main {
  x = f32[1024]{0} parameter(0)
  ROOT f = f32[1024]{0} fusion(x), kind=kLoop, calls=fused
}
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("typed") / "m.hlo"
    path.write_text(HLO)
    return jaxmove.analyze(str(path), hardware="h100-sxm")


def _row(report, name):
    return next(r for r in report.rows if r.instr.name == name)


def test_report_fields_are_the_pass_records(report):
    assert isinstance(report.times, TimeEstimate) and isinstance(report.reuse, ReuseAnalysis)
    assert report.measurement is None
    row = _row(report, "f")
    assert row.total.hbm_read_bytes == 4096 and row.total.hbm_write_bytes == 4096
    assert row_time(report, row) is report.times.rows[("main", "f")]
    # unfused: exp reads 4096 + writes 4096, negate the same; fused 8192 -> 8192 kept on chip
    assert row_reuse(report, row).onchip_reuse_bytes == 8192
    assert row_measured_s(report, row) is None


def test_measurement_columns_and_trace_lane(report):
    from jaxmove.report.trace import chrome_trace

    t_s = 2.5e-6
    timing = {("main", "f"): InstructionTiming("main", "f", "fusion", t_s, 1, (t_s,))}
    prof = ProfileJoin("m", 1, timing, t_s, t_s, {}, t_s, t_s)
    m = Measurement(None, "NVIDIA H100", "gpu", 0, (3e-6,), prof)
    measured = copy.copy(report)
    measured.measurement = m
    row = _row(measured, "f")
    assert row_measured_s(measured, row) == t_s
    lane = [e for e in chrome_trace(measured)["traceEvents"] if e.get("pid") == 2 and e["ph"] == "X"]
    assert [(e["name"], e["dur"]) for e in lane] == [("f", pytest.approx(t_s * 1e6))]
    df = measured.to_dataframe()
    assert df.set_index("name").loc["f", "measured_s"] == t_s


def test_html_names_the_hardware(report):
    from jaxmove.report.html import render_html

    assert "hardware h100-sxm" in render_html(report)


def test_memo_is_per_module_and_not_copied(report):
    module = report.module
    fc = memo_of(module).fused_flops["fused"]
    assert (fc.flops, fc.transcendentals) == (1024, 1024)
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert clone.memo is None or clone.memo.fused_flops == {}
    fresh = jaxmove.hlo.parse_module(HLO)
    assert fresh.memo is None and isinstance(memo_of(fresh), ModuleMemo)
    assert memo_of(fresh) is memo_of(fresh) and memo_of(fresh) is not memo_of(module)


def test_access_fields_by_memory_space_role_direction():
    # HBM (S(0)): the HBM total, the data path and the role's own field
    assert access_fields(0, "weights", True) == ("hbm_read_bytes", "hbm_to_onchip_bytes", "weights_read_bytes")
    assert access_fields(0, "kv_cache", False) == ("hbm_write_bytes", "onchip_to_hbm_bytes",
                                                    "kv_cache_write_bytes")
    assert access_fields(5, "weights", True) == ("host_to_device_bytes",)   # host S(5)
    assert access_fields(5, "weights", False) == ("device_to_host_bytes",)
    assert access_fields(1, "activations", True) == ("onchip_read_bytes",)  # VMEM S(1)
    assert access_fields(6, "activations", False) == ("onchip_write_bytes",)  # SMEM S(6)
    with pytest.raises(ValueError, match="unknown role 'gradients'"):
        access_fields(0, "gradients", True)
    acc = [0] * N_FIELDS
    for f in ACCESS_SLOTS[0, "weights", True]:
        acc[f] += 100
    assert from_values(acc) == Cost(hbm_read_bytes=100, hbm_to_onchip_bytes=100, weights_read_bytes=100)
    assert ACCESS_SLOTS[0, "weights", True] == tuple(FIELD_INDEX[n] for n in access_fields(0, "weights", True))


def test_slots_constructor_both_forms():
    @dataclass(frozen=True, slots=True)
    class P:
        a: int
        b: str = "x"

    assert slots_constructor(P)(1, "y") == P(1, "y")
    assert slots_constructor(P, from_sequence=True)([2, "z"]) == P(2, "z")
    with pytest.raises(IndexError):
        slots_constructor(P, from_sequence=True)([3])

    @dataclass(frozen=True)
    class Q:
        a: int

    with pytest.raises(TypeError, match="not a slotted dataclass"):
        slots_constructor(Q)


def test_every_custom_call_rule_has_a_kind():
    rules = list(flops.CUSTOM_CALL_RULES.items()) + list(flops.CUSTOM_CALL_PREFIX_RULES)
    for target, rule in rules:
        if rule in flops.KERNEL_RULES:  # Pallas / Triton kernels: costed by their own model
            assert flops.custom_call_kind(target) is None, target
            continue
        assert flops.custom_call_kind(target) == flops.CUSTOM_CALL_KINDS[rule], target
    assert flops.custom_call_kind("__cublas$lt$matmul") == "matmul"
    assert flops.custom_call_kind("__cudnn$convForward") == "convolution"
    assert flops.custom_call_kind("__cudnn$fmhaSoftmaxBackward") == "attention"  # by prefix
    assert flops.custom_call_kind("ConcatBitcast") is None and flops.custom_call_kind(None) is None
