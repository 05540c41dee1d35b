"""GPT-2-style decoder in Flax NNX, with prefill and one-step KV-cache decode.

Architecture (Radford et al. 2019, "Language Models are Unsupervised Multitask
Learners"; the layout of Hugging Face ``GPT2LMHeadModel``):

  token embedding ``wte`` [vocab, d_model] + learned position embedding
  ``wpe`` [seq_len, d_model]  ->  ``layers`` x pre-LN block
  (``ln1`` -> causal self-attention -> residual, ``ln2`` -> MLP(gelu) -> residual)
  -> final LayerNorm ``ln_f`` -> LM head.

The LM head is **tied** to ``wte`` like GPT-2 (logits = h @ wte.T), so GPT-2 small
has the familiar 124,439,808 parameters.  The position table has ``seq_len`` rows:
``seq_len`` is both the prompt length of prefill and the cache length of decode.

Attention supports multi-head (``kv_heads == heads``), grouped-query
(``kv_heads`` divides ``heads``) and multi-query (``kv_heads == 1``) attention.
All projections carry biases, as in GPT-2.

KV-cache layout (one step of decode reads and writes this):

  unstacked (``scan_layers=False``)::

      {"layers": [{"k_cache": T, "v_cache": T}, ...]}   # one dict per layer
      T = [batch, kv_heads, seq_len, head_dim] in the model dtype

  stacked (``scan_layers=True``)::

      {"k_cache": [layers, batch, kv_heads, seq_len, head_dim],
       "v_cache": [layers, batch, kv_heads, seq_len, head_dim]}

Heads before positions: both attention dots then contract the cache in its stored
layout (keys over head_dim, values over positions), so XLA reads the cache once
instead of first copying it into a transposed layout (XLA:CPU does that copy for a
[batch, seq_len, kv_heads, head_dim] cache, doubling the cache traffic).

Sharding and name scopes: every activation is marked with logical axes through
``models.sharding.constrain`` (the identity outside a sharding plan) -- hidden states
(``batch``, ``length``, ``embed``), q (``batch``, ``length``, ``heads``, ``kv``), k/v
(``batch``, ``length``, ``kv_heads``, ``kv``), attention output (``batch``, ``length``,
``heads``, ``kv``), MLP hidden (``batch``, ``length``, ``mlp``), logits (``batch``,
``length``, ``vocab``), cache (``batch``, ``kv_heads``, ``length``, ``kv``) -- and every
parameter is constrained where it is used to the layout its logical axes take for
activations (``models.sharding.constrain_params``): under ``fsdp`` that is where a
weight is all-gathered (ZeRO-3), under ``tp`` and ``dp`` nothing moves. (The activation
rules map no ``length`` axis, so decode's [B, 1, ...] activations use the same names.)
Each sub-module runs inside a ``jax.named_scope`` (``embed``,
``layers_<i>/{ln1,attn,ln2,mlp}``, ``ln_f``, ``lm_head``; ``layers/...`` under
``scan_layers``), so HLO ``op_name`` metadata carries the module path that ``jaxmove
analyze --by module`` groups by.

Parameters (pure dict from ``nnx.to_pure_dict``) follow the module attribute
names: ``wte/embedding``, ``wpe/embedding``, ``layers/<i>/ln1/{scale,bias}``,
``layers/<i>/attn/{query,key,value}/{kernel,bias}`` (kernel [d_model, heads or
kv_heads, head_dim]), ``layers/<i>/attn/out/{kernel,bias}`` (kernel
[heads, head_dim, d_model]), ``layers/<i>/mlp/{fc,proj}/{kernel,bias}``,
``ln_f/{scale,bias}``.  With ``scan_layers`` the ``<i>`` level is absent and
every layer leaf gains a leading ``layers`` dimension.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmove.capture.workload import Workload
from .sharding import constrain, constrain_params

DTYPES = {
    "bf16": jnp.bfloat16, "bfloat16": jnp.bfloat16,
    "f32": jnp.float32, "float32": jnp.float32,
    "f16": jnp.float16, "float16": jnp.float16,
}


def canonical_dtype(name: str) -> str:
    """Map a dtype spelling (``bf16``, ``bfloat16``, ...) to its numpy name.

    Raises:
      ValueError: the name is not one of ``DTYPES``.
    """
    try:
        return jnp.dtype(DTYPES[name]).name
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}") from None


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """GPT configuration.

    Attributes:
      vocab: vocabulary size V.
      d_model: model width d.
      heads: query heads H; ``head_dim = d_model // heads``.
      kv_heads: key/value heads H_kv (None -> ``heads``); must divide ``heads``.
      d_ff: MLP hidden width (None -> ``4 * d_model``).
      layers: number of blocks L.
      batch: batch size B.
      seq_len: prompt length (prefill) / KV-cache length (decode); also the number
        of rows of the position table.
      dtype: parameter, activation and cache dtype: ``bfloat16`` / ``float32`` /
        ``float16`` (short spellings accepted).
      scan_layers: stack the layer parameters (leading ``layers`` dim) and run the
        blocks with ``jax.lax.scan`` (one HLO ``while`` loop).

    Raises:
      ValueError: on non-positive sizes, ``heads`` not dividing ``d_model`` or
        ``kv_heads`` not dividing ``heads``.
    """

    vocab: int = 256
    d_model: int = 64
    heads: int = 4
    kv_heads: int | None = None
    d_ff: int | None = None
    layers: int = 2
    batch: int = 2
    seq_len: int = 16
    dtype: str = "float32"
    scan_layers: bool = False

    def __post_init__(self):
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        for k in ("vocab", "d_model", "heads", "kv_heads", "d_ff", "layers", "batch", "seq_len"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"GPTConfig.{k} must be a positive int, got {v!r}")
        if self.d_model % self.heads:
            raise ValueError(f"heads={self.heads} must divide d_model={self.d_model}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.dtype)


# ----------------------------------------------------------------------------- modules

# Logical axes of activations (see the module docstring).
HIDDEN = ("batch", "length", "embed")
Q_AXES = ("batch", "length", "heads", "kv")
KV_AXES = ("batch", "length", "kv_heads", "kv")
CACHE_AXES = ("batch", "kv_heads", "length", "kv")
MLP_AXES = ("batch", "length", "mlp")
LOGITS_AXES = ("batch", "length", "vocab")


def _axes(name: str) -> dict[str, tuple]:
    """Logical axes of the parameters of sub-module ``name``, by leaf (``_PARAM_AXES``;
    LayerNorm scale and bias are ``embed``)."""
    if name in ("ln1", "ln2", "ln_f"):
        return {"scale": ("embed",), "bias": ("embed",)}
    return {leaf: ax for (mod, leaf), ax in _PARAM_AXES.items() if mod == name}


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query softmax attention.

    Args:
      q: [B, T, H, D] queries.
      k, v: [B, H_kv, S, D] keys / values; H_kv divides H (query head h uses
        kv head h // (H // H_kv)).
      mask: bool, broadcastable to [T, S]; True where a query may attend a key.

    Returns:
      [B, T, H, D] in q's dtype.  Scores and softmax are computed in float32.
    """
    b, t, h, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(b, t, hkv, h // hkv, d)
    scores = jnp.einsum("btkgd,bksd->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = scores * (d ** -0.5)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", probs, v)
    return out.reshape(b, t, h, d)


class Attention(nnx.Module):
    """Causal self-attention with separate q/k/v projections (MHA/GQA/MQA)."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        dt = cfg.jnp_dtype
        lin = dict(dtype=dt, param_dtype=dt, rngs=rngs)
        d, h, hkv, hd = cfg.d_model, cfg.heads, cfg.kv_heads, cfg.head_dim
        self.query = nnx.LinearGeneral(d, (h, hd), **lin)
        self.key = nnx.LinearGeneral(d, (hkv, hd), **lin)
        self.value = nnx.LinearGeneral(d, (hkv, hd), **lin)
        self.out = nnx.LinearGeneral((h, hd), d, axis=(-2, -1), **lin)

    def _qkv(self, x):
        """x [B, T, d] -> q [B, T, H, D], k and v [B, H_kv, T, D] (cache layout)."""
        q = constrain(constrain_params(self.query, _axes("query"))(x), Q_AXES)
        k = constrain(constrain_params(self.key, _axes("key"))(x), KV_AXES)
        v = constrain(constrain_params(self.value, _axes("value"))(x), KV_AXES)
        return (q, constrain(k.transpose(0, 2, 1, 3), CACHE_AXES),
                constrain(v.transpose(0, 2, 1, 3), CACHE_AXES))

    def _out(self, q, k, v, mask):
        """Attention of q over k, v, then the output projection: [B, T, d]."""
        o = constrain(attend(q, k, v, mask), Q_AXES)
        return constrain(constrain_params(self.out, _axes("out"))(o), HIDDEN)

    def prefill(self, x: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """x [B, T, d] -> (y [B, T, d], (k, v) each [B, H_kv, T, D])."""
        q, k, v = self._qkv(x)
        t = x.shape[1]
        mask = jnp.tril(jnp.ones((t, t), bool))
        return self._out(q, k, v, mask), (k, v)

    def decode(self, x, k_cache, v_cache, pos):
        """One step.

        Args:
          x: [B, 1, d] the new token's hidden state.
          k_cache, v_cache: [B, H_kv, S, D].
          pos: int32 scalar, 0 <= pos < S: where the new k/v are written.

        Returns:
          (y [B, 1, d], (k_cache, v_cache)) with row ``pos`` replaced
          (``jax.lax.dynamic_update_slice``); keys at positions > pos are masked.
        """
        q, k, v = self._qkv(x)                   # k, v [B, H_kv, 1, D]
        zero = jnp.zeros((), jnp.int32)
        start = (zero, zero, pos.astype(jnp.int32), zero)
        k_cache = constrain(jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), start),
                            CACHE_AXES)
        v_cache = constrain(jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), start),
                            CACHE_AXES)
        mask = (jnp.arange(k_cache.shape[2]) <= pos)[None, :]
        return self._out(q, k_cache, v_cache, mask), (k_cache, v_cache)


class MLP(nnx.Module):
    """d -> d_ff (gelu, tanh approximation as GPT-2) -> d."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        dt = cfg.jnp_dtype
        self.fc = nnx.Linear(cfg.d_model, cfg.d_ff, dtype=dt, param_dtype=dt, rngs=rngs)
        self.proj = nnx.Linear(cfg.d_ff, cfg.d_model, dtype=dt, param_dtype=dt, rngs=rngs)

    def __call__(self, x):
        h = constrain_params(self.fc, _axes("fc"))(x)
        h = constrain(jax.nn.gelu(h, approximate=True), MLP_AXES)
        return constrain(constrain_params(self.proj, _axes("proj"))(h), HIDDEN)


class Block(nnx.Module):
    """Pre-LN transformer block (LayerNorm epsilon 1e-5 as GPT-2)."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        dt = cfg.jnp_dtype
        ln = dict(epsilon=1e-5, dtype=dt, param_dtype=dt, rngs=rngs)
        self.ln1 = nnx.LayerNorm(cfg.d_model, **ln)
        self.attn = Attention(cfg, rngs=rngs)
        self.ln2 = nnx.LayerNorm(cfg.d_model, **ln)
        self.mlp = MLP(cfg, rngs=rngs)

    def _ln(self, name, x):
        with jax.named_scope(name):
            return constrain(constrain_params(getattr(self, name), _axes(name))(x), HIDDEN)

    def _mlp(self, x):
        h = self._ln("ln2", x)
        with jax.named_scope("mlp"):
            return constrain(x + self.mlp(h), HIDDEN)

    def prefill(self, x):
        h = self._ln("ln1", x)
        with jax.named_scope("attn"):
            a, kv = self.attn.prefill(h)
            x = constrain(x + a, HIDDEN)
        return self._mlp(x), kv

    def decode(self, x, k_cache, v_cache, pos):
        h = self._ln("ln1", x)
        with jax.named_scope("attn"):
            a, kv = self.attn.decode(h, k_cache, v_cache, pos)
            x = constrain(x + a, HIDDEN)
        return self._mlp(x), kv


class GPT(nnx.Module):
    """GPT-2-style decoder; see the module docstring for names and layouts."""

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = cfg.jnp_dtype
        self.wte = nnx.Embed(cfg.vocab, cfg.d_model, dtype=dt, param_dtype=dt, rngs=rngs)
        self.wpe = nnx.Embed(cfg.seq_len, cfg.d_model, dtype=dt, param_dtype=dt, rngs=rngs)
        if cfg.scan_layers:
            @nnx.split_rngs(splits=cfg.layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def make(rngs):
                return Block(cfg, rngs=rngs)

            self.layers = make(rngs)
        else:
            self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.layers)])
        self.ln_f = nnx.LayerNorm(cfg.d_model, epsilon=1e-5, dtype=dt, param_dtype=dt, rngs=rngs)

    def _embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """tokens int32 [B, T], positions int32 [T] -> hidden states [B, T, d]."""
        with jax.named_scope("embed"):
            # the table is read directly (as nnx.Embed does) rather than through
            # constrain_params, so the LM head's use of the tied table starts again from
            # the stored (under fsdp: sharded) value and gathers it there once more
            table = constrain(self.wte.embedding[...], _PARAM_AXES[("wte", "embedding")])
            x = (jnp.take(table, tokens, axis=0)
                 + constrain_params(self.wpe, _axes("wpe"))(positions)[None])
            return constrain(x, HIDDEN)

    def _logits(self, x):
        with jax.named_scope("ln_f"):
            h = constrain(constrain_params(self.ln_f, _axes("ln_f"))(x), HIDDEN)
        with jax.named_scope("lm_head"):   # tied to wte: logits = h @ wte.T
            return constrain(constrain_params(self.wte, _axes("wte")).attend(h), LOGITS_AXES)

    def prefill(self, tokens: jax.Array) -> tuple[jax.Array, dict]:
        """tokens int32 [B, T] (T <= seq_len) -> (logits [B, T, V], cache).

        The cache has the layout of the module docstring with length T.
        """
        t = tokens.shape[1]
        x = self._embed(tokens, jnp.arange(t))
        if self.cfg.scan_layers:
            graphdef, state = nnx.split(self.layers)

            def body(x, layer_state):
                x, kv = nnx.merge(graphdef, layer_state).prefill(x)
                return x, kv

            with jax.named_scope("layers"):
                x, (k, v) = jax.lax.scan(body, x, state)
            cache = {"k_cache": k, "v_cache": v}
        else:
            entries = []
            for i, block in enumerate(self.layers):
                with jax.named_scope(f"layers_{i}"):
                    x, (k, v) = block.prefill(x)
                entries.append({"k_cache": k, "v_cache": v})
            cache = {"layers": entries}
        return self._logits(x), cache

    def decode(self, cache: dict, tokens: jax.Array, pos: jax.Array) -> tuple[jax.Array, dict]:
        """One decode step.

        Args:
          cache: KV cache (module docstring layout), length S = seq_len.
          tokens: int32 [B, 1], the new token ids.
          pos: int32 scalar, its position (0 <= pos < S).

        Returns:
          (logits [B, 1, V], cache with position ``pos`` written in every layer).
        """
        x = self._embed(tokens, jnp.reshape(pos, (1,)))
        if self.cfg.scan_layers:
            graphdef, state = nnx.split(self.layers)

            def body(x, xs):
                layer_state, kc, vc = xs
                x, kv = nnx.merge(graphdef, layer_state).decode(x, kc, vc, pos)
                return x, kv

            with jax.named_scope("layers"):
                x, (k, v) = jax.lax.scan(body, x, (state, cache["k_cache"], cache["v_cache"]))
            new_cache = {"k_cache": k, "v_cache": v}
        else:
            entries = []
            for i, (block, c) in enumerate(zip(self.layers, cache["layers"])):
                with jax.named_scope(f"layers_{i}"):
                    x, (k, v) = block.decode(x, c["k_cache"], c["v_cache"], pos)
                entries.append({"k_cache": k, "v_cache": v})
            new_cache = {"layers": entries}
        return self._logits(x), new_cache


# ----------------------------------------------------------------------------- workloads


def abstract_params(cfg: GPTConfig) -> tuple[nnx.GraphDef, dict]:
    """(graphdef, pure-dict params of ``jax.ShapeDtypeStruct``); nothing is allocated."""
    model = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    return graphdef, nnx.to_pure_dict(state)


def abstract_cache(cfg: GPTConfig) -> dict:
    """The decode KV cache as ``jax.ShapeDtypeStruct`` leaves (module docstring layout)."""
    shape = (cfg.batch, cfg.kv_heads, cfg.seq_len, cfg.head_dim)
    if cfg.scan_layers:
        leaf = jax.ShapeDtypeStruct((cfg.layers, *shape), cfg.jnp_dtype)
        return {"k_cache": leaf, "v_cache": leaf}
    leaf = jax.ShapeDtypeStruct(shape, cfg.jnp_dtype)
    return {"layers": [{"k_cache": leaf, "v_cache": leaf} for _ in range(cfg.layers)]}


# Logical axes of each parameter, by the last two path components (module, leaf).
_PARAM_AXES = {
    ("wte", "embedding"): ("vocab", "embed"),
    ("wpe", "embedding"): ("length", "embed"),
    ("query", "kernel"): ("embed", "heads", "kv"),
    ("query", "bias"): ("heads", "kv"),
    ("key", "kernel"): ("embed", "kv_heads", "kv"),
    ("key", "bias"): ("kv_heads", "kv"),
    ("value", "kernel"): ("embed", "kv_heads", "kv"),
    ("value", "bias"): ("kv_heads", "kv"),
    ("out", "kernel"): ("heads", "kv", "embed"),
    ("out", "bias"): ("embed",),
    ("fc", "kernel"): ("embed", "mlp"),
    ("fc", "bias"): ("mlp",),
    ("proj", "kernel"): ("mlp", "embed"),
    ("proj", "bias"): ("embed",),
}


def _key_name(k) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def param_logical_axes(params: dict, scan_layers: bool) -> Any:
    """A pytree like ``params`` of logical axis-name tuples (None where unknown).

    Names: ``vocab``, ``embed``, ``length`` (positions), ``heads``, ``kv_heads``,
    ``kv`` (head_dim), ``mlp`` (d_ff), ``layers`` (stacked layer dim).
    """

    def axes(path, leaf):
        names = [_key_name(k) for k in path]
        key = tuple(names[-2:])
        if key in _PARAM_AXES:
            ax = _PARAM_AXES[key]
        elif names[-1] in ("scale", "bias"):  # LayerNorm
            ax = ("embed",)
        else:
            ax = (None,) * (len(leaf.shape) - (1 if scan_layers and names[0] == "layers" else 0))
        if scan_layers and names[0] == "layers":
            ax = ("layers", *ax)
        assert len(ax) == len(leaf.shape), (names, ax, leaf.shape)
        return ax

    return jax.tree_util.tree_map_with_path(axes, params)


def cache_logical_axes(cache: dict, scan_layers: bool) -> Any:
    ax = ("batch", "kv_heads", "length", "kv")
    if scan_layers:
        ax = ("layers", *ax)
    return jax.tree.map(lambda _: ax, cache)


def prefill_workload(cfg: GPTConfig, name: str) -> Workload:
    """``fn(params, tokens) -> (logits [B, S, V], cache)`` with tokens int32 [B, S]."""
    graphdef, params = abstract_params(cfg)

    def prefill(params, tokens):
        return nnx.merge(graphdef, params).prefill(tokens)

    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq_len), jnp.int32)
    return Workload(
        name=name,
        fn=prefill,
        args=(params, tokens),
        roles=(jax.tree.map(lambda _: "weights", params), "activations"),
        config={**dataclasses.asdict(cfg), "model": "gpt", "mode": "prefill"},
        logical_axes=(param_logical_axes(params, cfg.scan_layers), ("batch", "length")),
        out_logical_axes=(("batch", "length", "vocab"),
                          cache_logical_axes(abstract_cache(cfg), cfg.scan_layers)),
        out_roles=("activations", "kv_cache"),  # (the cache it writes is the KV cache)
    )


def decode_workload(cfg: GPTConfig, name: str) -> Workload:
    """``fn(params, cache, tokens, pos) -> (logits [B, 1, V], cache)``; cache donated.

    tokens int32 [B, 1]; pos int32 scalar in [0, seq_len).
    """
    graphdef, params = abstract_params(cfg)

    def decode(params, cache, tokens, pos):
        return nnx.merge(graphdef, params).decode(cache, tokens, pos)

    cache = abstract_cache(cfg)
    tokens = jax.ShapeDtypeStruct((cfg.batch, 1), jnp.int32)
    pos = jax.ShapeDtypeStruct((), jnp.int32)
    return Workload(
        name=name,
        fn=decode,
        args=(params, cache, tokens, pos),
        roles=(
            jax.tree.map(lambda _: "weights", params),
            jax.tree.map(lambda _: "kv_cache", cache),
            "activations",
            "activations",
        ),
        donate_argnums=(1,),
        config={**dataclasses.asdict(cfg), "model": "gpt", "mode": "decode"},
        logical_axes=(
            param_logical_axes(params, cfg.scan_layers),
            cache_logical_axes(cache, cfg.scan_layers),
            ("batch", None),
            (),
        ),
        out_logical_axes=(("batch", None, "vocab"), cache_logical_axes(cache, cfg.scan_layers)),
        out_roles=("activations", "kv_cache"),
    )
