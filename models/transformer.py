"""Llama-class decoders in Flax NNX: Llama-3, Mixtral, DeepSeek-V3-style MoE, Gemma-2.

One configurable decoder (``TransformerConfig``) covers the four families; the presets in
``jaxmove.zoo`` set the published dimensions.

Block (pre-norm; Touvron et al. 2023 "LLaMA", Dubey et al. 2024 "The Llama 3 Herd of
Models" Table 3)::

    h = x + Attention(RMSNorm(x))          # Gemma-2: x + RMSNorm_post(Attention(RMSNorm(x)))
    y = h + FFN(RMSNorm(h))                # Gemma-2: h + RMSNorm_post(FFN(RMSNorm(h)))

- RMSNorm (Zhang & Sennrich 2019): ``x * rsqrt(mean(x^2) + eps) * scale`` in float32;
  Gemma-2 multiplies by ``1 + scale``.
- Rotary position embeddings (Su et al. 2021, "RoFormer"), the rotate-half layout of
  Hugging Face ``LlamaRotaryEmbedding``; inverse frequencies ``theta^(-2i/D)``, with the
  Llama-3.1 long-context scaling (``rope_scaling`` = (factor, low_freq_factor,
  high_freq_factor, original_max_position), HF ``_compute_llama3_parameters``).
- Grouped-query attention (Ainslie et al. 2023): ``kv_heads`` divides ``heads``.
  Gemma-2 (Gemma Team 2024, "Gemma 2", section 2): even layers attend within a sliding
  window of ``sliding_window`` positions, odd layers globally; scores are soft-capped
  ``cap * tanh(s / cap)`` (``attn_softcap``) and so are the final logits
  (``final_softcap``); queries are scaled by ``query_scale ** -0.5``.
- Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", section 2.1; "DeepSeek-V3"
  section 2.1) when ``kv_lora_rank`` is set: q = W_qb RMSNorm(W_qa x); the cache holds the
  compressed ``c_kv`` [B, S, kv_lora_rank] and the shared rotary key ``k_rope``
  [B, S, qk_rope_dim], in one [B, S, kv_lora_rank + qk_rope_dim] array (below). Prefill
  expands keys and values per head; decode uses the absorbed form (queries projected into the
  latent space, attention over ``c_kv`` directly).
  YaRN scaling and the MTP module are left out.
- FFN: SwiGLU ``down(silu(gate x) * up x)`` (Shazeer 2020), GeGLU (tanh gelu) for Gemma-2;
  or a routed mixture of experts (``experts`` > 0): top-``top_k`` of ``experts`` SwiGLU
  experts of width ``expert_d_ff``, plus ``shared_experts`` always-on experts (one SwiGLU
  of width ``shared_experts * expert_d_ff``, DeepSeekMoE, Dai et al. 2024), routed with
  softmax-then-top-k renormalised (Mixtral, Jiang et al. 2024) or sigmoid scores with a
  selection bias, normalised and scaled by ``routed_scale`` (DeepSeek-V3 eq. 12-16; the
  node-limited group routing is left out). Tokens reach experts through GShard's one-hot
  dispatch with capacity ``ceil(top_k * S * capacity_factor / experts)`` per batch row
  (see ``jaxmove.zoo.moe``); where a batch row's sequence fits one slot per expert (S <= C:
  decode) and no plan splits the experts, the slots are left out and every token goes
  through every expert with the gates on the hidden activations (same flops, no
  [E, B, C, d] token buffer, one all-reduce of [B, S, d] under tp); the first
  ``dense_layers`` layers have a dense FFN of width ``d_ff`` (DeepSeek-V3: 3).
- Untied LM head (Llama, Mixtral, DeepSeek) or tied to the embedding (Gemma-2, whose
  embeddings are also scaled by ``sqrt(d_model)``).

Weight-only quantization (``weights_dtype`` int8, int4 or float8_e4m3fn): every projection
kernel (attention, FFN, experts, LM head; not the embedding, norms or router) is stored in
that dtype with one scale per output channel in the model dtype (initialised 1 / qmax: int8
127, int4 7, e4m3 448), converted inside the matmul and scaled after it:
``(x @ kernel.astype(dtype)) * scale`` (the AQT / MaxText weight-only scheme; ``Dense``); MLA's
absorbed decode puts W_uk's scale on the queries (its channels are contracted there).
``act_dtype=fp8`` (with fp8 weights): the GEMM inputs are quantized per row to
float8_e4m3fn and each projection is an fp8 x fp8 dot with f32 accumulation
(``Dense.einsum``).
Quantized KV cache (``kv_dtype``): int8 keeps one scale per (position, kv head) in the
model dtype beside the cache (``k_scale``/``v_scale``, symmetric absmax / 127); float8
stores the values cast with a per-tensor scale of 1 (vLLM's ``kv_cache_dtype=fp8``
default), so no scale arrays.

KV cache layout (``[B, H_kv, S, D]``, heads before positions as ``jaxmove.zoo.gpt``)::

    unrolled: {"layers": [{"k_cache": [B,Hkv,S,D], "v_cache": ..., ("k_scale": [B,Hkv,S], ...)}]}
    scanned:  {"layers": {"k_cache": [L,B,Hkv,S,D], ...}}
    MLA:      "latent_cache" [B,S,r+dr]: c_kv then k_rope, one array (FlashMLA's layout: one
              score dot over r + dr); int8 KV keeps them apart, each with its scale:
              "c_kv_cache" [B,S,r], "k_rope_cache" [B,S,dr], "c_kv_scale", "k_rope_scale" [B,S]

Gemma 2's local layers (``sliding_window``, unrolled over one cache array per layer, the
decode presets' form) keep a ring of the window's last positions instead of ``seq_len``
(position ``p`` in slot ``p % sliding_window``; ``TransformerConfig.ring_length``), as serving
engines do (Hugging Face ``HybridCache``, vLLM): a local layer then reads and holds only its
window (Gemma 2 9B, batch 32, 8192 context: 63 GiB of KV instead of 84); ``--set
window_cache=false`` keeps full-length caches with the window masked (scanned layers and
``stacked_cache`` always do: one array holds every layer's cache).

MLA's latent cache is one kv head that every query head attends with, and its batch dim is
named so (``LATENT_CACHE_AXES``: batch with a size-1 kv_heads dim folded in, plans step 4):
under ``tp`` the model axis, which cannot split one kv head, splits the cache over batch
instead (the plan's ``kv_heads`` fallback), as it does a GQA cache with fewer kv heads than
devices, and decode's latent attention runs batch-parallel over the model axis ("DP
attention", SGLang's DeepSeek serving layout): the absorbed queries move to the devices that
hold their rows' cache and the result moves back to the heads' split, two all-to-alls of
[B, H, r (+ dr)] per layer instead of a cache replicated on every device.

A model with ``dense_layers`` has a second stack ``dense_layers`` beside ``layers`` in the
parameters and the cache. Decode writes only the new entries with ``dynamic_update_slice``
(scanned layers: into the stacked cache carried by the loop) and attends over the updated
cache (positions <= pos), so the donated cache is updated in place.

Attention (``attention``, ``jaxmove.zoo.attention``): ``xla`` computes the scores with two
einsums around a masked softmax; ``flash`` / ``splash`` / ``paged`` / ``cudnn`` call a fused
kernel (Pallas TPU, Pallas Triton, cuDNN); ``auto`` picks the flash kernel where the lowering
platform has one and the model is one it computes, else ``xla``.

Name scopes (HLO ``op_name``): ``embed``, ``layers_<i>/{attn_norm,attn,mlp_norm,mlp|moe}``
(``layers/...`` when scanned), ``norm``, ``lm_head``. Parameters (``nnx.to_pure_dict``):
``embed/embedding`` [V, d]; per layer ``attn/{q,k,v,o}/kernel`` ([d, H, D], [d, Hkv, D],
[H, D, d]), MLA ``attn/{q_a,q_b,kv_a,kv_b,o}/kernel`` and ``attn/{q_norm,kv_norm}/scale``;
``mlp/{gate,up,down}/kernel``; ``moe/{router, router_bias, w_gate, w_up, w_down}`` and
``moe/shared/{gate,up,down}``; norms ``*/scale``; ``norm/scale``, ``lm_head/kernel``
[d, V]. Quantized kernels add ``.../scale`` of the kernel's output dims.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxmove.workload import Workload
from .gpt import DTYPES
from .attention import attention_name
from . import attention as attn_kernels
from .moe import _top_k
from .sharding import constrain, is_sharded, logical_sharding_of

# ----------------------------------------------------------------------------- dtypes

#: Spellings of the quantized storage dtypes (``weights_dtype``, ``kv_dtype``).
QUANT_DTYPES = {"int8": "int8", "s8": "int8", "fp8": "float8_e4m3fn", "f8": "float8_e4m3fn",
                "float8_e4m3fn": "float8_e4m3fn", "e4m3": "float8_e4m3fn"}
_NONE = ("none", "")


#: Weight-only storage dtypes beyond ``QUANT_DTYPES`` (not for the cache).
WEIGHT_ONLY_DTYPES = {"int4": "int4", "s4": "int4"}
#: Largest magnitude of each storage dtype: the symmetric absmax scale is max|x| / QMAX
#: (int8 127, int4 7; float8_e4m3fn 448, its largest finite value: Micikevicius et al.
#: 2022, "FP8 Formats for Deep Learning", Table 1).
QMAX = {"int8": 127.0, "int4": 7.0, "float8_e4m3fn": 448.0}


def weights_dtype_name(name: str | None) -> str | None:
    """``int8`` / ``int4`` / ``fp8`` (float8_e4m3fn) / ``none`` -> canonical name or None.

    Raises:
      ValueError: another name.
    """
    if name is None or str(name).lower() in _NONE:
        return None
    n = str(name).lower()
    try:
        return {**QUANT_DTYPES, **WEIGHT_ONLY_DTYPES}[n]
    except KeyError:
        raise ValueError(f"unknown weights_dtype {name!r}; expected int8, int4, fp8 or none") from None


def act_dtype_name(name: str | None) -> str | None:
    """``fp8`` (float8_e4m3fn activations into fp8 x fp8 GEMMs) / ``none`` -> name or None.

    Raises:
      ValueError: another name.
    """
    if name is None or str(name).lower() in _NONE:
        return None
    if QUANT_DTYPES.get(str(name).lower()) == "float8_e4m3fn":
        return "float8_e4m3fn"
    raise ValueError(f"unknown act_dtype {name!r}; expected fp8 or none")


def kv_dtype_name(name: str | None) -> str | None:
    """``int8`` / ``fp8`` / a float dtype (``bf16``, ``f32``, ``f16``) / ``none`` -> numpy name.

    Raises:
      ValueError: another name.
    """
    if name is None or str(name).lower() in _NONE:
        return None
    n = str(name).lower()
    if n in QUANT_DTYPES:
        return QUANT_DTYPES[n]
    if n in DTYPES:
        return jnp.dtype(DTYPES[n]).name
    raise ValueError(f"unknown kv_dtype {name!r}; expected int8, fp8 or one of {sorted(DTYPES)}")


#: ``remat`` policies: name -> jax.checkpoint policy (None: no rematerialisation).
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}



def remat_name(name: str) -> str:
    """A ``REMAT_POLICIES`` key (case-insensitive).

    Raises:
      ValueError: another name.
    """
    n = str(name).strip().lower()
    if n not in REMAT_POLICIES:
        raise ValueError(f"unknown remat {name!r}; expected one of {', '.join(REMAT_POLICIES)}")
    return n

# ----------------------------------------------------------------------------- config

_POSITIVE = ("vocab", "d_model", "heads", "kv_heads", "head_dim", "d_ff", "layers", "batch",
             "seq_len")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Configuration of the Llama-class decoder (module docstring).

    Sizes: ``vocab`` V, ``d_model`` d, ``heads`` H, ``kv_heads`` H_kv (None -> H),
    ``head_dim`` D (None -> d / H), ``d_ff`` (dense FFN width), ``layers`` L, ``batch`` B,
    ``seq_len`` S (prompt length of prefill and training, cache length of decode).
    ``dtype``: parameters, activations and (by default) cache. ``scan_layers``: stacked
    layer parameters run by one ``jax.lax.scan``. The other fields are described in the
    module docstring.

    Raises:
      ValueError: a size is not a positive int; ``heads`` does not divide ``d_model``
        (when ``head_dim`` is not given); ``kv_heads`` does not divide ``heads``;
        ``top_k`` > ``experts``; ``dense_layers`` > ``layers``; an unknown dtype,
        ``weights_dtype``, ``kv_dtype`` or ``remat`` name; an odd rotary dimension.
    """

    family: str = "llama"
    vocab: int = 256
    d_model: int = 64
    heads: int = 4
    kv_heads: int | None = None
    head_dim: int | None = None
    d_ff: int = 128
    layers: int = 2
    batch: int = 2
    seq_len: int = 16
    dtype: str = "float32"
    scan_layers: bool = False
    stacked_cache: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: tuple | None = None
    tie_embeddings: bool = False
    # Gemma-2
    activation: str = "silu"
    norm_plus_one: bool = False
    post_norms: bool = False
    embed_scale: bool = False
    sliding_window: int | None = None
    window_cache: bool = True
    attn_softcap: float | None = None
    final_softcap: float | None = None
    query_scale: float | None = None
    # mixture of experts
    experts: int = 0
    top_k: int = 2
    expert_d_ff: int | None = None
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float = 1.0
    router: str = "softmax"
    routed_scale: float = 1.0
    # multi-head latent attention (DeepSeek)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_dim: int = 64
    v_head_dim: int | None = None
    # quantization and training
    weights_dtype: str | None = None
    kv_dtype: str | None = None
    act_dtype: str | None = None
    remat: str = "none"
    # attention kernel (jaxmove.zoo.attention)
    attention: str = "xla"

    def __post_init__(self):
        from .gpt import canonical_dtype
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        if self.kv_heads is None:
            set_("kv_heads", self.heads)
        if self.head_dim is None and isinstance(self.heads, int) and self.heads > 0 \
                and isinstance(self.d_model, int):
            if self.d_model % self.heads:
                raise ValueError(f"heads={self.heads} must divide d_model={self.d_model} "
                                 "(head_dim = d_model / heads)")
            set_("head_dim", self.d_model // self.heads)
        if self.expert_d_ff is None:
            set_("expert_d_ff", self.d_ff)
        set_("dtype", canonical_dtype(self.dtype))
        set_("weights_dtype", weights_dtype_name(self.weights_dtype))
        set_("kv_dtype", kv_dtype_name(self.kv_dtype) or self.dtype)
        set_("attention", attention_name(self.attention))
        set_("act_dtype", act_dtype_name(self.act_dtype))
        if self.act_dtype and self.weights_dtype != "float8_e4m3fn":
            raise ValueError(f"act_dtype={self.act_dtype} quantizes the inputs of fp8 x fp8 GEMMs: it "
                             f"needs weights_dtype=fp8 (got {self.weights_dtype or 'none'})")
        for k in _POSITIVE + ("expert_d_ff",):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{k} must be a positive int, got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.mla and self.sliding_window is not None:   # (a key that would change nothing)
            raise ValueError(f"sliding_window={self.sliding_window}: latent attention (MLA) attends "
                             "over the whole cache; the zoo's local window is Gemma 2's")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} must not exceed experts={self.experts}")
        if self.dense_layers > self.layers:
            raise ValueError(f"dense_layers={self.dense_layers} must not exceed layers={self.layers}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"unknown remat {self.remat!r}; expected one of {', '.join(REMAT_POLICIES)}")
        if self.router not in ("softmax", "sigmoid"):
            raise ValueError(f"unknown router {self.router!r}; expected softmax or sigmoid")
        if self.activation not in ("silu", "gelu"):
            raise ValueError(f"unknown activation {self.activation!r}; expected silu or gelu")
        if self.rope_dim % 2:
            raise ValueError(f"the rotary dimension ({self.rope_dim}) must be even")

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_dim if self.mla else self.head_dim

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def capacity(self) -> int:
        """Expert slots per batch row: ceil(top_k * S * capacity_factor / experts) (GShard)."""
        return max(1, math.ceil(self.top_k * self.seq_len * self.capacity_factor / self.experts))

    def local_layer(self, i: int) -> bool:
        """Layer ``i`` attends within ``sliding_window`` (Gemma-2: even layers, HF
        ``Gemma2DecoderLayer.is_sliding = not layer_idx % 2``)."""
        return self.sliding_window is not None and i % 2 == 0

    def ring_length(self, i: int) -> int | None:
        """Positions of layer ``i``'s cache when it is a ring of the last ``sliding_window``
        positions (position ``p`` in slot ``p % sliding_window``), else None (``seq_len``
        positions). A local layer keeps such a ring when ``window_cache`` and the layers are
        unrolled over one cache array each (scanned layers and ``stacked_cache`` stack every
        layer's cache in one array, so every layer keeps ``seq_len`` positions) and the window
        is shorter than the cache: what serving engines keep for Gemma 2's local layers (Hugging
        Face ``HybridCache``, vLLM's sliding-window KV cache)."""
        if not (self.window_cache and self.local_layer(i)) or self.scan_layers or self.stacked_cache:
            return None
        return self.sliding_window if self.sliding_window < self.seq_len else None


# ----------------------------------------------------------------------------- layers

# Logical axes of activations.
HIDDEN = ("batch", "length", "embed")
Q_AXES = ("batch", "length", "heads", "kv")
#: queries grouped by the kv head they attend with, [B, T, H_kv, H / H_kv, D]: laid out as the
#: cache is (under ``tp`` with more model devices than kv heads, split over batch like it)
GROUPED_Q_AXES = ("batch", "length", "kv_heads", None, "kv")
CACHE_AXES = ("batch", "kv_heads", "length", "kv")
#: MLA's latent cache [B, S, r] (and its scales [B, S]): one kv head, folded into batch
#: (module docstring), so split like a GQA cache with fewer kv heads than model devices; the
#: latent dim is never split (scores sum over it)
LATENT_BATCH = ("batch", "kv_heads")
LATENT_CACHE_AXES = (LATENT_BATCH, "length", None)
MLP_AXES = ("batch", "length", "mlp")
LOGITS_AXES = ("batch", "length", "vocab")


class Dense(nnx.Module):
    """A projection kernel, optionally weight-only quantized.

    ``kernel`` has ``shape``; ``in_dims`` are the dims contracted with the input; a
    quantized kernel has ``scale`` of ``shape`` without ``in_dims`` (one per output
    channel) in the model dtype. ``axes`` are the kernel's logical axes.
    """

    def __init__(self, shape: tuple, axes: tuple, cfg: TransformerConfig, *, rngs: nnx.Rngs,
                 in_dims: tuple = (0,), quantize: bool = True):
        assert len(shape) == len(axes)
        self.axes = tuple(axes)
        self.in_dims = tuple(in_dims)
        self.dtype = cfg.jnp_dtype
        q = cfg.weights_dtype if quantize else None
        if q is None:
            fan_in = math.prod(shape[i] for i in in_dims)
            init = nnx.initializers.normal(fan_in ** -0.5)
            self.kernel = nnx.Param(init(rngs.params(), shape, self.dtype))
        else:
            self.kernel = nnx.Param(jnp.zeros(shape, jnp.dtype(q)))
            out_shape = tuple(s for i, s in enumerate(shape) if i not in self.in_dims)
            self.scale = nnx.Param(jnp.full(out_shape, 1.0 / QMAX[q], self.dtype))
        self.act_fp8 = cfg.act_dtype is not None and q == "float8_e4m3fn"

    def weight(self) -> jax.Array:
        """The kernel in the model dtype (dequantized: ``kernel * scale`` per channel)."""
        w = constrain(self.kernel[...], self.axes)
        if "scale" in vars(self):
            out_axes = tuple(a for i, a in enumerate(self.axes) if i not in self.in_dims)
            s = constrain(self.scale[...], out_axes)
            w = w.astype(self.dtype) * jnp.expand_dims(s, self.in_dims)
        return w

    def __call__(self, x: jax.Array) -> jax.Array:
        """Contract the last ``len(in_dims)`` dims of x with the kernel's leading dims.

        A quantized kernel is converted to the model dtype inside the matmul and its
        per-output-channel scale multiplies the result (``(x @ q) * s == x @ (q * s)``, the
        AQT / MaxText order): XLA:GPU then fuses the int8/fp8 -> bf16 convert into its
        Triton gemm and no dequantized copy of the weight reaches HBM (scaling the kernel
        first, XLA:GPU wrote the bf16 weight to HBM and read it back: 2.5 bytes per weight
        moved for 1)."""
        n = len(self.in_dims)
        if "scale" not in vars(self) or self.in_dims != tuple(range(n)):
            return jnp.tensordot(x, self.weight(), axes=n)
        letters = "abcdefghijklmnopqrstuvwxyz"
        xs = letters[:x.ndim]
        ks = xs[x.ndim - n:] + letters[x.ndim:x.ndim + self.kernel.ndim - n]
        return self.einsum(f"{xs},{ks}->{xs[:x.ndim - n]}{ks[n:]}", x)

    def _scale_on(self, out_spec: str, kernel_spec: str) -> jax.Array:
        """The per-channel scale broadcast onto an einsum output with letters ``out_spec``
        (the kernel's letters ``kernel_spec``; its non-contracted dims are the scale's)."""
        out_axes = tuple(a for i, a in enumerate(self.axes) if i not in self.in_dims)
        s = constrain(self.scale[...], out_axes)
        s_letters = "".join(c for i, c in enumerate(kernel_spec) if i not in self.in_dims)
        order = [c for c in out_spec if c in s_letters]
        s = jnp.transpose(s, [s_letters.index(c) for c in order])
        return s.reshape([s.shape[order.index(c)] if c in order else 1 for c in out_spec])

    def einsum(self, spec: str, x: jax.Array) -> jax.Array:
        """``jnp.einsum(spec, x, kernel)`` with a quantized kernel converted inside the matmul and
        its per-channel scale multiplied onto the result (``Dense.__call__``); every scale
        dim must be an output dim of ``spec``.

        ``act_dtype=fp8`` (an fp8 kernel): x is quantized per row to float8_e4m3fn (scale
        max|x| / 448 over the contracted dims, in f32) and the dot is fp8 x fp8 with f32
        accumulation, rescaled by both scales (the DeepSeek-V3 / Transformer Engine recipe
        with per-token activation scales: DeepSeek-AI 2024, "DeepSeek-V3", section 3.3.2)."""
        ins, out = spec.split("->")
        xspec, kspec = ins.split(",")
        if "scale" not in vars(self):
            return jnp.einsum(spec, x, constrain(self.kernel[...], self.axes))
        q = constrain(self.kernel[...], self.axes)
        if not self.act_fp8:
            return jnp.einsum(spec, x, q.astype(self.dtype)) * self._scale_on(out, kspec)
        contracted = tuple(i for i, c in enumerate(xspec) if c not in out)
        x32 = x.astype(jnp.float32)
        sx = jnp.maximum(jnp.max(jnp.abs(x32), axis=contracted, keepdims=True), 1e-12) / QMAX[q.dtype.name]
        xq = (x32 / sx).astype(q.dtype)
        y = jnp.einsum(spec, xq, q, preferred_element_type=jnp.float32)
        sx_out = jnp.squeeze(sx, contracted)
        kept = "".join(c for i, c in enumerate(xspec) if i not in contracted)
        sx_out = jnp.einsum(f"{kept}->{''.join(c for c in out if c in kept)}", sx_out)
        sx_out = sx_out.reshape([sx_out.shape[[c for c in out if c in kept].index(c)] if c in kept else 1
                                 for c in out])
        return (y * sx_out * self._scale_on(out, kspec).astype(jnp.float32)).astype(self.dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, cfg: TransformerConfig, *, eps: float | None = None):
        self.eps = cfg.norm_eps if eps is None else eps
        self.plus_one = cfg.norm_plus_one
        init = jnp.zeros if cfg.norm_plus_one else jnp.ones
        self.scale = nnx.Param(init((dim,), cfg.jnp_dtype))

    def __call__(self, x, axes=HIDDEN):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        s = constrain(self.scale[...], axes[-1:]).astype(jnp.float32)
        y = y * (1.0 + s if self.plus_one else s)
        return constrain(y.astype(x.dtype), axes)


def inv_frequencies(cfg: TransformerConfig) -> np.ndarray:
    """float32 [rope_dim / 2]: theta^(-2i/D), Llama-3.1-scaled when ``rope_scaling`` is set
    (HF ``modeling_rope_utils._compute_llama3_parameters``)."""
    d = cfg.rope_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if cfg.rope_scaling:
        factor, low, high, orig = cfg.rope_scaling
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > orig / low, inv / factor, inv)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= orig / high) & (wavelen <= orig / low)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


def rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate-half rotary embedding of x [B, T, H, D] (or [B, T, D]) at positions [T]."""
    ang = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]   # [T, D/2]
    if x.ndim == 4:
        ang = ang[:, None, :]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def _softcap(s, cap):
    return s if cap is None else cap * jnp.tanh(s / cap)


def quantize_kv(x: jax.Array, kv_dtype, scale_dtype) -> tuple[jax.Array, jax.Array | None]:
    """Cache entries in ``kv_dtype``: int8 symmetric absmax over the last dim (scale
    ``max|x| / 127`` in ``scale_dtype``); float8 and float dtypes a plain cast (scale None)."""
    if jnp.dtype(kv_dtype) != jnp.int8:
        return x.astype(kv_dtype), None
    x32 = x.astype(jnp.float32)
    s = jnp.maximum(jnp.max(jnp.abs(x32), axis=-1), 1e-8) / 127.0
    q = jnp.clip(jnp.round(x32 / s[..., None]), -127, 127).astype(jnp.int8)
    return q, s.astype(scale_dtype)


def dequantize_kv(q: jax.Array, s: jax.Array | None, dtype) -> jax.Array:
    if s is None:
        return q.astype(dtype)
    return q.astype(dtype) * s[..., None].astype(dtype)


def _masked_softmax_parts(scores, mask):
    """(softmax over the last axis of f32 ``scores`` where ``mask``, None)."""
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores, axis=-1), None


def _local_mask(q_pos, k_pos, local, window):
    """bool [T, S]: causal (k <= q), and within ``window`` when ``local`` (traced or bool)."""
    causal = k_pos[None, :] <= q_pos[:, None]
    if window is None:
        return causal
    near = (q_pos[:, None] - k_pos[None, :]) < window
    return causal & (near | jnp.logical_not(local))


class Attention(nnx.Module):
    """Grouped-query attention with RoPE (Llama, Mixtral, Gemma-2)."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, h, hkv, hd = cfg.d_model, cfg.heads, cfg.kv_heads, cfg.head_dim
        self.q = Dense((d, h, hd), ("embed", "heads", "kv"), cfg, rngs=rngs)
        self.k = Dense((d, hkv, hd), ("embed", "kv_heads", "kv"), cfg, rngs=rngs)
        self.v = Dense((d, hkv, hd), ("embed", "kv_heads", "kv"), cfg, rngs=rngs)
        self.o = Dense((h, hd, d), ("heads", "kv", "embed"), cfg, rngs=rngs, in_dims=(0, 1))

    @property
    def _scale(self):
        c = self.cfg
        return (c.query_scale if c.query_scale else c.head_dim) ** -0.5

    def _qkv(self, x, positions):
        q = constrain(rope(self.q(x), positions, inv_frequencies(self.cfg)), Q_AXES)
        k = rope(self.k(x), positions, inv_frequencies(self.cfg))
        v = self.v(x)
        return (q, constrain(k.transpose(0, 2, 1, 3), CACHE_AXES),
                constrain(v.transpose(0, 2, 1, 3), CACHE_AXES))

    def _out(self, o):
        return constrain(self.o(constrain(o, Q_AXES)), HIDDEN)

    def forward(self, x, positions, local) -> tuple[jax.Array, dict]:
        """x [B, T, d] -> (y [B, T, d], cache entries of T positions in ``kv_dtype``)."""
        c = self.cfg
        q, k, v = self._qkv(x, positions)

        def xla(q, k, v):
            # shapes of the arrays it is given: per device when a plan's shard_map calls it
            b, t, h, d = q.shape
            hkv = k.shape[1]
            qg = q.reshape(b, t, hkv, h // hkv, d)
            s = jnp.einsum("btkgd,bksd->bkgts", qg, k, preferred_element_type=jnp.float32)
            s = _softcap(s * self._scale, c.attn_softcap)
            p, _ = _masked_softmax_parts(s, _local_mask(positions, positions, local, c.sliding_window))
            return jnp.einsum("bkgts,bksd->btkgd", p.astype(v.dtype), v).reshape(b, t, h, d)

        o = attn_kernels.forward(self._kernel, q, k, v, self._scale, xla)
        return self._out(o), self._entries(k, v)

    @property
    def _kernel(self) -> str:
        """``cfg.attention``; ``auto`` is ``xla`` where the kernels cannot compute the model."""
        c = self.cfg
        if c.attention != "auto":
            return c.attention
        return "xla" if attn_kernels.unsupported_feature(c) else "auto"

    @property
    def _decode_kernel(self) -> str:
        """``_kernel`` for decode: ``auto`` is ``xla`` over a quantized cache (the kernels
        read the cache in the model dtype)."""
        c = self.cfg
        quantized = jnp.dtype(c.kv_dtype) != c.jnp_dtype
        if c.attention == "auto" and not c.mla:
            # soft-capping and a sliding window: the GPU decode kernel computes them
            # (models/triton_decode.py); other platforms take the XLA form
            return "xla" if quantized else "auto"
        return "xla" if self._kernel == "auto" and quantized else self._kernel

    def _entries(self, k, v) -> dict:
        c = self.cfg
        kq, ks = quantize_kv(k, c.kv_dtype, c.jnp_dtype)
        vq, vs = quantize_kv(v, c.kv_dtype, c.jnp_dtype)
        out = {"k_cache": kq, "v_cache": vq}
        if ks is not None:
            out.update(k_scale=ks, v_scale=vs)
        return out

    def decode(self, x, write, pos, local, ring=None) -> jax.Array:
        """One step. x [B, 1, d]; ``write(entries) -> cache``: stores this step's entries
        ([B, Hkv, 1, D], in ``kv_dtype``) at ``pos`` (``pos % ring`` in a ring cache) and
        returns this layer's updated cache ([B, Hkv, S, D], S = ``ring`` in a ring cache); pos
        int32 scalar; ``ring``: the cache is a ring of the last ``ring`` positions
        (``TransformerConfig.ring_length``): every filled slot is inside the window, so
        attention reads slots ``<= min(pos, ring - 1)`` with no window mask. Returns y
        [B, 1, d].

        Attention reads the updated cache (the form XLA:CPU, XLA:GPU and XLA:TPU update in
        place: reading the old cache beside the update makes XLA:CPU copy each donated
        cache first). The queries are grouped by kv head and laid out as the cache is."""
        c = self.cfg
        positions = jnp.reshape(pos, (1,)).astype(jnp.int32)
        q, k, v = self._qkv(x, positions)
        cache = write(self._entries(k, v))
        b, t, h, d = q.shape
        hkv = k.shape[1]
        kc = constrain(dequantize_kv(cache["k_cache"], cache.get("k_scale"), k.dtype), CACHE_AXES)
        vc = constrain(dequantize_kv(cache["v_cache"], cache.get("v_scale"), v.dtype), CACHE_AXES)
        qg = constrain(q.reshape(b, t, hkv, h // hkv, d), GROUPED_Q_AXES)
        if ring is not None:   # the slots filled so far, all inside the window
            pos, local = jnp.minimum(pos, ring - 1), False
        if self._decode_kernel != "xla":   # the kernels' layout: [B, Hkv, g, D] (t = 1)
            start = None
            if c.sliding_window is not None:   # positions (pos - window, pos] in a local layer
                start = jnp.where(local, jnp.maximum(pos + 1 - c.sliding_window, 0), 0).astype(jnp.int32)
            o = attn_kernels.decode(self._decode_kernel, qg.reshape(b, hkv, h // hkv, d), kc, vc, pos,
                                    self._scale, lambda qg, kc, vc, pos, *_: self._xla_decode(
                                        qg[:, None], kc, vc, pos, local)[:, 0],
                                    softcap=c.attn_softcap, start=start)
            return self._out(o.reshape(b, t, h, d))
        return self._out(self._xla_decode(qg, kc, vc, pos, local).reshape(b, t, h, d))

    def _xla_decode(self, qg, kc, vc, pos, local):
        """The XLA form: qg [B, 1, Hkv, g, D] over kc/vc [B, Hkv, S, D] -> [B, 1, Hkv, g, D]."""
        c = self.cfg
        s = jnp.einsum("btkgd,bksd->bkgts", qg, kc, preferred_element_type=jnp.float32)
        s = _softcap(s * self._scale, c.attn_softcap)
        k_pos = jnp.arange(kc.shape[2])
        mask = (k_pos <= pos)[None, :]
        if c.sliding_window is not None:
            mask = mask & ((pos - k_pos < c.sliding_window) | jnp.logical_not(local))[None, :]
        p, _ = _masked_softmax_parts(s, mask)
        return jnp.einsum("bkgts,bksd->btkgd", p.astype(vc.dtype), vc)


def _latent_shardings(b: int, h: int, c_shape: tuple):
    """(query, cache) ``NamedSharding`` of absorbed MLA decode's [B, H, r] queries and
    [B, S, r] latent cache when the plan splits the latent cache (``LATENT_CACHE_AXES``) over
    mesh axes the queries (``Q_AXES``) do not split their batch over (``tp``'s kv_heads
    fallback: DP attention), else None (no plan, or the two agree)."""
    from .sharding import logical_sharding_of
    r = c_shape[-1]
    sc = logical_sharding_of(LATENT_CACHE_AXES, c_shape)
    sq = logical_sharding_of(("batch", "heads", None), (b, h, r))
    if not isinstance(sc, jax.sharding.NamedSharding) or not isinstance(sq, jax.sharding.NamedSharding):
        return None
    c_spec = tuple(sc.spec) + (None,) * 3
    # a cache split over batch beyond the queries, or over length (a batch the mesh axis does
    # not divide): its layout is kept, not gathered at the write
    if c_spec[0] == (tuple(sq.spec) + (None,))[0] and c_spec[1] is None and c_spec[2] is None:
        return None
    return logical_sharding_of((LATENT_BATCH, None, None), (b, h, r)), sc


class MLAttention(nnx.Module):
    """Multi-head latent attention (DeepSeek-V2/V3; module docstring)."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, h = cfg.d_model, cfg.heads
        r, dr, dn = cfg.kv_lora_rank, cfg.qk_rope_dim, cfg.head_dim
        dv = cfg.v_head_dim or cfg.head_dim
        if cfg.q_lora_rank:
            self.q_a = Dense((d, cfg.q_lora_rank), ("embed", None), cfg, rngs=rngs)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg, eps=1e-6)
            self.q_b = Dense((cfg.q_lora_rank, h, dn + dr), (None, "heads", "kv"), cfg, rngs=rngs)
        else:
            self.q_b = Dense((d, h, dn + dr), ("embed", "heads", "kv"), cfg, rngs=rngs)
        self.kv_a = Dense((d, r + dr), ("embed", None), cfg, rngs=rngs)
        self.kv_norm = RMSNorm(r, cfg, eps=1e-6)
        self.kv_b = Dense((r, h, dn + dv), (None, "heads", "kv"), cfg, rngs=rngs)
        self.o = Dense((h, dv, d), ("heads", "kv", "embed"), cfg, rngs=rngs, in_dims=(0, 1))
        self.dims = (r, dr, dn, dv)

    def _q(self, x, positions):
        r, dr, dn, dv = self.dims
        if "q_a" in vars(self):
            x = self.q_norm(self.q_a(x), ("batch", "length", None))
        q = constrain(self.q_b(x), Q_AXES)
        return q[..., :dn], rope(q[..., dn:], positions, inv_frequencies(self.cfg))

    def _latent(self, x, positions):
        r = self.dims[0]
        kv = self.kv_a(x)
        c = self.kv_norm(kv[..., :r], ("batch", "length", None))
        return c, rope(kv[..., r:], positions, inv_frequencies(self.cfg))           # [B,T,r], [B,T,dr]

    def _entries(self, c, kr) -> dict:
        cfg = self.cfg
        if jnp.dtype(cfg.kv_dtype) != jnp.int8:   # one latent cache [c_kv | k_rope] (cache_entry_shapes)
            merged, _ = quantize_kv(jnp.concatenate([c, kr.astype(c.dtype)], axis=-1), cfg.kv_dtype,
                                    cfg.jnp_dtype)   # (a float cache: a plain cast, no scale)
            return {"latent_cache": merged}
        cq, cs = quantize_kv(c, cfg.kv_dtype, cfg.jnp_dtype)
        rq, rs = quantize_kv(kr, cfg.kv_dtype, cfg.jnp_dtype)
        out = {"c_kv_cache": cq, "k_rope_cache": rq}
        if cs is not None:
            out.update(c_kv_scale=cs, k_rope_scale=rs)
        return out

    @property
    def _scale(self):
        return (self.dims[2] + self.dims[1]) ** -0.5

    def forward(self, x, positions, local):
        r, dr, dn, dv = self.dims
        q_nope, q_rope = self._q(x, positions)
        c, kr = self._latent(x, positions)
        kv = constrain(self.kv_b.einsum("btr,rhn->bthn", c), Q_AXES)
        k_nope, v = kv[..., :dn], kv[..., dn:]
        s = (jnp.einsum("bthn,bshn->bhts", q_nope, k_nope, preferred_element_type=jnp.float32)
             + jnp.einsum("bthp,bsp->bhts", q_rope, kr, preferred_element_type=jnp.float32))
        p, _ = _masked_softmax_parts(s * self._scale, _local_mask(positions, positions, local, None))
        o = jnp.einsum("bhts,bshv->bthv", p.astype(v.dtype), v)
        return constrain(self.o(constrain(o, Q_AXES)), HIDDEN), self._entries(c, kr)

    def decode(self, x, write, pos, local, ring=None):
        """Absorbed form: q_nope projected by W_uk into the latent space; attention over
        ``c_kv`` [B, S, r]; the result projected by W_uv. ``write`` as ``Attention.decode``."""
        r, dr, dn, dv = self.dims
        positions = jnp.reshape(pos, (1,)).astype(jnp.int32)
        q_nope, q_rope = self._q(x, positions)
        c, kr = self._latent(x, positions)
        cache = write(self._entries(c, kr))
        # the quantized kv_b kernel converted inside each matmul: W_uk's per-(head, dim) scale
        # on the queries (its dims are contracted), W_uv's on the result
        kb = self.kv_b
        w = constrain(kb.kernel[...], kb.axes).astype(c.dtype)
        w_uk, w_uv = w[..., :dn], w[..., dn:]
        kv_s = constrain(kb.scale[...], ("heads", "kv")).astype(c.dtype) if "scale" in vars(kb) else None
        if kv_s is not None:
            q_nope = q_nope * kv_s[:, :dn]
        ql = jnp.einsum("bthn,rhn->bthr", q_nope, w_uk)
        merged = "latent_cache" in cache
        if merged:   # [c_kv | k_rope] in one array (cache_entry_shapes), in the model dtype
            cc = rc = dequantize_kv(cache["latent_cache"], None, c.dtype)
        else:
            cc = dequantize_kv(cache["c_kv_cache"], cache.get("c_kv_scale"), c.dtype)
            rc = dequantize_kv(cache["k_rope_cache"], cache.get("k_rope_scale"), kr.dtype)
        # DP attention where the plan splits the latent cache over more of the batch than the
        # queries (module docstring): the queries move to the cache's layout, not the cache
        shardings = _latent_shardings(ql.shape[0], ql.shape[2], cc.shape)
        if shardings is not None:
            cc = constrain(cc, LATENT_CACHE_AXES)
            rc = cc if merged else constrain(rc, LATENT_CACHE_AXES)
            # the absorbed and rotary queries move together: one all-to-all, not two
            qa = constrain(jnp.concatenate([ql, q_rope.astype(ql.dtype)], axis=-1),
                           (LATENT_BATCH, None, None, None))
            ql, q_rope = qa[..., :ql.shape[-1]], qa[..., ql.shape[-1]:].astype(q_rope.dtype)
        def xla(ql, q_rope, cc, rc, pos):   # [B, H, r], [B, H, dr] (t = 1) -> [B, H, r]
            ql, q_rope = ql[:, None], q_rope[:, None]
            f32 = dict(preferred_element_type=jnp.float32)
            mask = (jnp.arange(cc.shape[1]) <= pos)[None, :]
            if merged:
                # one dot for the scores over [c_kv | k_rope] (r + dr), and one for the output,
                # whose last dr columns (the rope keys' products) are dropped: the score tensor is
                # written once (two dots plus their sum wrote and read it again: XLA:TPU, 16 MiB
                # per layer and device for DeepSeek-V3 at batch 2 x 8192 positions x 128 heads)
                qa = jnp.concatenate([ql, q_rope.astype(ql.dtype)], axis=-1)
                s = jnp.einsum("bthk,bsk->bhts", qa, cc, **f32)
                p, _ = _masked_softmax_parts(s * self._scale, mask)
                return jnp.einsum("bhts,bsk->bthk", p.astype(cc.dtype), cc)[:, 0, :, :r]
            s = jnp.einsum("bthr,bsr->bhts", ql, cc, **f32) + jnp.einsum("bthp,bsp->bhts", q_rope, rc, **f32)
            p, _ = _masked_softmax_parts(s * self._scale, mask)
            return jnp.einsum("bhts,bsr->bthr", p.astype(cc.dtype), cc)[:, 0]

        quantized = jnp.dtype(self.cfg.kv_dtype) != self.cfg.jnp_dtype
        # the latent kernel (GPU) reads the cache in the model dtype, as the other kernels
        option = "xla" if self.cfg.attention != "auto" or quantized else "auto"
        ol = attn_kernels.mla_decode(option, ql[:, 0], q_rope[:, 0], cc, rc, pos, self._scale, xla,
                                     shardings)[:, None]
        if shardings is not None:   # back to the heads' split for W_uv and the output projection
            ol = constrain(ol, Q_AXES)
        o = jnp.einsum("bthr,rhv->bthv", ol, w_uv)
        if kv_s is not None:
            o = o * kv_s[:, dn:]
        return constrain(self.o(constrain(o, Q_AXES)), HIDDEN)


class MLP(nnx.Module):
    """Gated FFN: down(act(gate x) * up x); act silu (SwiGLU) or tanh-gelu (GeGLU)."""

    def __init__(self, cfg: TransformerConfig, d_ff: int, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.act = cfg.activation
        self.gate = Dense((d, d_ff), ("embed", "mlp"), cfg, rngs=rngs)
        self.up = Dense((d, d_ff), ("embed", "mlp"), cfg, rngs=rngs)
        self.down = Dense((d_ff, d), ("mlp", "embed"), cfg, rngs=rngs)

    def __call__(self, x):
        g = self.gate(x)
        g = jax.nn.silu(g) if self.act == "silu" else jax.nn.gelu(g, approximate=True)
        h = constrain(g * self.up(x), MLP_AXES)
        return constrain(self.down(h), HIDDEN)


class MoE(nnx.Module):
    """Routed SwiGLU experts (+ shared experts); module docstring and ``jaxmove.zoo.moe``."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        e, d, f = cfg.experts, cfg.d_model, cfg.expert_d_ff
        self.router = nnx.Param(nnx.initializers.normal(d ** -0.5)(rngs.params(), (d, e), cfg.jnp_dtype))
        if cfg.router == "sigmoid":
            self.router_bias = nnx.Param(jnp.zeros((e,), jnp.float32))
        self.w_gate = Dense((e, d, f), ("expert", "embed", "mlp"), cfg, rngs=rngs, in_dims=(1,))
        self.w_up = Dense((e, d, f), ("expert", "embed", "mlp"), cfg, rngs=rngs, in_dims=(1,))
        self.w_down = Dense((e, f, d), ("expert", "mlp", "embed"), cfg, rngs=rngs, in_dims=(1,))
        if cfg.shared_experts:
            self.shared = MLP(cfg, cfg.shared_experts * f, rngs=rngs)

    def _route(self, x):
        """(gates [B, S, k] f32, expert [B, S, k] int32)."""
        cfg = self.cfg
        router = constrain(self.router[...], ("embed", None))
        # f32 logits from the dot itself (DeepSeek-V3 gates in f32). An f32 result also keeps
        # XLA's DotMerger from merging this small dot with the experts' gate projection, which
        # reads the same x in the dense decode form: it would concatenate the router and the
        # whole w_gate into one new matrix every step (measured on h100-sxm: 0.9 GB written
        # and read back per Mixtral layer; dot_merger.cc merges only dots of one result type).
        logits = jnp.einsum("bsd,de->bse", x, router, preferred_element_type=jnp.float32)
        if cfg.router == "softmax":  # Mixtral: top-k of the softmax, renormalised
            probs = constrain(jax.nn.softmax(logits, axis=-1), ("batch", None, None))
            gates, expert = _top_k(probs, cfg.top_k)
        else:  # DeepSeek-V3: sigmoid affinities, biased selection, normalised gates
            scores = constrain(jax.nn.sigmoid(logits), ("batch", None, None))
            _, expert = _top_k(scores + self.router_bias[...], cfg.top_k)
            gates = jnp.take_along_axis(scores, expert, axis=-1)
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True) * cfg.routed_scale
        return gates, expert

    def __call__(self, x):
        cfg = self.cfg
        b, s, _ = x.shape
        e, k = cfg.experts, cfg.top_k
        c = max(1, math.ceil(k * s * cfg.capacity_factor / e))
        # Dense form (decode): where the experts stay on every device (no plan, or tp, which
        # splits expert_d_ff) and a batch row's sequence fits one capacity slot per expert
        # (S <= C, so no token is dropped; decode has S = C = 1), GShard's slot buffers are
        # left out: every token goes through every expert and the gates weight the hidden
        # activations, y = sum_e gate[e] * FFN_e(x). The flops are the same as the slot form's
        # (B*S*E*d*f against E*B*C*d*f), the [E, B, C, d] dispatched copy of x is never
        # written and read back, and the down projection contracts experts and expert_d_ff in
        # one dot, so under tp its partial sums are all-reduced once on [B, S, d], as
        # Megatron's FFN does, not on [E, B, C, d] (DeepSeek-V3 decode on 32 H100s under tp:
        # 6.4 GiB of all-reduce per step). A quantized w_down keeps the slot form: its
        # per-expert scale is not a dim of the dense form's output.
        dense = (s <= c and not is_sharded(("expert",), (e,))
                 and "scale" not in vars(self.w_down))
        with jax.named_scope("router"):
            gates, expert = self._route(x)
            onehot = constrain(jax.nn.one_hot(expert, e, dtype=jnp.int32),
                               ("batch", None, None, None))                     # [B, S, k, E]
            oh = onehot.astype(x.dtype)
            if dense:
                weight = jnp.einsum("bske,bsk->bse", oh, gates.astype(x.dtype))  # [B, S, E]
            else:
                flat = onehot.reshape(b, s * k, e)
                position = ((jnp.cumsum(flat, axis=1) - 1) * flat).sum(-1).reshape(b, s, k)
                slot = jax.nn.one_hot(position, c, dtype=x.dtype)               # [B, S, k, C]
                dispatch = constrain(jnp.einsum("bske,bskc->bsec", oh, slot),
                                     ("batch", None, None, None))
                combine = constrain(jnp.einsum("bske,bskc,bsk->bsec", oh, slot, gates.astype(x.dtype)),
                                    ("batch", None, None, None))
        if dense:
            with jax.named_scope("experts"):
                g = self.w_gate.einsum("bsd,edf->bsef", x)
                u = self.w_up.einsum("bsd,edf->bsef", x)
                h = jax.nn.silu(g) * u * weight[..., None]
                y = constrain(self.w_down.einsum("bsef,efd->bsd", h), HIDDEN)
        else:
            moved = is_sharded(("expert",), (e,))
            with jax.named_scope("dispatch"):
                xe = constrain(jnp.einsum("bsec,bsd->ebcd", dispatch, x), ("expert", "batch", None, "embed"))
            with jax.named_scope("experts"):
                g = self.w_gate.einsum("ebcd,edf->ebcf", xe)
                u = self.w_up.einsum("ebcd,edf->ebcf", xe)
                h = jax.nn.silu(g) * u
                wd = self.w_down
                quantized = "scale" in vars(wd)
                y = None if moved else _reduce_after_combine(
                    combine, h, wd.kernel[...], (b, s, x.shape[-1]),
                    wd.scale[...] if quantized else None, wd.dtype, wd.act_fp8)
                if y is None:
                    ye = self.w_down.einsum("ebcf,efd->ebcd", h)
                    if moved:  # ep: the expert outputs go back to their batch's devices
                        ye = constrain(ye, ("expert", "batch", None, "embed"))
            if y is None:
                with jax.named_scope("combine"):
                    if moved:
                        ye = constrain(ye, (None, "batch", None, "embed"))
                    y = constrain(jnp.einsum("bsec,ebcd->bsd", combine, ye), HIDDEN)
        if cfg.shared_experts:
            with jax.named_scope("shared"):
                y = y + self.shared(x)
        return y


def _reduce_after_combine(combine, h, w_down, out_shape, scale=None, dtype=None, act_fp8=False):
    """The slot form's down projection and combine where a plan splits expert_d_ff (``tp``,
    experts on every device): y [B, S, d] = sum over e, c of combine [B, S, E, C] x (h
    [E, B, C, f] @ w_down [E, f, d]), each device's partial sums over its share of f combined
    first and then summed over the devices (``psum``), so the all-reduce carries [B, S, d]
    instead of the expert outputs [E, B, C, d], E*C/S = top_k x capacity_factor times more
    (Megatron-Core's MoE reduces after the token unpermutation the same way). A weight-only
    quantized ``w_down`` comes with its per-output-channel ``scale`` [E, d] and the model
    ``dtype``: each device converts its share of the kernel inside the dot and scales the
    partial sums (``Dense.einsum``'s order; the scale is per output channel, so it scales each
    device's share of the sum alike). With ``act_fp8`` (an fp8 kernel, ``act_dtype=fp8``) each
    row of h is quantized to e4m3 as ``Dense.einsum`` does, with the same scale max|h| / 448
    over the whole row: each device's max over its share of f, then the max over the devices
    (an all-gather of the [E, B, C, 1] maxima, then their max: differentiable, so the gradients
    are ``Dense.einsum``'s, the rows' largest elements included). Returns None outside a plan
    or where the arrays' layouts are not that one (the caller's form then)."""
    P = jax.sharding.PartitionSpec
    sh = logical_sharding_of(("expert", "batch", None, "mlp"), tuple(h.shape))
    sw = logical_sharding_of(("expert", "mlp", "embed"), tuple(w_down.shape))
    sc = logical_sharding_of(("batch", None, None, None), tuple(combine.shape))
    so = logical_sharding_of(HIDDEN, tuple(out_shape))
    ss = logical_sharding_of(("expert", "embed"), tuple(scale.shape)) if scale is not None else so
    if not all(isinstance(x, jax.sharding.NamedSharding) for x in (sh, sw, sc, so, ss)):
        return None

    def spec(x, n):
        return tuple(x.spec) + (None,) * (n - len(x.spec))
    hs, ws, cs, os_ = spec(sh, 4), spec(sw, 3), spec(sc, 4), spec(so, 3)
    f_axes = hs[3]
    if (f_axes is None or ws != (None, f_axes, None) or hs[:3] != (None, cs[0], None)
            or cs[1:] != (None, None, None) or os_ != (cs[0], None, None)
            or (scale is not None and spec(ss, 2) != (None, None))):
        return None

    def down(hl, wl, sl):  # this device's expert outputs [E, B, C, d], partial over f
        if sl is None:
            return jnp.einsum("ebcf,efd->ebcd", hl, wl)
        if not act_fp8:  # (Dense.einsum's weight-only form)
            return jnp.einsum("ebcf,efd->ebcd", hl, wl.astype(dtype)) * sl[:, None, None, :]
        h32 = hl.astype(jnp.float32)  # (Dense.einsum's fp8 x fp8 form, the row max over devices)
        # (the devices' maxima gathered and maxed here: max is differentiable, pmax is not)
        amax = jnp.max(jax.lax.all_gather(jnp.max(jnp.abs(h32), axis=3, keepdims=True), f_axes), axis=0)
        sx = jnp.maximum(amax, 1e-12) / QMAX[wl.dtype.name]                 # [E, B, C, 1]
        y = jnp.einsum("ebcf,efd->ebcd", (h32 / sx).astype(wl.dtype), wl, preferred_element_type=jnp.float32)
        return (y * sx * sl[:, None, None, :].astype(jnp.float32)).astype(dtype)

    def local(c, hl, wl, *sl):  # (sl: the scale's share, where there is one)
        return jax.lax.psum(jnp.einsum("bsec,ebcd->bsd", c, down(hl, wl, sl[0] if sl else None)), f_axes)

    args, in_specs = (combine, h, w_down), (P(*cs), P(*hs), P(*ws))
    if scale is not None:
        args, in_specs = args + (scale,), in_specs + (P(None, None),)

    # (check_vma: jax tracks which values vary over the mesh axes, so the psum's transpose in
    # a training step's backward pass is the right one)
    return jax.shard_map(local, mesh=sh.mesh, in_specs=in_specs, out_specs=P(*os_),
                         check_vma=True)(*args)


class Block(nnx.Module):
    def __init__(self, cfg: TransformerConfig, moe: bool, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.d_model
        self.attn_norm = RMSNorm(d, cfg)
        self.attn = MLAttention(cfg, rngs=rngs) if cfg.mla else Attention(cfg, rngs=rngs)
        self.mlp_norm = RMSNorm(d, cfg)
        if moe:
            self.moe = MoE(cfg, rngs=rngs)
        else:
            self.mlp = MLP(cfg, cfg.d_ff, rngs=rngs)
        if cfg.post_norms:
            self.attn_post_norm = RMSNorm(d, cfg)
            self.mlp_post_norm = RMSNorm(d, cfg)

    def _ffn(self, x):
        with jax.named_scope("mlp_norm"):
            h = self.mlp_norm(x)
        name = "moe" if "moe" in vars(self) else "mlp"
        with jax.named_scope(name):
            y = getattr(self, name)(h)
            if self.cfg.post_norms:
                y = self.mlp_post_norm(y)
            return constrain(x + y, HIDDEN)

    def _attn(self, x, a):
        if self.cfg.post_norms:
            a = self.attn_post_norm(a)
        return constrain(x + a, HIDDEN)

    def forward(self, x, positions, local):
        """x [B, T, d] -> (y [B, T, d], this layer's cache entries of T positions)."""
        with jax.named_scope("attn_norm"):
            h = self.attn_norm(x)
        with jax.named_scope("attn"):
            a, entries = self.attn.forward(h, positions, local)
            x = self._attn(x, a)
        return self._ffn(x), entries

    def decode(self, x, write, pos, local, ring=None):
        """One step; ``write`` and ``ring`` as ``Attention.decode``."""
        with jax.named_scope("attn_norm"):
            h = self.attn_norm(x)
        with jax.named_scope("attn"):
            x = self._attn(x, self.attn.decode(h, write, pos, local, ring))
        return self._ffn(x)


def _stack(cfg: TransformerConfig, n: int, moe: bool, rngs: nnx.Rngs):
    if cfg.scan_layers:
        @nnx.split_rngs(splits=n)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Block(cfg, moe, rngs=rngs)
        return make(rngs)
    return nnx.List([Block(cfg, moe, rngs=rngs) for _ in range(n)])


def segments(cfg: TransformerConfig) -> list[tuple[str, int, int, bool]]:
    """[(stack name, first layer index, number of layers, is MoE)] in execution order."""
    if not cfg.experts:
        return [("layers", 0, cfg.layers, False)]
    out = [("dense_layers", 0, cfg.dense_layers, False)] if cfg.dense_layers else []
    if cfg.layers > cfg.dense_layers:
        out.append(("layers", cfg.dense_layers, cfg.layers - cfg.dense_layers, True))
    return out


class Transformer(nnx.Module):
    """The decoder; see the module docstring for names and layouts."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = cfg.jnp_dtype
        self.embed = nnx.Embed(cfg.vocab, cfg.d_model, dtype=dt, param_dtype=dt, rngs=rngs)
        for name, _, n, moe in segments(cfg):
            setattr(self, name, _stack(cfg, n, moe, rngs))
        self.norm = RMSNorm(cfg.d_model, cfg)
        if not cfg.tie_embeddings:
            self.lm_head = Dense((cfg.d_model, cfg.vocab), ("embed", "vocab"), cfg, rngs=rngs)

    # -- pieces

    def _embed(self, tokens):
        with jax.named_scope("embed"):
            table = constrain(self.embed.embedding[...], ("vocab", "embed"))
            x = jnp.take(table, tokens, axis=0, mode="clip")
            if self.cfg.embed_scale:  # Gemma: normalizer sqrt(d) in the model dtype
                x = x * jnp.asarray(math.sqrt(self.cfg.d_model), x.dtype)
            return constrain(x, HIDDEN)

    def _logits(self, x):
        with jax.named_scope("norm"):
            h = self.norm(x)
        with jax.named_scope("lm_head"):
            if self.cfg.tie_embeddings:
                table = constrain(self.embed.embedding[...], ("vocab", "embed"))
                logits = jnp.einsum("btd,vd->btv", h, table)
            else:
                logits = self.lm_head(h)
            logits = _softcap(logits.astype(jnp.float32), self.cfg.final_softcap)
            return constrain(logits, LOGITS_AXES)

    def _flags(self, first, n):
        return np.array([self.cfg.local_layer(first + i) for i in range(n)])

    def _run(self, x, positions, keep_cache: bool, remat: bool):
        """All stacks over x [B, T, d]; returns (x, {stack: entries}) (entries None unless
        ``keep_cache``)."""
        cfg = self.cfg
        policy = REMAT_POLICIES[cfg.remat] if remat else None
        caches = {}
        for name, first, n, _ in segments(cfg):
            stack = getattr(self, name)
            flags = self._flags(first, n)

            def step(block_state, x, flag, graphdef):
                y, entries = nnx.merge(graphdef, block_state).forward(x, positions, flag)
                return y, (entries if keep_cache else None)

            if cfg.scan_layers:
                graphdef, state = nnx.split(stack)

                def body(x, xs, graphdef=graphdef):
                    st, flag = xs
                    return step(st, x, flag, graphdef)

                if policy is not None:
                    body = jax.checkpoint(body, policy=policy)
                with jax.named_scope(name):
                    x, entries = jax.lax.scan(body, x, (state, jnp.asarray(flags)))
                caches[name] = entries
            else:
                entries = []
                for i, block in enumerate(stack):
                    graphdef, st = nnx.split(block)
                    f = lambda st, x, flag=bool(flags[i]), g=graphdef: step(st, x, flag, g)  # noqa: E731
                    if policy is not None:
                        f = jax.checkpoint(f, policy=policy)
                    with jax.named_scope(f"{name}_{first + i if name == 'layers' and first else i}"):
                        x, e = f(st, x)
                    entries.append(e)
                caches[name] = entries
        return x, caches

    # -- entry points

    def forward(self, tokens: jax.Array) -> jax.Array:
        """Training forward: tokens int32 [B, T] -> logits float32 [B, T, V]."""
        x = self._embed(tokens)
        x, _ = self._run(x, jnp.arange(tokens.shape[1], dtype=jnp.int32), False, True)
        return self._logits(x)

    def prefill(self, tokens: jax.Array) -> tuple[jax.Array, dict]:
        """tokens int32 [B, T] -> (logits float32 [B, 1, V] of the last position, cache of
        length T in the module docstring layout)."""
        x = self._embed(tokens)
        x, caches = self._run(x, jnp.arange(tokens.shape[1], dtype=jnp.int32), True, False)
        cache = {}
        for name, first, _, _ in segments(self.cfg):   # (_run's stacks, in its order)
            entries = caches[name]
            if self.cfg.scan_layers:
                cache[name] = entries
            elif self.cfg.stacked_cache:
                cache[name] = {k: jnp.stack([e[k] for e in entries]) for k in entries[0]}
            else:   # (a local layer's ring: TransformerConfig.ring_length)
                cache[name] = [_ring_entries(e, self.cfg.ring_length(first + i)) for i, e in enumerate(entries)]
        return self._logits(x[:, -1:]), cache

    def decode(self, cache: dict, tokens: jax.Array, pos: jax.Array) -> tuple[jax.Array, dict]:
        """One step: cache (length S), tokens int32 [B, 1], pos int32 scalar in [0, S) ->
        (logits float32 [B, 1, V], cache with position ``pos`` written in every layer)."""
        cfg = self.cfg
        pos = pos.astype(jnp.int32)
        x = self._embed(tokens)
        new_cache = {}
        for name, first, n, _ in segments(cfg):
            stack = getattr(self, name)
            flags = self._flags(first, n)
            if cfg.scan_layers:
                graphdef, state = nnx.split(stack)

                def body(carry, xs, graphdef=graphdef):
                    x, c = carry
                    st, flag, i = xs
                    held = {}

                    def write(entries, c=c, i=i):  # into the stacked cache, then this layer's view
                        held.update({k: _write(k, v, entries[k], pos, i) for k, v in c.items()})
                        return {k: jax.lax.dynamic_index_in_dim(v, i, 0, keepdims=False)
                                for k, v in held.items()}

                    y = nnx.merge(graphdef, st).decode(x, write, pos, flag)
                    return (y, held), None

                with jax.named_scope(name):
                    (x, c), _ = jax.lax.scan(body, (x, cache[name]),
                                             (state, jnp.asarray(flags), jnp.arange(n, dtype=jnp.int32)))
                new_cache[name] = c
            elif cfg.stacked_cache:   # unrolled layers, one stacked cache: static layer indices
                held = dict(cache[name])
                for i, block in enumerate(stack):
                    def write(entries, i=i):
                        held.update({k: _write(k, v, entries[k], pos, i) for k, v in held.items()})
                        return {k: v[i] for k, v in held.items()}

                    with jax.named_scope(f"{name}_{first + i if name == 'layers' and first else i}"):
                        x = block.decode(x, write, pos, bool(flags[i]))
                new_cache[name] = held
            else:
                out = []
                for i, (block, c) in enumerate(zip(stack, cache[name])):
                    ring = cfg.ring_length(first + i)
                    at = pos if ring is None else pos % ring   # (a ring's slot)

                    def write(entries, c=c, at=at):
                        out.append({k: _write(k, v, entries[k], at) for k, v in c.items()})
                        return out[-1]

                    with jax.named_scope(f"{name}_{first + i if name == 'layers' and first else i}"):
                        x = block.decode(x, write, pos, bool(flags[i]), ring)
                new_cache[name] = out
        return self._logits(x), new_cache


#: Position dim of each cache entry (without the stacked layers dim).
POSITION_DIM = {"k_cache": 2, "v_cache": 2, "k_scale": 2, "v_scale": 2,
                "c_kv_cache": 1, "k_rope_cache": 1, "c_kv_scale": 1, "k_rope_scale": 1,
                "latent_cache": 1}


def _ring_entries(entries: dict, ring: int | None) -> dict:
    """A layer's prefill cache entries of T positions as its decode cache: the same, or with
    ``ring`` a ring of the last ``min(T, ring)`` positions, position ``p`` in slot
    ``p % ring`` (``TransformerConfig.ring_length``)."""
    out = {}
    for k, v in entries.items():
        dim = POSITION_DIM[k]
        t = v.shape[dim]
        if ring is not None and t > ring:   # positions t - ring .. t - 1, rolled to slot p % ring
            v = jnp.roll(jax.lax.slice_in_dim(v, t - ring, t, axis=dim), t % ring, axis=dim)
        out[k] = v
    return out


def _write(key, buf, entry, pos, layer=None):
    """``dynamic_update_slice`` of the new entry (one position) into cache leaf ``key`` at
    ``pos``; with ``layer`` the buffer has a leading layers dim."""
    zero = jnp.zeros((), jnp.int32)
    start = [zero] * entry.ndim
    start[POSITION_DIM[key]] = pos
    if layer is not None:
        start = [layer] + start
        entry = entry[None]
    return jax.lax.dynamic_update_slice(buf, entry.astype(buf.dtype), tuple(start))


# ----------------------------------------------------------------------------- workloads


def _key_name(k) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def abstract_model(cfg: TransformerConfig) -> Transformer:
    """The model with ``jax.ShapeDtypeStruct`` leaves (``nnx.eval_shape``; nothing allocated)."""
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))


def abstract_params(cfg: TransformerConfig) -> tuple[nnx.GraphDef, dict, dict]:
    """(graphdef, pure-dict params of ``jax.ShapeDtypeStruct``, logical axes like params)."""
    model = abstract_model(cfg)
    axes_by_path: dict[tuple, tuple] = {}
    for path, node in nnx.iter_graph(model):
        p = tuple(str(x) for x in path)
        if isinstance(node, Dense):
            axes_by_path[p + ("kernel",)] = node.axes
            out = tuple(a for i, a in enumerate(node.axes) if i not in node.in_dims)
            axes_by_path[p + ("scale",)] = out
        elif isinstance(node, RMSNorm):
            axes_by_path[p + ("scale",)] = ("embed",) if p[-1] not in ("q_norm", "kv_norm") else (None,)
        elif isinstance(node, nnx.Embed):
            axes_by_path[p + ("embedding",)] = ("vocab", "embed")
        elif isinstance(node, MoE):
            axes_by_path[p + ("router",)] = ("embed", None)
            axes_by_path[p + ("router_bias",)] = (None,)
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)

    def axes(path, leaf):
        names = tuple(_key_name(k) for k in path)
        ax = axes_by_path[names]
        if len(ax) + 1 == len(leaf.shape) and cfg.scan_layers and names[0] in ("layers", "dense_layers"):
            ax = ("layers", *ax)
        assert len(ax) == len(leaf.shape), (names, ax, leaf.shape)
        return ax

    return graphdef, params, jax.tree_util.tree_map_with_path(axes, params)


def cache_entry_shapes(cfg: TransformerConfig, length: int) -> dict[str, tuple[tuple, Any, tuple]]:
    """{leaf name: (shape, dtype, logical axes)} of one layer's cache of ``length`` positions."""
    b, kv, dt = cfg.batch, jnp.dtype(cfg.kv_dtype), cfg.jnp_dtype
    quant = kv == jnp.int8
    if cfg.mla:
        if not quant:   # [c_kv | k_rope] (MLAttention.decode: one score dot)
            return {"latent_cache": ((b, length, cfg.kv_lora_rank + cfg.qk_rope_dim), kv, LATENT_CACHE_AXES)}
        out = {"c_kv_cache": ((b, length, cfg.kv_lora_rank), kv, LATENT_CACHE_AXES),
               "k_rope_cache": ((b, length, cfg.qk_rope_dim), kv, LATENT_CACHE_AXES)}
        if quant:
            out.update(c_kv_scale=((b, length), dt, LATENT_CACHE_AXES[:2]),
                       k_rope_scale=((b, length), dt, LATENT_CACHE_AXES[:2]))
        return out
    shape = (b, cfg.kv_heads, length, cfg.head_dim)
    out = {"k_cache": (shape, kv, CACHE_AXES), "v_cache": (shape, kv, CACHE_AXES)}
    if quant:
        out.update(k_scale=(shape[:3], dt, CACHE_AXES[:3]), v_scale=(shape[:3], dt, CACHE_AXES[:3]))
    return out


def abstract_cache(cfg: TransformerConfig) -> tuple[dict, dict]:
    """(the decode cache of ``seq_len`` positions as ``jax.ShapeDtypeStruct`` leaves, its
    logical axes), in the module docstring layout."""
    entries = cache_entry_shapes(cfg, cfg.seq_len)
    cache, axes = {}, {}
    for name, first, n, _ in segments(cfg):
        if cfg.scan_layers or cfg.stacked_cache:
            cache[name] = {k: jax.ShapeDtypeStruct((n, *s), d) for k, (s, d, _) in entries.items()}
            axes[name] = {k: ("layers", *a) for k, (_, _, a) in entries.items()}
        else:   # (a local layer's ring: TransformerConfig.ring_length)
            cache[name] = [{k: jax.ShapeDtypeStruct(s, d) for k, (s, d, _) in cache_entry_shapes(
                cfg, cfg.ring_length(first + i) or cfg.seq_len).items()} for i in range(n)]
            axes[name] = [{k: a for k, (_, _, a) in entries.items()} for _ in range(n)]
    return cache, axes


def parameter_count(params) -> int:
    """Number of parameters: elements of every leaf except quantization scales (a
    ``scale`` beside a ``kernel``; norms' ``scale`` leaves count)."""
    def count(tree) -> int:
        if isinstance(tree, dict):
            return sum(count(v) for k, v in tree.items() if not (k == "scale" and "kernel" in tree))
        if isinstance(tree, (list, tuple)):
            return sum(count(v) for v in tree)
        return math.prod(tree.shape)
    return count(params)


def _config(cfg: TransformerConfig, mode: str) -> dict:
    return {**dataclasses.asdict(cfg), "model": cfg.family, "mode": mode}


def _decode_platform_notes(cfg: TransformerConfig) -> dict:
    """``{"platform_notes": {platform: [note]}}`` for a decode whose report on a GPU or TPU
    target must say how its attention runs (capture/program.py adds the target platform's
    notes to the program's): ``attention=auto`` over a quantized cache takes XLA's form there
    (``_decode_kernel``: the decode kernels read the cache in the model dtype)."""
    kv, dt = jnp.dtype(cfg.kv_dtype), cfg.jnp_dtype
    if cfg.attention != "auto" or cfg.mla or kv == dt:
        return {}
    note = (f"attention=auto over a KV cache of {kv.name} (kv_dtype) runs XLA's attention, not the "
            f"decode kernel (the zoo's GPU and TPU decode kernels read the cache in {dt.name}): "
            "XLA dequantizes the cache and may write it to HBM and read it back (see the excess "
            f"pass's spilled_intermediate); compare with kv_dtype={dt.name} for the kernel's form")
    return {"platform_notes": {"gpu": [note], "tpu": [note]}}


def prefill_workload(cfg: TransformerConfig, name: str) -> Workload:
    """``fn(params, tokens) -> (logits [B, 1, V] f32, cache)``; tokens int32 [B, seq_len].

    Raises:
      AttentionError: ``cfg.attention`` has no prefill kernel or cannot compute ``cfg``."""
    attn_kernels.check_mode(cfg, "forward")
    graphdef, params, param_axes = abstract_params(cfg)

    def prefill(params, tokens):
        return nnx.merge(graphdef, params).prefill(tokens)

    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq_len), jnp.int32)
    _, cache_axes = abstract_cache(cfg)
    return Workload(
        name=name, fn=prefill, args=(params, tokens),
        roles=(jax.tree.map(lambda _: "weights", params), "activations"),
        config=_config(cfg, "prefill"),
        logical_axes=(param_axes, ("batch", "length")),
        out_logical_axes=(("batch", None, "vocab"), cache_axes),
        out_roles=("activations", "kv_cache"),  # (the cache it writes is the KV cache)
    )


def decode_workload(cfg: TransformerConfig, name: str) -> Workload:
    """``fn(params, cache, tokens, pos) -> (logits [B, 1, V] f32, cache)``; the cache
    (``seq_len`` positions) is donated; tokens int32 [B, 1]; pos int32 scalar.

    Raises:
      AttentionError: ``cfg.attention`` has no decode kernel or cannot compute ``cfg``."""
    attn_kernels.check_mode(cfg, "decode")
    graphdef, params, param_axes = abstract_params(cfg)

    def decode(params, cache, tokens, pos):
        return nnx.merge(graphdef, params).decode(cache, tokens, pos)

    cache, cache_axes = abstract_cache(cfg)
    return Workload(
        name=name, fn=decode,
        args=(params, cache, jax.ShapeDtypeStruct((cfg.batch, 1), jnp.int32),
              jax.ShapeDtypeStruct((), jnp.int32)),
        roles=(jax.tree.map(lambda _: "weights", params), jax.tree.map(lambda _: "kv_cache", cache),
               "activations", "activations"),
        donate_argnums=(1,),
        config={**_config(cfg, "decode"), **_decode_platform_notes(cfg)},
        logical_axes=(param_axes, cache_axes, ("batch", None), ()),
        out_logical_axes=(("batch", None, "vocab"), cache_axes),
        out_roles=("activations", "kv_cache"),
    )
