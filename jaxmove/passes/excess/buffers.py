"""Buffers of the excess pass: which value leaves ``(computation, instruction, leaf)`` share one
buffer (a union-find: bitcasts, tuples, while carries, call parameters, in-place updates, async
pairs), the leaf a write fills, and the origin of a chain of copy kernels.
"""

from __future__ import annotations

from ...hlo import Computation, Instruction, Module
from ..roles import leaf_position
from .kernels import through_bitcast

ALIAS_LEAFWISE = frozenset({"bitcast", "add-dependency", "domain", "opt-barrier",
                            "optimization-barrier"})
# opcodes whose value shares a buffer with another value (``union_all``; and ``*-done``)
_UNION_OPS = ALIAS_LEAFWISE | {"get-tuple-element", "tuple", "while", "call", "async-start", "conditional",
                               "dynamic-update-slice", "scatter", "fusion"}
NATIVE_STARTS = frozenset({"all-reduce-start", "all-gather-start", "collective-permute-start"})
_OPERAND_RESULT_STARTS = frozenset({"all-gather-start", "collective-permute-start"})

class Buffers:
    """Union-find over value leaves ``(computation, instruction, leaf)`` that share one buffer
    (bitcasts, tuples, while carries, call parameters, in-place updates, async pairs)."""

    __slots__ = ("parent",)

    def __init__(self):
        self.parent: dict[tuple, tuple] = {}

    def find(self, k: tuple) -> tuple:
        parent = self.parent
        p = parent.get(k)
        if p is None:
            return k
        if p not in parent:  # one step from the root: nothing to compress
            return p
        root = p
        while True:
            q = parent.get(root)
            if q is None:
                break
            root = q
        while k != root:  # path compression
            nxt = parent[k]
            parent[k] = root
            k = nxt
        return root

    def union(self, a: tuple, b: tuple) -> None:
        parent = self.parent
        if a in parent:
            a = self.find(a)
        if b in parent:
            b = self.find(b)
        if a != b:
            parent[a] = b

    def union_leaves(self, ca: str, a: str, cb: str, b: str, n: int, oa: int = 0, ob: int = 0) -> None:
        if n == 1:
            self.union((ca, a, oa), (cb, b, ob))
            return
        for j in range(n):
            self.union((ca, a, oa + j), (cb, b, ob + j))


def union_all(module: Module, B: Buffers, comps: list[str], inplace: set, rebuilds: dict | None = None) -> bool:
    """Union the value leaves of ``comps`` (kernel-level computations) that share a buffer:
    bitcasts and other aliasing ops leaf by leaf, tuple elements, while carries (operand,
    body and condition parameters, body root), call and async-start parameters and roots,
    conditional branches, in-place updates (dynamic-update-slice, scatter; the fusions of
    ``inplace``, (computation, name) pairs, that update an operand in place; those of
    ``rebuilds``, (computation, name) -> operand number, that rebuild an operand around its
    update, ``kernels.classify``'s REBUILD) and async ``*-done`` results. Returns whether the ENTRY root tuple was skipped (its leaves are then
    found from its operands)."""
    parent, find = B.parent, B.find
    # The ENTRY root tuple, when it is the last instruction, is no operand of anything, and
    # no computation calls ENTRY (the call graph is acyclic: hlo/validate.py): its leaves'
    # unions matter only for the result leaves, which run() takes from its operands.
    entry = module.entry
    skip_root = entry.root if entry.root.opcode == "tuple" and entry.instructions \
        and entry.instructions[-1] is entry.root else None
    # opcode -> may share a buffer (fusions only when one updates a buffer in place)
    union_ops = _UNION_OPS if inplace or rebuilds else _UNION_OPS - {"fusion"}
    unions: dict[str, bool] = {}
    for cname in comps:
        comp = module.computations[cname]
        by_name = comp.by_name
        for instr in comp.instructions:
            op = instr.opcode
            aliases = unions.get(op)
            if not aliases:
                if aliases is not None:
                    continue  # (parameters, constants, arithmetic...: a buffer of their own)
                aliases = unions[op] = op in union_ops or op.endswith("-done")
                if not aliases:
                    continue
            name = instr.name
            if op in ALIAS_LEAFWISE and instr.operands:
                B.union_leaves(cname, name, cname, instr.operands[0], instr.shape.num_leaves)
            elif op == "get-tuple-element":
                src = by_name[instr.operands[0]]
                # leaf_position(shape, (index,))
                off = src.shape.leaf_offsets[instr.tuple_index]
                n = instr.shape.num_leaves
                if n == 1:  # (B.union, inline: one per tuple element of a module)
                    a, b = (cname, name, 0), (cname, src.name, off)
                    if a in parent:
                        a = find(a)
                    if b in parent:
                        b = find(b)
                    if a != b:
                        parent[a] = b
                else:
                    B.union_leaves(cname, name, cname, src.name, n, 0, off)
            elif op == "tuple":
                if instr is skip_root:
                    continue
                k = 0
                for o in instr.operands:
                    n = by_name[o].shape.num_leaves
                    if n == 1:  # (B.union, inline)
                        a, b = (cname, name, k), (cname, o, 0)
                        if a in parent:
                            a = find(a)
                        pb = parent.get(b)
                        if pb is not None:
                            b = pb if pb not in parent else find(b)
                        if a != b:
                            parent[a] = b
                    else:
                        B.union_leaves(cname, name, cname, o, n, k, 0)
                    k += n
            elif op == "while":
                body = module.computations[instr.attrs["body"].strip().lstrip("%")]
                cond = module.computations[instr.attrs["condition"].strip().lstrip("%")]
                n = instr.shape.num_leaves
                B.union_leaves(cname, name, cname, instr.operands[0], n)
                for c in (body, cond):
                    if c.parameters:
                        B.union_leaves(cname, name, c.name, c.parameters[0].name, n)
                B.union_leaves(cname, name, body.name, body.root.name, n)
            elif op in ("call", "async-start"):
                for callee in instr.called_computations:
                    c = module.computations[callee]
                    for p in c.parameters:
                        k = p.parameter_number
                        if k is not None and k < len(instr.operands):
                            B.union_leaves(c.name, p.name, cname, instr.operands[k], p.shape.num_leaves)
                    if op == "call":
                        B.union_leaves(cname, name, c.name, c.root.name, instr.shape.num_leaves)
                    elif instr.shape.is_tuple and len(instr.shape.tuple_shapes) > 1:
                        off = leaf_position(instr.shape, (1,))
                        B.union_leaves(cname, name, c.name, c.root.name, c.root.shape.num_leaves, off)
            elif op == "conditional":
                for b, callee in enumerate(instr.called_computations):
                    c = module.computations[callee]
                    if c.parameters and b + 1 < len(instr.operands):
                        B.union_leaves(c.name, c.parameters[0].name, cname, instr.operands[b + 1],
                                       c.parameters[0].shape.num_leaves)
                    B.union_leaves(cname, name, c.name, c.root.name, instr.shape.num_leaves)
            elif op == "dynamic-update-slice" and instr.operands:
                B.union((cname, name, 0), (cname, instr.operands[0], 0))
            elif op == "scatter" and instr.operands:
                n_in = (len(instr.operands) - 1) // 2
                for k in range(n_in):
                    B.union((cname, name, k if n_in > 1 else 0), (cname, instr.operands[k], 0))
            elif op.endswith("-done") and instr.operands:
                start = comp.by_name.get(instr.operands[0])
                while start is not None and start.opcode.endswith("-update") and start.operands:
                    start = comp.by_name.get(start.operands[0])
                if start is None:
                    continue
                if start.opcode in NATIVE_STARTS or not start.shape.is_tuple:
                    continue  # the start's writes are indexed by the done (see _write_key)
                idx = (0,) if start.opcode == "copy-start" else (1,)
                if len(start.shape.tuple_shapes) > idx[0]:
                    off = leaf_position(start.shape, idx)
                    B.union_leaves(cname, name, cname, start.name, instr.shape.num_leaves, 0, off)
            elif op == "fusion" and rebuilds and (cname, name) in rebuilds:
                B.union((cname, name, 0), (cname, instr.operands[rebuilds[(cname, name)]], 0))
            elif op == "fusion" and (cname, name) in inplace:
                _union_inplace_fusion(module, B, comp, instr)
    return skip_root is not None


def _union_inplace_fusion(module: Module, B: Buffers, comp: Computation, instr: Instruction) -> None:
    """A fusion whose root (tuple element) is an in-place dynamic-update-slice / scatter of
    a fusion parameter writes into that operand's buffer (passes/traffic.py's rule)."""
    fused = module.computations.get(instr.called_computations[0]) if instr.called_computations else None
    if fused is None:
        return
    root = fused.root
    leaves = ([(k, fused.by_name[o]) for k, o in enumerate(root.operands)] if root.opcode == "tuple"
              else [(None, root)])
    for k, leaf in leaves:
        p = through_bitcast(fused, leaf)
        if p.opcode not in ("dynamic-update-slice", "scatter") or not p.operands:
            continue
        buf = through_bitcast(fused, fused.by_name[p.operands[0]])
        if buf.opcode != "parameter" or buf.shape.byte_size != p.shape.byte_size:
            continue
        n = buf.parameter_number
        if n is None or n >= len(instr.operands):
            continue
        pos = 0 if k is None else leaf_position(instr.shape, (k,))
        B.union((comp.name, instr.name, pos), (comp.name, instr.operands[n], 0))


def write_key(instr: Instruction, comp: Computation, index: tuple[int, ...]):
    """The value leaf a write of ``instr`` at ``index`` fills, and that leaf's shape."""
    target = instr
    if instr.opcode in NATIVE_STARTS:
        done = [u for u in comp.users(instr.name) if u.opcode.endswith("-done")]
        if done:
            target = done[0]
            if index and index[0] == 1 and instr.opcode in _OPERAND_RESULT_STARTS:
                index = index[1:]  # traffic indexes these into the start's result element
    shape = target.shape
    if not shape.is_tuple:
        return (comp.name, target.name, 0), shape
    try:
        return (comp.name, target.name, leaf_position(shape, index)), shape.subshape(index)
    except (IndexError, KeyError, AttributeError):
        return (comp.name, target.name, 0), None


def gathered_leaves(instr: Instruction, comp: Computation) -> list[tuple[tuple, object]]:
    """(value leaf, shape) of each array an all-gather row writes: its result (``write_key``),
    or each result of a combined all-gather (XLA:GPU's ``AllGatherCombiner``: one
    ``all-gather`` / ``all-gather-start`` of several operands, a tuple of results, read by the
    ``all-gather-done``'s users one element each); [] where the result is no such array."""
    key, leaf = write_key(instr, comp, ())
    if leaf is not None and leaf.is_array:
        return [(key, leaf)]
    if instr.opcode not in ("all-gather", "all-gather-start"):
        return []
    target = instr
    if instr.opcode == "all-gather-start":
        done = [u for u in comp.users(instr.name) if u.opcode == "all-gather-done"]
        if not done:
            return []
        target = done[0]
    shape = target.shape
    if not shape.is_tuple:
        return [((comp.name, target.name, 0), shape)] if shape.is_array else []
    out = []
    for j, e in enumerate(shape.tuple_shapes):
        if not e.is_array:
            return []
        out.append(((comp.name, target.name, leaf_position(shape, (j,))), e))
    return out


def resolve_copy(droot: tuple, copies: dict, param_root: dict) -> tuple | None:
    """(origin root, width num, den, kind, row) of the copy kernel writing ``droot``: its
    source followed through the copies it is one of (``copies``: droot -> (source root,
    result bits, source bits, kind, row, takes a window)); None for a window copied out of a
    buffer that is no parameter and no copy of one."""
    sroot, n, dd, kind, row, sliced = copies[droot]
    if sroot not in copies:  # a copy of a buffer that is no copy: the chain below, of one link
        return None if sliced and sroot not in param_root else (sroot, n, dd, kind, row)
    chain = []
    d = droot
    seen = set()
    while d in copies and d not in seen and len(chain) < 10_000:
        seen.add(d)
        chain.append((d, *copies[d]))
        d = copies[d][0]
    # from the far end: a copy that is dropped (a window of no parameter) is the origin of
    # the copies made of it
    origin, num, den, kept = d, 1, 1, True
    for d, _sroot, n, dd, _kind, _row, sliced in reversed(chain):
        num, den = num * n, den * dd
        kept = not sliced or origin in param_root
        if not kept:
            origin, num, den = d, 1, 1
    if not kept:
        return None
    _d, _s, _n, _dd, kind, row, _sl = chain[0]
    return origin, num, den, kind, row
