"""The compiler's own figures beside jaxmove's (issue 11 item 6) and ``program.target`` (item 1).

Checked against what XLA itself wrote, read here independently of jaxmove: the
``estimated_cycles`` strings in the HLO text (a regex over the text), ``cost_analysis()``
figures against closed-form FLOPs from the shapes, the TPU clock from the spec TOML file
(tomllib), executions from the loop's trip count written in the hand-made module.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # never start an accelerator client here
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import importlib.util  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import tomllib  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxmove  # noqa: E402
from jaxmove.capture.resolve import resolve_program  # noqa: E402
from jaxmove.capture.xla_figures import fusion_estimated_cycles, xla_figures  # noqa: E402
from jaxmove.hlo import parse_module  # noqa: E402
from jaxmove.passes.pipeline import analyze_module  # noqa: E402

SPECS = Path(jaxmove.__file__).parent / "hardware" / "specs"
N = 1024  # a bf16 [N,N] @ [N,N]: multiples of the TPU tiles


def _clock(spec: str) -> float | None:
    with open(SPECS / f"{spec}.toml", "rb") as f:
        return tomllib.load(f).get("target", {}).get("clock_hz")


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _need(module: str, extra: str):
    if not _have(module):
        pytest.skip(f"{module} is not installed (pip install \"jaxmove[{extra}]\")")


def _cycles_in_text(hlo_text: str) -> dict[str, int]:
    """instruction name -> estimated_cycles, straight from the HLO text."""
    out = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT\s+)?%?([^\s=]+)\s*=.*\"estimated_cycles\":\"(\d+)\"", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def matmul_tanh(x, w):
    return jnp.tanh(x @ w)


# ---- hand-made module: a while loop of 5 trips around a fusion with estimated_cycles ------

LOOP_HLO = """HloModule loop_cycles, entry_computation_layout={(f32[8,128]{1,0})->f32[8,128]{1,0}}

%fused_add (p0: f32[8,128]) -> f32[8,128] {
  %p0 = f32[8,128]{1,0} parameter(0)
  ROOT %a = f32[8,128]{1,0} add(%p0, %p0)
}

%fused_mul (p0.1: f32[8,128]) -> f32[8,128] {
  %p0.1 = f32[8,128]{1,0} parameter(0)
  ROOT %m = f32[8,128]{1,0} multiply(%p0.1, %p0.1)
}

%body (s: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {
  %s = (s32[], f32[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %x.1 = f32[8,128]{1,0} get-tuple-element(%s), index=1
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %f = f32[8,128]{1,0} fusion(%x.1), kind=kLoop, calls=%fused_mul, backend_config={"window_config":{"estimated_cycles":"3000"}}
  ROOT %t = (s32[], f32[8,128]{1,0}) tuple(%i1, %f)
}

%cond (s.1: (s32[], f32[8,128])) -> pred[] {
  %s.1 = (s32[], f32[8,128]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%s.1), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (x: f32[8,128]) -> f32[8,128] {
  %x = f32[8,128]{1,0} parameter(0)
  %g = f32[8,128]{1,0} fusion(%x), kind=kLoop, calls=%fused_add, backend_config={"window_config":{"estimated_cycles":"1500"}}
  %zero = s32[] constant(0)
  %t0 = (s32[], f32[8,128]{1,0}) tuple(%zero, %g)
  %w = (s32[], f32[8,128]{1,0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  ROOT %r = f32[8,128]{1,0} get-tuple-element(%w), index=1
}
"""


@pytest.fixture(scope="module")
def loop_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("xla") / "loop.hlo"
    p.write_text(LOOP_HLO)
    return p


def test_fusion_estimated_cycles_reads_backend_config():
    m = parse_module(LOOP_HLO, "loop.hlo")
    by_name = {i.name: i for c in m.computations.values() for i in c.instructions}
    assert fusion_estimated_cycles(by_name["g"]) == 1500
    assert fusion_estimated_cycles(by_name["f"]) == 3000
    assert fusion_estimated_cycles(by_name["i1"]) is None          # no backend_config
    assert fusion_estimated_cycles(by_name["w"]) is None           # a while's config has none
    bad = parse_module(LOOP_HLO.replace('"3000"', '"-7"').replace('"1500"', '"many"'), "bad.hlo")
    bad_names = {i.name: i for c in bad.computations.values() for i in c.instructions}
    assert fusion_estimated_cycles(bad_names["f"]) is None and fusion_estimated_cycles(bad_names["g"]) is None


def test_hlo_file_cycles_times_trip_count_at_spec_clock(loop_file):
    clock = _clock("tpu-v5e")
    assert clock  # the spec gives one (with a source)
    j = jaxmove.analyze(str(loop_file), hardware="tpu-v5e").to_json()
    assert j["program"]["backend"] == "tpu" and j["program"]["target"] is None
    rows = {r["name"]: r["xla"] for r in j["instructions"]}
    assert rows["g"] == {"estimated_cycles": 1500, "executions": 1, "estimated_s": 1500 / clock}
    assert rows["f"] == {"estimated_cycles": 3000, "executions": 5, "estimated_s": 5 * 3000 / clock}
    x = j["xla"]
    assert x["estimated_cycles"] == 1500 + 5 * 3000 and x["estimated_instructions"] == 2
    assert x["estimated_s"] == pytest.approx((1500 + 5 * 3000) / clock)
    assert x["clock_hz"] == clock and "MXU" in x["clock_source"]   # the spec's cited derivation
    assert x["cost_analysis_available"] is False and x["flops"] is None
    assert any("HLO file" in n for n in x["notes"])


def test_dataframe_columns_carry_xla_cycles(loop_file):
    pytest.importorskip("pandas")
    clock = _clock("tpu-v5e")
    df = jaxmove.analyze(str(loop_file), hardware="tpu-v5e").to_dataframe().set_index("name")
    assert df.loc["g", "xla_estimated_cycles"] == 1500 and df.loc["g", "xla_executions"] == 1
    assert df.loc["f", "xla_estimated_s"] == pytest.approx(5 * 3000 / clock)
    # rows XLA gave no estimate have none (NaN in the frame), not a made-up zero
    assert df["xla_estimated_cycles"].isna().sum() == len(df) - 2
    # a program XLA gave no estimate for (XLA:CPU here) has the columns too, all empty
    cpu = jaxmove.analyze("mlp-tiny", hardware="h100-sxm").to_dataframe()
    for col in ("xla_estimated_cycles", "xla_executions", "xla_estimated_s"):
        assert cpu[col].isna().all(), col


def test_html_instruction_table_has_xla_column(loop_file, tmp_path):
    from jaxmove.report.html import render_html

    clock = _clock("tpu-v5e")
    page = render_html(jaxmove.analyze(str(loop_file), hardware="tpu-v5e"))
    assert "XLA est." in page
    # f: 3000 cycles x 5 trips at the spec's clock, as the cell's sort value
    assert f'data-v="{5 * 3000 / clock}"' in page
    cycles_only = render_html(jaxmove.analyze(str(loop_file)))  # no TPU clock: cycles
    assert "15,000 cycles" in cycles_only and "1,500 cycles" in cycles_only
    bare = tmp_path / "bare.hlo"  # control: no estimated_cycles, no column
    bare.write_text(LOOP_HLO.replace('"estimated_cycles"', '"other"'))
    assert "XLA est." not in render_html(jaxmove.analyze(str(bare), hardware="tpu-v5e"))


def test_hlo_file_without_tpu_spec_gives_cycles_only(loop_file):
    x = jaxmove.analyze(str(loop_file)).to_json()["xla"]
    assert x["estimated_cycles"] == 16500 and x["estimated_s"] is None and x["clock_hz"] is None
    assert any("without seconds" in n for n in x["notes"])


def test_negative_optimal_seconds_is_no_time():
    """XLA sums -1 s per custom call it cannot cost (hlo_cost_analysis.cc HandleCustomCall)."""
    hlo = """HloModule cc, entry_computation_layout={(f32[8,128]{1,0})->(f32[8,128]{1,0}, f32[8,128]{1,0})}

ENTRY %main (x: f32[8,128]) -> (f32[8,128], f32[8,128]) {
  %x = f32[8,128]{1,0} parameter(0)
  %a = f32[8,128]{1,0} custom-call(%x), custom_call_target="ConcatBitcast"
  %b = f32[8,128]{1,0} custom-call(%x), custom_call_target="ConcatBitcast"
  ROOT %t = (f32[8,128]{1,0}, f32[8,128]{1,0}) tuple(%a, %b)
}
"""
    analysis = analyze_module(parse_module(hlo, "cc.hlo"))
    fig = xla_figures(analysis, {"flops": 10.0, "bytes accessed": 4094.0, "optimal_seconds": -1.99997},
                      "tpu", None, "compiled:cc")
    assert fig.optimal_seconds is None and fig.optimal_seconds_reported == -1.99997
    assert fig.custom_calls == 2
    assert any("-1 s" in n and "2 custom-call" in n and "ConcatBitcast" in n for n in fig.notes)
    ok = xla_figures(analysis, {"flops": 10.0, "optimal_seconds": 2e-6}, "tpu", None, "compiled:cc")
    assert ok.optimal_seconds == 2e-6 and any("may count -1" in n for n in ok.notes)


# ---- real device programs (compiled once per module) ------------------------------------

@pytest.fixture(scope="module")
def tpu_matmul():
    _need("libtpu", "tpu")
    x = jax.ShapeDtypeStruct((N, N), jnp.bfloat16)
    program = resolve_program(matmul_tanh, x, x, roles=("activations", "weights"), target="tpu-v5e:2x2")
    return program, jaxmove.analyze(program, hardware="tpu-v5e")


def test_tpu_program_figures_side_by_side(tpu_matmul):
    program, report = tpu_matmul
    j = report.to_json()
    assert j["program"]["target"] == "tpu-v5e:2x2" and j["hardware"] == "tpu-v5e"
    x = j["xla"]
    # XLA:TPU's flops: 2 N^3 for the dot, plus a few per element for the tanh/converts
    assert x["flops"] == pytest.approx(2 * N ** 3, rel=0.01)
    assert x["flops"] == pytest.approx(j["totals"]["flops"], rel=0.01)
    # bytes accessed covers at least reading both operands and writing the result once (bf16)
    assert x["bytes_accessed"] >= 3 * N * N * 2
    assert x["optimal_seconds"] is not None and x["optimal_seconds"] > 0
    assert x["optimal_seconds"] == program.xla_cost_analysis["optimal_seconds"]
    # per kernel: exactly the instructions whose backend_config says estimated_cycles
    expected = _cycles_in_text(program.hlo_text)
    assert expected, "XLA:TPU wrote no estimated_cycles"
    got = {r["name"]: r["xla"] for r in j["instructions"] if r["xla"] is not None}
    assert {k: v["estimated_cycles"] for k, v in got.items()} == expected
    clock = _clock("tpu-v5e")
    for name, v in got.items():
        assert v["executions"] == 1 and v["estimated_s"] == pytest.approx(expected[name] / clock)
    assert x["estimated_cycles"] == sum(expected.values())
    # XLA's own two times of the same program agree to within 2x (both are its models)
    assert 0.5 < x["estimated_s"] / x["optimal_seconds"] < 2


def test_cli_xla_view(tpu_matmul, tmp_path, capsys):
    program, _ = tpu_matmul
    path = tmp_path / "m.hlo"
    path.write_text(program.hlo_text)
    from jaxmove.cli import main
    assert main(["analyze", str(path), "--hardware", "tpu-v5e", "--xla"]) == 0
    out = capsys.readouterr().out
    assert "Program totals" in out and "estimated_cycles" in out
    name, cycles = max(_cycles_in_text(program.hlo_text).items(), key=lambda kv: kv[1])
    assert name in out and f"{cycles:,}" in out


def test_tpu_v6e_has_no_clock_cycles_only():
    _need("libtpu", "tpu")
    assert _clock("tpu-v6e") is None
    x = jax.ShapeDtypeStruct((N, N), jnp.bfloat16)
    j = jaxmove.analyze(matmul_tanh, x, x, target="tpu-v6e:2x2").to_json()
    rows = [r["xla"] for r in j["instructions"] if r["xla"] is not None]
    assert rows and all(r["estimated_cycles"] > 0 and r["estimated_s"] is None for r in rows)
    assert j["xla"]["estimated_s"] is None and j["xla"]["estimated_cycles"] > 0
    assert any("clock_hz" in n for n in j["xla"]["notes"])


def test_gpu_target_has_no_cost_analysis():
    _need("jax_plugins.xla_cuda12", "gpu")
    x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    j = jaxmove.analyze(matmul_tanh, x, x, target="h100-sxm:1x1x1").to_json()
    assert j["program"]["target"] == "h100-sxm:1x1x1" and j["hardware"] == "h100-sxm"
    x = j["xla"]
    assert x["cost_analysis_available"] is False
    assert x["flops"] is None and x["optimal_seconds"] is None and x["estimated_cycles"] is None
    assert any("XLA:GPU gives no cost_analysis" in n for n in x["notes"])
    assert all(r["xla"] is None for r in j["instructions"])
    json.dumps(j)  # serialisable


def test_cpu_program_flops_from_cost_analysis():
    a = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    b = jax.ShapeDtypeStruct((128, 32), jnp.float32)
    j = jaxmove.analyze(lambda a, b: a @ b, a, b).to_json()
    assert j["program"]["target"] == "cpu"
    assert j["xla"]["flops"] == 2 * 64 * 128 * 32
    assert j["xla"]["estimated_cycles"] is None
