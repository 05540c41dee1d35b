"""Terminal rendering of a Report (rich tables). Computes nothing; formats what it is given."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..passes.cost import PATHS
from ..workload import ROLES
from .report import Report, dominant_role

_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def human_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units)."""
    for scale, unit in _UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def human_count(n: float) -> str:
    """12_300_000 -> '12.3 M' (SI units, for flops)."""
    for scale, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)}"


def make_console() -> Console:
    """A console for tables: the terminal's width, or 160 columns when output is not a terminal."""
    c = Console()
    return c if c.is_terminal else Console(width=160)


def render_report(report: Report, top: int = 15, console: Console | None = None) -> None:
    console = console or make_console()
    p = report.program
    t = report.totals
    console.print(f"[bold]{p.name}[/bold]  backend={p.backend}  devices={p.num_devices}  "
                  f"source={p.source}")
    console.print(f"HBM read {human_bytes(t.hbm_read_bytes)}, written {human_bytes(t.hbm_write_bytes)}, "
                  f"{human_count(t.flops)}FLOP per program run "
                  f"({sum(1 for r in report.rows if r.instr.opcode not in ('parameter', 'constant'))} "
                  f"kernel-level instructions)")

    table = Table(title=f"Top {top} instructions by HBM bytes (totals over one program run)")
    num = {"justify": "right", "no_wrap": True}
    for col, kw in (("instruction", {"overflow": "fold"}), ("op / fusion", {"no_wrap": True}),
                    ("x", num), ("flops", num), ("read", num), ("written", num),
                    ("role", {"no_wrap": True}), ("source", {"overflow": "fold"})):
        table.add_column(col, **kw)
    for r in report.top(top):
        loc = report.module.source_location(r.instr)
        kind = r.instr.opcode if r.instr.opcode != "fusion" else f"fusion:{r.instr.fusion_kind or '?'}"
        mult = f"{r.multiplicity.count}{'?' if r.multiplicity.unknown_trip_count else ''}"
        name = r.instr.name + (" [red](unmodeled)[/red]" if r.unmodeled else "")
        table.add_row(name, kind, mult, human_count(r.total.flops), human_bytes(r.total.hbm_read_bytes),
                      human_bytes(r.total.hbm_write_bytes), dominant_role(r.total),
                      f"{loc.file.rsplit('/', 1)[-1]}:{loc.line}" if loc else "")
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

    if report.unmodeled:
        console.print(f"[bold red]Unmodeled ({len(report.unmodeled)}):[/bold red] figures for these are "
                      "incomplete")
        for r in report.unmodeled[:20]:
            console.print(f"  {r.instr.name} ({r.instr.opcode}): {'; '.join(r.unmodeled)}")
    else:
        console.print("Unmodeled: none")
    notes = list(report.notes)
    whole = [r for r in report.rows if any("whole KV-cache" in n for n in r.notes)]
    if whole:
        notes.append(f"{len(whole)} instruction(s) rewrite a whole KV-cache buffer instead of updating it "
                     f"in place (e.g. {whole[0].instr.name}: {[n for n in whole[0].notes if 'whole' in n][0]})")
    for n in notes:
        console.print(f"[yellow]note:[/yellow] {n}")
