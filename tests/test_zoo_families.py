"""Llama-class zoo families (jaxmove.zoo.transformer): published sizes, closed-form bytes,
decode against prefill, training steps, expert parallelism and bad --set values.

Closed forms are checked on reduced sizes in float32 with unrolled layers: XLA:CPU
promotes bf16 and float8 values to f32 around some ops (extra converts of whole buffers)
and does not fuse the dynamic-slice of a scanned layer's weights / cache into its dots, so
on CPU the byte identities hold exactly only for f32 unrolled programs (the real-size test
checks the entry parameters, which hold for any dtype).

Reduced config (all tests): V=512 vocab, d=64, H=4 heads (D=16), Hkv=2, f=128, B=2, S=32.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmove import analyze, zoo
from jaxmove.capture import capture
from jaxmove.zoo import transformer as tf
from tests.conftest import cpu_devices_env

ROOT = Path(__file__).resolve().parents[1]
V, D_MODEL, H, HKV, F, B, S = 512, 64, 4, 2, 128, 2, 32
D = D_MODEL // H
SMALL = dict(vocab=V, d_model=D_MODEL, heads=H, kv_heads=HKV, d_ff=F, batch=B, seq_len=S,
             dtype="f32", scan_layers="false", stacked_cache="false")

#: Published totals, independent of the code: Llama / Mixtral from the bf16 checkpoints'
#: model.safetensors.index.json total_size / 2; Gemma 2 9B: report Table 1 (917,504,000
#: embedding + 8,324,201,984 non-embedding); DeepSeek-V3: "671B total parameters".
PUBLISHED = {"llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496,
             "llama3-405b": 405_853_388_800, "mixtral-8x7b": 46_702_792_704,
             "deepseek-v3": 671e9, "gemma2-9b": 9_241_705_984}


def n_params(tree) -> int:
    """Elements of every leaf (unquantized presets: no scale leaves)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("family", list(PUBLISHED))
def test_parameter_count_matches_published(family):
    # built with stacked layers (the same parameters as one module per layer, which the 8B
    # check below compares; building 126 unrolled layers took 15 s for the 405B)
    wl = zoo.build(f"{family}-decode", {"scan_layers": "true"})
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(wl.args))
    n = n_params(wl.args[0])
    assert abs(n - PUBLISHED[family]) <= 0.005 * PUBLISHED[family], (family, n)
    if family == "llama3-8b":  # the presets' default, one module per layer: the same count
        assert n_params(zoo.build(f"{family}-decode").args[0]) == n


def test_inference_presets_unroll_their_layers_and_training_scans():
    """Issue 24: inference defaults to one array per layer (the form XLA:TPU/GPU compile near
    the compulsory traffic), training to scanned layers."""
    for fam in PUBLISHED:
        for mode, scan in (("prefill", False), ("decode", False), ("train", True)):
            name = f"{fam}-{mode}"
            assert zoo.PRESETS[name].config["scan_layers"] is scan, name
            assert ("scanned layers" if scan else "unrolled layers") in zoo.PRESETS[name].description
    unset = {k: v for k, v in SMALL.items() if k not in ("scan_layers", "stacked_cache")}
    wl = zoo.build("llama3-8b-decode", {**unset, "layers": "3"})
    assert wl.config["scan_layers"] is False and wl.config["stacked_cache"] is False
    assert len(wl.args[1]["layers"]) == 3 and wl.args[1]["layers"][0]["k_cache"].shape == (B, HKV, S, D)
    assert "stablehlo.while" not in jax.jit(wl.fn).lower(*wl.args).as_text()
    # the TPU layout: one array per stack, [L, B, Hkv, S, D] (each layer indexes it statically)
    cache = zoo.build("llama3-8b-decode", {**unset, "layers": "3", "stacked_cache": "true"}).args[1]
    assert cache["layers"]["k_cache"].shape == (3, B, HKV, S, D)


def test_llama3_70b_decode_at_real_size_compiles_with_closed_form_arguments():
    """`jaxmove analyze llama3-70b-decode --set scan_layers=true` (abstract, ~4 s; the
    unrolled default takes ~50 s at 80 layers, benchmarks/zoo_compile.md)."""
    prog = capture(zoo.build("llama3-70b-decode", {"batch": "32", "seq_len": "8192",
                                                   "scan_layers": "true"}))
    by_role: dict[str, int] = {}
    for p in prog.parameters:
        by_role[p.role] = by_role.get(p.role, 0) + p.byte_size
    assert by_role["weights"] == PUBLISHED["llama3-70b"] * 2                     # bf16
    assert by_role["kv_cache"] == 2 * 80 * 32 * 8192 * 8 * 128 * 2               # 2 L B S Hkv D b
    assert all(p.donated for p in prog.parameters if p.role == "kv_cache")
    assert " while(" in prog.hlo_text                                           # scanned layers


# ---- closed forms on reduced sizes ------------------------------------------------------------

def llama_layer_params(d=D_MODEL, h=H, hkv=HKV, hd=D, f=F) -> dict[str, tuple[int, int]]:
    """{kernel: (elements, output channels)} of one Llama layer; plus 2 RMSNorm scales [d]."""
    return {"q": (d * h * hd, h * hd), "k": (d * hkv * hd, hkv * hd), "v": (d * hkv * hd, hkv * hd),
            "o": (h * hd * d, d), "gate": (d * f, f), "up": (d * f, f), "down": (f * d, d)}


def role_read(rep, role):
    return rep.totals.role_bytes(role)[0]


def role_written(rep, role):
    return rep.totals.role_bytes(role)[1]


@pytest.fixture(scope="module")
def reports():
    """Analyses of the reduced programs the closed-form tests read (each compiled once)."""
    def run(preset, **sets):
        return analyze(capture(zoo.build(preset, {**SMALL, **{k: str(v) for k, v in sets.items()}})))

    return {
        "decode2": run("llama3-8b-decode", layers=2),
        "decode3": run("llama3-8b-decode", layers=3),
        "int8_2": run("llama3-8b-decode", layers=2, weights_dtype="int8", kv_dtype="int8"),
        "int8_3": run("llama3-8b-decode", layers=3, weights_dtype="int8", kv_dtype="int8"),
        "mixtral2": run("mixtral-8x7b-decode", layers=2, experts=4, top_k=2),
        "mixtral3": run("mixtral-8x7b-decode", layers=3, experts=4, top_k=2),
        "gemma": run("gemma2-9b-decode", layers=2, head_dim=32, sliding_window=8),
        "mla": run("deepseek-v3-decode", layers=2, dense_layers=1, experts=4, top_k=2,
                   expert_d_ff=32, head_dim=16, kv_heads=H),   # (MLA has no kv_heads of its own)
    }


def test_weights_read_per_layer_is_the_layer_parameter_bytes(reports):
    """One more layer reads exactly its parameters once: 7 kernels + 2 norm scales, f32."""
    per_layer = sum(n for n, _ in llama_layer_params().values()) + 2 * D_MODEL
    assert role_read(reports["decode3"], "weights") - role_read(reports["decode2"], "weights") \
        == per_layer * 4


def compulsory_weights(rep) -> int:
    return rep.excess.by_role["weights"].compulsory_bytes


def test_int8_weights_read_int8_kernels_plus_per_channel_scales(reports):
    """Weight-only int8: kernels at 1 byte plus one f32 scale per output channel; norms f32.
    Compulsory reads (each parameter once): the kernels are converted inside the matmul and
    scaled after it, and XLA:CPU, whose dots are library calls that fuse no convert, converts
    each kernel to f32 whole first (its compiled reads add that copy); the targets that fuse
    the convert into the GEMM are checked in tests/test_serving_zoo.py."""
    layer = llama_layer_params()
    per_layer = sum(n * 1 + out * 4 for n, out in layer.values()) + 2 * D_MODEL * 4
    assert compulsory_weights(reports["int8_3"]) - compulsory_weights(reports["int8_2"]) == per_layer
    # the LM head [d, V] too: whole-program weights shrink by 3 bytes per kernel element less
    # the scales
    kernels = 2 * sum(n for n, _ in layer.values()) + D_MODEL * V
    scales = 2 * sum(out for _, out in layer.values()) + V
    assert compulsory_weights(reports["decode2"]) - compulsory_weights(reports["int8_2"]) \
        == kernels * 3 - scales * 4


def test_decode_reads_the_kv_cache_once_and_writes_one_position(reports):
    for key, layers in (("decode2", 2), ("decode3", 3), ("mixtral2", 2)):
        rep = reports[key]
        assert role_read(rep, "kv_cache") == 2 * layers * B * S * HKV * D * 4, key
        assert role_written(rep, "kv_cache") == 2 * layers * B * 1 * HKV * D * 4, key


def test_int8_kv_cache_reads_int8_values_plus_one_scale_per_position_and_head(reports):
    rep = reports["int8_2"]
    assert role_read(rep, "kv_cache") == 2 * 2 * B * S * HKV * (D * 1 + 4)
    assert role_written(rep, "kv_cache") == 2 * 2 * B * 1 * HKV * (D * 1 + 4)


def test_gemma2_kv_uses_its_own_head_dim(reports):
    """K and V of head_dim 32: the global layer's S positions, the local layer's ring of the
    window's 8 (TransformerConfig.ring_length), read once each, compulsory."""
    want = 2 * B * (S + 8) * HKV * 32 * 4
    assert role_read(reports["gemma"], "kv_cache") == want
    assert reports["gemma"].excess.by_role["kv_cache"].compulsory_bytes >= want


def test_mla_cache_is_the_compressed_latent_and_rotary_key(reports):
    """Absorbed MLA decode: one cache [B, S, r + dr] holds the latent c_kv and the rotary key
    (FlashMLA's layout); the XLA form reads it whole twice per layer, by the score dot (over
    r + dr) and the output dot (whose rotary columns it drops)."""
    r, dr = 512, 64   # DeepSeek-V3 kv_lora_rank and qk_rope_head_dim (not reduced)
    assert role_read(reports["mla"], "kv_cache") == 2 * B * S * 2 * (r + dr) * 4
    assert role_written(reports["mla"], "kv_cache") == 2 * B * 1 * (r + dr) * 4


def test_mixtral_decode_reads_every_expert_once_per_layer(reports):
    """Batch rows route to different experts: all E experts' SwiGLU weights are read, plus
    the router [d, E], attention and the 2 norm scales. Decode runs the dense expert form
    (every token through every expert, gates on the hidden activations), whose gate and up
    dots contract d of the [E, d, f] kernels with E and f free: with jit's default layouts
    XLA:CPU copies w_gate and w_up into [d, E*f] each step (read twice: by the copy and, as
    the copy, by the dot; the layout_change that weight_layouts="auto" removes on GPUs)."""
    e = 4
    layer = llama_layer_params()
    attn = sum(layer[k][0] for k in "qkvo")
    per_layer = attn + e * 3 * D_MODEL * F + D_MODEL * e + 2 * D_MODEL + 2 * e * D_MODEL * F
    assert role_read(reports["mixtral3"], "weights") - role_read(reports["mixtral2"], "weights") \
        == per_layer * 4


# ---- numerics: one decode step continues a prefill ----------------------------------------------

FAMILY_SMALL = {   # Mixtral's routed experts are DeepSeek's code with a softmax router
    "llama3-8b": dict(layers=3, scan_layers=True),
    "deepseek-v3": dict(experts=8, top_k=3, expert_d_ff=32, shared_experts=1, dense_layers=1,
                        head_dim=16, q_lora_rank=24, kv_lora_rank=20, qk_rope_dim=8,
                        v_head_dim=12, capacity_factor=8.0, scan_layers=True),
    "gemma2-9b": dict(head_dim=32, sliding_window=5, layers=3),
    # the decode presets' default: unrolled layers over one stacked cache
    "llama3-8b/stacked": dict(layers=3, stacked_cache=True),
    "gemma2-9b/stacked": dict(head_dim=32, sliding_window=5, layers=3, stacked_cache=True),
    # the local layers' ring of 5 positions kept whole (full-length caches, window masked)
    "gemma2-9b/full-cache": dict(head_dim=32, sliding_window=5, layers=3, window_cache=False),
    # a ring exactly as long as the prefill: decode at position 11 overwrites position 0
    "gemma2-9b/ring-boundary": dict(head_dim=32, sliding_window=11, layers=3),
}


@pytest.mark.parametrize("family", list(FAMILY_SMALL))
def test_decode_step_matches_prefill_logits(family):
    """logits of prefill(t[0:S])[-1] == decode(cache of prefill(t[0:S-1]), t[S-1], pos=S-1);
    scanned (Llama, DeepSeek), unrolled (Gemma-2, a window shorter than the sequence: its
    local layers' caches are rings of the window's positions) and unrolled over a stacked
    cache (``/stacked``)."""
    dims = {**zoo.families.FAMILIES[family.split("/")[0]], **dict(vocab=97, d_model=64, heads=4,
            kv_heads=2, d_ff=96, layers=2, batch=2, seq_len=12, dtype="float32", scan_layers=False),
            **FAMILY_SMALL[family]}
    cfg = tf.TransformerConfig(**dims)
    n = cfg.seq_len
    import dataclasses
    short = dataclasses.replace(cfg, seq_len=n - 1)
    full_wl, short_wl, dec_wl = (tf.prefill_workload(cfg, "p"), tf.prefill_workload(short, "p"),
                                 tf.decode_workload(cfg, "d"))
    rng = np.random.default_rng(0)   # N(0, 0.6^2): logits of order 1-10
    params = jax.tree.map(lambda x: np.asarray(rng.normal(0, 0.6, x.shape), x.dtype), full_wl.args[0])
    tokens = jax.random.randint(jax.random.key(1), (cfg.batch, n), 0, cfg.vocab)
    want, _ = jax.jit(full_wl.fn)(params, tokens)
    _, cache = jax.jit(short_wl.fn)(params, tokens[:, :n - 1])

    def pad(x, want):   # empty positions at the end of each cache leaf up to the decode cache's
        # (one more; none in a local layer's ring of the window's positions, ring_length)
        return jnp.pad(x, [(0, w - n) for n, w in zip(x.shape, want.shape)])

    cache = jax.tree.map(pad, cache, dec_wl.args[1])
    got, _ = jax.jit(dec_wl.fn)(params, cache, tokens[:, n - 1:], jnp.int32(n - 1))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4 * float(jnp.max(jnp.abs(want))))
    if cfg.final_softcap:
        assert float(jnp.max(jnp.abs(want))) <= cfg.final_softcap


def test_gemma2_ring_cache_decodes_step_by_step_through_the_wrap():
    """Gemma 2's local layers keep a ring of ``sliding_window`` positions: decode from a
    3-token prefill, one step at a time through positions 3..11 (the ring of 4 wraps twice),
    and each step's logits equal prefill(t[0:p+1])'s last logits (the full-length form);
    the cache shapes are the ring's (4 positions) in local layers and seq_len in global ones."""
    import dataclasses
    dims = {**zoo.families.FAMILIES["gemma2-9b"], **dict(vocab=97, d_model=64, heads=4, kv_heads=2,
            d_ff=96, layers=3, batch=2, seq_len=12, dtype="float32", scan_layers=False,
            head_dim=32, sliding_window=4)}
    cfg = tf.TransformerConfig(**dims)
    dec = tf.decode_workload(cfg, "d")
    lengths = [[leaf.shape[2] for leaf in layer.values()] for layer in dec.args[1]["layers"]]
    assert lengths == [[4, 4], [12, 12], [4, 4]]     # layers 0 and 2 local (Gemma 2: even)
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda x: np.asarray(rng.normal(0, 0.6, x.shape), x.dtype), dec.args[0])
    tokens = jax.random.randint(jax.random.key(2), (cfg.batch, cfg.seq_len), 0, cfg.vocab)

    def prefill(n):
        wl = tf.prefill_workload(dataclasses.replace(cfg, seq_len=n), "p")
        return jax.jit(wl.fn)(params, tokens[:, :n])

    _, cache = prefill(3)
    cache = jax.tree.map(lambda x, want: jnp.pad(x, [(0, w - n) for n, w in zip(x.shape, want.shape)]),
                         cache, dec.args[1])
    step = jax.jit(dec.fn)
    for p in range(3, cfg.seq_len):
        got, cache = step(params, cache, tokens[:, p:p + 1], jnp.int32(p))
        want, _ = prefill(p + 1)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want),
                                   atol=1e-4 * float(jnp.max(jnp.abs(want))), err_msg=f"position {p}")


@pytest.mark.parametrize("target", ["cpu", "tpu-v5e"])
def test_gemma2_int8_ring_cache_compulsory_is_the_closed_form(target):
    """int8 KV in a ring: the local layer's ring of W = 16 positions and the global layer's
    S = 64, each position int8 values (head_dim 32) + one f32 scale per kv head, read once; one
    position of each written; on XLA:CPU and on a TPU-compiled program (deviceless)."""
    import importlib.util
    if target != "cpu" and importlib.util.find_spec("libtpu") is None:
        pytest.skip('libtpu is not installed (pip install "jaxmove[tpu]")')
    sets = dict(layers="2", seq_len="64", sliding_window="16", d_model="128", heads="2", kv_heads="1",
                head_dim="32", d_ff="256", vocab="512", batch="2", dtype="f32", kv_dtype="int8")
    rep = analyze("gemma2-9b-decode", overrides=sets, target=target)
    b, hkv, d = 2, 1, 32
    reads = 2 * b * hkv * (64 + 16) * (d * 1 + 4)     # K and V, both layers
    writes = 2 * 2 * b * hkv * (d * 1 + 4)            # K and V of both layers, one position
    assert rep.excess.by_role["kv_cache"].compulsory_bytes == reads + writes


# ---- training ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def train_program():
    return capture(zoo.build("llama3-8b-train", {**SMALL, "layers": "2"}))


def test_train_step_roles_donation_and_optimizer_bytes(train_program):
    prog = train_program
    layer = llama_layer_params()
    params = 2 * (sum(n for n, _ in layer.values()) + 2 * D_MODEL) + 2 * V * D_MODEL + D_MODEL
    by_role: dict[str, int] = {}
    for p in prog.parameters:
        by_role[p.role] = by_role.get(p.role, 0) + p.byte_size
    assert by_role["weights"] == params * 4
    # AdamW: mu and nu like the parameters (their dtype) + the int32 step count
    assert by_role["optimizer_state"] == 2 * params * 4 + 4
    assert by_role["activations"] == 2 * B * S * 4                 # tokens and targets
    assert all(p.donated for p in prog.parameters if p.role in ("weights", "optimizer_state"))
    rep = analyze(prog)
    # The new state is written once into the donated (aliased) buffers: mu, nu and the count.
    assert rep.totals.optimizer_state_write_bytes == 2 * params * 4 + 4
    # Read: the old moments once (by the fusions that write the new ones) and the new moments once
    # more (by the fusion that updates the parameter, e.g. multiply_add_fusion reads
    # multiply_add_fusion.1/.2); the old count once (its increment) and the new count twice (the
    # two bias corrections, convert_power_fusion and .1). Hand-checked on the compiled HLO.
    assert role_read(rep, "optimizer_state") == 2 * (2 * params * 4) + 3 * 4


def test_remat_recomputes_the_forward(train_program):
    """remat=full recomputes each layer's forward in the backward pass: at least the matmuls
    whose outputs the backward needs (q, k, v, gate, up; not o and down, whose gradients need
    only their inputs) run again: 2 x tokens x their kernel elements per layer."""
    full_prog = capture(zoo.build("llama3-8b-train", {**SMALL, "layers": "2", "remat": "full"}))
    none, full = analyze(train_program), analyze(full_prog)
    layer = llama_layer_params()
    needed = sum(layer[k][0] for k in ("q", "k", "v", "gate", "up"))
    assert full.totals.flops - none.totals.flops >= 2 * B * S * 2 * needed
    assert [p.byte_size for p in full_prog.parameters] == [p.byte_size for p in train_program.parameters]


# ---- expert parallelism ----------------------------------------------------------------------

_EP_WORKER = textwrap.dedent("""
    import json, sys
    from jaxmove.plans import PRESETS, capture_with_plan, ensure_cpu_devices
    from jaxmove.api import analyze
    assert ensure_cpu_devices(4)
    small = dict(vocab="64", d_model="32", heads="4", kv_heads="2", d_ff="64", batch="4",
                 seq_len="16", dtype="f32", scan_layers="false", experts="4", top_k="2")
    out = {}
    for key, preset, extra in [
            ("mixtral", "mixtral-8x7b-prefill", {"layers": "2"}),
            ("deepseek", "deepseek-v3-prefill", {"layers": "3", "dense_layers": "1",
                                                 "shared_experts": "1", "expert_d_ff": "64",
                                                 "head_dim": "8", "kv_heads": "4"})]:
        for plan, name in (("ep", preset), ("tp", preset.replace("prefill", "decode"))):
            rep = analyze(capture_with_plan(name, {**small, **extra}, PRESETS[plan], {"model": 4}))
            out[key + "/" + plan] = [[r.collective.kind, r.collective.group_size,
                                      r.collective.buffer_bytes, r.multiplicity.count]
                                     for r in rep.rows if r.collective is not None]
            out[key + "/" + plan + "/moe"] = [r.collective.buffer_bytes for r in rep.rows if r.collective
                                              is not None and "/moe/" in (r.instr.metadata.op_name or "")]
    # DeepSeek's latent cache under tp, batch 8 (2 rows per device): split over batch
    rep = analyze(capture_with_plan("deepseek-v3-decode", {**small, **extra, "batch": "8"}, PRESETS["tp"],
                                    {"model": 4}))
    out["deepseek/tp8"] = [[r.collective.kind, r.collective.buffer_bytes, r.instr.metadata.op_name]
                           for r in rep.rows if r.collective is not None]
    kv = rep.excess.by_role["kv_cache"]
    out["deepseek/tp8/kv"] = [kv.compulsory_bytes, kv.compiled_bytes]
    # batch 3, which model=4 does not divide: the cache splits over length instead
    rep = analyze(capture_with_plan("deepseek-v3-decode", {**small, **extra, "batch": "3"}, PRESETS["tp"],
                                    {"model": 4}))
    out["deepseek/tp3/kv"] = rep.excess.by_role["kv_cache"].compiled_bytes
    # prefill's slot form under tp: the experts' partial sums combined, then all-reduced
    rep = analyze(capture_with_plan("mixtral-8x7b-prefill", {**small, "layers": "2"}, PRESETS["tp"],
                                    {"model": 4}))
    out["mixtral/tp/prefill/moe"] = [[r.collective.kind, r.collective.buffer_bytes] for r in rep.rows
                                     if r.collective is not None and "/moe/" in (r.instr.metadata.op_name or "")]
    # ... with int8 weights too (each device converts its share of w_down inside the dot)
    rep = analyze(capture_with_plan("mixtral-8x7b-prefill", {**small, "layers": "2", "weights_dtype": "int8"},
                                    PRESETS["tp"], {"model": 4}))
    out["mixtral/tp/prefill/int8/moe"] = [[r.collective.kind, r.collective.buffer_bytes] for r in rep.rows
                                          if r.collective is not None and "/moe/" in (r.instr.metadata.op_name or "")]
    rep = analyze(capture_with_plan("mixtral-8x7b-prefill", {**small, "layers": "2", "weights_dtype": "fp8",
                                                             "act_dtype": "fp8"}, PRESETS["tp"], {"model": 4}))
    out["mixtral/tp/prefill/fp8act/moe"] = [[r.collective.kind, r.collective.buffer_bytes] for r in rep.rows
                                            if r.collective is not None and "/moe/" in (r.instr.metadata.op_name or "")]
    # ... and the same numbers as the einsums without a plan
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from jaxmove.zoo.sharding import logical_sharding
    from jaxmove.zoo.transformer import _reduce_after_combine
    for mesh_shape in ({"model": 4}, {"data": 2, "model": 2}):
        mesh = Mesh(np.array(jax.devices()[:4]).reshape(tuple(mesh_shape.values())), tuple(mesh_shape))
        def resolve(axes, shape):
            return NamedSharding(mesh, PartitionSpec(*PRESETS["tp"].partition_spec(axes, shape, mesh_shape, False)))
        rng = np.random.default_rng(0)
        c, h, w = (rng.standard_normal(sh).astype(np.float32) for sh in ((4, 16, 4, 8), (4, 4, 8, 64), (4, 64, 32)))
        t = rng.standard_normal((4, 16, 32)).astype(np.float32)
        def planned(c, h, w):
            with logical_sharding(resolve):
                return _reduce_after_combine(c, h, w, (4, 16, 32))
        def plain(c, h, w):
            return jax.numpy.einsum("bsec,ebcd->bsd", c, jax.numpy.einsum("ebcf,efd->ebcd", h, w))
        errs = [np.abs(np.asarray(jax.jit(planned)(c, h, w)) - np.asarray(plain(c, h, w))).max()]
        # a training step's backward pass: the gradients of <y, t> with respect to c, h, w
        grads = [jax.jit(jax.grad(lambda *a, f=f: (f(*a) * t).sum(), argnums=(0, 1, 2)))(c, h, w)
                 for f in (planned, plain)]
        errs += [np.abs(np.asarray(x) - np.asarray(y)).max() for x, y in zip(*grads)]
        # an int8 w_down with its per-channel scale [E, d]: (h @ q) * s, partial sums scaled
        q = rng.integers(-127, 128, (4, 64, 32)).astype(np.int8)
        sc = (rng.random((4, 32)) / 127).astype(np.float32)
        def planned_q(c, h):
            with logical_sharding(resolve):
                return _reduce_after_combine(c, h, q, (4, 16, 32), sc, jax.numpy.float32)
        ref = plain(c, h, q.astype(np.float32) * sc[:, None, :])
        errs.append(np.abs(np.asarray(jax.jit(planned_q)(c, h)) - np.asarray(ref)).max()
                    / np.abs(np.asarray(ref)).max())
        # an fp8 w_down with fp8 activations (act_dtype=fp8): each row of h quantized with the
        # scale of the whole row (the devices' max), as Dense.einsum quantizes it unsplit
        q8 = jax.numpy.asarray(rng.standard_normal((4, 64, 32)) * 64, jax.numpy.float8_e4m3fn)
        def planned_fp8(c, h):
            with logical_sharding(resolve):
                return _reduce_after_combine(c, h, q8, (4, 16, 32), sc, jax.numpy.float32, True)
        def plain_fp8(c, h):
            jnp = jax.numpy
            sx = jnp.maximum(jnp.max(jnp.abs(h), axis=3, keepdims=True), 1e-12) / 448.0
            y = jnp.einsum("ebcf,efd->ebcd", (h / sx).astype(q8.dtype), q8, preferred_element_type=jnp.float32)
            return jnp.einsum("bsec,ebcd->bsd", c, y * sx * sc[:, None, None, :])
        ref = np.asarray(plain_fp8(c, h))
        errs.append(np.abs(np.asarray(jax.jit(planned_fp8)(c, h)) - ref).max() / np.abs(ref).max())
        g8 = [np.asarray(jax.jit(jax.grad(lambda c, h, f=f: (f(c, h) * t).sum(), argnums=1))(c, h))
              for f in (planned_fp8, plain_fp8)]
        errs.append(np.abs(g8[0] - g8[1]).max() / np.abs(g8[1]).max())
        out["reduce_after_combine_err/" + "x".join(mesh_shape)] = float(max(errs))
    json.dump(out, sys.stdout)
""")


@pytest.fixture(scope="module")
def moe_collectives():
    env = cpu_devices_env(4, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _EP_WORKER], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_ep_plan_moves_tokens_by_two_all_to_alls_per_moe_layer(moe_collectives):
    """ep over model=4: experts split 4 ways, tokens dispatched and combined by all-to-all;
    per-device buffer = E x (B/4) x C x d x 4 bytes, C = ceil(k S / E) (GShard capacity)."""
    e, b, s, d, k, n = 4, 4, 16, 32, 2, 4
    buffer = e * (b // n) * math.ceil(k * s / e) * d * 4
    for key, moe_layers in (("mixtral", 2), ("deepseek", 2)):
        assert moe_collectives[key + "/ep"] == [["all-to-all", n, buffer, 1]] * (2 * moe_layers), key


def test_tp_decode_all_reduces_the_hidden_state_not_the_expert_outputs(moe_collectives):
    """tp decode over model=4 (expert_d_ff split): the experts' partial sums are all-reduced
    on the hidden state [B, 1, d] x 4 bytes = 512 B (2x where XLA's all-reduce combiner merges
    the routed and shared experts' sums), never on the GShard slot buffer [E, B, C, d]
    (E x B x 1 x d x 4 = 2048 B), which is E*C/S times larger."""
    e, b, d = 4, 4, 32
    hidden, slots = b * d * 4, e * b * 1 * d * 4
    for key in ("mixtral", "deepseek"):
        reduces = [c for c in moe_collectives[key + "/tp"] if c[0] == "all-reduce"]
        assert reduces, key
        assert all(c[2] in (hidden, 2 * hidden) for c in reduces), (key, reduces)
        assert moe_collectives[key + "/tp/moe"] and max(moe_collectives[key + "/tp/moe"]) < slots, key


def test_tp_prefill_combines_the_experts_before_all_reducing(moe_collectives):
    """Prefill's slot form under tp over model=4 (expert_d_ff split): each device combines its
    partial expert outputs into [B, S, d] first, so each MoE layer all-reduces B x S x d x 4 =
    8192 B once, not the expert outputs [E, B, C, d] (4 x 4 x 8 x 32 x 4 = 16384 B, C =
    ceil(k S / E) = 8), with bf16/f32 and with int8 weights; the sums, and their gradients,
    equal the einsums' without a plan (an int8 kernel with its scale: relative error)."""
    b, s, d = 4, 16, 32
    assert moe_collectives["mixtral/tp/prefill/moe"] == [["all-reduce", b * s * d * 4]] * 2
    # int8 weights (w_down converted inside each device's dot, its partial sums scaled), and
    # fp8 x fp8 (each row's scale the max over the devices)
    assert moe_collectives["mixtral/tp/prefill/int8/moe"] == [["all-reduce", b * s * d * 4]] * 2
    # (and before it an all-gather of each device's row maxima [E, B, C, 1] f32, 4 x 4 x 8 x 4 B
    # per device, 4 devices' worth gathered)
    assert moe_collectives["mixtral/tp/prefill/fp8act/moe"] == [["all-gather", 4 * 4 * b * 8 * 4],
                                                                ["all-reduce", b * s * d * 4]] * 2
    for mesh in ("model", "dataxmodel"):
        assert moe_collectives["reduce_after_combine_err/" + mesh] < 1e-4, mesh


def test_tp_decode_splits_the_latent_cache_over_batch(moe_collectives):
    """DeepSeek's latent cache is one kv head (LATENT_CACHE_AXES): under tp over model=4 it
    is split over batch (2 of 8 rows per device), not replicated. Per device, per layer: the
    cache read is (B/n) x S x 2(r + dr) x 4 B (the merged latent cache twice: scores and output) and
    the write (B/n) x (r + dr) x 4 B; attention runs batch-parallel (DP attention): the
    absorbed and rope queries [B, H, r + dr] move by one all-to-all to the rows' devices and
    the result [B, H, r] back, each (B x H x dim x 4 B) / n per device; no collective moves
    the cache."""
    b, n, s, h, r, dr, layers = 8, 4, 16, 4, 512, 64, 3
    compulsory = layers * ((b // n) * s * (r + dr) * 4 + (b // n) * (r + dr) * 4)
    assert moe_collectives["deepseek/tp8/kv"] == [compulsory, compulsory + layers * (b // n) * s * (r + dr) * 4]
    colls = moe_collectives["deepseek/tp8"]
    for layer in ("dense_layers_0", "layers_1", "layers_2"):
        a2a = sorted(c[1] for c in colls if c[0] == "all-to-all" and f"/{layer}/attn/" in c[2])
        assert a2a == sorted([b * h * (r + dr) * 4 // n, b * h * r * 4 // n]), (layer, colls)
    assert max(c[1] for c in colls) < b * s * r * 4 // n, colls   # (one device's share of a layer's cache)
    # batch 3 over model=4: split over length, read in place (was gathered whole at each write:
    # 2.0 MB compiled); at most the latent cache twice for S/n positions, + the new entries
    b3 = 3
    assert moe_collectives["deepseek/tp3/kv"] <= layers * (b3 * (s // n) * 2 * (r + dr) * 4 + b3 * (r + dr) * 4 * 2)


# ---- bad --set --------------------------------------------------------------------------------

@pytest.mark.parametrize("preset,sets,match", [
    ("llama3-8b-decode", {"heads": "7"}, r"heads=7 must divide d_model=4096"),
    ("llama3-8b-decode", {"kv_heads": "5"}, r"kv_heads=5 must divide heads=32"),
    ("llama3-8b-decode", {"dtype": "f8"}, r"--set dtype='f8': unknown dtype"),
    ("llama3-8b-decode", {"weights_dtype": "int2"}, r"--set weights_dtype='int2': .*int8, int4, fp8"),
    ("llama3-8b-decode", {"kv_dtype": "int4"}, r"--set kv_dtype='int4': .*int8, fp8"),
    ("llama3-8b-train", {"remat": "some"}, r"--set remat='some': .*none, full, dots"),
    ("llama3-8b-train", {"weights_dtype": "int8"}, r"weights_dtype=int8: training presets"),
    ("mixtral-8x7b-decode", {"top_k": "9"}, r"top_k=9 must not exceed experts=8"),
    ("deepseek-v3-decode", {"dense_layers": "-1"}, r"--set dense_layers='-1': expected an integer"),
    # keys that would change nothing in latent attention
    ("deepseek-v3-decode", {"sliding_window": "8"}, r"sliding_window=8: latent attention"),
    ("deepseek-v3-decode", {"kv_heads": "8"}, r"kv_heads=8: .*latent attention.*changes nothing"),
    ("deepseek-v3-train", {"kv_heads": "1"}, r"kv_heads=1: .*latent attention"),
    ("llama3-8b-decode", {"window_cache": "false"}, r"window_cache=false: .*sliding window"),
    ("gemma2-9b-decode", {"window_cache": "maybe"}, r"--set window_cache='maybe'"),
    # a ring asked for where every layer's cache is one stacked array (it was ignored silently)
    ("gemma2-9b-decode", {"window_cache": "true", "scan_layers": "true"}, r"window_cache=true: with scan_layers"),
    ("gemma2-9b-decode", {"window_cache": "true", "stacked_cache": "true"}, r"window_cache=true: with stacked"),
])
def test_bad_set_is_one_line_naming_the_key(preset, sets, match):
    with pytest.raises(ValueError, match=match) as info:
        zoo.build(preset, sets)
    assert "\n" not in str(info.value)


def test_quantized_presets_store_int8_and_fp8_kernels_with_scales():
    for q, dtype in (("int8", jnp.int8), ("fp8", jnp.float8_e4m3fn)):
        params = zoo.build("llama3-8b-decode", {**SMALL, "layers": "1", "weights_dtype": q}).args[0]
        q_kernel = params["layers"][0]["attn"]["q"]
        assert q_kernel["kernel"].dtype == dtype and q_kernel["kernel"].shape == (D_MODEL, H, D)
        assert q_kernel["scale"].shape == (H, D) and q_kernel["scale"].dtype == jnp.float32
        assert params["embed"]["embedding"].dtype == jnp.float32          # gathers stay float
        assert tf.parameter_count(params) == n_params(zoo.build(
            "llama3-8b-decode", {**SMALL, "layers": "1"}).args[0])
