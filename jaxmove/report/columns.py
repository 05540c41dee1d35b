"""Optional per-instruction columns that other passes add to a Report, read defensively.

The renderings (annotated HLO, HTML, DataFrame, trace) show time, bound, reuse, collective
and measured figures when the Report carries them and work without them. This module is
the one place that knows where those figures live:

  * ``report.times``: a ``TimeEstimate`` (``jaxmove.passes.timing``) whose ``rows`` map
    ``(computation, instruction name)`` to an ``InstructionTime`` (``est_time_s``,
    ``bound``, ``arithmetic_intensity``, ...), set when analysed with a hardware spec;
  * ``row.collective``: a ``CollectiveInfo`` (``jaxmove.passes.collectives``);
  * ``report.measurement``: a ``Measurement`` (``jaxmove.measure``) with per-instruction
    measured times keyed by ``(computation, instruction name)``.

Every accessor returns None when the figure is absent; none invents a value.
"""

from __future__ import annotations

from typing import Any

from ..passes.pipeline import InstructionCost

# Opcodes that never appear as their own rows: they move nothing and compute nothing.
# (The same set as report._QUIET; kept equal by tests/test_annotate.py.)
from .report import _QUIET as QUIET_OPCODES  # noqa: F401  (re-exported)


def _lookup(table: Any, row: InstructionCost) -> Any:
    """``table[(computation, name)]`` (or ``table[id(instr)]``), None when absent."""
    if table is None:
        return None
    get = getattr(table, "get", None)
    if get is None:
        return None
    for key in ((row.computation, row.instr.name), id(row.instr), row.instr.name):
        try:
            v = get(key)
        except TypeError:
            v = None
        if v is not None:
            return v
    return None


def times_of(report) -> Any:
    """The report's TimeEstimate, or None when no hardware spec was given."""
    return getattr(report, "times", None)


def row_time(report, row: InstructionCost) -> Any:
    """The InstructionTime of one row (``est_time_s``, ``bound``, ...), or None."""
    t = times_of(report)
    return _lookup(getattr(t, "rows", None), row) if t is not None else None


def row_collective(row: InstructionCost) -> Any:
    """The row's CollectiveInfo (kind, group_size, wire_bytes, ...), or None."""
    return getattr(row, "collective", None)


def row_reuse(report, row: InstructionCost) -> Any:
    """The row's on-chip reuse record from the reuse pass, or None when not computed."""
    row_attr = getattr(row, "reuse", None)
    if row_attr is not None:
        return row_attr
    reuse = getattr(report, "reuse", None)
    rows = getattr(reuse, "rows", reuse)
    return _lookup(rows, row)


def measurement_of(report) -> Any:
    """The report's Measurement (from ``compare``), or None."""
    return getattr(report, "measurement", None)


def row_measured_s(report, row: InstructionCost, measurement: Any = None) -> float | None:
    """Measured seconds of one row per program run, or None when not measured.

    Reads ``measurement.per_instruction`` / ``measurement.instructions`` (whichever exists);
    a value may be a number of seconds or a record with ``time_s`` / ``mean_s``.
    """
    m = measurement if measurement is not None else measurement_of(report)
    if m is None:
        return None
    for attr in ("per_instruction_s", "per_instruction", "instructions", "rows"):
        table = getattr(m, attr, None)
        if table is not None:
            v = _lookup(table, row)
            if v is None:
                continue
            if isinstance(v, (int, float)):
                return float(v)
            for field in ("time_s", "mean_s", "measured_s", "total_s"):
                x = getattr(v, field, None)
                if isinstance(x, (int, float)):
                    return float(x)
    return None


def attr_or_none(obj: Any, *names: str) -> Any:
    """The first attribute of ``obj`` among ``names`` that is present and not None."""
    if obj is None:
        return None
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    return None
