"""capture: parameter <-> argument mapping, roles, donation, stages, modules, HLO files."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from jaxmove.capture import program as cap
from jaxmove.capture import (CaptureError, EntryParameter, Program, capture, keystr_to_path,
                             program_from_hlo_file, role_from_name)
from jaxmove.capture import Workload

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def f_unused_middle(p, unused, x, c):
    """p: {'w': [4,4], 'b': [4]}; unused: [3] (pruned by jit); x: [2,4]; c: [8]."""
    return x @ p["w"] + p["b"], c.at[0].set(1.0)


ARGS = ({"w": S((4, 4), F32), "b": S((4,), F32)}, S((3,), F32), S((2, 4), F32), S((8,), F32))


def summary(prog: Program):
    return [(p.number, p.path, p.role, p.donated, p.shape, p.byte_size) for p in prog.parameters]


def test_unused_argument_in_the_middle_keeps_paths():
    prog = capture(f_unused_middle, *ARGS, donate_argnums=(3,),
                   roles=({"w": "weights", "b": "weights"}, "activations", "activations", "kv_cache"))
    # Flat leaves: p/b, p/w (dict keys sorted), unused, x, c; 'unused' is pruned.
    assert summary(prog) == [
        (0, "p/b", "weights", False, "f32[4]", 16),
        (1, "p/w", "weights", False, "f32[4,4]", 64),
        (2, "x", "activations", False, "f32[2,4]", 32),
        (3, "c", "kv_cache", True, "f32[8]", 32),
    ]
    assert [p.aliased for p in prog.parameters] == [False, False, False, True]
    assert prog.backend == "cpu" and prog.num_devices == 1
    assert prog.name == "f_unused_middle"
    assert prog.source.startswith("callable:") and prog.source.endswith("test_capture.f_unused_middle")
    assert prog.memory_stats["argument_size_in_bytes"] == 16 + 64 + 32 + 32
    assert prog.memory_stats["alias_size_in_bytes"] == 32
    assert prog.xla_cost_analysis is None or prog.xla_cost_analysis["flops"] > 0
    assert "ENTRY" in prog.hlo_text


def test_callable_default_roles_and_callable_roles_and_static():
    def g(a, n, b):
        return a * n + b["y"]

    a, b = S((5,), F32), {"y": S((5,), jnp.bfloat16), "z": S((7,), F32)}
    prog = capture(g, a, 3, b, static_argnums=(1,))
    assert summary(prog) == [(0, "a", "activations", False, "f32[5]", 20),
                             (1, "b/y", "activations", False, "bf16[5]", 10)]
    prog = capture(g, a, 3, b, static_argnums=(1,),
                   roles=lambda path, leaf: "weights" if path.startswith("b/") else "activations")
    assert [(p.path, p.role) for p in prog.parameters] == [("a", "activations"), ("b/y", "weights")]
    prog = capture(g, a, 3, b, static_argnums=(1,), roles=("activations", None, {"y": "weights", "z": "weights"}))
    assert [(p.path, p.role) for p in prog.parameters] == [("a", "activations"), ("b/y", "weights")]
    with pytest.raises(ValueError, match="not one of"):
        capture(g, a, 3, b, static_argnums=(1,), roles="params")


def test_varargs_paths():
    def h(*args):
        return args[0] + args[2]["k"][1]

    x = S((2,), F32)
    prog = capture(h, x, x, {"k": [x, x]})
    assert [p.path for p in prog.parameters] == ["args/0", "args/2/k/1"]


def test_workload_target():
    def fn(params, cache, tok):
        return tok @ params["kernel"], cache + 1

    wl = Workload(name="toy", fn=fn,
                  args=({"kernel": S((8, 8), jnp.bfloat16)}, S((4, 8), jnp.bfloat16), S((2, 8), jnp.bfloat16)),
                  roles=({"kernel": "weights"}, "kv_cache", "activations"), donate_argnums=(1,))
    prog = capture(wl)
    assert summary(prog) == [(0, "params/kernel", "weights", False, "bf16[8,8]", 128),
                             (1, "cache", "kv_cache", True, "bf16[4,8]", 64),
                             (2, "tok", "activations", False, "bf16[2,8]", 32)]
    assert prog.source == "workload:toy" and prog.name == "toy"


@pytest.mark.parametrize("stage", ["lowered", "compiled"])
def test_lowered_and_compiled_targets(stage):
    def k(params, cache, x):
        return x @ params["kernel"] + params["bias"], cache.at[1].set(0.0)

    args = ({"kernel": S((4, 4), F32), "bias": S((4,), F32)}, S((6, 4), F32), S((2, 4), F32))
    lowered = jax.jit(k, donate_argnums=(1,)).lower(*args)
    target = lowered if stage == "lowered" else lowered.compile()
    prog = capture(target)
    assert summary(prog) == [(0, "params/bias", "weights", False, "f32[4]", 16),
                             (1, "params/kernel", "weights", False, "f32[4,4]", 64),
                             (2, "cache", "kv_cache", True, "f32[6,4]", 96),
                             (3, "x", "unknown", False, "f32[2,4]", 32)]
    assert prog.source == f"{stage}:jit_k"


def test_lowered_with_pruned_argument():
    lowered = jax.jit(f_unused_middle).lower(*ARGS)
    prog = capture(lowered.compile())
    assert [(p.number, p.path) for p in prog.parameters] == [(0, "p/b"), (1, "p/w"), (2, "x"), (3, "c")]


class KVCache(nnx.Variable):
    pass


class Counter(nnx.Variable):
    pass


class Tiny(nnx.Module):
    def __init__(self):
        self.dense = nnx.Linear(8, 16, rngs=nnx.Rngs(0))
        self.store = KVCache(jnp.zeros((3, 16)))      # type name says cache
        self.step = Counter(jnp.zeros((), jnp.int32))  # other variable
        self.dead = nnx.Linear(8, 8, rngs=nnx.Rngs(1))  # never called -> pruned

    def __call__(self, x):
        return self.dense(x) + self.store[...].sum(0) + self.step[...]


def test_nnx_module_target():
    module = nnx.eval_shape(Tiny)
    prog = capture(module, S((2, 8), F32))
    assert summary(prog) == [
        (0, "state/dense/bias", "weights", False, "f32[16]", 64),
        (1, "state/dense/kernel", "weights", False, "f32[8,16]", 512),
        (2, "state/step", "activations", False, "s32[]", 4),
        (3, "state/store", "kv_cache", False, "f32[3,16]", 192),
        (4, "args/0", "activations", False, "f32[2,8]", 64),
    ]
    assert prog.source == "module:Tiny"


def test_count_mismatch_raises():
    prog = capture(f_unused_middle, *ARGS)
    leaves = [cap._Leaf(n, n, "activations", False, s, F32)
              for n, s in [("p['b']", (4,)), ("p['w']", (4, 4)), ("unused", (3,)), ("x", (2, 4)), ("c", (8,))]]
    assert len(cap._build_parameters(prog.hlo_text, leaves, {0, 1, 3, 4})) == 4
    with pytest.raises(CaptureError, match="ENTRY has 4 parameters but jax kept 5"):
        cap._build_parameters(prog.hlo_text, leaves, {0, 1, 2, 3, 4})
    # Wrong kept set of the right size: the metadata cross-check catches it.
    with pytest.raises(CaptureError, match="op_name"):
        cap._build_parameters(prog.hlo_text, leaves, {0, 1, 2, 4})


@pytest.mark.parametrize("name,role", [
    ("cache/layers/0/k_cache", "kv_cache"),
    ("decoder/layers_0/self_attn/cached_key", "kv_cache"),
    ("cached_value", "kv_cache"),
    ("v_cache", "kv_cache"),
    ("state/kv", "kv_cache"),
    ("params/layers/0/attn/query/kernel", "weights"),
    ("params['layers'][0]['ln1']['scale']", "weights"),
    ("%params__layers___0___kernel___value.1", "weights"),
    ("model.embed_tokens.weight", "weights"),
    ("wte/embedding", "weights"),
    ("mlp/fc/bias", "weights"),
    ("params/attn/kv/kernel", "weights"),   # a fused kv projection is a weight
    ("tokens", "unknown"),
    ("x", "unknown"),
    ("p/w", "unknown"),
    ("Arg_0.1", "unknown"),
    ("rescale_factor", "unknown"),
])
def test_role_from_name(name, role):
    assert role_from_name(name) == role


@pytest.mark.parametrize("name,path", [
    ("p['w']", "p/w"),
    ("p[\\'w\\']", "p/w"),
    ("state['layers'][1]['bias'].value", "state/layers/1/bias"),
    ("t.w.value", "t/w"),
    ("args[2]['k'][0]", "args/2/k/0"),
    ("pos", "pos"),
    ("d['value']", "d/value"),   # a dict key named value is kept
])
def test_keystr_to_path(name, path):
    assert keystr_to_path(name) == path


def test_program_from_hlo_file(tmp_path):
    text = (
        "HloModule jit_step, is_scheduled=true, input_output_alias={ {0}: (1, {}, may-alias) },\n"
        "    num_partitions=4, replica_count=2\n\n"
        "ENTRY %main (a: f32[2], b: f32[2]) -> f32[2] {\n"
        "  %a = f32[2]{0} parameter(0)\n"
        "  %b = f32[2]{0} parameter(1)\n"
        "  ROOT %add = f32[2]{0} add(%a, %b)\n"
        "}\n")
    f = tmp_path / "step.hlo"
    f.write_text(text)
    prog = program_from_hlo_file(f)
    assert (prog.name, prog.num_devices, prog.backend, prog.parameters, prog.memory_stats) == \
        ("jit_step", 8, "unknown", (), {})
    assert prog.source == f"hlo:{f}" and prog.hlo_text == text
    assert cap._aliased_parameters(text) == {1}
    f.write_text(text.replace("    num_partitions=4, replica_count=2\n", ""))
    assert program_from_hlo_file(f).num_devices == 1
    with pytest.raises(FileNotFoundError):
        program_from_hlo_file(tmp_path / "missing.hlo")


def test_program_from_corpus_file():
    from tests.conftest import corpus_file

    prog = program_from_hlo_file(corpus_file("xla__host_offloader_test__DynamicUpdateSliceAllGatherDecomposer.hlo"))
    assert prog.name == "jit_f" and prog.num_devices == 8
    prog = program_from_hlo_file(corpus_file("xla__dynamic_update_slice_inplace_bf16__MultipleInplaceDus.hlo"))
    assert cap._aliased_parameters(prog.hlo_text) == {0, 2}


def test_entry_parameter_is_frozen():
    p = EntryParameter(0, "x", "activations", False, "f32[2]", 8)
    with pytest.raises(Exception):
        p.role = "weights"  # type: ignore[misc]
