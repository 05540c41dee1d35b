"""Speed and scale of jaxmove's parser and passes, against XLA's own C++ parser.

    python benchmarks/parse_speed.py            # corpus module, 10k, 100k, 1M instructions
    python benchmarks/parse_speed.py --max 100000 --repeat 1

The table is printed and written to ``benchmarks/parse_speed.md`` (``--out``; ``--out ''``
writes nothing).

For each module: the time to parse (``parse_module``), to run the passes (``analyze_module``),
the reuse pass and the excess pass (``passes/excess/``), as ``jaxmove analyze FILE`` runs them;
the headline ``total with excess s`` is all four, what a user waits for (``analyze() s``: the
same end to end through ``jaxmove.analyze(path)``, the report included); instructions per second and microseconds per
instruction of that total (flat when cost grows linearly), peak memory of the process, and the
time of
``jaxlib._hlo.hlo_module_from_text`` (XLA's parser, no passes) on the same text in the same
run. Each measurement runs in a fresh subprocess, so peak RSS (``VmHWM``) is that of one
parse (+ analysis) alone; the text is read from a file before timing starts. Times are the
best of ``--repeat`` runs in that subprocess (wall clock, ``time.perf_counter``).

Modules: (a) the largest file of the HLO corpus (../shared/corpus/hlo, when present);
(b)-(d) synthetic unrolled transformers of 10k / 100k / 1M instructions from
``benchmarks/synth_hlo.py`` (fusions, dots, all-reduce start/done, a while loop, metadata);
(e) a *wide* module of 100k instructions: one fusion of 25k operands returning a 25k-tuple
(per-operand costs that are not O(1) would show up there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent.parent / "shared" / "corpus" / "hlo"


def _peak_rss_bytes() -> int:
    """This process's peak resident set: VmHWM from /proc (Linux; fresh after exec, unlike
    ``ru_maxrss``, which a child inherits from the parent that forked it), else ru_maxrss."""
    import resource
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(kind: str, path: str, repeat: int) -> dict:
    """Runs in the subprocess: time one parser on the text in ``path``; print JSON."""
    import gc
    text = Path(path).read_text()
    out: dict = {}
    if kind == "xla":
        from jaxlib import _hlo
        rss0 = _peak_rss_bytes()
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            mod = _hlo.hlo_module_from_text(text)
            best = min(best, time.perf_counter() - t)
            del mod
        out.update(parse_s=best)
    else:
        sys.path.insert(0, str(HERE.parent))
        import jaxmove
        from jaxmove.hlo import parse_module
        from jaxmove.passes.pipeline import analyze_module
        from jaxmove.passes.excess import excess_pass
        from jaxmove.passes.reuse import reuse_pass
        rss0 = _peak_rss_bytes()
        best_p = best_a = best_r = best_e = best_api = float("inf")
        for _ in range(repeat):
            gc.collect()
            # the passes `jaxmove analyze FILE` runs without --hardware (pipeline.run_pipeline
            # with no spec), each timed
            t = time.perf_counter()
            module = parse_module(text)
            t1 = time.perf_counter()
            analysis = analyze_module(module)
            t2 = time.perf_counter()
            reuse = reuse_pass(analysis, None)
            t3 = time.perf_counter()
            excess_pass(analysis, (), None, reuse, roles=analysis.roles)
            t4 = time.perf_counter()
            best_p, best_a = min(best_p, t1 - t), min(best_a, t2 - t1)
            best_r, best_e = min(best_r, t3 - t2), min(best_e, t4 - t3)
            out["instructions"] = sum(len(c) for c in module.computations.values())
            out["rows"] = len(analysis.rows)
            out["unmodeled"] = len(analysis.unmodeled)
            del module, analysis, reuse
        for _ in range(repeat):  # end to end, as `jaxmove analyze FILE` calls it (the file read too)
            gc.collect()
            t = time.perf_counter()
            jaxmove.analyze(path)
            best_api = min(best_api, time.perf_counter() - t)
        out.update(parse_s=best_p, analyze_s=best_a, reuse_s=best_r, excess_s=best_e, api_s=best_api)
    out["peak_rss_bytes"] = _peak_rss_bytes()
    out["rss_before_bytes"] = rss0
    return out


def _run(kind: str, path: Path, repeat: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", kind, str(path), "--repeat", str(repeat)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max", type=int, default=1_000_000, help="largest synthetic module (instructions)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs per module (1 for >= 1M)")
    ap.add_argument("--no-xla", action="store_true", help="skip XLA's parser")
    ap.add_argument("--out", default=str(HERE / "parse_speed.md"),
                    help="also write the table here (markdown); '' writes nothing")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], args.child[1], args.repeat)))
        return 0

    sys.path.insert(0, str(HERE))
    from synth_hlo import generate, generate_wide

    cases: list[tuple[str, str]] = []
    if CORPUS.is_dir():
        largest = max(CORPUS.glob("*.hlo"), key=lambda p: p.stat().st_size)
        cases.append((f"corpus: {largest.stem[:38]}", largest.read_text()))
    for n in (10_000, 100_000, 1_000_000):
        if n <= args.max:
            cases.append((f"synthetic {n // 1000}k", generate(n)))
    if args.max >= 100_000:
        cases.append(("wide: 25k-operand fusion, 25k-tuples", generate_wide(25_000)))

    load0 = os.getloadavg()
    hdr = (f"{'module':<44} {'instrs':>9} {'MB':>6} {'parse s':>8} {'passes s':>8} {'reuse s':>8} "
           f"{'excess s':>8} {'total with excess s':>19} {'instr/s':>9} {'us/instr':>8} {'peak MiB':>8} "
           f"{'XLA s':>7} {'XLA MiB':>7} {'ours/XLA':>8} {'excess':>6} {'no-ex/XLA':>9} {'analyze() s':>11}")
    lines = [hdr, "-" * len(hdr)]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for label, text in cases:
            path = Path(tmp) / "module.hlo"
            path.write_text(text)
            big = len(text) > 50_000_000
            repeat = 1 if big else (args.repeat if len(text) > 100_000 else max(args.repeat, 20))
            ours = _run("ours", path, repeat)
            xla = {} if args.no_xla else _run("xla", path, repeat)
            if "error" in ours:
                lines.append(f"{label:<44} jaxmove failed: {ours['error']}")
                print(lines[-1], flush=True)
                continue
            ex_s = ours["excess_s"]
            no_ex = ours["parse_s"] + ours["analyze_s"] + ours["reuse_s"]
            total = no_ex + ex_s  # what `jaxmove analyze` waits for: parse + every pass + excess
            n = ours["instructions"]
            xs = xla.get("parse_s")
            ratio = f"{total / xs:8.2f}" if xs else f"{'-':>8}"
            ratio_no_ex = f"{no_ex / xs:9.2f}" if xs else f"{'-':>9}"
            xmib = f"{xla['peak_rss_bytes'] / 2**20:7.0f}" if xs else f"{'-':>7}"
            lines.append(f"{label:<44} {n:>9,} {len(text) / 1e6:>6.1f} {ours['parse_s']:>8.3f} "
                         f"{ours['analyze_s']:>8.3f} {ours['reuse_s']:>8.3f} {ex_s:>8.3f} {total:>19.3f} "
                         f"{n / total:>9,.0f} {1e6 * total / n:>8.2f} {ours['peak_rss_bytes'] / 2**20:>8.0f} "
                         f"{xs if xs else float('nan'):>7.3f} {xmib} {ratio} "
                         f"{100 * ex_s / total:>5.1f}% {ratio_no_ex} {ours['api_s']:>11.3f}")
            print(lines[-1], flush=True)
    load1 = os.getloadavg()
    foot = ("passes = analyze_module (multiplicity, roles, traffic, flops, collectives); reuse = the reuse "
            "pass (fusion reuse; run_pipeline runs it, and the earlier tables of this file left it out); "
            "total with excess = parse + passes + reuse + the excess pass (passes/excess/): every pass "
            "`jaxmove analyze FILE` runs without --hardware (passes/pipeline.run_pipeline), in the same "
            "process and run; peak = max RSS of a fresh process that read the text and parsed it (Python + "
            "text + IR + analysis); ours/XLA = total with excess / XLA's parse alone (issue 28's target: "
            "<= 1.5 at 100k, 1M and the wide module); excess = the excess pass's share of total with excess "
            "(target <= 10%); no-ex/XLA = the total without the excess pass / XLA's parse; analyze() = "
            "`jaxmove.analyze(path)` end to end in the same process (file read, backend inference, parse, "
            f"every pass, the report), what `jaxmove analyze FILE` adds to Python's and jax's import. "
            f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}.")
    print("\n" + foot)
    if args.out:
        cmd = " ".join(["python benchmarks/parse_speed.py"] + (argv if argv is not None else sys.argv[1:]))
        Path(args.out).write_text(
            "# Parse + analysis speed against XLA's parser\n\n"
            "Generated by `benchmarks/parse_speed.py`; do not edit by hand.\n\n"
            f"`{cmd}`, measured {time.strftime('%Y-%m-%d %H:%M')} on {platform.machine()} "
            f"({os.cpu_count()} CPUs), Python {sys.version.split()[0]}, load average (1/5/15 min) "
            f"{'/'.join(f'{x:.2f}' for x in load0)} at the start and "
            f"{'/'.join(f'{x:.2f}' for x in load1)} at the end (other work on the machine slows "
            "every column alike, XLA's too). Times in seconds (wall clock, "
            "best of `--repeat` runs in a fresh process per module and parser).\n\n"
            "```\n" + "\n".join(lines) + "\n```\n\n" + foot + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
