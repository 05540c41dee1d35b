"""Fidelity: how far jaxmove's time estimates are from what this machine measures.

For every zoo preset (``models.PRESETS``) at a CPU-friendly size (``CPU_SIZES``), runs
``jaxmove.measure.compare.compare`` on the local device and writes one table row:

- coverage: share of measured device time joined to HLO instructions;
- measured wall time per run (median) and the profiled device span;
- jaxmove's estimated program time and its error against the wall time;
- the baseline users have today: the roofline of XLA's ``Compiled.cost_analysis()``
  program totals, ``max(flops / peak, bytes accessed / bandwidth)``, with the same spec;
- jaxmove's per-instruction errors: MdAPE over instructions >= 1% of the run,
  time-weighted error, Spearman rank correlation. XLA's cost_analysis gives program
  totals only, so the baseline has no per-instruction figures.

One command regenerates the table (written to ``benchmarks/fidelity.md`` and printed)::

    python benchmarks/fidelity.py [--hardware local] [--runs 10] [--readme]

``--readme`` also replaces the block between ``<!-- fidelity:begin -->`` and
``<!-- fidelity:end -->`` in README.md with the same table. Without ``--hardware`` the
calibrated ``local`` spec is used, and ``jaxmove calibrate --quick`` is run first when
there is none (it writes the ``local`` spec, as the command would).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: ``--set`` overrides that bring the large presets to a size a 2-core CPU runs in seconds.
CPU_SIZES: dict[str, dict[str, str]] = {
    "gpt2-small-prefill": {"layers": "2", "seq_len": "256"},
    "gpt2-small-decode": {"layers": "2"},
    "moe": {"layers": "1", "batch": "2", "seq_len": "128"},
}

BEGIN, END = "<!-- fidelity:begin -->", "<!-- fidelity:end -->"


def _fmt_s(t):
    from jaxmove.report.compare_table import fmt_s
    return fmt_s(t)


def _pct(x, signed=True):
    if x is None:
        return "-"
    return f"{x * 100:+.0f}%" if signed else f"{x * 100:.0f}%"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _spec(hardware: str | None):
    from jaxmove.hardware import calibrate, load_spec, local_spec_path, write_spec

    if hardware:
        return load_spec(hardware)
    if not local_spec_path().is_file():
        print(f"fidelity: no calibrated spec at {local_spec_path()}; running calibrate(quick=True)",
              file=sys.stderr)
        write_spec(calibrate(quick=True), local_spec_path())
    return load_spec("local")


def run(hardware: str | None, runs: int, warmup: int, profile_runs: int, presets: list[str]) -> str:
    import jax
    from jaxmove import zoo as models
    from jaxmove.measure.compare import compare

    spec = _spec(hardware)
    rows, notes = [], []
    for name in presets:
        sets = CPU_SIZES.get(name, {})
        t0 = time.perf_counter()
        c = compare(name, hardware=spec, runs=runs, warmup=warmup, profile_runs=profile_runs,
                    overrides=sets)
        s, p = c.stats, c.measurement.profile
        base_err = None if c.baseline_s is None else c.baseline_s / s.measured_wall_s - 1.0
        label = name + (" " + " ".join(f"{k}={v}" for k, v in sets.items()) if sets else "")
        rows.append([label, str(s.n_measured), _pct(p.coverage, signed=False), _fmt_s(s.measured_wall_s),
                     _fmt_s(s.measured_span_s), _fmt_s(s.est_program_s), _pct(s.program_error),
                     _pct(s.span_error), _fmt_s(c.baseline_s), _pct(base_err),
                     _pct(s.mdape, signed=False), _pct(s.weighted_error, signed=False),
                     "-" if s.spearman is None else f"{s.spearman:.2f}"])
        if base_err is not None and abs(s.program_error) > abs(base_err):
            notes.append(_why(label, c, base_err))
        print(f"fidelity: {label}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    head = ["preset (CPU size)", "instrs", "joined", "measured wall", "device span", "jaxmove est",
            "err vs wall", "err vs span", "XLA roofline est", "XLA err vs wall", "MdAPE (>=1%)",
            "time-weighted err", "Spearman"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    dev = jax.devices()[0]
    flops = ", ".join(f"{k} {v / 1e9:.3g} GFLOP/s" for k, v in spec.flops_per_s.items())
    meta = [
        f"Measured {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')} on `{dev.device_kind}` "
        f"({_cpu_model()}), jax {jax.__version__}; hardware spec `{spec.name}`: "
        f"{spec.hbm_bytes_per_s / 1e9:.3g} GB/s, {flops}, "
        f"{spec.kernel_launch_overhead_s * 1e6:.3g} us per kernel"
        + (f", first touch {spec.first_touch_bytes_per_s / 1e9:.3g} GB/s above a "
           f"{spec.mmap_threshold_bytes / 2**20:.3g} MiB allocation"
           if spec.first_touch_bytes_per_s and spec.mmap_threshold_bytes else "")
        + (f", {spec.dispatch_overhead_s * 1e6:.3g} us dispatch per call" if spec.dispatch_overhead_s else "")
        + ".",
        f"{warmup} warm-up, {runs} timed and {profile_runs} profiled runs per preset. "
        "Command: `python benchmarks/fidelity.py" + (f" --hardware {hardware}" if hardware else "")
        + (f" --runs {runs}" if runs != 10 else "")
        + ("".join(f" --preset {n}" for n in presets) if presets != list(models.PRESETS) else "") + "`.",
    ]
    out = "\n".join(meta) + "\n\n" + "\n".join(lines) + "\n"
    if notes:
        out += ("\nWhere jaxmove's program error is larger than the baseline's, the figures behind "
                "it:\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    return out


def _why(label: str, c, base_err: float) -> str:
    """One line: both estimates' flops and bytes, and the instruction jaxmove misses most."""
    s = c.stats
    times = c.report.times
    flops = sum(r.flops for r in times.rows.values())
    hbm = sum(r.hbm_bytes for r in times.rows.values())
    xla = c.measurement.program.xla_cost_analysis or {}
    worst = max((r for r in c.rows if r.measured_time_s is not None),
                key=lambda r: r.measured_time_s - (r.est_time_s or 0.0))
    return (f"{label}: jaxmove {_pct(s.program_error)} vs baseline {_pct(base_err)}. jaxmove counts "
            f"{flops / 1e9:.4g} GFLOP and {hbm / 1e6:.4g} MB of HBM traffic per run, XLA's "
            f"cost_analysis {float(xla.get('flops', 0)) / 1e9:.4g} GFLOP and "
            f"{float(xla.get('bytes accessed', 0)) / 1e6:.4g} MB; the largest shortfall is "
            f"`{worst.name}` ({worst.opcode}, {worst.bound or 'no'} bound): measured "
            f"{_fmt_s(worst.measured_time_s)}, estimated {_fmt_s(worst.est_time_s)}.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", help="spec name or .toml (default: local, calibrated if missing)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--profile-runs", type=int, default=3)
    ap.add_argument("--preset", action="append", help="only these presets (repeatable)")
    ap.add_argument("-o", "--output", default=str(ROOT / "benchmarks" / "fidelity.md"))
    ap.add_argument("--readme", action="store_true", help="also update the table in README.md")
    args = ap.parse_args(argv)
    from jaxmove import zoo as models

    presets = args.preset or list(models.PRESETS)
    table = run(args.hardware, args.runs, args.warmup, args.profile_runs, presets)
    Path(args.output).write_text("# jaxmove fidelity: estimate vs measurement\n\n"
                                 "Generated by `benchmarks/fidelity.py`; do not edit by hand.\n\n" + table,
                                 encoding="utf-8")
    print(table)
    if args.readme:
        readme = ROOT / "README.md"
        text = readme.read_text(encoding="utf-8")
        pat = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
        if not pat.search(text):
            print(f"fidelity: {readme} has no {BEGIN} ... {END} block; not updated", file=sys.stderr)
            return 1
        readme.write_text(pat.sub(lambda _m: BEGIN + "\n" + table + END, text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
