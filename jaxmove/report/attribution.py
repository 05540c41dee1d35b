"""Attribution: map every instruction to its source line and JAX name stack, and aggregate.

Where an instruction came from is in its ``metadata``:

  * ``source_file`` / ``source_line`` (what JAX writes), or ``stack_frame_id``, an index
    into the module's ``FileNames`` / ``FunctionNames`` / ``FileLocations`` /
    ``StackFrames`` tables (what newer XLA prints; xla/service/hlo.proto
    ``StackFrameIndexProto``) -- resolved by ``Module.source_location``;
  * ``op_name``: the JAX name stack plus the primitive, e.g.
    ``jit(step)/transpose(jvp(Block_0))/attn/dot_general``. Flax Linen modules and
    ``jax.named_scope`` put their path into the name stack; ``jit(...)``/``pjit(...)``
    components name traced functions, and transform wrappers (``jvp(...)``,
    ``transpose(...)``, ``vmap(...)``, ``remat(...)`` ...) wrap a scope name.

Two repairs keep the module path about modules: an einsum's subscripts, which
``jnp.einsum`` pushes onto the name stack (``layers_0/attn/bkgts,bksd->btkgd/dot_general``),
are dropped; and an instruction whose op_name an XLA pass dropped while rewriting it
(XLA:CPU's gemv-rewriter re-creates matrix-vector dots without metadata, and its
reduce-window split of reductions does the same) takes the module path its users share,
else the one its operands share (``Attribution.module_inferred`` says so).

``aggregate(report, by)`` sums the per-instruction figures (totals over one program run)
by source line, module path, opcode, fusion kind or tensor role.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..hlo import Instruction, Module, SourceLocation
from ..passes.cost import PATHS, Cost
from ..passes.pipeline import InstructionCost
from ..vocab import ROLES
from .columns import QUIET_OPCODES, row_time

BY_KEYS = ("source", "module", "opcode", "fusion_kind", "role")

NO_SOURCE = "(no source)"
NO_OP_NAME = "(no op_name)"
TOP_LEVEL = "(top level)"

_WRAPPER = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\((.*)\)$", re.S)
# Name-stack components that name a traced function, not a module/scope.
_FUNCTION_WRAPPERS = frozenset({"jit", "pjit", "xla_computation", "pmap", "xmap", "shard_map",
                                "custom_jvp_call", "custom_vjp_call", "core_call",
                                "closed_call", "remat_call", "checkpoint"})


def split_name_stack(op_name: str) -> list[str]:
    """``a/b(c/d)/e`` -> ``['a', 'b(c/d)', 'e']``: split on '/' outside parentheses."""
    out, depth, cur = [], 0, []
    for ch in op_name:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        if ch == "/" and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [c for c in out if c]


def _unwrap(component: str) -> str | None:
    """A module/scope name inside transform wrappers, or None for a function wrapper or
    an einsum's subscripts (``bkgts,bksd->btkgd``, a name-stack entry of ``jnp.einsum``).

    ``transpose(jvp(Block_0))`` -> ``Block_0``; ``jit(step)`` -> None; ``attn`` -> ``attn``.
    """
    while True:
        m = _WRAPPER.match(component)
        if m is None:  # bare ``closed_call`` (what lax.scan's body is traced as) is no scope
            return None if "->" in component or component in _FUNCTION_WRAPPERS else component
        if m.group(1) in _FUNCTION_WRAPPERS:
            return None
        component = m.group(2)


@dataclass(frozen=True, slots=True)
class Attribution:
    """Where one instruction came from.

    Attributes:
      source: innermost source location (file, line, function) or None.
      stack: every resolved frame, innermost first (one entry from source_file/line; the
        whole parent chain when the module has StackFrames tables).
      op_name: the metadata op_name ("" when absent).
      name_stack: op_name without its last component (the primitive).
      module_path: the name stack with function wrappers (``jit(...)``) dropped and
        transform wrappers (``jvp(...)``) unwrapped: the Flax module / named-scope path.
      primitive: the op_name's last component (``dot_general``), or "".
      module_inferred: True when the instruction has no op_name and ``module_path`` is
        the path its neighbours share (see the module docstring).
    """

    source: SourceLocation | None
    stack: tuple[SourceLocation, ...]
    op_name: str
    name_stack: str
    module_path: str
    primitive: str
    module_inferred: bool = False

    @property
    def source_key(self) -> str:
        """``file:line`` of the innermost frame, or ``(no source)``."""
        return f"{self.source.file}:{self.source.line}" if self.source else NO_SOURCE

    @property
    def module_key(self) -> str:
        """The module path (inferred from neighbours for an instruction without op_name),
        ``(top level)`` when the op_name names no scope, or ``(no op_name)``."""
        if self.module_path:
            return self.module_path
        return TOP_LEVEL if self.op_name else NO_OP_NAME


def source_stack(module: Module, instr: Instruction) -> tuple[SourceLocation, ...]:
    """Every source frame of ``instr``, innermost first.

    ``metadata.source_file/source_line`` gives one frame. ``stack_frame_id`` is followed
    through ``StackFrames`` parents (``parent_frame_id``; a frame that names itself or an
    id already seen ends the chain, as does an id with no entry).
    """
    md = instr.metadata
    if md is None:
        return ()
    if md.source_file:
        return (SourceLocation(md.source_file, md.source_line),)
    frames: list[SourceLocation] = []
    seen: set[int] = set()
    fid = md.stack_frame_id
    while fid and fid in module.stack_frames and fid not in seen:
        seen.add(fid)
        loc_id, parent = module.stack_frames[fid]
        loc = module.file_locations.get(loc_id)
        if loc is not None:
            frames.append(SourceLocation(module.file_names.get(loc.get("file_name_id", 0), "?"),
                                         loc.get("line", 0),
                                         module.function_names.get(loc.get("function_name_id", 0), "")))
        fid = parent
    return tuple(frames)


def metadata_instruction(module: Module, instr: Instruction) -> Instruction:
    """The instruction whose metadata describes ``instr``: itself, or for a fusion without
    metadata of its own the first fused instruction (root first, then the others from last
    to first, nested fusions included) that has some -- XLA keeps the metadata of the ops
    it fused (the same fallback as ``Module.source_location``)."""
    md = instr.metadata
    if (md is not None and (md.op_name or md.source_file or md.stack_frame_id)) \
            or instr.opcode != "fusion" or not instr.called_computations:
        return instr
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return instr
    for inner in [fused.root] + fused.instructions[::-1]:
        if inner is instr:
            continue
        found = metadata_instruction(module, inner)
        if found.metadata is not None:
            return found
    return instr


def _module_parts(module: Module, instr: Instruction) -> tuple[str, list[str]]:
    """(op_name, module path components) of ``instr`` from its own metadata (or a fusion's
    fused instructions'), without looking at neighbours."""
    md = metadata_instruction(module, instr).metadata
    op_name = md.op_name if md else ""
    scopes = split_name_stack(op_name)[:-1]
    return op_name, [u for u in (_unwrap(p) for p in scopes) if u]


def _common_prefix(paths: list[list[str]]) -> list[str]:
    out: list[str] = []
    for parts in zip(*paths):
        if any(p != parts[0] for p in parts):
            break
        out.append(parts[0])
    return out


def _owner(module: Module, instr: Instruction):
    for comp in module.computations.values():
        if comp.by_name.get(instr.name) is instr:
            return comp
    return None


def neighbour_module_path(module: Module, instr: Instruction) -> str:
    """The module path shared by ``instr``'s users (those with an op_name naming a scope),
    else by its non-parameter operands; "" when neither group has one in common.

    For instructions an XLA pass re-created without metadata: the rewritten op computes
    a value for its users, so their scope is the best witness, its operands' the next.
    One hop only (neighbours without op_name are skipped).
    """
    comp = _owner(module, instr)
    if comp is None:
        return ""
    for group in (comp.users(instr.name),
                  [o for o in comp.operand_instructions(instr) if o.opcode != "parameter"]):
        paths = [parts for op_name, parts in (_module_parts(module, i) for i in group)
                 if op_name and parts]
        common = _common_prefix(paths) if paths else []
        if common:
            return "/".join(common)
    return ""


def attribute(module: Module, instr: Instruction) -> Attribution:
    """Source location, stack, name stack and module path of one instruction (a fusion
    without metadata is attributed through its fused instructions; an instruction with
    no op_name at all through its neighbours, ``neighbour_module_path``)."""
    source = module.source_location(instr)
    original = instr
    instr = metadata_instruction(module, instr)
    md = instr.metadata
    op_name = md.op_name if md else ""
    parts = split_name_stack(op_name)
    primitive = parts[-1] if parts else ""
    scopes = parts[:-1]
    module_parts = [u for u in (_unwrap(p) for p in scopes) if u]
    module_path, inferred = "/".join(module_parts), False
    if not op_name:
        module_path = neighbour_module_path(module, original)
        inferred = bool(module_path)
    return Attribution(source, source_stack(module, instr), op_name,
                       "/".join(scopes), module_path, primitive, inferred)


def row_key(report, row: InstructionCost, by: str) -> str:
    """The group of one row under ``by`` (one of BY_KEYS except ``role``)."""
    if by == "source":
        return attribute(report.module, row.instr).source_key
    if by == "module":
        return attribute(report.module, row.instr).module_key
    if by == "opcode":
        return row.instr.opcode
    if by == "fusion_kind":
        if row.instr.opcode == "fusion":
            return row.instr.fusion_kind or "(fusion without kind)"
        return f"(not a fusion: {row.instr.opcode})"
    from ..errors import UsageError
    raise UsageError(f"--by expects one of {', '.join(BY_KEYS)}, got '{by}'")


@dataclass(frozen=True, slots=True)
class Group:
    """The instructions of one group and the sum of their figures over one program run.

    Attributes:
      key: the group's name (a ``file:line``, module path, opcode, fusion kind or role).
      instructions: number of instructions in the group (for a role: that move its bytes).
      total: summed Cost. For a role group only the byte fields are filled: HBM read and
        write bytes of that role (an instruction's bytes split exactly by role); flops
        are not split by role and are None in ``flops``.
      flops: summed flops, or None for role groups.
      est_time_s: summed estimated time when the report has times, else None (a sum of
        per-instruction times, not a schedule).
      names: instruction names, costliest (HBM bytes) first.
    """

    key: str
    instructions: int
    total: Cost
    flops: int | None
    est_time_s: float | None
    names: tuple[str, ...]

    def to_json(self) -> dict:
        t = self.total
        out = {"key": self.key, "instructions": self.instructions, "flops": self.flops,
               "hbm_read_bytes": t.hbm_read_bytes, "hbm_write_bytes": t.hbm_write_bytes,
               "by_path": {p: t.path_bytes(p) for p in PATHS if t.path_bytes(p)},
               "instruction_names": list(self.names[:20])}
        if self.est_time_s is not None:
            out["est_time_s"] = self.est_time_s
        return out


def report_rows(report) -> list[InstructionCost]:
    """The rows the JSON ``instructions`` list holds (every non-quiet instruction)."""
    return [r for r in report.rows if r.instr.opcode not in QUIET_OPCODES]


def _sum_time(report, rows: list[InstructionCost]) -> float | None:
    if getattr(report, "times", None) is None:
        return None
    ts = [getattr(row_time(report, r), "est_time_s", None) for r in rows]
    ts = [t for t in ts if t is not None]
    return float(sum(ts)) if ts else None


def aggregate(report, by: str) -> list[Group]:
    """Group the report's instructions by ``by`` and sum their figures.

    Args:
      report: a Report.
      by: ``source`` (``file:line`` of the innermost frame), ``module`` (Flax module /
        named-scope path from op_name), ``opcode``, ``fusion_kind`` or ``role``.
    Returns:
      Groups sorted by HBM bytes (then flops), largest first. For every key except
      ``role`` the groups partition the rows of ``report_rows(report)``, so the group
      sums equal the sums over the JSON ``instructions``. For ``role`` each group holds
      that role's bytes of every instruction (the sums equal the JSON ``by_role`` when
      the program has no conditional, whose totals count only the costliest branch).
    Raises:
      ValueError: an unknown ``by``.
    """
    rows = report_rows(report)
    groups: list[Group] = []
    if by == "role":
        for role in ROLES:
            members = [r for r in rows if any(r.total.role_bytes(role))]
            rd = sum(r.total.role_bytes(role)[0] for r in members)
            wr = sum(r.total.role_bytes(role)[1] for r in members)
            c = Cost(hbm_read_bytes=rd, hbm_write_bytes=wr,
                     **{f"{role}_read_bytes": rd, f"{role}_write_bytes": wr})
            members.sort(key=lambda r: sum(r.total.role_bytes(role)), reverse=True)
            groups.append(Group(role, len(members), c, None, None,
                                tuple(r.instr.name for r in members)))
    else:
        by_key: dict[str, list[InstructionCost]] = {}
        for r in rows:
            by_key.setdefault(row_key(report, r, by), []).append(r)
        for key, members in by_key.items():
            total = Cost()
            for r in members:
                total = total + r.total
            members.sort(key=lambda r: (r.total.hbm_bytes, r.total.flops), reverse=True)
            groups.append(Group(key, len(members), total, total.flops, _sum_time(report, members),
                                tuple(r.instr.name for r in members)))
    groups.sort(key=lambda g: (g.total.hbm_bytes, g.flops or 0), reverse=True)
    return groups


def by_json(report, by: str, base_json: dict | None = None) -> dict:
    """The JSON keys ``jaxmove analyze --by BY --json`` adds to the report's JSON.

    For ``source``, ``module``, ``opcode`` and ``fusion_kind``: ``{"by_<by>": [group, ...]}``
    (``Group.to_json``, largest first). For ``role``, the report already has ``by_role``
    (exact role bytes of the program totals); its entries keep their values and gain
    ``instructions`` (how many instructions move bytes of that role) and
    ``instruction_names`` (the costliest 20).
    """
    groups = aggregate(report, by)
    if by != "role":
        return {f"by_{by}": [g.to_json() for g in groups]}
    base = (base_json or report.to_json())["by_role"]
    out = {}
    for g in groups:
        entry = dict(base.get(g.key, {}))
        entry.update(instructions=g.instructions, instruction_names=list(g.names[:20]))
        out[g.key] = entry
    return {"by_role": out}
