"""Model zoo: abstract builds, closed-form sizes, overrides, and numerics of decode."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmove import zoo as models
from jaxmove.capture import capture


def gpt_param_count(V, d, H, Hkv, L, S, F=None):
    """GPT parameter count by hand (tied LM head, biases everywhere, pre-LN)."""
    D = d // H
    F = F or 4 * d
    per_layer = (
        2 * 2 * d                      # ln1, ln2: scale + bias
        + d * H * D + H * D            # query
        + 2 * (d * Hkv * D + Hkv * D)  # key, value
        + H * D * d + d                # out
        + d * F + F + F * d + d        # mlp fc, proj
    )
    return V * d + S * d + L * per_layer + 2 * d  # wte, wpe, blocks, ln_f


def leaves(tree):
    return jax.tree.leaves(tree)


def n_elems(tree):
    return sum(int(np.prod(x.shape)) for x in leaves(tree))


def test_presets_listed_and_unknown_preset():
    names = [n for n, _ in models.list_presets()]
    for required in ("mlp", "mlp-tiny", "gpt2-small-prefill", "gpt2-small-decode",
                     "gpt-tiny-prefill", "gpt-tiny-decode"):
        assert required in names
    assert all(isinstance(d, str) and d and "\n" not in d for _, d in models.list_presets())
    with pytest.raises(models.PresetError, match="gpt-tiny-decode"):
        models.build("nope")


def test_keys_the_program_never_reads_are_refused():
    """A ``--set`` key that would compile the same program (silently) is an error naming it:
    remat outside a training step, the MoE keys of a dense model; where they apply they pass."""
    small = {"layers": "1", "d_model": "64", "heads": "2", "kv_heads": "1", "d_ff": "128",
             "vocab": "256", "seq_len": "16", "batch": "1"}
    for preset in ("llama3-8b-decode", "llama3-8b-prefill"):
        with pytest.raises(models.PresetError, match=r"remat=full: remat applies to the training presets"):
            models.check_overrides(preset, {**small, "remat": "full"})
    models.check_overrides("llama3-8b-train", {**small, "remat": "full"})
    models.check_overrides("llama3-8b-decode", {**small, "remat": "none", "shared_experts": "0"})  # defaults
    for key, value in (("top_k", "1"), ("expert_d_ff", "64"), ("shared_experts", "1"), ("dense_layers", "1")):
        with pytest.raises(models.PresetError, match=rf"--set {key}={value}: {key} applies to mixture-of-experts"):
            models.check_overrides("llama3-8b-decode", {**small, key: value})
    models.check_overrides("llama3-8b-decode", {**small, "experts": "4", "top_k": "1", "expert_d_ff": "64"})
    models.check_overrides("mixtral-8x7b-decode", {**small, "top_k": "1"})
    # a training step has no KV cache, and trains unquantized weights: its cache keys change
    # nothing, and weights_dtype is refused when a sweep file is read, not only at build
    for key, value in (("kv_dtype", "int8"), ("stacked_cache", "true")):
        with pytest.raises(models.PresetError, match=rf"--set {key}={value}: {key} applies to a KV cache"):
            models.check_overrides("llama3-8b-train", {**small, key: value})
        models.check_overrides("llama3-8b-decode", {**small, key: value})
    with pytest.raises(models.PresetError, match=r"weights_dtype=int8: training presets train unquantized"):
        models.check_overrides("llama3-8b-train", {**small, "weights_dtype": "int8"})


def test_gpt2_small_is_abstract_and_has_124m_params():
    wl = models.build("gpt2-small-decode")
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves(wl.args))
    params, cache, tokens, pos = wl.args
    # The published GPT-2 small size (n_ctx 1024, tied head): 124,439,808.
    assert n_elems(params) == 124_439_808 == gpt_param_count(50257, 768, 12, 12, 12, 1024)
    assert {x.dtype for x in leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    assert cache["layers"][0]["k_cache"].shape == (1, 12, 1024, 64)  # [B, H_kv, S, D]
    assert tokens.shape == (1, 1) and tokens.dtype == jnp.int32
    assert pos.shape == () and pos.dtype == jnp.int32
    assert wl.donate_argnums == (1,)


def test_gpt2_small_decode_compiles_on_cpu():
    t0 = time.perf_counter()
    prog = capture(models.build("gpt2-small-decode"))
    assert time.perf_counter() - t0 < 60
    by_role = {}
    for p in prog.parameters:
        by_role[p.role] = by_role.get(p.role, 0) + p.byte_size
    assert by_role["weights"] == 124_439_808 * 2
    assert by_role["kv_cache"] == 2 * 12 * 1 * 1024 * 12 * 64 * 2
    assert prog.source == "zoo:gpt2-small-decode"


@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # MHA, GQA, MQA
@pytest.mark.parametrize("scan", [False, True])
def test_gpt_tiny_decode_roles_and_bytes(kv_heads, scan):
    V, d, H, L, B, S, b = 256, 64, 4, 2, 2, 16, 4
    D = d // H
    prog = capture(models.build("gpt-tiny-decode",
                                {"kv_heads": str(kv_heads), "scan_layers": str(scan).lower()}))
    roles = {p.role for p in prog.parameters}
    assert roles == {"weights", "kv_cache", "activations"}
    weights = sum(p.byte_size for p in prog.parameters if p.role == "weights")
    cache = [p for p in prog.parameters if p.role == "kv_cache"]
    acts = [p for p in prog.parameters if p.role == "activations"]
    assert weights == gpt_param_count(V, d, H, kv_heads, L, S) * b
    assert sum(p.byte_size for p in cache) == 2 * L * B * S * kv_heads * D * b
    assert all(p.donated for p in cache) and not any(p.donated for p in prog.parameters if p.role != "kv_cache")
    assert all("cache" in p.path for p in cache)
    assert sorted(p.path for p in acts) == ["pos", "tokens"]
    assert sum(p.byte_size for p in acts) == B * 1 * 4 + 4
    if scan:
        assert len(cache) == 2 and cache[0].shape == f"f32[{L},{B},{kv_heads},{S},{D}]"
        assert " while(" in prog.hlo_text
    else:
        assert len(cache) == 2 * L and cache[0].shape == f"f32[{B},{kv_heads},{S},{D}]"


def test_gpt_tiny_prefill_bytes():
    prog = capture(models.build("gpt-tiny-prefill", {"layers": "3"}))
    w = sum(p.byte_size for p in prog.parameters if p.role == "weights")
    assert w == gpt_param_count(256, 64, 4, 4, 3, 16) * 4
    (tok,) = [p for p in prog.parameters if p.role == "activations"]
    assert tok.path == "tokens" and tok.shape == "s32[2,16]"


def test_mlp_bytes():
    prog = capture(models.build("mlp-tiny", {"layers": "3", "dtype": "bf16"}))
    w = sum(p.byte_size for p in prog.parameters if p.role == "weights")
    assert w == 3 * (2 * 32 * 128 + 128 + 32) * 2
    (x,) = [p for p in prog.parameters if p.role == "activations"]
    assert x.shape == "bf16[4,32]"
    wl = models.build("mlp")
    assert n_elems(wl.args[0]) == 4 * (2 * 2048 * 8192 + 8192 + 2048)


def test_overrides_parse_and_validate():
    wl = models.build("gpt-tiny-decode", {"batch": "3", "seq_len": "8", "dtype": "bf16",
                                          "scan_layers": "1", "d_ff": "96", "vocab": "100",
                                          "heads": "8", "kv_heads": "2", "d_model": "32"})
    c = wl.config
    assert (c["batch"], c["seq_len"], c["dtype"], c["scan_layers"], c["d_ff"]) == (3, 8, "bfloat16", True, 96)
    assert wl.args[1]["k_cache"].shape == (2, 3, 2, 8, 4)  # [L, B, H_kv, S, D]
    assert models.build("gpt-tiny-decode", {"scan_layers": "false"}).config["scan_layers"] is False
    with pytest.raises(ValueError, match="valid keys: .*kv_heads"):
        models.build("gpt-tiny-decode", {"colour": "red"})
    with pytest.raises(ValueError, match="valid keys"):
        models.build("mlp-tiny", {"seq_len": "8"})  # not an MLP key
    with pytest.raises(ValueError, match="positive integer"):
        models.build("gpt-tiny-decode", {"batch": "two"})
    # Python's int() takes these (as 40, 4, 4): a typo must not become a batch size
    for typo in ("4_0", "\u0664", "+4"):
        with pytest.raises(ValueError, match="positive integer"):
            models.build("gpt-tiny-decode", {"batch": typo})
    assert models.build("gpt-tiny-decode", {"batch": 5}).config["batch"] == 5   # a TOML integer
    with pytest.raises(ValueError, match="true/false"):
        models.build("gpt-tiny-decode", {"scan_layers": "maybe"})
    with pytest.raises(ValueError, match="dtype"):
        models.build("gpt-tiny-decode", {"dtype": "f8"})
    with pytest.raises(ValueError, match="divide"):
        models.build("gpt-tiny-decode", {"kv_heads": "3"})


@pytest.mark.parametrize("name", ["gpt-tiny-decode", "gpt-tiny-prefill", "mlp-tiny"])
@pytest.mark.parametrize("scan", [False, True])
def test_logical_axes_match_args(name, scan):
    wl = models.build(name, {"scan_layers": "true"} if scan and name.startswith("gpt") else None)
    checked = []

    def check(leaf, axes):
        assert isinstance(axes, tuple) and len(axes) == len(leaf.shape), (leaf, axes)
        assert all(a is None or isinstance(a, str) for a in axes)
        checked.append(axes)

    jax.tree.map(check, wl.args, wl.logical_axes)
    assert len(checked) == len(leaves(wl.args))
    flat = {a for axes in checked for a in axes}
    assert {"embed", "mlp", "batch"} <= flat
    if name.startswith("gpt"):
        assert {"vocab", "heads", "kv"} <= flat
        assert ("layers" in flat) == scan


def test_materialize_ranges():
    wl = models.build("gpt-tiny-decode")
    params, cache, tokens, pos = models.materialize(wl, seed=1)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), (params, cache)) == \
        jax.tree.map(lambda a: (a.shape, a.dtype), wl.args[:2])
    assert tokens.dtype == jnp.int32 and 0 <= int(tokens.min()) and int(tokens.max()) < 256
    assert pos.dtype == jnp.int32 and 0 <= int(pos) < 16


@pytest.mark.parametrize("overrides", [{}, {"kv_heads": "1", "scan_layers": "true"}, {"kv_heads": "2"}])
def test_decode_matches_prefill(overrides):
    """Decoding the last token over the prefill cache reproduces prefill's last logits,
    and cache rows beyond pos do not affect the result (the mask works)."""
    pre = models.build("gpt-tiny-prefill", overrides)
    dec = models.build("gpt-tiny-decode", overrides)
    params, tokens = models.materialize(pre, seed=0)
    S = pre.config["seq_len"]
    logits, cache = jax.jit(pre.fn)(params, tokens)
    assert logits.shape == (2, S, 256)
    p = S // 2
    # Keep cache rows < p, fill the rest with garbage: decode writes row p itself.
    garbage = jax.tree.map(lambda c: c.at[..., p:, :, :].set(7.0), cache)
    out, new_cache = jax.jit(dec.fn)(params, garbage, tokens[:, p:p + 1], jnp.int32(p))
    assert out.shape == (2, 1, 256)
    np.testing.assert_allclose(out[:, 0], logits[:, p], rtol=2e-4, atol=2e-4)
    # Row p of the new cache equals prefill's row p.
    for new, ref in zip(leaves(new_cache), leaves(cache)):
        np.testing.assert_allclose(new[..., p, :, :], ref[..., p, :, :], rtol=1e-5, atol=1e-5)


def test_window_cache_on_a_model_without_a_window_names_the_missing_window():
    """Llama has no sliding window: ``window_cache=false`` is refused for that reason, also on
    the (scanned) training preset, where the scanned-cache rule answered instead (a user trial);
    the default value passes, as every key's default does (one sweep grid spans presets)."""
    for preset in ("llama3-8b-decode", "llama3-8b-train"):
        with pytest.raises(models.PresetError, match=r"window_cache=false: window_cache applies to "
                                                     r"models with a sliding window"):
            models.check_overrides(preset, {"window_cache": "false"})
        models.check_overrides(preset, {"window_cache": "true"})
    with pytest.raises(models.PresetError, match=r"window_cache=true: with scan_layers"):
        models.check_overrides("gemma2-9b-decode", {"window_cache": "true", "scan_layers": "true"})


def test_overrides_must_be_a_dict():
    with pytest.raises(models.PresetError, match=r"overrides must be a dict .* got list"):
        models.check_overrides("mlp-tiny", [("batch", "2")])
