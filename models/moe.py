"""A mixture-of-experts feed-forward stack in Flax NNX: top-k routed experts.

Each of ``layers`` blocks is ``x + MoE(x)`` on x [B, S, d]. Routing follows GShard
(Lepikhin et al. 2020, "GShard: Scaling Giant Models with Conditional Computation and
Automatic Sharding", algorithm 1) with each batch row a group:

  router logits  = x @ router                       [B, S, E]  (router [d, E], f32 softmax)
  gates, expert  = top_k(softmax(logits), k)        [B, S, k]
  position       = order of (token, choice) among those sent to the same expert, per row
  capacity C     = ceil(k * S * capacity_factor / E); choices past C are dropped
  dispatch       = one-hot [B, S, E, C];  combine = dispatch * gate
  dispatched     = einsum(dispatch, x)             [E, B, C, d]   <- the token buffer
  expert outputs = gelu(dispatched @ w_in[e]) @ w_out[e]   (w_in [E, d, f], w_out [E, f, d])
  y              = einsum(combine, expert outputs)  [B, S, d]

The dispatched buffer is constrained to (``expert``, ``batch``, -, ``embed``) and the
expert outputs back to (-, ``batch``, -, ``embed``): under the ``ep`` plan (experts and
batch sharded over the same mesh axis) XLA moves tokens with two all-to-alls per layer.

Name scopes (HLO ``op_name``): ``layers_<i>/router`` (logits, top-k, dispatch and
combine masks), ``layers_<i>/dispatch`` (tokens to the expert buffer),
``layers_<i>/experts`` (the expert FFNs), ``layers_<i>/combine`` (back to tokens).

Parameters (pure dict): ``layers/<i>/router`` [d, E], ``layers/<i>/w_in`` [E, d, f],
``layers/<i>/w_out`` [E, f, d]. Parameter count ``layers * (d*E + 2*E*d*f)``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxmove.capture.workload import Workload
from .gpt import canonical_dtype
from .sharding import constrain


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Attributes: batch B, seq_len S, d_model d, d_ff f (per expert), experts E, top_k k,
    layers L, capacity_factor, dtype (params and activations).

    Raises:
      ValueError: a size is not a positive int, top_k > experts, or the dtype is unknown.
    """

    batch: int = 4
    seq_len: int = 16
    d_model: int = 32
    d_ff: int = 64
    experts: int = 4
    top_k: int = 2
    layers: int = 2
    capacity_factor: float = 1.0
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        for k in ("batch", "seq_len", "d_model", "d_ff", "experts", "top_k", "layers"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"MoEConfig.{k} must be a positive int, got {v!r}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} must not exceed experts={self.experts}")

    @property
    def capacity(self) -> int:
        """Token slots per expert and batch row: ceil(k * S * capacity_factor / E)."""
        return math.ceil(self.top_k * self.seq_len * self.capacity_factor / self.experts)


def _top_k(probs: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Top-k over the last axis by k rounds of argmax (an elementwise-and-reduce form the SPMD
    partitioner keeps local to each batch shard; ``lax.top_k`` is gathered on XLA:CPU)."""
    gates, idx = [], []
    p = probs
    for _ in range(k):
        i = jnp.argmax(p, axis=-1)
        gates.append(jnp.take_along_axis(p, i[..., None], axis=-1)[..., 0])
        idx.append(i)
        p = jnp.where(jax.nn.one_hot(i, p.shape[-1], dtype=bool), -jnp.inf, p)
    return jnp.stack(gates, -1), jnp.stack(idx, -1)


class MoELayer(nnx.Module):
    def __init__(self, cfg: MoEConfig, *, rngs: nnx.Rngs):
        dt = jnp.dtype(cfg.dtype)
        init = nnx.initializers.lecun_normal()
        e, d, f = cfg.experts, cfg.d_model, cfg.d_ff
        self.cfg = cfg
        self.router = nnx.Param(init(rngs.params(), (d, e), dt))
        self.w_in = nnx.Param(init(rngs.params(), (e, d, f), dt))
        self.w_out = nnx.Param(init(rngs.params(), (e, f, d), dt))

    def __call__(self, x):
        cfg = self.cfg
        b, s, _ = x.shape
        e, k, c = cfg.experts, cfg.top_k, cfg.capacity
        with jax.named_scope("router"):
            logits = jnp.einsum("bsd,de->bse", x, self.router[...]).astype(jnp.float32)
            probs = constrain(jax.nn.softmax(logits, axis=-1), ("batch", None, None))
            gates, expert = _top_k(probs, k)                                    # [B, S, k]
            onehot = jax.nn.one_hot(expert, e, dtype=jnp.int32)                 # [B, S, k, E]
            onehot = constrain(onehot, ("batch", None, None, None))
            flat = onehot.reshape(b, s * k, e)
            position = ((jnp.cumsum(flat, axis=1) - 1) * flat).sum(-1).reshape(b, s, k)
            slot = jax.nn.one_hot(position, c, dtype=jnp.float32)              # [B, S, k, C]
            keep = (position < c).astype(jnp.float32)[..., None, None]
            route = onehot.astype(jnp.float32)[..., None] * slot[..., None, :] * keep  # [B,S,k,E,C]
            dispatch = constrain(route.sum(2).astype(x.dtype), ("batch", None, None, None))
            combine = constrain((route * gates[..., None, None]).sum(2).astype(x.dtype),
                                ("batch", None, None, None))                   # [B, S, E, C]
        with jax.named_scope("dispatch"):
            xe = jnp.einsum("bsec,bsd->ebcd", dispatch, x)
            xe = constrain(xe, ("expert", "batch", None, "embed"))
        with jax.named_scope("experts"):
            h = jax.nn.gelu(jnp.einsum("ebcd,edf->ebcf", xe, self.w_in[...]))
            ye = jnp.einsum("ebcf,efd->ebcd", h, self.w_out[...])
            ye = constrain(ye, ("expert", "batch", None, "embed"))
        with jax.named_scope("combine"):
            ye = constrain(ye, (None, "batch", None, "embed"))
            return jnp.einsum("bsec,ebcd->bsd", combine, ye)


class MoE(nnx.Module):
    """x [B, S, d] -> [B, S, d]: ``layers`` residual MoE blocks."""

    def __init__(self, cfg: MoEConfig, *, rngs: nnx.Rngs):
        self.layers = nnx.List([MoELayer(cfg, rngs=rngs) for _ in range(cfg.layers)])

    def __call__(self, x):
        for i, layer in enumerate(self.layers):
            with jax.named_scope(f"layers_{i}"):
                x = x + layer(x)
        return x


_AXES = {"router": ("embed", None), "w_in": ("expert", "embed", "mlp"),
         "w_out": ("expert", "mlp", "embed")}


def forward_workload(cfg: MoEConfig, name: str) -> Workload:
    """``fn(params, x) -> y`` with x, y [batch, seq_len, d_model] in ``cfg.dtype``."""
    model = nnx.eval_shape(lambda: MoE(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)

    def forward(params, x):
        return nnx.merge(graphdef, params)(x)

    x = jax.ShapeDtypeStruct((cfg.batch, cfg.seq_len, cfg.d_model), cfg.dtype)
    axes = jax.tree_util.tree_map_with_path(lambda p, _: _AXES[str(p[-1].key)], params)
    return Workload(
        name=name,
        fn=forward,
        args=(params, x),
        roles=(jax.tree.map(lambda _: "weights", params), "activations"),
        config={**dataclasses.asdict(cfg), "model": "moe", "mode": "forward",
                "capacity": cfg.capacity},
        logical_axes=(axes, ("batch", "length", "embed")),
        out_logical_axes=("batch", "length", "embed"),
    )
