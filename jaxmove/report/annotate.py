"""Annotated HLO: the optimized program text with every kernel-level instruction's figures as a
``//`` comment (README "Annotated programs"): the figures of the JSON ``instructions`` entry,
per program run. A multi-line instruction, or one sharing its line, gets a ``// %name: ...``
line before it. HLO's lexer treats ``//`` comments as whitespace (xla/hlo/parser/hlo_lexer.cc),
so the text still parses to the same instructions; program strings are written as JSON
strings, so a newline in them cannot end the comment.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..passes.cost import PATHS
from ..passes.pipeline import InstructionCost
from .attribution import attribute, display_path
from .columns import QUIET_OPCODES, row_collective, row_reuse, row_time
from .columns import dominant_role
from .shapes import operand_shapes, shape_text

_COMMENT_ONLY = re.compile(r"^\s*(//.*)?$")


#: annotate's own header line, and the comments it adds (a line before an instruction, the end
#: of an instruction's line): replaced when annotate reads text it wrote
_HEADER_START = "// jaxmove annotate"
_OLD_LINE = re.compile(r"\s*// %[^\s:]+(?: \(the unnamed [^)]*\))?: x=\d+")
_OLD_TAIL = re.compile(r"  // x=\d+\??(?: .*)?$")
#: the parser's name of an unnamed instruction written inline as an operand (hlo/parser.py)
_ANON = re.compile(r"[a-z][a-z0-9-]*\.anon\d+")

def _q(s: str) -> str:
    """A program-derived string as a JSON string literal (quotes, control characters escaped)."""
    return json.dumps(s, ensure_ascii=True)


def _num(x: float) -> str:
    """Exact (round-trip) text of a float, so the comment equals the JSON figure."""
    return repr(float(x))


def row_annotation(report, row: InstructionCost) -> str:
    """The comment text (without ``//``) for one row: ``key=value`` pairs separated by spaces."""
    t = row.total
    if row.instr.opcode in QUIET_OPCODES:
        return f"x={row.multiplicity.count} (moves nothing)"
    mult = f"{row.multiplicity.count}{'?' if row.multiplicity.unknown_trip_count else ''}"
    parts = [f"x={mult}", f"flops={t.flops}", f"hbm_read_bytes={t.hbm_read_bytes}",
             f"hbm_write_bytes={t.hbm_write_bytes}", f"role={dominant_role(t)}"]
    if t.transcendentals:
        parts.insert(2, f"transcendentals={t.transcendentals}")
    paths = [f"{p}:{t.path_bytes(p)}" for p in PATHS if t.path_bytes(p)]
    if paths:
        parts.append("paths=" + ",".join(paths))
    if t.onchip_read_bytes or t.onchip_write_bytes:
        parts.append(f"onchip_read_bytes={t.onchip_read_bytes} onchip_write_bytes={t.onchip_write_bytes}")
    tm = row_time(report, row)
    if tm is not None:
        parts.append(f"est_time_s={_num(tm.est_time_s)}")
        if tm.bound:
            parts.append(f"bound={tm.bound}")
        if tm.arithmetic_intensity is not None:
            parts.append(f"intensity={_num(tm.arithmetic_intensity)}")
        if tm.hbm_bytes != t.hbm_bytes:
            parts.append(f"modeled_hbm_bytes={tm.hbm_bytes}")
    mult_n = row.multiplicity.count
    reuse = row_reuse(report, row)
    if reuse is not None and reuse.onchip_reuse_bytes:
        parts.append(f"onchip_reuse_bytes={reuse.onchip_reuse_bytes * mult_n}")
    coll = row_collective(row)
    if coll is not None:
        parts.append(f"collective={coll.kind}")
        parts.append(f"group={coll.group_size}")
        parts.append(f"wire_bytes={coll.wire_bytes * mult_n}")
        if coll.is_async:
            parts.append("async")
    if row.unmodeled:
        parts.append("unmodeled=" + _q("; ".join(row.unmodeled)))
    parts.append("shape=" + _q(shape_text(row.instr.shape)))
    if row.instr.operands:
        parts.append("operand_shapes=" + _q("; ".join(operand_shapes(report.module, row.computation,
                                                                      row.instr))))
    att = attribute(report.module, row.instr)
    if att.source is not None:
        parts.append("src=" + _q(f"{display_path(att.source.file)}:{att.source.line}"))  # as the tables
        if att.source_inferred:
            parts.append("src_inferred_from=" + _q(att.source_inferred_from))
    if att.op_name:
        parts.append("op_name=" + _q(att.op_name))
    return " ".join(parts)


def _line_kinds(lines: list[str]) -> list[bool]:
    """Per line: True when it is blank or holds only a ``//`` comment."""
    return [bool(_COMMENT_ONLY.match(ln)) for ln in lines]


def annotate(report, hlo_text: str | None = None) -> str:
    """The program's HLO text with each kernel-level instruction's figures as a comment.

    Args:
      report: a Report whose module was parsed from ``hlo_text``.
      hlo_text: the optimized HLO text (``Program.hlo_text``). None reads the file named by
        an ``hlo:PATH`` program source.
    Returns:
      The annotated text (ends with a newline). It parses, with ``jaxmove.hlo.parse_module``,
      to the same instructions as ``hlo_text``.
    Raises:
      ValueError: no text was given and the report was not read from an HLO file, or the
        text does not match the report's module (an instruction's line holds another name).
    """
    if hlo_text is None:
        src = report.program.source
        if not src.startswith("hlo:"):
            from ..errors import UsageError
            raise UsageError("annotate needs the program's HLO text (Program.hlo_text) for a "
                             f"program captured from '{src}'")
        hlo_text = Path(src[4:]).read_text()
    lines = hlo_text.split("\n")
    blank = _line_kinds(lines)
    module = report.module
    rows = {(r.computation, r.instr.name): r for r in report.rows}

    after: dict[int, list[str]] = {}    # 0-based line -> comments appended at its end
    before: dict[int, list[str]] = {}   # 0-based line -> comment lines inserted before it
    starts: dict[int, int] = {}
    for instr in module.instructions():
        starts[instr.line - 1] = starts.get(instr.line - 1, 0) + 1

    for comp in module.computations.values():
        instrs = comp.instructions
        for k, instr in enumerate(instrs):
            row = rows.get((comp.name, instr.name))
            if row is None:
                continue
            i = instr.line - 1
            # an unnamed instruction written inline as an operand (``convert(f32[4] negate(p))``)
            # has the parser's name ``negate.anon1`` (hlo/parser.py), on the line it starts on
            anon = (i < len(lines) and instr.name not in lines[i]
                    and _ANON.fullmatch(instr.name) is not None
                    and instr.name.rsplit(".anon", 1)[0] == instr.opcode
                    and f"{instr.opcode}(" in lines[i])
            if not anon and (i >= len(lines) or f"{instr.name}" not in lines[i]):
                raise ValueError(f"line {instr.line} of the HLO text does not hold instruction "
                                 f"'{instr.name}': the text is not the one the report was parsed from")
            text = row_annotation(report, row)
            # Does the instruction end on its own line? Its successor (next instruction, or
            # the computation's closing brace) must follow after only blank/comment lines.
            nxt = instrs[k + 1].line - 1 if k + 1 < len(instrs) else None
            j = i + 1
            while j < len(lines) and (nxt is None or j < nxt) and blank[j]:
                j += 1
            if nxt is not None:
                single = j == nxt
            else:
                single = j >= len(lines) or lines[j].lstrip().startswith("}")
            if anon:
                indent = re.match(r"\s*", lines[i]).group(0)
                before.setdefault(i, []).append(
                    f"{indent}// %{instr.name} (the unnamed {instr.opcode} written inline on the next line): {text}")
            elif single and starts.get(i, 0) == 1:
                after.setdefault(i, []).append(text)
            else:
                indent = re.match(r"\s*", lines[i]).group(0)
                before.setdefault(i, []).append(f"{indent}// %{instr.name}: {text}")

    # text annotate wrote before (its header first): its comments are replaced, not stacked
    old_header = next((k + 1 for k, ln in enumerate(lines[:4]) if ln.startswith(_HEADER_START)), 0)
    if old_header and not all(ln.startswith("//") for ln in lines[:old_header]):
        old_header = 0
    out: list[str] = []
    for i, ln in enumerate(lines):
        if old_header:
            if i < old_header or _OLD_LINE.match(ln):
                continue
            ln = _OLD_TAIL.sub("", ln)
        out.extend(before.get(i, ()))
        if i in after:
            ln = f"{ln}  // {' '.join(after[i])}"
        out.append(ln)
    header = (f"{_HEADER_START}: figures are totals over one program run (per execution x "
              "multiplicity x=); bytes in bytes; role = the tensor role with the most HBM bytes; "
              "shape / operand_shapes without layout (operands separated by '; '); "
              "src_inferred_from = the instruction whose source line was taken (XLA dropped this one's)")
    headline = report.incomplete_headline()
    if headline:
        header = f"// {headline}\n{header}"
    fit = next((n for n in report.notes if n.startswith("does not fit:")), None)
    if fit:  # the first line, as the tables' headline (cli/common.py fit_status exits 2 after it)
        from .render_helpers import one_line
        header = f"// {one_line(fit)}\n{header}"
    text = header + "\n" + "\n".join(out)
    return text if text.endswith("\n") else text + "\n"
