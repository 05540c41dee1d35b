"""Compile + analyze time and peak memory of the zoo's full-size presets on CPU.

Each preset runs in a fresh process (so its peak resident memory is its own):
build (abstract arguments) -> capture (lower + XLA:CPU compile) -> analyze. Writes
benchmarks/zoo_compile.md.

    python benchmarks/zoo_compile.py                 # every Llama-class preset + unrolled 70B
    python benchmarks/zoo_compile.py llama3-8b-decode --set scan_layers=false
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "zoo_compile.md"

_WORKER = """
import json, resource, sys, time
t0 = time.perf_counter()
from jaxmove import zoo, analyze
from jaxmove.capture import capture
t_import = time.perf_counter() - t0
name, sets = sys.argv[1], json.loads(sys.argv[2])
t = time.perf_counter(); wl = zoo.build(name, sets); t_build = time.perf_counter() - t
t = time.perf_counter(); prog = capture(wl); t_capture = time.perf_counter() - t
t = time.perf_counter(); rep = analyze(prog); t_analyze = time.perf_counter() - t
params = zoo.transformer.parameter_count(wl.args[0])
json.dump({"import_s": t_import, "build_s": t_build, "capture_s": t_capture,
           "analyze_s": t_analyze, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "params": params, "instructions": len(rep.rows),
           "hbm_bytes": rep.totals.hbm_read_bytes + rep.totals.hbm_write_bytes,
           "flops": rep.totals.flops}, sys.stdout)
"""

FAMILIES = ("llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "deepseek-v3", "gemma2-9b")
MODES = ("prefill", "decode", "train")


def run(name: str, sets: dict[str, str], timeout_s: float = 1800) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _WORKER, name, json.dumps(sets)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed",
                "wall_s": wall}
    out = json.loads(proc.stdout)
    out["wall_s"] = wall
    return out


def main(argv: list[str]) -> None:
    if argv:
        sets = dict(a.split("=", 1) for a in argv[2::2]) if len(argv) > 1 else {}
        print(json.dumps(run(argv[0], sets), indent=1))
        return
    cases = [(f"{f}-{m}", {}) for f in FAMILIES for m in MODES]
    cases.append(("llama3-70b-decode", {"scan_layers": "false"}))
    cases.append(("llama3-70b-prefill", {"scan_layers": "false"}))
    rows = []
    for name, sets in cases:
        r = run(name, sets)
        label = name + "".join(f" --set {k}={v}" for k, v in sets.items())
        print(label, json.dumps(r), flush=True)
        rows.append((label, r))
    lines = [
        "# Zoo presets at full size: compile + analyze on CPU",
        "",
        f"Measured by `python benchmarks/zoo_compile.py` on {platform.machine()} "
        f"({os.cpu_count()} CPUs, shared with other jobs), jax/XLA:CPU, abstract arguments "
        "(nothing allocated). One fresh process per preset: *build* = `zoo.build` (eval_shape of "
        "the model + the array-size check), *compile* = `capture` (lower + XLA:CPU compile), "
        "*analyze* = `jaxmove.analyze` of the compiled HLO; *peak RSS* = the process's maximum "
        "resident memory (ru_maxrss). Presets default to `scan_layers=true` (bf16); the last rows "
        "unroll the 80 layers of Llama 3 70B.",
        "",
        "| preset | params | build s | compile s | analyze s | total s | peak RSS GiB | HLO rows |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in rows:
        if "error" in r:
            lines.append(f"| {label} | error: {r['error']} | | | | {r['wall_s']:.1f} | | |")
            continue
        total = r["build_s"] + r["capture_s"] + r["analyze_s"]
        lines.append(f"| {label} | {r['params'] / 1e9:.2f}B | {r['build_s']:.1f} | {r['capture_s']:.1f} "
                     f"| {r['analyze_s']:.1f} | {total:.1f} | {r['peak_rss_bytes'] / 2**30:.2f} "
                     f"| {r['instructions']} |")
    lines += [
        "",
        "Not measured here: TPU (`tpu-v5e:4x4`) and GPU (`h100-sxm:1x1x8`) targets -- the "
        "`--target` API (jaxmove/capture/targets.py) had not landed when this table was made.",
        "",
    ]
    OUT.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
