"""Quantized GEMMs on GPU are timed on the bytes their operands occupy in memory (issue 23.2).

XLA:GPU fuses a weight-only quantized matmul ``x @ w.astype(bf16) * scale`` into one Triton
gemm fusion whose dot sees the bf16 result of a convert inside the fusion: the fusion's
parameter is the stored s8 / f8 / s4 weight. The GPU GEMM model must load (HBM and L2 ->
shared memory) the stored width, as the traffic pass counts it, not the dot's 2 bytes.

The HLO below is what jaxlib 0.10.2 compiles deviceless for h100-sxm (the CUDA plugin, see
``test_real_deviceless_int8_gemv``) for K = 4096, N = 14336, with the dtype substituted.
"""

from __future__ import annotations

import os

import pytest

from jaxmove.hardware import gpu_gemm, load_spec

K, N = 4096, 14336

# (HLO element type, bytes per element as stored: closed form)
STORED = {"s8": 1.0, "f8e4m3fn": 1.0, "f8e5m2": 1.0, "s4": 0.5}


def _hlo(t: str) -> str:
    lay = "{1,0:E(4)}" if t == "s4" else "{1,0}"
    return f"""HloModule m, is_scheduled=true

%gemm_comp (parameter_0: bf16[{K},1], parameter_1: {t}[{K},{N}], parameter_2: bf16[1,{N}]) -> bf16[1,{N}] {{
  %parameter_1 = {t}[{K},{N}]{lay} parameter(1)
  %convert.0 = bf16[{K},{N}]{{1,0}} convert(%parameter_1)
  %parameter_0 = bf16[{K},1]{{1,0}} parameter(0)
  %dot.3 = bf16[{N},1]{{0,1}} dot(%convert.0, %parameter_0), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}, backend_config={{"sizes":["16"]}}
  %bitcast.10 = bf16[1,{N}]{{1,0}} bitcast(%dot.3)
  %parameter_2 = bf16[1,{N}]{{1,0}} parameter(2)
  ROOT %mul.2 = bf16[1,{N}]{{1,0}} multiply(%bitcast.10, %parameter_2)
}}

ENTRY %main (x: bf16[1,{K}], w: {t}[{K},{N}], s: bf16[{N}]) -> bf16[1,{N}] {{
  %s = bf16[{N}]{{0}} parameter(2)
  %bs = bf16[1,{N}]{{1,0}} bitcast(%s)
  %w = {t}[{K},{N}]{lay} parameter(1)
  %x = bf16[1,{K}]{{1,0}} parameter(0)
  %bx = bf16[{K},1]{{1,0}} bitcast(%x)
  ROOT %g = bf16[1,{N}]{{1,0}} fusion(%bx, %w, %bs), kind=kCustom, calls=%gemm_comp, backend_config={{"fusion_backend_config":{{"kind":"__triton_nested_gemm_fusion","block_level_fusion_config":{{"num_warps":"2","output_tiles":[{{"sizes":["8","16"]}}],"num_ctas":1,"num_stages":1}}}}}}
}}
"""


def _row(text: str, hardware: str, tmp_path, name: str):
    import jaxmove

    p = tmp_path / f"{name}.hlo"
    p.write_text(text)
    r = jaxmove.analyze(str(p), hardware=hardware)
    return next(x for x in r.times.rows.values() if x.opcode == "fusion")


@pytest.mark.parametrize("hardware", ["h100-sxm", "b200"])
@pytest.mark.parametrize("etype", sorted(STORED))
def test_quantized_weight_gemv_is_timed_at_its_stored_width(etype, hardware, tmp_path):
    spec = load_spec(hardware)
    w = STORED[etype]
    # compulsory bytes: the weight at its stored width, x and the scale and y in bf16
    closed_bytes = K * N * w + (K + N + N) * 2
    row = _row(_hlo(etype), hardware, tmp_path, f"{etype}_{hardware}")
    # the traffic pass and the closed form agree
    assert row.hbm_bytes == pytest.approx(closed_bytes, rel=1e-9)
    # and the GEMM model's HBM bytes are that traffic's, not the bf16 width's (2x for s8/f8, 4x s4)
    note = next(n for n in row.notes if n.startswith("GPU GEMM model"))
    hbm = int(note.split("HBM ")[1].split(" bytes")[0])
    assert hbm == pytest.approx(K * N * w + (K + N) * 2, rel=0.01)
    # memory time: the HBM time, or the tiles' L2 -> shared-memory loads where those are slower
    # (s4 on b200: half a byte per weight at 8 TB/s outruns the loads)
    closed_s = closed_bytes / spec.hbm_bytes_per_s
    tiles_s = float(note.split("(tiles ")[1].split(" s,")[0])
    assert row.memory_time_s == pytest.approx(max(closed_s, tiles_s), rel=0.01)
    bf16_s = (K * N * 2 + (K + 2 * N) * 2) / spec.hbm_bytes_per_s
    assert row.memory_time_s < 0.6 * bf16_s
    assert any(f"read from memory at {w:g} bytes per element" in n for n in row.notes)
    # the memory-bound kernel's time: its fixed cost and launch on top of at least the HBM time
    assert row.est_time_s >= closed_s + spec.kernel_launch_overhead_s


def test_bf16_weight_gemv_is_unchanged(tmp_path):
    # the control: a bf16 weight has no convert and keeps 2 bytes per element
    text = _hlo("s8").replace("s8[", "bf16[")
    row = _row(text, "h100-sxm", tmp_path, "bf16")
    assert row.hbm_bytes == (K * N + K + 2 * N) * 2
    assert row.memory_time_s == pytest.approx(row.hbm_bytes / 3.35e12, rel=0.01)
    assert not any("read from memory at" in n for n in row.notes)


def test_per_channel_scale_broadcast_inside_the_prologue_counts_its_share():
    # convert(w) * broadcast(scale[N]) in front of the dot: B's bytes per element are
    # 1 (s8) + 2 * N / (K * N) (the bf16 scale, shared by a column's K elements)
    from jaxmove.hlo import parse_module
    from jaxmove.passes.gpu_kernel_time import _stored_elem_bytes

    text = f"""HloModule m

%f (p0: s8[{K},{N}], p1: bf16[{N}]) -> bf16[{K},{N}] {{
  %p0 = s8[{K},{N}]{{1,0}} parameter(0)
  %c = bf16[{K},{N}]{{1,0}} convert(%p0)
  %p1 = bf16[{N}]{{0}} parameter(1)
  %b = bf16[{K},{N}]{{1,0}} broadcast(%p1), dimensions={{1}}
  ROOT %m = bf16[{K},{N}]{{1,0}} multiply(%c, %b)
}}

ENTRY %e (w: s8[{K},{N}], s: bf16[{N}]) -> bf16[{K},{N}] {{
  %w = s8[{K},{N}]{{1,0}} parameter(0)
  %s = bf16[{N}]{{0}} parameter(1)
  ROOT %r = bf16[{K},{N}]{{1,0}} fusion(%w, %s), kind=kLoop, calls=%f
}}
"""
    mod = parse_module(text)
    fc, entry = mod.computations["f"], mod.entry
    got = _stored_elem_bytes("m", fc, entry.by_name["r"], entry)
    assert got == pytest.approx(1.0 + 2.0 * N / (K * N))


@pytest.fixture(scope="module")
def deviceless_int8_gemv_text():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.experimental import topologies

    from jaxmove._platform import quiet_stderr
    from jaxmove.capture.targets import gpu_target_config

    try:
        with quiet_stderr():
            devs = topologies.get_topology_desc("h100", "cuda", target_config=gpu_target_config(load_spec("h100-sxm")),
                                                topology="1x1x1").devices
    except Exception as e:  # noqa: BLE001 - no CUDA plugin installed
        pytest.skip(f"deviceless GPU compilation unavailable: {e}")
    sh = jax.sharding.SingleDeviceSharding(devs[0])
    x = jax.ShapeDtypeStruct((1, K), jnp.bfloat16, sharding=sh)
    w = jax.ShapeDtypeStruct((K, N), jnp.int8, sharding=sh)
    s = jax.ShapeDtypeStruct((N,), jnp.bfloat16, sharding=sh)
    with quiet_stderr():
        return jax.jit(lambda x, w, s: (x @ w.astype(jnp.bfloat16)) * s).lower(x, w, s).compile().as_text()


def test_real_deviceless_int8_gemv(deviceless_int8_gemv_text, tmp_path):
    # the program XLA:GPU compiles: before the fix it was timed on 117,731,328 HBM bytes
    # (the weight at bf16's 2 bytes: 35 us on h100-sxm) while its traffic is 58.8 MB (17.5 us)
    row = _row(deviceless_int8_gemv_text, "h100-sxm", tmp_path, "real")
    closed_bytes = K * N + (K + 2 * N) * 2
    assert row.hbm_bytes == closed_bytes
    assert row.memory_time_s == pytest.approx(closed_bytes / 3.35e12, rel=0.01)
    assert row.memory_time_s < 20e-6
    assert gpu_gemm.FITTED.fixed_cycles > 0  # the fixed cost stays a separate term
