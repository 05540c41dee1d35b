"""Cost records: typed, frozen, and closed under + and scaling by a trip count.

One ``Cost`` holds what one instruction (or a whole computation) moves and computes
per execution: flops, HBM bytes by role, bytes by data path. ``cost * n`` is the cost of
n executions, so a loop body's cost times its trip count is one expression (the idea of
JAX's ``RooflineResult``, jax/experimental/roofline/roofline.py).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass, fields

from ..vocab import PATHS  # noqa: F401  (re-exported)


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
        """Field-wise sum of many costs, built once (chaining ``+`` builds one per term)."""
        columns = list(zip(*[_values(c) for c in costs if c is not ZERO_COST]))  # zeros add nothing
        if not columns:
            return Cost()
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


def _make_from_values():
    """Build ``from_values``: a Cost from its field values in ``_NAMES`` order, set through
    the slot descriptors (what the frozen ``__init__`` does, without 19 keyword arguments
    and ``object.__setattr__`` calls: ~2.5x faster; analyze_module builds one per row)."""
    setters = {f"_s{i}": Cost.__dict__[n].__set__ for i, n in enumerate(_NAMES)}
    body = "".join(f"    _s{i}(c, v[{i}])\n" for i in range(len(_NAMES)))
    src = f"def from_values(v):\n    c = _new(Cost)\n{body}    return c\n"
    ns = {"_new": object.__new__, "Cost": Cost, **setters}
    exec(src, ns)  # noqa: S102 - generated from the dataclass's own field names
    fn = ns["from_values"]
    fn.__doc__ = ("A Cost from a sequence of its field values in declaration order (ints; "
                  "not checked). Raises IndexError when shorter than the field count.")
    return fn


from_values = _make_from_values()
ZERO_COST = Cost()  # frozen: one shared zero
