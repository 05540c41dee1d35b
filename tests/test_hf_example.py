"""examples/hf_flax.py: Hugging Face Flax models (random-initialised from a config, abstract,
no download) wrapped as Workloads with roles from their parameter names.

Closed forms are written from the configs here (HF's Flax Llama: Dense kernels [in, out]
without biases, RMSNorm ``weight`` [d]; GPT-2: fused qkv ``c_attn``, LayerNorm scale + bias,
learned positions, LM head tied to ``wte``), independently of the example and of jaxmove.
Byte identities on reads are checked on a reduced f32 Llama with XLA:CPU (which keeps HF
Llama's [B, S, H_kv, D] cache and [in, out] kernels in their layouts; for HF GPT-2 XLA:CPU
copies each layer's cache and its [out, in] kernels transposed, so reads there are larger).
Skipped when transformers with Flax models (``pip install -e ".[hf]"``) is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402

try:
    from transformers import (FlaxGPT2LMHeadModel, FlaxLlamaForCausalLM,  # noqa: E402
                              GPT2Config, LlamaConfig)
except ImportError as e:  # not installed, or a release without Flax models (transformers 5)
    pytest.skip(f"transformers with Flax models is not installed ({e}); "
                'pip install -e ".[hf]" (transformers>=4.40,<5)', allow_module_level=True)

from jaxmove import analyze  # noqa: E402
from jaxmove.capture import capture  # noqa: E402
from jaxmove.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hf_flax.py"
_spec = importlib.util.spec_from_file_location("hf_flax_example", EXAMPLE)
hf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf)

# reduced Llama: vocab, d_model, heads, kv heads, head dim, d_ff, batch, cache length
V, D_MODEL, H, HKV, F, B, S = 512, 64, 4, 2, 128, 2, 32
D = D_MODEL // H


def tree_bytes(tree) -> int:
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def llama_layer_params(d, h, hkv, hd, f) -> int:
    """q, k, v, o projections, gate/up/down SwiGLU kernels, two RMSNorm weights."""
    return d * h * hd + 2 * d * hkv * hd + h * hd * d + 3 * d * f + 2 * d


def llama_params(v, d, layers, h, hkv, hd, f) -> int:
    """Embedding + untied LM head + layers + final norm."""
    return 2 * v * d + layers * llama_layer_params(d, h, hkv, hd, f) + d


def gpt2_params(v, positions, d, layers) -> int:
    """wte + wpe + per layer (ln_1, c_attn 3d x d + 3d, c_proj d x d + d, ln_2, c_fc 4d x d + 4d,
    c_proj d x 4d + d = 12 d^2 + 13 d) + ln_f; the LM head is wte (tied)."""
    return v * d + positions * d + layers * (12 * d * d + 13 * d) + 2 * d


def llama(layers: int):
    cfg = LlamaConfig(vocab_size=V, hidden_size=D_MODEL, intermediate_size=F,
                      num_hidden_layers=layers, num_attention_heads=H, num_key_value_heads=HKV,
                      max_position_embeddings=S, tie_word_embeddings=False)
    return hf.decode_workload(FlaxLlamaForCausalLM, cfg, batch=B, seq_len=S)


def role_bytes(prog) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in prog.parameters:
        out[p.role] = out.get(p.role, 0) + p.byte_size
    return out


@pytest.fixture(scope="module")
def llama_runs():
    """{layers: (workload, program, report)} of the reduced f32 Llama, each compiled once."""
    runs = {}
    for layers in (2, 3):
        wl = llama(layers)
        prog = capture(wl)
        runs[layers] = (wl, prog, analyze(prog))
    return runs


def test_gpt2_small_is_abstract_with_the_published_parameter_count():
    """``GPT2Config()`` is the ``gpt2`` checkpoint's layout: 124,439,808 parameters, none
    allocated; every parameter is a weight by its name, K/V are kv_cache, counters are not."""
    wl = hf.gpt2_decode()
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(wl.args))
    n = sum(math.prod(x.shape) for x in jax.tree.leaves(wl.args[0]))
    assert n == gpt2_params(50257, 1024, 768, 12) == 124_439_808
    def roles(arg: int, name: str) -> dict[str, str]:
        flat = jax.tree_util.tree_flatten_with_path(wl.args[arg])[0]
        paths = [jax.tree_util.keystr(k, simple=True, separator="/") for k, _ in flat]
        return {p: wl.roles(f"{name}/{p}", None) for p in paths}

    assert set(roles(0, "params").values()) == {"weights"}
    for path, role in roles(1, "cache").items():
        assert role == ("activations" if path.endswith("cache_index") else "kv_cache"), path
    assert wl.roles("input_ids", None) == "activations"
    # the cache: per layer K and V [B, S, H, D] in f32
    assert tree_bytes(wl.args[1]) == 12 * (2 * 1 * 1024 * 768 * 4 + 4)


def test_llama_entry_parameters_are_the_config_closed_forms(llama_runs):
    for layers, (wl, prog, _rep) in llama_runs.items():
        by_role = role_bytes(prog)
        params = llama_params(V, D_MODEL, layers, H, HKV, D, F) * 4
        assert by_role["weights"] == tree_bytes(wl.args[0]) == params
        assert by_role["kv_cache"] == 2 * layers * B * S * HKV * D * 4            # 2 L B S Hkv D b
        assert all(p.donated for p in prog.parameters if p.role == "kv_cache")


def test_one_more_layer_reads_exactly_its_parameter_bytes(llama_runs):
    """Weights read grow by the added layer's bytes in the abstract tree (= the closed form)."""
    wl3 = llama_runs[3][0]
    layer_bytes = tree_bytes(wl3.args[0]["model"]["layers"]["2"])
    assert layer_bytes == llama_layer_params(D_MODEL, H, HKV, D, F) * 4
    read = {L: rep.totals.role_bytes("weights")[0] for L, (_, _, rep) in llama_runs.items()}
    assert read[3] - read[2] == layer_bytes


def test_decode_reads_the_cache_once_and_writes_one_position(llama_runs):
    for layers, (_wl, _prog, rep) in llama_runs.items():
        read, written = rep.totals.role_bytes("kv_cache")
        assert read == 2 * layers * B * S * HKV * D * 4
        assert written == 2 * layers * B * 1 * HKV * D * 4


def test_cli_analyzes_the_documented_target(capsys):
    """``jaxmove analyze examples/hf_flax.py:llama_decode`` (bf16, 2 layers, batch 4, cache 512)."""
    assert main(["analyze", f"{EXAMPLE}:llama_decode", "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    by_role: dict[str, int] = {}
    for p in j["parameters"]:
        by_role[p["role"]] = by_role.get(p["role"], 0) + p["byte_size"]
    assert by_role["weights"] == llama_params(32000, 512, 2, 8, 2, 64, 1408) * 2
    assert by_role["kv_cache"] == 2 * 2 * 4 * 512 * 2 * 64 * 2
    assert j["program"]["name"] == "hf-llama-decode"
