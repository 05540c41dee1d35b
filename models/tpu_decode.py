"""A Pallas TPU (Mosaic) kernel for absorbed multi-head latent attention decode (DeepSeek-V2 /
V3): each block of the merged latent cache is read from HBM once and used for both products,
the scores (against the latent and rotary keys) and the output (against the latent).

XLA:TPU compiles the same attention (``transformer.MLAttention.decode``'s ``xla`` form) as two
dots over the cache, the scores and the output, so it reads the cache twice (DeepSeek-V3 on 16
v5p chips: 2.16 GiB of KV read per step for 1.07 GiB of cache, ``benchmarks/zoo_compile.md``),
and writes the f32 scores [B, H, S] to HBM between them. Here the grid walks (sequence, key
block); one sequence's H query heads stay in VMEM with an online-softmax accumulator
(FlashAttention, Dao et al. 2022, section 3.1; FlashMLA's decode form).

Numerics checked against attention written in numpy in Pallas's interpreter
(``tests/test_tpu_decode_kernels.py``); compiled for TPU without the device through libtpu.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

#: lanes of a TPU vreg (the minor tile, ``T(8,128)``): the running max and sum are kept
#: broadcast over this many lanes, as jax's TPU flash_attention keeps its m / l scratch
LANES = 128


def _kernel(pos_ref, q_ref, c_ref, o_ref, m_ref, l_ref, acc_ref, *, sm_scale: float, block_k: int, r: int):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    pos = pos_ref[0]
    start = j * block_k

    @pl.when(start <= pos)   # a block past the last valid position adds nothing
    def _step():
        q = q_ref[0]                       # [H, r + dr]
        ct = c_ref[0]                      # [r + dr, block_k]: the cache block, positions minor
        s = jax.lax.dot_general(q, ct, (((1,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32) * sm_scale   # [H, block_k]
        key = start + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(key <= pos, s, -jnp.inf)
        m_prev = m_ref[...]                                    # [H, LANES], lanes equal
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new[:, :1])
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        m_ref[...] = m_new
        pv = jax.lax.dot_general(p.astype(ct.dtype), ct[:r, :], (((1,), (1,)), ((), ())),
                                 preferred_element_type=jnp.float32)             # [H, r]
        acc_ref[...] = alpha[:, :1] * acc_ref[...] + pv

    @pl.when(j == pl.num_programs(1) - 1)
    def _done():
        o_ref[0] = (acc_ref[...] / l_ref[...][:, :1]).astype(o_ref.dtype)


def mla(ql, qr, c, pos, *, sm_scale: float, block_k: int = 512, interpret: bool = False):
    """Absorbed latent attention of one query per head over the merged cache.

    Args:
      ql: [N, H, r] latent queries (q_nope times W_uk); qr: [N, H, dr] rotary queries.
      c: [N, S, r + dr] the merged cache, the latent then the rotary keys (FlashMLA's layout;
        ``transformer.cache_entry_shapes``'s ``latent_cache``).
      pos: int32 scalar, the last valid position (positions ``<= pos`` attend).
      sm_scale: the softmax scale.
      block_k: positions per grid step (a multiple of 128 dividing S, or S; min(block_k, S)
        is taken).
    Returns:
      ``softmax((ql c[..., :r]^T + qr c[..., r:]^T) * sm_scale) c[..., :r]`` [N, H, r] in
      ql's dtype (the caller applies W_uv).
    Raises:
      ValueError: S not a multiple of the block (a multiple of 128), or a cache width other
        than r + dr.
    """
    n, h, r = ql.shape
    dr = qr.shape[-1]
    s = c.shape[1]
    if c.shape[-1] != r + dr:
        raise ValueError(f"the cache is {c.shape[-1]} wide; the merged latent cache is r + dr = {r + dr}")
    bk = min(block_k, s)
    if s % bk or (bk % 128 and bk != s):
        raise ValueError(f"cache length {s} is not a multiple of the key block {bk} (a multiple "
                         "of 128, the lanes its positions fill)")
    qa = jnp.concatenate([ql, qr.astype(ql.dtype)], axis=-1).astype(c.dtype)   # [N, H, r + dr]
    pos = jnp.reshape(pos, (1,)).astype(jnp.int32)
    # the kernel reads the cache positions-minor, [N, r + dr, S]: the layout XLA:TPU gives the
    # [N, S, r + dr] cache (576 = r + dr is no multiple of the 128 lanes, S is), so this
    # transpose is a relabelling of the same bytes there (a row-major cache would cost a
    # layout copy in and out of every layer, and 11% tile padding)
    ct = jnp.swapaxes(c, 1, 2)
    kernel = functools.partial(_kernel, sm_scale=sm_scale, block_k=bk, r=r)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(n, s // bk),
        in_specs=[pl.BlockSpec((1, h, r + dr), lambda i, j, p: (i, 0, 0)),
                  pl.BlockSpec((1, r + dr, bk), lambda i, j, p: (i, 0, j))],
        out_specs=pl.BlockSpec((1, h, r), lambda i, j, p: (i, 0, 0)),
        scratch_shapes=[pltpu.VMEM((h, LANES), jnp.float32), pltpu.VMEM((h, LANES), jnp.float32),
                        pltpu.VMEM((h, r), jnp.float32)])
    itemsize = jnp.dtype(c.dtype).itemsize
    cost = pl.CostEstimate(flops=2 * n * h * s * (2 * r + dr), transcendentals=n * h * s,
                           bytes_accessed=(c.size + qa.size) * itemsize + n * h * r * jnp.dtype(ql.dtype).itemsize)
    return pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct((n, h, r), ql.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        cost_estimate=cost, interpret=interpret, name="mla_decode")(pos, qa, ct)


__all__ = ["mla"]
