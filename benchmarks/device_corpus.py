"""A corpus of real device programs: every zoo preset, compiled without the device for TPU
and GPU targets under each applicable sharding plan, cached, and analysed by jaxmove.

Why: jaxmove's passes are checked on XLA:CPU programs; device programs (tiled layouts,
async copies and slices, windowed einsums, Triton gemms, ...) once made it reject an input
XLA itself compiled (issue 18). This corpus is the regression net: zero rejections and zero
unmodeled instructions is the bar, and what remains unmodeled is listed by opcode /
custom-call target with its reason.

Per program (preset x size x target x plan) it reports compile s (XLA, deviceless), analysis s
(``jaxmove.analyze`` on the cached HLO text), instructions, unmodeled count and any rejection,
and records the opcodes, custom-call targets and layout kinds (a layout's tile / element-size /
memory-space part, e.g. ``T(8,128)(2,1)S(1)``) it contains.

    python benchmarks/device_corpus.py                     # the full run -> device_corpus.md
    python benchmarks/device_corpus.py --sizes reduced --targets tpu-v5e --presets mlp,moe
    python benchmarks/device_corpus.py --no-write --sizes tiny --presets llama3-8b-decode \
        --weights-dtypes bf16,int8,fp8 --kv-dtypes bf16,int8 --scan true,false   # the dtype / scan matrix
    python benchmarks/device_corpus.py --cached-only --all-cached   # re-analyse the cache, rebuild the .md

Programs compiled with dtype / scan values (``extra``) are checked in a section of their own
(``AXES_BEGIN``): a row per preset x size x target x plan, a cell per combination. Every program
is the XLA attention form (``PINNED``).

Targets: TPU v5e / v5p / v6e topologies of 4 chips (libtpu), H100 / B200 GPU target configs
generated from the h100-sxm / b200 specs (``jaxmove.capture.targets.gpu_target_config``), 4 devices. Plans: ``single`` (one device, nothing sharded) and every plan of
``jaxmove.plans.default_plans`` on a data=2 x model=2 mesh. Sizes: ``full`` (the preset) and
``reduced`` (2 layers, short sequences, small batch). HLO texts are cached in
``benchmarks/.device_corpus/`` (not committed); ``--fresh`` recompiles.

The full run also writes ``benchmarks/device_corpus_coverage.json``: the union of opcodes,
custom-call targets and layout kinds it saw, and a small *slice* of programs (greedy cover,
cheapest first) that together contain all of them; ``tests/test_device_corpus.py`` compiles
and analyses that slice and checks it still covers everything the full run saw.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # never start an accelerator client
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".device_corpus"
COVERAGE = HERE / "device_corpus_coverage.json"
REPORT = HERE / "device_corpus.md"


# name -> (platform, topology or target config)
TARGETS: dict[str, tuple[str, str]] = {
    "tpu-v5e": ("tpu", "v5e:2x2"),
    "tpu-v5p": ("tpu", "v5p:2x2x1"),
    "tpu-v6e": ("tpu", "v6e:2x2"),
    "h100": ("gpu", "h100-sxm"),
    "b200": ("gpu", "b200"),
}
MESH = {"data": 2, "model": 2}
# reduced size: applied where the preset's config has the key
REDUCED = {"layers": "2", "seq_len": "256", "batch": "2", "dense_layers": "1"}
# tiny: reduced, and narrow (a few seconds to compile even for the 70B-405B families)
TINY = {**REDUCED, "d_model": "256", "d_ff": "512", "expert_d_ff": "128", "vocab": "1024"}
SIZES = ("tiny", "reduced", "full")
#: ``--set`` values every program gets where its preset has the key (a program's own ``extra``
#: wins): the XLA attention form. The zoo's default ``attention=auto`` picks Pallas kernels on
#: TPU, and ``jax.jit`` with the plans' NamedShardings refuses to partition them ("Mosaic kernels
#: cannot be automatically partitioned"); the kernels have tests of their own
#: (tests/test_zoo_attention.py). Programs cached before the option existed are this form.
PINNED = {"attention": "xla"}

_DEVICES: dict[str, list] = {}


def devices(target: str) -> list:
    """The 4 devices of a target (TPU topology / GPU target config), loaded once."""
    if target not in _DEVICES:
        from jax.experimental import topologies

        from jaxmove._platform import quiet_stderr
        platform, spec = TARGETS[target]
        with quiet_stderr():
            if platform == "tpu":
                _DEVICES[target] = list(topologies.get_topology_desc(topology_name=spec, platform="tpu").devices)
            else:
                from jaxmove.capture.targets import gpu_target_config
                from jaxmove.hardware import load_spec
                _DEVICES[target] = list(topologies.get_topology_desc(
                    target.split("-")[0], "cuda", target_config=gpu_target_config(load_spec(spec)),
                    topology="1x1x4").devices)
    return _DEVICES[target]


def overrides_for(preset: str, size: str) -> dict[str, str] | None:
    """The ``--set`` values of a size, or None when ``reduced`` would not reduce the preset."""
    from jaxmove import zoo
    if size == "full":
        return {}
    p = zoo.PRESETS[preset]
    fields = {f.name for f in dataclasses.fields(p.config_cls)}
    out = {}
    for k, v in (TINY if size == "tiny" else REDUCED).items():
        if k in fields and int(p.config.get(k, 0) or 0) > int(v):
            out[k] = v
    return out or None


@functools.lru_cache(maxsize=None)
def plans_for(preset: str) -> list[str]:
    """``single`` and the preset's default plans, read from its tiny size (the logical axes do not
    depend on the size; building a full 405B or DeepSeek-V3 abstract model takes minutes)."""
    from jaxmove.plans import default_plans
    return ["single"] + default_plans(preset, overrides_for(preset, "tiny"))


#: the dtype / scan axes (``--weights-dtypes``, ``--kv-dtypes``, ``--scan``): config key -> spelling in keys
AXES = {"weights_dtype": "w", "kv_dtype": "kv", "scan_layers": "scan"}
#: values that mean "the preset's default" (no ``--set``): bf16 weights are the model dtype
DEFAULT_VALUES = {"weights_dtype": ("bf16", "none", ""), "kv_dtype": ("bf16", ""), "scan_layers": ("",)}


def key_of(preset: str, size: str, target: str, plan: str, extra: dict[str, str] | None = None) -> str:
    """The cache key of one program; ``extra`` (the dtype / scan ``--set`` values) as a suffix."""
    tail = "".join(f"__{AXES.get(k, k)}-{v}" for k, v in sorted((extra or {}).items()))
    return f"{preset}__{size}__{target}__{plan}{tail}"


def axis_extras(preset: str, weights_dtypes=None, kv_dtypes=None, scans=None) -> list[dict[str, str]]:
    """The ``--set`` dicts of the dtype / scan axes that apply to ``preset`` (a key its config
    lacks is dropped; a default value sets nothing), deduplicated, in order. Raises ValueError on
    a ``--scan`` value other than true / false."""
    import dataclasses as dc
    import itertools

    from jaxmove import zoo
    fields = {f.name for f in dc.fields(zoo.PRESETS[preset].config_cls)}
    for v in scans or ():
        if v not in ("true", "false"):
            raise ValueError(f"--scan values must be true or false, got {v!r}")
    out: list[dict[str, str]] = []
    for w, kv, sc in itertools.product(weights_dtypes or [""], kv_dtypes or [""], scans or [""]):
        e = {}
        for k, v in (("weights_dtype", w), ("kv_dtype", kv), ("scan_layers", sc)):
            if k in fields and v not in DEFAULT_VALUES[k]:
                e[k] = v
        if e not in out:
            out.append(e)
    return out


def program_inputs(preset: str, size: str, target: str, plan: str, extra: dict[str, str] | None = None):
    """(workload, per-argument shardings, out_shardings or None) of one program."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jaxmove import zoo
    from jaxmove.plans import PRESETS as PLANS
    from jaxmove.plans import workload_shardings

    fields = {f.name for f in dataclasses.fields(zoo.PRESETS[preset].config_cls)}
    pinned = {k: v for k, v in PINNED.items() if k in fields}
    wl = zoo.build(preset, {**pinned, **(overrides_for(preset, size) or {}), **(extra or {})})
    devs = devices(target)
    out_sh = None
    if plan == "single":
        mesh = Mesh(np.array(devs[:1]), ("x",))
        shard = [jax.tree_util.tree_map(lambda _l: NamedSharding(mesh, PartitionSpec()), a) for a in wl.args]
    else:
        mesh = Mesh(np.array(devs[:4]).reshape(tuple(MESH.values())), tuple(MESH))
        shard, out_sh, _specs = workload_shardings(wl, PLANS[plan], mesh, [])
    return wl, shard, out_sh


def program_closed_forms(preset: str, size: str, target: str, plan: str, extra: dict[str, str] | None = None):
    """The per-device closed forms of one program (``corpus_checks.closed_forms``): from the leaf
    shapes and shardings, without compiling."""
    sys.path.insert(0, str(HERE)) if str(HERE) not in sys.path else None
    import corpus_checks

    wl, shard, _ = program_inputs(preset, size, target, plan, extra)
    return corpus_checks.closed_forms(wl, shard)


def compile_program(preset: str, size: str, target: str, plan: str,
                    extra: dict[str, str] | None = None) -> tuple[str, float]:
    """(HLO text, compile s) of one program (``extra``: more ``--set`` values). Raises what
    jax/XLA raise on a compile failure."""
    import jax

    from jaxmove._platform import quiet_stderr

    wl, shard, out_sh = program_inputs(preset, size, target, plan, extra)
    args = [a if i in wl.static_argnums else jax.tree_util.tree_map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s), a, shard[i])
        for i, a in enumerate(wl.args)]
    t = time.perf_counter()
    with quiet_stderr():
        jitted = jax.jit(wl.fn, donate_argnums=wl.donate_argnums, static_argnums=wl.static_argnums,
                         **({"out_shardings": out_sh} if out_sh is not None else {}))
        text = jitted.lower(*args).compile().as_text()
    return text, time.perf_counter() - t


_LAYOUT = re.compile(r"\{[0-9,]*:([^{}]*)\}")


_NUMBERS = re.compile(r"\d+")


def layout_kind(text: str) -> str:
    """A layout's kind: its tile / element-size / memory-space part with the top-level tile
    reduced to its rank (``T(8,128)`` and ``T(2,128)`` are one kind, ``T(r2)``), packing
    sub-tiles (``(2,1)``, ``(4,1)``), ``E(n)`` and ``S(n)`` kept, split configs ``SC(...)`` as
    ``SC``: ``{1,0:T(8,128)(2,1)S(1)}`` -> ``T(r2)(2,1)S(1)``."""
    tail = text.split(":", 1)[1] if ":" in text else ""
    tail = re.sub(r"SC\([^()]*\)", "SC", tail)
    m = re.match(r"T\(([^()]*)\)", tail)
    if m:
        tail = f"T(r{len(m.group(1).split(','))})" + tail[m.end():]
    # further tiles: keep packing tiles (x,1); others by rank
    return re.sub(r"(?<=\))\((\d+),(\d+)\)", lambda t: t.group(0) if t.group(2) == "1" else "(r2)",
                  re.sub(r"(?<=\))\((\d+)\)", "(r1)", tail))


def coverage_of(module) -> dict[str, set[str]]:
    """Opcodes, custom-call targets and layout kinds (``layout_kind``) of a module."""
    ops, targets, layouts = set(), set(), set()
    for instr in module.instructions():
        ops.add(instr.opcode)
        if instr.opcode == "custom-call":
            targets.add(instr.custom_call_target or "")
        for leaf in instr.shape.leaves():
            lay = leaf.layout
            if lay is not None and ":" in lay.text:
                layouts.add(layout_kind(lay.text))
    return {"opcodes": ops, "custom_call_targets": targets, "layout_kinds": layouts}


# corpus target -> the hardware spec its programs are costed on (the checks need the excess
# pass's figures and, on TPU, XLA's estimated cycles at the spec's clock)
SPECS = {"tpu-v5e": "tpu-v5e", "tpu-v5p": "tpu-v5p", "tpu-v6e": "tpu-v6e", "h100": "h100-sxm", "b200": "b200"}


def cross_program_prefetched(module) -> list[str]:
    """Entry parameters (their pytree path, else name) that XLA copies by a ``copy-start`` with
    ``cross_program_prefetch_index`` (XLA:TPU's cross-program prefetch into VMEM)."""
    from jaxmove.passes.roles import entry_parameter_name
    entry = module.entry
    out = []
    for instr in entry.instructions:
        if instr.opcode == "copy-start" and "cross_program_prefetch_index" in instr.attrs and instr.operands:
            src = entry.by_name.get(instr.operands[0])
            if src is not None and src.opcode == "parameter":
                out.append(entry_parameter_name(src))
    return out


def analyse_text(path: Path, target: str | None = None, closed=None) -> dict:
    """Analyse one cached program; the record's analysis fields (rejection on error). With
    ``target`` the program is costed on its spec; with ``closed`` (``corpus_checks.ClosedForms``)
    the record gets ``checks`` (``corpus_checks.check_report``)."""
    import jaxmove
    from jaxmove.hlo import parse_module
    rec: dict = {}
    t = time.perf_counter()
    try:
        report = jaxmove.analyze(str(path), hardware=SPECS.get(target) if target else None)
    except Exception as e:  # noqa: BLE001 - a rejection is the finding this corpus exists for
        rec.update(analysis_s=time.perf_counter() - t, rejection=f"{type(e).__name__}: {e}"[:500])
        module = None
        try:
            module = parse_module(path.read_text(), str(path))
        except Exception:  # noqa: BLE001
            pass
        rec["coverage"] = coverage_of(module) if module is not None else {}
        return rec
    rec["analysis_s"] = time.perf_counter() - t
    rec["instructions"] = sum(len(c) for c in report.module.computations.values())
    un: dict[str, list[str]] = {}
    for row in report.unmodeled:
        i = row.instr
        what = f"custom-call {i.custom_call_target}" if i.opcode == "custom-call" else i.opcode
        un.setdefault(what, [])
        for reason in row.unmodeled:
            if reason not in un[what]:
                un[what].append(reason)
    rec["unmodeled"] = len(report.unmodeled)
    rec["unmodeled_by"] = un
    tot = report.totals
    rec["hbm_bytes"] = tot.hbm_bytes
    rec["padding_fraction"] = tot.hbm_padding_bytes / tot.hbm_bytes if tot.hbm_bytes else 0.0
    rec["unknown_trip_loops"] = sum(1 for n in report.notes if "trip count unknown" in n)
    rec["coverage"] = coverage_of(report.module)
    rec["prefetched"] = cross_program_prefetched(report.module)
    if closed is not None:
        sys.path.insert(0, str(HERE)) if str(HERE) not in sys.path else None
        import corpus_checks
        rec["closed_forms"] = closed.to_json()
        rec["checks"] = [c.to_json() for c in corpus_checks.check_report(report, closed, TARGETS[target][0])]
    return rec


def run_one(preset: str, size: str, target: str, plan: str, fresh: bool = False,
            extra: dict[str, str] | None = None) -> dict:
    """Compile (or read from the cache) and analyse one program (``extra``: its dtype / scan
    ``--set`` values): its record."""
    key = key_of(preset, size, target, plan, extra)
    rec = {"preset": preset, "size": size, "target": target, "plan": plan, **({"extra": extra} if extra else {})}
    CACHE.mkdir(exist_ok=True)
    hlo, meta = CACHE / f"{key}.hlo", CACHE / f"{key}.json"
    if not fresh and hlo.is_file() and meta.is_file():
        rec["compile_s"] = json.loads(meta.read_text())["compile_s"]
    else:
        try:
            text, secs = compile_program(preset, size, target, plan, extra)
        except Exception as e:  # noqa: BLE001 - XLA could not compile it: not jaxmove's finding
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            rec["compile_error"] = f"{type(e).__name__}: {msg}"[:300]
            return rec
        hlo.write_text(text)
        meta.write_text(json.dumps({"compile_s": secs}))
        rec["compile_s"] = secs
    try:
        closed = program_closed_forms(preset, size, target, plan, extra)
    except Exception as e:  # noqa: BLE001 - no closed form: the record says why
        closed = None
        rec["closed_forms_error"] = f"{type(e).__name__}: {e}"[:300]
    rec.update(analyse_text(hlo, target, closed))
    return rec


def _jsonable(rec: dict) -> dict:
    out = dict(rec)
    if "coverage" in out:
        out["coverage"] = {k: sorted(v) for k, v in out["coverage"].items()}
    return out


def cached_records() -> list[dict]:
    """Every record a run saved in the cache (the corpus so far), in key order."""
    return [json.loads(p.read_text()) for p in sorted(CACHE.glob("*.rec.json"))] if CACHE.is_dir() else []


def programs(presets=None, sizes=SIZES, targets=tuple(TARGETS), plans=None, weights_dtypes=None,
             kv_dtypes=None, scans=None):
    """(preset, size, target, plan, extra) of the corpus, reduced sizes first (``extra``: one
    ``axis_extras`` dict of the dtype / scan axes, {} without them)."""
    from jaxmove import zoo
    out = []
    for size in sizes:
        for preset in (presets or list(zoo.PRESETS)):
            if size != "full" and overrides_for(preset, size) is None:
                continue  # already small: its full size is the reduced one
            if size == "tiny" and overrides_for(preset, "tiny") == overrides_for(preset, "reduced"):
                continue
            for target in targets:
                for plan in plans_for(preset):
                    if plans is None or plan in plans:
                        for extra in axis_extras(preset, weights_dtypes, kv_dtypes, scans):
                            out.append((preset, size, target, plan, extra))
    return out


def greedy_slice(records: list[dict], budget_s: float = 25.0) -> list[list[str]]:
    """Programs that together contain every opcode / target / layout kind of ``records``:
    repeatedly the one adding the most uncovered items per second of compile + analysis."""
    def items(r):
        c = r.get("coverage") or {}
        return {(k, v) for k, vals in c.items() for v in vals}
    ok = [r for r in records if r.get("coverage")]
    need = set().union(*(items(r) for r in ok)) if ok else set()
    chosen, spent = [], 0.0
    while need:
        best = max(ok, key=lambda r: len(items(r) & need) / (0.5 + r.get("compile_s", 0) + r.get("analysis_s", 0)))
        gain = items(best) & need
        if not gain:
            break
        chosen.append([best["preset"], best["size"], best["target"], best["plan"]]
                      + ([best["extra"]] if best.get("extra") else []))
        spent += best.get("compile_s", 0) + best.get("analysis_s", 0)
        need -= gain
    if spent > budget_s:
        print(f"note: the slice takes ~{spent:.0f} s (> {budget_s} s)", file=sys.stderr)
    return chosen


def write_outputs(records: list[dict], args) -> None:
    ok = [r for r in records if "coverage" in r]
    cov = {k: sorted(set().union(*(set(r["coverage"].get(k, ())) for r in ok)))
           for k in ("opcodes", "custom_call_targets", "layout_kinds")} if ok else {}
    slice_ = greedy_slice(records)
    unmodeled = sorted({w for r in records for w in (r.get("unmodeled_by") or {})})
    COVERAGE.write_text(json.dumps({"targets": sorted({r["target"] for r in records}), **cov,
                                    "unmodeled": unmodeled, "slice": slice_}, indent=1) + "\n")
    lines = ["# Device corpus: real TPU / GPU programs of the zoo, analysed by jaxmove", "",
             "Generated by `python benchmarks/device_corpus.py " + " ".join(sys.argv[1:]) + "` "
             "(with `--all-cached`: every program earlier runs cached) "
             "(deviceless compilation: libtpu topologies, CUDA-plugin target configs; "
             "2-core CI host). compile s is XLA's, analysis s is `jaxmove.analyze` of the HLO "
             "text on the target's hardware spec (parse + passes + reuse + excess + times).", ""]
    rej = [r for r in records if r.get("rejection")]
    cerr = [r for r in records if r.get("compile_error")]
    unm = [r for r in records if r.get("unmodeled")]
    lines += [f"- programs: {len(records)} ({len(ok)} analysed, {len(cerr)} not compiled by XLA)",
              "- by size: " + ", ".join(f"{k} {v}" for k, v in _count(records, "size").items())
              + "; by target: " + ", ".join(f"{k} {v}" for k, v in _count(records, "target").items())
              + "; by plan: " + ", ".join(f"{k} {v}" for k, v in _count(records, "plan").items())
              + f"; in the dtype / scan matrix: {len(split_axes(records)[1])}",
              f"- rejections by jaxmove: {len(rej)}",
              f"- programs with unmodeled instructions: {len(unm)} "
              f"({sum(r.get('unmodeled', 0) for r in records)} instructions)",
              f"- loops whose trip count could not be derived: "
              f"{sum(r.get('unknown_trip_loops', 0) for r in records)}",
              f"- coverage: {len(cov.get('opcodes', []))} opcodes, "
              f"{len(cov.get('custom_call_targets', []))} custom-call targets, "
              f"{len(cov.get('layout_kinds', []))} layout kinds; the test slice has "
              f"{len(slice_)} programs", ""]
    by: dict[str, set[str]] = {}
    for r in records:
        for what, reasons in (r.get("unmodeled_by") or {}).items():
            by.setdefault(what, set()).update(reasons)
    lines += ["## Unmodeled, by opcode / custom-call target", ""]
    if by:
        lines += ["| opcode / target | reasons |", "|---|---|"]
        lines += [f"| `{w}` | {'; '.join(sorted(rs))[:400]} |" for w, rs in sorted(by.items())]
    else:
        lines.append("None.")
    d70 = CACHE / "issue18.json"
    if d70.is_file():
        d = json.loads(d70.read_text())
        lines += ["", "## Issue 18's 70B-class decode (v5e:4x4, every parameter and cache leaf sharded 16 ways)", "",
                  f"`gpt2-small-decode` with {', '.join(f'{k}={v}' for k, v in ISSUE18_DECODE.items())}: "
                  f"compile {d['compile_s']:.1f} s, analysis {d['analysis_s']:.2f} s, "
                  f"{d['unmodeled']} unmodeled; weights read per device {d['weights_read_bytes']} bytes "
                  f"= {d['ratio']:.4f} x the per-device parameter bytes {d['param_bytes']} "
                  f"(from leaf shapes and shardings; {d['padded_param_bytes']} as stored, tile-padded); "
                  f"layer scan: {d['scan_trips']} trips (derived: the loop carries no known_trip_count)."]
    base, axes = split_axes(records)
    lines += [CHECKS_BEGIN, *_checks_section(base), CHECKS_END]
    if axes:
        lines += ["", AXES_BEGIN, *_axes_section(axes), AXES_END]
    lines += ["", "## Rejections", ""]
    lines += ([f"- {key_of(r['preset'], r['size'], r['target'], r['plan'], r.get('extra'))}: {r['rejection']}" for r in rej]
              or ["None."])
    base_recs, axes_recs = split_axes(records)
    lines += ["", "## Programs", ""]
    if axes_recs:
        lines += [f"(The {len(axes_recs)} programs of the dtype / scan matrix are in its section above: compile "
                  f"{sum(r.get('compile_s', 0) for r in axes_recs):.0f} s in all, analysis at most "
                  f"{max(r.get('analysis_s', 0) for r in axes_recs):.2f} s.)", ""]
    lines += ["| preset | size | target | plan | compile s | analysis s | instructions | unmodeled | "
              "padding % of HBM | result |", "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in base_recs:
        res = ("rejected" if r.get("rejection") else
               f"XLA: {r['compile_error'][:80]}" if r.get("compile_error") else "ok")
        lines.append(f"| {r['preset']} | {r['size']} | {r['target']} | {r['plan']} | "
                     f"{r.get('compile_s', float('nan')):.1f} | {r.get('analysis_s', float('nan')):.2f} | "
                     f"{r.get('instructions', '')} | {r.get('unmodeled', '')} | "
                     f"{100 * r.get('padding_fraction', 0):.1f} | {res} |")
    kept = kept_sections(REPORT.read_text()) if REPORT.is_file() else []
    for sec in kept:
        lines += ["", sec]
    REPORT.write_text("\n".join(lines) + "\n")


CHECKS_BEGIN, CHECKS_END = "<!-- checks: begin -->", "<!-- checks: end -->"
#: the dtype / scan matrix's own section: programs compiled with ``--weights-dtypes`` /
#: ``--kv-dtypes`` / ``--scan`` values (records with ``extra``), after the checks section
AXES_BEGIN, AXES_END = "<!-- axes-checks: begin -->", "<!-- axes-checks: end -->"
#: a hand-written section of device_corpus.md that a rebuild keeps (its heading says so)
KEPT = "(not generated by this script)"


def _count(records: list[dict], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r[key]] = out.get(r[key], 0) + 1
    return out


def split_axes(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(records of the presets' own dtypes and scan, records of the dtype / scan matrix)."""
    return [r for r in records if not r.get("extra")], [r for r in records if r.get("extra")]


def _replace_block(text: str, begin: str, end: str, block: str, after: str | None = None) -> str:
    """``text`` with the ``begin`` .. ``end`` block replaced by ``block``; absent: inserted after
    the ``after`` marker if present, else before the Rejections section, else appended."""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    if after is not None and after in text:
        head, rest = text.split(after, 1)
        return head + after + "\n\n" + block + rest
    if "\n## Rejections" in text:
        head, rest = text.split("\n## Rejections", 1)
        return head + "\n" + block + "\n\n## Rejections" + rest
    return text + "\n" + block + "\n"


def write_checks_section(records: list[dict]) -> None:
    """Replace the checks sections of device_corpus.md with this run's: the records without
    dtype / scan ``extra`` between ``CHECKS_BEGIN`` / ``CHECKS_END``, the dtype / scan matrix's
    between ``AXES_BEGIN`` / ``AXES_END``; a section this run has no records for is kept."""
    text = REPORT.read_text() if REPORT.is_file() else ""
    cmd = "python benchmarks/device_corpus.py " + " ".join(sys.argv[1:])
    base, axes = split_axes(records)
    if base:
        block = "\n".join([CHECKS_BEGIN, *_checks_section(base), "", f"(This section: `{cmd}`.)", CHECKS_END])
        text = _replace_block(text, CHECKS_BEGIN, CHECKS_END, block)
    if axes:
        block = "\n".join([AXES_BEGIN, *_axes_section(axes), "", f"(This section: `{cmd}`.)", AXES_END])
        text = _replace_block(text, AXES_BEGIN, AXES_END, block, after=CHECKS_END)
    REPORT.write_text(text)


def kept_sections(text: str) -> list[str]:
    """The hand-written ``## `` sections of ``text`` whose heading contains ``KEPT``."""
    parts = text.split("\n## ")
    return ["## " + p.rstrip("\n") for p in parts[1:] if KEPT in p.split("\n", 1)[0]]


def _fmt_bytes(v) -> str:
    return "" if v is None else f"{v:,.0f}"


def _cause(rec: dict, check: dict) -> str | None:
    """A failed check's known cause (``corpus_checks.known_cause``), or None."""
    sys.path.insert(0, str(HERE)) if str(HERE) not in sys.path else None
    import corpus_checks
    return corpus_checks.known_cause(check, (rec.get("closed_forms") or {}).get("detail", {}),
                                     rec.get("prefetched"))


def _why(rec: dict, check: dict) -> str:
    """A failed check's reason, with its known cause if any."""
    cause = _cause(rec, check)
    return f"{check['reason']}: {cause}" if cause else check["reason"]


def _axes_label(extra: dict) -> str:
    order = list(AXES)
    return " ".join(f"{AXES.get(k, k)}={v}" for k, v in sorted(extra.items(), key=lambda kv: order.index(kv[0])
                                                                if kv[0] in order else len(order)))


def _axes_section(records: list[dict]) -> list[str]:
    """The dtype / scan matrix: totals, the failed checks grouped by check and cause (each
    program listed), and one row per preset x size x target x plan with a cell per dtype /
    scan combination (ok, the number of failed checks, XLA: not compiled, rejected)."""
    checked = [r for r in records if r.get("checks")]
    failed = [(r, c) for r in checked for c in r["checks"] if c["ok"] is False]
    skipped = [(r, c) for r in checked for c in r["checks"] if c["ok"] is None]
    n = sum(len(r["checks"]) for r in checked)
    cerr = [r for r in records if r.get("compile_error")]
    rej = [r for r in records if r.get("rejection")]
    unm = [r for r in records if r.get("unmodeled")]
    lines = ["", "## The dtype / scan matrix checked against closed forms", "",
             "Programs compiled with `--weights-dtypes` / `--kv-dtypes` / `--scan` values (the closed forms "
             "of benchmarks/corpus_checks.py get the same `--set` values); the checks of the section above.", "",
             f"- programs: {len(records)} ({len(cerr)} not compiled by XLA, {len(rej)} rejected by jaxmove, "
             f"{len(unm)} with unmodeled instructions: "
             f"{sum(r.get('unmodeled', 0) for r in records)} instructions)",
             f"- programs checked: {len(checked)}; checks: {n}; failed: {len(failed)}; "
             f"not checked (no closed form): {len(skipped)}", ""]
    if failed:
        groups: dict[tuple[str, str], list] = {}
        for r, c in failed:
            cause = _cause(r, c)  # "<cause>; <this program's numbers>"
            groups.setdefault((c["name"], cause.split("; ")[0] if cause else c["reason"]), []).append((r, c))
        lines += ["### Failed checks, by cause", "",
                  "| check | cause | programs | closed form / jaxmove |", "|---|---|---:|---|"]
        for (name, cause), rows in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            ratios = [c["got"] / c["expected"] for _r, c in rows if c.get("expected") and c.get("got") is not None]
            rng = f"{min(ratios):.3f}x .. {max(ratios):.3f}x" if ratios else ""
            lines.append(f"| {name} | {cause[:300]} | {len(rows)} | {rng} |")
        lines += ["", "<details><summary>each failed check</summary>", "",
                  "| program | check | expected | got | why |", "|---|---|---:|---:|---|"]
        lines += [f"| {key_of(r['preset'], r['size'], r['target'], r['plan'], r.get('extra'))} | {c['name']} | "
                  f"{_fmt_bytes(c['expected'])} | {_fmt_bytes(c['got'])} | {_why(r, c)[:400]} |" for r, c in failed]
        lines += ["", "</details>", ""]
    if skipped:
        why = sorted({c["reason"] for _r, c in skipped})
        lines += ["Not checked: " + "; ".join(why[:6]), ""]
    if cerr:
        lines += ["Not compiled by XLA: " + "; ".join(sorted({
            f"{key_of(r['preset'], r['size'], r['target'], r['plan'], r.get('extra'))}: {r['compile_error'][:120]}"
            for r in cerr})[:10]), ""]
    cols = []
    for r in records:
        lab = _axes_label(r["extra"])
        if lab not in cols:
            cols.append(lab)
    cols.sort(key=lambda c: (("w=" in c) and c.split("w=")[1].split()[0] or "", c))
    rows: dict[tuple, dict[str, str]] = {}
    for r in records:
        fails = sum(1 for c in (r.get("checks") or []) if c["ok"] is False)
        cell = ("XLA" if r.get("compile_error") else "rejected" if r.get("rejection") else
                f"**{fails} failed**" if fails else "ok" if r.get("checks") else "-")
        if r.get("unmodeled"):
            cell += f" ({r['unmodeled']} unmodeled)"
        rows.setdefault((r["preset"], r["size"], r["target"], r["plan"]), {})[_axes_label(r["extra"])] = cell
    lines += ["| preset | size | target | plan | " + " | ".join(f"`{c}`" for c in cols) + " |",
              "|---|---|---|---|" + "---|" * len(cols)]
    for (preset, size, target, plan), cells in sorted(rows.items()):
        lines.append(f"| {preset} | {size} | {target} | {plan} | " + " | ".join(cells.get(c, "") for c in cols) + " |")
    return lines


def _checks_section(records: list[dict]) -> list[str]:
    """The closed-form checks (benchmarks/corpus_checks.py): per program, per check."""
    checked = [r for r in records if r.get("checks")]
    failed = [(r, c) for r in checked for c in r["checks"] if c["ok"] is False]
    skipped = [(r, c) for r in checked for c in r["checks"] if c["ok"] is None]
    n = sum(len(r["checks"]) for r in checked)
    lines = ["", "## Numbers checked against closed forms (issue 23's net)", "",
             "Per device, from the leaf shapes and shardings (benchmarks/corpus_checks.py, never from the "
             "passes): the excess pass's compulsory bytes per role within 1% of the closed form; "
             "compiled = compulsory + causes + unattributed, unattributed <= 1% of compiled; on TPU no "
             "fusion's memory time above 3x XLA:TPU's own estimated_cycles for it.", "",
             f"- programs checked: {len(checked)}; checks: {n}; failed: {len(failed)}; "
             f"not checked (no closed form): {len(skipped)}", ""]
    if failed:
        lines += ["### Failed checks", "", "| program | check | expected | got | why |", "|---|---|---:|---:|---|"]
        lines += [f"| {key_of(r['preset'], r['size'], r['target'], r['plan'], r.get('extra'))} | {c['name']} | "
                  f"{_fmt_bytes(c['expected'])} | {_fmt_bytes(c['got'])} | {_why(r, c)[:400]} |" for r, c in failed]
        lines.append("")
    if skipped:
        why = sorted({c["reason"] for _r, c in skipped})
        lines += ["Not checked: " + "; ".join(why[:6]), ""]
    lines += ["| program | weights closed / jaxmove | kv closed / jaxmove | optimizer closed / jaxmove | "
              "identity | unattributed | TPU vs XLA (worst ratio) |", "|---|---|---|---|---|---|---|"]
    for r in checked:
        cs = {c["name"]: c for c in r["checks"]}

        def pair(name):
            c = cs.get(name)
            if c is None:
                return ""
            mark = {True: "ok", False: "FAIL", None: "n/a"}[c["ok"]]
            return f"{_fmt_bytes(c['expected'])} / {_fmt_bytes(c['got'])} {mark}"
        tv = cs.get("tpu_memory_vs_xla")
        tv_text = "" if tv is None else ("ok" if tv["ok"] else "FAIL") + " ({:.2f}x)".format(tv["got"] or 0.0)
        lines.append(f"| {key_of(r['preset'], r['size'], r['target'], r['plan'], r.get('extra'))} | {pair('compulsory_weights')} | "
                     f"{pair('compulsory_kv_cache')} | {pair('compulsory_optimizer_state')} | "
                     f"{'ok' if cs.get('identity', {}).get('ok') else 'FAIL'} | "
                     f"{'ok' if cs.get('unattributed_le_1pct', {}).get('ok') else 'FAIL'} | "
                     f"{tv_text} |")
    return lines


# issue 18: a 70B-class decode, every parameter and cache leaf sharded 16 ways over v5e:4x4
ISSUE18_DECODE = {"d_model": "8192", "heads": "64", "kv_heads": "8", "d_ff": "28672", "layers": "80",
                  "vocab": "128256", "seq_len": "8192", "batch": "16", "scan_layers": "true"}


def shard_16_ways(path, leaf, mesh):
    """PartitionSpec sharding ``leaf`` over every device of ``mesh`` (one axis, 16 devices)
    along its largest dimension divisible by the mesh size, never a stacked ``layers`` dim."""
    from jax.sharding import NamedSharding, PartitionSpec
    import jax
    n = mesh.size
    dims = list(leaf.shape)
    start = 1 if "layers" in jax.tree_util.keystr(path) and len(dims) > 1 else 0
    best = None
    for i in range(start, len(dims)):
        if dims[i] % n == 0 and (best is None or dims[i] > dims[best]):
            best = i
    spec = [None] * len(dims)
    if best is not None:
        spec[best] = mesh.axis_names[0]
    return NamedSharding(mesh, PartitionSpec(*spec))


def sharded_decode(overrides: dict[str, str] = ISSUE18_DECODE, topology: str = "v5e:4x4",
                   hlo_path: Path | None = None) -> dict:
    """Compile ``gpt2-small-decode`` with ``overrides`` for ``topology`` (parameters and cache
    sharded over every chip, ``shard_16_ways``), analyse it and compare its weights read with
    the per-device parameter bytes computed from the leaf shapes and shardings.

    Returns: compile_s, analysis_s, weights_read_bytes, param_bytes (per device, data bytes),
    padded_param_bytes (per device, as XLA stores them: from the entry layouts), ratio
    (weights read / param_bytes), scan_trips (of the layer loop), unmodeled, notes.
    """
    import jax
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import jaxmove
    from jaxmove import zoo
    from jaxmove._platform import quiet_stderr
    from jaxmove.passes.trip_count import trip_count

    wl = zoo.build("gpt2-small-decode", overrides)
    with quiet_stderr():
        devs = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices
    mesh = Mesh(np.array(devs), ("x",))
    args = list(wl.args)
    for i in (0, 1):  # params, cache
        args[i] = jax.tree_util.tree_map_with_path(
            lambda p, l: jax.ShapeDtypeStruct(l.shape, l.dtype, sharding=shard_16_ways(p, l, mesh)), args[i])
    for i in range(2, len(args)):
        args[i] = jax.tree_util.tree_map(
            lambda l: jax.ShapeDtypeStruct(l.shape, l.dtype, sharding=NamedSharding(mesh, PartitionSpec())), args[i])
    param_bytes = sum(int(np.prod(l.sharding.shard_shape(l.shape))) * l.dtype.itemsize
                      for l in jax.tree_util.tree_leaves(args[0]))
    t = time.perf_counter()
    with quiet_stderr():
        text = jax.jit(wl.fn, donate_argnums=wl.donate_argnums).lower(*args).compile().as_text()
    compile_s = time.perf_counter() - t
    hlo_path = hlo_path or (CACHE / "issue18_decode.hlo")
    hlo_path.parent.mkdir(parents=True, exist_ok=True)
    hlo_path.write_text(text)
    t = time.perf_counter()
    report = jaxmove.analyze(str(hlo_path))
    analysis_s = time.perf_counter() - t
    module = report.module
    n_params = len(jax.tree_util.tree_leaves(args[0]))
    padded = sum(p.shape.byte_size for p in module.entry.parameters[:n_params])
    entry_whiles = [i for i in module.entry.instructions if i.opcode == "while"]
    layers = int(overrides.get("layers", 0))
    trips = [trip_count(w, module).n for w in entry_whiles]
    return {"compile_s": compile_s, "analysis_s": analysis_s,
            "weights_read_bytes": report.totals.weights_read_bytes, "param_bytes": param_bytes,
            "padded_param_bytes": padded, "ratio": report.totals.weights_read_bytes / param_bytes,
            "scan_trips": layers if layers in trips else trips, "unmodeled": len(report.unmodeled),
            "notes": report.notes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", help="comma-separated zoo presets (default: all)")
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--plans", help="comma-separated plans (default: single + every applicable)")
    ap.add_argument("--weights-dtypes", help="comma-separated weights_dtype values (bf16 = the model "
                    "dtype, int8, fp8); presets without the key ignore it")
    ap.add_argument("--kv-dtypes", help="comma-separated kv_dtype values (bf16, int8, fp8)")
    ap.add_argument("--scan", help="comma-separated scan_layers values (true, false)")
    ap.add_argument("--fresh", action="store_true", help="recompile programs already cached")
    ap.add_argument("--no-write", action="store_true", help="print only; keep the .md and coverage")
    ap.add_argument("--all-cached", action="store_true",
                    help="write the .md and coverage from every program in the cache (several runs)")
    ap.add_argument("--cached-only", action="store_true",
                    help="only the programs already in the cache (re-analysed, not recompiled); with "
                         "--all-cached: every program in the cache, whatever the other options")
    ap.add_argument("--decode-70b", action="store_true",
                    help="also compile and analyse issue 18's 70B-class decode on v5e:4x4")
    ap.add_argument("--checks-only", action="store_true",
                    help="write only the closed-form checks sections of device_corpus.md (between their "
                         "markers: the presets' own dtypes, and the dtype / scan matrix), from this run's "
                         "programs; keep the rest of the file and the coverage")
    args = ap.parse_args(argv)
    if args.decode_70b:
        d = sharded_decode()
        d.pop("notes")
        CACHE.mkdir(exist_ok=True)
        (CACHE / "issue18.json").write_text(json.dumps(d))
        print("70B-class decode:", d, flush=True)
    split = lambda s: [x for x in s.split(",") if x] if s else None  # noqa: E731
    if args.cached_only and args.all_cached:  # re-analyse every program the cache holds
        todo = [(r["preset"], r["size"], r["target"], r["plan"], r.get("extra") or {}) for r in cached_records()
                if (CACHE / f"{key_of(r['preset'], r['size'], r['target'], r['plan'], r.get('extra'))}.hlo").is_file()]
    else:
        todo = programs(split(args.presets), tuple(split(args.sizes)), tuple(split(args.targets)),
                        split(args.plans), split(args.weights_dtypes), split(args.kv_dtypes), split(args.scan))
    if args.cached_only and not args.all_cached:  # re-analyse what earlier runs compiled, compile nothing
        todo = [t for t in todo if (CACHE / f"{key_of(*t)}.hlo").is_file()]
    records = []
    for k, (preset, size, target, plan, extra) in enumerate(todo):
        try:
            rec = run_one(preset, size, target, plan, args.fresh, extra)
        except Exception as e:  # noqa: BLE001 - keep going; the record says what failed
            rec = {"preset": preset, "size": size, "target": target, "plan": plan,
                   **({"extra": extra} if extra else {}), "compile_error": f"{type(e).__name__}: {e}"[:300]}
            traceback.print_exc(limit=2)
        records.append(rec)
        CACHE.mkdir(exist_ok=True)
        (CACHE / f"{key_of(preset, size, target, plan, extra)}.rec.json").write_text(json.dumps(_jsonable(rec)))
        status = rec.get("rejection") or rec.get("compile_error") or f"{rec.get('unmodeled')} unmodeled"
        print(f"[{k + 1}/{len(todo)}] {key_of(preset, size, target, plan, extra)}: compile "
              f"{rec.get('compile_s', 0):.1f} s, analysis {rec.get('analysis_s', 0):.2f} s, {status}",
              flush=True)
    if args.checks_only:
        write_checks_section(cached_records() if args.all_cached else records)
    elif not args.no_write:
        write_outputs(cached_records() if args.all_cached else records, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
