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
