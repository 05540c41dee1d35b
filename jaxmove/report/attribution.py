"""Attribution: every instruction's source line and module path (README "Annotated programs,
attribution"), and sums of the figures by source line, module path, opcode, fusion kind or role.

Sources: ``metadata.source_file``/``source_line``, or ``stack_frame_id`` into the module's
StackFrames tables (xla/service/hlo.proto ``StackFrameIndexProto``; ``Module.source_location``);
module paths: the JAX name stack in ``op_name`` (``split_name_stack``), einsum subscripts
dropped. An instruction whose metadata an XLA pass dropped takes both from its nearest
neighbours (``_Inference``, on demand, at most linear per computation) and says so.
"""

from __future__ import annotations

import functools
import os
import re
import sysconfig
from collections import Counter
from dataclasses import dataclass

from ..hlo import Instruction, Module, SourceLocation
from ..passes.cost import PATHS, Cost
from ..passes.memo import memo_of
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
    """``a/b(c/d)/e`` -> ``['a', 'b(c/d)', 'e']``: split on '/' outside parentheses (a ')'
    with none open is ignored)."""
    if "(" not in op_name:  # no parentheses: every '/' splits (the common case, one C call)
        return [c for c in op_name.split("/") if c]
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for piece in op_name.split("/"):  # rejoin the pieces a '/' inside parentheses split
        cur.append(piece)
        if "(" in piece or ")" in piece:
            for ch in piece:
                if ch == "(":
                    depth += 1
                elif ch == ")":
                    depth = max(depth - 1, 0)
        if depth == 0:
            out.append("/".join(cur))
            cur = []
    if cur:
        out.append("/".join(cur))
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


_PACKAGE_DIRS = ("site-packages", "dist-packages")


def display_path(path: str, cwd: str | None = None) -> str:
    """A source path as a reader wants it: relative to the package root for an installed
    package (``.../site-packages/flax/nnx/nn/linear.py`` -> ``flax/nnx/nn/linear.py``),
    else relative to ``cwd`` (default: the current directory) when below it, else to the
    standard library, else to the root of an editable install that lies there (a package's
    ``__init__.py`` chain: ``/work/main/models/gpt.py`` -> ``models/gpt.py``... when
    ``/work/main/models`` is a package), else unchanged. Never shortened in the middle."""
    norm = path.replace("\\", "/")
    parts = norm.split("/")
    for k in range(len(parts) - 2, -1, -1):
        if parts[k] in _PACKAGE_DIRS:
            return "/".join(parts[k + 1:])
    if not os.path.isabs(path):
        return path
    cwd = cwd or os.getcwd()
    for root in (cwd, sysconfig.get_paths().get("stdlib", "")):
        if root and (path == root or path.startswith(root.rstrip(os.sep) + os.sep)):
            return os.path.relpath(path, root)
    return _package_relative(path)


@functools.lru_cache(maxsize=4096)
def _package_relative(path: str) -> str:
    """``path`` relative to the directory above its outermost package (the folders that
    hold an ``__init__.py``), or ``path`` when its folder is no package."""
    d = os.path.dirname(path)
    top = None
    try:
        while d and d != os.path.dirname(d) and os.path.isfile(os.path.join(d, "__init__.py")):
            top = d
            d = os.path.dirname(d)
    except OSError:
        return path
    return os.path.relpath(path, os.path.dirname(top)) if top else path


_LAYER = re.compile(r"^(?:(.*[_-])?\d+|\d+)$")


def rollup_path(module_path: str) -> str:
    """Merge repeated layers: every path component that is a number or ends in ``_<n>``
    / ``-<n>`` gets ``*`` for the number (``layers_3/attn`` -> ``layers_*/attn``,
    ``h/11/mlp`` -> ``h/*/mlp``, ``Dense_0`` -> ``Dense_*``). Keys such as ``(no op_name)``
    are returned unchanged."""
    if module_path.startswith("("):
        return module_path
    out = []
    for c in module_path.split("/"):
        m = _LAYER.match(c)
        out.append(((m.group(1) or "") + "*") if m else c)
    return "/".join(out)


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
      source_inferred_from: "" when ``source`` is the instruction's own (or its fused
        instructions'); else the name of the neighbouring instruction whose source line
        was taken (``source`` is then that line, ``stack`` empty).
    """

    source: SourceLocation | None
    stack: tuple[SourceLocation, ...]
    op_name: str
    name_stack: str
    module_path: str
    primitive: str
    module_inferred: bool = False
    source_inferred_from: str = ""

    @property
    def source_inferred(self) -> bool:
        """True when ``source`` was taken from a neighbouring instruction."""
        return bool(self.source_inferred_from)

    @property
    def source_key(self) -> str:
        """``file:line`` of the innermost frame (as the metadata wrote the path), or
        ``(no source)``."""
        return f"{self.source.file}:{self.source.line}" if self.source else NO_SOURCE

    @property
    def source_label(self) -> str:
        """``display_path(file):line`` (``flax/nnx/nn/linear.py:1342``), prefixed with
        ``≈`` when inferred; ``(no source)`` when there is none."""
        if self.source is None:
            return NO_SOURCE
        return ("≈ " if self.source_inferred else "") + f"{display_path(self.source.file)}:{self.source.line}"

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
    # depth first with an explicit stack (nested fusions any number of levels deep), each
    # fused computation once: what the recursive walk finds, without its repeated visits
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return instr
    seen = {fused.name}
    stack = [(instr, iter([fused.root] + fused.instructions[::-1]))]
    while stack:
        owner, it = stack[-1]
        inner = next(it, None)
        if inner is None:
            stack.pop()
            if stack and owner.metadata is not None:  # a nested fusion with (empty) metadata
                return owner
            continue
        if inner is instr:
            continue
        md = inner.metadata
        if (md is not None and (md.op_name or md.source_file or md.stack_frame_id)) \
                or inner.opcode != "fusion" or not inner.called_computations \
                or inner.called_computations[0] not in module.computations:
            if md is not None:
                return inner
            continue
        cname = inner.called_computations[0]
        if cname in seen:
            if md is not None:
                return inner
            continue
        seen.add(cname)
        nested = module.computations[cname]
        stack.append((inner, iter([nested.root] + nested.instructions[::-1])))
    return instr


def _module_parts(module: Module, instr: Instruction) -> tuple[str, list[str]]:
    """(op_name, module path components) of ``instr`` from its own metadata (or a fusion's
    fused instructions'), without looking at neighbours."""
    md = metadata_instruction(module, instr).metadata
    op_name = md.op_name if md else ""
    return op_name, list(_op_name_parts(op_name)[1])


@functools.lru_cache(maxsize=1 << 16)
def _op_name_parts(op_name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(name-stack components, module path components) of an op_name, once per distinct
    op_name (``split_name_stack``, then ``_unwrap`` of every scope but the primitive)."""
    parts = tuple(split_name_stack(op_name))
    return parts, tuple(u for u in (_unwrap(p) for p in parts[:-1]) if u)


def _common_prefix(paths: list[list[str]]) -> list[str]:
    out: list[str] = []
    for parts in zip(*paths):
        if any(p != parts[0] for p in parts):
            break
        out.append(parts[0])
    return out


class _ModuleIndex:
    """Per-module lookups the inference needs, built once: each instruction's computation,
    the inference tables of the computations asked about, and the attributions already
    computed (attribution is a pure function of the module)."""

    def __init__(self, module: Module):
        self.owner: dict[int, object] = {}
        for comp in module.computations.values():
            for i in comp.instructions:
                self.owner[id(i)] = comp
        self.attributions: dict[int, Attribution] = {}
        self.inference: dict[str, _Inference] = {}


def _index(module: Module) -> _ModuleIndex:
    memo = memo_of(module)
    idx = memo.attribution
    if idx is None:
        idx = memo.attribution = _ModuleIndex(module)
    return idx


def _owner(module: Module, instr: Instruction):
    comp = _index(module).owner.get(id(instr))
    if comp is not None and comp.by_name.get(instr.name) is instr:
        return comp
    for comp in module.computations.values():   # the module changed since it was indexed
        if comp.by_name.get(instr.name) is instr:
            return comp
    return None


def _majority(cands: list[tuple[SourceLocation, str]]) -> tuple[SourceLocation, str] | None:
    """The candidate whose (file, line) most candidates share; the first of them on a tie."""
    if not cands:
        return None
    if len(cands) == 1:   # the common case: one user / one operand
        return cands[0]
    counts = Counter((loc.file, loc.line) for loc, _ in cands)
    best = max(counts.values())
    return next(c for c in cands if counts[(c[0].file, c[0].line)] == best)


class _Inference:
    """Source lines and module paths of one computation's instructions, inferred from their
    neighbours, computed on demand and memoized (each instruction's value once, from its
    neighbours' own values or theirs in turn; an explicit stack, so any depth of chains of
    instructions without metadata; at most linear in the computation's size in all).

    From the users (the printed order is a topological order: the parser rejects operands
    defined later): an instruction takes, from each user, the user's own value or else the
    user's inferred one, i.e. the nearest value along every path to the outputs; the source
    line most of them share (the first on a tie), the module path as their common prefix.
    From the operands likewise; parameters carry neither and are not walked through.
    """

    def __init__(self, module: Module, comp):
        self.module, self.comp = module, comp
        self._own_src: dict[str, SourceLocation | None] = {}
        self._own_mod: dict[str, list[str] | None] = {}
        self._memo: dict[str, dict] = {"up_src": {}, "up_mod": {}, "down_src": {}, "down_mod": {}}

    def own_src(self, i: Instruction) -> SourceLocation | None:
        got = self._own_src.get(i.name, self)
        if got is self:
            got = self._own_src[i.name] = self.module.source_location(i)
        return got

    def own_mod(self, i: Instruction) -> list[str] | None:
        got = self._own_mod.get(i.name, self)
        if got is self:
            op_name, parts = _module_parts(self.module, i)
            got = self._own_mod[i.name] = parts if op_name and parts else None
        return got

    def _neighbours(self, i: Instruction, up: bool) -> list[Instruction]:
        if up:
            return self.comp.users(i.name)
        return [o for o in self.comp.operand_instructions(i) if o.opcode != "parameter"]

    def _value(self, kind: str, name: str):
        """``up_src`` / ``up_mod`` / ``down_src`` / ``down_mod`` of instruction ``name``."""
        memo = self._memo[kind]
        if name in memo:
            return memo[name]
        instr = self.comp.by_name.get(name)
        if instr is None:
            return None
        up, src = kind.startswith("up"), kind.endswith("src")
        own = self.own_src if src else self.own_mod
        stack, entered = [instr], set()
        while stack:  # depth first: a neighbour without its own value needs its inferred one first
            i = stack[-1]
            if i.name in memo:
                stack.pop()
                continue
            nbrs = self._neighbours(i, up)
            if i.name not in entered:  # (a cycle, which a parsed module cannot have, ends here)
                entered.add(i.name)
                pending = [n for n in nbrs if not own(n) and n.name not in memo and n.name not in entered]
                if pending:
                    stack.extend(pending)
                    continue
            stack.pop()
            if src:
                memo[i.name] = _majority(
                    [(own(n), n.name) if own(n) is not None else memo[n.name]
                     for n in nbrs if own(n) is not None or memo.get(n.name)])
            else:
                paths = [own(n) or memo[n.name] for n in nbrs if own(n) or memo.get(n.name)]
                memo[i.name] = (_common_prefix(paths) or None) if paths else None
        return memo[name]

    def up_src(self, name: str) -> tuple[SourceLocation, str] | None:
        return self._value("up_src", name)

    def down_src(self, name: str) -> tuple[SourceLocation, str] | None:
        return self._value("down_src", name)

    def up_mod(self, name: str) -> list[str] | None:
        return self._value("up_mod", name)

    def down_mod(self, name: str) -> list[str] | None:
        return self._value("down_mod", name)


def _inference(module: Module, comp) -> _Inference:
    idx = _index(module)
    inf = idx.inference.get(comp.name)
    if inf is None:
        inf = idx.inference[comp.name] = _Inference(module, comp)
    return inf


def neighbour_module_path(module: Module, instr: Instruction) -> str:
    """The module path shared by ``instr``'s nearest users with an op_name naming a scope,
    else by its nearest non-parameter operands; "" when neither has one in common.

    For instructions an XLA pass re-created without metadata: the rewritten op computes
    a value for its users, so their scope is the best witness, its operands' the next.
    Neighbours without op_name are walked through (``_Inference``).
    """
    comp = _owner(module, instr)
    if comp is None:
        return ""
    inf = _inference(module, comp)
    parts = inf.up_mod(instr.name) or inf.down_mod(instr.name)
    return "/".join(parts) if parts else ""


def neighbour_source(module: Module, instr: Instruction) -> tuple[SourceLocation, str] | None:
    """(source location, instruction it was taken from) for an instruction without one:
    the line most of its nearest users with a source line share (the first of them in
    printed order on a tie), else the same over its nearest operands; None when neither
    direction reaches one (``_Inference``)."""
    comp = _owner(module, instr)
    if comp is None:
        return None
    inf = _inference(module, comp)
    return inf.up_src(instr.name) or inf.down_src(instr.name)


def attribute(module: Module, instr: Instruction) -> Attribution:
    """Source location, stack, name stack and module path of one instruction (a fusion
    without metadata is attributed through its fused instructions; an instruction with
    no op_name or no source line at all through its neighbours, ``neighbour_module_path``
    and ``neighbour_source``). Cached per module."""
    idx = _index(module)
    cached = idx.attributions.get(id(instr))
    if cached is not None:
        return cached
    source = module.source_location(instr)
    original = instr
    instr = metadata_instruction(module, instr)
    md = instr.metadata
    op_name = md.op_name if md else ""
    parts, module_parts = _op_name_parts(op_name)
    primitive = parts[-1] if parts else ""
    scopes = parts[:-1]
    module_path, inferred = "/".join(module_parts), False
    if not op_name:
        module_path = neighbour_module_path(module, original)
        inferred = bool(module_path)
    stack, source_from = source_stack(module, instr), ""
    if source is None:
        found = neighbour_source(module, original)
        if found is not None:
            source, source_from = found
            stack = ()
    att = Attribution(source, stack, op_name, "/".join(scopes), module_path, primitive, inferred,
                      source_from)
    idx.attributions[id(original)] = att
    return att


def excess_with_sources(module: Module, excess):
    """``excess`` (an ExcessAnalysis) with each listed instruction that has no source line of
    its own given the line ``attribute`` infers from its neighbours (``source_inferred``), as
    the report's instruction table shows it; ``excess`` itself when none changes."""
    import dataclasses

    if excess is None:
        return None
    changed = False

    def sourced(c):
        nonlocal changed
        items = []
        for i in c.instructions:
            if i.source is None:
                comp = module.computations.get(i.computation)
                instr = comp.by_name.get(i.name) if comp is not None else None
                att = attribute(module, instr) if instr is not None else None
                if att is not None and att.source is not None:
                    i = dataclasses.replace(i, source=att.source_key, source_inferred=att.source_inferred)
                    changed = True
            items.append(i)
        return dataclasses.replace(c, instructions=tuple(items))

    causes, unattributed = [sourced(c) for c in excess.causes], sourced(excess.unattributed)
    return dataclasses.replace(excess, causes=causes, unattributed=unattributed) if changed else excess


def row_key(report, row: InstructionCost, by: str, rollup: bool = False) -> str:
    """The group of one row under ``by`` (one of BY_KEYS except ``role``); with ``rollup``
    a module path has its repeated layers merged (``rollup_path``)."""
    if by == "source":
        return attribute(report.module, row.instr).source_key
    if by == "module":
        key = attribute(report.module, row.instr).module_key
        return rollup_path(key) if rollup else key
    if by == "opcode":
        return row.instr.opcode
    if by == "fusion_kind":
        if row.instr.opcode == "fusion":
            return row.instr.fusion_kind or "(fusion without kind)"
        return f"(not a fusion: {row.instr.opcode})"
    raise ValueError(f"--by expects one of {', '.join(BY_KEYS)}, got '{by}'")


def _inferred(report, row: InstructionCost, by: str) -> bool:
    """Whether the row's group under ``by`` was inferred from its neighbours."""
    if by == "source":
        return attribute(report.module, row.instr).source_inferred
    if by == "module":
        return attribute(report.module, row.instr).module_inferred
    return False


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
      inferred: how many of the instructions have the key by inference from their
        neighbours (a source line or module path they lack themselves).
      label: the key as shown (a source key with its path made readable,
        ``display_path``); the key itself otherwise.
      merged: for a rolled-up module path, how many distinct paths it merges (else 1).
    """

    key: str
    instructions: int
    total: Cost
    flops: int | None
    est_time_s: float | None
    names: tuple[str, ...]
    inferred: int = 0
    label: str = ""
    merged: int = 1

    @property
    def shown(self) -> str:
        """``label`` or ``key``."""
        return self.label or self.key

    def to_json(self) -> dict:
        t = self.total
        out = {"key": self.key, "label": self.shown, "instructions": self.instructions,
               "inferred_instructions": self.inferred, "flops": self.flops,
               "hbm_read_bytes": t.hbm_read_bytes, "hbm_write_bytes": t.hbm_write_bytes,
               "by_path": {p: t.path_bytes(p) for p in PATHS if t.path_bytes(p)},
               "instruction_names": list(self.names[:20])}
        if self.est_time_s is not None:
            out["est_time_s"] = self.est_time_s
        if self.merged != 1:
            out["merged_paths"] = self.merged
        return out


def report_rows(report) -> list[InstructionCost]:
    """The rows the JSON ``instructions`` list holds (every non-quiet instruction)."""
    return [r for r in report.rows if r.instr.opcode not in QUIET_OPCODES]


def uncounted_computations(analysis) -> set[str]:
    """Computations the program totals do not count: a conditional's branches other than the
    one its totals take (``ModuleAnalysis.branches``, the costliest), and what only they call.
    Empty for a program without conditionals."""
    branches = getattr(analysis, "branches", None) or {}
    if not branches:
        return set()
    module = analysis.module
    return set(module.computations) - module.reachable_computations([module.entry.name], branches=branches)


def _sum_time(report, rows: list[InstructionCost]) -> float | None:
    if report.times is None:
        return None
    ts = [tm.est_time_s for r in rows if (tm := row_time(report, r)) is not None]
    return float(sum(ts)) if ts else None


def _label(by: str, key: str) -> str:
    if by == "source" and key != NO_SOURCE:
        file, _, line = key.rpartition(":")
        return f"{display_path(file)}:{line}" if file else key
    return key


def aggregate(report, by: str, rollup: bool = False) -> list[Group]:
    """Group the report's instructions by ``by`` and sum their figures.

    Args:
      report: a Report.
      by: ``source`` (``file:line`` of the innermost frame, inferred from neighbours for an
        instruction without one), ``module`` (Flax module / named-scope path from op_name),
        ``opcode``, ``fusion_kind`` or ``role``.
      rollup: with ``by="module"``, merge repeated layers (``layers_*/attn``,
        ``rollup_path``); ignored otherwise.
    Returns:
      Groups sorted by HBM bytes (then flops), largest first, of the instructions the
      program totals count: those of ``report_rows(report)`` outside the branches of a
      conditional that its totals leave out (``uncounted_computations``: they count the
      costliest branch), so every grouping sums to the totals. For every key except
      ``role`` the groups partition those rows; for ``role`` each group holds that role's
      bytes of every such instruction.
    Raises:
      ValueError: an unknown ``by``.
    """
    skip = uncounted_computations(report.analysis)
    rows = [r for r in report_rows(report) if r.computation not in skip] if skip else report_rows(report)
    groups: list[Group] = []
    rollup = rollup and by == "module"
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
            by_key.setdefault(row_key(report, r, by, rollup), []).append(r)
        for key, members in by_key.items():
            total = Cost()
            for r in members:
                total = total + r.total
            members.sort(key=lambda r: (r.total.hbm_bytes, r.total.flops), reverse=True)
            merged = len({row_key(report, r, by) for r in members}) if rollup else 1
            groups.append(Group(key, len(members), total, total.flops, _sum_time(report, members),
                                tuple(r.instr.name for r in members),
                                sum(_inferred(report, r, by) for r in members), _label(by, key),
                                merged))
    groups.sort(key=lambda g: (g.total.hbm_bytes, g.flops or 0), reverse=True)
    return groups


def by_json(report, by: str, base_json: dict | None = None, rollup: bool = False) -> dict:
    """The JSON keys ``jaxmove analyze --by BY --json`` adds to the report's JSON.

    For ``source``, ``module``, ``opcode`` and ``fusion_kind``: ``{"by_<by>": [group, ...]}``
    (``Group.to_json``, largest first); ``--by module --rollup`` adds ``by_module_rollup``
    (repeated layers merged) beside ``by_module``. For ``role``, the report already has ``by_role``
    (exact role bytes of the program totals); its entries keep their values and gain
    ``instructions`` (how many instructions move bytes of that role) and
    ``instruction_names`` (the costliest 20).
    """
    groups = aggregate(report, by)
    if by != "role":
        out = {f"by_{by}": [g.to_json() for g in groups]}
        if rollup and by == "module":
            out["by_module_rollup"] = [g.to_json() for g in aggregate(report, by, rollup=True)]
        return out
    base = (base_json or report.to_json())["by_role"]
    out = {}
    for g in groups:
        entry = dict(base.get(g.key, {}))
        entry.update(instructions=g.instructions, instruction_names=list(g.names[:20]))
        out[g.key] = entry
    return {"by_role": out}
