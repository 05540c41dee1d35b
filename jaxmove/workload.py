"""Workload: what the model zoo (and user code) hands to capture.

A workload is a function plus its arguments (arrays or ``jax.ShapeDtypeStruct``),
with a tensor role for every argument leaf, so that capture can label each entry
parameter of the compiled program as ``weights``, ``kv_cache`` or ``activations``.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from typing import Any, Callable

ROLES = ("weights", "kv_cache", "activations", "unknown")

# Names -> roles (HLO dumps carry no Python objects).

_KV_TOKENS = {"cache", "cached_key", "cached_value", "k_cache", "v_cache", "kv_cache"}
_WEIGHT_TOKENS = {"params", "param", "kernel", "weight", "weights", "embedding", "bias", "scale"}


def _name_components(name: str) -> list[str]:
    """Split a path / HLO name into lower-case components.

    Separators are any character outside ``[A-Za-z0-9_]`` and runs of two or more ``_``
    (jax mangles ``params['layers'][0]['kernel']`` into ``params__layers___0___kernel``).
    """
    return [c for c in re.split(r"[^0-9a-z_]+|__+", name.lower()) if c.strip("_")]


def _names(comp: str, tokens: set[str]) -> bool:
    """``comp`` is one of ``tokens`` or ends with ``_<token>`` (``k_cache``, ``q_kernel``)."""
    comp = comp.strip("_")
    return comp in tokens or any(comp.endswith("_" + t) for t in tokens)


def role_from_name(path_or_name: str) -> str:
    """Tensor role from a name alone (for HLO dumps without Python objects).

    Rules, on the name's components (``_name_components``), in order:

    1. a component that is, or ends with ``_`` and, one of ``cache, cached_key,
       cached_value, k_cache, v_cache, kv_cache`` (so ``k_cache``, ``layer_cache``) ->
       ``kv_cache``; ``cache_position`` is not a cache;
    2. a component that is, or ends with ``_`` and, one of ``params, param, kernel,
       weight, weights, embedding, bias, scale`` -> ``weights`` (``scale_factor`` is not);
    3. a component equal to ``kv`` -> ``kv_cache`` (after rule 2, so a fused ``kv``
       projection kernel stays a weight);
    4. otherwise ``unknown`` (never a guess).
    """
    comps = _name_components(path_or_name)
    if any(_names(c, _KV_TOKENS) for c in comps):
        return "kv_cache"
    if any(_names(c, _WEIGHT_TOKENS) for c in comps):
        return "weights"
    if "kv" in comps:
        return "kv_cache"
    return "unknown"




@dataclass(frozen=True)
class Workload:
    """A jittable function and its (possibly abstract) arguments.

    Attributes:
      name: e.g. ``gpt2-small-decode``.
      fn: ``fn(*args)``; it is wrapped in ``jax.jit`` by capture.
      args: positional arguments: pytrees of arrays or ``jax.ShapeDtypeStruct``.
      roles: a pytree with the same structure as ``args`` whose leaves are role
        strings from ``ROLES`` (or a callable ``(path_str, leaf) -> role``).
      donate_argnums: positional arguments whose buffers are donated.
      static_argnums: positional arguments that are static (hashable, not traced).
      config: the model configuration it was built from (for reports).
      logical_axes: optional pytree like ``args`` of logical axis-name tuples.
      out_logical_axes: optional pytree like ``fn``'s output of logical axis-name tuples
        (used by sharding plans for ``out_shardings``).
    """

    name: str
    fn: Callable[..., Any]
    args: tuple
    roles: Any
    donate_argnums: tuple[int, ...] = ()
    static_argnums: tuple[int, ...] = ()
    config: dict = field(default_factory=dict)
    logical_axes: Any = None
    out_logical_axes: Any = None
