"""Roles of HLO-dump parameters from Flax NNX names, and roles the user gives (issue 23.6)."""

from __future__ import annotations

import sys

import pytest

from jaxmove.vocab import role_from_name


@pytest.mark.parametrize("name,role", [
    # nnx.split(model): jax prints the State path and the Variable's .value
    ("state['w1'].value", "weights"),
    ("state['lin']['kernel'].value", "weights"),   # (rule 2 already)
    ("state__w1___value.1", "weights"),            # the HLO parameter name jax mangles it to
    ("ost['model']['w1'].value", "weights"),
    # nnx.Optimizer / optax state: its moments repeat the parameters' paths
    ("ost['opt_state'][0]['mu']['lin']['kernel'].value", "optimizer_state"),
    ("ost['opt_state'][0]['nu']['w1'].value", "optimizer_state"),
    ("opt_state__0___mu____w1___value.2", "optimizer_state"),
    # NNX state that is not a parameter
    ("state['rngs']['default']['count'].value", "unknown"),
    ("state['rngs']['default']['key'].value", "unknown"),
    ("ost['step'].value", "unknown"),
    ("state['layers'][0]['attn']['cached_key'].value", "kv_cache"),
    # not NNX variables
    ("value", "unknown"), ("state", "unknown"), ("state['w1']", "unknown"), ("x['w1'].value", "unknown"),
])
def test_nnx_names(name, role):
    assert role_from_name(name) == role


# a hand-written dump: the byte counts per role are counted by hand below
HLO = """HloModule m

ENTRY %e (a: f32[8,16], b: f32[16,4], c: f32[2,8]) -> f32[2,4] {
  %a = f32[8,16]{1,0} parameter(0), metadata={op_name="state['w1'].value"}
  %b = f32[16,4]{1,0} parameter(1), metadata={op_name="blob_b"}
  %c = f32[2,8]{1,0} parameter(2), metadata={op_name="c"}
  %d = f32[2,16]{1,0} dot(%c, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %r = f32[2,4]{1,0} dot(%d, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


@pytest.fixture()
def hlo_path(tmp_path):
    p = tmp_path / "m.hlo"
    p.write_text(HLO)
    return p


def test_role_globs_name_hlo_parameters(hlo_path):
    import jaxmove

    r = jaxmove.analyze(str(hlo_path)).to_json()["by_role"]
    # state['w1'].value: 8 x 16 f32 = 512 B of weights; blob_b and c by no rule
    assert r["weights"]["read_bytes"] == 512
    assert r["unknown"]["read_bytes"] == 16 * 4 * 4 + 2 * 8 * 4
    r = jaxmove.analyze(str(hlo_path), role_globs={"blob_*": "weights", "c": "activations"}).to_json()["by_role"]
    assert r["weights"]["read_bytes"] == 512 + 256
    assert r["unknown"]["read_bytes"] == 0
    # c (64 B) read, d (2 x 16 x 4 = 128 B) written and read back, r (32 B) written
    assert r["activations"]["read_bytes"] == 64 + 128
    # the first matching glob wins; a glob matches the HLO name too
    r = jaxmove.analyze(str(hlo_path), role_globs={"b": "kv_cache", "*": "weights"}).to_json()["by_role"]
    assert r["kv_cache"]["read_bytes"] == 256 and r["weights"]["read_bytes"] == 512 + 64


def test_role_globs_errors(hlo_path):
    import jaxmove
    from jaxmove.errors import JaxmoveInputError

    with pytest.raises(JaxmoveInputError, match="matches no parameter.*blob_b"):
        jaxmove.analyze(str(hlo_path), role_globs={"nope*": "weights"})
    with pytest.raises(JaxmoveInputError, match="unknown role 'wieghts'"):
        jaxmove.analyze(str(hlo_path), role_globs={"c": "wieghts"})


def test_cli_role_option(hlo_path):
    import json

    from .conftest import run_side_by_side

    run = [sys.executable, "-m", "jaxmove.cli", "analyze", str(hlo_path)]
    bads = ("blob_b", "=weights", "typo*=weights")
    # the four processes (python + jaxmove import, ~1.5 s each) two at a time
    p, *bad_runs = run_side_by_side([run + ["--role", "blob_*=weights", "--json"]]
                                    + [run + ["--role", bad] for bad in bads],
                                    capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["by_role"]["weights"]["read_bytes"] == 768
    for bad, p in zip(bads, bad_runs):
        assert p.returncode == 2, (bad, p.stderr)
        assert "--role" in p.stderr.splitlines()[-1]
