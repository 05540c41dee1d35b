"""Excess of a real device program (issue 23 items 3 and 4): the scanned Llama-3-8B decode,
reduced to 2 layers and batch 4 at its full 8192-position cache, compiled for h100-sxm without
the device. One layer's cache window (64 MiB) exceeds the 50 MiB L2 there: compulsory traffic
must not depend on it. The expected bytes are closed forms of the model's shapes."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from tests.test_excess import check_identity  # noqa: E402

CFG = dict(layers=2, batch=4, seq_len=8192, scan_layers="true")
# Llama-3-8B (models/families.py LLAMA3_8B, from meta-llama/Meta-Llama-3-8B config.json)
D, HEADS, KV_HEADS, D_FF, VOCAB = 4096, 32, 8, 14336, 128256
HEAD_DIM, BF16 = D // HEADS, 2


def _have_cuda_plugin() -> bool:
    try:
        from jaxmove.capture.targets import _check_extra
        _check_extra("gpu")
        return True
    except Exception:  # noqa: BLE001 - MissingExtraError and anything the finder raises
        return False


@pytest.fixture(scope="module")
def report():
    if not _have_cuda_plugin():
        pytest.skip("the CUDA plugin (jax-cuda12-plugin) is not installed: no h100-sxm target")
    import jaxmove
    return jaxmove.analyze("llama3-8b-decode", overrides={k: str(v) for k, v in CFG.items()},
                           target="h100-sxm")


def test_scanned_decode_kv_compulsory_is_the_closed_form_beyond_onchip_capacity(report):
    ex = report.excess
    check_identity(ex, report.analysis)
    layers, batch, seq = CFG["layers"], CFG["batch"], CFG["seq_len"]
    per_position = 2 * layers * batch * KV_HEADS * HEAD_DIM * BF16     # k and v
    window = batch * KV_HEADS * seq * HEAD_DIM * BF16                  # one layer's K (or V)
    assert window > ex.onchip_capacity_bytes                           # 64 MiB > 50 MiB L2
    kv = ex.by_role["kv_cache"]
    assert kv.compulsory_bytes == per_position * seq + per_position     # read once + one position
    # XLA:GPU copies each layer's K and V windows out (one multi-output fusion): excess, read
    # from the cache and written, per layer
    for name in ("cache/layers/k_cache", "cache/layers/v_cache"):
        c = ex.cause("slice_copy", name)
        assert c is not None and c.by_role == {"kv_cache": 2 * layers * window}, name


def test_scanned_decode_split_k_partials_are_activations_and_weight_windows_slice_copies(report):
    ex = report.excess
    per_layer = (D * HEADS * HEAD_DIM + 2 * D * KV_HEADS * HEAD_DIM + HEADS * HEAD_DIM * D
                 + 3 * D * D_FF + 2 * D)                    # q, k, v, o, gate/up/down, two norms
    weights = (CFG["layers"] * per_layer + VOCAB * D + D    # + lm_head, final norm
               + CFG["batch"] * D) * BF16                   # + the embedding rows gathered
    assert ex.by_role["weights"].compulsory_bytes == weights
    sk = ex.cause("split_k_partials")
    assert sk is not None and set(sk.by_role) == {"activations"}
    copies = [c for c in ex.causes if c.kind == "slice_copy" and c.subject.startswith("params/")]
    assert copies and all(set(c.by_role) == {"weights"} for c in copies)
    # each weight's window copy: the stacked weight read by the copy kernel and the window written
    q = ex.cause("slice_copy", "params/layers/attn/q/kernel")
    assert q.bytes == 2 * CFG["layers"] * D * HEADS * HEAD_DIM * BF16
