"""Serialized ``HloProto`` / ``HloModuleProto`` -> HLO text, printed by jaxlib.

Captures carry the optimized program as a binary proto (XProf's ``/host:metadata`` plane, the
``*.hlo.pb`` dumps of nsys-jax). jaxlib reads an ``HloModuleProto`` and prints it as HLO text
(``xla_client.XlaComputation(bytes).as_hlo_text()``), which jaxmove's own parser then reads.

Instruction ids: XLA since 2025 numbers an instruction ``(computation id << 32) | local id``
(``CalculateLocalId`` in ``xla/hlo/ir/hlo_instruction.cc``); older protos (e.g. the 2024 nsys-jax
dump) number instructions module-wide, and jaxlib 0.10 then runs out of memory reading them
(>4.5 GB for a 6 MB proto). So before printing, every instruction id is renumbered to the new form
(the operand, control-predecessor, root and schedule references with it); the rest of the proto
passes through untouched (protobuf keeps the fields this schema does not declare).

The schema below declares only the id-carrying fields, with the numbers of ``xla/service/hlo.proto``:
HloProto.hlo_module = 1; HloModuleProto.computations = 3, .schedule = 7;
HloComputationProto.name = 1, .instructions = 2, .id = 5, .root_id = 6;
HloInstructionProto.name = 1, .opcode = 2, .id = 35, .operand_ids = 36,
.control_predecessor_ids = 37, .called_computation_ids = 38; HloScheduleProto.sequences = 1
(map<int64, InstructionSequence>), InstructionSequence.instruction_ids = 1.
"""

from __future__ import annotations

import functools

from .xplane import CaptureFormatError

__all__ = ["async_wrapped_names", "hlo_text_from_proto", "normalize_instruction_ids"]


@functools.cache
def _messages():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    fdp = descriptor_pb2.FileDescriptorProto(name="jaxmove_hlo_ids.proto", package="jaxmove.hlo_ids",
                                             syntax="proto3")
    pkg = ".jaxmove.hlo_ids."

    def msg(name, fields, parent=None):
        m = (parent.nested_type.add(name=name) if parent is not None
             else fdp.message_type.add(name=name))
        for fname, num, ftype, label, *tn in fields:
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if tn:
                f.type_name = tn[0]
        return m

    msg("HloProto", [("hlo_module", 1, F.TYPE_MESSAGE, OPT, pkg + "HloModuleProto")])
    msg("HloModuleProto", [("computations", 3, F.TYPE_MESSAGE, REP, pkg + "HloComputationProto"),
                           ("schedule", 7, F.TYPE_MESSAGE, OPT, pkg + "HloScheduleProto")])
    msg("HloComputationProto", [("name", 1, F.TYPE_STRING, OPT),
                                ("instructions", 2, F.TYPE_MESSAGE, REP, pkg + "HloInstructionProto"),
                                ("id", 5, F.TYPE_INT64, OPT), ("root_id", 6, F.TYPE_INT64, OPT)])
    msg("HloInstructionProto", [("name", 1, F.TYPE_STRING, OPT), ("opcode", 2, F.TYPE_STRING, OPT),
                                ("id", 35, F.TYPE_INT64, OPT),
                                ("operand_ids", 36, F.TYPE_INT64, REP),
                                ("control_predecessor_ids", 37, F.TYPE_INT64, REP),
                                ("called_computation_ids", 38, F.TYPE_INT64, REP)])
    sched = msg("HloScheduleProto", [("sequences", 1, F.TYPE_MESSAGE, REP,
                                      pkg + "HloScheduleProto.SequencesEntry")])
    msg("InstructionSequence", [("instruction_ids", 1, F.TYPE_INT64, REP)], parent=sched)
    entry = msg("SequencesEntry", [("key", 1, F.TYPE_INT64, OPT),
                                   ("value", 2, F.TYPE_MESSAGE, OPT,
                                    pkg + "HloScheduleProto.InstructionSequence")], parent=sched)
    entry.options.map_entry = True
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    get = lambda n: message_factory.GetMessageClass(pool.FindMessageTypeByName(pkg[1:] + n))  # noqa: E731
    return get("HloProto"), get("HloModuleProto")


def normalize_instruction_ids(module_bytes: bytes) -> bytes:
    """The HloModuleProto with every instruction id renumbered ``(computation id << 32) | i``
    (``i`` = its index in the computation), references updated (module docstring).

    Raises:
      CaptureFormatError: an operand, root or schedule reference names no instruction of its
        computation, or a computation id does not fit 31 bits.
    """
    _, HloModuleProto = _messages()
    mod = HloModuleProto()
    mod.ParseFromString(module_bytes)
    per_comp: dict[int, dict[int, int]] = {}
    for comp in mod.computations:
        if not 0 <= comp.id < 2 ** 31:
            raise CaptureFormatError(f"HloModuleProto: computation id {comp.id} out of range")
        ids = {ins.id: (comp.id << 32) | i for i, ins in enumerate(comp.instructions)}
        per_comp[comp.id] = ids
        try:
            for ins in comp.instructions:
                ins.id = ids[ins.id]
                ops = [ids[o] for o in ins.operand_ids]
                del ins.operand_ids[:]
                ins.operand_ids.extend(ops)
                preds = [ids[o] for o in ins.control_predecessor_ids]
                del ins.control_predecessor_ids[:]
                ins.control_predecessor_ids.extend(preds)
            if comp.instructions:
                comp.root_id = ids[comp.root_id]
        except KeyError as e:
            raise CaptureFormatError(f"HloModuleProto: computation {comp.id} refers to instruction id "
                                     f"{e.args[0]}, which it does not hold") from None
    if mod.HasField("schedule"):
        for cid, seq in mod.schedule.sequences.items():
            ids = per_comp.get(cid)
            if ids is None:
                continue
            try:
                new = [ids[i] for i in seq.instruction_ids]
            except KeyError as e:
                raise CaptureFormatError(f"HloModuleProto: the schedule of computation {cid} names "
                                         f"instruction id {e.args[0]}, which it does not hold") from None
            del seq.instruction_ids[:]
            seq.instruction_ids.extend(new)
    return mod.SerializeToString()


def _module_proto(data: bytes):
    """The HloModuleProto of a serialized ``HloProto`` or bare ``HloModuleProto``, else None."""
    from google.protobuf.message import DecodeError

    HloProto, HloModuleProto = _messages()
    try:
        hp = HloProto()
        hp.ParseFromString(data)
        if hp.HasField("hlo_module") and hp.hlo_module.computations:
            return hp.hlo_module
    except (DecodeError, ValueError, RuntimeError):
        pass
    try:
        m = HloModuleProto()
        m.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError):
        return None
    return m if m.computations else None


def async_wrapped_names(data: bytes) -> dict[str, str]:
    """Wrapped instruction name -> its ``async-start``'s name, for the async ops of a serialized
    ``HloProto`` / ``HloModuleProto``.

    jaxlib prints an async op in its short form (``reduce-scatter-start(...)``, xla/hlo/ir
    ``HloPrintOptions::syntax_sugar_async_ops``), without the computation it wraps, while a GPU
    trace names the wrapped instruction (``#hlo_op=reduce-scatter.131#``): this map joins such
    events to the start that the HLO text shows. Empty where the bytes hold no module."""
    mod = _module_proto(data)
    if mod is None:
        return {}
    by_id = {c.id: c for c in mod.computations}
    out: dict[str, str] = {}
    for comp in mod.computations:
        for ins in comp.instructions:
            if ins.opcode != "async-start":
                continue
            stack = list(ins.called_computation_ids)
            seen: set[int] = set()
            while stack:  # (the wrapped computation, and any it calls: a fusion inside it)
                cid = stack.pop()
                if cid in seen or cid not in by_id:
                    continue
                seen.add(cid)
                for inner in by_id[cid].instructions:
                    if inner.opcode != "parameter":
                        out.setdefault(inner.name, ins.name)
                    stack.extend(inner.called_computation_ids)
    return out


def hlo_text_from_proto(data: bytes, where: str) -> str:
    """HLO text of a serialized ``HloProto`` (or a bare ``HloModuleProto``), printed by jaxlib.

    Args:
      data: the proto's bytes.
      where: names the source in error messages (a file, ``program 40 of FILE``).

    Raises:
      CaptureFormatError: the bytes are neither, or jaxlib rejects the module.
    """
    from google.protobuf.message import DecodeError

    from jax._src.lib import xla_client

    HloProto, HloModuleProto = _messages()
    module_bytes = None
    try:
        hp = HloProto()
        hp.ParseFromString(data)
        if hp.HasField("hlo_module") and hp.hlo_module.computations:
            module_bytes = hp.hlo_module.SerializeToString()
    except (DecodeError, ValueError, RuntimeError):
        pass
    if module_bytes is None:
        try:
            m = HloModuleProto()
            m.ParseFromString(data)
        except (DecodeError, ValueError, RuntimeError) as e:
            raise CaptureFormatError(f"{where}: not a readable HloProto / HloModuleProto ({e})") from None
        if not m.computations:
            raise CaptureFormatError(f"{where}: the HloProto holds no computation (empty or not an HloProto)")
        module_bytes = data
    module_bytes = normalize_instruction_ids(module_bytes)
    try:
        return xla_client.XlaComputation(module_bytes).as_hlo_text()
    except Exception as e:  # jaxlib raises JaxRuntimeError (a RuntimeError) on a bad module
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CaptureFormatError(f"{where}: jaxlib cannot read the HloModuleProto ({first}); pass the "
                                 "program's HLO text with --hlo FILE") from None
