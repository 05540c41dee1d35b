"""GPU kernel time against XLA's measured H100 tables: GEMMs and NCCL collectives.

Writes ``benchmarks/gpu_kernels.md``. Data (``../shared/data``, see its README.md):
``xla_gemm_h100.csv`` (XLA's default_matmul_perf_table.txtpb, sm_90) and
``xla_collectives_h100.csv`` (default_collective_perf_table.txtpb, sm_90).

Method:
  * Rows are split in two halves at random (numpy seed 0): a GEMM shape (b, m, n, k) goes to
    one half with all its dtypes; collective rows are split one by one. The fitted constants of
    ``jaxmove/hardware/gpu_gemm.py`` (GemmParams) and ``jaxmove/hardware/nccl.py``
    (NcclParams) are fitted on the first half (mean absolute error of log time, scipy's
    Nelder-Mead); every figure in the report is on the other half.
  * What the table measures: XLA's ``matmul_perf_table_gen`` records the *median kernel
    duration* over the CUPTI kernel events of 5 x 2 runs of a one-dot program
    (xla/tools/matmul_perf_table_gen.cc, ``Profile``; hlo_op_profiler.cc,
    ``getMedianKernelTimeNs``). A program of one kernel records that kernel; a program of
    several (a split-K gemm and its reduction; an fp8 gemm through cuBLASLt, which takes both
    operands k-minor, after a kernel that transposes the [b,k,n] rhs) records the median of
    their durations. The estimate compared is the same statistic over the kernels jaxmove
    predicts for the program (gpu_gemm's kernels, plus the fp8 rhs transpose as a
    memory-bound kernel of the same fixed cost).
  * What the collective table measures: XLA's ``collective_perf_table_gen`` records the median
    over 20 runs of the whole one-collective program's ``compute_time_ns`` (so XLA's thunk and
    NCCL's launch are in it); a collective-permute runs 101 times in a while loop and the time
    is divided by 100 (xla/tools/collective_perf_table_gen.cc).
  * Baselines: a plain roofline ``max(2bmnk / peak, bytes(A + B + C) / hbm_bytes_per_s)`` and
    the roofline + the spec's ``kernel_launch_overhead_s`` (jaxmove's estimate before this
    model).

Run: ``python benchmarks/gpu_kernels.py`` (about a minute on one core).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"
OUT = Path(__file__).with_name("gpu_kernels.md")
SEED = 0

from jaxmove.hardware import gpu_gemm, load_spec, nccl  # noqa: E402

# dtype_key of the table -> (flops_per_s key, lhs bytes, rhs bytes, out bytes, label)
DTYPES = {
    "bf16xbf16->bf16": ("bf16", 2, 2, 2, "bf16"),
    "f32xf32->f32": ("tf32", 4, 4, 4, "f32 (tf32)"),
    "f8e4m3fnxf8e4m3fn->bf16": ("fp8", 1, 1, 2, "fp8 e4m3 x e4m3"),
    "f8e4m3fnxf8e5m2->bf16": ("fp8", 1, 1, 2, "fp8 e4m3 x e5m2"),
    "f8e5m2xf8e4m3fn->bf16": ("fp8", 1, 1, 2, "fp8 e5m2 x e4m3"),
}


def load_gemm() -> pd.DataFrame:
    d = pd.read_csv(DATA / "xla_gemm_h100.csv")
    return d[d.device_key == "sm_90"].reset_index(drop=True)


def split_halves(keys: pd.Series, seed: int = SEED) -> np.ndarray:
    """True for rows whose key is in the fitting half (a random half of the distinct keys)."""
    uniq = sorted(set(keys))
    rng = np.random.default_rng(seed)
    pick = set(rng.permutation(len(uniq))[: len(uniq) // 2].tolist())
    fit_keys = {uniq[i] for i in pick}
    return keys.map(lambda k: k in fit_keys).to_numpy()


def table_statistic(kernel_times_s: list[float]) -> float:
    """The median over 10 runs' kernel events = the median of one run's kernel durations."""
    return float(statistics.median(kernel_times_s))


def _arrays(spec, d: pd.DataFrame) -> dict:
    cfgs = []
    for bm, bn in gpu_gemm.CANDIDATE_TILES:
        for sk in gpu_gemm._SPLITS:
            cfgs.append((bm, bn, sk))
    c = np.array(cfgs, dtype=np.float64)
    info = [DTYPES[k] for k in d.dtype_key]
    ea = np.array([i[1] for i in info], dtype=np.float64)[:, None]
    return {
        "b": d.b.to_numpy(np.float64)[:, None], "m": d.m.to_numpy(np.float64)[:, None],
        "n": d.n.to_numpy(np.float64)[:, None], "k": d.k.to_numpy(np.float64)[:, None],
        "peak": np.array([spec.flops_per_s[i[0]] for i in info])[:, None], "ea": ea,
        "key": [i[0] for i in info],
        "eb": np.array([i[2] for i in info], dtype=np.float64)[:, None],
        "ec": np.array([i[3] for i in info], dtype=np.float64)[:, None],
        "fp8": np.array([i[0] == "fp8" for i in info]),
        "bm": c[None, :, 0], "bn": c[None, :, 1], "s": c[None, :, 2],
        "bk": np.array([gpu_gemm._block_k(i[1]) for i in info], dtype=np.float64)[:, None],
    }


def predict(spec, d: pd.DataFrame, params, arrays: dict | None = None) -> np.ndarray:
    """The table's statistic (median kernel duration) over the kernels of each row's program:
    the model's fastest configuration (gemm, + reduction with split-K), + the fp8 transpose."""
    a = arrays if arrays is not None else _arrays(spec, d)
    eta = np.array([params.eta_for(k) for k in a["key"]])[:, None]
    r = gpu_gemm.kernel_times(spec, params, a["b"], a["m"], a["n"], a["k"], a["peak"], eta, a["ea"],
                              a["eb"], a["ec"], a["bm"], a["bn"], a["bk"], a["s"])
    valid = (a["s"] == 1) | (np.floor(a["k"] / a["s"]) >= a["bk"])  # as candidate_configs
    total = np.where(valid, r["gemm_s"] + r["reduce_s"], np.inf)
    i = np.argmin(total, axis=1)
    rows = np.arange(len(i))
    g = r["gemm_s"][rows, i]
    red = r["reduce_s"][rows, i]
    split = a["s"][0, i] > 1
    # cuBLASLt fp8 takes B k-minor: a kernel transposes the [b,k,n] rhs first
    tr = r["fixed_s"] + 2.0 * a["b"][:, 0] * a["k"][:, 0] * a["n"][:, 0] * a["eb"][:, 0] / spec.hbm_bytes_per_s
    out = np.empty(len(i))
    for j in range(len(i)):
        ks = [g[j]] + ([red[j]] if split[j] else []) + ([tr[j]] if a["fp8"][j] else [])
        out[j] = table_statistic(ks)
    return out


def roofline(spec, d: pd.DataFrame, launch: bool) -> np.ndarray:
    out = []
    for r in d.itertuples():
        key, ea, eb, ec, _ = DTYPES[r.dtype_key]
        flops = 2.0 * r.b * r.m * r.n * r.k
        byts = r.b * (r.m * r.k * ea + r.k * r.n * eb + r.m * r.n * ec)
        t = max(flops / spec.flops_per_s[key], byts / spec.hbm_bytes_per_s)
        out.append(t + (spec.kernel_launch_overhead_s if launch else 0.0))
    return np.array(out)


FIT_KEYS = ("bf16", "tf32", "fp8")


def fit_gemm(spec, d: pd.DataFrame) -> gpu_gemm.GemmParams:
    """Fit GemmParams on ``d``: mean absolute log error, Nelder-Mead from two starts."""
    from scipy.optimize import minimize

    y = np.log(d.time_s.to_numpy())
    arrays = _arrays(spec, d)

    def params_of(x):
        return gpu_gemm.GemmParams(eta=dict(zip(FIT_KEYS, (float(v) for v in x[:3]))),
                                   fill_k_steps=float(x[3]), fixed_cycles=float(x[4]) * 1000.0,
                                   feed_bytes_per_cycle=float(x[5]))

    def loss(x):
        if not (all(0.05 < v <= 1.0 for v in x[:3]) and 0 <= x[3] < 64 and 0 <= x[4] < 1000
                and 1.0 < x[5] < 1024):
            return 1e9
        return float(np.mean(np.abs(np.log(predict(spec, d, params_of(x), arrays)) - y)))

    best = None
    for x0 in ([0.9, 0.7, 0.8, 2.0, 10.0, 64.0], [0.8, 0.8, 0.8, 4.0, 6.0, 32.0]):
        r = minimize(loss, x0, method="Nelder-Mead",
                     options={"xatol": 1e-4, "fatol": 1e-6, "maxiter": 3000, "adaptive": True})
        if best is None or r.fun < best.fun:
            best = r
    x = best.x
    return gpu_gemm.GemmParams(eta={k: round(float(v), 4) for k, v in zip(FIT_KEYS, x[:3])},
                               fill_k_steps=round(float(x[3]), 3),
                               fixed_cycles=round(float(x[4]) * 1000.0, 1),
                               feed_bytes_per_cycle=round(float(x[5]), 2))


def err_stats(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float, float, int]:
    """(median |rel err|, p90 |rel err|, median signed rel err, n), rel err = pred/meas - 1."""
    e = pred / meas - 1.0
    if len(e) == 0:
        return (math.nan, math.nan, math.nan, 0)
    return (float(np.median(np.abs(e))), float(np.percentile(np.abs(e), 90)), float(np.median(e)),
            len(e))


def band_of(t: np.ndarray) -> np.ndarray:
    return np.where(t < 10e-6, "<10us", np.where(t <= 100e-6, "10-100us", ">100us"))


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:+.1f}%" if x < 0 else f"{100 * x:.1f}%"


def table(rows: list[tuple[str, dict[str, tuple]]]) -> list[str]:
    head = ("| group | n | model median | model p90 | model signed | roofline median | "
            "roofline signed | roofline+launch median | roofline+launch signed |")
    lines = [head, "|" + "---|" * 9]
    for name, s in rows:
        m, r, rl = s["model"], s["roofline"], s["roofline+launch"]
        lines.append(f"| {name} | {m[3]} | {_pct(m[0])} | {_pct(m[1])} | {_pct(m[2])} | "
                     f"{_pct(r[0])} | {_pct(r[2])} | {_pct(rl[0])} | {_pct(rl[2])} |")
    return lines


def gemm_report(spec) -> tuple[list[str], dict]:
    d = load_gemm()
    shape_key = d.apply(lambda r: (r.b, r.m, r.n, r.k), axis=1)
    fit_mask = split_halves(shape_key)
    t0 = time.perf_counter()
    params = fit_gemm(spec, d[fit_mask])
    fit_s = time.perf_counter() - t0
    test = d[~fit_mask].reset_index(drop=True)
    meas = test.time_s.to_numpy()
    preds = {"model": predict(spec, test, params), "roofline": roofline(spec, test, False),
             "roofline+launch": roofline(spec, test, True)}
    bands = band_of(meas)
    rows: list[tuple[str, dict]] = []
    summary = {}
    for dk, (_key, _a, _b, _c, label) in DTYPES.items():
        sel = (test.dtype_key == dk).to_numpy()
        st = {k: err_stats(v[sel], meas[sel]) for k, v in preds.items()}
        rows.append((f"**{label}** all", st))
        summary[dk] = st["model"]
        for band in ("<10us", "10-100us", ">100us"):
            bs = sel & (bands == band)
            rows.append((f"{label} {band}", {k: err_stats(v[bs], meas[bs]) for k, v in preds.items()}))
    allst = {k: err_stats(v, meas) for k, v in preds.items()}
    rows.append(("**all dtypes**", allst))
    summary["all"] = allst["model"]
    lines = [
        "## GEMMs: XLA's measured H100 table (sm_90)",
        "",
        f"{len(d)} rows ({d.dtype_key.nunique()} dtype pairs x {shape_key.nunique()} shapes); fitted on "
        f"{int(fit_mask.sum())} rows ({len(set(shape_key[fit_mask]))} shapes, seed {SEED}), reported on the "
        f"other {len(test)}. Fit took {fit_s:.1f} s.",
        "",
        "Fitted constants (`jaxmove/hardware/gpu_gemm.py`, `GemmParams`):",
        "",
        f"* `eta` (sustained fraction of the datasheet tensor-core peak, per dtype) = {params.eta}",
        f"* `fill_k_steps` (pipeline fill + drain per CTA tile, k steps) = {params.fill_k_steps}",
        f"* `fixed_cycles` (per-kernel fixed cost, SM cycles at {spec.sm_clock_hz / 1e9:.2f} GHz) = "
        f"{params.fixed_cycles} ({1e6 * params.fixed_cycles / spec.sm_clock_hz:.2f} us)",
        f"* `feed_bytes_per_cycle` (operand bytes per SM per cycle, L2 -> shared memory) = "
        f"{params.feed_bytes_per_cycle}",
        "",
        "Errors are `estimate / measured - 1` on the held-out half; size bands are by measured time.",
        "",
        *table(rows),
        "",
        *skinny_lines(spec, d, test, params),
    ]
    return lines, {"params": params, "summary": summary}


def skinny_lines(spec, d: pd.DataFrame, test: pd.DataFrame, params) -> list[str]:
    """What the table does not measure: skinny (decode) GEMMs; and the model's bound labels."""
    bf = test[test.dtype_key == "bf16xbf16->bf16"]
    peak = spec.flops_per_s["bf16"]

    def bf16(b, m, n, k):
        return gpu_gemm.gemm_time(spec, b=int(b), m=int(m), n=int(n), k=int(k), peak_flops_per_s=peak,
                                  peak_key="bf16", lhs_bytes=2, rhs_bytes=2, out_bytes=2, params=params)

    bounds = pd.Series([bf16(r.b, r.m, r.n, r.k).bound for r in bf.itertuples()]).value_counts()
    out = ["## Skinny GEMMs (decode) are outside the table", "",
           f"The table's smallest m, n and k are {int(d.m.min())}, {int(d.n.min())} and {int(d.k.min())}: "
           "no decode GEMM (m <= 64) is measured, so the model's skinny case rests on its structure "
           "(`jaxmove/hardware/gpu_gemm.py` docstring: the tensor cores issue the padded tile, a "
           "skinny tile waits on its operand loads, the kernel is memory-bound). Held-out bf16 "
           "shapes by the model's bound: " + ", ".join(f"{k} {v}" for k, v in bounds.items()) + ".",
           "", "| [m,k] x [k,n] bf16 | tile | bound | est us | weights / HBM us | tensor cores, padded tiles us | useful us |",
           "|---|---|---|---|---|---|---|"]
    for m, n, k in ((1, 4096, 4096), (1, 14336, 4096), (1, 50257, 768), (16, 4096, 4096), (64, 4096, 4096)):
        t = bf16(1, m, n, k)
        c = t.config
        out.append(f"| [{m},{k}] x [{k},{n}] | {c.block_m}x{c.block_n}x{c.block_k}"
                   f"{f' split-K {c.split_k}' if c.split_k > 1 else ''} | {t.bound} | {1e6 * t.time_s:.2f} | "
                   f"{1e6 * n * k * 2 / spec.hbm_bytes_per_s:.2f} | {1e6 * t.mma_s:.2f} | {1e6 * t.useful_mma_s:.3f} |")
    return out


def load_collectives() -> pd.DataFrame:
    d = pd.read_csv(DATA / "xla_collectives_h100.csv")
    d = d[d.device_key == "sm_90"].reset_index(drop=True)
    d["n"] = d.num_devices_per_group.fillna(2).astype(int)
    return d


def wire_bytes(r) -> float:
    """Bytes one device sends (the ring factors of passes/collectives.py's docstring)."""
    n = r.n
    if r.opcode == "all-reduce":
        return 2.0 * (n - 1) / n * r.input_bytes
    if r.opcode == "all-gather":
        return (n - 1) / n * r.output_bytes
    if r.opcode in ("reduce-scatter", "all-to-all"):  # reduce-scatter: input = pre-scatter buffer
        return (n - 1) / n * r.input_bytes
    return float(r.input_bytes)  # collective-permute: each device sends its buffer to one peer


def predict_collectives(spec, d: pd.DataFrame, params) -> np.ndarray:
    return np.array([nccl.collective_time_s(r.opcode, wire_bytes(r), r.n, spec, params=params)
                     for r in d.itertuples()])


def fit_nccl(spec, d: pd.DataFrame) -> nccl.NcclParams:
    """Fit NcclParams on ``d``: mean absolute log error, Nelder-Mead."""
    from scipy.optimize import minimize

    y = np.log(d.time_s.to_numpy())

    def params_of(x):
        return nccl.NcclParams(overhead_s=x[0] * 1e-6, latency_scale=x[1], bandwidth_efficiency=x[2],
                               local_copy_efficiency=x[3])

    def loss(x):
        if not (0 <= x[0] < 1000 and 0 <= x[1] < 100 and 0.01 < x[2] <= 1.5 and 0.01 < x[3] <= 10):
            return 1e9
        return float(np.mean(np.abs(np.log(predict_collectives(spec, d, params_of(x))) - y)))

    r = minimize(loss, [6.0, 1.0, 0.8, 0.5], method="Nelder-Mead",
                 options={"xatol": 1e-4, "fatol": 1e-6, "maxiter": 3000, "adaptive": True})
    return nccl.NcclParams(overhead_s=round(float(r.x[0]), 3) * 1e-6, latency_scale=round(float(r.x[1]), 4),
                           bandwidth_efficiency=round(float(r.x[2]), 4),
                           local_copy_efficiency=round(float(r.x[3]), 4))


def _ring_bus_gbps(spec) -> float:
    arch = nccl.arch_of(spec)
    link = spec.intra_node_bytes_per_s / 1e9 * arch.nvlink_bw_per_link_gbps / arch.nvlink_raw_per_link_gbps
    nch, bw = nccl._ring_channels(link, arch)
    return nch * bw


def _steps_before(kind: str, n: int) -> int:
    """Ring steps of jaxmove's collective time before the NCCL model (passes/collectives.py)."""
    return 1 if kind == "collective-permute" else 2 * (n - 1) if kind == "all-reduce" else n - 1


def collective_baselines(spec, d: pd.DataFrame, launch: bool) -> np.ndarray:
    """jaxmove's collective time before this model: link_latency_s x ring steps + wire bytes /
    intra-node bandwidth (+ the kernel launch overhead)."""
    out = []
    for r in d.itertuples():
        t = spec.link_latency_s * _steps_before(r.opcode, r.n) + wire_bytes(r) / spec.intra_node_bytes_per_s
        out.append(t + (spec.kernel_launch_overhead_s if launch else 0.0))
    return np.array(out)


def collectives_report(spec) -> tuple[list[str], dict]:
    d = load_collectives()
    fit_mask = split_halves(pd.Series(range(len(d))))
    params = fit_nccl(spec, d[fit_mask])
    test = d[~fit_mask].reset_index(drop=True)
    picks: dict[str, int] = {}
    for r in test.itertuples():
        c = nccl.choose(r.opcode, wire_bytes(r), r.n, spec)
        key = f"{c.algorithm}/{c.protocol}"
        picks[key] = picks.get(key, 0) + 1
    meas = test.time_s.to_numpy()
    preds = {"model": predict_collectives(spec, test, params),
             "roofline": collective_baselines(spec, test, False),
             "roofline+launch": collective_baselines(spec, test, True)}
    bands = band_of(meas)
    rows: list[tuple[str, dict]] = []
    summary = {}
    for op in sorted(d.opcode.unique()):
        sel = (test.opcode == op).to_numpy()
        rows.append((f"**{op}** all", {k: err_stats(v[sel], meas[sel]) for k, v in preds.items()}))
        summary[op] = rows[-1][1]["model"]
        big = sel & (meas > 100e-6)
        rows.append((f"{op} >100us", {k: err_stats(v[big], meas[big]) for k, v in preds.items()}))
    for band in ("<10us", "10-100us", ">100us"):
        bs = bands == band
        rows.append((f"all kinds {band}", {k: err_stats(v[bs], meas[bs]) for k, v in preds.items()}))
    rows.append(("**all kinds**", {k: err_stats(v, meas) for k, v in preds.items()}))
    summary["all"] = rows[-1][1]["model"]
    lines = [
        "",
        "## Collectives: XLA's measured NCCL table (8 x H100 in one node, sm_90)",
        "",
        f"{len(d)} rows (5 kinds, groups of 2, 4 and 8, f32 buffers of 1 KiB to 8 GiB); fitted on a "
        f"random half of the rows ({int(fit_mask.sum())}, seed {SEED}), reported on the other {len(test)}. "
        "The baseline is jaxmove's time before this model: `link_latency_s` x ring steps + wire "
        "bytes / `intra_node_bytes_per_s` (\"roofline\"), and the same + `kernel_launch_overhead_s`.",
        "",
        "Fitted constants (`jaxmove/hardware/nccl.py`, `NcclParams`):",
        "",
        f"* `overhead_s` (XLA's collective thunk + NCCL kernel launch) = {params.overhead_s:.4g}",
        f"* `latency_scale` (on NCCL's tuning.cc latencies) = {params.latency_scale}",
        f"* `bandwidth_efficiency` (on NCCL's tuning.cc bandwidths; the ring's busBw here is "
        f"{_ring_bus_gbps(spec):.0f} GB/s from {spec.intra_node_bytes_per_s / 1e9:.0f} GB/s NVLink per direction) = "
        f"{params.bandwidth_efficiency}",
        f"* `local_copy_efficiency` (NCCL's in-GPU copies, fraction of {spec.hbm_bytes_per_s / 1e12:.2f} TB/s HBM) = "
        f"{params.local_copy_efficiency}",
        "",
        "NCCL's pick per row (algorithm/protocol by tuning.cc's own time; held-out rows): "
        + ", ".join(f"{k} {v}" for k, v in sorted(picks.items())) + ".",
        "",
        *table(rows),
    ]
    return lines, {"params": params, "summary": summary}


def main() -> int:
    if not (DATA / "xla_gemm_h100.csv").is_file():
        print(f"no data at {DATA}", file=sys.stderr)
        return 2
    spec = load_spec("h100-sxm")
    lines = ["# GPU kernel time against measurements (generated by benchmarks/gpu_kernels.py)", "",
             __doc__.split("Run:")[0].strip().split("\n", 1)[1].strip(), ""]
    g, info = gemm_report(spec)
    lines += g
    if info["params"] != gpu_gemm.FITTED:
        print(f"note: gpu_gemm.FITTED differs from this fit: {info['params']}", file=sys.stderr)
    if (DATA / "xla_collectives_h100.csv").is_file():
        c, cinfo = collectives_report(spec)
        lines += c
        if cinfo["params"] != nccl.FITTED:
            print(f"note: nccl.FITTED differs from this fit: {cinfo['params']}", file=sys.stderr)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
