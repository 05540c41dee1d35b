"""Trip counts of while loops: ``known_trip_count``, or derived from the induction variable.

XLA's ``WhileLoopTripCountAnnotator`` writes ``known_trip_count`` into a while's
backend_config, but XLA:TPU programs often carry none (the annotation is lost when later
passes rewrite the loop). jaxmove then derives the count as XLA's while-loop analysis does
(xla/service/while_loop_analysis.cc: ``GetLoopInductionVarTupleIdx``,
``MatchTrivialLoopTripCount``, ``ComputeWhileLoopTripCount``):

* the condition's root is a ``compare`` (possibly inside a fusion, through copies and
  bitcasts) of one element ``k`` of the loop state with a constant, or with a loop-invariant
  state element whose initial value is a constant;
* the body's result element ``k`` is element ``k`` of its parameter plus (or minus) a
  constant step, through get-tuple-element / tuple, copies, bitcasts, converts and fusions
  (XLA:TPU moves the counter to SMEM with a ``copy`` and adds the step in a fusion);
* the while's operand element ``k`` is a constant (through tuple, copies and bitcasts):
  the initial value.

The count is then closed-form: with init ``a``, step ``s`` and bound ``b``,
``LT``: ``ceil((b - a) / s)``, ``LE``: ``floor((b - a) / s) + 1``, ``GT``/``GE`` the same
for a decreasing counter, ``NE``: ``(b - a) / s`` when ``s`` divides it, ``EQ``: 1; 0 when
the condition fails on the initial value. A counter that moves away from its bound (the
loop would run until the integer wraps), or whose values on the way would leave its integer
type (``s32``: init 2147483600, step 10, ``< 2147483647`` wraps after 2147483640), is *not*
derived. E.g. ``i = 0; while i < 4:
i += 2`` runs 2 trips. Anything else is reported with the reason it could not be derived;
such a body is counted once (and flagged), never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hlo import Computation, Instruction, Module
from .memo import memo_of

__all__ = ["TripCount", "trip_count"]

# Opcodes that pass their (first) operand's value through unchanged, for integer scalars.
_PASS_THROUGH = frozenset({"copy", "bitcast", "reshape", "convert", "optimization-barrier"})
_SWAP = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ", "NE": "NE"}
_MAX_DEPTH = 64  # operand hops followed per value (XLA's loops need a handful)
_INT_TYPES = frozenset({"s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64"})


@dataclass(frozen=True, slots=True)
class TripCount:
    """Trip count of one while loop.

    Attributes:
      n: body executions per execution of the while, or None when unknown.
      source: ``"known_trip_count"`` (backend_config), ``"derived"`` (induction variable)
        or ``"unknown"``.
      detail: how it was derived (``"element 0: init 0, step 2, while < 4"``) or why not.
    """

    n: int | None
    source: str
    detail: str = ""


class _NotDerived(Exception):
    """The loop does not have the pattern; the message says why."""


# Resolved values: ("c", int) a constant; ("v", k, off) loop-state element k (None: the
# whole, non-tuple state) plus off.
def _literal_int(instr: Instruction) -> int | None:
    text = (instr.literal or "").strip()
    if instr.shape.dims or instr.shape.element_type not in _INT_TYPES:
        return None
    try:
        return int(text)
    except ValueError:
        return None


class _Resolver:
    """Follows a scalar value back to a constant or to a loop-state element plus a constant."""

    def __init__(self, module: Module, loop_comp: str | None):
        self.module = module
        self.loop_comp = loop_comp  # its parameter(0) is the loop state; None: no loop level

    def resolve(self, comp: Computation, name: str, binding, path: tuple[int, ...] = (),
                depth: int = 0):
        """``binding``: (outer computation, fusion instruction, outer binding) when ``comp``
        is a fused computation, else None. ``path``: tuple indices still to apply."""
        if depth > _MAX_DEPTH:
            return None
        instr = comp.by_name.get(name)
        if instr is None:
            return None
        op = instr.opcode
        nxt = depth + 1
        if op == "parameter":
            if binding is not None:
                outer, fusion, outer_binding = binding
                k = instr.parameter_number or 0
                if k >= len(fusion.operands):
                    return None
                return self.resolve(outer, fusion.operands[k], outer_binding, path, nxt)
            if comp.name != self.loop_comp:
                return None
            if path == ():
                return ("v", None, 0)
            if len(path) == 1:
                return ("v", path[0], 0)
            return None
        if op == "get-tuple-element":
            return self.resolve(comp, instr.operands[0], binding, (instr.tuple_index or 0,) + path, nxt)
        if op == "tuple":
            if not path or path[0] >= len(instr.operands):
                return None
            return self.resolve(comp, instr.operands[path[0]], binding, path[1:], nxt)
        if op in _PASS_THROUGH and instr.operands:
            return self.resolve(comp, instr.operands[0], binding, path, nxt)
        if op == "fusion" and instr.called_computations:
            fused = self.module.computations.get(instr.called_computations[0])
            if fused is None:
                return None
            return self.resolve(fused, fused.root.name, (comp, instr, binding), path, nxt)
        if path:
            return None
        if op == "constant":
            v = _literal_int(instr)
            return None if v is None else ("c", v)
        if op in ("add", "subtract", "multiply") and len(instr.operands) == 2:
            a = self.resolve(comp, instr.operands[0], binding, (), nxt)
            b = self.resolve(comp, instr.operands[1], binding, (), nxt)
            if a is None or b is None:
                return None
            if a[0] == "c" and b[0] == "c":
                x, y = a[1], b[1]
                return ("c", x + y if op == "add" else x - y if op == "subtract" else x * y)
            if op == "add" and a[0] == "v" and b[0] == "c":
                return ("v", a[1], a[2] + b[1])
            if op == "add" and a[0] == "c" and b[0] == "v":
                return ("v", b[1], b[2] + a[1])
            if op == "subtract" and a[0] == "v" and b[0] == "c":
                return ("v", a[1], a[2] - b[1])
        return None

    def find_compare(self, comp: Computation, name: str, binding, depth: int = 0):
        """The compare that produces ``name`` (through fusions, copies, bitcasts), with its
        computation and binding, or None."""
        if depth > _MAX_DEPTH:
            return None
        instr = comp.by_name.get(name)
        if instr is None:
            return None
        if instr.opcode == "compare" and len(instr.operands) == 2:
            return instr, comp, binding
        if instr.opcode in ("copy", "bitcast", "reshape") and instr.operands:
            return self.find_compare(comp, instr.operands[0], binding, depth + 1)
        if instr.opcode == "fusion" and instr.called_computations:
            fused = self.module.computations.get(instr.called_computations[0])
            if fused is not None:
                return self.find_compare(fused, fused.root.name, (comp, instr, binding), depth + 1)
        return None


def _count(init: int, step: int, direction: str, bound: int) -> int | None:
    """Trips of ``i = init; while i <direction> bound: i += step`` (None: never ends)."""
    holds = {"LT": init < bound, "LE": init <= bound, "GT": init > bound, "GE": init >= bound,
             "EQ": init == bound, "NE": init != bound}[direction]
    if not holds:
        return 0
    if direction == "EQ":
        return 1
    if direction == "NE":
        d = bound - init
        return d // step if d % step == 0 and d // step > 0 else None
    if direction in ("LT", "LE"):
        if step <= 0:
            return None
        return -(-(bound - init) // step) if direction == "LT" else (bound - init) // step + 1
    if step >= 0:
        return None
    return -(-(init - bound) // -step) if direction == "GT" else (init - bound) // -step + 1


def _derive(module: Module, comp: Computation, instr: Instruction) -> TripCount:
    comps = module.computations
    cond = comps.get(instr.attrs.get("condition", "").strip().lstrip("%"))
    body = comps.get(instr.attrs.get("body", "").strip().lstrip("%"))
    if cond is None or body is None or not instr.operands:
        raise _NotDerived("the loop's condition or body is missing")
    cr = _Resolver(module, cond.name)
    found = cr.find_compare(cond, cond.root.name, None)
    if found is None:
        raise _NotDerived(f"its condition's root '{cond.root.name}' is not a comparison")
    cmp_instr, cmp_comp, cmp_binding = found
    direction = cmp_instr.attrs.get("direction", "").strip()
    if direction not in _SWAP:
        raise _NotDerived(f"comparison '{cmp_instr.name}' has direction {direction!r}")
    lhs = cr.resolve(cmp_comp, cmp_instr.operands[0], cmp_binding)
    rhs = cr.resolve(cmp_comp, cmp_instr.operands[1], cmp_binding)
    br = _Resolver(module, body.name)
    ir = _Resolver(module, None)

    def init_of(k):
        v = ir.resolve(comp, instr.operands[0], None, () if k is None else (k,))
        return v[1] if v is not None and v[0] == "c" else None

    def invariant_constant(side):
        """A loop-state element the body passes through unchanged, with a constant init."""
        if side is None or side[0] != "v":
            return None
        k = side[1]
        upd = br.resolve(body, body.root.name, None, () if k is None else (k,))
        if upd != ("v", k, 0):
            return None
        a = init_of(k)
        return None if a is None else ("c", a + side[2])

    # the induction variable: the side the body steps by a nonzero constant
    candidates = []
    for var, other, d in ((lhs, rhs, direction), (rhs, lhs, _SWAP[direction])):
        if var is None or var[0] != "v":
            continue
        k = var[1]
        upd = br.resolve(body, body.root.name, None, () if k is None else (k,))
        if upd is None or upd[0] != "v" or upd[1] != k or upd[2] == 0:
            continue
        bound = other if other is not None and other[0] == "c" else invariant_constant(other)
        if bound is None:
            continue
        candidates.append((k, var[2], upd[2], d, bound[1]))
    if not candidates:
        if (lhs is None or lhs[0] != "v") and (rhs is None or rhs[0] != "v"):
            raise _NotDerived(f"comparison '{cmp_instr.name}' does not compare a loop-state element")
        raise _NotDerived(f"no loop-state element that comparison '{cmp_instr.name}' tests is "
                          "stepped by a constant in the body and compared with a constant")
    k, off, step, d, bound = candidates[0]
    where = "the loop state" if k is None else f"loop-state element {k}"
    state = cond.parameters[0].shape if cond.parameters else None
    leaf = state if k is None else (state.tuple_shapes[k] if state is not None and state.is_tuple
                                    and k < len(state.tuple_shapes) else None)
    if leaf is None or leaf.element_type not in _INT_TYPES:
        raise _NotDerived(f"{where} is not an integer counter")
    init = init_of(k)
    if init is None:
        raise _NotDerived(f"the initial value of {where} (the counter) is not a constant")
    # the condition tests counter + off <d> bound, i.e. counter <d> bound - off
    n = _count(init, step, d, bound - off)
    sym = {"LT": "<", "LE": "<=", "GT": ">", "GE": ">=", "EQ": "==", "NE": "!="}[d]
    how = f"{where}: init {init}, step {step:+d}, while {'counter' if not off else f'counter{off:+d}'} {sym} {bound}"
    if n is None:
        raise _NotDerived(f"{how}: the counter never reaches the bound (it would wrap)")
    # the counter steps from init to init + n*step (the value that ends the loop), each value
    # (and counter + off, what the condition compares) in the counter's integer type: a value
    # outside it wraps in XLA's arithmetic, and the loop does not end where the closed form says
    bits = int(leaf.element_type[1:])
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if leaf.element_type[0] == "s" else (0, 2 ** bits - 1)
    last = init + n * step
    if not all(lo <= v <= hi for v in (init, last, init + off, last + off)):
        raise _NotDerived(f"{how}: the counter would overflow {leaf.element_type} (it reaches {last}) "
                          "and wrap before the loop ends")
    return TripCount(n, "derived", how)


def trip_count(instr: Instruction, module: Module | None = None) -> TripCount:
    """The trip count of while ``instr``: ``known_trip_count`` when XLA wrote one, else
    derived from its induction variable (module docstring) when ``module`` is given.
    Memoized per module. Never raises for a malformed loop: it is ``unknown`` with a reason."""
    n = instr.known_trip_count
    if module is None:
        if n is not None:
            return TripCount(n, "known_trip_count")
        return TripCount(None, "unknown", "no known_trip_count (and no module to derive it from)")
    memo = memo_of(module).trip_counts
    key = (instr.computation, instr.name)
    tc = memo.get(key)
    if tc is None:
        comp = module.computations.get(instr.computation)
        if comp is None or comp.by_name.get(instr.name) is not instr:
            if n is not None:
                return TripCount(n, "known_trip_count")
            return TripCount(None, "unknown", "the while is not in the module")
        try:
            tc = _derive(module, comp, instr)
        except _NotDerived as e:
            tc = TripCount(None, "unknown", f"no known_trip_count, and not derived: {e}")
        if n is not None:
            # XLA's annotation is kept; a loop condition that says otherwise is reported
            # (``loop_notes``): a hand-edited or inconsistent dump
            clash = (f"its loop condition gives {tc.n} ({tc.detail})"
                     if tc.source == "derived" and tc.n != n else "")
            tc = TripCount(n, "known_trip_count", clash)
        memo[key] = tc
    return tc
