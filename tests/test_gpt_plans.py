"""GPT under sharding plans: the collectives of the partitioned gpt-tiny programs (compiled on
8 simulated CPU devices in a subprocess, as the device count is fixed when jax starts) equal
closed forms computed from the config.

gpt-tiny: vocab V=256, d=64, heads H=4 (head_dim D=16), d_ff f=4d, L=2 layers, seq S=16, f32
(b=4 bytes); the tests set batch B=8.

  tp (data=2, model=4; Megatron): per layer one all-reduce after the attention output
    projection and one after the MLP down projection, plus one after the embedding lookup
    from the vocab-sharded table; each over the local hidden state (B/2)*T*d*b bytes
    (T = S for prefill, 1 for decode) in groups of 4, wire 2*(3/4) of it.
  fsdp (data=8): every parameter with an ``embed`` dim is all-gathered where it is used,
    wire (7/8) of its full bytes, and nothing else moves; the tied table wte is gathered
    once (its embedding and LM-head uses gather the same stored value, and XLA merges the
    two identical all-gathers). Per-device parameter bytes: unsharded ones whole, the
    rest / 8.
  dp (data=8, B divisible by 8): no collective at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.conftest import cpu_devices_env

ROOT = Path(__file__).resolve().parents[1]

V, D_MODEL, S, L, B, ELEM = 256, 64, 16, 2, 8, 4
F = 4 * D_MODEL
HEADS, HEAD_DIM = 4, 16

_WORKER = textwrap.dedent("""
    import json, sys
    from jaxmove.plans import PRESETS, capture_with_plan, ensure_cpu_devices
    from jaxmove.api import analyze
    assert ensure_cpu_devices(8)
    out = {}
    for key, preset, sets, plan, mesh in [
            ("tp_prefill", "gpt-tiny-prefill", {"batch": "8"}, "tp", {"data": 2, "model": 4}),
            ("tp_decode", "gpt-tiny-decode", {"batch": "8"}, "tp", {"data": 2, "model": 4}),
            ("tp_decode_scan", "gpt-tiny-decode", {"batch": "8", "scan_layers": "true"}, "tp",
             {"data": 2, "model": 4}),
            ("fsdp_prefill", "gpt-tiny-prefill", {"batch": "8"}, "fsdp", {"data": 8}),
            ("fsdp_prefill_scan", "gpt-tiny-prefill", {"batch": "8", "scan_layers": "true"}, "fsdp",
             {"data": 8}),
            ("dp_prefill", "gpt-tiny-prefill", {"batch": "8"}, "dp", {"data": 8}),
            ("dp_decode", "gpt-tiny-decode", {"batch": "8"}, "dp", {"data": 8})]:
        program = capture_with_plan(preset, sets, PRESETS[plan], mesh)
        rep = analyze(program)
        out[key] = {"args": program.memory_stats.get("argument_size_in_bytes"),
                    "colls": [[r.collective.kind, r.collective.group_size, r.collective.buffer_bytes,
                               r.collective.wire_bytes, r.multiplicity.count]
                              for r in rep.rows if r.collective is not None]}
    json.dump(out, sys.stdout)
""")


@pytest.fixture(scope="module")
def gpt_plans():
    env = cpu_devices_env(8, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _WORKER], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _tp_expected(tokens: int) -> list[list]:
    n = 4
    local = (B // 2) * tokens * D_MODEL * ELEM          # batch split over data=2
    return [["all-reduce", n, local, 2 * (n - 1) * local // n, 1]] * (2 * L + 1)


@pytest.mark.parametrize("key,tokens", [("tp_prefill", S), ("tp_decode", 1)])
def test_tp_two_all_reduces_per_layer_plus_embedding(gpt_plans, key, tokens):
    assert gpt_plans[key]["colls"] == _tp_expected(tokens)


def test_tp_scan_layers_all_reduces_run_once_per_layer(gpt_plans):
    colls = gpt_plans["tp_decode_scan"]["colls"]
    local = (B // 2) * 1 * D_MODEL * ELEM
    wire = 2 * 3 * local // 4
    # the embedding's all-reduce runs once, the two in the loop body once per layer
    assert sorted(c[4] for c in colls) == [1, L, L]
    assert all(c[:4] == ["all-reduce", 4, local, wire] for c in colls)


def _param_bytes() -> tuple[list[int], int]:
    """(full bytes of each parameter with an ``embed`` dim, bytes of those without one)."""
    d, f = D_MODEL, F
    per_layer = ([d, d]                                   # ln1 scale, bias
                 + [d * d] * 3                            # query/key/value kernels [d, H, D]
                 + [d * d, d]                             # out kernel [H, D, d], out bias
                 + [d, d]                                 # ln2
                 + [d * f, f * d, d])                     # fc kernel, proj kernel, proj bias
    sharded = per_layer * L + [d, d] + [V * d, S * d]     # ln_f; wte, wpe
    unsharded = L * (3 * d + f)                           # q/k/v biases [H, D], fc bias [f]
    return [n * ELEM for n in sharded], unsharded * ELEM


def test_fsdp_gathers_every_embed_weight_once_and_nothing_else(gpt_plans):
    n = 8
    sharded, _ = _param_bytes()
    colls = gpt_plans["fsdp_prefill"]["colls"]
    assert all(k == "all-gather" and g == n and mult == 1 for k, g, _, _, mult in colls)
    assert sorted(c[2] for c in colls) == sorted(sharded)
    assert all(wire == (n - 1) * full // n for _, _, full, wire, _ in colls)


def test_fsdp_scan_gathers_each_layer_inside_the_loop(gpt_plans):
    n = 8
    sharded, _ = _param_bytes()
    colls = gpt_plans["fsdp_prefill_scan"]["colls"]
    assert all(k == "all-gather" and g == n for k, g, *_ in colls)
    # per-layer weights are gathered in the loop body (L executions each), the rest once
    total = sum((n - 1) * full // n * mult for _, _, full, _, mult in colls)
    assert total == sum((n - 1) * w // n for w in sharded)
    assert {mult for *_, mult in colls} == {1, L}


def test_fsdp_holds_an_eighth_of_the_weights_dp_holds_them_all(gpt_plans):
    sharded, unsharded = _param_bytes()
    tokens = (B // 8) * S * 4                               # int32 [B/8, S] per device
    assert gpt_plans["dp_prefill"]["args"] == sum(sharded) + unsharded + tokens
    assert gpt_plans["fsdp_prefill"]["args"] == sum(sharded) // 8 + unsharded + tokens


@pytest.mark.parametrize("key", ["dp_prefill", "dp_decode"])
def test_dp_with_divisible_batch_moves_nothing(gpt_plans, key):
    assert gpt_plans[key]["colls"] == []
