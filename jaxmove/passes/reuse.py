"""On-chip reuse per kernel: what fusion keeps on chip, and how often a dot or convolution
re-reads its operands from HBM (README "Time estimates, on-chip reuse, hardware").

Fusion reuse (``fusion_reuse``): the traffic of the fused instructions run one per kernel
(the traffic pass's rules) minus the fusion's own traffic. Tiling (``matmul_traffic``):
output-stationary a x a tiles, the schedule that attains the 2·M·N·K/sqrt(S) + M·N I/O bound
of a matmul with S elements on chip (Hong & Kung, STOC 1981; Irony, Toledo & Tiskin, JPDC 2004;
Kwasniewski et al., SC 2019), clamped between compulsory and no-reuse traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._perf import gc_paused, slots_constructor
from ..errors import Unmodeled
from ..hlo import Computation, Instruction, Module, Shape
from .callgraph import post_order
from .flops import KFMA_FLOPS, convolution_flops, custom_call_kind, instruction_flops
from .cost import hbm_access_bytes
from .traffic import FREE_OPCODES, InstrTraffic, instruction_traffic

if TYPE_CHECKING:
    from .analysis import ModuleAnalysis

TILING_SOURCE = ("tiled-matmul I/O bound 2·M·N·K/sqrt(S) + M·N (Hong & Kung 1981; Irony, Toledo & "
                 "Tiskin 2004; Kwasniewski et al. SC 2019), output-stationary a×a tiles, "
                 "a = floor(sqrt(S+1) - 1)")


# ---- records ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TilingEstimate:
    """HBM traffic of one dot / convolution under the tiling model, per execution (bytes).

    Attributes:
      instruction: the dot / convolution / custom call (inside a fusion: the fused one).
      kind: "dot" or "convolution".
      batch, m, n, k: the (implicit) GEMM C[batch, m, n] = A[batch, m, k] · B[batch, k, n].
      lhs_bytes, rhs_bytes, out_bytes: bytes of A, B and C.
      fast_memory_bytes: S in bytes; tile: a, the tile edge in elements.
      lhs_passes, rhs_passes: how many times A and B are read from HBM.
      compulsory_bytes: A + B + C once each; no_reuse_bytes: every multiply-add fetches
        both operands, C written once; tiled_bytes: the model, between the two.
      lower_bound_bytes: 2·M·N·K/sqrt(S)·b + M·N·b_C summed over the batch, the I/O
        lower bound the schedule approaches (b = mean operand element size).
    """

    instruction: str
    kind: str
    batch: int
    m: int
    n: int
    k: int
    lhs_bytes: int
    rhs_bytes: int
    out_bytes: int
    fast_memory_bytes: int
    tile: int
    lhs_passes: int
    rhs_passes: int
    compulsory_bytes: int
    no_reuse_bytes: int
    tiled_bytes: int
    lower_bound_bytes: int

    @property
    def extra_read_bytes(self) -> int:
        """Re-reads beyond the compulsory traffic (what the tiling model adds), bytes."""
        return self.tiled_bytes - self.compulsory_bytes


@dataclass(frozen=True, slots=True)
class FusionReuse:
    """Traffic of one fusion fused against unfused, per execution (bytes).

    Attributes:
      fused_bytes: HBM bytes read + written by the fusion (the traffic pass).
      unfused_bytes: HBM bytes if every fused instruction were its own kernel.
      onchip_reuse_bytes: unfused_bytes - fused_bytes.
      intermediates: (name, bytes) of fused values that stayed on chip, largest first.
      intermediate_bytes: their sum.
      working_set_bytes: data the kernel touches (= fused_bytes).
      onchip_capacity_bytes: the device's on-chip capacity (None without a spec).
      fits_on_chip: working_set_bytes <= onchip_capacity_bytes (None without a capacity).
      unmodeled: fused instructions the traffic pass has no rule for.
    """

    fused_bytes: int
    unfused_bytes: int
    intermediates: tuple[tuple[str, int], ...]
    onchip_capacity_bytes: int | None = None
    unmodeled: tuple[str, ...] = ()

    @property
    def onchip_reuse_bytes(self) -> int:
        return max(0, self.unfused_bytes - self.fused_bytes)

    @property
    def intermediate_bytes(self) -> int:
        return sum(b for _n, b in self.intermediates)

    @property
    def working_set_bytes(self) -> int:
        return self.fused_bytes

    @property
    def fits_on_chip(self) -> bool | None:
        if self.onchip_capacity_bytes is None:
            return None
        return self.working_set_bytes <= self.onchip_capacity_bytes


@dataclass(frozen=True, slots=True)
class InstructionReuse:
    """Reuse figures of one kernel-level instruction, per execution.

    Attributes:
      fusion: FusionReuse for fusions, else None.
      tilings: tiling estimates of the dots / convolutions this kernel runs.
      notes: why a tiling could not be estimated, etc.
    """

    fusion: FusionReuse | None = None
    tilings: tuple[TilingEstimate, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def onchip_reuse_bytes(self) -> int:
        return self.fusion.onchip_reuse_bytes if self.fusion is not None else 0

    @property
    def tiling_extra_read_bytes(self) -> int:
        return sum(t.extra_read_bytes for t in self.tilings)


@dataclass
class ReuseAnalysis:
    """Reuse of every kernel-level instruction of a module.

    Attributes:
      rows: (computation, instruction name) -> InstructionReuse (per execution).
      total_onchip_reuse_bytes: bytes fusion kept on chip over one program run (loops by
        trip count; a conditional counts the branch the totals take, ``ModuleAnalysis.branches``).
      onchip_capacity_bytes, onchip_capacity_key: the spec's capacity used (None without).
    """

    rows: dict[tuple[str, str], InstructionReuse]
    total_onchip_reuse_bytes: int
    onchip_capacity_bytes: int | None = None
    onchip_capacity_key: str | None = None
    notes: list[str] = field(default_factory=list)


# ---- helpers ----------------------------------------------------------------------------

def hbm_bytes(traffic: InstrTraffic) -> int:
    """HBM bytes (memory space other than on-chip S(1)/S(6) and host S(5)) read + written."""
    return hbm_access_bytes(traffic.reads) + hbm_access_bytes(traffic.writes)


def onchip_capacity_bytes(spec) -> tuple[int, str] | None:
    """(bytes, field name) of S, the last on-chip level in front of HBM: ``l2_bytes`` on GPUs
    (where tiles of concurrently running thread blocks share operands) and CPUs (last-level
    cache), ``vmem_bytes`` (one TensorCore's vector memory) on TPUs; None when the spec lacks it."""
    if spec is None:
        return None
    key, v = ("vmem_bytes", spec.vmem_bytes) if spec.kind == "tpu" else ("l2_bytes", spec.l2_bytes)
    if v is None and spec.kind == "tpu" and spec.l2_bytes is not None:
        key, v = "l2_bytes", spec.l2_bytes
    return (int(v), key) if v else None


# ---- unfused traffic of a fused computation ---------------------------------------------

def _root_names(comp: Computation) -> set[str]:
    names = {comp.root.name}
    if comp.root.opcode == "tuple":
        names.update(comp.root.operands)
    # a bitcast at the root exposes its operand as an output too
    frontier = list(names)
    while frontier:
        i = comp.by_name.get(frontier.pop())
        if i is not None and i.opcode == "bitcast" and i.operands[0] not in names:
            names.add(i.operands[0])
            frontier.append(i.operands[0])
    return names


def unfused_traffic(fused: Computation, module: Module,
                    _memo: dict | None = None
                    ) -> tuple[int, tuple[str, ...]]:
    """HBM bytes (read + written, per execution) of ``fused`` run one instruction per kernel.

    Each fused instruction is costed by the traffic pass's rule for it, as if unfused
    (``instruction_traffic(instr, fused, module)``); a nested fusion contributes its own
    unfused traffic, recursively. Returns (bytes, unmodeled reasons).

    ``_memo``: the reuse pass's one memo of a module, keyed by computation name (this answer)
    and by tuples: ("unfused", structural class), ("intermediates", class), ("fused", ids of a
    traffic record's accesses).
    """
    memo = {} if _memo is None else _memo
    hit = memo.get(fused.name)
    if hit is not None:
        return hit
    # a structurally identical computation (hlo/structure.py: the same instructions up to
    # their names) moves the same bytes unfused; its unmodeled reasons name its own
    # instructions, so only an answer without them is shared
    cls = module.structural_classes.get(fused.name)
    if cls is not None:
        hit = memo.get(("unfused", cls))
        if hit is not None:
            memo[fused.name] = hit
            return hit
    # nested fused computations first, innermost first (iterative: any nesting depth)
    for name in post_order(module, [fused.name], _is_fusion)[:-1]:
        if name not in memo:
            memo[name] = _unfused_one(module.computations[name], module, memo)
    out = memo[fused.name] = _unfused_one(fused, module, memo)
    if cls is not None and not out[1]:
        memo[("unfused", cls)] = out
    return out


def _is_fusion(instr: Instruction) -> bool:
    return instr.opcode == "fusion"


def _unfused_one(fused: Computation, module: Module,
                 memo: dict) -> tuple[int, tuple[str, ...]]:
    """unfused_traffic of one computation whose nested fusions are in ``memo``."""
    total = 0
    unmodeled: list[str] = []
    # HBM bytes by traffic record: instructions that read and write whole share one record per
    # shapes (traffic.py's default_traffic); the dict holds the records, so ids stay theirs
    seen: dict[int, tuple] = {}
    for instr in fused.instructions:
        if instr.opcode == "fusion" and instr.called_computations \
                and instr.called_computations[0] in module.computations:
            b, u = memo.get(instr.called_computations[0]) or unfused_traffic(
                module.computations[instr.called_computations[0]], module, memo)
            total += b
            unmodeled.extend(u)
            continue
        t = instruction_traffic(instr, fused, module)
        hit = seen.get(id(t))
        if hit is None:
            hit = seen[id(t)] = (t, hbm_bytes(t))
        total += hit[1]
        if t.unmodeled:
            unmodeled.extend(f"{instr.name}: {r}" for r in t.unmodeled)
    return total, tuple(dict.fromkeys(unmodeled))


def onchip_intermediates(fused: Computation, module: Module | None = None,
                         _memo: dict | None = None) -> tuple[tuple[str, int], ...]:
    """(name, bytes) of fused values computed but never written to HBM, largest first:
    every instruction that is not free (parameter, constant, bitcast, tuple, ...) and is
    not an output of the fusion. With ``module`` and ``_memo``, structurally identical
    computations (hlo/structure.py) share the positions and bytes; each names its own."""
    cls = module.structural_classes.get(fused.name) if module is not None and _memo is not None else None
    if cls is not None:
        hit = _memo.get(("intermediates", cls))
        if hit is not None:
            instrs = fused.instructions
            return tuple([(instrs[k].name, nb) for k, nb in hit])
    outputs = _root_names(fused)
    found = [(k, i.shape.byte_size) for k, i in enumerate(fused.instructions)
             if i.opcode not in FREE_OPCODES and i.name not in outputs and i.shape.is_array]
    found.sort(key=lambda knb: -knb[1])
    if cls is not None:
        _memo[("intermediates", cls)] = found
    instrs = fused.instructions
    return tuple([(instrs[k].name, nb) for k, nb in found])


def fusion_reuse(instr: Instruction, comp: Computation, module: Module,
                 capacity_bytes: int | None = None,
                 _memo: dict | None = None, traffic: InstrTraffic | None = None) -> FusionReuse:
    """Fused against unfused traffic of the fusion ``instr`` in ``comp``, per execution.

    ``onchip_reuse_bytes = unfused - fused``; the intermediates are the fused values that are
    not free (parameter, constant, bitcast, tuple...) and not an output; the working set is the
    fused HBM traffic, compared with ``capacity_bytes``. For a fused chain of k elementwise ops on
    N elements of b bytes: unfused = 2·k·N·b, fused = 2·N·b, reuse = (2k - 2)·N·b.

    ``traffic``: the fusion's traffic when the caller has it (the pipeline's row: the traffic
    pass's ``instruction_traffic(instr, comp, module)``), else computed here.
    Raises ValueError when ``instr`` is not a fusion with a fused computation.
    """
    if instr.opcode != "fusion" or not instr.called_computations \
            or instr.called_computations[0] not in module.computations:
        raise ValueError(f"'{instr.name}' is not a fusion with a fused computation")
    fused_comp = module.computations[instr.called_computations[0]]
    if traffic is None:
        traffic = instruction_traffic(instr, comp, module)
        fused = hbm_bytes(traffic)
    elif _memo is not None:  # (fusions of one traffic key share its accesses: traffic.py;
        # the memo holds them, so their ids name them while the memo lives)
        reads, writes = traffic.reads, traffic.writes
        key = ("fused", id(reads), id(writes))
        hit = _memo.get(key)
        if hit is None:
            hit = _memo[key] = (reads, writes, hbm_bytes(traffic))
        fused = hit[2]
    else:
        fused = hbm_bytes(traffic)
    unfused, unmodeled = unfused_traffic(fused_comp, module, _memo)
    # Run unfused, the kernels still read the fusion's operands and write its results: never
    # less than the fusion itself (a fusion of bitcasts costs 0 unfused by the per-op rules,
    # yet its kernel moves its operand), so reuse is never negative.
    unfused = max(unfused, fused)
    return _fusion_reuse(fused, unfused, onchip_intermediates(fused_comp, module, _memo), capacity_bytes,
                         unmodeled)


# (records built once per kernel: set through their slots, _perf.slots_constructor)
_fusion_reuse = slots_constructor(FusionReuse)
_instruction_reuse = slots_constructor(InstructionReuse)


# ---- tiling model -----------------------------------------------------------------------

def tile_edge(fast_memory_elems: int) -> int:
    """a = floor(sqrt(S + 1) - 1): a² accumulators plus a column of A and a row of B
    (2a elements) fit in S (Kwasniewski et al. SC 2019). At least 1."""
    return max(1, math.isqrt(fast_memory_elems + 1) - 1)


def matmul_traffic(batch: int, m: int, n: int, k: int, lhs_bytes: int, rhs_bytes: int,
                   out_bytes: int, elem_bytes: tuple[float, float, float],
                   fast_memory_bytes: int, *, instruction: str = "", kind: str = "dot",
                   macs: int | None = None) -> TilingEstimate:
    """The tiling model for C[batch, m, n] = A[batch, m, k] · B[batch, k, n].

    With S elements on chip (S = fast_memory_bytes / the widest element of A, B, C), an a x a
    tile of C stays on chip, a = ``tile_edge(S)``, and A and B stream through it (Kwasniewski
    et al. SC 2019, section 5): A is read ceil(N / t_n) times and B ceil(M / t_m) times, with
    t_m = min(M, a) and a skinny matrix widening the other side so the tile keeps a² elements:

        tiled = bytes(A)·ceil(N / t_n) + bytes(B)·ceil(M / t_m) + bytes(C)

    clamped to [compulsory, no-reuse]: compulsory = bytes(A) + bytes(B) + bytes(C); no-reuse =
    macs·(b_A + b_B) + bytes(C) (every multiply-add fetches both operands).

    Args:
      lhs_bytes, rhs_bytes, out_bytes: bytes of A, B, C (all batches).
      elem_bytes: bytes per element of A, B, C.
      fast_memory_bytes: S in bytes (must be > 0).
      macs: multiply-adds (default batch·m·n·k), for the no-reuse traffic.
    Raises ValueError for a non-positive size.
    """
    if fast_memory_bytes <= 0 or min(batch, m, n, k) <= 0:
        raise ValueError(f"bad matmul sizes batch={batch} m={m} n={n} k={k} S={fast_memory_bytes}")
    widest = max(elem_bytes)
    s_elems = max(1, int(fast_memory_bytes // widest))
    a = tile_edge(s_elems)
    area = a * a
    tm = min(m, a)
    tn = min(n, max(a, area // tm))
    if tn == n:
        tm = min(m, max(a, area // tn))
    lhs_passes = -(-n // tn)
    rhs_passes = -(-m // tm)
    compulsory = lhs_bytes + rhs_bytes + out_bytes
    macs = batch * m * n * k if macs is None else macs
    no_reuse = max(compulsory, int(macs * (elem_bytes[0] + elem_bytes[1])) + out_bytes)
    tiled = lhs_bytes * lhs_passes + rhs_bytes * rhs_passes + out_bytes
    tiled = min(max(tiled, compulsory), no_reuse)
    b_in = (elem_bytes[0] + elem_bytes[1]) / 2
    lower = int(batch * (2 * m * n * k / math.sqrt(s_elems) * b_in + m * n * elem_bytes[2]))
    return TilingEstimate(instruction, kind, batch, m, n, k, lhs_bytes, rhs_bytes, out_bytes,
                          int(fast_memory_bytes), a, lhs_passes, rhs_passes, compulsory, no_reuse,
                          tiled, lower)


def _elem_bytes(shape: Shape) -> float:
    return shape.bit_width / 8


def _first_array(shape: Shape) -> Shape:
    return shape.tuple_shapes[0] if shape.is_tuple and shape.tuple_shapes else shape


def _dot_tiling(instr: Instruction, comp: Computation, fast: int) -> TilingEstimate:
    lhs = comp.by_name[instr.operands[0]].shape
    rhs = comp.by_name[instr.operands[1]].shape
    out = _first_array(instr.shape)
    contracting = set(instr.int_list("lhs_contracting_dims") or ())
    batch_dims = set(instr.int_list("lhs_batch_dims") or ())
    k = math.prod(lhs.dims[d] for d in contracting)
    b = math.prod(lhs.dims[d] for d in batch_dims)
    m = math.prod(n for d, n in enumerate(lhs.dims) if d not in contracting | batch_dims)
    n = out.num_elements // max(1, b * m)
    return matmul_traffic(b, m, n, k, lhs.byte_size, rhs.byte_size, out.byte_size,
                          (_elem_bytes(lhs), _elem_bytes(rhs), _elem_bytes(out)), fast,
                          instruction=instr.name, kind="dot")


def _gemm_tiling(instr: Instruction, comp: Computation, module: Module, fast: int) -> TilingEstimate:
    """A library matmul from its element counts and flops: with E output elements,
    K = flops / (2E); A·B elements = batch·E·K², so batch, M = A/(batch·K), N = B/(batch·K)."""
    lhs = comp.by_name[instr.operands[0]].shape
    rhs = comp.by_name[instr.operands[1]].shape
    out = _first_array(instr.shape)
    fc = instruction_flops(instr, module)
    e = out.num_elements
    if fc.unmodeled or not fc.flops or not e:
        raise Unmodeled("no flops for this custom call")
    k = fc.flops // (KFMA_FLOPS * e)
    prod_ab = lhs.num_elements * rhs.num_elements
    if k <= 0 or prod_ab % (e * k * k):
        raise Unmodeled(f"cannot read M, N, K from {lhs} x {rhs} -> {out}")
    b = prod_ab // (e * k * k)
    m, n = lhs.num_elements // (b * k), rhs.num_elements // (b * k)
    return matmul_traffic(b, m, n, k, lhs.byte_size, rhs.byte_size, out.byte_size,
                          (_elem_bytes(lhs), _elem_bytes(rhs), _elem_bytes(out)), fast,
                          instruction=instr.name, kind="dot")


def _conv_tiling(instr: Instruction, comp: Computation, fast: int) -> TilingEstimate:
    """A convolution as its implicit GEMM: M = output elements / output features, N = output
    features, K = flops / (2·M·N); A is the input, B the kernel."""
    from .flops import parse_dim_labels

    lhs = comp.by_name[instr.operands[0]].shape
    rhs = comp.by_name[instr.operands[1]].shape
    out = _first_array(instr.shape)
    flops = convolution_flops(instr, lhs, rhs, out)
    out_f = parse_dim_labels(instr.attrs["dim_labels"])[7]
    n = out.dims[out_f]
    m = out.num_elements // max(1, n)
    macs = flops // KFMA_FLOPS
    k = max(1, macs // max(1, m * n))
    return matmul_traffic(1, m, n, k, lhs.byte_size, rhs.byte_size, out.byte_size,
                          (_elem_bytes(lhs), _elem_bytes(rhs), _elem_bytes(out)), fast,
                          instruction=instr.name, kind="convolution", macs=macs)


def _tiling_of(instr: Instruction, comp: Computation, module: Module, fast: int) -> TilingEstimate | None:
    """Tiling estimate of one dot-like instruction, or None when it is not one. Raises
    ValueError / KeyError / IndexError when its shapes cannot be read."""
    op = instr.opcode
    if op == "dot":
        return _dot_tiling(instr, comp, fast)
    if op == "convolution":
        return _conv_tiling(instr, comp, fast)
    if op == "custom-call":
        kind = custom_call_kind(instr.custom_call_target)
        if kind == "matmul":
            return _gemm_tiling(instr, comp, module, fast)
        if kind == "convolution":
            return _conv_tiling(instr, comp, fast)
    return None


def kernel_tilings(instr: Instruction, comp: Computation, module: Module,
                   fast_memory_bytes: int) -> tuple[tuple[TilingEstimate, ...], tuple[str, ...]]:
    """Tiling estimates of the dots and convolutions one kernel runs: the instruction itself,
    or those inside a fusion (recursively). Returns (estimates, notes on ones skipped)."""
    found: list[TilingEstimate] = []
    notes: list[str] = []

    def visit(i: Instruction, c: Computation) -> None:
        try:
            t = _tiling_of(i, c, module, fast_memory_bytes)
        except (Unmodeled, ValueError) as e:  # ValueError: malformed dim_labels / window sizes
            notes.append(f"tiling of '{i.name}' unmodeled: {e}")
            return
        if t is not None:
            found.append(t)

    # in the order a recursive walk would meet them, with an explicit stack (any nesting depth)
    stack = [(instr, comp)]
    while stack:
        i, c = stack.pop()
        if i.opcode == "fusion":
            fc = module.computations.get(i.called_computations[0]) if i.called_computations else None
            if fc is not None:
                stack.extend((inner, fc) for inner in reversed(fc.instructions))
            continue
        visit(i, c)
    return tuple(found), tuple(notes)


def is_dot_like(instr: Instruction, module: Module) -> bool:
    """A dot, convolution, library matmul/convolution call, or a fusion containing one."""
    if instr.opcode in ("dot", "convolution"):
        return True
    if instr.opcode == "custom-call":
        return custom_call_kind(instr.custom_call_target) in ("matmul", "convolution")
    if instr.opcode == "fusion" and instr.called_computations:
        stack, seen = [instr.called_computations[0]], set()  # iterative: any nesting depth
        while stack:
            fc = module.computations.get(stack.pop())
            if fc is None or fc.name in seen:
                continue
            seen.add(fc.name)
            for i in fc.instructions:
                if i.opcode == "fusion":
                    stack.extend(i.called_computations[:1])
                elif is_dot_like(i, module):
                    return True
    return False


# ---- the pass ---------------------------------------------------------------------------

@gc_paused
def reuse_pass(analysis: ModuleAnalysis, spec=None) -> ReuseAnalysis:
    """Reuse of every kernel-level instruction of ``analysis`` (a pipeline ModuleAnalysis).

    Fusion reuse needs no hardware; the tiling model and the working-set check need the
    on-chip capacity of ``spec`` (a HardwareSpec, or None to skip them).
    """
    module = analysis.module
    cap = onchip_capacity_bytes(spec)
    cap_bytes, cap_key = (cap if cap else (None, None))
    memo: dict = {}
    rows: dict[tuple[str, str], InstructionReuse] = {}
    notes: list[str] = []
    if spec is not None and cap is None:
        notes.append(f"hardware '{spec.name}' gives no on-chip size: the tiling model is off, "
                     "dot/convolution traffic is the compulsory traffic")
    computations = module.computations
    for row in analysis.rows:
        instr = row.instr
        fusion = instr.opcode == "fusion"
        if not fusion and not is_dot_like(instr, module):
            continue
        cname = row.computation
        comp = computations[cname]
        fr = None
        if fusion:
            called = instr.called_computations
            if called and called[0] in computations:
                fr = fusion_reuse(instr, comp, module, cap_bytes, memo, row.traffic)
        if cap_bytes and is_dot_like(instr, module):
            tilings, tnotes = kernel_tilings(instr, comp, module, cap_bytes)
            rows[(cname, instr.name)] = InstructionReuse(fr, tilings, tnotes)
        else:
            rows[(cname, instr.name)] = _instruction_reuse(fr, (), ())
    total = _program_total(analysis, rows)
    return ReuseAnalysis(rows, total, cap_bytes, cap_key, notes)


def _program_total(analysis: ModuleAnalysis, rows: dict[tuple[str, str], InstructionReuse]) -> int:
    from .multiplicity import callee_counts

    module = analysis.module
    memo: dict[str, int] = {}

    def total(cname: str) -> int:
        if cname in memo:
            return memo[cname]
        memo[cname] = 0  # guards against recursion in malformed modules
        s = 0
        for instr in module.computations[cname].instructions:
            r = rows.get((cname, instr.name))
            if r is not None:
                s += r.onchip_reuse_bytes
            if instr.opcode == "conditional":  # the branch the totals take
                s += total(analysis.branches[(cname, instr.name)])
            elif instr.opcode in ("while", "call", "async-start", "call-start"):
                for callee, k, _u, _b in callee_counts(instr, module):
                    s += total(callee) * k
        memo[cname] = s
        return s

    # callees first (iterative), so total() finds every callee memoized and never recurses
    for cname in post_order(module, [module.entry.name],
                            lambda i: i.opcode in ("while", "call", "conditional", "async-start", "call-start")):
        total(cname)
    return total(module.entry.name)
