"""The vocabulary every pass and report shares: tensor roles, data paths, roles from names.

Roles and paths are defined in ../shared/DESIGN.md ("The four data paths"); the JSON contract
(README "JSON contract") keys its ``by_role`` and ``by_path`` tables by these strings.
"""

from __future__ import annotations

import re

ROLES = ("weights", "kv_cache", "optimizer_state", "activations", "unknown")
PATHS = ("host_to_device", "hbm_to_onchip", "onchip_to_hbm", "device_to_device", "device_to_host")

# Names -> roles (HLO dumps carry no Python objects).

_KV_TOKENS = {"cache", "cached_key", "cached_value", "k_cache", "v_cache", "kv_cache"}
_WEIGHT_TOKENS = {"params", "param", "kernel", "weight", "weights", "embedding", "bias", "scale"}
# optax / nnx.Optimizer state: ``opt_state[0]['mu']['w1'].value``
_OPT_TOKENS = {"opt_state", "optimizer_state"}
# Flax NNX variables that are not parameters: RNG streams (``rngs['default']['count'].value``)
_NNX_NOT_PARAM = {"rngs", "rng", "rng_state", "key", "count", "step"}


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
    3. a component ``opt_state`` or ``optimizer_state`` (optax's state, ``nnx.Optimizer``'s
       ``opt_state[0]['mu']['w1'].value``) -> ``optimizer_state``; before rule 2, whose
       ``kernel`` the moments' paths repeat;
    4. a component equal to ``kv`` -> ``kv_cache`` (after rule 2, so a fused ``kv``
       projection kernel stays a weight);
    5. a Flax NNX variable of a model's state (``state['w1'].value``: the last component is
       ``value``, the NNX ``Variable`` attribute jax prints in the path, and an earlier one is
       ``state`` or ``model``) -> ``weights``, unless a component names an RNG stream or a
       counter (``rngs``, ``key``, ``count``, ``step``);
    6. otherwise ``unknown`` (never a guess).
    """
    comps = _name_components(path_or_name)
    if any(_names(c, _KV_TOKENS) for c in comps):
        return "kv_cache"
    if any(c.strip("_") in _OPT_TOKENS for c in comps):
        return "optimizer_state"
    if any(_names(c, _WEIGHT_TOKENS) for c in comps):
        return "weights"
    if "kv" in comps:
        return "kv_cache"
    core = comps
    while core and core[-1].isdigit():  # the HLO name's ``.1`` suffix
        core = core[:-1]
    if (len(core) >= 2 and core[-1] == "value" and any(c in ("state", "model") for c in core[:-1])
            and not any(c in _NNX_NOT_PARAM for c in core)):
        return "weights"
    return "unknown"


def roles_from_globs(names: dict[int, tuple[str, ...]], globs: dict[str, str] | list[tuple[str, str]],
                     where: str = "--role") -> dict[int, str]:
    """Roles a user gives parameters by name: ``{"state*w1*": "weights"}`` (``--role GLOB=ROLE``).

    Args:
      names: parameter number -> the names it answers to (its pytree path / ``op_name``, its
        HLO name); a glob matches when it matches any of them (``fnmatch.fnmatchcase``).
      globs: GLOB -> ROLE, in order: the first glob that matches a parameter gives its role.
      where: what to name in errors.
    Returns:
      parameter number -> role, for the parameters some glob matched.
    Raises:
      JaxmoveInputError (a ValueError): a role not in ``ROLES``, or a glob that matches no parameter (a typo would
        otherwise leave the roles silently as they were); the message lists some names.
    """
    from fnmatch import fnmatchcase

    from .errors import JaxmoveInputError as ValueError  # noqa: A001 - a ValueError the CLI reports as input

    items = list(globs.items()) if isinstance(globs, dict) else list(globs)
    out: dict[int, str] = {}
    for glob, role in items:
        if role not in ROLES:
            raise ValueError(f"{where} {glob}={role}: unknown role '{role}' (expected one of {', '.join(ROLES)})")
        hit = [n for n, ns in names.items() if any(fnmatchcase(x, glob) for x in ns)]
        if not hit:
            shown = [ns[0] for ns in list(names.values())[:6]]
            more = f" and {len(names) - 6} more" if len(names) > 6 else ""
            raise ValueError(f"{where} {glob}={role}: the glob matches no parameter (parameters: "
                             f"{', '.join(repr(x) for x in shown)}{more})")
        for n in hit:
            out.setdefault(n, role)
    return out


def unlabeled_role(path: str) -> str:
    """The role of an argument leaf the caller gave no role (``roles=None``): what its path
    names (``role_from_name``) when that is ``weights`` or ``kv_cache``, else
    ``activations`` (a program input). The one rule for captured programs and HLO dumps:
    ``cache/k`` updated in place is ``kv_cache`` whether the program came from a Workload or
    from its ``--xla_dump_to`` dump (which has only the names); a leaf no name rule covers is
    ``activations`` when captured (it is an input) and ``unknown`` in a dump."""
    role = role_from_name(path)
    return role if role in ("weights", "kv_cache") else "activations"
