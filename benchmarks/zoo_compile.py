"""Compile + analyze time and peak memory of the zoo's full-size presets, per compile target.

Each preset runs in a fresh process (so its peak resident memory is its own):
build (abstract arguments) -> capture (lower + compile) -> analyze. Writes
benchmarks/zoo_compile.md, one section per target; a run with ``--targets`` rewrites only
those targets' sections and keeps the others as they are in the file.

    python benchmarks/zoo_compile.py                          # cpu + tpu-v5e:4x4 + h100-sxm:1x1x8
    python benchmarks/zoo_compile.py --targets tpu-v5e:4x4,h100-sxm:1x1x8 --modes prefill,decode
    python benchmarks/zoo_compile.py --one llama3-8b-decode --target tpu-v5e:4x4 --set scan_layers=false
    python benchmarks/zoo_compile.py --serving                # excess of the default decode presets

``--serving`` (issue 24) runs ``jaxmove analyze PRESET --target T --excess --xla --json`` for the
default decode presets on tpu-v5e, tpu-v5p, h100-sxm and b200 (one device when weights + cache
fit in 90% of its HBM, else ``--plan tp`` over the smallest power-of-two topology that holds
them, ``model`` over every device) and the scaling book's Llama 3 70B int8 decode
(jax-ml/scaling-book, "applied inference"), and writes the ``serving`` section: compulsory
vs compiled HBM bytes by role (the excess pass), excess %, jaxmove's estimate, the bandwidth
bound (the compulsory weights + cache bytes of one device / the spec's HBM bandwidth) and fits.

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
import fnmatch
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
        "resident memory (ru_maxrss). Presets use their defaults (bf16; inference unrolled, decode over "
        "a stacked cache, training scanned); the last rows scan the 80 layers of Llama 3 70B.",
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
        + f"): deviceless compilation for `--target {target}` with the presets' defaults (inference "
        f"unrolled, training scanned), abstract arguments, one fresh process per preset. The program is the `fsdp` plan "
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


# ---- serving: the excess of the default decode presets (issue 24) -------------------------

#: serving targets: name -> topology text per device count (the topologies libtpu and the
#: CUDA plugin accept; capture/targets.py)
SERVING_TARGETS = {
    "tpu-v5e": {1: "", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8"},
    "tpu-v5p": {1: "", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4"},
    "h100-sxm": {1: "", 8: "1x1x8", 16: "1x2x8", 32: "1x4x8", 64: "1x8x8"},
    "b200": {1: "", 8: "1x1x8", 16: "1x2x8", 32: "1x4x8", 64: "1x8x8"},
}
#: the scaling book's check: (label, target, sets, the book's time in seconds):
#: (70e9 + 32 x 8192 x 160e3) B / (chips x 8.1e11 B/s)
#: (the TPU cache layout, ``stacked_cache``: 16 MiB of K and of V per layer and chip would
#: otherwise be staged through VMEM and written back whole)
SCALING_BOOK = [
    ("llama3-70b-decode int8 weights + int8 KV", "tpu-v5e:4x4",
     {"weights_dtype": "int8", "kv_dtype": "int8", "stacked_cache": "true"},
     (70e9 + 32 * 8192 * 160e3) / (16 * 8.1e11)),
    ("llama3-70b-decode int8 weights + int8 KV", "tpu-v5e:4x2",
     {"weights_dtype": "int8", "kv_dtype": "int8", "stacked_cache": "true"},
     (70e9 + 32 * 8192 * 160e3) / (8 * 8.1e11)),
]


def resident_bytes(name: str, sets: dict[str, str]) -> dict[str, int]:
    """Bytes of the preset's arguments by role (weights, kv_cache), from its abstract workload."""
    import jax
    from jaxmove import zoo
    # scanned: the same arguments' bytes, faster to trace; not where a local layer's cache is a
    # ring of its window when unrolled (Gemma 2: TransformerConfig.ring_length)
    ring = zoo.PRESETS[name].config.get("sliding_window") is not None
    wl = zoo.build(name, sets if ring else {**sets, "scan_layers": "true"})
    out: dict[str, int] = {}
    for arg, role in zip(wl.args, wl.roles):
        leaves = jax.tree.leaves(arg)
        roles = [role] * len(leaves) if isinstance(role, str) else jax.tree.leaves(role)
        for leaf, r in zip(leaves, roles):
            out[r] = out.get(r, 0) + leaf.size * leaf.dtype.itemsize
    return out


def serving_case(name: str, sets: dict[str, str], family: str, n: int | None = None,
                 timeout_s: float = 1800, topo: str | None = None) -> dict:
    """``jaxmove analyze`` of one case in a fresh process; n devices (None: the smallest that
    holds weights + cache in 90% of a device's HBM, ``--plan tp`` when more than one)."""
    from jaxmove.hardware import load_spec
    spec = load_spec(family)
    res = resident_bytes(name, sets)
    need = res.get("weights", 0) + res.get("kv_cache", 0)
    if n is None:
        n = next((k for k in sorted(SERVING_TARGETS[family])
                  if need / k <= 0.9 * spec.hbm_capacity_bytes), None)
        if n is None:
            return {"error": f"needs {need / 2**30:.0f} GiB: more than the largest topology listed"}
    topo = SERVING_TARGETS[family][n] if topo is None else topo
    target = f"{family}:{topo}" if topo else family
    argv = ["analyze", name, "--target", target, "--excess", "--xla", "--json"]
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    if n > 1:
        argv += ["--mesh", f"model={n}", "--plan", "tp"]
    cmd = [sys.executable, "-c", "import sys; from jaxmove.cli import main; sys.exit(main(sys.argv[1:]))",
           *argv]
    t = time.perf_counter()
    load0 = os.getloadavg()[0]
    try:
        # several processes may load libtpu at once (tests/device_compile.py)
        proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu",
                                                      ALLOW_MULTIPLE_LIBTPU_LOAD="1"),
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"target": target, "n": n, "error": f"timed out after {timeout_s:.0f} s"}
    out = {"target": target, "n": n, "cmd": "jaxmove " + " ".join(argv[:-3] if False else argv),
           "wall_s": time.perf_counter() - t, "load": (load0, os.getloadavg()[0]),
           "resident_bytes": res, "hbm_bytes_per_s": spec.hbm_bytes_per_s,
           "capacity_bytes": spec.hbm_capacity_bytes}
    if proc.returncode != 0:
        lines = [x for x in (proc.stderr + proc.stdout).strip().splitlines() if x.startswith("jaxmove")]
        last = lines[-1] if lines else f"exit {proc.returncode}"
        out.update(error=last, fits=False if "does not fit" in last or "needs" in last else None)
        return out
    j = json.loads(proc.stdout)
    ms = j.get("memory_stats") or {}
    peak = (ms.get("argument_size_in_bytes", 0) + ms.get("output_size_in_bytes", 0)
            - ms.get("alias_size_in_bytes", 0) + ms.get("temp_size_in_bytes", 0)) if ms else None
    ex = j["excess"]
    out.update(excess_fraction=ex["excess_fraction"], compulsory_bytes=ex["compulsory_bytes"],
               compiled_bytes=ex["compiled_bytes"],
               by_role={r: (v["compulsory_bytes"], v["compiled_bytes"]) for r, v in ex["by_role"].items()},
               causes=[(c["kind"], c.get("subject"), c["bytes"]) for c in ex["causes"][:3]],
               est_time_s=j["time"]["est_time_s"], bound=j["time"].get("bound"),
               complete=j.get("complete"), unmodeled=j.get("unmodeled_count"),
               xla_estimated_s=(j.get("xla") or {}).get("estimated_s"),
               peak_bytes=peak, fits=True if target.startswith("tpu") else
               (None if peak is None else peak <= spec.hbm_capacity_bytes))
    return out


def _role_text(by_role: dict, role: str) -> str:
    c, g = by_role.get(role, (0, 0))
    if not c and not g:
        return "-"
    return f"{c / 2**30:.2f} / {g / 2**30:.2f} ({(g / c - 1) * 100 if c else 0:+.1f}%)"


def serving_section(rows: list[tuple[str, dict]], book: list[tuple[str, dict, float]],
                    commentary: str = "", argv_text: str = "--serving") -> list[str]:
    """The serving section's lines: the two tables (a row dict with ``line`` is an earlier
    run's line, kept as it was), then ``commentary`` (hand-written notes on the rows, kept
    from the file across runs)."""
    loads = [x for _, r in rows for x in r.get("load", ())]
    lines = [
        _MARK.format("serving"),
        "## serving: default decode presets, compulsory vs compiled (issue 24)",
        "",
        f"Measured by `python benchmarks/zoo_compile.py {argv_text}` on {platform.machine()} "
        f"({os.cpu_count()} CPUs, shared with other jobs"
        + (f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f} during the run" if loads else "")
        + "). Each row is `jaxmove analyze PRESET --target T --excess --xla --json` (the command "
        "column; deviceless compilation, the presets' defaults: bf16, unrolled layers, batch 32, "
        "cache 8192, attention=auto, weights in the layouts XLA picks: `--weight-layouts auto`, "
        "the inference presets' default on TPU / GPU targets). One device when the weights and the cache fit in 90% of its HBM, else "
        "`--plan tp` over `model` = every device of the smallest power-of-two topology that holds "
        "them (kv heads fewer than the devices: the cache split over batch, the plan's fallback). "
        "Per device, GiB *compulsory / compiled (excess)* by role from the excess pass; *excess* = "
        "(compiled - compulsory) / compiled over every path; *estimate* = jaxmove's time "
        "(passes/timing.py, the target's spec); *bandwidth bound* = the compulsory weights + cache "
        "bytes of one device (a weight or cache the plan replicates counts on every device) / the "
        "spec's HBM bandwidth; *XLA est.* = XLA:TPU's own `estimated_cycles` at the "
        "spec's clock (TPU only); *fits* = XLA:TPU compiled it (it refuses what does not fit) / "
        "XLA:GPU's `memory_analysis()` within the spec's HBM.",
        "",
        "*run* = the day the row was compiled (`--rerun` compiles some rows again and keeps the "
        "others' lines as they were).",
        "",
        "| preset | command | weights | kv_cache | activations | excess | estimate ms | bandwidth bound ms | XLA est. ms | fits | top causes | run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]

    def row(label, r):
        if "line" in r:   # kept from the file as it was (``--rerun``)
            return r["line"]
        return _row(label, r) + f" {r.get('date', '-')} |"

    def _row(label, r):
        if "error" in r:
            return (f"| {label} | `{r.get('cmd', '')}` | error: {r['error']} | | | | | | | "
                    f"{'NO' if r.get('fits') is False else '?'} | |")
        # what one device must read of weights and cache (the excess pass's compulsory bytes):
        # a weight or cache the plan replicates (DeepSeek-V3's latent cache under tp, the k / v
        # kernels of fewer kv heads than devices) counts on every device
        need = r["by_role"].get("weights", [0])[0] + r["by_role"].get("kv_cache", [0])[0]
        bound_s = need / r["hbm_bytes_per_s"]
        fits = {True: "yes", False: "NO", None: "?"}[r.get("fits")]
        causes = "; ".join(f"{k} {s or ''} {b / 2**20:.0f} MiB".replace("  ", " ") for k, s, b in r["causes"])
        xla = f"{r['xla_estimated_s'] * 1e3:.2f}" if r.get("xla_estimated_s") else "-"
        inc = "" if r.get("complete", True) else " (incomplete)"
        return (f"| {label} | `{r['cmd'].replace(' --excess --xla --json', '')}` | "
                f"{_role_text(r['by_role'], 'weights')} | {_role_text(r['by_role'], 'kv_cache')} | "
                f"{_role_text(r['by_role'], 'activations')} | {r['excess_fraction'] * 100:.1f}% | "
                f"{r['est_time_s'] * 1e3:.2f}{inc} | {bound_s * 1e3:.2f} | {xla} | {fits} | {causes} |")

    for label, r in rows:
        lines.append(row(label, r))
    if book:
        lines += ["", "The scaling book's Llama 3 70B decode (jax-ml/scaling-book, \"applied "
                  "inference\": int8 weights and KV, batch 32, 8192 context; the book's time = "
                  "(70e9 + 32 x 8192 x 160e3) B / (chips x 8.1e11 B/s)); *ratio* = estimate / book:",
                  "", "| preset | command | weights | kv_cache | activations | excess | estimate ms "
                  "| bandwidth bound ms | XLA est. ms | fits | top causes | book ms | ratio | run |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---|"]
        for label, r, book_s in book:
            if "line" in r:
                lines.append(r["line"])
                continue
            ratio = f"{r['est_time_s'] / book_s:.2f}" if "est_time_s" in r else "-"
            lines.append(_row(label, r) + f" {book_s * 1e3:.1f} | {ratio} | {r.get('date', '-')} |")
    return lines + [""] + ([commentary.rstrip(), ""] if commentary else [])


def _resumed(path: str | None) -> dict[tuple[str, ...], dict]:
    """Rows of an earlier run's log (its ``book TARGET {json}`` / ``serving FAMILY PRESET {json}``
    lines, as this script prints them), reused by ``--resume LOG`` instead of compiling again."""
    out: dict[tuple[str, ...], dict] = {}
    if not path or not os.path.exists(path):
        return out
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        parts = line.split(" ", 3)
        if parts[0] == "book" and len(parts) >= 3:
            out[("book", parts[1])] = json.loads(line.split(" ", 2)[2])
        elif parts[0] == "serving" and len(parts) == 4:
            out[("serving", parts[1], parts[2])] = json.loads(parts[3])
    return {k: v for k, v in out.items() if "error" not in v}


def serving(argv_text: str, families: list[str], timeout_s: float, book_only: bool = False,
            resume: str | None = None, rerun: list[str] | None = None) -> None:
    """Compile and analyze the serving rows (and the scaling book's), rewriting the section
    after each; with ``rerun`` (``FAMILY@TARGET`` fnmatch patterns, ``book``) only the rows
    that match compile, the others keep their lines from the file."""
    done = _resumed(resume)
    sections = _old_sections(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
    old_rows, old_book, commentary = _old_serving(sections.get("serving", ""))
    rows: list[tuple[str, dict]] = []
    book: list[tuple[str, dict, float]] = []
    today = time.strftime("%Y-%m-%d")

    def flush():
        sections["serving"] = "\n".join(serving_section(rows, book, commentary, argv_text))
        write(sections)

    def chosen(fam: str, family: str) -> bool:   # --rerun FAMILY@TARGET (fnmatch patterns), book
        return rerun is None or any(fnmatch.fnmatch(f"{fam}@{family}", pat) for pat in rerun)

    for i, (label, target, sets, book_s) in enumerate(SCALING_BOOK):
        family, topo = target.split(":")
        n = 1
        for x in topo.split("x"):
            n *= int(x)
        if rerun is not None and "book" not in rerun and i < len(old_book):
            book.append((label, {"line": old_book[i]}, book_s))
            continue
        r = done.get(("book", target)) or dict(serving_case("llama3-70b-decode", sets, family, n,
                                                            timeout_s, topo), date=today)
        print("book", target, json.dumps(r), flush=True)
        book.append((label, r, book_s))
        flush()
    if book_only:
        flush()
        return
    for fam in families:
        for family in SERVING_TARGETS:
            kept = old_rows.get((f"{fam}-decode", family))
            if not chosen(fam, family) and kept is not None:
                rows.append((f"{fam}-decode", {"line": kept}))
                continue
            r = done.get(("serving", family, fam)) or dict(serving_case(f"{fam}-decode", {}, family,
                                                                        None, timeout_s), date=today)
            print("serving", family, fam, json.dumps(r), flush=True)
            rows.append((f"{fam}-decode", r))
            flush()
    flush()   # (rows kept from the file are not flushed one by one)


def _old_serving(section: str) -> tuple[dict[tuple[str, str], str], list[str], str]:
    """From an existing serving section: ({(preset, target family): its table line}, the
    scaling book table's lines, the hand-written notes after the tables, from "Reading the
    rows"). Lines from before the *run* column get one: "before 2026-12-07". A row whose
    command names no target (a preset no listed topology holds) is keyed by the first target
    family without a line of that preset, in SERVING_TARGETS order (the order rows are written)."""
    rows: dict[tuple[str, str], str] = {}
    book: list[str] = []
    note = ""
    if "Reading the rows" in section:
        section, note = section.split("Reading the rows", 1)
        note = "Reading the rows" + note
    in_book = False
    for line in section.splitlines():
        if line.startswith("The scaling book"):
            in_book = True
        if not line.startswith("| ") or line.startswith("| preset"):
            continue
        cells = line.split(" | ")
        if len(cells) in (11, 13):   # (before the run column)
            line = line + " before 2026-12-07 |"
        if in_book:
            book.append(line)
            continue
        preset = cells[0][2:]
        m = re.search(r"--target ([^\s`]+)", line)
        family = m.group(1).split(":")[0] if m else next(
            (f for f in SERVING_TARGETS if (preset, f) not in rows), None)
        if family is not None:
            rows[(preset, family)] = line
    return rows, book, note


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
    ap.add_argument("--serving", action="store_true",
                    help="the serving section: excess of the default decode presets (module docstring)")
    ap.add_argument("--book-only", action="store_true", help="with --serving: the scaling book rows only")
    ap.add_argument("--resume", metavar="LOG", help="with --serving: reuse the rows of an earlier run's log")
    ap.add_argument("--rerun", action="append", metavar="FAMILY@TARGET",
                    help="with --serving: compile only the rows that match (fnmatch: gemma2-9b@*, "
                         "*@h100-sxm; 'book': the scaling book's rows) and keep the others' lines "
                         "from the file; repeatable")
    a = ap.parse_args(argv)
    if a.serving:
        fams = [f for f in a.families.split(",") if f]
        serving(" ".join(argv), fams, a.timeout_s, a.book_only, a.resume, a.rerun)
        print(f"wrote {OUT}")
        return
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
            cases.append(("llama3-70b-decode", {"scan_layers": "true"}))
            cases.append(("llama3-70b-prefill", {"scan_layers": "true"}))
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
