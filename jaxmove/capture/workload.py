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
      logical_axes: optional pytree like ``args`` of logical axis-name tuples (the
        ``jaxmove.zoo.sharding`` vocabulary: ``batch``, ``embed``, ``mlp``...). Where it is None
        (or an argument's entry is), sharding plans read them from Flax NNX variable metadata
        of an ``nnx.State`` / abstract module argument (``with_module_axes``).
      out_logical_axes: optional pytree like ``fn``'s output of logical axis-name tuples
        (used by sharding plans for ``out_shardings``).
      out_roles: optional pytree like ``fn``'s output of role strings (or one string for all).
        Sharding plans lay an output with role ``weights`` or ``optimizer_state`` out by the
        plan's parameter rules, like the argument it replaces (a training step's new
        parameters and optimizer state), so XLA can write it into the donated buffer; other
        outputs (and every output when None) follow the activation rules. Capture also
        records them (``Program.output_roles``): the roles pass gives the values an output
        is made of its role (a prefill's new KV cache is ``kv_cache``, not ``activations``).
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


def flatten_out_roles(out_roles, treedef, n: int, name: str = "workload") -> list:
    """One role (or None) per output leaf from a Workload's ``out_roles`` (None, one string for
    all, or a pytree prefix of the output: its containers those of the output, each leaf a role
    string or None covering that subtree), in jax's flattening order (the order of the compiled
    program's outputs).

    Raises:
      JaxmoveInputError (a ValueError): ``out_roles`` is not a prefix of the output's structure
        (``treedef``, ``n`` leaves; a tuple given for a dict output is one), or a role is not
        one of ``ROLES``.
    """
    import jax

    from ..errors import JaxmoveInputError

    is_role = lambda x: x is None or isinstance(x, str)  # noqa: E731
    if is_role(out_roles):
        flat = [out_roles] * n
    else:
        full = jax.tree_util.tree_unflatten(treedef, list(range(n)))
        flat = [None] * n
        try:
            pairs = jax.tree_util.tree_leaves(
                jax.tree_util.tree_map(lambda r, sub: [(k, r) for k in jax.tree_util.tree_leaves(sub)],
                                       out_roles, full, is_leaf=is_role),
                is_leaf=lambda x: isinstance(x, list))
        except (ValueError, TypeError, KeyError) as e:
            given = jax.tree_util.tree_structure(out_roles, is_leaf=is_role)
            raise JaxmoveInputError(
                f"{name}: out_roles {given} is not a prefix of the structure of its output "
                f"({treedef}): give one role (or None) per output leaf, or per subtree, in the "
                f"output's own containers ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
            ) from None
        for group in pairs:
            for k, r in group:
                flat[k] = r
    for r in flat:
        if r is not None and (not isinstance(r, str) or r not in ROLES):
            raise JaxmoveInputError(f"{name}: out_roles has {r!r}; expected one of "
                                    f"{', '.join(ROLES)} (or None)")
    return flat

# ---- logical axes from Flax NNX variable metadata ----------------------------------------

def _is_variable(x) -> bool:
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover - flax is a dependency
        return False
    return isinstance(x, nnx.Variable)


def _variable_axes(var) -> tuple | None:
    """The logical axes a Flax NNX variable carries: its ``out_sharding`` metadata (flax 0.12;
    ``nnx.with_partitioning(init, axes)`` and ``nnx.Param(..., sharding=axes)`` set it, the
    older ``sharding`` / ``sharding_names`` keys are read too), as a tuple of names or None
    per dimension; None when it has none. A ``PartitionSpec`` entry naming several axes for one
    dimension keeps the tuple (plans then match no rule for that dimension)."""
    try:
        meta = var.get_metadata()
    except Exception:  # noqa: BLE001 - an older Variable API
        meta = getattr(var, "metadata", {}) or {}
    for key in ("out_sharding", "sharding_names", "sharding"):
        axes = meta.get(key) if isinstance(meta, dict) else None
        if axes is not None:
            return tuple(axes)
    return None


def module_logical_axes(tree) -> Any:
    """Logical axes of every leaf of ``tree`` (an ``nnx.State``, an abstract ``nnx.Module``
    or any pytree holding NNX variables) read from the variables' sharding metadata.

    Returns a pytree with ``tree``'s structure (``jax.tree_util.tree_structure(tree)``, the
    variables' own nodes included) whose leaves are axis-name tuples, or None for leaves
    without metadata; None when no variable in ``tree`` carries any (a pure dict made by
    ``nnx.to_pure_dict`` has lost it: declare ``logical_axes`` then).
    """
    import jax

    items = jax.tree_util.tree_leaves(tree, is_leaf=_is_variable)
    axes: list = []
    found = False
    for item in items:
        n = len(jax.tree_util.tree_leaves(item)) if _is_variable(item) else 1
        ax = _variable_axes(item) if _is_variable(item) else None
        found = found or ax is not None
        axes.extend([ax if n == 1 else None] * n)
    if not found:
        return None
    return jax.tree_util.tree_structure(tree).unflatten(axes)


def with_module_axes(workload: "Workload") -> "Workload":
    """``workload`` with the logical axes of its NNX arguments read from their variables'
    metadata (``module_logical_axes``) where it declares none: when ``logical_axes`` is None,
    for every argument; when an argument's entry is None, for that argument. Unchanged when
    nothing carries metadata."""
    import dataclasses

    declared = workload.logical_axes
    if declared is not None and not isinstance(declared, (tuple, list)):
        return workload
    per_arg = list(declared) if declared is not None else [None] * len(workload.args)
    if len(per_arg) != len(workload.args):
        return workload
    filled = False
    for i, arg in enumerate(workload.args):
        if per_arg[i] is None:
            ax = module_logical_axes(arg)
            if ax is not None:
                per_arg[i], filled = ax, True
    return dataclasses.replace(workload, logical_axes=tuple(per_arg)) if filled else workload
