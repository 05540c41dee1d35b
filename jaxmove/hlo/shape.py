"""HLO shapes: primitive types, array and tuple shapes, layouts.

Sizes follow XLA's ``primitive_util::BitWidth`` (xla/primitive_util.h) and
``ShapeUtil::ByteSizeOf`` (xla/shape_util.cc): an array occupies
``ceil(num_elements * bit_width / 8)`` bytes, so sub-byte types (s4, u4, f4e2m1fn,
s2, u2) are counted packed, as XLA:GPU and XLA:TPU store them. A tuple's byte size
here is the sum of its leaves (the data it refers to), not XLA's pointer table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

# Bit width of every primitive type XLA prints (xla/xla_data.proto PrimitiveType).
# token and opaque carry no data that jaxmove can size: 0 bits.
PRIMITIVE_BIT_WIDTHS: dict[str, int] = {
    "pred": 8,
    "s1": 1, "s2": 2, "s4": 4, "s8": 8, "s16": 16, "s32": 32, "s64": 64,
    "u1": 1, "u2": 2, "u4": 4, "u8": 8, "u16": 16, "u32": 32, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
    "f8e5m2": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e5m2fnuz": 8,
    "f8e4m3fnuz": 8, "f8e4m3": 8, "f8e3m4": 8, "f8e8m0fnu": 8,
    "f6e2m3fn": 6, "f6e3m2fn": 6,
    "f4e2m1fn": 4,
    "c64": 64, "c128": 128,
    "token": 0, "opaque": 0,
}

FLOAT_TYPES = frozenset(
    t for t in PRIMITIVE_BIT_WIDTHS if t.startswith(("f", "bf")) or t in ("c64", "c128")
)


@dataclass(frozen=True, slots=True)
class Layout:
    """An array layout as XLA prints it: ``{1,0:T(8,128)(2,1)E(4)S(1)}``.

    Attributes:
      minor_to_major: dimension numbers, most minor first.
      tiles: each tile is a tuple of tile dimension sizes (``-1`` for ``*``).
      element_size_bits: ``E(n)``, the packed element size, or None.
      memory_space: ``S(n)``; 0 is device HBM, 1 is on-chip (VMEM on TPU),
        5 is host memory (xla/layout.h ``kHostMemorySpace``).
      text: the layout exactly as printed, without braces.
    """

    minor_to_major: tuple[int, ...] = ()
    tiles: tuple[tuple[int, ...], ...] = ()
    element_size_bits: int | None = None
    memory_space: int = 0
    text: str = ""


HOST_MEMORY_SPACE = 5  # xla/layout.h: Layout::kHostMemorySpace


@dataclass(frozen=True, slots=True)
class Shape:
    """An HLO shape: an array (``f32[4,<=8]{1,0}``), a tuple, a token or opaque.

    Attributes:
      element_type: primitive type name (``f32``, ``bf16``...), or ``tuple``.
      dims: dimension sizes (upper bounds for dynamic dimensions).
      dynamic: per dimension, True when printed with ``<=`` (bounded dynamic).
      layout: the layout, or None when the text printed none.
      tuple_shapes: element shapes when ``element_type == "tuple"``.
    """

    element_type: str
    dims: tuple[int, ...] = ()
    dynamic: tuple[bool, ...] = ()
    layout: Layout | None = None
    tuple_shapes: tuple["Shape", ...] = field(default=())
    # Derived once at construction (shapes are immutable and shared by the parser's cache).
    is_tuple: bool = field(init=False, repr=False, compare=False)
    is_array: bool = field(init=False, repr=False, compare=False)
    num_elements: int = field(init=False, repr=False, compare=False)
    byte_size: int = field(init=False, repr=False, compare=False)
    num_leaves: int = field(init=False, repr=False, compare=False)
    leaf_offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)
    memory_space: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Sets ``is_tuple``, ``is_array``, ``num_elements`` (elements of an array shape, 1
        for a scalar), ``byte_size`` (ceil(elements * bits / 8) for arrays, the sum over
        leaves for tuples), ``num_leaves`` (1 for a non-tuple), ``leaf_offsets`` (per tuple
        element, the flat number of its first leaf) and ``memory_space`` (the layout's, 0 without
        a layout). Raises KeyError for an unknown element type."""
        is_tuple = self.element_type == "tuple"
        n = prod(self.dims)
        if is_tuple:
            nbytes = sum(s.byte_size for s in self.tuple_shapes)
        else:
            nbytes = (n * PRIMITIVE_BIT_WIDTHS[self.element_type] + 7) // 8
        object.__setattr__(self, "is_tuple", is_tuple)
        object.__setattr__(self, "is_array", self.element_type not in ("tuple", "token", "opaque"))
        object.__setattr__(self, "num_elements", n)
        object.__setattr__(self, "byte_size", nbytes)
        # flat leaf number of each tuple element's first leaf (leaf_position in O(depth))
        offsets, k = [], 0
        for e in self.tuple_shapes:
            offsets.append(k)
            k += e.num_leaves
        object.__setattr__(self, "num_leaves", k if is_tuple else 1)
        object.__setattr__(self, "leaf_offsets", tuple(offsets))
        object.__setattr__(self, "memory_space",
                           self.layout.memory_space if self.layout is not None else 0)

    @property
    def bit_width(self) -> int:
        return PRIMITIVE_BIT_WIDTHS[self.element_type]

    def leaves(self) -> list["Shape"]:
        """Array/token leaves of this shape in tuple order (self for a non-tuple)."""
        if not self.is_tuple:
            return [self]
        out: list[Shape] = []
        for s in self.tuple_shapes:
            out.extend(s.leaves())
        return out

    def leaves_with_index(self, prefix: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], "Shape"]]:
        """(ShapeIndex, leaf) pairs, as XLA's ShapeUtil::ForEachLeafShape visits them."""
        if not self.is_tuple:
            return [(prefix, self)]
        out = []
        for i, s in enumerate(self.tuple_shapes):
            out.extend(s.leaves_with_index(prefix + (i,)))
        return out

    def subshape(self, index: tuple[int, ...] | list[int]) -> "Shape":
        """The shape at a ShapeIndex; raises IndexError when the index does not exist."""
        s = self
        for i in index:
            if not s.is_tuple or not 0 <= i < len(s.tuple_shapes):
                raise IndexError(f"shape index {tuple(index)} not in {self}")
            s = s.tuple_shapes[i]
        return s

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        dims = ",".join(("<=" if d else "") + str(n) for n, d in zip(self.dims, self.dynamic))
        out = f"{self.element_type}[{dims}]"
        if self.layout is not None and self.layout.text:
            out += "{" + self.layout.text + "}"
        return out


def array_shape(element_type: str, dims: tuple[int, ...] | list[int]) -> Shape:
    """Convenience constructor for a static array shape without layout."""
    dims = tuple(dims)
    return Shape(element_type, dims, (False,) * len(dims))
