"""Structurally identical computations: one class per shape of computation, so that what is
derived from a computation alone (its checks, and what the passes infer from a fused
computation) is derived once per class instead of once per copy.

A model's unrolled layers print the same fused computations again and again under other
names (``%fused_computation.18`` and ``.26`` differ only in their instructions' names). Two
computations are in one class when their instructions agree one to one, in order, on
everything but their names: opcode, result shape (the same ``Shape`` object: the parser
shares one per distinct shape text), attributes (their text, which names the computations
they call: callees must be the very same), literal, parameter number, operands (by position
in the computation) and which one is the root; and the computations run on the same
execution thread. Whatever follows from a computation and the computations it calls alone is
then the same for every member, up to the names it mentions.

A computation's class is named by its first member in the module's order. A computation
whose coarse shape (instruction count, root opcode and shape, parameter count) no other
computation has is its own class without being compared, so a module of unique computations
pays one tuple and one dict lookup each.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter

from .ir import Computation, Module

_name = attrgetter("name")
_operands = attrgetter("operands")
_shape = attrgetter("shape")
_attrs = attrgetter("_attrs")
_row = attrgetter("opcode", "_attr_text", "literal", "parameter_number")


def signature(comp: Computation) -> tuple | None:
    """Everything of ``comp`` but its names (module docstring), as one hashable tuple; None
    when an operand names no instruction of ``comp`` (malformed: hlo/validate.py reports it)."""
    instrs = comp.instructions
    pos = dict(zip(map(_name, instrs), range(len(instrs))))
    ops = list(map(_operands, instrs))
    given = ()
    if any(map(_attrs, instrs)):  # attributes held as a dict without the fast path's text
        given = tuple((k, tuple(i._attrs.items())) for k, i in enumerate(instrs)
                      if i._attr_text is None and i._attrs)
    try:
        positions = tuple(map(pos.__getitem__, chain.from_iterable(ops)))
        root = pos[comp.root.name]
    except KeyError:
        return None
    return (tuple(map(_row, instrs)), tuple(map(id, map(_shape, instrs))), tuple(map(len, ops)),
            positions, root, given, comp.execution_thread)


def structural_classes(module: Module) -> dict[str, str]:
    """Computation name -> the name of the first computation of ``module`` (in order) that is
    structurally identical to it (module docstring), possibly itself."""
    out: dict[str, str] = {}
    coarse_first: dict[tuple, str] = {}  # coarse shape -> its first computation, until signed
    by_signature: dict[tuple, str] = {}
    computations = module.computations
    clones = getattr(module, "clones", None) or {}  # (a module pickled before it had them)
    for name, comp in computations.items():
        src = clones.get(name)
        if src is not None and computations[src].execution_thread == comp.execution_thread:
            out[name] = out[src]  # its instructions are src's, renamed (hlo/clones.py)
            continue
        root = comp.root
        coarse = (len(comp.instructions), root.opcode, id(root.shape), len(comp.parameters))
        first = coarse_first.get(coarse)
        if first is None:  # the first of its coarse shape: its own class, not compared yet
            coarse_first[coarse] = name
            out[name] = name
            continue
        if first:  # a second computation of this coarse shape: the first is signed now
            coarse_first[coarse] = ""
            sig = signature(computations[first])
            if sig is not None:
                by_signature[sig] = first
        sig = signature(comp)
        out[name] = name if sig is None else by_signature.setdefault(sig, name)
    return out
