"""matplotlib plots of a Report: roofline scatter, traffic by path and by role, estimate
against measurement.

matplotlib is an optional dependency (``pip install jaxmove[notebooks]``). Every function
takes an optional ``ax`` and returns the Axes it drew on. No plot invents a point: an
instruction without the figure a plot needs (no flops on a log axis, no measured time) is
left out and the count of those left out is written in the title.
"""

from __future__ import annotations

from ..passes.cost import PATHS
from ..vocab import ROLES
from .attribution import report_rows
from .columns import row_measured_s, row_time, times_of

_BOUND_COLORS = {"compute": "#d14a4a", "memory": "#3b6fd4", "network": "#3aa17e", "overhead": "#8a8a8a",
                 None: "#c9a227"}


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt
        _fig, ax = plt.subplots(figsize=(7, 4.5))
    return ax


def _spec_of(report, spec):
    if spec is not None:
        if isinstance(spec, str):
            from ..hardware import load_spec
            return load_spec(spec)
        return spec
    times = times_of(report)
    if times is None:
        raise ValueError("a roofline needs a hardware spec: analyse with hardware=NAME or pass spec=")
    if times.spec is not None:  # the spec the times used: a user's file or --spec overrides too
        return times.spec
    from ..hardware import load_spec
    return load_spec(times.spec_name)


def roofline(report, spec=None, dtype: str = "bf16", ax=None):
    """Roofline scatter of the instructions (Williams, Waterman & Patterson, CACM 2009).

    x: arithmetic intensity, flops per HBM byte (the time model's modeled bytes when the
    report has times). y: estimated attained FLOP/s = flops / est_time_s (needs
    ``report.times``). Lines: the memory roof ``hbm_bytes_per_s * x`` and the compute roof
    ``spec.peak_flops_per_s(dtype)``. Points are coloured by ``bound`` and sized by HBM bytes.

    Raises:
      ValueError: the report has no times (analyse with ``hardware=``).
    """
    import numpy as np

    times = times_of(report)
    if times is None:
        raise ValueError("the roofline scatter needs estimated times: analyse with hardware=NAME")
    spec = _spec_of(report, spec)
    ax = _axes(ax)
    xs, ys, sizes, colors, left_out = [], [], [], [], 0
    for r in report_rows(report):
        tm = row_time(report, r)
        est = tm.est_time_s if tm is not None else None
        hbm = (tm.hbm_bytes if tm is not None else 0) or r.total.hbm_bytes
        if not est or not r.total.flops or not hbm:
            left_out += 1
            continue
        xs.append(r.total.flops / hbm)
        ys.append(r.total.flops / est)
        sizes.append(hbm)
        colors.append(_BOUND_COLORS.get(tm.bound, "#c9a227"))
    peak = spec.peak_flops_per_s(dtype)
    bw = spec.hbm_bytes_per_s
    lo = min(xs + [0.01]) / 2
    hi = max(xs + [(peak / bw) if peak else 100.0]) * 4
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    roof = bw * grid if peak is None else np.minimum(bw * grid, peak)
    ax.plot(grid, roof, color="black", lw=1.2, label=f"roof: {spec.name} ({dtype})")
    if xs:
        s = np.asarray(sizes, dtype=float)
        ax.scatter(xs, ys, s=15 + 185 * s / s.max(), c=colors, alpha=0.7, edgecolors="none")
    for bound, c in _BOUND_COLORS.items():
        if bound and c in colors:
            ax.scatter([], [], c=c, label=f"{bound}-bound")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flops / HBM byte)")
    ax.set_ylabel("estimated FLOP/s")
    extra = f"; {left_out} without flops or time left out" if left_out else ""
    ax.set_title(f"{report.program.name}: roofline{extra}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return ax


def traffic_by_path(report, ax=None):
    """Horizontal bars: bytes per data path (totals over one program run), MiB."""
    ax = _axes(ax)
    t = report.totals
    vals = [t.path_bytes(p) / 2**20 for p in PATHS]
    ax.barh(list(PATHS), vals, color="#3b6fd4")
    ax.invert_yaxis()
    ax.set_xlabel("MiB per program run")
    ax.set_title(f"{report.program.name}: bytes by path", fontsize=10)
    return ax


def traffic_by_role(report, ax=None):
    """Stacked horizontal bars: HBM bytes read and written per tensor role, MiB."""
    ax = _axes(ax)
    t = report.totals
    rd = [t.role_bytes(r)[0] / 2**20 for r in ROLES]
    wr = [t.role_bytes(r)[1] / 2**20 for r in ROLES]
    ax.barh(list(ROLES), rd, color="#3b6fd4", label="read")
    ax.barh(list(ROLES), wr, left=rd, color="#e07b39", label="written")
    ax.invert_yaxis()
    ax.set_xlabel("MiB per program run")
    ax.set_title(f"{report.program.name}: HBM bytes by role", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def estimate_vs_measured(report, measurement=None, ax=None):
    """Scatter, log-log: estimated against measured seconds per instruction (per program run).

    Args:
      measurement: a ``jaxmove.measure.Measurement`` (default: ``report.measurement``).
    Raises:
      ValueError: no times, or no measured instruction.
    """
    import numpy as np

    if times_of(report) is None:
        raise ValueError("estimate_vs_measured needs estimated times: analyse with hardware=NAME")
    ax = _axes(ax)
    est, meas, colors, left_out = [], [], [], 0
    for r in report_rows(report):
        tm = row_time(report, r)
        e = tm.est_time_s if tm is not None else None
        m = row_measured_s(report, r, measurement)
        if not e or not m:
            left_out += 1
            continue
        est.append(e)
        meas.append(m)
        colors.append(_BOUND_COLORS.get(tm.bound, "#c9a227"))
    if not est:
        raise ValueError("no instruction has both an estimated and a measured time")
    lo, hi = min(est + meas) / 2, max(est + meas) * 2
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="estimate = measured")
    ax.scatter(meas, est, c=colors, alpha=0.7, edgecolors="none")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured s per program run")
    ax.set_ylabel("estimated s per program run")
    ratio = np.median(np.asarray(est) / np.asarray(meas))
    extra = f"; {left_out} not joined" if left_out else ""
    ax.set_title(f"{report.program.name}: median estimate/measured = {ratio:.2g}{extra}", fontsize=10)
    ax.legend(fontsize=8)
    return ax
