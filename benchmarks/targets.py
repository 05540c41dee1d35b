"""Compile + analysis time per compile target (issue 11), and the process's peak memory.

For each target: GPT-2-small decode and prefill compiled by the target's compiler without the
device (capture) and analysed (passes), then a 16-device plan sweep (dp, fsdp, tp) of
gpt2-small-prefill. Writes benchmarks/targets.md.

    python benchmarks/targets.py            # all targets whose extra is installed
    python benchmarks/targets.py --quick    # decode/prefill only, no sweep
    python benchmarks/targets.py --cache-only   # only the compile cache table (cold vs warm)

The compile tables compile with jaxmove's compile cache off (JAXMOVE_NO_COMPILE_CACHE=1), so
they time the compiler; the compile cache table runs ``jaxmove plans`` as a user does, with a
fresh cache directory (cold) and then again with the same one (warm).
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
os.environ.setdefault("JAXMOVE_NO_COMPILE_CACHE", "1")  # the compile tables time the compiler

#: the command of issue 28, run cold and warm for the compile cache table
CACHE_COMMAND = ["plans", "gpt2-small-prefill", "--target", "tpu-v5e:2x4", "--plan", "dp", "--plan", "fsdp",
                 "--plan", "tp", "--json", "--no-progress"]
CACHE_MARK = "## Compile cache"

TARGETS = ("cpu", "tpu-v5e:2x2", "h100-sxm:1x1x8")
SWEEPS = (("tpu-v5e:4x4", "data=4,model=4"), ("h100-sxm:1x2x8", "data=2,model=8"))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _cli_timed(argv: list[str], env: dict) -> tuple[float, float, str, dict]:
    """(wall s, CPU s of the child, its last stderr line, its JSON) of ``jaxmove ARGV``."""
    import json
    import subprocess
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    exe = Path(sys.executable).with_name("jaxmove")  # the console script, as a user runs it
    p = subprocess.run([str(exe), *argv], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - w0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"jaxmove {' '.join(argv)} exited {p.returncode}: {p.stderr[-2000:]}")
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    last = [ln for ln in p.stderr.splitlines() if "compile cache" in ln]
    return wall, cpu, (last[-1] if last else ""), json.loads(p.stdout)


def cache_section() -> list[str]:
    """The compile cache table: CACHE_COMMAND with a fresh cache directory, then again."""
    import tempfile
    d = tempfile.mkdtemp(prefix="jaxmove-bench-xla-")
    env = dict(os.environ)
    env.pop("JAXMOVE_NO_COMPILE_CACHE", None)
    env["JAXMOVE_COMPILE_CACHE_DIR"] = d
    runs = []
    for label in ("cold (empty cache)", "warm (same cache)"):
        load0 = os.getloadavg()[0]
        wall, cpu, line, out = _cli_timed(CACHE_COMMAND, env)
        runs.append((label, wall, cpu, load0, line, out))
        print(runs[-1][:5], file=sys.stderr, flush=True)

    def strip(out):  # the figures, without timings and cache counts
        return [{k: v for k, v in r.items() if k != "compile_s"} for r in out["plans"]]
    same = strip(runs[0][5]) == strip(runs[1][5])
    size = sum(f.stat().st_size for f in Path(d).glob("*.json.gz"))
    import shutil
    shutil.rmtree(d, ignore_errors=True)
    lines = [CACHE_MARK, "",
             f"`jaxmove {' '.join(CACHE_COMMAND)}` run by `python benchmarks/targets.py --cache-only` "
             f"as a user runs it (a new process each time; {os.cpu_count()} CPUs, so the plans compile "
             "one after the other: `--jobs` defaults to 1 on <= 2 CPUs), first with an empty compile "
             "cache directory, then again with the same one. CPU s is the child process's user + "
             "system time.", "",
             "| run | wall s | CPU s | load average at start | compile cache (stderr) |",
             "|---|---:|---:|---:|---|"]
    lines += [f"| {lb} | {w:.1f} | {c:.1f} | {ld:.1f} | {ln.replace('jaxmove: ', '')} |"
              for lb, w, c, ld, ln, _ in runs]
    lines += ["", f"Warm / cold wall time: {runs[1][1] / runs[0][1]:.2f}; the warm run's plan figures are "
              f"{'identical to' if same else 'DIFFERENT FROM'} the cold run's (every JSON field but "
              f"compile_s). The cache holds {size / 2**20:.2f} MiB for the 3 plans. The key holds the "
              "program's source lines, so an edit of the model's source between runs makes the next "
              "run cold.", ""]
    return lines


def _write_cache_only(path: str) -> int:
    p = Path(path)
    text = p.read_text(encoding="utf-8") if p.is_file() else ""
    head = text.split(CACHE_MARK)[0].rstrip("\n")
    p.write_text((head + "\n\n" if head else "") + "\n".join(cache_section()), encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cache-only", action="store_true", help="only the compile cache table")
    ap.add_argument("-o", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args()
    if args.cache_only:
        return _write_cache_only(args.o)

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
    if not args.quick:
        lines += cache_section()
    Path(args.o).write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {args.o}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
