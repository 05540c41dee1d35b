"""Wrap a Hugging Face Flax model as a jaxmove ``Workload`` (random-initialised, no download).

    pip install -e ".[hf]"             # transformers>=4.40,<5 (transformers 5 has no Flax models)
    jaxmove analyze examples/hf_flax.py:gpt2_decode
    jaxmove analyze examples/hf_flax.py:llama_decode --target tpu-v5e:2x2

Each ``module:function`` here is called with no arguments and returns a ``Workload``: one
decode step ``fn(params, cache, input_ids, attention_mask, position_ids) -> (logits, cache)``
of a ``Flax*ForCausalLM`` / ``Flax*LMHeadModel`` built from a config with ``_do_init=False``.
The parameters and the KV cache are ``jax.eval_shape`` trees of ``jax.ShapeDtypeStruct``:
nothing is allocated, nothing is downloaded (``HF_HUB_OFFLINE=1`` is set and
``from_pretrained`` is never called), so a real-size configuration costs compile time only.

Roles come from the leaves' names (``leaf_role``: ``jaxmove.vocab.unlabeled_role``, the rule
jaxmove applies to an HLO dump's parameter names, of the path inside each argument): Flax
parameters end in ``kernel`` / ``bias`` / ``scale`` / ``embedding`` / ``weight`` -> ``weights``;
the Flax cache's ``cached_key`` / ``cached_value`` -> ``kv_cache``; its ``cache_index`` counter
and the token inputs -> ``activations``. The cache is donated (HF's ``_concatenate_to_cache``
writes the new position with ``lax.dynamic_update_slice``).

The same wrapper takes the other Flax causal LMs with ``init_cache`` (``FlaxMistralForCausalLM``
and ``FlaxGemmaForCausalLM`` checked): ``decode_workload(cls, config)``. Checked with
transformers 4.40.2, 4.49.0 and 4.57.6 (4.50+ print a deprecation notice for the Flax classes).
Keep ``max_position_embeddings`` (GPT-2: ``n_positions``) at the cache length: HF's Flax
attention builds a [P, P] causal mask of that size inside the program.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")        # never reach the hub

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxmove.capture.workload import Workload  # noqa: E402
from jaxmove.vocab import unlabeled_role  # noqa: E402

__all__ = ["decode_workload", "gpt2_decode", "llama_decode", "abstract_params", "leaf_role"]

INSTALL_HINT = 'pip install -e ".[hf]" (transformers>=4.40,<5; transformers 5 has no Flax models)'


def _transformers():
    """The ``transformers`` module, or ImportError with the install line."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"this example needs transformers with Flax models: {INSTALL_HINT}") from e
    return transformers


def _cast(tree, dtype):
    """``tree`` (of ShapeDtypeStruct) with every floating leaf in ``dtype``."""
    def one(x):
        return jax.ShapeDtypeStruct(x.shape, dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
    return jax.tree.map(one, tree)


def abstract_params(model, dtype=jnp.float32):
    """The parameter tree of ``model`` (a ``FlaxPreTrainedModel`` made with ``_do_init=False``)
    as ``jax.ShapeDtypeStruct`` leaves: ``jax.eval_shape`` of its ``init_weights`` (the random
    initialiser; nothing allocated). Floating leaves are cast to ``dtype`` (HF initialises f32;
    ``model.to_bf16`` is the concrete equivalent)."""
    params = jax.eval_shape(lambda: model.init_weights(jax.random.PRNGKey(0), (1, 1)))
    return _cast(dict(params), dtype)


def leaf_role(path: str, _leaf=None) -> str:
    """Role of an argument leaf from its name inside the argument: ``path`` is jaxmove's
    ``arg/key/key/...`` string (``cache/model/layers/0/self_attn/cached_key``); its first
    component, the Python argument's name, is dropped, and ``unlabeled_role`` names the rest:
    ``.../kernel``, ``bias``, ``scale``, ``embedding``, ``weight`` -> ``weights``;
    ``cached_key`` / ``cached_value`` -> ``kv_cache``; the int32 ``cache_index`` counter and the
    token inputs (``input_ids``, no ``/``) -> ``activations``."""
    return unlabeled_role(path.split("/", 1)[1] if "/" in path else path)


def decode_workload(model_cls, config, *, batch: int = 1, seq_len: int | None = None,
                    dtype=jnp.float32, name: str | None = None) -> Workload:
    """One decode step of a Hugging Face Flax causal LM, abstract.

    Args:
      model_cls: a transformers Flax class with ``init_weights`` / ``init_cache``
        (``FlaxGPT2LMHeadModel``, ``FlaxLlamaForCausalLM``, ...).
      config: its ``PretrainedConfig`` (random initialisation: no weights are loaded).
      batch: B, sequences decoded together.
      seq_len: S, the KV cache length (default: the config's ``max_position_embeddings``).
      dtype: parameters, activations and cache (``jnp.float32`` / ``jnp.bfloat16``).
      name: the workload's name (default ``hf-<model_type>-decode``).

    Returns:
      A ``Workload`` of ``fn(params, cache, input_ids, attention_mask, position_ids)`` ->
      ``(logits [B, 1, V], cache)``; input_ids / position_ids int32 [B, 1], attention_mask
      int32 [B, S]; cache (the Flax ``cache`` collection: per layer ``cached_key`` /
      ``cached_value`` [B, S, H_kv, D] and an int32 ``cache_index``) donated. Roles from the
      leaves' names (``leaf_role``).

    Raises:
      ImportError: transformers is not installed (the message gives the install line).
    """
    _transformers()
    seq_len = seq_len or config.max_position_embeddings
    model = model_cls(config, _do_init=False, dtype=dtype)
    params = abstract_params(model, dtype)
    cache = _cast(jax.eval_shape(lambda: model.init_cache(batch, seq_len)), dtype)

    def decode(params, cache, input_ids, attention_mask, position_ids):
        out = model(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    params=params, past_key_values=cache)
        return out.logits, out.past_key_values

    tokens = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
    mask = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    return Workload(
        name=name or f"hf-{config.model_type}-decode",
        fn=decode,
        args=(params, cache, tokens, mask, tokens),
        roles=leaf_role,
        donate_argnums=(1,),
        config={"model": model_cls.__name__, "mode": "decode", "batch": batch, "seq_len": seq_len,
                "dtype": jnp.dtype(dtype).name, **config.to_diff_dict()},
    )


def gpt2_decode() -> Workload:
    """GPT-2 small (124M: V 50257, d 768, 12 layers, 12 heads, tied LM head), batch 1, cache
    1024, f32: ``GPT2Config()``'s defaults are the published ``gpt2`` checkpoint's."""
    t = _transformers()
    return decode_workload(t.FlaxGPT2LMHeadModel, t.GPT2Config(), batch=1, seq_len=1024,
                           name="hf-gpt2-decode")


def llama_decode() -> Workload:
    """A 2-layer Llama (GQA 8 / 2 heads of 64, d 512, SwiGLU 1408, V 32000, untied), batch 4,
    cache 512, bf16: small enough to compile in seconds; pass a real ``LlamaConfig`` to
    ``decode_workload`` for a real size."""
    t = _transformers()
    cfg = t.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408,
                        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                        max_position_embeddings=512, tie_word_embeddings=False)
    return decode_workload(t.FlaxLlamaForCausalLM, cfg, batch=4, seq_len=512, dtype=jnp.bfloat16,
                           name="hf-llama-decode")
