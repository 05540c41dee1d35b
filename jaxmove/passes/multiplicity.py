"""Multiplicity: how many times each computation runs in one run of the program.

XLA's HloCostAnalysis walks a while body once ("for now compute the cost of a single
iteration", xla/service/hlo_cost_analysis.cc); jaxmove multiplies by the loop's trip count:
``known_trip_count`` (the while's backend_config, set by XLA's WhileLoopTripCountAnnotator),
or, where XLA wrote none (often on TPU), the count derived from the loop's induction variable
as XLA's while-loop analysis does (``passes/trip_count.py``).

Rules, applied from the ENTRY computation down the call graph:
  * while: body runs ``n`` times and condition ``n + 1`` times per execution of the
    while, with ``n`` its trip count; nested loops multiply. When the trip count is
    neither known nor derivable the body is counted once and the computation is flagged
    ``unknown_trip_count`` (``loop_notes`` says why, per loop).
  * conditional: every branch is reported with the conditional's multiplicity and
    flagged with the conditional that selects it (program totals take the max branch).
  * call / async-start ``calls``: the callee runs once per execution of the caller.
  * fusion ``calls``, and ``to_apply``/``scatter``/``select`` of reduce-like ops are part
    of their instruction's kernel; they are *not* kernel-level computations.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hlo import HloParseError, Instruction, Module
from ..hlo.opcodes import names
from .trip_count import TripCount, trip_count

MAX_EXECUTIONS = (1 << 63) - 1  # XLA counts in int64

# Opcodes whose called computations run as separate kernels (control flow).
CONTROL_FLOW_OPCODES = names(control_flow=True)  # hlo/opcodes.py


@dataclass(frozen=True, slots=True)
class Multiplicity:
    """Executions of one kernel-level computation per program run.

    Attributes:
      count: executions per program run (trip counts multiplied down the call chain).
      unknown_trip_count: some enclosing while has no known trip count (counted as 1).
      branch_of: (conditional instruction name, branch index) of the innermost enclosing
        conditional branch, or None.
    """

    count: int
    unknown_trip_count: bool = False
    branch_of: tuple[str, int] | None = None


def callee_counts(instr: Instruction, module: Module | None = None
                  ) -> list[tuple[str, int, bool, tuple[str, int] | None]]:
    """(callee, executions per execution of instr, trip count unknown, branch) for control flow.

    A while's count is its ``known_trip_count``, else (given ``module``) the count derived
    from its induction variable (``trip_count.trip_count``); without either, 1 and unknown.
    """
    op = instr.opcode
    if op == "while":
        n = trip_count(instr, module).n
        unknown = n is None
        n = 1 if n is None else n
        return [(instr.attrs["body"].lstrip("%"), n, unknown, None),
                (instr.attrs["condition"].lstrip("%"), n + 1, unknown, None)]
    if op == "conditional":
        return [(c, 1, False, (instr.name, i)) for i, c in enumerate(instr.called_computations)]
    if op in ("call", "async-start", "call-start"):
        return [(c, 1, False, None) for c in instr.called_computations]
    return []


def multiplicity_pass(module: Module) -> dict[str, Multiplicity]:
    """Kernel-level computation name -> Multiplicity, for every computation reachable from
    ENTRY through control flow (while, conditional, call, async-start).

    Computations reachable several ways (a body shared by two calls) sum their counts.
    """
    comps = module.computations
    # the control-flow call graph reachable from ENTRY: caller -> [(callee, k, unknown, branch, instr)]
    edges: dict[str, list] = {}
    stack = [module.entry.name]
    while stack:
        name = stack.pop()
        if name in edges:
            continue
        edges[name] = out_edges = []
        for instr in comps[name].instructions:
            if instr.opcode in CONTROL_FLOW_OPCODES:
                for callee, k, unknown, branch in callee_counts(instr, module):
                    out_edges.append((callee, k, unknown, branch, instr))
                    if callee not in edges:
                        stack.append(callee)
    # callers before callees (Kahn's algorithm; validation rejected call-graph cycles), so
    # a computation reached along several paths sums its counts without walking each path
    indegree = dict.fromkeys(edges, 0)
    for outs in edges.values():
        for callee, *_ in outs:
            indegree[callee] += 1
    out: dict[str, Multiplicity] = {module.entry.name: Multiplicity(1)}
    ready = [n for n, d in indegree.items() if d == 0]
    while ready:
        name = ready.pop()
        m = out[name]
        for callee, k, unknown, branch, instr in edges[name]:
            count = m.count * k
            old = out.get(callee)
            if old is not None:
                count += old.count
            if count > MAX_EXECUTIONS:
                raise HloParseError(module.filename, instr.line, instr.column,
                                    f"'{callee}' would run {count} times per program run (nested "
                                    f"trip counts multiply past 2^63): known_trip_count values are "
                                    "not plausible")
            out[callee] = Multiplicity(
                count, (old is not None and old.unknown_trip_count) or m.unknown_trip_count or unknown,
                (old.branch_of if old is not None else None) or
                (branch if branch is not None else m.branch_of))
            indegree[callee] -= 1
            if indegree[callee] == 0:
                ready.append(callee)
    return out


def loop_trip_counts(module: Module, computations=None) -> dict[tuple[str, str], TripCount]:
    """(computation, while name) -> TripCount for every while of ``computations`` (names;
    default: every computation of the module), in printed order."""
    names = module.computations if computations is None else computations
    out: dict[tuple[str, str], TripCount] = {}
    for cname in names:
        for instr in module.computations[cname].instructions:
            if instr.opcode == "while":
                out[(cname, instr.name)] = trip_count(instr, module)
    return out


def loop_notes(module: Module, computations=None, trips=None) -> list[str]:
    """One note per while without ``known_trip_count``: the count derived and how, or why
    it could not be derived (its body is then counted once); and one per while whose
    ``known_trip_count`` its loop condition contradicts. ``trips``: `loop_trip_counts`'s
    result when the caller has it."""
    notes = []
    trips = loop_trip_counts(module, computations) if trips is None else trips
    for (cname, name), tc in trips.items():
        if tc.source == "derived":
            notes.append(f"while '{name}' (in '{cname}'): no known_trip_count; {tc.n} trips derived "
                         f"from its induction variable ({tc.detail})")
        elif tc.source == "known_trip_count" and tc.detail:
            notes.append(f"while '{name}' (in '{cname}'): known_trip_count {tc.n}, but {tc.detail}; "
                         f"counted {tc.n} times, as XLA's annotation says (an inconsistent dump?)")
        elif tc.source == "unknown":
            notes.append(f"while '{name}' (in '{cname}'): trip count unknown ({tc.detail}); its body "
                         "is counted once per execution of the loop")
    return notes
