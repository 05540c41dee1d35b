"""HLO shapes: primitive types, array and tuple shapes, layouts.

Two sizes per array shape:

* ``logical_byte_size``: the data, ``ceil(num_elements * bits / 8)`` with the bit width of
  ``primitive_util::BitWidth`` (xla/primitive_util.h), or the layout's ``E(n)`` element size
  when printed; sub-byte types (s4, u4, f4e2m1fn, s2, u2) are counted packed, as XLA:GPU and
  XLA:TPU store them.
* ``byte_size``: the *physical* size, what the buffer occupies in memory and what a DMA
  moves. Without tiles it is the logical size. With a tiled layout (``{1,0:T(8,128)(2,1)}``)
  it follows ``ShapeUtil::ArraySize`` (xla/shape_util.cc): the first (top-level) tile pads
  the most-minor dimensions up to multiples of the tile's dimensions (its last dimension
  pads the most-minor array dimension; a tile with more dimensions than the array pads
  dimensions of size 1), sub-tiles such as ``(2,1)``/``(4,1)`` (element packing) add no
  padding, ``L(n)`` rounds the padded element count up to a multiple of n, and the element
  size is ``E(n)`` bits when printed, else the type's bit width. E.g. XLA:TPU's
  ``f32[16,8]{0,1:T(8,128)}`` is 4096 bytes (512 of data), ``pred[16]{0:T(512)(128)(4,1)}``
  and ``u32[1,1,128]{2,1,0:T(1,128)}`` are both 512, ``f32[]{:T(128)}`` is 512.
  XLA's ``Compiled.memory_analysis().argument_size_in_bytes`` is the sum of these sizes
  over the entry parameters (tests/test_tiled_layouts.py checks it on real TPU programs).

A tuple's sizes here are the sums over its leaves (the data it refers to), not XLA's
pointer table.
"""

from __future__ import annotations

import functools

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
      memory_space: ``S(n)``; 0 is device HBM, 5 is host memory (xla/layout.h
        ``kHostMemorySpace``), ``ON_CHIP_MEMORY_SPACES`` are on chip (TPU VMEM, sync flags, SMEM).
      text: the layout exactly as printed, without braces.
      tail_padding_alignment_elements: ``L(n)``, the padded element count is rounded up to
        a multiple of n (``Layout::tail_padding_alignment_in_elements``); 1 when not printed.
    """

    minor_to_major: tuple[int, ...] = ()
    tiles: tuple[tuple[int, ...], ...] = ()
    element_size_bits: int | None = None
    memory_space: int = 0
    text: str = ""
    tail_padding_alignment_elements: int = 1


HOST_MEMORY_SPACE = 5  # xla/layout.h: Layout::kHostMemorySpace
# XLA:TPU's memory-space colours (jax/_src/tpu_custom_call.py, MemorySpace.color: the
# colours JAX passes to XLA:TPU for a Mosaic kernel's operands): 0 HBM, 1 VMEM, 2 semaphore
# memory (the sync flags of DMAs and async collectives: u32[]{:S(2)}), 4 SMEM (scalar
# memory: s32[2]{0:S(4)} beside a collective's flags), 5 host, 8 the SparseCore's scalar
# semaphore memory.
TPU_VMEM_MEMORY_SPACE = 1
TPU_SEMAPHORE_MEMORY_SPACE = 2
TPU_SMEM_MEMORY_SPACE = 4
TPU_SPARSECORE_SEMAPHORE_MEMORY_SPACE = 8
# On-chip memory spaces, never HBM traffic: the TPU colours above, and S(6), which XLA:TPU
# gives scalars (loop indices, s32[]{:S(6)}) in compiled programs (benchmarks/device_corpus.md;
# not in JAX's table). XLA:GPU numbers its colours differently
# (xla/service/gpu/gpu_memory_space_assignment.h: 1 collective memory, 2 temp buffers, both
# in HBM; S(1) is printed with --xla_gpu_enable_nccl_user_buffers): the parser reads them as
# HBM in XLA:GPU text (hlo/parser.py, is_xla_gpu_text).
ON_CHIP_MEMORY_SPACES = frozenset({TPU_VMEM_MEMORY_SPACE, TPU_SEMAPHORE_MEMORY_SPACE,
                                   TPU_SMEM_MEMORY_SPACE, 6,
                                   TPU_SPARSECORE_SEMAPHORE_MEMORY_SPACE})


def _padded_elements(dims: tuple[int, ...], layout: Layout) -> int:
    """Elements an array of ``dims`` occupies under ``layout``'s top-level tile
    (``ShapeUtil::ArraySize``, xla/shape_util.cc): tile dimension ``j`` from the end pads the
    ``j``-th most-minor array dimension (size 1 where the array has fewer dimensions); a
    combined dimension ``*`` (printed -1 here) pads nothing."""
    tile = layout.tiles[0]
    m2m = layout.minor_to_major
    if len(m2m) != len(dims) or sorted(m2m) != list(range(len(dims))):
        # no (or no valid) dimension order printed: dims in major-to-minor order
        m2m = tuple(range(len(dims) - 1, -1, -1))
    n = 1
    nt = len(tile)
    for d in range(max(nt, len(dims))):
        size = dims[m2m[d]] if d < len(dims) else 1
        if d < nt:
            t = tile[nt - d - 1]
            if t > 1:
                size = -(-size // t) * t
        n *= size
    align = layout.tail_padding_alignment_elements
    if align > 1:
        n = -(-n // align) * align
    return n


@dataclass(frozen=True, slots=True)
class Shape:
    """An HLO shape: an array (``f32[4,<=8]{1,0}``), a tuple, a token or opaque.

    Attributes:
      element_type: primitive type name (``f32``, ``bf16``...), or ``tuple``.
      dims: dimension sizes (upper bounds for dynamic dimensions).
      dynamic: per dimension, True when printed with ``<=`` (bounded dynamic).
      layout: the layout, or None when the text printed none.
      tuple_shapes: element shapes when ``element_type == "tuple"``.
      unbounded: per dimension, True for an unbounded dynamic dimension (printed ``?``;
        XLA's ``Shape::kUnboundedSize``): its size is known only at run time, its ``dims``
        entry is 0 and no byte count of this shape is a model (``has_unbounded_dim``).

    Derived (set at construction): ``byte_size`` (physical bytes, tile padding included),
    ``logical_byte_size`` (the data's bytes), ``num_elements``, ``memory_space`` ... (see
    ``__post_init__`` and the module docstring).
    """

    element_type: str
    dims: tuple[int, ...] = ()
    dynamic: tuple[bool, ...] = ()
    layout: Layout | None = None
    tuple_shapes: tuple["Shape", ...] = field(default=())
    unbounded: tuple[bool, ...] = ()
    # Derived once at construction (shapes are immutable and shared by the parser's cache).
    is_tuple: bool = field(init=False, repr=False, compare=False)
    is_array: bool = field(init=False, repr=False, compare=False)
    num_elements: int = field(init=False, repr=False, compare=False)
    byte_size: int = field(init=False, repr=False, compare=False)
    logical_byte_size: int = field(init=False, repr=False, compare=False)
    num_leaves: int = field(init=False, repr=False, compare=False)
    leaf_offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)
    memory_space: int = field(init=False, repr=False, compare=False)
    tuple_depth: int = field(init=False, repr=False, compare=False)
    has_unbounded_dim: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Sets ``is_tuple``, ``is_array``, ``num_elements`` (elements of an array shape, 1
        for a scalar), ``logical_byte_size`` (ceil(elements * bits / 8) for arrays, bits from
        ``E(n)`` when printed, the sum over leaves for tuples), ``byte_size`` (the physical
        size: tile-padded for a tiled layout, as the module docstring says; the sum over leaves
        for tuples), ``num_leaves`` (1 for a non-tuple), ``leaf_offsets`` (per tuple element,
        the flat number of its first leaf) and ``memory_space`` (the layout's, 0 without a
        layout), ``tuple_depth`` (0 for a non-tuple, else 1 + its deepest element's). Raises
        KeyError for an unknown element type."""
        is_tuple = self.element_type == "tuple"
        n = prod(self.dims)
        layout = self.layout
        if is_tuple:
            nbytes = sum(s.byte_size for s in self.tuple_shapes)
            logical = sum(s.logical_byte_size for s in self.tuple_shapes)
        else:
            bits = PRIMITIVE_BIT_WIDTHS[self.element_type]
            if layout is not None and layout.element_size_bits:
                bits = layout.element_size_bits
            logical = nbytes = (n * bits + 7) // 8
            if layout is not None and layout.tiles and bits:
                nbytes = (_padded_elements(self.dims, layout) * bits + 7) // 8
        object.__setattr__(self, "is_tuple", is_tuple)
        object.__setattr__(self, "is_array", self.element_type not in ("tuple", "token", "opaque"))
        object.__setattr__(self, "num_elements", n)
        object.__setattr__(self, "byte_size", nbytes)
        object.__setattr__(self, "logical_byte_size", logical)
        # flat leaf number of each tuple element's first leaf (leaf_position in O(depth))
        offsets, k = [], 0
        for e in self.tuple_shapes:
            offsets.append(k)
            k += e.num_leaves
        object.__setattr__(self, "num_leaves", k if is_tuple else 1)
        object.__setattr__(self, "leaf_offsets", tuple(offsets))
        object.__setattr__(self, "memory_space",
                           self.layout.memory_space if self.layout is not None else 0)
        object.__setattr__(self, "has_unbounded_dim", any(self.unbounded) or any(
            s.has_unbounded_dim for s in self.tuple_shapes))
        object.__setattr__(self, "tuple_depth", 1 + max(
            (e.tuple_depth for e in self.tuple_shapes), default=0) if is_tuple else 0)

    @property
    def bit_width(self) -> int:
        return PRIMITIVE_BIT_WIDTHS[self.element_type]

    @property
    def padding_bytes(self) -> int:
        """``byte_size - logical_byte_size``: bytes of tile padding (0 without tiles)."""
        return self.byte_size - self.logical_byte_size

    def footprint_bytes(self, elems: int) -> int:
        """Physical bytes a kernel moves to touch ``elems`` of this array's elements: the
        whole ``byte_size`` when it touches all of them, else the same share of it
        (``ceil(byte_size * elems / num_elements)``; without tiles this is the logical
        ``ceil(elems * bits / 8)``). The share is exact for slices along major dimensions
        (a layer of a stacked weight); a slice of a tiled minor dimension touches whole tiles,
        which ``sliced_byte_size`` counts when the slice's dimensions are known."""
        n = self.num_elements
        if elems >= n:
            return self.byte_size
        if elems <= 0:
            return 0
        if self.byte_size == self.logical_byte_size:
            return (elems * self.element_bits + 7) // 8
        return -(-self.byte_size * elems // n)

    def logical_footprint_bytes(self, elems: int) -> int:
        """Data bytes of ``elems`` elements: ``ceil(elems * bits / 8)`` (at most the whole)."""
        if elems >= self.num_elements:
            return self.logical_byte_size
        return (max(elems, 0) * self.element_bits + 7) // 8

    def sliced_byte_size(self, dims: tuple[int, ...]) -> int:
        """Physical bytes of a tile-aligned block of ``dims`` of this array stored in this
        array's layout: the tiles a slice of those dimensions touches (at least; a slice
        not aligned to the tiles touches up to one more tile per tiled dimension).
        ``dims`` must have this array's rank; else the ``footprint_bytes`` share."""
        lay = self.layout
        if not self.is_array or len(dims) != len(self.dims):
            return self.footprint_bytes(prod(dims))
        if lay is None or not lay.tiles or not self.element_bits:
            return (prod(dims) * self.element_bits + 7) // 8
        return min(self.byte_size, (_padded_elements(tuple(dims), lay) * self.element_bits + 7) // 8)

    @property
    def element_bits(self) -> int:
        """Bits per stored element: the layout's ``E(n)`` when printed, else ``bit_width``."""
        lay = self.layout
        if lay is not None and lay.element_size_bits:
            return lay.element_size_bits
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
        unb = self.unbounded or (False,) * len(self.dims)
        dims = ",".join("?" if u else ("<=" if d else "") + str(n)
                        for n, d, u in zip(self.dims, self.dynamic, unb))
        out = f"{self.element_type}[{dims}]"
        if self.layout is not None and self.layout.text:
            out += "{" + self.layout.text + "}"
        return out


@functools.lru_cache(maxsize=1 << 16)  # shapes repeat (every layer's); Shape is frozen, hashable
def shape_text(shape: "Shape") -> str:
    """``bf16[1,768]`` / ``(f32[8], s32[])``: dtype and dimensions, no layout (what the tensor
    is; the layout changes its bytes). Messages of the passes and the renderings use it."""
    if shape.is_tuple:
        return "(" + ", ".join(shape_text(s) for s in shape.tuple_shapes) + ")"
    dims = ",".join(("<=" if d else "") + str(n) for n, d in zip(shape.dims, shape.dynamic or
                                                                  (False,) * len(shape.dims)))
    return f"{shape.element_type}[{dims}]"


def array_shape(element_type: str, dims: tuple[int, ...] | list[int]) -> Shape:
    """Convenience constructor for a static array shape without layout."""
    dims = tuple(dims)
    return Shape(element_type, dims, (False,) * len(dims))
