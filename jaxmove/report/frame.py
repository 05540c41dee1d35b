"""The Report as a pandas DataFrame, and its compact HTML for Jupyter (``_repr_html_``).

pandas is an optional dependency (``pip install jaxmove[notebooks]``); it is imported
only when ``to_dataframe`` is called.
"""

from __future__ import annotations

from ..passes.cost import PATHS
from ..vocab import ROLES
from .attribution import attribute, report_rows
from .columns import row_collective, row_measured_s, row_reuse, row_time
from .columns import dominant_role

#: Columns always present, in order. Figures are totals over one program run.
BASE_COLUMNS = (
    "computation", "name", "opcode", "fusion_kind", "multiplicity", "unknown_trip_count",
    "flops", "transcendentals", "hbm_read_bytes", "hbm_write_bytes", "hbm_bytes",
    "arithmetic_intensity",
    *(f"{r}_{d}_bytes" for r in ROLES for d in ("read", "write")),
    *(f"{p}_bytes" for p in PATHS),
    "role", "source", "module", "op_name", "unmodeled", "hlo_line",
)


def report_records(report) -> list[dict]:
    """One dict per instruction of the JSON ``instructions`` list, flat (no nesting).

    Keys: ``BASE_COLUMNS`` plus, when the report has them, ``est_time_s``,
    ``compute_time_s``, ``memory_time_s``, ``network_time_s``, ``bound`` (time model),
    ``modeled_hbm_bytes`` (time model), ``collective``, ``group_size``, ``wire_bytes``
    (collectives; wire bytes per program run), ``onchip_reuse_bytes`` (reuse pass, per
    program run), ``excess_bytes`` (passes/excess.py, per program run), ``measured_s`` and,
    for the instructions XLA:TPU gave an ``estimated_cycles`` (``capture/xla_figures.py``, the
    JSON row's ``xla``), ``xla_estimated_cycles`` (per execution), ``xla_executions`` and
    ``xla_estimated_s`` (per program run at the spec's clock; None without one). ``arithmetic_intensity`` is flops per HBM byte (the time model's,
    over its modeled bytes, when the report has times; None when no HBM bytes move) --
    the same figure as the JSON.
    """
    has_times = report.times is not None
    ex = report.excess
    out = []
    for r in report_rows(report):
        t = r.total
        att = attribute(report.module, r.instr)
        rec = {
            "computation": r.computation, "name": r.instr.name, "opcode": r.instr.opcode,
            "fusion_kind": r.instr.fusion_kind, "multiplicity": r.multiplicity.count,
            "unknown_trip_count": r.multiplicity.unknown_trip_count,
            "flops": t.flops, "transcendentals": t.transcendentals,
            "hbm_read_bytes": t.hbm_read_bytes, "hbm_write_bytes": t.hbm_write_bytes,
            "hbm_bytes": t.hbm_bytes,
            "arithmetic_intensity": (t.flops / t.hbm_bytes) if t.hbm_bytes else None,
        }
        for role in ROLES:
            rd, wr = t.role_bytes(role)
            rec[f"{role}_read_bytes"] = rd
            rec[f"{role}_write_bytes"] = wr
        for p in PATHS:
            rec[f"{p}_bytes"] = t.path_bytes(p)
        rec.update(role=dominant_role(t), source=att.source_key if att.source else None,
                   module=att.module_key, op_name=att.op_name or None,
                   unmodeled="; ".join(r.unmodeled) or None, hlo_line=r.instr.line)
        if has_times:
            tm = row_time(report, r)
            if tm is None:
                rec.update(est_time_s=None, compute_time_s=None, memory_time_s=None,
                           network_time_s=None, bound=None)
            else:  # the time model's intensity counts its modeled bytes (as the JSON)
                rec.update(est_time_s=tm.est_time_s, compute_time_s=tm.compute_time_s,
                           memory_time_s=tm.memory_time_s, network_time_s=tm.network_time_s,
                           bound=tm.bound, arithmetic_intensity=tm.arithmetic_intensity)
        coll = row_collective(r)
        if coll is not None:
            rec["collective"] = coll.kind
            rec["group_size"] = coll.group_size
            rec["wire_bytes"] = coll.wire_bytes * r.multiplicity.count
        reuse = row_reuse(report, r)
        if reuse is not None:
            rec["onchip_reuse_bytes"] = reuse.onchip_reuse_bytes * r.multiplicity.count
        if has_times and tm is not None:
            rec["modeled_hbm_bytes"] = tm.hbm_bytes
        if ex is not None:  # bytes beyond the compulsory (passes/excess.py), per program run
            rec["excess_bytes"] = ex.per_instruction.get((r.computation, r.instr.name), 0)
        ms = row_measured_s(report, r)
        if ms is not None:
            rec["measured_s"] = ms
        fig = report.xla.row(r.computation, r.instr.name) if report.xla is not None else None
        if fig is not None:
            rec.update(xla_estimated_cycles=fig.estimated_cycles, xla_executions=fig.executions,
                       xla_estimated_s=fig.estimated_s)
        out.append(rec)
    return out


def to_dataframe(report):
    """A pandas DataFrame with one row per instruction (see ``report_records``).

    Raises:
      ImportError: pandas is not installed (``pip install jaxmove[notebooks]``).
    """
    try:
        import pandas as pd
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("Report.to_dataframe needs pandas: pip install 'jaxmove[notebooks]'") from e
    recs = report_records(report)
    cols = list(BASE_COLUMNS)
    for rec in recs:
        for k in rec:
            if k not in cols:
                cols.append(k)
    # XLA's own figures: columns in every frame (README), empty where XLA gave none (XLA:CPU
    # and XLA:GPU give no per-instruction estimate; XLA:TPU none for some instructions)
    cols += [k for k in XLA_COLUMNS if k not in cols]
    return pd.DataFrame.from_records(recs, columns=cols)


#: to_dataframe's columns of XLA:TPU's per-instruction estimate (capture/xla_figures.py)
XLA_COLUMNS = ("xla_estimated_cycles", "xla_executions", "xla_estimated_s")


def repr_html(report, top: int = 10) -> str:
    """Compact HTML for Jupyter: program line, totals, bytes by path and role, top rows.

    Every program-derived string is escaped (``html.escape``).
    """
    from .html import summary_html
    return summary_html(report, top=top)
