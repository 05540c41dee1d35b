"""Traffic: bytes each kernel-level instruction reads and writes, per execution.

A *kernel-level* instruction is one in a computation that runs as its own kernels
(ENTRY, while bodies and conditions, conditional branches, called computations; see
``multiplicity``). Instructions inside fusions are not kernels: the fusion is.

Semantics (DESIGN.md, and where jaxmove deliberately differs from XLA's
``HloCostAnalysis::HandleFusion``/``FusionParameterReadBytes``):

* bitcast, tuple, get-tuple-element, parameter, constant, after-all, add-dependency,
  while/conditional/call (their bodies are costed), async-start/done (the wrapped
  computation is costed), *-done of async pairs (the *-start carries the transfer),
  and domain/opt-barrier move nothing.
* A kernel reads each distinct operand once (``add(x, x)`` reads x once) and writes
  each leaf of its result once.
* In a fusion, a parameter used only through slice / dynamic-slice / gather (also
  through element-count-preserving ops: elementwise, convert, copy, bitcast, reshape,
  transpose, and nested fusions) is read only for the elements those users touch. Through a
  one-input reduce, a window of the result needs the same share of the operand (the reduced
  dimensions whole: a split-K partial sum reduced, then sliced into q, k and v). A nested
  fusion's root is demanded as far as its caller's users demand the nested fusion's result,
  so a footprint carries through any depth of nesting (XLA:TPU's retiling copy fusion of a
  stacked int8 weight, then a dynamic-slice of one layer; ``hlo_cost_analysis_test.cc``
  ``NestedCopyFusion``). A parameter used several times is read once, for the sum of its
  users' footprints (at most whole).
* A dynamic-update-slice whose buffer operand is (through bitcasts) a fusion parameter
  of the same size as its result, and that is the fusion root or an element of the root
  tuple, is in place: the buffer is not read, and only the update is written. So is one
  whose buffer reaches the parameter through copies and nested fusions that only copy it
  (XLA:TPU's aliased retiling copy of an s8 KV cache) when the result has the parameter's
  own dims and layout (its untouched elements stay where they are). An unfused
  dynamic-update-slice is in place too. Anything else rewrites the whole buffer.
* scatter updates its operand in place (unfused, or as a fusion root whose operand is
  a same-size fusion parameter): it reads the updates and indices and reads and writes
  the scattered elements (as many as the updates) of the operand -- writes only, where its
  combiner returns the update (``x.at[i].set``: the old elements are overwritten unread).
* Library custom calls do not count a trailing u8/s8 workspace result (cuBLAS/cuDNN
  scratch) as traffic.
* Every access carries the memory space of the shape it touches: S(0) is HBM, S(5)
  host memory, S(1) and S(6) on-chip (TPU VMEM and SMEM), which are not HBM traffic.
* Bytes are *physical*: a tiled layout (XLA:TPU's ``{1,0:T(8,128)(2,1)}``) is moved in
  whole tiles, so a buffer's bytes are its tile-padded ``Shape.byte_size`` (DMA engines move
  tiles). A slice reads the tiles its dimensions cover under the source's layout
  (``Shape.sliced_byte_size``); a fusion's footprint of ``e`` of ``n`` elements the same share
  ``e / n`` of the padded buffer (``Shape.footprint_bytes``). Each access also carries its
  data (logical) bytes, ``logical_nbytes``; the difference is tile padding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

from .._perf import slots_constructor
from ..hlo.shape import HOST_MEMORY_SPACE, ON_CHIP_MEMORY_SPACES  # noqa: F401  (re-exported)
from ..hlo import Computation, Instruction, Module, Shape
from ..hlo.opcodes import OPCODES, custom_call_target, names
from .memo import memo_of

# Opcodes that never move data on their own (the opcode table, hlo/opcodes.py).
FREE_OPCODES = names(moves_data=False)

# Every opcode XLA prints that jaxmove models (xla/hlo/ir/hlo_opcode.h).
KNOWN_OPCODES = frozenset(OPCODES)

# Ops that touch each element of their operand at most once per output element and keep
# the element count: a footprint demanded of their output is demanded of their operands.
ELEMENT_PRESERVING = names(element_preserving=True)

LIBRARY_PREFIXES = ("__cublas", "__cudnn", "__onednn", "__ynn", "__op$")
# Pallas kernels: costed from their kernel (passes/pallas.py KERNEL_TARGETS, checked equal in tests)
_PALLAS_TARGETS = frozenset({"tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu_v2"})


@dataclass(frozen=True, slots=True)
class Access:
    """One read or write of a buffer leaf by a kernel, per execution.

    Attributes:
      nbytes: bytes moved.
      operand: operand number for a read, None for a write of the result.
      index: ShapeIndex of the leaf within the operand (read) or result (write).
      memory_space: memory space of the leaf (0 HBM, 5 host, ON_CHIP_MEMORY_SPACES on-chip).
      logical_nbytes: the data bytes among ``nbytes`` (``nbytes`` less tile padding), or
        None: the same share of the leaf's data as ``nbytes`` is of its physical size.
    """

    nbytes: int
    operand: int | None
    index: tuple[int, ...]
    memory_space: int
    logical_nbytes: int | None = None


@dataclass(frozen=True, slots=True)
class InstrTraffic:
    """Reads and writes of one kernel-level instruction, per execution."""

    reads: tuple[Access, ...] = ()
    writes: tuple[Access, ...] = ()
    notes: tuple[str, ...] = ()
    unmodeled: tuple[str, ...] = ()
    inplace_buffer_bytes: int = 0  # bytes of buffers updated in place (not read, not rewritten)

    @property
    def read_bytes(self) -> int:
        return sum(a.nbytes for a in self.reads)

    @property
    def write_bytes(self) -> int:
        return sum(a.nbytes for a in self.writes)


# Access(nbytes, operand, index, memory_space[, logical_nbytes]) and InstrTraffic(reads,
# writes, notes, unmodeled, inplace_buffer_bytes), positional, without the frozen __init__
_new_access = slots_constructor(Access)
_traffic = slots_constructor(InstrTraffic)


def _access(nbytes: int, operand: int | None, index: tuple[int, ...], memory_space: int,
            logical_nbytes: int | None = None) -> Access:
    return _new_access(nbytes, operand, index, memory_space, logical_nbytes)


def _leaf_access(leaf: Shape, operand: int | None, index: tuple[int, ...]) -> Access:
    """An access of a whole leaf: its physical bytes, with its data bytes."""
    return _new_access(leaf.byte_size, operand, index, leaf.memory_space, leaf.logical_byte_size)


def _elems_to_bytes(shape: Shape, elems: int) -> int:
    """Physical bytes of ``elems`` elements of ``shape`` (``Shape.footprint_bytes``)."""
    return shape.footprint_bytes(elems)


def _full_reads(instr: Instruction, comp: Computation, skip: frozenset[int] = frozenset()) -> list[Access]:
    """Read every leaf of every distinct operand once."""
    out: list[Access] = []
    seen: set[str] = set()
    for i, name in enumerate(instr.operands):
        if i in skip or name in seen:
            continue
        seen.add(name)
        shape = comp.by_name[name].shape
        if not shape.is_tuple:  # the common case, without building the leaf list
            if shape.is_array:
                out.append(_leaf_access(shape, i, ()))
            continue
        for idx, leaf in shape.leaves_with_index():
            if leaf.is_array:
                out.append(_leaf_access(leaf, i, idx))
    return out


def _full_writes(shape: Shape, skip_index: set[tuple[int, ...]] | None = None) -> list[Access]:
    if not shape.is_tuple:
        if shape.is_array and not (skip_index and () in skip_index):
            return [_leaf_access(shape, None, ())]
        return []
    return [_leaf_access(leaf, None, idx)
            for idx, leaf in shape.leaves_with_index()
            if leaf.is_array and not (skip_index and idx in skip_index)]


# ---- fusions ---------------------------------------------------------------------------

class _FusionAnalysis:
    """Footprint and in-place analysis of one fused computation.

    A nested fused computation is analysed per call site (``parent``: the analysis of the
    computation that holds the nested ``fusion`` instruction, and that instruction): what its
    root leaves to the outside is demanded only as far as the call's users in the parent
    demand it, so a slice footprint taken of a nested fusion's result (XLA:TPU's retiling
    ``copy`` fusion, then a dynamic-slice of one layer) carries through to the nested
    parameter and on to the top-level operand, at any depth of nesting."""

    def __init__(self, module: Module, comp: Computation,
                 nested: dict | None = None,
                 parent: "tuple[_FusionAnalysis, Instruction] | None" = None):
        """``nested``: analyses of nested fused computations, by call site, shared with the
        analysis that holds this one (each is built once per top-level fusion). ``parent``:
        (the analysis of the calling computation, the calling ``fusion`` instruction) for a
        nested computation, None for the top-level fused computation."""
        self.module = module
        self.comp = comp
        self.parent = parent
        # value name -> [(user, operand number)]; a value without users has no entry
        users: dict[str, list[tuple[Instruction, int]]] = {}
        for instr in comp.instructions:
            k = 0
            for o in instr.operands:
                lst = users.get(o)
                if lst is None:
                    users[o] = [(instr, k)]
                else:
                    lst.append((instr, k))
                k += 1
        self.users = users
        self._nested = {} if nested is None else nested
        self.inplace: dict[str, Instruction] = {}  # DUS name -> DUS, in place
        self.root_leaves = self._root_leaves()
        self._root_names = {p.name for _i, p in self.root_leaves}
        for _idx, producer in self.root_leaves:
            if producer.opcode in ("dynamic-update-slice", "scatter") and self._is_inplace(producer):
                self.inplace[producer.name] = producer
        self._memo: dict[str, int] = {}

    def _nested_analysis(self, call: Instruction) -> "_FusionAnalysis":
        """The analysis of the computation ``call`` (a ``fusion`` of this computation) runs."""
        key = (id(self), call.name)
        fa = self._nested.get(key)
        if fa is None:
            fa = self._nested[key] = _FusionAnalysis(
                self.module, self.module.computations[call.called_computations[0]],
                self._nested, (self, call))
        return fa

    def _through_bitcast(self, instr: Instruction) -> Instruction:
        while instr.opcode == "bitcast":
            instr = self.comp.by_name[instr.operands[0]]
        return instr

    def _root_leaves(self) -> list[tuple[tuple[int, ...], Instruction]]:
        root = self.comp.root
        if root.opcode == "tuple":
            return [((k,), self._through_bitcast(self.comp.by_name[o])) for k, o in enumerate(root.operands)]
        return [((), self._through_bitcast(root))]

    def _buffer_parameter(self, value: Instruction) -> tuple[Instruction | None, bool]:
        """(the fusion parameter whose elements ``value`` holds in the same places, whether
        the way there changed the layout), following bitcast, copy and nested fusions whose
        root is such a chain from one of their parameters (XLA:TPU's retiling copy fusion
        ``copy(T(32,128) -> T(8,128))`` of an s8 buffer); (None, False) when ``value`` is
        anything else."""
        relaid = False
        fa, v = self, value
        while True:
            op = v.opcode
            if op == "parameter":
                if fa.parent is None:
                    return v, relaid
                pfa, call = fa.parent
                k = v.parameter_number
                if k is None or k >= len(call.operands):
                    return None, False
                fa, v = pfa, pfa.comp.by_name[call.operands[k]]
            elif op in ("bitcast", "copy") and v.operands:
                relaid = relaid or op == "copy"
                v = fa.comp.by_name[v.operands[0]]
            elif op == "fusion" and v.called_computations and v.shape.is_array:
                nfa = fa._nested_analysis(v)
                fa, v = nfa, nfa.comp.root
                relaid = True
            else:
                return None, False
            if v.shape.is_array and v.shape.num_elements != value.shape.num_elements:
                return None, False

    def _is_inplace(self, dus: Instruction) -> bool:
        """A root DUS / scatter whose buffer (operand 0) is a fusion parameter of the result's
        size, through bitcasts; or, through copies and nested fusions (a relayout on chip), one
        of the result's very layout: its untouched elements stay where they are."""
        if self.parent is not None:  # nested: its own parameter, through bitcasts
            buf = self._through_bitcast(self.comp.by_name[dus.operands[0]])
            return buf.opcode == "parameter" and buf.shape.byte_size == dus.shape.byte_size
        param, relaid = self._buffer_parameter(self.comp.by_name[dus.operands[0]])
        if param is None:
            return False
        if param.shape.byte_size != dus.shape.byte_size:
            return False
        if relaid:
            a, b = param.shape.layout, dus.shape.layout
            if a is None or b is None or (a.minor_to_major, a.tiles, a.element_size_bits) != \
                    (b.minor_to_major, b.tiles, b.element_size_bits) or \
                    param.shape.dims != dus.shape.dims or \
                    param.shape.element_type != dus.shape.element_type:
                return False
        return True

    def has_users(self, name: str) -> bool:
        return bool(self.users.get(name))

    def _pad_demand(self, pad: Instruction, vshape: Shape, total: int) -> int:
        """Elements of a pad's operand (of ``vshape``) that the pad's users read: a slice or
        dynamic-slice of the padded value of dims ``s`` touches at most ``min(s_i, operand_i)``
        operand elements along each dimension i (edge padding only; with interior padding, or
        any other user, the whole operand). XLA:TPU's windowed einsums slice weights this way."""
        cfg = pad.attrs.get("padding", "")
        if "_" not in cfg or cfg.count("_") > 2 * len(vshape.dims):
            return total
        for part in cfg.split("x"):
            bits = part.split("_")
            if len(bits) == 3 and bits[2].strip() not in ("", "0"):
                return total  # interior padding dilates the operand
        demand = 0
        for user, j in self.users.get(pad.name, ()):
            if user.opcode in ("slice", "dynamic-slice") and j == 0 and user.shape.is_array \
                    and len(user.shape.dims) == len(vshape.dims):
                d = 1
                for a, b in zip(user.shape.dims, vshape.dims):
                    d *= min(a, b)
                demand += d
            else:
                return total
            if demand >= total:
                return total
        return demand

    def demand_elems(self, value: Instruction) -> int:
        """Elements of ``value`` that the fusion's kernel actually reads.

        Iterative: the demands it depends on (element-preserving users inside the fusion,
        parameters of nested fusions, and for a nested computation's root the demand on the
        calling fusion's result) are settled first from an explicit stack, deepest first, so
        chains and nestings of any depth take no Python recursion."""
        hit = self._memo.get(value.name)
        if hit is not None:
            return hit
        stack: list[tuple[_FusionAnalysis, Instruction]] = [(self, value)]
        while stack:
            fa, v = stack[-1]
            if v.name in fa._memo:
                stack.pop()
                continue
            deps = fa._unsettled(v)
            if deps:
                stack.extend(deps)
                continue
            stack.pop()
            fa._memo[v.name] = fa._demand_one(v)
        return self._memo[value.name]

    # -- the demand on what a nested computation's root leaves to its caller ---------------

    def _outside_values(self, idx: tuple[int, ...]):
        """(analysis, value) pairs of the parent whose demands make up the demand on root
        element ``idx`` of this computation, or None when it is read whole: at the top level
        (a result leaves the kernel whole), or when a user of the calling fusion takes it
        whole (anything but get-tuple-element of a tuple result)."""
        if self.parent is None:
            return None
        pfa, call = self.parent
        if idx == ():
            return [(pfa, call)]
        if len(idx) != 1 or call.is_root:
            return None
        out = []
        for u, _k in pfa.users.get(call.name, ()):
            if u.opcode != "get-tuple-element":
                return None
            if u.tuple_index == idx[0]:
                out.append((pfa, u))
        return out

    def _outside_deps(self, idx: tuple[int, ...], out: list) -> None:
        vals = self._outside_values(idx)
        if vals:
            out.extend((fa, v) for fa, v in vals if v.name not in fa._memo)

    def _outside_demand(self, idx: tuple[int, ...], total: int) -> int:
        """Elements of root element ``idx`` (of ``total`` elements) that the consumers outside
        this computation read: all of them at the top level, else what the calling fusion's
        users in the parent demand of it."""
        vals = self._outside_values(idx)
        if vals is None:
            return total
        return min(total, sum(fa._memo[v.name] for fa, v in vals))

    def _unsettled(self, value: Instruction) -> list[tuple["_FusionAnalysis", Instruction]]:
        """The demands _demand_one(value) reads that are not memoized yet."""
        out: list[tuple[_FusionAnalysis, Instruction]] = []
        vshape = value.shape
        if not vshape.is_array:
            return out
        total = vshape.num_elements
        nested = self.parent is not None
        if nested and value.is_root:
            self._outside_deps((), out)  # (at the top level a root leaves whole: no deps)
        for user, k in self.users.get(value.name, ()):
            op = user.opcode
            rebuilt = op == "dynamic-update-slice" and k == 0 and user.name not in self.inplace
            if k == 0 and op in ("slice", "dynamic-slice", "gather", "pad", "dynamic-update-slice",
                                 "scatter") and not rebuilt:
                continue
            if (op in ELEMENT_PRESERVING and user.shape.is_array and user.shape.num_elements == total
                    or _reduces(user, k, total) or rebuilt and user.shape.num_elements == total):
                if user.is_root:
                    if nested:
                        self._outside_deps((), out)
                elif user.name not in self._memo:
                    out.append((self, user))
            elif op == "tuple" and user.is_root:
                if nested:
                    self._outside_deps((k,), out)
            elif op == "fusion" and user.called_computations:
                fa = self._nested_analysis(user)
                p = fa.comp.parameters[k]
                if p.shape.is_array and p.name not in fa._memo:
                    out.append((fa, p))
        return out

    def _demand_one(self, value: Instruction) -> int:
        """demand_elems of ``value`` once _unsettled(value) is empty."""
        vshape = value.shape
        if not vshape.is_array:
            return 0
        total = vshape.num_elements
        demand = 0
        if value.is_root and (self.parent is not None or value.opcode != "parameter"):
            # the root: as the caller reads it (a nested computation's), whole at the top level
            # (a nested fusion that is the fusion's root; a parameter root keeps the old
            # reading, as _PlainFusion's: not read)
            demand = self._outside_demand((), total)
        for user, k in self.users.get(value.name, ()):
            if demand >= total:
                break
            op = user.opcode
            if op in ("slice", "dynamic-slice") and k == 0:
                d = user.shape.num_elements
            elif op == "gather" and k == 0:
                d = min(user.shape.num_elements, total)
            elif op == "pad" and k == 0 and not (user.is_root or user.name in self._root_names):
                d = self._pad_demand(user, vshape, total)
            elif op == "dynamic-update-slice" and k == 0 and user.name in self.inplace:
                d = 0
            elif op == "dynamic-update-slice" and k == 0 and user.shape.num_elements == total:
                # a buffer rebuilt around a window (not in place): each element of the result
                # its users read is the operand's or the update's -- a slice of the result reads
                # no more of the operand than its own size
                d = self._outside_demand((), total) if user.is_root else self._memo[user.name]
            elif op == "scatter" and k == 0 and user.name in self.inplace:
                # (the touched elements, unless the combiner overwrites them: .at[i].set)
                d = 0 if _scatter_overwrites(user, self.module) else \
                    min(self.comp.by_name[user.operands[-1]].shape.num_elements, total)
            elif op in ELEMENT_PRESERVING and user.shape.is_array and user.shape.num_elements == total:
                # a result leaves the fusion as far as the consumers outside read it (in full
                # at the top level); a value inside it, as far as its own users read it
                d = self._outside_demand((), total) if user.is_root else self._memo[user.name]
            elif _reduces(user, k, total):
                # each result element reduces total / n of the operand's: a window of the
                # result (a slice after the reduce) needs that share of the operand
                n = user.shape.num_elements
                d = (self._outside_demand((), n) if user.is_root else self._memo[user.name]) * (total // n)
            elif op == "tuple" and user.is_root:
                d = self._outside_demand((k,), total)
            elif op == "fusion" and user.called_computations:
                fa = self._nested_analysis(user)
                p = fa.comp.parameters[k]
                d = fa._memo[p.name] if p.shape.is_array else total
            else:
                d = total
            demand += d
        return min(demand, total)


def _reduces(user: Instruction, k: int, total: int) -> bool:
    """``user`` is a one-input reduce of its operand ``k`` (of ``total`` elements) to an array
    of fewer elements: each result element reads ``total / n`` operand elements (the reduced
    dimensions), so a demand on part of its result is that share of its operand."""
    if user.opcode != "reduce" or k != 0 or len(user.operands) != 2 or not user.shape.is_array:
        return False
    n = user.shape.num_elements
    return 0 < n < total and total % n == 0


# Fused opcodes that read (or write) less than a whole value: a computation without them
# reads each value in full, or not at all.
_FOOTPRINT_OPCODES = frozenset({"slice", "dynamic-slice", "gather", "dynamic-update-slice",
                                "scatter", "fusion"})


_opcode = attrgetter("opcode")
_operands = attrgetter("operands")


class _PlainFusion:
    """What ``_FusionAnalysis`` finds for a *plain* fused computation, without building it:
    one with no ``_FOOTPRINT_OPCODES`` and no dead values (every instruction but the root
    and the parameters has a user). There, following users from a value always reaches the
    root or an op that reads in full, so an array parameter with a user is demanded in full
    and one without users (unused, or the root itself) not at all; nothing is in place."""

    __slots__ = ("used", "root_leaves", "inplace", "_root", "constants")

    def __init__(self, comp: Computation, used: set[str], constants: list[Instruction]):
        self.used = used
        self.constants = constants  # its constant instructions, in order (_fused_constant_reads)
        self.inplace: dict[str, Instruction] = {}
        root = comp.root
        # the root leaves whole, so it is demanded whole (a constant root is read; a parameter
        # root keeps its reading, not read, as _FusionAnalysis's)
        self._root = root.name if root.opcode != "parameter" else None
        self.root_leaves = ([((k,), None) for k in range(len(root.operands))]
                            if root.opcode == "tuple" else [((), None)])

    @staticmethod
    def of(comp: Computation) -> "_PlainFusion | None":
        instrs = comp.instructions
        ops = set(map(_opcode, instrs))
        if not _FOOTPRINT_OPCODES.isdisjoint(ops):
            return None
        constants = [i for i in instrs if i.opcode == "constant"] if "constant" in ops else []
        used = set(chain.from_iterable(map(_operands, instrs)))
        root, params = comp.root, comp.parameters
        root_counts = root.opcode != "parameter"  # (a parameter root is counted with the params)
        need = len(comp.instructions) - len(params) - root_counts
        have = len(used) - sum(p.name in used for p in params) - (root_counts and root.name in used)
        if have != need:
            return None  # a computed value nothing uses: let _FusionAnalysis follow it
        return _PlainFusion(comp, used, constants)

    def demand_elems(self, value: Instruction) -> int:
        shape = value.shape
        return shape.num_elements if shape.is_array and (
            value.name in self.used or value.name == self._root) else 0

    def has_users(self, name: str) -> bool:
        return name in self.used


def _output_aliasing(instr: Instruction) -> dict[tuple[int, ...], int]:
    """``output_to_operand_aliasing={{1}: (0, {}), ...}``: result index -> operand number
    (whole operands only)."""
    text = instr.attrs.get("output_to_operand_aliasing")
    if not text:
        return {}
    out = {}
    for m in _ALIAS_ENTRY.finditer(text):
        idx = tuple(int(x) for x in m.group(1).replace(" ", "").split(",") if x)
        if not m.group(3).strip():
            out[idx] = int(m.group(2))
    return out


_ALIAS_ENTRY = re.compile(r"\{([0-9,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([0-9,\s]*)\}")
_ASYNC_COLLECTIVE_TARGETS = frozenset({"AsyncCollectiveStart", "AsyncCollectiveDone"})
_COLLECTIVE_OPS = frozenset(o for o, r in OPCODES.items() if r.collective is not None)


def _collective_continuation(instr: Instruction, fused: Computation) -> tuple[set, set]:
    """XLA:TPU's decomposed async collective (one collective, one channel_id, run by a start
    fusion whose root is the ``AsyncCollectiveStart`` custom call, continuation fusions that
    carry it on beside other work, and a fusion whose root is ``AsyncCollectiveDone``): the
    start reads the operand and writes the result buffer; the continuations and the done get
    that buffer as an operand and return it in place (``output_to_operand_aliasing``).

    Returns (root indices that write nothing: an aliased parameter passed through, an aliased
    collective result, the done's root; fused instructions whose operand reads are not
    traffic: those collectives and the async-collective custom calls). Both empty for any
    other fusion."""
    alias = _output_aliasing(instr)
    root = fused.root
    free_idx: set = set()
    free_users: set = set()
    if not alias and not (root.opcode == "custom-call" and root.custom_call_target in _ASYNC_COLLECTIVE_TARGETS):
        return free_idx, free_users
    for idx, producer in _root_producers(fused):
        k = alias.get(idx)
        if producer.opcode == "custom-call" and producer.custom_call_target == "AsyncCollectiveDone" \
                and k is not None:
            free_idx.add(idx)
            free_users.add(producer.name)
            free_users.update(o for o in producer.operands if fused.by_name[o].opcode in _COLLECTIVE_OPS)
        elif k is None:
            continue
        elif producer.opcode == "parameter" and producer.parameter_number == k:
            free_idx.add(idx)
        elif producer.opcode in _COLLECTIVE_OPS:
            free_idx.add(idx)
            free_users.add(producer.name)
    return free_idx, free_users  # (the start: its collective's read and write are traffic)


def _root_producers(fused: Computation) -> list[tuple[tuple[int, ...], Instruction]]:
    """(root index, producer through bitcasts) of each element of a fused root."""
    root = fused.root
    leaves = ([((k,), fused.by_name[o]) for k, o in enumerate(root.operands)]
              if root.opcode == "tuple" else [((), root)])
    out = []
    for idx, v in leaves:
        while v.opcode == "bitcast":
            v = fused.by_name[v.operands[0]]
        out.append((idx, v))
    return out


def fusion_traffic(instr: Instruction, comp: Computation, module: Module) -> InstrTraffic:
    """Traffic of a ``fusion``: its operands' footprints, its fused constants, its result leaves
    (in-place updates write their update). Computed once per structurally identical fused
    computation (``Module.structural_classes``) and call site shapes: the operands' and the
    result's shapes, which operands repeat, and the output aliasing decide it; the notes that
    name an operand are then named for each fusion."""
    fused_name = instr.called_computations[0]
    operands = instr.operands
    by_name = comp.by_name
    n = len(operands)
    repeats = None
    if len(set(operands)) != n:  # (rare) which operands are one value: first position of each
        first: dict[str, int] = {}
        repeats = tuple(first.setdefault(o, k) for k, o in enumerate(operands))
    key = (module.structural_classes[fused_name], id(instr.shape),
           instr.attrs.get("output_to_operand_aliasing"), repeats,
           tuple(map(id, map(_shape, map(by_name.__getitem__, operands)))))
    cache = memo_of(module).fusion_traffic
    t = cache.get(key)
    if t is None:
        t = cache[key] = _fusion_traffic(instr, comp, module, module.computations[fused_name])
    notes = t.notes
    if notes and any(type(x) is tuple for x in notes):  # notes naming an operand: named here
        t = _traffic(t.reads, t.writes, tuple(
            f"operand {x[0]} ({operands[x[0]]}){x[1]}" if type(x) is tuple else x for x in notes),
            t.unmodeled, t.inplace_buffer_bytes)
    return t


_shape = attrgetter("shape")


def _fusion_traffic(instr: Instruction, comp: Computation, module: Module,
                    fused: Computation) -> InstrTraffic:
    """fusion_traffic's answer, but with each note about operand ``k`` as ``(k, the rest of
    its text)``: the same for every fusion of the same key."""
    fa = _PlainFusion.of(fused) or _FusionAnalysis(module, fused)
    free_idx, free_users = _collective_continuation(instr, fused)
    if free_idx:
        return _continuation_traffic(instr, comp, fused, free_idx, free_users)
    reads: list[Access] = []
    notes: list[str] = []
    operands = instr.operands
    parameters = fused.parameters
    n_params = len(parameters)
    # operand name -> its fusion parameters (one pass: fusions may take hundreds of operands);
    # None when every operand is distinct (the usual case: operand k binds parameter k)
    bound: dict[str, list[Instruction]] | None = None
    if len(set(operands)) != len(operands):
        bound = {}
        for j, o in enumerate(operands):
            ps = bound.setdefault(o, [])
            if j < n_params:
                ps.append(parameters[j])
    seen: set[str] = set()
    by_name = comp.by_name
    for k, name in enumerate(operands):
        if bound is not None:
            if name in seen:
                continue
            seen.add(name)
        oshape = by_name[name].shape
        if not oshape.is_array:
            params_k = bound[name] if bound is not None else (
                [parameters[k]] if k < n_params else [])
            reads.extend(_tuple_operand_reads(fa, fused, params_k, oshape, k, name, notes))
            continue
        if bound is None:
            demand = fa.demand_elems(parameters[k]) if k < n_params else 0
        else:
            # all fusion parameters bound to the same operand (rare) are read once, as their union
            demand = sum(fa.demand_elems(p) for p in bound[name])
        n_el = oshape.num_elements
        if demand >= n_el:  # read whole (the usual case): footprint_bytes' first answer
            nbytes = oshape.byte_size
            if nbytes:
                reads.append(_new_access(nbytes, k, (), oshape.memory_space,
                                         oshape.logical_byte_size))
            continue
        elems = demand
        nbytes = _elems_to_bytes(oshape, elems)
        if elems < n_el:
            if elems == 0:
                params_k = bound[name] if bound is not None else (
                    [parameters[k]] if k < n_params else [])
                used = any(fa.has_users(p.name) for p in params_k)
                notes.append((k, " is updated in place: not read") if used else
                             (k, " is not used inside the fusion: not read"))
            else:
                notes.append((k, f" read only for its slice footprint: {nbytes} of "
                                 f"{oshape.byte_size} bytes"))
        if nbytes:
            reads.append(_access(nbytes, k, (), oshape.memory_space,
                                 oshape.logical_footprint_bytes(elems)))
    reads.extend(_fused_constant_reads(fa, fused, notes))
    writes: list[Access] = []
    inplace_bytes = 0
    inplace = fa.inplace
    for idx, producer in fa.root_leaves:
        leaf = instr.shape.subshape(idx) if instr.shape.is_tuple else instr.shape
        if not leaf.is_array:
            continue
        if inplace and producer.name in inplace and producer.opcode == "scatter":
            upd = fused.by_name[producer.operands[-1]].shape
            ne = min(upd.num_elements, leaf.num_elements)
            nb = _elems_to_bytes(leaf, ne)
            writes.append(_access(nb, None, idx, leaf.memory_space, leaf.logical_footprint_bytes(ne)))
            inplace_bytes += leaf.byte_size
            notes.append(f"in-place scatter: writes {nb} of {leaf.byte_size} bytes of result {list(idx)}")
        elif inplace and producer.name in inplace:
            upd = fused.by_name[producer.operands[1]].shape
            writes.append(_access(upd.byte_size, None, idx, leaf.memory_space, upd.logical_byte_size))
            inplace_bytes += leaf.byte_size
            notes.append(f"in-place dynamic-update-slice: writes {upd.byte_size} of "
                         f"{leaf.byte_size} bytes of result {list(idx)}")
        else:
            writes.append(_leaf_access(leaf, None, idx))
    if instr.shape.is_tuple and fused.root.opcode != "tuple":
        writes = _full_writes(instr.shape)
    return _traffic(tuple(reads), tuple(writes), tuple(notes), (), inplace_bytes)


def _tuple_operand_reads(fa, fused: Computation, params: list[Instruction], oshape: Shape, k: int,
                         name: str, notes: list[str]) -> list[Access]:
    """Reads of a tuple-shaped fusion operand ``k`` bound to fusion parameters ``params``: the
    elements the fusion takes with get-tuple-element, each for its footprint (``demand_elems``
    of the get-tuple-element); an element no get-tuple-element takes is not read. Any other
    use of the parameter (or none known) reads every leaf. XLA likewise charges only the used
    element (hlo_cost_analysis_test.cc IgnoreUnusedParameterShape: 3 of 103 bytes)."""
    whole = [_leaf_access(leaf, k, idx) for idx, leaf in oshape.leaves_with_index() if leaf.is_array]
    if not params:
        return whole
    gtes: dict[int, list[Instruction]] = {}
    names = {p.name for p in params}
    for i in fused.instructions:
        if not names.intersection(i.operands):
            continue
        if i.opcode != "get-tuple-element" or i.tuple_index is None or i is fused.root:
            return whole
        gtes.setdefault(i.tuple_index, []).append(i)
    if any(p is fused.root for p in params):
        return whole
    out: list[Access] = []
    for e, elem in enumerate(oshape.tuple_shapes):
        users = gtes.get(e)
        if not users:
            continue
        if not elem.is_array:  # a nested tuple: its leaves whole
            out.extend(_leaf_access(leaf, k, (e,) + idx)
                       for idx, leaf in elem.leaves_with_index() if leaf.is_array)
            continue
        elems = min(elem.num_elements, sum(fa.demand_elems(g) for g in users))
        if elems:
            out.append(_access(_elems_to_bytes(elem, elems), k, (e,), elem.memory_space,
                               elem.logical_footprint_bytes(elems)))
    unread = sum(a.nbytes for a in whole) - sum(a.nbytes for a in out)
    if unread:
        notes.append((k, f" is a tuple: only the elements the fusion uses are read ({unread} of "
                         f"{sum(a.nbytes for a in whole)} bytes not read)"))
    return out


def _fused_constant_reads(fa, fused: Computation, notes: list[str]) -> list[Access]:
    """Reads of the non-scalar constants inside a fusion (and its nested fusions), each once for
    its footprint: a constant array is a buffer in device memory that the kernel reads, as
    XLA charges it (HloCostAnalysis::HandleFusion; gpu_hlo_cost_analysis_test.cc LargeConstant:
    the fusion reads its s8[1000] operand and its s8[1000] constant, 2,000 bytes). A scalar
    constant is an immediate of the kernel's code. The accesses have no operand (``operand`` is
    None); their role is ``activations``."""
    out: list[Access] = []
    stack = [(fa, fused)]
    total = 0
    while stack:
        a, comp = stack.pop()
        # (a plain fusion has no nested fusions, and listed its constants: no second walk)
        for i in (a.constants if type(a) is _PlainFusion else comp.instructions):
            op = i.opcode
            if op == "constant":
                shape = i.shape
                if shape.is_array and shape.num_elements > 1:
                    elems = min(shape.num_elements, a.demand_elems(i))
                    if elems:
                        nb = _elems_to_bytes(shape, elems)
                        out.append(_access(nb, None, (), shape.memory_space,
                                           shape.logical_footprint_bytes(elems)))
                        total += nb
            elif op == "fusion" and i.called_computations and isinstance(a, _FusionAnalysis):
                n = a._nested_analysis(i)
                stack.append((n, n.comp))
    if out:
        notes.append(f"{len(out)} constant(s) inside the fusion read from device memory "
                     f"({total} bytes)")
    return out


def _continuation_traffic(instr, comp, fused, free_idx, free_users) -> InstrTraffic:
    """Traffic of a continuation / done fusion of a decomposed async collective
    (``_collective_continuation``): its other work's reads and writes only. An operand is
    read (in full) when a fused instruction other than the root tuple's aliased
    pass-through elements and the collective's own instructions uses it."""
    reads: list[Access] = []
    by_name = comp.by_name
    params = fused.parameters
    root = fused.root
    passed = set()  # parameter names the root returns in place
    producers = _root_producers(fused)
    for idx, producer in producers:
        if idx in free_idx and producer.opcode == "parameter":
            passed.add(producer.name)
    users: dict[str, list[Instruction]] = {}
    for i in fused.instructions:
        for o in i.operands:
            users.setdefault(o, []).append(i)
    for k, name in enumerate(instr.operands):
        if k >= len(params):
            break
        p = params[k]
        used = False
        stack, seen = [p], set()
        while stack and not used:  # through bitcasts to the real users
            v = stack.pop()
            for u in users.get(v.name, ()):
                if u.name in seen:
                    continue
                seen.add(u.name)
                if u.opcode == "bitcast":
                    stack.append(u)
                elif u is root and root.opcode == "tuple":
                    if v.name not in passed:
                        used = True
                elif u.name not in free_users:
                    used = True
        if not used:
            continue
        oshape = by_name[name].shape
        for idx, leaf in (oshape.leaves_with_index() if oshape.is_tuple else [((), oshape)]):
            if leaf.is_array:
                reads.append(_leaf_access(leaf, k, idx))
    writes = []
    for idx, _producer in producers:
        if idx in free_idx:
            continue
        leaf = instr.shape.subshape(idx) if instr.shape.is_tuple else instr.shape
        if leaf.is_array:
            writes.append(_leaf_access(leaf, None, idx))
    note = ("continuation of an async collective (XLA:TPU): the collective's buffer is an "
            "aliased operand, written by its start fusion; only the other work moves bytes")
    return _traffic(tuple(reads), tuple(writes), (note,), (), 0)


# ---- rules for unfused instructions ------------------------------------------------------

def _default(instr, comp, module) -> InstrTraffic:
    """Every distinct operand read whole, every result leaf written: one (shared) record per
    (result shape, operand shapes, which operands repeat) of the module."""
    operands = instr.operands
    n = len(operands)
    repeats = None  # (which operands are one value: rare, but an elementwise x op x has it)
    if n == 2:
        if operands[0] == operands[1]:
            repeats = (0, 0)
    elif n > 2 and len(set(operands)) != n:
        first: dict[str, int] = {}
        repeats = tuple([first.setdefault(o, k) for k, o in enumerate(operands)])
    by_name = comp.by_name
    key = (id(instr.shape), repeats, tuple([id(by_name[o].shape) for o in operands]))
    cache = memo_of(module).default_traffic
    t = cache.get(key)
    if t is None:
        t = cache[key] = _traffic(tuple(_full_reads(instr, comp)), tuple(_full_writes(instr.shape)),
                                  (), (), 0)
    return t


_NO_TRAFFIC = InstrTraffic()  # frozen: shared by every instruction that moves nothing


def _free(instr, comp, module) -> InstrTraffic:
    return _NO_TRAFFIC


def _slice_like(instr, comp, module) -> InstrTraffic:
    """slice / dynamic-slice / gather: read the footprint (output size) of operand 0."""
    src = comp.by_name[instr.operands[0]].shape
    elems = min(instr.shape.num_elements, src.num_elements)
    # slice / dynamic-slice: the tiles the result's dimensions cover in the source's layout
    nbytes = (src.sliced_byte_size(instr.shape.dims) if instr.opcode != "gather" and instr.shape.is_array
              else _elems_to_bytes(src, elems))
    reads = [_access(nbytes, 0, (), src.memory_space, src.logical_footprint_bytes(elems))]
    reads += _full_reads(instr, comp, skip=frozenset({0}))
    note = _loop_invariant_note(instr, comp, module, "static slice") if instr.opcode == "slice" else None
    return InstrTraffic(tuple(reads), tuple(_full_writes(instr.shape)), (note,) if note else ())


def _dus(instr, comp, module) -> InstrTraffic:
    """Unfused dynamic-update-slice: in place; reads update and indices, writes the update."""
    upd = comp.by_name[instr.operands[1]].shape
    reads = _full_reads(instr, comp, skip=frozenset({0}))
    return InstrTraffic(tuple(reads), (Access(upd.byte_size, None, (), instr.shape.memory_space,
                                              upd.logical_byte_size),),
                        ("in-place dynamic-update-slice: buffer operand not read",), (),
                        instr.shape.byte_size)


def _scatter_overwrites(instr, module) -> bool:
    """A scatter whose combiner (``to_apply``) returns its update operand(s) unchanged --
    ``x.at[i].set(v)``: the touched elements of the operand are overwritten, not read. The
    combiner of n operands takes (old..., new...) and returns new (a tuple for n > 1)."""
    name = (instr.attrs.get("to_apply") or "").strip().lstrip("%")
    comb = module.computations.get(name) if name else None
    if comb is None or not comb.parameters:
        return False
    n = len(comb.parameters) // 2
    root = comb.root
    outs = [comb.by_name.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
    for i, o in enumerate(outs):   # (through bitcasts: XLA:TPU's ``ROOT bitcast(parameter(1))``)
        while o is not None and o.opcode in ("bitcast", "copy", "reshape") and o.operands:
            o = comb.by_name.get(o.operands[0])
        outs[i] = o
    return len(outs) == n and all(o is not None and o.opcode == "parameter" and o.parameter_number == n + i
                                  for i, o in enumerate(outs))


def _scatter(instr, comp, module) -> InstrTraffic:
    """scatter: in place on operand 0; reads indices+updates and the touched operand elements
    (none where the combiner overwrites them, ``_scatter_overwrites``)."""
    n_in = (len(instr.operands) - 1) // 2  # variadic: operands..., indices, updates...
    reads = _full_reads(instr, comp, skip=frozenset(range(n_in)))
    writes = []
    overwrites = _scatter_overwrites(instr, module)
    for k in range(n_in):
        src = comp.by_name[instr.operands[k]].shape
        upd = comp.by_name[instr.operands[n_in + 1 + k]].shape
        ne = min(upd.num_elements, src.num_elements)
        nb, lg = _elems_to_bytes(src, ne), src.logical_footprint_bytes(ne)
        if not overwrites:
            reads.append(Access(nb, k, (), src.memory_space, lg))
        writes.append(Access(nb, None, (k,) if n_in > 1 else (), src.memory_space, lg))
    return InstrTraffic(tuple(reads), tuple(writes), ("scatter updates its operand in place",))


def _custom_call(instr, comp, module) -> InstrTraffic:
    target = instr.custom_call_target or ""
    if target in _PALLAS_TARGETS:  # Pallas kernels (Mosaic TPU, Triton, Mosaic GPU): passes/pallas.py
        from .pallas import kernel_traffic
        return kernel_traffic(instr, comp, module)
    rec = custom_call_target(target)
    if rec is not None and not rec.moves_data:  # e.g. XLA:TPU's ConcatBitcast (hlo/opcodes.py)
        return _NO_TRAFFIC
    skip: set[tuple[int, ...]] = set()
    notes: list[str] = []
    if target.startswith(LIBRARY_PREFIXES) and instr.shape.is_tuple and instr.shape.tuple_shapes:
        last = instr.shape.tuple_shapes[-1]
        if last.element_type in ("u8", "s8") and len(last.dims) == 1:
            skip.add((len(instr.shape.tuple_shapes) - 1,))
            notes.append(f"workspace result of {last.byte_size} bytes not counted")
    if target in ("MoveToHost", "MoveToDevice"):
        ms = HOST_MEMORY_SPACE
        src = comp.by_name[instr.operands[0]].shape
        if target == "MoveToHost":
            return InstrTraffic((Access(src.byte_size, 0, (), src.memory_space),),
                                (Access(instr.shape.byte_size, None, (), ms),))
        return InstrTraffic((Access(src.byte_size, 0, (), ms),),
                            (Access(instr.shape.byte_size, None, (), instr.shape.memory_space),))
    return InstrTraffic(tuple(_full_reads(instr, comp)), tuple(_full_writes(instr.shape, skip)),
                        tuple(notes))


def _collective_start(instr, comp, module) -> InstrTraffic:
    """*-start: the pair moves the operands in and the *-done's result out.

    ``all-gather-start`` / ``collective-permute-start`` are shaped ``(operand(s), result(s),
    context...)``: the writes are indexed into the start's element 1 (as for the async
    wrapper's starts), so the roles and tile padding of each result leaf are looked up in
    the start's own shape. ``all-reduce-start`` has its result's shape."""
    done = [u for u in comp.users(instr.name) if u.opcode.endswith("-done")]
    out_shape = done[0].shape if done else instr.shape
    reads = _full_reads(instr, comp)
    writes = _full_writes(out_shape)
    shape = instr.shape
    if (instr.opcode in _OPERAND_RESULT_STARTS and shape.is_tuple and len(shape.tuple_shapes) >= 2
            and shape.tuple_shapes[1].num_leaves == out_shape.num_leaves):
        writes = [_access(a.nbytes, None, (1,) + a.index, a.memory_space, a.logical_nbytes)
                  for a in writes]
    return InstrTraffic(tuple(reads), tuple(writes))


#: native async starts shaped ``(operand(s), result(s), context...)`` (xla/hlo/ir/hlo_instructions.h)
_OPERAND_RESULT_STARTS = frozenset({"all-gather-start", "collective-permute-start"})


def _copy_start(instr, comp, module) -> InstrTraffic:
    src = comp.by_name[instr.operands[0]].shape
    dst = instr.shape.tuple_shapes[0] if instr.shape.is_tuple and instr.shape.tuple_shapes else instr.shape
    note = _loop_invariant_note(instr, comp, module, "copy")
    if note is None and src.memory_space in ON_CHIP_MEMORY_SPACES and dst.memory_space not in ON_CHIP_MEMORY_SPACES:
        note = (f"evicts a buffer from on-chip memory to HBM whole ({dst.byte_size} bytes): XLA:TPU's "
                "memory-space assignment kept it in VMEM (e.g. prefetched, updated there) and writes "
                "it back")
    return InstrTraffic((Access(src.byte_size, 0, (), src.memory_space),),
                        (Access(dst.byte_size, None, (0,), dst.memory_space),), (note,) if note else ())


def _infeed(instr, comp, module) -> InstrTraffic:
    """infeed: reads its data from the host (host_to_device; no operand: its operand is a
    token) and writes it to device memory, the (data, token) result's element 0. XLA's
    figure is the device-memory side (hlo_cost_analysis_test.cc InfeedOutfeed: 24 bytes
    written for ((f32[2,3]), token[]), 0 read)."""
    writes = _full_writes(instr.shape)
    reads = tuple(_access(a.nbytes, None, (), HOST_MEMORY_SPACE, a.logical_nbytes) for a in writes)
    return _traffic(reads, tuple(writes), ("infeed: host_to_device bytes are the written bytes",),
                    (), 0)


def _outfeed(instr, comp, module) -> InstrTraffic:
    """outfeed: reads its data operand (operand 0; operand 1 is a token) from device memory
    and writes it to the host (device_to_host). XLA's figure is the device-memory side
    (InfeedOutfeed: 24 bytes read of (f32[2,3]), 0 written)."""
    reads = _full_reads(instr, comp, skip=frozenset(range(1, len(instr.operands))))
    writes = tuple(_access(a.nbytes, None, a.index, HOST_MEMORY_SPACE, a.logical_nbytes)
                   for a in reads)
    return _traffic(tuple(reads), writes, ("outfeed: device_to_host bytes are the read bytes",),
                    (), 0)


def _is_host_transfer(instr) -> bool:
    return instr.attrs.get("is_host_transfer", "false").strip() == "true"


def _send(instr, comp, module) -> InstrTraffic:
    """send: reads its data operand (operand 0; operand 1 is a token) once; to the host
    (``is_host_transfer=true``) it also writes it to host memory (device_to_host). The
    bytes on the wire are the collectives pass's."""
    src = comp.by_name[instr.operands[0]].shape
    reads = tuple(_access(leaf.byte_size, 0, idx, leaf.memory_space)
                  for idx, leaf in src.leaves_with_index() if leaf.is_array)
    if _is_host_transfer(instr):
        return _traffic(reads, tuple(_access(a.nbytes, None, (0,) + a.index, HOST_MEMORY_SPACE)
                                     for a in reads), ("send to the host",), (), 0)
    return _traffic(reads, (), (), (), 0)


def _recv(instr, comp, module) -> InstrTraffic:
    """recv: writes the data it receives (element 0 of its (data, context, token) result);
    from the host (``is_host_transfer=true``) it reads as many bytes from host memory."""
    shape = instr.shape
    data = shape.tuple_shapes[0] if shape.is_tuple and shape.tuple_shapes else shape
    writes = tuple(_access(leaf.byte_size, None, (0,) + idx if shape.is_tuple else idx,
                           leaf.memory_space)
                   for idx, leaf in data.leaves_with_index() if leaf.is_array)
    if _is_host_transfer(instr):
        return _traffic((), writes, ("recv from the host: host_to_device bytes are the written "
                                     "bytes",), (), 0)
    return _traffic((), writes, (), (), 0)


# Row-note marker: a kernel in a while body that reads a loop-invariant buffer (the same
# bytes) in every iteration; ``reread_notes`` sums them into a program-level note.
LOOP_INVARIANT_REREAD = "re-read in every iteration"

def _while_bodies(module: Module) -> frozenset[str]:
    """Names of the computations that are the body of some ``while`` (computed once per module)."""
    memo = memo_of(module)
    bodies = memo.while_bodies
    if bodies is None:
        bodies = memo.while_bodies = frozenset(
            i.attrs["body"].strip().lstrip("%") for i in module.instructions()
            if i.opcode == "while" and "body" in i.attrs)
    return bodies


def loop_invariant_element(name: str, comp: Computation, module: Module) -> int | None:
    """The loop-state index of ``name`` when it is ``get-tuple-element(parameter(0)), index=i``
    of a while body ``comp`` whose ROOT tuple passes element i through unchanged (the same
    get-tuple-element): a loop-invariant value, the same bytes in every iteration. None
    otherwise (not a while body, not a state element, or one the body updates)."""
    if module is None or comp.name not in _while_bodies(module):
        return None
    gte = comp.by_name.get(name)
    if gte is None or gte.opcode != "get-tuple-element" or not gte.operands:
        return None
    param = comp.by_name.get(gte.operands[0])
    idx, root = gte.tuple_index, comp.root
    if (param is None or param.opcode != "parameter" or idx is None or root.opcode != "tuple"
            or idx >= len(root.operands)):
        return None
    out = comp.by_name.get(root.operands[idx])
    if out is not None and out.opcode == "get-tuple-element" and tuple(out.operands[:1]) == (param.name,) \
            and out.tuple_index == idx:
        return idx
    return None


def _loop_invariant_note(instr, comp: Computation, module: Module, what: str) -> str | None:
    """The ``LOOP_INVARIANT_REREAD`` row note of a static slice / copy of a loop-invariant
    while-state element, or None. XLA:TPU emits this for a scanned layer stack: every layer
    of a stacked ``[L, ...]`` weight is sliced into VMEM (``slice-start``, one per layer,
    joined by ``ConcatBitcast``) in each iteration and one layer is picked on chip, so the
    compiled program reads each layer L times."""
    src_name = instr.operands[0] if instr.operands else None
    idx = loop_invariant_element(src_name, comp, module) if src_name else None
    if idx is None:
        return None
    src = comp.by_name[src_name].shape
    return (f"{LOOP_INVARIANT_REREAD}: a {what} of loop-state element {idx} ({src}), which the "
            f"while body '{comp.name}' passes through unchanged: the same bytes are read in each "
            "iteration")


def reread_notes(module: Module, rows) -> list[str]:
    """Program-level notes on bytes the compiled program reads more than once although they do
    not change, from analysed rows (``passes/pipeline.py`` ``InstructionCost``):

    * loop-invariant re-reads (rows noted ``LOOP_INVARIANT_REREAD``): bytes per program run,
      how many of them weights, and the number of times each is read;
    * weight copies: kernels that write a weights-role buffer which is not a program result
      (a layout change or dtype conversion of a weight, e.g. XLA:GPU transposing a stacked
      ``[L, ...]`` weight once before a scan's loop): its consumers read the copy, so the
      weights read exceed the parameters' bytes by the copy's size.
    """
    notes: list[str] = []
    hit = [r for r in rows if r.notes and any(n.startswith(LOOP_INVARIANT_REREAD) for n in r.notes)]
    if hit:
        nbytes = sum(r.total.hbm_read_bytes for r in hit)
        wbytes = sum(r.total.weights_read_bytes for r in hit)
        per_exec = sum(r.per_execution.hbm_read_bytes for r in hit)
        times = nbytes // per_exec if per_exec else 0
        first = max(hit, key=lambda r: r.total.hbm_read_bytes)
        notes.append(
            f"{len(hit)} instruction(s) in while bodies slice or copy a loop-invariant buffer "
            f"afresh in every iteration ({nbytes} HBM bytes per program run, {wbytes} of them "
            f"weights; read {times} times each), e.g. '{first.instr.name}' in '{first.computation}': "
            "XLA:TPU streams every layer of a stacked [L, ...] operand into on-chip memory in each "
            "of the L iterations and picks one layer on chip, so each layer is read L times "
            "(the compiled program moves these bytes; unrolling the layers or a scan whose "
            "slices depend on the loop counter reads each once)")
    results: dict[str, set[str]] = {}
    copies = [r for r in rows if r.total.weights_write_bytes
              and r.instr.name not in _result_names(module, r.computation, results)]
    if copies:
        nbytes = sum(r.total.weights_write_bytes for r in copies)
        first = max(copies, key=lambda r: r.total.weights_write_bytes)
        op = first.instr.opcode
        if op.startswith("all-gather") or op.startswith("collective-permute"):
            what = "a sharded weight gathered whole (fsdp / ZeRO-3) or moved between devices"
        elif op == "gather" or "gather" in first.instr.name or op == "dynamic-slice":
            what = "rows or a window taken from a weight, e.g. an embedding lookup"
        else:
            what = ("a layout change or dtype conversion, such as XLA:GPU transposing a stacked "
                    "[L, ...] weight before a scan's loop")
        notes.append(
            f"{len(copies)} instruction(s) write a copy of weights ({nbytes} bytes per program "
            f"run), e.g. '{first.instr.name}' ({op}: {what}); their consumers read the copy, so "
            "weights read exceed the parameters' bytes by up to that much (the compiled program "
            "reads those weights twice)")
    return notes


def _result_names(module: Module, cname: str, memo: dict[str, set[str]]) -> set[str]:
    """Instructions of ``cname`` whose value is its result: the ROOT and what reaches it through
    tuple / bitcast only (an updated weight of a training step, a loop-carried state)."""
    if cname not in memo:
        comp = module.computations[cname]
        out, stack = set(), [comp.root]
        while stack:
            i = stack.pop()
            if i.name in out:
                continue
            out.add(i.name)
            if i.opcode in ("tuple", "bitcast"):
                stack.extend(comp.by_name[o] for o in i.operands if o in comp.by_name)
        memo[cname] = out
    return memo[cname]


class _AsyncView:
    """The instruction an async ``X-start`` wraps, seen by X's rule: the start's operands and
    attributes, X's opcode, and X's result (element 1 of the start's shape
    ``((operands...), result, context...)``)."""

    __slots__ = ("_start", "opcode", "shape")

    def __init__(self, start: Instruction, opcode: str, shape: Shape):
        self._start, self.opcode, self.shape = start, opcode, shape

    def __getattr__(self, name):
        return getattr(self._start, name)


def _async_start(instr, comp, module) -> InstrTraffic:
    """``slice-start``, ``dynamic-update-slice-start``, ``reduce-scatter-start`` ...: the
    wrapped op's traffic (the pair is one transfer; its ``*-done`` moves nothing). Each access
    keeps its memory space, so an HBM -> VMEM (S(1)) slice is hbm_to_onchip and a VMEM -> HBM
    update onchip_to_hbm. Writes are indexed into the start's result element (1,)."""
    shape = instr.shape
    nested = shape.is_tuple and len(shape.tuple_shapes) >= 2
    result = shape.tuple_shapes[1] if nested else shape
    wrapped = OPCODES[instr.opcode].async_of
    t = _RULE_OF[wrapped](_AsyncView(instr, wrapped, result), comp, module)
    if nested and t.writes:
        t = _traffic(t.reads, tuple(_access(a.nbytes, None, (1,) + a.index, a.memory_space)
                                    for a in t.writes), t.notes, t.unmodeled, t.inplace_buffer_bytes)
    return t


TRAFFIC_RULES = {op: _free for op in FREE_OPCODES}
TRAFFIC_RULES.update({
    "fusion": fusion_traffic,
    "slice": _slice_like, "dynamic-slice": _slice_like, "gather": _slice_like,
    "dynamic-update-slice": _dus,
    "scatter": _scatter,
    "custom-call": _custom_call,
    "copy-start": _copy_start,
    "send": _send, "recv": _recv,
    "infeed": _infeed, "outfeed": _outfeed,
})
for _op, _rec in OPCODES.items():
    if _rec.async_part == "start" and _rec.collective is not None and _op not in ("send", "recv"):
        if _rec.async_of in ("all-reduce", "all-gather", "collective-permute"):
            TRAFFIC_RULES[_op] = _collective_start  # native pairs: shape (operand(s), result)
        else:
            TRAFFIC_RULES[_op] = _async_start  # wrapped collectives read/write like the sync op
    elif _rec.async_part == "start" and _rec.async_of is not None and _op not in TRAFFIC_RULES:
        TRAFFIC_RULES[_op] = _async_start


# Every known opcode -> its rule (_default where TRAFFIC_RULES has none): one lookup.
_RULE_OF = {op: TRAFFIC_RULES.get(op, _default) for op in KNOWN_OPCODES}
NO_TRAFFIC = _NO_TRAFFIC
FREE_RULE_OPCODES = frozenset(op for op, rule in _RULE_OF.items() if rule is _free)  # -> NO_TRAFFIC
# Opcodes whose traffic records are shared by the instructions of one key (fusion_traffic,
# _default): equal accesses are one object, which callers may key on.
SHARED_RULE_OPCODES = frozenset(op for op, rule in _RULE_OF.items() if rule in (fusion_traffic, _default))


def instruction_traffic(instr: Instruction, comp: Computation, module: Module) -> InstrTraffic:
    """Bytes read and written by one kernel-level instruction per execution.

    Unknown opcodes return an empty InstrTraffic with ``unmodeled`` set, never a guess.
    """
    rule = _RULE_OF.get(instr.opcode)
    if rule is None:
        return InstrTraffic(unmodeled=(f"opcode '{instr.opcode}' has no traffic rule",))
    return rule(instr, comp, module)
