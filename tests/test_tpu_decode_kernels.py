"""The Pallas TPU latent-attention decode kernel (``models/tpu_decode.py``, issue 24): numerics in
Pallas's interpreter against attention written here in numpy, and a reduced DeepSeek-V3 decode
compiled for TPU v5p without the device, where each layer's kernel reads that layer's merged
cache once, in the layout XLA:TPU gives the cache (positions minor), with no layout copy.

Closed forms: a device's merged cache per layer is B_dev x S x (r + dr) x 2 bytes (bf16).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


def _reference(ql, qr, c, kr, pos, scale):
    want = np.zeros_like(ql)
    for i in range(ql.shape[0]):
        sc = (ql[i] @ c[i].T + qr[i] @ kr[i].T) * scale
        sc[:, pos + 1:] = -np.inf
        p = np.exp(sc - sc.max(-1, keepdims=True))
        want[i] = (p / p.sum(-1, keepdims=True)) @ c[i]      # the latent cache is the values too
    return want


@pytest.mark.parametrize("pos", [0, 49, 130, 255])
@pytest.mark.parametrize("block", [128, 256])
def test_tpu_mla_kernel_matches_latent_attention(pos, block):
    from models import tpu_decode
    rng = np.random.default_rng(5)
    n, h, s, r, dr = 2, 16, 256, 128, 64
    ql, qr = rng.standard_normal((n, h, r)).astype(np.float32), rng.standard_normal((n, h, dr)).astype(np.float32)
    c, kr = rng.standard_normal((n, s, r)).astype(np.float32), rng.standard_normal((n, s, dr)).astype(np.float32)
    merged = np.concatenate([c, kr], axis=-1)   # the zoo's cache: [c_kv | k_rope] in one array
    got = tpu_decode.mla(jnp.asarray(ql), jnp.asarray(qr), jnp.asarray(merged), jnp.int32(pos),
                         sm_scale=0.3, block_k=block, interpret=True)
    np.testing.assert_allclose(np.asarray(got), _reference(ql, qr, c, kr, pos, 0.3), rtol=2e-5, atol=2e-5)


def test_tpu_mla_kernel_refuses_what_it_cannot_tile():
    from models import tpu_decode
    z = jnp.zeros
    with pytest.raises(ValueError, match="r \\+ dr = 192"):
        tpu_decode.mla(z((1, 8, 128)), z((1, 8, 64)), z((1, 256, 128)), jnp.int32(0), sm_scale=1.0)
    with pytest.raises(ValueError, match="not a multiple of the key block 256"):
        tpu_decode.mla(z((1, 8, 128)), z((1, 8, 64)), z((1, 384, 192)), jnp.int32(0), sm_scale=1.0,
                       block_k=256)


# reduced DeepSeek-V3 (MLA r = 512, dr = 64 as the full model), 64 heads, tp over 4 v5p chips:
# the latent cache split over batch (DP attention), one sequence per chip
DS_SETS = {"layers": "2", "dense_layers": "1", "seq_len": "1024", "batch": "4", "d_model": "256",
           "d_ff": "256", "expert_d_ff": "128", "vocab": "1024", "experts": "8", "top_k": "2",
           "heads": "64"}
R, DR = 512, 64


@pytest.fixture(scope="module")
def deepseek_tpu():
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install 'jaxmove[tpu]')")
    import jaxmove
    from jaxmove.plans import PRESETS
    from jaxmove.plans.compare import capture_with_plan
    out = {}
    for a in ("xla", "auto"):
        program = capture_with_plan("deepseek-v3-decode", {**DS_SETS, "attention": a}, PRESETS["tp"],
                                    {"model": 4}, target="tpu-v5p:2x2x1")
        out[a] = jaxmove.analyze(program, hardware="tpu-v5p")
    return out


def test_deepseek_decode_on_tpu_reads_each_layer_cache_once_in_place(deepseek_tpu):
    rep = deepseek_tpu["auto"]
    layers = int(DS_SETS["layers"])
    cache_layer = (int(DS_SETS["batch"]) // 4) * int(DS_SETS["seq_len"]) * (R + DR) * 2
    kernels = [r for r in rep.rows if r.instr.opcode == "custom-call" and r.instr.name.startswith("mla_decode")]
    assert len(kernels) == layers
    for r in kernels:
        # operands: the position, the queries [1, H, r + dr], the cache [1, r + dr, S]
        assert [a.nbytes for a in r.traffic.reads][-1] == cache_layer
    ex = rep.excess
    # the cache reaches the kernel as it is stored: no layout copy of it, in or out
    assert not [c for c in ex.causes if c.kind == "layout_change" and "latent_cache" in c.subject]
    assert not any(r.instr.opcode == "copy" and r.instr.shape.dims == (1, int(DS_SETS["seq_len"]), R + DR)
                   for r in rep.rows)
    # the same compulsory bytes as XLA's form of the same step (the kernel changes no semantics)
    xla = deepseek_tpu["xla"].excess
    for role in ("weights", "kv_cache", "activations"):
        assert ex.by_role[role].compulsory_bytes == xla.by_role[role].compulsory_bytes, role
    assert rep.complete and not rep.analysis.unmodeled


@pytest.mark.parametrize("sets, mesh, plan", [
    # tp with 2 kv heads over model=4 falls back to batch, and batch 2 does not divide 4: the
    # cache is split over its length
    ({"batch": "2", "kv_heads": "2"}, {"model": 4}, "tp"),
    # dp over data=4 with batch 2: nothing divides, every array replicated
    ({"batch": "2", "kv_heads": "4"}, {"data": 4}, "dp"),
])
def test_flash_decode_under_a_plan_that_splits_no_batch_or_heads(sets, mesh, plan):
    """XLA cannot partition a Mosaic kernel: a plan that splits the cache's sequence, or
    nothing, made the TPU flash decode an internal error ("Mosaic kernels cannot be
    automatically partitioned"); the kernel now runs in shard_map on the whole sequence."""
    import importlib.util
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (the tpu extra)")
    from jaxmove.api import analyze
    from jaxmove.plans import PRESETS, capture_with_plan
    small = {"layers": "2", "d_model": "256", "heads": "4", "d_ff": "512", "vocab": "512", "seq_len": "128"}
    rep = analyze(capture_with_plan("llama3-8b-decode", {**small, **sets}, PRESETS[plan], mesh,
                                    target="tpu-v5e:2x2"))
    kernels = [r for r in rep.rows if r.instr.opcode == "custom-call"
               and r.instr.custom_call_target == "tpu_custom_call"]
    assert len(kernels) == 2   # one flash decode per layer
