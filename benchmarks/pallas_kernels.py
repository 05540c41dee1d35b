"""Pallas TPU kernels costed from their grid and BlockSpecs, against hand closed forms (issue 25).

Writes ``benchmarks/pallas_kernels.md``. Each kernel is compiled here for TPU v5e without the
device (libtpu topology ``v5e:2x2``, one chip) at a serving-size shape; per kernel the table gives

* **ours**: the bytes the kernel's pipeline moves between HBM/VMEM buffers and its blocks, summed
  over its windows (jaxmove/passes/pallas.py), and of them the HBM bytes of the row;
* **closed form**: the same, computed by hand below from the block sizes and the grid;
* **author**: the kernel's ``pl.CostEstimate.bytes_accessed`` (what XLA's ``cost_analysis()``
  repeats for the custom call);
* **XLA**: ``compiled.cost_analysis()["bytes accessed"]`` of the whole one-kernel program;
* the estimated time on tpu-v5e (pipelined steps + 0.35 us per step, see pallas.py).

Pallas Triton kernels (``__gpu$xla.gpu.triton``) compiled for H100 without the device (the
CUDA plugin's target config) follow in a second table: bytes from their loads and stores per
program instance, closed forms by hand.

Run: ``python benchmarks/pallas_kernels.py`` (about a minute on one core).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = Path(__file__).with_name("pallas_kernels.md")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

BF16 = 2


@functools.lru_cache(maxsize=None)
def _devices():
    from jax.experimental import topologies
    from jaxmove._platform import quiet_stderr
    with quiet_stderr():
        return topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices


def _abstract(shape, dtype):
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(_devices()[:1]), ("x",))
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=NamedSharding(mesh, P()))


def _compile(fn, *args):
    import jax
    from jaxmove._platform import quiet_stderr
    with quiet_stderr():
        return jax.jit(fn).lower(*args).compile()


# ---- kernels and their closed forms -------------------------------------------------------------

def flash(causal: bool, block: int, B=1, H=8, S=2048, D=128):
    """Closed form: q and o one pass (n blocks per head); k and v n*n blocks per head, causal
    n(n+1)/2 - 1 (the masked tail's index returns to block 0; tests/test_pallas.py)."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes, flash_attention
    bs = BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)
    q = _abstract((B, H, S, D), jnp.bfloat16)
    c = _compile(lambda q, k, v: flash_attention(q, k, v, causal=causal, block_sizes=bs), q, q, q)
    n = S // block
    blk = block * D * BF16
    kv = n * (n + 1) // 2 - 1 if causal else n * n
    closed = B * H * n * blk * 2 + 2 * B * H * kv * blk
    return c, closed, None


def splash(block: int, H=8, S=2048, D=128):
    """Causal splash attention with its mask info given: as flash attention's causal form."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi
    mask = sa.MultiHeadMask([sa.CausalMask((S, S)) for _ in range(H)])
    bs = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block)
    kern = sa.make_splash_mha(mask, block_sizes=bs, head_shards=1, q_seq_shards=1)
    q = _abstract((H, S, D), jnp.bfloat16)
    c = _compile(lambda q, k, v: kern(q, k, v), q, q, q)
    info, _ = mi.process_mask(mask, (block, block), downcast_smem_data=True, head_shards=1, q_seq_shards=1)
    prefetch = [x for x in (info.data_next, info.mask_next, info.block_mask) if x is not None]
    n = S // block
    blk = block * D * BF16
    # q, o: n blocks per head; k, v: n(n+1)/2 - 1 per head; the m/l/o f32 outputs (bq, 128),
    # (bq, 128), (bq, D) written once; the iota operand s32[S, 128]... read per q block (n per head);
    # the two s8 tables read once whole (their HBM tiles).
    f32_outs = (block * 128 * 4) * 2 + block * D * 4
    iota = H * n * block * 128 * 4
    closed = H * n * blk * 2 + 2 * H * (n * (n + 1) // 2 - 1) * blk + f32_outs + iota
    return c, closed, ("splash_mha_fwd_no_residuals", prefetch, None)


def paged(B=8, Hq=32, Hkv=8, D=128, page=16, pps=64):
    """k/v pools in ANY memory space: costed once whole (exact here: every page belongs to one
    sequence, at full length)."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
    q = _abstract((B, Hq, D), jnp.bfloat16)
    kp = _abstract((Hkv, B * pps, page, D), jnp.bfloat16)
    c = _compile(lambda q, k, v, l, p: paged_attention(q, k, v, l, p, pages_per_compute_block=8),
                 q, kp, kp, _abstract((B,), jnp.int32), _abstract((B, pps), jnp.int32))
    closed_pools = 2 * Hkv * B * pps * page * D * BF16
    return c, closed_pools, None


PAGED_LENGTHS = [1024, 512, 256, 1000, 16, 64, 700, 1024]


def paged_given(B=8, Hq=32, Hkv=8, D=128, page=16, pps=64, ppcb=8):
    """Lengths and page table given: each sequence fetches whole compute blocks of ``ppcb``
    pages, per kv head, for k and for v (paged_attention_kernel.py: pages_to_load)."""
    c, _, _ = paged(B, Hq, Hkv, D, page, pps)
    pages = sum(-(-n // (page * ppcb)) * ppcb for n in PAGED_LENGTHS)
    closed = 2 * Hkv * pages * page * D * BF16
    return c, closed, ("paged_flash_attention_kernel_inline_seq_dim",
                       [PAGED_LENGTHS, list(range(B * pps)), None, None], None)


def gmm(M=4096, K=2048, N=4096, G=8, tile=512):
    """Uniform groups of M/G rows, aligned to the m tile: each m tile is one group. Grid
    (N/tn, M/tm, K/tk): lhs (tile, k) and rhs (group, k, n) change at every step (K/tk > 1): each
    fetched (N/tn)(M/tm)(K/tk) times; out written (N/tn)(M/tm) times."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.megablox import gmm as _gmm
    lhs = _abstract((M, K), jnp.bfloat16)
    rhs = _abstract((G, K, N), jnp.bfloat16)
    c = _compile(lambda l, r, g: _gmm(l, r, g, preferred_element_type=jnp.bfloat16,
                                      tiling=(tile, tile, tile)), lhs, rhs, _abstract((G,), jnp.int32))
    tm = M // tile
    per = M // G
    offsets = [g * per for g in range(G + 1)]
    gids = [t * tile // per for t in range(tm)] + [0] * (G - 1)
    mtiles = list(range(tm)) + [0] * (G - 1)
    steps = (N // tile) * tm * (K // tile)
    blk = tile * tile * BF16
    closed = 2 * steps * blk + (N // tile) * tm * blk
    return c, closed, ("kernel", [offsets, gids, mtiles, [0]], (tm,))


def matmul(m=4096, k=4096, n=4096, bm=512, bk=1024, bn=1024):
    """x (i, k) and y (k, j) change at every step: x read n/bn times, y m/bm times; z once."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, y_ref, z_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)
        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    def mm(x, y):
        return pl.pallas_call(
            kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                          pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
                scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
                grid=(m // bm, n // bn, k // bk)),
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
            cost_estimate=pl.CostEstimate(flops=2 * m * k * n, transcendentals=0,
                                          bytes_accessed=(m * k + k * n + m * n) * BF16))(x, y)

    c = _compile(mm, _abstract((m, k), jnp.bfloat16), _abstract((k, n), jnp.bfloat16))
    closed = (n // bn) * m * k * BF16 + (m // bm) * k * n * BF16 + m * n * BF16
    return c, closed, None


CASES = [
    ("flash_attention causal, bf16[1,8,2048,128], blocks 128", lambda: flash(True, 128), "windows"),
    ("flash_attention causal, blocks 256", lambda: flash(True, 256), "windows"),
    ("flash_attention non-causal, blocks 128", lambda: flash(False, 128), "windows"),
    ("flash_attention non-causal, blocks 256", lambda: flash(False, 256), "windows"),
    ("splash_attention causal, bf16[8,2048,128], blocks 512, mask info given", lambda: splash(512), "windows"),
    ("paged_attention, 8 seqs x 64 pages of 16, 8 kv heads (k/v pools)", lambda: paged(), "manual"),
    ("paged_attention, the same, lengths 16..1024 given: its DMAs walked", lambda: paged_given(), "walked"),
    ("megablox gmm, bf16[4096,2048] x 8 x [2048,4096], tiles 512, metadata given", lambda: gmm(), "windows"),
    ("tiled matmul bf16 4096^3, blocks (512,1024)x(1024,1024)", lambda: matmul(), "windows"),
]


# ---- Pallas Triton on GPU (deviceless H100) ----------------------------------------------------

def _gpu_compile(fn, *shapes):
    import jax
    from jax.experimental import topologies
    from jaxmove._platform import quiet_stderr
    from jaxmove.capture.targets import gpu_target_config
    from jaxmove.hardware import load_spec
    with quiet_stderr():
        dev = topologies.get_topology_desc("h100", "cuda", target_config=gpu_target_config(
            load_spec("h100-sxm")), topology="1x1x1").devices[0]
    sh = jax.sharding.SingleDeviceSharding(dev)
    args = [jax.ShapeDtypeStruct(s, d, sharding=sh) for s, d in shapes]
    with quiet_stderr():
        return jax.jit(fn).lower(*args).compile()


def gpu_mha(causal: bool, B=1, S=4096, H=16, D=64, block=128):
    """Program (q block i, head): q once, k and v blocks 0..i (causal) or all n, o once."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha
    bs = BlockSizes(block_q=block, block_k=block)
    c = _gpu_compile(lambda q, k, v: mha(q, k, v, segment_ids=None, causal=causal, block_sizes=bs),
                     *[((B, S, H, D), jnp.float16)] * 3)
    n = S // block
    blk = block * D * 2
    kv = B * H * (n * (n + 1) // 2 if causal else n * n)
    return c, 2 * B * H * n * blk + 2 * kv * blk, None


def gpu_layer_norm(B=4, T=2048, D=4096):
    """One program per row, in column blocks: x loaded by the mean, variance and normalizing
    passes (3x), weight and bias once per row, y stored once."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.layer_norm import layer_norm
    R = B * T
    c = _gpu_compile(lambda x, w, b: layer_norm(x, w, b), ((B, T, D), jnp.float32), ((D,), jnp.float32),
                     ((D,), jnp.float32))
    return c, 3 * R * D * 4 + 2 * R * D * 4 + R * D * 4, None


GPU_CASES = [
    ("Triton mha causal, f16[1,4096,16,64], blocks 128", lambda: gpu_mha(True)),
    ("Triton mha non-causal, f16[1,4096,16,64], blocks 128", lambda: gpu_mha(False)),
    ("Triton layer_norm f32[4,2048,4096]", lambda: gpu_layer_norm()),
]


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f}"


def main() -> None:
    from jaxmove.hardware import load_spec
    from jaxmove.hlo import parse_module
    from jaxmove.passes.pallas import instruction_cost, set_prefetch_values
    from jaxmove.passes.pipeline import analyze_module
    from jaxmove.passes.timing import estimate_times

    spec = load_spec("tpu-v5e")
    rows = []
    t0 = time.perf_counter()
    for label, build, what in CASES:
        compiled, closed, given = build()
        text = compiled.as_text()
        if given is not None:
            set_prefetch_values(given[0], given[1], dynamic_grid=given[2])
        try:
            module = parse_module(text, "pallas.hlo")
            an = analyze_module(module)
            row = next(r for r in an.rows if r.instr.opcode == "custom-call"
                       and r.instr.custom_call_target == "tpu_custom_call")
            comp = module.computations[row.computation]
            cost = instruction_cost(row.instr, comp, module)
            tm = estimate_times(an, spec).row(row.computation, row.instr.name)
        finally:
            if given is not None:
                set_prefetch_values(given[0], None)
        if what == "manual":
            ours = sum(w.nbytes for w in cost.windows if w.assumption == "manual DMA")
        elif what == "walked":
            ours = sum(w.nbytes for w in cost.windows if w.assumption == "manual DMA walked")
        else:
            ours = cost.read_bytes + cost.write_bytes - cost.prefetch_read_bytes
        xla = compiled.cost_analysis().get("bytes accessed")
        author_flops = cost.flops if cost.author_bytes is not None else None
        rows.append((label, ours, closed, row.per_execution.hbm_bytes, cost.author_bytes, xla,
                     tm.per_execution_s, tm.bound, cost.steps, bool(row.unmodeled),
                     author_flops, cost.body_mxu_flops))
    gpu_rows = []
    hspec = load_spec("h100-sxm")
    for label, build in GPU_CASES:
        compiled, closed, _ = build()
        module = parse_module(compiled.as_text(), "triton.hlo")
        an = analyze_module(module)
        row = next(r for r in an.rows if r.instr.opcode == "custom-call"
                   and r.instr.custom_call_target == "__gpu$xla.gpu.triton")
        tm = estimate_times(an, hspec).row(row.computation, row.instr.name)
        ours = row.per_execution.hbm_bytes
        ca = compiled.cost_analysis() or {}
        gpu_rows.append((label, ours, closed, ca.get("bytes accessed"), row.per_execution.flops,
                         tm.per_execution_s, tm.bound, bool(row.unmodeled)))
    elapsed = time.perf_counter() - t0
    lines = ["# Pallas TPU kernels: bytes from the grid and BlockSpecs (generated by "
             "benchmarks/pallas_kernels.py)", "", __doc__.split("\n\n", 1)[1].split("Run:")[0].strip(), "",
             "| kernel | steps | ours (MiB) | closed form (MiB) | ours / closed | of it HBM (MiB) "
             "| author's bytes_accessed (MiB) | XLA cost_analysis (MiB) | author's GFLOP | body MXU GFLOP "
             "| est. time tpu-v5e | bound | unmodeled |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    gf = lambda x: "-" if x is None else f"{x / 1e9:,.2f}"  # noqa: E731
    for label, ours, closed, hbm, author, xla, t, bound, steps, unm, af, bf in rows:
        lines.append(f"| {label} | {steps:,} | {_mib(ours)} | {_mib(closed)} | {ours / closed:.4f} | "
                     f"{_mib(hbm)} | {_mib(author)} | {_mib(xla)} | {gf(af)} | {gf(bf)} | "
                     f"{t * 1e6:,.1f} us | {bound} | {'yes' if unm else 'no'} |")
    lines += ["", "## Pallas Triton kernels (GPU, deviceless H100 target)", "",
              "Bytes are the kernel's loads and stores per program instance summed over the grid "
              "(jaxmove/passes/triton.py): what it asks of global memory; L2 hits between program "
              "instances (k/v blocks shared by one head's q blocks, a weight row read by every "
              "program) are not modeled, so HBM traffic may be lower. XLA's `cost_analysis()` "
              "gives nothing for these custom calls (None).", "",
              "| kernel | ours (MiB) | closed form (MiB) | ours / closed | XLA cost_analysis | "
              "tt.dot GFLOP | est. time h100-sxm | bound | unmodeled |",
              "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for label, ours, closed, xla, flops, t, bound, unm in gpu_rows:
        lines.append(f"| {label} | {_mib(ours)} | {_mib(closed)} | {ours / closed:.4f} | "
                     f"{'-' if xla is None else _mib(xla)} | {flops / 1e9:,.2f} | {t * 1e6:,.1f} us | "
                     f"{bound} | {'yes' if unm else 'no'} |")
    lines += ["", "Notes:", "",
              "* 'ours' for paged attention is the two k/v page pools (ANY memory space, moved by the "
              "kernel's own DMAs): without the lengths, costed once whole (exact when every page of "
              "the pool belongs to one sequence at full length, as in the first row; shorter lengths "
              "make it an upper bound); with the lengths and page table given "
              "(set_prefetch_values), the kernel body's DMAs are walked over the grid (second row).",
              "* 'body MXU GFLOP': the kernel body walked over the grid with its branches evaluated "
              "per step (jaxmove/passes/mosaic_body.py): causal kernels skip the blocks above the "
              "diagonal, which the author's estimate counts. Splash attention carries no cost "
              "estimate: its flops are the body's. Paged attention carries none and its body's "
              "loops depend on the sequence lengths (unknown here): its flops are unmodeled (the row "
              "is incomplete). XLA's figure for these two is its program's other instructions and the "
              "operands once.",
              "* 'of it HBM' is the part in HBM: XLA:TPU copies small operands (gmm's lhs and rhs, "
              "splash's q) into VMEM before the kernel (copy-start to S(1)); those block copies are "
              "on-chip and the HBM read is the copy's.",
              "* The author's estimate is one pass over the operands; causal attention over blocks "
              "re-reads k and v once per q block.",
              f"* {len(rows) + len(gpu_rows)} kernels compiled and analysed in {elapsed:.0f} s."]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
