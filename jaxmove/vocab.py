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


def unlabeled_role(path: str) -> str:
    """The role of an argument leaf the caller gave no role (``roles=None``): what its path
    names (``role_from_name``) when that is ``weights`` or ``kv_cache``, else
    ``activations`` (a program input). The one rule for captured programs and HLO dumps:
    ``cache/k`` updated in place is ``kv_cache`` whether the program came from a Workload or
    from its ``--xla_dump_to`` dump (which has only the names); a leaf no name rule covers is
    ``activations`` when captured (it is an input) and ``unknown`` in a dump."""
    role = role_from_name(path)
    return role if role in ("weights", "kv_cache") else "activations"
