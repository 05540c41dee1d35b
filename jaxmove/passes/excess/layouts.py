"""Where an element of an array lies in its buffer, for XLA's tiled layouts, and whether a chain
of bitcasts and copies holds an array's elements in their row-major order (a reshape of it).

XLA's tiled layout (xla/g3doc/tiled_layout.md; ``xla/layout_util.cc``): the dimensions are
ordered major to minor (``minor_to_major`` reversed); each tile ``T(t_1..t_k)`` in turn splits
the k most minor dimensions ``d_i`` of the shape so far into ``ceil(d_i / t_i)`` tile counts
followed by the tile's ``t_i`` (a shape of fewer dimensions than the tile is padded with
leading 1s); the buffer holds the final shape in row-major order, padding included. A
``bitcast`` reinterprets the buffer (the element at one offset keeps it), a ``copy`` keeps
each element's logical index, a ``reshape`` its row-major position.
"""

from __future__ import annotations

import random

#: at most this many indices of an array are checked by ``keeps_row_major`` (all of them up to it)
SAMPLES = 512


def _physical(shape) -> tuple[list[int], list[int]] | None:
    """(dimension numbers major to minor, the tiles) of an array shape; None for a tile with
    ``*`` (-1) dimensions (combined dimensions: not modelled)."""
    lay = shape.layout
    rank = len(shape.dims)
    m2m = list(lay.minor_to_major) if lay is not None and lay.minor_to_major else list(range(rank - 1, -1, -1))
    tiles = list(lay.tiles) if lay is not None else []
    if len(m2m) != rank or any(t <= 0 for tile in tiles for t in tile):
        return None
    return m2m[::-1], tiles


def _levels(shape):
    """The shapes the tiles make in turn: [(dims before the tile, tile)] and the final dims."""
    got = _physical(shape)
    if got is None:
        return None
    order, tiles = got
    dims = [shape.dims[d] for d in order]
    levels = []
    for tile in tiles:
        k = len(tile)
        before = len(dims)
        if len(dims) < k:
            dims = [1] * (k - len(dims)) + dims
        levels.append((before, list(dims), tile))
        head, minor = dims[:-k], dims[-k:]
        dims = head + [-(-m // t) for m, t in zip(minor, tile)] + list(tile)
    return order, levels, dims


def offset_of(shape, index: tuple[int, ...]) -> int | None:
    """The element offset (in elements, padding included) of logical ``index`` in a buffer
    of ``shape``; None where the layout is not modelled."""
    got = _levels(shape)
    if got is None:
        return None
    order, levels, final = got
    idx = [index[d] for d in order]
    for _before, dims, tile in levels:
        k = len(tile)
        if len(idx) < len(dims):
            idx = [0] * (len(dims) - len(idx)) + idx
        head, minor = idx[:-k], idx[-k:]
        idx = head + [i // t for i, t in zip(minor, tile)] + [i % t for i, t in zip(minor, tile)]
    off = 0
    for i, d in zip(idx, final):
        off = off * d + i
    return off


def index_at(shape, offset: int) -> tuple[int, ...] | None:
    """The logical index of the element at ``offset`` of a buffer of ``shape``; None in the
    padding, or where the layout is not modelled."""
    got = _levels(shape)
    if got is None:
        return None
    order, levels, final = got
    idx = []
    for d in reversed(final):
        idx.append(offset % d)
        offset //= d
    if offset:
        return None
    idx.reverse()
    for before, dims, tile in reversed(levels):
        k = len(tile)
        n = len(idx) - 2 * k
        head, counts, within = idx[:n], idx[n:n + k], idx[n + k:]
        idx = head + [c * t + w for c, t, w in zip(counts, tile, within)]
        if any(i >= d for i, d in zip(idx, dims)):
            return None   # (the padding of a partial tile)
        if len(idx) > before:   # (the leading 1s this tile added)
            if any(idx[:len(idx) - before]):
                return None
            idx = idx[len(idx) - before:]
    rank = len(shape.dims)
    if len(idx) != rank:
        return None
    out = [0] * rank
    for pos, d in enumerate(order):
        out[d] = idx[pos]
    return tuple(out)


def _unravel(linear: int, dims) -> tuple[int, ...]:
    out = []
    for d in reversed(dims):
        out.append(linear % d)
        linear //= d
    return tuple(reversed(out))


def keeps_row_major(chain) -> bool:
    """``chain`` (``[result, ..., parameter]`` of ``reshape``, ``copy``, ``bitcast``,
    ``copy-start`` / ``copy-done`` steps and ``get-tuple-element`` of ``tuple``) holds the
    parameter's elements in their row-major order in the result's dimensions (a reshape of
    it): checked element by element for up to ``SAMPLES`` indices (every index of a smaller
    array; else the first and last and a fixed pseudo-random sample), following each element
    through the buffers. False where a step moves an element elsewhere (a transpose made of
    bitcasts between layouts), lands in padding, or a layout is not modelled."""
    param, result = chain[-1], chain[0]
    pshape, rshape = param.shape, result.shape
    if not (pshape.is_array and rshape.is_array) or pshape.num_elements != rshape.num_elements:
        return False
    n = pshape.num_elements
    if n <= SAMPLES:
        linears = range(n)
    else:
        rng = random.Random(0)
        linears = [0, n - 1] + [rng.randrange(n) for _ in range(SAMPLES - 2)]
    steps = chain[-2::-1]   # parameter side first
    for lin in linears:
        idx, cur = _unravel(lin, pshape.dims), pshape
        for node in steps:
            op = node.opcode
            if op == "reshape":
                idx, cur = _unravel(_ravel(idx, cur.dims), node.shape.dims), node.shape
            elif op == "bitcast":
                off = offset_of(cur, idx)
                idx = index_at(node.shape, off) if off is not None else None
                if idx is None:
                    return False
                cur = node.shape
            elif node.shape.is_array:   # copy / copy-done: the same logical index
                if node.shape.dims != cur.dims:
                    return False
                cur = node.shape
            # (copy-start, tuple, get-tuple-element: the value passes through unchanged)
        if idx != _unravel(lin, rshape.dims):
            return False
    return True


def _ravel(idx, dims) -> int:
    lin = 0
    for i, d in zip(idx, dims):
        lin = lin * d + i
    return lin


__all__ = ["SAMPLES", "index_at", "keeps_row_major", "offset_of"]
