"""A Pallas Triton decode-attention kernel with score soft-capping and a sliding window (Gemma 2).

Adapted from ``jax.experimental.pallas.ops.gpu.decode_attention`` (the JAX authors, Apache
License 2.0; jax 0.10.2): the same split-K flash-decoding kernel (one program per
(sequence, block of query heads, split of positions), online softmax over blocks of
``block_k`` keys, FlashAttention-2's unscaled accumulator; Dao et al. 2023,
"Flash-Decoding for long-context inference"), with two changes:

- scores are soft-capped, ``cap * tanh(s / cap)`` after the scale (Gemma 2: Gemma Team 2024,
  "Gemma 2: Improving Open Language Models at a Practical Size", section 2), when ``softcap``
  is given;
- the valid positions of sequence ``n`` are ``[start[n], length[n])`` (jax's kernel takes the
  same two bounds): a sliding window of ``W`` at position ``pos`` is ``start = pos + 1 - W``.
  Positions before ``start`` in a split are still read and masked, as in jax's kernel, so a
  windowed layer reads the whole valid prefix of its cache, as the XLA form does.

jax's kernel has no soft-capping, so without this module Gemma 2 decodes with the XLA form,
which writes the f32 scores to HBM and reads them back (``materialized_intermediate``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def _softmax_step(s, values, carry):
    """One block of FlashAttention-2's online softmax: scores s [block_h, block_k] (f32, masked),
    values [block_k, D]; carry (o [block_h, D] unnormalised, running max m, running sum l)."""
    o_prev, m_prev, l_prev = carry
    m_next = jnp.maximum(m_prev, s.max(axis=-1))
    corr = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - m_next[:, None])
    o_next = corr[:, None] * o_prev + plgpu.dot(p.astype(values.dtype), values)
    return o_next, m_next, corr * l_prev + p.sum(axis=-1)


def _run_and_store(compute, start, length, o_ref, l_ref, m_ref, q_mask, width: int):
    """Run ``compute(o, m, l)`` from the empty state unless the split has no valid position,
    then store the block's rows (``q_mask``) of o [block_h, width], l and m."""
    block_h = q_mask.shape[0]
    m_i = jnp.zeros(block_h, jnp.float32) + jnp.finfo(jnp.float32).min
    l_i = jnp.zeros(block_h, jnp.float32)
    o = jnp.zeros((block_h, width), jnp.float32)
    o, m_i, l_i = lax.cond(start >= length, lambda: (o, m_i, l_i), lambda: compute(o, m_i, l_i))
    rows = pl.ds(0, block_h)
    vec_mask = q_mask.reshape(-1)
    plgpu.store(l_ref.at[rows], l_i, mask=vec_mask)
    plgpu.store(m_ref.at[rows], m_i, mask=vec_mask)
    plgpu.store(o_ref.at[rows, :], o.astype(o_ref.dtype), mask=q_mask)


def _split_len(seq: int, block_k: int, k_splits: int) -> int:
    """Positions per split; raises ValueError when ``seq`` cannot be split ``k_splits`` ways
    in blocks of ``block_k`` (each split >= 16 positions, jax's kernel's limit)."""
    if seq % k_splits or (seq // k_splits) % min(block_k, seq // k_splits) or seq // k_splits < 16:
        raise ValueError(f"cache length {seq} cannot be split {k_splits} ways in blocks of {block_k}")
    return seq // k_splits


def _kernel(q_ref, k_ref, v_ref, start_ref, length_ref, o_ref, l_ref, m_ref, *,
            sm_scale: float, softcap: float | None, block_k: int, block_h: int, num_heads: int):
    """One (block of query heads, split of positions) of one sequence: q [block_h, D] over
    k / v [split, D]; writes the split's unnormalised output, its softmax sum l and max m."""
    _, head_dim = q_ref.shape
    split_len, _ = k_ref.shape
    prog_i, prog_j = pl.program_id(0), pl.program_id(1)
    q_slice = pl.ds(0, block_h)
    q_mask = (jnp.arange(block_h) < num_heads - block_h * prog_i)[:, None]
    start = jnp.maximum(split_len * prog_j, start_ref[()])
    length = jnp.minimum((prog_j + 1) * split_len, length_ref[()])

    def compute(o, m_i, l_i):
        q = plgpu.load(q_ref.at[q_slice, :], mask=q_mask)
        offsets = jnp.arange(block_k)

        def body(kb, carry):
            ks = pl.ds(kb * block_k, block_k)
            s = plgpu.dot(q, k_ref[ks, :].T) * sm_scale          # [block_h, block_k] f32
            if softcap is not None:
                s = softcap * jnp.tanh(s / softcap)
            idx = prog_j * split_len + kb * block_k + offsets
            valid = ((idx >= start) & (idx < length))[None, :]
            s += (~valid) * (0.7 * jnp.finfo(s.dtype).min)
            return _softmax_step(s, v_ref[ks, :], carry)

        trips = jnp.minimum(pl.cdiv(length - prog_j * split_len, block_k), split_len // block_k)
        return lax.fori_loop(0, trips, body, (o, m_i, l_i))

    _run_and_store(compute, start, length, o_ref, l_ref, m_ref, q_mask, head_dim)


def _one(q, k, v, start, length, *, sm_scale, softcap, block_h, block_k, k_splits, interpret):
    num_heads, head_dim = q.shape
    seq, _ = k.shape
    split_len = _split_len(seq, block_k, k_splits)
    block_k = min(block_k, split_len)
    k = k.reshape(k_splits, split_len, head_dim)
    v = v.reshape(k_splits, split_len, head_dim)
    kernel = functools.partial(_kernel, sm_scale=sm_scale, softcap=softcap, block_k=block_k,
                               block_h=block_h, num_heads=num_heads)
    o, l, m = pl.pallas_call(
        kernel,
        grid=(pl.cdiv(num_heads, block_h), k_splits),
        in_specs=[pl.BlockSpec((block_h, head_dim), lambda i, j: (i, 0)),
                  pl.BlockSpec((None, split_len, head_dim), lambda i, j: (j, 0, 0)),
                  pl.BlockSpec((None, split_len, head_dim), lambda i, j: (j, 0, 0)),
                  pl.BlockSpec((), lambda i, j: ()),
                  pl.BlockSpec((), lambda i, j: ())],
        out_specs=[pl.BlockSpec((None, block_h, head_dim), lambda i, j: (j, i, 0)),
                   pl.BlockSpec((None, block_h), lambda i, j: (j, i)),
                   pl.BlockSpec((None, block_h), lambda i, j: (j, i))],
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        out_shape=[jax.ShapeDtypeStruct((k_splits, *q.shape), q.dtype),
                   jax.ShapeDtypeStruct((k_splits, num_heads), jnp.float32),
                   jax.ShapeDtypeStruct((k_splits, num_heads), jnp.float32)],
        name="softcap_decode",
        interpret=interpret,
    )(q, k, v, start, length)
    return _combine(o, l, m)


@functools.partial(jax.jit, static_argnames=("sm_scale", "softcap", "block_h", "block_k", "k_splits",
                                             "interpret"))
def mqa(q, k, v, start, length, *, sm_scale: float, softcap: float | None = None, block_h: int = 16,
        block_k: int = 128, k_splits: int = 1, interpret: bool = False):
    """Decode attention of ``N`` sequences: q [N, H, D] (the H query heads of one kv head),
    k / v [N, S, D], start / length int32 [N] (valid positions ``[start, length)``) ->
    [N, H, D] in q's dtype; ``softmax(softcap(q k^T * sm_scale)) v`` over the valid positions.
    ``interpret``: Pallas's interpreter (any platform; the tests' numerical check).

    Raises:
      ValueError: S cannot be split ``k_splits`` ways in blocks of ``block_k`` (each split
        >= 16 positions).
    """
    inner = functools.partial(_one, sm_scale=sm_scale, softcap=softcap, block_h=block_h,
                              block_k=block_k, k_splits=k_splits, interpret=interpret)
    return jax.vmap(inner)(q, k, v, start, length)


def _mla_merged_kernel(ql_ref, qr_ref, c_ref, length_ref, o_ref, l_ref, m_ref, **kw):
    """``_mla_kernel`` over one merged cache c [split, r + dr]: the latent in its first r
    columns, the rope keys in the last dr (the columns loaded apart, each a power of two)."""
    rank, rope = ql_ref.shape[1], qr_ref.shape[1]
    _mla_kernel(ql_ref, qr_ref, c_ref, None, length_ref, o_ref, l_ref, m_ref,
                columns=(pl.ds(0, rank), pl.ds(rank, rope)), **kw)


def _mla_kernel(ql_ref, qr_ref, c_ref, r_ref, length_ref, o_ref, l_ref, m_ref, *,
                sm_scale: float, block_k: int, block_h: int, num_heads: int, columns=None):
    """Absorbed multi-head latent attention, one (block of heads, split of positions) of one
    sequence: latent queries ql [block_h, r] and rope queries qr [block_h, dr] over the latent
    cache c [split, r] (keys and values both) and the rope keys [split, dr] (``r_ref`` None:
    both in c's ``columns``). Each block of ``c`` is loaded once and used for the scores and
    the output."""
    _, rank = ql_ref.shape
    split_len, _ = c_ref.shape
    prog_i, prog_j = pl.program_id(0), pl.program_id(1)
    q_slice = pl.ds(0, block_h)
    q_mask = (jnp.arange(block_h) < num_heads - block_h * prog_i)[:, None]
    start = split_len * prog_j
    length = jnp.minimum((prog_j + 1) * split_len, length_ref[()])

    def compute(o, m_i, l_i):
        ql = plgpu.load(ql_ref.at[q_slice, :], mask=q_mask)
        qr = plgpu.load(qr_ref.at[q_slice, :], mask=q_mask)
        offsets = jnp.arange(block_k)

        def body(kb, carry):
            ks = pl.ds(kb * block_k, block_k)
            if columns is None:
                c, kr = c_ref[ks, :], r_ref[ks, :]
            else:
                c, kr = c_ref[ks, columns[0]], c_ref[ks, columns[1]]
            s = (plgpu.dot(ql, c.T) + plgpu.dot(qr, kr.T)) * sm_scale   # [block_h, block_k]
            valid = ((start + kb * block_k + offsets) < length)[None, :]
            s += (~valid) * (0.7 * jnp.finfo(s.dtype).min)
            return _softmax_step(s, c, carry)

        trips = jnp.minimum(pl.cdiv(length - start, block_k), split_len // block_k)
        return lax.fori_loop(0, trips, body, (o, m_i, l_i))

    _run_and_store(compute, start, length, o_ref, l_ref, m_ref, q_mask, rank)


def _combine(o, l, m):
    """The splits' partial outputs o [splits, H, D], sums l and maxima m [splits, H] -> [H, D]
    (FlashAttention-2's rescaling; jax's decode kernel does the same in XLA)."""
    m_all = lax.optimization_barrier(m.max(axis=0))
    corr = jnp.exp(m - m_all[None])
    o = (o * corr[:, :, None].astype(o.dtype)).sum(axis=0)
    l_all = (l * corr).sum(axis=0)
    return o / (l_all[:, None].astype(o.dtype) + jnp.finfo(l_all.dtype).eps)


def _mla_one(ql, qr, c, r, length, *, sm_scale, block_h, block_k, k_splits, num_warps, interpret):
    num_heads, rank = ql.shape
    rope = qr.shape[1]
    seq = c.shape[0]
    split_len = _split_len(seq, block_k, k_splits)
    block_k = min(block_k, split_len)
    kw = dict(sm_scale=sm_scale, block_k=block_k, block_h=block_h, num_heads=num_heads)
    if r is None:   # one merged cache [S, r + dr]
        kernel = functools.partial(_mla_merged_kernel, **kw)
        caches = [pl.BlockSpec((None, split_len, rank + rope), lambda i, j: (j, 0, 0))]
        operands = (c.reshape(k_splits, split_len, rank + rope),)
    else:
        kernel = functools.partial(_mla_kernel, **kw)
        caches = [pl.BlockSpec((None, split_len, rank), lambda i, j: (j, 0, 0)),
                  pl.BlockSpec((None, split_len, rope), lambda i, j: (j, 0, 0))]
        operands = (c.reshape(k_splits, split_len, rank), r.reshape(k_splits, split_len, rope))
    o, l, m = pl.pallas_call(
        kernel,
        grid=(pl.cdiv(num_heads, block_h), k_splits),
        in_specs=[pl.BlockSpec((block_h, rank), lambda i, j: (i, 0)),
                  pl.BlockSpec((block_h, rope), lambda i, j: (i, 0)),
                  *caches,
                  pl.BlockSpec((), lambda i, j: ())],
        out_specs=[pl.BlockSpec((None, block_h, rank), lambda i, j: (j, i, 0)),
                   pl.BlockSpec((None, block_h), lambda i, j: (j, i)),
                   pl.BlockSpec((None, block_h), lambda i, j: (j, i))],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=2),
        out_shape=[jax.ShapeDtypeStruct((k_splits, num_heads, rank), ql.dtype),
                   jax.ShapeDtypeStruct((k_splits, num_heads), jnp.float32),
                   jax.ShapeDtypeStruct((k_splits, num_heads), jnp.float32)],
        name="mla_decode",
        interpret=interpret,
    )(ql, qr, *operands, length)
    return _combine(o, l, m)


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_h", "block_k", "k_splits", "num_warps",
                                             "interpret"))
def mla(ql, qr, c, r, length, *, sm_scale: float, block_h: int = 16, block_k: int = 32, k_splits: int = 1,
        num_warps: int = 4, interpret: bool = False):
    """Absorbed multi-head latent attention decode (DeepSeek-V2, DeepSeek-AI 2024, section
    2.1.2 and appendix C; the FlashMLA decode kernel's form): ``N`` sequences of H heads,
    latent queries ql [N, H, r] (q_nope times W_uk) and rope queries qr [N, H, dr] over the
    latent cache c [N, S, r] and rope keys r [N, S, dr]; positions ``< length[n]`` (int32 [N])
    valid. Returns ``softmax((ql c^T + qr r^T) * sm_scale) c`` [N, H, r] in ql's dtype (the
    caller applies W_uv). Each block of ``c`` is read once for both products, by each of the
    ``ceil(H / block_h)`` blocks of heads (FlashMLA takes 64 heads per block). ``r`` None: ``c``
    is one merged cache [N, S, r + dr], the latent then the rope keys (FlashMLA's layout).

    Raises:
      ValueError: S cannot be split ``k_splits`` ways in blocks of ``block_k`` (>= 16 each).
    """
    inner = functools.partial(_mla_one, sm_scale=sm_scale, block_h=block_h, block_k=block_k,
                              k_splits=k_splits, num_warps=num_warps, interpret=interpret)
    return jax.vmap(inner)(ql, qr, c, r, length)
