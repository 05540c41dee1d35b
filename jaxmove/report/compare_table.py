"""Rendering of ``jaxmove compare``: estimate vs measurement, per instruction and per program."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .table import make_console


def fmt_s(t: float | None) -> str:
    """Seconds with a unit that keeps 3-4 significant digits ('-' for None)."""
    if t is None:
        return "-"
    a = abs(t)
    if a >= 1:
        return f"{t:.3g} s"
    if a >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    if a >= 1e-6:
        return f"{t * 1e6:.3g} us"
    return f"{t * 1e9:.3g} ns"


def fmt_pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x * 100:+.0f}%" if signed else f"{x * 100:.0f}%"


def fmt_num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def instruction_time_table(title: str, rows, top: int, executions: str) -> Table:
    """The measured-against-estimated table of ``rows`` (CompareRow-like: name, opcode, bound,
    executions, measured_time_s, share, est_time_s, ratio), the ``top`` first; ``title`` may
    hold ``{scope}`` ("all n" or "top k of n"); ``executions`` heads the executions column."""
    scope = f"all {len(rows)}" if top >= len(rows) else f"top {top} of {len(rows)}"
    t = Table(title=title.format(scope=scope))
    for col, just in (("instruction", "left"), ("opcode", "left"), ("bound", "left"), (executions, "right"),
                      ("measured", "right"), ("share", "right"), ("estimate", "right"), ("est/meas", "right")):
        t.add_column(col, justify=just, no_wrap=(col != "instruction"))
    for r in rows[:top]:
        t.add_row(escape(r.name), r.opcode, r.bound or "-",
                  "-" if r.executions is None else f"{r.executions:g}",
                  fmt_s(r.measured_time_s), fmt_pct(r.share), fmt_s(r.est_time_s), fmt_num(r.ratio))
    return t


def excluded_note(console: Console, rows, report) -> None:
    """Say that the estimate is incomplete (``Report.incomplete_headline``) and which measured
    instructions the error statistics leave out, and why (``measure.compare.excluded_rows``)."""
    head = report.incomplete_headline()
    if head:
        console.print(f"[yellow]{escape(head)}[/yellow]")
    out = [r for r in rows if r.excluded and r.measured_time_s]
    if out:
        shown = "; ".join(f"{escape(r.name)}: {escape(r.excluded)}" for r in out[:5])
        more = f"; +{len(out) - 5} more" if len(out) > 5 else ""
        console.print(f"[yellow]not in the error statistics ({len(out)} measured instruction"
                      f"{'s' if len(out) != 1 else ''}): {shown}{more}[/yellow]")


def render_comparison(c, top: int = 20, console: Console | None = None) -> None:
    """Print a Comparison (jaxmove.measure.compare): instruction table, program summary, fit."""
    console = console or make_console()
    m = c.measurement
    s = c.stats
    prof = m.profile
    console.print(f"[bold]{escape(m.program.name)}[/bold]  device={escape(m.device_kind)}  "
                  f"hardware={escape(c.spec.name)} ({escape(c.spec_note)})")
    p25, p75 = m.wall_iqr_s
    console.print(f"wall time per run: median {fmt_s(m.wall_median_s)} (IQR {fmt_s(p25)} - {fmt_s(p75)}, "
                  f"min {fmt_s(m.wall_min_s)}, max {fmt_s(m.wall_max_s)}; {len(m.wall_times_s)} runs "
                  f"after {m.warmup_runs} warm-up)")
    console.print(f"profile: {prof.runs} runs; device time {fmt_s(prof.device_time_s)} per run, "
                  f"joined to instructions {fmt_pct(prof.coverage)}"
                  + (f"; span {fmt_s(prof.span_s)}, busy {fmt_s(prof.busy_s)}" if prof.span_s is not None else ""))
    if prof.unjoined_s:
        parts = ", ".join(f"{escape(k)} {fmt_s(v)}" for k, v in list(prof.unjoined_s.items())[:5])
        console.print(f"[yellow]unjoined events (named after no instruction): {parts}[/yellow]")

    console.print(instruction_time_table("instructions by measured time ({scope})", c.rows, top, "runs/prog"))

    excluded_note(console, c.rows, c.report)
    console.print(f"program: estimated {'at least ' if s.est_is_lower_bound else ''}{fmt_s(s.est_program_s)} "
                  f"vs measured wall {fmt_s(s.measured_wall_s)} "
                  f"({fmt_pct(s.program_error, signed=True)})"
                  + (f"; measured device span {fmt_s(s.measured_span_s)}" if s.measured_span_s is not None else ""))
    console.print(f"instructions: sum of estimates {fmt_s(s.est_sum_s)} vs sum measured {fmt_s(s.measured_sum_s)}; "
                  f"MdAPE {fmt_pct(s.mdape)} over the {s.n_significant} taking >= 1% of the run, "
                  f"time-weighted error {fmt_pct(s.weighted_error)} over {s.n_measured}, "
                  f"Spearman {fmt_num(s.spearman)} over the {s.n_significant} taking >= 1%")
    if c.baseline_s is not None:
        console.print(f"baseline (XLA cost_analysis roofline, same spec): {fmt_s(c.baseline_s)} "
                      f"({fmt_pct(c.baseline_s / s.measured_wall_s - 1, signed=True)} vs wall)")
    if c.fit is not None:
        f = c.fit
        b, a = f.before, f.after
        console.print(f"[bold]fit[/bold] ({f.n_rows} instructions, {f.rounds} rounds): overhead "
                      f"{fmt_s(f.kernel_launch_overhead_s)}/kernel, bandwidth {f.hbm_bytes_per_s / 1e9:.3g} GB/s, "
                      f"peaks x{f.flops_scale:.3g}"
                      + (f"; not determined by these measurements, kept: {', '.join(f.kept)}" if f.kept else ""))
        console.print(f"  before: MdAPE {fmt_pct(b.mdape)}, time-weighted {fmt_pct(b.weighted_error)}, "
                      f"Spearman {fmt_num(b.spearman)}, program {fmt_pct(b.program_error, signed=True)}")
        console.print(f"  after:  MdAPE {fmt_pct(a.mdape)}, time-weighted {fmt_pct(a.weighted_error)}, "
                      f"Spearman {fmt_num(a.spearman)}, program {fmt_pct(a.program_error, signed=True)} "
                      "(in-sample: fitted to these measurements)")
    for note in m.notes:
        console.print(f"[yellow]note: {escape(note)}[/yellow]")
