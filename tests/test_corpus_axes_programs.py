"""Two small programs of the device corpus's dtype / scan axes (issue 23's net), checked against
closed forms counted by hand here: the Llama-3-8B decode at the corpus's tiny size (2 layers,
d_model 256, 32 heads / 8 kv heads: head_dim 8, batch 2, cache 256) under ``tp`` on a 2x2 mesh
(data=2, model=2: batch 1 and 4 kv heads per device).

* int8 KV cache, unrolled layers, TPU v5p: values int8, one bf16 scale per (position, kv head);
* fp8 weights (float8_e4m3fn) with int8 KV, scanned layers, B200.
Each compiles deviceless in a few seconds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from . import device_compile  # noqa: F401  (sets JAX_PLATFORMS / libtpu sharing before jax starts)

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

# per device: layers x (k, v) x batch x kv heads x cache x head_dim x 1 byte, + bf16 scales
LAYERS, BATCH, HEADS, SEQ, HD = 2, 1, 4, 256, 8
KV_VALUES = LAYERS * 2 * BATCH * HEADS * SEQ * HD * 1          # 32,768
KV_SCALES = LAYERS * 2 * BATCH * HEADS * SEQ * 2               # 8,192
KV_WRITTEN = (KV_VALUES + KV_SCALES) // SEQ                    # one position: 160


@pytest.fixture(scope="module")
def dc():
    spec = importlib.util.spec_from_file_location("device_corpus", BENCH / "device_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _record(dc, tmp_path, target, extra):
    try:
        text, _ = dc.compile_program("llama3-8b-decode", "tiny", target, "tp", extra)
    except Exception as e:  # noqa: BLE001 - a target this machine cannot compile for
        pytest.skip(f"cannot compile for {target}: {type(e).__name__}: {e}")
    p = tmp_path / "p.hlo"
    p.write_text(text)
    return dc.analyse_text(p, target, dc.program_closed_forms("llama3-8b-decode", "tiny", target, "tp", extra))


def _check(rec, name):
    return next(c for c in rec["checks"] if c["name"] == name)


def test_int8_kv_unrolled_on_v5p(dc, tmp_path):
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install jaxmove[tpu])")
    rec = _record(dc, tmp_path, "tpu-v5p", {"kv_dtype": "int8", "scan_layers": "false"})
    kv = _check(rec, "compulsory_kv_cache")
    assert kv["expected"] == KV_VALUES + KV_SCALES + KV_WRITTEN == 41_120
    assert kv["ok"], kv
    assert not [c for c in rec["checks"] if c["ok"] is False]


def test_fp8_weights_scanned_on_b200(dc, tmp_path):
    rec = _record(dc, tmp_path, "b200", {"weights_dtype": "fp8", "kv_dtype": "int8", "scan_layers": "true"})
    assert _check(rec, "compulsory_kv_cache")["got"] == KV_VALUES + KV_SCALES + KV_WRITTEN
    w = _check(rec, "compulsory_weights")
    assert w["ok"], w
    # fp8 projections are one byte per parameter: per device the 2 layers' q/k/v/o + MLP shards
    # (d_model 256, d_ff 512, kv dim 8 x 8 = 64) over model=2 are at most
    # 2 x (256 x (256 + 2 x 64 + 256) + 3 x 256 x 512) / 2 = 557,056 B, plus scales, norms and
    # the gathered embedding rows and the bf16 LM head shard 256 x 1024 x 2 / 2 = 262,144 B
    assert 557_056 < w["got"] < 557_056 + 262_144 + 20_000
    assert not [c for c in rec["checks"] if c["ok"] is False]
