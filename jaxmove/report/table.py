"""Terminal rendering of a Report (rich tables). Computes nothing; formats what it is given."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..units import human_bytes  # noqa: F401  (re-exported)
from ..passes.cost import PATHS
from ..vocab import ROLES
from .columns import dominant_role
from .render_helpers import make_console  # noqa: F401  (re-exported: the renderers' console)

if TYPE_CHECKING:
    from .report import Report



def human_count(n: float) -> str:
    """12_300_000 -> '12.3 M' (SI units, for flops)."""
    for scale, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)}"


def human_flops(n: float) -> str:
    """12_300_000 -> '12.3 MFLOP', 0 -> '0 FLOP' (never '0FLOP')."""
    c = human_count(n)
    return f"{c}FLOP" if c[-1].isalpha() else f"{c} FLOP"




def render_report(report: Report, top: int = 15, console: Console | None = None) -> None:
    from .attribution import attribute
    from .shapes import operand_shapes, shape_text, short_shapes

    console = console or make_console()
    p = report.program
    t = report.totals
    headline = report.incomplete_headline()
    if headline:
        console.print(f"[bold red]{escape(headline)}[/bold red]")
    for n in report.notes:   # api.does_not_fit_note: said first, and again with the notes
        if n.startswith("does not fit:"):
            console.print(f"[bold yellow]{escape(n)}[/bold yellow]")
    console.print(f"[bold]{escape(p.name)}[/bold]  backend={p.backend}  devices={p.num_devices}  "
                  f"source={escape(p.source)}")
    console.print(f"HBM read {human_bytes(t.hbm_read_bytes)}, written {human_bytes(t.hbm_write_bytes)}, "
                  f"{human_flops(t.flops)} per program run "
                  f"({len(report.listed_rows())} instructions = JSON `instructions`; parameters, "
                  "constants, tuples, bitcasts not counted)")
    render_time_summary(report, console)

    times = report.times
    ordered = top_by_time(report, top) if times is not None else report.top(top)
    listed = len(report.listed_rows())
    scope = f"All {listed}" if top >= listed else f"Top {top} of {listed}"
    table = Table(title=f"{scope} instructions by {'estimated time' if times is not None else 'HBM bytes'} "
                        "(totals over one program run)")
    num = {"justify": "right", "no_wrap": True}
    for col, kw in (("instruction", {"overflow": "fold"}), ("op / fusion", {"no_wrap": True}),
                    ("shape ← operands", {"overflow": "fold", "min_width": 18}),
                    ("x", num), ("flops", num), ("read", num), ("written", num),
                    ("role", {"no_wrap": True}), ("source", {"overflow": "fold", "min_width": 24})):
        table.add_column(col, **kw)
    if times is not None:
        for col in ("est. time", "bound", "flop/B", "on-chip reuse"):
            table.add_column(col, **num)
    inferred = False
    for r in ordered:
        att = attribute(report.module, r.instr)
        inferred = inferred or att.source_inferred
        kind = r.instr.opcode if r.instr.opcode != "fusion" else f"fusion:{r.instr.fusion_kind or '?'}"
        mult = f"{r.multiplicity.count}{'?' if r.multiplicity.unknown_trip_count else ''}"
        name = escape(r.instr.name) + (" [red](unmodeled)[/red]" if r.unmodeled else "")
        ops = short_shapes(operand_shapes(report.module, r.computation, r.instr))
        shapes = shape_text(r.instr.shape) + (f"\n← {ops}" if ops else "")
        cells = [name, kind, escape(shapes), mult, human_count(r.total.flops),
                 human_bytes(r.total.hbm_read_bytes), human_bytes(r.total.hbm_write_bytes),
                 dominant_role(r.total),
                 escape(att.source_label.replace("≈ ", "≈\u00a0")) if att.source else ""]
        if times is not None:
            cells += time_cells(report, r)
        table.add_row(*cells)
    if inferred:
        table.caption = ("source '≈ file:line': inferred from the nearest instructions using (else "
                         "feeding) it; XLA dropped its own metadata")
    console.print(table)

    paths = Table(title="Bytes by path")
    paths.add_column("path")
    paths.add_column("bytes", justify="right")
    for path in PATHS:
        paths.add_row(path, human_bytes(t.path_bytes(path)))
    roles = Table(title="HBM bytes by tensor role")
    for col in ("role", "read", "written"):
        roles.add_column(col, justify="right" if col != "role" else "left")
    for role in ROLES:
        rd, wr = t.role_bytes(role)
        roles.add_row(role, human_bytes(rd), human_bytes(wr))
    console.print(paths)
    console.print(roles)
    render_collectives(report, console)

    if report.unmodeled:
        console.print(f"[bold red]Unmodeled ({len(report.unmodeled)}):[/bold red] figures for these are "
                      "incomplete, so the totals above are lower bounds")
        for r in report.unmodeled[:20]:
            console.print(f"  {escape(r.instr.name)} ({r.instr.opcode}): {escape('; '.join(r.unmodeled))}")
    else:
        console.print("Unmodeled: none")
    notes = list(report.notes)
    for n in notes:
        console.print(f"[yellow]note:[/yellow] {escape(n)}")


def render_groups(report: Report, by: str, top: int = 40, console: Console | None = None,
                  rollup: bool = False) -> None:
    """``jaxmove analyze --by BY``: instructions aggregated by source line, module path,
    opcode, fusion kind or role (report/attribution.py), largest HBM bytes first;
    ``rollup`` merges repeated layers of module paths (``layers_*/attn``)."""
    from .attribution import aggregate

    console = console or make_console()
    headline = report.incomplete_headline()
    if headline:
        console.print(f"[bold red]{escape(headline)}[/bold red]")
    groups = aggregate(report, by, rollup=rollup)
    has_time = any(g.est_time_s is not None for g in groups)
    has_inferred = any(g.inferred for g in groups)
    rolled = rollup and by == "module"
    table = Table(title=f"HBM bytes and flops by {by}{' (repeated layers merged)' if rolled else ''} "
                        "(totals over one program run)")
    for col in (by, "instructions") + (("inferred",) if has_inferred else ()) + (("paths",) if rolled else ()) \
            + ("flops", "read", "written") + (("est. time (sum)",) if has_time else ()) \
            + ("costliest instructions",):
        table.add_column(col, justify="left" if col in (by, "costliest instructions") else "right",
                         overflow="fold")
    for g in groups[:top]:
        cells = [g.shown, str(g.instructions)] + ([str(g.inferred)] if has_inferred else []) \
            + ([str(g.merged)] if rolled else []) \
            + [human_count(g.flops) if g.flops is not None else "n/a",
               human_bytes(g.total.hbm_read_bytes), human_bytes(g.total.hbm_write_bytes)]
        if has_time:
            cells.append(f"{g.est_time_s * 1e6:.3g} µs" if g.est_time_s is not None else "")
        cells.append(", ".join(g.names[:3]) + (" …" if len(g.names) > 3 else ""))
        table.add_row(*[escape(c) for c in cells])  # program strings are not markup
    if has_inferred:
        table.caption = (f"inferred: instructions without their own {'source line' if by == 'source' else 'op_name'}"
                         " (XLA dropped it), grouped by their nearest neighbours'")
    console.print(table)
    if len(groups) > top:
        console.print(f"({len(groups) - top} more groups; --json lists them all)")
    from .attribution import uncounted_computations
    skipped = uncounted_computations(report.analysis)
    if skipped:
        branches = report.analysis.branches
        (cname, cond), taken = next(iter(branches.items()))
        left = [b for b in report.module.computations[cname].by_name[cond].called_computations
                if b != taken]
        console.print(f"[yellow]note[/yellow] the groups leave out the conditional branches the totals "
                      f"do not count (they count each conditional's costliest branch: '{escape(cond)}' "
                      f"counts '{escape(taken)}', not {', '.join(repr(escape(b)) for b in left)})")


# ---- estimated time (passes/timing.py, passes/reuse.py) -----------------------------------

def human_seconds(s: float | None) -> str:
    """2.5e-05 -> '25 µs'; None -> 'n/a'."""
    if s is None:
        return "n/a"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns" if s else "0"


def top_by_time(report: Report, n: int) -> list:
    """The n rows with the largest estimated time per program run (ties: HBM bytes)."""
    times = report.times
    rows = [r for r in report.top(len(report.rows))
            if (r.computation, r.instr.name) in times.rows]
    rows.sort(key=lambda r: (times.rows[(r.computation, r.instr.name)].est_time_s, r.total.hbm_bytes),
              reverse=True)
    return rows[:n]


def time_cells(report: Report, r) -> list[str]:
    """est. time, bound, arithmetic intensity and on-chip reuse cells of one row."""
    key = (r.computation, r.instr.name)
    tm = report.times.rows.get(key)
    ru = report.reuse.rows.get(key) if report.reuse is not None else None
    reuse = ru.onchip_reuse_bytes * r.multiplicity.count if ru is not None and ru.fusion is not None else None
    if tm is None:
        return ["", "", "", human_bytes(reuse) if reuse is not None else ""]
    ai = tm.arithmetic_intensity
    est = human_seconds(tm.est_time_s) + (" [red]*[/red]" if tm.unmodeled else "")
    return [est, tm.bound or "-", f"{ai:.3g}" if ai is not None else "-",
            human_bytes(reuse) if reuse is not None else ""]


def render_time_summary(report: Report, console: Console) -> None:
    """Program time on the hardware spec and the bytes fusion kept on chip."""
    times, reuse = report.times, report.reuse
    if times is None:
        if reuse is not None and reuse.total_onchip_reuse_bytes:
            console.print(f"On-chip reuse by fusion: {human_bytes(reuse.total_onchip_reuse_bytes)} not moved "
                          "through HBM (pass --hardware NAME for time estimates)")
        return
    t = times
    lower = "at least " if not report.complete else ""
    from ..hardware.overrides import user_overrides
    shown = user_overrides(t.spec) if t.spec is not None else []
    over = f" [--spec {', '.join(shown)}]" if shown else ""   # (the numbers are not the built-in's)
    console.print(f"[bold]Estimated time on {escape(t.spec_name + over)}: {lower}{human_seconds(t.est_time_s)}[/bold] per program run, "
                  f"{t.bound}-bound (the largest of the sums: compute {human_seconds(t.compute_time_s)}, memory "
                  f"{human_seconds(t.memory_time_s)}, network {human_seconds(t.network_time_s)}, launch overhead "
                  f"{human_seconds(t.overhead_s)} for {t.kernels} kernels; the kernels' own times "
                  f"one after another, without overlap: {human_seconds(t.serial_time_s)})")
    if reuse is not None:
        console.print(f"On-chip reuse by fusion: {human_bytes(reuse.total_onchip_reuse_bytes)} not moved through HBM"
                      + (f"; on-chip capacity {human_bytes(reuse.onchip_capacity_bytes)} ({reuse.onchip_capacity_key})"
                         if reuse.onchip_capacity_bytes else ""))
    if t.unmodeled:
        console.print(f"[red]*[/red] time incomplete for {len(t.unmodeled)} instruction(s), e.g. "
                      f"{escape(str(t.unmodeled[0]))}", soft_wrap=True)
    for n in t.notes:
        console.print(f"[yellow]note:[/yellow] {escape(n)}")


def render_collectives(report: Report, console: Console, top: int = 10) -> None:
    """The collectives that put the most bytes on the wire (per device, one program run)."""
    from .attribution import attribute

    rows = [r for r in report.rows if r.collective is not None]
    if not rows:
        return
    rows.sort(key=lambda r: r.total.device_to_device_bytes, reverse=True)
    table = Table(title=f"Collectives ({len(rows)}), bytes each device sends per program run")
    for col in ("instruction", "kind", "group", "groups", "x", "buffer", "wire", "source"):
        table.add_column(col, justify="right" if col in ("group", "groups", "x", "buffer", "wire") else "left")
    for r in rows[:top]:
        c = r.collective
        att = attribute(report.module, r.instr)
        table.add_row(escape(r.instr.name), c.kind + (" (async)" if c.is_async else ""), str(c.group_size),
                      str(c.num_groups), str(r.multiplicity.count), human_bytes(c.buffer_bytes),
                      human_bytes(r.total.device_to_device_bytes),
                      escape(att.source_label) if att.source else "")
    console.print(table)
