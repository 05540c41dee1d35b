"""Pallas TPU kernels (issue 25): HBM traffic from the grid and BlockSpecs, checked against closed
forms computed by hand from the block sizes and the grid, on kernels compiled here for TPU v5e
without the device (libtpu topology). Compiles are small and shared per module."""

from __future__ import annotations

import functools
import math

import pytest

from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import analyze_module

from .device_compile import abstract, compile_tpu, tpu_mesh


def _kernel_row(text: str):
    an = analyze_module(parse_module(text, "pallas.hlo"))
    rows = [r for r in an.rows if r.instr.opcode == "custom-call"
            and r.instr.custom_call_target == "tpu_custom_call"]
    assert len(rows) == 1, [r.instr.name for r in rows]
    return an, rows[0]


@functools.lru_cache(maxsize=None)
def _flash(causal: bool, block: int, batch=1, heads=2, seq=1024, d=128) -> str:
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes, flash_attention

    mesh = tpu_mesh(1)
    q = abstract(mesh, (batch, heads, seq, d), jnp.bfloat16)
    bs = BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)
    c = compile_tpu(lambda q, k, v: flash_attention(q, k, v, causal=causal, block_sizes=bs), q, q, q)
    return c.as_text()


# ---- flash attention ------------------------------------------------------------------------
# jax/experimental/pallas/ops/tpu/flash_attention.py (_flash_attention_impl): grid
# (batch, heads, Sq/block_q, Sk/block_k_major), k/v index map (b, h, kv if on/below the diagonal
# else 0, 0) when causal, (b, h, kv, 0) otherwise; q and o (b, h, q, 0).
#
# Non-causal: the k/v block index changes at every step (kv runs 0..n-1, then wraps to 0 for the
# next q block): n*n fetches per (batch, head). q changes once per q block: n fetches; o: n writes.
# Causal: for q block i the k index runs 0, 1, ..., i, then 0 for the masked blocks. Fetches per
# (batch, head): the n(n+1)/2 blocks on/below the diagonal, plus one re-fetch of block 0 after
# each row 1..n-2 (its masked tail returns to 0), minus one for each row 1..n-1 whose first block
# 0 equals the previous row's last index (0 after a masked tail; the last row has no tail, but
# row n-1 follows row n-2 which ends at 0): n(n+1)/2 + (n-2) - (n-1) = n(n+1)/2 - 1.

BF16 = 2


def _flash_closed_form(causal: bool, block: int, batch=1, heads=2, seq=1024, d=128) -> dict:
    n = seq // block
    blk = block * d * BF16  # one (block, d) bf16 block: whole (8,128)(2,1) tiles, no padding
    kv_per_head = n * (n + 1) // 2 - 1 if causal else n * n
    return {"q": batch * heads * n * blk, "kv": 2 * batch * heads * kv_per_head * blk,
            "o": batch * heads * n * blk}


@pytest.mark.parametrize("causal,block", [(True, 128), (False, 128), (True, 256), (False, 256)])
def test_flash_attention_traffic_matches_the_closed_form(causal, block):
    an, row = _kernel_row(_flash(causal, block))
    cf = _flash_closed_form(causal, block)
    pe = row.per_execution
    assert pe.hbm_read_bytes == pytest.approx(cf["q"] + cf["kv"], rel=0.01)
    assert pe.hbm_write_bytes == pytest.approx(cf["o"], rel=0.01)
    # exactly, in fact: whole tiles, no data-dependent blocks
    assert pe.hbm_read_bytes == cf["q"] + cf["kv"]
    assert not row.unmodeled
    assert any("Pallas TPU kernel" in n for n in row.notes)


def test_flash_attention_flops_are_the_authors_estimate_and_compared_bytes():
    text = _flash(True, 128)
    an, row = _kernel_row(text)
    bc = row.instr.backend_config["custom_call_config"]["cost_estimate"]
    assert row.per_execution.flops == int(bc["flops"])
    assert any("author's bytes_accessed" in n for n in row.notes)
    # the author's estimate is one pass over q, k, v, o: causal attention over blocks re-reads k/v
    assert int(bc["bytes_accessed"]) == 4 * 2 * 1024 * 128 * BF16
    assert row.per_execution.hbm_bytes > 2 * int(bc["bytes_accessed"])


@pytest.mark.parametrize("causal,block", [(True, 128), (False, 128), (True, 256)])
def test_flash_attention_body_walk_counts_the_mxu_work_of_the_blocks_it_computes(causal, block):
    # the kernel body walked over the grid with its pl.when conditions evaluated per step: the
    # blocks on/below the diagonal (causal: n(n+1)/2 per head) run q k^T and p v, 2 * block *
    # block * 128 flops each; the author's estimate counts every block (4 * S * S * D per head)
    an, row, cost = _cost(_flash(causal, block))
    n, heads, d = 1024 // block, 2, 128
    blocks = n * (n + 1) // 2 if causal else n * n
    assert cost.body_mxu_flops == heads * blocks * 2 * (2 * block * block * d)
    assert row.per_execution.flops == int(row.instr.backend_config["custom_call_config"]
                                          ["cost_estimate"]["flops"])  # the author's, still
    assert any("MXU flops" in x for x in row.notes)


# ---- a tiled matmul with known blocks --------------------------------------------------------

def _matmul_text(m, k, n, bm, bk, bn, dtype="float32", estimate=False) -> str:
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

    dt = jnp.dtype(dtype)

    def mm(x, y):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                          pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
                scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
                grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk))),
            out_shape=jax.ShapeDtypeStruct((m, n), dt),
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
            cost_estimate=pl.CostEstimate(flops=2 * m * k * n, transcendentals=0,
                                          bytes_accessed=(m * k + k * n + m * n) * dt.itemsize)
            if estimate else None,
        )(x, y)

    mesh = tpu_mesh(1)
    return compile_tpu(mm, abstract(mesh, (m, k), dt), abstract(mesh, (k, n), dt)).as_text()


@functools.lru_cache(maxsize=None)
def _matmul(*args) -> str:
    return _matmul_text(*args)


def test_tiled_matmul_traffic_matches_the_closed_form():
    # f32 [512, 1024] @ [1024, 768], blocks (128, 256) x (256, 256): grid (4, 3, 4) = 48 steps.
    # x's index (i, k) and y's (k, j) change at every step (k is the fastest grid dimension):
    # 48 fetches each; z's (i, j) changes every 4 steps: 12 write-backs.
    m, k, n, bm, bk, bn = 512, 1024, 768, 128, 256, 256
    an, row = _kernel_row(_matmul(m, k, n, bm, bk, bn))
    steps = (m // bm) * (n // bn) * (k // bk)
    x_bytes = steps * bm * bk * 4
    y_bytes = steps * bk * bn * 4
    z_bytes = (m // bm) * (n // bn) * bm * bn * 4
    assert row.per_execution.hbm_read_bytes == x_bytes + y_bytes
    assert row.per_execution.hbm_write_bytes == z_bytes
    # = x read n/bn = 3 times, y read m/bm = 4 times, z written once
    assert x_bytes == 3 * m * k * 4 and y_bytes == 4 * k * n * 4 and z_bytes == m * n * 4


def test_tiled_matmul_partial_blocks_count_their_tile_padding():
    # M = 1001 rows in blocks of 128: grid (8, 1, 1) (K = N = 128, one block each); x's index
    # (i, 0) changes at every step, y's (0, 0) never: y is fetched once. The last x block holds
    # rows 896..1000 (105 rows) and moves ceil(105 / 8) = 14 whole (8, 128) f32 tiles.
    m, k, n = 1001, 128, 128
    an, row = _kernel_row(_matmul(m, k, n, 128, 128, 128))
    tile = 8 * 128 * 4
    x_bytes = 7 * 128 * k * 4 + math.ceil(105 / 8) * tile
    y_bytes = k * n * 4
    z_bytes = 7 * 128 * n * 4 + math.ceil(105 / 8) * tile
    assert row.per_execution.hbm_read_bytes == x_bytes + y_bytes
    assert row.per_execution.hbm_write_bytes == z_bytes
    assert row.per_execution.hbm_padding_read_bytes == (14 * 8 - 105) * 128 * 4


def test_tiled_matmul_time_is_pipelined_with_a_per_step_overhead():
    from jaxmove.hardware import load_spec
    from jaxmove.passes.pallas import PALLAS_TPU_STEP_OVERHEAD_S
    from jaxmove.passes.timing import estimate_times

    # bf16 [512, 1024] @ [1024, 768], blocks (128, 256) x (256, 256), grid (4, 3, 4) = 48 steps,
    # with the author's estimate 2*m*k*n flops timed at the bf16 MXU peak
    m, k, n, bm, bk, bn = 512, 1024, 768, 128, 256, 256
    an, row = _kernel_row(_matmul(m, k, n, bm, bk, bn, "bfloat16", True))
    assert row.per_execution.flops == 2 * m * k * n
    spec = load_spec("tpu-v5e")
    t = estimate_times(an, spec).row(row.computation, row.instr.name)
    steps = 48
    bw = spec.hbm_bytes_per_s
    blk_in = (bm * bk + bk * bn) * BF16  # x and y blocks fetched at every step
    blk_out = bm * bn * BF16
    c = 2 * m * k * n / spec.flops_per_s["bf16"] / steps
    # steady state: each step overlaps the next step's two input blocks (+ the write-back of the
    # previous output block every 4 steps) with its compute; step 0's fetch and the last
    # write-back are outside the overlap (docs/pallas/pipelining.md)
    dma = [blk_in * (s + 1 < steps) + blk_out * (s >= 1 and s % 4 == 0) for s in range(steps)]
    expected = (blk_in + blk_out) / bw + sum(max(d / bw, c) for d in dma) \
        + steps * PALLAS_TPU_STEP_OVERHEAD_S + spec.kernel_launch_overhead_s
    assert t.per_execution_s == pytest.approx(expected, rel=0.01)
    assert not t.unmodeled


def test_each_steps_compute_is_its_work_in_the_kernel_body():
    # bf16 [1024, 1024] @ [1024, 1024], blocks (512, 1024) x (1024, 512): grid (2, 2, 1), one k
    # step. Per step the body runs one 512x1024x512 MXU matmul (2*512*1024*512 flops) and adds it
    # into the f32 accumulator (512*512 vector adds). x (i, 0) is fetched when i changes (steps 0,
    # 2), y (0, j) at every step, z written back after every step. Pipelined: step t overlaps the
    # next step's fetches and the previous step's write-back.
    from jaxmove.hardware import load_spec
    from jaxmove.passes.pallas import PALLAS_TPU_STEP_OVERHEAD_S
    from jaxmove.passes.timing import estimate_times

    an, row, cost = _cost(_matmul(1024, 1024, 1024, 512, 1024, 512, "bfloat16", True))
    assert sorted({(p[1], p[2]) for p in cost.step_profile}) == [(2 * 512 * 1024 * 512, 512 * 512)]
    spec = load_spec("tpu-v5e")
    bw = spec.hbm_bytes_per_s
    x = y = 512 * 1024 * BF16
    z = 512 * 512 * BF16
    c = 2 * 512 * 1024 * 512 / spec.flops_per_s["bf16"] + 512 * 512 / spec.flops_per_s["f32"]
    d = [y, x + y + z, y + z, z]
    expected = (x + y + z) / bw + sum(max(b / bw, c) for b in d) + 4 * PALLAS_TPU_STEP_OVERHEAD_S \
        + spec.kernel_launch_overhead_s
    t = estimate_times(an, spec).row(row.computation, row.instr.name)
    assert t.per_execution_s == pytest.approx(expected, rel=0.01)
    assert any("each step's compute is its work in the kernel body" in x for x in t.notes)


# ---- unreadable bodies ------------------------------------------------------------------------

def _with_body(text: str, body: str) -> str:
    i = text.index('"body":"') + len('"body":"')
    j = text.index('"', i)
    return text[:i] + body + text[j:]


@pytest.mark.parametrize("body", ["", "bm90IE1MSVI=", "!!!notbase64"])
def test_an_unreadable_kernel_body_is_a_marked_lower_bound_not_a_crash(body):
    text = _with_body(_matmul(512, 1024, 768, 128, 256, 256), body)
    an, row = _kernel_row(text)
    # operand + result bytes once: x, y read whole, z written whole
    assert row.per_execution.hbm_read_bytes == (512 * 1024 + 1024 * 768) * 4
    assert row.per_execution.hbm_write_bytes == 512 * 768 * 4
    assert row.unmodeled and "lower bound" in row.unmodeled[0]


def test_a_truncated_kernel_body_is_a_marked_lower_bound():
    text = _matmul(512, 1024, 768, 128, 256, 256)
    i = text.index('"body":"') + len('"body":"')
    body = text[i:text.index('"', i)]
    an, row = _kernel_row(_with_body(text, body[: len(body) // 2 // 4 * 4]))
    assert row.per_execution.hbm_read_bytes == (512 * 1024 + 1024 * 768) * 4
    assert row.unmodeled and "not decoded" in row.unmodeled[0]


def test_the_decoder_reads_grid_blocks_and_index_maps():
    from jaxmove.passes.mosaic import decode_kernel, evaluate_index_map
    import numpy as np

    text = _flash(True, 256)
    an, row = _kernel_row(text)
    k = decode_kernel(row.instr.backend_config)
    assert k.grid == (1, 2, 4, 4)
    assert k.dimension_semantics == ("parallel", "parallel", "parallel", "arbitrary")
    assert [w.block_shape for w in k.windows] == [(1, 1, 256, 128)] * 4
    # the causal k index map at q block 1: kv 0, 1, then 0, 0 (masked)
    qi = np.full(4, 1)
    out = evaluate_index_map(k.windows[1].index_map, [np.zeros(4, int), np.zeros(4, int), qi, np.arange(4)])
    assert list(out[2]) == [0, 1, 0, 0]


# ---- kernels with scalar prefetch, manual DMA and dynamic grids --------------------------------

def _cost(text: str):
    """(analysis, the kernel's row, its PallasCost)."""
    from jaxmove.passes.pallas import instruction_cost
    an, row = _kernel_row(text)
    module = parse_module(text, "pallas.hlo")
    comp = module.computations[row.computation]
    return an, row, instruction_cost(comp.by_name[row.instr.name], comp, module)


SPLASH_H, SPLASH_S, SPLASH_D, SPLASH_B = 2, 1024, 128, 256


@functools.lru_cache(maxsize=None)
def _splash() -> tuple[str, tuple]:
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi

    H, S, D, B = SPLASH_H, SPLASH_S, SPLASH_D, SPLASH_B
    mask = sa.MultiHeadMask([sa.CausalMask((S, S)) for _ in range(H)])
    bs = sa.BlockSizes(block_q=B, block_kv=B, block_kv_compute=B)
    kern = sa.make_splash_mha(mask, block_sizes=bs, head_shards=1, q_seq_shards=1)
    mesh = tpu_mesh(1)
    q = abstract(mesh, (H, S, D), jnp.bfloat16)
    text = compile_tpu(lambda q, k, v: kern(q, k, v), q, q, q).as_text()
    info, _ = mi.process_mask(mask, (B, B), downcast_smem_data=True, head_shards=1, q_seq_shards=1)
    prefetch = tuple(x for x in (info.data_next, info.mask_next, info.block_mask) if x is not None)
    return text, prefetch


def test_splash_attention_with_its_mask_info_matches_the_closed_form():
    # grid (heads, q blocks, kv steps) = (2, 4, 4); the k/v index map is (h, data_next[0, i, j], 0).
    # For a causal mask data_next[i, j] = j for j <= i and 0 over the masked tail (checked below),
    # as flash attention's: n(n+1)/2 - 1 fetches per head (see the flash attention closed form).
    from jaxmove.passes.pallas import set_prefetch_values

    text, prefetch = _splash()
    n = SPLASH_S // SPLASH_B
    assert prefetch[0].tolist() == [[[j if j <= i else 0 for j in range(n)] for i in range(n)]]
    blk = SPLASH_B * SPLASH_D * BF16
    name = "splash_mha_fwd_no_residuals"
    # without the contents (elided constants): distinct entries assumed distinct: every step
    an, row, cost = _cost(text)
    k_win = [w for w in cost.windows if w.operand is not None and w.assumption == "data-dependent blocks"]
    assert len(k_win) == 2 and all(w.transfers == SPLASH_H * n * n for w in k_win)
    assert any("assumed distinct entries" in x for x in row.notes)
    # and its flops, without a cost estimate and with the block mask unknown, are the body's with
    # every masked block counted: an upper bound, so the row is incomplete
    assert cost.body_mxu_flops == SPLASH_H * n * n * 2 * (2 * SPLASH_B * SPLASH_B * SPLASH_D)
    assert row.unmodeled and "upper bound" in row.unmodeled[0]
    try:
        set_prefetch_values(name, prefetch)
        an, row, cost = _cost(text)
    finally:
        set_prefetch_values(name, None)
    k_win = [w for w in cost.windows if w.operand is not None and w.assumption == "data-dependent blocks"]
    per_head = n * (n + 1) // 2 - 1
    assert [w.transfers for w in k_win] == [SPLASH_H * per_head] * 2
    assert [w.nbytes for w in k_win] == [SPLASH_H * per_head * blk] * 2
    # k and v live in HBM: the row's HBM reads are those blocks plus the two s8 tables
    assert row.per_execution.hbm_read_bytes >= 2 * SPLASH_H * per_head * blk
    # splash carries no cost estimate: its flops are the kernel body's, walked with the mask
    # info: the 10 blocks on/below the diagonal of each head run q k^T and p v, each
    # 2 * 256 * 256 * 128 flops on the MXU; the masked blocks (block_mask 0) are skipped
    assert cost.body_mxu_flops == SPLASH_H * (n * (n + 1) // 2) * 2 * (2 * SPLASH_B * SPLASH_B * SPLASH_D)
    assert row.per_execution.flops == cost.body_flops and not row.unmodeled
    assert any("FLOPs are the kernel body's count" in x for x in row.notes)


@functools.lru_cache(maxsize=None)
def _paged() -> str:
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    B, Hq, Hkv, D, page, pps = 4, 8, 2, 128, 16, 8
    mesh = tpu_mesh(1)
    q = abstract(mesh, (B, Hq, D), jnp.bfloat16)
    kp = abstract(mesh, (Hkv, B * pps, page, D), jnp.bfloat16)
    return compile_tpu(lambda q, k, v, l, p: paged_attention(q, k, v, l, p, pages_per_compute_block=4),
                       q, kp, kp, abstract(mesh, (B,), jnp.int32),
                       abstract(mesh, (B, pps), jnp.int32)).as_text()


def test_paged_attention_pages_moved_by_manual_dma_are_costed_once_under_a_stated_assumption():
    # k/v pages are in ANY memory space (the kernel DMAs the pages of each sequence itself): each
    # pool is costed as read once whole, which is exact when every page of the pool belongs to one
    # sequence at full length (here: 4 sequences x 8 pages = the 32 pages of the pool).
    an, row, cost = _cost(_paged())
    pool = 2 * 32 * 16 * 128 * BF16  # kv heads x pages x page size x head dim
    manual = [w for w in cost.windows if w.assumption == "manual DMA"]
    assert [w.nbytes for w in manual] == [pool, pool]
    assert any("ANY/HBM memory space" in x and "assumed moved once whole" in x for x in row.notes)
    assert row.per_execution.hbm_read_bytes >= 2 * pool
    # the kernel carries no cost estimate: its traffic is modeled, its flops are not
    assert len(row.unmodeled) == 1 and "no cost_estimate" in row.unmodeled[0]


def test_paged_attention_with_given_lengths_counts_the_pages_its_dmas_fetch():
    # With the lengths and page table given (and the kernel's init flag, an HLO constant {1}),
    # the body's DMAs are walked: each sequence fetches whole compute blocks of 4 pages (64
    # tokens; paged_attention_kernel.py: pages_to_load = pages_per_compute_block), per kv head.
    # Lengths 128, 64, 16, 100 tokens -> 2, 1, 1, 2 blocks -> 24 pages of 16 x 128 bf16.
    from jaxmove.passes.pallas import set_prefetch_values

    text = _paged()
    lengths = [128, 64, 16, 100]
    try:
        set_prefetch_values("paged_flash_attention_kernel_inline_seq_dim",
                            [lengths, list(range(32)), None, None])
        an, row, cost = _cost(text)
    finally:
        set_prefetch_values("paged_flash_attention_kernel_inline_seq_dim", None)
    pages = sum(-(-n // 64) * 4 for n in lengths)
    walked = [w for w in cost.windows if w.assumption == "manual DMA walked"]
    assert [w.nbytes for w in walked] == [2 * pages * 16 * 128 * BF16] * 2
    assert any("the bytes of the kernel's own DMAs" in x for x in row.notes)
    # and its flops are the body's: q (4 heads of a group) x k^T and p x v per block, per kv head
    assert not row.unmodeled and row.per_execution.flops == cost.body_flops
    assert cost.body_mxu_flops == 2 * sum(-(-n // 64) for n in lengths) * 2 * (2 * 4 * 64 * 128)


@functools.lru_cache(maxsize=None)
def _gmm(M=512, K=128, N=256, G=4) -> str:
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    mesh = tpu_mesh(1)
    return compile_tpu(lambda l, r, g: gmm(l, r, g, preferred_element_type=jnp.bfloat16,
                                           tiling=(128, 128, 128)),
                       abstract(mesh, (M, K), jnp.bfloat16), abstract(mesh, (G, K, N), jnp.bfloat16),
                       abstract(mesh, (G,), jnp.int32)).as_text()


def test_megablox_gmm_dynamic_grid_is_a_lower_bound_until_given_then_the_closed_form():
    # gmm's grid is (N/tn, active m tiles, K/tk) = (2, dynamic, 1); lhs block (m_tile_ids[t], 0),
    # rhs (group_ids[t], 0, n), out (m_tile_ids[t], n). Groups [256, 128, 128, 0] over M = 512 in
    # tiles of 128: m tiles 0,1 -> group 0, 2 -> 1, 3 -> 2: 4 active tiles. lhs and out change at
    # every step: 2 x 4 = 8 blocks; rhs changes with the group: 3 per n, 6 in all.
    from jaxmove.passes.pallas import set_prefetch_values

    text = _gmm()
    an, row, cost = _cost(text)
    assert row.unmodeled and "dynamic" in row.unmodeled[0] and "lower bound" in row.unmodeled[0]
    # megablox's group metadata (gmm.py make_group_metadata), written out by hand: group offsets
    # in rows, each active m tile's group and row tile; arrays of tiles_m + G - 1 = 7 entries
    offsets = [0, 256, 384, 512, 512]
    gids = [0, 0, 1, 2, 0, 0, 0]
    mtiles = [0, 1, 2, 3, 0, 0, 0]
    try:
        set_prefetch_values("kernel", [offsets, gids, mtiles, [0]], dynamic_grid=(4,))
        an, row, cost = _cost(text)
    finally:
        set_prefetch_values("kernel", None)
    assert not row.unmodeled
    blk = 128 * 128 * BF16
    lhs, rhs, out = cost.windows
    assert (lhs.transfers, rhs.transfers, out.transfers) == (8, 6, 8)
    assert (lhs.nbytes, rhs.nbytes, out.nbytes) == (8 * blk, 6 * blk, 8 * blk)
    assert row.per_execution.flops == 2 * 512 * 128 * 256  # the author's estimate: 2*M*K*N


def test_ragged_paged_attention_does_not_compile_without_the_device():
    # jax 0.10.2's ragged_paged_attention asks the local TPU's version at trace time
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    mesh = tpu_mesh(1)
    i32 = jnp.int32
    with pytest.raises(NotImplementedError, match="TPU version"):
        compile_tpu(lambda q, kv, a, b, c, n: ragged_paged_attention(q, kv, a, b, c, n, sm_scale=1.0),
                    abstract(mesh, (64, 8, 128), jnp.bfloat16),
                    abstract(mesh, (32, 16, 4, 128), jnp.bfloat16), abstract(mesh, (4,), i32),
                    abstract(mesh, (4, 8), i32), abstract(mesh, (5,), i32), abstract(mesh, (1,), i32))


# ---- Pallas Triton on GPU (deviceless, the CUDA plugin's H100 target config) ------------------

@functools.lru_cache(maxsize=None)
def _gpu_text(which: str, causal: bool = True) -> str:
    import os
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.experimental import topologies

    from jaxmove._platform import quiet_stderr
    from jaxmove.capture.targets import gpu_target_config
    from jaxmove.hardware import load_spec

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        with quiet_stderr():
            dev = topologies.get_topology_desc("h100", "cuda", target_config=gpu_target_config(
                load_spec("h100-sxm")), topology="1x1x1").devices[0]
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"deviceless GPU compilation unavailable: {e}")
    sh = jax.sharding.SingleDeviceSharding(dev)
    if which == "mha":
        from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha
        q = jax.ShapeDtypeStruct((1, 1024, 4, 64), jnp.float16, sharding=sh)
        bs = BlockSizes(block_q=128, block_k=128)
        fn, args = (lambda q, k, v: mha(q, k, v, segment_ids=None, causal=causal, block_sizes=bs)), (q, q, q)
    elif which == "decode":
        from jax.experimental.pallas.ops.gpu import decode_attention as gd
        q = jax.ShapeDtypeStruct((8, 4, 128), jnp.bfloat16, sharding=sh)
        kv = jax.ShapeDtypeStruct((8, 1024, 128), jnp.bfloat16, sharding=sh)
        lengths = jax.ShapeDtypeStruct((8,), jnp.int32, sharding=sh)
        fn = (lambda q, k, v, n: gd.mqa(q, k, v, kv_seq_len=n, sm_scale=0.1, block_h=16,
                                         block_k=128, k_splits=2))
        args = (q, kv, kv, lengths)
    else:
        from jax.experimental.pallas.ops.gpu.layer_norm import layer_norm
        x = jax.ShapeDtypeStruct((4, 256, 512), jnp.float32, sharding=sh)
        w = jax.ShapeDtypeStruct((512,), jnp.float32, sharding=sh)
        fn, args = (lambda x, w, b: layer_norm(x, w, b)), (x, w, w)
    with quiet_stderr():
        return jax.jit(fn).lower(*args).compile().as_text()


def _triton_row(text: str):
    an = analyze_module(parse_module(text, "triton.hlo"))
    rows = [r for r in an.rows if r.instr.opcode == "custom-call"
            and r.instr.custom_call_target == "__gpu$xla.gpu.triton"]
    assert len(rows) == 1
    return an, rows[0]


@pytest.mark.parametrize("causal", [True, False])
def test_pallas_triton_attention_loads_and_dots_match_the_closed_form(causal):
    # mha f16[1, 1024, 4, 64], blocks 128: grid (1024/128 = 8 q blocks, 1, 4 heads); program
    # (i, h) loads its q block once, then k and v blocks 0..i (causal) or 0..7, and stores o.
    # FLOPs: two [128, 64] x [64, 128] / [128, 128] x [128, 64] dots per k block.
    an, row = _triton_row(_gpu_text("mha", causal))
    n, H, blk = 8, 4, 128 * 64 * 2
    kv_blocks = H * (n * (n + 1) // 2 if causal else n * n)
    assert row.per_execution.hbm_read_bytes == H * n * blk + 2 * kv_blocks * blk
    assert row.per_execution.hbm_write_bytes == H * n * blk
    assert row.per_execution.flops == kv_blocks * 2 * (2 * 128 * 128 * 64)
    assert not row.unmodeled


def test_pallas_triton_decode_with_lengths_counts_the_full_cache():
    # decode_attention.mqa over 8 sequences of 1024 cached positions (bf16, head dim 128), 4 query
    # heads padded to block_h=16, block_k=128, k_splits=2: grid (1, 2 splits, 8). The loop bound
    # min(cdiv(kv_seq_len - 512 j, 128), 4) reads kv_seq_len from memory: its cap, 4 blocks, counted
    # (the step at a full cache). The q block's rows past the 4 heads are masked
    # (make_range(0, 16) < 4): per program q [4,128] bf16 once, the length (4 B), 4 x (k + v
    # [128,128] bf16); writes o [4,128] bf16 and the residuals l, m [4] f32.
    an, row = _triton_row(_gpu_text("decode"))
    programs, blk = 2 * 8, 128 * 128 * 2
    assert row.per_execution.hbm_read_bytes == programs * (4 * 128 * 2 + 4 + 4 * 2 * blk)
    assert row.per_execution.hbm_read_bytes - programs * (4 * 128 * 2 + 4) == 2 * 8 * 1024 * 128 * 2
    assert row.per_execution.hbm_write_bytes == programs * (4 * 128 * 2 + 2 * 4 * 4)
    assert row.per_execution.flops == programs * 4 * 2 * (2 * 16 * 128 * 128)
    assert not row.unmodeled
    assert any("data-dependent trip count" in n for n in row.notes)


def test_pallas_triton_layer_norm_reads_x_three_times():
    # layer_norm_forward_kernel: one program per row (4 x 256 rows of 512 f32): a mean pass,
    # a variance pass and the normalizing pass each load the row; weight and bias once per row.
    an, row = _triton_row(_gpu_text("ln"))
    rows, d = 4 * 256, 512
    assert row.per_execution.hbm_read_bytes == 3 * rows * d * 4 + 2 * rows * d * 4
    assert row.per_execution.hbm_write_bytes == rows * d * 4
    assert any("L2 hits" in x for x in row.notes)


def test_pallas_triton_unreadable_ir_is_a_marked_lower_bound():
    text = _gpu_text("ln")
    i = text.index('ir = "') + len('ir = "')
    bad = text[:i] + "garbage" + text[text.index('"', i):]
    an, row = _triton_row(bad)
    rows, d = 4 * 256, 512
    assert row.per_execution.hbm_read_bytes == rows * d * 4 + 2 * d * 4
    assert row.per_execution.hbm_write_bytes == rows * d * 4
    assert row.unmodeled and "lower bound" in row.unmodeled[0]


# ---- walking details: chunks, element windows, grid-free kernels -------------------------------

def test_the_grid_walk_in_chunks_equals_the_walk_in_one(monkeypatch):
    # chunk boundaries inside a q row (7 does not divide the 16 steps of a row): the same copies
    from jaxmove.passes import pallas

    text = _flash(True, 128)
    pallas._COST_CACHE.clear()
    _, _, whole = _cost(text)
    monkeypatch.setattr(pallas, "_CHUNK", 7)
    pallas._COST_CACHE.clear()
    _, _, chunked = _cost(text)
    pallas._COST_CACHE.clear()
    assert [(w.transfers, w.nbytes) for w in chunked.windows] == [(w.transfers, w.nbytes) for w in whole.windows]
    assert chunked.step_dma == whole.step_dma and chunked.first_bytes == whole.first_bytes


def _pallas_text(kernel, in_specs, out_spec, grid, shapes, out_shape) -> str:
    import jax
    from jax.experimental import pallas as pl

    def f(*xs):
        return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_spec,
                              out_shape=out_shape)(*xs)
    mesh = tpu_mesh(1)
    return compile_tpu(f, *[abstract(mesh, s, d) for s, d in shapes]).as_text()


def test_element_windows_read_overlapping_blocks_at_element_offsets():
    # f32[1024, 128] read in windows of 128 rows starting every 64 rows (pl.Element: the index
    # map returns element offsets): 15 steps (the last window ends at row 1024), each a new
    # 128-row block; the output's 64-row blocks are written once each.
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[:64, :] + x_ref[64:, :]

    text = _pallas_text(kernel, [pl.BlockSpec((pl.Element(128), pl.Element(128)), lambda i: (i * 64, 0))],
                        pl.BlockSpec((64, 128), lambda i: (i, 0)), (15,),
                        [((1024, 128), jnp.float32)], jax.ShapeDtypeStruct((960, 128), jnp.float32))
    an, row = _kernel_row(text)
    assert row.per_execution.hbm_read_bytes == 15 * 128 * 128 * 4
    assert row.per_execution.hbm_write_bytes == 960 * 128 * 4


def test_a_grid_free_kernel_reads_and_writes_its_arrays_once():
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    def f(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((256, 128), jnp.float32))(x)
    mesh = tpu_mesh(1)
    text = compile_tpu(f, abstract(mesh, (256, 128), jnp.float32)).as_text()
    an, row = _kernel_row(text)
    assert row.per_execution.hbm_read_bytes == 256 * 128 * 4
    assert row.per_execution.hbm_write_bytes == 256 * 128 * 4


def test_a_grid_too_long_for_a_step_profile_is_timed_at_its_mean_bytes(monkeypatch):
    from jaxmove.hardware import load_spec
    from jaxmove.passes import pallas

    m, k, n, bm, bk, bn = 512, 1024, 768, 128, 256, 256
    text = _matmul(m, k, n, bm, bk, bn, "bfloat16", True)
    monkeypatch.setattr(pallas, "_MAX_STEP_PROFILE", 10)
    pallas._COST_CACHE.clear()
    try:
        _, row, cost = _cost(text)
    finally:
        pallas._COST_CACHE.clear()
    assert any("mean bytes per step" in x for x in row.notes)
    # the same bytes in all: 48 steps of 2 input blocks, 12 output blocks
    moved = 48 * (bm * bk + bk * bn) * BF16 + 12 * bm * bn * BF16
    assert cost.step_dma == ((moved // 48, 48),)
    spec = load_spec("tpu-v5e")
    t, comp, dma, notes, unm = pallas.pallas_time(cost, spec, "bf16")
    c = 2 * m * k * n / spec.flops_per_s["bf16"] / 48
    assert t == pytest.approx(48 * max(moved / 48 / spec.hbm_bytes_per_s, c)
                              + 48 * pallas.PALLAS_TPU_STEP_OVERHEAD_S, rel=1e-6)


def test_a_mosaic_gpu_kernel_is_its_operands_and_results_once_a_marked_lower_bound():
    text = """HloModule m
ENTRY e {
  a = f16[1024,256]{1,0} parameter(0)
  b = f16[256,512]{1,0} parameter(1)
  ROOT k = f16[1024,512]{1,0} custom-call(a, b), custom_call_target="mosaic_gpu_v2"
}"""
    an = analyze_module(parse_module(text, "mgpu.hlo"))
    row = next(r for r in an.rows if r.instr.name == "k")
    assert row.per_execution.hbm_read_bytes == (1024 * 256 + 256 * 512) * 2
    assert row.per_execution.hbm_write_bytes == 1024 * 512 * 2
    assert any("lower bound" in u for u in row.unmodeled)
    assert any("flops are unknown" in u for u in row.unmodeled)


def test_the_traffic_pass_sends_every_pallas_target_here():
    from jaxmove.passes import traffic
    from jaxmove.passes.pallas import KERNEL_TARGETS
    assert traffic._PALLAS_TARGETS == KERNEL_TARGETS
