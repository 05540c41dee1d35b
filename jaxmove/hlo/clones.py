"""The parser's reading of repeated computations: a computation whose body repeats, up to the
names of its instructions, the text of one read before is built from that one's instructions.

A model's unrolled layers print the same fused computations again and again under other names
(``%fused_computation.18`` and ``.26``, with ``%param_0.18`` / ``%param_0.26``...). For such a
body the parser's fast path would match every line with the same regular expression and read
the same shapes, opcodes, attribute texts and literals, only the names differ. Here the body
text is split at its ``%name`` tokens (one C-level ``re.split``): when the text between the
tokens is the same as in an earlier body that the fast path read whole, every token that names
an instruction of the earlier body maps to one token of this body (and back), and every other
token (a called computation's name) is the same, this body is that one's instructions renamed,
on lines shifted by as many as the header moved: what the fast path would read, and nothing
else is read. Anything else (a body the general parser read in part, a name in an attribute
text, a name without ``%``, an instruction named ``ROOT``) is read line by line as before.

A body is split only when a second body of the same number of lines and ``%`` signs is met,
so a module of unique computations splits none.
"""

from __future__ import annotations

import re
from operator import itemgetter

from .ir import Computation, Instruction

# a '%' and a name (parser.py _NAME's characters, which the fast path's names have too)
_TOKEN = re.compile(r"%([A-Za-z0-9_][A-Za-z0-9_.\-$]*+)")


def _getter(positions: list[int]):
    """itemgetter(*positions), always returning a tuple."""
    if len(positions) > 1:
        return itemgetter(*positions)
    if positions:
        k = positions[0]
        return lambda s: (s[k],)
    return lambda s: ()


class _Template:
    """A body read whole by the fast path, ready to be repeated (module docstring)."""

    __slots__ = ("comp", "line", "names", "unique", "inst_of", "other_of", "others", "root", "rows")

    def __init__(self, comp: Computation, line: int, names: list[str], inst_pos: list[int],
                 other_pos: list[int]):
        self.comp = comp
        self.line = line
        self.names = tuple(names[k] for k in inst_pos)  # instruction-name tokens, in order
        self.unique = len(comp.instructions)
        self.inst_of = _getter(inst_pos)
        self.other_of = _getter(other_pos)
        self.others = self.other_of(names)
        self.root = comp.instructions.index(comp.root)
        # per instruction: where its name and operands are among the instruction-name tokens
        # (its name, then its operands: _template checked the order), and what is repeated
        rows = []
        k = 0
        for i in comp.instructions:
            end = k + 1 + len(i.operands)
            rows.append((k, end, i.opcode, i.shape, i._attrs, i.literal, i.is_root, i.line, i.column,
                         i.parameter_number, i._attr_text))
            k = end
        self.rows = rows


class CloneReader:
    """One parse's templates (module docstring): ``read`` a body as a repeat of one, ``note`` a
    body read line by line as a possible template."""

    def __init__(self, text: str):
        self.text = text
        self.first: dict[tuple[int, int], tuple | None] = {}  # body's (lines, '%'s) -> first one
        self.templates: dict[tuple[str, ...], _Template] = {}  # text between tokens -> template
        self.clones: dict[str, str] = {}  # computation -> the computation it repeats

    def _split(self, start: int, end: int) -> tuple[tuple[str, ...], list[str]]:
        parts = _TOKEN.split(self.text[start:end])
        return tuple(parts[0::2]), parts[1::2]

    def read(self, name: str, line: int, is_entry: bool, start: int):
        """The computation ``name`` (header on ``line``) whose body starts at ``start`` (after
        its '{'), as a repeat of a template: (computation, position after its '}'); or
        (None, the body's end) when it is not one (the end is -1 without a '}' line)."""
        text = self.text
        self._pending = None
        end = text.find("\n}", start)
        if end < 0:
            return None, -1
        key = (text.count("\n", start, end), text.count("%", start, end))
        first = self.first.get(key)
        if first is None:
            return None, end
        if first:  # a second body of this size: the first one is split now
            self.first[key] = ()
            comp0, line0, start0, end0 = first
            self._template(comp0, line0, *self._split(start0, end0))
        segments, names = self._split(start, end)
        t = self.templates.get(segments)
        if t is None or t.other_of(names) != t.others:
            self._pending = (segments, names)
            return None, end
        new = t.inst_of(names)
        pairs = set(zip(t.names, new))
        renamed = set(new)
        if len(pairs) != t.unique or len(renamed) != t.unique or "ROOT" in renamed:
            self._pending = (segments, names)
            return None, end
        shift = line - t.line
        instrs: list[Instruction] = []
        by_name: dict[str, Instruction] = {}
        for k, stop, opcode, shape, attrs, literal, is_root, ln, column, number, attr_text in t.rows:
            n = new[k]  # (the token of its name; its operands' follow it)
            i = Instruction(n, opcode, shape, new[k + 1:stop], None if attrs is None else dict(attrs),
                            literal, is_root, ln + shift, column, name, number, attr_text)
            by_name[n] = i
            instrs.append(i)
        self.clones[name] = t.comp.name
        return Computation(name, instrs, instrs[t.root], is_entry, line, by_name=by_name), end + 2

    _pending: tuple | None = None

    def note(self, comp: Computation, line: int, start: int, end: int) -> None:
        """``comp``, read whole by the fast path from its body ``start:end`` (its '}' at
        ``end + 1``), as a template for the bodies that repeat it."""
        text = self.text
        key = (text.count("\n", start, end), text.count("%", start, end))
        if key not in self.first:
            self.first[key] = (comp, line, start, end)  # (split when a second one comes)
            self._pending = None
            return
        pending, self._pending = self._pending, None
        segments, names = pending if pending is not None else self._split(start, end)
        if segments not in self.templates:
            self._template(comp, line, segments, names)

    def _template(self, comp: Computation, line: int, segments: tuple[str, ...],
                  names: list[str]) -> None:
        by_name = comp.by_name
        inst_pos = [k for k, t in enumerate(names) if t in by_name]
        expected: list[str] = []
        for i in comp.instructions:
            expected.append(i.name)
            expected.extend(i.operands)
        if [names[k] for k in inst_pos] != expected:
            return  # a name without '%', or an instruction's name elsewhere: not repeated
        for i in comp.instructions:  # (then only names and operands are instructions' tokens)
            for t in (i._attr_text, i.literal):
                if t and "%" in t and not by_name.keys().isdisjoint(_TOKEN.findall(t)):
                    return
        other_pos = [k for k, t in enumerate(names) if t not in by_name]
        self.templates.setdefault(segments, _Template(comp, line, names, inst_pos, other_pos))
