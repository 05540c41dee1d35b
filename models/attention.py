"""Attention kernels of the zoo's decoders: ``--set attention=xla|flash|splash|paged|cudnn|auto``.

Every option computes the same function, causal grouped-query softmax attention
``softmax(q k^T * scale) v`` (Vaswani et al. 2017; GQA, Ainslie et al. 2023), in one of
these forms:

=========  ==========================================================================================
``xla``    two einsums around a masked softmax (``transformer.Attention``); XLA fuses what it can,
           and on TPU v5p / GPUs writes the f32 scores to HBM and reads them back
``flash``  a fused kernel, per lowering platform: TPU ``jax.experimental.pallas.ops.tpu.
           flash_attention`` (Dao et al. 2022, "FlashAttention"; k/v repeated to the query heads
           for training and prefill, the queries of one kv head as its rows for decode);
           CUDA GPUs the Pallas Triton kernels ``pallas.ops.gpu.attention.mha`` (training /
           prefill) and ``pallas.ops.gpu.decode_attention.mqa`` (decode: one program per
           (batch row, kv head), the cache read in place as ``[B * Hkv, S, D]``, split over
           ``k_splits`` blocks of positions). No kernel for XLA:CPU: an error.
``splash`` TPU ``pallas.ops.tpu.splash_attention`` (the block-sparse flash kernel), its MQA form
           per (batch row, kv head); training and prefill only (its masks are static, decode's
           valid length is not).
``paged``  TPU ``pallas.ops.tpu.paged_attention`` (vLLM's PagedAttention, Kwon et al. 2023, as
           the JAX TPU kernel); decode only. The zoo's contiguous cache [B, Hkv, S, D] is the
           paged layout with an identity page table: ``[1, B * Hkv * S / page, page, D]`` (a
           reshape, no copy), page ``j`` of sequence ``b * Hkv + h`` is page
           ``(b * Hkv + h) * S / page + j``; ``head_dim`` a multiple of 128 (the kernel's tile).
``cudnn``  ``jax.nn.dot_product_attention(implementation="cudnn")`` (cuDNN's fused attention,
           the ``__cudnn$fmha*`` custom calls); CUDA only. jax checks for the cuDNN library
           when it traces the call and XLA:GPU needs it to compile the fusion: on a machine
           without cuDNN (a deviceless compile with the CUDA plugin alone) it is an error.
``auto``   ``flash`` where the lowering platform has its kernel and the model's attention is
           one it computes (no soft-capping, sliding window or latent attention), else ``xla``
           (the training presets' default: XLA:CPU, Gemma-2 and DeepSeek-V3 keep ``xla``).
           Decode on CUDA also computes soft-capping and a sliding window, with the same Triton
           decode kernel adapted to them, and DeepSeek's absorbed latent attention with a
           Triton kernel of its own (``models/triton_decode.py``): Gemma-2 and DeepSeek-V3
           decode with them on GPUs. DeepSeek-V3 decode on TPU uses a Pallas TPU kernel of
           its own (``models/tpu_decode.py``: the merged latent cache read once); Gemma-2
           keeps ``xla`` there.
=========  ==========================================================================================

The kernel is chosen when the program is lowered, by ``jax.lax.platform_dependent``
(every branch is traced, only the lowering platform's is lowered): a branch with no kernel
for a platform lowers to a primitive whose lowering raises ``AttentionError`` naming the
option, the platform and why, so ``--set attention=splash --target h100-sxm`` fails with one
line instead of a Mosaic lowering trace.

Under a sharding plan the kernel runs per device in ``jax.shard_map`` over the batch and
head dims the plan splits (attention is independent per (batch row, head)): a custom call
is opaque to XLA's partitioner, which would otherwise gather its operands to every device.
When the plan splits a sequence dim the kernel is called on the whole arrays (XLA gathers
them; the count shows it).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.extend
import jax.numpy as jnp
from jax.interpreters import ad, mlir

from jaxmove.errors import JaxmoveInputError
from .sharding import logical_sharding_of

#: The ``attention`` values (module docstring).
ATTENTION = ("xla", "flash", "splash", "paged", "cudnn", "auto")
#: Platforms (jax lowering platform names) with a kernel, per option and mode
#: ("forward": training and prefill, T queries; "decode": one query over the cache).
KERNELS = {
    "flash": {"forward": ("tpu", "cuda"), "decode": ("tpu", "cuda")},
    "splash": {"forward": ("tpu",), "decode": ()},
    "paged": {"forward": (), "decode": ("tpu",)},
    "cudnn": {"forward": ("cuda",), "decode": ("cuda",)},
}
_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
_WHAT = {"tpu": "XLA:TPU", "cuda": "XLA:GPU (CUDA)", "rocm": "XLA:GPU (ROCm)", "cpu": "XLA:CPU"}
#: Block sizes of the TPU / Triton kernels: the kernels' own defaults (128), or the whole
#: dim when it is shorter.
BLOCK = 128
#: Keys per grid step of the TPU flash decode (``_decode_block``): 8192 bf16 keys of
#: head_dim 128 are 2 MiB per K / V buffer, 8 MiB of VMEM double-buffered. Each Pallas TPU grid
#: step costs ~0.35 us (passes/pallas.py): llama3-8b-decode, 2 layers, on tpu-v5p, jaxmove's
#: estimate 13.0 ms with 128 keys per step, 4.4 ms with 512, 2.3 ms with 2048, 1.7 ms with 8192
#: (bandwidth bound 1.5 ms).
DECODE_BLOCK = 8192
#: Programs the Triton decode kernel aims for ((batch x kv heads) x position splits; ``mqa``'s
#: own default splits every sequence 16 ways): llama3-8b-decode (32 x 8 = 256 programs) then
#: takes one split.
TRITON_DECODE_PROGRAMS = 256
#: Query heads per program of the latent-attention decode kernel (``models/triton_decode.mla``):
#: FlashMLA's 64 (DeepSeek-AI, FlashMLA, 2025); each block of heads reads the cache once.
MLA_BLOCK_HEADS = 64
#: Paged attention: positions per page and pages per compute block (the kernel's tile of
#: keys is page * pages_per_block = 512 positions, the JAX test suite's configuration).
PAGE_SIZE = 128
PAGES_PER_BLOCK = 4


class AttentionError(JaxmoveInputError):
    """An ``attention`` option that cannot compute this model or compile for this target."""


def attention_name(name: str) -> str:
    """An ``ATTENTION`` value (case-insensitive).

    Raises:
      ValueError: another name.
    """
    n = str(name).strip().lower()
    if n not in ATTENTION:
        raise ValueError(f"unknown attention {name!r}; expected one of {', '.join(ATTENTION)}")
    return n


def unsupported_feature(cfg) -> str | None:
    """Why the kernels cannot compute ``cfg``'s attention (None: they can)."""
    if cfg.mla:
        return "multi-head latent attention (DeepSeek: query/key dim != value dim, absorbed decode)"
    if cfg.attn_softcap is not None:
        return f"score soft-capping (attn_softcap={cfg.attn_softcap})"
    if cfg.sliding_window is not None:
        return f"a sliding window (sliding_window={cfg.sliding_window})"
    return None


def check_mode(cfg, mode: str) -> None:
    """Raise ``AttentionError`` when ``cfg.attention`` has no kernel for ``mode``
    ("forward": prefill / training, "decode") or needs what ``cfg`` does not have."""
    opt = cfg.attention
    if opt in ("xla", "auto"):
        return
    why = unsupported_feature(cfg)
    if why:
        raise AttentionError(f"--set attention={opt}: the kernels compute causal softmax attention "
                             f"without {why}; use attention=xla for {cfg.family}")
    if not KERNELS[opt][mode]:
        other = "decode (use flash or splash for prefill and training)" if opt == "paged" else \
            "prefill and training (use flash or paged for decode)"
        raise AttentionError(f"--set attention={opt}: the {opt} kernel is for {other}")
    if mode == "decode" and jnp.dtype(cfg.kv_dtype) != jnp.dtype(cfg.dtype):
        raise AttentionError(f"--set attention={opt}: the kernels read the cache in the model dtype "
                             f"({cfg.dtype}); a {cfg.kv_dtype} cache would be dequantized to HBM "
                             "before the call (use attention=xla with kv_dtype)")
    if opt == "paged" and cfg.head_dim % 128:
        raise AttentionError(f"--set attention=paged: the TPU paged attention kernel tiles head_dim "
                             f"by 128; head_dim={cfg.head_dim} is not a multiple of 128")


# ---------------------------------------------------------------------------- unsupported targets

_unsupported_p = jax.extend.core.Primitive("jaxmove_attention_unsupported")


@_unsupported_p.def_abstract_eval
def _unsupported_aval(*_, shape, dtype, option, reason):
    return jax.core.ShapedArray(shape, dtype)


def _unsupported_lowering(ctx, *_, shape, dtype, option, reason):
    plats = ", ".join(_WHAT.get(p, p) for p in ctx.module_context.platforms)
    raise AttentionError(f"--set attention={option} cannot compile for {plats}: {reason}")


mlir.register_lowering(_unsupported_p, _unsupported_lowering)


def _unsupported_jvp(primals, tangents, **params):
    """A zero tangent: a training step differentiates every branch before one is lowered."""
    out = _unsupported_p.bind(*primals, **params)
    return out, jnp.zeros_like(out)


ad.primitive_jvps[_unsupported_p] = _unsupported_jvp


def _unsupported(option: str, reason: str, out: jax.ShapeDtypeStruct):
    """A branch that lowers to ``AttentionError(option, platform, reason)``."""
    def branch(*args):
        return _unsupported_p.bind(*args[:1], shape=tuple(out.shape), dtype=jnp.dtype(out.dtype),
                                   option=option, reason=reason)
    return branch


def _guarded(option: str, fn, out: jax.ShapeDtypeStruct, xla):
    """``fn``, or, when tracing it raises (a kernel's shape checks), ``xla`` for ``auto`` and
    a branch that lowers to that error otherwise (so another platform's branch never fails
    the trace)."""
    def branch(*args):
        try:
            return fn(*args).astype(out.dtype)
        except AttentionError:
            raise
        except Exception as e:  # noqa: BLE001 - the kernel's own checks, reported at lowering
            if option == "auto":
                return xla(*args)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return _unsupported(option, f"the kernel refused these shapes ({msg[:300]})", out)(*args)
    return branch


def shape_refusal(platform: str, mode: str, q_len: int, kv_len: int) -> str | None:
    """Why the ``platform`` kernel of ``mode`` cannot take these lengths (None: it can).

    TPU flash / splash training and prefill: the backward kernels tile keys by 128 (flash's
    ``MIN_BLOCK_SIZE``; a shorter block fails inside the kernel's trace, after the forward
    was chosen), so the sequence must be a multiple of 128. Triton (prefill / training):
    blocks of min(64, T) positions must tile T. Decode: the cache length a multiple of the
    key block (min(128, S))."""
    if mode == "forward" and platform == "tpu" and q_len % BLOCK:
        return f"the TPU kernels tile the sequence by {BLOCK}; seq_len={q_len} is not a multiple"
    if mode == "forward" and platform == "cuda" and q_len % min(64, q_len):
        return f"the Triton kernel tiles the sequence by 64; seq_len={q_len} is not a multiple"
    if mode == "decode" and kv_len % _block(kv_len):
        return f"the kernels tile the cache by {BLOCK} positions; seq_len={kv_len} is not a multiple"
    return None


def _dispatch(option: str, mode: str, kernels: dict, xla, args, out: jax.ShapeDtypeStruct,
              lengths: tuple[int, int]):
    """``platform_dependent`` over ``kernels`` {platform: fn}; ``auto`` falls back to ``xla``
    elsewhere, an explicit option lowers to ``AttentionError`` elsewhere (and where
    ``shape_refusal`` refuses the lengths)."""
    branches = {}
    for plat in _PLATFORMS:
        refused = shape_refusal(plat, mode, *lengths) if plat in kernels else None
        if refused and option == "auto":
            branches[plat] = xla
        elif refused:
            branches[plat] = _unsupported(option, refused, out)
        elif plat in kernels:
            branches[plat] = _guarded(option, kernels[plat], out, xla)
        elif option == "auto":
            branches[plat] = xla
        else:
            have = ", ".join(_WHAT[p] for p in KERNELS[option][mode]) or "no platform"
            branches[plat] = _unsupported(option, f"the {option} kernel is written for {have} "
                                          f"({'decode' if mode == 'decode' else 'prefill / training'})",
                                          out)
    return jax.lax.platform_dependent(*args, **branches)


def _sharded(fn, args: tuple, q_spec):
    """``fn(q, k, v, *rest)`` per device in ``shard_map`` when a plan splits the cache
    ``k`` [B, Hkv, S, D] (its ``CACHE_AXES`` layout) over batch and kv heads only; the
    queries take the matching split (``q_spec(batch part, kv-head part)``: a query head's
    block of heads goes with its kv heads'), the rest is replicated. Without a plan, or when
    the plan splits the sequence or head dim, ``fn(*args)`` on whole arrays (XLA:GPU
    replicates the kernel's operands); on a TPU mesh of several devices XLA cannot partition a
    Mosaic kernel ("Mosaic kernels cannot be automatically partitioned"), so there the kernel
    runs in ``shard_map`` over what the plan splits of batch and kv heads, on the whole
    sequence (XLA all-gathers the cache's sequence split), or replicated."""
    from .transformer import CACHE_AXES
    k = args[1]
    s = logical_sharding_of(CACHE_AXES, tuple(k.shape))
    if not isinstance(s, jax.sharding.NamedSharding):
        return fn(*args)
    spec = tuple(s.spec) + (None,) * (4 - len(s.spec))
    pb, ph, ps, pd = spec
    if ps is not None or pd is not None or (pb is None and ph is None):
        devices = getattr(s.mesh, "devices", None)
        if s.mesh.size == 1 or devices is None or devices.flat[0].platform != "tpu":
            return fn(*args)
    P = jax.sharding.PartitionSpec
    cache = P(pb, ph, None, None)
    specs = (q_spec(pb, ph), cache, cache) + (P(),) * (len(args) - 3)
    return jax.shard_map(fn, mesh=s.mesh, in_specs=specs, out_specs=specs[0], check_vma=False)(*args)


def _block(n: int) -> int:
    return min(BLOCK, n)


def _decode_block(s: int) -> int:
    """Keys per grid step of the TPU flash decode: ``DECODE_BLOCK`` or the cache length when
    shorter, halved (down to 128) until it divides the cache length."""
    b = min(DECODE_BLOCK, s)
    while b > BLOCK and s % b:
        b //= 2
    return b


# ---------------------------------------------------------------------------- training / prefill

def _repeat_heads(x, g):
    """[B, Hkv, T, D] -> [B, Hkv * g, T, D] (each kv head for its g query heads)."""
    return x if g == 1 else jnp.repeat(x, g, axis=1)


def _tpu_flash_forward(q, k, v, scale):
    """q [B, T, H, D], k/v [B, Hkv, T, D] -> [B, T, H, D]; TPU flash_attention, causal."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa
    t = q.shape[1]
    g = q.shape[2] // k.shape[1]
    b = _block(t)
    bs = fa.BlockSizes(block_q=b, block_k_major=b, block_k=b, block_b=1,
                       block_q_major_dkv=b, block_k_major_dkv=b, block_k_dkv=b, block_q_dkv=b,
                       block_k_major_dq=b, block_k_dq=b, block_q_dq=b)
    o = fa.flash_attention(q.transpose(0, 2, 1, 3), _repeat_heads(k, g), _repeat_heads(v, g),
                           causal=True, sm_scale=scale, block_sizes=bs)
    return o.transpose(0, 2, 1, 3)


def _triton_shapes_ok(**dims: int) -> None:
    """Raise ValueError naming each of ``dims`` that is not a power of 2: Pallas Triton lowers
    only power-of-2 block shapes (jax 0.10.2, ``pallas/triton/lowering.py``: "currently
    requires ... power of 2"), and it refuses them when the program is lowered, after the
    platform branch was traced, so ``_guarded`` could not fall back to XLA's form (``auto``)
    and the capture failed with an internal error. Raised while tracing, ``_guarded`` takes
    XLA's form for ``auto`` and gives an explicit option a one-line error."""
    bad = [f"{k}={v}" for k, v in dims.items() if v <= 0 or v & (v - 1)]
    if bad:
        raise ValueError("Pallas Triton needs power-of-2 block shapes; not a power of 2: " + ", ".join(bad))


def _triton_forward(q, k, v, scale):
    """q [B, T, H, D], k/v [B, Hkv, T, D] -> [B, T, H, D]; Pallas Triton mha, causal."""
    from jax.experimental.pallas.ops.gpu import attention as ga
    g = q.shape[2] // k.shape[1]
    kt = _repeat_heads(k, g).transpose(0, 2, 1, 3)
    vt = _repeat_heads(v, g).transpose(0, 2, 1, 3)
    t = q.shape[1]
    b = min(64, t)
    _triton_shapes_ok(block=b, head_dim=q.shape[3])
    bs = ga.BlockSizes(block_q=b, block_k=b, block_q_dkv=b, block_kv_dkv=b, block_q_dq=b, block_kv_dq=b)
    return ga.mha(q, kt, vt, segment_ids=None, sm_scale=scale, causal=True, block_sizes=bs)


def _splash_forward(q, k, v, scale):
    """q [B, T, H, D], k/v [B, Hkv, T, D] -> [B, T, H, D]; splash MQA kernel per (batch row,
    kv head) over its g query heads, causal mask."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    bsz, t, h, d = q.shape
    hkv = k.shape[1]
    g = h // hkv
    mask = sm.MultiHeadMask([sm.CausalMask((t, t)) for _ in range(g)])
    b = _block(t)
    bs = sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b, block_kv_dkv=b,
                       block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
    kern = sk.make_splash_mqa(mask, block_sizes=bs, head_shards=1, q_seq_shards=1)
    qg = (q * jnp.asarray(scale, q.dtype)).reshape(bsz, t, hkv, g, d).transpose(0, 2, 3, 1, 4)
    o = jax.vmap(jax.vmap(kern))(qg, k, v)                       # [B, Hkv, g, T, D]
    return o.transpose(0, 3, 1, 2, 4).reshape(bsz, t, h, d)


def _cudnn_forward(q, k, v, scale):
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    return _cudnn(lambda: jax.nn.dot_product_attention(q, kt, vt, scale=scale, is_causal=True,
                                                       implementation="cudnn"))


def _cudnn(call):
    try:
        return call()
    except RuntimeError as e:  # jax's trace-time check of the cuDNN library
        raise AttentionError(
            f"--set attention=cudnn: jax.nn.dot_product_attention(implementation='cudnn') needs the "
            f"cuDNN library when it traces the call and XLA:GPU needs it to compile the fused "
            f"attention ({str(e).strip()[:200]}); a deviceless compile with the CUDA plugin alone has "
            f"none: use attention=flash (the Pallas Triton kernel)") from None


def forward(option: str, q, k, v, scale: float, xla):
    """Causal attention of the queries q [B, T, H, D] over k/v [B, Hkv, T, D] -> [B, T, H, D]
    with ``option`` (``xla(q, k, v)`` the XLA form)."""
    if option == "xla":
        return xla(q, k, v)
    if option == "cudnn":
        kernels = {"cuda": functools.partial(_cudnn_forward, scale=scale)}
        _cudnn_forward(q, k, v, scale)  # the cuDNN check, whichever the target (it raises at trace)
    elif option == "splash":
        kernels = {"tpu": functools.partial(_splash_forward, scale=scale)}
    elif option in ("flash", "auto"):
        kernels = {"tpu": functools.partial(_tpu_flash_forward, scale=scale),
                   "cuda": functools.partial(_triton_forward, scale=scale)}
    else:
        raise AttentionError(f"--set attention={option}: no prefill / training kernel")

    def run(q, k, v):
        return _dispatch(option, "forward", kernels, xla, (q, k, v),
                         jax.ShapeDtypeStruct(q.shape, q.dtype), (q.shape[1], k.shape[2]))

    P = jax.sharding.PartitionSpec
    return _sharded(run, (q, k, v), lambda pb, ph: P(pb, None, ph, None))


# ---------------------------------------------------------------------------- decode

def _tpu_flash_decode(q, kc, vc, pos, scale):
    """q [B, Hkv, g, D] (the g query heads of each kv head as rows), cache [B, Hkv, S, D] ->
    [B, Hkv, g, D]; positions > pos masked with segment ids (queries 1, keys k <= pos)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa
    b, hkv, g, d = q.shape
    s = kc.shape[2]
    seg = fa.SegmentIds(q=jnp.ones((b, g), jnp.int32),
                        kv=jnp.broadcast_to((jnp.arange(s) <= pos).astype(jnp.int32), (b, s)))
    bk = _decode_block(s)
    bs = fa.BlockSizes(block_q=g, block_k_major=bk, block_k=bk, block_b=1)
    return fa.flash_attention(q, kc, vc, segment_ids=seg, causal=False, sm_scale=scale, block_sizes=bs)


def _triton_decode(q, kc, vc, pos, start=None, *, scale, softcap=None):
    """Pallas Triton ``decode_attention.mqa`` on [B * Hkv, g, D] queries over the cache viewed
    as [B * Hkv, S, D] (a reshape of [B, Hkv, S, D]: no copy), valid length pos + 1. With a
    score soft-cap or a window start (positions ``[start, pos]``; int32 scalar) the same
    kernel with soft-capping, ``models/triton_decode.py``."""
    from jax.experimental.pallas.ops.gpu import decode_attention as gd
    b, hkv, g, d = q.shape
    s = kc.shape[2]
    n = b * hkv
    lengths = jnp.broadcast_to(pos + 1, (n,)).astype(jnp.int32)
    bk = _block(s)
    _triton_shapes_ok(key_block=bk, head_dim=d, head_block=max(16, g))
    # split the positions only as far as needed for ~256 programs (two waves of an H100's 132
    # SMs): each split writes f32 partial outputs that XLA reads back to combine them
    splits = max(1, min(16, s // bk, -(-TRITON_DECODE_PROGRAMS // n)))
    while (s // bk) % splits:
        splits -= 1
    if softcap is not None or start is not None:
        from . import triton_decode
        starts = jnp.broadcast_to(0 if start is None else start, (n,)).astype(jnp.int32)
        o = triton_decode.mqa(q.reshape(n, g, d), kc.reshape(n, s, d), vc.reshape(n, s, d), starts,
                              lengths, sm_scale=scale, softcap=softcap, block_h=max(16, g),
                              block_k=bk, k_splits=splits)
        return o.reshape(b, hkv, g, d)
    o = gd.mqa(q.reshape(n, g, d), kc.reshape(n, s, d), vc.reshape(n, s, d), kv_seq_len=lengths,
               sm_scale=scale, block_h=max(16, g), block_k=bk, k_splits=splits)
    return o.reshape(b, hkv, g, d)


def _paged_decode(q, kc, vc, pos, scale):
    """TPU ``paged_attention`` with the identity page table (module docstring)."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention
    b, hkv, g, d = q.shape
    s = kc.shape[2]
    n = b * hkv
    page = min(PAGE_SIZE, s)
    if s % page:
        raise ValueError(f"seq_len={s} is not a multiple of the page size {page}")
    pages = s // page
    kp = kc.reshape(1, n * pages, page, d)
    vp = vc.reshape(1, n * pages, page, d)
    lengths = jnp.broadcast_to(pos + 1, (n,)).astype(jnp.int32)
    table = jnp.arange(n * pages, dtype=jnp.int32).reshape(n, pages)
    per_block = math.gcd(pages, PAGES_PER_BLOCK)
    qs = (q * jnp.asarray(scale, q.dtype)).reshape(n, g, d)
    o = paged_attention(qs, kp, vp, lengths, table, pages_per_compute_block=per_block)
    return o.reshape(b, hkv, g, d)


def _cudnn_decode(q, kc, vc, pos, scale):
    b, hkv, g, d = q.shape
    qt = q.reshape(b, 1, hkv * g, d)
    lengths = jnp.broadcast_to(pos + 1, (b,)).astype(jnp.int32)
    o = _cudnn(lambda: jax.nn.dot_product_attention(
        qt, kc.transpose(0, 2, 1, 3), vc.transpose(0, 2, 1, 3), scale=scale,
        key_value_seq_lengths=lengths, implementation="cudnn"))
    return o.reshape(b, hkv, g, d)


def decode(option: str, qg, kc, vc, pos, scale: float, xla, softcap: float | None = None, start=None):
    """One query per head: qg [B, Hkv, g, D] (queries grouped by kv head) over the updated
    cache kc/vc [B, Hkv, S, D], positions <= pos -> [B, Hkv, g, D] with ``option``
    (``xla(qg, kc, vc, pos, *rest)`` the XLA form).

    ``softcap`` (scores ``cap * tanh(s / cap)``) and ``start`` (an int32 scalar: positions
    before it masked, a sliding window) are computed by the GPU kernel of ``auto`` only
    (``models/triton_decode.py``); elsewhere ``auto`` is the XLA form, which must apply them."""
    extra = () if start is None else (start,)
    if option == "xla":
        return xla(qg, kc, vc, pos, *extra)
    if softcap is not None or start is not None:
        if option != "auto":
            raise AttentionError(f"--set attention={option}: the kernels compute causal softmax "
                                 "attention without score soft-capping or a sliding window")
        kernels = {"cuda": functools.partial(_triton_decode, scale=scale, softcap=softcap)}
    elif option == "cudnn":
        kernels = {"cuda": functools.partial(_cudnn_decode, scale=scale)}
        _cudnn_decode(qg, kc, vc, pos, scale)
    elif option == "paged":
        kernels = {"tpu": functools.partial(_paged_decode, scale=scale)}
    elif option in ("flash", "auto"):
        kernels = {"tpu": functools.partial(_tpu_flash_decode, scale=scale),
                   "cuda": functools.partial(_triton_decode, scale=scale)}
    else:
        raise AttentionError(f"--set attention={option}: no decode kernel")

    def run(qg, kc, vc, pos, *rest):
        return _dispatch(option, "decode", kernels, xla, (qg, kc, vc, pos, *rest),
                         jax.ShapeDtypeStruct(qg.shape, qg.dtype), (1, kc.shape[2]))

    P = jax.sharding.PartitionSpec
    return _sharded(run, (qg, kc, vc, pos, *extra), lambda pb, ph: P(pb, ph, None, None))


def _triton_mla(ql, qr, cc, rc, pos, *, scale):
    """``models/triton_decode.mla`` on ql [B, H, r], qr [B, H, dr] over cc [B, S, r],
    rc [B, S, dr], valid length pos + 1; position splits as ``_triton_decode``'s."""
    from . import triton_decode
    b, h, _ = ql.shape
    s = cc.shape[1]
    bk = min(32, s)
    # every head of a sequence in one block where it fits (each block of heads reads the
    # cache again): up to 64, FlashMLA's block, with 8 warps for its [64, r] f32 accumulator
    bh = max(16, min(MLA_BLOCK_HEADS, 1 << (h - 1).bit_length()))
    _triton_shapes_ok(key_block=bk, latent_dim=ql.shape[-1], rope_dim=qr.shape[-1])
    splits = max(1, min(16, s // bk, -(-TRITON_DECODE_PROGRAMS // (b * -(-h // bh)))))
    while (s // bk) % splits:
        splits -= 1
    lengths = jnp.broadcast_to(pos + 1, (b,)).astype(jnp.int32)
    if cc.shape[-1] == ql.shape[-1] + qr.shape[-1]:   # one merged cache [c_kv | k_rope]: rc is cc
        rc = None
    return triton_decode.mla(ql, qr, cc, rc, lengths, sm_scale=scale, block_h=bh, block_k=bk, k_splits=splits,
                             num_warps=4 if bh <= 16 else 8)


#: positions per grid step of the TPU latent-attention kernel: a [2048, 576] bf16 block of the
#: merged DeepSeek cache is 2.25 MiB (double-buffered, with the [H, 2048] f32 scores, well in
#: the 16 MiB of scoped VMEM); fewer, larger steps amortise the ~0.35 us per grid step
TPU_MLA_BLOCK = 2048


def _tpu_mla(ql, qr, cc, rc, pos, *, scale):
    """``models/tpu_decode.mla`` (Pallas TPU) on ql [B, H, r], qr [B, H, dr] over the merged
    cache cc [B, S, r + dr] (``rc`` is ``cc``), positions <= pos; the key block the largest
    power of two <= ``TPU_MLA_BLOCK`` dividing S. Raises ValueError for a split cache (int8
    KV: two arrays) or S not a multiple of 128 (``auto`` then takes the XLA form)."""
    from . import tpu_decode
    if cc.shape[-1] != ql.shape[-1] + qr.shape[-1]:
        raise ValueError("the TPU latent kernel reads the merged cache [c_kv | k_rope] only")
    s = cc.shape[1]
    bk = TPU_MLA_BLOCK
    while bk > 128 and s % bk:
        bk //= 2
    return tpu_decode.mla(ql, qr, cc, pos, sm_scale=scale, block_k=bk)


def mla_decode(option: str, ql, qr, cc, rc, pos, scale: float, xla, shardings=None):
    """Absorbed latent attention of one query per head (``transformer.MLAttention.decode``):
    ql [B, H, r], qr [B, H, dr] over the latent cache cc [B, S, r] and rope keys rc [B, S, dr]
    (or the merged cache cc [B, S, r + dr], passed as rc too), positions <= pos -> [B, H, r] in
    ql's dtype. ``auto``: the Triton kernel on CUDA (``models/triton_decode.mla``), the Pallas
    TPU kernel on TPU for the merged cache (``models/tpu_decode.mla``: each cache block read
    once for the scores and the output; XLA's form reads the cache twice), ``xla(ql, qr, cc,
    rc, pos)`` elsewhere.

    Under a plan the kernel runs per device in ``shard_map``: heads as the plan splits them,
    the cache and queries split alike over batch; a plan that splits the cache's length or
    latent dim calls it on whole arrays. ``shardings`` (query, cache ``NamedSharding``) gives
    the layouts instead of the plan's ``batch, heads`` / ``batch, length`` ones (DP attention:
    ``transformer._latent_shardings``)."""
    if option == "xla":
        return xla(ql, qr, cc, rc, pos)
    if option != "auto":
        raise AttentionError(f"--set attention={option}: no kernel computes latent attention")
    kernels = {"cuda": functools.partial(_triton_mla, scale=scale),
               "tpu": functools.partial(_tpu_mla, scale=scale)}

    def run(ql, qr, cc, rc, pos):
        return _dispatch(option, "decode", kernels, xla, (ql, qr, cc, rc, pos),
                         jax.ShapeDtypeStruct(ql.shape, ql.dtype), (1, cc.shape[1]))

    if shardings is not None:
        sq, sc = shardings
    else:
        sq = logical_sharding_of(("batch", "heads", None), tuple(ql.shape))
        sc = logical_sharding_of(("batch", "length", None), tuple(cc.shape))
    if not isinstance(sq, jax.sharding.NamedSharding) or not isinstance(sc, jax.sharding.NamedSharding):
        return run(ql, qr, cc, rc, pos)
    qb, qh, qd = tuple(sq.spec) + (None,) * (3 - len(sq.spec))
    cb, cs, cd = tuple(sc.spec) + (None,) * (3 - len(sc.spec))
    if qd is not None or cs is not None or cd is not None or qb != cb:
        return run(ql, qr, cc, rc, pos)
    P = jax.sharding.PartitionSpec
    q, c = P(qb, qh, None), P(cb, None, None)
    return jax.shard_map(run, mesh=sq.mesh, in_specs=(q, q, c, c, P()), out_specs=q,
                         check_vma=False)(ql, qr, cc, rc, pos)


__all__ = ["ATTENTION", "AttentionError", "KERNELS", "attention_name", "check_mode", "decode",
           "forward", "mla_decode", "unsupported_feature"]
