"""HLO text parser.

Reads what XLA prints (``Compiled.as_text()``, ``--xla_dump_to`` after-optimizations
dumps) for CPU, GPU and TPU. The grammar follows xla/hlo/parser/hlo_parser.cc:

    module      := 'HloModule' name (',' attr)* preamble* computation*
    preamble    := ('FileNames'|'FunctionNames'|'FileLocations'|'StackFrames') (int value)*
    computation := ['ENTRY'] name [signature '->' shape] (',' attr)* '{' instruction* '}'
    instruction := ['ROOT'] name '=' [shape] opcode '(' operands ')' (',' attr)*

Instructions may span several lines; ``//`` line comments and ``/*...*/`` block
comments are whitespace. Operands may carry their shape (older printers) or be a
nested unnamed instruction (``convert(f16[4] multiply(%a, %b))``, accepted by XLA's
parser too). The shape may be omitted for tuple, get-tuple-element and while, whose
shapes follow from their operands. Attribute values are kept as the raw text; typed
accessors live on :class:`~jaxmove.hlo.ir.Instruction`.

Every error is an :class:`HloParseError` with file, line, column and what was expected.
"""

from __future__ import annotations

import bisect
import errno
import os
import re
import stat
import sys
from math import prod
from pathlib import Path

from .._perf import gc_paused
from .clones import CloneReader
from .errors import HloFileError, HloParseError
from .fastpath import _F_ARRAY, _F_NAME, _F_SHAPE, _FAST_ATTR, _FAST_LINE
from .ints import ascii_int, is_uint
from .ir import Computation, Instruction, Module
from .opcodes import names
from .replica_groups import MAX_DEVICES, ReplicaGroupsError, parse_replica_groups
from .validate import validate_module
from .shape import HOST_MEMORY_SPACE, ON_CHIP_MEMORY_SPACES, PRIMITIVE_BIT_WIDTHS, Layout, Shape

# Possessive quantifiers (Python >= 3.11) throughout: a repeated group keeps no backtracking
# state per repetition, so memory stays bounded by the input's size (a backtracking
# ``(?:...)*`` over 2M comment lines took 670 MB; over a 10M-character string 1.1 GB).
_WS = re.compile(r"(?:\s++|//[^\n]*+|/\*.*?\*/)*+", re.S)
# Deepest tuple-in-tuple shape accepted: shapes are walked recursively (Shape.leaves,
# byte sizes, roles); XLA programs nest tuples a few levels at most.
MAX_TUPLE_DEPTH = 256
# Deepest nest of unnamed instructions written as operands (``negate(f32[4] exp(%a))``),
# read recursively, a few Python frames a level; XLA never prints them nested.
MAX_NESTED_OPERAND_DEPTH = 64
_NAME = re.compile(r"%?([A-Za-z_][A-Za-z0-9_.\-$]*|[0-9][A-Za-z0-9_.\-$]*)")
_OPCODE = re.compile(r"[a-z][a-z0-9\-]*")
_ATTR_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-.]*")
_ARRAY_SHAPE = re.compile(r"([a-z][a-z0-9]*)\[([^\]\[\n]*)\](\{[^{}\n]*\})?")
_TYPE_AT = re.compile(r"([a-z][a-z0-9]*)\[")
_BRACKETS = re.compile(r'[(){}\[\]"]')
_STOP0 = re.compile(r'[(){}\[\]"\s,]')
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"')
_TILE = re.compile(r"\(([^()]*)\)")
_INT = re.compile(r"-?[0-9]+")
_UINT = re.compile(r"[0-9]+")
_MAX_DIM = 1 << 62
_MAX_BITS = 1 << 66  # 2^63 bytes
_WORD = re.compile(r"[A-Za-z]+")
_PREAMBLE = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_CLOSE = {"(": ")", "[": "]", "{": "}"}

# Opcodes whose result shape equals their first operand's (used when the shape is omitted).
_SAME_SHAPE_AS_OPERAND0 = names(same_shape_as_operand0=True)  # opcodes.py


# ---- the fast path (fastpath.py): one instruction on one line, in the form XLA prints ----

# A computation's parameter list ``(p: f32[4]{0}, t: (s32[], f32[2]))`` on one line, every
# bracket closed in order (up to three levels of tuples): what ``balanced`` accepts there.
_S_ATOM = r'[^()\[\]{}"\n]++'
_S_GROUP = rf'\[[^()\[\]{{}}"\n]*+\]|\{{(?:{_S_ATOM}|\([^()\[\]{{}}"\n]*+\))*+\}}'
_S_PARENS = rf'\((?:{_S_ATOM}|{_S_GROUP})*+\)'
for _ in range(3):
    _S_PARENS = rf'\((?:{_S_ATOM}|{_S_GROUP}|{_S_PARENS})*+\)'
_SIGNATURE = re.compile(_S_PARENS)
# A parameter list in the form XLA prints, each array's element type known and its
# dimensions numbers (what XLA's parser checks there: hlo_parser.cc, ParseParamList reads each
# parameter's shape), tuples one level deep (with XLA's ``/*index=5*/``): ``_HEADER``'s; any other list goes to the general
# code, which reads each of its arrays with ``shape`` (``_check_signature``)
_ETYPES = "|".join(sorted(PRIMITIVE_BIT_WIDTHS, key=len, reverse=True))
_SIG_ARRAY = rf"(?:{_ETYPES})\[[0-9,<=?]*+\](?:\{{[^{{}}\n]*+\}})?"
_SIG_SHAPE = (rf"(?:{_SIG_ARRAY}|\((?:{_SIG_ARRAY}(?:,[ \t]*+(?:/\*index=[0-9]++\*/)?{_SIG_ARRAY})*+)?\))")
_SIG_PARAMS = rf"\((?:{_F_NAME}:[ \t]*+{_SIG_SHAPE}(?:,[ \t]*+{_F_NAME}:[ \t]*+{_SIG_SHAPE})*+)?\)"
# Where an array starts in a parameter list: its element type (any word), then '['
_SIG_ARRAY_AT = re.compile(r"(?<![\w.\-$%])[A-Za-z][A-Za-z0-9]*\[")
# A tuple of arrays in the form XLA prints (``_F_SHAPE``'s tuple), and one of its arrays.
_FLAT_TUPLE = re.compile(rf"\((?:{_F_ARRAY}(?:,[ \t]*+{_F_ARRAY})*+)?\)")
_ARRAY_AT = re.compile(_F_ARRAY)
# A computation header in the form XLA prints, on one line: ``[ENTRY] %name (params) ->
# shape {`` (groups: ENTRY, name, result shape). Anything else (comments, attributes, no
# signature, line breaks) is read by the general code, which also reports every error.
_HEADER = re.compile(rf"(ENTRY[ \t]++)?+({_F_NAME})[ \t]*+{_SIG_PARAMS}[ \t]*+->[ \t]*+({_F_SHAPE})"
                     rf"[ \t]++\{{")  # a blank before '{': 'f32[]{' is a broken layout

# Element types narrower than a byte, the only ones a layout's E(n) may pack (shape.py).
_SUB_BYTE_TYPES = ", ".join(t for t, b in PRIMITIVE_BIT_WIDTHS.items() if 0 < b < 8)

# Device groups are expanded into explicit lists; a count above MAX_DEVICES
# (replica_groups.py: 2^20, more than any real system has) is refused rather than allocated.
_COUNT_KEYS = ("replica_count", "num_partitions")
# Keys whose value is one computation (XLA's attribute type kHloComputation): a '{' there
# starts a computation written in place (hlo_parser.cc, ParseHloComputation's nested case).
_INLINE_KEYS = frozenset({"calls", "to_apply", "condition", "body", "true_computation",
                          "false_computation", "select", "scatter"})
  # the module header's device counts
_IOTA_DIMS = re.compile(r"<=\[([0-9,\s]*)\]")
_MESH_SIZES = re.compile(r"=\s*([0-9]+)")


def _device_count_bound(value: str) -> int:
    """Devices an iota or mesh-axes group list spans (0 for explicit lists, bounded by
    their text), computed without expanding it."""
    m = _IOTA_DIMS.search(value)
    if m:
        try:
            return prod(ascii_int(x) for x in m.group(1).split(",") if x.strip())
        except ValueError:
            return 0
    if value.lstrip().startswith("mesh["):
        head = value[:value.find("]") + 1]
        return prod(int(x) for x in _MESH_SIZES.findall(head))
    return 0


class _Parser:
    def __init__(self, text: str, filename: str):
        self.text = text
        self.n = len(text)
        self.filename = filename
        self.pos = 0
        self._line_starts: list[int] | None = None
        self._lc = (0, 1, 0)  # (position, its line, start of that line) of the last linecol
        self._shape_cache: dict[str, Shape] = {}
        self._anon = 0
        self._nest = 0  # depth of nested unnamed operand instructions being read
        self._instr_pos = self._comp_pos = 0
        self.inline: list[Computation] = []  # computations written in place, not yet added
        self._taken: set[str] = set()  # computation names used so far
        self._checked_groups: set[str] = set()
        self.pos_in_header = False  # attrs() is reading the HloModule header
        self.unbounded_dims = False  # a shape with an unbounded dynamic dimension ('?') was read
        self.header_counts: dict[str, int] = {}
        # XLA:GPU's memory-space colours are HBM allocations, not TPU on-chip memories;
        # whether the text is XLA:GPU's is looked up at the first S(1) / S(2) (None: not yet)
        self._gpu: bool | None = None
        self.gpu_colors: set[int] = set()
        self.unknown_spaces: set[int] = set()
        self._general = 0  # instructions read by the general code (instruction()) so far
        self._clones = CloneReader(text)

    # ---- positions and errors ------------------------------------------------------
    def linecol(self, pos: int) -> tuple[int, int]:
        lc_pos, lc_line, lc_start = self._lc
        if pos >= lc_pos:  # moving forward (the usual case): count newlines since last time
            nl = self.text.count("\n", lc_pos, pos)
            if nl:
                lc_line += nl
                lc_start = self.text.rfind("\n", lc_pos, pos) + 1
            self._lc = (pos, lc_line, lc_start)
            return lc_line, pos - lc_start + 1
        if self._line_starts is None:
            self._line_starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
        i = bisect.bisect_right(self._line_starts, pos) - 1
        return i + 1, pos - self._line_starts[i] + 1

    def error(self, expected: str, pos: int | None = None) -> HloParseError:
        line, col = self.linecol(self.pos if pos is None else min(pos, self.n))
        return HloParseError(self.filename, line, col, expected)

    def found(self) -> str:
        if self.pos >= self.n:
            return "end of file"
        tok = re.match(r"\S{1,20}", self.text[self.pos:self.pos + 20])
        return repr(tok.group(0)) if tok else repr(self.text[self.pos])

    # ---- lexing helpers ------------------------------------------------------------
    def ws(self) -> None:
        pos = self.pos
        if pos < self.n:
            c = self.text[pos]
            if not c.isspace() and c != "/":  # nothing to skip (str.isspace is re's \s)
                return
        self.pos = _WS.match(self.text, pos).end()

    def peek(self, s: str) -> bool:
        return self.text.startswith(s, self.pos)

    def expect(self, s: str, what: str) -> None:
        self.ws()
        if not self.text.startswith(s, self.pos):
            raise self.error(f"expected '{s}' {what}, found {self.found()}")
        self.pos += len(s)

    def name(self, what: str) -> str:
        self.ws()
        m = _NAME.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected {what}, found {self.found()}")
        self.pos = m.end()
        return m.group(1)

    def balanced(self, what: str) -> str:
        """Consume a balanced ``(...)``, ``[...]`` or ``{...}`` group (strings respected)."""
        start = self.pos
        text = self.text
        stack: list[tuple[str, int]] = []
        pos = self.pos
        while True:
            m = _BRACKETS.search(text, pos)
            if m is None:
                o, opos = stack[-1] if stack else (text[start], start)
                raise self.error(f"expected '{_CLOSE.get(o, o)}' closing '{o}' of {what} "
                                 f"opened at {self._fmt(opos)}", self.n)
            c = m.group(0)
            pos = m.end()
            if c == '"':
                sm = _STRING.match(text, m.start())
                if sm is None:
                    raise self.error(f"unterminated string in {what}", m.start())
                pos = sm.end()
            elif c in "([{":
                stack.append((c, m.start()))
            else:
                if not stack:
                    raise self.error(f"unexpected '{c}' in {what}", m.start())
                o, opos = stack.pop()
                if _CLOSE[o] != c:
                    raise self.error(f"expected '{_CLOSE[o]}' closing '{o}' of {what} opened at "
                                     f"{self._fmt(opos)}, found '{c}'", m.start())
                if not stack:
                    self.pos = pos
                    return text[start:pos]

    def _fmt(self, pos: int) -> str:
        line, col = self.linecol(pos)
        return f"{line}:{col}"

    def value(self, what: str) -> str:
        """An attribute value: text up to ',' / whitespace at depth 0, brackets balanced."""
        self.ws()
        start = self.pos
        text = self.text
        while self.pos < self.n:
            m = _STOP0.search(text, self.pos)
            if m is None:
                self.pos = self.n
                break
            c = m.group(0)
            self.pos = m.start()
            if c in "([{":
                self.balanced(what)
            elif c == '"':
                sm = _STRING.match(text, self.pos)
                if sm is None:
                    raise self.error(f"unterminated string in {what}")
                self.pos = sm.end()
            elif c in ")]}":
                if self.pos == start:
                    raise self.error(f"unexpected '{c}' in {what}")
                break
            else:  # whitespace or ',' at depth 0
                break
        if self.pos == start:
            raise self.error(f"expected a value for {what}, found {self.found()}")
        return text[start:self.pos]

    def attrs(self, what: str, into: dict[str, str], owner: str | None = None) -> None:
        """``(',' key '=' value)*``. For an instruction (``owner``, its name), a computation
        written in place as the value of a key that names one computation (``calls={ ... }``,
        ``to_apply={ ... }``: XLA's parser reads a '{' there as a nested instruction list)
        is parsed as a computation of its own, named ``OWNER.KEY``, and the value is that name."""
        while True:
            save = self.pos
            self.ws()
            if not self.peek(","):
                self.pos = save
                return
            self.pos += 1
            self.ws()
            m = _ATTR_KEY.match(self.text, self.pos)
            if not m:
                raise self.error(f"expected attribute name after ',' in {what}, found {self.found()}")
            key = m.group(0)
            self.pos = m.end()
            self.expect("=", f"after attribute '{key}' of {what}")
            self.ws()
            vpos = self.pos
            if owner is not None and key in _INLINE_KEYS and self.peek("{"):
                into[key] = self.inline_computation(f"{owner}.{key}", what)
                continue
            into[key] = self.value(f"attribute '{key}' of {what}")
            if into[key].startswith("mesh["):
                into[key] = self._mesh_axes_tail(into[key], f"attribute '{key}' of {what}")
            self.check_attr(key, into[key], vpos, what)

    def inline_computation(self, name: str, what: str) -> str:
        """A computation written in place (``{`` at ``pos``): parsed, queued for the module
        (``self.inline``, added before the computation that holds it) under ``name`` (made
        unique with ``.1``, ``.2`` ...); returns the name given."""
        if self._nest >= MAX_NESTED_OPERAND_DEPTH:
            raise self.error(f"computations written in place nested deeper than "
                             f"{MAX_NESTED_OPERAND_DEPTH} levels are not supported (in {what})")
        base, k = name, 0
        while name in self._taken:
            k += 1
            name = f"{base}.{k}"
        self._taken.add(name)
        line, _ = self.linecol(self.pos)
        saved = self._comp_pos, self._instr_pos
        self._comp_pos = self.pos
        self.pos += 1  # '{'
        self._nest += 1
        try:
            comp = self._body(name, line, False)
        finally:
            self._nest -= 1
            self._comp_pos, self._instr_pos = saved
        self.inline.append(comp)
        return name

    def _mesh_axes_tail(self, head: str, what: str) -> str:
        """The rest of a mesh-axes replica group list, ``mesh[a=2,b=4][, device_ids=(...)] {a}``
        (xla/hlo/ir/replica_group.cc ``MeshAxesReplicaGroupList::ToString``), whose
        comma and space would otherwise end the value at ``mesh[...]``."""
        parts = [head]
        save = self.pos
        self.ws()
        m = re.compile(r",\s*device_ids\s*=\s*").match(self.text, self.pos)
        if m:
            self.pos = m.end()
            if not self.peek("("):
                raise self.error(f"expected '(' after device_ids= in {what}, found {self.found()}")
            parts.append(", device_ids=" + self.balanced(what))
            save = self.pos
            self.ws()
        if not self.peek("{"):
            self.pos = save
            return "".join(parts)
        parts.append(" " + self.balanced(what))
        return "".join(parts)

    # ---- shapes --------------------------------------------------------------------
    def shape(self, what: str, depth: int = 0) -> Shape:
        self.ws()
        start = self.pos
        if self.peek("("):
            if depth >= MAX_TUPLE_DEPTH:
                raise self.error(f"tuple shapes nested deeper than {MAX_TUPLE_DEPTH} levels are not "
                                 f"supported (in shape of {what})")
            text = self.text
            flat = _FLAT_TUPLE.match(text, self.pos)
            if flat is not None:  # '(' arrays ')' as XLA prints it: each element through the cache
                cache = self._shape_cache
                elems = []
                for em in _ARRAY_AT.finditer(text, flat.start(), flat.end()):
                    s = cache.get(em.group(0))
                    if s is None:
                        self.pos = em.start()
                        s = self.shape(what, depth + 1)
                    elems.append(s)
                self.pos = flat.end()
                return Shape("tuple", tuple_shapes=tuple(elems))
            self.pos += 1
            elems: list[Shape] = []
            self.ws()
            if self.peek(")"):
                self.pos += 1
            else:
                while True:
                    elems.append(self.shape(what, depth + 1))
                    self.ws()
                    if self.peek(","):
                        self.pos += 1
                        continue
                    if self.peek(")"):
                        self.pos += 1
                        break
                    raise self.error(f"expected ',' or ')' in tuple shape of {what}, found {self.found()}")
            # A tuple may carry a (meaningless to us) layout-free suffix; nothing to read.
            return Shape("tuple", tuple_shapes=tuple(elems))
        m = _ARRAY_SHAPE.match(self.text, self.pos)
        if m is not None and not m.group(3) and self.text.startswith("{", m.end()):
            raise self.error(f"expected '}}' closing the layout of {m.group(0)}", m.end())
        if m is None:
            tm = _TYPE_AT.match(self.text, self.pos)
            if tm:
                b = self.text.find("]", tm.end())
                nl = self.text.find("\n", tm.end())
                if b == -1 or (nl != -1 and nl < b):
                    raise self.error(f"expected ']' closing dimensions of "
                                     f"{self.text[start:(nl if nl != -1 else self.n)].strip()}", tm.end())
            raise self.error(f"expected a shape for {what}, found {self.found()}")
        key = m.group(0)
        cached = self._shape_cache.get(key)
        if cached is not None:
            self.pos = m.end()
            return cached
        etype = m.group(1)
        if etype not in PRIMITIVE_BIT_WIDTHS:
            raise self.error(f"unknown element type '{etype}' in shape of {what}")
        dims: list[int] = []
        dyn: list[bool] = []
        unbounded: list[bool] = []
        dtext = m.group(2).strip()
        if dtext:
            off = m.start(2) + len(m.group(2)) - len(m.group(2).lstrip())  # (the part's position)
            for part in dtext.split(","):
                part_pos = off + len(part) - len(part.lstrip())
                off += len(part) + 1
                p = part.strip()
                d = p.startswith("<=")
                if d:
                    p = p[2:].strip()
                if p == "?":  # unbounded dynamic: sized at run time only (Shape.unbounded)
                    dims.append(0)
                    dyn.append(True)
                    unbounded.append(True)
                    continue
                unbounded.append(False)
                if not is_uint(p):
                    raise self.error(f"expected a dimension size (integer or <=integer) in "
                                     f"{key}, found {part.strip()!r}", part_pos)
                dims.append(int(p))
                dyn.append(d)
        if dims and (max(dims) >= _MAX_DIM or prod(dims) * PRIMITIVE_BIT_WIDTHS[etype] >= _MAX_BITS):
            raise self.error(f"shape {key} is too large: XLA sizes arrays in int64, so dimensions and "
                             f"the byte size must stay below 2^63", m.start(2))
        layout = None
        if m.group(3):
            layout = self.layout(m.group(3)[1:-1], m.start(3))
            m2m = layout.minor_to_major
            if m2m and sorted(m2m) != list(range(len(dims))):
                # XLA's LayoutUtil::ValidateLayoutForShape: a permutation of the dimensions
                raise self.error(f"layout {m.group(3)} of {key.split('{')[0]}: expected the dimension numbers "
                                 f"0..{len(dims) - 1} in some order, each once (minor to major)"
                                 if dims else f"layout {m.group(3)} of {key.split('{')[0]}: a scalar's layout "
                                 f"names no dimension", m.start(3))
            esize = layout.element_size_bits
            bits = PRIMITIVE_BIT_WIDTHS[etype]
            if esize and bits >= 8 and esize != bits:
                # XLA packs only sub-byte types (CpuGpuShapeVerifier::Preprocess: "custom element
                # sizes on non-sub-byte types" are refused); E(n) would shrink this array's bytes
                raise self.error(f"layout {m.group(3)} of {key.split('{')[0]}: E({esize}) sets a "
                                 f"{esize}-bit element size on {etype} ({bits}-bit); expected E(n) "
                                 f"only on sub-byte types ({_SUB_BYTE_TYPES})", m.start(3))
        if any(unbounded):
            shape = Shape(etype, tuple(dims), tuple(dyn), layout, unbounded=tuple(unbounded))
            self.unbounded_dims = True
        else:
            shape = Shape(etype, tuple(dims), tuple(dyn), layout)
        if layout is not None and max(shape.byte_size, shape.logical_byte_size) >= _MAX_BITS // 8:
            raise self.error(f"shape {key} is too large: its layout's tiles or element size make "
                             f"it {max(shape.byte_size, shape.logical_byte_size)} bytes, and XLA sizes "
                             f"arrays in int64 (below 2^63)", m.start(3))
        self._shape_cache[key] = shape
        self.pos = m.end()
        return shape

    def _is_gpu(self) -> bool:
        self._gpu = is_xla_gpu_text(self.text)
        return self._gpu

    def layout(self, text: str, pos: int) -> Layout:
        try:
            return self._layout(text, pos)
        except HloParseError:
            raise
        except ValueError:
            raise self.error(f"expected integers in layout {{{text}}}", pos) from None

    def _layout(self, text: str, pos: int) -> Layout:
        head, _, tail = text.partition(":")
        try:
            m2m = tuple(ascii_int(x) for x in head.split(",") if x.strip())
        except ValueError:
            raise self.error(f"expected integers in layout {{{text}}}", pos) from None
        tiles: list[tuple[int, ...]] = []
        esize = None
        mspace = 0
        align = 1
        i = 0
        while i < len(tail):
            c = tail[i]
            if c == "T":
                i += 1
                while i < len(tail) and tail[i] == "(":
                    m = _TILE.match(tail, i)
                    if m is None:
                        raise self.error(f"expected ')' closing tile in layout {{{text}}}", pos)
                    tile = tuple(-1 if x.strip() == "*" else ascii_int(x)
                                 for x in m.group(1).split(",") if x.strip())
                    if any(t < 1 and t != -1 for t in tile) or -1 in tile and "-" in m.group(1):
                        raise self.error(f"tile ({m.group(1)}) in layout {{{text}}}: expected "
                                         "positive tile dimensions (or '*')", pos)
                    tiles.append(tile)
                    i = m.end()
            elif c in "ESLDP#M" and i + 1 < len(tail) and tail[i + 1] == "(":
                m = _TILE.match(tail, i + 1)
                if m is None:
                    raise self.error(f"expected ')' in layout {{{text}}}", pos)
                if c in "ES" and ascii_int(m.group(1)) < 0:
                    raise self.error(f"{c}({m.group(1)}) in layout {{{text}}}: expected a "
                                     f"non-negative {'element size' if c == 'E' else 'memory space'}",
                                     pos)
                if c == "E":
                    esize = ascii_int(m.group(1))
                elif c == "S":
                    mspace = ascii_int(m.group(1))
                    if mspace in XLA_GPU_HBM_COLORS and self._gpu is not False and (
                            self._gpu or self._is_gpu()):
                        self.gpu_colors.add(mspace)
                        mspace = 0
                    elif mspace and mspace != HOST_MEMORY_SPACE and mspace not in ON_CHIP_MEMORY_SPACES:
                        self.unknown_spaces.add(mspace)   # (counted as HBM, with a note: pipeline)
                elif c == "L":  # tail padding alignment in elements (shape.py sizes)
                    align = max(1, ascii_int(m.group(1)))
                i = m.end()
            else:
                i += 1  # D(...) dim level types, '*' etc.: kept in text only
        return Layout(m2m, tuple(tiles), esize, mspace, text, align)

    # ---- module --------------------------------------------------------------------
    def module(self) -> Module:
        self.ws()
        name = "unnamed"
        header: dict[str, str] = {}
        if self.peek("HloModule"):
            self.pos += len("HloModule")
            name = self.name("module name after 'HloModule'")
            self.pos_in_header = True
            self.attrs("HloModule header", header)
            self.pos_in_header = False
        tables: dict[str, dict] = {k: {} for k in _PREAMBLE}
        computations: dict[str, Computation] = {}
        entry: Computation | None = None
        while True:
            self.ws()
            if self.pos >= self.n:
                break
            word = _WORD.match(self.text[self.pos:self.pos + 16]) if self.text[self.pos] in "FS" else None
            if word and word.group(0) in _PREAMBLE and self._preamble_here(word.group(0)):
                self.preamble(word.group(0), tables[word.group(0)])
                continue
            comp = self.computation()
            for c in self.inline:  # computations written in place, before their user
                if c.name in computations:
                    raise self.error(f"duplicate computation name '{c.name}' (first defined at "
                                     f"line {computations[c.name].line})", self._comp_pos)
                computations[c.name] = c
            self.inline.clear()
            if comp.name in computations:
                raise self.error(f"duplicate computation name '{comp.name}' (first defined at line "
                                 f"{computations[comp.name].line})", self._comp_pos)
            computations[comp.name] = comp
            if comp.is_entry:
                if entry is not None:
                    raise self.error("a second ENTRY computation", self._comp_pos)
                entry = comp
        if not computations:
            raise self.error("expected at least one computation")
        entry_marked = entry is not None
        if entry is None:
            entry = list(computations.values())[-1]
            entry.is_entry = True
            self._check_entry_layout(header, entry)
        mod = Module(name, header, computations, entry, self.filename,
                     {k: v for k, v in tables["FileNames"].items()},
                     {k: v for k, v in tables["FunctionNames"].items()},
                     tables["FileLocations"], {
                         k: (v.get("file_location_id", 0), v.get("parent_frame_id", 0))
                         for k, v in tables["StackFrames"].items()})
        mod.entry_marked = entry_marked
        mod.gpu_memory_colors = tuple(sorted(self.gpu_colors))
        mod.unknown_memory_spaces = tuple(sorted(self.unknown_spaces))
        mod.has_unbounded_dims = self.unbounded_dims
        mod.clones = self._clones.clones
        self.validate(mod)
        return mod

    def _check_entry_layout(self, header: dict[str, str], entry: Computation) -> None:
        """Without an ENTRY marker the last computation is the entry; it must then take as
        many parameters as ``entry_computation_layout`` declares. A text cut after a complete
        computation otherwise parses as a smaller program (XLA's parser accepts it too)."""
        layout = header.get("entry_computation_layout")
        if layout is None:
            return
        sub = _Parser(layout.strip()[1:-1] if layout.strip().startswith("{") else layout, self.filename)
        try:
            params = sub.shape("entry_computation_layout")
        except HloParseError:
            return  # a layout we cannot read proves nothing
        def same(a: Shape, b: Shape) -> bool:
            if a.is_tuple or b.is_tuple:
                return a.is_tuple and b.is_tuple and len(a.tuple_shapes) == len(b.tuple_shapes) \
                    and all(same(x, y) for x, y in zip(a.tuple_shapes, b.tuple_shapes))
            return a.element_type == b.element_type and a.dims == b.dims

        if params.is_tuple and len(params.tuple_shapes) == len(entry.parameters):
            for declared, p in zip(params.tuple_shapes, entry.parameters):
                if not same(declared, p.shape):
                    raise self.error(
                        f"expected an ENTRY computation whose parameter {p.parameter_number} is "
                        f"{declared} as entry_computation_layout declares; the last computation, "
                        f"'{entry.name}' (line {entry.line}), has {p.shape} (is the file truncated?)",
                        self.n)
        if params.is_tuple and len(params.tuple_shapes) != len(entry.parameters):
            raise self.error(
                f"expected an ENTRY computation with {len(params.tuple_shapes)} parameters as "
                f"entry_computation_layout declares; the last computation, '{entry.name}' (line "
                f"{entry.line}), has {len(entry.parameters)} (is the file truncated?)", self.n)

    def _preamble_here(self, word: str) -> bool:
        after = self.pos + len(word)
        rest = _WS.match(self.text, after).end()
        return rest >= self.n or "0" <= self.text[rest] <= "9" or self.text[after] == "\n"

    def preamble(self, word: str, table: dict) -> None:
        self.pos += len(word)
        while True:
            self.ws()
            m = _UINT.match(self.text, self.pos)
            if not m:
                return
            key = int(m.group(0))
            self.pos = m.end()
            self.ws()
            wants_string = word in ("FileNames", "FunctionNames")
            if self.peek("{" if wants_string else '"'):
                raise self.error(f"expected {'a string' if wants_string else '{...}'} for {word} "
                                 f"entry {key}, found {self.found()}")
            if self.peek('"'):
                sm = _STRING.match(self.text, self.pos)
                if sm is None:
                    raise self.error(f"unterminated string in {word} entry {key}")
                from .attrs import EscapeError, unquote
                try:
                    table[key] = unquote(sm.group(0))
                except EscapeError as e:
                    raise self.error(f"bad escape in {word} entry {key}: {e} (XLA's lexer unescapes "
                                     "strings as absl::CUnescape does)") from None
                self.pos = sm.end()
            elif self.peek("{"):
                body = self.balanced(f"{word} entry {key}")
                vals = {}
                for kv in body[1:-1].split():
                    k, _, v = kv.partition("=")
                    try:
                        vals[k] = ascii_int(v)
                    except ValueError:
                        raise self.error(f"expected integer value for '{k}' in {word} entry {key}") from None
                table[key] = vals
            else:
                raise self.error(f"expected a string or {{...}} for {word} entry {key}, found {self.found()}")

    def _fast_header(self) -> tuple[bool, str] | None:
        """(is ENTRY, name) of a header in XLA's one-line form (``_HEADER``) at ``pos``, with
        ``pos`` moved past its '{'; None, with ``pos`` unchanged, for any other form."""
        hm = _HEADER.match(self.text, self.pos)
        if hm is None:
            return None
        shape_text = hm.group(3)
        if shape_text not in self._shape_cache:
            save = self.pos
            self.pos = hm.start(3)
            try:
                shape = self.shape("result of computation")
                ok = self.pos == hm.end(3)
            except HloParseError:
                ok = False
            self.pos = save
            if not ok:
                return None
            self._shape_cache[shape_text] = shape  # (as fast_block keeps a line's shape)
        name = hm.group(2)
        self.pos = hm.end()
        return hm.group(1) is not None, name[1:] if name[0] == "%" else name

    def _check_signature(self, start: int, end: int, name: str) -> None:
        """Computation ``name``'s parameter list in ``text[start:end]``: an array with an
        unknown element type or dimensions that are not numbers raises, at its position, the
        error its shape would raise in an instruction; ``pos`` is kept."""
        save = self.pos
        for m in _SIG_ARRAY_AT.finditer(self.text, start, end):
            self.pos = m.start()
            self.shape(f"parameter list of computation '{name}'")
        self.pos = save

    def computation(self) -> Computation:
        self.ws()
        self._comp_pos = self.pos
        fast = self._fast_header()
        if fast is not None:
            is_entry, name = fast
            line, _ = self.linecol(self._comp_pos)
            # a body that repeats an earlier one up to its names (clones.py), else line by line
            start = self.pos
            comp, end = self._clones.read(name, line, is_entry, start)
            if comp is not None:
                self.pos = end
                self._taken.add(name)
            else:
                general = self._general
                comp = self._body(name, line, is_entry)
                if end >= 0 and self._general == general and self.pos == end + 2 and not self.inline:
                    self._clones.note(comp, line, start, end)  # (read whole by the fast path)
        else:
            is_entry, name, line = self._header()
            comp = self._body(name, line, is_entry)
        # attributes after the closing brace: XLA:TPU prints `}, execution_thread="sparsecore"`
        # for a computation run on another execution thread (HloComputation::ToString)
        trailing: dict[str, str] = {}
        if not self.text.startswith(",", _WS.match(self.text, self.pos).end()):
            return comp  # (what attrs() reads without a ',': nothing)
        self.attrs(f"computation '{name}' (after its '}}')", trailing)
        if "execution_thread" in trailing:
            from .attrs import EscapeError, unquote
            try:
                comp.execution_thread = unquote(trailing["execution_thread"])
            except EscapeError as e:
                raise self.error(f"bad escape in execution_thread of computation '{name}': {e} "
                                 "(XLA's lexer unescapes strings as absl::CUnescape does)") from None
        return comp

    def _body(self, name: str, line: int, is_entry: bool) -> Computation:
        """The instructions of computation ``name`` after its '{', through its '}'."""
        instrs: list[Instruction] = []
        by_name: dict[str, Instruction] = {}
        root: Instruction | None = None
        while True:
            self.ws()
            if self.pos >= self.n:
                raise self.error(f"expected '}}' closing computation '{name}' opened at line {line}")
            if self.peek("}"):
                self.pos += 1
                break
            n_before = len(instrs)
            root = self.fast_block(name, instrs, by_name, root)
            if len(instrs) > n_before:
                continue
            instr = self.instruction(name, instrs, by_name)
            if instr.is_root:
                if root is not None:
                    raise self.error(f"second ROOT instruction '{instr.name}' in computation '{name}' "
                                     f"(first: '{root.name}')", self._instr_pos)
                root = instr
        if not instrs:
            raise self.error(f"computation '{name}' has no instructions", self._comp_pos)
        self._taken.add(name)
        if root is None:
            root = instrs[-1]
            root.is_root = True
        return Computation(name, instrs, root, is_entry, line, by_name=by_name)

    def _header(self) -> tuple[bool, str, int]:
        """``[ENTRY] name [(params) -> shape] (, attr)* {`` in any form: (is ENTRY, name, line)."""
        is_entry = False
        if re.match(r"ENTRY\s", self.text[self.pos:self.pos + 6]):
            is_entry = True
            self.pos += 5
        name = self.name("computation name (or 'HloModule', 'ENTRY')")
        line, _ = self.linecol(self._comp_pos)
        self.ws()
        sig = _SIGNATURE.match(self.text, self.pos) if self.peek("(") else None
        if sig is not None:  # the common, well-nested case: what balanced() accepts, faster
            self._check_signature(sig.start(), sig.end(), name)
            self.pos = sig.end()
            self.expect("->", f"after parameter list of computation '{name}'")
            self.shape(f"result of computation '{name}'")
        elif self.peek("("):
            sig_start = self.pos
            self.balanced(f"parameter list of computation '{name}'")
            self._check_signature(sig_start, self.pos, name)
            self.expect("->", f"after parameter list of computation '{name}'")
            self.shape(f"result of computation '{name}'")
        extra: dict[str, str] = {}
        self.attrs(f"computation '{name}'", extra)
        self.expect("{", f"opening the body of computation '{name}'")
        return is_entry, name, line

    def _add(self, instr: Instruction, instrs: list, by_name: dict, pos: int) -> None:
        if instr.name in by_name:
            prev = by_name[instr.name]
            raise self.error(f"duplicate instruction name '{instr.name}' in computation "
                             f"'{instr.computation}' (first defined at line {prev.line})", pos)
        by_name[instr.name] = instr
        instrs.append(instr)

    def fast_block(self, comp: str, instrs: list, by_name: dict,
                   root: Instruction | None) -> Instruction | None:
        """Read consecutive instructions at ``pos`` that are in XLA's one-line form (see
        ``_FAST_LINE``); stop, with ``pos`` at its start, at the first line that is not, or
        that the general code must see (a duplicate name, a second ROOT). Returns the root."""
        text = self.text
        pos = self.pos
        line, col0 = self.linecol(pos)
        line_start = pos - col0 + 1
        match = _FAST_LINE.match
        shapes = self._shape_cache
        intern = sys.intern
        while True:
            m = match(text, pos)
            if m is None:
                break
            is_root, name, shape_text, opcode, optext, literal, atext, indent = m.groups()
            if name[0] == "%":
                name = name[1:]
            if name in by_name or name == "ROOT" or (is_root and root is not None):
                break  # the general code raises the error
            shape = shapes.get(shape_text)
            if shape is None:
                self.pos = m.start(3)
                shape = self.shape(f"instruction '{name}'")
                if self.pos != m.end(3):
                    break
                shapes[shape_text] = shape
            param_no = None
            if opcode == "constant" or opcode == "parameter":
                operands: tuple[str, ...] = ()
                literal = (optext if literal is None else literal).strip()
                if opcode == "parameter":
                    if not is_uint(literal):
                        break
                    param_no = int(literal)
                    literal = None
            elif optext is None:
                break
            else:
                # names hold neither '%' nor blanks: the regex has checked the form
                optext = optext.replace("%", "").replace(" ", "").replace("\t", "")
                operands = tuple(optext.split(",")) if optext else ()
            attrs = None  # split from atext on first use (Instruction.attrs)
            if atext:
                if "mesh[" in atext:
                    break  # read by the general code (mesh axes)
                if "replica_groups" in atext or "source_target_pairs" in atext:
                    # the checks the general parser's attrs() makes (check_attr), on the
                    # value each key keeps, so both paths accept the same lines
                    attrs = dict(_FAST_ATTR.findall(atext))
                    for key in ("replica_groups", "source_target_pairs"):
                        groups = attrs.get(key)
                        if groups is None or groups in self._checked_groups:
                            continue
                        for am in _FAST_ATTR.finditer(atext):
                            if am.group(1) == key and am.group(2) == groups:
                                self.check_attr(key, groups, m.start(7) + am.start(2),
                                                f"instruction '{name}'")
            else:
                atext = None
            instr = Instruction(name, intern(opcode), shape, operands, attrs, literal,
                                is_root is not None, line, m.start(2) - line_start + 1, comp, param_no,
                                atext)
            by_name[name] = instr
            instrs.append(instr)
            if is_root is not None:
                root = instr
            pos = m.end()
            if indent is None:  # end of text
                break
            line += 1
            line_start = m.start(8)
        self.pos = pos
        if self._lc[0] < line_start <= pos:  # only ever advance linecol's cache: moving it back
            self._lc = (line_start, line, line_start)  # re-counts a long line per instruction
        return root

    def instruction(self, comp: str, instrs: list, by_name: dict) -> Instruction:
        self._general += 1
        self._instr_pos = start = self.pos
        is_root = False
        if self.text.startswith("ROOT", self.pos) and self.text[self.pos + 4:self.pos + 5].isspace():
            is_root = True
            self.pos += 4
            self.ws()
        npos = self.pos
        name = self.name(f"instruction name in computation '{comp}'")
        self.expect("=", f"after instruction name '{name}'")
        instr = self.instruction_body(name, comp, instrs, by_name, npos)
        instr.is_root = is_root
        self._add(instr, instrs, by_name, start)
        return instr

    def _shape_follows(self) -> bool:
        return self.peek("(") or _TYPE_AT.match(self.text, self.pos) is not None

    def instruction_body(self, name, comp, instrs, by_name, npos) -> Instruction:
        self.ws()
        shape = self.shape(f"instruction '{name}'") if self._shape_follows() else None
        self.ws()
        opos = self.pos
        m = _OPCODE.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected an opcode for instruction '{name}', found {self.found()}")
        opcode = m.group(0)
        self.pos = m.end()
        self.ws()
        if not self.peek("("):
            raise self.error(f"expected '(' after opcode '{opcode}' of instruction '{name}', "
                             f"found {self.found()}")
        literal = None
        param_no = None
        operands: list[str] = []
        if opcode in ("constant", "parameter"):
            body = self.balanced(f"operands of '{name}'")
            literal = body[1:-1].strip()
            if opcode == "parameter":
                if not is_uint(literal):
                    raise self.error(f"expected a parameter number in parameter(...) of '{name}'", opos)
                param_no = int(literal)
                literal = None
        else:
            self.operands(name, comp, instrs, by_name, operands)
        attrs: dict[str, str] = {}
        self.attrs(f"instruction '{name}'", attrs, owner=name)
        line, col = self.linecol(npos)
        if shape is None:
            shape = self.infer_shape(name, opcode, operands, attrs, by_name, opos)
        return Instruction(name, opcode, shape, tuple(operands), attrs, literal, False, line, col,
                           comp, param_no)

    def operands(self, name, comp, instrs, by_name, out: list[str]) -> None:
        self.pos += 1  # '('
        self.ws()
        if self.peek(")"):
            self.pos += 1
            return
        while True:
            self.ws()
            ostart = self.pos
            if self._shape_follows():
                self.shape(f"an operand of '{name}'")
                self.ws()
            m = _NAME.match(self.text, self.pos)
            if not m:
                raise self.error(f"expected an operand name in operands of '{name}', found {self.found()}")
            after = _WS.match(self.text, m.end()).end()
            if (self.text.startswith("(", after) and not m.group(0).startswith("%")
                    and _OPCODE.fullmatch(m.group(0))):
                # A nested unnamed instruction, e.g. convert(f16[4] multiply(%a, %b)).
                self._anon += 1
                self.pos = ostart
                if self._nest >= MAX_NESTED_OPERAND_DEPTH:
                    raise self.error(f"unnamed instructions nested as operands deeper than "
                                     f"{MAX_NESTED_OPERAND_DEPTH} levels are not supported (in "
                                     f"operands of '{name}'); name them on lines of their own")
                self._nest += 1
                try:
                    sub = self.instruction_body(f"{m.group(0)}.anon{self._anon}", comp, instrs,
                                                by_name, ostart)
                finally:
                    self._nest -= 1
                self._add(sub, instrs, by_name, ostart)
                out.append(sub.name)
            else:
                self.pos = m.end()
                out.append(m.group(1))
            self.ws()
            if self.peek(","):
                self.pos += 1
                continue
            if self.peek(")"):
                self.pos += 1
                return
            raise self.error(f"expected ',' or ')' in operands of '{name}', found {self.found()}")

    def infer_shape(self, name, opcode, operands, attrs, by_name, pos) -> Shape:
        def op(i: int) -> Shape:
            if i >= len(operands) or operands[i] not in by_name:
                raise self.error(f"instruction '{name}' has no shape and its operand {i} is not "
                                 "defined before it, so its shape cannot be inferred", pos)
            return by_name[operands[i]].shape
        if opcode == "tuple":
            shape = Shape("tuple", tuple_shapes=tuple(op(i) for i in range(len(operands))))
            if shape.tuple_depth > MAX_TUPLE_DEPTH:
                raise self.error(f"tuple '{name}' has no shape and its operands' shapes make "
                                 f"one nested {shape.tuple_depth} levels deep; tuple shapes "
                                 f"nested deeper than {MAX_TUPLE_DEPTH} are not supported", pos)
            return shape
        if opcode == "get-tuple-element":
            t = op(0)
            try:
                return t.subshape((ascii_int(attrs.get("index", "x")),))
            except (ValueError, IndexError):
                raise self.error(f"get-tuple-element '{name}': index={attrs.get('index')} is not an "
                                 f"element of {t}", pos) from None
        if opcode in _SAME_SHAPE_AS_OPERAND0 and operands:
            return op(0)
        raise self.error(f"expected a shape before opcode '{opcode}' of instruction '{name}'", pos)

    # ---- validation ----------------------------------------------------------------
    def validate(self, mod: Module) -> None:
        validate_module(mod)

    def check_attr(self, key: str, value: str, pos: int, what: str = "") -> None:
        """Attribute values checked at parse time: ``replica_groups`` must expand (an iota
        list's sizes must multiply out, and span at most ``MAX_DEVICES``); the module
        header's ``replica_count`` / ``num_partitions`` must be integers in [1, MAX_DEVICES];
        when the header gives either, group ids must lie below their product
        (``_check_id_range``). ``what`` names the instruction for messages. Raises
        HloParseError at the value's position."""
        if key in _COUNT_KEYS and self.pos_in_header:
            try:
                n = ascii_int(value)
            except ValueError:
                raise self.error(f"{key}={value}: expected an integer", pos) from None
            if not 1 <= n <= MAX_DEVICES:
                raise self.error(f"{key}={value}: expected a device count in [1, {MAX_DEVICES}] "
                                 f"(jaxmove expands device groups into lists; no system has more "
                                 f"than {MAX_DEVICES} devices)", pos)
            self.header_counts[key] = n
            if prod(self.header_counts.values()) > MAX_DEVICES:
                raise self.error(f"replica_count x num_partitions = "
                                 f"{prod(self.header_counts.values())} devices, more than the "
                                 f"{MAX_DEVICES} jaxmove expands", pos)
            return
        if key in ("replica_groups", "source_target_pairs") and value not in self._checked_groups:
            n = _device_count_bound(value)
            if n > MAX_DEVICES:
                raise self.error(f"{key}={value} spans {n} devices, more than the {MAX_DEVICES} "
                                 "jaxmove expands", pos)
            try:
                groups = parse_replica_groups(value)
            except ReplicaGroupsError as e:
                raise self.error(str(e), pos) from None
            except (ValueError, MemoryError, OverflowError) as e:
                raise self.error(f"{key} {value}: {e}", pos) from None
            if key == "source_target_pairs" and any(len(g) != 2 for g in groups):
                raise self.error(f"source_target_pairs={value}: expected {{source,target}} pairs", pos)
            if self.header_counts:
                self._check_id_range(key, value, groups, pos, what)
            if key == "replica_groups":  # HloVerifier's CheckReplicaGroups: "Replica %d is repeated"
                seen: dict[int, int] = {}
                for k, g in enumerate(groups):
                    for d in g:
                        if d in seen:
                            where = "twice in group" if seen[d] == k else f"in groups {seen[d]} and"
                            raise self.error(f"replica_groups={value}: device {d} appears {where} "
                                             f"{k}; each device belongs to at most one group", pos)
                        seen[d] = k
            self._checked_groups.add(value)

    def _check_id_range(self, key: str, value: str, groups: list[list[int]], pos: int,
                        what: str) -> None:
        """Every id of a ``replica_groups`` / ``source_target_pairs`` list is below
        replica_count x num_partitions, when the module header gives either count (the other
        is then 1). Ids are replica ids (< replica_count) without a channel_id, partition ids
        or global device ids (< replica_count x num_partitions) with one
        (xla/service/collective_ops_utils.cc, GetParticipatingIDs / GetCollectiveOpGroupMode);
        the larger bound holds in every mode, so only an id no mode allows is refused."""
        r = self.header_counts.get("replica_count", 1)
        p = self.header_counts.get("num_partitions", 1)
        top = max((d for g in groups for d in g), default=-1)
        if top >= r * p:
            raise self.error(f"{key}={value}{' of ' + what if what else ''} names device {top}, "
                             f"but the HloModule header has "
                             f"replica_count={r} x num_partitions={p} = {r * p} devices: expected "
                             f"ids in [0, {r * p})", pos)


#: XLA:GPU's buffer colours (xla/service/gpu/gpu_memory_space_assignment.h): 1
#: ``kCollectiveMemorySpaceColor`` (collective buffers in ncclMemAlloc memory, printed S(1)
#: with ``--xla_gpu_enable_nccl_user_buffers``), 2 ``kTempBufferMemorySpaceColor``; both are
#: device HBM. The TPU reading of S(1) / S(2) (VMEM, semaphores: hlo/shape.py) does not apply.
XLA_GPU_HBM_COLORS = frozenset({1, 2})
#: Text only XLA:GPU writes: GpuBackendConfig fields and its kernels' custom-call / fusion kinds.
_XLA_GPU_MARKERS = ('"operation_queue_id"', '"fusion_backend_config"', "__triton", "__cublas$", "__cudnn$")


def is_xla_gpu_text(text: str) -> bool:
    """True for HLO text from XLA:GPU (`_XLA_GPU_MARKERS`: none appears in XLA:TPU or XLA:CPU
    programs); its memory-space colours are then read as HBM (`XLA_GPU_HBM_COLORS`)."""
    return any(m in text for m in _XLA_GPU_MARKERS)


@gc_paused
def parse_module(text: str, filename: str = "<string>") -> Module:
    """Parse HLO text into a :class:`Module`.

    Args:
      text: the text of one HLO module, as XLA prints it.
      filename: used in error messages.
    Raises:
      HloParseError: malformed text; carries filename, line, column and what was expected.
    """
    return _Parser(text, filename).module()


#: Largest HLO file read (bytes): 2 GiB, ~18M instructions of XLA's one-line form (a
#: 100k-instruction module is 11.4 MB), which take ~15 GB of memory to parse
#: (benchmarks/parse_speed.md: 849 MB at 1M). The environment variable
#: ``JAXMOVE_MAX_HLO_BYTES`` raises (or lowers) it.
MAX_HLO_FILE_BYTES = 2 << 30


def max_hlo_file_bytes() -> int:
    """``MAX_HLO_FILE_BYTES``, or ``JAXMOVE_MAX_HLO_BYTES`` when set to an integer."""
    v = os.environ.get("JAXMOVE_MAX_HLO_BYTES", "").strip()
    return int(v) if v.isascii() and v.isdigit() else MAX_HLO_FILE_BYTES


def _open_problem(e: OSError) -> str:
    """Why ``os.open`` refused an HLO path, in words (the text of an ``HloFileError``)."""
    if e.errno == errno.ELOOP:
        return ("cannot be opened: too many levels of symbolic links (a symbolic link that "
                "points, through others, back to itself?)")
    if isinstance(e, PermissionError):
        return "cannot be opened: permission denied (jaxmove needs to read the file)"
    return f"cannot be opened: {e.strerror or e}"


def read_hlo_text(path: str | Path) -> str:
    """The text of an HLO file, decoded as UTF-8 (a leading byte-order mark is dropped).

    Raises:
      FileNotFoundError: the file does not exist.
      HloFileError: the path is not a regular file (a directory, /dev/zero, a FIFO: read
        until memory ran out before), it is larger than ``max_hlo_file_bytes()``, or it cannot
        be opened or read (a symbolic link loop, no permission, an I/O error).
      HloParseError: the bytes are not UTF-8 (names the file, line and column of the first
        bad byte).
    """
    p = Path(path)
    limit = max_hlo_file_bytes()
    # O_NONBLOCK: opening a FIFO with no writer would block; regular files ignore it
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except IsADirectoryError:
        raise HloFileError(str(p), "is a directory, not an HLO text file") from None
    except FileNotFoundError:
        raise
    except OSError as e:  # a symlink loop (ELOOP), no permission, a name too long ...
        raise HloFileError(str(p), _open_problem(e)) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if
                    stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                    or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                    else "not a regular file")
            raise HloFileError(str(p), f"is {kind}, not a regular file: jaxmove reads HLO text "
                               "from regular files only")
        if st.st_size > limit:
            raise HloFileError(str(p), f"is {st.st_size} bytes, more than the {limit} jaxmove "
                               "reads (set JAXMOVE_MAX_HLO_BYTES to raise the limit)")
        try:
            data = f.read(limit + 1)
        except OSError as e:  # EIO, EISDIR from a file system that opens directories ...
            raise HloFileError(str(p), f"cannot be read: {e.strerror or e}") from None
    if len(data) > limit:  # the file grew while being read
        raise HloFileError(str(p), f"is more than the {limit} bytes jaxmove reads (set "
                           "JAXMOVE_MAX_HLO_BYTES to raise the limit)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise HloParseError(str(p), line, col, "expected UTF-8 text (is this an HLO proto or a "
                            "binary file, not HLO text?)") from None
    return text[1:] if text.startswith("\ufeff") else text


def parse_file(path: str | Path) -> Module:
    """Read and parse an HLO text file.

    Raises:
      FileNotFoundError: the file does not exist.
      HloFileError: the path is not a regular file, is too large, or cannot be opened or read.
      HloParseError: the text is malformed, or not UTF-8.
    """
    return parse_module(read_hlo_text(path), str(path))
