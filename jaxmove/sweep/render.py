"""Renderings of a SweepResult: the ranked terminal table, the Pareto plot, the HTML page.

They compute nothing: ranks, the Pareto front and every figure come from the rows.
Strings from the sweep (model names, plan paths, errors, notes) are escaped: rich markup in
the table, HTML in the page (``report.html``'s escaping, CSS and table script); the plot is
an SVG whose text matplotlib draws as paths.
"""

from __future__ import annotations

import io
import math
import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..units import short_seconds
from ..report.table import human_bytes, make_console
from ..plans.compare import SHARDS_NOTHING

__all__ = ["render_table", "pareto_plot", "render_html", "table_html", "point_label", "fmt_time"]


fmt_time = short_seconds


def _b(n) -> str:
    return "n/a" if n is None else human_bytes(n)


def _excess(r) -> str:
    """A row's excess bytes and their share of the bytes compiled (compulsory + excess), as
    ``jaxmove plans`` shows them; n/a when the point was not analysed."""
    n, c = r.get("excess_bytes"), r.get("compulsory_bytes")
    if n is None:
        return "n/a"
    compiled = n + (c or 0)
    return f"{human_bytes(n)} ({100 * n / compiled if compiled else 0.0:.0f}%)"


def short_model(model: str) -> str:
    """A model as a label shows it: ``/home/me/exp/wl.py:make`` -> ``wl.py:make`` (the file's
    name, not the absolute path the sweep resolved it to); presets and ``module:function`` as
    they are."""
    import os
    path, colon, fn = str(model).rpartition(":")
    if colon and (os.sep in path or "/" in path):
        return f"{os.path.basename(path)}:{fn}"
    return str(model)


def point_label(row: dict) -> str:
    """``mlp-tiny batch=8 data=8 dp`` (+ `` @target`` off cpu) from a row's inputs; a
    ``file.py:function`` model by its file's name (``short_model``)."""
    from pathlib import Path
    parts = [short_model(row["model"]), *(f"{k}={v}" for k, v in (row.get("overrides") or {}).items())]
    if row.get("mesh"):
        plan = row.get("plan") or "dp"
        parts += [row["mesh"], Path(plan).stem if plan.endswith(".toml") else plan]
    if row.get("target") not in (None, "cpu"):
        parts.append(f"@{row['target']}")
    return " ".join(parts)


def _fits_text(row: dict, markup: bool = True) -> str:
    if row["status"] != "ok":
        return ""
    f = row.get("fits")
    if f is None:
        return "?"
    if f:
        return "yes"
    return "[bold red]NO[/bold red]" if markup else "NO"


def _status_text(row: dict) -> str:
    if row["status"] == "ok":
        return ""
    return f"{row['status']}: {row.get('error') or ''}"


def _memory(row: dict) -> str:
    """Memory per device, or what a refusing target compiler said it needs."""
    if row.get("peak_bytes") is None and row.get("needs_bytes") is not None:
        return f"needs {human_bytes(row['needs_bytes'])}"
    return _b(row.get("peak_bytes"))


def _kinds(row: dict) -> str:
    kinds = row.get("wire_bytes_by_kind") or {}
    return ", ".join(f"{k} {human_bytes(v)}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])) or "-"


def render_table(result, top: int | None = None, console: Console | None = None) -> None:
    """The ranked table: one row per point (the first ``top``), then counts and notes."""
    console = console or make_console()
    c = result.counts()
    console.print(f"[bold]sweep {escape(result.name)}[/bold]: {c['points']} points, {c['ok']} analysed "
                  f"({c['fits']} fit, {c['does_not_fit']} do not), {c['error']} failed to compile, "
                  f"{c['died'] + c['timeout']} lost their worker"
                  + (f"; {result.resumed} resumed from {escape(str(result.output))}" if result.output else "")
                  + f"; {result.executor} executor, {result.wall_s:.1f} s")
    has_excess = any(r.get("excess_bytes") is not None for r in result.rows)
    table = Table(title="Ranked: fastest point that fits first (per device, one step)")
    cols = [("#", "right"), ("point", "left"), ("fits", "left"), ("memory", "right"),
            ("step time", "right"), ("bound", "left"), ("HBM bytes", "right"),
            ("wire bytes by kind", "left"), ("compile", "right")]
    if has_excess:
        cols.insert(7, ("excess", "right"))
    for name, just in cols:
        table.add_column(name, justify=just, overflow="fold")
    rows = result.rows if top is None else result.rows[:top]
    for r in rows:
        label = escape(point_label(r)) + (" [green]*[/green]" if r.get("pareto") else "")
        if r["status"] != "ok":
            cells = [str(r["rank"]), label, "", "", "", "", "",
                     f"[red]{escape(_status_text(r))}[/red]", ""]
            if has_excess:
                cells.insert(7, "")
            table.add_row(*cells)
            continue
        cells = [str(r["rank"]), label, _fits_text(r), _memory(r), fmt_time(r.get("est_time_s")),
                 escape(str(r.get("bound") or "n/a")), _b(r.get("hbm_bytes")), escape(_kinds(r)),
                 fmt_time(r.get("compile_s"))]
        if has_excess:
            cells.insert(7, _excess(r))
        table.add_row(*cells)
    console.print(table)
    if top is not None and len(result.rows) > top:
        console.print(f"... {len(result.rows) - top} more points (--top, --json or -o for all)")
    console.print("memory = XLA's arguments + outputs - aliased + temporaries per device, or its own peak "
                  "where larger (on TPU targets its peak); step time = "
                  "jaxmove's estimate on the point's hardware spec; "
                  + ("excess = bytes moved beyond the compulsory minimum on every path (HBM and wire "
                     "bytes, so it can exceed HBM bytes), and its share of the bytes compiled; "
                     if has_excess else "")
                  + "* = on the Pareto front of step time vs memory.")
    for note in result.notes:
        console.print(f"[yellow]note[/yellow] {escape(note)}")
    # the one per-point note a ranking cannot do without (the others: --json, -o, --html): a
    # plan that shards nothing over its mesh ranks a replicated program as if it were sharded
    for r in rows:
        for n in r.get("notes") or ():
            if SHARDS_NOTHING in n:
                console.print(f"[yellow]note[/yellow] {escape(point_label(r))}: {escape(n)}")


def pareto_plot(result, ax=None, path=None):
    """Scatter of estimated step time (y, log) against memory per device (x, log) of every
    analysed point; points that fit in blue, that do not in red, the Pareto front as a line,
    each spec's HBM capacity as a dashed vertical line. Returns the Axes; ``path`` also
    saves the figure (format by extension: .png, .svg, .pdf).

    Raises:
      ImportError: matplotlib is not installed.
    """
    import matplotlib.pyplot as plt

    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(7, 4.5))
    pts = [r for r in result.rows if r["status"] == "ok" and r.get("est_time_s") is not None
           and r.get("peak_bytes") is not None]
    for fits, color, label in ((True, "#3b6fd4", "fits"), (False, "#d14a4a", "does not fit"),
                               (None, "#6b7a8f", "memory unknown")):
        sel = [r for r in pts if r.get("fits") is fits]
        if sel:
            ax.scatter([r["peak_bytes"] for r in sel], [r["est_time_s"] for r in sel], c=color,
                       label=label, s=28, zorder=3)
    front = sorted((r for r in pts if r.get("pareto")), key=lambda r: r["peak_bytes"])
    if front:
        ax.step([r["peak_bytes"] for r in front], [r["est_time_s"] for r in front], where="post",
                color="#3aa17e", lw=1.2, label="Pareto front", zorder=2)
        # labels point inwards so that they stay inside the axes: a point right of the middle
        # of the (log) x range gets its label on its left (the median point would not do: a
        # point below it may still sit near the right edge)
        lo, hi = min(r["peak_bytes"] for r in pts), max(r["peak_bytes"] for r in pts)
        mid = math.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2
        for r in front:
            right = r["peak_bytes"] > mid
            ax.annotate(point_label(r), (r["peak_bytes"], r["est_time_s"]), fontsize=7,
                        xytext=(-5 if right else 5, 5), textcoords="offset points",
                        ha="right" if right else "left")
    for cap in sorted({r["hbm_capacity_bytes"] for r in result.rows if r.get("hbm_capacity_bytes")}):
        if pts and cap <= 10 * max(r["peak_bytes"] for r in pts):
            ax.axvline(cap, color="#c9a227", ls="--", lw=1, label=f"HBM {human_bytes(cap)}")
    if pts:
        from matplotlib.ticker import FuncFormatter, LogLocator
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=2, numticks=8))    # 16 KiB, 32 KiB, ...
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_time(v)))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.margins(x=0.15, y=0.15)
    ax.set_xlabel("memory per device")
    ax.set_ylabel("estimated step time")
    ax.set_title(f"sweep {result.name}: step time vs memory per device")
    if pts:
        ax.legend(fontsize=8)
    if own and path is not None:
        fig.tight_layout()
        from pathlib import Path

        from ..report.outputs import write_atomic
        fmt = Path(path).suffix.lower().lstrip(".") or None   # matplotlib's default without one
        try:  # a temporary file renamed over the path: an error leaves no partial image
            # bbox_inches="tight": the saved image grows to hold every label (none cut at an edge)
            write_atomic(path, lambda f: fig.savefig(f, format=fmt, bbox_inches="tight"), "Pareto plot",
                         binary=True)
        finally:
            plt.close(fig)
    return ax


def _plot_svg(result) -> str | None:
    """The Pareto plot as inline SVG (text drawn as paths), or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "jaxmove"}):
        fig, ax = plt.subplots(figsize=(8, 5))
        pareto_plot(result, ax=ax)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
        plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and doctype
    return re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)


def table_html(result, top: int | None = None) -> str:
    """The ranked table as an escaped, sortable HTML table."""
    from ..report.render_helpers import e as _e

    has_excess = any(r.get("excess_bytes") is not None for r in result.rows)
    heads = [("#", True), ("point", False), ("status", False), ("fits", False), ("memory / device", True),
             ("step time", True), ("bound", False), ("HBM bytes", True), ("wire bytes", True),
             ("wire bytes by kind", False), ("compile", True), ("Pareto", False)]
    if has_excess:
        heads.insert(8, ("excess bytes", True))
    th = "".join(f'<th{" class=n data-type=num" if num else ""}>{_e(h)}</th>' for h, num in heads)

    def num(v, text):
        return f'<td class=n data-v="{_e("" if v is None else v)}">{_e(text)}</td>'

    body = []
    for r in result.rows if top is None else result.rows[:top]:
        cells = [num(r["rank"], r["rank"]), f"<td class=name>{_e(point_label(r))}</td>",
                 f"<td class={'unmodeled' if r['status'] != 'ok' else 'ok'}>{_e(_status_text(r) or 'ok')}</td>",
                 f"<td>{_e(_fits_text(r, markup=False))}</td>",
                 num(r.get("peak_bytes"), _memory(r)),
                 num(r.get("est_time_s"), fmt_time(r.get("est_time_s"))),
                 f"<td>{_e(r.get('bound') or '')}</td>", num(r.get("hbm_bytes"), _b(r.get("hbm_bytes"))),
                 num(r.get("wire_bytes"), _b(r.get("wire_bytes"))), f"<td>{_e(_kinds(r))}</td>",
                 num(r.get("compile_s"), fmt_time(r.get("compile_s"))),
                 f"<td>{'yes' if r.get('pareto') else ''}</td>"]
        if has_excess:
            cells.insert(8, num(r.get("excess_bytes"), _b(r.get("excess_bytes"))))
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table id="instructions" class="sortable"><thead><tr>{th}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def render_html(result) -> str:
    """One self-contained page (inline CSS, script and SVG; no network): the counts, the best
    point, the Pareto plot, the sortable and filterable ranked table, and every point's notes."""
    from ..report.html import _CSS, _JS
    from ..report.render_helpers import e as _e

    c = result.counts()
    best = result.best
    cards = [("points", c["points"]), ("analysed", c["ok"]), ("fit", c["fits"]),
             ("do not fit", c["does_not_fit"]), ("failed", c["error"] + c["died"] + c["timeout"]),
             ("best step time", fmt_time(best["est_time_s"]) if best else "none fits")]
    cards_html = "".join(f"<div class=card><b>{_e(v)}</b><span>{_e(k)}</span></div>" for k, v in cards)
    best_html = (f"<p>Fastest point that fits: <b>{_e(point_label(best))}</b>, "
                 f"{_e(fmt_time(best['est_time_s']))} per step ({_e(best.get('bound'))}-bound), "
                 f"{_e(_b(best.get('peak_bytes')))} per device.</p>") if best else \
        "<p>No point fits the device's memory.</p>"
    svg = _plot_svg(result)
    plot = svg if svg is not None else "<p class=note>The plot needs matplotlib (pip install matplotlib).</p>"
    notes = []
    for r in result.rows:
        for n in r.get("notes") or []:
            notes.append(f"<li><b>{_e(point_label(r))}</b>: {_e(n)}</li>")
    notes_html = (f"<details><summary>Notes ({len(notes)})</summary><ul>{''.join(notes)}</ul></details>"
                  if notes else "")
    sweep_notes = "".join(f"<p class=note>{_e(n)}</p>" for n in result.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>jaxmove sweep {_e(result.name)}</title>
<style>{_CSS}</style></head><body>
<h1>jaxmove sweep {_e(result.name)}</h1>
<div class=meta>{_e(result.path)} &middot; {_e(result.executor)} executor &middot; {result.wall_s:.1f} s
{f"&middot; {_e(result.resumed)} points resumed from {_e(result.output)}" if result.output else ""}</div>
<div class=cards>{cards_html}</div>
{best_html}{sweep_notes}
<h2>Step time vs memory per device</h2>
<div class=chart>{plot}</div>
<h2>Points, ranked (fastest that fits first)</h2>
<input id="filter" placeholder="filter points">
{table_html(result)}
<p class=meta>memory = XLA's arguments + outputs - aliased + temporaries per device; step time = jaxmove's
estimate on the point's hardware spec; excess bytes = bytes moved beyond the compulsory minimum on every
path (HBM and wire bytes); figures per device for one program run.</p>
{notes_html}
<script>{_JS}</script>
</body></html>
"""
