"""A plain MLP in Flax NNX: ``layers`` x (Linear d->d_ff, gelu, Linear d_ff->d).

Parameters (pure dict): ``layers/<i>/up/{kernel [d_model, d_ff], bias [d_ff]}``,
``layers/<i>/down/{kernel [d_ff, d_model], bias [d_model]}``.
Parameter count: ``layers * (2 * d_model * d_ff + d_ff + d_model)``.

Each block runs in ``jax.named_scope`` ``layers_<i>``, its projections in ``up`` and
``down``, so HLO ``op_name`` metadata carries the module path (``layers_0/up``).
"""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from jaxmove.capture.workload import Workload
from .gpt import canonical_dtype
from .sharding import constrain


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """Attributes: batch B, d_model d, d_ff, layers L, dtype (params and activations).

    Raises:
      ValueError: a size is not a positive int, or the dtype is unknown.
    """

    batch: int = 4
    d_model: int = 32
    d_ff: int = 128
    layers: int = 2
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        for k in ("batch", "d_model", "d_ff", "layers"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"MLPConfig.{k} must be a positive int, got {v!r}")


class MLPBlock(nnx.Module):
    def __init__(self, cfg: MLPConfig, *, rngs: nnx.Rngs):
        dt = cfg.dtype
        self.up = nnx.Linear(cfg.d_model, cfg.d_ff, dtype=dt, param_dtype=dt, rngs=rngs)
        self.down = nnx.Linear(cfg.d_ff, cfg.d_model, dtype=dt, param_dtype=dt, rngs=rngs)

    def __call__(self, x):
        # Logical constraints (identity outside a sharding plan, see models/sharding.py):
        # the hidden activation is [batch, mlp], the block output [batch, embed].
        with jax.named_scope("up"):
            h = constrain(jax.nn.gelu(self.up(x)), ("batch", "mlp"))
        with jax.named_scope("down"):
            return constrain(self.down(h), ("batch", "embed"))


class MLP(nnx.Module):
    """x [B, d_model] -> [B, d_model]."""

    def __init__(self, cfg: MLPConfig, *, rngs: nnx.Rngs):
        self.layers = nnx.List([MLPBlock(cfg, rngs=rngs) for _ in range(cfg.layers)])

    def __call__(self, x):
        for i, layer in enumerate(self.layers):
            with jax.named_scope(f"layers_{i}"):
                x = layer(x)
        return x


_AXES = {("up", "kernel"): ("embed", "mlp"), ("up", "bias"): ("mlp",),
         ("down", "kernel"): ("mlp", "embed"), ("down", "bias"): ("embed",)}


def forward_workload(cfg: MLPConfig, name: str) -> Workload:
    """``fn(params, x) -> y`` with x, y [batch, d_model] in ``cfg.dtype``."""
    model = nnx.eval_shape(lambda: MLP(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)

    def forward(params, x):
        return nnx.merge(graphdef, params)(x)

    x = jax.ShapeDtypeStruct((cfg.batch, cfg.d_model), cfg.dtype)
    axes = jax.tree_util.tree_map_with_path(
        lambda p, _: _AXES[(str(p[-2].key), str(p[-1].key))], params)
    return Workload(
        name=name,
        fn=forward,
        args=(params, x),
        roles=(jax.tree.map(lambda _: "weights", params), "activations"),
        config={**dataclasses.asdict(cfg), "model": "mlp", "mode": "forward"},
        logical_axes=(axes, ("batch", "embed")),
        out_logical_axes=("batch", "embed"),
    )
