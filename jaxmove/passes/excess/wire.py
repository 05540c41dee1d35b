"""The excess rules of dots' tiling and of collectives (``tiling_re_read``,
``collective_wider_than_data``, ``all_gather_partly_used``): bytes the accounting of
``compulsory.py`` does not see in the traffic pass's accesses (the tiling model's re-reads,
passes/reuse.py; wire bytes, passes/collectives.py). ``acc`` is the running ``Accounting``.
"""

from __future__ import annotations

from ...errors import Unmodeled
from ...hlo import Computation, Instruction, Module
from ..collectives import link_bandwidth_bytes_per_s
from ..roles import _trace_to_parameter
from .buffers import gathered_leaves
from .kernels import copy_kind, through_bitcast
from .ledger import HBM_READ


def tiling_excess(acc, k: int, r, ru) -> None:
    """``tiling_re_read`` of row ``k`` (``ru``: its reuse row): the tiling model's extra operand
    reads, split between the dot operands' roles in proportion to each one's re-reads."""
    comp = acc.module.computations[r.computation]
    count = r.multiplicity.count
    for t in ru.tilings:
        extra = t.extra_read_bytes * count
        if extra <= 0:
            continue
        lhs = t.lhs_bytes * max(0, t.lhs_passes - 1)
        rhs = t.rhs_bytes * max(0, t.rhs_passes - 1)
        ops = _dot_operand_roles(acc, r.instr, comp, t.instruction)
        shares = [(ops[0], lhs), (ops[1], rhs)] if lhs + rhs else [(ops[0], 1)]
        tot = sum(s for _r, s in shares) or 1
        done = 0
        for i, (role, s) in enumerate(shares):
            b = extra - done if i == len(shares) - 1 else extra * s // tot
            done += b
            if b:
                acc.ledger.add(role, HBM_READ, b, 0, b, "tiling_re_read", "", k)


def _dot_operand_roles(acc, instr: Instruction, comp: Computation, dot_name: str) -> tuple[str, str]:
    roles = acc.roles
    out = []
    if instr.opcode != "fusion":
        for o in instr.operands[:2]:
            rl = roles.get((comp.name, o))
            out.append(rl[0] if rl else "activations")
    else:
        fused = acc.module.computations.get(instr.called_computations[0])
        dot = _find_fused(acc.module, fused, dot_name) if fused is not None else None
        if dot is not None:
            dcomp, d = dot
            for o in d.operands[:2]:
                kk = _trace_to_parameter(acc.module, dcomp, dcomp.by_name[o]) if dcomp is fused else None
                rl = roles.get((comp.name, instr.operands[kk])) if kk is not None and kk < len(instr.operands) else None
                out.append(rl[0] if rl else "activations")
    while len(out) < 2:
        out.append("activations")
    return out[0], out[1]


def collective_excess(acc, k: int, r, read_units: dict) -> None:
    """Compulsory wire bytes of row ``k``'s collective, and its ``collective_wider_than_data`` /
    ``all_gather_partly_used`` excess (``read_units``: buffer root -> data bytes its readers
    touch)."""
    c = r.collective
    count = r.multiplicity.count
    wire = c.wire_bytes * count
    if wire <= 0:
        return
    comp = acc.module.computations[r.computation]
    instr = r.instr
    compulsory = wire
    parts: list[tuple[str, int]] = []
    # wider than the data: operands converted from a narrower float just to be sent
    narrow = _narrow_source_bits(acc, instr, comp)
    if narrow is not None:
        wide_bits, narrow_bits = narrow
        keep = wire * narrow_bits // wide_bits
        parts.append(("collective_wider_than_data", compulsory - keep))
        compulsory = keep
    if c.kind == "all-gather":
        leaves = gathered_leaves(instr, comp)  # (several for a combined all-gather)
        if leaves:
            size = used = 0
            out_root = acc.out_root
            for key, leaf in leaves:  # (each leaf's wire bytes are its share of the result's)
                leaf_size = leaf.logical_byte_size * count
                size += leaf_size
                root = acc.buffers.find(key)
                # (a result of the program is used whole: the caller gets all of it)
                used += leaf_size if root in out_root else min(leaf_size, read_units.get(root, 0))
            if used < size:
                keep = compulsory * used // size if size else compulsory
                parts.append(("all_gather_partly_used", compulsory - keep))
                compulsory = keep
    s_per_byte = None
    if acc.spec is not None:
        try:
            bw = link_bandwidth_bytes_per_s(c, acc.spec)
        except (AttributeError, ValueError, KeyError, TypeError, Unmodeled):
            bw = None
        s_per_byte = 1.0 / bw if bw else None
    acc.ledger.add_wire("device_to_device", wire, compulsory, parts, k, s_per_byte)


def _narrow_source_bits(acc, instr: Instruction, comp: Computation) -> tuple[int, int] | None:
    """(wide bits, narrow bits) when an operand of ``instr`` is a narrower float converted to be
    sent, else None."""
    for o in instr.operands:
        src = comp.by_name.get(o)
        if src is None or not src.shape.is_array:
            continue
        src = through_bitcast(comp, src)
        inner = None
        if src.opcode == "convert" and src.operands:
            inner = comp.by_name.get(src.operands[0])
        elif src.opcode == "fusion":
            ck = copy_kind(src, comp, acc.module)
            if ck is not None and ck[0] == "dtype_conversion":
                inner = comp.by_name.get(src.operands[ck[1]])
        if inner is not None and inner.shape.is_array and inner.shape.element_type.startswith(("bf", "f")) \
                and src.shape.element_type.startswith("f") \
                and inner.shape.element_bits < src.shape.element_bits:
            return src.shape.element_bits, inner.shape.element_bits
    return None


def _find_fused(module: Module, fused: Computation, name: str):
    for c in [fused]:
        i = c.by_name.get(name)
        if i is not None:
            return c, i
    return None
