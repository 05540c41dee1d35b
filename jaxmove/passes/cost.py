"""Cost records, and the one mapping from an access to the Cost fields it adds to.

A ``Cost`` is what one instruction (or computation) moves and computes per execution; it is
closed under ``+`` and scaling by a trip count (the idea of JAX's ``RooflineResult``,
jax/experimental/roofline/roofline.py). ``ACCESS_SLOTS`` maps (memory space, role, read or
write) to the Cost fields an access adds its bytes to (memory spaces: hlo/shape.py; roles and
paths: vocab.py, ../shared/DESIGN.md "The four data paths").
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass, fields

from .._perf import slots_constructor
from ..hlo.shape import HOST_MEMORY_SPACE, ON_CHIP_MEMORY_SPACES
from ..vocab import PATHS, ROLES  # noqa: F401  (PATHS re-exported)


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """Flops and bytes; every byte field counts bytes, every flop field operations."""

    flops: int = 0
    transcendentals: int = 0
    hbm_read_bytes: int = 0
    hbm_write_bytes: int = 0
    onchip_read_bytes: int = 0    # operands already in on-chip memory spaces (S(1), S(6))
    onchip_write_bytes: int = 0
    # of hbm_read_bytes / hbm_write_bytes, the bytes that are tile padding (physical minus
    # data bytes of tiled layouts such as XLA:TPU's T(8,128); passes/traffic.py)
    hbm_padding_read_bytes: int = 0
    hbm_padding_write_bytes: int = 0
    weights_read_bytes: int = 0
    weights_write_bytes: int = 0
    kv_cache_read_bytes: int = 0
    kv_cache_write_bytes: int = 0
    optimizer_state_read_bytes: int = 0
    optimizer_state_write_bytes: int = 0
    activations_read_bytes: int = 0
    activations_write_bytes: int = 0
    unknown_read_bytes: int = 0
    unknown_write_bytes: int = 0
    host_to_device_bytes: int = 0
    hbm_to_onchip_bytes: int = 0
    onchip_to_hbm_bytes: int = 0
    device_to_device_bytes: int = 0
    device_to_host_bytes: int = 0

    def __add__(self, other: "Cost") -> "Cost":
        return from_values(list(map(operator.add, _values(self), _values(other))))

    def __mul__(self, k: int) -> "Cost":
        if k == 1:
            return self  # frozen: sharing is safe
        return from_values([v * k for v in _values(self)])

    @staticmethod
    def sum(costs: "Iterable[Cost]") -> "Cost":
        """Field-wise sum of many costs, built once (chaining ``+`` builds one per term).

        The rows of a module share a few Cost objects (``pipeline.instruction_cost``'s memo):
        each distinct object's fields are scaled by how often it occurs, where every field
        is an int (exact); a float field sums term by term, in order, as before."""
        if not isinstance(costs, (list, tuple)):
            costs = list(costs)
        seen: dict[int, list] = {}  # id -> [cost, occurrences]; the list holds the objects
        for c in costs:
            e = seen.get(id(c))
            if e is None:
                seen[id(c)] = [c, 1]
            else:
                e[1] += 1
        seen.pop(id(ZERO_COST), None)  # zeros add nothing
        if not seen:
            return Cost()
        if len(seen) * 4 < len(costs):
            groups = [(_values(c), k) for c, k in seen.values()]
            if all(type(v) is int for vals, _k in groups for v in vals):
                return from_values([sum(col) for col in zip(*[
                    vals if k == 1 else [v * k for v in vals] for vals, k in groups])])
        columns = list(zip(*[_values(c) for c in costs if c is not ZERO_COST]))
        return from_values(list(map(sum, columns)))

    __rmul__ = __mul__

    def role_bytes(self, role: str) -> tuple[int, int]:
        """(read, write) HBM bytes of one role."""
        return getattr(self, f"{role}_read_bytes"), getattr(self, f"{role}_write_bytes")

    def path_bytes(self, path: str) -> int:
        return getattr(self, f"{path}_bytes")

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read_bytes + self.hbm_write_bytes

    @property
    def hbm_padding_bytes(self) -> int:
        """HBM bytes moved that are tile padding, not data."""
        return self.hbm_padding_read_bytes + self.hbm_padding_write_bytes

    @property
    def hbm_logical_bytes(self) -> int:
        """HBM bytes that are data: ``hbm_bytes - hbm_padding_bytes``."""
        return self.hbm_bytes - self.hbm_padding_bytes


_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Cost))
_values = operator.attrgetter(*_NAMES)  # Cost -> tuple of its fields, in _NAMES order
FIELD_INDEX: dict[str, int] = {n: i for i, n in enumerate(_NAMES)}  # field name -> position
N_FIELDS = len(_NAMES)

# analyze_module builds one Cost per row: set through the slot descriptors (~2.5x faster than
# the frozen keyword-only __init__)
from_values = slots_constructor(Cost, from_sequence=True)
from_values.__doc__ = ("A Cost from a sequence of its field values in declaration order "
                       "(``FIELD_INDEX``; ints, not checked). IndexError when it is too short.")
ZERO_COST = Cost()  # frozen: one shared zero


# ---- accesses -> Cost fields --------------------------------------------------------------

NOT_HBM_MEMORY_SPACES = ON_CHIP_MEMORY_SPACES | {HOST_MEMORY_SPACE}


def hbm_access_bytes(accesses: Iterable) -> int:
    """Bytes of the accesses (``passes/traffic.Access``) whose memory space is HBM (not
    on-chip ``ON_CHIP_MEMORY_SPACES``: TPU VMEM, sync flags, SMEM; not host S(5))."""
    return sum(a.nbytes for a in accesses if a.memory_space not in NOT_HBM_MEMORY_SPACES)


def access_fields(memory_space: int, role: str, is_read: bool) -> tuple[str, ...]:
    """The Cost fields an access adds its bytes to.

    On-chip: ``onchip_read_bytes`` / ``onchip_write_bytes``. Host: the host_to_device /
    device_to_host path. HBM: ``hbm_read_bytes`` + the hbm_to_onchip path + ``<role>_read_bytes``
    (writes: ``hbm_write_bytes`` + onchip_to_hbm + ``<role>_write_bytes``).

    Raises:
      ValueError: ``role`` is not one of ``vocab.ROLES``.
    """
    if memory_space in ON_CHIP_MEMORY_SPACES:
        return ("onchip_read_bytes",) if is_read else ("onchip_write_bytes",)
    if memory_space == HOST_MEMORY_SPACE:
        return ("host_to_device_bytes",) if is_read else ("device_to_host_bytes",)
    if role not in ROLES:
        raise ValueError(f"unknown role '{role}' (roles: {', '.join(ROLES)})")
    if is_read:
        return "hbm_read_bytes", "hbm_to_onchip_bytes", f"{role}_read_bytes"
    return "hbm_write_bytes", "onchip_to_hbm_bytes", f"{role}_write_bytes"


class _AccessSlots(dict):
    """(memory space, role, is_read) -> positions (``FIELD_INDEX``) of ``access_fields``,
    filled on first use."""

    def __missing__(self, key: tuple[int, str, bool]) -> tuple[int, ...]:
        fs = self[key] = tuple(FIELD_INDEX[n] for n in access_fields(*key))
        return fs


ACCESS_SLOTS: dict[tuple[int, str, bool], tuple[int, ...]] = _AccessSlots()
