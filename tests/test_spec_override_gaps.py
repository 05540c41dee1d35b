"""``--spec`` overrides and spec files: the gaps a user trial found (keys the target's model never
reads, a user file named like a built-in, zero latencies, repeated keys, the capacity range,
plans' needs / has figures on a GPU target)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from jaxmove.hardware import HardwareSpecError, load_spec, parse_spec, spec_to_toml
from jaxmove.hardware.loader import builtin_name_note
from jaxmove.hardware.overrides import override_spec, parse_spec_overrides, unused_override_reason

TINY_HLO = """HloModule m, is_scheduled=true

ENTRY e {
  p = f32[1048576] parameter(0)
  ROOT n = f32[1048576] negate(p)
}
"""

ALL_REDUCE_HLO = """HloModule m, is_scheduled=true, num_partitions=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  p = f32[262144] parameter(0)
  ROOT r = f32[262144] all-reduce(p), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
}
"""


def _cli(capsys, *args):
    from jaxmove.cli import main
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def tiny_hlo(tmp_path):
    p = tmp_path / "m.hlo"
    p.write_text(TINY_HLO)
    return p


# ---- 1. keys the target's cost model never reads ------------------------------------------------

@pytest.mark.parametrize("spec_name, key, words", [
    ("h100-sxm", "link_latency_s", "NCCL"),                       # NCCL's own latency tables
    ("a100-80gb", "link_latency_s", "NCCL"),
    ("tpu-v5e", "intra_node_bytes_per_s", "ici_bytes_per_s_per_link"),  # ICI links, not NVLink
    ("tpu-v5p", "inter_node_bytes_per_s", "ici_bytes_per_s_per_link"),
    ("h100-sxm", "ici_bytes_per_s_per_link", "only TPU specs"),
    ("tpu-v5p", "tensor_cores_per_chip", "no cost model reads it"),  # (no pass reads them:
    ("tpu-v5e", "torus_dims", "--target topology"),                      #  grep jaxmove/passes)
    # GPU-only figures on a TPU or CPU spec (gpu_gemm.py needs kind gpu; the command-buffer gap
    # is XLA:GPU's), and L2 on a TPU, whose on-chip capacity is VMEM
    ("tpu-v5e", "num_sms", "only GPU specs"),
    ("tpu-v5p", "sm_clock_hz", "only GPU specs"),
    ("cpu-generic", "smem_per_sm_bytes", "only GPU specs"),
    ("tpu-v6e", "command_buffer_launch_overhead_s", "only GPU specs"),
    ("tpu-v5e", "l2_bytes", "vmem_bytes"),
    # and VMEM off a TPU (a user trial: accepted on h100-sxm, changing nothing)
    ("h100-sxm", "vmem_bytes", "override l2_bytes"),
    ("cpu-generic", "vmem_bytes", "only a TPU's"),
])
def test_override_of_a_key_the_target_never_reads_is_an_error(spec_name, key, words):
    spec = load_spec(spec_name)
    with pytest.raises(HardwareSpecError) as e:
        value = {"link_latency_s": "1e-3", "tensor_cores_per_chip": "2", "torus_dims": "3", "num_sms": "100",
                 "command_buffer_launch_overhead_s": "1e-6", "smem_per_sm_bytes": "100000",
                 "sm_clock_hz": "1.5e9", "l2_bytes": "1e6", "vmem_bytes": "1e6"}.get(key, "1e11")
        override_spec(spec, [f"{key}={value}"])
    msg = str(e.value)
    assert msg.startswith(f"--spec {key}=") and f"{key} is not used for" in msg and spec_name in msg
    assert words in msg


def test_keys_the_target_reads_stay_accepted():
    # the GPU-only figures on GPUs; L2 (the LLC) on a CPU spec: passes/reuse.py reads it
    for key, value in (("num_sms", "100"), ("sm_clock_hz", "1.5e9"), ("smem_per_sm_bytes", "100000"),
                       ("command_buffer_launch_overhead_s", "1e-6")):
        assert getattr(override_spec(load_spec("h100-sxm"), [f"{key}={value}"]), key) == float(value)
    assert override_spec(load_spec("cpu-generic"), ["l2_bytes=1000000"]).l2_bytes == 1_000_000
    # TPU collectives: link_latency_s x ring steps + bytes / ICI bandwidth
    assert override_spec(load_spec("tpu-v5e"), ["link_latency_s=2e-6"]).link_latency_s == 2e-6
    # GPU: NVLink / network bandwidths feed the NCCL model
    assert override_spec(load_spec("h100-sxm"), ["intra_node_bytes_per_s=300e9"]).intra_node_bytes_per_s == 300e9
    assert override_spec(load_spec("h100-sxm"), ["inter_node_bytes_per_s=25e9"]).inter_node_bytes_per_s == 25e9
    # a GPU spec without an intra-node bandwidth is timed by passes/collectives.py, which reads it
    no_nvlink = dataclasses.replace(load_spec("h100-sxm"), intra_node_bytes_per_s=None,
                                    sources={k: v for k, v in load_spec("h100-sxm").sources.items()
                                             if k != "intra_node_bytes_per_s"})
    assert unused_override_reason(no_nvlink, "link_latency_s") is None


def test_cli_unused_key_exit_2_and_no_output(tmp_path, tiny_hlo, capsys):
    html = tmp_path / "r.html"
    code, out, err = _cli(capsys, "analyze", str(tiny_hlo), "--hardware", "h100-sxm", "--spec",
                          "link_latency_s=1e-3", "--json", "--html", str(html))
    assert code == 2 and not out and "Traceback" not in err
    assert "link_latency_s is not used for GPU spec h100-sxm" in err
    assert not html.exists()  # nothing half-written


# ---- 2. a user's file named like a built-in ---------------------------------------------------

def test_user_file_with_a_builtin_name_says_so(tmp_path, tiny_hlo, capsys):
    mine = tmp_path / "my-h100.toml"
    mine.write_text(spec_to_toml(dataclasses.replace(load_spec("h100-sxm"), hbm_bytes_per_s=2e12)))
    spec = load_spec(str(mine))
    assert spec.name == "h100-sxm"  # the compile target and device kind stay the name's
    assert str(mine) in spec.display_name
    assert builtin_name_note(spec) == f"spec h100-sxm loaded from {mine}, not the built-in h100-sxm"
    assert builtin_name_note(load_spec("h100-sxm")) is None  # the built-in itself: no note
    # analyze: the time notes say where the numbers come from
    code, out, err = _cli(capsys, "analyze", str(tiny_hlo), "--hardware", str(mine), "--json")
    assert code == 0, err
    notes = json.loads(out)["time"]["notes"]
    assert f"spec h100-sxm loaded from {mine}, not the built-in h100-sxm" in notes
    # with --spec too: both notes; the overridden spec's TOML round trip (plans' child
    # processes) keeps the file's note once and adds no note for the temporary file
    over = override_spec(spec, ["hbm_bytes_per_s=1.5e12"])
    again = tmp_path / "h100-sxm.toml"
    again.write_text(spec_to_toml(over))
    back = load_spec(str(again))
    assert builtin_name_note(back) == builtin_name_note(spec)
    assert back.notes.count("not the built-in") == 1
    # an overridden built-in written to a file jaxmove made: no note about that file
    plain = tmp_path / "plain" / "h100-sxm.toml"
    plain.parent.mkdir()
    plain.write_text(spec_to_toml(override_spec(load_spec("h100-sxm"), ["hbm_bytes_per_s=1.5e12"])))
    assert builtin_name_note(load_spec(str(plain))) is None


def test_plans_notes_name_the_users_file(tmp_path, capsys):
    mine = tmp_path / "h100-sxm.toml"
    mine.write_text(spec_to_toml(load_spec("h100-sxm")))
    code, out, err = _cli(capsys, "plans", "mlp-tiny", "--mesh", "data=2", "--plan", "dp", "--hardware",
                          str(mine), "--json", "--no-progress")
    assert code == 0, err
    assert f"spec h100-sxm loaded from {mine}, not the built-in h100-sxm" in json.loads(out)["notes"]


# ---- 3. zero latency / launch overhead --------------------------------------------------------

def test_zero_latency_and_launch_overhead_are_accepted():
    assert parse_spec_overrides(["link_latency_s=0"]) == {"link_latency_s": 0.0}
    assert parse_spec_overrides(["kernel_launch_overhead_s=0"]) == {"kernel_launch_overhead_s": 0.0}
    for item in ("hbm_bytes_per_s=0", "flops_per_s.bf16=0", "inter_node_bytes_per_s=0", "link_latency_s=-1"):
        with pytest.raises(HardwareSpecError) as e:
            parse_spec_overrides([item])
        key = item.split("=")[0]
        assert key in str(e.value) and ("positive" in str(e.value) or ">= 0" in str(e.value))
    # a tiny nonzero value is still a typo
    with pytest.raises(HardwareSpecError, match=r"physical range \[1e-12, 1000\] s .*or exactly 0"):
        parse_spec_overrides(["link_latency_s=1e-20"])


def test_spec_files_take_zero_for_the_same_keys():
    base = load_spec("tpu-v5e")
    text = spec_to_toml(base)
    s = parse_spec(text.replace(f"link_latency_s = {base.link_latency_s!r}\n", "link_latency_s = 0.0\n")
                   .replace(f"kernel_launch_overhead_s = {base.kernel_launch_overhead_s!r}\n",
                            "kernel_launch_overhead_s = 0\n"))
    assert s.link_latency_s == 0.0 and s.kernel_launch_overhead_s == 0.0
    assert parse_spec(spec_to_toml(s)) == s  # round trip
    with pytest.raises(HardwareSpecError, match="'hbm_bytes_per_s' must be a positive finite number"):
        parse_spec(text.replace(f"hbm_bytes_per_s = {base.hbm_bytes_per_s!r}\n", "hbm_bytes_per_s = 0\n"))


def test_zero_latency_changes_the_collective_time(tmp_path):
    import jaxmove
    path = tmp_path / "ar.hlo"
    path.write_text(ALL_REDUCE_HLO)
    base = load_spec("tpu-v5e")
    t0 = jaxmove.analyze(str(path), hardware=base).times.network_time_s
    t1 = jaxmove.analyze(str(path), hardware=override_spec(base, ["link_latency_s=0"])).times.network_time_s
    assert t0 > t1 > 0  # the bytes over the links remain


def test_zero_launch_overhead_keeps_the_kernels(tiny_hlo):
    import jaxmove
    spec = override_spec(load_spec("h100-sxm"), ["kernel_launch_overhead_s=0"])
    tm = jaxmove.analyze(str(tiny_hlo), hardware=spec).times
    assert tm.overhead_s == 0.0
    assert tm.kernels == 1  # the negate still launches a kernel, at no cost
    assert tm.est_time_s == pytest.approx(2 * 4 * 2**20 / spec.hbm_bytes_per_s, rel=0.05)


# ---- 4. a key given twice ----------------------------------------------------------------------

def test_a_key_given_twice_is_an_error(tiny_hlo, capsys):
    with pytest.raises(HardwareSpecError) as e:
        parse_spec_overrides(["hbm_bytes_per_s=1e12", "num_sms=100", "hbm_bytes_per_s=2e12"])
    msg = str(e.value)
    assert "hbm_bytes_per_s given twice" in msg and "1e12" in msg and "2e12" in msg
    code, out, err = _cli(capsys, "analyze", str(tiny_hlo), "--hardware", "h100-sxm", "--spec", "num_sms=100",
                          "--spec", "num_sms=120")
    assert code == 2 and not out and "num_sms given twice (num_sms=100 and num_sms=120)" in err


# ---- 5. the capacity's physical range ----------------------------------------------------------

@pytest.mark.parametrize("value", ["1e30", "0.5", "1e18"])
def test_capacity_override_is_range_checked(value, tiny_hlo, capsys):
    with pytest.raises(HardwareSpecError) as e:
        parse_spec_overrides([f"hbm_capacity_bytes={value}"])
    assert "hbm_capacity_bytes" in str(e.value) and "physical range [1, 1e+17] bytes" in str(e.value)
    code, out, err = _cli(capsys, "analyze", str(tiny_hlo), "--hardware", "h100-sxm", "--spec",
                          f"hbm_capacity_bytes={value}")
    assert code == 2 and not out and "physical range [1, 1e+17] bytes" in err
    assert parse_spec_overrides(["hbm_capacity_bytes=1e17"]) == {"hbm_capacity_bytes": 10**17}


# ---- 6. plans on a GPU target: needs_bytes / has_bytes of a plan that does not fit --------------

def test_gpu_plan_that_does_not_fit_has_needs_and_has_bytes(capsys):
    import importlib.util
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        pytest.skip("jax_plugins.xla_cuda12 is not installed (the gpu extra)")
    code, out, err = _cli(capsys, "plans", "mlp-tiny", "--target", "h100-sxm:1x1x2", "--mesh", "data=2",
                          "--plan", "dp", "--spec", "hbm_capacity_bytes=10000", "--json", "--no-progress")
    assert code == 0, err
    (dp,) = json.loads(out)["plans"]
    assert dp["fits"] is False
    assert dp["needs_bytes"] == dp["peak_bytes"] > 10000 and dp["has_bytes"] == 10000
    assert any(n.startswith("does not fit: needs ") and "XLA:GPU memory_analysis" in n for n in dp["notes"])


def test_plan_without_memory_analysis_says_why_figures_are_null(tiny_hlo):
    import jaxmove
    from jaxmove.plans.compare import summarize
    from jaxmove.plans.plan import PRESETS
    report = jaxmove.analyze(str(tiny_hlo), hardware="h100-sxm")
    res = summarize(report, PRESETS["dp"], load_spec("h100-sxm"), 1, {}, "gpu")
    assert res.fits is None and res.needs_bytes is None and res.has_bytes is None
    assert any("gave no memory_analysis" in n and "needs_bytes / has_bytes are null" in n for n in res.notes)


def test_capacity_source_keeps_brackets_balanced():
    """The capacity message gives the source's first clause; a comma inside brackets (an
    override's "(--spec ...)" or the old value's "(datasheet, ...)") does not cut it open."""
    from jaxmove.api import capacity_source
    from jaxmove.hardware import load_spec
    from jaxmove.hardware.overrides import override_spec

    text = capacity_source(override_spec(load_spec("h100-sxm"), {"hbm_capacity_bytes": 4e10}))
    assert text.startswith("hbm_capacity_bytes = 40,000,000,000 B of spec h100-sxm (user override")
    assert text.count("(") == text.count(")")
    assert "the spec's value was" not in text  # (the clause after the ';')


def test_plans_text_gives_needs_and_has_of_a_plan_over_the_spec_capacity(capsys):
    """A plan that compiled but whose peak exceeds the spec's capacity: the text table says
    NO (needs PEAK, has CAPACITY), the peak being the plan's own peak column, and says whose
    figures they are (it said only '> capacity')."""
    code, out, err = _cli(capsys, "plans", "mlp-tiny", "--mesh", "data=2", "--plan", "dp", "--hardware",
                          "h100-sxm", "--spec", "hbm_capacity_bytes=1000", "--no-progress")
    assert code == 0, err
    assert "X is its peak per device" in out
    code, js, err = _cli(capsys, "plans", "mlp-tiny", "--mesh", "data=2", "--plan", "dp", "--hardware",
                         "h100-sxm", "--spec", "hbm_capacity_bytes=1000", "--json", "--no-progress")
    row = json.loads(js)["plans"][0]
    assert row["fits"] is False and row["has_bytes"] == 1000
    from jaxmove.units import human_bytes
    flat = " ".join(out.split())   # (rich wraps the cell)
    assert f"NO (needs {human_bytes(row['needs_bytes'])}, has {human_bytes(1000)})" in flat, flat


def test_overrides_show_in_the_headline_and_the_json(tiny_hlo, capsys):
    """--spec overrides are named where the time is given: the headline and JSON
    ``hardware_overrides`` (they were only in a note; ``hardware`` stays the spec's name)."""
    code, out, err = _cli(capsys, "analyze", str(tiny_hlo), "--hardware", "h100-sxm", "--spec",
                          "hbm_bytes_per_s=1.675e12")
    assert code == 0, err
    assert "Estimated time on h100-sxm [--spec hbm_bytes_per_s=1.675e+12]:" in " ".join(out.split())
    code, js, err = _cli(capsys, "analyze", str(tiny_hlo), "--hardware", "h100-sxm", "--spec",
                         "hbm_bytes_per_s=1.675e12", "--json")
    d = json.loads(js)
    assert d["hardware"] == "h100-sxm" and d["hardware_overrides"] == ["hbm_bytes_per_s=1.675e+12"]
    code, js, err = _cli(capsys, "analyze", str(tiny_hlo), "--hardware", "h100-sxm", "--json")
    assert json.loads(js)["hardware_overrides"] == []
