"""Serving-grade zoo (issue 24): plan fallbacks that split a KV cache over batch when the
model axis exceeds the kv heads, checked by rule resolution and on a partitioned program
compiled on 4 simulated CPU devices (in a subprocess: the device count is fixed when jax
starts).

Closed forms (reduced Llama, f32, b = 4 bytes): cache per layer 2 x B x Hkv x S x D x b; with
kv_heads=2 over model=4 under ``tp`` each device holds B/4 of the batch, so 1/4 of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jaxmove.plans import PRESETS, PlanError, parse_plan
from tests.conftest import cpu_devices_env

ROOT = Path(__file__).resolve().parents[1]
V, D_MODEL, H, HKV, F, B, S, L = 512, 64, 4, 2, 128, 8, 32, 2
D = D_MODEL // H


def test_tp_kv_heads_fall_back_to_batch_then_length():
    tp = PRESETS["tp"]
    cache = ("batch", "kv_heads", "length", "kv")
    notes: list[str] = []
    # 8 kv heads over model=16: the batch takes model (the cache is split 16 ways, not replicated)
    assert tp.partition_spec(cache, (32, 8, 8192, 128), {"model": 16}, False, notes) == \
        ("model", None, None, None)
    assert notes == ["kv_heads (8) is not divisible by model=16: batch takes model instead"]
    # batch 1 (prefill) does not divide: the sequence takes it
    assert tp.partition_spec(cache, (1, 8, 8192, 128), {"model": 16}, False) == (None, None, "model", None)
    # batch already over data: model joins it when the product divides
    assert tp.partition_spec(cache, (32, 8, 8192, 128), {"data": 2, "model": 16}, False) == \
        (("data", "model"), None, None, None)
    # kv heads that divide keep the rule; nothing falls back
    assert tp.partition_spec(cache, (32, 8, 8192, 128), {"model": 4}, False) == (None, "model", None, None)
    # parameters keep step 2: the k/v kernels stay replicated over the axis
    notes = []
    assert tp.partition_spec(("embed", "kv_heads", "kv"), (8192, 8, 128), {"model": 16}, True, notes) == \
        (None, None, None)
    # (its note says it is the parameters': beside the cache's "batch takes model instead",
    # a bare "kv_heads (8) ... kept replicated" read as a contradiction in a user trial)
    assert notes == ["kv_heads (8) of the parameters is not divisible by model=16: kept replicated over model"]
    # dp has no fallbacks: a dimension that does not divide stays replicated
    assert PRESETS["dp"].partition_spec(("batch",), (3,), {"data": 2}, False) == (None,)


def test_merged_dim_takes_the_fallback_of_its_unit_kv_heads():
    """DeepSeek's latent cache [B, S, r] names its batch (batch, kv_heads): one kv head folded
    in (plan.py step 4), so tp's model axis, which cannot split one head, splits the batch."""
    tp, dp = PRESETS["tp"], PRESETS["dp"]
    latent = (("batch", "kv_heads"), "length", None)
    notes: list[str] = []
    assert tp.partition_spec(latent, (32, 4096, 512), {"model": 16}, False, notes) == ("model", None, None)
    assert notes == ["kv_heads (1) is not divisible by model=16: batch takes model instead"]
    assert tp.partition_spec(latent, (32, 4096, 512), {"data": 2, "model": 8}, False) == \
        (("data", "model"), None, None)
    # batch 1 (prefill): the sequence takes model, as for a GQA cache
    assert tp.partition_spec(latent, (1, 4096, 512), {"model": 16}, False) == (None, "model", None)
    # the same as the 4-D cache with a size-1 kv_heads dim, under every preset
    for plan in PRESETS.values():
        for mesh in ({"model": 4}, {"data": 2, "model": 4}, {"data": 8}):
            want = plan.partition_spec(("batch", "kv_heads", "length", None), (32, 1, 64, 512), mesh, False)
            got = plan.partition_spec(latent, (32, 64, 512), mesh, False)
            assert got[1:] == want[2:] and want[1] is None, (plan.name, mesh)
            assert got[0] == want[0], (plan.name, mesh)
    assert dp.partition_spec(latent, (32, 64, 512), {"data": 4}, False) == ("data", None, None)


def test_logical_axes_given_wrongly_get_a_clear_error_or_mean_the_same():
    """A string for the per-dimension logical axes, an empty merged dimension or a non-name
    entry is refused by name; a list for a merged dimension means the tuple; a parameter's
    folded unit dimension (it is not in the tensor) gets no "kept replicated" note."""
    tp = PRESETS["tp"]
    with pytest.raises(PlanError, match=r"cache: logical axes must be one entry per dimension .*'batch'"):
        tp.partition_spec("batch", (8,), {"model": 4}, False, what="cache")
    with pytest.raises(PlanError, match="logical axis 0 is an empty tuple"):
        tp.partition_spec(((), "length"), (8, 64), {"model": 4}, False)
    with pytest.raises(PlanError, match=r"logical axis 1 is 3; expected a name, None or a tuple"):
        tp.partition_spec(("batch", 3), (8, 64), {"model": 4}, False)
    latent = (("batch", "kv_heads"), "length", None)
    as_list = (["batch", "kv_heads"], "length", None)
    assert tp.partition_spec(as_list, (32, 64, 512), {"model": 16}, False) == \
        tp.partition_spec(latent, (32, 64, 512), {"model": 16}, False) == ("model", None, None)
    notes: list[str] = []
    # a parameter: no fallbacks, and the folded kv_heads is no dimension of the kernel
    assert tp.partition_spec((("embed", "kv_heads"), "mlp"), (64, 256), {"model": 4}, True, notes) == \
        (None, "model")
    assert notes == []
    # the dimension's own rule still notes what it cannot divide
    tp.partition_spec((("vocab", "kv_heads"), None), (50257, 64), {"model": 4}, True, notes)
    assert len(notes) == 1 and notes[0].startswith("vocab (50257)")


def test_toml_fallbacks(tmp_path):
    p = parse_plan('[rules]\nkv_heads = "model"\n[fallbacks]\nkv_heads = ["length"]\n', "f.toml")
    assert p.fallbacks == {"kv_heads": ("length",)}
    assert p.partition_spec(("batch", "kv_heads", "length"), (32, 8, 64), {"model": 16}, False) == \
        (None, None, "model")
    with pytest.raises(PlanError, match=r"f.toml:4: \[fallbacks\] kv_heads: unknown logical axis 'seq'"):
        parse_plan('[rules]\nkv_heads = "model"\n[fallbacks]\nkv_heads = ["seq"]\n', "f.toml")
    # [fallbacks] names logical axes (its errors say so), never the axis itself
    with pytest.raises(PlanError, match=r"f.toml:4: \[fallbacks\] kv_heads must be a logical axis name"):
        parse_plan('[rules]\nkv_heads = "model"\n[fallbacks]\nkv_heads = [1]\n', "f.toml")
    with pytest.raises(PlanError, match=r"names logical axis 'batch' twice; each logical axis"):
        parse_plan('[rules]\nkv_heads = "model"\n[fallbacks]\nkv_heads = ["batch", "batch"]\n', "f.toml")
    with pytest.raises(PlanError, match=r"f.toml:4: \[fallbacks\] kv_heads: unknown logical axis 'model'; "
                       r".*'model' is a mesh axis of the rules"):
        parse_plan('[rules]\nkv_heads = "model"\n[fallbacks]\nkv_heads = ["model"]\n', "f.toml")
    with pytest.raises(PlanError, match=r"f.toml:4: \[fallbacks\] kv_heads names itself"):
        parse_plan('[rules]\nkv_heads = "model"\n[fallbacks]\nkv_heads = ["batch", "kv_heads"]\n', "f.toml")


_WORKER = textwrap.dedent("""
    import json, sys
    from jaxmove.plans import PRESETS, capture_with_plan, ensure_cpu_devices
    from jaxmove.api import analyze
    assert ensure_cpu_devices(4)
    sets = dict(vocab="512", d_model="64", heads="4", kv_heads="2", d_ff="128", batch="8",
                seq_len="32", dtype="f32", layers="2", stacked_cache="false")  # XLA:CPU reads a stacked cache twice
    program = capture_with_plan("llama3-8b-decode", sets, PRESETS["tp"], {"model": 4})
    rep = analyze(program)
    by_role = {}
    for p in program.parameters:
        by_role[p.role] = by_role.get(p.role, 0) + p.byte_size
    json.dump({"by_role": by_role, "kv": rep.totals.role_bytes("kv_cache"),
               "colls": [[r.collective.kind, r.collective.buffer_bytes] for r in rep.rows
                         if r.collective is not None]}, sys.stdout)
""")


@pytest.fixture(scope="module")
def tp_decode():
    env = cpu_devices_env(4, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _WORKER], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_tp_cache_with_fewer_kv_heads_than_devices_is_split_over_batch(tp_decode):
    cache = 2 * L * B * HKV * S * D * 4
    assert tp_decode["by_role"]["kv_cache"] == cache // 4          # was replicated: cache
    read, written = tp_decode["kv"]
    assert read == cache // 4 and written == 2 * L * (B // 4) * HKV * D * 4   # one position
    # no collective moves the cache (or a layer of it)
    assert max(b for _, b in tp_decode["colls"]) < 2 * (B // 4) * HKV * S * D * 4 // 2


# ---- quantized weights dequantized inside the GEMM (XLA:GPU, deviceless) --------------------

QSMALL = dict(layers="2", d_model="1024", heads="8", kv_heads="8", d_ff="4096", vocab="8192",
              seq_len="256", batch="32")


_GPU_WORKER = textwrap.dedent("""
    import json, sys
    import jaxmove
    from jaxmove.capture.targets import MissingExtraError, TargetNameError
    out = {}
    for q in ("int8", "fp8"):
        try:
            rep = jaxmove.analyze("llama3-8b-decode", overrides={**json.loads(sys.argv[1]),
                                  "weights_dtype": q}, target="h100-sxm")
        except (MissingExtraError, TargetNameError) as e:
            out = {"skip": str(e)}
            break
        ex = rep.excess
        w = ex.by_role["weights"]
        out[q] = {"compulsory": w.compulsory_bytes, "compiled": w.compiled_bytes,
                  "materialized": ex.bytes_of("materialized_intermediate")}
    json.dump(out, sys.stdout)
""")


@pytest.fixture(scope="module")
def gpu_quantized():
    """The two programs compiled for h100-sxm in a fresh process (the CUDA plugin's compile-only
    topology cannot start in a process whose jax backends are already up)."""
    pytest.importorskip("jax_plugins.xla_cuda12", reason="the CUDA plugin is not installed (jaxmove[gpu])")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _GPU_WORKER, json.dumps(QSMALL)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


@pytest.mark.parametrize("q", ["int8", "fp8"])
def test_gpu_quantized_weights_never_reach_hbm_as_bf16(gpu_quantized, q):
    """h100-sxm, int8 / fp8 weights with per-channel scales: every kernel is read once at 1
    byte per weight (+ the scales) and no dequantized bf16 copy is written: the excess pass's
    compiled weight bytes are within 3% of its compulsory ones, and what it calls materialized
    is far below the bf16 bytes of one layer's kernels (scaling the kernel before the matmul,
    XLA:GPU wrote every layer's bf16 weights to HBM: 103 MB here)."""
    got = gpu_quantized[q]
    d, f, v = 1024, 4096, 8192
    kernels = 2 * (4 * d * d + 3 * d * f) + d * v              # 2 layers' q,k,v,o + gate,up,down; lm_head
    scales = 2 * (4 * d + 2 * f + d) + v
    norms = (2 * 2 + 1) * d
    embed_rows = 32 * d                                        # the batch's gathered rows
    assert got["compulsory"] == kernels + 2 * scales + 2 * norms + 2 * embed_rows
    assert got["compiled"] <= 1.03 * got["compulsory"]
    layer_bf16 = 2 * (4 * d * d + 3 * d * f)
    assert got["materialized"] < layer_bf16 / 4


# ---- MoE decode under tp on a TPU-compiled program (deviceless) ---------------------------------

def test_tpu_tp_moe_decode_all_reduces_only_the_hidden_state():
    """Mixtral decode, tp over tpu-v5e:2x2 (expert_d_ff split 4 ways): the dense MoE decode form
    sums the experts in the down-projection dot, so each all-reduce carries the [B, 1, d] bf16
    hidden state (8 x 256 x 2 = 4096 B), never the [E, B, 1, d] expert outputs (4 x 4096 B)."""
    pytest.importorskip("libtpu", reason='libtpu is not installed (pip install "jaxmove[tpu]")')
    from jaxmove.api import analyze
    from jaxmove.plans.compare import capture_with_plan
    sets = dict(layers="2", d_model="256", heads="4", kv_heads="4", d_ff="512", vocab="1024",
                seq_len="128", batch="8", experts="4", top_k="2")
    rep = analyze(capture_with_plan("mixtral-8x7b-decode", sets, PRESETS["tp"], {"model": 4},
                                    target="tpu-v5e:2x2"))
    hidden, slots = 8 * 256 * 2, 4 * 8 * 256 * 2
    colls = [(r.collective.kind, r.collective.buffer_bytes) for r in rep.rows if r.collective is not None]
    reduces = [b for k, b in colls if k == "all-reduce"]
    assert reduces and all(b % hidden == 0 and b < slots for b in reduces), colls
    assert max(b for _, b in colls) < slots, colls


# ---- DeepSeek's merged latent cache on a TPU-compiled program (deviceless) ----------------------

def test_tpu_mla_decode_scores_the_merged_latent_cache_in_one_dot():
    """DeepSeek-V3 decode's cache is one [B, S, r + dr] array ([c_kv | k_rope], FlashMLA's
    layout): XLA:TPU computes each layer's scores in one dot over r + dr (the rope keys in a
    second dot wrote the f32 scores and read them back: 16 MiB per layer and v5p chip at full
    size, benchmarks/zoo_compile.md) and reads the cache at most twice (scores, output). The
    XLA form (``attention=xla``); ``auto`` takes the Pallas TPU kernel, which reads it once
    (tests/test_tpu_decode_kernels.py)."""
    pytest.importorskip("libtpu", reason='libtpu is not installed (pip install "jaxmove[tpu]")')
    from jaxmove.api import analyze
    from jaxmove.capture import capture
    from jaxmove import zoo
    sets = dict(layers="2", dense_layers="1", d_model="256", d_ff="256", expert_d_ff="128",
                vocab="1024", experts="4", top_k="2", heads="8", seq_len="512", batch="2",
                attention="xla")
    wl = zoo.build("deepseek-v3-decode", sets)
    rep = analyze(capture(wl, target="tpu-v5p"))
    cfg = wl.config
    r, dr = cfg["kv_lora_rank"], cfg["qk_rope_dim"]
    names = [(r_.instr.metadata.op_name if r_.instr.metadata is not None else None) or "" for r_ in rep.rows]
    assert not any("bthp,bsp->bhts" in n for n in names), "a separate rope score dot"
    for layer in ("dense_layers_0", "layers_1"):
        assert sum(f"/{layer}/" in n and "bthk,bsk->bhts" in n for n in names) == 1, layer
    cache = 2 * 512 * (r + dr) * 2  # one layer's merged cache, bf16
    kv = rep.excess.by_role["kv_cache"]
    assert kv.compulsory_bytes == 2 * (cache + 2 * (r + dr) * 2)
    assert kv.compiled_bytes <= 2 * 2 * cache + 2 * 2 * (r + dr) * 2 * 2


@pytest.mark.parametrize("kv", ["fp8", "f32", "int8"])
def test_mla_cache_in_every_kv_dtype(kv):
    """DeepSeek decode with a KV dtype other than the model's: a float KV dtype (a plain cast)
    keeps the one merged [B, S, r + dr] array in that dtype; int8 keeps c_kv and k_rope apart,
    each with its per-position scale. Each compiles and reads every layer's cache (a float
    KV dtype other than the model's is converted whole on XLA:CPU, so no upper bound here)."""
    import jax.numpy as jnp
    from jaxmove.api import analyze
    from jaxmove import zoo
    sets = dict(layers="2", dense_layers="1", d_model="256", d_ff="256", expert_d_ff="128",
                vocab="1024", experts="4", top_k="2", heads="8", seq_len="64", batch="2", kv_dtype=kv)
    wl = zoo.build("deepseek-v3-decode", sets)
    r, dr = wl.config["kv_lora_rank"], wl.config["qk_rope_dim"]
    layer = wl.args[1]["layers"][0]
    if kv == "int8":
        assert set(layer) == {"c_kv_cache", "k_rope_cache", "c_kv_scale", "k_rope_scale"}
        cache_bytes = 2 * 64 * (r + dr) * 1 + 2 * 2 * 64 * 2
    else:
        assert set(layer) == {"latent_cache"}
        assert layer["latent_cache"].shape == (2, 64, r + dr)
        assert layer["latent_cache"].dtype == jnp.dtype({"fp8": "float8_e4m3fn", "f32": "float32"}[kv])
        cache_bytes = 2 * 64 * (r + dr) * layer["latent_cache"].dtype.itemsize
    rep = analyze(wl)
    read, written = rep.totals.role_bytes("kv_cache")
    assert rep.excess.by_role["kv_cache"].compulsory_bytes >= 2 * cache_bytes
    assert 2 * cache_bytes <= read, (read, cache_bytes)


@pytest.mark.parametrize("weights", ["bf16", "int8", "fp8act"])
@pytest.mark.parametrize("target,plugin", [("tpu-v5e:2x2", "libtpu"), ("h100-sxm:1x1x4", "jax_plugins.xla_cuda12")])
def test_tp_moe_prefill_all_reduces_the_combined_tokens_on_accelerators(target, plugin, weights):
    """Mixtral prefill, tp over 4 devices, compiled by XLA:TPU and XLA:GPU: each MoE layer's one
    all-reduce carries the combined [B, S, d] bf16 tokens (4 x 32 x 256 x 2 = 65536 B), not
    the [E, B, C, d] expert outputs (C = ceil(k S cf / E) = 20: 4 x 4 x 20 x 256 x 2 B), with
    int8 weights too (each device's share of w_down converted inside its dot), and with fp8 x fp8
    GEMMs (``act_dtype=fp8``: the rows' scales need the devices' maxima, a small all-gather
    before the all-reduce)."""
    import importlib.util
    if importlib.util.find_spec(plugin) is None:
        pytest.skip(f"{plugin} is not installed")
    from jaxmove.api import analyze
    from jaxmove.plans.compare import capture_with_plan
    # B = 4, S = 32 (was 8 x 128: XLA:TPU's compiles took twice as long, the same collectives)
    b, s, d = 4, 32, 256
    sets = dict(layers="2", d_model=str(d), heads="4", kv_heads="4", d_ff="512", vocab="1024",
                seq_len=str(s), batch=str(b), experts="4", top_k="2")
    if weights == "int8":
        sets["weights_dtype"] = "int8"
    elif weights == "fp8act":
        sets.update(weights_dtype="fp8", act_dtype="fp8")
    rep = analyze(capture_with_plan("mixtral-8x7b-prefill", sets, PRESETS["tp"], {"model": 4}, target=target))
    moe = [(r.collective.kind, r.collective.buffer_bytes) for r in rep.rows
           if r.collective is not None and r.instr.metadata is not None
           and "/moe/" in (r.instr.metadata.op_name or "")]
    if weights == "fp8act":  # (the maxima's all-gathers: small, whichever way XLA places them)
        assert all(n < b * s * d * 2 // 8 for kind, n in moe if kind == "all-gather"), moe
        moe = [c for c in moe if c[0] != "all-gather"]
    assert moe == [("all-reduce", b * s * d * 2)] * 2, moe
