"""Time of one GEMM kernel on an NVIDIA GPU: tiles, waves, a k pipeline, and its memory traffic.

A structural model of how cuBLAS and XLA's Triton gemm emitter run ``C[b,m,n] = A[b,m,k] @
B[b,k,n]`` (the CUTLASS / Triton "tiled GEMM", Triton's matmul tutorial and NVIDIA's "Matrix
Multiplication Background User's Guide", https://docs.nvidia.com/deeplearning/performance/
dl-performance-matrix-multiplication/index.html, sections "Tile quantization" and "Wave
quantization"):

* The output is cut into CTA tiles ``BM x BN``; the k loop advances ``BK`` at a time, and a
  split-K kernel gives each of ``S`` CTAs ``k / S`` of it. ``ctas = b * ceil(m/BM) *
  ceil(n/BN) * S``.
* The CTAs run in waves over the SMs, one CTA per SM: ``waves = ceil(ctas / num_sms)``
  (wave quantization: 133 tiles on 132 SMs take two waves).
* One CTA's time is its k steps plus the pipeline's fill and drain
  (``fill_k_steps``, fitted), each step limited by its tensor-core work at the SM's share of
  the peak (``eta[dtype] * flops_per_s[dtype] / num_sms``) or by its operand loads
  (``(BM + BN) x BK`` elements from L2 into shared memory at ``feed_bytes_per_cycle`` per SM
  per cycle), whichever is slower; then its epilogue writes the ``BM x BN`` tile.
* The kernel's HBM traffic is the tiled schedule's: A, B and C once when one batch's A and B
  fit in L2 (``l2_bytes``); otherwise every wave re-reads the A rows and B columns its tiles
  need (a near-square block of tiles per wave, the grouped ordering of Triton's tutorial).
  The kernel takes ``max(waves x tile time, HBM bytes / hbm_bytes_per_s)`` (the loads overlap
  the math) plus a fixed cost (``fixed_cycles`` SM cycles at ``sm_clock_hz``: CTA launch,
  prologue, the tail of the last wave), fitted; a TF32 gemm kernel has its own
  (``gemm_fixed_cycles["tf32"]``, fitted: on XLA's measured H100 table a TF32 gemm's fixed
  part is ~1.35x a bf16 or fp8 gemm's, ``benchmarks/gpu_kernels.md``).
* Operand layout (Hopper, sm_90): ``wgmma`` reads its B operand from shared memory, and only
  16-bit types (f16/bf16) may be MN-major there; ``.tf32``, ``.e4m3``/``.e5m2`` and ``.s8``
  operands must be K-major (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate",
  section "Matrices in shared memory": the transpose of A/B, ``imm-trans-a``/``imm-trans-b``, is
  only for ``.f16``/``.bf16``). A TF32 dot whose B is ``[k, n]`` with ``n`` minor (what
  ``x @ w`` gives) has its B tile transposed on the way into shared memory, through registers
  instead of a TMA copy: the model charges the B bytes ``mn_major_feed_factor`` (fitted) times
  in the k step's operand loads, and adds ``mn_major_step_cycles`` (fitted) to every k step
  (the shuffle is on the step's critical path). fp8 is not charged: the measured table's fp8 programs fit a
  cuBLASLt gemm that takes B k-minor after a separate transpose kernel
  (``benchmarks/gpu_kernels.py`` models that kernel), and no measured fp8 program transposes B
  inside the gemm. jaxlib 0.10.2's XLA:GPU does: it compiles an fp8 dot to a Triton gemm fusion
  with the transpose inside it (``passes/gpu_kernel_time.py`` reads B's stored layout through
  it); such a time lacks that cost and says so (`mn_major_uncharged`).
* Split-K writes ``S`` partial f32 results, and a second kernel reduces them (XLA's Triton
  split-K rewrite: a ``kCustom`` gemm fusion followed by a reduce fusion); the reduction is a
  memory-bound kernel with the same fixed cost.
* Without tiles from the program (``tile=None``) the model does what XLA's autotuner does:
  it tries the candidate configurations `CANDIDATE_TILES` and keeps the fastest.
* Skinny GEMMs (decode: m or n far below the tile, e.g. a GEMV ``[1,k] x [k,n]``): the
  tensor cores spend the *padded* tile, not the useful rows. The smallest bf16/f16 MMA is
  ``mma.sync.m16n8k16`` (16 rows; Hopper's ``wgmma`` is ``m64nNk16``, a whole warpgroup on 64
  rows; PTX ISA, "Warp Level Matrix Multiply-Accumulate Instructions" and "Asynchronous
  Warpgroup Level Matrix Multiply-Accumulate"), and Triton's ``tl.dot`` needs every block
  dimension >= 16 and fills the rows past ``m`` with masked zero loads (Triton docs,
  ``triton.language.dot``): the MMA issued for a tile is ``2 x BM x BN x BK`` per k step
  whatever ``m`` is. So `GemmTime.mma_s` is the padded tiles' tensor-core time and
  ``useful_mma_s`` the useful work's (``2bmnk / (eta x peak)``), shown side by side. A skinny
  tile's step is limited by its operand loads (the B panel at ``feed_bytes_per_cycle``),
  not by the MMA: ``2 x BM x BN x BK`` flops on ``(BM + BN) x BK`` elements is
  ``2 BM BN / ((BM + BN) e)`` flop/B (``e`` bytes per element), 14 flop/B for a 16 x 128 bf16
  tile against the SM's ridge ``eta x peak / num_sms / (feed_bytes_per_cycle x sm_clock_hz)``
  ~ 47 flop/B on the H100 (fitted constants). ``bound`` is "compute" only when the
  tensor-core issue of the tiles is the largest term (their MMA limits the step and the tile
  time exceeds the HBM time); a kernel held up by loads, from HBM or L2 into shared memory,
  is "memory". The measured table has no shape under 256 (``benchmarks/gpu_kernels.md``), so
  the skinny case is the structure's, unchecked against measurements.

Constants: ``num_sms``, ``sm_clock_hz``, ``flops_per_s``, ``hbm_bytes_per_s`` and
``l2_bytes`` come from the hardware spec (each with its source in the spec's ``[sources]``);
``GemmParams`` holds the fitted ones, fitted on a random half of
XLA's measured H100 table by ``benchmarks/gpu_kernels.py`` (values in `FITTED` and in
``benchmarks/gpu_kernels.md``). With ``eta = 1`` the compute-bound limit of the model is the
spec's peak exactly; the fitted ``eta`` is the sustained fraction of it (clock under load).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import numpy as np

__all__ = [
    "CANDIDATE_TILES",
    "FITTED",
    "GemmConfig",
    "GemmParams",
    "GemmTime",
    "GemmModelError",
    "K_MAJOR_ONLY_KEYS",
    "gemm_model_applies",
    "mn_major_penalized",
    "mn_major_uncharged",
    "WGMMA_K_MAJOR_KEYS",
    "gemm_time",
    "kernel_times",
]


class GemmModelError(ValueError):
    """The spec lacks a figure the GEMM model needs, or the GEMM is malformed."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GemmParams:
    """The fitted constants of the model (dimensionless or in SM cycles, so they carry to
    other GPUs through the spec's clock, SM count and peaks).

    eta: sustained fraction of the datasheet tensor-core peak, per ``flops_per_s`` key
      (bf16, tf32, fp8; f16 uses bf16's, int8 fp8's, others `default_eta`): the clock under a
      power-limited load over the clock the datasheet assumes, and the MMA issue rate.
    fill_k_steps: k steps of pipeline fill and drain per CTA tile (the loads of the first
      stages before the first MMA, the last MMAs after the last load).
    fixed_cycles: SM cycles per kernel that do no tile work (CTA launch and rasterisation,
      prologue, epilogue tail, the kernel's own start and end as a profiler sees them).
    feed_bytes_per_cycle: operand bytes one SM loads from L2 into shared memory per cycle.
    gemm_fixed_cycles: a gemm kernel's fixed cost per ``flops_per_s`` key where it differs
      from ``fixed_cycles`` (tf32); split-K reductions and transposes keep ``fixed_cycles``.
    mn_major_feed_factor: cost of one B byte, in operand-load bytes, when the MMA takes only
      K-major operands from shared memory and B is MN-major (TF32 on sm_90, module docstring);
      1 = no penalty.
    mn_major_step_cycles: SM cycles added to every k step of such a tile: the transpose of the
      B tile through registers sits on the step's critical path (load, shuffle, store to shared
      memory, then the MMA) instead of overlapping it as a TMA copy does; 0 = none.
    """

    eta: Mapping[str, float]
    fill_k_steps: float
    fixed_cycles: float
    feed_bytes_per_cycle: float
    gemm_fixed_cycles: Mapping[str, float] = dataclasses.field(default_factory=dict)
    mn_major_feed_factor: float = 1.0
    mn_major_step_cycles: float = 0.0

    def fixed_cycles_for(self, key: str | None) -> float:
        """Fixed SM cycles of a gemm kernel whose operands have ``flops_per_s`` key ``key``
        (f32/f64 dots on tensor cores run as tf32)."""
        key = {"f32": "tf32", "f64": "tf32"}.get(key or "", key)
        return float(self.gemm_fixed_cycles.get(key or "", self.fixed_cycles))

    def eta_for(self, key: str | None) -> float:
        """``eta`` of a ``flops_per_s`` key (f16 -> bf16, int8/int4/fp4 -> fp8)."""
        alias = {"f16": "bf16", "int8": "fp8", "int4": "fp8", "fp4": "fp8", "f32": "tf32",
                 "f64": "tf32"}
        if key in self.eta:
            return self.eta[key]
        if alias.get(key or "") in self.eta:
            return self.eta[alias[key]]
        return min(self.eta.values())


#: Fitted by benchmarks/gpu_kernels.py on a random half (seed 0) of XLA's measured sm_90 table
#: (../shared/data/xla_gemm_h100.csv); the other half is the reported, out-of-sample error.
FITTED = GemmParams(eta={"bf16": 0.8581, "tf32": 0.7271, "fp8": 0.8451}, fill_k_steps=0.924,
                    fixed_cycles=11120.2, feed_bytes_per_cycle=67.77,
                    gemm_fixed_cycles={"tf32": 15011.6}, mn_major_feed_factor=1.0,
                    mn_major_step_cycles=192.8)

#: flops_per_s keys whose Hopper wgmma operands must be K-major in shared memory and which the
#: model charges for an MN-major B (module docstring; fp8/int8 reach cuBLASLt already K-major).
K_MAJOR_ONLY_KEYS = frozenset({"tf32"})


#: flops_per_s keys whose sm_90 wgmma operands must be K-major in shared memory (PTX ISA, module
#: docstring): tf32 is charged (`K_MAJOR_ONLY_KEYS`); an MN-major 8-bit B is not
#: (`mn_major_uncharged`): XLA's measured table has no such program to fit its cost on.
WGMMA_K_MAJOR_KEYS = frozenset({"tf32", "fp8", "int8"})


def _sm90(spec) -> bool:
    cc = str((getattr(spec, "target", None) or {}).get("compute_capability", ""))
    return cc.split(".")[0] == "9"


def mn_major_uncharged(spec, peak_key: str | None, rhs_k_major: bool) -> bool:
    """True when a gemm's B is MN-major, sm_90's wgmma needs it K-major (the kernel transposes
    it: e.g. the transpose XLA:GPU puts inside a Triton fp8 gemm fusion), and the model has no
    measured cost for that (`WGMMA_K_MAJOR_KEYS` less `K_MAJOR_ONLY_KEYS`): the time lacks it."""
    return (peak_key in WGMMA_K_MAJOR_KEYS and peak_key not in K_MAJOR_ONLY_KEYS
            and not rhs_k_major and _sm90(spec))


def mn_major_penalized(spec, peak_key: str | None, rhs_k_major: bool) -> bool:
    """True when a gemm's B operand pays `GemmParams.mn_major_feed_factor`: an MN-major B of
    a `K_MAJOR_ONLY_KEYS` dtype on an sm_90 GPU (the spec's ``target.compute_capability``
    ``9.x``: wgmma; Ampere's mma.sync loads 32-bit operands with plain shared loads, and
    Blackwell is unmeasured here)."""
    key = {"f32": "tf32", "f64": "tf32"}.get(peak_key or "", peak_key)
    return key in K_MAJOR_ONLY_KEYS and not rhs_k_major and _sm90(spec)


@dataclasses.dataclass(frozen=True, slots=True)
class GemmConfig:
    """One kernel configuration: CTA tile ``block_m x block_n``, k step ``block_k``
    (elements), split-K factor ``split_k``."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1


def _block_k(operand_bytes: float) -> int:
    """k step of a CTA: 128 bytes of k per row (64 bf16, 32 tf32, 128 fp8), the width of one
    128-byte swizzled shared-memory row that Hopper's TMA/wgmma and Ampere's ldmatrix load."""
    return max(16, int(128 // max(operand_bytes, 1)))


#: Tiles (block_m, block_n) and split-K factors the model's "autotuner" tries: the
#: power-of-two tiles of XLA's Triton search space (xla/service/gpu/autotuning/
#: dot_search_space.cc: tile sizes 16..256, split-K 1..16); tiles of 16 and 32 rows are the
#: skinny ones it keeps for small m (decode GEMMs), which run mma.sync m16 instructions
#: instead of Hopper's 64-row warpgroup MMA (PTX ISA, "Warp Level Matrix Multiply-Accumulate
#: Instructions").
CANDIDATE_TILES: tuple[tuple[int, int], ...] = (
    (16, 64), (16, 128), (32, 64), (32, 128), (64, 32), (64, 64), (64, 128), (64, 256), (128, 32), (128, 64), (128, 128), (128, 256),
    (256, 64), (256, 128))
_SPLITS: tuple[int, ...] = (1, 2, 4, 8, 16)


@dataclasses.dataclass(frozen=True, slots=True)
class GemmTime:
    """Predicted time of one GEMM (all its kernels) and how it was derived.

    Attributes:
      time_s: gemm kernel + split-K reduction kernel, s.
      kernel_times_s: each kernel's time, s (the gemm, then the reduction when split_k > 1).
      config: the tile configuration used.
      ctas: CTAs of the gemm kernel; waves: ceil(ctas / num_sms).
      tile_s: time of one CTA tile (k steps + fill/drain + epilogue), s.
      compute_s: waves x tile_s, s.  memory_s: HBM bytes / HBM bandwidth of the gemm kernel, s.
      fixed_s: the fixed per-kernel cost, s.
      hbm_bytes: the gemm kernel's modeled HBM traffic, bytes.
      bound: "compute" (the tiles' tensor-core issue is the largest term: MMA-limited k steps
        and ``compute_s >= memory_s``) or "memory" (HBM, or k steps limited by the operand
        loads from L2 into shared memory: skinny tiles, module docstring).
      from_program: the tiles came from the program's backend_config.
      mma_s: tensor-core time of the padded tiles the kernel issues, waves x (k steps + fill)
        x ``2 BM BN BK / (eta peak / num_sms)``, s (<= compute_s).
      useful_mma_s: tensor-core time of the useful work, ``2 b m n k / (eta peak)``, s.
      feed_limited: the k steps wait on operand loads (L2 -> shared memory), not the MMA.
      reduce_fixed_s: the split-K reduction kernel's fixed cost, s (0 without split-K;
        ``fixed_s`` is the gemm kernel's).
      rhs_feed_factor: what one B byte costs in the operand loads (`mn_major_penalized`).
      rhs_step_s: the latency added to every k step for transposing B (`mn_major_penalized`), s.
    """

    time_s: float
    kernel_times_s: tuple[float, ...]
    config: GemmConfig
    ctas: int
    waves: int
    tile_s: float
    compute_s: float
    memory_s: float
    fixed_s: float
    hbm_bytes: int
    bound: str
    from_program: bool = False
    mma_s: float = 0.0
    useful_mma_s: float = 0.0
    feed_limited: bool = False
    reduce_fixed_s: float = 0.0
    rhs_feed_factor: float = 1.0
    rhs_step_s: float = 0.0


def gemm_model_applies(spec) -> bool:
    """True when ``spec`` is a GPU with the figures the model needs (num_sms, sm_clock_hz,
    l2_bytes)."""
    return (getattr(spec, "kind", None) == "gpu" and bool(spec.num_sms)
            and bool(getattr(spec, "sm_clock_hz", None)) and bool(spec.l2_bytes))


def _require(spec) -> None:
    if not gemm_model_applies(spec):
        missing = [k for k in ("num_sms", "sm_clock_hz", "l2_bytes")
                   if not getattr(spec, k, None)]
        raise GemmModelError(f"spec '{spec.name}': the GPU GEMM model needs a GPU spec with "
                             f"{', '.join(missing) or 'kind = gpu'}")


def kernel_times(spec, params: GemmParams, b, m, n, k, peak, eta, ea, eb, ec, bm, bn, bk, s, *,
                 gemm_fixed_s=None, rhs_feed_factor=1.0, rhs_step_s=0.0) -> dict:
    """The model's terms for arrays (numpy-broadcastable) of GEMMs x configurations.

    Arguments as in `gemm_time` (``peak`` in FLOP/s, ``eta`` its sustained fraction,
    ``ea``/``eb``/``ec`` bytes per element of A, B, C) plus the configuration's ``bm``, ``bn``,
    ``bk``, ``s`` (split-K); ``gemm_fixed_s`` the gemm kernel's fixed cost, s (None:
    ``params.fixed_cycles``), ``rhs_feed_factor`` the cost of a B byte in the operand loads,
    ``rhs_step_s`` the latency added to each k step for transposing B (s).
    Returns a dict of arrays: ``gemm_s``, ``reduce_s`` (0 without split-K), ``ctas``,
    ``waves``, ``tile_s``, ``compute_s``, ``memory_s``, ``hbm_bytes``, ``mma_s`` (the padded
    tiles' tensor-core time), ``feed_limited`` (bool: the k step waits on its operand loads),
    ``gemm_fixed_s``; ``fixed_s`` (the reduction's and other plain kernels') is a float.
    """
    sms = spec.num_sms
    b, m, n, k = (np.asarray(x, dtype=np.float64) for x in (b, m, n, k))
    bm, bn, bk, s = (np.asarray(x, dtype=np.float64) for x in (bm, bn, bk, s))
    tiles_mn = np.ceil(m / bm) * np.ceil(n / bn)
    ctas = b * tiles_mn * s
    waves = np.ceil(ctas / sms)
    k_steps = np.ceil(np.ceil(k / s) / bk)
    sm_flops = np.asarray(eta, dtype=np.float64) * np.asarray(peak, dtype=np.float64) / sms
    sm_l2 = params.feed_bytes_per_cycle * spec.sm_clock_hz
    mma_step_s = 2.0 * bm * bn * bk / sm_flops  # the padded tile's MMA: m16/m64 fragments
    feed_step_s = (bm * ea + bn * eb * np.asarray(rhs_feed_factor, dtype=np.float64)) * bk / sm_l2
    step_s = np.maximum(mma_step_s, feed_step_s) + np.asarray(rhs_step_s, dtype=np.float64)
    out_e = np.where(s > 1, 4.0, ec)  # split-K partials are f32
    tile_s = (k_steps + params.fill_k_steps) * step_s + bm * bn * out_e / sm_l2
    compute_s = waves * tile_s
    mma_s = waves * (k_steps + params.fill_k_steps) * mma_step_s
    a_bytes, b_bytes = m * k * ea, k * n * eb
    # one batch's operands in L2: each read once; else every wave re-reads the A rows and
    # B columns of a near-square block of its tiles
    per_wave = np.minimum(ctas, sms) / s
    rows = np.clip(np.sqrt(per_wave), 1.0, np.ceil(m / bm))
    cols = np.clip(per_wave / rows, 1.0, np.ceil(n / bn))
    rows = np.clip(per_wave / cols, 1.0, np.ceil(m / bm))
    rereads = tiles_mn / (rows * cols) * (rows * bm * ea + cols * bn * eb) * k
    reads = b * np.where(a_bytes + b_bytes <= spec.l2_bytes, a_bytes + b_bytes,
                         np.maximum(a_bytes + b_bytes, rereads))
    hbm = reads + b * m * n * out_e * s
    memory_s = hbm / spec.hbm_bytes_per_s
    fixed_s = params.fixed_cycles / spec.sm_clock_hz
    g_fixed = fixed_s if gemm_fixed_s is None else np.asarray(gemm_fixed_s, dtype=np.float64)
    gemm_s = g_fixed + np.maximum(compute_s, memory_s)
    reduce_s = np.where(s > 1, fixed_s + b * m * n * (4.0 * s + ec) / spec.hbm_bytes_per_s, 0.0)
    return {"gemm_s": gemm_s, "reduce_s": reduce_s, "ctas": ctas, "waves": waves,
            "tile_s": tile_s, "compute_s": compute_s, "memory_s": memory_s, "hbm_bytes": hbm,
            "fixed_s": fixed_s, "mma_s": mma_s, "feed_limited": feed_step_s > mma_step_s,
            "gemm_fixed_s": g_fixed}


def candidate_configs(k: int, operand_bytes: float) -> Iterable[GemmConfig]:
    """The configurations the model's autotuner tries for a contraction of length ``k``."""
    bk = _block_k(operand_bytes)
    for bm, bn in CANDIDATE_TILES:
        for s in _SPLITS:
            if s == 1 or k // s >= bk:
                yield GemmConfig(bm, bn, bk, s)


def gemm_time(spec, *, b: int, m: int, n: int, k: int, peak_flops_per_s: float, peak_key: str | None,
              lhs_bytes: float, rhs_bytes: float, out_bytes: float,
              tile: GemmConfig | None = None, allow_split_k: bool = True,
              params: GemmParams = FITTED, rhs_k_major: bool = False) -> GemmTime:
    """Predicted time of ``C[b,m,n] = A[b,m,k] @ B[b,k,n]`` on the GPU ``spec``.

    Args:
      spec: a GPU HardwareSpec with num_sms, sm_clock_hz, l2_bytes, l2_bytes_per_s.
      b, m, n, k: batch, rows, columns, contraction length (elements, all >= 1).
      peak_flops_per_s: the datasheet tensor-core peak for the operands (FLOP/s), e.g.
        ``spec.flops_per_s["bf16"]``; ``passes/timing.matrix_peak`` picks it (tf32 for f32).
      peak_key: its ``flops_per_s`` key (selects ``params.eta``).
      lhs_bytes, rhs_bytes, out_bytes: bytes per element of A, B and C.
      tile: the program's configuration (from a Triton fusion's backend_config); None: the
        fastest of `candidate_configs`, as XLA's autotuner picks.
      allow_split_k: let the autotuner choose split-K (False for a kernel whose program fixes
        it, e.g. a Triton fusion: XLA's split-K is then a batch dimension of its dot).
      params: fitted constants (default `FITTED`).
      rhs_k_major: B's contraction dimension is its minor (fastest-varying) one; False (the
        ``[k, n]`` row-major weight of ``x @ w``): an MN-major B (`mn_major_penalized`).
    Returns:
      a GemmTime; ``time_s`` covers the gemm kernel and, with split-K, its reduction.
    Raises:
      GemmModelError: spec without the GPU figures, or a non-positive size or peak.
    """
    _require(spec)
    if min(b, m, n, k) < 1 or not peak_flops_per_s or peak_flops_per_s <= 0:
        raise GemmModelError(f"gemm b={b} m={m} n={n} k={k} peak={peak_flops_per_s}: sizes must be "
                             ">= 1 and the peak positive")
    cfgs = [tile] if tile is not None else [c for c in candidate_configs(k, max(lhs_bytes, rhs_bytes))
                                            if allow_split_k or c.split_k == 1]
    cols = np.array([(c.block_m, c.block_n, c.block_k, max(1, c.split_k)) for c in cfgs], dtype=np.float64)
    penalized = mn_major_penalized(spec, peak_key, rhs_k_major)
    factor = params.mn_major_feed_factor if penalized else 1.0
    step_extra_s = params.mn_major_step_cycles / spec.sm_clock_hz if penalized else 0.0
    g_fixed = params.fixed_cycles_for(peak_key) / spec.sm_clock_hz
    r = kernel_times(spec, params, b, m, n, k, peak_flops_per_s, params.eta_for(peak_key), lhs_bytes, rhs_bytes, out_bytes,
                     cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3], gemm_fixed_s=g_fixed,
                     rhs_feed_factor=factor, rhs_step_s=step_extra_s)
    total = r["gemm_s"] + r["reduce_s"]
    i = int(np.argmin(total))  # the autotuner keeps the fastest (first on ties)
    cfg = cfgs[i]
    feed = bool(np.broadcast_to(r["feed_limited"], total.shape)[i])
    compute_bound = r["compute_s"][i] >= r["memory_s"][i] and not feed
    useful = 2.0 * b * m * n * k / (params.eta_for(peak_key) * peak_flops_per_s)
    kernels = (float(r["gemm_s"][i]),) + ((float(r["reduce_s"][i]),) if cfg.split_k > 1 else ())
    return GemmTime(float(total[i]), kernels, cfg, int(r["ctas"][i]), int(r["waves"][i]),
                    float(r["tile_s"][i]), float(r["compute_s"][i]), float(r["memory_s"][i]),
                    g_fixed, int(r["hbm_bytes"][i]),
                    "compute" if compute_bound else "memory", tile is not None,
                    float(r["mma_s"][i]), useful, feed,
                    float(r["fixed_s"]) if cfg.split_k > 1 else 0.0, factor, step_extra_s)
