"""Collectives: who talks to whom, and how many bytes each device puts on the wire.

For every collective instruction (all-reduce, all-gather, reduce-scatter, all-to-all,
ragged-all-to-all, collective-permute, collective-broadcast, send, recv), synchronous,
as a ``*-start``/``*-done`` pair, wrapped in a generic ``async-start``/``async-done``, or
fused (a collective inside a fusion's computation is found and reported on the fusion),
``collective_info`` gives its kind, its groups and the bytes ONE device sends per
execution.

Groups (xla/hlo/ir/collective_op_group_mode.h, ``GetCollectiveOpGroupMode``): the ids in
``replica_groups`` are replica ids (no ``channel_id``: *cross_replica*), partition ids
(``channel_id`` on ops without ``use_global_device_ids``: *cross_partition*), replica ids
each spanning every partition (``channel_id`` on all-reduce / all-gather / reduce-scatter
without ``use_global_device_ids``: *cross_replica_and_partition*), or global device ids
``replica * num_partitions + partition`` (``use_global_device_ids=true``:
*flattened_id*). An empty list means every participant of that mode. ``num_partitions``
and ``replica_count`` come from the module header.

Wire bytes per device for the ring algorithm (the NCCL bus-bandwidth factors,
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md, and How To Scale
Your Model, part 3 "Sharded matrices", https://jax-ml.github.io/scaling-book/sharding/),
with ``n`` the group size and ``S`` the full buffer:

=========================  ====================  ==========================================
kind                       S                     bytes one device sends
=========================  ====================  ==========================================
all-reduce                 operand bytes         2 (n-1)/n * S  (reduce-scatter + all-gather)
all-gather                 n * operand bytes     (n-1)/n * S    (= (n-1) * its own shard)
reduce-scatter             operand bytes         (n-1)/n * S
all-to-all                 operand bytes         (n-1)/n * S    (keeps its own 1/n)
ragged-all-to-all          input bytes           (n-1)/n * S    (runtime sizes: assumes even)
collective-permute         operand bytes         S per source-target pair it is the source of
collective-broadcast       operand bytes         S              (NCCL broadcast factor 1)
send                       operand bytes         S per pair it is the source of
recv                       result bytes          0              (counted on the matching send)
=========================  ====================  ==========================================

A ``*-done`` carries nothing (its ``*-start`` carries the transfer), so a pair is counted
once. XLA:TPU's decomposed async collectives are one collective (one ``channel_id``) cloned
into a start fusion (root: the ``AsyncCollectiveStart`` custom call), continuation fusions
(the collective carried on beside other work) and a done fusion (root:
``AsyncCollectiveDone``): the chain is counted once, on its start (``_chain_owners``); the
other fusions' records have ``wire_bytes`` 0 and ``counted_on`` naming the start. Passes
never print.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from ..errors import JaxmoveInputError
from ..hlo import Computation, Instruction, Module
from ..hlo.attrs import parse_kv_block
from ..hlo.opcodes import COLLECTIVE_KINDS, OPCODES
from ..hlo.replica_groups import ReplicaGroupsError, parse_replica_groups
from ..hlo.shape import shape_text
from .memo import memo_of
from .callgraph import post_order

_KINDS = frozenset(COLLECTIVE_KINDS)
# Ops that carry ``use_global_device_ids`` (the others are cross-partition with a channel_id).
_GLOBAL_ID_KINDS = frozenset({"all-reduce", "all-gather", "reduce-scatter"})
_POINT_TO_POINT = frozenset({"collective-permute", "send", "recv"})


@dataclass(frozen=True, slots=True)
class CollectiveInfo:
    """One collective, per execution.

    Attributes:
      kind: ``all-reduce`` | ``all-gather`` | ``reduce-scatter`` | ``all-to-all`` |
        ``ragged-all-to-all`` | ``collective-permute`` | ``collective-broadcast`` |
        ``send`` | ``recv`` (``-start`` dropped).
      group_size: devices per group (2 for point-to-point ops: one source, one target).
      num_groups: independent groups over all devices of the program (pairs for
        point-to-point ops).
      groups: the groups as printed, expanded (replica, partition or global ids per
        ``mode``); source-target pairs for point-to-point ops.
      device_groups: the same groups in global device ids ``replica * num_partitions +
        partition``, one per independent group.
      mode: ``cross_replica`` | ``cross_partition`` | ``cross_replica_and_partition`` |
        ``flattened_id``.
      buffer_bytes: the full buffer ``S`` of the wire formula (module docstring), bytes.
      wire_bytes: bytes one device sends per execution (ring algorithm), bytes.
      is_async: a ``*-start`` or a collective wrapped by ``async-start``.
      instruction: the collective's own name (differs from the row for fused collectives).
      notes: how the figures were derived where it is not obvious.
      counted_on: for a continuation or done fusion of a decomposed collective (module
        docstring), the fusion whose record carries the transfer; its own ``wire_bytes`` are
        0 and it takes no time. None otherwise.
    """

    kind: str
    group_size: int
    num_groups: int
    groups: tuple[tuple[int, ...], ...]
    device_groups: tuple[tuple[int, ...], ...]
    mode: str
    buffer_bytes: int
    wire_bytes: int
    is_async: bool
    instruction: str
    notes: tuple[str, ...] = ()
    counted_on: str | None = None

    def to_json(self) -> dict:
        """The per-instruction ``collective`` object of the JSON report."""
        return {"kind": self.kind, "group_size": self.group_size, "num_groups": self.num_groups,
                "wire_bytes": self.wire_bytes, "buffer_bytes": self.buffer_bytes,
                "mode": self.mode, "is_async": self.is_async, "counted_on": self.counted_on}


class CollectiveError(JaxmoveInputError):
    """A collective whose groups cannot be read, or whose result shapes do not follow from its
    operands and groups (names the file, the instruction and its line)."""


# every collective opcode (``kind``, ``kind-start``, async ``kind-start``) -> its kind: the
# opcode table's ``collective`` column (a ``*-done`` carries nothing)
_KIND_OF = {op: rec.collective for op, rec in OPCODES.items()
            if rec.collective is not None and rec.async_part != "done"}


def collective_kind(opcode: str) -> str | None:
    """``all-reduce-start`` -> ``all-reduce``; None for non-collectives and ``*-done``."""
    return _KIND_OF.get(opcode)


# ---- per-module caches (passes/memo.py) ------------------------------------------------

def _async_wrapped(module: Module) -> frozenset[str]:
    """Computations run by a generic ``async-start`` (their collectives are asynchronous)."""
    memo = memo_of(module)
    hit = memo.async_wrapped
    if hit is None:
        hit = memo.async_wrapped = frozenset(c for i in module.instructions() if i.opcode == "async-start"
                                             for c in i.called_computations)
    return hit


_KIND_OR_FUSION = frozenset(_KIND_OF) | {"fusion"}
_opcode = attrgetter("opcode")


def _fused_collectives(module: Module, cname: str) -> tuple[tuple[Instruction, Computation], ...]:
    """Collectives inside a fused computation and its nested fusions."""
    cache = memo_of(module).fused_collectives
    hit = cache.get(cname)
    if hit is not None:
        return hit
    kinds = _KIND_OF
    cls = module.structural_classes[cname]  # a copy of a computation without any (hlo/structure.py)?
    if cls != cname and cache.get(cls) == ():
        cache[cname] = ()
        return ()
    comp = module.computations[cname]
    if _KIND_OR_FUSION.isdisjoint(map(_opcode, comp.instructions)):
        cache[cname] = cache[cls] = ()  # the common case: no collective and no nested fusion to walk
        return ()
    # nested fused computations first, innermost first (iterative: any nesting depth)
    for name in post_order(module, [cname], lambda i: i.opcode == "fusion"):
        if name in cache:
            continue
        comp = module.computations[name]
        out: list[tuple[Instruction, Computation]] = []
        for i in comp.instructions:
            if i.opcode in kinds:
                out.append((i, comp))
            elif i.opcode == "fusion":
                for c in i.called_computations:
                    out.extend(cache.get(c, ()))
        cache[name] = tuple(out)
    return cache[cname]


_ASYNC_START_TARGET = "AsyncCollectiveStart"  # XLA:TPU's start of a decomposed collective


def _starts_a_chain(module: Module, fusion: Instruction) -> bool:
    """The fused root is (a tuple holding) an ``AsyncCollectiveStart`` custom call."""
    for cname in fusion.called_computations:
        fused = module.computations.get(cname)
        if fused is None:
            continue
        root = fused.root
        leaves = [fused.by_name[o] for o in root.operands] if root.opcode == "tuple" else [root]
        if any(v.opcode == "custom-call" and v.custom_call_target == _ASYNC_START_TARGET
               for v in leaves):
            return True
    return False


def _chain_owners(module: Module, comp: Computation) -> dict[str, str]:
    """``channel_id`` -> the fusion of ``comp`` that carries the transfer, for every channel
    id that several fusions of ``comp`` carry: XLA:TPU's decomposed async collective clones
    one collective (one channel id; XLA gives each collective of a module its own) into its
    start, continuation and done fusions. The owner is the fusion whose root is the
    ``AsyncCollectiveStart`` custom call, else the first in program order."""
    cache = memo_of(module).collective_chains
    hit = cache.get(comp.name)
    if hit is not None:
        return hit
    by_channel: dict[str, list[Instruction]] = {}
    for i in comp.instructions:
        if i.opcode != "fusion":
            continue
        chans = {c.attrs["channel_id"].strip() for cname in i.called_computations
                 for c, _ in _fused_collectives(module, cname) if "channel_id" in c.attrs}
        for ch in sorted(chans):
            by_channel.setdefault(ch, []).append(i)
    owners: dict[str, str] = {}
    for ch, fusions in by_channel.items():
        if len(fusions) > 1:
            starts = [f for f in fusions if _starts_a_chain(module, f)]
            owners[ch] = (starts or fusions)[0].name
    cache[comp.name] = owners
    return owners


def _continuation(info: CollectiveInfo, owner: str) -> CollectiveInfo:
    """The record of a continuation / done part of a decomposed collective: no wire bytes."""
    return CollectiveInfo(info.kind, info.group_size, info.num_groups, info.groups,
                          info.device_groups, info.mode, info.buffer_bytes, 0, info.is_async,
                          info.instruction,
                          info.notes + (f"part of the decomposed async collective started by "
                                        f"'{owner}' (same channel_id): its transfer is counted "
                                        "there",), owner)


# ---- groups -------------------------------------------------------------------------

def _mode(kind: str, instr: Instruction) -> str:
    """Collective group mode (xla/service/collective_ops_utils.cc GetCollectiveOpGroupMode)."""
    if "channel_id" not in instr.attrs:
        return "cross_replica"
    if kind in _GLOBAL_ID_KINDS:
        ugdi = instr.attrs.get("use_global_device_ids", "false").strip() == "true"
        return "flattened_id" if ugdi else "cross_replica_and_partition"
    return "cross_partition"


def _error(instr: Instruction, module: Module, e: Exception) -> CollectiveError:
    return CollectiveError(f"{module.filename}:{instr.line}:{instr.column}: collective "
                           f"'{instr.name}': {e}")


def _counts(module: Module, ids: list[int], mode: str) -> tuple[int, int, list[str]]:
    """(replicas, partitions) of the program, widened when groups name ids past the header."""
    r, p = module.replica_count, module.num_partitions
    notes: list[str] = []
    top = max(ids) + 1 if ids else 0
    if mode in ("cross_replica", "cross_replica_and_partition") and top > r:
        notes.append(f"replica_count={r} in the header but groups name replica {top - 1}: "
                     f"assumed {top} replicas")
        r = top
    elif mode == "cross_partition" and top > p:
        notes.append(f"num_partitions={p} in the header but groups name partition {top - 1}: "
                     f"assumed {top} partitions")
        p = top
    elif mode == "flattened_id" and top > r * p:
        notes.append(f"the header has {r * p} devices but groups name device {top - 1}: "
                     f"assumed {top} partitions")
        r, p = 1, top
    return r, p, notes


def _device_groups(groups: list[list[int]], mode: str, r: int, p: int) -> list[tuple[int, ...]]:
    """Groups in global device ids (replica * num_partitions + partition)."""
    if mode == "cross_replica":
        groups = groups or [list(range(r))]
        return [tuple(rep * p + q for rep in g) for q in range(p) for g in groups]
    if mode == "cross_partition":
        groups = groups or [list(range(p))]
        return [tuple(rep * p + q for q in g) for rep in range(r) for g in groups]
    if mode == "cross_replica_and_partition":
        groups = groups or [list(range(r))]
        return [tuple(rep * p + q for rep in g for q in range(p)) for g in groups]
    groups = groups or [list(range(r * p))]
    return [tuple(g) for g in groups]


def _pairs_text(kind: str, instr: Instruction) -> str | None:
    if kind == "collective-permute":
        return instr.attrs.get("source_target_pairs")
    fa = instr.attrs.get("frontend_attributes")
    if fa is None:
        return None
    return parse_kv_block(fa).get("_xla_send_recv_source_target_pairs")


def _reduction_widening(instr: Instruction, comp: Computation, module: Module) -> tuple[int, int] | None:
    """(reduction bits, operand bits) when an all-reduce / reduce-scatter's operands are all
    of one element type narrower than its ``to_apply`` computation's parameters and its
    result is of the reduction's type (XLA:TPU: ``f32[...] all-reduce(bf16[...])`` with an
    f32 ``maximum``): the partial results each device sends are the reduction's, so the wire
    carries that width. None otherwise (the operand's width is the data's)."""
    called = instr.attrs.get("to_apply")
    red = module.computations.get(called.strip().lstrip("%")) if called else None
    if red is None or not red.parameters:
        return None
    rbits = red.parameters[0].shape.element_bits if red.parameters[0].shape.is_array else 0
    obits = set()
    for o in instr.operands:
        src = comp.by_name.get(o)
        if src is None or not src.shape.is_array:
            return None
        obits.add(src.shape.element_bits)
    leaves = instr.shape.tuple_shapes if instr.shape.is_tuple else (instr.shape,)
    if len(obits) != 1 or not rbits or any(not x.is_array or x.element_bits != rbits for x in leaves):
        return None
    b = obits.pop()
    return (rbits, b) if b and rbits > b else None


def _operand_bytes(instr: Instruction, comp: Computation, operands: range | list[int] | None = None) -> int:
    idx = range(len(instr.operands)) if operands is None else operands
    # the data's bytes: tile padding of TPU layouts is not counted on the wire (shape.py)
    return sum(comp.by_name[instr.operands[k]].shape.logical_byte_size for k in idx
               if k < len(instr.operands) and instr.operands[k] in comp.by_name)


# ---- the pass -----------------------------------------------------------------------

def _promoted_operands(instr: Instruction, comp: Computation) -> list[str]:
    """Operands that are a ``convert`` of a narrower float to f32.

    XLA:CPU's all-reduce promotion and bf16 float-normalization passes run bf16/f16
    collectives in f32 (xla/service/cpu/cpu_compiler.cc); GPU and TPU run them in bf16.
    """
    out = []
    for o in instr.operands:
        src = comp.by_name.get(o)
        if src is None or src.opcode != "convert" or not src.shape.is_array:
            continue
        inner = comp.by_name.get(src.operands[0]) if src.operands else None
        if (inner is not None and inner.shape.is_array and src.shape.element_type == "f32"
                and inner.shape.element_type in ("bf16", "f16")):
            out.append(f"{o} ({inner.shape.element_type}->f32)")
    return out


def _shape_mismatch(instr: Instruction, comp: Computation, n: int) -> str | None:
    """Why the result shapes of an all-gather / all-reduce / reduce-scatter (or its ``-start``)
    over groups of ``n`` devices are not those of its operands, else None. XLA's verifier
    checks the same (xla/service/hlo_verifier.cc, HandleAllGather / HandleAllReduce /
    HandleReduceScatter, with ShapeInference::InferAllGatherShape and its siblings): an
    all-gather's result is its operand with dimension ``d`` times ``n``; an all-reduce's, its
    operand; a reduce-scatter's, its operand with dimension ``d`` divided by ``n`` (which must
    divide it). Dimensions only: XLA:TPU's all-reduce may change the element type (an f32
    operand, a bf16 result, moe-tiny under fsdp_tp on tpu-v5e). Forms it cannot pair one
    operand to one result leaf are not checked."""
    op = instr.opcode
    shape = instr.shape
    if op == "all-gather-start":  # ((operands...), (results...)) or (operand, result)
        if not shape.is_tuple or len(shape.tuple_shapes) != 2:
            return None
        shape = shape.tuple_shapes[1]
    elif op not in ("all-gather", "all-reduce", "all-reduce-start", "reduce-scatter"):
        return None
    results = list(shape.tuple_shapes) if shape.is_tuple else [shape]
    by_name = comp.by_name
    operands = [by_name.get(o) for o in instr.operands]
    if len(results) != len(operands) or any(o is None for o in operands):
        return None
    dim = None
    if op not in ("all-reduce", "all-reduce-start"):
        dims = instr.int_list("dimensions")
        if not dims or len(dims) != 1:
            return None
        dim = dims[0]
    for o, res in zip(operands, results):
        osh = o.shape
        if not osh.is_array or not res.is_array or osh.has_unbounded_dim or res.has_unbounded_dim:
            continue
        odims = list(osh.dims)
        if dim is not None and not 0 <= dim < len(odims):
            return f"dimensions={{{dim}}} is not a dimension of operand '{o.name}' {shape_text(osh)}"
        if dim is None:  # (an all-reduce)
            want = odims
        elif op == "reduce-scatter":
            if odims[dim] % n:
                return (f"operand '{o.name}' {shape_text(osh)}: dimension {dim} ({odims[dim]}) is "
                        f"not divisible by the {n} devices of its replica groups")
            want = odims[:dim] + [odims[dim] // n] + odims[dim + 1:]
        else:
            want = odims[:dim] + [odims[dim] * n] + odims[dim + 1:]
        if list(res.dims) != want:  # (the element type may change: XLA:TPU all-reduces f32 into bf16)
            expect = f"{res.element_type}[{','.join(map(str, want))}]"
            if dim is None:
                how = "an all-reduce's result has its operand's shape"
            else:
                how = (f"{'scattered' if op == 'reduce-scatter' else 'gathered'} over the {n} devices "
                       f"of its replica groups along dimension {dim}")
            return (f"result {shape_text(res)} does not match operand '{o.name}' {shape_text(osh)} ({how}): "
                    f"expected {expect}")
    return None


def _info(instr: Instruction, comp: Computation, module: Module, kind: str) -> CollectiveInfo:
    mode = _mode(kind, instr)
    notes: list[str] = []
    promoted = _promoted_operands(instr, comp)
    if promoted:
        notes.append("runs in f32 on operands converted from a narrower float "
                     f"({', '.join(promoted)}), as XLA:CPU promotes bf16/f16 collectives; "
                     "a GPU/TPU program would move half these bytes")
    is_async = instr.opcode.endswith("-start") or comp.name in _async_wrapped(module)
    if kind in _POINT_TO_POINT:
        text = _pairs_text(kind, instr)
        try:
            pairs = parse_replica_groups(text) if text else []
        except ReplicaGroupsError as e:
            raise _error(instr, module, e) from None
        if any(len(pr) != 2 for pr in pairs):
            raise _error(instr, module, ValueError(f"source_target_pairs {text}: expected pairs"))
        if not pairs:
            notes.append("no source_target_pairs: assumed one pair")
            pairs = [[0, 1]]
        mode = "cross_partition" if "channel_id" in instr.attrs else "cross_replica"
        r, p, more = _counts(module, [d for pr in pairs for d in pr], mode)
        notes += more
        if mode == "cross_partition":
            dev = [(rep * p + s, rep * p + t) for rep in range(r) for s, t in pairs]
        else:
            dev = [(s * p + q, t * p + q) for q in range(p) for s, t in pairs]
        if kind == "recv":
            shape = instr.shape.tuple_shapes[0] if instr.shape.is_tuple else instr.shape
            buffer = shape.logical_byte_size
            wire = 0
            notes.append("received bytes are counted on the matching send")
        else:
            # in place (slice_sizes=, XLA's parser requires it of that form; its start
            # indices may be tuples): operand 0 is the data; combined (XLA:GPU's
            # CollectivePermuteCombiner, N operands of any type, s32 data too): every operand
            inplace = kind == "collective-permute" and ("slice_sizes" in instr.attrs or (
                len(instr.operands) == 4 and instr.operands[2] in comp.by_name
                and comp.by_name[instr.operands[2]].shape.is_tuple))
            buffer = _operand_bytes(instr, comp, [0] if inplace or kind != "collective-permute" else None)
            sends: dict[int, int] = {}
            for s, t in pairs:
                if s != t:
                    sends[s] = sends.get(s, 0) + 1
            wire = buffer * max(sends.values(), default=0)
            if inplace:
                notes.append("in-place collective-permute (slice_sizes): the whole operand is "
                              "counted per pair, an upper bound")
        return CollectiveInfo(kind, 2, len(dev), tuple(tuple(pr) for pr in pairs), tuple(dev), mode,
                              buffer, wire, is_async, instr.name, tuple(notes))

    text = instr.attrs.get("replica_groups", "{}")
    try:
        groups = parse_replica_groups(text)
    except ReplicaGroupsError as e:
        raise _error(instr, module, e) from None
    groups = [g for g in groups if g] if any(groups) else []
    r, p, more = _counts(module, [d for g in groups for d in g], mode)
    notes += more
    dev = _device_groups(groups, mode, r, p)
    sizes = {len(g) for g in dev}
    n = max(sizes)
    if len(sizes) > 1:
        notes.append(f"groups of unequal sizes {sorted(sizes)}: the largest is used")
    else:
        bad = _shape_mismatch(instr, comp, n)
        if bad:
            raise _error(instr, module, ValueError(bad))
    if kind == "all-gather":
        shard = _operand_bytes(instr, comp)
        buffer = n * shard
        wire = (n - 1) * shard
    elif kind == "ragged-all-to-all":
        buffer = _operand_bytes(instr, comp, [0])
        wire = (n - 1) * buffer // n
        notes.append("ragged-all-to-all sends runtime-sized pieces: assumes its input is spread "
                     "evenly over the group")
    else:
        buffer = _operand_bytes(instr, comp)
        if kind in ("all-reduce", "reduce-scatter"):
            wider = _reduction_widening(instr, comp, module)
            if wider is not None:
                num, den = wider
                buffer = buffer * num // den
                notes.append("operands narrower than the reduction computation (XLA:TPU's bf16 "
                             "all-reduce into an f32 result): partial results travel at the "
                             "reduction's width")
        if kind == "all-reduce":
            wire = 2 * (n - 1) * buffer // n
        elif kind == "collective-broadcast":
            wire = buffer if n > 1 else 0
        else:  # reduce-scatter, all-to-all
            wire = (n - 1) * buffer // n
    return CollectiveInfo(kind, n, len(dev), tuple(tuple(g) for g in groups), tuple(dev), mode,
                          buffer, wire, is_async, instr.name, tuple(notes))


def collective_info(instr: Instruction, comp: Computation, module: Module) -> CollectiveInfo | None:
    """The collective an instruction runs, per execution, or None.

    A collective or ``*-start`` returns its own info; a fusion returns the collective(s)
    inside its computation (several are summed into one record, kind of the largest);
    ``*-done``, ``async-start``/``async-done`` wrappers (the wrapped computation's own
    instruction carries the transfer) and everything else return None.

    Raises:
      CollectiveError: unreadable ``replica_groups`` / ``source_target_pairs`` (names the
        file, line and instruction).
    """
    kind = _KIND_OF.get(instr.opcode)
    if kind is not None:
        return _info(instr, comp, module, kind)
    if instr.opcode != "fusion":
        return None
    called = instr.called_computations
    if not called:
        return None
    if len(called) == 1:  # the usual fusion: one fused computation, most without collectives
        inner = (_fused_collectives(module, called[0]),)
        if not inner[0]:
            return None
    else:
        inner = tuple(_fused_collectives(module, cname) for cname in called)
        if not any(inner):
            return None
    owners = _chain_owners(module, comp)
    found = []
    for fused in inner:
        for i, c in fused:
            info = _info(i, c, module, collective_kind(i.opcode))
            if info.kind == "all-reduce" and info.group_size > 1 and _scatters(i, c, info.group_size):
                info = _as_reduce_scatter(info)
            owner = owners.get(i.attrs.get("channel_id", "").strip())
            if owner is not None and owner != instr.name:
                info = _continuation(info, owner)
            found.append(info)
    if not found:
        return None
    if len(found) == 1:
        info = found[0]
        return CollectiveInfo(info.kind, info.group_size, info.num_groups, info.groups,
                              info.device_groups, info.mode, info.buffer_bytes, info.wire_bytes,
                              info.is_async, info.instruction,
                              info.notes + (f"fused: '{info.instruction}' inside this fusion",),
                              info.counted_on)
    big = max(found, key=lambda i: i.wire_bytes)
    return CollectiveInfo(big.kind, big.group_size, big.num_groups, big.groups, big.device_groups,
                          big.mode, sum(i.buffer_bytes for i in found),
                          sum(i.wire_bytes for i in found), big.is_async, big.instruction,
                          big.notes + (f"{len(found)} fused collectives summed: "
                                       + ", ".join(f"{i.instruction} ({i.kind})" for i in found),),
                          big.counted_on if all(i.counted_on for i in found) else None)


_DEVICE_ID_OPS = frozenset({"partition-id", "replica-id"})


def _scatters(ar: Instruction, comp: Computation, n: int) -> bool:
    """The fused all-reduce ``ar`` is a reduce-scatter: every use of every leaf of its result
    (through ``get-tuple-element``) is a ``dynamic-slice`` that keeps 1/``n`` of it along one
    dimension, at an offset computed from ``partition-id`` / ``replica-id``, so each device
    keeps only its own shard of the sum. XLA:TPU fuses a reduce-scatter so
    (``AllReduceScatterFusion`` / ``SingleInputAllReduceScatterFusion``: an all-reduce, then
    the dynamic-slice at ``partition-id x shard``), and runs it as a reduce-scatter."""
    by_name = comp.by_name
    leaves = []
    for u in comp.users(ar.name):
        if u.opcode == "get-tuple-element":
            leaves.append(u)
        elif u.opcode == "dynamic-slice" and not ar.shape.is_tuple:
            leaves = [ar]
            break
        else:
            return False
    if not leaves or (ar.shape.is_tuple and len(leaves) != len(ar.shape.tuple_shapes)):
        return False
    for leaf in leaves:
        users = comp.users(leaf.name) if leaf is not ar else comp.users(ar.name)
        if not users:
            return False
        for ds in users:
            if ds.opcode != "dynamic-slice" or not ds.operands or ds.operands[0] != leaf.name:
                return False
            full, part = leaf.shape.dims, ds.shape.dims
            if len(full) != len(part):
                return False
            cut = [d for d, (a, b) in enumerate(zip(full, part)) if a != b]
            if len(cut) != 1 or part[cut[0]] * n != full[cut[0]]:
                return False
            if len(ds.operands) <= 1 + cut[0] or not _from_device_id(ds.operands[1 + cut[0]], by_name):
                return False
    return True


def _from_device_id(name: str, by_name: dict, depth: int = 8) -> bool:
    """The scalar ``name`` is computed from ``partition-id`` / ``replica-id`` (within ``depth``
    operand steps)."""
    seen, todo = set(), [(name, 0)]
    while todo:
        nm, d = todo.pop()
        i = by_name.get(nm)
        if i is None or nm in seen:
            continue
        seen.add(nm)
        if i.opcode in _DEVICE_ID_OPS:
            return True
        if d < depth:
            todo.extend((o, d + 1) for o in i.operands)
    return False


def _as_reduce_scatter(info: CollectiveInfo) -> CollectiveInfo:
    """``info`` of an all-reduce that ``_scatters`` as the reduce-scatter it runs: the same
    buffer, (n - 1) / n of it on the wire (module docstring's reduce-scatter)."""
    n = info.group_size
    return CollectiveInfo("reduce-scatter", n, info.num_groups, info.groups, info.device_groups,
                          info.mode, info.buffer_bytes, (n - 1) * info.buffer_bytes // n,
                          info.is_async, info.instruction,
                          info.notes + (f"'{info.instruction}' is an all-reduce whose every use is a 1/{n} "
                                        "dynamic-slice at the device's own offset (partition-id / "
                                        "replica-id): a reduce-scatter, as XLA:TPU's "
                                        "AllReduceScatterFusion runs it",),
                          info.counted_on)


# ---- time on a topology ---------------------------------------------------------------

def ring_steps(info: CollectiveInfo) -> int:
    """Latency steps of the ring algorithm: all-reduce 2(n-1) (reduce-scatter then
    all-gather), all-gather / reduce-scatter / all-to-all / broadcast (n-1), point-to-point 1,
    recv 0 (NCCL's ring; Thakur et al., "Optimization of Collective Communication Operations
    in MPICH", IJHPCA 2005); 0 for a continuation / done part of a decomposed collective
    (``counted_on``: its start takes the steps)."""
    n = info.group_size
    if info.kind == "recv" or n <= 1 or info.counted_on is not None:
        return 0
    if info.kind in ("collective-permute", "send"):
        return 1 if info.wire_bytes else 0
    if info.kind == "all-reduce":
        return 2 * (n - 1)
    return n - 1


def node_of(device: int, devices_per_node: int, device_to_node=None) -> int:
    """The node a global device id sits in: ``device // devices_per_node`` (ids fill nodes
    in order), unless ``device_to_node`` (a sequence or a callable) says otherwise."""
    if device_to_node is None:
        return device // max(1, devices_per_node)
    return device_to_node(device) if callable(device_to_node) else device_to_node[device]


def spans_nodes(info: CollectiveInfo, devices_per_node: int, device_to_node=None) -> bool:
    """True when some group of the collective holds devices of more than one node."""
    return any(len({node_of(d, devices_per_node, device_to_node) for d in g}) > 1
               for g in info.device_groups)


#: TPU generations whose slices get wraparound links from optical circuit switches: only slices
#: made of whole 4x4x4 cubes (every dimension a multiple of 4); a 2x2x4 has none. The others
#: (v5e, v6e: 16x16 pods without OCS) have a wraparound on a dimension only when it is a full
#: 16. How To Scale Your Model, part 2 ("TPU Networking"; its pop quiz on an AllGather over
#: Y = 4 of a v5e {X: 8, Y: 4} mesh measures 680 us against 560 us without wraparound).
_OCS_FAMILIES = frozenset({"v4", "v5p"})
_FULL_AXIS = 16


def has_wraparound(topology: tuple[int, ...], axis: int, family: str | None) -> bool:
    """Whether dimension ``axis`` of a TPU slice of chip grid ``topology`` is a ring (has its
    wraparound link) on generation ``family`` (``v4``, ``v5p``, ``v5e``, ``v6e``;
    ``_OCS_FAMILIES``, ``_FULL_AXIS``)."""
    fam = (family or "").lower()
    if fam in _OCS_FAMILIES:
        return all(d % 4 == 0 for d in topology)
    return topology[axis] == _FULL_AXIS


def _chip_coords(chip: int, topology: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for d in topology:  # the first dimension varies fastest (libtpu's device ids: id = x + X*y ...)
        out.append(chip % d)
        chip //= d
    return tuple(out)


def ici_links(info: CollectiveInfo, spec) -> tuple[int, str] | None:
    """(ICI links each device drives for the collective, how) from the slice topology
    (``spec.ici_topology``): per torus axis its groups span, 2 links (a bidirectional ring)
    when the axis has its wraparound and the group covers it (``has_wraparound``), else 1 (a
    line: data from one end must cross every hop, so only one direction's bandwidth
    counts); the axes add (an AllGather over several axes gets each one's links). The
    slowest group decides. Devices map to chips as libtpu numbers them (first dimension
    fastest; two TensorCore devices per chip on v4), and the groups' ids are taken to be
    those device ids (a mesh made of the devices in id order). None without a topology or
    for groups with a device outside it; ``(0, how)`` when every group lies on one chip (no
    ICI link: its time is unmodeled, ``link_bandwidth_bytes_per_s``).
    """
    topo = tuple(getattr(spec, "ici_topology", ()) or ())
    if not topo or not info.device_groups:
        return None
    target = getattr(spec, "target", None) or {}
    family = str(target.get("tpu_family", "")).lower() or None
    per_chip = 2 if family == "v4" else 1
    chips_total = 1
    for d in topo:
        chips_total *= d
    best: tuple[int, str] | None = None
    on_one_chip = False
    for group in info.device_groups:
        chips = {d // per_chip for d in group}
        if any(c < 0 or c >= chips_total for c in chips):
            return None
        coords = [_chip_coords(c, topo) for c in chips]
        links, parts = 0, []
        for a, size in enumerate(topo):
            k = len({c[a] for c in coords})
            if k <= 1:
                continue
            wrap = k == size and has_wraparound(topo, a, family)
            links += 2 if wrap else 1
            parts.append(f"axis {a} ({k} of {size} chips, {'ring' if wrap else 'no wraparound'})")
        if not links:
            on_one_chip = True  # every device on one chip: no ICI link used
            continue
        if best is None or links < best[0]:
            best = (links, ", ".join(parts))
    if best is None and on_one_chip:
        return 0, "every group on one chip (a v4 chip's TensorCores), no ICI link used"
    return best


def link_bandwidth_bytes_per_s(info: CollectiveInfo, spec, device_to_node=None) -> float | None:
    """Per-device, per-direction bandwidth of the slowest link the collective's groups span.

    GPUs/CPUs: ``intra_node_bytes_per_s`` when every group stays inside one node (NVLink),
    else ``inter_node_bytes_per_s`` (InfiniBand / DCN). TPUs with ICI figures: with the
    slice topology (``spec.ici_topology``, set from the compile target) the links each device
    uses (``ici_links``: 2 per torus axis with its wraparound, 1 per axis without) times
    ``ici_bytes_per_s_per_link``; without one, a group is taken to be one torus axis with its
    wraparound, a bidirectional ring using 2 links (How To Scale Your Model, part 3: an
    AllGather over one axis costs V / W_ici with W_ici the bidirectional bandwidth). None
    when the spec lacks the number needed.
    """
    if spec.kind == "tpu" and spec.ici_bytes_per_s_per_link:
        got = ici_links(info, spec)
        if got is not None:
            if not got[0]:
                from ..errors import Unmodeled
                raise Unmodeled(f"{got[1]}; the transfer between a chip's TensorCores is not modelled")
            return got[0] * spec.ici_bytes_per_s_per_link
        return 2 * spec.ici_bytes_per_s_per_link
    if spans_nodes(info, spec.devices_per_node, device_to_node):
        return spec.inter_node_bytes_per_s
    return spec.intra_node_bytes_per_s


def collective_time_s(info: CollectiveInfo, spec, device_to_node=None) -> float | None:
    """Time of one execution: ``link_latency_s * ring_steps + wire_bytes / bandwidth`` of
    the slowest link the groups span (``link_bandwidth_bytes_per_s``), in seconds.

    Args:
      info: from ``collective_info``.
      spec: a ``jaxmove.hardware.HardwareSpec``.
      device_to_node: optional map of global device id -> node (default: in order,
        ``devices_per_node`` ids per node).
    Returns:
      Seconds, 0.0 for a collective that sends nothing, or None when the spec lacks the
      bandwidth or ``link_latency_s`` the estimate needs.
    Raises:
      jaxmove.errors.Unmodeled: on a TPU slice, every group on one chip (TPU v4's two
        TensorCore devices): no ICI link is used, and the on-chip transfer is not modelled.
    """
    steps = ring_steps(info)
    if info.wire_bytes == 0 and steps == 0:
        return 0.0
    bw = link_bandwidth_bytes_per_s(info, spec, device_to_node)
    if not bw or spec.link_latency_s is None:
        return None
    return spec.link_latency_s * steps + info.wire_bytes / bw


__all__ = ["COLLECTIVE_KINDS", "CollectiveError", "CollectiveInfo", "collective_info",
           "collective_kind", "collective_time_s", "has_wraparound", "ici_links",
           "link_bandwidth_bytes_per_s", "node_of",
           "ring_steps", "spans_nodes"]
