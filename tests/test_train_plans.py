"""Training presets under sharding plans (issue 16.1 follow-up): the step's new parameters and
optimizer state take the donated arguments' layout (``Workload.out_roles``), so XLA writes them
in place, and ``fsdp`` shards the optimizer state like the weights (ZeRO: Rajbhandari et al.
2020). Compiled once, for 4 compile-only TPU v5e chips (no device needed; skipped without
libtpu); expected per-device sizes are computed here from the workload's global shapes.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # never start an accelerator client here
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import importlib.util  # noqa: E402
import math  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import jax  # noqa: E402

from jaxmove import zoo  # noqa: E402
from jaxmove.capture.program import keystr_to_path  # noqa: E402
from jaxmove.plans import PRESETS  # noqa: E402
from jaxmove.plans.compare import capture_with_plan  # noqa: E402

# seq 16 and vocab 256 (were 128 and 1024: the two XLA:TPU compiles took a third longer)
SMALL = {"layers": "2", "d_model": "256", "heads": "4", "kv_heads": "2", "d_ff": "512",
         "vocab": "256", "seq_len": "16", "batch": "4"}
N = 4  # devices: mesh data=4


def _bytes(leaf) -> int:
    return math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize


@pytest.fixture(scope="module")
def fsdp_train():
    try:
        if importlib.util.find_spec("libtpu") is None:
            raise ImportError
    except (ImportError, ValueError):
        pytest.skip('libtpu is not installed (pip install "jaxmove[tpu]")')
    wl = zoo.build("llama3-8b-train", SMALL)
    program = capture_with_plan(wl, None, PRESETS["fsdp"], {"data": N}, target="tpu-v5e:2x2")
    return wl, program


def test_fsdp_shards_optimizer_state_like_weights(fsdp_train):
    wl, program = fsdp_train
    params, opt_state = wl.args[0], wl.args[1]
    # global bytes of every leaf, by capture's path scheme (argument name / pytree keys)
    glob = {}
    for name, tree in (("params", params), ("opt_state", opt_state)):
        for kp, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            glob[keystr_to_path(name + jax.tree_util.keystr(kp))] = _bytes(leaf)
    opt = [p for p in program.parameters if p.role == "optimizer_state"]
    moments = [p for p in opt if p.path in glob and glob[p.path] >= N * 4]   # mu/nu, not count
    assert len(moments) == 2 * len(jax.tree_util.tree_leaves(params))
    for p in moments:   # every weight of this config has an embed dim divisible by 4
        assert p.byte_size * N == glob[p.path], p.path
    opt_total = sum(glob[p.path] for p in opt)
    assert sum(p.byte_size for p in opt) == pytest.approx(opt_total / N, rel=1e-3)
    # arguments per device = 1/4 of the global arguments (tokens/targets split by batch too;
    # logical bytes: XLA:TPU's argument_size_in_bytes adds tile padding)
    total = sum(_bytes(x) for x in jax.tree_util.tree_leaves(wl.args))
    assert sum(p.byte_size for p in program.parameters) == pytest.approx(total / N, rel=1e-3)


def test_donated_parameters_and_optimizer_state_are_written_in_place(fsdp_train):
    _, program = fsdp_train
    donated = [p for p in program.parameters if p.donated]
    assert {p.role for p in donated} == {"weights", "optimizer_state"}
    assert all(p.aliased for p in donated), [p.path for p in donated if not p.aliased][:5]
    # XLA's own account: the aliased bytes are the donated arguments' bytes (tile padding aside)
    logical = sum(p.byte_size for p in donated)
    assert program.memory_stats["alias_size_in_bytes"] >= logical


def test_replicated_weights_plan_captures_on_tpu(fsdp_train):
    """dp on TPU: XLA:TPU gives loop-carried parameters an operation's metadata
    ('jit(train_step)/jvp(layers)/while'); capture maps them by count and shape (was a
    CaptureError refusing the mapping)."""
    wl, _ = fsdp_train
    program = capture_with_plan(wl, None, PRESETS["dp"], {"data": 2, "model": 2}, target="tpu-v5e:2x2")
    params = [p for p in program.parameters if p.role == "weights"]
    assert len(params) == len(jax.tree_util.tree_leaves(wl.args[0]))
    glob = {keystr_to_path("params" + jax.tree_util.keystr(kp)): _bytes(leaf)
            for kp, leaf in jax.tree_util.tree_flatten_with_path(wl.args[0])[0]}
    assert all(p.byte_size == glob[p.path] for p in params)      # dp: weights whole on each chip
    assert all(p.aliased for p in program.parameters if p.donated)
