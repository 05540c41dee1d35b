"""Tests for jaxmove.hardware: built-in specs, the TOML loader/writer, and calibration.

Expected datasheet values are typed in here independently of the spec files.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import pytest

from jaxmove.hardware import (
    HardwareSpec,
    HardwareSpecError,
    builtin_spec_names,
    calibrate,
    canonical_flops_dtype,
    list_specs,
    load_spec,
    local_spec_path,
    parse_spec,
    spec_for_device_kind,
    spec_to_toml,
    write_spec,
)

BUILTINS = {"h100-sxm", "h200", "a100-80gb", "b200", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "cpu-generic"}

NUMERIC_SCALARS = (
    "hbm_bytes_per_s",
    "hbm_capacity_bytes",
    "kernel_launch_overhead_s",
    "devices_per_node",
    "intra_node_bytes_per_s",
    "inter_node_bytes_per_s",
    "link_latency_s",
    "l2_bytes",
    "smem_per_sm_bytes",
    "num_sms",
    "vmem_bytes",
    "tensor_cores_per_chip",
    "torus_dims",
    "ici_links",
    "ici_bytes_per_s_per_link",
)

MINIMAL = """\
name = "tiny"
vendor = "Test"
kind = "gpu"
hbm_bytes_per_s = 1e12
hbm_capacity_bytes = 1000
kernel_launch_overhead_s = 1e-6
devices_per_node = 1

[flops_per_s]
bf16 = 1e14

[sources]
hbm_bytes_per_s = "made up for a test"
hbm_capacity_bytes = "made up for a test"
kernel_launch_overhead_s = "made up for a test"
devices_per_node = "made up for a test"
"flops_per_s.bf16" = "made up for a test"
"""


def _write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ----------------------------------------------------------------- built-in specs


def test_builtin_names():
    assert BUILTINS <= set(builtin_spec_names())
    assert {s.name for s in list_specs()} >= BUILTINS


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_number_has_a_source(name):
    spec = load_spec(name)
    numbers = {k: getattr(spec, k) for k in NUMERIC_SCALARS if getattr(spec, k) is not None}
    numbers.update({f"flops_per_s.{k}": v for k, v in spec.flops_per_s.items()})
    assert numbers, name
    for key, value in numbers.items():
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (name, key)
        assert spec.sources.get(key, "").strip(), f"{name}: no source for {key}"
    assert "bf16" in spec.flops_per_s
    assert spec.kind in ("gpu", "tpu", "cpu")
    assert spec.vendor and spec.notes


@pytest.mark.parametrize("name", sorted(BUILTINS - {"cpu-generic"}))
def test_accelerators_have_interconnect_and_onchip_sizes(name):
    spec = load_spec(name)
    for key in ("intra_node_bytes_per_s", "inter_node_bytes_per_s", "link_latency_s"):
        assert getattr(spec, key) is not None, (name, key)
    if spec.kind == "gpu":
        assert spec.l2_bytes and spec.smem_per_sm_bytes and spec.num_sms
        assert spec.devices_per_node == 8
    else:
        assert spec.vmem_bytes and spec.torus_dims and spec.ici_links and spec.ici_bytes_per_s_per_link
        # the per-chip ICI figure is the sum over the chip's links, per direction
        assert spec.intra_node_bytes_per_s == pytest.approx(spec.ici_links * spec.ici_bytes_per_s_per_link)
        assert spec.ici_links == 2 * spec.torus_dims


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_alternatives_name_real_keys_and_differ(name):
    spec = load_spec(name)
    numbers = spec.numeric_fields()
    for alt in spec.alternatives:
        assert alt.key in numbers
        assert alt.value != numbers[alt.key], f"{name}: alternative for {alt.key} equals the chosen value"
        assert alt.source.strip() and alt.note.strip()


def test_h100_datasheet_values():
    # NVIDIA H100 datasheet / Hopper whitepaper, H100 SXM5, dense (no sparsity).
    h = load_spec("h100-sxm")
    assert h.kind == "gpu" and h.vendor == "NVIDIA"
    assert h.flops_per_s["bf16"] == 989.4e12
    assert h.flops_per_s["f16"] == 989.4e12
    assert h.flops_per_s["tf32"] == 494.7e12
    assert h.flops_per_s["fp8"] == 1978.9e12
    assert h.flops_per_s["int8"] == 1978.9e12
    assert h.flops_per_s["f64"] == 66.9e12
    assert h.hbm_bytes_per_s == 3.35e12
    assert h.hbm_capacity_bytes == 80 * 10**9
    assert h.l2_bytes == 50 * 2**20
    assert h.num_sms == 132
    assert h.smem_per_sm_bytes == 228 * 2**10
    assert h.intra_node_bytes_per_s == 900e9 / 2  # 900 GB/s NVLink is bidirectional
    assert h.inter_node_bytes_per_s == 400e9 / 8  # one 400 Gb/s ConnectX-7 per GPU
    assert h.ridge_point_flops_per_byte == pytest.approx(989.4e12 / 3.35e12)


def test_h200_is_h100_compute_with_more_memory():
    h100, h200 = load_spec("h100-sxm"), load_spec("h200")
    assert dict(h200.flops_per_s) == dict(h100.flops_per_s)
    assert h200.hbm_bytes_per_s == 4.8e12
    assert h200.hbm_capacity_bytes == 141 * 10**9


def test_other_headline_figures():
    assert load_spec("a100-80gb").flops_per_s["bf16"] == 312e12
    assert load_spec("a100-80gb").hbm_bytes_per_s == 2039e9
    assert load_spec("tpu-v5e").flops_per_s["bf16"] == 197e12
    assert load_spec("tpu-v5e").hbm_bytes_per_s == 819e9
    assert load_spec("tpu-v5p").flops_per_s["bf16"] == 459e12
    assert load_spec("tpu-v6e").flops_per_s["bf16"] == 918e12
    assert load_spec("tpu-v4").hbm_capacity_bytes == 32 * 2**30
    assert load_spec("b200").hbm_bytes_per_s == 8e12


def test_peak_flops_accepts_hlo_type_names():
    h = load_spec("h100-sxm")
    assert h.peak_flops_per_s("bf16") == 989.4e12
    assert h.peak_flops_per_s("BF16") == 989.4e12
    assert h.peak_flops_per_s("bfloat16") == 989.4e12
    assert h.peak_flops_per_s("f8e4m3fn") == 1978.9e12
    assert h.peak_flops_per_s("f8e5m2") == 1978.9e12
    assert h.peak_flops_per_s("s8") == 1978.9e12
    assert h.peak_flops_per_s("u8") == 1978.9e12
    assert h.peak_flops_per_s("f32") == 66.9e12
    assert h.peak_flops_per_s("c64") == 66.9e12
    assert h.peak_flops_per_s("s32") is None  # known type, no matrix-unit peak
    assert h.peak_flops_per_s("pred") is None
    assert h.peak_flops_per_s("s4") is None  # H100 spec lists no int4
    # TPU: f32 is the vector unit (VPU): clock (bf16 MXU peak / (4 MXUs x 128^2 x 2)) x 8 x 128 lanes
    # x 2 ALUs; f32 dots run on the MXU as bf16 passes (passes/timing.py)
    vpu = 197e12 / (4 * 128 * 128 * 2) * 8 * 128 * 2
    assert abs(load_spec("tpu-v5e").peak_flops_per_s("f32") - vpu) / vpu < 0.01
    with pytest.raises(ValueError, match="unknown dtype 'f31'"):
        h.peak_flops_per_s("f31")
    assert canonical_flops_dtype("f8e4m3b11fnuz") == "fp8"


def test_spec_for_device_kind():
    assert spec_for_device_kind("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert spec_for_device_kind("TPU v5 lite").name == "tpu-v5e"
    assert spec_for_device_kind("TPU v5").name == "tpu-v5p"
    assert spec_for_device_kind("Some Future Chip") is None


def test_builtins_round_trip_through_writer():
    for spec in list_specs():
        again = parse_spec(spec_to_toml(spec), f"<{spec.name}>")
        assert again == spec, spec.name


# ----------------------------------------------------------------- loader errors


def test_minimal_spec_loads(tmp_path):
    spec = load_spec(_write(tmp_path, MINIMAL))
    assert spec.name == "tiny" and spec.flops_per_s == {"bf16": 1e14}
    assert spec.intra_node_bytes_per_s is None
    assert load_spec(str(tmp_path / "spec.toml")) == spec


def test_malformed_toml_names_file_and_line(tmp_path):
    p = _write(tmp_path, MINIMAL.replace("hbm_bytes_per_s = 1e12", "hbm_bytes_per_s = = 1e12"), "broken.toml")
    with pytest.raises(HardwareSpecError) as e:
        load_spec(p)
    msg = str(e.value)
    assert "broken.toml:4:" in msg and "invalid TOML" in msg


def test_missing_key_names_file_and_key(tmp_path):
    text = MINIMAL.replace("hbm_bytes_per_s = 1e12\n", "").replace('hbm_bytes_per_s = "made up for a test"\n', "")
    p = _write(tmp_path, text, "nobw.toml")
    with pytest.raises(HardwareSpecError) as e:
        load_spec(p)
    assert "nobw.toml" in str(e.value) and "'hbm_bytes_per_s'" in str(e.value)


def test_wrong_type_names_line(tmp_path):
    p = _write(tmp_path, MINIMAL.replace("devices_per_node = 1", 'devices_per_node = "eight"'), "typed.toml")
    with pytest.raises(HardwareSpecError, match=r"typed\.toml:7: key 'devices_per_node' must be a number"):
        load_spec(p)


def test_unknown_key_and_dtype_are_rejected(tmp_path):
    p = _write(tmp_path, "hbm_byte_per_s = 1.0\n" + MINIMAL, "typo.toml")
    with pytest.raises(HardwareSpecError, match=r"typo\.toml:1: unknown key 'hbm_byte_per_s'"):
        load_spec(p)
    p = _write(tmp_path, MINIMAL.replace("bf16 = 1e14", "bf16 = 1e14\nfp9 = 1e15"), "dtype.toml")
    with pytest.raises(HardwareSpecError, match=r"dtype\.toml:11: unknown dtype 'fp9'"):
        load_spec(p)


def test_number_without_source_is_rejected(tmp_path):
    p = _write(tmp_path, MINIMAL.replace('"flops_per_s.bf16" = "made up for a test"\n', ""), "nosrc.toml")
    with pytest.raises(HardwareSpecError, match=r"nosrc\.toml:10: no source for 'flops_per_s.bf16'"):
        load_spec(p)


def test_non_positive_value_is_rejected(tmp_path):
    p = _write(tmp_path, MINIMAL.replace("hbm_capacity_bytes = 1000", "hbm_capacity_bytes = -5"), "neg.toml")
    with pytest.raises(HardwareSpecError, match=r"neg\.toml:5: .*positive"):
        load_spec(p)


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(HardwareSpecError, match="absent.toml: no such hardware spec file"):
        load_spec(tmp_path / "absent.toml")
    with pytest.raises(HardwareSpecError, match="unknown hardware 'h1000'.*h100-sxm"):
        load_spec("h1000")


def test_local_missing_tells_user_to_calibrate(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXMOVE_CACHE_DIR", str(tmp_path / "cache"))
    assert local_spec_path() == tmp_path / "cache" / "local.toml"
    with pytest.raises(HardwareSpecError, match="jaxmove calibrate"):
        load_spec("local")


def test_local_spec_path_default(monkeypatch):
    monkeypatch.delenv("JAXMOVE_CACHE_DIR", raising=False)
    assert local_spec_path() == Path.home() / ".cache" / "jaxmove" / "local.toml"


# ----------------------------------------------------------------- writer


def test_write_spec_is_atomic_and_round_trips(tmp_path):
    spec = load_spec("tpu-v5e")
    target = tmp_path / "deep" / "dir" / "v5e.toml"
    assert write_spec(spec, target) == target
    back = load_spec(target)
    # the numbers round trip; the copy, a file named like the built-in, says it is not the
    # built-in (display name with its path, a note: loader.py _mark_builtin_name_reuse)
    assert dataclasses.replace(back, display_name=spec.display_name, notes=spec.notes) == spec
    assert str(target) in back.display_name and back.notes.endswith(f"not the built-in {spec.name}")
    assert os.listdir(target.parent) == ["v5e.toml"]  # no temporary file left behind


def test_write_spec_escapes_strings(tmp_path):
    spec = parse_spec(MINIMAL)
    tricky = HardwareSpec(
        **{
            **{f: getattr(spec, f) for f in ("name", "vendor", "kind", "flops_per_s", "hbm_bytes_per_s",
                                             "hbm_capacity_bytes", "kernel_launch_overhead_s", "devices_per_node")},
            "notes": 'quote " backslash \\ newline \n tab \t done',
            "sources": {**spec.sources, "hbm_bytes_per_s": "C:\\path \"x\""},
        }
    )
    p = write_spec(tricky, tmp_path / "t.toml")
    assert load_spec(p) == tricky


# ----------------------------------------------------------------- calibration


@pytest.fixture(scope="module")
def quick_spec():
    messages: list[str] = []
    spec = calibrate(quick=True, progress=messages.append)
    assert messages, "progress callback was never called"
    return spec


def test_calibrate_quick_gives_positive_finite_numbers(quick_spec):
    s = quick_spec
    assert s.name == "local"
    for key in ("f32", "bf16"):
        v = s.flops_per_s[key]
        assert math.isfinite(v) and 1e8 < v < 1e17, (key, v)
    assert math.isfinite(s.hbm_bytes_per_s) and 1e8 < s.hbm_bytes_per_s < 1e14
    assert 0 < s.kernel_launch_overhead_s < 1e-2
    assert s.hbm_capacity_bytes > 2**20 and s.devices_per_node >= 1
    for key in s.numeric_fields():
        assert s.sources[key].startswith("measured by jaxmove calibrate"), key
    assert s.calibration and s.calibration["quick"] is True
    # each figure's spread is over its own repeats (--quick: 3 per probe, 7 for the launch
    # overheads, calibrate.py's plan), which the unstable-figure warning quotes
    assert s.calibration["flops_per_s_f32_repeats"] == s.calibration["hbm_bytes_per_s_repeats"] == 3
    assert s.calibration["kernel_launch_overhead_s_repeats"] == 7


def test_calibrate_quick_measures_host_runtime_terms(quick_spec):
    import platform

    s = quick_spec
    assert s.dispatch_overhead_s is not None and 0 < s.dispatch_overhead_s < 1e-1
    if s.kind != "cpu" or platform.libc_ver()[0] != "glibc":
        pytest.skip("first-touch calibration applies to glibc CPU hosts")
    if s.first_touch_bytes_per_s is None:
        pytest.skip("a fresh output did not fault on every page here (huge pages?): term not written")
    # a fresh output of 64 MiB or more faults once per 4 KiB page (ru_minflt)
    assert s.calibration["first_touch_faults_per_call"] >= s.calibration["first_touch_array_bytes"] // 4096
    assert 1e6 < s.first_touch_bytes_per_s < s.hbm_bytes_per_s * 10
    assert s.mmap_threshold_bytes == 32 * 2**20
    for key in ("first_touch_bytes_per_s", "mmap_threshold_bytes", "dispatch_overhead_s"):
        assert s.sources[key].startswith("measured by jaxmove calibrate"), key


def test_calibrated_spec_round_trips_as_local(quick_spec, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXMOVE_CACHE_DIR", str(tmp_path))
    path = write_spec(quick_spec, local_spec_path())
    assert path == tmp_path / "local.toml"
    loaded = load_spec("local")
    assert loaded == quick_spec
    assert loaded.path == str(path)


def test_bad_kind_is_named_even_with_a_target_table(tmp_path):
    # with a [target] table the kind used to be reported as the table's fault
    bad = MINIMAL.replace('kind = "gpu"', 'kind = "fpga"')
    for text in (bad, bad + '\n[target]\ncompute_capability = "9.0"\n'):
        p = _write(tmp_path, text, "fpga.toml")
        with pytest.raises(HardwareSpecError, match=r"fpga\.toml:3: key 'kind' must be one of .*got 'fpga'"):
            load_spec(p)
