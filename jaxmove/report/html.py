"""A self-contained HTML report: one file, inline CSS, JS and SVG charts, no network access.

``render_html(report)`` returns the page; ``jaxmove analyze TARGET --html FILE`` writes it.
The page holds the program summary, bar charts (bytes by path, HBM bytes by role, by source
line, by opcode; estimated time by bound when the report has times), a sortable and
filterable table of every instruction (click a column header; ``#sort=TABLE:COL:asc|desc``
in the URL sorts on load), aggregation tables by source, module, opcode, fusion kind and
role (and by module with repeated layers merged), the unmodeled instructions and the notes.
When the report is incomplete (anything unmodeled) or the arguments exceed the spec's
memory, the page says so first.

Layout: each row shows the result shape and the operand shapes (``f32[1,768] ← f32[768,1],
f32[768,768]``); instruction names never wrap (the table scrolls sideways instead); paths and
name stacks wrap only after a ``/``; chart labels are whole (the label column is as wide as
the longest label; the chart scales to its column), source paths are shown relative to the
package root or the current directory (``≈`` marks a line inferred from neighbours), and
``(no source)`` / ``(no op_name)`` are drawn last, in grey.

HLO text is untrusted input: every string taken from the program (instruction and
computation names, op_name, source paths, notes) goes through ``html.escape`` and is never
placed inside the script. Figures are totals over one program run.
"""

from __future__ import annotations

from datetime import datetime, timezone

from ..passes.cost import PATHS
from ..vocab import ROLES
from .attribution import BY_KEYS, NO_OP_NAME, NO_SOURCE, aggregate, attribute, report_rows
from .columns import row_collective, row_measured_s, row_time, times_of
from .columns import dominant_role
from .render_helpers import e as _e
from .render_helpers import fmt_s as _fmt_s
from .render_helpers import td_num as _td_num
from .render_helpers import th as _th
from .shapes import operand_shapes, shape_text
from .table import human_bytes, human_count, human_flops

#: At most this many instruction rows are written (the costliest by HBM bytes).
MAX_ROWS = 5000

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em;color:#1d2330;max-width:1600px}
h1{font-size:1.4em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #dde}
.meta{color:#556;font-size:.9em} .cards{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.card{background:#f4f6fb;border-radius:6px;padding:.6em 1em;min-width:9em}
.card b{display:block;font-size:1.25em} .card span{color:#556;font-size:.85em}
.charts{display:flex;flex-wrap:wrap;gap:1.5em} .chart{flex:1 1 460px}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{padding:.25em .6em;border-bottom:1px solid #e6e8ef;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.sortable th{cursor:pointer;background:#f4f6fb;position:sticky;top:0;user-select:none}
table.sortable th.asc:after{content:" \\25B2"} table.sortable th.desc:after{content:" \\25BC"}
td.name{font-family:ui-monospace,Menlo,Consolas,monospace;white-space:nowrap}
td.src,td.op,td.shape{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em;color:#445;max-width:30em}
td.shape{white-space:nowrap} td.shape .ops{white-space:normal;color:#6b7a8f;font-size:.9em;min-width:14em}
td.shape span{white-space:nowrap}
.inferred{font-style:italic;color:#6b7a8f}
.scroll{overflow-x:auto;max-width:100%}
.chart svg{max-width:100%;height:auto}
.incomplete{background:#fdecea;color:#b3261e;border-left:4px solid #b3261e;padding:.5em .8em;font-weight:600}
.unmodeled{color:#b3261e} .note{color:#7a5b00} #filter{margin:.4em 0;padding:.3em;width:24em}
details{margin:.4em 0} summary{cursor:pointer;font-weight:600}
"""

# The only script on the page. It reads the DOM only; no program string is ever placed in it.
_JS = r"""
(function(){
  function cellValue(row, i, num){
    var c = row.cells[i]; if (!c) return num ? -Infinity : "";
    var v = c.hasAttribute("data-v") ? c.getAttribute("data-v") : c.textContent;
    if (num){ var f = parseFloat(v); return isNaN(f) ? -Infinity : f; }
    return v.toLowerCase();
  }
  function sortTable(table, i, dir){
    var th = table.tHead.rows[0].cells[i]; if (!th) return;
    var num = th.getAttribute("data-type") === "num";
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function(h){ h.classList.remove("asc","desc"); });
    th.classList.add(dir);
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function(a, b){
      var x = cellValue(a, i, num), y = cellValue(b, i, num);
      var c = num ? (x < y ? -1 : x > y ? 1 : 0) : x.localeCompare(y);
      return dir === "asc" ? c : -c;
    });
    rows.forEach(function(r){ body.appendChild(r); });
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function(table){
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function(th, i){
      th.addEventListener("click", function(){
        sortTable(table, i, th.classList.contains("desc") ? "asc" : "desc");
      });
    });
  });
  var filter = document.getElementById("filter");
  if (filter) filter.addEventListener("input", function(){
    var q = filter.value.toLowerCase();
    Array.prototype.forEach.call(document.getElementById("instructions").tBodies[0].rows, function(r){
      r.style.display = r.textContent.toLowerCase().indexOf(q) >= 0 ? "" : "none";
    });
  });
  var m = /#sort=([A-Za-z0-9_-]+):(\d+):(asc|desc)/.exec(window.location.hash);
  if (m){ var t = document.getElementById(m[1]); if (t) sortTable(t, parseInt(m[2], 10), m[3]); }
  document.body.setAttribute("data-ready", "1");
})();
"""

_PALETTE = ("#3b6fd4", "#e07b39", "#3aa17e", "#b84fb0", "#c9a227", "#6b7a8f", "#d14a4a", "#4fb0c9")


#: Width of one character of the charts' monospace labels at 12 px: 0.6 em (7.2 px, the
#: advance of DejaVu Sans Mono, Menlo, Consolas) plus a margin for wider fallback faces.
_LABEL_CHAR_PX = 7.4


def bar_chart(title: str, items: list[tuple[str, list[float]]], fmt=human_bytes,
              legend: tuple[str, ...] = (), width: int = 560, muted: frozenset[str] = frozenset(),
              titles: dict[str, str] | None = None) -> str:
    """An inline SVG horizontal bar chart.

    Args:
      items: (label, [segment values]) per bar; segments are stacked left to right.
      fmt: formats a bar's total for its value label.
      legend: one name per segment (shown when more than one).
      width: width of the plot area plus labels when the labels are short; the label
        column widens to the longest label (never cut), and the page scales the chart
        down to its column.
      muted: labels drawn in grey (``(no source)``: not a place in the program).
      titles: label -> tooltip text (e.g. the full path of a shortened source label).
    Labels are escaped; the chart has no script.
    """
    bar_h, gap, value_w = 18, 6, 90
    longest = max((len(label) for label, _ in items), default=0)
    label_w = max(120, int(longest * _LABEL_CHAR_PX) + 16)
    plot_w = max(width - 230 - value_w, 240)
    width = label_w + plot_w + value_w
    top = 24 + (18 if len(legend) > 1 else 0)
    height = top + len(items) * (bar_h + gap) + 6
    vmax = max((sum(v) for _, v in items), default=0) or 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-size="12" font-family="system-ui,sans-serif">',
           f'<title>{_e(title)}</title><text x="0" y="14" font-weight="600">{_e(title)}</text>']
    if len(legend) > 1:
        x = label_w
        for k, name in enumerate(legend):
            out.append(f'<rect x="{x}" y="24" width="10" height="10" fill="{_PALETTE[k % len(_PALETTE)]}"/>'
                       f'<text x="{x + 14}" y="33">{_e(name)}</text>')
            x += 14 + 8 * len(name) + 12
    titles = titles or {}
    for j, (label, values) in enumerate(items):
        y = top + j * (bar_h + gap)
        grey = label in muted
        out.append(f'<text class="label" x="{label_w - 6}" y="{y + 13}" text-anchor="end" '
                   f'font-family="ui-monospace,Menlo,Consolas,monospace"'
                   f'{" fill=" + chr(34) + "#8a93a3" + chr(34) if grey else ""}>'
                   f'<title>{_e(titles.get(label, label))}</title>{_e(label)}</text>')
        x = float(label_w)
        for k, v in enumerate(values):
            w = plot_w * v / vmax
            if w > 0:
                fill = "#c4c9d4" if grey else _PALETTE[k % len(_PALETTE)]
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{fill}"/>')
            x += w
        out.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{_e(fmt(sum(values)))}</text>')
    out.append("</svg>")
    return "".join(out)



def _breakable(text: str) -> str:
    """Escaped ``text`` with a line-break opportunity after every ``/`` (paths and name
    stacks wrap between components, never inside one)."""
    return "/<wbr>".join(_e(part) for part in text.split("/"))



def _incomplete(report) -> str:
    headline = report.incomplete_headline()
    out = f'<p class="incomplete" id="incomplete">{_e(headline)}</p>' if headline else ""
    for n in report.notes:   # api.does_not_fit_note
        if n.startswith("does not fit:"):
            out += f'<p class="incomplete">{_e(n)}</p>'
    return out


def _cards(report) -> str:
    t = report.totals
    cards = [(human_bytes(t.hbm_read_bytes), "HBM read"), (human_bytes(t.hbm_write_bytes), "HBM written"),
             (human_flops(t.flops), "flops"),
             (str(len(report_rows(report))), "instructions")]
    for role in ("weights", "kv_cache"):
        rd, wr = t.role_bytes(role)
        if rd or wr:
            cards.append((human_bytes(rd + wr), f"{role} bytes"))
    if t.device_to_device_bytes:
        cards.append((human_bytes(t.device_to_device_bytes), "device_to_device"))
    times = times_of(report)
    if times is not None:
        est, lower = times.est_time_s, not report.complete
        cards.append((("\u2265 " if lower else "") + _fmt_s(est),
                      "estimated time (at least)" if lower else "estimated time"))
    return '<div class="cards">' + "".join(
        f'<div class="card"><b>{_e(v)}</b><span>{_e(k)}</span></div>' for v, k in cards) + "</div>"


def _program_line(report) -> str:
    p = report.program
    times = times_of(report)
    hw = f" &middot; hardware {_e(times.spec_name)}" if times is not None else ""
    return (f'<p class="meta">backend {_e(p.backend)} &middot; {_e(p.num_devices)} device(s) &middot; '
            f'source {_e(p.source)}{hw} &middot; figures are totals over one program run</p>')


def _instruction_table(report, rows) -> str:
    has_times = times_of(report) is not None
    has_coll = any(row_collective(r) is not None for r in rows)
    has_meas = any(row_measured_s(report, r) is not None for r in rows)
    xla = report.xla
    has_xla = xla is not None and any(xla.row(r.computation, r.instr.name) is not None for r in rows)
    head = [_th("#", True), _th("instruction"), _th("computation"), _th("op / fusion"),
            _th("shape \u2190 operand shapes"), _th("x", True),
            _th("flops", True), _th("HBM read", True), _th("HBM written", True),
            _th("flops/byte", True), _th("role")]
    if has_times:
        head += [_th("est. time", True), _th("bound")]
    if has_coll:
        head += [_th("collective"), _th("wire bytes", True)]
    if has_meas:
        head += [_th("measured", True)]
    if has_xla:  # XLA:TPU's estimated_cycles per program run (capture/xla_figures.py)
        head += [_th("XLA est.", True)]
    head += [_th("source"), _th("op_name")]
    body = []
    for k, r in enumerate(rows, 1):
        t = r.total
        att = attribute(report.module, r.instr)
        kind = r.instr.opcode if r.instr.opcode != "fusion" else f"fusion:{r.instr.fusion_kind or '?'}"
        name_cls = "name unmodeled" if r.unmodeled else "name"
        title = f' title="{_e("unmodeled: " + "; ".join(r.unmodeled))}"' if r.unmodeled else ""
        ops = operand_shapes(report.module, r.computation, r.instr)
        ops_html = ", ".join(f"<span>{_e(o)}</span>" for o in ops[:4]) + (
            f", \u2026 +{len(ops) - 4}" if len(ops) > 4 else "")
        shape_cell = (f'<td class="shape" title="{_e(shape_text(r.instr.shape))} \u2190 {_e("; ".join(ops))}">'
                      f'{_e(shape_text(r.instr.shape))}'
                      + (f'<div class="ops">\u2190 {ops_html}</div>' if ops else "") + "</td>")
        # flops per HBM byte: the JSON's arithmetic_intensity (the time model's, over its modeled
        # bytes with tiling re-reads, when the report has times; else over the HBM bytes)
        tm0 = row_time(report, r) if has_times else None
        ai = (tm0.arithmetic_intensity if tm0 is not None
              else t.flops / t.hbm_bytes if t.hbm_bytes else None)
        cells = [_td_num(k), f'<td class="{name_cls}"{title}>{_e(r.instr.name)}</td>',
                 f'<td class="name">{_e(r.computation)}</td>', f"<td>{_e(kind)}</td>", shape_cell,
                 _td_num(r.multiplicity.count,
                         f"{r.multiplicity.count}{'?' if r.multiplicity.unknown_trip_count else ''}"),
                 _td_num(t.flops, human_count(t.flops)),
                 _td_num(t.hbm_read_bytes, human_bytes(t.hbm_read_bytes)),
                 _td_num(t.hbm_write_bytes, human_bytes(t.hbm_write_bytes)),
                 _td_num(ai, f"{ai:.3g}" if ai is not None else ""),
                 f"<td>{_e(dominant_role(t))}</td>"]
        if has_times:
            tm = tm0
            est = tm.est_time_s if tm is not None else None
            cells += [_td_num(est, _fmt_s(est)), f"<td>{_e((tm.bound or '') if tm is not None else '')}</td>"]
        if has_coll:
            c = row_collective(r)
            wb = c.wire_bytes * r.multiplicity.count if c is not None else None
            label = "" if c is None else f"{c.kind} (n={c.group_size})"
            cells += [f"<td>{_e(label)}</td>", _td_num(wb, human_bytes(wb) if wb is not None else "")]
        if has_meas:
            ms = row_measured_s(report, r)
            cells += [_td_num(ms, _fmt_s(ms))]
        if has_xla:
            fig = xla.row(r.computation, r.instr.name)
            if fig is None:
                cells += [_td_num(None, "")]
            elif fig.estimated_s is not None:
                cells += [_td_num(fig.estimated_s, _fmt_s(fig.estimated_s))]
            else:  # no clock in the spec: cycles only
                cyc = fig.estimated_cycles * fig.executions
                cells += [_td_num(cyc, f"{cyc:,} cycles")]
        if att.source_inferred:
            src_title = (f"inferred from {att.source_inferred_from} (XLA dropped this instruction's "
                         f"metadata): {att.source_key}")
        else:
            src_title = " <- ".join(f"{s.file}:{s.line}" for s in att.stack)
        cells += [f'<td class="src{" inferred" if att.source_inferred else ""}" title="{_e(src_title)}">'
                  f'{_breakable(att.source_label) if att.source else ""}</td>',
                  f'<td class="op">{_breakable(att.op_name)}</td>']
        body.append("<tr>" + "".join(cells) + "</tr>")
    return ('<div class="scroll"><table class="sortable" id="instructions"><thead><tr>' + "".join(head) +
            "</tr></thead><tbody>" + "\n".join(body) + "</tbody></table></div>")


def _group_table(report, by: str, rollup: bool = False) -> str:
    groups = aggregate(report, by, rollup=rollup)
    has_time = any(g.est_time_s is not None for g in groups)
    head = [_th(by), _th("instructions", True), _th("inferred", True), _th("flops", True), _th("HBM read", True),
            _th("HBM written", True)] + ([_th("est. time (sum)", True)] if has_time else []) + \
        [_th("costliest instructions")]
    body = []
    for g in groups:
        cells = [f'<td class="src" title="{_e(g.key)}">{_breakable(g.shown)}</td>', _td_num(g.instructions),
                 _td_num(g.inferred),
                 _td_num(g.flops, human_count(g.flops) if g.flops is not None else "n/a"),
                 _td_num(g.total.hbm_read_bytes, human_bytes(g.total.hbm_read_bytes)),
                 _td_num(g.total.hbm_write_bytes, human_bytes(g.total.hbm_write_bytes))]
        if has_time:
            cells.append(_td_num(g.est_time_s, _fmt_s(g.est_time_s)))
        names = ", ".join(g.names[:3]) + (" \u2026" if len(g.names) > 3 else "")
        cells.append(f'<td class="name">{_e(names)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    tid = f"by_{by}" + ("_rollup" if rollup else "")
    return (f'<div class="scroll"><table class="sortable" id="{_e(tid)}"><thead><tr>' + "".join(head) +
            "</tr></thead><tbody>" + "\n".join(body) + "</tbody></table></div>")


def _charts(report) -> str:
    t = report.totals
    charts = [bar_chart("Bytes by path", [(p, [t.path_bytes(p)]) for p in PATHS]),
              bar_chart("HBM bytes by tensor role", [(r, list(t.role_bytes(r))) for r in ROLES],
                        legend=("read", "written"))]
    for by, title in (("source", "HBM bytes by source line (top 12; \u2248 = some inferred)"),
                      ("opcode", "HBM bytes by opcode"),
                      ("module", "HBM bytes by module path, repeated layers merged (top 12)")):
        groups = aggregate(report, by, rollup=by == "module")
        # a group without a place in the program is no bar to compare: drawn last, in grey
        placeless = [g for g in groups if g.key in (NO_SOURCE, NO_OP_NAME)]
        groups = [g for g in groups if g not in placeless][:12] + placeless
        charts.append(bar_chart(title, [(("\u2248 " if g.inferred else "") + g.shown,
                                          [g.total.hbm_read_bytes, g.total.hbm_write_bytes])
                                         for g in groups], legend=("read", "written"),
                                muted=frozenset({NO_SOURCE, NO_OP_NAME}),
                                titles={("\u2248 " if g.inferred else "") + g.shown:
                                        g.key + (f" ({g.inferred} of {g.instructions} instructions "
                                                 "inferred from neighbours)" if g.inferred else "")
                                        for g in groups}))
    times = times_of(report)
    if times is not None:
        by_bound: dict[str, float] = {}
        for r in report_rows(report):
            tm = row_time(report, r)
            if tm is not None:
                b = tm.bound or "?"
                by_bound[b] = by_bound.get(b, 0.0) + tm.est_time_s
        if by_bound:
            charts.append(bar_chart("Estimated time by bound (sum over instructions)",
                                    sorted(((b, [v]) for b, v in by_bound.items()), key=lambda x: -x[1][0]),
                                    fmt=_fmt_s))
    return '<div class="charts">' + "".join(f'<div class="chart">{c}</div>' for c in charts) + "</div>"


def _notes(report) -> str:
    parts = []
    if report.unmodeled:
        parts.append(f'<h2>Unmodeled ({len(report.unmodeled)})</h2><p>Figures for these instructions are '
                     "incomplete; they are listed, never given a made-up number.</p><ul>")
        for r in report.unmodeled:
            parts.append(f'<li class="unmodeled"><code>{_e(r.instr.name)}</code> ({_e(r.instr.opcode)}): '
                         f'{_e("; ".join(r.unmodeled))}</li>')
        parts.append("</ul>")
    else:
        parts.append("<h2>Unmodeled</h2><p>none</p>")
    if report.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f'<li class="note">{_e(n)}</li>' for n in report.notes)
                     + "</ul>")
    return "".join(parts)


def render_html(report, title: str | None = None) -> str:
    """The whole report as one self-contained HTML page (a str).

    Args:
      report: a Report (time, collective and measured columns appear when present).
      title: page title; defaults to the program name.
    Returns:
      HTML text with inline CSS, JS and SVG; it loads nothing from the network.
    """
    rows = sorted(report_rows(report), key=lambda r: (r.total.hbm_bytes, r.total.flops), reverse=True)
    shown = rows[:MAX_ROWS]
    more = (f"<p>Showing the {MAX_ROWS} instructions that move the most bytes of {len(rows)}.</p>"
            if len(rows) > MAX_ROWS else "")
    title = title or f"jaxmove: {report.program.name}"
    groups = "".join(f"<details{' open' if by == 'source' else ''}><summary>by {_e(by)}</summary>"
                     f"{_group_table(report, by)}</details>" for by in BY_KEYS)
    groups += ("<details><summary>by module, repeated layers merged (layers_*/attn)</summary>"
               f"{_group_table(report, 'module', rollup=True)}</details>")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    from .excess_html import excess_section
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>{_incomplete(report)}{_program_line(report)}{_cards(report)}"
        f"<h2>Breakdown</h2>{_charts(report)}{excess_section(report)}"
        f"<h2>Instructions</h2><p>Click a column header to sort. {len(rows)} kernel-level "
        f"instructions.</p><input id=\"filter\" type=\"search\" placeholder=\"filter rows\u2026\">{more}"
        f"{_instruction_table(report, shown)}"
        f"<h2>Aggregated</h2>{groups}{_notes(report)}"
        f"<p class=\"meta\">generated by jaxmove on {_e(stamp)}</p>"
        f"<script>{_JS}</script></body></html>\n")


def write_html(report, path) -> None:
    """Write ``render_html(report)`` to ``path`` (UTF-8; a temporary file renamed over it).

    Raises:
      jaxmove.report.outputs.OutputPathError: ``path`` cannot be written.
    """
    from .outputs import write_text_atomic
    write_text_atomic(path, render_html(report), "--html file")


def summary_html(report, top: int = 10) -> str:
    """A compact, script-free HTML summary (for Jupyter's ``_repr_html_``)."""
    t = report.totals
    rows = report.top(top)
    trs = []
    for r in rows:
        kind = r.instr.opcode if r.instr.opcode != "fusion" else f"fusion:{r.instr.fusion_kind or '?'}"
        att = attribute(report.module, r.instr)
        tm = row_time(report, r)
        est = tm.est_time_s if tm is not None else None
        trs.append(f"<tr><td>{_e(r.instr.name)}</td><td>{_e(kind)}</td><td>{_e(shape_text(r.instr.shape))}</td>"
                   f'<td style="text-align:right">{_e(r.multiplicity.count)}</td>'
                   f'<td style="text-align:right">{_e(human_count(r.total.flops))}</td>'
                   f'<td style="text-align:right">{_e(human_bytes(r.total.hbm_read_bytes))}</td>'
                   f'<td style="text-align:right">{_e(human_bytes(r.total.hbm_write_bytes))}</td>'
                   f"<td>{_e(dominant_role(r.total))}</td>"
                   + (f'<td style="text-align:right">{_e(_fmt_s(est))}</td>' if times_of(report) is not None else "")
                   + f"<td>{_e(att.source_label if att.source else '')}</td></tr>")
    time_head = "<th>est. time</th>" if times_of(report) is not None else ""
    paths = "".join(f"<tr><td>{_e(p)}</td><td style=\"text-align:right\">{_e(human_bytes(t.path_bytes(p)))}"
                    f"</td></tr>" for p in PATHS)
    roles = "".join(f"<tr><td>{_e(r)}</td><td style=\"text-align:right\">{_e(human_bytes(t.role_bytes(r)[0]))}"
                    f"</td><td style=\"text-align:right\">{_e(human_bytes(t.role_bytes(r)[1]))}</td></tr>"
                    for r in ROLES)
    times = times_of(report)
    est_txt = f", estimated {_fmt_s(times.est_time_s)}" if times is not None else ""
    p = report.program
    headline = report.incomplete_headline()
    head_html = f'<b style="color:#b3261e">{_e(headline)}</b><br>' if headline else ""
    return (f"<div>{head_html}<b>{_e(p.name)}</b> <small>backend={_e(p.backend)} devices={_e(p.num_devices)} "
            f"source={_e(p.source)}</small><br>HBM read {_e(human_bytes(t.hbm_read_bytes))}, written "
            f"{_e(human_bytes(t.hbm_write_bytes))}, {_e(human_flops(t.flops))}{_e(est_txt)} per program run; "
            f"{len(report.unmodeled)} unmodeled"
            f"<div style=\"display:flex;gap:2em\"><table><tr><th>path</th><th>bytes</th></tr>{paths}</table>"
            f"<table><tr><th>role</th><th>read</th><th>written</th></tr>{roles}</table></div>"
            f"<table><tr><th>instruction</th><th>op</th><th>shape</th><th>x</th><th>flops</th><th>read</th><th>written</th>"
            f"<th>role</th>{time_head}<th>source</th></tr>{''.join(trs)}</table></div>")
