"""The excess pass's compulsory bytes at full size, against closed forms (issue 23 items 3-4).

    python benchmarks/excess_closed_forms.py              # the default cases below
    python benchmarks/excess_closed_forms.py --quick      # scanned decode forms only

Llama-3-8B (models/families.py, meta-llama/Meta-Llama-3-8B's config.json) compiled without the
device for each target: the compulsory bytes the excess pass (jaxmove/passes/excess/) reports
per role are compared with closed forms of the model's shapes, computed here and not by the
passes. Decode (batch 32, KV cache 8192), bf16:

* KV cache: every layer's K and V read once (2 L B H_kv d S bf16) and one position written
  (2 L B H_kv d bf16);
* weights: every layer's q, k, v, o, gate, up, down and two norms, the final norm and lm_head
  once, and the B embedding rows the tokens gather;
* activations: the tokens (s32 [B, 1]) and the position (s32) read, the logits (f32 [B, 1, V])
  written.

Decode with fp8 weights and an fp8 cache (``fp8``: ``--set weights_dtype=fp8 --set
kv_dtype=fp8``; ``fp8a`` adds ``--set act_dtype=fp8``, fp8 x fp8 GEMMs): the weights as int8's
below (1 B per kernel element, a bf16 scale per output channel), the cache 1 B per element with
no scales (a per-tensor scale of 1); int4 weights (``int4``): half a byte per kernel element,
the same scales, a bf16 cache.

Decode with int8 weights and int8 KV (``--set weights_dtype=int8 --set kv_dtype=int8``;
models/transformer.py): each projection kernel and lm_head int8 with a bf16 scale per output
channel, norms and the embedding bf16; the cache int8 with a bf16 scale per (batch, kv head,
position): KV read 2 L B H_kv S (d + 2), written 2 L B H_kv (d + 2).

The AdamW training step (``llama3-8b-train``: micro-batch 1 x 8192, scanned layers; models/train.py,
optax.adamw): every parameter read and written once (bf16, 2 P bytes each way), both moments
read and written once (bf16, the parameters' dtype) and the step count (s32), the tokens and
targets (s32 [1, 8192]) read and the loss (f32) written.

Gemma 2 9B decode (batch 32, 8192 positions, bf16; ``g2``): the KV cache only. The even layers
attend within 4096 positions and keep a ring of that many (``window_cache``), so K and V read
2 B H_kv d (21 x 4096 + 21 x 8192) bf16 and one position per layer written; under ``--plan tp``
over 8 devices (``g2/tp8``) the cache splits over the 8 kv heads; with an int8 cache (``g2q``,
``--set kv_dtype=int8``) 1 B per element and a bf16 scale per (batch, kv head, position).

Llama-3-8B prefill (``pre``: batch 1 x 8192 tokens, bf16, unrolled and scanned layers: a scan
returns the cache stacked, each layer's written into its slot): every parameter read once
but the embedding, of which the 8192 rows the tokens gather; the cache it returns written once
as ``kv_cache`` (2 L B H_kv d S bf16; the preset's ``out_roles``); the tokens (s32 [1, 8192])
read and the last position's logits (f32 [1, 1, V]) written. The KV cache alone of Mixtral 8x7B
prefill (``mxpre``: 32 layers x 8 kv heads of 128) and Gemma 2 9B prefill (``g2pre``: the
local layers' ring of 4096 positions, the global ones' 8192), 8192 tokens, batch 1, and of
DeepSeek-V3 prefill (``dspre``: 61 layers' latent cache [1, 4096, 512 + 64], 4096 tokens).

Decode under ``--plan tp`` over ``model`` = every device of h100-sxm:1x1x8 and tpu-v5p:2x2x1
(*tp/8*, *tp/4*: no more devices than the 8 kv heads), per device: the projections split n ways,
lm_head and the logits over vocab, the cache over kv heads, the norms replicated, and each
device's embedding gather reads the B rows the tokens give (of its vocab shard: which tokens
fall in it is not known before the run).

Compulsory traffic depends on the program's semantics alone (DESIGN.md), so the closed forms
hold for every compiler's program of the step (XLA:CPU's, XLA:GPU's, XLA:TPU's, scanned or
unrolled) and the excess pass run again without a hardware spec must give the same compulsory
bytes per role and path (column *no spec*). Also checked: compiled = compulsory + causes +
unattributed per role, no split-K partials charged to ``weights``, unattributed <= 1% of
compiled. The table goes to
``benchmarks/excess_closed_forms.md`` (``--out``; ``--out ''`` writes nothing). Each case runs
in a fresh process (one XLA compile at a time, its peak memory its own). The reduced copies of
these checks are ``tests/test_compulsory_invariance.py``.
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
# (case, preset, overrides, target, scan_layers); (v5e: 16 GiB, does not fit an 8B decode; the
# training step fits no single TPU chip: XLA:TPU refuses it, XLA:GPU and XLA:CPU do not check)
_Q = {"weights_dtype": "int8", "kv_dtype": "int8"}
_F8 = {"weights_dtype": "fp8", "kv_dtype": "fp8"}
CASES = [("bf16", "llama3-8b-decode", {}, "h100-sxm", "true"),
         ("bf16", "llama3-8b-decode", {}, "h100-sxm", "false"),
         ("bf16", "llama3-8b-decode", {}, "tpu-v5p", "true"),
         ("bf16", "llama3-8b-decode", {}, "tpu-v5p", "false"),
         ("bf16", "llama3-8b-decode", {}, "b200", "false"),
         ("bf16", "llama3-8b-decode", {}, "cpu", "false"),
         ("int8", "llama3-8b-decode", _Q, "h100-sxm", "true"),
         ("int8", "llama3-8b-decode", _Q, "h100-sxm", "false"),
         ("int8", "llama3-8b-decode", _Q, "tpu-v5p", "true"),
         ("int8", "llama3-8b-decode", _Q, "tpu-v5p", "false"),
         ("train", "llama3-8b-train", {}, "h100-sxm", "true"),
         ("train", "llama3-8b-train", {}, "cpu", "true"),
         ("tp/8", "llama3-8b-decode", {}, "h100-sxm:1x1x8", "false"),
         ("tp/4", "llama3-8b-decode", {}, "tpu-v5p:2x2x1", "false"),
         ("g2", "gemma2-9b-decode", {}, "b200", "false"),
         ("g2", "gemma2-9b-decode", {}, "tpu-v5p", "false"),
         ("g2/tp8", "gemma2-9b-decode", {}, "h100-sxm:1x1x8", "false"),
         ("g2q", "gemma2-9b-decode", {"kv_dtype": "int8"}, "h100-sxm", "false"),
         ("fp8", "llama3-8b-decode", _F8, "h100-sxm", "false"),
         ("fp8", "llama3-8b-decode", _F8, "b200", "false"),
         ("fp8a", "llama3-8b-decode", {**_F8, "act_dtype": "fp8"}, "h100-sxm", "false"),
         ("int4", "llama3-8b-decode", {"weights_dtype": "int4"}, "tpu-v5p", "false"),
         ("int4", "llama3-8b-decode", {"weights_dtype": "int4"}, "h100-sxm", "false"),
         ("pre", "llama3-8b-prefill", {}, "h100-sxm", "false"),
         ("pre", "llama3-8b-prefill", {}, "h100-sxm", "true"),
         ("pre", "llama3-8b-prefill", {}, "tpu-v5p", "false"),
         ("pre", "llama3-8b-prefill", {}, "tpu-v5p", "true"),
         ("mxpre", "mixtral-8x7b-prefill", {}, "h100-sxm", "false"),
         ("g2pre", "gemma2-9b-prefill", {}, "h100-sxm", "false"),
         ("g2pre", "gemma2-9b-prefill", {}, "tpu-v5p", "false"),
         ("dspre", "deepseek-v3-prefill", {}, "h100-sxm", "false")]
# the roles each case's closed form gives: weights, KV cache and activations, but for training
# (the second is the optimizer state) and the cases checked for their KV cache alone (Gemma 2's
# ring, the prefill caches of Mixtral, Gemma 2 and DeepSeek-V3: weights and activations shown)
_ALL = ("weights", "kv_cache", "activations")
_KV_ONLY = (None, "kv_cache", None)
ROLES = {"train": ("weights", "optimizer_state", "activations"),
         **{c: _KV_ONLY for c in ("g2", "g2/tp8", "g2q", "mxpre", "g2pre", "dspre")}}
TRAIN_B, TRAIN_S = 1, 8192  # models/families.py MODE_SIZES["train"]
PRE_B, PRE_S = 1, 8192  # models/families.py MODE_SIZES["prefill"]
# elements of one layer's projection kernels: q, k, v, o, gate, up, down
KERNELS = D * HEADS * HEAD_DIM + 2 * D * KV_HEADS * HEAD_DIM + HEADS * HEAD_DIM * D + 3 * D * D_FF


def _tp(n: int) -> dict[str, int]:
    """Per device, bf16 decode under ``--plan tp`` over ``model`` = n (n <= kv heads; the
    module docstring): the projections split n ways (q, k, v, gate, up by output features, o
    and down by input features), lm_head and the logits split over vocab, the cache over kv
    heads; the norms replicated, and each device's gather reads the B rows its tokens give
    (of its vocab shard of the table: which tokens fall in it is not known before the run)."""
    per_position = 2 * L * B * (KV_HEADS // n) * HEAD_DIM * BF16
    return {"weights": (L * (KERNELS // n + 2 * D) + VOCAB * D // n + D + B * D) * BF16,
            "kv_cache": per_position * S + per_position, "activations": B * 4 + 4 + B * VOCAB * 4 // n}


# Gemma 2 9B (models/families.py GEMMA2_9B, google/gemma-2-9b's config.json): 42 layers, 8 kv
# heads of 256, bf16 decode at batch 32 and 8192 positions; the even (local) layers attend within a
# window of 4096 and keep a ring of that many positions (models/transformer.py, --set
# window_cache=true, the default for unrolled layers), the odd (global) ones all 8192
G2_LAYERS, G2_KV_HEADS, G2_HEAD_DIM, G2_WINDOW = 42, 8, 256, 4096


def _gemma2_kv(n: int = 1, int8: bool = False) -> int:
    """Per device, the cache over kv heads split n ways: K and V of every position each layer
    holds read once (21 local layers x 4096 + 21 global x 8192), one position written per layer;
    ``int8``: 1 B per element and a bf16 scale per (batch, kv head, position)."""
    per_position = 2 * B * (G2_KV_HEADS // n) * (G2_HEAD_DIM + BF16 if int8 else G2_HEAD_DIM * BF16)
    local = (G2_LAYERS + 1) // 2
    return per_position * (local * G2_WINDOW + (G2_LAYERS - local) * S) + per_position * G2_LAYERS


def closed_forms() -> dict[str, dict[str, int]]:
    """case -> role -> compulsory bytes per program run and device (the module docstring's forms)."""
    per_layer = KERNELS + 2 * D
    per_position = 2 * L * B * KV_HEADS * HEAD_DIM * BF16
    act = B * 4 + 4 + B * VOCAB * 4
    # int8: kernels 1 B per element, a bf16 scale per output channel (q: H d, k / v: H_kv d,
    # o: D, gate / up: F, down: D); lm_head int8 + V scales; norms, final norm, embedding rows bf16
    scales = HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM + D + 2 * D_FF + D
    def quantized(elem_bits: int) -> int:  # kernels and lm_head at elem_bits, the rest as int8's
        return ((L * KERNELS + VOCAB * D) * elem_bits // 8 + L * scales * BF16 + L * 2 * D * BF16
                + VOCAB * BF16 + D * BF16 + B * D * BF16)
    q_weights = quantized(8)
    fp8 = {"weights": q_weights, "kv_cache": (per_position * S + per_position) // BF16, "activations": act}
    q_per_position = 2 * L * B * KV_HEADS * (HEAD_DIM + BF16)
    p = L * per_layer + 2 * VOCAB * D + D  # every parameter (embedding and lm_head untied)
    return {"bf16": {"weights": (L * per_layer + VOCAB * D + D + B * D) * BF16,
                     "kv_cache": per_position * S + per_position, "activations": act},
            "int8": {"weights": q_weights, "kv_cache": q_per_position * S + q_per_position,
                     "activations": act},
            # fp8 (float8_e4m3fn) weights as int8's, a bf16 scale per output channel; the fp8
            # cache 1 B per element and no scales (a per-tensor scale of 1)
            "fp8": fp8,
            # fp8 x fp8 GEMMs (act_dtype=fp8): the activations' quantization is on chip or an
            # intermediate, so the compulsory bytes are fp8's
            "fp8a": fp8,
            # int4 weights: half a byte per kernel element; the cache bf16
            "int4": {"weights": quantized(4), "kv_cache": per_position * S + per_position,
                     "activations": act},
            "train": {"weights": 2 * p * BF16, "optimizer_state": 2 * 2 * p * BF16 + 2 * 4,
                      "activations": 2 * TRAIN_B * TRAIN_S * 4 + 4},
            "tp/8": _tp(8), "tp/4": _tp(4),
            "g2": {"kv_cache": _gemma2_kv()}, "g2/tp8": {"kv_cache": _gemma2_kv(8)},
            "g2q": {"kv_cache": _gemma2_kv(int8=True)},
            # prefill: every parameter read once but the embedding, of which the B S rows the
            # tokens gather; the cache it returns (every layer's K and V of the S positions)
            # written once as kv_cache (Workload.out_roles); the tokens read, the last
            # position's logits written
            # Mixtral 8x7B prefill (32 layers, 8 kv heads of 128; models/families.py): its cache
            "mxpre": {"kv_cache": 2 * 32 * PRE_B * 8 * 128 * PRE_S * BF16},
            # Gemma 2 9B prefill: the ring of 4096 positions of the 21 local layers, 8192 of the
            # 21 global ones, written once
            "g2pre": {"kv_cache": 2 * PRE_B * G2_KV_HEADS * G2_HEAD_DIM * BF16
                      * ((G2_LAYERS + 1) // 2 * G2_WINDOW + G2_LAYERS // 2 * PRE_S)},
            # DeepSeek-V3 prefill (61 layers, 4096 tokens): one latent cache [B, S, r + dr] per
            # layer (r = 512, dr = 64; FlashMLA's layout, models/transformer.py)
            "dspre": {"kv_cache": 61 * PRE_B * 4096 * (512 + 64) * BF16},
            "pre": {"weights": (L * per_layer + VOCAB * D + D + PRE_B * PRE_S * D) * BF16,
                    "kv_cache": 2 * L * PRE_B * KV_HEADS * HEAD_DIM * PRE_S * BF16,
                    "activations": PRE_B * PRE_S * 4 + PRE_B * VOCAB * 4}}


def _child(preset: str, overrides: str, target: str, scan: str) -> dict:
    sys.path.insert(0, str(HERE.parent))
    import jaxmove
    t = time.perf_counter()
    over = {**json.loads(overrides), "scan_layers": scan}
    if ":" in target:  # a topology: --plan tp over model = every device (jaxmove analyze --mesh --plan)
        from jaxmove.capture.targets import Target
        from jaxmove.plans import capture_with_plan, load_plan
        tgt = Target.parse(target)
        program = capture_with_plan(preset, over, load_plan("tp"), {"model": tgt.num_devices}, [],
                                    target=target)
        r = jaxmove.analyze(program, hardware=target.split(":")[0])
    else:
        r = jaxmove.analyze(preset, overrides=over, target=target)
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
    ap.add_argument("--quick", action="store_true", help="scanned decode forms only (seconds to compile)")
    ap.add_argument("--out", default=str(HERE / "excess_closed_forms.md"))
    ap.add_argument("--cases", default="", help="only these cases (comma-separated: bf16,int8,train,"
                    "tp/8,tp/4,g2,g2/tp8,g2q,fp8,fp8a,int4,pre,mxpre,g2pre,dspre); default: all")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0
    wants = closed_forms()
    hdr = (f"{'case':<6} {'target':<15} {'layers':<9} {'weights compulsory B':>21} {'closed form':>16} "
           f"{'KV / opt. state B':>17} {'closed form':>16} {'act. compulsory B':>18} {'closed form':>12} "
           f"{'no spec':>7} {'identity':>8} {'split-K->weights B':>18} {'unattr':>7} {'result':>6} {'s':>6}")
    lines = [hdr, "-" * len(hdr)]
    print(hdr, flush=True)
    failed = 0
    for case, preset, overrides, target, scan in CASES:
        if args.quick and (scan != "true" or case == "train"):
            continue
        if args.cases and case not in args.cases.split(","):
            continue
        proc = subprocess.run([sys.executable, __file__, "--child", preset, json.dumps(overrides), target, scan],
                              capture_output=True, text=True)
        form = "scanned" if scan == "true" else "unrolled"
        if proc.returncode != 0:
            lines.append(f"{case:<6} {target:<15} {form:<9} error: "
                         f"{(proc.stderr.strip().splitlines() or ['?'])[-1][:120]}")
            print(lines[-1], flush=True)
            failed += 1
            continue
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        want = wants[case]
        roles = ROLES.get(case, _ALL)
        w_role, s_role, a_role = roles
        shown = [r or k for r, k in zip(roles, _ALL)]
        w, second, act = (got["by_role"].get(k, {"compulsory": 0})["compulsory"] for k in shown)
        checked = [(g, want[r]) for g, r in zip((w, second, act), roles) if r is not None]
        ok = (all(g == x for g, x in checked) and got["same_without_spec"]
              and got["identity_ok"] and got["split_k_weights_bytes"] == 0
              and got["unattributed_fraction"] <= 0.01)
        failed += not ok
        wf, af = (f"{want[r]:,}" if r is not None else "-" for r in (w_role, a_role))
        lines.append(f"{case:<6} {target:<15} {form:<9} {w:>21,} {wf:>16} {second:>17,} "
                     f"{want[s_role]:>16,} {act:>18,} {af:>12} "
                     f"{'same' if got['same_without_spec'] else 'DIFF':>7} "
                     f"{'yes' if got['identity_ok'] else 'NO':>8} {got['split_k_weights_bytes']:>18,} "
                     f"{100 * got['unattributed_fraction']:>6.2f}% {'ok' if ok else 'FAIL':>6} {got['analyze_s']:>6.1f}")
        print(lines[-1], flush=True)
    foot = ("Llama-3-8B: *bf16* = decode, batch 32, KV cache 8192, bf16; *int8* = the same with "
            "`--set weights_dtype=int8 --set kv_dtype=int8`; *train* = `llama3-8b-train`, the AdamW step "
            "(micro-batch 1 x 8192; the second role is the optimizer state); *tp/n* = bf16 decode under "
            "`--plan tp` over model = n devices, per device; *g2* = Gemma 2 9B decode (batch 32, 8192 "
            "positions, bf16, the local layers' ring of 4096; *g2/tp8* under `--plan tp` over 8 devices, "
            "per device; *g2q* with `--set kv_dtype=int8`), its KV cache checked against the closed form (weights and activations shown, "
            "- = not checked); *pre* = `llama3-8b-prefill` (batch 1 x 8192 tokens, bf16), the cache it "
            "returns as KV written once (*mxpre*, *g2pre*, *dspre*: Mixtral 8x7B's, Gemma 2 9B's and DeepSeek-V3's prefill, the KV "
            "cache only); *fp8* = decode with `--set weights_dtype=fp8 --set kv_dtype=fp8` "
            "(*fp8a* also `--set act_dtype=fp8`: fp8 x fp8 GEMMs); *int4* = `--set weights_dtype=int4`; "
            "compiled without the device "
            "(deviceless XLA:GPU / XLA:TPU; XLA:CPU on this machine); compulsory bytes per program run "
            "and device, from `jaxmove analyze ... "
            "--excess` (the excess pass); closed forms computed in this script from the shapes (the "
            "module docstring); no spec = "
            "the compulsory bytes per role and path the same when the pass runs without a hardware spec; "
            "ok = weights, KV / optimizer state and activations equal to the closed form, the same without "
            "a spec, compiled = compulsory + causes + unattributed "
            "per role, no split-K partials charged to weights, unattributed <= 1% of compiled; "
            "s = compile + analysis, wall clock (jaxmove's compile cache on, as `jaxmove analyze "
            "--target` runs: a warm cache skips the accelerator compiles).")
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
