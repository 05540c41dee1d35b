"""Published configurations of the Llama-class families (``jaxmove.zoo.transformer``).

Sources (dimensions as in each model's Hugging Face ``config.json``):

- Llama 3 8B / 70B (Meta, ``meta-llama/Meta-Llama-3-{8B,70B}``) and Llama 3.1 405B
  (``meta-llama/Llama-3.1-405B``, with its ``rope_scaling`` "llama3": factor 8, low 1,
  high 4, original 8192); Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3.
- Mixtral 8x7B (``mistralai/Mixtral-8x7B-v0.1``; Jiang et al. 2024, "Mixtral of Experts").
- DeepSeek-V3 (``deepseek-ai/DeepSeek-V3``; DeepSeek-AI 2024, "DeepSeek-V3 Technical
  Report", section 4.2): 61 layers, the first 3 dense, 256 routed experts of width 2048 +
  1 shared, top 8, MLA (q rank 1536, kv rank 512, nope/rope/v head dims 128/64/128).
- Gemma 2 9B (``google/gemma-2-9b``; Gemma Team 2024, "Gemma 2", Table 1).

Each dict is the ``TransformerConfig`` of the full model without batch / seq_len.
"""

LLAMA3_8B = dict(family="llama", vocab=128256, d_model=4096, heads=32, kv_heads=8, d_ff=14336,
                 layers=32, rope_theta=500000.0, norm_eps=1e-5)
LLAMA3_70B = dict(LLAMA3_8B, d_model=8192, heads=64, kv_heads=8, d_ff=28672, layers=80)
LLAMA3_405B = dict(LLAMA3_8B, d_model=16384, heads=128, kv_heads=8, d_ff=53248, layers=126,
                   rope_scaling=(8.0, 1.0, 4.0, 8192))
MIXTRAL_8X7B = dict(family="mixtral", vocab=32000, d_model=4096, heads=32, kv_heads=8,
                    d_ff=14336, layers=32, experts=8, top_k=2, rope_theta=1e6, norm_eps=1e-5)
DEEPSEEK_V3 = dict(family="deepseek", vocab=129280, d_model=7168, heads=128, head_dim=128,
                   q_lora_rank=1536, kv_lora_rank=512, qk_rope_dim=64, v_head_dim=128,
                   d_ff=18432, expert_d_ff=2048, experts=256, top_k=8, shared_experts=1,
                   dense_layers=3, layers=61, router="sigmoid", routed_scale=2.5,
                   rope_theta=10000.0, norm_eps=1e-6)
GEMMA2_9B = dict(family="gemma2", vocab=256000, d_model=3584, heads=16, kv_heads=8, head_dim=256,
                 d_ff=14336, layers=42, rope_theta=10000.0, norm_eps=1e-6, activation="gelu",
                 norm_plus_one=True, post_norms=True, embed_scale=True, sliding_window=4096,
                 attn_softcap=50.0, final_softcap=30.0, query_scale=256.0, tie_embeddings=True)

#: Published total parameter counts (the figure each test checks within 0.5%) and where
#: they come from. Llama and Mixtral: the bf16 checkpoints' ``total_size`` / 2 in
#: ``model.safetensors.index.json``; Gemma 2: the report's Table 1 (embedding
#: 917,504,000 + non-embedding 8,324,201,984); DeepSeek-V3: "671B total parameters"
#: (report abstract; the 685B checkpoint adds the 14B multi-token-prediction module).
PUBLISHED_PARAMS = {
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "mixtral-8x7b": 46_702_792_704,
    "deepseek-v3": 671_000_000_000,
    "gemma2-9b": 9_241_705_984,
}

FAMILIES = {"llama3-8b": LLAMA3_8B, "llama3-70b": LLAMA3_70B, "llama3-405b": LLAMA3_405B,
            "mixtral-8x7b": MIXTRAL_8X7B, "deepseek-v3": DEEPSEEK_V3, "gemma2-9b": GEMMA2_9B}

_NAMES = {"llama3-8b": "Llama 3 8B", "llama3-70b": "Llama 3 70B", "llama3-405b": "Llama 3.1 405B",
          "mixtral-8x7b": "Mixtral 8x7B", "deepseek-v3": "DeepSeek-V3", "gemma2-9b": "Gemma 2 9B"}
#: Families whose attention the kernels compute (jaxmove.zoo.attention.unsupported_feature).
_FLASH = ("llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b")
#: decode kernels of the families without flash attention (models/attention.py, ``auto``)
_DECODE_KERNELS = {"deepseek-v3": ", latent-attention kernels on GPU (Triton) and TPU (Pallas; cache "
                                  "length a multiple of 128) where they compile",
                   "gemma2-9b": ", a soft-capping Triton decode kernel on GPU, the local layers' "
                                "cache a ring of their 4096-position window"}
_TRAITS = {"mixtral-8x7b": ", top-2 of 8 experts", "deepseek-v3": ", MLA, top-8 of 256 experts + 1 shared",
           "gemma2-9b": ", local/global attention, soft-capping"}

#: (batch, seq_len) of each mode's preset; DeepSeek-V3 pre-trained on 4K sequences.
MODE_SIZES = {"prefill": (1, 8192), "decode": (32, 8192), "train": (1, 8192)}


#: ``scan_layers`` of each mode's preset. Inference unrolls its layers: one array per layer
#: is what XLA:TPU and XLA:GPU compile near the compulsory traffic (each weight and cache
#: entry read once, the new position written in place). Scanned, the same step reads the
#: weights and the cache about twice (llama3-8b-decode on h100-sxm, 4 layers: weights 5.86
#: GiB compiled for 2.60 GiB compulsory, each layer's weight window copied out of the
#: stack; on tpu-v5e the donated caches copied whole and each layer's window copied: KV 28
#: GiB for 4 GiB); ``--set scan_layers=true`` keeps that form (compiles in seconds
#: instead of a minute at 80 layers). Training scans (its compile is the long one, and
#: the weight windows are a small part of a step's traffic).
MODE_SCAN = {"prefill": False, "decode": False, "train": True}
#: Decode keeps one cache array per layer (XLA:GPU copies each layer's window out of a
#: stacked cache at full size: llama3-8b-decode on h100-sxm, KV 95.0 GiB compiled for 31.5
#: GiB). ``--set stacked_cache=true`` (one [L, B, Hkv, S, D] array per stack, each unrolled
#: layer indexing it statically) is the TPU layout when a layer's cache per device fits in
#: VMEM (a sharded or short cache: 16 MiB per chip for Llama 3 70B on 16 chips): XLA:TPU
#: otherwise stages such a cache through VMEM and writes it back whole every step
#: (llama3-8b-decode, 2 layers of d 1024, cache 1024, on tpu-v5e: KV 335.9 MB compiled for
#: 268.6 MB compulsory; stacked 269.0 MB, the tile padding of the new position).


#: ``attention`` of each mode's preset (jaxmove.zoo.attention). ``auto``: the flash kernel where
#: the lowering platform has one and the model is one it computes (TPU: Pallas
#: flash_attention; CUDA: the Pallas Triton kernels), the XLA form elsewhere (XLA:CPU; Gemma 2's
#: soft-capped local/global attention; DeepSeek-V3's latent attention; decode over an int8 /
#: fp8 cache, which the kernels would read dequantized). Training: an 8192-token step then
#: never stores the [8192, 8192] f32 scores per head. Decode: the XLA form's f32 scores
#: [B, H, S] are written to HBM and read back three times on TPU v5p and GPUs (excess 2.7-20%
#: of the step, benchmarks/zoo_compile.md); the kernel keeps them on chip. Prefill keeps ``xla``
#: (one compile of the long prompt; ``--set attention=flash|splash`` are the options).
MODE_ATTENTION = {"prefill": "xla", "decode": "auto", "train": "auto"}


def presets(preset_cls) -> dict:
    """``{name: preset_cls(...)}`` for every family x {prefill, decode, train}: bf16;
    ``scan_layers`` per ``MODE_SCAN`` (inference unrolled, training scanned)."""
    from . import train, transformer
    builders = {"prefill": transformer.prefill_workload, "decode": transformer.decode_workload,
                "train": train.train_workload}
    out = {}
    for fam, dims in FAMILIES.items():
        billions = PUBLISHED_PARAMS[fam] / 1e9
        for mode, builder in builders.items():
            b, s = MODE_SIZES[mode]
            if fam == "deepseek-v3" and mode != "decode":
                s = 4096
            what = {"prefill": f"prefill of {s} tokens, batch {b}",
                    "decode": f"one decode step, KV cache {s}, batch {b}",
                    "train": f"AdamW training step, micro-batch {b} x {s} tokens"}[mode]
            out[f"{fam}-{mode}"] = preset_cls(
                f"{_NAMES[fam]}, {billions:.3g}B params{_TRAITS.get(fam, '')}: {what}, bf16, "
                f"{'scanned' if MODE_SCAN[mode] else 'unrolled'} layers"
                f"{', flash attention where a kernel compiles' if MODE_ATTENTION[mode] == 'auto' and fam in _FLASH else ''}"
                f"{_DECODE_KERNELS.get(fam, '') if mode == 'decode' else ''}",
                transformer.TransformerConfig, builder,
                dict(dims, batch=b, seq_len=s, dtype="bfloat16", scan_layers=MODE_SCAN[mode],
                     attention=MODE_ATTENTION[mode]))
    return out
