"""Table lookups: a kernel that uses one of its operands only as the table of a lookup (an
embedding: ``gather`` or ``dynamic-slice`` of rows, or a dot with a one-hot operand), and the
elements those lookups touch.

The compulsory footprint of a lookup of a weight table is the rows it gathers (tokens x d_model
x width), not the table (DESIGN.md, "Compulsory and excess": "each input's needed footprint").
The traffic pass already counts a gather that reads its table from HBM at the rows it touches
(``passes/traffic.py``); two shapes of program read more, and ``compulsory.py`` charges the rest
of that read to ``whole_table_read`` (``causes.py``):

* XLA:TPU copies the whole local table shard into VMEM (a layout change: a table sharded over
  d_model is stored vocab-minor, ``bf16[1024,64]{0,1}``, and the gather wants rows contiguous)
  and gathers the rows from the on-chip copy;
* a one-hot matmul (``one_hot(tokens, V) @ table``, T5X / MaxText's iota embedding) reads every
  row to keep the T rows the one-hot selects: ``dot(compare(iota, broadcast(ids), EQ), table)``
  (XLA:TPU: a ``convolution`` of an ``iota_compare_fusion`` with the table, prefetched whole
  into VMEM by a ``copy-start``).

Pure functions of an instruction, its operand number and the module.
"""

from __future__ import annotations

from ...hlo import Computation, Instruction, Module

#: ops whose operand 0 is a table read for the elements of the result
LOOKUP_OPS = frozenset({"gather", "dynamic-slice"})
# ops that pass the table (or the one-hot mask) through, element for element
_TABLE_CHAIN = frozenset({"bitcast", "copy", "convert", "reshape", "transpose", "bitcast-convert"})
_MASK_CHAIN = _TABLE_CHAIN | {"broadcast"}
# a matmul of the table with a one-hot mask (XLA:TPU writes a dot as a convolution, dim_labels bf_io->bf)
_MATMUL_OPS = frozenset({"dot", "convolution"})
_MAX_STEPS = 64  # a lookup is a short chain; longer walks are no lookup


def table_lookup(instr: Instruction, operand: int, module: Module) -> int | None:
    """Elements of operand ``operand`` of kernel ``instr`` that its lookups touch per
    execution, when the kernel uses that operand only as the table of lookups (``gather`` /
    ``dynamic-slice`` operand 0, or a dot whose other operand is one-hot, through bitcast /
    copy / convert / reshape / transpose and nested fusions); None when any use is no lookup.
    A one-hot dot touches as many table elements as its result has (T rows of d_model)."""
    op = instr.opcode
    if op in LOOKUP_OPS:
        return instr.shape.num_elements if operand == 0 and instr.shape.is_array else None
    if op != "fusion" or not instr.called_computations:
        return None
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return None
    return _fused_lookup(fused, operand, module, 0)


def _fused_lookup(fused: Computation, operand: int, module: Module, depth: int) -> int | None:
    param = next((p for p in fused.parameters if p.parameter_number == operand), None)
    if param is None or depth > 8:
        return None
    elems = 0
    stack = [param]
    steps = 0
    while stack:
        cur = stack.pop()
        users = fused.users(cur.name)
        if not users:
            if cur is fused.root or cur is param:
                return None  # the table (or a copy of it) is the result: no lookup
            continue
        for u in users:
            steps += 1
            if steps > _MAX_STEPS:
                return None
            uop = u.opcode
            if uop in _TABLE_CHAIN:
                if u is fused.root:
                    return None
                stack.append(u)
            elif uop in LOOKUP_OPS:
                if u.operands[0] != cur.name or cur.name in u.operands[1:] or not u.shape.is_array:
                    return None  # the table used as an index
                elems += u.shape.num_elements
            elif uop in _MATMUL_OPS and len(u.operands) == 2 and u.operands[0] != u.operands[1]:
                other = u.operands[1] if u.operands[0] == cur.name else u.operands[0]
                if not u.shape.is_array or not _is_one_hot(fused, fused.by_name.get(other), module):
                    return None
                elems += u.shape.num_elements
            elif uop == "fusion" and u.called_computations:
                inner = module.computations.get(u.called_computations[0])
                if inner is None:
                    return None
                if len(u.operands) == 1 and _passes_through(inner):
                    if u is fused.root:
                        return None
                    stack.append(u)  # a nested fusion that only re-lays the table (a bitcast)
                    continue
                for k, o in enumerate(u.operands):
                    if o == cur.name:
                        got = _fused_lookup(inner, k, module, depth + 1)
                        if got is None:
                            return None
                        elems += got
            else:
                return None
    return elems


def _passes_through(comp: Computation) -> bool:
    """``comp``'s root is its parameter through ``_TABLE_CHAIN`` ops only (XLA:TPU's nested
    ``bitcast_fusion`` of a table read from VMEM)."""
    instr = comp.root
    for _ in range(_MAX_STEPS):
        if instr is None:
            return False
        if instr.opcode == "parameter":
            return True
        if instr.opcode not in _TABLE_CHAIN or not instr.operands:
            return False
        instr = comp.by_name.get(instr.operands[0])
    return False


def _is_one_hot(comp: Computation, instr: Instruction | None, module: Module, depth: int = 0) -> bool:
    """``instr`` is a one-hot mask: ``compare(iota, ids, EQ)`` (or ``select`` on one), through
    convert / bitcast / reshape / transpose / broadcast, and through a nested fusion computing it
    (XLA:TPU's ``iota_compare_fusion``)."""
    for _ in range(_MAX_STEPS):
        if instr is None:
            return False
        op = instr.opcode
        if op in _MASK_CHAIN and instr.operands:
            instr = comp.by_name.get(instr.operands[0])
            continue
        if op == "fusion" and instr.called_computations and depth < 8:
            inner = module.computations.get(instr.called_computations[0])
            return inner is not None and _is_one_hot(inner, inner.root, module, depth + 1)
        if op == "select" and instr.operands:
            instr = comp.by_name.get(instr.operands[0])
            continue
        if op != "compare" or len(instr.operands) != 2 or instr.attrs.get("direction") != "EQ":
            return False
        sides = [_base(comp, comp.by_name.get(o)) for o in instr.operands]
        return sum(1 for s in sides if s is not None and s.opcode == "iota") == 1
    return False


def _base(comp: Computation, instr: Instruction | None) -> Instruction | None:
    """``instr`` through the ops that only move or broadcast its elements."""
    for _ in range(_MAX_STEPS):
        if instr is None or instr.opcode not in _MASK_CHAIN or not instr.operands:
            return instr
        instr = comp.by_name.get(instr.operands[0])
    return instr


# ops that keep a table's or an index's elements in order and value (a layout copy, a
# conversion): a transpose / reshape / bitcast would make the same lookup read other elements
_ORDER_CHAIN = frozenset({"copy", "convert"})
# the attributes that, with the indices, decide which rows a lookup reads
_LOOKUP_ATTRS = ("offset_dims", "collapsed_slice_dims", "start_index_map", "index_vector_dim",
                 "slice_sizes", "operand_batching_dims", "start_indices_batching_dims",
                 "dynamic_slice_sizes")


def lookup_rows(instr: Instruction, operand: int, module: Module) -> frozenset | None:
    """What decides the rows that kernel ``instr`` reads of its operand ``operand`` when it uses
    that operand only as the table of ``gather`` / ``dynamic-slice`` lookups (directly, or in the
    fusion it calls, through ``copy`` / ``convert`` only): one ``(opcode, attributes, index
    operands)`` per lookup, the index operands the kernel's operand numbers whose values are the
    indices (through ``copy`` / ``convert`` only); None when a use is no such lookup, the table
    or an index passes through an op that reorders elements (transpose, reshape, bitcast) or an
    index is computed in the kernel. Two kernels whose lookups have the same signatures, with
    the same values as indices, read the same rows (XLA:GPU fuses an embedding's gather into
    each of its consumers: the table's rows are read once per consumer, needed once); that the
    index operands hold the same values is the caller's to establish."""
    op = instr.opcode
    if op in LOOKUP_OPS:
        if operand != 0 or not instr.shape.is_array:
            return None
        return frozenset({(op, _lookup_attrs(instr), tuple(range(1, len(instr.operands))))})
    if op != "fusion" or not instr.called_computations:
        return None
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return None
    param = next((p for p in fused.parameters if p.parameter_number == operand), None)
    if param is None:
        return None
    out = set()
    stack = [param]
    steps = 0
    while stack:
        cur = stack.pop()
        users = fused.users(cur.name)
        if not users:
            return None  # (the table, or a copy of it, is the result)
        for u in users:
            steps += 1
            if steps > _MAX_STEPS:
                return None
            if u.opcode in _ORDER_CHAIN and u is not fused.root:
                stack.append(u)
            elif u.opcode in LOOKUP_OPS and u.shape.is_array and u.operands[0] == cur.name \
                    and cur.name not in u.operands[1:]:
                idx = []
                for o in u.operands[1:]:
                    src = _index_source(fused, fused.by_name.get(o))
                    if src is None:
                        return None
                    idx.append(src)
                out.add((u.opcode, _lookup_attrs(u), tuple(idx)))
            else:
                return None
    return frozenset(out) if out else None


def _lookup_attrs(instr: Instruction) -> tuple:
    a = instr.attrs
    return tuple(a.get(k) for k in _LOOKUP_ATTRS) + (tuple(instr.shape.dims),)


# ops whose result is a pure function of their operands and attributes (an index XLA computes
# in the kernel: jnp.take's wrap-around and clamp, ``select(lt(i, 0), i + n, i)``)
_PURE_INDEX_OPS = frozenset({"add", "subtract", "multiply", "divide", "remainder", "negate", "abs",
                             "minimum", "maximum", "clamp", "select", "compare", "and", "or", "xor",
                             "not", "shift-left", "shift-right-logical", "shift-right-arithmetic",
                             "broadcast", "reshape", "bitcast", "copy", "convert", "slice",
                             "concatenate", "transpose", "iota"})
_NOT_SEMANTIC = frozenset({"metadata", "backend_config", "frontend_attributes", "sharding",
                           "statistics_viz", "origin"})


def _index_source(comp: Computation, instr: Instruction | None, depth: int = 0):
    """What ``instr`` (an index) is, as a value: the parameter number of ``comp`` it is
    (through ``copy`` / a widening integer ``convert``), ``("constant", literal, shape)``, or an
    expression of those through pure ops (``_PURE_INDEX_OPS``: opcode, shape, attributes and the
    operands' expressions); None for anything else (a value the expression cannot name)."""
    for _ in range(_MAX_STEPS):
        if instr is None or depth > _MAX_STEPS:
            return None
        op = instr.opcode
        if op == "parameter":
            return instr.parameter_number
        if op == "constant":   # (an elided literal, ``{...}``, names no value)
            lit = instr.literal
            return ("constant", lit.strip(), str(instr.shape)) if lit is not None and "..." not in lit else None
        if op in _ORDER_CHAIN and len(instr.operands) == 1:
            src = comp.by_name.get(instr.operands[0])
            if op == "copy" or (src is not None and _widens(src.shape, instr.shape)):
                instr = src
                continue
        if op not in _PURE_INDEX_OPS:
            return None
        kids = []
        for o in instr.operands:
            got = _index_source(comp, comp.by_name.get(o), depth + 1)
            if got is None:
                return None
            kids.append(got)
        attrs = tuple(sorted((k, v) for k, v in instr.attrs.items() if k not in _NOT_SEMANTIC))
        return ("expr", op, str(instr.shape), attrs, tuple(kids))
    return None


def _widens(a, b) -> bool:
    """Integer ``a`` converts to integer ``b`` without losing a value (s32 -> s64, u8 -> s32)."""
    ta, tb = a.element_type, b.element_type
    if not (ta[:1] in "su" and tb[:1] in "su" and ta[1:].isdigit() and tb[1:].isdigit()):
        return False
    ba, bb = int(ta[1:]), int(tb[1:])
    if ta[0] == tb[0]:
        return bb >= ba
    return ta[0] == "u" and tb[0] == "s" and bb > ba
