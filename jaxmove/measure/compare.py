"""Estimate against measurement: per-instruction errors, program errors, a fitted spec.

``compare(target, hardware)`` measures TARGET on the local device (``run.measure``),
analyses the very HLO that ran with the time model (``passes/timing.py``) on a hardware
spec, and puts the two side by side.

Error statistics (``ErrorStats``), over the instructions with a measured time:

- ``mdape``: median of |est - meas| / meas over the instructions that take at least
  ``MIN_SHARE`` (1%) of the run's measured instruction time (the "significant" set);
- ``weighted_error``: sum |est - meas| / sum meas over every measured instruction
  (the time-weighted absolute percentage error, WAPE);
- ``spearman``: Spearman's rank correlation of est and meas over the significant set
  (Pearson correlation of the ranks, ties given their mean rank; Spearman 1904);
- ``program_error``: estimated program time / measured wall time (median) - 1, and
  ``span_error`` the same against the profiled device span (first to last kernel of a
  run), which leaves out the host's per-call dispatch (so does the estimate it is compared
  with: ``est_program_s - est_dispatch_s``).

The fit (``fit_spec``): the time model of one execution is
``overhead + max(memory_time, compute_time)`` with ``memory_time = bytes / bandwidth``
and ``compute_time = flops / peak``. Scaling bandwidth by 1/beta and every peak by
1/gamma scales those terms by beta and gamma, so per instruction (per program run)

    meas_i ~= a * launches_i + max(beta * memory_time_i, gamma * compute_time_i)

with ``launches_i`` = kernel launches per run. It is fitted by non-negative least squares
on relative residuals (each row weighted by 1 / meas_i, so a 2 us kernel counts as much
as a 2 ms one), alternating: given which term of the max is larger for each instruction
the problem is linear, solved exactly (active-set enumeration of the 3-variable NNLS);
the assignment is then updated until it no longer changes (at most 20 rounds). The
"after" errors re-run the full time model with the fitted spec. The fit is in-sample:
its errors are on the same measurements it was fitted to.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import itertools
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .run import Measurement, Prepared, measure, prepare

if TYPE_CHECKING:
    from ..hardware import HardwareSpec
    from ..report.report import Report

__all__ = ["MIN_SHARE", "InstructionComparison", "ErrorStats", "Fit", "Comparison",
           "compare", "error_stats", "excluded_rows", "spearman", "fit_spec", "baseline_time_s", "default_hardware"]

#: Instructions below this share of the measured instruction time are left out of the
#: MdAPE and the rank correlation (their times are at the profiler's resolution).
MIN_SHARE = 0.01


@dataclass(frozen=True)
class InstructionComparison:
    """One instruction: estimate and measurement, seconds per program run.

    ``est_time_s`` is None when the time model has no row for it; ``measured_time_s`` is
    None when no profile event named it (it did not run, or ran inside another kernel).
    ``ratio`` = est / measured; ``share`` = measured / sum of measured. ``excluded`` says why
    the row takes no part in the error statistics (its estimate is a lower bound, or it is
    control flow): ``excluded_rows``.
    """

    computation: str
    name: str
    opcode: str
    est_time_s: float | None
    measured_time_s: float | None
    executions: float | None
    bound: str | None
    share: float | None
    #: why the row is kept out of the error statistics (``excluded_rows``), else None
    excluded: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.est_time_s is None or not self.measured_time_s:
            return None
        return self.est_time_s / self.measured_time_s


@dataclass(frozen=True)
class ErrorStats:
    """How far estimates are from measurements (module docstring for the definitions).

    Attributes:
      n_measured: instructions with both a measurement and an estimate.
      n_significant: those at or above ``MIN_SHARE`` of the measured time.
      mdape, weighted_error: fractions (0.25 = 25%); None without instructions.
      spearman: in [-1, 1]; None with fewer than 2 significant instructions.
      est_sum_s, measured_sum_s: sums over the n_measured instructions.
      est_program_s: the time model's program time (schedule with overlap).
      measured_wall_s: median wall time of a run; measured_span_s: profiled device span.
      program_error: est_program_s / measured_wall_s - 1.
      est_dispatch_s: the per-call dispatch overhead included in est_program_s (0 when the
        spec has none).
      n_excluded: measured instructions kept out of these statistics (``excluded_rows``).
      est_is_lower_bound: the program's estimate is a lower bound (an instruction unmodeled,
        a time incomplete, a loop of unknown trip count: ``Report.complete`` is False).
    """

    n_measured: int
    n_significant: int
    mdape: float | None
    weighted_error: float | None
    spearman: float | None
    est_sum_s: float
    measured_sum_s: float
    est_program_s: float
    measured_wall_s: float
    measured_span_s: float | None
    est_dispatch_s: float = 0.0
    n_excluded: int = 0
    est_is_lower_bound: bool = False

    @property
    def program_error(self) -> float:
        return self.est_program_s / self.measured_wall_s - 1.0

    @property
    def span_error(self) -> float | None:
        """(est_program_s - est_dispatch_s) / measured_span_s - 1: against the device's busy
        stretch of a run, without the host's per-call dispatch that the wall time includes."""
        if not self.measured_span_s:
            return None
        return (self.est_program_s - self.est_dispatch_s) / self.measured_span_s - 1.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["program_error"] = self.program_error
        d["span_error"] = self.span_error
        return d


@dataclass(frozen=True)
class Fit:
    """A spec fitted to measured instruction times (module docstring).

    Attributes:
      spec: the fitted HardwareSpec (name ``<spec>-fit``); write it with ``write_spec``.
      kernel_launch_overhead_s, hbm_bytes_per_s: fitted values.
      flops_scale: fitted peak / original peak (every dtype scaled alike).
      before, after: error statistics with the original and the fitted spec.
      n_rows: instructions the fit used; rounds: alternation rounds.
      kept: fields the measurements did not determine (coefficient 0), left as they were.
    """

    spec: object
    kernel_launch_overhead_s: float
    hbm_bytes_per_s: float
    flops_scale: float
    before: ErrorStats
    after: ErrorStats
    n_rows: int
    rounds: int
    kept: tuple[str, ...] = ()


@dataclass
class Comparison:
    """Estimate vs measurement for one program.

    Attributes:
      measurement: the Measurement (wall times, profile join, coverage).
      report: the Report of the HLO that ran, with ``times`` on ``spec`` and ``measurement``.
      spec: the HardwareSpec used; spec_note: how it was chosen.
      rows: per-instruction comparisons, largest measured time first.
      stats: ErrorStats.
      baseline_s: program time from XLA's ``cost_analysis()`` roofline (``baseline_time_s``),
        None when XLA gave no figures.
      fit: the Fit when requested.
    """

    measurement: Measurement
    report: Report
    spec: HardwareSpec
    spec_note: str
    rows: list[InstructionComparison]
    stats: ErrorStats
    baseline_s: float | None
    fit: Fit | None = None

    def to_json(self) -> dict:
        m = self.measurement
        analysed = instruction_figures(self.report)
        out = {
            "program": {"name": m.program.name, "source": m.program.source},
            "hardware": self.spec.name, "hardware_note": self.spec_note,
            "measurement": m.to_json(),
            "stats": self.stats.to_json(),
            "baseline": {"est_time_s": self.baseline_s,
                         "error": None if self.baseline_s is None else
                         self.baseline_s / self.stats.measured_wall_s - 1.0,
                         "method": "max(XLA cost_analysis flops / peak, bytes accessed / HBM bandwidth)"},
            "instructions": [
                {"computation": r.computation, "name": r.name, "opcode": r.opcode,
                 "est_time_s": r.est_time_s, "measured_time_s": r.measured_time_s,
                 "ratio": r.ratio, "executions": r.executions, "bound": r.bound, "share": r.share,
                 "excluded": r.excluded, **analysed((r.computation, r.name))}
                for r in self.rows],
            "complete": self.report.complete,
            "incomplete": self.report.incomplete_headline(),
        }
        if self.fit is not None:
            f = self.fit
            out["fit"] = {"kernel_launch_overhead_s": f.kernel_launch_overhead_s,
                          "hbm_bytes_per_s": f.hbm_bytes_per_s, "flops_scale": f.flops_scale,
                          "flops_per_s": dict(f.spec.flops_per_s),
                          "n_rows": f.n_rows, "rounds": f.rounds, "kept": list(f.kept),
                          "before": f.before.to_json(), "after": f.after.to_json()}
        return out


def instruction_figures(report):
    """``(computation, name) -> {"shape", "flops", "hbm_read_bytes", "hbm_write_bytes"}``: an
    instruction's result shape, flops and HBM bytes per program run, as ``jaxmove analyze
    --json`` gives them (each None for a measured name the report has no row for); the
    ``compare --json`` rows of a live run and of a capture both carry them."""
    from ..report.shapes import shape_text

    by_key = {(r.computation, r.instr.name): r for r in report.rows}

    def analysed(key) -> dict:
        r = by_key.get(key)
        if r is None:
            return {"shape": None, "flops": None, "hbm_read_bytes": None, "hbm_write_bytes": None}
        t = r.total
        return {"shape": shape_text(r.instr.shape), "flops": t.flops,
                "hbm_read_bytes": t.hbm_read_bytes, "hbm_write_bytes": t.hbm_write_bytes}
    return analysed


# ----------------------------------------------------------------------------- statistics

def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given the mean of the ranks they span."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=float)
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(a, b) -> float | None:
    """Spearman's rank correlation of two equal-length sequences (None when undefined:
    fewer than 2 values or a constant sequence)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"spearman: lengths differ ({len(x)} vs {len(y)})")
    if len(x) < 2:
        return None
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float(np.sqrt((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / den) if den > 0 else None


# control flow: its own measured time is what is left between its body's kernels
_CONTROL_FLOW = frozenset({"while", "conditional", "call"})


def excluded_rows(report) -> dict[tuple[str, str], str]:
    """(computation, instruction) -> why its estimate takes no part in the error statistics:
    it is a lower bound (the instruction is unmodeled, its time incomplete on the spec, or it
    runs in a while loop of unknown trip count, counted once), or the instruction is control
    flow (``while`` / ``conditional`` / ``call``: no kernel of its own, estimated 0, while a
    profile gives it what is left between its body's kernels)."""
    out: dict[tuple[str, str], str] = {}
    for r in report.rows:
        key = (r.computation, r.instr.name)
        if r.unmodeled:
            out[key] = f"unmodeled ({r.unmodeled[0]})"
        elif r.multiplicity.unknown_trip_count:
            out[key] = "in a while loop of unknown trip count (counted once)"
        elif r.instr.opcode in _CONTROL_FLOW:
            out[key] = "control flow (its time is its body's)"
    times = report.times
    if times is not None:
        for key, t in times.rows.items():
            if t.unmodeled and key not in out:
                out[key] = f"time incomplete ({t.unmodeled[0]})"
    return out


def _pairs(times, measurement: Measurement, exclude=()) -> list[tuple[float, float]]:
    out = []
    for key, t in measurement.instructions.items():
        row = times.rows.get(key)
        if row is not None and t.time_s > 0 and key not in exclude:
            out.append((row.est_time_s, t.time_s))
    return out


def error_stats(times, measurement: Measurement, min_share: float = MIN_SHARE,
                exclude: dict | None = None, lower_bound: bool = False) -> ErrorStats:
    """ErrorStats of a TimeEstimate against a Measurement (module docstring), without the
    instructions of ``exclude`` (``excluded_rows``); ``lower_bound``: the program's estimate
    is one (``not Report.complete``)."""
    exclude = exclude or {}
    pairs = _pairs(times, measurement, exclude)
    n_excluded = sum(1 for key, t in measurement.instructions.items() if key in exclude and t.time_s > 0)
    meas_sum = sum(m for _, m in pairs)
    sig = [(e, m) for e, m in pairs if meas_sum > 0 and m / meas_sum >= min_share]
    mdape = statistics.median(abs(e - m) / m for e, m in sig) if sig else None
    wape = sum(abs(e - m) for e, m in pairs) / meas_sum if meas_sum > 0 else None
    rho = spearman([e for e, _ in sig], [m for _, m in sig]) if len(sig) >= 2 else None
    prof = measurement.profile
    return ErrorStats(len(pairs), len(sig), mdape, wape, rho, sum(e for e, _ in pairs), meas_sum,
                      times.est_time_s, measurement.wall_median_s, prof.span_s if prof else None,
                      getattr(times, "dispatch_overhead_s", 0.0), n_excluded, lower_bound)


def baseline_time_s(xla_cost: dict | None, spec, dtype: str) -> float | None:
    """The roofline users can build today from ``Compiled.cost_analysis()``:
    ``max(flops / peak(dtype), bytes accessed / hbm_bytes_per_s)``, seconds.

    XLA counts a while body once and has no per-kernel overhead term; both are kept as
    they are (this is the baseline, not a corrected version of it). None when XLA gave
    no figures or the spec has no peak for ``dtype``.
    """
    if not xla_cost or "flops" not in xla_cost or "bytes accessed" not in xla_cost:
        return None
    peak = spec.peak_flops_per_s(dtype)
    if not peak:
        return None
    return max(float(xla_cost["flops"]) / peak, float(xla_cost["bytes accessed"]) / spec.hbm_bytes_per_s)


# ----------------------------------------------------------------------------- fit

def _nnls_small(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a few columns: the unconstrained least squares
    on every subset of columns, the best one whose coefficients are all >= 0 (the NNLS
    optimum is the least-squares solution on its own support; Lawson & Hanson 1974, ch. 23)."""
    n = A.shape[1]
    best, best_res = np.zeros(n), float(b @ b)
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sub = A[:, cols]
            if np.linalg.matrix_rank(sub) < k:
                continue
            x, *_ = np.linalg.lstsq(sub, b, rcond=None)
            if np.all(x >= 0):
                full = np.zeros(n)
                full[list(cols)] = x
                r = A @ full - b
                res = float(r @ r)
                if res < best_res:
                    best, best_res = full, res
    return best


def _fit_coefficients(launches, mem, comp, meas) -> tuple[np.ndarray, int]:
    """(a, beta, gamma) and rounds of the alternating weighted NNLS (module docstring)."""
    w = 1.0 / meas
    mem_bound = mem >= comp
    coef = np.zeros(3)
    rounds = 0
    for rounds in range(1, 21):
        A = np.stack([launches, np.where(mem_bound, mem, 0.0), np.where(mem_bound, 0.0, comp)], 1)
        coef = _nnls_small(A * w[:, None], meas * w)
        a, beta, gamma = coef
        new = beta * mem >= gamma * comp
        if np.array_equal(new, mem_bound):
            break
        mem_bound = new
    return coef, rounds


def fit_spec(times, measurement: Measurement, spec, program_name: str) -> tuple[object, dict]:
    """Fit overhead, bandwidth and a peak scale to the measured times (module docstring).

    Returns:
      (fitted HardwareSpec, info) with info keys ``kernel_launch_overhead_s``,
      ``hbm_bytes_per_s``, ``flops_scale``, ``n_rows``, ``rounds``, ``kept``.

    Raises:
      ValueError: fewer than 3 measured instructions with an estimate.
    """
    keys = [k for k, t in measurement.instructions.items() if k in times.rows and t.time_s > 0]
    rows = [times.rows[k] for k in keys if times.rows[k].network_time_s in (0, 0.0)]
    keys = [k for k in keys if times.rows[k].network_time_s in (0, 0.0)]
    if len(rows) < 3:
        from ..errors import UsageError
        raise UsageError(f"--fit needs at least 3 measured instructions with an estimate, got {len(rows)}")
    if spec.kernel_launch_overhead_s > 0:
        launches = np.array([r.overhead_s / spec.kernel_launch_overhead_s for r in rows])
    else:  # an ideal-launch spec (kernel_launch_overhead_s = 0): count the launches
        launches = np.array([float(r.multiplicity if r.launches_kernel else 0) for r in rows])
    mem = np.array([r.memory_time_s for r in rows])
    comp = np.array([r.compute_time_s or 0.0 for r in rows])
    meas = np.array([measurement.instructions[k].time_s for k in keys])
    (a, beta, gamma), rounds = _fit_coefficients(launches, mem, comp, meas)
    kept = []
    overhead = a if a > 0 else spec.kernel_launch_overhead_s
    if a <= 0:
        kept.append("kernel_launch_overhead_s")
    bw = spec.hbm_bytes_per_s / beta if beta > 0 else spec.hbm_bytes_per_s
    if beta <= 0:
        kept.append("hbm_bytes_per_s")
    scale = 1.0 / gamma if gamma > 0 else 1.0
    if gamma <= 0:
        kept.append("flops_per_s")
    when = _dt.date.today().isoformat()
    how = (f"fitted by `jaxmove compare --fit` on {when} to {len(rows)} measured instruction times of "
           f"'{program_name}' (weighted non-negative least squares, jaxmove/measure/compare.py); "
           f"starting spec '{spec.name}'")
    sources = dict(spec.sources)
    if "kernel_launch_overhead_s" not in kept:
        sources["kernel_launch_overhead_s"] = how
    if "hbm_bytes_per_s" not in kept:
        sources["hbm_bytes_per_s"] = how
    flops = dict(spec.flops_per_s)
    if "flops_per_s" not in kept:
        flops = {k: v * scale for k, v in flops.items()}
        for k in flops:
            sources[f"flops_per_s.{k}"] = how + f" (the spec's {k} peak x {scale:.4g})"
    fitted = dataclasses.replace(
        spec, name=f"{spec.name}-fit", display_name=f"{spec.label} (fitted to {program_name})",
        kernel_launch_overhead_s=float(overhead), hbm_bytes_per_s=float(bw), flops_per_s=flops,
        sources=sources, path=None,
        notes=(spec.notes + "\n" if spec.notes else "") + how + ".",
        calibration={"method": "jaxmove compare --fit", "program": program_name,
                     "instructions": len(rows), "date": when, "base_spec": spec.name})
    return fitted, {"kernel_launch_overhead_s": float(overhead), "hbm_bytes_per_s": float(bw),
                    "flops_scale": float(scale), "n_rows": len(rows), "rounds": rounds,
                    "kept": tuple(kept)}


# ----------------------------------------------------------------------------- compare

def default_hardware(device_kind: str) -> tuple[object, str]:
    """The spec ``compare`` uses without ``--hardware``: the calibrated ``local`` spec when
    ``jaxmove calibrate`` has written one, else the built-in spec for this device kind,
    else ``cpu-generic``. Returns (spec, a sentence saying which and why)."""
    from ..hardware import load_spec, local_spec_path, spec_for_device_kind

    if local_spec_path().is_file():
        return load_spec("local"), f"calibrated spec {local_spec_path()}"
    spec = spec_for_device_kind(device_kind)
    if spec is not None:
        return spec, f"built-in spec for device kind '{device_kind}' (run `jaxmove calibrate` for a measured one)"
    return load_spec("cpu-generic"), ("rough built-in 'cpu-generic' spec: no calibrated spec found; "
                                      "run `jaxmove calibrate` and use --hardware local")


def kind_mismatch_note(spec, platform: str) -> str | None:
    """A warning when ``spec`` describes another kind of device (``spec.kind``: gpu / tpu /
    cpu) than the one the program is measured on (jax's ``Device.platform``: ``cpu``, ``gpu``
    -- ``cuda``/``rocm`` count as gpu -- or ``tpu``), else None: the estimates are then for
    that device and the errors compare two machines, not the model with a measurement."""
    measured = "gpu" if platform in ("gpu", "cuda", "rocm") else platform
    if spec.kind == measured:
        return None
    return (f"WARNING: {spec.name} is a {spec.kind.upper()} spec but the program runs here on "
            f"{measured.upper()}: the estimates are for the {spec.kind.upper()}, so the errors "
            f"compare two machines (use the spec of this device, e.g. --hardware local after "
            f"`jaxmove calibrate`)")


def _rows(report, measurement: Measurement, field_: str = "est_time_s",
          excluded: dict | None = None) -> list[InstructionComparison]:
    """One comparison per instruction measured or estimated; the estimate is the time row's
    ``field_`` (``est_time_s``; profiles compare ``duration_s``, the estimate less launch gaps);
    ``excluded``: ``excluded_rows``' reasons."""
    excluded = excluded or {}
    times = report.times
    meas = measurement.instructions
    total = sum(t.time_s for t in meas.values()) or 0.0
    opcode = {(r.computation, r.instr.name): r.instr.opcode for r in report.rows}
    keys = set(meas) | {k for k, r in times.rows.items() if r.est_time_s > 0}
    out = []
    for key in keys:
        t, e = meas.get(key), times.rows.get(key)
        out.append(InstructionComparison(
            key[0], key[1], t.opcode if t else opcode.get(key, e.opcode if e else "?"),
            getattr(e, field_) if e else None, t.time_s if t else None, t.executions if t else None,
            e.bound if e else None, (t.time_s / total) if (t and total) else None, excluded.get(key)))
    out.sort(key=lambda r: (-(r.measured_time_s or 0.0), -(r.est_time_s or 0.0), r.name))
    return out


def _dtype_of(program) -> str:
    return str(program.config.get("dtype", "f32")) if program.config else "f32"


def compare(target, *args, hardware=None, runs: int = 10, warmup: int = 2, profile_runs: int = 3,
            overrides: dict[str, str] | None = None, seed: int = 0, fit: bool = False,
            prepared: Prepared | None = None, **capture_kwargs) -> Comparison:
    """Measure TARGET here and compare the time model's estimates with the measurements.

    Args:
      target, args, overrides, seed, capture_kwargs: see ``run.prepare``.
      hardware: a spec name, ``local``, a ``.toml`` path or a HardwareSpec; None picks
        ``default_hardware``.
      runs, warmup, profile_runs: see ``run.measure`` (profile_runs >= 1 here).
      fit: also fit overhead, bandwidth and peak scale (``fit_spec``).

    Raises:
      ValueError: profile_runs < 1; --fit with fewer than 3 measured instructions.
      TargetError, FileNotFoundError, ProfileError, HardwareSpecError.
    """
    import jax

    from ..api import analyze
    from ..hardware import HardwareSpec, load_spec

    if profile_runs < 1:
        from ..errors import UsageError
        raise UsageError("compare needs at least one profiled run (profile_runs >= 1)")
    if hardware is None:
        spec, note = default_hardware(jax.devices()[0].device_kind)
    elif isinstance(hardware, HardwareSpec):
        spec, note = hardware, f"spec '{hardware.name}' given"
    else:
        spec = load_spec(hardware)
        note = f"spec '{spec.name}' ({hardware})"
    mismatch = kind_mismatch_note(spec, jax.devices()[0].platform)
    if mismatch:
        note = f"{note}; {mismatch}"
    prep = prepared or prepare(target, *args, overrides=overrides, seed=seed, **capture_kwargs)
    m = measure(None, runs=runs, warmup=warmup, profile_runs=profile_runs, prepared=prep)
    report = analyze(prep.program, hardware=spec)
    report.measurement = m  # the renderings' measured columns and trace lane (report/columns.py)
    excluded = excluded_rows(report)
    stats = error_stats(report.times, m, exclude=excluded, lower_bound=not report.complete)
    base = baseline_time_s(prep.program.xla_cost_analysis, spec, _dtype_of(prep.program))
    result = Comparison(m, report, spec, note, _rows(report, m, excluded=excluded), stats, base)
    if fit:
        fitted, info = fit_spec(report.times, m, spec, prep.program.name)
        after_report = analyze(prep.program, hardware=fitted)
        result.fit = Fit(fitted, info["kernel_launch_overhead_s"], info["hbm_bytes_per_s"],
                         info["flops_scale"], stats,
                         error_stats(after_report.times, m, exclude=excluded_rows(after_report),
                                     lower_bound=not after_report.complete),
                         info["n_rows"], info["rounds"], info["kept"])
    return result
