"""Quantization as served (issue 24): int4 weights, fp8 x fp8 GEMMs (``act_dtype=fp8``), and the
MoE experts / MLA ``kv_b`` scaled after their matmuls like the dense layers.

Numerics on CPU against the dequantized weights (``Dense.weight()``: kernel * scale, the
definition); programs compiled without the device for h100-sxm / b200 (fp8 x fp8 dots: both
dot operands float8_e4m3fn in the compiled HLO) and tpu-v5e (s4 parameters).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from jaxmove import zoo

ROOT = Path(__file__).resolve().parents[1]


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _dense(shape, axes, in_dims, weights_dtype, act_dtype=None, seed=0):
    """A Dense of ``shape`` with random quantized values and random positive scales."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jaxmove.zoo.transformer import QMAX, Dense, TransformerConfig
    cfg = TransformerConfig(weights_dtype=weights_dtype, act_dtype=act_dtype)
    d = Dense(shape, axes, cfg, rngs=nnx.Rngs(0), in_dims=in_dims)
    rng = np.random.default_rng(seed)
    q = jnp.dtype(cfg.weights_dtype)
    qmax = QMAX[q.name]
    vals = rng.integers(-int(qmax), int(qmax) + 1, shape) if jnp.issubdtype(q, jnp.integer) else \
        rng.uniform(-qmax, qmax, shape)
    d.kernel.set_value(jnp.asarray(vals).astype(q))
    d.scale.set_value(jnp.asarray(rng.uniform(0.5, 2.0, d.scale.shape) / qmax, jnp.float32))
    del jax
    return d


@pytest.mark.parametrize("q", ["int8", "int4", "fp8"])
def test_dense_scaled_after_the_matmul_equals_the_dequantized_weight(q):
    """(x @ kernel) * scale == x @ (kernel * scale), for a projection (leading in dims), an
    output projection with two in dims and an expert kernel (in dim 1: scale [E, F])."""
    import jax.numpy as jnp
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 3, 16)), jnp.float32)
    d = _dense((16, 4, 8), ("embed", "heads", "kv"), (0,), q)
    np.testing.assert_allclose(d(x), jnp.tensordot(x, d.weight(), axes=1), rtol=1e-5, atol=1e-5)
    o = _dense((4, 8, 16), ("heads", "kv", "embed"), (0, 1), q)
    xo = jnp.asarray(rng.standard_normal((2, 3, 4, 8)), jnp.float32)
    np.testing.assert_allclose(o(xo), jnp.tensordot(xo, o.weight(), axes=2), rtol=1e-5, atol=1e-5)
    e = _dense((3, 16, 8), ("expert", "embed", "mlp"), (1,), q)
    xe = jnp.asarray(rng.standard_normal((3, 2, 5, 16)), jnp.float32)
    got = e.einsum("ebcd,edf->ebcf", xe)
    np.testing.assert_allclose(got, jnp.einsum("ebcd,edf->ebcf", xe, e.weight()), rtol=1e-5, atol=1e-5)
    # the scale matters: a kernel read without it gives another result
    assert np.abs(np.asarray(got) - np.asarray(jnp.einsum("ebcd,edf->ebcf", xe, e.kernel[...].astype(
        jnp.float32)))).max() > 1.0


def test_fp8_activations_are_close_to_the_weight_only_result():
    """act_dtype=fp8: rows quantized to e4m3 (3 mantissa bits: relative rounding error <= 2**-4
    per element) -> the product within a few % of the weight-only one, and not equal to it."""
    import jax.numpy as jnp
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((4, 64)), jnp.float32)
    w8 = _dense((64, 32), ("embed", "mlp"), (0,), "fp8", "fp8")
    ref = jnp.tensordot(x, w8.weight(), axes=1)
    got = w8(x)
    err = np.linalg.norm(np.asarray(got - ref)) / np.linalg.norm(np.asarray(ref))
    assert 0 < err < 2 ** -4
    with pytest.raises(zoo.PresetError, match="act_dtype=float8_e4m3fn .* needs weights_dtype=fp8"):
        zoo.build("llama3-8b-decode", {"layers": "1", "act_dtype": "fp8"})
    with pytest.raises(zoo.PresetError, match="unknown act_dtype 'int8'"):
        zoo.build("llama3-8b-decode", {"layers": "1", "act_dtype": "int8"})


def test_int4_weights_are_half_a_byte():
    small = dict(layers="1", d_model="64", heads="4", kv_heads="2", d_ff="128", vocab="256",
                 seq_len="16", batch="2")
    p = zoo.build("llama3-8b-decode", {**small, "weights_dtype": "int4"}).args[0]
    k = p["layers"][0]["mlp"]["down"]["kernel"]
    assert str(k.dtype) == "int4" and k.shape == (128, 64)
    with pytest.raises(zoo.PresetError, match="unknown kv_dtype 'int4'"):
        zoo.build("llama3-8b-decode", {**small, "kv_dtype": "int4"})


def test_mla_absorbed_decode_scales_match_the_dequantized_weights():
    """DeepSeek (MLA) decode with int8 kv_b: W_uk's scale applied to the queries and W_uv's to
    the result gives the same logits as the same model with kv_b stored dequantized (bf16
    replaced by f32 for the comparison)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jaxmove.zoo import transformer as tf
    dims = dict(family="deepseek", vocab=64, d_model=32, heads=2, head_dim=8, q_lora_rank=16,
                kv_lora_rank=16, qk_rope_dim=8, v_head_dim=8, d_ff=32, layers=1, batch=1, seq_len=8,
                dtype="float32")
    cfg_q = tf.TransformerConfig(**dims, weights_dtype="int8")
    cfg_f = tf.TransformerConfig(**dims)
    mq, mf = tf.Transformer(cfg_q, rngs=nnx.Rngs(0)), tf.Transformer(cfg_f, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(3)
    dense_f = {path: n for path, n in nnx.iter_graph(mf) if isinstance(n, tf.Dense)}
    for path, node_q in nnx.iter_graph(mq):
        if isinstance(node_q, tf.Dense):
            node_f = dense_f[path]
            node_q.kernel.set_value(jnp.asarray(rng.integers(-127, 128, node_q.kernel.shape), jnp.int8))
            node_q.scale.set_value(jnp.asarray(rng.uniform(0.5, 2, node_q.scale.shape) / 127, jnp.float32))
            node_f.kernel.set_value(node_q.weight())
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tf.abstract_cache(cfg_q)[0])
    tok = jnp.asarray([[5]], jnp.int32)
    decode = nnx.jit(lambda m, c, t, pos: m.decode(c, t, pos))   # one compile each, not op by op
    lq, _ = decode(mq, cache, tok, jnp.int32(3))
    lf, _ = decode(mf, cache, tok, jnp.int32(3))
    np.testing.assert_allclose(lq, lf, rtol=2e-4, atol=2e-4)


# ---- compiled programs -----------------------------------------------------------------------

_WORKER = textwrap.dedent("""
    import json, sys
    import jaxmove
    from jaxmove.capture import resolve_program
    target, cases = sys.argv[1], json.loads(sys.argv[2])
    out = {}
    for key, (preset, sets) in cases.items():
        p = resolve_program(preset, overrides=sets, target=target)
        m = jaxmove.parse_module(p.hlo_text)
        dots = []
        for comp in m.computations.values():
            by = {i.name: i for i in comp.instructions}
            dots += [[str(by[o].shape).split("[")[0] for o in i.operands]
                     for i in comp.instructions if i.opcode == "dot"]
        params = [str(i.shape).split("[")[0] for i in m.entry.instructions if i.opcode == "parameter"]
        out[key] = {"dots": dots, "params": params}
    json.dump(out, sys.stdout)
""")
#: one layer: each layer is the same GEMMs (at two, the GPU compiles took ~40% longer)
L = 1
SMALL = dict(layers=str(L), d_model="512", heads="4", kv_heads="2", d_ff="1024", vocab="1024",
             seq_len="256", batch="8")


FP8_CASES = {
    "fp8": ["llama3-8b-decode", {**SMALL, "weights_dtype": "fp8", "act_dtype": "fp8"}],
    "weight_only": ["llama3-8b-decode", {**SMALL, "weights_dtype": "fp8"}],
    "moe": ["mixtral-8x7b-decode", {**SMALL, "experts": "4", "weights_dtype": "fp8", "act_dtype": "fp8"}]}
INT4_CASES = {"int4": ["llama3-8b-decode", {**SMALL, "weights_dtype": "int4"}]}
# (test, target) -> (the plugin it needs, the cases its worker compiles)
_RUNS = {("fp8", "h100-sxm"): ("jax_plugins.xla_cuda12", FP8_CASES),
         ("fp8", "b200"): ("jax_plugins.xla_cuda12", FP8_CASES),
         ("int4", "h100-sxm"): ("jax_plugins.xla_cuda12", INT4_CASES),
         ("int4", "tpu-v5e"): ("libtpu", INT4_CASES)}


@pytest.fixture(scope="module")
def compiled() -> dict:
    """Every compile worker of this file's compiled-program tests, two at a time, one process
    per target (the fp8 and int4 cases of h100-sxm in one: a process start, jax and the CUDA
    plugin cost about 2.5 s of CPU): (test, target) -> its output, for the plugins installed."""
    from tests.conftest import run_side_by_side
    by_target: dict[str, dict] = {}
    for (test, target), (module, cases) in _RUNS.items():
        if _have(module):
            by_target.setdefault(target, {}).update({f"{test}/{k}": v for k, v in cases.items()})
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    procs = run_side_by_side([[sys.executable, "-c", _WORKER, target, json.dumps(cases)]
                              for target, cases in by_target.items()],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out: dict = {}
    for target, proc in zip(by_target, procs):
        assert proc.returncode == 0, (target, proc.stderr[-3000:])
        for key, got in json.loads(proc.stdout).items():
            test, case = key.split("/", 1)
            out.setdefault((test, target), {})[case] = got
    return out


@pytest.mark.parametrize("target", ["h100-sxm", "b200"])
def test_fp8_activations_compile_to_fp8_x_fp8_dots(target, compiled):
    if not _have("jax_plugins.xla_cuda12"):
        pytest.skip('the CUDA plugin is not installed (pip install "jaxmove[gpu]")')
    out = compiled[("fp8", target)]
    f8 = ["f8e4m3fn", "f8e4m3fn"]
    # per layer q, k, v, o, gate, up, down (some fused by XLA) + the LM head: at least L x 4 + 1
    assert sum(d == f8 for d in out["fp8"]["dots"]) >= L * 4 + 1, out["fp8"]["dots"]
    assert f8 not in out["weight_only"]["dots"]          # weight-only: bf16 x (converted) fp8
    # per layer attention's two (q/k/v fused, o) and the experts' two (gate/up fused, down), and
    # the LM head: 4 L + 1 (XLA:GPU compiles 5 of the 6 dots at L = 1 this way; the router's is
    # not fp8), so the experts' dots must be fp8 x fp8 for this to hold
    assert sum(d == f8 for d in out["moe"]["dots"]) >= 4 * L + 1, out["moe"]["dots"]


def test_int4_weights_compile_as_s4_parameters(compiled):
    ran = 0
    for target, module in (("h100-sxm", "jax_plugins.xla_cuda12"), ("tpu-v5e", "libtpu")):
        if not _have(module):
            continue
        out = compiled[("int4", target)]["int4"]
        # L layers x 7 kernels + the LM head, stored as s4
        assert out["params"].count("s4") == L * 7 + 1, (target, out["params"])
        ran += 1
    if not ran:
        pytest.skip("neither libtpu nor the CUDA plugin is installed")


def test_auto_attention_over_a_quantized_cache_says_it_is_xlas_on_gpu_and_tpu():
    """attention=auto decodes with XLA's attention over an int8 cache on GPU and TPU targets
    (the decode kernels read the cache in the model dtype): the report says so there (a user
    trial: int8 KV on h100-sxm was twice as slow as bf16 and nothing said why), not on cpu
    (no kernel there) and not for a cache in the model dtype."""
    import importlib.util

    import jaxmove
    sets = dict(layers="1", d_model="256", heads="4", kv_heads="2", d_ff="512", vocab="512",
                seq_len="128", batch="2")
    targets = [None] + [t for t, mod in (("h100-sxm", "jax_plugins.xla_cuda12"), ("tpu-v5e", "libtpu"))
                        if importlib.util.find_spec(mod) is not None]
    for target in targets:
        for kv in ("int8", "bfloat16"):
            rep = jaxmove.analyze("llama3-8b-decode", overrides={**sets, "kv_dtype": kv}, target=target)
            said = [n for n in rep.notes if n.startswith("attention=auto over a KV cache of int8")]
            assert len(said) == (1 if target is not None and kv == "int8" else 0), (target, kv)
