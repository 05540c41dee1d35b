"""Attention kernels of the zoo (issue 24): ``--set attention=xla|flash|splash|paged|cudnn|auto``.

Each kernel option is compiled on a tiny Llama config for its platform without the device
(tpu-v5e for the Pallas TPU kernels, h100-sxm for the Pallas Triton ones) and the program must
contain the kernel's custom call (``tpu_custom_call`` / ``__gpu$xla.gpu.triton``); options
that cannot compile for a target fail with one line naming the option, the compiler and why.
The TPU kernels' numerics (the grouped-query folding, the identity page table) are checked
in Pallas' TPU interpret mode on CPU against softmax attention written here in numpy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from jaxmove import zoo

ROOT = Path(__file__).resolve().parents[1]
# head_dim 128 (paged attention's tile), 2 query heads per kv head, sequences of 128 (the TPU
# backward kernels' key block)
TINY = dict(layers="2", d_model="256", heads="2", kv_heads="1", d_ff="256", vocab="512",
            seq_len="128", batch="2", dtype="bf16")


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# ---- names and mode checks (no compile) ------------------------------------------------------

def test_attention_names_and_defaults():
    assert zoo.attention.attention_name(" Flash ") == "flash"
    with pytest.raises(ValueError, match="unknown attention 'fast'; expected one of xla, flash"):
        zoo.attention.attention_name("fast")
    with pytest.raises(zoo.PresetError, match=r"--set attention='fast'"):
        zoo.build("llama3-8b-decode", {**TINY, "attention": "fast"})
    # decode and training pick the flash kernel where it compiles, prefill keeps the XLA form
    assert zoo.PRESETS["llama3-8b-decode"].config["attention"] == "auto"
    assert zoo.PRESETS["llama3-8b-prefill"].config["attention"] == "xla"
    assert zoo.PRESETS["llama3-70b-train"].config["attention"] == "auto"
    assert "flash attention where a kernel compiles" in zoo.PRESETS["llama3-70b-train"].description
    assert "flash" not in zoo.PRESETS["gemma2-9b-train"].description


@pytest.mark.parametrize("preset, sets, match", [
    ("llama3-8b-prefill", {"attention": "paged"}, "the paged kernel is for decode"),
    ("llama3-8b-train", {"attention": "paged"}, "the paged kernel is for decode"),
    ("llama3-8b-decode", {"attention": "splash"}, "the splash kernel is for prefill and training"),
    ("gemma2-9b-decode", {"attention": "flash"}, r"without score soft-capping \(attn_softcap=50.0\)"),
    ("deepseek-v3-prefill", {"attention": "flash", "dense_layers": "1"}, "multi-head latent attention"),
    ("llama3-8b-decode", {"attention": "flash", "kv_dtype": "int8"}, "a int8 cache would be dequantized"),
    ("llama3-8b-decode", {"attention": "paged", "heads": "4"}, "head_dim=64 is not a multiple of 128"),
])
def test_options_that_cannot_compute_the_model_are_refused_at_build(preset, sets, match):
    with pytest.raises(zoo.PresetError, match=match):
        zoo.build(preset, {**TINY, **sets})


def test_auto_keeps_xla_where_the_kernels_cannot_compute_the_model():
    wl = zoo.build("gemma2-9b-train", {"layers": "2", "d_model": "64", "heads": "4", "kv_heads": "2",
                                       "head_dim": "16", "d_ff": "128", "vocab": "256", "seq_len": "16",
                                       "batch": "1", "sliding_window": "8"})
    assert wl.config["attention"] == "auto"   # builds; its Attention modules run the XLA form


# ---- XLA:CPU: no kernel -----------------------------------------------------------------------

CPU_TINY = dict(layers="2", d_model="64", heads="4", kv_heads="2", d_ff="128", vocab="256",
                seq_len="16", batch="2")


def test_cpu_flash_is_a_clear_error_and_auto_is_the_xla_form():
    import jaxmove
    from jaxmove.zoo.attention import AttentionError
    with pytest.raises(AttentionError, match=r"^--set attention=flash cannot compile for XLA:CPU: "
                                             r"the flash kernel is written for XLA:TPU, XLA:GPU"):
        jaxmove.analyze("llama3-8b-decode", overrides={**CPU_TINY, "attention": "flash"})
    # auto on XLA:CPU: the same bytes as the XLA form (the training default changes nothing here)
    reps = {a: jaxmove.analyze("llama3-8b-train", overrides={**CPU_TINY, "attention": a})
            for a in ("xla", "auto")}
    for role in ("weights", "activations", "optimizer_state"):
        assert reps["auto"].totals.role_bytes(role) == reps["xla"].totals.role_bytes(role)


# ---- numerics of the TPU kernels in interpret mode -----------------------------------------------

def _softmax_attention(q, k, v, mask, scale):
    """softmax(q k^T * scale) v over the last two dims, ``mask`` True where attended."""
    s = np.einsum("...td,...sd->...ts", q, k) * scale
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("...ts,...sd->...td", p / p.sum(-1, keepdims=True), v)


def test_tpu_kernels_match_softmax_attention_in_interpret_mode():
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import tpu as pltpu
    from jaxmove.zoo import attention as A

    rng = np.random.default_rng(0)
    b, hkv, g, s, d, pos = 2, 2, 2, 256, 128, 137
    scale = d ** -0.5
    q = rng.standard_normal((b, hkv, g, d)).astype(np.float32)
    k, v = (rng.standard_normal((b, hkv, s, d)).astype(np.float32) for _ in range(2))
    want = _softmax_attention(q, k, v, np.arange(s) <= pos, scale)
    t = 128
    qf = rng.standard_normal((b, t, hkv * g, d)).astype(np.float32)
    kf, vf = (rng.standard_normal((b, hkv, t, d)).astype(np.float32) for _ in range(2))
    # query head h attends with kv head h // g
    wantf = _softmax_attention(qf.transpose(0, 2, 1, 3), np.repeat(kf, g, 1), np.repeat(vf, g, 1),
                               np.tril(np.ones((t, t), bool)), scale).transpose(0, 2, 1, 3)
    with pltpu.force_tpu_interpret_mode():
        flash = jax.jit(lambda *a: A._tpu_flash_decode(*a, scale=scale))(q, k, v, jnp.int32(pos))
        paged = jax.jit(lambda *a: A._paged_decode(*a, scale=scale))(q, k, v, jnp.int32(pos))
        fwd = jax.jit(lambda *a: A._tpu_flash_forward(*a, scale=scale))(qf, kf, vf)
    np.testing.assert_allclose(np.asarray(flash), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(paged), want, atol=5e-3)   # the kernel's own precision
    np.testing.assert_allclose(np.asarray(fwd), wantf, atol=1e-5)
    # the masked positions matter: attending to every position gives another result
    assert np.abs(_softmax_attention(q, k, v, np.ones(s, bool), scale) - want).max() > 0.05


# ---- deviceless compiles: the kernel's custom call is in the program --------------------------

_WORKER = textwrap.dedent("""
    import json, re, sys
    from jaxmove.capture import resolve_program
    target, sets, cases = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    out = {}
    for preset, opt in cases:
        att, _, extra = opt.partition("@")   # (OPTION@key=value,...: more --set keys)
        more = dict(kv.split("=", 1) for kv in extra.split(",") if kv)
        try:
            prog = resolve_program(preset, overrides={**sets[preset], **more, "attention": att}, target=target)
            out[f"{preset}:{opt}"] = sorted(set(re.findall(r'custom_call_target="([^"]+)"', prog.hlo_text)))
        except Exception as e:
            out[f"{preset}:{opt}"] = f"{type(e).__name__}: {e}"
    json.dump(out, sys.stdout)
""")


def _sets(preset: str) -> dict:
    """TINY for ``preset``'s compile: one layer where the layers are unrolled (decode, prefill:
    each layer calls the same kernels; two took the compile processes ~1.5 s more CPU each);
    training keeps two, its scanned layers a loop the kernels run in (a one-layer scan is none)."""
    return TINY if preset.endswith("-train") else {**TINY, "layers": "1"}


def _start_compiles(target: str, cases: list) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    sets = {preset: _sets(preset) for preset, _ in cases}
    return subprocess.Popen([sys.executable, "-c", _WORKER, target, json.dumps(sets), json.dumps(cases)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _results(proc: subprocess.Popen) -> dict:
    try:
        out, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


TPU_CASES = [("llama3-8b-prefill", "flash"), ("llama3-8b-prefill", "splash"), ("llama3-8b-train", "flash"),
             ("llama3-8b-train", "splash"), ("llama3-8b-train", "auto"), ("llama3-8b-decode", "flash"),
             ("llama3-8b-decode", "paged"), ("llama3-8b-decode", "xla"), ("llama3-8b-prefill", "cudnn")]
GPU_CASES = [("llama3-8b-prefill", "flash"), ("llama3-8b-train", "flash"), ("llama3-8b-train", "auto"),
             ("llama3-8b-decode", "auto"),
             ("llama3-8b-decode", "flash"), ("llama3-8b-decode", "xla"), ("llama3-8b-prefill", "splash"),
             ("llama3-8b-decode", "paged"), ("llama3-8b-decode", "cudnn"),
             # shapes Pallas Triton cannot lower (not powers of 2): auto takes XLA's form, an
             # explicit option is a one-line error (they were internal errors at lowering)
             ("llama3-8b-decode", "auto@seq_len=96"), ("llama3-8b-decode", "auto@head_dim=96"),
             ("llama3-8b-decode", "flash@seq_len=96"), ("llama3-8b-prefill", "flash@seq_len=48")]


@pytest.fixture(scope="module")
def _compiling(request):
    """The TPU and the GPU compile processes (each ~10 s: python, jax, 9 compiles), both
    started when the first is needed (for the tests selected that read them): they run side
    by side on the machine's two cores instead of one after the other."""
    need = {name for item in request.session.items if item.module is request.module
            for name in ("tpu_programs", "gpu_programs") if name in item.fixturenames}
    procs = {}
    if "tpu_programs" in need and _have("libtpu"):
        procs["tpu"] = _start_compiles("tpu-v5e", TPU_CASES)
    if "gpu_programs" in need and _have("jax_plugins.xla_cuda12"):
        procs["gpu"] = _start_compiles("h100-sxm", GPU_CASES)
    yield procs
    for proc in procs.values():       # a run stopped early (-x, Ctrl-C): leave no process behind
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def tpu_programs(_compiling):
    if not _have("libtpu"):
        pytest.skip('libtpu is not installed (pip install "jaxmove[tpu]")')
    return _results(_compiling["tpu"])


@pytest.fixture(scope="module")
def gpu_programs(_compiling):
    if not _have("jax_plugins.xla_cuda12"):
        pytest.skip('the CUDA plugin is not installed (pip install "jaxmove[gpu]")')
    return _results(_compiling["gpu"])


def test_tpu_kernels_compile_to_mosaic_custom_calls(tpu_programs):
    for case in TPU_CASES[:7]:
        key = ":".join(case)
        assert isinstance(tpu_programs[key], list), tpu_programs[key]
        assert "tpu_custom_call" in tpu_programs[key], key
    assert "tpu_custom_call" not in tpu_programs["llama3-8b-decode:xla"]
    # cuDNN: jax checks for the library when it traces the call; this machine has none
    err = tpu_programs["llama3-8b-prefill:cudnn"]
    if isinstance(err, str):
        assert err.startswith("AttentionError: --set attention=cudnn") and "cuDNN" in err
    else:
        pytest.fail("the cudnn option compiled for tpu-v5e")


def test_gpu_kernels_compile_to_triton_custom_calls(gpu_programs):
    for key in ("llama3-8b-prefill:flash", "llama3-8b-train:flash", "llama3-8b-train:auto",
                "llama3-8b-decode:flash", "llama3-8b-decode:auto"):
        assert isinstance(gpu_programs[key], list), gpu_programs[key]
        assert "__gpu$xla.gpu.triton" in gpu_programs[key], key
    assert "__gpu$xla.gpu.triton" not in gpu_programs["llama3-8b-decode:xla"]
    assert gpu_programs["llama3-8b-prefill:splash"] == (
        "AttentionError: --set attention=splash cannot compile for XLA:GPU (CUDA): the splash kernel "
        "is written for XLA:TPU (prefill / training)")
    assert gpu_programs["llama3-8b-decode:paged"].startswith(
        "AttentionError: --set attention=paged cannot compile for XLA:GPU (CUDA)")
    for key in ("llama3-8b-decode:auto@seq_len=96", "llama3-8b-decode:auto@head_dim=96"):
        assert isinstance(gpu_programs[key], list), gpu_programs[key]
        assert "__gpu$xla.gpu.triton" not in gpu_programs[key], key
    assert gpu_programs["llama3-8b-decode:flash@seq_len=96"] == (
        "AttentionError: --set attention=flash cannot compile for XLA:GPU (CUDA): the kernel refused "
        "these shapes (Pallas Triton needs power-of-2 block shapes; not a power of 2: key_block=96)")
    assert gpu_programs["llama3-8b-prefill:flash@seq_len=48"].startswith(
        "AttentionError: --set attention=flash cannot compile for XLA:GPU (CUDA)") and \
        "block=48" in gpu_programs["llama3-8b-prefill:flash@seq_len=48"]
    cudnn = gpu_programs["llama3-8b-decode:cudnn"]
    if isinstance(cudnn, list):          # a machine with cuDNN: the fused attention custom call
        assert any(c.startswith("__cudnn$fmha") for c in cudnn), cudnn
    else:
        assert cudnn.startswith("AttentionError: --set attention=cudnn") and "cuDNN not found" in cudnn
