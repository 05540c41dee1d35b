"""Which kernels XLA runs for the one-dot programs of its measured GEMM table, on a local GPU.

The open GEMM targets of issue 13 (``benchmarks/gpu_kernels.md``: fp8's p90 from rows the
table measures slower than a larger GEMM; TF32's split-K and tile choices) turn on a question
only a device answers: for a given shape and dtype, how many kernels does XLA's compiled
program launch, which ones (cuBLAS / cuBLASLt / a Triton gemm, a split-K reduction, a
transpose), and how long does each take? The table's figure is the median duration over all
kernel events of its runs (xla/tools/matmul_perf_table_gen.cc, ``Profile``;
hlo_op_profiler.cc, ``getMedianKernelTimeNs``), so a program of two kernels records their
mean and one of three records the middle one.

For each selected row of ``../shared/data/xla_gemm_h100.csv`` this script compiles the same
program as the table's generator, a plain ``dot`` of two parameters ``[b,m,k] x [b,k,n]``
with default precision (f32 runs as TF32 on sm_80+) and the table's output type, with XLA's
default flags (autotuning on), runs it ``--warmup`` times, then ``--runs`` times under
``jax.profiler.trace``, and records per row:

* ``kernels_per_run``, ``kernel_names`` (``;``-joined, one run's, in launch order) and
  ``kernel_us`` (the same run's durations);
* ``median_kernel_us`` (the table's statistic over every kernel event of every run) and
  ``run_kernel_sum_us`` (the median over runs of the sum of a run's kernels: what the
  program costs);
* ``table_h100_us`` (the table's time on the H100) and ``jaxmove_us`` (jaxmove's GEMM model
  on the local device's spec, ``--spec``, the same statistic as benchmarks/gpu_kernels.py);
* ``hlo_kernels``: the optimized HLO's kernel-level instructions (fusion kinds and
  custom-call targets), so a row says whether cuBLASLt, cuBLAS or Triton ran.

The CSV is rewritten atomically after every row, so a run stopped at its limit keeps every
finished row; ``--max-seconds`` stops cleanly before a device lease ends.

Run on a GPU (the device tool's H200: its image has jax, so ``PYTHONPATH=.`` suffices; the
tool does not send ``../shared``, so copy the table into an ignored folder of the checkout,
e.g. ``.device/``, name it in ``carry`` and pass ``--table``)::

    PYTHONPATH=. python3 benchmarks/gpu_table_kernels.py --table .device/xla_gemm_h100.csv \
        --max-seconds 420 --out $OUT/gpu_table_kernels.csv

``--select inverted`` (default) takes b = 1 shapes with m, n <= 1024 and k <= 2048 (the
region of the inverted fp8 rows and of TF32's split-K choices) plus 4096^3, for bf16, f32 and
fp8 e4m3 x e4m3: 111 programs; ``--select all`` the whole table (1875). On a machine without a
GPU the script refuses unless ``--allow-cpu`` is given; the CPU's "kernels" are XLA:CPU
thunks (what tests/test_gpu_table_kernels.py checks), not GPU figures.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"

FIELDS = ("b", "m", "n", "k", "dtype_key", "device", "kernels_per_run", "kernel_names", "kernel_us",
          "median_kernel_us", "run_kernel_sum_us", "table_h100_us", "jaxmove_us", "hlo_kernels",
          "runs")

#: the table's dtype keys -> (lhs, rhs, out) jax dtype names
DTYPE_NAMES = {
    "bf16xbf16->bf16": ("bfloat16", "bfloat16", "bfloat16"),
    "f32xf32->f32": ("float32", "float32", "float32"),
    "f8e4m3fnxf8e4m3fn->bf16": ("float8_e4m3fn", "float8_e4m3fn", "bfloat16"),
    "f8e4m3fnxf8e5m2->bf16": ("float8_e4m3fn", "float8_e5m2", "bfloat16"),
    "f8e5m2xf8e4m3fn->bf16": ("float8_e5m2", "float8_e4m3fn", "bfloat16"),
}
INVERTED_DTYPES = ("bf16xbf16->bf16", "f32xf32->f32", "f8e4m3fnxf8e4m3fn->bf16")


def select_rows(table, how: str):
    """The table rows to measure (a pandas DataFrame): ``inverted`` or ``all`` (module doc)."""
    if how == "all":
        return table.reset_index(drop=True)
    if how != "inverted":
        raise SystemExit(f"--select: expected 'inverted' or 'all', got {how!r}")
    t = table[table.dtype_key.isin(INVERTED_DTYPES)]
    small = (t.b == 1) & (t.m <= 1024) & (t.n <= 1024) & (t.k <= 2048)
    big = (t.b == 1) & (t.m == 4096) & (t.n == 4096) & (t.k == 4096)
    return t[small | big].reset_index(drop=True)


def hlo_kernels(hlo_text: str) -> str:
    """The optimized HLO's kernel-level instructions of the entry computation, as
    ``fusion:<kind or backend kind>`` / ``custom-call:<target>`` joined by ``;``."""
    out = []
    entry = hlo_text[hlo_text.find("ENTRY"):]
    for line in entry.splitlines():
        if " fusion(" in line:
            kind = re.search(r'"kind":"([^"]+)"', line) or re.search(r"kind=(k\w+)", line)
            out.append(f"fusion:{kind.group(1) if kind else '?'}")
        elif " custom-call(" in line:
            tgt = re.search(r'custom_call_target="([^"]+)"', line)
            out.append(f"custom-call:{tgt.group(1) if tgt else '?'}")
    return ";".join(out)


def runs_of(events, runs: int) -> list[list]:
    """Group one module's kernel events into program runs: by ``run_id`` when every event has
    one, else in launch order into ``runs`` equal parts.

    Raises:
      ValueError: the events do not split into ``runs`` equal runs.
    """
    evs = sorted(events, key=lambda e: e.start_ns)
    if evs and all(e.run_id is not None for e in evs):
        by: dict[int, list] = {}
        for e in evs:
            by.setdefault(e.run_id, []).append(e)
        return [by[r] for r in sorted(by)]
    if runs < 1 or len(evs) % runs:
        raise ValueError(f"{len(evs)} kernel events do not split into {runs} runs")
    per = len(evs) // runs
    return [evs[i * per:(i + 1) * per] for i in range(runs)]


def measure_row(row, *, warmup: int, runs: int):
    """Compile and profile one table row's program; returns (runs' events, optimized HLO)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxmove.measure.profile import module_events, record_events

    lhs_t, rhs_t, out_t = (getattr(jnp, n) for n in DTYPE_NAMES[row.dtype_key])
    b, m, n, k = int(row.b), int(row.m), int(row.n), int(row.k)
    dims = (((2,), (1,)), ((0,), (0,)))

    def dot(x, y):
        return jax.lax.dot_general(x, y, dims, preferred_element_type=out_t)

    name = f"gemm_b{b}_m{m}_n{n}_k{k}_{row.dtype_key.replace('->', '_to_')}"
    dot.__name__ = re.sub(r"\W", "_", name)
    fn = jax.jit(dot)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((b, m, k), dtype=np.float32)).astype(lhs_t)
    y = jnp.asarray(rng.standard_normal((b, k, n), dtype=np.float32)).astype(rhs_t)
    compiled = fn.lower(x, y).compile()
    for _ in range(warmup):
        jax.block_until_ready(compiled(x, y))

    def go():
        for _ in range(runs):
            jax.block_until_ready(compiled(x, y))

    events = record_events(go)
    module = f"jit_{dot.__name__}"
    return runs_of(module_events(events, module), runs), compiled.as_text()


def jaxmove_estimate_us(spec, row) -> float:
    """jaxmove's estimate of the table's statistic for ``row`` on ``spec`` (as gpu_kernels.py)."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_kernels  # noqa: E402 (the benchmark's own predict: one definition)
    import pandas as pd

    return 1e6 * float(gpu_kernels.predict(spec, pd.DataFrame([row._asdict()]), gpu_kernels.gpu_gemm.FITTED)[0])


def write_csv(path: Path, rows: list[dict]) -> None:
    from jaxmove.report.outputs import write_atomic

    def w(f: io.TextIOBase) -> None:
        wr = csv.DictWriter(f, fieldnames=FIELDS)
        wr.writeheader()
        wr.writerows(rows)

    write_atomic(path, w, "kernel table")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="CSV to write (rewritten after every row)")
    ap.add_argument("--select", default="inverted", help="inverted (default) or all")
    ap.add_argument("--limit", type=int, default=None, help="measure at most this many rows")
    ap.add_argument("--runs", type=int, default=10, help="profiled runs per program (table: 5 x 2)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after this long")
    ap.add_argument("--spec", default=None, help="jaxmove hardware spec for jaxmove_us "
                    "(default: h200 when the device says H200, else h100-sxm)")
    ap.add_argument("--table", default=str(DATA / "xla_gemm_h100.csv"))
    ap.add_argument("--allow-cpu", action="store_true", help="run without a GPU (tests only)")
    a = ap.parse_args(argv)

    from jaxmove.hardware import load_spec  # first: jaxmove picks the platform, quietly

    import jax
    import pandas as pd

    dev = jax.devices()[0]
    if dev.platform != "gpu" and not a.allow_cpu:
        print(f"gpu_table_kernels: no GPU (jax's first device is {dev.platform}); "
              "pass --allow-cpu to run anyway (thunks, not GPU kernels)", file=sys.stderr)
        return 2
    table_path = Path(a.table)
    if not table_path.is_file():
        print(f"gpu_table_kernels: no table at {table_path}", file=sys.stderr)
        return 2
    rows = select_rows(pd.read_csv(table_path), a.select)
    if a.limit is not None:
        rows = rows.head(a.limit)
    spec = load_spec(a.spec or ("h200" if "H200" in dev.device_kind.upper() else "h100-sxm"))
    out_rows: list[dict] = []
    t0 = time.monotonic()
    for i, row in enumerate(rows.itertuples(index=False), 1):
        if a.max_seconds is not None and time.monotonic() - t0 > a.max_seconds:
            print(f"stopped at --max-seconds after {i - 1} of {len(rows)} rows", file=sys.stderr)
            break
        per_run, hlo = measure_row(row, warmup=a.warmup, runs=a.runs)
        durs = [[e.duration_ns / 1e3 for e in r] for r in per_run]
        first = per_run[0]
        rec = {
            "b": row.b, "m": row.m, "n": row.n, "k": row.k, "dtype_key": row.dtype_key,
            "device": dev.device_kind, "kernels_per_run": len(first),
            "kernel_names": ";".join(e.name for e in first),
            "kernel_us": ";".join(f"{d:.3f}" for d in durs[0]),
            "median_kernel_us": round(statistics.median(d for r in durs for d in r), 3),
            "run_kernel_sum_us": round(statistics.median(sum(r) for r in durs), 3),
            "table_h100_us": round(row.time_s * 1e6, 3),
            "jaxmove_us": round(jaxmove_estimate_us(spec, row), 3),
            "hlo_kernels": hlo_kernels(hlo), "runs": len(per_run),
        }
        out_rows.append(rec)
        write_csv(Path(a.out), out_rows)
        print(f"[{i}/{len(rows)}] {row.dtype_key} b={row.b} m={row.m} n={row.n} k={row.k}: "
              f"{rec['kernels_per_run']} kernel(s), median {rec['median_kernel_us']} us "
              f"(table {rec['table_h100_us']}, jaxmove {rec['jaxmove_us']})", flush=True)
    print(f"wrote {len(out_rows)} rows to {a.out} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
