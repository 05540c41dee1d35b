"""Terminal rendering of ``Report.xla`` beside jaxmove's figures (``jaxmove analyze ... --xla``).

Computes nothing but ratios of figures it is given. Two tables: the program's totals (jaxmove
vs the compiler's ``cost_analysis()`` and the sum of XLA:TPU's per-kernel
``estimated_cycles``), then the kernels that carry ``estimated_cycles``, costliest first, with
jaxmove's estimated time beside XLA's (``capture/xla_figures.py``). What XLA does not give is
said (``n/a`` with the reason in the notes), never filled in.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .table import human_bytes, human_count, human_seconds, make_console


def _ratio(xla: float | None, ours: float | None) -> str:
    if xla is None or not ours:
        return "-"
    return f"{xla / ours:.3g}"


def render_xla(report, top: int = 15, console: Console | None = None) -> None:
    """Print jaxmove's and the compiler's figures of ``report`` side by side."""
    from .attribution import attribute

    console = console or make_console()
    x = report.xla
    p = report.program
    if x is None:
        console.print("no compiler figures in this report")
        return
    where = f" for {escape(p.target)}" if p.target else ""
    clock = f", clock {x.clock_hz / 1e9:.3g} GHz" if x.clock_hz else ""
    console.print(f"[bold]{escape(p.name)}[/bold]: jaxmove beside XLA:{p.backend.upper()}'s own "
                  f"model{where}{clock} (per device, one program run)")
    t = report.totals
    times = report.times
    ours_time = times.est_time_s if times is not None else None
    keyed = [(key, fig) for key, fig in x.rows.items()]
    ours_rows = None
    if times is not None and keyed:
        its = [times.rows.get(key) for key, _ in keyed]
        ours_rows = sum(it.est_time_s for it in its) if all(it is not None for it in its) else None
    tot = Table(title="Program totals")
    for col in ("figure", "jaxmove", "XLA", "XLA / jaxmove", "XLA's source"):
        tot.add_column(col, justify="left" if col in ("figure", "XLA's source") else "right")
    tot.add_row("flops", human_count(t.flops),
                human_count(x.flops) if x.flops is not None else "n/a", _ratio(x.flops, t.flops),
                "cost_analysis() flops")
    tot.add_row("HBM bytes (read + written)", human_bytes(t.hbm_bytes),
                human_bytes(x.bytes_accessed) if x.bytes_accessed is not None else "n/a",
                _ratio(x.bytes_accessed, t.hbm_bytes), "cost_analysis() bytes accessed")
    tot.add_row("time", human_seconds(ours_time),
                human_seconds(x.optimal_seconds) if x.optimal_seconds is not None else "n/a",
                _ratio(x.optimal_seconds, ours_time), "cost_analysis() optimal_seconds")
    if x.estimated_instructions:
        xla_sum = human_seconds(x.estimated_s) if x.estimated_s is not None else (
            f"{x.estimated_cycles:,} cycles")
        tot.add_row(f"time of the {x.estimated_instructions} kernels XLA estimated",
                    human_seconds(ours_rows), xla_sum, _ratio(x.estimated_s, ours_rows),
                    "sum of estimated_cycles x executions / clock")
    console.print(tot)
    if times is None:
        console.print("(pass --hardware NAME or --target for jaxmove's times)")

    if keyed:
        def xla_key(item):
            key, fig = item
            return fig.estimated_cycles * fig.executions
        keyed.sort(key=xla_key, reverse=True)
        shown = keyed[:top]
        table = Table(title=f"{'All' if len(keyed) <= top else f'Top {top} of'} {len(keyed)} kernels "
                            "with XLA's estimated_cycles (per program run)")
        num = {"justify": "right", "no_wrap": True}
        for col, kw in (("instruction", {"overflow": "fold"}), ("op / fusion", {"no_wrap": True}),
                        ("x", num), ("jaxmove est.", num), ("bound", {"no_wrap": True}),
                        ("XLA cycles", num), ("XLA est.", num), ("XLA / jaxmove", num),
                        ("source", {"overflow": "fold", "min_width": 16})):
            table.add_column(col, **kw)
        instrs = {(r.computation, r.instr.name): r for r in report.rows}
        for key, fig in shown:
            r = instrs.get(key)
            instr = r.instr if r is not None else None
            kind = "?" if instr is None else (instr.opcode if instr.opcode != "fusion"
                                              else f"fusion:{instr.fusion_kind or '?'}")
            tm = times.rows.get(key) if times is not None else None
            ours = tm.est_time_s if tm is not None else None
            att = attribute(report.module, instr) if instr is not None else None
            table.add_row(escape(key[1]), kind, str(fig.executions), human_seconds(ours),
                          (tm.bound or "-") if tm is not None else "-",
                          f"{fig.estimated_cycles * fig.executions:,}",
                          human_seconds(fig.estimated_s) if fig.estimated_s is not None else "n/a",
                          _ratio(fig.estimated_s, ours),
                          escape(att.source_label) if att is not None and att.source else "")
        console.print(table)
    for n in x.notes:
        console.print(f"[yellow]note:[/yellow] {escape(n)}")
    if x.clock_source:
        console.print(f"[dim]clock: {escape(x.clock_source)}[/dim]")
