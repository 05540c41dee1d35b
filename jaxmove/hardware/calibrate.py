"""Calibration: measure the local default JAX device and return it as a `HardwareSpec`.

What is measured, with JAX itself (each timing ends with ``block_until_ready``):

- ``hbm_bytes_per_s``: a stream ``x <- x + 1`` over a float32 array far larger than
  any cache, with the input donated so the update is in place; bytes per call =
  read + write = 2 * x.nbytes. The best (shortest) of several timed calls is kept,
  as an attainable peak comparable to a datasheet's.
- ``flops_per_s.f32`` / ``.bf16`` (+ ``.f16`` in full mode, ``.tf32`` on NVIDIA GPUs):
  square matmuls, FLOPs = 2 * n**3 (one multiply and one add per term), n doubled
  until one call takes long enough to time; best of several calls. f32 uses
  ``precision=HIGHEST`` (true f32; on TPU that is 6 bf16 passes), tf32 the default.
- ``kernel_launch_overhead_s``: a jitted chain of k tiny 8x8 dots; the kernels XLA
  emits are counted in the compiled HLO, and
  (median t(chain of k) - median t(chain of 1)) / (kernels(k) - kernels(1)) is the cost
  of one more kernel, with the per-call dispatch cost subtracted out.
- ``dispatch_overhead_s``: the chain of 1 above: its median time minus its kernels at the
  per-kernel overhead, i.e. the host's cost of one blocking program call.
- ``first_touch_bytes_per_s`` and ``mmap_threshold_bytes`` (CPU with glibc only):
  ``jit(x + 1)`` on a float32 array of 2x the mmap threshold or more, once writing a fresh
  output (allocated and freed by every call) and once donated (in place). The page faults
  per call are counted with ``getrusage`` (``ru_minflt``); when the fresh call faults on
  its output's pages, (median fresh - median in-place) is the time to map and zero
  ``x.nbytes`` bytes of pages. The threshold is glibc's ``DEFAULT_MMAP_THRESHOLD_MAX``
  (32 MiB on 64-bit, mallopt(3)): above it an allocation is always mmap'd, so freed and
  mapped again on every run. No faults (another allocator, huge pages): neither is written.
- ``intra_node_bytes_per_s`` (only with 2+ local devices): ``jax.device_put`` of a
  large array from device 0 to device 1.

Capacity comes from ``Device.memory_stats()['bytes_limit']`` (host RAM on CPU), the
CPU last-level cache from sysfs, and the GPU SM count from ``Device.core_count``.
`quick=True` uses smaller problems and fewer repetitions (about 10 s on a 2-core CPU).

Repeats and spread. A machine under load gives figures that are off without looking
wrong (a per-kernel overhead of 0.0065 us where idle runs give 0.3-0.4 us). So every
probe runs ``repeats`` times (3 quick, 5 full; each repeat is the whole timing above,
problem set-up and compilation shared), the spec keeps the **median** of the repeats,
and ``calibration`` records each figure's spread, ``(max - min) / median`` over the
repeats (``<key>_spread``, dots in the key written as ``_``); the two launch overheads run
7 repeats (9 full) and their spread is the interquartile range over the median
(``robust_spread``), so one repeat on a busy core does not refuse the spec. A figure is *unstable*
(``calibration["unstable"]``, comma-separated keys) when its spread exceeds
``SPREAD_LIMITS``: 25% for bandwidths and peaks (the best of several calls is a stable
statistic on an idle machine: repeats agree within a few percent), 50% for the overheads
and the first-touch rate (differences of two medians of short timings: idle repeats agree
within ~20%), or when the per-kernel overhead needed a fall-back estimator (the chain of
k kernels was not slower than the chain of one). ``jaxmove calibrate`` warns about
unstable figures and saves the spec only with ``--force``.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform as _platform
import re
import statistics
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from jaxmove.hardware.spec import HardwareSpec
from jaxmove.hlo.opcodes import names

__all__ = ["CalibrationError", "SPREAD_LIMITS", "calibrate", "robust_spread", "spread", "unstable_figures"]

Progress = Callable[[str], None]

# Entry-computation opcodes that move nothing and launch no kernel.
_NOT_KERNELS = names(quiet=True)  # hlo/opcodes.py


class CalibrationError(RuntimeError):
    """A measurement produced no usable number (e.g. timings all zero)."""


#: Largest relative spread ``(max - min) / median`` over a probe's repeats that a saved
#: figure may have (module docstring): throughput figures, and time differences.
SPREAD_LIMITS = {"throughput": 0.25, "overhead": 0.5}
_OVERHEAD_KEYS = ("kernel_launch_overhead_s", "dispatch_overhead_s", "first_touch_bytes_per_s")


def spread(values: list[float]) -> float:
    """``(max - min) / median`` of repeated measurements of one figure (0 for one value;
    inf when the median is not positive)."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else float("inf")


def robust_spread(values: list[float]) -> float:
    """The spread of an overhead figure: with 5 or more repeats, the interquartile range over
    the median (``statistics.quantiles(values, n=4, method="inclusive")``), which one repeat
    disturbed by another process does not move; with fewer, ``spread``. An overhead is a
    difference of two short timings: on a loaded 2-core machine one repeat in several lands
    on a busy core (issue 29: ``--quick``'s 3 repeats gave 82% and refused to save)."""
    if len(values) < 5:
        return spread(values)
    med = statistics.median(values)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / med if med > 0 else float("inf")


def spread_limit(key: str) -> float:
    """The ``SPREAD_LIMITS`` entry that applies to the figure ``key``."""
    return SPREAD_LIMITS["overhead" if key in _OVERHEAD_KEYS else "throughput"]


def unstable_figures(spec: HardwareSpec) -> list[str]:
    """The keys a calibrated spec marks unstable (``calibration["unstable"]``), or []."""
    text = (spec.calibration or {}).get("unstable", "")
    return [k for k in str(text).split(",") if k]


class _Plan:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.repeats = 3 if quick else 5          # of every probe; the median is kept
        self.stream_bytes = (128 if quick else 512) * 2**20
        self.stream_reps = 3 if quick else 10      # calls per repeat (the best is its figure)
        self.matmul_start_n = 512
        self.matmul_max_n = 2048 if quick else 8192
        self.matmul_target_s = 0.03 if quick else 0.2
        self.matmul_reps = 2 if quick else 5
        self.chain_len = 64 if quick else 256
        self.chain_reps = 60 if quick else 300
        # the overheads are differences of short timings: more repeats, a robust spread
        self.overhead_repeats = 7 if quick else 9
        self.chain_budget_s = 0.2 if quick else 1.0  # per chain and repeat
        self.copy_bytes = (64 if quick else 256) * 2**20
        self.budget_s = 0.5 if quick else 2.0  # per measurement and repeat, beyond the minimum reps
        self.first_touch_bytes = (64 if quick else 256) * 2**20
        self.first_touch_reps = 3 if quick else 7


def _timed(fn: Callable[[], Any], *, reps: int, budget_s: float, warmup: int = 1) -> list[float]:
    """Wall times of `reps` (or more, up to `budget_s` and 10 * reps) calls of `fn`,
    each waited for with ``jax.block_until_ready``."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn())
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < reps or (time.perf_counter() - start < budget_s and len(times) < 10 * reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return times


def _platform_kind(platform: str) -> str:
    p = platform.lower()
    if p == "tpu":
        return "tpu"
    if p in ("gpu", "cuda", "rocm"):
        return "gpu"
    return "cpu"


def _cpu_info() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("vendor_id", "model name") and key not in info:
                info[key] = value.strip()
    except OSError:
        pass
    return info


def _vendor(kind: str, device_kind: str) -> str:
    if kind == "tpu":
        return "Google"
    if kind == "gpu":
        first = device_kind.split()[0] if device_kind.split() else ""
        return first or "unknown"
    vendor_id = _cpu_info().get("vendor_id", "")
    return {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(vendor_id, vendor_id or _platform.machine() or "unknown")


def _cpu_last_level_cache_bytes() -> tuple[int, str] | None:
    """(size, sysfs path) of the highest-level data/unified cache of cpu0, if readable."""
    best: tuple[int, int, str] | None = None
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        entries = sorted(root.glob("index*"))
    except OSError:
        return None
    for idx in entries:
        try:
            level = int((idx / "level").read_text())
            ctype = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if ctype == "Instruction":
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", size)
        if not m:
            continue
        nbytes = int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
        if best is None or level > best[0]:
            best = (level, nbytes, str(idx / "size"))
    return None if best is None else (best[1], best[2])


def _count_kernels(hlo_text: str) -> int:
    """Instructions of the ENTRY computation that launch a kernel."""
    entry = hlo_text[hlo_text.index("ENTRY") :] if "ENTRY" in hlo_text else hlo_text
    body = entry.split("\n}", 1)[0]
    ops = re.findall(r"=\s*[^=\s]+\s+([a-z][a-z0-9\-]*)\(", body)
    return sum(n for op, n in Counter(ops).items() if op not in _NOT_KERNELS)


def _measure_stream(plan: _Plan, device: Any) -> tuple[float, dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    nbytes = plan.stream_bytes
    capacity, _ = _capacity_bytes(device)
    nbytes = min(nbytes, capacity // 8)  # leave room on small devices
    n = nbytes // 4
    holder = [jax.device_put(jnp.zeros((n,), jnp.float32), device)]
    step = jax.jit(lambda x: x + 1.0, donate_argnums=0)

    def call() -> Any:
        holder[0] = step(holder[0])
        return holder[0]

    moved = 2 * n * 4
    values, calls = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "donated buffers were not usable" on some backends
        for k in range(plan.repeats):
            times = _timed(call, reps=plan.stream_reps, budget_s=plan.budget_s, warmup=1 if k == 0 else 0)
            values.append(moved / min(times))
            calls += len(times)
    del holder[0]
    return values, {
        "stream_array_bytes": n * 4,
        "stream_calls": calls,
    }


def _measure_matmul(plan: _Plan, device: Any, dtype: Any, precision: Any) -> tuple[list[float], dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    mm = jax.jit(lambda a, b: jnp.dot(a, b, precision=precision))
    n = plan.matmul_start_n
    while True:
        a = jax.device_put(jnp.full((n, n), 0.5, dtype), device)
        b = jax.device_put(jnp.full((n, n), 0.25, dtype), device)
        first = _timed(lambda: mm(a, b), reps=1, budget_s=0.0)
        if min(first) >= plan.matmul_target_s or n * 2 > plan.matmul_max_n:
            break
        n *= 2
    flops = 2 * n**3
    values, calls = [], 0
    for _ in range(plan.repeats):
        times = _timed(lambda: mm(a, b), reps=plan.matmul_reps, budget_s=plan.budget_s, warmup=0)
        values.append(flops / min(times))
        calls += len(times)
    return values, {"n": n, "calls": calls}


def _kernel_overhead_one(extra: int, med1: float, medn: float, min1: float, minn: float,
                         kn: int) -> tuple[float, str]:
    """(seconds per extra kernel, estimator) from one repeat's chain timings."""
    per_kernel = (medn - med1) / extra
    if per_kernel > 0:
        return per_kernel, "median difference"
    per_kernel = (minn - min1) / extra
    if per_kernel > 0:
        return per_kernel, "minimum difference"
    return medn / kn, "upper bound: median time / kernels"


def _measure_kernel_overhead(plan: _Plan, device: Any) -> tuple[list[float], list[float], dict[str, Any]]:
    """(per-kernel overhead per repeat, dispatch overhead per repeat, details)."""
    import jax
    import jax.numpy as jnp

    def chain(k: int) -> Callable[..., Any]:
        def f(x: Any, w: Any) -> Any:
            for _ in range(k):
                x = jnp.dot(x, w) + 1.0
            return x

        return jax.jit(f)

    x = jax.device_put(jnp.ones((8, 8), jnp.float32), device)
    w = jax.device_put(jnp.eye(8, dtype=jnp.float32) * 0.5, device)
    compiled = {k: chain(k).lower(x, w).compile() for k in (1, plan.chain_len)}
    kernels = {k: _count_kernels(c.as_text()) for k, c in compiled.items()}
    k1, kn = kernels[1], kernels[plan.chain_len]
    extra = kn - k1
    if extra <= 0:
        raise CalibrationError(f"kernel-overhead chain compiled to {kn} kernels vs {k1}; cannot separate them")
    per_kernel, dispatch, methods, med1s, medns = [], [], [], [], []
    for r in range(plan.overhead_repeats):  # the two chains timed back to back in each repeat
        stats = {}
        for k, c in compiled.items():
            times = _timed(lambda c=c: c(x, w), reps=plan.chain_reps, budget_s=plan.chain_budget_s,
                           warmup=3 if r == 0 else 1)
            stats[k] = (statistics.median(times), min(times))
        (med1, min1), (medn, minn) = stats[1], stats[plan.chain_len]
        value, method = _kernel_overhead_one(extra, med1, medn, min1, minn, kn)
        per_kernel.append(value)
        dispatch.append(med1 - k1 * value)
        methods.append(method)
        med1s.append(med1)
        medns.append(medn)
    return per_kernel, dispatch, {
        "kernel_chain_kernels": kn,
        "kernel_chain_median_s": statistics.median(medns),
        "kernel_chain_1_kernels": k1,
        "kernel_chain_1_median_s": statistics.median(med1s),
        "kernel_overhead_estimator": ", ".join(dict.fromkeys(methods)),
    }


# glibc malloc/malloc.c: DEFAULT_MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * sizeof(long).
_GLIBC_MMAP_THRESHOLD_MAX_BYTES = 4 * 1024 * 1024 * 8


def _measure_first_touch(plan: _Plan, device: Any) -> tuple[list[float], dict[str, Any]] | None:
    """(bytes/s of writing into freshly mapped pages, one per repeat; details), or None when
    a fresh output does not fault or is not slower than the in-place call in the median
    repeat (module docstring)."""
    import resource

    import jax
    import jax.numpy as jnp

    n = max(plan.first_touch_bytes, 2 * _GLIBC_MMAP_THRESHOLD_MAX_BYTES) // 4
    base = jax.device_put(jnp.ones((n,), jnp.float32), device)
    fresh = jax.jit(lambda x: x + 1.0)
    inplace = jax.jit(lambda x: x + 1.0, donate_argnums=0)

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def run(fn: Callable[[Any], Any], donate: bool) -> tuple[float, float]:
        times, flts = [], []
        for k in range(plan.first_touch_reps + 1):
            x = jax.block_until_ready(base + 0.0) if donate else base
            f0, t0 = faults(), time.perf_counter()
            out = jax.block_until_ready(fn(x))
            t1, f1 = time.perf_counter(), faults()
            del out, x
            if k:  # the first call compiles
                times.append(t1 - t0)
                flts.append(f1 - f0)
        return statistics.median(times), statistics.median(flts)

    nbytes = n * 4
    rates, fresh_s, inplace_s, faults_seen = [], [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(plan.repeats):
            t_fresh, f_fresh = run(fresh, False)
            t_inplace, _f_inplace = run(inplace, True)
            fresh_s.append(t_fresh)
            inplace_s.append(t_inplace)
            faults_seen.append(f_fresh)
            # a repeat where the fresh call was not slower gives no rate: counted as 0 so the
            # spread shows it
            rates.append(nbytes / (t_fresh - t_inplace) if t_fresh > t_inplace else 0.0)
    del base
    f_fresh = statistics.median(faults_seen)
    if not f_fresh or f_fresh < 0.5 * nbytes / 4096 or statistics.median(rates) <= 0:
        return None
    return rates, {
        "first_touch_array_bytes": nbytes,
        "first_touch_fresh_median_s": statistics.median(fresh_s),
        "first_touch_inplace_median_s": statistics.median(inplace_s),
        "first_touch_faults_per_call": int(f_fresh),
        "first_touch_bytes_per_fault": round(nbytes / f_fresh, 1),
    }


def _measure_device_copy(plan: _Plan, devices: list[Any]) -> list[float]:
    import jax
    import jax.numpy as jnp

    n = plan.copy_bytes // 4
    x = jax.device_put(jnp.ones((n,), jnp.float32), devices[0])
    return [n * 4 / min(_timed(lambda: jax.device_put(x, devices[1]), reps=3 if plan.quick else 10,
                               budget_s=plan.budget_s)) for _ in range(plan.repeats)]


def _capacity_bytes(device: Any) -> tuple[int, str]:
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), "jax Device.memory_stats()['bytes_limit']"
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host physical memory (os.sysconf SC_PHYS_PAGES x SC_PAGE_SIZE)"
    except (ValueError, OSError, AttributeError):
        raise CalibrationError("cannot determine device memory capacity") from None


def calibrate(quick: bool = False, progress: Progress | None = None) -> HardwareSpec:
    """Measure the local default JAX device (``jax.devices()[0]``) and return its spec.

    The spec is named ``local``; every measured number's ``sources`` entry reads
    "measured by jaxmove calibrate on <device> at <UTC time>: <method>". Each figure is
    the median of ``repeats`` runs of its probe; ``calibration`` holds the spread of each
    (``<key>_spread``), the limits (``spread_limit_throughput``, ``spread_limit_overhead``)
    and the figures beyond them (``unstable``; see the module docstring), besides problem
    sizes and the jax version.

    quick: smaller problems and fewer repetitions; under 30 s on a 2-core CPU.
      Full mode takes up to a couple of minutes.
    progress: called with a one-line message before each measurement.

    Raises CalibrationError when a measurement yields no positive number.
    """
    import jax
    import jax.numpy as jnp

    say: Progress = progress or (lambda _msg: None)
    t_start = time.perf_counter()
    plan = _Plan(quick)
    device = jax.devices()[0]
    platform = device.platform
    kind = _platform_kind(platform)
    device_kind = str(device.device_kind)
    label = device_kind
    if kind == "cpu":
        model = _cpu_info().get("model name")
        label = f"{model} ({os.cpu_count()} CPUs)" if model else f"{_platform.processor() or 'CPU'} ({os.cpu_count()} CPUs)"
    when = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    stamp = f"measured by jaxmove calibrate{' --quick' if quick else ''} on {label} [jax {jax.__version__}, {platform}] at {when}"

    sources: dict[str, str] = {}
    details: dict[str, Any] = {
        "device_kind": device_kind,
        "platform": platform,
        "jax_version": jax.__version__,
        "date": when,
        "quick": quick,
    }

    details["repeats"] = plan.repeats
    details["spread_limit_throughput"] = SPREAD_LIMITS["throughput"]
    details["spread_limit_overhead"] = SPREAD_LIMITS["overhead"]
    unstable: list[str] = []
    reps = f"median of {plan.repeats} repeats"

    def keep(key: str, values: list[float]) -> float:
        """The median of a figure's repeats; records its spread (``robust_spread`` for the
        overheads), and whether it is unstable."""
        sp = robust_spread(values) if key in _OVERHEAD_KEYS else spread(values)
        details[f"{key.replace('.', '_')}_spread"] = round(sp, 4) if sp != float("inf") else -1.0
        details[f"{key.replace('.', '_')}_repeats"] = len(values)  # (the overheads run more)
        if sp > spread_limit(key):
            unstable.append(key)
        return statistics.median(values)

    say(f"memory bandwidth: streaming x + 1 over up to {plan.stream_bytes // 2**20} MiB of float32 "
        f"({plan.repeats} repeats)")
    values, d = _measure_stream(plan, device)
    hbm = keep("hbm_bytes_per_s", values)
    details.update(d)
    sources["hbm_bytes_per_s"] = (
        f"{stamp}: {reps}, each the best of its calls ({d['stream_calls']} calls in all), of jit(x + 1) on "
        f"float32[{d['stream_array_bytes'] // 4}] with x donated; bytes = read + write = 2 x "
        f"{d['stream_array_bytes']}"
    )

    flops: dict[str, float] = {}
    dtypes: list[tuple[str, Any, Any]] = [
        ("f32", jnp.float32, jax.lax.Precision.HIGHEST),
        ("bf16", jnp.bfloat16, None),
    ]
    if not quick:
        dtypes.append(("f16", jnp.float16, None))
    if kind == "gpu" and device_kind.upper().startswith("NVIDIA"):
        dtypes.append(("tf32", jnp.float32, jax.lax.Precision.DEFAULT))
    for key, dtype, precision in dtypes:
        say(f"peak FLOP/s ({key}): square matmuls")
        values, d = _measure_matmul(plan, device, dtype, precision)
        flops[key] = keep(f"flops_per_s.{key}", values)
        details[f"matmul_{key}_n"] = d["n"]
        prec = f", precision={precision.name}" if precision is not None else ""
        sources[f"flops_per_s.{key}"] = (
            f"{stamp}: {reps}, each the best of its calls ({d['calls']} in all), of jit(dot) on "
            f"{jnp.dtype(dtype).name}[{d['n']},{d['n']}] x [{d['n']},{d['n']}]{prec}; FLOPs = 2 n^3"
        )

    say(f"per-kernel overhead: chain of {plan.chain_len} tiny dots ({plan.overhead_repeats} repeats)")
    per_kernel, dispatches, d = _measure_kernel_overhead(plan, device)
    overhead = keep("kernel_launch_overhead_s", per_kernel)
    details.update(d)
    if d["kernel_overhead_estimator"] != "median difference" and "kernel_launch_overhead_s" not in unstable:
        unstable.append("kernel_launch_overhead_s")   # the chain of k was not slower than the chain of 1
    sources["kernel_launch_overhead_s"] = (
        f"{stamp}: median of {plan.overhead_repeats} repeats of (median time of a jitted chain of {plan.chain_len} 8x8 dots "
        f"({d['kernel_chain_kernels']} kernels in the compiled HLO) - median time of a chain of 1) / extra "
        f"kernels ({d['kernel_overhead_estimator']})"
    )

    extra: dict[str, Any] = {}
    if statistics.median(dispatches) > 0:
        extra["dispatch_overhead_s"] = keep("dispatch_overhead_s", dispatches)
        sources["dispatch_overhead_s"] = (
            f"{stamp}: {reps} of (median time of the jitted chain of 1 8x8 dot "
            f"({d['kernel_chain_1_kernels']} kernels, {d['kernel_chain_1_median_s']:.4g} s in the median repeat) - "
            "its kernels x that repeat's per-kernel overhead): the host's cost of one blocking program call"
        )

    if kind == "cpu" and _platform.libc_ver()[0] == "glibc":
        say("first-touch page mapping: x + 1 into a fresh output vs in place")
        ft = _measure_first_touch(plan, device)
        if ft is not None:
            rates, d = ft
            details.update(d)
            extra["first_touch_bytes_per_s"] = keep("first_touch_bytes_per_s", rates)
            extra["mmap_threshold_bytes"] = _GLIBC_MMAP_THRESHOLD_MAX_BYTES
            sources["first_touch_bytes_per_s"] = (
                f"{stamp}: {reps} of: float32[{d['first_touch_array_bytes'] // 4}] x + 1: median of "
                f"{plan.first_touch_reps} calls into a fresh output ({d['first_touch_faults_per_call']} page "
                f"faults per call, ru_minflt) - median of {plan.first_touch_reps} donated in-place calls; "
                f"bytes = {d['first_touch_array_bytes']} / that difference"
            )
            sources["mmap_threshold_bytes"] = (
                f"{stamp}: the fresh {d['first_touch_array_bytes']}-byte output faulted on every page "
                f"({d['first_touch_bytes_per_fault']} bytes per fault), as glibc maps every allocation above "
                "its mmap threshold afresh; the value is glibc's DEFAULT_MMAP_THRESHOLD_MAX = 4 MiB x "
                "sizeof(long) = 32 MiB on 64-bit (mallopt(3), malloc/malloc.c), the most the dynamic "
                "threshold can reach"
            )

    capacity, cap_how = _capacity_bytes(device)
    sources["hbm_capacity_bytes"] = f"{stamp}: {cap_how}"

    local = [d for d in jax.local_devices() if d.platform == platform]
    sources["devices_per_node"] = f"{stamp}: number of local {platform} devices (jax.local_devices())"
    if len(local) > 1:
        say("device-to-device bandwidth: jax.device_put from device 0 to device 1")
        extra["intra_node_bytes_per_s"] = keep("intra_node_bytes_per_s", _measure_device_copy(plan, local))
        sources["intra_node_bytes_per_s"] = (
            f"{stamp}: {reps}, each the best time of jax.device_put of {plan.copy_bytes} bytes from device 0 "
            "to device 1"
        )
    if kind == "cpu":
        llc = _cpu_last_level_cache_bytes()
        if llc:
            extra["l2_bytes"] = llc[0]
            sources["l2_bytes"] = f"{stamp}: last-level cache size read from {llc[1]}"
    if kind == "gpu":
        cores = getattr(device, "core_count", None)
        if isinstance(cores, int) and cores > 0:
            extra["num_sms"] = cores
            sources["num_sms"] = f"{stamp}: jax Device.core_count"

    details["unstable"] = ",".join(unstable)
    details["duration_s"] = round(time.perf_counter() - t_start, 3)
    for key, value in {"hbm_bytes_per_s": hbm, "kernel_launch_overhead_s": overhead, **{f"flops_per_s.{k}": v for k, v in flops.items()}}.items():
        if not (value > 0 and value != float("inf")):
            raise CalibrationError(f"calibration of {key} gave {value!r}")

    return HardwareSpec(
        name="local",
        display_name=f"{label} (calibrated)",
        vendor=_vendor(kind, device_kind),
        kind=kind,
        device_kinds=(device_kind,),
        flops_per_s=flops,
        hbm_bytes_per_s=hbm,
        hbm_capacity_bytes=capacity,
        kernel_launch_overhead_s=overhead,
        devices_per_node=len(local),
        notes=(
            "Measured on this machine by `jaxmove calibrate`. Attainable peaks (best of repeated runs), not "
            "datasheet figures; for CPUs 'hbm' is host DRAM. Interconnect figures are absent unless 2+ local "
            "devices were present."
        ),
        sources=sources,
        calibration=details,
        **extra,
    )
