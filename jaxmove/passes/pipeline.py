"""The pipeline: every pass, in order, over one module.

``run_pipeline``: multiplicity -> roles -> per kernel-level instruction traffic, flops and
collectives -> per-instruction ``Cost`` and program totals (``analyze_module``) -> reuse ->
first touch -> timing -> excess. One call-graph fold (``analyze_module``'s totals) decides which
branch of each conditional the totals take (``ModuleAnalysis.branches``); reuse, timing and excess
read that choice, so every column describes the same branch. A rule that cannot cost an
instruction raises ``jaxmove.errors.Unmodeled`` and the row is listed as unmodeled; any other
exception is a bug and propagates. What a pass memoizes per module is held by the module
(``passes/memo.py``). Passes never print.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._perf import gc_paused, slots_constructor
from ..errors import Unmodeled
from ..hlo import Computation, Instruction, Module
from .analysis import InstructionCost, ModuleAnalysis
from .callgraph import post_order
from .collectives import CollectiveError, CollectiveInfo, collective_info, collective_kind
from .cost import ACCESS_SLOTS, FIELD_INDEX, N_FIELDS, NOT_HBM_MEMORY_SPACES, ZERO_COST, Cost
from .cost import _values as _cost_values
from .cost import from_values as cost_from_values
from .flops import ZERO as ZERO_FLOPS
from .flops import ZERO_RULE_OPCODES, FlopCount, instruction_flops
from .multiplicity import Multiplicity, callee_counts, loop_notes, loop_trip_counts, multiplicity_pass
from .roles import RoleMap, leaf_position, roles_pass
from .traffic import (FREE_RULE_OPCODES, NO_TRAFFIC, ON_CHIP_MEMORY_SPACES, SHARED_RULE_OPCODES,
                      InstrTraffic, instruction_traffic, reread_notes)

if TYPE_CHECKING:
    from ..capture.program import EntryParameter
    from ..hardware import HardwareSpec
    from .excess import ExcessAnalysis
    from .first_touch import FirstTouch
    from .reuse import ReuseAnalysis
    from .timing import TimeEstimate

# Start of the unmodeled reason of an instruction on which a pass raised (a rule that did
# not foresee its shapes or attributes); tests/test_fuzz.py requires that none occurs.
PASS_FAILURE = "no pass rule could cost this instruction"
# The unmodeled reason of an instruction whose result or an operand has an unbounded dynamic
# dimension (``f32[?]``, hlo/shape.py ``Shape.unbounded``): its size exists only at run time.
UNBOUNDED_DIM = ("a dynamic dimension without a bound ('?') in its shape or an operand's: its "
                 "size is known only at run time, so its bytes and FLOPs are not modeled")


# InstructionCost(*fields), positional, without the frozen __init__ (one per row)
_new_row = slots_constructor(InstructionCost)
# Opcodes that move nothing (traffic NO_TRAFFIC), compute nothing (flops ZERO) and run no
# collective: their cost is ZERO_COST, and analyze_module fills their rows without the passes.
_NOTHING_TO_COST = frozenset(op for op in FREE_RULE_OPCODES & ZERO_RULE_OPCODES
                             if collective_kind(op) is None)


def instruction_cost(instr: Instruction, comp: Computation, roles: RoleMap, traffic: InstrTraffic,
                     flop_count: FlopCount, memo: dict | None = None) -> tuple[Cost, list[str]]:
    """One execution's Cost of ``instr`` from its traffic (each access's bytes go to the fields
    ``cost.ACCESS_SLOTS`` names for its memory space, role and direction; tile padding of HBM
    accesses to ``hbm_padding_*``) and flops, and notes on whole KV-cache writes. With ``memo``
    (field values -> Cost), equal costs are one shared (frozen) Cost: the layers of a model
    repeat the same kernels."""
    reads, writes = traffic.reads, traffic.writes
    if not reads and not writes:  # moves nothing (parameters, tuples, *-done, ...)
        if not flop_count.flops and not flop_count.transcendentals:
            return ZERO_COST, []
        return Cost(flops=flop_count.flops, transcendentals=flop_count.transcendentals), []
    acc = [0] * N_FIELDS  # Cost fields, in FIELD_INDEX order
    acc[_FLOPS], acc[_TRANSCENDENTALS] = flop_count.flops, flop_count.transcendentals
    notes: list[str] = []
    cname = comp.name
    slots = ACCESS_SLOTS
    if reads:
        by_name, operands = comp.by_name, instr.operands
        for a in reads:
            if a.operand is None:  # no operand: a constant inside a fusion, infeed's host side
                for f in slots[a.memory_space, "activations", True]:
                    acc[f] += a.nbytes
                lg = a.logical_nbytes
                if lg is not None and lg != a.nbytes and a.memory_space not in NOT_HBM_MEMORY_SPACES:
                    acc[_PAD_READ] += a.nbytes - lg
                continue
            oname = operands[a.operand]
            r = roles[(cname, oname)]
            if a.index:
                oshape = by_name[oname].shape
                role = r[leaf_position(oshape, a.index)] if oshape.is_tuple else r[0]
            else:
                role = r[0]
            ms, nbytes = a.memory_space, a.nbytes
            for f in slots[ms, role, True]:
                acc[f] += nbytes
            lg = a.logical_nbytes
            if lg != nbytes and ms not in NOT_HBM_MEMORY_SPACES:
                acc[_PAD_READ] += _padding(nbytes, lg, by_name[oname].shape, a.index)
    if writes:
        out_roles = roles[(cname, instr.name)]
        shape = instr.shape
        for a in writes:
            pos = 0
            if shape.is_tuple:
                try:
                    pos = leaf_position(shape, a.index)
                    role = out_roles[pos]
                except (IndexError, KeyError):
                    role = "activations"
            else:
                role = out_roles[0]
            ms, nbytes = a.memory_space, a.nbytes
            for f in slots[ms, role, False]:
                acc[f] += nbytes
            lg = a.logical_nbytes
            if lg != nbytes and ms not in NOT_HBM_MEMORY_SPACES:
                acc[_PAD_WRITE] += _padding(nbytes, lg, shape, a.index)
            if role == "kv_cache" and ms not in ON_CHIP_MEMORY_SPACES:
                leaf = shape.subshape(a.index) if shape.is_tuple else shape
                seeded = getattr(roles, "output_seeded", None)
                before = seeded.get((cname, instr.name)) if seeded else None
                if before is not None and (pos >= len(before) or before[pos] != "kv_cache"):
                    continue  # a cache the program makes, as an output (a prefill's): no update to note
                if nbytes == leaf.byte_size and leaf.byte_size > 0:
                    notes.append(_kv_note(instr, comp, roles, leaf, nbytes))
    if memo is None:
        return cost_from_values(acc), notes
    key = tuple(acc)
    c = memo.get(key)
    if c is None:
        c = memo[key] = cost_from_values(key)
    return c, notes




def _padding(nbytes: int, logical_nbytes: int | None, shape, index) -> int:
    """Tile-padding bytes of an access of ``nbytes`` (``logical_nbytes`` of them data; None:
    the leaf's share, ``nbytes * logical / physical`` of the leaf at ``index`` of ``shape``)."""
    if logical_nbytes is None:
        try:
            leaf = shape.subshape(index) if index else shape
        except IndexError:
            return 0
        if not leaf.byte_size or leaf.byte_size == leaf.logical_byte_size:
            return 0
        logical_nbytes = nbytes * leaf.logical_byte_size // leaf.byte_size
    return max(0, nbytes - logical_nbytes)


KV_REWRITE = "rewrites the whole KV-cache buffer"
KV_COPY = "writes a whole copy of the KV cache"


def _kv_note(instr, comp, roles, leaf, nbytes: int) -> str:
    """Why an instruction writes a whole KV-cache-sized buffer.

    On the chain to the output aliased to the donated cache, it is the cache state itself,
    rebuilt instead of updated in place; elsewhere it is a copy made to read the cache
    (a dtype conversion or layout change before attention).
    """
    if (comp.name, instr.name) in roles.aliased:
        why = ("its result is a new buffer, not an in-place dynamic-update-slice"
               if instr.opcode == "fusion" else f"'{instr.opcode}' copies it")
        return f"{KV_REWRITE} {leaf} ({nbytes} bytes) instead of updating it in place: {why}"
    return (f"{KV_COPY} {leaf} ({nbytes} bytes) to read it ('{instr.opcode}': e.g. a dtype "
            "conversion or a layout change before attention)")


_FLOPS, _TRANSCENDENTALS = FIELD_INDEX["flops"], FIELD_INDEX["transcendentals"]
_D2D = FIELD_INDEX["device_to_device_bytes"]
_PAD_READ, _PAD_WRITE = FIELD_INDEX["hbm_padding_read_bytes"], FIELD_INDEX["hbm_padding_write_bytes"]

# Instructions of at most this many operands share one cost per (accesses, flops, roles): the
# key holds each operand's roles (a 25k-operand fusion is costed as itself, once).
_SHARED_COST_OPERANDS = 64


def _calls_kernels(instr: Instruction) -> bool:
    return instr.opcode in ("while", "call", "conditional", "async-start", "call-start")


def _branch_cost(c: Cost) -> tuple[int, int]:
    """How a conditional's branches are ranked (the totals take the largest): the bytes one
    execution moves over every path (HBM, device <-> device, host <-> device: a branch that
    all-reduces moves as many HBM bytes as one that does not, and its wire bytes as well),
    then its flops."""
    return (c.hbm_bytes + c.device_to_device_bytes + c.host_to_device_bytes + c.device_to_host_bytes,
            c.flops)


@gc_paused
def analyze_module(module: Module, entry_roles: dict[int, str] | None = None,
                   output_roles: tuple[str | None, ...] | None = None) -> ModuleAnalysis:
    """Run the passes over ``module``.

    Args:
      entry_roles: ENTRY parameter number -> role (from capture); None reads roles from
        parameter names and metadata.
      output_roles: one role (or None) per ENTRY root leaf (``Program.output_roles``;
        ``roles_pass``).
    """
    mult = multiplicity_pass(module)
    roles = roles_pass(module, entry_roles, output_roles=output_roles)
    rows: list[InstructionCost] = []
    per_comp: dict[str, list[InstructionCost]] = {}
    cost_memo: dict[tuple, Cost] = {}  # (instruction_cost's: one Cost per distinct cost)
    total_memo: dict[tuple[int, int], tuple[Cost, Cost]] = {}  # (id(cost), count) -> (cost, total)
    fusion_flops: dict[tuple, FlopCount] = {}  # a fusion's flops by its traffic record and kind
    fusion_costs: dict[tuple, Cost] = {}  # a shared-traffic row's cost by (accesses, flops, roles)
    for cname, m in mult.items():
        comp = module.computations[cname]
        count, unknown_trip_count = m.count, m.unknown_trip_count
        comp_rows = per_comp.setdefault(cname, [])
        # the row of an instruction that costs nothing, when nothing about its shapes or its
        # loop adds to it: one for all (fields as the general code below fills them)
        plain = not unknown_trip_count and not module.has_unbounded_dims
        if count == 1:
            zero_total = ZERO_COST
        else:
            hit = total_memo.get((id(ZERO_COST), count))
            if hit is None:
                hit = total_memo[(id(ZERO_COST), count)] = (ZERO_COST, ZERO_COST * count)
            zero_total = hit[1]
        for instr in comp.instructions:
            if instr.opcode in _NOTHING_TO_COST:  # what the passes answer, without asking
                if plain:
                    row = _new_row(instr, cname, m, ZERO_COST, zero_total, NO_TRAFFIC, ZERO_FLOPS, (),
                                   (), None)
                    rows.append(row)
                    comp_rows.append(row)
                    continue
                traffic, fc, cost, notes, coll = NO_TRAFFIC, ZERO_FLOPS, ZERO_COST, [], None
            else:
                try:
                    traffic = instruction_traffic(instr, comp, module)
                    # fusions of one traffic record (its key holds the fused computation's
                    # structural class: traffic.fusion_traffic) of one kind have one FlopCount,
                    # and no collective when the first has none
                    parts = None
                    if instr.opcode == "fusion" and traffic.reads:
                        parts = (id(traffic.reads), id(traffic.writes), instr.fusion_kind)
                        fc = fusion_flops.get(parts)
                    else:
                        fc = None
                    known = fc is not None
                    if not known:
                        fc = instruction_flops(instr, module)
                    if instr.opcode in SHARED_RULE_OPCODES and len(instr.operands) <= _SHARED_COST_OPERANDS:
                        # accesses shared by the instructions of one traffic key (fusions, and
                        # what reads and writes whole: traffic.py): one Cost per (accesses,
                        # flops, roles); every row's traffic lives until the end, so ids are its
                        out_roles = roles[(cname, instr.name)]
                        ckey = (id(traffic.reads), id(traffic.writes), fc.flops, fc.transcendentals,
                                out_roles, tuple([roles[(cname, o)] for o in instr.operands]))
                        cost = fusion_costs.get(ckey)
                        if cost is None or "kv_cache" in out_roles:  # (kv notes name the fusion)
                            cost, notes = instruction_cost(instr, comp, roles, traffic, fc, cost_memo)
                            fusion_costs[ckey] = cost
                        else:
                            notes = []
                    else:
                        cost, notes = instruction_cost(instr, comp, roles, traffic, fc, cost_memo)
                    coll = None if known else collective_info(instr, comp, module)
                    if parts is not None and not known and coll is None and not fc.unmodeled:
                        fusion_flops[parts] = fc
                except CollectiveError:
                    raise  # a positioned error about the input: the caller reports it
                except Unmodeled as e:
                    # a rule has no model for this instruction: list it as unmodeled, never guess
                    traffic = InstrTraffic(unmodeled=(f"{PASS_FAILURE} ({e})",))
                    fc, cost, notes, coll = FlopCount(), Cost(), [], None
            if coll is not None:  # (replace(cost, device_to_device_bytes=...), memoized)
                vals = list(_cost_values(cost))
                vals[_D2D] += coll.wire_bytes
                key = tuple(vals)
                cost = cost_memo.get(key)
                if cost is None:
                    cost = cost_memo[key] = cost_from_values(key)
            unmodeled = (tuple(dict.fromkeys(traffic.unmodeled + fc.unmodeled))
                         if traffic.unmodeled or fc.unmodeled else ())
            if module.has_unbounded_dims and (instr.shape.has_unbounded_dim or any(
                    comp.by_name[o].shape.has_unbounded_dim for o in instr.operands)):
                unmodeled += (UNBOUNDED_DIM,)
            if unknown_trip_count and instr.opcode != "parameter":
                notes.append("inside a while loop with no known trip count: counted once per loop run")
            row_notes = tuple(traffic.notes)
            if notes:
                row_notes += tuple(notes)
            if coll is not None:
                row_notes += coll.notes
            if count == 1:
                tot = cost  # (cost * 1)
            else:  # equal costs are one object (cost_memo): one product per (cost, count)
                hit = total_memo.get((id(cost), count))
                if hit is None:
                    hit = total_memo[(id(cost), count)] = (cost, cost * count)  # (holds cost)
                tot = hit[1]
            row = _new_row(instr, cname, m, cost, tot, traffic, fc, unmodeled,
                           row_notes, coll)
            rows.append(row)
            comp_rows.append(row)

    notes: list[str] = []
    memo: dict[str, Cost] = {}
    chosen: dict[tuple[str, str], str] = {}

    def total(cname: str) -> Cost:
        """Cost of one execution of a kernel-level computation, callees included."""
        if cname in memo:
            return memo[cname]
        parts: list[Cost] = []  # summed once at the end: O(rows), not O(rows) Cost builds
        for row in per_comp.get(cname, []):
            parts.append(row.per_execution)
            instr = row.instr
            if instr.opcode == "conditional":
                branches = [(b, total(b)) for b in instr.called_computations]
                best = max(branches, key=lambda bc: _branch_cost(bc[1]))
                chosen[(cname, instr.name)] = best[0]
                parts.append(best[1])
                notes.append(f"conditional '{instr.name}': totals use its costliest branch "
                             f"'{best[0]}' (the most bytes moved over HBM, the network and the host, "
                             "then flops; which branch runs is not known statically)")
            elif instr.opcode in ("while", "call", "async-start", "call-start"):
                for callee, k, _unknown, _branch in callee_counts(instr, module):
                    parts.append(total(callee) * k)
        c = memo[cname] = Cost.sum(parts)
        return c

    # callees first (iterative), so total() finds every callee memoized and never recurses
    for cname in post_order(module, [module.entry.name], _calls_kernels):
        total(cname)
    totals = total(module.entry.name)
    noted = [r for r in rows if r.notes]  # (most rows have none: no generator for them)
    for marker, what in ((KV_REWRITE, "rewrite a whole KV-cache buffer instead of updating it in "
                          "place"), (KV_COPY, "write a whole copy of the KV cache to read it")):
        hit = [r for r in noted if any(n.startswith(marker) for n in r.notes)]
        if hit:
            nbytes = sum(r.total.kv_cache_write_bytes for r in hit)
            notes.append(f"{len(hit)} instruction(s) {what} ({nbytes} bytes per program run), e.g. "
                         f"'{hit[0].instr.name}'")
    if not module.entry_marked:
        notes.append(f"the text has no ENTRY marker: its last computation, '{module.entry.name}', "
                     "is taken as the program (as XLA's parser does); a file cut after a complete "
                     "computation would look the same")
    if module.gpu_memory_colors:
        notes.append("XLA:GPU memory-space colours " + ", ".join(f"S({c})" for c in module.gpu_memory_colors)
                     + " (1: collective buffers in NCCL-registered memory, 2: temp buffers; "
                     "xla/service/gpu/gpu_memory_space_assignment.h) are device HBM: counted as HBM, "
                     "not as TPU on-chip memory")
    unknown_spaces = getattr(module, "unknown_memory_spaces", ())  # (a module pickled before it had them)
    if unknown_spaces:
        notes.append("memory space(s) " + ", ".join(f"S({c})" for c in unknown_spaces)
                     + " are none jaxmove knows (0 HBM, 5 host; on chip: TPU's 1 VMEM, 2 and 8 "
                     "semaphores, 4 SMEM, 6 scalars; XLA:GPU's 1 and 2 are HBM): their bytes are "
                     "counted as HBM")
    if any(m.unknown_trip_count for m in mult.values()):
        notes.append("some while loops have no known trip count; their bodies are counted once")
    trips = loop_trip_counts(module, mult)
    notes.extend(loop_notes(module, trips=trips))
    unknown_loops = tuple({"computation": c, "while": w, "why": tc.detail}
                          for (c, w), tc in trips.items() if tc.source == "unknown")
    notes.extend(reread_notes(module, rows))  # loop-invariant re-reads, weight copies
    if totals.hbm_padding_bytes:
        notes.append(padding_note(totals))
    return ModuleAnalysis(module, rows, totals, mult, notes, roles, chosen, unknown_loops)


def padding_note(totals: Cost) -> str:
    """"x% of HBM traffic is tile padding": the program-level padding figure."""
    return (f"{100 * totals.hbm_padding_bytes / totals.hbm_bytes:.1f}% of HBM traffic is tile "
            f"padding ({totals.hbm_padding_bytes} of {totals.hbm_bytes} bytes; tiled layouts such "
            "as T(8,128) are moved in whole tiles)")


@dataclass(frozen=True)
class PassResults:
    """Every pass's result for one module: what ``Report`` is built from.

    Attributes:
      analysis: per-instruction costs and totals (``analyze_module``).
      reuse: on-chip reuse of fusions, and the tiling model when a spec is given.
      first_touch: bytes written into freshly mapped pages (CPU specs with the terms), or None
        without a spec.
      times: the time estimate on ``spec``, or None without one.
      excess: compulsory traffic, excess and its causes.
    """

    analysis: ModuleAnalysis
    reuse: ReuseAnalysis
    first_touch: FirstTouch | None
    times: TimeEstimate | None
    excess: ExcessAnalysis


def run_pipeline(module: Module, entry_roles: dict[int, str] | None = None,
                 parameters: tuple[EntryParameter, ...] = (), spec: HardwareSpec | None = None,
                 output_roles: tuple[str | None, ...] | None = None) -> PassResults:
    """Run every pass over ``module``, in order, and return their results.

    Args:
      entry_roles: ENTRY parameter number -> role (from capture); None reads roles from names.
      parameters: the program's ``EntryParameter`` s (donation and pytree paths for excess).
      spec: a HardwareSpec for reuse's tiling model, first touch, timing and excess time; None
        skips first touch and timing.
      output_roles: one role (or None) per ENTRY root leaf (``Program.output_roles``).
    Raises:
      jaxmove.passes.collectives.CollectiveError: malformed replica groups (an input error).
    """
    from .excess import excess_pass
    from .first_touch import first_touch_pass
    from .reuse import reuse_pass
    from .timing import estimate_times, schedule_order

    analysis = analyze_module(module, entry_roles, output_roles)
    reuse = reuse_pass(analysis, spec)
    ft = times = None
    if spec is not None:
        ft = first_touch_pass(analysis, spec, schedule_order(module.entry, module))
        times = estimate_times(analysis, spec, reuse, first_touch=ft)
    excess = excess_pass(analysis, parameters, spec, reuse, roles=analysis.roles)
    return PassResults(analysis, reuse, ft, times, excess)
