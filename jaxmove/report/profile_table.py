"""Rendering of ``jaxmove compare --profile``: a capture's kernel times against the estimates."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .compare_table import excluded_note, fmt_num, fmt_pct, fmt_s, instruction_time_table
from .table import make_console


def _group_table(title: str, groups, top: int) -> Table:
    t = Table(title=title)
    for col, just in (("group", "left"), ("n", "right"), ("measured", "right"), ("estimate", "right"),
                      ("median err", "right"), ("p90 err", "right"), ("weighted err", "right")):
        t.add_column(col, justify=just, no_wrap=True)
    for g in groups[:top]:
        t.add_row(escape(g.key), str(g.n), fmt_s(g.measured_s), fmt_s(g.est_s), fmt_pct(g.median_error),
                  fmt_pct(g.p90_error), fmt_pct(g.weighted_error))
    return t


def render_profile_comparison(c, top: int = 20, console: Console | None = None) -> None:
    """Print a ProfileComparison (jaxmove.measure.profile_compare)."""
    console = console or make_console()
    cap, p, j, s = c.capture, c.program, c.join, c.stats
    console.print(f"[bold]{escape(p.label)}[/bold]  capture={escape(cap.format)} {escape(cap.path)}")
    console.print(f"device={escape(cap.device_kind or '?')} ({escape(p.device)}"
                  + (f", 1 of {p.n_devices} that ran it" if p.n_devices > 1 else "") + ")  "
                  f"hardware={escape(c.spec.name)} ({escape(c.spec_note)})")
    console.print(f"HLO: {escape(c.hlo_source)}")
    console.print(f"executions in the capture: {j.runs}; device time {fmt_s(j.device_time_s)} per execution, "
                  f"joined to instructions {fmt_pct(j.coverage)}")
    if j.unjoined_s:
        parts = ", ".join(f"{escape(k)} {fmt_s(v)}" for k, v in list(j.unjoined_s.items())[:5])
        console.print(f"[yellow]not joined (events naming no instruction of the HLO): {parts}[/yellow]")
    if cap.outside_s:
        top_out = sorted(cap.outside_s.items(), key=lambda kv: -kv[1])[:3]
        console.print("device time outside any program (whole capture): "
                      + ", ".join(f"{escape(k)} {fmt_s(v)}" for k, v in top_out))
    for n in c.notes + cap.notes:
        console.print(f"[yellow]note: {escape(n)}[/yellow]")

    what = "kernel duration" if c.est_field == "duration_s" else "est_time_s"
    console.print(instruction_time_table(
        "instructions by measured time per execution ({scope}); estimate = " + what, c.rows, top, "kernels/exec"))
    console.print(_group_table("per-instruction error by opcode", c.by_opcode, top))
    if any(g.key != "-" for g in c.by_fusion_kind):
        console.print(_group_table("per-instruction error by fusion kind", c.by_fusion_kind, top))
    console.print(_group_table("per-instruction error by bound", c.by_bound, top))

    o = c.overall
    excluded_note(console, c.rows, c.report)
    console.print(f"program: estimated {'at least ' if s.est_is_lower_bound else ''}{fmt_s(s.est_program_s)} "
                  f"vs measured device span {fmt_s(s.measured_wall_s)} "
                  f"({fmt_pct(s.program_error, signed=True)}) per execution")
    console.print(f"instructions: sum of estimates ({what}) {fmt_s(s.est_sum_s)} vs sum measured "
                  f"{fmt_s(s.measured_sum_s)}; per-instruction error median {fmt_pct(o.median_error if o else None)}, "
                  f"p90 {fmt_pct(o.p90_error if o else None)} over {o.n if o else 0}; MdAPE {fmt_pct(s.mdape)} over "
                  f"the {s.n_significant} taking >= 1%, time-weighted error {fmt_pct(s.weighted_error)}, "
                  f"Spearman {fmt_num(s.spearman)} over the same {s.n_significant}")
