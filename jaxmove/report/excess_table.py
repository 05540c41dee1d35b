"""Terminal rendering of ``Report.excess`` (``jaxmove analyze ... --excess``). Computes nothing.

Two tables: per role (and per path) the compulsory bytes, the compiled bytes and the excess
share; then the causes ranked by time (by bytes without a hardware spec), each with the
instructions responsible, their source lines and the change that would remove it.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..vocab import PATHS, ROLES
from .table import human_bytes, make_console

#: Instructions shown per cause in the table (the JSON lists up to passes.excess.MAX_LISTED).
SHOWN_INSTRUCTIONS = 3


def _time(t: float | None) -> str:
    if t is None:
        return "n/a"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def _pct(line) -> str:
    return f"{100 * line.excess_fraction:.1f}%" if line.compiled_bytes else "-"


def render_excess(report, console: Console | None = None) -> None:
    """Print the excess tables of ``report`` (a Report whose ``excess`` is set)."""
    console = console or make_console()
    ex = report.excess
    if ex is None:
        console.print("no excess analysis in this report")
        return
    hw = f" on {escape(ex.hardware)}" if ex.hardware else ""
    console.print(f"[bold]Excess movement[/bold]{hw}: {human_bytes(ex.excess_bytes)} of "
                  f"{human_bytes(ex.compiled_bytes)} moved per program run is beyond the compulsory "
                  f"{human_bytes(ex.compulsory_bytes)} ({100 * ex.excess_fraction:.1f}%)"
                  + (f", about {_time(ex.excess_time_s)} of memory time" if ex.excess_time_s else ""))
    t = Table(title="Compulsory and compiled traffic (HBM bytes by role, all bytes by path)")
    for col in ("role / path", "compulsory", "compiled", "excess", "excess %"):
        t.add_column(col, justify="left" if col == "role / path" else "right")
    for r in ROLES:
        line = ex.by_role[r]
        if line.compiled_bytes:
            t.add_row(r, human_bytes(line.compulsory_bytes), human_bytes(line.compiled_bytes),
                      human_bytes(line.excess_bytes), _pct(line))
    for p in PATHS:
        line = ex.by_path[p]
        if line.compiled_bytes:
            t.add_row(f"[dim]{p}[/dim]", human_bytes(line.compulsory_bytes),
                      human_bytes(line.compiled_bytes), human_bytes(line.excess_bytes), _pct(line))
    console.print(t)
    causes = list(ex.causes) + ([ex.unattributed] if ex.unattributed.bytes else [])
    if not causes:
        console.print("no excess: the program moves only the compulsory bytes")
    else:
        c_t = Table(title=f"Causes, ranked by {'time' if ex.hardware else 'bytes'} (per program run)")
        for col, kw in (("cause", {"no_wrap": True}), ("about", {"overflow": "fold"}),
                        ("bytes", {"justify": "right", "no_wrap": True}),
                        ("time", {"justify": "right", "no_wrap": True}),
                        ("instructions (source)", {"overflow": "fold"}), ("fix", {"overflow": "fold"})):
            c_t.add_column(col, **kw)
        for c in causes:
            shown = []
            for i in c.instructions[:SHOWN_INSTRUCTIONS]:
                shown.append(f"{i.name} @{i.source_label(basename=True)}" if i.source else i.name)
            more = c.num_instructions - len(shown)
            if more > 0:
                shown.append(f"+{more} more")
            c_t.add_row(c.kind, escape(c.subject) or "-", human_bytes(c.bytes), _time(c.time_s),
                        escape("\n".join(shown)), escape(c.fix))
        console.print(c_t)
    for n in ex.notes:
        console.print(f"[yellow]note[/yellow] {escape(n)}")
