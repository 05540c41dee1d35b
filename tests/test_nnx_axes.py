"""Logical axes read from a user's Flax NNX model (issue 16 item 1): a ``module:function``
returning a Workload of an NNX model whose params carry ``nnx.with_partitioning`` /
``nnx.Param(..., sharding=...)`` metadata works in ``plans``, ``analyze --mesh/--plan`` and
``annotate --mesh/--plan`` like a zoo preset, without declaring ``logical_axes``.

Expected layouts and per-device shapes follow from the axes written in the user model below
and the plan presets' rules (jaxmove/plans/plan.py docstring); the TP all-reduce is the MLP
output block, B x D x 4 bytes.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # never start an accelerator client here
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import importlib.util  # noqa: E402
import json  # noqa: E402
import textwrap  # noqa: E402

import pytest  # noqa: E402

import jax  # noqa: E402
from jax.sharding import AbstractMesh  # noqa: E402

from jaxmove.capture.resolve import load_target  # noqa: E402
from jaxmove.capture.workload import module_logical_axes  # noqa: E402
from jaxmove.plans import PRESETS, PlanError  # noqa: E402
from jaxmove.plans.compare import load_workload, workload_shardings  # noqa: E402

D, F, B = 256, 1024, 64

USER_MODULE = textwrap.dedent(f"""
    import dataclasses
    import jax, jax.numpy as jnp
    from flax import nnx
    from jaxmove.workload import Workload

    D, F, B = {D}, {F}, {B}

    class MLP(nnx.Module):
        def __init__(self, rngs, odd=False):
            init = nnx.initializers.lecun_normal()
            self.up = nnx.Linear(D, F, use_bias=False, rngs=rngs,
                                 kernel_init=nnx.with_partitioning(init, ("embed", "mlp")))
            self.down = nnx.Linear(F, D, use_bias=False, rngs=rngs,
                                   kernel_init=nnx.with_partitioning(init, ("mlp", "embed")))
            self.scale = nnx.Param(jnp.ones((D,)), sharding=("hidden" if odd else "embed",))
            self.plain = nnx.Param(jnp.ones((D,)))

        def __call__(self, x):
            return self.down(jax.nn.relu(self.up(x))) * self.scale + self.plain

    def _model(odd=False):
        with nnx.use_eager_sharding(False):
            return nnx.eval_shape(lambda: MLP(nnx.Rngs(0), odd))

    X = jax.ShapeDtypeStruct((B, D), jnp.float32)

    def make():                       # an nnx.State argument
        graphdef, state = nnx.split(_model())
        def step(state, x):
            return nnx.merge(graphdef, state)(x)
        return Workload("user-nnx-mlp", step, (state, X), roles=("weights", "activations"))

    def make_module():                # the abstract module itself; x's axes declared
        return Workload("user-nnx-module", lambda m, x: m(x), (_model(), X), roles=None,
                        logical_axes=(None, ("batch", "embed")))

    def make_odd():                   # a name outside the plans' vocabulary
        w = make_module()
        return dataclasses.replace(w, args=(_model(odd=True), X))

    def make_pure():                  # metadata lost: a pure dict
        graphdef, state = nnx.split(_model())
        def step(p, x):
            return nnx.merge(graphdef, p)(x)
        return Workload("user-pure", step, (nnx.to_pure_dict(state), X), roles=("weights", "activations"))
""")


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("nnx_user") / "user_nnx.py"
    p.write_text(USER_MODULE)
    return p


def _mesh():
    return AbstractMesh((2, 2), ("data", "model"))


def test_axes_read_from_state_and_module(user_file):
    wl = load_target(f"{user_file}:make")
    axes = module_logical_axes(wl.args[0])
    flat = dict((jax.tree_util.keystr(k), v) for k, v in jax.tree_util.tree_flatten_with_path(
        axes, is_leaf=lambda x: isinstance(x, tuple) or x is None)[0])
    got = {k.split(".")[0]: v for k, v in flat.items()}
    assert got == {"['down']['kernel']": ("mlp", "embed"), "['up']['kernel']": ("embed", "mlp"),
                   "['scale']": ("embed",), "['plain']": None}
    mod = load_target(f"{user_file}:make_module")
    leaves = jax.tree_util.tree_leaves(module_logical_axes(mod.args[0]), is_leaf=lambda x: isinstance(x, tuple))
    assert sorted(leaves) == sorted([("mlp", "embed"), ("embed", "mlp"), ("embed",)])
    # a pure dict carries no metadata
    assert module_logical_axes(load_target(f"{user_file}:make_pure").args[0]) is None


def test_plan_layouts_from_module_axes(user_file):
    notes: list[str] = []
    _, _, specs = workload_shardings(load_workload(f"{user_file}:make"), PRESETS["tp"], _mesh(), notes)
    # tp: mlp over model; embed of a parameter is not a tp rule; no axes on x: replicated
    assert {k.split(".")[0]: v for k, v in specs.items()} == {
        "arg0['down']['kernel']": "P('model', None)", "arg0['up']['kernel']": "P(None, 'model')"}
    _, _, specs = workload_shardings(load_workload(f"{user_file}:make_module"), PRESETS["fsdp_tp"],
                                     _mesh(), notes)
    # roles=None: the nnx.Params follow the parameter rules (embed over data); x's declared
    # axes still apply (batch over data)
    assert {k.split(".value")[0]: v for k, v in specs.items()} == {
        "arg0.down.kernel": "P('model', 'data')", "arg0.up.kernel": "P('data', 'model')",
        "arg0.scale": "P('data')", "arg1": "P('data', None)"}


def test_unknown_axis_name_is_a_note_and_replicated(user_file):
    notes: list[str] = []
    _, _, specs = workload_shardings(load_workload(f"{user_file}:make_odd"), PRESETS["fsdp"], _mesh(), notes)
    assert not any(k.startswith("arg0.scale") for k in specs)
    assert any("'hidden'" in n and "replicated" in n for n in notes)


def test_pure_dict_without_axes_says_how(user_file):
    with pytest.raises(PlanError, match="names no logical axes.*nnx.with_partitioning"):
        workload_shardings(load_workload(f"{user_file}:make_pure"), PRESETS["tp"], _mesh(), [])


# ---- the commands, on 4 compile-only TPU v5e chips (in process, no simulated devices) -------

@pytest.fixture(scope="module")
def tpu():
    try:
        if importlib.util.find_spec("libtpu") is None:
            raise ImportError
    except (ImportError, ValueError):
        pytest.skip('libtpu is not installed (pip install "jaxmove[tpu]")')
    return "tpu-v5e:2x2"


def test_commands_take_the_user_nnx_workload(user_file, tpu, capsys):
    from jaxmove.cli import main

    target = f"{user_file}:make"
    assert main(["analyze", target, "--target", tpu, "--mesh", "data=2,model=2", "--plan", "tp",
                 "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    shapes = {p["path"]: p["shape"] for p in j["parameters"]}
    assert shapes == {"state/up/kernel": f"f32[{D},{F // 2}]", "state/down/kernel": f"f32[{F // 2},{D}]",
                      "state/scale": f"f32[{D}]", "state/plain": f"f32[{D}]", "x": f"f32[{B},{D}]"}
    ars = [r["collective"] for r in j["instructions"]
           if r["collective"] and r["collective"]["kind"] == "all-reduce"]
    assert [c["buffer_bytes"] for c in ars] == [B * D * 4] and ars[0]["group_size"] == 2
    assert main(["annotate", target, "--target", tpu, "--mesh", "data=2,model=2", "--plan", "tp"]) == 0
    assert "all-reduce" in capsys.readouterr().out
    assert main(["plans", target, "--target", tpu, "--mesh", "data=2,model=2", "--plan", "dp",
                 "--plan", "tp", "--json", "--no-progress"]) == 0
    plans = {p["plan"]: p for p in json.loads(capsys.readouterr().out)["plans"]}
    weights = 2 * D * F * 4
    assert plans["dp"]["wire_bytes"] == 0 and not plans["tp"]["error"]
    assert plans["tp"]["wire_bytes_by_kind"] == {"all-reduce": B * D * 4 * 2 * (2 - 1) // 2}
    # tp halves the two kernels per device; scale, plain and x stay whole (TPU pads nothing here)
    assert plans["dp"]["argument_bytes"] - plans["tp"]["argument_bytes"] == weights // 2
