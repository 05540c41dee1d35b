"""Time estimates: roofline per instruction, program time along the schedule, CLI.

Expected times are computed in the tests from datasheet figures (H100 SXM: 989.4e12 bf16
FLOP/s dense, 66.9e12 f32 FLOP/s, 3.35e12 HBM bytes/s, 2e-6 s per kernel as the spec
charges) and bytes / flops counted by hand from the HLO text.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from jaxmove.cli import main
from jaxmove.hardware import load_spec
from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import analyze_module
from jaxmove.passes.timing import estimate_times, matrix_peak, schedule_order
from jaxmove.passes.traffic import FREE_OPCODES

H100_BF16 = 989.4e12
H100_TF32 = 494.7e12
H100_F32 = 66.9e12
H100_HBM = 3.35e12
H100_LAUNCH = 2e-6


def _times(text: str, hw="h100-sxm"):
    return estimate_times(analyze_module(parse_module(text)), hw if not isinstance(hw, str) else load_spec(hw))


# h100-sxm without sm_clock_hz: dots keep the roofline (the GPU GEMM model needs the clock;
# it is tested in tests/test_gpu_kernels.py)
ROOFLINE_H100 = dataclasses.replace(load_spec("h100-sxm"), sm_clock_hz=None)


def _chain(n: int, dtype: str = "f32") -> str:
    return f"""HloModule chain

fused_chain {{
  p0 = {dtype}[{n}]{{0}} parameter(0)
  a = {dtype}[{n}]{{0}} negate(p0)
  b = {dtype}[{n}]{{0}} exponential(a)
  ROOT c = {dtype}[{n}]{{0}} tanh(b)
}}

ENTRY main {{
  x = {dtype}[{n}]{{0}} parameter(0)
  ROOT f = {dtype}[{n}]{{0}} fusion(x), kind=kLoop, calls=fused_chain
}}
"""


def test_8192_cubed_bf16_matmul_is_compute_bound():
    n = 8192
    text = f"""HloModule mm
ENTRY main {{
  a = bf16[{n},{n}]{{1,0}} parameter(0)
  b = bf16[{n},{n}]{{1,0}} parameter(1)
  ROOT d = bf16[{n},{n}]{{1,0}} dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}"""
    # with the GPU GEMM model (full spec) the dot takes longer than at the datasheet peak
    gemm = _times(text).row("main", "d")
    assert gemm.bound == "compute" and gemm.compute_time_s > 2 * n**3 / H100_BF16
    te = _times(text, ROOFLINE_H100)
    r = te.row("main", "d")
    compute = 2 * n**3 / H100_BF16
    assert r.bound == "compute" and te.bound == "compute"
    assert r.compute_time_s == pytest.approx(compute, rel=1e-12)
    assert r.est_time_s == pytest.approx(compute + H100_LAUNCH, rel=1e-12)
    assert te.est_time_s == pytest.approx(compute + H100_LAUNCH, rel=1e-12)
    compulsory = 3 * n * n * 2
    no_reuse = n**3 * 4 + n * n * 2
    assert compulsory < r.hbm_bytes < no_reuse          # tiling re-reads counted in memory time
    assert r.memory_time_s == pytest.approx(r.hbm_bytes / H100_HBM)
    assert r.arithmetic_intensity == pytest.approx(2 * n**3 / r.hbm_bytes)


def test_large_elementwise_chain_is_memory_bound():
    n = 2**24
    r = _times(_chain(n)).row("main", "f")
    assert r.bound == "memory"
    assert r.hbm_bytes == 2 * n * 4
    assert r.memory_time_s == pytest.approx(2 * n * 4 / H100_HBM)
    # negate: n flops; exponential and tanh: 2n transcendentals, one operation each at the f32 rate
    assert r.compute_time_s == pytest.approx(3 * n / H100_F32)
    assert r.est_time_s == pytest.approx(H100_LAUNCH + 2 * n * 4 / H100_HBM)
    assert r.arithmetic_intensity == pytest.approx(n / (2 * n * 4))


def test_tiny_kernel_is_overhead_bound():
    te = _times(_chain(8))
    r = te.row("main", "f")
    assert r.bound == "overhead" and r.overhead_s == H100_LAUNCH
    assert te.kernels == 1
    assert te.row("main", "x").bound is None and te.row("main", "x").est_time_s == 0


def test_a_kernel_runs_at_least_the_specs_shortest_duration():
    """a100-40gb's kernel_min_duration_s (2.24 us, fitted on a capture): a kernel of 8 floats
    lasts that long, launch gap apart; a large one is untouched; h100-sxm gives none."""
    a100 = load_spec("a100-40gb")
    floor = a100.kernel_min_duration_s
    assert floor == 2.24e-6
    r = _times(_chain(8), a100).row("main", "f")
    assert r.duration_s == pytest.approx(floor) and r.est_time_s == pytest.approx(a100.kernel_launch_overhead_s + floor)
    assert r.bound == "overhead" and any("kernel_min_duration_s" in n for n in r.notes)
    n = 1 << 24  # 64 MiB in, 64 MiB out: far above the floor
    big = _times(_chain(n), a100).row("main", "f")
    assert big.duration_s == pytest.approx(2 * 4 * n / a100.hbm_bytes_per_s) and big.bound == "memory"
    h100 = _times(_chain(8)).row("main", "f")
    assert h100.duration_s < 1e-9 and load_spec("h100-sxm").kernel_min_duration_s is None
    # without a launch (a free opcode) there is no kernel, and no floor
    assert _times(_chain(8), a100).row("main", "x").est_time_s == 0


def test_f32_dot_peaks_follow_precision():
    h100, v5p = load_spec("h100-sxm"), load_spec("tpu-v5p")
    assert matrix_peak(h100, "f32")[:2] == (H100_TF32, "tf32")
    assert matrix_peak(h100, "f32", "highest")[:2] == (H100_F32, "f32")
    assert matrix_peak(h100, "bf16")[:2] == (H100_BF16, "bf16")
    assert matrix_peak(v5p, "f32", "highest")[0] == pytest.approx(459e12 / 6)
    assert matrix_peak(v5p, "f32", "high")[0] == pytest.approx(459e12 / 3)
    assert matrix_peak(v5p, "s32")[0] is None
    text = """HloModule p
ENTRY main {
  a = f32[1024,1024]{1,0} parameter(0)
  b = f32[1024,1024]{1,0} parameter(1)
  ROOT d = f32[1024,1024]{1,0} dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,highest}
}"""
    r = _times(text).row("main", "d")
    assert r.peak_key == "f32" and r.compute_time_s == pytest.approx(2 * 1024**3 / H100_F32)


def test_tpu_vector_work_runs_at_the_vpu_peak():
    # negate + exponential + tanh: 3 vector operations per element; the v5e VPU derivation:
    # clock (197e12 / (4 MXUs x 128^2 x 2)) x 8 sublanes x 128 lanes x 2 ALUs
    te = _times(_chain(2**20), "tpu-v5e")
    r = te.row("main", "f")
    vpu = 197e12 / (4 * 128 * 128 * 2) * 8 * 128 * 2
    assert r.compute_time_s == pytest.approx(3 * 2**20 / vpu, rel=0.01)
    assert not r.unmodeled and r.memory_time_s == pytest.approx(2 * 2**20 * 4 / 819e9)


def test_vector_work_without_a_vector_peak_is_unmodeled_not_invented():
    import dataclasses
    spec = load_spec("tpu-v5e")
    spec = dataclasses.replace(spec, flops_per_s={k: v for k, v in spec.flops_per_s.items() if k != "f32"})
    te = estimate_times(analyze_module(parse_module(_chain(2**20))), spec)
    r = te.row("main", "f")
    assert r.compute_time_s is None
    assert any("no f32 (vector unit) peak" in u for u in r.unmodeled)
    assert te.unmodeled and r.memory_time_s == pytest.approx(2 * 2**20 * 4 / 819e9)


def _copy_overlap(done_first: bool) -> str:
    n, m = 2**22, 2**23
    fus = f"  f = f32[{m}]{{0}} fusion(p1), kind=kLoop, calls=fused_chain"
    done = f"  cd = f32[{n}]{{0}} copy-done(cs)"
    body = "\n".join([done, fus] if done_first else [fus, done])
    return f"""HloModule overlap, is_scheduled=true

fused_chain {{
  q = f32[{m}]{{0}} parameter(0)
  ROOT r = f32[{m}]{{0}} negate(q)
}}

ENTRY main {{
  p0 = f32[{n}]{{0}} parameter(0)
  p1 = f32[{m}]{{0}} parameter(1)
  cs = (f32[{n}]{{0}}, f32[{n}]{{0}}, u32[]) copy-start(p0)
{body}
  ROOT t = (f32[{n}]{{0}}, f32[{m}]{{0}}) tuple(cd, f)
}}
"""


def test_async_copy_overlaps_work_between_start_and_done():
    """The copy runs beside the fusion in the schedule (timeline), but both are memory-bound
    and HBM is one: the program takes at least (2n + 2m) x 4 B / bandwidth, not the longer of
    the two (a user trial saw llama3-8b decode on tpu-v5e estimated at 5.02 ms with 5.23 ms of
    HBM time: XLA:TPU's weight prefetches overlapped the memory-bound kernels for free)."""
    n, m = 2**22, 2**23
    t_copy = H100_LAUNCH + 2 * n * 4 / H100_HBM
    t_fusion = H100_LAUNCH + 2 * m * 4 / H100_HBM
    overlapped = _times(_copy_overlap(done_first=False))
    hbm_floor = 2 * (n + m) * 4 / H100_HBM
    assert hbm_floor > max(t_copy, t_fusion)
    assert overlapped.est_time_s == pytest.approx(hbm_floor)
    assert overlapped.est_time_s >= overlapped.memory_time_s * (1 - 1e-12)
    assert any("its HBM bytes / bandwidth" in note for note in overlapped.notes)
    assert overlapped.serial_time_s == pytest.approx(t_copy + t_fusion)
    serial = _times(_copy_overlap(done_first=True))
    assert serial.est_time_s == pytest.approx(t_copy + t_fusion)
    spans = {name: (s, e) for _c, name, s, e in overlapped.timeline}
    assert spans["cs"][0] == 0 and spans["f"] == (0, pytest.approx(t_fusion))


def test_overhead_note_says_when_async_launches_overlap():
    # 8-element copy and fusion: each is one 2 us launch; the copy runs beside the fusion, so
    # the program takes ~2 us while the launches sum to 4 us
    def tiny(done_first):
        return _copy_overlap(done_first).replace(str(2**22), "8").replace(str(2**23), "8")

    te = _times(tiny(False))
    assert te.kernels == 2 and te.overhead_s == pytest.approx(2 * H100_LAUNCH)
    assert te.est_time_s == pytest.approx(H100_LAUNCH + 2 * 8 * 4 / H100_HBM)
    note = next(n for n in te.notes if n.startswith("kernel launch overhead"))
    assert f"the program's time, {te.est_time_s:.3g} s, is less than this sum" in note
    serial = _times(tiny(True))  # the copy is done before the fusion starts: nothing overlaps
    assert serial.est_time_s == pytest.approx(serial.overhead_s + 4 * 8 * 4 / H100_HBM)
    note = next(n for n in serial.notes if n.startswith("kernel launch overhead"))
    assert "less than this sum" not in note


def test_while_loop_time_is_trip_count_times_body():
    n, trips = 2**20, 4
    text = f"""HloModule loop

fused_chain {{
  p0 = f32[{n}]{{0}} parameter(0)
  ROOT a = f32[{n}]{{0}} negate(p0)
}}

body {{
  t = (s32[], f32[{n}]{{0}}) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  x = f32[{n}]{{0}} get-tuple-element(t), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  y = f32[{n}]{{0}} fusion(x), kind=kLoop, calls=fused_chain
  ROOT r = (s32[], f32[{n}]{{0}}) tuple(i1, y)
}}

cond {{
  t = (s32[], f32[{n}]{{0}}) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  lim = s32[] constant({trips})
  ROOT lt = pred[] compare(i, lim), direction=LT
}}

ENTRY main {{
  x = f32[{n}]{{0}} parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[{n}]{{0}}) tuple(zero, x)
  w = (s32[], f32[{n}]{{0}}) while(init), condition=cond, body=body, backend_config={{"known_trip_count":{{"n":"{trips}"}}}}
  ROOT out = f32[{n}]{{0}} get-tuple-element(w), index=1
}}
"""
    te = _times(text)
    t_add = H100_LAUNCH + max(1 / H100_F32, (4 + 4 + 4) / H100_HBM)   # reads i and one, writes i1
    t_fusion = H100_LAUNCH + 2 * n * 4 / H100_HBM
    t_cmp = H100_LAUNCH + max(1 / H100_F32, (4 + 4 + 1) / H100_HBM)   # reads i and lim, writes pred
    assert te.est_time_s == pytest.approx(trips * (t_add + t_fusion) + (trips + 1) * t_cmp)
    assert te.row("body", "y").est_time_s == pytest.approx(trips * t_fusion)
    assert te.kernels == 2 * trips + trips + 1
    (block,) = [t for t in te.timeline if t[1] == "w"]
    assert block[3] - block[2] == pytest.approx(te.est_time_s)


def test_topological_order_respects_control_predecessors():
    m = parse_module("""HloModule t
ENTRY main {
  x = f32[4]{0} parameter(0)
  a = f32[4]{0} negate(x), control-predecessors={b}
  b = f32[4]{0} exponential(x)
  ROOT t = (f32[4]{0}, f32[4]{0}) tuple(a, b)
}""")
    assert [i.name for i in schedule_order(m.entry, m)] == ["x", "b", "a", "t"]


_ALL_REDUCE = """HloModule ar, replica_count=8

add {
  p0 = f32[] parameter(0)
  p1 = f32[] parameter(1)
  ROOT s = f32[] add(p0, p1)
}

ENTRY main {
  x = f32[16777216]{0} parameter(0)
  ROOT r = f32[16777216]{0} all-reduce(x), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add
}
"""


def test_collective_network_time_or_unmodeled():
    pytest.importorskip("jaxmove.passes.collectives")
    r = _times(_ALL_REDUCE).row("main", "r")
    # ring all-reduce over 8 GPUs sends 2 * 7/8 of 64 MiB per device over 450 GB/s NVLink
    wire = 2 * 7 / 8 * 16777216 * 4
    assert r.network_time_s is not None and r.network_time_s >= wire / 450e9
    assert r.bound == "network"
    # cpu-generic has no intra-node bandwidth nor link latency: no number is made up
    te = _times(_ALL_REDUCE, "cpu-generic")
    r = te.row("main", "r")
    assert r.network_time_s is None and any("network time unmodeled" in u for u in r.unmodeled)


@pytest.fixture(scope="module")
def gpt_decode_report(gpt2_small_decode):
    import jaxmove

    # the program of "gpt2-small-decode" (conftest); the roofline's bounds
    return jaxmove.analyze(gpt2_small_decode, hardware=ROOFLINE_H100)


def test_gpt_decode_on_h100_is_memory_bound(gpt_decode_report):
    rep = gpt_decode_report
    te = rep.times
    assert te.memory_time_s > 10 * te.compute_time_s
    kernels = sum(r.multiplicity.count for r in rep.rows if r.instr.opcode not in FREE_OPCODES)
    assert te.kernels == kernels
    # the program bound is its largest component, launch overhead included (the XLA:CPU
    # program has many small kernels: overhead can exceed the HBM time)
    # runs of >= 5 fusions run in command buffers (XLA:GPU's default): 0.5 us of gap per kernel
    # there plus one 2 us launch per command buffer, 2 us for every other kernel (h100-sxm.toml)
    in_cb = te.command_buffer_kernels
    assert 0 < in_cb <= kernels and 0 < te.command_buffers <= in_cb / 5
    launch_s = (kernels - in_cb) * H100_LAUNCH + in_cb * 0.5e-6 + te.command_buffers * H100_LAUNCH
    assert te.launch_gap_s == pytest.approx(launch_s)
    assert te.bound == ("overhead" if launch_s > te.memory_time_s else "memory")
    expected = rep.totals.hbm_bytes / H100_HBM + launch_s
    assert te.est_time_s == pytest.approx(expected, rel=0.10)
    assert rep.reuse.total_onchip_reuse_bytes > 0


def test_report_json_has_time_and_reuse_fields(gpt_decode_report):
    out = gpt_decode_report.to_json()
    assert out["totals"]["est_time_s"] == gpt_decode_report.times.est_time_s
    assert out["totals"]["onchip_reuse_bytes"] == gpt_decode_report.reuse.total_onchip_reuse_bytes
    assert out["hardware"] == "h100-sxm" and out["time"]["bound"] == gpt_decode_report.times.bound
    rows = out["instructions"]
    for key in ("est_time_s", "bound", "arithmetic_intensity", "onchip_reuse_bytes"):
        assert all(key in r for r in rows), key
    assert math.isclose(sum(r["est_time_s"] for r in rows), out["time"]["serial_time_s"], rel_tol=1e-9)
    assert sum(r["onchip_reuse_bytes"] for r in rows) == out["totals"]["onchip_reuse_bytes"]
    json.dumps(out)


def test_json_without_hardware_has_reuse_not_time(tmp_path):
    import jaxmove

    p = tmp_path / "chain.hlo"
    p.write_text(_chain(1000))
    out = jaxmove.analyze(str(p)).to_json()
    assert out["totals"]["est_time_s"] is None
    assert out["totals"]["onchip_reuse_bytes"] == 4 * 1000 * 4  # (2k - 2) N b with k = 3
    (row,) = [r for r in out["instructions"] if r["name"] == "f"]
    assert row["est_time_s"] is None and row["onchip_reuse_bytes"] == 4 * 1000 * 4


# ---- CLI --------------------------------------------------------------------------------

def test_cli_hardware_lists_specs(capsys):
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    for name in ("h100-sxm", "h200", "a100-80gb", "b200", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"):
        assert name in out
    assert main(["hardware", "h100-sxm"]) == 0
    assert "3.35 TB/s" in capsys.readouterr().out


def test_cli_analyze_hardware_table_and_bad_name(tmp_path, capsys):
    p = tmp_path / "chain.hlo"
    p.write_text(_chain(2**20))
    assert main(["analyze", str(p), "--hardware", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "Estimated time on h100-sxm" in out and "memory" in out
    assert main(["analyze", str(p), "--hardware", "no-such-gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-gpu" in err


def test_calibrate_quick_then_hardware_local(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAXMOVE_CACHE_DIR", str(tmp_path))
    assert main(["calibrate", "--quick", "--force"]) == 0  # --force: a busy test machine spreads
    captured = capsys.readouterr()
    assert "memory bandwidth" in captured.err  # progress lines
    assert (tmp_path / "local.toml").is_file()
    local = load_spec("local")
    p = tmp_path / "chain.hlo"
    p.write_text(_chain(2**16))
    assert main(["analyze", str(p), "--hardware", "local", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hardware"] == "local"
    (row,) = [r for r in out["instructions"] if r["name"] == "f"]
    expected = local.kernel_launch_overhead_s + max(
        2 * 2**16 * 4 / local.hbm_bytes_per_s, 3 * 2**16 / local.flops_per_s["f32"])
    assert row["est_time_s"] == pytest.approx(expected)


def test_pallas_kernel_launches_are_launch_gaps_and_grid_steps_are_named():
    """A Pallas TPU kernel's launch counts in ``launch_gap_s`` like any kernel's (it counted in
    its duration), and its per-grid-step cost (passes/pallas.py) is named in the overhead
    note: overhead = kernels x launch + grid steps x the step cost (a new-user trial: the note
    said 99 kernels x 1.22 us = 129 us, which is 120.8 us)."""
    import importlib.util
    import re
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip('libtpu is not installed (pip install "jaxmove[tpu]")')
    import jaxmove
    from jaxmove.passes.pallas import PALLAS_TPU_STEP_OVERHEAD_S
    rep = jaxmove.analyze("llama3-8b-decode", hardware="tpu-v5e", target="tpu-v5e:1x1", overrides={
        "layers": "2", "d_model": "256", "heads": "2", "kv_heads": "1", "d_ff": "256", "vocab": "512",
        "seq_len": "128", "batch": "2", "scan_layers": "true"})
    t = rep.times
    launch = load_spec("tpu-v5e").kernel_launch_overhead_s
    assert t.launch_gap_s == pytest.approx(t.kernels * launch, rel=1e-9)
    pallas = [r for r in t.rows.values() if r.opcode == "custom-call"]
    assert pallas, "no Pallas kernel in the program"
    steps = 0
    for r in pallas:
        assert r.launch_gap_s == pytest.approx(r.multiplicity * launch, rel=1e-9)
        n = int(re.search(r"pipelined over (\d+) grid steps", " ".join(r.notes)).group(1))
        steps += n * r.multiplicity
        assert r.overhead_s == pytest.approx(r.multiplicity * (launch + n * PALLAS_TPU_STEP_OVERHEAD_S), rel=1e-9)
    assert t.overhead_s == pytest.approx(t.kernels * launch + steps * PALLAS_TPU_STEP_OVERHEAD_S, rel=1e-9)
    note = next(n for n in t.notes if n.startswith("kernel launch overhead"))
    assert f"{t.kernels} kernels x {launch:g} s" in note
    assert f"{steps * PALLAS_TPU_STEP_OVERHEAD_S:.3g} s of per-grid-step overhead in " \
           f"{sum(r.multiplicity for r in pallas)} Pallas kernel runs" in note
