"""Compile + analyze time and peak memory of the zoo's full-size presets, per compile target.

Each preset runs in a fresh process (so its peak resident memory is its own):
build (abstract arguments) -> capture (lower + compile) -> analyze. Writes
benchmarks/zoo_compile.md, one section per target; a run with ``--targets`` rewrites only
those targets' sections and keeps the others as they are in the file.

    python benchmarks/zoo_compile.py                          # cpu + tpu-v5e:4x4 + h100-sxm:1x1x8
    python benchmarks/zoo_compile.py --targets tpu-v5e:4x4,h100-sxm:1x1x8 --modes prefill,decode
    python benchmarks/zoo_compile.py --one llama3-8b-decode --target tpu-v5e:4x4 --set scan_layers=false

On an accelerator target (deviceless compilation, capture/targets.py) the program is the
``fsdp`` plan over every device of the topology, the mesh ``jaxmove plans --target`` uses
(``Target.default_mesh``: ``model`` over the innermost dimension, ``data`` over the rest),
built by ``plans.compare.capture_with_plan``. ``fits`` is the target compiler's verdict as in
``plans``: XLA:TPU refuses a program that does not fit its HBM (a result row, ``NO``); XLA:GPU
does not check, so its ``fits`` compares ``memory_analysis()`` (argument + output - alias +
temp bytes) with the spec's HBM capacity (``plans.compare.summarize``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
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
name, sets, target = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
out = {"import_s": t_import}
if target != "cpu":
    from jaxmove.capture.targets import DoesNotFitError, Target
    from jaxmove.plans.compare import capture_with_plan
    from jaxmove.plans.plan import load_plan
    tgt = Target.parse(target)
    mesh = tgt.default_mesh()
    t = time.perf_counter(); tgt.devices(); out["devices_s"] = time.perf_counter() - t
    out["mesh"] = mesh
t = time.perf_counter(); wl = zoo.build(name, sets); out["build_s"] = time.perf_counter() - t
out["params"] = zoo.transformer.parameter_count(wl.args[0])
t = time.perf_counter()
if target == "cpu":
    prog = capture(wl)
else:
    try:
        prog = capture_with_plan(wl, None, load_plan("fsdp"), mesh, [], None, tgt.name)
    except DoesNotFitError as e:
        out.update(capture_s=time.perf_counter() - t, fits=False, needs_bytes=e.needs_bytes,
                   has_bytes=e.has_bytes, does_not_fit=e.compiler_message,
                   peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        json.dump(out, sys.stdout); sys.exit(0)
out["capture_s"] = time.perf_counter() - t
t = time.perf_counter(); rep = analyze(prog); out["analyze_s"] = time.perf_counter() - t
ms = dict(prog.memory_stats or {})
keys = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
if all(k in ms for k in keys):
    out["peak_bytes"] = (ms[keys[0]] + ms[keys[1]] - ms.get("alias_size_in_bytes", 0) + ms[keys[2]])
if target != "cpu":
    # plans.compare.summarize: XLA:TPU refuses what does not fit (it compiled: it fits);
    # XLA:GPU does not check, so compare its memory_analysis with the spec's capacity
    cap = tgt.spec().hbm_capacity_bytes
    out["has_bytes"] = cap
    out["fits"] = True if tgt.platform == "tpu" else (
        None if "peak_bytes" not in out else out["peak_bytes"] <= cap)
out.update(peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           instructions=len(rep.rows),
           hbm_bytes=rep.totals.hbm_read_bytes + rep.totals.hbm_write_bytes, flops=rep.totals.flops)
json.dump(out, sys.stdout)
"""

FAMILIES = ("llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "deepseek-v3", "gemma2-9b")
MODES = ("prefill", "decode", "train")
TARGETS = ("cpu", "tpu-v5e:4x4", "h100-sxm:1x1x8")
_MARK = "<!-- target: {} -->"


def run(name: str, sets: dict[str, str], target: str = "cpu", timeout_s: float = 1800) -> dict:
    """One preset in a fresh process; the worker's figures plus ``wall_s`` and the 1-minute
    load average before and after (``os.getloadavg``), or ``error`` (the child's last line)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _WORKER, name, json.dumps(sets), target],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s", "wall_s": time.perf_counter() - t,
                "load": (load0, os.getloadavg()[0])}
    wall = time.perf_counter() - t
    load = (load0, os.getloadavg()[0])
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed",
                "wall_s": wall, "load": load}
    out = json.loads(proc.stdout)
    out.update(wall_s=wall, load=load)
    return out


def _gib(n) -> str:
    return "" if n is None else f"{n / 2**30:.1f}"


def cpu_section(rows: list[tuple[str, dict]]) -> list[str]:
    loads = [x for _, r in rows for x in r.get("load", ())]
    lines = [
        _MARK.format("cpu"),
        "## cpu (XLA:CPU, one device)",
        "",
        f"Measured by `python benchmarks/zoo_compile.py --targets cpu` on {platform.machine()} "
        f"({os.cpu_count()} CPUs, shared with other jobs"
        + (f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f} during the run" if loads else "")
        + "), jax/XLA:CPU, abstract arguments "
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
    return lines + [""]


def target_section(target: str, rows: list[tuple[str, dict]], argv_text: str) -> list[str]:
    loads = [x for _, r in rows for x in r.get("load", ())]
    mesh = next((r["mesh"] for _, r in rows if "mesh" in r), None)
    mesh_text = ",".join(f"{k}={v}" for k, v in mesh.items()) if mesh else "(default mesh)"
    gpu = target.startswith(("h100", "h200", "b200", "a100"))
    verdict = ("`fits` is the GPU verdict `plans` gives: XLA:GPU does not check device memory, so it "
               "compares the compiled program's `memory_analysis()` (argument + output - alias + "
               "temp bytes per device) with the spec's HBM capacity"
               if gpu else
               "`fits` is the compiler's verdict: XLA:TPU refuses a program that does not fit a "
               "chip's HBM (a result row: `NO`, with the compiler's *needs*; the compile time is "
               "then the time until the refusal, and *has* is the compiler's usable HBM; a row that "
               "fits shows its `memory_analysis()` peak against the spec's capacity, 16 GB)")
    lines = [
        _MARK.format(target),
        f"## {target} (fsdp over {mesh_text})",
        "",
        f"Measured by `python benchmarks/zoo_compile.py {argv_text}` on {platform.machine()} "
        f"({os.cpu_count()} CPUs, shared with other jobs"
        + (f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f} during the run" if loads else "")
        + f"): deviceless compilation for `--target {target}` with `scan_layers=true` (the presets' "
        f"default), abstract arguments, one fresh process per preset. The program is the `fsdp` plan "
        f"over every device ({mesh_text}, the mesh `jaxmove plans {{preset}} --target {target} --plan fsdp` "
        "uses): *devices* = loading the compile-only topology, *build* = `zoo.build`, *compile* = "
        "`capture_with_plan` (shardings + lower + the target compiler), *analyze* = "
        f"`jaxmove.analyze` of the per-device HLO; *peak RSS* as above. {verdict}. *device GiB* = "
        "that per-device peak (needs/has). Training rows: micro-batch 1 x 8192 with AdamW state; "
        "the `--set remat=full` rows rematerialise every layer (`jax.checkpoint` with "
        "`nothing_saveable`).",
        "",
        "| preset | params | devices s | build s | compile s | analyze s | total s | peak RSS GiB | fits | device GiB needs / has | HLO rows |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for label, r in rows:
        if "error" in r:
            lines.append(f"| {label} | error: {r['error']} | | | | | {r['wall_s']:.1f} | | | | |")
            continue
        total = r.get("devices_s", 0) + r["build_s"] + r["capture_s"] + r.get("analyze_s", 0)
        fits = {True: "yes", False: "NO", None: "?"}[r.get("fits")]
        needs = r.get("needs_bytes", r.get("peak_bytes"))
        mem = f"{_gib(needs) or '?'} / {_gib(r.get('has_bytes')) or '?'}"
        an = f"{r['analyze_s']:.1f}" if "analyze_s" in r else "-"
        rows_n = r.get("instructions", "-")
        lines.append(f"| {label} | {r['params'] / 1e9:.2f}B | {r.get('devices_s', 0):.1f} | {r['build_s']:.1f} "
                     f"| {r['capture_s']:.1f} | {an} | {total:.1f} | {r['peak_rss_bytes'] / 2**30:.2f} "
                     f"| {fits} | {mem} | {rows_n} |")
    return lines + [""]


def _old_sections(text: str) -> dict[str, str]:
    """The sections of an existing zoo_compile.md by target (``<!-- target: NAME -->``); a file
    from before the per-target layout is all the cpu section (up to its closing note)."""
    if "<!-- target:" not in text:
        body = text.split("\nNot measured here:")[0]
        body = re.sub(r"^# .*\n\n", "", body)
        return {"cpu": _MARK.format("cpu") + "\n## cpu (XLA:CPU, one device)\n\n" + body.strip() + "\n"}
    parts = re.split(r"^(<!-- target: (\S+) -->)$", text, flags=re.M)
    out = {}
    for i in range(1, len(parts), 3):
        out[parts[i + 1]] = (parts[i] + parts[i + 2]).rstrip() + "\n"
    return out


def write(sections: dict[str, str]) -> None:
    order = [t for t in TARGETS if t in sections] + [t for t in sections if t not in TARGETS]
    head = ["# Zoo presets at full size: compile + analyze per compile target", "",
            "Produced by `benchmarks/zoo_compile.py`; each section says the command and the machine "
            "load of its run.", ""]
    missing = [t for t in TARGETS if t not in sections]
    tail = [f"Not measured yet: {', '.join(missing)}.", ""] if missing else []
    OUT.write_text("\n".join(head) + "\n" + "\n".join(sections[t] for t in order) + "\n".join(tail),
                   encoding="utf-8")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help=f"comma-separated compile targets (default: {','.join(TARGETS)})")
    ap.add_argument("--modes", default=",".join(MODES), help="prefill,decode,train (default: all)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--one", metavar="PRESET", help="run one preset and print its JSON")
    ap.add_argument("--target", default="cpu", help="with --one: the target")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--timeout-s", type=float, default=1800)
    a = ap.parse_args(argv)
    if a.one:
        sets = dict(s.split("=", 1) for s in a.set)
        print(json.dumps(run(a.one, sets, a.target, a.timeout_s), indent=1))
        return
    targets = [t for t in a.targets.split(",") if t]
    modes = [m for m in a.modes.split(",") if m]
    families = [f for f in a.families.split(",") if f]
    sections = _old_sections(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
    argv_text = " ".join(argv)
    for target in targets:
        cases = [(f"{f}-{m}", {}) for m in modes for f in families]
        if target == "cpu":
            cases.append(("llama3-70b-decode", {"scan_layers": "false"}))
            cases.append(("llama3-70b-prefill", {"scan_layers": "false"}))
        elif "train" in modes:
            # the training steps without rematerialisation need far more than a chip or GPU
            # holds at seq_len 8192: the same steps with every layer rematerialised
            cases += [(f"{f}-train", {"remat": "full"}) for f in families]
        rows = []
        for name, sets in cases:
            r = run(name, sets, target, a.timeout_s)
            label = name + "".join(f" --set {k}={v}" for k, v in sets.items())
            print(target, label, json.dumps(r), flush=True)
            rows.append((label, r))
            # rewrite after every row: an interrupted run keeps what it measured
            sections[target] = "\n".join(cpu_section(rows) if target == "cpu"
                                         else target_section(target, rows, argv_text))
            write(sections)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
