"""Terminal rendering of a PlanComparison (rich). Computes nothing; formats what it is given."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..units import short_seconds
from .table import human_bytes, make_console


_time = short_seconds


def _b(n: int | None) -> str:
    return "n/a" if n is None else human_bytes(n)


def _excess(r) -> str:
    """Excess bytes (passes/excess.py) and their share of the bytes moved, or n/a."""
    n, f = r.excess_bytes, r.excess_fraction
    return "n/a" if n is None else f"{human_bytes(n)} ({100 * (f or 0.0):.0f}%)"


def _step(r) -> str:
    """Estimated step time (passes/timing.py), its bound, and its summed components:
    compute / memory / network / launch (a lower bound marked '>=')."""
    if r.step_time_s is None:
        return "n/a"
    low = "" if r.step_time_complete is not False else ">="
    parts = " / ".join(_time(x) for x in (r.step_compute_s, r.step_memory_s, r.step_network_s, r.step_launch_s))
    return f"[bold]{low}{_time(r.step_time_s)}[/bold] {r.step_bound or ''}\n{parts}"


def _label(r) -> str:
    """The plan's name, and the file it came from when it is no preset (``tp.toml`` and the
    ``tp`` preset are told apart)."""
    from pathlib import Path
    source = getattr(r, "plan_source", "preset")
    return escape(r.plan) if source == "preset" else f"{escape(r.plan)} [dim]({escape(Path(source).name)})[/dim]"


def render_plans(cmp, console: Console | None = None) -> None:
    """One row per plan: per-device memory, HBM bytes, wire bytes by kind, collective time,
    the three costliest collectives; then each plan's notes and errors."""
    console = console or make_console()
    mesh = ",".join(f"{k}={v}" for k, v in cmp.mesh.items())
    n = 1
    for v in cmp.mesh.values():
        n *= v
    sets = " ".join(f"--set {k}={v}" for k, v in cmp.overrides.items())
    target = cmp.target or "cpu"
    where = "simulated CPU devices" if target == "cpu" else f"devices of {target}"
    console.print(f"[bold]{escape(cmp.model)}[/bold] {sets}  mesh {mesh} ({n} {where})  "
                  f"hardware [bold]{cmp.hardware}[/bold] (HBM {human_bytes(cmp.hbm_capacity_bytes)} "
                  f"per device, the spec's hbm_capacity_bytes; collective time on its links)")
    if any(r.does_not_fit for r in cmp.results):  # the compiler's own figure differs: say whose
        console.print("fits NO (needs X, has Y): the target compiler refused the plan; X and Y are "
                      "its figures (XLA:TPU's usable device memory, not the spec's)")
    if any(r.fits is False and not r.does_not_fit and not r.error for r in cmp.results):
        console.print("fits NO (needs X, has Y) of a plan that compiled: X is its peak per device "
                      "(memory_analysis: arguments + outputs - aliased + temporaries), Y the spec's "
                      "hbm_capacity_bytes")
    table = Table(title="Sharding plans, per device, one program run, fastest estimated step first")
    for col, just in (("plan", "left"), ("step time", "right"), ("args", "right"), ("temp", "right"),
                      ("peak", "right"), ("fits", "left"), ("HBM bytes", "right"), ("excess", "right"), ("wire bytes by kind", "left"),
                      ("coll. time", "right"), ("costliest collectives", "left")):
        table.add_column(col, justify=just, no_wrap=col in ("plan", "costliest collectives"))
    for r in cmp.results:
        if r.error:
            table.add_row(_label(r), "", "", "", "", "", "", "", f"[red]failed: {escape(str(r.error))}[/red]",
                          "", "")
            continue
        needs = r.needs_bytes if r.needs_bytes is not None else r.peak_bytes
        has = r.has_bytes if r.has_bytes is not None else cmp.hbm_capacity_bytes
        fits = ("?" if r.fits is None else "yes" if r.fits else
                f"[bold red]NO[/bold red] (needs {_b(needs)}, has {_b(has)})" if needs is not None else
                f"[bold red]NO[/bold red] (> {human_bytes(cmp.hbm_capacity_bytes)})")
        kinds = "\n".join(f"{k} {human_bytes(v)}" for k, v in
                          sorted(r.wire_bytes_by_kind.items(), key=lambda kv: -kv[1])) or "none"
        if len(r.wire_bytes_by_kind) > 1:
            kinds += f"\n[bold]total {human_bytes(r.wire_bytes)}[/bold]"
        top = "\n".join(
            f"{c.kind} n={c.group_size} x{c.executions} {human_bytes(c.wire_bytes)} {_time(c.time_s)}"
            + (f" @{c.source.rsplit('/', 1)[-1]}" if c.source else f" {c.name}")
            for c in r.top_collectives) or "-"
        table.add_row(_label(r), _step(r), _b(r.argument_bytes), _b(r.temp_bytes), _b(r.peak_bytes), fits,
                      human_bytes(r.hbm_bytes), _excess(r), kinds, _time(r.collective_time_s), top)
    console.print(table)
    compiler = "XLA:CPU" if target == "cpu" else "XLA:TPU" if target.startswith("tpu") else "XLA:GPU"
    peak = ("XLA:TPU's own peak_memory_in_bytes of the partitioned program (its buffer assignment's HBM peak)"
            if compiler == "XLA:TPU" else
            f"XLA's arguments + outputs - aliased + temporaries of the partitioned program ({compiler} "
            "buffer assignment), or its own peak_memory_in_bytes where larger")
    console.print(f"peak = {peak}; step time = the estimated time of one run on "
                  f"{cmp.hardware} along the schedule (async collectives overlap), below it the summed "
                  "compute / memory / network / launch time of its kernels; coll. time sums the "
                  "collectives without overlap.")
    for note in cmp.notes:
        console.print(f"[yellow]note[/yellow]: {escape(note)}")
    for r in cmp.results:
        for note in r.notes:
            console.print(f"[yellow]note[/yellow] {escape(r.plan)}: {escape(note)}")
