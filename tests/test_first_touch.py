"""Host-runtime terms of the time model: first-touch page mapping and per-call dispatch.

A small CPU-like spec is written here with round numbers (B = 50e9 HBM bytes/s,
F = 2e9 first-touch bytes/s, T = 32 MiB mmap threshold, 1e-6 s per kernel, 1e-5 s per
call), so every expected time is bytes / rate counted by hand from the HLO text.
"""

from __future__ import annotations

import dataclasses

import pytest

from jaxmove.hardware import HardwareSpecError, load_spec, parse_spec, spec_to_toml
from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import analyze_module
from jaxmove.passes.timing import estimate_times

B = 50e9
F = 2e9
T = 32 * 2**20
LAUNCH = 1e-6
DISPATCH = 1e-5

_SPEC = f"""
name = "test-cpu"
vendor = "test"
kind = "cpu"
hbm_bytes_per_s = {B}
hbm_capacity_bytes = {2**34}
kernel_launch_overhead_s = {LAUNCH}
devices_per_node = 1
first_touch_bytes_per_s = {F}
mmap_threshold_bytes = {T}
dispatch_overhead_s = {DISPATCH}

[flops_per_s]
f32 = 1e15
bf16 = 1e15

[sources]
hbm_bytes_per_s = "test value"
hbm_capacity_bytes = "test value"
kernel_launch_overhead_s = "test value"
devices_per_node = "test value"
first_touch_bytes_per_s = "test value"
mmap_threshold_bytes = "test value"
dispatch_overhead_s = "test value"
"flops_per_s.f32" = "test value"
"flops_per_s.bf16" = "test value"
"""


@pytest.fixture(scope="module")
def spec():
    return parse_spec(_SPEC, "test-cpu.toml")


def _times(text: str, spec):
    return estimate_times(analyze_module(parse_module(text)), spec)


def _convert(n: int) -> str:
    """bf16[n] -> f32[n] convert (a temp), then a negate producing the f32 result."""
    return f"""HloModule cvt

ENTRY main {{
  p = bf16[{n}]{{0}} parameter(0)
  c = f32[{n}]{{0}} convert(p)
  ROOT r = f32[{n}]{{0}} negate(c)
}}
"""


def test_large_convert_pays_first_touch_on_top_of_its_stream(spec):
    n = 2**24  # f32 result 64 MiB >= T: the temp allocation and the result are mapped fresh
    te = _times(_convert(n), spec)
    c, r = te.row("main", "c"), te.row("main", "r")
    # convert: reads 2n, writes 4n bytes at B; its 4n-byte output is the temp high-water mark
    assert c.first_touch_bytes == 4 * n
    assert c.first_touch_s == pytest.approx(4 * n / F)
    assert c.memory_time_s == pytest.approx(6 * n / B + 4 * n / F)
    assert c.est_time_s == pytest.approx(LAUNCH + 6 * n / B + 4 * n / F)
    assert c.bound == "memory"
    # negate: reads and writes 4n bytes; its result is a fresh 64 MiB output allocation
    assert r.first_touch_bytes == 4 * n
    assert r.est_time_s == pytest.approx(LAUNCH + 8 * n / B + 4 * n / F)
    assert te.first_touch.temp_high_water_bytes == 4 * n and te.first_touch.temp_fresh
    assert te.first_touch.total_bytes == 8 * n
    # program: both kernels in sequence plus one dispatch
    assert te.dispatch_overhead_s == DISPATCH
    assert te.est_time_s == pytest.approx(c.est_time_s + r.est_time_s + DISPATCH)
    assert te.serial_time_s == pytest.approx(c.est_time_s + r.est_time_s)


def test_convert_below_the_mmap_threshold_has_no_first_touch(spec):
    n = 2**20  # 4 MiB: reused from the heap across runs
    te = _times(_convert(n), spec)
    c = te.row("main", "c")
    assert c.first_touch_bytes == 0 and c.first_touch_s == 0.0
    assert c.est_time_s == pytest.approx(LAUNCH + 6 * n / B)
    assert te.first_touch.total_bytes == 0 and not te.first_touch.temp_fresh


def _chain(n: int, alias: bool) -> str:
    header = "HloModule chain" + (", input_output_alias={ {}: (0, {}, may-alias) }" if alias else "")
    return f"""{header}

ENTRY main {{
  p = f32[{n}]{{0}} parameter(0)
  a = f32[{n}]{{0}} negate(p)
  b = f32[{n}]{{0}} exponential(a)
  c = f32[{n}]{{0}} negate(b)
  d = f32[{n}]{{0}} exponential(c)
  ROOT e = f32[{n}]{{0}} negate(d)
}}
"""


def test_temp_high_water_mark_reuses_freed_buffers(spec):
    n = 2**24
    te = _times(_chain(n, alias=False), spec)
    ft = te.first_touch
    # live temps: a; a+b (a freed after b); b+c; c+d; then e is the result.
    # High-water mark 2 x 4n: a and b push it up, c and d reuse freed pages.
    assert ft.temp_high_water_bytes == 8 * n
    assert te.row("main", "a").first_touch_bytes == 4 * n
    assert te.row("main", "b").first_touch_bytes == 4 * n
    assert te.row("main", "c").first_touch_bytes == 0
    assert te.row("main", "d").first_touch_bytes == 0
    assert te.row("main", "e").first_touch_bytes == 4 * n   # fresh result allocation
    assert te.row("main", "c").est_time_s == pytest.approx(LAUNCH + 8 * n / B)


def test_donated_result_is_not_a_fresh_allocation(spec):
    n = 2**24
    te = _times(_chain(n, alias=True), spec)
    assert te.row("main", "e").first_touch_bytes == 0
    assert te.first_touch.output_fresh_bytes == 0
    assert te.first_touch.total_bytes == 8 * n


def test_builtin_gpu_spec_has_no_host_terms():
    h100 = load_spec("h100-sxm")
    assert h100.first_touch_bytes_per_s is None and h100.mmap_threshold_bytes is None
    assert h100.dispatch_overhead_s is None
    n = 2**24
    te = estimate_times(analyze_module(parse_module(_convert(n))), h100)
    assert not te.first_touch.applied and te.first_touch.total_bytes == 0
    assert te.dispatch_overhead_s == 0.0
    assert te.row("main", "c").est_time_s == pytest.approx(2e-6 + 6 * n / 3.35e12)
    assert te.est_time_s == pytest.approx(te.serial_time_s)


def test_spec_with_the_new_fields_round_trips_and_needs_sources(spec):
    assert parse_spec(spec_to_toml(spec), "rt.toml") == dataclasses.replace(spec, path="rt.toml")
    no_source = _SPEC.replace('first_touch_bytes_per_s = "test value"\n', "")
    with pytest.raises(HardwareSpecError, match="no source for 'first_touch_bytes_per_s'"):
        parse_spec(no_source, "x.toml")
    with pytest.raises(HardwareSpecError, match="whole number"):
        parse_spec(_SPEC.replace(f"mmap_threshold_bytes = {T}", "mmap_threshold_bytes = 1.5"), "x.toml")
    with pytest.raises(HardwareSpecError, match="unknown key 'page_fault_s'"):
        parse_spec(_SPEC.replace("devices_per_node = 1\n", "devices_per_node = 1\npage_fault_s = 1e-6\n", 1),
                   "x.toml")
