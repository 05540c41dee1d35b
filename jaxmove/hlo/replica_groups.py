"""Replica groups as XLA prints them.

Forms (xla/hlo/ir/collective_device_list.h, ``IotaReplicaGroupList``):
  explicit  ``{{0,1},{2,3}}``;  empty ``{}`` means one group of all participants;
  iota      ``[G,S]<=[d0,d1,...]T(p0,p1,...)``: ``iota(prod(d))`` reshaped to ``d``,
            transposed by ``p``, reshaped to G groups of S devices; ``T(...)`` optional.
  mesh axes ``mesh['a'=2,'b'=4] {'b'}`` (XLA's ``MeshAxesReplicaGroupList``, printed by
            jax 0.10 for SPMD programs): the devices of a named mesh (row-major ids, or
            ``, device_ids=([d0,d1]T(p))`` / ``device_ids=(3,1,2,0)`` when not in order);
            each group holds the devices that differ only along the listed axes. A listed
            axis may be a sub-axis ``'a':(pre)size`` (the ``size`` factor of axis ``a``
            after the first ``pre``). Expansion follows xla/hlo/ir/replica_group.cc
            (``ComputeReindexedAxes``, ``get_replica_groups_for_full_axes``).
"""

from __future__ import annotations

import re

import numpy as np

from .ints import ascii_int

#: The most devices a group list may name: device ids lie in [0, MAX_DEVICES). No system
#: has near 2^20 = 1,048,576 accelerators (the largest TPU pods and GPU clusters hold
#: tens to a few hundred thousand), and every group list is expanded into Python lists
#: (~60 bytes per id), so a larger count is refused rather than allocated.
MAX_DEVICES = 1 << 20

_IOTA = re.compile(r"^\[([0-9]++(?:,[0-9]++)*+)\]<=\[([0-9]++(?:,[0-9]++)*+)\](?:T\(([0-9]++(?:,[0-9]++)*+)\))?$")


class ReplicaGroupsError(ValueError):
    """A replica_groups value that is malformed or whose sizes do not multiply out."""


def _ints(s: str) -> list[int]:
    return [ascii_int(x) for x in s.split(",")]


# text -> its groups, for texts already expanded: a program repeats the same few values on
# thousands of collectives. Bounded (entries, and devices per entry).
_CACHE: dict[str, tuple[tuple[int, ...], ...]] = {}
_CACHE_ENTRIES = 4096
_CACHE_MAX_IDS = 1 << 16


def parse_replica_groups(text: str) -> list[list[int]]:
    """Expand a ``replica_groups`` value into explicit groups (a new list on every call).

    Returns [] for ``{}`` (all participants form one group; the caller knows how many).
    Raises as ``_parse_replica_groups`` below; results are cached by text, errors are not.
    """
    hit = _CACHE.get(text)
    if hit is not None:
        return [list(g) for g in hit]
    groups = _parse_replica_groups(text)
    if len(_CACHE) < _CACHE_ENTRIES and sum(map(len, groups)) <= _CACHE_MAX_IDS:
        _CACHE[text] = tuple(tuple(g) for g in groups)
    return groups


def _parse_replica_groups(text: str) -> list[list[int]]:
    """Expand a ``replica_groups`` value into explicit groups.

    Returns [] for ``{}`` (all participants form one group; the caller knows how many).
    Raises ReplicaGroupsError when the text is malformed, when a mesh-axes list names an
    axis the mesh lacks or device_ids that do not fill the mesh, when an iota list's group
    shape [G,S] does not hold as many devices as its reshape dims, or when the
    transpose is not a permutation of the reshape dims.
    """
    t = re.sub(r"\s+", "", text)
    if t.startswith("mesh["):
        return parse_mesh_axes_groups(t)
    m = _IOTA.match(t)
    if m:
        shape = _ints(m.group(1))
        dims = _ints(m.group(2))
        perm = _ints(m.group(3)) if m.group(3) else list(range(len(dims)))
        if len(shape) != 2:
            raise ReplicaGroupsError(f"iota replica groups {text}: expected [groups,size], got {shape}")
        n = _device_count(dims, text)
        if shape[0] * shape[1] != n:
            raise ReplicaGroupsError(
                f"iota replica groups {text}: {shape[0]}x{shape[1]} = {shape[0] * shape[1]} devices "
                f"in groups but the reshape dims {dims} hold {n}")
        if sorted(perm) != list(range(len(dims))):
            raise ReplicaGroupsError(f"iota replica groups {text}: T{tuple(perm)} is not a "
                                     f"permutation of {len(dims)} dims")
        arr = np.arange(n).reshape(dims).transpose(perm).reshape(shape)
        return arr.tolist()
    if not (t.startswith("{") and t.endswith("}")):
        raise ReplicaGroupsError(f"replica groups {text}: expected {{{{...}},...}} or [G,S]<=[dims]")
    inner = t[1:-1]
    if inner == "":
        return []
    groups = re.findall(r"\{([^{}]*)\}", inner)
    if re.sub(r"\{[^{}]*\}", "", inner).strip(",") != "":
        raise ReplicaGroupsError(f"replica groups {text}: expected a list of {{...}} groups")
    try:
        out = [_ints(g) if g else [] for g in groups]
    except ValueError:
        raise ReplicaGroupsError(f"replica groups {text}: expected integers") from None
    _check_ids(text, (d for g in out for d in g))
    return out


def _check_ids(text: str, ids) -> None:
    """Device ids must lie in [0, MAX_DEVICES) (XLA's ids are non-negative int64)."""
    for d in ids:
        if not 0 <= d < MAX_DEVICES:
            raise ReplicaGroupsError(f"replica groups {text}: device id {d} is not in "
                                     f"[0, {MAX_DEVICES}) (ids are non-negative; jaxmove "
                                     f"expands groups of at most {MAX_DEVICES} devices)")


_MESH = re.compile(r"^mesh\[(?P<axes>[^\]]*)\](?:,device_ids=\((?P<ids>.*)\))?\{(?P<refs>[^{}]*)\}$")
_MESH_AXIS = re.compile(r"^'?([^'=]+)'?=([0-9]+)$")
_AXIS_REF = re.compile(r"^'?([^':]+)'?(?::\(([0-9]+)\)([0-9]+))?$")
_IOTA_IDS = re.compile(r"^\[([0-9]++(?:,[0-9]++)*+)\](?:T\(([0-9]++(?:,[0-9]++)*+)\))?$")


def _device_count(dims: list[int], text: str) -> int:
    """prod(dims), refused (ReplicaGroupsError) above MAX_DEVICES before anything is allocated."""
    n = 1
    for d in dims:
        n *= d
    if n > MAX_DEVICES:
        raise ReplicaGroupsError(f"replica groups {text} span {n} devices, more than the "
                                 f"{MAX_DEVICES} jaxmove expands")
    return n


def _mesh_device_array(ids: str | None, sizes: list[int], text: str) -> np.ndarray:
    n = _device_count(sizes, text)
    if ids is None:
        return np.arange(n).reshape(sizes)
    m = _IOTA_IDS.match(ids)
    if m:
        dims = _ints(m.group(1))
        perm = _ints(m.group(2)) if m.group(2) else list(range(len(dims)))
        if _device_count(dims, text) != n or sorted(perm) != list(range(len(dims))):
            raise ReplicaGroupsError(f"replica groups {text}: device_ids [{m.group(1)}] do not "
                                     f"fill a mesh of {n} devices (or T is not a permutation)")
        return np.arange(n).reshape(dims).transpose(perm).reshape(sizes)
    try:
        flat = _ints(ids.strip("{}[]"))
        _check_ids(text, flat)
    except ValueError:
        raise ReplicaGroupsError(f"replica groups {text}: device_ids=({ids}) is neither "
                                 f"[dims]T(perm) nor a list of integers") from None
    if sorted(flat) != list(range(n)):
        raise ReplicaGroupsError(f"replica groups {text}: device_ids must be a permutation of "
                                 f"0..{n - 1}, got {len(flat)} ids")
    return np.array(flat).reshape(sizes)


def parse_mesh_axes_groups(text: str) -> list[list[int]]:
    """Expand ``mesh[...] [, device_ids=(...)] {axes}`` into explicit groups.

    Raises ReplicaGroupsError for malformed text, an unknown axis, a sub-axis that does not
    divide its axis, or device_ids that are not a permutation of the mesh's devices.
    """
    t = re.sub(r"\s+", "", text)
    m = _MESH.match(t)
    if not m:
        raise ReplicaGroupsError(f"replica groups {text}: expected mesh[name=size,...] {{axes}}")
    names, sizes = [], []
    for part in m.group("axes").split(","):
        am = _MESH_AXIS.match(part)
        if not am:
            raise ReplicaGroupsError(f"replica groups {text}: expected 'name'=size, got {part!r}")
        names.append(am.group(1))
        sizes.append(int(am.group(2)))
    devices = _mesh_device_array(m.group("ids"), sizes, text)
    refs: dict[int, list[tuple[int, int]]] = {}   # mesh dim -> [(pre_size, size)], listed order
    for part in (p for p in m.group("refs").split(",") if p):
        rm = _AXIS_REF.match(part)
        if not rm or rm.group(1) not in names:
            raise ReplicaGroupsError(f"replica groups {text}: axis {part!r} is not one of {names}")
        dim = names.index(rm.group(1))
        full = sizes[dim]
        pre, size = (int(rm.group(2)), int(rm.group(3))) if rm.group(2) else (1, full)
        if pre < 1 or size < 1:
            raise ReplicaGroupsError(f"replica groups {text}: sub-axis {part}: the sizes in "
                                     f"'name':(pre)size must be at least 1")
        if full % (pre * size):
            raise ReplicaGroupsError(f"replica groups {text}: sub-axis {part} does not divide "
                                     f"axis {rm.group(1)} of size {full}")
        refs.setdefault(dim, []).append((pre, size))
    reshape: list[int] = []
    grouped: list[int] = []
    for dim, full in enumerate(sizes):
        if dim not in refs:
            reshape.append(full)
            continue
        # Split the axis into [pad, sub, pad, sub, ..., rest] (HandleMultiAxisRefPerDimension).
        subs = refs[dim]
        order = sorted(range(len(subs)), key=lambda i: subs[i][0])
        agg_sorted: list[int] = []
        prefix = 1
        for i in order:
            pre, size = subs[i]
            if pre != prefix:
                reshape.append(pre // prefix)
                prefix = pre
            agg_sorted.append(len(reshape))
            reshape.append(size)
            prefix *= size
        if prefix != full:
            reshape.append(full // prefix)
        agg = [0] * len(subs)
        for k, i in enumerate(order):
            agg[i] = agg_sorted[k]
        grouped.extend(agg)
    group_size = int(np.prod([reshape[g] for g in grouped])) if grouped else 1
    perm = [i for i in range(len(reshape)) if i not in grouped] + grouped
    arr = devices.reshape(reshape).transpose(perm).reshape(-1, group_size)
    return arr.tolist()
