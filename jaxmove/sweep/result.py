"""The rows of a sweep, ranked: fastest point that fits first; JSON, DataFrame, Pareto front.

Ranking (``rank_key``): analysed points that fit the device's HBM by estimated step time
(``est_time_s``; then memory per device), then points whose memory XLA did not report, then
points that do not fit (by time), then points that failed (``error``, ``died``,
``timeout``). Rank 1 is the fastest point that fits.

Pareto front (``pareto_keys``): among analysed points with both figures, those that no other
point beats on both step time and memory per device (``peak_bytes``): the choices worth
considering when trading memory for speed. A point that does not fit can be on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .store import flatten_row

__all__ = ["SweepResult", "rank_key", "pareto_keys"]

_INF = math.inf


def rank_key(row: dict) -> tuple:
    """Sort key of a row: (group, step time, memory per device, key); see the module docstring."""
    ok = row.get("status") == "ok"
    fits = row.get("fits")
    group = 0 if ok and fits is True else 1 if ok and fits is None else 2 if ok else 3
    t = row.get("est_time_s")
    m = row.get("peak_bytes")
    return (group, _INF if t is None else t, _INF if m is None else m, row.get("key", ""))


def pareto_keys(rows: list[dict]) -> set[str]:
    """Keys of the rows no other row beats on both ``est_time_s`` and ``peak_bytes``
    (lower is better; of points equal on both, the first by key)."""
    pts = [(r["est_time_s"], r["peak_bytes"], r["key"]) for r in rows
           if r.get("status") == "ok" and r.get("est_time_s") is not None and r.get("peak_bytes") is not None]
    front: set[str] = set()
    best_mem = _INF
    for t, m, k in sorted(pts):  # by time, then memory: a point is on the front when its
        if m < best_mem:         # memory is below every faster point's
            front.add(k)
            best_mem = m
    return front


@dataclass
class SweepResult:
    """What ``jaxmove.sweep`` returns.

    Attributes:
      name, path: the sweep's name and SWEEP.toml path.
      rows: one row per point (``point.py``'s dict), ranked, each with ``rank`` (1 = fastest
        that fits) and ``pareto`` (on the step time / memory Pareto front).
      executor: ``local`` or ``ray``.
      wall_s: seconds the sweep ran (points resumed from the file cost none).
      resumed: points read from the result file instead of compiled.
      output: the result file, or None.
      notes: sweep-level notes (duplicates dropped, a cut-short file line...).
    """

    name: str
    path: str
    rows: list[dict]
    executor: str = "local"
    wall_s: float = 0.0
    resumed: int = 0
    output: str | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.rows = sorted(self.rows, key=rank_key)
        front = pareto_keys(self.rows)
        for i, r in enumerate(self.rows, 1):
            r["rank"] = i
            r["pareto"] = r["key"] in front

    @property
    def best(self) -> dict | None:
        """The fastest point that fits, or None when none does."""
        r = self.rows[0] if self.rows else None
        return r if r is not None and r.get("status") == "ok" and r.get("fits") is True else None

    def counts(self) -> dict[str, int]:
        """Points by status: ok, error, died, timeout (and fits / does not fit among ok)."""
        out = {"points": len(self.rows), "ok": 0, "error": 0, "died": 0, "timeout": 0,
               "fits": 0, "does_not_fit": 0}
        for r in self.rows:
            out[r["status"]] = out.get(r["status"], 0) + 1
            if r["status"] == "ok":
                out["fits" if r.get("fits") else "does_not_fit"] += r.get("fits") is not None
        return out

    def to_json(self) -> dict:
        """``jaxmove sweep --json``: {"sweep": {...}, "counts": {...}, "points": [rows, ranked]}.
        Keys may be added, never removed."""
        from .. import __version__
        return {"sweep": {"name": self.name, "path": self.path, "executor": self.executor,
                          "wall_s": self.wall_s, "resumed": self.resumed, "output": self.output,
                          "jaxmove_version": __version__, "notes": list(self.notes)},
                "counts": self.counts(),
                "points": [dict(r) for r in self.rows]}

    def to_dataframe(self):
        """One pandas row per point, ranked; nested dicts spread into ``set.<key>``,
        ``hbm_bytes.<role>``, ``wire_bytes.<kind>`` and ``mesh.<axis>`` columns
        (``store.flatten_row``); ``set.<key>`` columns whose values are all integers, and the
        ``mesh.<axis>`` columns, are integers (``Int64``: empty where a point has no such axis).

        Raises:
          ImportError: pandas is not installed (one line saying which extra brings it).
        """
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("SweepResult.to_dataframe needs pandas: pip install 'jaxmove[notebooks]'") from e

        df = pd.DataFrame([flatten_row(r) for r in self.rows])
        for c in df.columns:
            if c.startswith("set.") and df[c].dropna().map(lambda v: str(v).isdigit()).all():
                df[c] = df[c].map(lambda v: None if v is None else int(v)).astype("Int64")
            elif c.startswith("mesh."):
                df[c] = df[c].astype("Int64")
        return df

    def pareto_plot(self, ax=None, path=None):
        """Step time vs memory per device (matplotlib); see ``render.pareto_plot``."""
        from .render import pareto_plot
        return pareto_plot(self, ax=ax, path=path)

    def to_html(self) -> str:
        """The sweep's self-contained HTML page (``render.render_html``)."""
        from .render import render_html
        return render_html(self)

    def write_html(self, path) -> None:
        from ..report.outputs import write_text_atomic
        write_text_atomic(path, self.to_html(), "--html file")

    def _repr_html_(self) -> str:
        from .render import table_html
        return table_html(self, top=20)
