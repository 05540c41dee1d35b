"""Logical sharding constraints inside zoo models.

A model marks an intermediate with logical axis names (``constrain(x, ("expert",
"batch", None, "embed"))``). Outside a plan this is the identity; while
``jaxmove.plans`` traces a workload under a plan it installs a resolver that turns the
names into a ``jax.sharding.Sharding`` for ``jax.lax.with_sharding_constraint`` (the
idea of Flax's ``logical_axis_rules`` / MaxText's logical-to-mesh rules).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import jax

try:  # source lines in HLO metadata name the model line that called ``constrain``, not this file
    from jax._src import source_info_util as _source_info_util
    _source_info_util.register_exclusion(__file__)
except (ImportError, AttributeError):  # a jax without the (private) hook: lines name this file
    pass

# resolver(logical_axes, shape) -> Sharding | None
_RESOLVER: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("jaxmove_resolver",
                                                                           default=None)


@contextlib.contextmanager
def logical_sharding(resolver: Callable):
    """Within the block, ``constrain`` asks ``resolver(logical_axes, shape)`` for a sharding."""
    token = _RESOLVER.set(resolver)
    try:
        yield
    finally:
        _RESOLVER.reset(token)


def constrain(x: jax.Array, logical_axes: tuple) -> jax.Array:
    """``x`` constrained to the sharding its logical axes map to (identity outside a plan).

    Raises:
      ValueError: ``logical_axes`` does not have one entry per dimension of ``x``.
    """
    if len(logical_axes) != x.ndim:
        raise ValueError(f"constrain: {len(logical_axes)} logical axes {logical_axes} for an "
                         f"array of rank {x.ndim}")
    resolver = _RESOLVER.get()
    if resolver is None:
        return x
    sharding = resolver(tuple(logical_axes), tuple(x.shape))
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def constrain_params(layer, axes: dict[str, tuple]):
    """``layer`` (a Flax NNX module) with its parameters constrained where they are used.

    Each ``layer.<leaf>`` named in ``axes`` (``{"kernel": ("embed", "mlp"), ...}``) is
    replaced, in place, by ``constrain(value, axes[leaf])``: the layout its logical axes
    take under the plan's *activation* rules. Under ``fsdp`` a weight stored sharded over
    its ``embed`` dim is all-gathered here, once per use (ZeRO stage 3: Rajbhandari et al.
    2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"); under
    ``fsdp_tp`` it is gathered over ``data`` and stays split over ``model``; under ``dp``
    and ``tp`` storage and use agree and nothing moves. Outside a plan nothing changes.

    The module must be one built inside the traced function (``nnx.merge``), so the
    replaced values never outlive the trace. Returns ``layer``.
    Raises:
      ValueError: a leaf's logical axes do not match its rank.
    """
    if _RESOLVER.get() is None:
        return layer
    for leaf, leaf_axes in axes.items():
        var = getattr(layer, leaf, None)
        if var is not None:
            var.set_value(constrain(var[...], leaf_axes))
    return layer


def logical_sharding_of(logical_axes: tuple, shape: tuple):
    """The sharding the active plan gives an array of ``shape`` with ``logical_axes`` (None
    outside a plan, or where the plan leaves it unconstrained)."""
    resolver = _RESOLVER.get()
    return None if resolver is None else resolver(tuple(logical_axes), tuple(shape))


def is_sharded(logical_axes: tuple, shape: tuple) -> bool:
    """Whether the active plan splits an array of ``shape`` with ``logical_axes`` over more
    than one device (False outside a plan)."""
    s = logical_sharding_of(logical_axes, shape)
    return s is not None and not s.is_fully_replicated
