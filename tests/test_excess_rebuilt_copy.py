"""A cache rebuilt around its update in one fusion and copied into the donated result: the copy
carries the new position (compulsory). XLA:GPU compiles a reduced Gemma 2 decode with an int8
cache of head_dim 32 so: a multi-output fusion transposes a layer's cache, writes the new position
into it (dynamic-update-slice), transposes it back (element 0, the whole updated cache) and
dequantizes the keys for the dot (element 1); a ``copy`` then writes element 0 into the donated
result. The compulsory KV write was 64 B per layer short (the new position of that array)."""

from __future__ import annotations

import pytest

import jaxmove

# layers, d_model, heads, kv_heads, head_dim, seq_len, batch, sliding_window
CASES = [(2, 128, 4, 2, 32, 256, 1, 128), (2, 64, 2, 1, 32, 64, 8, 32)]


def _kv_closed_form(L, HKV, HD, S, B, W) -> int:
    """int8 K and V with a bf16 scale per (batch, kv head, position): every position each layer
    holds read once (the even, local layers a ring of W, the odd ones S), one written per layer."""
    per_position = 2 * B * HKV * (HD + 2)
    local = (L + 1) // 2
    return per_position * (local * min(W, S) + (L - local) * S) + per_position * L


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_int8_cache_rebuilt_and_copied_on_xla_gpu(case):
    L, D, H, HKV, HD, S, B, W = case
    sets = dict(layers=L, d_model=D, heads=H, kv_heads=HKV, head_dim=HD, seq_len=S, batch=B,
                sliding_window=W, vocab=512, d_ff=256, kv_dtype="int8")
    r = jaxmove.analyze("gemma2-9b-decode", overrides={k: str(v) for k, v in sets.items()},
                        target="h100-sxm")
    # the form this test is about: a copy of element 0 of a fusion rebuilding an s8 cache
    mod = r.analysis.module
    entry = mod.entry
    rebuilt = []
    for i in entry.instructions:
        if i.opcode != "copy" or not i.shape.is_array or i.shape.element_type != "s8":
            continue
        src = entry.by_name[i.operands[0]]
        if src.opcode == "get-tuple-element" and entry.by_name[src.operands[0]].opcode == "fusion":
            fused = mod.computations[entry.by_name[src.operands[0]].called_computations[0]]
            if any(j.opcode == "dynamic-update-slice" for j in fused.instructions):
                rebuilt.append(i.name)
    assert rebuilt, "XLA:GPU no longer compiles the rebuilt-and-copied form this test checks"
    assert r.excess.by_role["kv_cache"].compulsory_bytes == _kv_closed_form(L, HKV, HD, S, B, W)
    line = r.excess.by_role["kv_cache"]
    causes = sum(c.by_role.get("kv_cache", 0) for c in r.excess.causes)
    assert line.compiled_bytes == line.compulsory_bytes + causes + line.unattributed_bytes
