"""The dtype / scan axes of the device corpus (benchmarks/device_corpus.py ``--weights-dtypes``,
``--kv-dtypes``, ``--scan``): which ``--set`` dicts a preset gets and the keys they are cached
under. Pure bookkeeping, no compile; the expected lists are written out by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from . import device_compile  # noqa: F401  (sets JAX_PLATFORMS / libtpu sharing before jax starts)

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def dc():
    spec = importlib.util.spec_from_file_location("device_corpus", BENCH / "device_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_axes_cross_product_and_defaults(dc):
    got = dc.axis_extras("llama3-8b-decode", ["bf16", "int8"], ["int8"], ["true", "false"])
    assert got == [{"kv_dtype": "int8", "scan_layers": "true"}, {"kv_dtype": "int8", "scan_layers": "false"},
                   {"weights_dtype": "int8", "kv_dtype": "int8", "scan_layers": "true"},
                   {"weights_dtype": "int8", "kv_dtype": "int8", "scan_layers": "false"}]
    # no axes: one program, no --set
    assert dc.axis_extras("llama3-8b-decode") == [{}]
    # a preset without the keys (the MLP) gets one program whatever the axes
    assert dc.axis_extras("mlp-tiny", ["int8", "fp8"], ["int8"], ["true"]) == [{}]


def test_axes_key_and_bad_scan(dc):
    assert dc.key_of("p", "tiny", "b200", "tp") == "p__tiny__b200__tp"
    assert (dc.key_of("p", "tiny", "b200", "tp", {"weights_dtype": "fp8", "kv_dtype": "int8"})
            == "p__tiny__b200__tp__kv-int8__w-fp8")
    with pytest.raises(ValueError, match="--scan values must be true or false"):
        dc.axis_extras("llama3-8b-decode", scans=["yes"])
