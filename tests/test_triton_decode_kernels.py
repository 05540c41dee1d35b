"""The zoo's own Pallas Triton decode kernels (models/triton_decode.py, issue 24).

- Gemma 2's attention: score soft-capping ``cap * tanh(s / cap)`` and a sliding window, which
  jax's own decode kernel lacks. On h100-sxm (deviceless) the default ``attention=auto`` program
  calls the kernel once per layer, is fully modeled, and no longer writes the f32 scores to HBM
  and reads them back (what the XLA form does): the difference is at least one write and one
  read of ``batch x heads x seq_len`` f32 scores per layer.
- DeepSeek's absorbed latent attention (MLA): one kernel reads each block of the latent cache
  once for the scores and the output; the XLA form reads the cache twice (two einsums) and
  materializes the scores. Under ``--plan tp`` the cache read equals its closed form.

Numerics of both in Pallas's interpreter against attention written here in numpy.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from . import device_compile  # noqa: F401  (JAX_PLATFORMS=cpu before jax starts)

import jax.numpy as jnp  # noqa: E402


def _reference(q, k, v, start, length, scale, cap):
    out = np.zeros_like(q)
    for n in range(q.shape[0]):
        s = q[n] @ k[n].T * scale
        s = cap * np.tanh(s / cap) if cap is not None else s
        ok = (np.arange(k.shape[1]) >= start[n]) & (np.arange(k.shape[1]) < length[n])
        s[:, ~ok] = -np.inf
        p = np.exp(s - s.max(-1, keepdims=True))
        out[n] = (p / p.sum(-1, keepdims=True)) @ v[n]
    return out


@pytest.mark.parametrize("cap, splits", [(2.0, 2), (None, 1), (50.0, 4)])
def test_kernel_matches_softcapped_windowed_attention(cap, splits):
    from models import triton_decode
    rng = np.random.default_rng(7)
    n, h, s, d = 3, 4, 64, 16
    q, k, v = (rng.standard_normal(shape).astype(np.float32) * 2 for shape in ((n, h, d), (n, s, d), (n, s, d)))
    start = np.array([0, 20, 40], np.int32)      # a window's first position per sequence
    length = np.array([50, 64, 41], np.int32)     # valid length (pos + 1)
    got = triton_decode.mqa(*map(jnp.asarray, (q, k, v, start, length)), sm_scale=0.7, softcap=cap,
                            block_k=16, k_splits=splits, interpret=True)
    np.testing.assert_allclose(np.asarray(got), _reference(q, k, v, start, length, 0.7, cap),
                               rtol=2e-5, atol=2e-5)


GEMMA_SETS = {"layers": "2", "seq_len": "1024", "batch": "4", "d_model": "512", "d_ff": "1024",
              "vocab": "1024"}


@pytest.fixture(scope="module")
def gemma_reports():
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        pytest.skip('the CUDA plugin is not installed (pip install "jaxmove[gpu]")')
    import jaxmove
    from jaxmove import zoo
    from jaxmove.capture import capture
    out = {}
    for a in ("xla", "auto"):
        program = capture(zoo.build("gemma2-9b-decode", {**GEMMA_SETS, "attention": a}), target="h100-sxm")
        out[a] = (program, jaxmove.analyze(program, hardware="h100-sxm"))
    return out


def test_gemma2_decode_on_gpu_calls_the_softcap_kernel(gemma_reports):
    (auto_program, auto), (xla_program, xla) = gemma_reports["auto"], gemma_reports["xla"]
    calls = [line for line in auto_program.hlo_text.splitlines()
             if "__gpu$xla.gpu.triton" in line and "softcap_decode" in line]
    assert len(calls) == 2                                       # one call per layer
    assert "softcap_decode" not in xla_program.hlo_text
    assert auto.complete and not auto.unmodeled
    # a Triton call's launch is a launch gap (its command buffer's, or the spec's launch), not
    # part of the kernel's duration
    for r in auto.times.rows.values():
        if r.opcode == "custom-call":
            assert r.launch_gap_s == r.overhead_s > 0 and r.duration_s < r.est_time_s, r
    # the kernel reads the cache once, as compulsory: per layer K and V of [B, Hkv, S, D] bf16
    from jaxmove import zoo
    cfg = zoo.build("gemma2-9b-decode", GEMMA_SETS).config
    cache = 2 * 2 * 4 * cfg["kv_heads"] * 1024 * cfg["head_dim"] * 2
    ex = auto.excess
    assert ex.by_role["kv_cache"].compulsory_bytes >= cache
    assert ex.by_role["kv_cache"].compiled_bytes <= 1.05 * ex.by_role["kv_cache"].compulsory_bytes
    # the f32 scores [B, H, 1, S] of each layer: written and read back at least once by XLA
    scores = 4 * cfg["heads"] * 1024 * 4
    saved = xla.excess.bytes_of("materialized_intermediate") - ex.bytes_of("materialized_intermediate")
    assert saved >= 2 * 2 * scores


def test_gemma2_ring_cache_on_gpu_reads_the_window_once():
    """A sliding window of 256 in a cache of 1024: the local layer's cache is a ring of 256
    positions (TransformerConfig.ring_length), read by the soft-capping kernel once; K and V
    of both layers (1024 + 256 positions) are the compulsory KV reads, compiled within 5%."""
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        pytest.skip('the CUDA plugin is not installed (pip install "jaxmove[gpu]")')
    import jaxmove
    from jaxmove import zoo
    from jaxmove.capture import capture
    wl = zoo.build("gemma2-9b-decode", {**GEMMA_SETS, "sliding_window": "256"})
    program = capture(wl, target="h100-sxm")
    rep = jaxmove.analyze(program, hardware="h100-sxm")
    calls = [line for line in program.hlo_text.splitlines()
             if "__gpu$xla.gpu.triton" in line and "softcap_decode" in line]
    assert len(calls) == 2
    cfg = wl.config
    reads = 2 * 4 * cfg["kv_heads"] * (1024 + 256) * cfg["head_dim"] * 2   # K and V, bf16
    ex = rep.excess.by_role["kv_cache"]
    new = 2 * 2 * 4 * cfg["kv_heads"] * cfg["head_dim"] * 2                 # one position per layer
    assert ex.compulsory_bytes == reads + new
    assert ex.compiled_bytes <= 1.05 * ex.compulsory_bytes


def test_mla_kernel_matches_latent_attention():
    from models import triton_decode
    rng = np.random.default_rng(3)
    n, h, s, r, dr = 2, 4, 64, 32, 16
    ql, qr = rng.standard_normal((n, h, r)).astype(np.float32), rng.standard_normal((n, h, dr)).astype(np.float32)
    c, kr = rng.standard_normal((n, s, r)).astype(np.float32), rng.standard_normal((n, s, dr)).astype(np.float32)
    length = np.array([50, 64], np.int32)
    want = np.zeros_like(ql)
    for i in range(n):
        sc = (ql[i] @ c[i].T + qr[i] @ kr[i].T) * 0.3
        sc[:, length[i]:] = -np.inf
        p = np.exp(sc - sc.max(-1, keepdims=True))
        want[i] = (p / p.sum(-1, keepdims=True)) @ c[i]      # the latent cache is the values too
    merged = np.concatenate([c, kr], axis=-1)   # the zoo's cache: [c_kv | k_rope] in one array
    for splits in (1, 2, 4):
        got = triton_decode.mla(*map(jnp.asarray, (ql, qr, c, kr, length)), sm_scale=0.3, block_k=16,
                                k_splits=splits, interpret=True)
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
        got = triton_decode.mla(*map(jnp.asarray, (ql, qr, merged)), None, jnp.asarray(length), sm_scale=0.3,
                                block_k=16, k_splits=splits, interpret=True)
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


# 64 heads: under tp's DP attention a device attends with every head, one block of the kernel
# (MLA_BLOCK_HEADS; more heads are more blocks, each reading the cache)
DS_SETS = {"layers": "2", "dense_layers": "1", "seq_len": "512", "batch": "4", "d_model": "256",
           "d_ff": "256", "expert_d_ff": "128", "vocab": "1024", "experts": "8", "top_k": "2",
           "heads": "64"}


@pytest.fixture(scope="module")
def deepseek_reports():
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        pytest.skip('the CUDA plugin is not installed (pip install "jaxmove[gpu]")')
    import jaxmove
    from jaxmove.plans import PRESETS
    from jaxmove.plans.compare import capture_with_plan
    out = {}
    for a in ("xla", "auto"):
        program = capture_with_plan("deepseek-v3-decode", {**DS_SETS, "attention": a}, PRESETS["tp"],
                                    {"model": 4}, target="h100-sxm:1x1x4")
        out[a] = (program, jaxmove.analyze(program, hardware="h100-sxm"))
    return out


def test_deepseek_decode_on_gpu_reads_the_latent_cache_once(deepseek_reports):
    from jaxmove import zoo
    (auto_program, auto), (xla_program, xla) = deepseek_reports["auto"], deepseek_reports["xla"]
    def calls(program):
        return [line for line in program.hlo_text.splitlines()
                if "__gpu$xla.gpu.triton" in line and "mla_decode" in line]
    assert len(calls(auto_program)) == 2                         # one call per layer
    assert not calls(xla_program)
    assert auto.complete and not auto.unmodeled
    cfg = zoo.build("deepseek-v3-decode", DS_SETS).config
    # per device and layer: the latent cache [B/n, S, r + dr] ([c_kv | k_rope]) bf16 read, one
    # position written; the one latent kv head splits over batch under tp (B/n = 1 row)
    rd = cfg["kv_lora_rank"] + cfg["qk_rope_dim"]
    cache, new = 2 * (4 // 4) * 512 * rd * 2, 2 * (4 // 4) * rd * 2
    kv = auto.excess.by_role["kv_cache"]
    assert kv.compulsory_bytes == cache + new
    assert kv.compiled_bytes <= 1.01 * kv.compulsory_bytes
    # the XLA form reads the latent cache twice: scores, then the output
    assert xla.excess.by_role["kv_cache"].compiled_bytes >= kv.compiled_bytes + 2 * (4 // 4) * 512 * cfg["kv_lora_rank"] * 2


def test_deepseek_tp_decode_on_gpu_all_reduces_only_the_hidden_state(deepseek_reports):
    """The dense MoE decode form on a GPU-compiled program: every all-reduce carries the
    [B, 1, d] bf16 hidden state (4 x 256 x 2 = 2048 B; twice that where XLA combines the routed
    and shared experts' sums), never the [E, B, 1, d] expert outputs (8 x 2048 B).

    At this reduced size XLA's DotMerger also joins the shared expert's small gate and up dots
    with the routed experts' (both read x): the excess pass's ``concatenated_copy`` is each
    joined weight, [d, (E + 1) x f / 4] bf16, written and read back, for gate and up (at full
    size on h100-sxm:1x4x8 XLA does not merge them: no concatenated_copy in the serving row)."""
    _, auto = deepseek_reports["auto"]
    hidden, slots = 4 * 256 * 2, 8 * 4 * 256 * 2
    reduces = [r.collective.buffer_bytes for r in auto.rows
               if r.collective is not None and r.collective.kind == "all-reduce"]
    assert reduces and all(b in (hidden, 2 * hidden) for b in reduces), reduces
    assert all(r.collective.buffer_bytes < slots for r in auto.rows if r.collective is not None
               and "/attn/" not in (r.instr.metadata.op_name or ""))   # (attention's: DP all-to-alls)
    joined = 256 * (8 + 1) * (128 // 4) * 2
    c = auto.excess.cause("concatenated_copy")
    assert c is not None and c.bytes == 2 * 2 * joined
    assert all("moe" in (i.op_name or "") for i in c.instructions)
