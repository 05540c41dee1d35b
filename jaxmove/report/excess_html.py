"""The "Excess movement" section of the HTML report (report/html.py). Computes nothing.

Every program-derived string (instruction names, sources, parameter paths, fixes) is escaped.
"""

from __future__ import annotations

from ..vocab import PATHS, ROLES
from ..units import human_bytes
from .render_helpers import e as _e
from .render_helpers import fmt_s as _fmt_s
from .render_helpers import td_num as _td_num
from .render_helpers import th as _th


def excess_section(report) -> str:
    """``<h2>Excess movement</h2>``: compulsory against compiled bytes per role and path, and a
    sortable table of the causes (bytes, time, instructions with sources, fix); "" when the
    report has no excess analysis."""
    ex = report.excess
    if ex is None:
        return ""
    head = (f"<h2>Excess movement</h2><p>{_e(human_bytes(ex.excess_bytes))} of "
            f"{_e(human_bytes(ex.compiled_bytes))} moved per program run is beyond the compulsory "
            f"{_e(human_bytes(ex.compulsory_bytes))} ({100 * ex.excess_fraction:.1f}%)"
            + (f", about {_e(_fmt_s(ex.excess_time_s))} of memory time on {_e(ex.hardware)}"
               if ex.excess_time_s else "") + ".</p>")
    lines = [_th("role / path"), _th("compulsory", True), _th("compiled", True), _th("excess", True),
             _th("excess %", True)]
    body = []
    for name, line in [(r, ex.by_role[r]) for r in ROLES] + [(p, ex.by_path[p]) for p in PATHS]:
        if not line.compiled_bytes:
            continue
        body.append(f"<tr><td>{_e(name)}</td>"
                    f"{_td_num(line.compulsory_bytes, human_bytes(line.compulsory_bytes))}"
                    f"{_td_num(line.compiled_bytes, human_bytes(line.compiled_bytes))}"
                    f"{_td_num(line.excess_bytes, human_bytes(line.excess_bytes))}"
                    f"{_td_num(line.excess_fraction, f'{100 * line.excess_fraction:.1f}%')}</tr>")
    table = ('<table class="sortable" id="excess_lines"><thead><tr>' + "".join(lines) +
             "</tr></thead><tbody>" + "".join(body) + "</tbody></table>")
    causes = list(ex.causes) + ([ex.unattributed] if ex.unattributed.bytes else [])
    if not causes:
        return head + table + "<p>No excess: the program moves only the compulsory bytes.</p>"
    ch = [_th("cause"), _th("about"), _th("bytes", True), _th("time", True), _th("instructions"),
          _th("fix")]
    rows = []
    for c in causes:
        instrs = "<br>".join(_e(i.name) + (f' <span class="meta">{_e(i.source_label())}</span>'
                                           if i.source else "")
                             for i in c.instructions[:5])
        if c.num_instructions > 5:
            instrs += f"<br>+{c.num_instructions - 5} more"
        rows.append(f"<tr><td>{_e(c.kind)}</td><td class=\"src\">{_e(c.subject) or '-'}</td>"
                    f"{_td_num(c.bytes, human_bytes(c.bytes))}{_td_num(c.time_s, _fmt_s(c.time_s))}"
                    f"<td class=\"name\">{instrs}</td><td>{_e(c.fix)}</td></tr>")
    ctable = ('<table class="sortable" id="excess_causes"><thead><tr>' + "".join(ch) +
              "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in ex.notes)
    return head + table + ctable + notes
