"""Correctness on the programs TPUs and GPUs run (issue 12, second round): roles through every
form of all-gather, XLA:TPU's decomposed async collectives, FLOPs of 1-row dots, split-K
partials and copies the device compilers emit. Hand-written HLO snippets of each exact
pattern (counted by hand in the comments) and small programs compiled here without the
device, against closed forms from their shapes and dtypes."""

from __future__ import annotations

import os

import pytest

from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import analyze_module
from tests.tpu_hlo import DECOMPOSED_ALL_GATHER as TPU_DECOMPOSED
from tests.tpu_hlo import analyze_rows

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

BF16 = 2  # bytes


def _rows(text: str, roles: dict[int, str] | None = None):
    return analyze_rows(text, roles)


# ---- (a) roles through every all-gather form ----------------------------------------------

# XLA:GPU's combiner: one all-gather-start for several arrays, shape ((operands), (results)).
# 3 weight shards and one activation shard over 4 devices.
GPU_COMBINED = """HloModule ag
ENTRY e {
  w1 = bf16[256,1024]{1,0} parameter(0)
  w2 = bf16[128,512]{1,0} parameter(1)
  w3 = bf16[64,256]{1,0} parameter(2)
  x = bf16[4,1024]{1,0} parameter(3)
  s = ((bf16[256,1024]{1,0}, bf16[128,512]{1,0}, bf16[64,256]{1,0}, bf16[4,1024]{1,0}), (bf16[1024,1024]{1,0}, bf16[512,512]{1,0}, bf16[256,256]{1,0}, bf16[16,1024]{1,0})) all-gather-start(w1, w2, w3, x), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  d = (bf16[1024,1024]{1,0}, bf16[512,512]{1,0}, bf16[256,256]{1,0}, bf16[16,1024]{1,0}) all-gather-done(s)
  g2 = bf16[256,256]{1,0} get-tuple-element(d), index=2
  g3 = bf16[16,1024]{1,0} get-tuple-element(d), index=3
  n2 = bf16[256,256]{1,0} negate(g2)
  n3 = bf16[16,1024]{1,0} negate(g3)
  ROOT t = (bf16[256,256]{1,0}, bf16[16,1024]{1,0}) tuple(n2, n3)
}"""


def test_combined_all_gather_start_gives_each_result_its_operands_role():
    an, rows = _rows(GPU_COMBINED, {0: "weights", 1: "weights", 2: "weights", 3: "activations"})
    shard_w = (256 * 1024 + 128 * 512 + 64 * 256) * BF16
    shard_x = 4 * 1024 * BF16
    s = rows["s"].per_execution
    assert s.weights_read_bytes == shard_w and s.activations_read_bytes == shard_x
    assert s.weights_write_bytes == 4 * shard_w  # the gathered weights are weights
    assert s.activations_write_bytes == 4 * shard_x
    assert rows["n2"].per_execution.weights_read_bytes == 256 * 256 * BF16  # done: result 2
    assert rows["n3"].per_execution.activations_read_bytes == 16 * 1024 * BF16  # done: result 3
    assert rows["n3"].per_execution.weights_read_bytes == 0


SYNC_COMBINED = """HloModule ag
ENTRY e {
  w = bf16[256,1024]{1,0} parameter(0)
  x = bf16[4,1024]{1,0} parameter(1)
  ROOT a = (bf16[1024,1024]{1,0}, bf16[16,1024]{1,0}) all-gather(w, x), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
}"""


def test_combined_sync_all_gather_gives_each_result_its_operands_role():
    _an, rows = _rows(SYNC_COMBINED, {0: "weights", 1: "activations"})
    a = rows["a"].per_execution
    assert a.weights_write_bytes == 1024 * 1024 * BF16
    assert a.activations_write_bytes == 16 * 1024 * BF16


# The generic async wrapper around an all-gather: async-start / async-done with calls=.
ASYNC_WRAPPED = """HloModule ag
wrapped {
  p = bf16[256,1024]{1,0} parameter(0)
  ROOT ag = bf16[1024,1024]{1,0} all-gather(p), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
}
ENTRY e {
  w = bf16[256,1024]{1,0} parameter(0)
  s = ((bf16[256,1024]{1,0}), bf16[1024,1024]{1,0}) async-start(w), calls=wrapped
  d = bf16[1024,1024]{1,0} async-done(s)
  ROOT n = bf16[1024,1024]{1,0} negate(d)
}"""


def test_async_start_wrapping_an_all_gather_passes_the_weight_role():
    an, rows = _rows(ASYNC_WRAPPED, {0: "weights"})
    assert rows["n"].per_execution.weights_read_bytes == 1024 * 1024 * BF16
    assert an.totals.activations_read_bytes == 0
    assert an.totals.weights_write_bytes == 1024 * 1024 * BF16  # the gather, inside `wrapped`


# XLA:TPU's decomposed async all-gather (start, continuation, done fusions): TPU_DECOMPOSED,
# from tests/tpu_hlo.py. One all-gather: the gathered buffer is written once.


def test_tpu_decomposed_all_gather_is_one_gather_of_weights():
    an, rows = _rows(TPU_DECOMPOSED, {0: "weights", 1: "weights", 2: "activations"})
    shard, full, act = 512 * 1024 * BF16, 1024 * 1024 * BF16, 8 * 1024 * BF16
    s = rows["s"].per_execution  # the start: the gathered buffer (element 1, HBM), once
    assert s.hbm_write_bytes == s.weights_write_bytes == full and s.hbm_read_bytes == 0
    c = rows["c"].per_execution  # the continuation: only its dot's operands and result
    assert c.weights_read_bytes == full and c.activations_read_bytes == act
    assert c.hbm_write_bytes == c.activations_write_bytes == act
    assert rows["dn"].per_execution.hbm_bytes == 0  # the done waits
    t = an.totals
    assert t.weights_read_bytes == shard + full + full  # copy to VMEM, the two dots
    assert t.weights_write_bytes == full
    assert t.activations_read_bytes == 2 * act and t.activations_write_bytes == 2 * act


# ---- (a) real FSDP programs: TPU v5e and H100 agree ---------------------------------------

def _fsdp3(devs, D: int, B: int = 16):
    """Three weights [D, D] and the batch sharded over 4 devices (FSDP): the analysed program."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jaxmove
    from jaxmove._platform import quiet_stderr
    mesh = Mesh(np.array(devs[:4]), ("d",))
    a = lambda s: jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=NamedSharding(mesh, P("d", None)))  # noqa: E731

    def f(w1, w2, w3, x):
        return jnp.tanh(jnp.tanh(x @ w1) @ w2) @ w3
    with quiet_stderr():
        return jaxmove.analyze(f, a((D, D)), a((D, D)), a((D, D)), a((B, D)),
                               roles=("weights", "weights", "weights", "activations"))


@pytest.fixture(scope="module")
def tpu4():
    from tests.device_compile import tpu_devices
    return tpu_devices("v5e:2x2")


@pytest.fixture(scope="module")
def gpu4():
    pytest.importorskip("jax_plugins.xla_cuda12", reason="the CUDA plugin is not installed")
    from jaxmove.capture.targets import Target
    try:
        return Target.parse("h100-sxm:1x1x4").devices()
    except Exception as e:  # noqa: BLE001 - a plugin that cannot start here: skip, not fail
        pytest.skip(f"H100 target not available: {type(e).__name__}: {e}")


def _gather_write_roles(rep) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rep.rows:
        if r.collective is not None and r.collective.kind == "all-gather":
            pe = r.per_execution
            for role in ("weights", "activations"):
                out[role] = out.get(role, 0) + getattr(pe, f"{role}_write_bytes") * r.multiplicity.count
    return out


@pytest.mark.parametrize("D", [8192])
def test_tpu_fsdp_gathers_write_each_full_weight_once_as_weights(tpu4, D):
    rep = _fsdp3(tpu4, D)  # 128 MiB weights: XLA:TPU gathers them into HBM (sync + decomposed)
    full = D * D * BF16
    # the start fusion's result also holds sync flags (u32 S(2), s32 S(4): at most these bytes)
    flags = sum(leaf.byte_size for r in rep.rows if r.collective is not None
                for leaf in r.instr.shape.leaves() if leaf.layout is not None
                and leaf.layout.memory_space in (2, 4))
    w = _gather_write_roles(rep)
    assert w["activations"] == 0
    assert 3 * full <= w["weights"] <= 3 * full + flags  # each gathered weight written once
    assert 3 * full <= rep.totals.weights_write_bytes <= 3 * full + flags
    assert rep.totals.weights_read_bytes == 3 * full // 4 + 3 * full  # shards + gathered


def test_gpu_combined_fsdp_gather_writes_its_weights_as_weights(gpu4):
    D = 1024
    rep = _fsdp3(gpu4, D)  # XLA:GPU combines the three gathers into one all-gather-start
    starts = [r for r in rep.rows if r.instr.opcode == "all-gather-start"]
    assert any(len(r.instr.operands) == 3 for r in starts), [r.instr.operands for r in starts]
    assert _gather_write_roles(rep) == {"weights": 3 * D * D * BF16, "activations": 0}


# ---- (b) FLOPs of a 1-row dot that XLA:TPU compiles as multiply + reduce -------------------

K, N = 768, 3072
# the fusion libtpu 0.0.42 emits for bf16 [1,K] x [K,N] (layouts dropped)
ROW_DOT = f"""HloModule rowdot
add {{
  a = bf16[] parameter(0)
  b = bf16[] parameter(1)
  ROOT s = bf16[] add(a, b)
}}
fused {{
  x = bf16[{K}] parameter(1)
  bx = bf16[{K},{N}] broadcast(x), dimensions={{0}}
  cx = f32[{K},{N}] convert(bx)
  w = bf16[{K},{N}] parameter(0)
  cw = f32[{K},{N}] convert(w)
  m = f32[{K},{N}] multiply(cx, cw)
  cm = bf16[{K},{N}] convert(m)
  z = bf16[] constant(0)
  ROOT r = bf16[{N}] reduce(cm, z), dimensions={{0}}, to_apply=add
}}
ENTRY e {{
  w = bf16[{K},{N}] parameter(0)
  x = bf16[{K}] parameter(1)
  ROOT f = bf16[{N}] fusion(w, x), kind=kLoop, calls=fused
}}"""


def test_tpu_row_dot_flops_count_the_compiled_multiply_reduce():
    an, rows = _rows(ROW_DOT)
    # XLA's HloCostAnalysis: 1 per element for each of 3 converts and the multiply, K-1 adds
    # per output element for the reduce; the broadcast is free
    assert rows["f"].per_execution.flops == 3 * K * N + K * N + (K - 1) * N == 5 * K * N - N


def test_tpu_row_dot_flops_equal_the_tpu_compilers_cost_analysis(tpu4):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jaxmove
    from jaxmove._platform import quiet_stderr
    mesh = Mesh(np.array(tpu4[:1]), ("x",))
    a = lambda s: jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=NamedSharding(mesh, P()))  # noqa: E731
    f = lambda x, w: x @ w  # noqa: E731
    with quiet_stderr():
        xla = jax.jit(f).lower(a((1, K)), a((K, N))).compile().cost_analysis()["flops"]
        rep = jaxmove.analyze(f, a((1, K)), a((K, N)))
    assert any("multiply_reduce" in r.instr.name for r in rep.rows)  # the pattern above
    assert rep.totals.flops == xla == 5 * K * N - N


# ---- (c) GPU: split-K partials and 1-row dots as multiply + reduce -----------------------

def _excess(text: str):
    from jaxmove.hardware import load_spec
    from jaxmove.passes.excess import excess_pass
    from jaxmove.passes.reuse import reuse_pass
    spec = load_spec("h100-sxm")
    an = analyze_module(parse_module(text, "dev.hlo"), {0: "activations", 1: "weights", 2: "weights"})
    return excess_pass(an, (), spec, reuse_pass(an, spec)), an


S, M, Kd, Nd = 8, 256, 3072, 768
# XLA:GPU's split-K in the nested Triton gemm form (as in the un-autotuned prefill of
# gpt2-small, layers_0/mlp/proj): no split_k field, the contraction cut into S parts as a
# batch dimension of the dot, f32 partials [S, M, N] summed over S by the consumer.
SPLIT_K = f"""HloModule splitk
gemm {{
  a = bf16[{M},{S},{Kd // S}] parameter(0)
  b = bf16[{S},{Kd // S},{Nd}] parameter(1)
  ROOT d = f32[{S},{M},{Nd}] dot(a, b), lhs_batch_dims={{1}}, lhs_contracting_dims={{2}}, rhs_batch_dims={{0}}, rhs_contracting_dims={{1}}
}}
sum {{
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}}
red {{
  p = f32[{S},{M},{Nd}] parameter(0)
  z = f32[] constant(0)
  r = f32[{M},{Nd}] reduce(p, z), dimensions={{0}}, to_apply=sum
  ROOT c = bf16[{M},{Nd}] convert(r)
}}
ENTRY e {{
  a = bf16[{M},{S},{Kd // S}] parameter(0)
  b = bf16[{S},{Kd // S},{Nd}] parameter(1)
  g = f32[{S},{M},{Nd}] fusion(a, b), kind=kCustom, calls=gemm, backend_config={{"fusion_backend_config":{{"kind":"__triton_nested_gemm_fusion","block_level_fusion_config":{{"num_warps":"2","output_tiles":[{{"sizes":["1","16","8"]}}],"num_ctas":1,"num_stages":1}}}}}}
  ROOT o = bf16[{M},{Nd}] fusion(g), kind=kLoop, calls=red
}}"""


def test_nested_gemm_split_k_partials_are_attributed_to_split_k():
    ex, _an = _excess(SPLIT_K)
    partials = S * M * Nd * 4  # f32 partial sums, written once and read back once
    assert ex.bytes_of("split_k_partials") == 2 * partials
    c = next(c for c in ex.causes if c.kind == "split_k_partials")
    assert "splitk_rewriter.cc" in c.fix and "xla_gpu_experimental_force_split_k" in c.fix
    assert ex.bytes_of("materialized_intermediate") == 0


def test_xla_gpu_splits_a_skinny_dot_by_its_heuristic_and_the_fix_text_turns_it_off():
    """What the split_k_partials fix text says of XLA:GPU (the installed plugin): a decode GEMM
    [32, 8192] x [8192, 1024] bf16 compiled for h100-sxm becomes an [S, 1024, 32] f32 dot
    summed over S (SplitkRewriter: no autotuning involved), and the compiler option the text
    names compiles it as one bf16 dot."""
    import importlib.util
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        pytest.skip('the CUDA plugin is not installed (pip install "jaxmove[gpu]")')
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding
    from jaxmove.capture.targets import Target, _load_devices
    dev = SingleDeviceSharding(_load_devices(Target.parse("h100-sxm"))[0])
    low = jax.jit(lambda x, w: x @ w).lower(jax.ShapeDtypeStruct((32, 8192), jnp.bfloat16, sharding=dev),
                                            jax.ShapeDtypeStruct((8192, 1024), jnp.bfloat16, sharding=dev))

    def dots(options):
        return [line.split("=", 1)[1].split()[0] for line in low.compile(options).as_text().splitlines()
                if " dot(" in line]
    split = dots({})
    assert len(split) == 1 and split[0].startswith("f32[") and split[0].endswith(",1024,32]{1,2,0}"), split
    assert dots({"xla_gpu_experimental_force_split_k": 1}) == ["bf16[1024,32]{0,1}"]


def test_a_batched_dot_summed_elsewhere_is_not_split_k():
    # the same gemm, but its result is also returned whole: not only reduced over S
    text = SPLIT_K.replace("ROOT o = bf16", "o = bf16").rstrip("}") + (
        f"  ROOT t = (bf16[{M},{Nd}], f32[{S},{M},{Nd}]) tuple(o, g)\n}}")
    ex, _an = _excess(text)
    assert ex.bytes_of("split_k_partials") == 0


Kg, Ng = 768, 3072
# XLA:GPU's batch-1 decode dot [1,K] x [K,N] (gpt2-small layers_0/mlp/fc): a multiply
# kernel writes the [K,N] product, a reduce kernel reads it back.
GEMV = f"""HloModule gemv
mul {{
  x = bf16[1,1,{Kg}] parameter(1)
  bx = bf16[{Kg}] bitcast(x)
  b = bf16[{Kg},{Ng}] broadcast(bx), dimensions={{0}}
  w = bf16[{Kg},{Ng}] parameter(0)
  ROOT m = bf16[{Kg},{Ng}] multiply(b, w), metadata={{op_name="jit(decode)/layers_0/mlp/dot_general"}}
}}
sum {{
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}}
red {{
  p = bf16[{Kg},{Ng}] parameter(0)
  c = f32[{Kg},{Ng}] convert(p)
  z = f32[] constant(0)
  r = f32[{Ng}] reduce(c, z), dimensions={{0}}, to_apply=sum
  ROOT o = bf16[{Ng}] convert(r)
}}
ENTRY e {{
  x = bf16[1,1,{Kg}] parameter(0)
  w = bf16[{Kg},{Ng}] parameter(1)
  f = bf16[{Kg},{Ng}] fusion(w, x), kind=kLoop, calls=mul, metadata={{op_name="jit(decode)/layers_0/mlp/dot_general"}}
  ROOT r = bf16[{Ng}] fusion(f), kind=kInput, calls=red
}}"""


def test_batch1_dot_as_multiply_reduce_is_its_own_cause():
    ex, an = _excess(GEMV)
    product = Kg * Ng * BF16  # written by the multiply kernel, read back by the reduce
    assert ex.bytes_of("dot_as_multiply_reduce") == 2 * product
    assert an.totals.weights_read_bytes == Kg * Ng * BF16  # the weight itself: once, compulsory
    assert ex.by_role["weights"].excess_bytes == 0


# ---- (d) TPU decode: the KV buffer kept in VMEM and written back whole --------------------

# libtpu 0.0.42, gpt2-small decode, layers_0 k_cache: memory-space assignment prefetches the
# donated cache into VMEM (copy-start), the in-place dynamic-update-slice runs there, and a
# second copy-start evicts the whole buffer to HBM (the aliased output).
KV = """HloModule kv, input_output_alias={ {}: (0, {}, may-alias) }
ENTRY e {
  c = bf16[12,1024,64]{2,1,0} parameter(0)
  u = bf16[12,1,64]{2,1,0:S(1)} parameter(1)
  i = s32[]{:S(6)} parameter(2)
  z = s32[]{:S(6)} constant(0)
  p = (bf16[12,1024,64]{2,1,0:S(1)}, bf16[12,1024,64]{2,1,0}, u32[]{:S(2)}) copy-start(c)
  pd = bf16[12,1024,64]{2,1,0:S(1)} copy-done(p)
  d = bf16[12,1024,64]{2,1,0:S(1)} dynamic-update-slice(pd, u, z, i, z)
  e = (bf16[12,1024,64]{2,1,0}, bf16[12,1024,64]{2,1,0:S(1)}, u32[]{:S(2)}) copy-start(d)
  ROOT ed = bf16[12,1024,64]{2,1,0} copy-done(e)
}"""


def test_tpu_kv_buffer_evicted_from_vmem_is_real_traffic_and_said_so():
    from jaxmove.hardware import load_spec
    from jaxmove.passes.excess import excess_pass
    from jaxmove.passes.reuse import reuse_pass
    an, rows = _rows(KV, {0: "kv_cache", 1: "activations", 2: "activations"})
    whole = 12 * 1024 * 64 * BF16
    assert rows["p"].per_execution.kv_cache_read_bytes == whole  # prefetch HBM -> VMEM
    assert rows["d"].per_execution.hbm_bytes == 0                # the update runs in VMEM
    assert rows["e"].per_execution.kv_cache_write_bytes == whole  # eviction VMEM -> HBM
    assert any("evicts a buffer" in n for n in rows["e"].notes)
    spec = load_spec("tpu-v5e")
    ex = excess_pass(an, (), spec, reuse_pass(an, spec))
    c = next(c for c in ex.causes if c.kind == "whole_rewrite")
    row = 12 * 1 * 64 * BF16  # the new row: the only compulsory write (not yet credited here)
    assert set(c.by_role) == {"kv_cache"} and whole - row <= c.bytes <= whole
    assert "memory-space assignment" in c.fix and "compiler choice" in c.fix
