"""Compile + analysis time per compile target (issue 11), and the process's peak memory.

For each target: GPT-2-small decode and prefill compiled by the target's compiler without the
device (capture) and analysed (passes), then a 16-device plan sweep (dp, fsdp, tp) of
gpt2-small-prefill. Writes benchmarks/targets.md.

    python benchmarks/targets.py            # all targets whose extra is installed
    python benchmarks/targets.py --quick    # decode/prefill only, no sweep
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

TARGETS = ("cpu", "tpu-v5e:2x2", "h100-sxm:1x1x8")
SWEEPS = (("tpu-v5e:4x4", "data=4,model=4"), ("h100-sxm:1x2x8", "data=2,model=8"))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("-o", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args()

    from jaxmove import zoo
    from jaxmove.api import analyze
    from jaxmove.capture import capture
    from jaxmove.capture.targets import MissingExtraError, Target
    from jaxmove.plans import compare_plans, parse_mesh

    rows = []
    for name in TARGETS:
        t = Target.parse(name)
        try:
            t.devices()
        except MissingExtraError as e:
            print(f"skip {name}: {e}", file=sys.stderr)
            continue
        for preset in ("gpt2-small-decode", "gpt2-small-prefill"):
            c0, w0 = time.process_time(), time.perf_counter()
            program = capture(zoo.build(preset, {}), target=t.name)
            c1, w1 = time.process_time(), time.perf_counter()
            report = analyze(program, hardware=None if t.platform == "cpu" else t.spec_name)
            c2, w2 = time.process_time(), time.perf_counter()
            w = report.totals.role_bytes("weights")
            rows.append((t.name, preset, c1 - c0, w1 - w0, c2 - c1, w2 - w1, w[0], w[1],
                         len(report.unmodeled)))
            print(rows[-1], file=sys.stderr, flush=True)
    sweeps = []
    if not args.quick:
        for name, mesh in SWEEPS:
            try:
                Target.parse(name).devices()
            except MissingExtraError as e:
                print(f"skip sweep {name}: {e}", file=sys.stderr)
                continue
            c0, w0 = time.process_time(), time.perf_counter()
            cmp = compare_plans("gpt2-small-prefill", parse_mesh(mesh, name), ["dp", "fsdp", "tp"],
                                target=name)
            c1, w1 = time.process_time(), time.perf_counter()
            sweeps.append((name, mesh, c1 - c0, w1 - w0,
                           ", ".join(f"{r.plan}: {r.compile_s:.1f} s" for r in cmp.results)))
            print(sweeps[-1], file=sys.stderr, flush=True)

    load = os.getloadavg()
    lines = [
        "# Compile targets: compile and analysis time, peak memory",
        "",
        "Measured by `python benchmarks/targets.py` on this machine "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; load average "
        f"{load[0]:.1f} during the run: the machine is shared, so wall times are above the CPU times).",
        "`capture` = trace + lower + the target compiler (deviceless); `analyze` = parse + every pass.",
        "CPU seconds are this process's (`time.process_time`), wall seconds include waiting for the CPUs.",
        "",
        "| target | program | capture CPU s | capture wall s | analyze CPU s | analyze wall s | weights read bytes | weights written | unmodeled |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {t} | {p} | {c:.1f} | {cw:.1f} | {a:.2f} | {aw:.2f} | {wr:,} | {ww:,} | {u} |"
              for t, p, c, cw, a, aw, wr, ww, u in rows]
    if sweeps:
        lines += ["", "16-device plan sweep of gpt2-small-prefill (dp, fsdp, tp), all in this process:", "",
                  "| target | mesh | CPU s | wall s | per plan (wall, compile + analysis) |", "|---|---|---:|---:|---|"]
        lines += [f"| {t} | {m} | {c:.1f} | {w:.1f} | {per} |" for t, m, c, w, per in sweeps]
    lines += ["", f"Peak resident memory of the process: {_peak_rss_bytes() / 2**20:.0f} MiB.", ""]
    Path(args.o).write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {args.o}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
