"""Excess movement: what a program moves beyond the compulsory minimum, why, and the fix.

*Compulsory* traffic of one program run (per device) is what the program's semantics need
(DESIGN.md, "Compulsory and excess"):

* each ENTRY parameter is read once, for the footprint the program needs of it: the sum over
  the kernels that read it (directly, or through a copy of it) of the bytes each touches,
  at most the parameter's data bytes (a gathered row, a sliced window, a whole weight);
* each result leaf is written once (its data bytes); a result that updates a parameter (the
  output aliased to it, or built on a copy of it) writes only the update: the bytes of its
  in-place dynamic-update-slice / scatter writes (in a fusion that rebuilds the buffer, the
  update operand of its dynamic-update-slice);
* an intermediate (a value written by one kernel and read by others) that fits on chip
  (its data bytes at most the on-chip capacity of ``reuse.onchip_capacity_bytes(spec)``)
  costs nothing; one that does not fit is written once and read once per time it is written;
  without a hardware spec the capacity is unknown and every intermediate is such a spill;
* a collective sends its wire bytes (``passes/collectives.py``) at the width of the data
  (a bf16 value converted to f32 to be sent counts at bf16) and only the part of an
  all-gather's result that the program reads;
* the program's own host I/O (infeed, outfeed, host send/recv) is compulsory; a host
  offload and its return are not.

*Compiled* traffic is what the traffic pass counts (``passes/traffic.py``, the report's
totals; a conditional counts its costliest branch, as the totals do) plus, with a spec, the
operand re-reads of the tiling model of dots (``passes/reuse.py``), the bytes the time model
charges. Every access of every kernel is split into a compulsory part and *excess*, and each
excess byte gets one cause, so per role and per path

    compiled = compulsory + sum of causes + unattributed

holds exactly. Causes (``CAUSE_KINDS``; the first that applies):

1. ``tile_padding``: physical minus data bytes of tiled layouts (TPU ``T(8,128)``).
2. The kernel's own kind: ``rematerialization`` (an instruction XLA's rematerialization
   cloned, named ``*.remat*``, or one from a ``jax.checkpoint``'s recomputation, op_name
   ``rematted_computation``), ``host_round_trip`` (MoveToHost / MoveToDevice, copies between
   host and device memory), ``split_k_partials`` (a Triton gemm fusion with ``split_k`` > 1,
   or whose root dot's ``[S, M, N]`` result every consumer sums over S: its partial sums,
   written and read back), ``dot_as_multiply_reduce`` (a dot with a 1-row operand that XLA
   compiled as a multiply kernel whose product a reduce kernel reads back) -- these two are
   causes of what the kernel writes: its operand reads are compulsory as any kernel's (a
   split-K gemm reads its weight as the gemm would) --, and the copy kernels -- ``copy`` /
   ``transpose`` / ``convert`` / ``reshape``, or a fusion whose root (or, multi-output, every
   root element) is a chain of them from one parameter:
   ``not_donated`` when the copy is of a parameter whose update the program returns (XLA
   copies an argument it may not overwrite), else ``layout_change`` or ``dtype_conversion``;
   a (dynamic-)slice kernel of a parameter or of a copy of one (XLA:TPU copies a scanned
   layer's window of a stacked KV cache out before attention) is ``slice_copy``: its reader's
   read is the parameter's compulsory read, the window's write and read-back are no spill.
   An in-place update of a copy of an updated parameter (copied into another layout or into
   VMEM, updated, copied back) is the compulsory update write; an update made on chip is
   credited to the kernel that writes the result back to HBM. A result that updates a
   parameter in a buffer of its own (rebuilt whole) is read from the parameter's read budget.
3. A read of a copy of a buffer beyond that buffer's footprint: the copy's cause.
4. The buffer: a parameter read again beyond its footprint, or a spilled intermediate read
   more often than written, is ``re_read`` (the same buffer read by several kernels, or in
   every loop iteration); an intermediate that fits on chip is
   ``materialized_intermediate`` (a fusion boundary); an update of a parameter written
   beyond its update bytes is ``whole_rewrite``.
5. Tiling: ``tiling_re_read``; collectives: ``collective_wider_than_data``,
   ``all_gather_partly_used``.
6. Anything else: ``unattributed`` (reported, never dropped).

Time: a cause's HBM bytes at the spec's ``hbm_bytes_per_s`` plus its wire bytes at the link
bandwidth of the collective (``collectives.link_bandwidth_bytes_per_s``): the memory time the
bytes add (the saving is that much where the kernel is memory-bound). Host bytes have no
bandwidth in the specs: their time is unmodeled (``untimed_bytes``).

The pass is a pure function of (analysis, entry parameters, spec, reuse); passes never print.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping
from operator import itemgetter
from dataclasses import dataclass, field

from ..units import human_bytes
from .._perf import gc_paused
from ..hlo import Computation, Instruction, Module
from ..hlo.shape import HOST_MEMORY_SPACE
from ..vocab import PATHS, ROLES
from .roles import entry_parameter_name, leaf_position, roles_pass
from .traffic import NO_TRAFFIC, ON_CHIP_MEMORY_SPACES

#: Stable cause keys of the JSON ``excess.causes[].kind`` (may be added to, never removed).
CAUSE_KINDS = ("not_donated", "donated_but_copied", "materialized_intermediate", "layout_change", "dtype_conversion",
               "re_read", "tiling_re_read", "whole_rewrite", "tile_padding", "split_k_partials",
               "rematerialization", "all_gather_partly_used", "collective_wider_than_data",
               "host_round_trip", "dot_as_multiply_reduce", "slice_copy")
UNATTRIBUTED = "unattributed"
#: Instructions listed per cause (the costliest); ``num_instructions`` counts them all.
MAX_LISTED = 10

_HBM_READ, _HBM_WRITE = "hbm_to_onchip", "onchip_to_hbm"
# causes of a kernel's own kind: program-wide, no subject
_NO_SUBJECT_CAUSES = frozenset({"rematerialization", "split_k_partials", "dot_as_multiply_reduce",
                                "host_round_trip"})
# kernel causes of what a kernel writes (its partial sums, its product): its own operand reads are
# compulsory as any kernel's (a split-K gemm reads its weight as the gemm would)
_WRITE_ONLY_CAUSES = frozenset({"split_k_partials", "dot_as_multiply_reduce"})
_COPY_OPS = frozenset({"copy", "transpose", "convert", "reshape", "bitcast-convert"})
_FUSED_COPY_OPS = _COPY_OPS | {"bitcast"}
# a window of a buffer copied out (a copy kernel only when the buffer is a parameter or a copy of one)
_SLICE_OPS = frozenset({"slice", "dynamic-slice"})
_ALIAS_LEAFWISE = frozenset({"bitcast", "add-dependency", "domain", "opt-barrier",
                             "optimization-barrier"})
# opcodes whose value shares a buffer with another value (``_Excess._union_all``; and ``*-done``)
_UNION_OPS = _ALIAS_LEAFWISE | {"get-tuple-element", "tuple", "while", "call", "async-start", "conditional",
                                "dynamic-update-slice", "scatter", "fusion"}
_ZERO = (0,)  # range(1)
_NONE = object()  # no value yet
_NATIVE_STARTS = frozenset({"all-reduce-start", "all-gather-start", "collective-permute-start"})
_OPERAND_RESULT_STARTS = frozenset({"all-gather-start", "collective-permute-start"})
_HOST_IO = frozenset({"infeed", "outfeed", "send", "recv"})
_HOST_TARGETS = frozenset({"MoveToHost", "MoveToDevice"})
# kernels that never stage through host memory themselves (the program's own host I/O, and
# fusions/dots, whose operands a host copy would have moved first)
_NO_HOST_CHECK = _HOST_IO | {"fusion", "dot", "convolution"}
_COPY_OR_SLICE_OPS = _COPY_OPS | _SLICE_OPS
# what a fused copy's root is through bitcasts and converts (``_fused_chain``'s ops, or its parameter)
_FUSED_CHAIN_OPS = _FUSED_COPY_OPS | _SLICE_OPS
_COPY_CHAIN_OPS = _FUSED_CHAIN_OPS | {"parameter"}


# ---- records ------------------------------------------------------------------------------

class _PerInstruction(Mapping):
    """``ExcessAnalysis.per_instruction``: (computation, instruction) -> excess bytes, the
    dict built on first use from the pass's bytes per row number (most callers never read
    it: ``jaxmove analyze`` without a frame). Read-only; iterates in the order the rows were
    first charged; pickles and deep-copies as a plain dict."""

    __slots__ = ("_rows", "_by_row", "_dict")

    def __init__(self, rows, by_row: dict[int, int]):
        self._rows, self._by_row, self._dict = rows, by_row, None

    def _d(self) -> dict[tuple[str, str], int]:
        d = self._dict
        if d is None:
            rows = self._rows
            d = self._dict = {(rows[k].computation, rows[k].instr.name): nbytes
                              for k, nbytes in self._by_row.items()}
            self._rows = self._by_row = None
        return d

    def __getitem__(self, key):
        return self._d()[key]

    def get(self, key, default=None):
        return self._d().get(key, default)

    def __contains__(self, key) -> bool:
        return key in self._d()

    def __iter__(self):
        return iter(self._d())

    def __len__(self) -> int:
        return len(self._d())

    def keys(self):
        return self._d().keys()

    def items(self):
        return self._d().items()

    def values(self):
        return self._d().values()

    def __eq__(self, other):
        return self._d() == (other._d() if isinstance(other, _PerInstruction) else other)

    def __repr__(self) -> str:
        return repr(self._d())

    def __reduce__(self):
        return dict, (self._d(),)


@dataclass(frozen=True, slots=True)
class CauseInstruction:
    """One instruction responsible for (part of) a cause: bytes per program run."""

    computation: str
    name: str
    opcode: str
    bytes: int
    source: str | None
    op_name: str | None


@dataclass(frozen=True)
class ExcessCause:
    """Bytes moved for one reason, per program run.

    Attributes:
      kind: one of ``CAUSE_KINDS`` or ``unattributed``.
      subject: what it is about (a parameter path, an argument name; "" for program-wide).
      bytes: all paths together; by_role: HBM bytes per role; by_path: bytes per path.
      time_s: HBM bytes / hbm_bytes_per_s + wire bytes / link bandwidth (None without a
        spec, or when no part of it can be timed); untimed_bytes: bytes not in time_s.
      fix: the change that would remove it, in the words a JAX user acts on.
      flops: flops of the instructions responsible (recomputation for remat), else 0.
      instructions: the costliest instructions responsible (at most ``MAX_LISTED``);
        num_instructions: how many there are.
    """

    kind: str
    subject: str
    bytes: int
    by_role: dict[str, int]
    by_path: dict[str, int]
    time_s: float | None
    untimed_bytes: int
    fix: str
    flops: int
    instructions: tuple[CauseInstruction, ...]
    num_instructions: int

    def to_json(self) -> dict:
        return {"kind": self.kind, "subject": self.subject, "bytes": self.bytes,
                "time_s": self.time_s, "untimed_bytes": self.untimed_bytes,
                "by_role": dict(self.by_role), "by_path": dict(self.by_path), "fix": self.fix,
                "flops": self.flops, "num_instructions": self.num_instructions,
                "instructions": [{"computation": i.computation, "name": i.name, "opcode": i.opcode,
                                  "bytes": i.bytes, "source": i.source, "op_name": i.op_name}
                                 for i in self.instructions]}


@dataclass(frozen=True, slots=True)
class ExcessLine:
    """Compulsory, compiled and excess bytes of one role or path, per program run."""

    compulsory_bytes: int
    compiled_bytes: int
    unattributed_bytes: int

    @property
    def excess_bytes(self) -> int:
        return self.compiled_bytes - self.compulsory_bytes

    @property
    def excess_fraction(self) -> float:
        """excess / compiled (0.0 when nothing moves)."""
        return self.excess_bytes / self.compiled_bytes if self.compiled_bytes else 0.0

    def to_json(self) -> dict:
        return {"compulsory_bytes": self.compulsory_bytes, "compiled_bytes": self.compiled_bytes,
                "excess_bytes": self.excess_bytes, "excess_fraction": self.excess_fraction,
                "unattributed_bytes": self.unattributed_bytes}


@dataclass
class ExcessAnalysis:
    """Excess movement of one program run (module docstring).

    Attributes:
      by_role: role -> ExcessLine of HBM bytes (read + written); by_path: path -> ExcessLine.
      causes: every cause with bytes, costliest first (by time with a spec, else bytes).
      unattributed: the excess no rule explains (kind ``unattributed``).
      hardware: the spec's name, or None; onchip_capacity_bytes: the capacity intermediates
        are compared with (None without a spec).
      per_instruction: (computation, instruction) -> excess bytes per program run (a
        read-only mapping, built on first use).
      notes: how the figures were derived where it is not obvious.
    """

    by_role: dict[str, ExcessLine]
    by_path: dict[str, ExcessLine]
    causes: list[ExcessCause]
    unattributed: ExcessCause
    hardware: str | None
    onchip_capacity_bytes: int | None
    per_instruction: Mapping[tuple[str, str], int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def compulsory_bytes(self) -> int:
        return sum(v.compulsory_bytes for v in self.by_path.values())

    @property
    def compiled_bytes(self) -> int:
        return sum(v.compiled_bytes for v in self.by_path.values())

    @property
    def excess_bytes(self) -> int:
        return self.compiled_bytes - self.compulsory_bytes

    @property
    def excess_fraction(self) -> float:
        return self.excess_bytes / self.compiled_bytes if self.compiled_bytes else 0.0

    @property
    def excess_time_s(self) -> float | None:
        """Sum of the causes' times (None without a spec)."""
        if self.hardware is None:
            return None
        return sum(c.time_s or 0.0 for c in (*self.causes, self.unattributed))

    def cause(self, kind: str, subject: str | None = None) -> ExcessCause | None:
        """The (first) cause of ``kind`` (and ``subject``), or None."""
        for c in self.causes:
            if c.kind == kind and (subject is None or c.subject == subject):
                return c
        return None

    def bytes_of(self, kind: str) -> int:
        """Bytes of every cause of ``kind`` together."""
        return sum(c.bytes for c in self.causes if c.kind == kind)

    def to_json(self) -> dict:
        """The ``excess`` object of ``jaxmove analyze --json`` (stable keys)."""
        return {"compulsory_bytes": self.compulsory_bytes, "compiled_bytes": self.compiled_bytes,
                "excess_bytes": self.excess_bytes, "excess_fraction": self.excess_fraction,
                "excess_time_s": self.excess_time_s, "hardware": self.hardware,
                "onchip_capacity_bytes": self.onchip_capacity_bytes,
                "by_role": {r: v.to_json() for r, v in self.by_role.items()},
                "by_path": {p: v.to_json() for p, v in self.by_path.items()},
                "causes": [c.to_json() for c in self.causes],
                "unattributed": self.unattributed.to_json(),
                "notes": list(self.notes)}

    def to_dataframe(self):
        """One pandas row per cause (kind, subject, bytes, time_s, HBM bytes per role, bytes
        per path, fix, instructions); the unattributed excess last when it is not zero.

        Raises ImportError without pandas (naming the extra that installs it)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("ExcessAnalysis.to_dataframe needs pandas: pip install 'jaxmove[notebooks]'") from e

        rows = []
        for c in (*self.causes, *((self.unattributed,) if self.unattributed.bytes else ())):
            rec = {"kind": c.kind, "subject": c.subject, "bytes": c.bytes, "time_s": c.time_s,
                   "flops": c.flops, "num_instructions": c.num_instructions, "fix": c.fix,
                   "instructions": ", ".join(i.name for i in c.instructions)}
            rec.update({f"{r}_bytes": c.by_role.get(r, 0) for r in ROLES})
            rec.update({f"{p}_bytes": c.by_path.get(p, 0) for p in PATHS})
            rows.append(rec)
        cols = ["kind", "subject", "bytes", "time_s", "flops", "num_instructions", "fix",
                "instructions", *(f"{r}_bytes" for r in ROLES), *(f"{p}_bytes" for p in PATHS)]
        return pd.DataFrame.from_records(rows, columns=cols)


# ---- buffers --------------------------------------------------------------------------------

class _Buffers:
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


def _fused_chain(module: Module, fused: Computation, instr: Instruction, ops) -> tuple[int | None, bool, bool]:
    """(parameter number, changes the element type, takes a window) when ``instr`` of
    ``fused`` is a chain of ``ops`` from one parameter (through operand 0: a slice's or
    dynamic-slice's data operand); (None, False, False) otherwise."""
    dtype_change = sliced = False
    seen = 0
    while seen < 10_000:
        seen += 1
        if instr.opcode == "parameter":
            return instr.parameter_number, dtype_change, sliced
        if instr.opcode not in ops or not instr.operands:
            return None, False, False
        src = fused.by_name.get(instr.operands[0])
        if src is None:
            return None, False, False
        if instr.opcode in ("convert", "bitcast-convert") and src.shape.element_type != instr.shape.element_type:
            dtype_change = True
        if instr.opcode in _SLICE_OPS:
            sliced = True
        instr = src
    return None, False, False


def _through_bitcast(comp: Computation, instr: Instruction) -> Instruction:
    while instr.opcode == "bitcast" and instr.operands and instr.operands[0] in comp.by_name:
        instr = comp.by_name[instr.operands[0]]
    return instr


def _copy_kind(instr: Instruction, comp: Computation, module: Module) -> tuple[str, int, bool] | None:
    """(kind, source operand, takes a window) of a copy kernel, else None: kind
    ``dtype_conversion`` when the element type changes, else ``slice_copy`` for a window
    (slice / dynamic-slice) of its source, else ``layout_change``."""
    op = instr.opcode
    if not instr.shape.is_array:
        return None
    if op in _COPY_OR_SLICE_OPS and instr.operands:
        src = comp.by_name.get(instr.operands[0])
        if src is None or not src.shape.is_array:
            return None
        dtype = src.shape.element_type != instr.shape.element_type
        sliced = op in _SLICE_OPS
        return ("dtype_conversion" if dtype else "slice_copy" if sliced else "layout_change"), 0, sliced
    if op == "fusion" and instr.called_computations:
        fused = module.computations.get(instr.called_computations[0])
        if fused is None:
            return None
        return _fused_copy_kind(instr, fused, module)
    return None


def _fused_copy_kind(instr: Instruction, fused: Computation, module: Module) -> tuple[str, int, bool] | None:
    """``_copy_kind`` of a fusion of array shape whose fused computation is ``fused``."""
    if fused.root.opcode == "tuple":
        return None
    k, dtype, sliced = _fused_chain(module, fused, fused.root, _FUSED_CHAIN_OPS)
    if k is None or k >= len(instr.operands) or fused.root.opcode == "parameter":
        return None
    if fused.root.opcode == "bitcast" and _through_bitcast(fused, fused.root).opcode == "parameter":
        return None
    return ("dtype_conversion" if dtype else "slice_copy" if sliced else "layout_change"), k, sliced


def _tuple_copy_kinds(instr: Instruction, fused: Computation, module: Module) -> list | None:
    """Copy kinds of a multi-output fusion every root leaf of which is a copy chain from a
    parameter (``_fused_copy_kind`` per element: XLA:GPU slices a scanned layer's K and V
    windows out of the stacked caches in one ``(bf16[1,...], bf16[1,...])`` fusion): a list of
    (leaf position, kind, source operand, takes a window), else None (any element computed)."""
    root, shape = fused.root, instr.shape
    if not shape.is_tuple or len(root.operands) != len(shape.tuple_shapes):
        return None
    out = []
    for e, o in enumerate(root.operands):
        leaf = fused.by_name.get(o)
        if leaf is None or not leaf.shape.is_array or not shape.tuple_shapes[e].is_array:
            return None
        if _through_bitcast(fused, leaf).opcode == "parameter":
            return None  # a parameter passed through (or bitcast): no copy
        k, dtype, sliced = _fused_chain(module, fused, leaf, _FUSED_CHAIN_OPS)
        if k is None or k >= len(instr.operands):
            return None
        out.append((shape.leaf_offsets[e],
                    "dtype_conversion" if dtype else "slice_copy" if sliced else "layout_change", k, sliced))
    return out or None


def _resolve_copy(droot: tuple, copies: dict, param_root: dict) -> tuple | None:
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


def _inner_update_bytes(instr: Instruction, module: Module) -> int:
    """Update bytes of a fusion that rebuilds a buffer around a dynamic-update-slice (root,
    through bitcasts and converts: XLA:CPU updates a bf16 cache as convert(dynamic-update-slice
    (convert(cache) to f32, ...)) to bf16) instead of updating it in place, in the root's
    element width; 0 for anything else."""
    if instr.opcode != "fusion" or not instr.called_computations:
        return 0
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return 0
    root = fused.root
    while root.opcode in ("bitcast", "convert") and root.operands and root.operands[0] in fused.by_name:
        root = fused.by_name[root.operands[0]]
    if root.opcode == "dynamic-update-slice" and len(root.operands) > 1:
        upd = fused.by_name.get(root.operands[1])
        if upd is None or not upd.shape.is_array:
            return 0
        out_bits, upd_bits = fused.root.shape.element_bits, upd.shape.element_bits
        if not out_bits or not upd_bits or not fused.root.shape.is_array:
            return upd.shape.logical_byte_size
        return upd.shape.logical_byte_size * out_bits // upd_bits
    return 0


def _update_bytes(r, logical: int, module: Module) -> int:
    """The update bytes among the ``logical`` bytes a write of row ``r`` puts into a buffer:
    all of them for an in-place update, a rebuilding fusion's update (``_inner_update_bytes``),
    else 0."""
    if r.traffic.inplace_buffer_bytes:
        return logical
    inner = _inner_update_bytes(r.instr, module)
    return min(logical, inner * r.multiplicity.count) if inner else 0


def _raw_attrs_have(instr: Instruction, key: str, needle: str) -> bool:
    """``needle`` occurs in attribute ``key`` (in the attribute text when not yet split: a
    cheap test before parsing metadata or backend_config)."""
    a = instr._attrs
    if a is None:
        t = instr._attr_text
        return bool(t) and needle in t
    v = a.get(key)
    return v is not None and needle in v


def _split_k(instr: Instruction) -> int:
    """``split_k`` of a Triton gemm fusion's config (xla/autotuning.proto TritonGemmKey), else 1."""
    if instr.opcode != "fusion" or not _raw_attrs_have(instr, "backend_config", "split_k"):
        return 1
    bc = instr.backend_config
    if not isinstance(bc, dict):
        return 1
    cfg = bc.get("fusion_backend_config", {})
    cfg = cfg.get("triton_gemm_config") if isinstance(cfg, dict) else None
    if not isinstance(cfg, dict):
        return 1
    try:
        return int(cfg.get("split_k", 1))
    except (TypeError, ValueError):
        return 1


def _split_k_by_shape(instr: Instruction, comp: Computation, module: Module) -> int:
    """Split-K of a Triton gemm fusion that prints no ``split_k`` (the nested-gemm form of
    XLA:GPU's split-K rewriter, xla/service/gpu/split_k_gemm_rewriter.cc): its root dot's
    result ``[S, M, N]`` carries a batch dimension S > 1 (the contraction cut into S parts)
    that every consumer sums over (a reduce over dimension 0, inside a consumer fusion);
    S, else 1."""
    if instr.opcode != "fusion" or not _raw_attrs_have(instr, "backend_config", "__triton"):
        return 1
    fused = module.computations.get(instr.called_computations[0]) if instr.called_computations else None
    if fused is None:
        return 1
    root = fused.root
    while root.opcode in ("bitcast", "convert") and root.operands:
        root = fused.by_name[root.operands[0]]
    if root.opcode != "dot" or "lhs_batch_dims" not in root.attrs or not instr.shape.is_array:
        return 1
    dims = instr.shape.dims
    if len(dims) < 3 or dims[0] < 2:
        return 1
    users = comp.users(instr.name)
    if not users:
        return 1
    for u in users:
        if u.opcode == "reduce":
            ok = u.attrs.get("dimensions", "").strip("{} ") == "0"
        elif u.opcode == "fusion" and u.called_computations:
            uc = module.computations.get(u.called_computations[0])
            ok = uc is not None and _reduces_dim0(uc, [uc.parameters[j] for j, o in enumerate(u.operands)
                                                        if o == instr.name and j < len(uc.parameters)])
        else:
            ok = False
        if not ok:
            return 1
    return dims[0]


def _reduces_dim0(fused: Computation, params: list) -> bool:
    """Every use of ``params`` inside ``fused`` (through bitcast/convert) is a reduce over dim 0."""
    if not params:
        return False
    users: dict[str, list[Instruction]] = {}
    for i in fused.instructions:
        for o in i.operands:
            users.setdefault(o, []).append(i)
    stack = list(params)
    while stack:
        v = stack.pop()
        us = users.get(v.name, ())
        if not us:
            return False
        for u in us:
            if u.opcode in ("bitcast", "convert"):
                stack.append(u)
            elif not (u.opcode == "reduce" and u.operands[0] == v.name
                      and u.attrs.get("dimensions", "").strip("{} ") == "0"):
                return False
    return True


def _is_dot_as_multiply_reduce(instr: Instruction, comp: Computation, module: Module) -> bool:
    """A dot XLA rewrote into an elementwise multiply and a reduce in two kernels (XLA:GPU,
    a dot with a 1-row operand, e.g. batch-1 decode: AlgebraicSimplifier's dot strength
    reduction): a loop fusion whose root (through bitcast/convert) multiplies for a
    ``dot_general`` (op_name) and whose every consumer reduces the product."""
    if instr.opcode != "fusion" or not instr.called_computations:
        return False
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return False
    root = fused.root
    for leaf in ([fused.by_name[o] for o in root.operands] if root.opcode == "tuple" else [root]):
        while leaf.opcode in ("bitcast", "convert") and leaf.operands:
            leaf = fused.by_name[leaf.operands[0]]
        if leaf.opcode != "multiply":
            return False
    # the fused root first, then the op_name (splitting every fusion's metadata is slow)
    if not _raw_attrs_have(instr, "metadata", "dot_general"):
        return False
    md = instr.metadata
    if md is None or not md.op_name or not md.op_name.endswith("dot_general"):
        return False
    users = [u for u in comp.users(instr.name) if u.opcode != "get-tuple-element"]
    for g in comp.users(instr.name):  # a multi-output fusion (q, k, v): the users of each element
        if g.opcode == "get-tuple-element":
            users.extend(comp.users(g.name))
    if not users:
        return False
    for u in users:
        name = instr.name if instr.name in u.operands else next(
            (o for o in u.operands if comp.by_name[o].opcode == "get-tuple-element"
             and comp.by_name[o].operands[0] == instr.name), None)
        if u.opcode == "fusion" and u.called_computations:
            uc = module.computations.get(u.called_computations[0])
            params = [uc.parameters[j] for j, o in enumerate(u.operands)
                      if o == name and uc is not None and j < len(uc.parameters)]
            if uc is None or not params or not _only_reduced(uc, params):
                return False
        elif u.opcode != "reduce":
            return False
    return True


def _only_reduced(fused: Computation, params: list) -> bool:
    """Every use of ``params`` (through bitcast/convert) is a reduce's operand."""
    users: dict[str, list[Instruction]] = {}
    for i in fused.instructions:
        for o in i.operands:
            users.setdefault(o, []).append(i)
    stack = list(params)
    while stack:
        v = stack.pop()
        us = users.get(v.name, ())
        if not us:
            return False
        for u in us:
            if u.opcode in ("bitcast", "convert"):
                stack.append(u)
            elif u.opcode != "reduce":
                return False
    return True


def _is_remat(instr: Instruction) -> bool:
    """Cloned by XLA's rematerialization (``.remat`` suffix, xla/service/hlo_rematerialization.cc)
    or recomputed by a ``jax.checkpoint`` (``rematted_computation`` in op_name)."""
    if ".remat" in instr.name:
        return True
    if not _raw_attrs_have(instr, "metadata", "rematted_computation"):
        return False
    md = instr.metadata
    return bool(md is not None and md.op_name and "rematted_computation" in md.op_name)


def _classify(instr: Instruction, comp: Computation, module: Module, t) -> tuple[str | None, tuple | None]:
    """(kernel cause, copy kind) of a kernel with traffic ``t``: the cause of the kernel's own
    kind (module docstring, rule 2: rematerialization, host round trip, split-K partials, a dot
    as multiply + reduce), else None and ``_copy_kind``'s answer for a copy kernel (else None).

    One walk from a fusion's root decides which rules can apply: split-K by shape needs a dot
    root, a dot as multiply + reduce multiply roots (each rule's own function then checks the
    rest), a fused copy a chain of copy ops to a parameter (``_fused_copy_kind``, here
    continued from where the walk through bitcasts and converts stopped)."""
    # the attribute texts (_raw_attrs_have's tests, inline: this runs for every kernel)
    attrs = instr._attrs
    if attrs is None:
        md_text = bc_text = instr._attr_text or ""
    else:
        md_text, bc_text = attrs.get("metadata") or "", None
    if ".remat" in instr.name or ("rematted_computation" in md_text and _is_remat(instr)):
        return "rematerialization", None
    op = instr.opcode
    if op != "fusion":
        if op == "custom-call" and (instr.custom_call_target or "") in _HOST_TARGETS:
            return "host_round_trip", None
        if op not in _NO_HOST_CHECK and _touches_host(t):
            return "host_round_trip", None
        if op in _COPY_OR_SLICE_OPS:
            return None, _copy_kind(instr, comp, module)
        return None, None
    if bc_text is None:
        bc_text = attrs.get("backend_config") or ""
    # the fusion's Triton gemm config prints split_k: then it, not the shape, decides
    split_field = "split_k" in bc_text
    if split_field and _split_k(instr) > 1:
        return "split_k_partials", None
    called = instr._called  # (Instruction.called_computations, once computed)
    if called is None:
        called = instr.called_computations
    fused = module.computations.get(called[0]) if called else None
    if fused is None:
        return None, None
    root = fused.root
    by_name = fused.by_name
    if root.opcode == "tuple":
        multiply = True  # every root leaf (through bitcast/convert) multiplies
        for o in root.operands:
            leaf = by_name[o]
            while leaf.opcode in ("bitcast", "convert") and leaf.operands:
                leaf = by_name[leaf.operands[0]]
            if leaf.opcode != "multiply":
                multiply = False
                break
        # (_is_dot_as_multiply_reduce asks the op_name for dot_general first: asked here)
        if multiply and "dot_general" in md_text and _is_dot_as_multiply_reduce(instr, comp, module):
            return "dot_as_multiply_reduce", None
        return None, _tuple_copy_kinds(instr, fused, module)
    base = root  # the root through bitcast/convert
    bitcasts = True  # the way has bitcasts only (then _through_bitcast(root) is base)
    while True:
        bop = base.opcode
        if bop != "bitcast" and bop != "convert" or not base.operands:
            break
        if bop == "convert":
            bitcasts = False
        base = by_name[base.operands[0]]
    bop = base.opcode
    if bop == "dot":
        if not split_field and _split_k_by_shape(instr, comp, module) > 1:
            return "split_k_partials", None
        return None, None
    if bop == "multiply":
        if "dot_general" in md_text and _is_dot_as_multiply_reduce(instr, comp, module):
            return "dot_as_multiply_reduce", None
        return None, None
    if bop not in _COPY_CHAIN_OPS or not instr.shape.is_array:
        return None, None
    # _fused_copy_kind, from ``base`` on (the walk so far passed bitcasts and converts only)
    k, dtype, sliced = _fused_chain(module, fused, base, _FUSED_CHAIN_OPS)
    if k is None or k >= len(instr.operands) or root.opcode == "parameter":
        return None, None
    if root.opcode == "bitcast" and bitcasts and bop == "parameter":  # (_through_bitcast(root) is base)
        return None, None
    if not dtype and not bitcasts:  # a convert between root and base changes the element type?
        node = root
        while node is not base:
            src = by_name[node.operands[0]]
            if node.opcode == "convert" and src.shape.element_type != node.shape.element_type:
                dtype = True
                break
            node = src
    return None, (("dtype_conversion" if dtype else "slice_copy" if sliced else "layout_change"), k, sliced)


# ---- the pass --------------------------------------------------------------------------------

class _Ledger:
    """Bytes per role and path: compiled, compulsory, per cause and per instruction (by its
    row number in ``_Excess.rows``). (defaultdicts: only ever added to, then iterated.)"""

    def __init__(self, hbm_s_per_byte: float | None):
        self.compiled: dict[tuple, int] = defaultdict(int)      # (role, path) -> bytes
        self.compulsory: dict[tuple, int] = defaultdict(int)
        # role -> bytes of HBM reads / writes all of whose bytes are data and needed (each
        # counts in compiled and compulsory alike: ``fold`` adds them there)
        self.read_both: dict = defaultdict(int)
        self.write_both: dict = defaultdict(int)
        # role -> compiled / compulsory bytes of other HBM reads (``_settle_reads``; ``fold``)
        self.read_compiled: dict = defaultdict(int)
        self.read_compulsory: dict = defaultdict(int)
        self.cause_rp: dict[tuple, int] = defaultdict(int)      # (kind, subject, role, path) -> bytes
        # (kind, subject) -> {row number: bytes}, and row number -> bytes of every cause
        self.cause_instr: dict[tuple, dict[int, int]] = {}
        self.by_row: dict[int, int] = defaultdict(int)
        self.cause_s: dict[tuple, float] = {}     # (kind, subject) -> seconds of wire bytes
        self.hbm_s_per_byte = hbm_s_per_byte

    def add(self, role, path: str, phys: int, compulsory: int, logical: int, kind: str,
            subject: str, k: int) -> None:
        """One access of row ``k``: ``phys`` bytes moved, ``logical`` of them data,
        ``compulsory`` of those needed; the padding is ``tile_padding``, the rest of the data
        ``kind``."""
        rp = (role, path)
        self.compiled[rp] += phys
        if compulsory:
            self.compulsory[rp] += compulsory
        if phys > logical:
            self._cause("tile_padding", "", role, path, phys - logical, k)
        if logical > compulsory:  # (_cause, inline)
            nbytes = logical - compulsory
            self.cause_rp[(kind, subject, role, path)] += nbytes
            g = self.cause_instr.get((kind, subject))
            if g is None:
                g = self.cause_instr[(kind, subject)] = defaultdict(int)
            g[k] += nbytes
            self.by_row[k] += nbytes

    def fold(self) -> None:
        """Add ``read_both`` / ``write_both`` into compiled and compulsory (once, at the end)."""
        for both, path in ((self.read_both, _HBM_READ), (self.write_both, _HBM_WRITE)):
            for role, nbytes in both.items():
                self.compiled[(role, path)] += nbytes
                self.compulsory[(role, path)] += nbytes
            both.clear()
        for part, into in ((self.read_compiled, self.compiled), (self.read_compulsory, self.compulsory)):
            for role, nbytes in part.items():
                into[(role, _HBM_READ)] += nbytes
            part.clear()

    def add_compulsory(self, role, path: str, nbytes: int) -> None:
        """An access all of whose ``nbytes`` are data and needed (``add`` with phys =
        compulsory = logical)."""
        rp = (role, path)
        self.compiled[rp] += nbytes
        self.compulsory[rp] += nbytes

    def _cause(self, kind, subject, role, path, nbytes, k: int) -> None:
        self.cause_rp[(kind, subject, role, path)] += nbytes
        g = self.cause_instr.get((kind, subject))
        if g is None:
            g = self.cause_instr[(kind, subject)] = defaultdict(int)
        g[k] += nbytes
        self.by_row[k] += nbytes

    def add_wire(self, path: str, wire: int, compulsory: int, parts, k: int, s_per_byte) -> None:
        """A collective's wire bytes (row ``k``): ``parts`` are (kind, bytes) of the excess."""
        rp = (None, path)
        self.compiled[rp] += wire
        self.compulsory[rp] += compulsory
        for kind, nbytes in parts:
            if nbytes > 0:
                self._cause(kind, "", None, path, nbytes, k)
                if s_per_byte is not None:
                    self.cause_s[(kind, "")] = self.cause_s.get((kind, ""), 0.0) + nbytes * s_per_byte


@gc_paused
def excess_pass(analysis, parameters=(), spec=None, reuse=None, roles=None) -> ExcessAnalysis:
    """Compulsory traffic and excess of ``analysis`` (a pipeline ModuleAnalysis).

    Args:
      parameters: the program's ``EntryParameter`` s (capture; empty for HLO dumps: roles and
        names then come from the HLO, donation from ``input_output_alias``).
      spec: a HardwareSpec for the on-chip capacity and the time of each cause, or None.
      reuse: the ReuseAnalysis computed with ``spec`` (tiling re-reads), or None.
      roles: the roles pass's RoleMap (recomputed from ``parameters`` when None).
    Returns:
      An ExcessAnalysis (module docstring); its figures are per program run.
    """
    return _Excess(analysis, tuple(parameters or ()), spec, reuse, roles).run()


class _Excess:
    def __init__(self, analysis, parameters, spec, reuse, roles):
        self.analysis = analysis
        self.module: Module = analysis.module
        self.params = {p.number: p for p in parameters}
        self.spec = spec
        self.reuse = reuse
        if roles is None:
            roles = getattr(analysis, "roles", None)
        if roles is None:
            entry_roles = {p.number: p.role for p in parameters} if parameters else None
            roles = roles_pass(self.module, entry_roles)
        self.roles = roles
        self.capacity: int | None = None
        if spec is not None:
            from .reuse import onchip_capacity_bytes
            cap = onchip_capacity_bytes(spec)
            self.capacity = cap[0] if cap else None
        self.notes: list[str] = []
        self._entry_names: dict | None = None
        self._subjects: dict[int, str] = {}  # entry parameter number -> _param_subject
        self.ledger = _Ledger(1.0 / spec.hbm_bytes_per_s if spec is not None else None)

    # -- buffers ---------------------------------------------------------------------------

    def _kernel_computations(self) -> list[str]:
        """Kernel-level computations whose rows count, as the totals count them: of a
        conditional, the branch the totals take (its costliest)."""
        mult = self.analysis.multiplicity
        module = self.module
        skip: set[str] = set()
        chosen = self.analysis.branches  # the one branch choice of the pipeline's totals
        if not chosen:  # (the pipeline chooses for every conditional of these computations)
            return list(mult)
        conds = [(c, i) for c in mult for i in module.computations[c].instructions
                 if i.opcode == "conditional"]
        if conds:
            keep: set[str] = set()
            for cname, ci in conds:
                best = chosen[(cname, ci.name)]
                keep |= module.reachable_computations([best], through_fusions=False)
                for b in ci.called_computations:
                    if b != best:
                        skip |= module.reachable_computations([b], through_fusions=False)
            skip -= keep
            if skip:
                self.notes.append("conditionals: the branch the totals take (the costliest) is "
                                  "counted, as in the report's totals")
        return [c for c in mult if c not in skip]

    def _union_all(self, comps: list[str]) -> None:
        module, B = self.module, self.buffers
        parent, find = B.parent, B.find
        # The ENTRY root tuple, when it is the last instruction, is no operand of anything, and
        # no computation calls ENTRY (the call graph is acyclic: hlo/validate.py): its leaves'
        # unions matter only for the result leaves, which run() takes from its operands.
        entry = module.entry
        skip_root = entry.root if entry.root.opcode == "tuple" and entry.instructions \
            and entry.instructions[-1] is entry.root else None
        self.root_tuple_skipped = skip_root is not None
        inplace = self.inplace_fusions
        # opcode -> may share a buffer (fusions only when one updates a buffer in place)
        union_ops = _UNION_OPS if inplace else _UNION_OPS - {"fusion"}
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
                if op in _ALIAS_LEAFWISE and instr.operands:
                    B.union_leaves(cname, name, cname, instr.operands[0], instr.shape.num_leaves)
                elif op == "get-tuple-element":
                    src = by_name[instr.operands[0]]
                    # leaf_position(shape, (index,)); the index as Instruction.tuple_index reads it
                    ia = instr._attrs
                    v = (ia if ia is not None else instr.attrs).get("index")
                    off = src.shape.leaf_offsets[int(v) if v is not None else None]
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
                    if start.opcode in _NATIVE_STARTS or not start.shape.is_tuple:
                        continue  # the start's writes are indexed by the done (see _write_key)
                    idx = (0,) if start.opcode == "copy-start" else (1,)
                    if len(start.shape.tuple_shapes) > idx[0]:
                        off = leaf_position(start.shape, idx)
                        B.union_leaves(cname, name, cname, start.name, instr.shape.num_leaves, 0, off)
                elif op == "fusion" and (cname, name) in inplace:
                    self._union_inplace_fusion(comp, instr)

    def _union_inplace_fusion(self, comp: Computation, instr: Instruction) -> None:
        """A fusion whose root (tuple element) is an in-place dynamic-update-slice / scatter of
        a fusion parameter writes into that operand's buffer (passes/traffic.py's rule)."""
        fused = self.module.computations.get(instr.called_computations[0]) if instr.called_computations else None
        if fused is None:
            return
        root = fused.root
        leaves = ([(k, fused.by_name[o]) for k, o in enumerate(root.operands)] if root.opcode == "tuple"
                  else [(None, root)])
        for k, leaf in leaves:
            p = _through_bitcast(fused, leaf)
            if p.opcode not in ("dynamic-update-slice", "scatter") or not p.operands:
                continue
            buf = _through_bitcast(fused, fused.by_name[p.operands[0]])
            if buf.opcode != "parameter" or buf.shape.byte_size != p.shape.byte_size:
                continue
            n = buf.parameter_number
            if n is None or n >= len(instr.operands):
                continue
            pos = 0 if k is None else leaf_position(instr.shape, (k,))
            self.buffers.union((comp.name, instr.name, pos), (comp.name, instr.operands[n], 0))

    # -- naming ----------------------------------------------------------------------------

    def _param_subject(self, number: int) -> str:
        got = self._subjects.get(number)
        if got is not None:
            return got
        p = self.params.get(number)
        if p is not None:
            got = p.path
        else:
            names = self._entry_names
            if names is None:
                names = self._entry_names = {i.parameter_number: i for i in self.module.entry.parameters}
            instr = names.get(number)
            got = entry_parameter_name(instr) if instr is not None else f"parameter {number}"
        self._subjects[number] = got
        return got

    def _argument(self, number: int) -> tuple[str, int | None, bool]:
        """(argument name, argnum or None, donated) of an entry parameter."""
        p = self.params.get(number)
        if p is None:
            return self._param_subject(number), None, number in self.module.input_output_alias
        arg = p.path.split("/", 1)[0]
        if arg == "args" and "/" in p.path:
            arg = "/".join(p.path.split("/")[:2])
        return arg, getattr(p, "argnum", None), p.donated

    # -- run -------------------------------------------------------------------------------

    def run(self) -> ExcessAnalysis:
        module = self.module
        self.buffers = _Buffers()
        comps = self._kernel_computations()
        self.comps = comps_set = set(comps)
        # the rows counted; those that move bytes (most rows of a module are parameters, tuples,
        # constants...), the collectives, and the fusions that update a buffer in place
        active: list[int] = []  # (row numbers)
        collective_rows: list[tuple[int, object]] = []
        inplace: set[tuple[str, str]] = set()
        unmodeled = False
        if len(comps_set) == len(self.analysis.multiplicity):  # no branch left out: every row
            rows = self.analysis.rows
        else:
            rows = [r for r in self.analysis.rows if r.computation in comps_set]
        # and each such row's kernel cause or copy kind (_classify: of the row alone), in the
        # same pass; the copy kernels' buffers are resolved below, after the unions
        kcause: dict[int, str] = {}
        copy_rows: list[tuple[int, tuple, int]] = []  # (row number, copy kind, result leaf)
        computations = module.computations
        cname = None
        for k, r in enumerate(rows):
            t = r.traffic
            if t is NO_TRAFFIC:  # (the one record of every instruction that moves nothing)
                pass
            elif t.reads or t.writes:
                active.append(k)
                instr = r.instr
                if r.computation is not cname:  # (rows come computation by computation)
                    cname = r.computation
                    comp = computations[cname]
                if t.inplace_buffer_bytes and instr.opcode == "fusion":
                    inplace.add((cname, instr.name))
                c, ck = _classify(instr, comp, module, t)
                if c is not None:
                    kcause[k] = c
                elif ck is not None:
                    if isinstance(ck, list):  # a multi-output copy fusion: each element a copy
                        copy_rows.extend((k, (kind, src_k, sliced), pos) for pos, kind, src_k, sliced in ck)
                    else:
                        copy_rows.append((k, ck, 0))
            elif t.inplace_buffer_bytes and r.instr.opcode == "fusion":
                inplace.add((r.computation, r.instr.name))
            if r.collective is not None:
                collective_rows.append((k, r))
            if r.unmodeled:
                unmodeled = True
        self.rows = rows
        self.inplace_fusions = inplace
        self.any_unmodeled = unmodeled
        self._union_all(comps)
        B = self.buffers
        find = B.find
        parent = B.parent
        entry = module.entry
        ename = entry.name
        # entry parameter leaves
        param_root: dict[tuple, tuple[int, int, object]] = {}
        for p in entry.parameters:
            if p.shape.is_tuple:
                for j, (_idx, leaf) in enumerate(_leaves(p.shape)):
                    param_root.setdefault(find((ename, p.name, j)), (p.parameter_number, j, leaf))
            else:
                key = (ename, p.name, 0)
                param_root.setdefault(find(key) if key in parent else key, (p.parameter_number, 0, p.shape))
        # result leaves
        out_root: dict[tuple, tuple[int, object]] = {}
        rname = entry.root.name
        leaves = _leaf_shapes(entry.root.shape)
        if self.root_tuple_skipped:
            # leaf j of the root tuple is leaf i of its operand o (the union _union_all skipped)
            j, n_leaves, eby = 0, len(leaves), entry.by_name
            for o in entry.root.operands:
                n = eby[o].shape.num_leaves
                for i in (_ZERO if n == 1 else range(n)):
                    if j >= n_leaves:
                        break
                    key = (ename, o, i)
                    pk = parent.get(key)
                    if pk is not None:
                        key = pk if pk not in parent else find(key)
                    if key not in out_root:
                        out_root[key] = (j, leaves[j])
                    j += 1
            for j in range(j, n_leaves):  # (leaves no operand fills: their own buffers)
                key = (ename, rname, j)
                if key not in out_root:
                    out_root[key] = (j, leaves[j])
        else:
            for j, leaf in enumerate(leaves):
                key = (ename, rname, j)
                pk = parent.get(key)
                if pk is not None:
                    key = pk if pk not in parent else find(key)
                if key not in out_root:
                    out_root[key] = (j, leaf)
        alias_of_out: dict[int, int] = {}
        for pnum, pairs in module.input_output_alias.items():
            for out_idx, _pidx in pairs:
                try:
                    alias_of_out[leaf_position(entry.root.shape, tuple(out_idx))
                                 if entry.root.shape.is_tuple else 0] = pnum
                except (IndexError, AttributeError):
                    continue
        self.param_root, self.out_root, self.alias_of_out = param_root, out_root, alias_of_out

        # cause kernels, and copy kernels: derived buffers (origin root, width num, den, kind, row)
        derived: dict[tuple, tuple] = {}
        copies: dict[tuple, tuple] = {}   # copy kernels' buffers: (source root, num, den, kind, row, sliced)
        cname = None
        for k, (kind, src_k, sliced), pos in copy_rows:
            r = rows[k]
            instr = r.instr
            if r.computation is not cname:  # (rows come computation by computation)
                cname = r.computation
                comp = computations[cname]
            src = comp.by_name[instr.operands[src_k]]
            sroot = (cname, src.name, 0)
            p = parent.get(sroot)
            if p is not None:
                sroot = p if p not in parent else find(sroot)
            droot = (cname, instr.name, pos)
            p = parent.get(droot)
            if p is not None:
                droot = p if p not in parent else find(droot)
            if droot in param_root:
                continue  # writes into a parameter's own buffer: not a copy of it
            dshape = instr.shape if not instr.shape.is_tuple else _leaf_shapes(instr.shape)[pos]
            copies[droot] = (sroot, dshape.element_bits, src.shape.element_bits, kind, k, sliced)
        # chains of copies lead to their origin (in any row order: a layout copy before a loop,
        # a slice of it inside); a window copied out of an intermediate is no copy kernel (the
        # intermediate's own rules decide), one of a parameter or of a copy of one is
        for droot in copies:
            got = _resolve_copy(droot, copies, param_root)
            if got is not None:
                derived[droot] = got
                kcause[got[4]] = got[3]
        # a copy of a parameter that becomes (the buffer of) an update result: not donated
        update_of: dict[tuple, int] = {}
        for oroot, (j, _leaf) in out_root.items():
            if oroot in param_root:
                update_of[oroot] = param_root[oroot][0]
            elif oroot in derived and derived[oroot][0] in param_root:
                pnum = update_of[oroot] = param_root[derived[oroot][0]][0]
                donated = self._argument(pnum)[2]
                kcause[derived[oroot][4]] = "donated_but_copied" if donated else "not_donated"
            elif j in alias_of_out:
                update_of[oroot] = alias_of_out[j]
        for oroot in [o for o in derived if o in out_root and o not in update_of]:
            del derived[oroot]  # a result written by a copy kernel: the result itself
        self.derived, self.kcause, self.update_of = derived, kcause, update_of
        self.update_root = {pnum: oroot for oroot, pnum in update_of.items()}
        self.onchip_update = self._onchip_updates([rows[k] for k in active] if self.update_of else ())
        self.copy_origin = {v[4]: v[0] for v in derived.values()}
        # split-K partial sums exist only to be reduced: reading them back is split-K's too
        produced_cause: dict[tuple, str] = {}
        for k, c in kcause.items():
            if c not in ("split_k_partials", "dot_as_multiply_reduce"):
                continue
            r = rows[k]
            for j in range(r.instr.shape.num_leaves):
                produced_cause.setdefault(B.find((r.computation, r.instr.name, j)), c)
        self.produced_cause = produced_cause
        special = set(param_root)
        special.update(out_root)
        special.update(derived)
        special.update(update_of)
        # a result that updates a parameter in a buffer of its own (XLA:CPU rebuilds a donated
        # cache: dynamic-update-slice in a fusion that writes it whole): reading it back reads
        # the parameter (and its update), so it draws on the parameter's read budget
        leaf_root = {(pnum, j): proot for proot, (pnum, j, _leaf) in param_root.items()}
        budget_root = {oroot: leaf_root[(pnum, 0)] for oroot, pnum in update_of.items()
                       if oroot not in param_root and (pnum, 0) in leaf_root}
        self.budget_root = budget_root
        cap = self.capacity
        ledger = self.ledger
        roles = self.roles
        update_root = self.update_root
        # budget root -> [(prio, units, logical, k, role, phys, root)] in schedule order
        reads: dict[tuple, list] = defaultdict(list)
        # buffer root -> [data bytes written into it, of those granted to reads so far]
        tally: dict[tuple, list[int]] = {}
        read_units: dict[tuple, int] = {}  # buffer root -> data bytes its readers touch
        update_left: dict[tuple, int] = {}
        tilings = []
        gathered = set()  # buffers all-gathers write: how much of them is read decides their excess
        for _k, r in collective_rows:
            if r.collective.kind == "all-gather":
                wkey, _leaf = self._write_key(r.instr, module.computations[r.computation], ())
                gathered.add(find(wkey))
        reuse_rows = self.reuse.rows if self.reuse is not None else None
        add = ledger.add
        read_both, write_both = ledger.read_both, ledger.write_both
        computations = module.computations
        no_cause = "materialized_intermediate"
        kernel_write_causes = frozenset({"rematerialization", "split_k_partials", "dot_as_multiply_reduce",
                                         "host_round_trip", "dtype_conversion", "layout_change", "slice_copy"})
        kc_of = [None] * len(rows)  # kcause as a list: row number -> cause kind or None
        for k, c in kcause.items():
            kc_of[k] = c
        cname = None
        for k in active:
            r = rows[k]
            t = r.traffic
            t_reads, t_writes = t.reads, t.writes
            instr = r.instr
            if r.computation is not cname:  # (rows come computation by computation)
                cname = r.computation
                comp = computations[cname]
                by_name = comp.by_name
                count = r.multiplicity.count  # (one Multiplicity per computation)
            operands = instr.operands
            key = (cname, instr.name)
            kc = kc_of[k]
            # the cause of the kernel's reads: a split-K gemm, or a dot computed as multiply +
            # reduce, reads its operands as the dot would (compulsory; only its output is excess)
            rkc = None if kc in _WRITE_ONLY_CAUSES else kc
            prio = 0 if rkc is None else (2 if kc == "rematerialization" else 1)
            for a in t_reads:
                ms = a.memory_space
                if ms:  # not HBM (0)
                    if ms in ON_CHIP_MEMORY_SPACES:
                        continue
                    if ms == HOST_MEMORY_SPACE:
                        phys = a.nbytes * count
                        add(None, "host_to_device", phys, phys if rkc is None else 0, phys,
                            rkc or "host_round_trip", "", k)
                        continue
                oname = operands[a.operand]
                # the leaf's shape only where a rule asks (a tuple index, no logical size, an
                # all-gather's buffer, an on-chip capacity): reading it touches the operand
                idx = a.index
                if idx:
                    leaf = by_name[oname].shape
                    if leaf.is_tuple:
                        pos = leaf_position(leaf, idx)
                        leaf = leaf.subshape(idx)
                        rl = roles[(cname, oname)]
                        role = rl[pos] if pos < len(rl) else rl[0]
                        root = (cname, oname, pos)
                    else:
                        role = roles[(cname, oname)][0]
                        root = (cname, oname, 0)
                else:
                    leaf = None
                    role = roles[(cname, oname)][0]
                    root = (cname, oname, 0)
                phys = a.nbytes * count
                lg = a.logical_nbytes
                if lg is None:
                    if leaf is None:
                        leaf = by_name[oname].shape
                    lg = _logical(a, leaf)
                logical = lg * count
                p = parent.get(root)
                if p is not None:
                    root = p if p not in parent else find(root)
                if gathered and root in gathered:
                    if leaf is None:
                        leaf = by_name[oname].shape
                    read_units[root] = read_units.get(root, 0) + min(logical, leaf.logical_byte_size * count)
                if root not in special:
                    if cap is not None and (leaf if leaf is not None else by_name[oname].shape).logical_byte_size <= cap:
                        # an intermediate that fits on chip: reading it back is excess
                        add(role, _HBM_READ, phys, 0, logical,
                            rkc if rkc is not None else produced_cause.get(root, no_cause), "", k)
                        continue
                    if prio == 0 and (not produced_cause or root not in produced_cause):
                        wt = tally.get(root)
                        if wt is not None:  # a spilled intermediate already written: read it back once
                            g = wt[1]
                            give = wt[0] - g
                            if logical < give:
                                give = logical  # (min(logical, written - granted))
                            if give > 0:
                                wt[1] = g + give
                            else:
                                give = 0
                            if give == logical == phys:  # all compulsory: only the two sums move
                                read_both[role] += phys
                            else:
                                add(role, _HBM_READ, phys, give, logical, "re_read", "", k)
                            continue
                    reads[root].append((prio, logical, logical, k, role, phys, root))
                elif root in derived:  # (derived buffers are special)
                    broot, num, den = derived[root][0], derived[root][1], derived[root][2]
                    units = logical * den // num if num else logical
                    reads[budget_root.get(broot, broot) if budget_root else broot].append(
                        (prio, units, logical, k, role, phys, root))
                else:
                    reads[budget_root.get(root, root) if budget_root else root].append(
                        (prio, logical, logical, k, role, phys, root))
            if t_writes:
                out_roles = roles[key]
                shape = instr.shape
                start = instr.opcode in _NATIVE_STARTS
                elements = None  # (the tuple elements, read at the first write with an index)
                iname = instr.name
            for a in t_writes:
                ms = a.memory_space
                if ms:  # not HBM (0)
                    if ms in ON_CHIP_MEMORY_SPACES:
                        continue
                    if ms == HOST_MEMORY_SPACE:
                        phys = a.nbytes * count
                        add(None, "device_to_host", phys, phys if kc is None else 0, phys,
                            kc or "host_round_trip", "", k)
                        continue
                idx = a.index
                if start or idx:
                    if elements is None:
                        elements = shape.tuple_shapes if shape.is_tuple else ()  # (non-tuple: _write_key)
                        n_elements = len(elements)
                        n_roles = len(out_roles) if out_roles else 0
                    if not start and len(idx) == 1 and 0 <= idx[0] < n_elements:
                        # one element of a tuple result (``_write_key``'s answer, without the call)
                        e = idx[0]
                        pos = shape.leaf_offsets[e]
                        wkey, leaf = (cname, iname, pos), elements[e]
                        role = out_roles[pos] if pos < n_roles else "activations"
                    else:
                        wkey, leaf = self._write_key(instr, comp, idx)
                        rl = roles.get((wkey[0], wkey[1]))
                        role = rl[wkey[2]] if rl and wkey[2] < len(rl) else "activations"
                else:
                    wkey, leaf = (cname, iname, 0), shape
                    role = out_roles[0]
                phys = a.nbytes * count
                lg = a.logical_nbytes
                logical = (lg if lg is not None else _logical(a, leaf)) * count
                p = parent.get(wkey)
                root = wkey if p is None else p if p not in parent else find(wkey)
                wt = tally.setdefault(root, [0, 0])
                wt[0] += logical
                if root not in special:  # an intermediate
                    if kc is not None and kc in kernel_write_causes:
                        add(role, _HBM_WRITE, phys, 0, logical, kc, "", k)
                    elif cap is not None and (leaf.logical_byte_size if leaf is not None else logical) <= cap:
                        add(role, _HBM_WRITE, phys, 0, logical, no_cause, "", k)
                    elif logical == phys:  # a spilled intermediate written once: compulsory
                        write_both[role] += phys
                    else:
                        add(role, _HBM_WRITE, phys, logical, logical, UNATTRIBUTED, "", k)
                    continue
                # (wt[0] - logical: the data bytes written into the buffer before this write)
                o = out_root.get(root) if kc is None else None
                if o is not None and root not in update_of:
                    # a result leaf that updates no parameter (_special_write's rule, inline):
                    # its data bytes are written once
                    left = o[1].logical_byte_size - (wt[0] - logical)
                    comp_b = 0 if left <= 0 else logical if logical < left else left
                    if comp_b == logical == phys:
                        write_both[role] += phys
                    else:
                        add(role, _HBM_WRITE, phys, comp_b, logical, UNATTRIBUTED, "", k)
                    continue
                d = derived.get(root)
                if d is not None and root not in update_of:
                    # a copy kernel's write into a copy of a parameter or intermediate
                    # (_special_write's last rule, inline) when the program returns no update of
                    # that parameter: no compulsory bytes
                    pr = param_root.get(d[0])
                    if pr is None or not update_root or update_root.get(pr[0]) is None:
                        kind = kc if kc is not None else d[3]
                        if kind in ("not_donated", "donated_but_copied"):
                            subject = self._not_donated_subject(k)
                        elif kind in _NO_SUBJECT_CAUSES:
                            subject = ""
                        else:
                            subject = self._param_subject(pr[0]) if pr is not None else ""
                        add(role, _HBM_WRITE, phys, 0, logical, kind, subject, k)
                        continue
                self._special_write(root, k, role, phys, logical, r, wt[0] - logical, update_left)
            if reuse_rows is not None:
                ru = reuse_rows.get(key)
                if ru is not None and ru.tilings:
                    tilings.append((k, r, ru))
        self._settle_reads(reads, tally)
        for k, r, ru in tilings:
            self._tiling(k, r, ru)
        for k, r in collective_rows:
            self._collective(k, r, read_units)
        return self._result()

    # -- accesses ------------------------------------------------------------------------

    def _write_key(self, instr: Instruction, comp: Computation, index: tuple[int, ...]):
        """The value leaf a write of ``instr`` at ``index`` fills, and that leaf's shape."""
        target = instr
        if instr.opcode in _NATIVE_STARTS:
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

    def _special_write(self, root, k, role, phys, logical, r, before, update_left) -> None:
        """A write into a result, a parameter or a copy of one (see the module docstring) by
        row ``r`` (number ``k``), after ``before`` data bytes were written into it."""
        kc = self.kcause.get(k)
        subject = ""
        if root in self.update_of or (root in self.param_root and root not in self.out_root):
            update = _update_bytes(r, logical, self.module)
            pnum = self.update_of.get(root)
            if pnum is None:
                pnum = self.param_root[root][0]
            left = update_left.get(root)
            if left is None:
                left = self._out_size(root)
            if not update and root in self.onchip_update:
                # a whole write of the result after its updates ran on chip: it carries them
                update = min(logical, self.onchip_update.pop(root))
            comp_b = min(update, left)
            update_left[root] = left - comp_b
            own, subject = "whole_rewrite", self._param_subject(pnum)
        elif root in self.out_root:  # written once: the first bytes written are compulsory
            left = self.out_root[root][1].logical_byte_size - before
            comp_b = 0 if left <= 0 else min(logical, left)
            if kc is None and comp_b == logical == phys:  # the result written once: compulsory
                self.ledger.write_both[role] += phys
                return
            own = UNATTRIBUTED
        else:  # a copy of a parameter or intermediate
            comp_b, own = 0, self.derived[root][3]
            o = self.derived[root][0]
            subject = self._param_subject(self.param_root[o][0]) if o in self.param_root else ""
            uroot = self.update_root.get(self.param_root[o][0]) if o in self.param_root else None
            update = _update_bytes(r, logical, self.module) if uroot is not None else 0
            if update:
                # an in-place update of a copy of a parameter whose update the program returns
                # (copied into another layout, updated, copied back): the update is compulsory
                left = update_left.get(uroot)
                if left is None:
                    left = self._out_size(uroot)
                comp_b = min(update, left)
                update_left[uroot] = left - comp_b
        kind = kc if kc is not None else own
        if kind in ("not_donated", "donated_but_copied"):
            subject = self._not_donated_subject(k)
        elif kind in _NO_SUBJECT_CAUSES:
            subject = ""
        self.ledger.add(role, _HBM_WRITE, phys, comp_b, logical, kind, subject, k)

    def _onchip_updates(self, rows) -> dict[tuple, int]:
        """Update result root -> bytes of in-place updates made to it (or to a copy of its
        parameter) in on-chip memory (XLA:TPU: a cache copied into VMEM, updated there, and
        copied back whole): the kernel that writes the result to HBM carries them, and they
        are its compulsory part."""
        out: dict[tuple, int] = {}
        if not self.update_of:
            return out
        B, module = self.buffers, self.module
        for r in rows:
            t = r.traffic
            if not t.writes:
                continue
            instr = r.instr
            if not any(a.memory_space in ON_CHIP_MEMORY_SPACES for a in t.writes):
                continue
            if not t.inplace_buffer_bytes:
                inner = _inner_update_bytes(instr, module)
                if not inner:
                    continue
            else:
                inner = 0
            comp = module.computations[r.computation]
            for a in t.writes:
                if a.memory_space not in ON_CHIP_MEMORY_SPACES:
                    continue
                wkey = self._write_key(instr, comp, a.index)[0] if a.index else (r.computation, instr.name, 0)
                root = B.find(wkey)
                uroot = root if root in self.update_of else None
                if uroot is None and root in self.derived and self.derived[root][0] in self.param_root:
                    uroot = self.update_root.get(self.param_root[self.derived[root][0]][0])
                if uroot is None:
                    continue
                lg = a.logical_nbytes if a.logical_nbytes is not None else a.nbytes
                nbytes = (min(lg, inner) if inner else lg) * r.multiplicity.count
                out[uroot] = out.get(uroot, 0) + nbytes
        return out

    def _settle_reads(self, reads: dict, tally: dict) -> None:
        """Grant each buffer's compulsory read budget: kernels that are no copies first, in
        schedule order, then copies, then recomputation; the rest is excess."""
        derived, kcause, ledger = self.derived, self.kcause, self.ledger
        cap = self.capacity
        add, param_root = ledger.add, self.param_root
        read_both, read_compiled, read_compulsory = ledger.read_both, ledger.read_compiled, ledger.read_compulsory
        l_kind = l_subj = l_role = _NONE  # the cause of the last claim charged, its keys and bytes per row
        l_crp = l_g = None
        cause_rp, cause_instr, by_row = ledger.cause_rp, ledger.cause_instr, ledger.by_row
        for broot, claims in reads.items():
            if len(claims) == 1:
                c0 = claims[0]
                pr = param_root.get(broot) if not c0[0] and c0[6] is broot else None
                if pr is not None:
                    # the common case: one kernel reads a parameter, no copy in between
                    _p, units, logical, k, role, phys, _root = c0
                    if phys == logical == units <= pr[2].logical_byte_size:  # read once, all needed
                        read_both[role] += phys
                        continue
                    comp_b = min(units, logical, pr[2].logical_byte_size)
                    if comp_b < logical:
                        add(role, _HBM_READ, phys, comp_b, logical, "re_read", self._param_subject(pr[0]), k)
                    elif phys == logical:  # read once, all of it needed
                        read_both[role] += phys
                    else:
                        add(role, _HBM_READ, phys, comp_b, logical, "re_read", "", k)
                    continue
            mixed = any(c[0] for c in claims)
            if mixed:
                claims.sort(key=itemgetter(0))  # by priority, then schedule order (stable)
            if broot in self.param_root:
                pnum, _j, leaf = self.param_root[broot]
                size = leaf.logical_byte_size
                normal = [c for c in claims if c[0] <= 0] or claims
                budget = min(size, sum(min(size, c[1]) for c in normal))
                subject = self._param_subject(pnum)
                own = "re_read"
            else:
                size = self._logical_size(broot)
                fits = cap is not None and size is not None and size <= cap
                wt = tally.get(broot)
                budget = 0 if fits or wt is None else wt[0] - wt[1]
                own = "materialized_intermediate" if fits else "re_read"
                if broot in self.produced_cause:
                    budget, own = 0, self.produced_cause[broot]
                subject = ""
            acc_role, acc = _NONE, 0  # compulsory bytes of a run of claims of one role, added once
            for prio, units, logical, k, role, phys, root in claims:
                if budget > 0:
                    g = units if units < budget else budget
                    budget -= g
                    # granted in the origin's bytes (a wider copy: the rest is excess)
                    comp_b = g if g < logical else logical
                    if comp_b == logical == phys:  # all of it needed: no cause
                        if role == acc_role:
                            acc += phys
                        else:
                            if acc_role is not _NONE:
                                read_both[acc_role] += acc
                            acc_role, acc = role, phys
                        continue
                else:
                    comp_b = 0
                kind = kcause.get(k)
                if kind in _WRITE_ONLY_CAUSES:
                    kind = None  # (its reads are a kernel's like any other: the buffer's cause)
                subj = subject
                if kind is None:
                    kind = kcause.get(derived[root][4], derived[root][3]) if root in derived else own
                if kind in ("not_donated", "donated_but_copied"):
                    subj = self._not_donated_subject(k if kcause.get(k) == kind else derived[root][4])
                elif kind in _NO_SUBJECT_CAUSES:
                    subj = ""
                if phys != logical:
                    add(role, _HBM_READ, phys, comp_b, logical, kind, subj, k)
                    continue
                # (ledger.add inline, the same steps: no tile padding here)
                read_compiled[role] += phys
                if comp_b:
                    read_compulsory[role] += comp_b
                if logical > comp_b:
                    nbytes = logical - comp_b
                    if kind is not l_kind or subj is not l_subj or role is not l_role:
                        l_kind, l_subj, l_role = kind, subj, role
                        l_crp = (kind, subj, role, _HBM_READ)
                        l_g = cause_instr.get((kind, subj))
                        if l_g is None:
                            l_g = cause_instr[(kind, subj)] = defaultdict(int)
                    cause_rp[l_crp] += nbytes
                    l_g[k] += nbytes
                    by_row[k] += nbytes
            if acc_role is not _NONE:
                read_both[acc_role] += acc

    def _not_donated_subject(self, k: int) -> str:
        origin = self.copy_origin.get(k)
        if origin is not None and origin in self.param_root:
            return self._argument(self.param_root[origin][0])[0]
        return ""

    def _logical_size(self, root: tuple) -> int | None:
        comp = self.module.computations.get(root[0])
        instr = comp.by_name.get(root[1]) if comp is not None else None
        if instr is None:
            return None
        shape = instr.shape
        if not shape.is_tuple:
            return shape.logical_byte_size
        leaves = _leaves(shape)
        return leaves[root[2]][1].logical_byte_size if root[2] < len(leaves) else None

    def _out_size(self, root: tuple) -> int:
        return self.out_root[root][1].logical_byte_size if root in self.out_root else \
            self.param_root[root][2].logical_byte_size

    # -- tiling and collectives ------------------------------------------------------------

    def _tiling(self, k: int, r, ru) -> None:
        comp = self.module.computations[r.computation]
        count = r.multiplicity.count
        roles = self.roles
        for t in ru.tilings:
            extra = t.extra_read_bytes * count
            if extra <= 0:
                continue
            lhs = t.lhs_bytes * max(0, t.lhs_passes - 1)
            rhs = t.rhs_bytes * max(0, t.rhs_passes - 1)
            ops = self._dot_operand_roles(r.instr, comp, t.instruction)
            shares = [(ops[0], lhs), (ops[1], rhs)] if lhs + rhs else [(ops[0], 1)]
            tot = sum(s for _r, s in shares) or 1
            done = 0
            for i, (role, s) in enumerate(shares):
                b = extra - done if i == len(shares) - 1 else extra * s // tot
                done += b
                if b:
                    self.ledger.add(role, _HBM_READ, b, 0, b, "tiling_re_read", "", k)

    def _dot_operand_roles(self, instr: Instruction, comp: Computation, dot_name: str) -> tuple[str, str]:
        from .roles import _trace_to_parameter
        roles = self.roles
        out = []
        if instr.opcode != "fusion":
            for o in instr.operands[:2]:
                rl = roles.get((comp.name, o))
                out.append(rl[0] if rl else "activations")
        else:
            fused = self.module.computations.get(instr.called_computations[0])
            dot = _find_fused(self.module, fused, dot_name) if fused is not None else None
            if dot is not None:
                dcomp, d = dot
                for o in d.operands[:2]:
                    kk = _trace_to_parameter(self.module, dcomp, dcomp.by_name[o]) if dcomp is fused else None
                    rl = roles.get((comp.name, instr.operands[kk])) if kk is not None and kk < len(instr.operands) else None
                    out.append(rl[0] if rl else "activations")
        while len(out) < 2:
            out.append("activations")
        return out[0], out[1]

    def _collective(self, k: int, r, read_units: dict) -> None:
        c = r.collective
        count = r.multiplicity.count
        wire = c.wire_bytes * count
        if wire <= 0:
            return
        comp = self.module.computations[r.computation]
        instr = r.instr
        compulsory = wire
        parts: list[tuple[str, int]] = []
        # wider than the data: operands converted from a narrower float just to be sent
        narrow = self._narrow_source_bits(instr, comp)
        if narrow is not None:
            wide_bits, narrow_bits = narrow
            keep = wire * narrow_bits // wide_bits
            parts.append(("collective_wider_than_data", compulsory - keep))
            compulsory = keep
        if c.kind == "all-gather":
            key, leaf = self._write_key(instr, comp, ())
            if key is not None and leaf is not None and leaf.is_array:
                root = self.buffers.find(key)
                size = leaf.logical_byte_size * count
                used = min(size, read_units.get(root, 0))
                if used < size:
                    keep = compulsory * used // size if size else compulsory
                    parts.append(("all_gather_partly_used", compulsory - keep))
                    compulsory = keep
        s_per_byte = None
        if self.spec is not None:
            from .collectives import link_bandwidth_bytes_per_s
            try:
                bw = link_bandwidth_bytes_per_s(c, self.spec)
            except (AttributeError, ValueError, KeyError, TypeError):
                bw = None
            s_per_byte = 1.0 / bw if bw else None
        self.ledger.add_wire("device_to_device", wire, compulsory, parts, k, s_per_byte)

    def _narrow_source_bits(self, instr: Instruction, comp: Computation) -> tuple[int, int] | None:
        for o in instr.operands:
            src = comp.by_name.get(o)
            if src is None or not src.shape.is_array:
                continue
            src = _through_bitcast(comp, src)
            inner = None
            if src.opcode == "convert" and src.operands:
                inner = comp.by_name.get(src.operands[0])
            elif src.opcode == "fusion":
                ck = _copy_kind(src, comp, self.module)
                if ck is not None and ck[0] == "dtype_conversion":
                    inner = comp.by_name.get(src.operands[ck[1]])
            if inner is not None and inner.shape.is_array and inner.shape.element_type.startswith(("bf", "f")) \
                    and src.shape.element_type.startswith("f") \
                    and inner.shape.element_bits < src.shape.element_bits:
                return src.shape.element_bits, inner.shape.element_bits
        return None

    # -- result ----------------------------------------------------------------------------

    def _result(self) -> ExcessAnalysis:
        ledger = self.ledger
        ledger.fold()
        module = self.module
        rows = self.rows
        groups: dict[tuple[str, str], list] = {}  # (kind, subject) -> [by_role, by_path, instrs]
        for (kind, subject, role, path), nbytes in ledger.cause_rp.items():
            g = groups.setdefault((kind, subject), [{}, {}, {}])
            if role is not None:
                g[0][role] = g[0].get(role, 0) + nbytes
            g[1][path] = g[1].get(path, 0) + nbytes
        for ks, by_k in ledger.cause_instr.items():
            groups[ks][2] = by_k  # row number -> bytes, in the order the rows were charged
        # (built on first use; a copy of the row list, which may be the analysis's own)
        per_instruction = _PerInstruction(rows[:], ledger.by_row)
        causes: list[ExcessCause] = []
        unattributed = None
        spb = ledger.hbm_s_per_byte
        for (kind, subject), (by_role, by_path, instrs) in groups.items():
            total = sum(by_path.values())
            if not total:
                continue
            items = []
            flops = 0
            if kind == "rematerialization":
                flops = sum(rows[k].total.flops for k in instrs)
            # the costliest MAX_LISTED, ties in row order (= a stable sort by -bytes, cut)
            for k, b in heapq.nlargest(MAX_LISTED, instrs.items(), key=itemgetter(1)):
                row = rows[k]
                loc = module.source_location(row.instr)
                md = row.instr.metadata
                items.append(CauseInstruction(row.computation, row.instr.name, row.instr.opcode, b,
                                              f"{loc.file}:{loc.line}" if loc else None,
                                              md.op_name if md is not None and md.op_name else None))
            hbm = by_path.get(_HBM_READ, 0) + by_path.get(_HBM_WRITE, 0)
            wire = by_path.get("device_to_device", 0)
            wire_s = ledger.cause_s.get((kind, subject))
            untimed = total - hbm - (wire if wire_s is not None else 0)
            time_s = None
            if spb is not None and untimed < total:
                time_s = hbm * spb + (wire_s or 0.0)
            if spb is None:
                untimed = total
            cause = ExcessCause(kind, subject, total, by_role, by_path, time_s, untimed,
                                self._fix(kind, subject, total, items), flops, tuple(items), len(instrs))
            if kind == UNATTRIBUTED:
                unattributed = cause
            else:
                causes.append(cause)
        if unattributed is None:
            unattributed = ExcessCause(UNATTRIBUTED, "", 0, {}, {}, 0.0 if spb is not None else None,
                                       0, "", 0, (), 0)
        if spb is not None:
            causes.sort(key=lambda c: (-(c.time_s or 0.0), -c.bytes, c.kind, c.subject))
        else:
            causes.sort(key=lambda c: (-c.bytes, c.kind, c.subject))
        un_rp: dict[tuple, int] = {}
        for (kind, _s, role, path), nbytes in ledger.cause_rp.items():
            if kind == UNATTRIBUTED:
                un_rp[(role, path)] = un_rp.get((role, path), 0) + nbytes

        def line(pick):
            return ExcessLine(sum(v for rp, v in ledger.compulsory.items() if pick(rp)),
                              sum(v for rp, v in ledger.compiled.items() if pick(rp)),
                              sum(v for rp, v in un_rp.items() if pick(rp)))

        by_role = {r: line(lambda rp, r=r: rp[0] == r and rp[1] in (_HBM_READ, _HBM_WRITE)) for r in ROLES}
        by_path = {p: line(lambda rp, p=p: rp[1] == p) for p in PATHS}
        notes = list(self.notes)
        if self.capacity is None:
            notes.append("no on-chip capacity (no hardware spec, or one without l2_bytes/vmem_bytes): "
                         "every intermediate is counted as a compulsory spill (written and read once); "
                         "give a hardware spec to find the ones that fit on chip")
        if self.any_unmodeled:
            notes.append("unmodeled instructions move bytes jaxmove cannot count: they are in neither "
                         "compiled nor compulsory")
        if spb is not None and any(c.untimed_bytes for c in causes):
            notes.append("host transfer bytes are not timed (the hardware specs give no host link "
                         "bandwidth), nor wire bytes on a spec without link figures")
        return ExcessAnalysis(by_role, by_path, causes, unattributed,
                              self.spec.name if self.spec is not None else None, self.capacity,
                              per_instruction, notes)

    def _is_vmem_eviction(self, item) -> bool:
        """``item`` (a listed instruction) is a copy-start from on-chip memory to HBM."""
        comp = self.module.computations.get(item.computation)
        instr = comp.by_name.get(item.name) if comp is not None else None
        if instr is None or instr.opcode != "copy-start" or not instr.operands:
            return False
        src = comp.by_name[instr.operands[0]].shape
        dst = instr.shape.tuple_shapes[0] if instr.shape.is_tuple else instr.shape
        return src.memory_space in ON_CHIP_MEMORY_SPACES and dst.memory_space not in ON_CHIP_MEMORY_SPACES

    def _fix(self, kind: str, subject: str, nbytes: int, items) -> str:
        saves = f"saves {human_bytes(nbytes)} per step"
        first = items[0].name if items else "?"
        if kind == "donated_but_copied":
            return (f"`{subject}` is donated but XLA still copies it (`{first}`) before updating it: the "
                    "program also reads the old value after the update is scheduled, or returns it with "
                    "another layout or sharding; read it before updating it, return it as it came in -- "
                    f"{saves}")
        if kind == "not_donated":
            pnum = next((p for p in self.params.values() if self._argument(p.number)[0] == subject), None)
            argnum = getattr(pnum, "argnum", None) if pnum is not None else None
            how = f"donate_argnums=({argnum},)" if argnum is not None else "donate_argnums / donate_argnames"
            return f"donate `{subject}` -- jax.jit(..., {how}) -- {saves}"
        if kind == "materialized_intermediate":
            return (f"values written by one kernel and read back by the next fit on chip (e.g. `{first}`): "
                    "a fusion boundary; let XLA fuse the pair (avoid optimization barriers, custom calls and "
                    f"sharding constraints between them) or write one Pallas kernel -- {saves}")
        if kind == "layout_change":
            return (f"`{first}` copies {('`' + subject + '`') if subject else 'a buffer'} into another layout: "
                    "store it in the layout its consumer reads (e.g. a KV cache as [B, H, S, D] for attention "
                    f"over S) or drop the transpose/swapaxes -- {saves}")
        if kind == "slice_copy":
            return (f"`{first}` copies a window of {('`' + subject + '`') if subject else 'a buffer'} "
                    "(a slice / dynamic_slice, e.g. a scanned layer's slice of a stacked KV cache or "
                    "weight) into a buffer of its own that the next kernel reads back: XLA did not fuse "
                    "the slice into its consumer; index the stacked array inside the consuming op, keep "
                    "one array per layer (scan_layers=false), or read the window in a Pallas kernel -- "
                    f"{saves}")
        if kind == "dtype_conversion":
            return (f"`{first}` converts {('`' + subject + '`') if subject else 'a value'} to another dtype and "
                    "back or before use: keep it in the dtype it is used in (store it so, or compute in it with "
                    f"preferred_element_type) -- {saves}")
        if kind == "re_read":
            return (f"{('`' + subject + '`') if subject else 'buffers'} read again by several kernels or loop "
                    f"iterations (e.g. `{first}`): fuse the consumers or reorder the work so it is read once -- "
                    f"{saves}")
        if kind == "tiling_re_read":
            return (f"dot operands exceed on-chip memory and are re-read per output tile (e.g. `{first}`): "
                    f"split the dot into blocks whose operands fit, or reuse each block -- {saves}")
        if kind == "whole_rewrite" and items and self._is_vmem_eviction(items[0]):
            return (f"`{subject}` is updated in place on chip, but XLA:TPU's memory-space assignment "
                    f"placed the whole buffer in VMEM (S(1)) and `{first}` copies it back to HBM "
                    "whole: a compiler choice, not the program's (its dynamic_update_slice is already in "
                    "place); a cache too large for VMEM, or a Pallas kernel that writes only the new "
                    f"rows, avoids it -- {saves}")
        if kind == "whole_rewrite":
            return (f"`{subject}` is rewritten whole (`{first}`) though only part of it changes: update it in "
                    "place with jax.lax.dynamic_update_slice / .at[].set on the donated buffer (no concatenate, "
                    f"no restacking in a scan) -- {saves}")
        if kind == "tile_padding":
            return ("tiled layouts move whole tiles: make the minor dimensions multiples of the tile (128 lanes; "
                    f"8 sublanes for 32-bit, 16 for bf16) or put large dimensions last -- {saves}")
        if kind == "split_k_partials":
            return (f"split-K writes partial sums (`{first}`) and reads them back to reduce them: a larger "
                    f"output (M·N) or a shorter contraction lets XLA pick a tiling without split-K; compiled "
                    f"without the device, XLA:GPU chose split-K by its heuristics, not by autotuning (on the "
                    f"device the autotuner may pick another tiling) -- {saves}")
        if kind == "dot_as_multiply_reduce":
            return (f"XLA rewrote a dot with a 1-row operand into a multiply (`{first}`) and a reduce in two "
                    f"kernels: the [K,N] product goes to HBM and back; give the dot at least 2 rows "
                    f"(batch >= 2 decode stays a GEMM on XLA:GPU) or write the GEMV as one Pallas kernel -- "
                    f"{saves}")
        if kind == "rematerialization":
            return (f"recomputed forward work (`{first}`, jax.checkpoint or XLA's rematerialization): save these "
                    "values instead (a jax.checkpoint policy such as dots_saveable, or more memory) -- "
                    f"{saves}")
        if kind == "all_gather_partly_used":
            return (f"only part of the all-gather's result is read (`{first}`): gather just that part, or shard "
                    f"the consumer like the operand -- {saves}")
        if kind == "collective_wider_than_data":
            return (f"`{first}` sends data wider than it is (converted to f32 to be sent): XLA:CPU promotes bf16 "
                    "collectives; on TPU/GPU keep the dtype, or convert after the collective -- "
                    f"{saves}")
        if kind == "host_round_trip":
            return (f"data goes to host memory and back (`{first}`): keep it on device if it fits (drop the "
                    f"host offload / memory_kind='pinned_host' or the checkpoint offload policy) -- {saves}")
        return f"excess no rule explains (e.g. `{first}`) -- {human_bytes(nbytes)} per step"


def _touches_host(t) -> bool:
    for a in t.reads:
        if a.memory_space == HOST_MEMORY_SPACE:
            return True
    for a in t.writes:
        if a.memory_space == HOST_MEMORY_SPACE:
            return True
    return False




def _leaf_shapes(shape) -> list:
    """The leaves of ``shape`` in tuple order (``Shape.leaves``, without a call per array)."""
    if not shape.is_tuple:
        return [shape]
    out = []
    for s in shape.tuple_shapes:
        if s.is_tuple:
            out.extend(_leaf_shapes(s))
        else:
            out.append(s)
    return out


def _leaves(shape) -> list:
    if not shape.is_tuple:
        return [((), shape)]
    return list(shape.leaves_with_index())


def _logical(a, leaf) -> int:
    """Data bytes of an access (``Access.logical_nbytes``, else the leaf's share)."""
    lg = a.logical_nbytes
    if lg is not None:
        return lg
    if leaf is None or not leaf.byte_size or leaf.byte_size == leaf.logical_byte_size:
        return a.nbytes
    return a.nbytes * leaf.logical_byte_size // leaf.byte_size


def _find_fused(module: Module, fused: Computation, name: str):
    for c in [fused]:
        i = c.by_name.get(name)
        if i is not None:
            return c, i
    return None
