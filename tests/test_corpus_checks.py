"""The device corpus's closed-form net (benchmarks/corpus_checks.py, issue 23): its closed forms
against the model's own formulas, and a reduced copy of the corpus checks on real programs
compiled without the device (the full sizes run in benchmarks/device_corpus.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from . import device_compile  # noqa: F401  (JAX_PLATFORMS / libtpu sharing before jax starts)

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    import importlib
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def cc():
    return _load("corpus_checks")


@pytest.fixture(scope="module")
def dc():
    return _load("device_corpus")


# the tiny Llama decode of the corpus: layers 2, seq 256, batch 2, d_model 256, d_ff 512,
# vocab 1024, heads 32 / kv_heads 8 (head_dim 8), bf16
L, S, B, D, F, V, H, KVH = 2, 256, 2, 256, 512, 1024, 32, 8
HD = D // H


def _llama_tiny():
    from jaxmove import zoo
    return zoo.build("llama3-8b-decode", {"layers": str(L), "seq_len": str(S), "batch": str(B),
                                          "d_model": str(D), "d_ff": str(F), "vocab": str(V)})


def test_closed_forms_of_a_llama_decode_by_hand(cc):
    wl = _llama_tiny()
    cf = cc.closed_forms(wl, None)
    per_layer = (D * H * HD + 2 * D * KVH * HD + H * HD * D  # q, k, v, o
                 + 3 * D * F + 2 * D)                         # gate, up, down; two norms
    weights = 2 * (L * per_layer + D * V + D + B * D)      # + lm_head, final norm, B embedding rows
    kv_read = 2 * L * 2 * B * KVH * S * HD                  # k and v caches, bf16
    kv_written = kv_read // S                               # one position per sequence
    assert cf.by_role["weights"] == weights
    assert cf.detail["kv_read"] == kv_read and cf.detail["kv_written"] == kv_written
    assert cf.by_role["kv_cache"] == kv_read + kv_written


def test_closed_forms_shard_per_device(cc, dc):
    # tp over a data=2 x model=2 TPU mesh: every sharded leaf is a quarter or a half per device;
    # the closed form is less than one device's and at least a quarter of it
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install jaxmove[tpu])")
    single = dc.program_closed_forms("llama3-8b-decode", "tiny", "tpu-v5e", "single")
    tp = dc.program_closed_forms("llama3-8b-decode", "tiny", "tpu-v5e", "tp")
    assert single.by_role["weights"] / 4 <= tp.by_role["weights"] < single.by_role["weights"]


def test_moe_weights_have_no_closed_form(cc):
    from jaxmove import zoo
    wl = zoo.build("mixtral-8x7b-decode", {"layers": "1", "seq_len": "64", "batch": "2", "d_model": "128",
                                           "d_ff": "256", "vocab": "512"})
    cf = cc.closed_forms(wl, None)
    assert cf.by_role["weights"] is None and "router" in cf.why["weights"]


@pytest.fixture(scope="module")
def tiny_records(dc, tmp_path_factory):
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install jaxmove[tpu])")
    tmp = tmp_path_factory.mktemp("corpus_checks")
    out = {}
    for target in ("tpu-v5e", "h100"):
        try:
            text, _ = dc.compile_program("llama3-8b-decode", "tiny", target, "single")
        except Exception as e:  # noqa: BLE001 - a target this machine cannot compile for
            pytest.skip(f"cannot compile for {target}: {type(e).__name__}: {e}")
        p = tmp / f"{target}.hlo"
        p.write_text(text)
        out[target] = dc.analyse_text(p, target, dc.program_closed_forms("llama3-8b-decode", "tiny", target, "single"))
    return out


@pytest.mark.parametrize("target", ["tpu-v5e", "h100"])
def test_reduced_decode_passes_every_check(tiny_records, target):
    rec = tiny_records[target]
    assert not rec.get("rejection"), rec.get("rejection")
    names = {c["name"] for c in rec["checks"]}
    assert {"compulsory_weights", "compulsory_kv_cache", "identity", "unattributed_le_1pct"} <= names
    if target.startswith("tpu"):
        assert "tpu_memory_vs_xla" in names
    failed = [c for c in rec["checks"] if c["ok"] is False]
    assert not failed, failed


def test_a_wrong_compulsory_figure_fails_its_check(cc, tiny_records):
    # the check itself can fail: a closed form 2% off is reported with its ratio
    from dataclasses import replace  # noqa: F401
    rec = tiny_records["tpu-v5e"]
    got = next(c for c in rec["checks"] if c["name"] == "compulsory_weights")["got"]

    class _Line:
        compulsory_bytes = got

    class _Ex:
        by_role = {"weights": _Line()}
        causes, compiled_bytes, compulsory_bytes = [], got, got

        class unattributed:
            bytes = 0

    class _Rep:
        excess, times, xla = _Ex(), None, None

    cf = cc.ClosedForms(by_role={"weights": int(got * 1.02)})
    checks = {c.name: c for c in cc.check_report(_Rep(), cf, "gpu")}
    assert checks["compulsory_weights"].ok is False and "x the closed form" in checks["compulsory_weights"].reason
    assert checks["identity"].ok is True
