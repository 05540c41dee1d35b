"""The per-row figures other passes attach to a Report, for the renderings (annotated HLO, HTML,
DataFrame, trace, plots): time (``Report.times``), reuse (``Report.reuse``), collective
(``InstructionCost.collective``) and measured time (``Report.measurement``). Each accessor
returns None when the report does not carry the figure; none invents a value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..hlo.opcodes import names
from ..passes.pipeline import InstructionCost
from ..vocab import ROLES

# Opcodes that never appear as their own rows in tables: they move nothing and compute nothing.
QUIET_OPCODES = names(quiet=True)  # the opcode table (hlo/opcodes.py)

if TYPE_CHECKING:
    from ..measure.run import Measurement
    from ..passes.collectives import CollectiveInfo
    from ..passes.reuse import InstructionReuse
    from ..passes.timing import InstructionTime, TimeEstimate
    from .report import Report


def times_of(report: Report) -> TimeEstimate | None:
    """The report's TimeEstimate, or None when no hardware spec was given."""
    return report.times


def row_time(report: Report, row: InstructionCost) -> InstructionTime | None:
    """The InstructionTime of one row (``est_time_s``, ``bound``, ...), or None."""
    t = report.times
    return t.rows.get((row.computation, row.instr.name)) if t is not None else None


def row_collective(row: InstructionCost) -> CollectiveInfo | None:
    """The row's CollectiveInfo (kind, group_size, wire_bytes, ...), or None."""
    return row.collective


def row_reuse(report: Report, row: InstructionCost) -> InstructionReuse | None:
    """The row's on-chip reuse record from the reuse pass, or None when it has none."""
    r = report.reuse
    return r.rows.get((row.computation, row.instr.name)) if r is not None else None


def measurement_of(report: Report) -> Measurement | None:
    """The report's Measurement (set by ``jaxmove compare``), or None."""
    return report.measurement


def row_measured_s(report: Report, row: InstructionCost,
                   measurement: Measurement | None = None) -> float | None:
    """Measured seconds of one row per program run (``InstructionTiming.time_s`` of
    ``measurement``, default ``report.measurement``), or None when not measured."""
    m = measurement if measurement is not None else report.measurement
    if m is None:
        return None
    t = m.instructions.get((row.computation, row.instr.name))
    return t.time_s if t is not None else None


def dominant_role(c) -> str:
    """The role that accounts for the most HBM bytes of a cost (a ``passes.cost.Cost``;
    "-" when it moves none)."""
    best = max(ROLES, key=lambda r: sum(c.role_bytes(r)))
    return best if sum(c.role_bytes(best)) else "-"
