"""The excess pass's compulsory bytes at full size, against closed forms (issue 23 items 3-4).

    python benchmarks/excess_closed_forms.py              # the default cases below
    python benchmarks/excess_closed_forms.py --quick      # scanned forms only

For Llama-3-8B decode (batch 32, KV cache 8192; models/families.py, meta-llama/Meta-Llama-3-8B's
config.json) compiled without the device for each target, the compulsory bytes the excess pass
(jaxmove/passes/excess/) reports per role are compared with closed forms of the model's shapes,
computed here and not by the passes:

* KV cache: every layer's K and V read once (2 L B H_kv d S bf16) and one position written
  (2 L B H_kv d bf16);
* weights: every layer's q, k, v, o, gate, up, down and two norms, the final norm and lm_head
  once, and the B embedding rows the tokens gather;
* activations: the tokens (s32 [B, 1]) and the position (s32) read, the logits (f32 [B, 1, V])
  written.

Compulsory traffic depends on the program's semantics alone (DESIGN.md), so the closed forms
hold for every compiler's program of the step (XLA:CPU's, XLA:GPU's, XLA:TPU's, scanned or
unrolled) and the excess pass run again without a hardware spec must give the same compulsory
bytes per role and path (column *no spec*). Also checked: compiled = compulsory + causes +
unattributed per role, no split-K partials charged to ``weights``, unattributed <= 1% of
compiled. The table goes to
``benchmarks/excess_closed_forms.md`` (``--out``; ``--out ''`` writes nothing). Each case runs
in a fresh process (one XLA compile at a time, its peak memory its own).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
L, B, S = 32, 32, 8192
D, HEADS, KV_HEADS, D_FF, VOCAB = 4096, 32, 8, 14336, 128256
HEAD_DIM, BF16 = D // HEADS, 2
CASES = [("h100-sxm", "true"), ("h100-sxm", "false"), ("tpu-v5p", "true"), ("tpu-v5p", "false"),
         ("b200", "false"), ("cpu", "false")]  # (v5e: 16 GiB, does not fit)


def closed_forms() -> dict[str, int]:
    per_layer = (D * HEADS * HEAD_DIM + 2 * D * KV_HEADS * HEAD_DIM + HEADS * HEAD_DIM * D
                 + 3 * D * D_FF + 2 * D)
    per_position = 2 * L * B * KV_HEADS * HEAD_DIM * BF16
    return {"kv_cache": per_position * S + per_position,
            "weights": (L * per_layer + VOCAB * D + D + B * D) * BF16,
            "activations": B * 4 + 4 + B * VOCAB * 4}


def _child(target: str, scan: str) -> dict:
    sys.path.insert(0, str(HERE.parent))
    import jaxmove
    t = time.perf_counter()
    r = jaxmove.analyze("llama3-8b-decode", overrides={"scan_layers": scan}, target=target)
    ex = r.excess
    out = {"analyze_s": time.perf_counter() - t, "by_role": {}, "identity_ok": True}
    for role, line in ex.by_role.items():
        causes = sum(c.by_role.get(role, 0) for c in ex.causes)
        out["identity_ok"] &= line.compiled_bytes == line.compulsory_bytes + causes + line.unattributed_bytes
        out["by_role"][role] = {"compulsory": line.compulsory_bytes, "compiled": line.compiled_bytes}
    from jaxmove.passes.excess import excess_pass
    from jaxmove.passes.reuse import reuse_pass
    bare = excess_pass(r.analysis, r.parameters, None, reuse_pass(r.analysis, None))
    out["same_without_spec"] = all(
        bare.by_role[k].compulsory_bytes == ex.by_role[k].compulsory_bytes for k in ex.by_role) and all(
        bare.by_path[k].compulsory_bytes == ex.by_path[k].compulsory_bytes for k in ex.by_path)
    sk = ex.cause("split_k_partials")
    out["split_k_weights_bytes"] = sk.by_role.get("weights", 0) if sk is not None else 0
    out["unattributed_fraction"] = ex.unattributed.bytes / ex.compiled_bytes if ex.compiled_bytes else 0.0
    out["top_causes"] = [(c.kind, c.subject, c.bytes) for c in ex.causes[:3]]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="scanned forms only (seconds to compile)")
    ap.add_argument("--out", default=str(HERE / "excess_closed_forms.md"))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0
    want = closed_forms()
    hdr = (f"{'target':<10} {'layers':<9} {'KV compulsory B':>16} {'closed form':>16} {'weights compulsory B':>21} "
           f"{'closed form':>16} {'act. compulsory B':>18} {'closed form':>12} {'no spec':>7} "
           f"{'identity':>8} {'split-K->weights B':>18} {'unattr':>7} {'result':>6} {'s':>6}")
    lines = [hdr, "-" * len(hdr)]
    print(hdr, flush=True)
    failed = 0
    for target, scan in CASES:
        if args.quick and scan != "true":
            continue
        proc = subprocess.run([sys.executable, __file__, "--child", target, scan], capture_output=True, text=True)
        form = "scanned" if scan == "true" else "unrolled"
        if proc.returncode != 0:
            lines.append(f"{target:<10} {form:<9} error: {(proc.stderr.strip().splitlines() or ['?'])[-1][:120]}")
            print(lines[-1], flush=True)
            failed += 1
            continue
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        kv, w = got["by_role"]["kv_cache"]["compulsory"], got["by_role"]["weights"]["compulsory"]
        act = got["by_role"]["activations"]["compulsory"]
        ok = (abs(kv - want["kv_cache"]) <= 0.01 * want["kv_cache"]
              and abs(w - want["weights"]) <= 0.01 * want["weights"]
              and act == want["activations"] and got["same_without_spec"]
              and got["identity_ok"] and got["split_k_weights_bytes"] == 0
              and got["unattributed_fraction"] <= 0.01)
        failed += not ok
        lines.append(f"{target:<10} {form:<9} {kv:>16,} {want['kv_cache']:>16,} {w:>21,} {want['weights']:>16,} "
                     f"{act:>18,} {want['activations']:>12,} {'same' if got['same_without_spec'] else 'DIFF':>7} "
                     f"{'yes' if got['identity_ok'] else 'NO':>8} {got['split_k_weights_bytes']:>18,} "
                     f"{100 * got['unattributed_fraction']:>6.2f}% {'ok' if ok else 'FAIL':>6} {got['analyze_s']:>6.1f}")
        print(lines[-1], flush=True)
    foot = ("Llama-3-8B decode, batch 32, KV cache 8192, bf16, compiled without the device (deviceless "
            "XLA:GPU / XLA:TPU; XLA:CPU on this machine); compulsory bytes per program run and device, from `jaxmove analyze ... "
            "--excess` (the excess pass); closed forms computed in this script from the shapes; no spec = "
            "the compulsory bytes per role and path the same when the pass runs without a hardware spec; "
            "ok = KV and weights within 1% of the closed form, activations equal to it, the same without "
            "a spec, compiled = compulsory + causes + unattributed "
            "per role, no split-K partials charged to weights, unattributed <= 1% of compiled; "
            "s = compile + analysis, wall clock.")
    print("\n" + foot)
    if args.out:
        cmd = " ".join(["python benchmarks/excess_closed_forms.py"] + (argv if argv is not None else sys.argv[1:]))
        Path(args.out).write_text(
            "# Excess pass: compulsory bytes against closed forms at full size\n\n"
            "Generated by `benchmarks/excess_closed_forms.py`; do not edit by hand.\n\n"
            f"`{cmd}`, measured {time.strftime('%Y-%m-%d %H:%M')} ({os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}).\n\n```\n" + "\n".join(lines) + "\n```\n\n" + foot + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
