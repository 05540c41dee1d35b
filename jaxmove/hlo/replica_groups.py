"""Replica groups as XLA prints them.

Forms (xla/hlo/ir/collective_device_list.h, ``IotaReplicaGroupList``):
  explicit  ``{{0,1},{2,3}}``;  empty ``{}`` means one group of all participants;
  iota      ``[G,S]<=[d0,d1,...]T(p0,p1,...)``: ``iota(prod(d))`` reshaped to ``d``,
            transposed by ``p``, reshaped to G groups of S devices; ``T(...)`` optional.
"""

from __future__ import annotations

import re

import numpy as np

_IOTA = re.compile(r"^\[(\d+(?:,\d+)*)\]<=\[(\d+(?:,\d+)*)\](?:T\((\d+(?:,\d+)*)\))?$")


class ReplicaGroupsError(ValueError):
    """A replica_groups value that is malformed or whose sizes do not multiply out."""


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",")]


def parse_replica_groups(text: str) -> list[list[int]]:
    """Expand a ``replica_groups`` value into explicit groups.

    Returns [] for ``{}`` (all participants form one group; the caller knows how many).
    Raises ReplicaGroupsError when the text is malformed, when an iota list's group
    shape [G,S] does not hold as many devices as its reshape dims, or when the
    transpose is not a permutation of the reshape dims.
    """
    t = re.sub(r"\s+", "", text)
    m = _IOTA.match(t)
    if m:
        shape = _ints(m.group(1))
        dims = _ints(m.group(2))
        perm = _ints(m.group(3)) if m.group(3) else list(range(len(dims)))
        if len(shape) != 2:
            raise ReplicaGroupsError(f"iota replica groups {text}: expected [groups,size], got {shape}")
        n = int(np.prod(dims))
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
        return [_ints(g) if g else [] for g in groups]
    except ValueError:
        raise ReplicaGroupsError(f"replica groups {text}: expected integers") from None
