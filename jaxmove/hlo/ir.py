"""The HLO IR: modules, computations, instructions.

The IR mirrors what XLA prints (xla/hlo/ir/hlo_instruction.cc ``ToString``): each
instruction keeps its attributes as the raw text XLA printed (``attrs``) plus typed
accessors for the ones the passes need. It knows nothing of JAX or of the passes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from .fastpath import parse_attr_text
from .ints import ascii_int
from .shape import Shape

# Attributes whose value names one or more computations.
CALLED_COMPUTATION_ATTRS = (
    "calls", "to_apply", "condition", "body", "branch_computations",
    "true_computation", "false_computation", "scatter", "select",
    "async_execution_thread_computation",
)
_CALLED_KEYS = frozenset(CALLED_COMPUTATION_ATTRS)
# Where such a key can start in unsplit attribute text (``, calls=%f``); no match: none is there.
_CALLED_KEY_AT = re.compile(r",[ \t]*(?:%s)[ \t]*=" % "|".join(CALLED_COMPUTATION_ATTRS))
# the attribute text of a get-tuple-element as XLA prints it: its index first (tuple_index)
_INDEX_FIRST = re.compile(r"[ \t]*+,[ \t]*+index[ \t]*+=[ \t]*+([0-9]++)[ \t]*+(?:,|\Z)")
_UNSET = object()
# attribute text -> Instruction.int_list's answer, for the texts read without error (a model's
# layers repeat the same few: dimensions={1}, lhs_contracting_dims={1}); cleared when it fills
_INT_LISTS: dict[str, tuple[int, ...]] = {}
_INT_LISTS_MAX = 4096


@dataclass(slots=True)
class Metadata:
    """``metadata={op_type=... op_name=... source_file=... source_line=... stack_frame_id=...}``."""

    op_type: str = ""
    op_name: str = ""
    source_file: str = ""
    source_line: int = 0
    stack_frame_id: int = 0
    raw: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class SourceLocation:
    """A resolved source position (file, line, function) for an instruction."""

    file: str
    line: int
    function: str = ""


class Instruction:
    """One HLO instruction.

    Attributes:
      name: instruction name without ``%``.
      opcode: e.g. ``fusion``, ``dot``, ``all-reduce-start``.
      shape: result shape.
      operands: operand instruction names, in order.
      attrs: every ``key=value`` attribute as printed (value text unparsed).
      literal: for ``constant``, the literal text between the parentheses.
      is_root: True when printed with ``ROOT`` (or implied: last instruction).
      line, column: 1-based position of the instruction name in the source text.
      computation: the name of the enclosing computation.

    ``attrs`` may be given as None with ``attr_text``, the attribute text the parser's fast
    path matched (``, key=value, ...``, already checked): it is split into the dict on first
    use, so attributes nothing reads (most ``metadata``, ``dimensions``) are never split.
    """

    __slots__ = ("name", "opcode", "shape", "operands", "_attrs", "_attr_text", "literal",
                 "is_root", "line", "column", "computation", "parameter_number", "_called",
                 "_metadata", "_backend_config")

    def __init__(self, name, opcode, shape, operands, attrs, literal, is_root, line, column,
                 computation, parameter_number=None, attr_text=None):
        self.name: str = name
        self.opcode: str = opcode
        self.shape: Shape = shape
        self.operands: tuple[str, ...] = operands
        self._attrs: dict[str, str] | None = attrs
        self._attr_text: str | None = attr_text
        self.literal: str | None = literal
        self.is_root: bool = is_root
        self.line: int = line
        self.column: int = column
        self.computation: str = computation
        self.parameter_number: int | None = parameter_number
        self._called: tuple[str, ...] | None = None
        self._metadata = _UNSET
        self._backend_config = _UNSET

    def __repr__(self) -> str:
        return f"<{self.name} = {self.shape} {self.opcode}({', '.join(self.operands)})>"

    @property
    def attrs(self) -> dict[str, str]:
        """Every ``key=value`` attribute as printed, by key (split from ``attr_text`` once)."""
        a = self._attrs
        if a is None:
            a = self._attrs = parse_attr_text(self._attr_text) if self._attr_text else {}
        return a

    @attrs.setter
    def attrs(self, value: dict[str, str]) -> None:
        self._attrs = value
        self._attr_text = None  # (the dict is the attributes now)
        self._called = None
        self._metadata = self._backend_config = _UNSET

    # ---- called computations -------------------------------------------------------
    def names_computations(self) -> bool:
        """True when an attribute that names called computations (``calls``, ``to_apply``,
        ... ``CALLED_COMPUTATION_ATTRS``) is present, even with an empty value."""
        if self._attrs is None and (not self._attr_text
                                    or _CALLED_KEY_AT.search(self._attr_text) is None):
            return False
        return not _CALLED_KEYS.isdisjoint(self.attrs)

    @property
    def called_computations(self) -> tuple[str, ...]:
        """Names of computations this instruction calls, in attribute order (computed once)."""
        out = self._called
        if out is None:
            out = self._called = self._find_called() if self.names_computations() else ()
        return out

    def _find_called(self) -> tuple[str, ...]:
        attrs = self.attrs
        keys = [k for k in attrs if k in _CALLED_KEYS]
        if len(keys) == 1:  # the usual case, one key naming one computation (calls=%f)
            v = attrs[keys[0]].strip()
            if "," not in v and not v.startswith("{"):
                return (v.lstrip("%"),) if v else ()
        out: list[str] = []
        for key in CALLED_COMPUTATION_ATTRS:
            v = attrs.get(key)
            if v is None:
                continue
            v = v.strip()
            if v.startswith("{"):
                v = v[1:-1]
            out.extend(p.strip().lstrip("%") for p in v.split(",") if p.strip())
        return tuple(out)

    # ---- typed attribute accessors -------------------------------------------------
    def int_list(self, key: str) -> tuple[int, ...] | None:
        """``key={1,2,3}`` as a tuple of ints, or None when absent."""
        v = self.attrs.get(key)
        if v is None:
            return None
        hit = _INT_LISTS.get(v)
        if hit is not None:
            return hit
        t = v.strip().strip("{}").strip()
        out = tuple(ascii_int(x) for x in t.split(",") if x.strip()) if t else ()
        if len(_INT_LISTS) >= _INT_LISTS_MAX:
            _INT_LISTS.clear()
        _INT_LISTS[v] = out
        return out

    @property
    def metadata(self) -> Metadata | None:
        """``metadata={...}`` parsed (once), or None when absent."""
        md = self._metadata
        if md is _UNSET:
            md = self._metadata = self._parse_metadata()
        return md

    def _parse_metadata(self) -> Metadata | None:
        if self._attrs is None and (not self._attr_text or "metadata" not in self._attr_text):
            return None  # (no such key: the attribute text is not split for it)
        v = self.attrs.get("metadata")
        if v is None:
            return None
        from .attrs import parse_kv_block  # local import: attrs imports ir-free helpers only
        raw = parse_kv_block(v)
        md = Metadata(raw=raw)
        md.op_type = raw.get("op_type", "")
        md.op_name = raw.get("op_name", "")
        md.source_file = raw.get("source_file", "")
        try:
            md.source_line = int(raw.get("source_line", "0") or 0)
            md.stack_frame_id = int(raw.get("stack_frame_id", "0") or 0)
        except ValueError:
            pass
        return md

    @property
    def backend_config(self) -> dict | None:
        """backend_config as a dict: JSON (``{...}``) or an escaped JSON string (older XLA).

        Relaxed JSON with unquoted keys (Triton fusions print ``{sizes: ...}``) is accepted.
        Returns None when absent or when the value is not JSON (e.g. a raw proto string).
        Parsed once.
        """
        bc = self._backend_config
        if bc is _UNSET:
            bc = self._backend_config = self._parse_backend_config()
        return bc

    def _parse_backend_config(self) -> dict | None:
        v = self.attrs.get("backend_config")
        if v is None:
            return None
        from .attrs import parse_backend_config
        return parse_backend_config(v)

    @property
    def fusion_kind(self) -> str | None:
        """``kind=kLoop|kInput|kOutput|kCustom`` for fusions, else None."""
        return self.attrs.get("kind")

    @property
    def custom_call_target(self) -> str | None:
        v = self.attrs.get("custom_call_target")
        if v is None:
            return None
        from .attrs import unquote  # escapes read as XLA does (validate.py checked them)
        return unquote(v)

    @property
    def known_trip_count(self) -> int | None:
        """``known_trip_count.n`` from a while's backend_config, or None when unknown."""
        bc = self.backend_config
        if isinstance(bc, dict):
            ktc = bc.get("known_trip_count")
            if isinstance(ktc, dict) and "n" in ktc:
                try:
                    return int(ktc["n"])
                except (TypeError, ValueError):
                    return None
        return None

    def index_first(self) -> int | None:
        """The ``index=`` attribute when the unsplit attribute text (the parser's fast path)
        gives it first, as ASCII digits, and names no other ``index`` (XLA's form of a
        get-tuple-element); else None (read ``attrs``). When it is the only attribute, the
        attributes are set from it (what splitting the text gives: ``{"index": "N"}``)."""
        text = self._attr_text
        if self._attrs is not None or not text:
            return None
        m = _INDEX_FIRST.match(text)
        if m is None or text.count("index") != 1:
            return None
        if m.end() == len(text):
            self._attrs = {"index": m.group(1)}
        return int(m.group(1))

    @property
    def tuple_index(self) -> int | None:
        """The ``index=`` attribute as an int (None without one)."""
        k = self.index_first()
        if k is not None:
            return k
        v = self.attrs.get("index")
        return int(v) if v is not None else None


class Computation:
    """An HLO computation: an ordered list of instructions with one root.

    Attributes:
      name: computation name without ``%``.
      instructions: in printed order (XLA prints a topological order; scheduled
        modules print the schedule).
      root: the ROOT instruction (the last one when no ROOT marker was printed).
      is_entry: True for the ENTRY computation.
      line, column: 1-based position of the computation header.
      execution_thread: the thread XLA runs it on (``main``; XLA:TPU prints
        ``execution_thread="sparsecore"`` after the closing brace of SparseCore computations).
    """

    __slots__ = ("name", "instructions", "by_name", "root", "is_entry", "line", "parameters",
                 "column", "_users", "execution_thread")

    def __init__(self, name: str, instructions: list[Instruction], root: Instruction,
                 is_entry: bool, line: int, column: int = 1,
                 by_name: dict[str, Instruction] | None = None):
        self.name = name
        self.instructions = instructions
        self.by_name = by_name if by_name is not None else {i.name: i for i in instructions}
        self.root = root
        self.is_entry = is_entry
        self.line = line
        self.column = column
        params = [i for i in instructions if i.opcode == "parameter"]
        self.parameters: list[Instruction] = sorted(params, key=lambda i: i.parameter_number or 0)
        self._users: dict[str, list[Instruction]] | None = None
        self.execution_thread = "main"

    def __repr__(self) -> str:
        return f"<Computation {self.name}: {len(self.instructions)} instructions>"

    def __iter__(self):
        return iter(self.instructions)

    def __len__(self) -> int:
        return len(self.instructions)

    def operand_instructions(self, instr: Instruction) -> list[Instruction]:
        return [self.by_name[o] for o in instr.operands]

    def users(self, name: str) -> list[Instruction]:
        """Instructions of this computation that use ``name`` as an operand, in printed
        order (each user once). The index is built once, on first use: O(instructions)."""
        if self._users is None:
            users: dict[str, list[Instruction]] = {}
            for instr in self.instructions:
                for o in dict.fromkeys(instr.operands):
                    users.setdefault(o, []).append(instr)
            self._users = users
        return self._users.get(name, [])


class Module:
    """An HLO module.

    Attributes:
      name: the ``HloModule`` name.
      header: header attributes as printed (``is_scheduled``, ``entry_computation_layout``,
        ``input_output_alias``, ``num_partitions``, ``replica_count`` ...).
      computations: by name, in printed order.
      entry: the ENTRY computation (the last one when no ENTRY marker was printed).
      filename: where the text came from (for error messages), or ``<string>``.
      file_names, function_names: id -> string tables from the preamble.
      file_locations: id -> {file_name_id, function_name_id, line, ...}.
      stack_frames: id -> (file_location_id, parent_frame_id).
    """

    def __init__(self, name, header, computations, entry, filename, file_names=None,
                 function_names=None, file_locations=None, stack_frames=None):
        self.name: str = name
        self.header: dict[str, str] = header
        self.computations: dict[str, Computation] = computations
        self.entry: Computation = entry
        self.filename: str = filename
        self.file_names: dict[int, str] = file_names or {}
        self.function_names: dict[int, str] = function_names or {}
        self.file_locations: dict[int, dict[str, int]] = file_locations or {}
        self.stack_frames: dict[int, tuple[int, int]] = stack_frames or {}
        # False when the text had no ENTRY marker and the last computation was taken as entry
        self.entry_marked: bool = True
        # XLA:GPU memory-space colours (S(1), S(2)) its text printed, read as HBM (hlo/parser.py)
        self.gpu_memory_colors: tuple[int, ...] = ()
        # memory spaces S(n) its text printed that are neither HBM, host nor a known on-chip
        # space (hlo/shape.py): their bytes are counted as HBM, with a note (passes/pipeline.py)
        self.unknown_memory_spaces: tuple[int, ...] = ()
        # some shape has an unbounded dynamic dimension ('?', Shape.unbounded): the pipeline
        # lists the instructions that produce or read one as unmodeled
        self.has_unbounded_dims: bool = False
        # the passes' memo caches of this module (passes/memo.py), made on first use
        self.memo = None
        # computation -> the earlier computation whose body text it repeats up to its
        # instructions' names, as the parser read it (hlo/clones.py): structurally identical
        self.clones: dict[str, str] = {}
        # jaxmove compiled it for a GPU target without the device (api.analyze sets it): XLA's
        # autotuner did not run, so no GEMM tile in it was measured (passes/gpu_kernel_time.py)
        self.compiled_without_device: bool = False

    def __repr__(self) -> str:
        n = sum(len(c) for c in self.computations.values())
        return f"<Module {self.name}: {len(self.computations)} computations, {n} instructions>"

    @property
    def is_scheduled(self) -> bool:
        return self.header.get("is_scheduled", "false").strip() == "true"

    def _header_int(self, key: str, default: int) -> int:
        try:
            return int(self.header.get(key, default))
        except ValueError:
            return default

    @property
    def num_partitions(self) -> int:
        return self._header_int("num_partitions", 1)

    @property
    def replica_count(self) -> int:
        return self._header_int("replica_count", 1)

    def reachable_computations(self, names, through_fusions: bool = True,
                               branches: dict | None = None) -> set[str]:
        """Computations reachable from ``names`` (included) through called computations.

        With ``through_fusions=False`` fused computations are not entered: their
        instructions never run as kernels (or profiler events) of their own. ``branches``:
        (computation, conditional name) -> the one branch to enter of that conditional.
        """
        seen: set[str] = set()
        stack = list(names)
        while stack:
            c = stack.pop()
            if c in seen or c not in self.computations:
                continue
            seen.add(c)
            for instr in self.computations[c].instructions:
                if branches and instr.opcode == "conditional" and (c, instr.name) in branches:
                    stack.append(branches[(c, instr.name)])
                elif through_fusions or instr.opcode != "fusion":
                    stack.extend(instr.called_computations)
        return seen

    def instructions(self):
        """Every instruction of every computation, in printed order."""
        for c in self.computations.values():
            yield from c.instructions

    @cached_property
    def structural_classes(self) -> dict[str, str]:
        """Computation name -> its class, the name of the first computation (in order) that is
        structurally identical to it, possibly itself (hlo/structure.py). Computed once."""
        from .structure import structural_classes
        return structural_classes(self)

    @cached_property
    def input_output_alias(self) -> dict[int, list[tuple[tuple[int, ...], tuple[int, ...]]]]:
        """Entry parameter number -> [(output index, parameter index)] from ``input_output_alias``.

        XLA prints ``input_output_alias={ {0}: (1, {}, may-alias), ... }``: output index
        ``{0}`` aliases parameter 1 at index ``{}`` (the buffer is donated and reused).
        """
        from .attrs import parse_input_output_alias
        v = self.header.get("input_output_alias")
        return parse_input_output_alias(v) if v else {}

    def source_location(self, instr: Instruction) -> SourceLocation | None:
        """Source file and line of an instruction: metadata source_file/source_line, or the
        innermost frame of ``stack_frame_id`` through the module's StackFrames tables.

        A fusion often carries no metadata of its own: then its fused instructions' (root
        first, then the others last to first, depth first into nested fusions, each fused
        computation once), which XLA keeps from the ops it fused. Iterative: nested
        fusions any number of levels deep.
        """
        loc = self._own_location(instr.metadata)
        if loc is not None or instr.opcode != "fusion" or not instr.called_computations:
            return loc
        seen: set[str] = set()
        stack = [iter((instr,))]
        while stack:
            inner = next(stack[-1], None)
            if inner is None:
                stack.pop()
                continue
            if inner is not instr:
                loc = self._own_location(inner.metadata)
                if loc is not None:
                    return loc
            if inner.opcode == "fusion" and inner.called_computations:
                cname = inner.called_computations[0]
                fused = self.computations.get(cname)
                if fused is not None and cname not in seen:
                    seen.add(cname)
                    root = fused.root
                    stack.append(iter([root] + [i for i in fused.instructions[::-1] if i is not root]))
        return None

    def _own_location(self, md) -> SourceLocation | None:
        """The source location an instruction's own metadata ``md`` names, if any."""
        if md is None:
            return None
        if md.source_file:
            return SourceLocation(md.source_file, md.source_line)
        if md.stack_frame_id and md.stack_frame_id in self.stack_frames:
            loc_id, _parent = self.stack_frames[md.stack_frame_id]
            loc = self.file_locations.get(loc_id)
            if loc is not None:
                return SourceLocation(
                    self.file_names.get(loc.get("file_name_id", 0), "?"),
                    loc.get("line", 0),
                    self.function_names.get(loc.get("function_name_id", 0), ""),
                )
        return None
