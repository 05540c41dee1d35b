"""Anchors: jaxmove's step time against published end-to-end measurements of LLM inference.

``../shared/data/anchors.csv`` holds eight measured steps with their configurations
(FasterTransformer GPT-13B prefill/decode on A100-40GB at TP 1 and 2, via cli99/llm-analysis;
gpt-fast Llama-2 7B/70B decode, bf16 and int8 weight-only, on A100-80GB power-limited to
330 W). Each anchor is reproduced with a zoo preset at the anchor's shapes (``--set``),
compiled for the GPU it ran on (``--target``, deviceless) and timed with the GPU spec;
where the source states a bandwidth the GPUs reach, it is given with ``--spec``. Where the
measured runtime differs from XLA's defaults, the command says so, not a factor: FasterTransformer
launches kernels from a stream (``XLA_FLAGS=--xla_gpu_enable_command_buffer=``, no CUDA graphs),
gpt-fast runs one CUDA graph with its all-reduces (``+COLLECTIVES``), and its tensor
parallelism leaves the embedding and LM head replicated (``benchmarks/anchors_gptfast_tp.toml``).
The int8 anchors need no flag: the zoo dequantizes as gpt-fast does, ``(x @ q) * s``. Per anchor
the table gives the command, jaxmove's step time and its components (compute, memory,
network, launch; each the sum over the program's kernels, so they need not add up to the
overlapped step time), the roofline bound (max of HBM bytes / bandwidth and FLOPs / peak),
the measured time and the ratio jaxmove / measured.

One command regenerates ``benchmarks/anchors.md`` (each anchor compiles in its own process,
one at a time; 20 s to a few minutes each on 2 cores)::

    python benchmarks/anchors.py [--only ID ...] [--dump DIR]

``--dump DIR`` also writes each program's optimized HLO under DIR/<id>/ (XLA's dump), so a
time-model change can be re-checked with ``jaxmove analyze DIR/<id> --hardware ...`` without
compiling again.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "anchors.csv"

#: the published configurations as zoo shapes (anchors.csv 'model' column)
_GPT13B = ["--set", "vocab=50272", "--set", "d_model=5120", "--set", "heads=40", "--set", "layers=40",
           "--set", "batch=1", "--set", "seq_len=512", "--set", "dtype=float16"]
_LLAMA2_7B = ["--set", "vocab=32000", "--set", "d_model=4096", "--set", "heads=32", "--set", "kv_heads=32",
              "--set", "d_ff=11008", "--set", "layers=32", "--set", "batch=1", "--set", "seq_len=205",
              "--set", "scan_layers=false"]
_LLAMA2_70B = ["--set", "vocab=32000", "--set", "batch=1", "--set", "seq_len=205", "--set", "scan_layers=false"]
#: gpt-fast README: "the GPUs reach about 1700 GB/s" of HBM bandwidth at their 330 W cap
_GPTFAST_BW = ["--spec", "hbm_bytes_per_s=1.7e12"]

#: anchor id -> ``jaxmove analyze`` arguments (without --json)
COMMANDS: dict[str, list[str]] = {
    "ft13b_prefill_tp1": ["gpt2-small-prefill", *_GPT13B, "--target", "a100-40gb:1x1x1"],
    "ft13b_prefill_tp2": ["gpt2-small-prefill", *_GPT13B, "--target", "a100-40gb:1x1x2",
                          "--mesh", "model=2", "--plan", "tp"],
    "ft13b_decode_tp1": ["gpt2-small-decode", *_GPT13B, "--target", "a100-40gb:1x1x1"],
    "ft13b_decode_tp2": ["gpt2-small-decode", *_GPT13B, "--target", "a100-40gb:1x1x2",
                         "--mesh", "model=2", "--plan", "tp"],
    "gptfast_7b_bf16": ["llama3-8b-decode", *_LLAMA2_7B, "--target", "a100-80gb:1x1x1", *_GPTFAST_BW],
    "gptfast_7b_int8": ["llama3-8b-decode", *_LLAMA2_7B, "--set", "weights_dtype=int8",
                        "--target", "a100-80gb:1x1x1", *_GPTFAST_BW],
    "gptfast_70b_int8_tp1": ["llama3-70b-decode", *_LLAMA2_70B, "--set", "weights_dtype=int8",
                             "--target", "a100-80gb:1x1x1", *_GPTFAST_BW],
    "gptfast_70b_bf16_tp8": ["llama3-70b-decode", *_LLAMA2_70B, "--target", "a100-80gb:1x1x8",
                             "--mesh", "model=8", "--plan", "benchmarks/anchors_gptfast_tp.toml", *_GPTFAST_BW],
}

#: environment of an anchor's command: FasterTransformer launches every kernel from its stream
#: (no CUDA graphs), so its programs are compiled and timed with XLA's command buffers off
_NO_GRAPHS = {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}
#: gpt-fast runs each step as one CUDA graph, its NCCL all-reduces included (torch.compile
#: mode="reduce-overhead"); XLA:GPU leaves collectives out of its command buffers by default,
#: so the gpt-fast anchors add them (COLLECTIVES)
_GRAPH_COLLECTIVES = "--xla_gpu_enable_command_buffer=+COLLECTIVES"
ENV: dict[str, dict[str, str]] = {
    **{k: _NO_GRAPHS for k in COMMANDS if k.startswith("ft13b")},
    **{k: {"XLA_FLAGS": _GRAPH_COLLECTIVES} for k in COMMANDS if k.startswith("gptfast")},
}

TOLERANCE = 0.15


def command_text(anchor_id: str) -> str:
    """The shell command of an anchor, its environment first."""
    env = " ".join(f"{k}={v}" for k, v in ENV.get(anchor_id, {}).items())
    return (env + " " if env else "") + "jaxmove analyze " + " ".join(COMMANDS[anchor_id])


def read_anchors(path: Path = DATA) -> list[dict]:
    """The rows of anchors.csv (id, value_s, ...). Raises FileNotFoundError when absent."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_anchor(anchor_id: str, dump: Path | None = None, timeout_s: float = 1800) -> dict:
    """Run the anchor's command in a child process; its ``--json`` report plus ``wall_s``."""
    argv = ["analyze", *COMMANDS[anchor_id], "--json"]
    env = dict(os.environ)
    for k, v in ENV.get(anchor_id, {}).items():
        env[k] = (env.get(k, "") + " " + v).strip() if k == "XLA_FLAGS" else v
    if dump is not None:
        d = dump / anchor_id
        d.mkdir(parents=True, exist_ok=True)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={d} --xla_dump_hlo_as_text"
                            " --xla_dump_hlo_pass_re=^$").strip()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-P", "-c",
                           "import sys; from jaxmove.cli import main; sys.exit(main(sys.argv[1:]))", *argv],
                          capture_output=True, text=True, env=env, timeout=timeout_s, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{anchor_id}: jaxmove exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    out = json.loads(proc.stdout)
    out["wall_s"] = time.perf_counter() - t0
    return out


def summary(report: dict) -> dict:
    """The figures the table shows, from a ``--json`` report (keys as in ``report.to_json``)."""
    t = report["time"]
    tot = report["totals"]
    return {
        "est_time_s": t["est_time_s"],
        "compute_time_s": t["compute_time_s"],
        "memory_time_s": t["memory_time_s"],
        "network_time_s": t["network_time_s"],
        "overhead_s": t["overhead_s"],
        "launch_gap_s": t.get("launch_gap_s"),
        "kernel_fixed_s": t.get("kernel_fixed_s"),
        "kernels": t["kernels"],
        "bound": t["bound"],
        "hbm_bytes": tot["hbm_read_bytes"] + tot["hbm_write_bytes"],
        "flops": tot["flops"],
        "wire_bytes": tot["collective_wire_bytes"],
        "complete": report.get("complete"),
        "time_unmodeled": t.get("unmodeled", []),
    }


def roofline_bound_s(anchor_id: str, s: dict) -> tuple[float, str]:
    """max(HBM bytes / bandwidth, FLOPs / peak) on the anchor's spec (its --spec overrides
    applied): the time no schedule beats, and which term it is."""
    from jaxmove.hardware import load_spec
    from jaxmove.hardware.overrides import override_spec

    args = COMMANDS[anchor_id]
    name = args[args.index("--target") + 1].partition(":")[0]  # the target's spec
    items = [args[i + 1] for i, a in enumerate(args) if a == "--spec"]
    spec = override_spec(load_spec(name), items)
    dtype = "f16" if "dtype=float16" in args else "bf16"
    mem = s["hbm_bytes"] / spec.hbm_bytes_per_s
    comp = s["flops"] / spec.flops_per_s[dtype]
    return (mem, "memory") if mem >= comp else (comp, "compute")


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def render(rows: list[dict], anchors: dict[str, dict]) -> str:
    lines = [
        "# Anchors: step time against published measurements",
        "",
        f"Generated by `python benchmarks/anchors.py` on {_dt.date.today().isoformat()}; jaxmove's "
        "numbers come from the deviceless compile of the zoo preset at each anchor's shapes "
        "for the GPU it ran on. Times in ms. Components are sums over kernels (compute, memory, "
        "network, launch = launch gaps + the GEMM model's fixed per-kernel cost), not a "
        "partition of the step time: a kernel costs max(compute, memory, network) + its launch. "
        "Bound = max(HBM bytes / bandwidth, FLOPs / peak) on the same spec. "
        f"Target: every ratio within 1 +- {TOLERANCE:.0%}.",
        "",
        "| anchor | measured | jaxmove | ratio | compute | memory | network | launch | kernels | "
        "bound (term) | within |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in rows:
        a = anchors[r["id"]]
        meas = float(a["value_s"])
        if "error" in r:
            lines.append(f"| {r['id']} | {_ms(meas)} | error | - | - | - | - | - | - | - | no |")
            continue
        s = r["summary"]
        ratio = s["est_time_s"] / meas
        ok = "yes" if abs(ratio - 1) <= TOLERANCE else "no"
        b, term = r["bound"]
        lines.append(f"| {r['id']} | {_ms(meas)} | {_ms(s['est_time_s'])} | {ratio:.2f} | "
                     f"{_ms(s['compute_time_s'])} | {_ms(s['memory_time_s'])} | {_ms(s['network_time_s'])} | "
                     f"{_ms(s['overhead_s'])} | {s['kernels']} | {_ms(b)} ({term}) | {ok} |")
    ok = [r for r in rows if "error" not in r
          and abs(r["summary"]["est_time_s"] / float(anchors[r["id"]]["value_s"]) - 1) <= TOLERANCE]
    lines += ["", f"{len(ok)} of {len(rows)} anchors within +-{TOLERANCE:.0%}.", "", "## Commands", ""]
    for r in rows:
        a = anchors[r["id"]]
        lines.append(f"- `{r['id']}` ({a['config']}; {a['hardware']}; {a['source']}): "
                     f"`{command_text(r['id'])}`"
                     + (f" (compile + analysis {r['wall_s']:.0f} s)" if "wall_s" in r else ""))
        if "error" in r:
            lines.append(f"  - error: {r['error']}")
        elif r["summary"]["time_unmodeled"]:
            lines.append(f"  - time incomplete: {len(r['summary']['time_unmodeled'])} instructions unmodeled, "
                         f"e.g. {r['summary']['time_unmodeled'][0]}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", metavar="ID", help="run these anchors only (the table keeps them only)")
    ap.add_argument("--dump", type=Path, default=None, help="also dump each program's HLO under DIR/<id>")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "anchors.md")
    args = ap.parse_args(argv)
    if not DATA.is_file():
        print(f"anchors.py: {DATA} not found (the measured anchors live in ../shared/data)", file=sys.stderr)
        return 2
    anchors = {a["id"]: a for a in read_anchors()}
    ids = args.only or list(COMMANDS)
    rows = []
    for i in ids:
        print(f"anchors: {i} ...", file=sys.stderr, flush=True)
        try:
            rep = run_anchor(i, args.dump)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            rows.append({"id": i, "error": str(e).splitlines()[-1][:300]})
            continue
        s = summary(rep)
        rows.append({"id": i, "summary": s, "bound": roofline_bound_s(i, s), "wall_s": rep["wall_s"]})
        print(f"  {i}: {s['est_time_s'] * 1e3:.2f} ms (measured {float(anchors[i]['value_s']) * 1e3:.2f})",
              file=sys.stderr, flush=True)
    text = render(rows, anchors)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
