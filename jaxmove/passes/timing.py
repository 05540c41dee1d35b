"""Time: a roofline estimate per kernel-level instruction, and a program time along the schedule.

Per instruction (``instruction_time``): launch overhead + max(compute, memory, network), after
Williams, Waterman & Patterson, "Roofline", CACM 2009, with the launch overhead additive as in
XLA's GPU performance model (``kKernelLaunchOverhead``, gpu_performance_model_base.h); GPU
GEMMs and collectives from hardware/gpu_gemm.py and hardware/nccl.py. Per program
(``estimate_times``): each computation walked in schedule order, async pairs overlapping the
work between start and done. README "Time estimates, on-chip reuse, hardware".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import Unmodeled
from ..hlo import Computation, Instruction, Module
from ..hlo.opcodes import OPCODES, names
from .callgraph import post_order
from .first_touch import FirstTouch, first_touch_pass
from .multiplicity import callee_counts
from .reuse import ReuseAnalysis, reuse_pass
from .traffic import FREE_OPCODES

if TYPE_CHECKING:
    from ..hardware.spec import HardwareSpec

BOUNDS = ("compute", "memory", "network", "overhead")

COLLECTIVE_OPCODES = frozenset(op for op, rec in OPCODES.items()
                               if rec.collective is not None and rec.async_part != "done")

# An asynchronous start and the queue it runs on; the dones (and updates) that wait for it
# (the opcode table, hlo/opcodes.py).
_ASYNC_STARTS = {op: rec.async_queue for op, rec in OPCODES.items() if rec.async_part == "start"}
_ASYNC_DONES = names(async_part="done")
_ASYNC_UPDATES = names(async_part="update")

_PASSES = {"default": 1, "high": 3, "highest": 6}  # bf16 passes of an f32 dot on TPU


@dataclass(frozen=True, slots=True)
class InstructionTime:
    """Estimated time of one kernel-level instruction. Every ``*_s`` is per program run
    (per execution × multiplicity) except ``per_execution_s``.

    Attributes:
      est_time_s: overhead + max(compute, memory, network).
      compute_time_s: None when some of its flops have no peak in the spec.
      memory_time_s: modeled HBM bytes / HBM bandwidth (a GPU GEMM kernel held up by its
        loads: the GEMM model's load-limited time when larger, with a note).
      network_time_s: None for a collective whose time is unmodeled; 0 for non-collectives.
      overhead_s: kernel launch overhead (0 for instructions that launch no kernel).
      bound: "compute" | "memory" | "network" | "overhead", or None when it takes no time.
      arithmetic_intensity: flops per modeled HBM byte (None when it moves no HBM bytes).
      hbm_bytes: modeled HBM bytes per program run (traffic + tiling re-reads).
      flops: flops per program run.
      peak_key: the ``flops_per_s`` key used for its matrix work (None without any).
      first_touch_bytes: bytes per program run written into freshly mapped pages
        (passes/first_touch.py); their time is part of ``memory_time_s``.
      first_touch_s: that time per program run (0 when the spec has no such term).
      gemm_fixed_s: the GPU GEMM model's fixed per-kernel cost per program run, part of
        ``overhead_s`` (0 for kernels that model does not time).
      launch_gap_s: the launch part of ``overhead_s`` per program run: the spec's
        ``kernel_launch_overhead_s``, or inside a GPU command buffer its
        ``command_buffer_launch_overhead_s`` (plus one ``kernel_launch_overhead_s`` for the command
        buffer's launch on its first kernel). ``est_time_s - launch_gap_s`` is the kernel's
        duration, what a profiler's kernel table shows.
      in_command_buffer: the kernel runs inside a command buffer (``command_buffer_runs``).
      launches_kernel: the instruction is a kernel launch (``_launches_kernel``), whatever its
        ``overhead_s`` (a spec may set ``kernel_launch_overhead_s = 0``, an ideal launch).
    """

    computation: str
    name: str
    opcode: str
    multiplicity: int
    est_time_s: float
    compute_time_s: float | None
    memory_time_s: float
    network_time_s: float | None
    overhead_s: float
    bound: str | None
    arithmetic_intensity: float | None
    hbm_bytes: int
    flops: int
    per_execution_s: float
    peak_key: str | None = None
    unmodeled: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    first_touch_bytes: int = 0
    first_touch_s: float = 0.0
    gemm_fixed_s: float = 0.0
    launch_gap_s: float = 0.0
    in_command_buffer: bool = False
    launches_kernel: bool = True

    @property
    def duration_s(self) -> float:
        """The kernel's duration per program run: ``est_time_s`` less its launch gaps."""
        return self.est_time_s - self.launch_gap_s


@dataclass
class TimeEstimate:
    """Time of one program run on one device.

    Attributes:
      spec_name: the hardware spec used.
      rows: (computation, instruction name) -> InstructionTime.
      est_time_s: program time along the schedule, async overlap included, and at least the
        program's HBM bytes / bandwidth (``estimate_times``).
      serial_time_s: sum of every instruction's est_time_s (no overlap).
      compute_time_s, memory_time_s, network_time_s, overhead_s: sums over instructions
        (per program run) of each component; network_time_s covers modeled collectives.
      kernels: kernel launches per program run.
      bound: the largest of the program's summed compute, memory, network time and
        overhead (kernel launches ``overhead_s`` + ``dispatch_overhead_s``): "compute",
        "memory", "network" or "overhead"; "none" when it does nothing.
      timeline: (computation, instruction, start_s, end_s) of the ENTRY computation's
        schedule; a while, conditional or call is one block; async ops span start to done.
      reuse: the ReuseAnalysis the memory times used.
      unmodeled: instructions whose time is incomplete, with the reason.
      dispatch_overhead_s: the spec's per-call host dispatch, included once in
        ``est_time_s`` (0 when the spec has none); not part of ``serial_time_s``.
      first_touch: the FirstTouch analysis the memory times used.
      launch_gap_s: the launch part of ``overhead_s`` (sum of the rows' ``launch_gap_s``); the
        rest of ``overhead_s`` is the GPU GEMM model's fixed per-kernel cost, part of the
        kernels' durations.
      kernel_duration_s: ``serial_time_s - launch_gap_s``: the kernels' durations summed.
      command_buffers: GPU command buffers launched per program run (``command_buffer_runs``).
      command_buffer_kernels: kernels per program run that run inside them.
      spec: the HardwareSpec itself (a user's file or ``--spec`` overrides included), for what
        reads its numbers later (the roofline plot); None in estimates built by hand.
    """

    spec_name: str
    rows: dict[tuple[str, str], InstructionTime]
    est_time_s: float
    serial_time_s: float
    compute_time_s: float
    memory_time_s: float
    network_time_s: float
    overhead_s: float
    kernels: int
    bound: str
    timeline: list[tuple[str, str, float, float]]
    reuse: ReuseAnalysis
    unmodeled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dispatch_overhead_s: float = 0.0
    first_touch: FirstTouch | None = None
    launch_gap_s: float = 0.0
    kernel_duration_s: float = 0.0
    command_buffers: int = 0
    command_buffer_kernels: int = 0
    spec: HardwareSpec | None = field(default=None, repr=False, compare=False)

    def row(self, computation: str, name: str) -> InstructionTime:
        return self.rows[(computation, name)]


# ---- compute peaks ----------------------------------------------------------------------

def _precision(instr: Instruction) -> str:
    v = instr.attrs.get("operand_precision")
    if v:
        first = v.strip("{} ").split(",")[0].strip().lower()
        return first or "default"
    bc = instr.backend_config or {}
    cfg = bc.get("gemm_backend_config", bc) if isinstance(bc, dict) else {}
    pc = cfg.get("precision_config") if isinstance(cfg, dict) else None
    ops = pc.get("operand_precision") if isinstance(pc, dict) else None
    if isinstance(ops, list) and ops:
        return str(ops[0]).lower()
    return "default"


def matrix_peak(spec, dtype: str, precision: str = "default", algorithm: str | None = None
                ) -> tuple[float | None, str | None, str]:
    """(peak FLOP/s, flops_per_s key, how it was chosen) for a dot on ``dtype`` operands.

    Returns (None, key, reason) when the spec has no figure for it.
    """
    from ..hardware import canonical_flops_dtype

    if algorithm:
        alg = algorithm.lower()
        if alg.startswith("dot_bf16_bf16"):
            passes = 6 if alg.endswith("x6") else 3 if alg.endswith("x3") else 9 if alg.endswith("x9") else 1
            p = spec.flops_per_s.get("bf16")
            return (p / passes if p else None), "bf16", f"algorithm={algorithm}: {passes} bf16 pass(es)"
        if alg.startswith("dot_tf32"):
            passes = 3 if alg.endswith("x3") else 1
            p = spec.flops_per_s.get("tf32")
            return (p / passes if p else None), "tf32", f"algorithm={algorithm}"
    try:
        key = canonical_flops_dtype(dtype)
    except ValueError:
        key = None
    if key is None:
        return None, None, f"no matrix peak for {dtype} operands"
    if key == "f32" and spec.kind == "tpu":
        passes = _PASSES.get(precision, 1)
        p = spec.flops_per_s.get("bf16")
        return (p / passes if p else None), "bf16", (f"f32 dot at {precision.upper()} precision runs as "
                                                     f"{passes} bf16 pass(es) on TPU (jax.lax.Precision)")
    if key == "f32" and spec.kind == "gpu" and precision != "highest" and "tf32" in spec.flops_per_s:
        return spec.flops_per_s["tf32"], "tf32", (f"f32 dot at {precision.upper()} precision runs on "
                                                  "tf32 tensor cores (jax.lax.Precision)")
    p = spec.flops_per_s.get(key)
    return p, key, (f"{key} peak" if p else f"spec '{spec.name}' has no flops_per_s.{key}")


def _is_matrix_instr(instr: Instruction, module: Module) -> bool:
    from .flops import custom_call_kind
    from .reuse import is_dot_like

    if instr.opcode == "fusion":
        return False
    if instr.opcode == "custom-call" and custom_call_kind(instr.custom_call_target) == "attention":
        return True
    return instr.opcode in ("dot", "ragged-dot", "scaled-dot") or is_dot_like(instr, module)


def _matrix_work(instr: Instruction, module: Module) -> list[Instruction]:
    """The dot-like instructions a kernel runs: itself, or those inside its fusion."""
    out: list[Instruction] = []
    stack = [instr]  # in the order a recursive walk meets them; iterative: any nesting depth
    while stack:
        i = stack.pop()
        if i.opcode == "fusion":
            fc = module.computations.get(i.called_computations[0]) if i.called_computations else None
            if fc is not None:
                stack.extend(reversed(fc.instructions))
        elif _is_matrix_instr(i, module):
            out.append(i)
    return out


def compute_time(instr: Instruction, module: Module, spec, flops: int, transcendentals: int
                 ) -> tuple[float | None, str | None, list[str], list[str]]:
    """(compute time s per execution or None, matrix peak key, unmodeled, notes)."""
    from .flops import instruction_flops

    unmodeled: list[str] = []
    notes: list[str] = []
    t = 0.0
    matrix_flops = 0
    key_used = None
    for m in _matrix_work(instr, module):
        fc = instruction_flops(m, module)
        if not fc.flops:
            continue
        matrix_flops += fc.flops
        owner = module.computations.get(m.computation)
        lhs = owner.by_name[m.operands[0]].shape if owner and m.operands and m.operands[0] in owner.by_name \
            else m.shape
        dtype = lhs.element_type if lhs.is_array else "f32"
        peak, key, how = matrix_peak(spec, dtype, _precision(m), m.attrs.get("algorithm"))
        if peak is None:
            unmodeled.append(f"compute time of '{m.name}': {how}")
            continue
        key_used = key_used or key
        if key in ("tf32",) or "pass" in how:
            notes.append(how)
        t += fc.flops / peak
    vector = max(0, flops - matrix_flops) + transcendentals
    if vector:
        vpeak = spec.flops_per_s.get("f32")
        if vpeak is None:
            unmodeled.append(f"spec '{spec.name}' has no f32 (vector unit) peak: time of {vector} "
                             "elementwise/transcendental operations unmodeled")
        else:
            t += vector / vpeak
    return (None if unmodeled and t == 0.0 else t), key_used, unmodeled, notes


def _gpu_gemm_time(instr: Instruction, comp: Computation, module: Module, spec):
    """(work seconds, fixed seconds, notes, GemmTime, reasons the time is incomplete) of a GEMM
    kernel from the GPU GEMM model (passes/gpu_kernel_time.py) when ``spec`` is a GPU with its
    figures and ``instr`` a dot / Triton gemm fusion / cuBLAS gemm on tensor cores; else None.
    The kernel's duration is work + fixed; the fixed part is charged with the launch overhead."""
    from ..hardware.gpu_gemm import gemm_model_applies
    from .gpu_kernel_time import gemm_kernel_time

    if not gemm_model_applies(spec):
        return None
    work = _matrix_work(instr, module)
    if len(work) != 1:
        return None
    m = work[0]
    owner = module.computations.get(m.computation)
    lhs = owner.by_name.get(m.operands[0]) if owner is not None and m.operands else None
    if lhs is None or not lhs.shape.is_array:
        return None
    peak, key, _how = matrix_peak(spec, lhs.shape.element_type, _precision(m), m.attrs.get("algorithm"))
    if key not in _TENSOR_CORE_KEYS:  # CUDA-core f32/f64 dots keep the roofline
        return None
    got = gemm_kernel_time(instr, comp, module, spec, peak, key)
    if got is None:
        return None
    t, notes, incomplete = got
    # a fusion is one kernel (its split-K reduction is a fusion of its own); a dot or cuBLAS
    # call runs its split-K reduction inside. (tile time, fixed per-kernel time)
    kernels = t.kernel_times_s[:1] if instr.opcode == "fusion" else t.kernel_times_s
    fixed = t.fixed_s + (t.reduce_fixed_s if len(kernels) > 1 else 0.0)
    return sum(kernels) - fixed, fixed, notes, t, incomplete


_TENSOR_CORE_KEYS = frozenset({"bf16", "f16", "tf32", "fp8", "int8", "int4", "fp4"})


def _gpu_nccl_time(info, spec, coll) -> float | None:
    from .gpu_kernel_time import nccl_time

    return nccl_time(info, spec, coll.spans_nodes(info, spec.devices_per_node))


# ---- network ----------------------------------------------------------------------------

def _is_collective(row) -> bool:
    """A collective opcode, or a row the collectives pass recognised (e.g. a fused one)."""
    return row.collective is not None or row.instr.opcode in COLLECTIVE_OPCODES


def network_time(row, comp: Computation, module: Module, spec) -> tuple[float | None, str | None]:
    """(seconds per execution, reason when unmodeled) of a collective, from
    ``passes/collectives.py``; (None, reason) when that pass or the spec cannot say."""
    from . import collectives as coll

    try:
        info = row.collective
        if info is None:
            info = coll.collective_info(row.instr, comp, module)
        if info is None:
            return None, "network time unmodeled: collectives pass gave no information"
        t = _gpu_nccl_time(info, spec, coll)  # GPU specs: the NCCL model (hardware/nccl.py)
        if t is None:
            t = coll.collective_time_s(info, spec)
    except Unmodeled as e:
        return None, f"network time unmodeled: {e}"
    if t is None:
        return None, f"network time unmodeled: spec '{spec.name}' lacks interconnect figures"
    return float(t), None


# ---- per instruction --------------------------------------------------------------------

_GPU_ID_OPS = frozenset({"partition-id", "replica-id"})


def _launches_kernel(instr: Instruction, spec=None) -> bool:
    """Whether ``instr`` pays a kernel's fixed cost. Not free opcodes (bitcast, tuple, ...).
    On TPU specs also not the DMA starts of async copies / slices / collectives (copy-start,
    slice-start, ...: the DMA engines run them beside the program) nor scalar operations
    outside fusions (the scalar unit's loop counters and indices): XLA:TPU gives none of them
    an ``estimated_cycles`` of their own (device corpus, v5e: it estimates 2,536 fusions,
    494 copies and 346 other array ops, and none of 1,985 copy-start / slice-start DMAs and
    757 of 761 scalar ops), nor the token-only sync-flag waits (``PrepareAsyncCallDone`` before a
    SparseCore ``call-start``: no ``estimated_cycles`` either, mixtral-8x7b-train on v5p)."""
    if instr.opcode in FREE_OPCODES:
        # XLA:GPU writes a partition / replica id with a device operation of its own (a 4-byte
        # memset: xla/backends/gpu/runtime/replica_id_thunk.cc), which a capture times (2.05 us
        # on the A100 Pax step); elsewhere it is free
        return spec is not None and spec.kind == "gpu" and instr.opcode in _GPU_ID_OPS
    if spec is not None and spec.kind == "tpu":
        if instr.opcode in _ASYNC_STARTS:
            return False
        shape = instr.shape
        if instr.opcode != "fusion" and ((shape.is_array and not shape.dims) or shape.element_type == "token"):
            return False
    return True


def instruction_time(row, module: Module, spec, reuse: ReuseAnalysis,
                     first_touch_bytes: int = 0, launch_s: float | None = None,
                     in_command_buffer: bool = False) -> InstructionTime:
    """The roofline time of one pipeline row, per execution (then x multiplicity):

        compute_time = sum over its dots/convolutions of flops / peak(dtype, precision)
                       + (other flops + transcendentals) / vector peak
        memory_time  = HBM bytes / hbm_bytes_per_s + first-touch bytes / first_touch_bytes_per_s
        network_time = collective time (hardware/nccl.py on GPU specs, else collectives.py)
        est_time     = kernel_launch_overhead_s + max(compute_time, memory_time, network_time,
                                                  kernel_min_duration_s)

    * HBM bytes: the traffic pass's plus the tiling model's re-reads (``passes/reuse.py``).
    * Matrix peak: ``matrix_peak`` (an f32 dot runs as tf32 on NVIDIA GPUs, as 1/3/6 bf16
      passes on TPU per ``jax.lax.Precision``; a printed ``algorithm=dot_*`` decides instead).
      On GPU specs a tensor-core GEMM is timed by its tiles (hardware/gpu_gemm.py).
    * Vector peak: the spec's ``f32`` figure (NVIDIA: CUDA cores); a transcendental counts one
      operation (a lower bound). Specs without it (TPUs) leave vector work unmodeled.
    * Launch overhead: once per instruction that launches a kernel (not a free opcode):
      ``launch_s`` per execution when given (a kernel inside a GPU command buffer,
      ``command_buffer_runs``), else the spec's ``kernel_launch_overhead_s``.
    * ``first_touch_bytes``: bytes per program run it writes into freshly mapped pages
      (``passes/first_touch.py``); timed only when the spec has ``first_touch_bytes_per_s``.
    * ``kernel_min_duration_s`` (GPU specs that give it): the shortest a launched kernel runs,
      however little its work; a kernel held up to it is ``overhead``-bound.
    * ``bound``: the largest term, or ``overhead`` when the launch overhead exceeds all three;
      ``arithmetic_intensity`` = flops / modeled HBM bytes.
    A collective without a network model gets ``network_time_s = None`` and is unmodeled.
    """
    instr = row.instr
    if instr.opcode == "custom-call" and instr.custom_call_target == "tpu_custom_call":
        from .pallas import pallas_instruction_time  # Pallas TPU: pipelined over its grid
        return pallas_instruction_time(row, module, spec)
    if instr.opcode == "custom-call" and instr.custom_call_target == "__gpu$xla.gpu.triton":
        from .pallas import triton_instruction_time  # Pallas Triton: its dots on the tensor cores
        return triton_instruction_time(row, module, spec, launch_s, in_command_buffer)
    comp = module.computations[row.computation]
    pe = row.per_execution
    mult = row.multiplicity.count
    unmodeled: list[str] = []
    notes: list[str] = []
    r = reuse.rows.get((row.computation, instr.name))
    extra = r.tiling_extra_read_bytes if r is not None else 0
    if r is not None:
        notes.extend(r.notes)
        if extra:
            notes.append(f"tiling model: +{extra} bytes of operand re-reads from HBM")
    hbm = pe.hbm_bytes + extra
    mem = hbm / spec.hbm_bytes_per_s
    ft_rate = getattr(spec, "first_touch_bytes_per_s", None)
    ft_s = 0.0
    if first_touch_bytes and ft_rate and mult:
        ft_s = first_touch_bytes / ft_rate / mult  # per execution
        mem += ft_s
        notes.append(f"first touch: {first_touch_bytes} bytes written into freshly mapped pages "
                     f"at {ft_rate:.4g} B/s (passes/first_touch.py)")
    if pe.host_to_device_bytes or pe.device_to_host_bytes:
        unmodeled.append("host <-> device transfer time unmodeled (no host link bandwidth in the spec)")
    comp_t, key, cu, cn = compute_time(instr, module, spec, pe.flops, pe.transcendentals)
    gemm = _gpu_gemm_time(instr, comp, module, spec) if comp_t is not None else None
    if gemm is not None:  # the kernel's tiles (math and loads, waves) + its fixed cost
        work_s, fixed_s, gnotes, gt, gincomplete = gemm
        unmodeled.extend(gincomplete)
        cn = [*cn, *gnotes, f"GEMM kernel fixed cost {fixed_s:.3g} s counted with the launch overhead"]
        if gt.bound == "compute":  # the tiles' tensor-core issue is the kernel's largest term
            comp_t = work_s
        else:  # held up by loads (HBM, or L2 -> shared memory): the kernel's work is memory time
            comp_t = gt.mma_s  # what the tensor cores spend on the padded tiles
            if work_s > mem:
                cn.append(f"memory time {work_s:.4g} s from the GPU GEMM model (HBM traffic "
                          f"{gt.hbm_bytes} bytes: {gt.memory_s:.4g} s; tiles "
                          f"{'waiting on their L2 -> shared-memory loads' if gt.feed_limited else 'MMA-limited'}: "
                          f"{gt.compute_s:.4g} s), above the traffic pass's {mem:.4g} s")
                mem = work_s
    unmodeled.extend(cu)
    notes.extend(cn)
    net: float | None = 0.0
    if _is_collective(row):
        net, why = network_time(row, comp, module, spec)
        if why:
            unmodeled.append(why)
    launches = _launches_kernel(instr, spec)
    if not launches:
        launch = 0.0
    else:
        launch = spec.kernel_launch_overhead_s if launch_s is None else launch_s
    overhead = launch
    if gemm is not None:
        overhead += gemm[1]
    gemm_fixed = gemm[1] if gemm is not None else 0.0
    parts = {"compute": comp_t or 0.0, "memory": mem, "network": net or 0.0}
    work = max(parts.values())
    floor = getattr(spec, "kernel_min_duration_s", None) if launches else None  # (a 0 s launch too)
    floored = bool(floor) and work < floor
    if floored:  # a kernel runs at least the spec's shortest duration (its grid's fill and drain)
        notes.append(f"work {work:.3g} s below the spec's kernel_min_duration_s: the kernel's "
                     f"duration is {floor:.3g} s")
        work = floor
    per_exec = overhead + work
    if per_exec <= 0.0:
        bound = None
    elif overhead > work or floored:
        bound = "overhead"
    else:
        bound = max(parts, key=lambda k: parts[k])
    ai = (pe.flops / hbm) if hbm else None
    return InstructionTime(
        row.computation, instr.name, instr.opcode, mult, per_exec * mult,
        None if comp_t is None else comp_t * mult, mem * mult,
        None if net is None else net * mult, overhead * mult, bound, ai, hbm * mult,
        pe.flops * mult, per_exec, key, tuple(dict.fromkeys(unmodeled)), tuple(dict.fromkeys(notes)),
        first_touch_bytes if ft_s else 0, ft_s * mult, gemm_fixed * mult, launch * mult,
        in_command_buffer and launches, launches)


# ---- GPU command buffers ----------------------------------------------------------------

#: XLA:GPU's defaults (xla/debug_options_flags.cc): ``xla_gpu_enable_command_buffer`` = FUSION,
#: CUBLAS, CUBLASLT, CUSTOM_CALL, CUDNN, DYNAMIC_SLICE_FUSION (not COLLECTIVES, WHILE or
#: CONDITIONAL), and ``xla_gpu_graph_min_graph_size`` = 5: a run of at least 5 such commands
#: in one computation's schedule is recorded as one command buffer (CUDA graph)
#: (xla/service/gpu/transforms/command_buffer_scheduling.cc).
COMMAND_BUFFER_MIN_SIZE = 5
COMMAND_BUFFER_DEFAULT_TYPES = frozenset({"FUSION", "CUBLAS", "CUBLASLT", "CUSTOM_CALL", "CUDNN",
                                          "DYNAMIC_SLICE_FUSION"})


@dataclass(frozen=True, slots=True)
class CommandBufferConfig:
    """What XLA:GPU records into command buffers: the ``xla_gpu_enable_command_buffer`` types
    and ``xla_gpu_graph_min_graph_size`` (defaults: ``COMMAND_BUFFER_DEFAULT_TYPES``, 5)."""

    types: frozenset = COMMAND_BUFFER_DEFAULT_TYPES
    min_size: int = COMMAND_BUFFER_MIN_SIZE

    @classmethod
    def from_xla_flags(cls, xla_flags: str | None = None) -> "CommandBufferConfig":
        """The config the XLA flags give (``os.environ["XLA_FLAGS"]`` when None): a program
        compiled with ``--xla_gpu_enable_command_buffer=`` (empty: none) runs every kernel from
        the stream, as a runtime without CUDA graphs does. Unknown flags are ignored."""
        import os
        import shlex

        text = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
        types, size = COMMAND_BUFFER_DEFAULT_TYPES, COMMAND_BUFFER_MIN_SIZE
        try:
            words = shlex.split(text)
        except ValueError:
            words = text.split()
        for w in words:
            key, eq, val = w.partition("=")
            if not eq:
                continue
            if key == "--xla_gpu_enable_command_buffer":
                items = {v.strip().upper() for v in val.split(",") if v.strip()}
                if any(v[:1] in "+-" for v in items):  # +TYPE / -TYPE edit the defaults
                    cur = set(types)
                    for v in items:
                        (cur.add if v[0] == "+" else cur.discard)(v[1:])
                    types = frozenset(cur)
                else:
                    types = frozenset(items)
            elif key == "--xla_gpu_graph_min_graph_size" and val.strip().isascii() and val.strip().isdigit():
                size = max(1, int(val))
        return cls(types, size)

    def is_command(self, instr: Instruction) -> bool:
        """A fusion (FUSION), a library call (cuBLAS: CUBLAS / CUBLASLT, cuDNN: CUDNN, any
        other custom call: CUSTOM_CALL) or a collective, its start or done (COLLECTIVES) of an
        enabled type."""
        if instr.opcode == "fusion":
            return "FUSION" in self.types
        rec = OPCODES.get(instr.opcode)
        if rec is not None and rec.collective is not None:
            return "COLLECTIVES" in self.types
        if instr.opcode != "custom-call":
            return False
        target = (instr.custom_call_target or "").lower()
        if "cublaslt" in target:
            return "CUBLASLT" in self.types
        if "cublas" in target:
            return "CUBLAS" in self.types
        if "cudnn" in target:
            return "CUDNN" in self.types
        return "CUSTOM_CALL" in self.types


def command_buffer_runs(comp: Computation, module: Module,
                        config: CommandBufferConfig | None = None) -> list[list[str]]:
    """The runs of ``comp``'s schedule XLA:GPU records as command buffers: maximal runs of
    consecutive fusions / custom calls (instructions that move nothing, such as bitcast,
    tuple, get-tuple-element, parameter, constant, neither join nor break a run; anything else
    ends it: collectives, while, conditional, copies, async pairs), kept when at least
    ``COMMAND_BUFFER_MIN_SIZE`` long. Fusion computations have none (their instructions are
    the fusion's kernel). ``config``: the enabled types and minimum size (default: XLA's
    defaults as changed by ``XLA_FLAGS``, ``CommandBufferConfig.from_xla_flags``). Returns the
    instruction names of each run, in schedule order."""
    config = config if config is not None else CommandBufferConfig.from_xla_flags()
    runs: list[list[str]] = []
    cur: list[str] = []
    for instr in schedule_order(comp, module):
        if config.is_command(instr):
            cur.append(instr.name)
        elif instr.opcode in FREE_OPCODES:
            continue
        else:
            if len(cur) >= config.min_size:
                runs.append(cur)
            cur = []
    if len(cur) >= config.min_size:
        runs.append(cur)
    return runs


def _command_buffer_launches(module: Module, spec, computations) -> dict[tuple[str, str], float]:
    """(computation, instruction) -> launch overhead per execution of each kernel that runs in
    a command buffer: the spec's ``command_buffer_launch_overhead_s``, and for a run's first
    kernel also one ``kernel_launch_overhead_s`` (the command buffer's launch). Empty unless
    the spec is a GPU's with ``command_buffer_launch_overhead_s``."""
    gap = getattr(spec, "command_buffer_launch_overhead_s", None)
    if spec.kind != "gpu" or not gap:
        return {}
    out: dict[tuple[str, str], float] = {}
    config = CommandBufferConfig.from_xla_flags()
    for cname in computations:
        comp = module.computations[cname]
        for run in command_buffer_runs(comp, module, config):
            for k, name in enumerate(run):
                out[(cname, name)] = gap + (spec.kernel_launch_overhead_s if k == 0 else 0.0)
    return out


def _command_buffer_firsts(module: Module, computations) -> set[tuple[str, str]]:
    """(computation, instruction) of each command buffer's first kernel (``command_buffer_runs``),
    the one that pays the command buffer's launch."""
    config = CommandBufferConfig.from_xla_flags()
    return {(cname, run[0]) for cname in computations
            for run in command_buffer_runs(module.computations[cname], module, config) if run}


# ---- schedule ---------------------------------------------------------------------------

def _control_predecessors(instr: Instruction) -> list[str]:
    v = instr.attrs.get("control-predecessors")
    if not v:
        return []
    return [p.strip().lstrip("%") for p in v.strip("{} ").split(",") if p.strip()]


def schedule_order(comp: Computation, module: Module) -> list[Instruction]:
    """The order instructions of ``comp`` run in: printed order when the module is scheduled,
    else a topological order (operands and control predecessors first; ties in printed
    order). Cycles (malformed input) fall back to printed order for the rest."""
    if module.is_scheduled:
        return list(comp.instructions)
    import heapq

    index = {i.name: k for k, i in enumerate(comp.instructions)}
    preds = {i.name: {p for p in (*i.operands, *_control_predecessors(i)) if p in index}
             for i in comp.instructions}
    succs: dict[str, list[str]] = {i.name: [] for i in comp.instructions}
    for name, ps in preds.items():
        for p in ps:
            succs[p].append(name)
    indeg = {n: len(ps) for n, ps in preds.items()}
    ready = [index[n] for n, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    out: list[Instruction] = []
    while ready:
        k = heapq.heappop(ready)
        instr = comp.instructions[k]
        out.append(instr)
        for s in succs[instr.name]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, index[s])
    if len(out) < len(comp.instructions):
        seen = {i.name for i in out}
        out.extend(i for i in comp.instructions if i.name not in seen)
    return out


def _async_root(comp: Computation, instr: Instruction) -> str | None:
    """The start instruction a done (or update) waits for."""
    cur = instr
    while cur.operands:
        op = comp.by_name.get(cur.operands[0])
        if op is None:
            return None
        if op.opcode in _ASYNC_UPDATES:
            cur = op
            continue
        return op.name
    return None


class _Walker:
    """The program's time along its schedule (``estimate_times``); with ``per_execution``
    (InstructionTime -> seconds per execution) and ``serial``, the sum of that one term along
    the same control flow (trip counts, the branch the totals take) with nothing overlapped:
    the HBM floor of the program."""

    def __init__(self, module: Module, times: dict[tuple[str, str], InstructionTime],
                 branches: dict[tuple[str, str], str], per_execution=None, serial: bool = False):
        self.module = module
        self.times = times
        self.branches = branches  # conditional -> the branch the totals take
        self.memo: dict[str, float] = {}
        self.timeline: list[tuple[str, str, float, float]] = []
        self._filling = False
        self._per_execution = per_execution
        self._serial = serial

    def _memoize_callees(self, cname: str) -> None:
        """Memoize every computation that ``comp_time(cname)`` recurses into (the callees of
        its while / call / conditional / async-start, at any depth), callees first: an
        iterative post-order, so that the recursion below never nests more than one level
        (a 10,000-deep call chain hit Python's recursion limit in the trace's walkers)."""
        comps = self.module.computations
        order: list[str] = []
        seen = {cname}
        stack: list[tuple[str, bool]] = [(cname, False)]
        while stack:
            c, done = stack.pop()
            if done:
                order.append(c)
                continue
            stack.append((c, True))
            for instr in comps[c].instructions:
                if instr.opcode in ("while", "call", "conditional", "async-start", "call-start"):
                    for callee in instr.called_computations:
                        if callee not in seen and callee in comps and callee not in self.memo:
                            seen.add(callee)
                            stack.append((callee, False))
        self._filling = True
        try:
            for c in order[:-1]:
                if c not in self.memo:
                    self.comp_time(c)
        finally:
            self._filling = False

    def own(self, cname: str, instr: Instruction) -> float:
        t = self.times.get((cname, instr.name))
        if t is None:
            return 0.0
        return t.per_execution_s if self._per_execution is None else self._per_execution(t)

    def comp_time(self, cname: str, record: bool = False) -> float:
        if not record and cname in self.memo:
            return self.memo[cname]
        if not self._filling:
            self._memoize_callees(cname)
        self.memo.setdefault(cname, 0.0)  # recursion guard
        comp = self.module.computations[cname]
        cursor = 0.0
        queues: dict[str, float] = {}
        pending: dict[str, tuple[float, float]] = {}  # start name -> (launch time, end time)
        for instr in schedule_order(comp, self.module):
            op = instr.opcode
            start = cursor
            if op in _ASYNC_STARTS:
                dur = self.own(cname, instr)
                if op in ("async-start", "call-start"):  # the wrapped / called computation
                    dur += sum(self.comp_time(c) for c in instr.called_computations)
                if self._serial:  # (the floor: nothing beside the stream)
                    cursor += dur
                    continue
                q = _ASYNC_STARTS[op]
                begin = max(cursor, queues.get(q, 0.0))
                queues[q] = begin + dur
                pending[instr.name] = (cursor, begin + dur)
                continue
            if op in _ASYNC_DONES:
                root = _async_root(comp, instr)
                if root in pending:
                    launched, end = pending.pop(root)
                    cursor = max(cursor, end)
                    if record:
                        self.timeline.append((cname, root, launched, end))
                continue
            if op == "while":
                counts = callee_counts(instr, self.module)
                cursor += sum(self.comp_time(c) * k for c, k, _u, _b in counts)
            elif op == "conditional":
                cursor += self.comp_time(self.branches[(cname, instr.name)])
            elif op == "call":
                cursor += sum(self.comp_time(c) for c in instr.called_computations)
            else:
                cursor += self.own(cname, instr)
            if record and cursor > start:
                self.timeline.append((cname, instr.name, start, cursor))
        for name, (launched, end) in pending.items():  # never waited for: the program waits at exit
            cursor = max(cursor, end)
            if record:
                self.timeline.append((cname, name, launched, end))
        self.memo[cname] = cursor
        return cursor


def estimate_times(analysis, spec, reuse: ReuseAnalysis | None = None,
                   first_touch: FirstTouch | None = None) -> TimeEstimate:
    """Estimated time of every kernel-level instruction and of one program run.

    Args:
      analysis: a pipeline ModuleAnalysis.
      spec: a HardwareSpec (``jaxmove.hardware.load_spec``).
      reuse: a ReuseAnalysis computed with ``spec`` (computed here when None).
      first_touch: the first-touch pass's result on ``spec`` (computed here when None).
    The program time walks each computation in schedule order (the printed order when
    ``is_scheduled=true``, else a topological order of operands and control predecessors),
    adding each instruction's time. An async operation (``*-start``/``*-done``, send/recv,
    async-start/done) runs on a side queue from its start, and the stream waits for it only at
    its done; async transfers of one kind queue behind each other. A while costs trip count x
    body + (trip count + 1) x condition, a conditional the branch the totals take
    (``analysis.branches``), a call its callee. The program time is at least the HBM floor,
    every instruction's HBM bytes / ``hbm_bytes_per_s`` (+ first-touch time) along the same
    control flow with nothing overlapped (one HBM: what runs beside the stream shares its
    bandwidth; the roofline's memory bound, Williams et al., CACM 2009), with a note when that
    floor is above the schedule. ``spec.dispatch_overhead_s`` (calibrated hosts) is added once
    per program run.
    """
    module = analysis.module
    reuse = reuse if reuse is not None else reuse_pass(analysis, spec)
    rows: dict[tuple[str, str], InstructionTime] = {}
    unmodeled: list[str] = []
    ft = first_touch if first_touch is not None else first_touch_pass(
        analysis, spec, schedule_order(module.entry, module))
    sequential = list(post_order(module, [module.entry.name],
                                 lambda i: i.opcode in ("while", "call", "conditional", "async-start", "call-start")))
    cb = _command_buffer_launches(module, spec, sequential)
    for row in analysis.rows:
        key = (row.computation, row.instr.name)
        it = instruction_time(row, module, spec, reuse, ft.rows.get(key, 0), cb.get(key), key in cb)
        rows[(row.computation, row.instr.name)] = it
        for why in it.unmodeled:
            unmodeled.append(f"{row.instr.name}: {why}")
    walker = _Walker(module, rows, analysis.branches)
    dispatch = getattr(spec, "dispatch_overhead_s", None) or 0.0
    # callees first (iterative), so comp_time finds every callee memoized and never recurses
    for cname in sequential:
        walker.comp_time(cname)
    scheduled = walker.comp_time(module.entry.name, record=True)
    # HBM is one resource: the async copies, prefetches and collectives the schedule runs beside
    # the stream share its bandwidth with the kernels there, so the program takes at least its
    # HBM time along the same control flow: each row's memory time (HBM bytes / bandwidth +
    # first touch; a Pallas kernel's, its grid's DMAs), except where the GPU GEMM model raised
    # it to the tiles' on-chip loads (then its HBM bytes alone)
    hbm_per_s = spec.hbm_bytes_per_s

    def hbm_s(t: InstructionTime) -> float:
        if not t.multiplicity:
            return 0.0
        if t.gemm_fixed_s:
            return (t.hbm_bytes / hbm_per_s + t.first_touch_s) / t.multiplicity
        return t.memory_time_s / t.multiplicity

    hbm_floor = _Walker(module, rows, analysis.branches, serial=True, per_execution=hbm_s
                        ).comp_time(module.entry.name)
    total = max(scheduled, hbm_floor) + dispatch
    # the component sums count what the totals count: a conditional's other branches are out
    # (they were in: a branch that all-reduces made the program "network-bound" while the
    # totals, and the schedule, took the other)
    if analysis.branches:
        counted = module.reachable_computations([module.entry.name], branches=analysis.branches)
        vals = [t for k, t in rows.items() if k[0] in counted]
    else:
        vals = rows.values()
    comp_s = sum(r.compute_time_s or 0.0 for r in vals)
    mem_s = sum(r.memory_time_s for r in vals)
    net_s = sum(r.network_time_s or 0.0 for r in vals)
    over_s = sum(r.overhead_s for r in vals)
    kernels = sum(r.multiplicity for r in vals if r.launches_kernel)
    gaps_s = sum(r.launch_gap_s for r in vals)
    cb_kernels = sum(r.multiplicity for r in vals if r.in_command_buffer)
    cb_runs = 0
    if cb:
        firsts = {k for k, v in cb.items() if v > spec.command_buffer_launch_overhead_s}
        if spec.kernel_launch_overhead_s == 0:  # (an ideal launch: no first kernel pays more)
            firsts = _command_buffer_firsts(module, sequential)
        cb_runs = sum(rows[k].multiplicity for k in firsts if k in rows)
    parts = {"compute": comp_s, "memory": mem_s, "network": net_s}
    # the program's bound is its largest component, launch + dispatch overhead included
    overall = {**parts, "overhead": over_s + dispatch}
    bound = max(overall, key=lambda k: overall[k]) if any(overall.values()) else "none"
    notes = list(reuse.notes) + list(ft.notes)
    from ..hardware.overrides import spec_notes
    # hardware/overrides.py: say the device is not the datasheet's (a user's file of a built-in
    # spec's name, --spec overrides)
    notes.extend(spec_notes(spec))
    if hbm_floor > scheduled * (1 + 1e-9):
        notes.append(f"program time raised from the schedule's {scheduled:.4g} s to {hbm_floor:.4g} s, "
                     "its HBM bytes / bandwidth: the schedule runs async copies, prefetches or "
                     "collectives beside memory-bound kernels, but they share HBM's bandwidth "
                     "(the timeline is the schedule's)")
    if dispatch:
        notes.append(f"program time includes the spec's per-call dispatch overhead ({dispatch:.3g} s)")
    if any(m.unknown_trip_count for m in analysis.multiplicity.values()):
        notes.append("some while loops have no known trip count: their bodies are timed once")
    if over_s > max(parts.values(), default=0.0):
        gemm_fixed = sum(r.gemm_fixed_s for r in vals)
        fixed = (f" + {gemm_fixed:.3g} s of the GPU GEMM model's fixed per-kernel cost "
                 f"(hardware/gpu_gemm.py) on the {sum(r.multiplicity for r in vals if r.gemm_fixed_s)} "
                 "of them that are GEMMs") if gemm_fixed else ""
        overlap = (f"; the program's time, {total:.3g} s, is less than this sum because the async "
                   "operations' launches run beside the stream (timeline)") if total < over_s else ""
        launches = (f"{kernels - cb_kernels} kernels x {spec.kernel_launch_overhead_s:g} s"
                    + (f", {cb_kernels} in {cb_runs} command buffers x "
                       f"{spec.command_buffer_launch_overhead_s:g} s + one launch each" if cb_kernels else ""))
        # the rest of a row's overhead, beyond its launch and the GEMM model's fixed cost: Pallas
        # TPU kernels' per-grid-step cost (passes/pallas.py), inside their durations
        steps = [(r.overhead_s - r.launch_gap_s - r.gemm_fixed_s, r.multiplicity) for r in vals]
        steps = [(s, m) for s, m in steps if s > 1e-12 * max(over_s, 1e-30)]
        if steps:
            launches += (f" + {sum(s for s, _ in steps):.3g} s of per-grid-step overhead in "
                         f"{sum(m for _, m in steps)} Pallas kernel runs (passes/pallas.py)")
        notes.append(f"kernel launch overhead {over_s:.3g} s ({launches}{fixed}) "
                     f"exceeds the compute, memory and network time of the work{overlap}")
    if cb_kernels:
        notes.append(f"{cb_kernels} of {kernels} kernels run in {cb_runs} GPU command buffers (CUDA "
                     f"graphs; XLA:GPU's default for runs of >= {COMMAND_BUFFER_MIN_SIZE} fusions / library "
                     f"calls; XLA_FLAGS=--xla_gpu_enable_command_buffer= turns them off): {spec.command_buffer_launch_overhead_s:g} s of gap each instead of "
                     f"{spec.kernel_launch_overhead_s:g} s; launch gaps {gaps_s:.3g} s of the program's "
                     "serial time, kernel durations the rest")
    serial = sum(r.est_time_s for r in vals)
    return TimeEstimate(spec.name, rows, total, serial, comp_s, mem_s, net_s,
                        over_s, kernels, bound, walker.timeline, reuse, unmodeled, notes, dispatch, ft,
                        gaps_s, serial - gaps_s, cb_runs, cb_kernels, spec)



# ---- against XLA:TPU's own estimate -------------------------------------------------------

XLA_DISAGREEMENT_FACTOR = 2.0


def xla_comparison_note(times: TimeEstimate, xla) -> str | None:
    """When jaxmove's time and XLA:TPU's own estimate of the same kernels differ by more than
    ``XLA_DISAGREEMENT_FACTOR``, a note saying which components differ, else None.

    Compared on the same instructions: those XLA gave ``estimated_cycles``
    (capture/xla_figures.py, ``xla.rows``: seconds per program run at the spec's clock), ours
    being their ``est_time_s``; then split by our bound (compute, memory, overhead) to say where
    the difference sits, the instruction that differs most named with both times, and our time
    on instructions XLA does not estimate (custom calls, DMA starts) given beside it.
    ``xla``: an XlaFigures, or None (then None).
    """
    rows = getattr(xla, "rows", None) or {}
    pairs = [(times.rows[k], x.estimated_s) for k, x in rows.items()
             if k in times.rows and x.estimated_s is not None]
    if not pairs:
        return None
    ours = sum(t.est_time_s for t, _x in pairs)
    theirs = sum(x for _t, x in pairs)
    if ours <= 0 or theirs <= 0:
        return None
    ratio = ours / theirs
    if 1 / XLA_DISAGREEMENT_FACTOR <= ratio <= XLA_DISAGREEMENT_FACTOR:
        return None
    by_bound: dict[str, list[float]] = {}
    for t, x in pairs:
        b = by_bound.setdefault(t.bound or "none", [0.0, 0.0, 0])
        b[0] += t.est_time_s
        b[1] += x
        b[2] += 1
    parts = ", ".join(f"{bound}-bound kernels (ours) {o:.3g} s vs XLA {x:.3g} s over {n}"
                      for bound, (o, x, n) in sorted(by_bound.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1])))
    worst_t, worst_x = max(pairs, key=lambda p: abs(p[0].est_time_s - p[1]))
    covered = {id(t) for t, _x in pairs}
    rest = sum(t.est_time_s for t in times.rows.values() if id(t) not in covered)
    return (f"jaxmove's time of the {len(pairs)} kernels XLA:TPU estimates is {ours:.3g} s, XLA's "
            f"{theirs:.3g} s ({ratio:.2g}x): {parts}; the largest difference is {worst_t.name} "
            f"({worst_t.opcode}, {worst_t.bound}-bound here: ours {worst_t.est_time_s:.3g} s, XLA "
            f"{worst_x:.3g} s); ours adds {rest:.3g} s on instructions XLA does not estimate "
            "(custom calls, DMAs, collectives). Neither is a measurement: compare on the device "
            "(jaxmove compare) before trusting either")
