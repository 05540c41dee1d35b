"""Workload: what the model zoo (and user code) hands to capture.

A workload is a function plus its arguments (arrays or ``jax.ShapeDtypeStruct``),
with a tensor role for every argument leaf, so that capture can label each entry
parameter of the compiled program as ``weights``, ``kv_cache`` or ``activations``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..vocab import ROLES, role_from_name  # noqa: F401  (re-exported)


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
      out_roles: optional pytree like ``fn``'s output of role strings (or one string for all).
        Sharding plans lay an output with role ``weights`` or ``optimizer_state`` out by the
        plan's parameter rules, like the argument it replaces (a training step's new
        parameters and optimizer state), so XLA can write it into the donated buffer; other
        outputs (and every output when None) follow the activation rules.
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
    out_roles: Any = None
