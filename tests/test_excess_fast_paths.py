"""The fast paths of issue 28's speed work, each against the general code it replaces
(STYLE.md: "every fast path is tested against the general code"): the roles pass asks
``role_from_name`` once per name up to its digits, and a plain fusion lists its constants in
the walk that finds it plain."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import re  # noqa: E402

import pytest  # noqa: E402

from jaxmove.hlo import parse_module  # noqa: E402
from jaxmove.passes.roles import entry_parameter_name, roles_pass  # noqa: E402
from jaxmove.vocab import role_from_name  # noqa: E402

NAMES = [
    "p0", "p17", "param.3", "params['layers'][0]['attn']['q']['kernel']", "layers_12_kernel",
    "cache['layers'][3]['k_cache']", "kv_cache.1", "k_cache2", "cache_position", "layer0_cache",
    "opt_state[0]['mu']['w1'].value", "state['w1'].value", "state__w1___value.1",
    "state['rngs']['default']['count'].value", "model_7.value", "x2_kv", "kv", "kv3",
    "scale_factor", "scale", "bias_1", "embedding12", "params__layers___0___kernel", "tokens",
    "arg_1_42", "123", "w.5", "state_0.value.7", "layers.31.mlp.weight",
]


@pytest.mark.parametrize("name", NAMES)
def test_role_from_name_is_blind_to_digits(name):
    # the roles pass's memo (roles._DIGITS) relies on it: any digit run may be written as one 0
    want = role_from_name(name)
    for repl in ("0", "9", "12345"):
        assert role_from_name(re.sub(r"[0-9]+", repl, name)) == want, (name, repl)


def test_roles_pass_matches_role_from_name_per_parameter():
    params = [f"p{i}" for i in range(5)] + ["params.3", "params.45", "k_cache.7", "k_cache.8",
                                             "state__w1___value.1", "opt_state.2"]
    decl = ", ".join(f"{n.replace('.', '_')}: f32[4]" for n in params)
    body = "\n".join(f"  %{n} = f32[4] parameter({i})" for i, n in enumerate(params))
    text = (f"HloModule m\n\nENTRY %main ({decl}) -> f32[4] {{\n{body}\n"
            f"  ROOT %r = f32[4] add(%p0, %p1)\n}}\n")
    m = parse_module(text)
    roles = roles_pass(m)
    for p in m.entry.parameters:
        assert roles[(m.entry.name, p.name)][0] == role_from_name(entry_parameter_name(p)), p.name
    assert {roles[(m.entry.name, n)][0] for n in ("k_cache.7", "k_cache.8")} == {"kv_cache"}
    assert roles[(m.entry.name, "params.45")][0] == "weights"


def test_plain_fusion_constants_are_a_full_walk():
    from jaxmove.passes.traffic import _PlainFusion
    text = """HloModule m

%f (a: f32[8]) -> f32[8] {
  %a = f32[8] parameter(0)
  %c = f32[8] constant({1, 2, 3, 4, 5, 6, 7, 8})
  %s = f32[] constant(2)
  %b = f32[8] broadcast(%s), dimensions={}
  %m = f32[8] multiply(%a, %c)
  ROOT %r = f32[8] add(%m, %b)
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8] parameter(0)
  ROOT %y = f32[8] fusion(%x), kind=kLoop, calls=%f
}
"""
    m = parse_module(text)
    plain = _PlainFusion.of(m.computations["f"])
    assert plain is not None
    assert plain.constants == [i for i in m.computations["f"].instructions if i.opcode == "constant"]
    from jaxmove.passes.pipeline import analyze_module
    row = next(r for r in analyze_module(m).rows if r.instr.name == "y")
    # the f32[8] constant is read (32 B) beside the operand (32 B); the scalar is an immediate
    assert sorted(a.nbytes for a in row.traffic.reads) == [32, 32]
