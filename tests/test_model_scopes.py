"""Zoo models run each block in a ``jax.named_scope``, so ``jaxmove analyze --by module``
groups bytes by block. Closed forms for gpt-tiny-decode (V=256, d=64, H=H_kv=4, D=16,
f=4d, L=2, B=2, cache length S=16, f32 so b=4):

  MLP of one layer reads its weights once per step: (d*f + f + f*d + d) * b bytes.
  Attention of one layer reads both caches whole (the two attention dots): 2*B*H_kv*S*D*b,
  and writes one row of each (in-place update): 2*B*H_kv*D*b.
"""

from __future__ import annotations

import json

import pytest

import jaxmove
from jaxmove.cli import main
from jaxmove.report.attribution import NO_OP_NAME, TOP_LEVEL, aggregate

V, D, F, L, B, S, HKV, HD, ELEM = 256, 64, 256, 2, 2, 16, 4, 16, 4


@pytest.fixture(scope="module")
def decode_groups():
    return {g.key: g for g in aggregate(jaxmove.analyze("gpt-tiny-decode"), "module")}


def test_gpt_decode_groups_by_block(decode_groups):
    keys = set(decode_groups)
    for i in range(L):
        assert {f"layers_{i}/attn", f"layers_{i}/mlp", f"layers_{i}/ln1", f"layers_{i}/ln2"} <= keys
    assert {"embed", "ln_f", "lm_head"} <= keys
    # every instruction has a module: XLA:CPU drops op_name when it rewrites the attention
    # dots (gemv-rewriter), and those are attributed through their users
    assert TOP_LEVEL not in keys and NO_OP_NAME not in keys


def test_gpt_decode_mlp_weights_and_cache_bytes_land_in_their_blocks(decode_groups):
    mlp_weights = (D * F + F + F * D + D) * ELEM
    cache_read, cache_write = 2 * B * HKV * S * HD * ELEM, 2 * B * HKV * HD * ELEM
    for i in range(L):
        assert decode_groups[f"layers_{i}/mlp"].total.role_bytes("weights") == (mlp_weights, 0)
        assert decode_groups[f"layers_{i}/attn"].total.role_bytes("kv_cache") == (cache_read, cache_write)
    # no cache byte is anywhere else
    others = [g for k, g in decode_groups.items() if not k.endswith("/attn")]
    assert all(g.total.role_bytes("kv_cache") == (0, 0) for g in others)
    # the LM head reads the tied table wte [V, d]
    assert decode_groups["lm_head"].total.role_bytes("weights")[0] == V * D * ELEM


def test_scan_layers_paths_and_cli(capsys):
    assert main(["analyze", "gpt-tiny-decode", "--set", "scan_layers=true", "--by", "module",
                 "--json"]) == 0
    groups = {g["key"]: g for g in json.loads(capsys.readouterr().out)["by_module"]}
    # lax.scan's body: layers/while/body/<module>; the stacked caches are read in attn
    assert {"layers/while/body/attn", "layers/while/body/mlp"} <= set(groups)
    assert groups["layers/while/body/mlp"]["flops"] >= L * 2 * 2 * B * D * F


@pytest.mark.parametrize("preset,keys", [
    ("mlp-tiny", {"layers_0/up", "layers_0/down", "layers_1/up", "layers_1/down"}),
    ("moe-tiny", {"layers_0/router", "layers_0/dispatch", "layers_0/experts", "layers_0/combine"}),
])
def test_mlp_and_moe_scopes(preset, keys):
    groups = {g.key: g for g in aggregate(jaxmove.analyze(preset), "module")}
    assert keys <= set(groups)
    if preset == "mlp-tiny":       # up kernel [32, 128] + bias, read once per layer
        assert groups["layers_0/up"].total.role_bytes("weights") == ((32 * 128 + 128) * 4, 0)


_HAND = """HloModule m

ENTRY %main (p0: f32[8,16], p1: f32[16]) -> f32[8] {
  %p0 = f32[8,16]{1,0} parameter(0), metadata={op_name="x"}
  %p1 = f32[16]{0} parameter(1), metadata={op_name="w"}
  %neg = f32[8,16]{1,0} negate(%p0), metadata={op_name="jit(f)/layers_0/attn/neg"}
  %dot = f32[8]{0} dot(%neg, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %e = f32[8]{0} exponential(%dot), metadata={op_name="jit(f)/layers_0/attn/bkgts,bksd->btkgd/exp"}
  ROOT %t = f32[8]{0} tanh(%e), metadata={op_name="jit(f)/layers/while/body/closed_call/mlp/tanh"}
}
"""


def test_attribution_infers_dropped_op_name_and_drops_einsum_and_closed_call():
    from jaxmove.report.attribution import attribute
    module = jaxmove.parse_module(_HAND)
    by = module.entry.by_name
    # einsum subscripts are not a module
    assert attribute(module, by["e"]).module_path == "layers_0/attn"
    # a bare closed_call (lax.scan's body) is not a module
    assert attribute(module, by["t"]).module_path == "layers/while/body/mlp"
    # the dot has no metadata: its only user says layers_0/attn
    att = attribute(module, by["dot"])
    assert (att.op_name, att.module_path, att.module_inferred) == ("", "layers_0/attn", True)
    assert att.module_key == "layers_0/attn"
    assert attribute(module, by["neg"]).module_inferred is False
