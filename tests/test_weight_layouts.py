"""``weight_layouts='auto'`` (capture/program.py, the CLI's ``--weight-layouts auto``): weights
compiled with ``Format(Layout.AUTO)`` take the layout XLA's kernels read, so XLA:TPU no longer
copies a weight into another layout every step (issue 24: llama3-405b-decode on tpu-v5p under tp
moved 36 GiB of ``layout_change``). Expected figures come from the shapes: the per-device q
kernel of a 405B layer is bf16[16384, 128 / 16, 128] = 32 MiB."""

from __future__ import annotations

import importlib.util

import pytest

from . import device_compile  # noqa: F401  (sets JAX_PLATFORMS / libtpu sharing before jax starts)

import jax  # noqa: E402

from jaxmove.capture.program import (WEIGHT_LAYOUTS_ENV, _auto_weight_layouts, _Leaf,  # noqa: E402
                                     capture, default_weight_layouts)

# one full-width Llama 3.1 405B layer, short cache, small vocab (a few seconds per compile)
SETS = {"layers": "1", "vocab": "1024", "d_ff": "1024", "seq_len": "256"}
Q_BYTES = 16384 * (128 // 16) * 128 * 2


@pytest.fixture(scope="module")
def programs():
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip('libtpu is not installed (pip install "jaxmove[tpu]")')
    from jaxmove.plans import PRESETS
    from jaxmove.plans.compare import capture_with_plan
    with pytest.MonkeyPatch.context() as mp:   # None reads the environment: keep it clear
        mp.delenv(WEIGHT_LAYOUTS_ENV, raising=False)
        return {wl: capture_with_plan("llama3-405b-decode", SETS, PRESETS["tp"], {"model": 16},
                                      target="tpu-v5p:2x2x4", weight_layouts=wl)
                for wl in ("default", "auto", None)}


def _excess(program):
    from jaxmove.hlo import parse_module
    from jaxmove.passes.excess import excess_pass
    from jaxmove.passes.pipeline import analyze_module
    return excess_pass(analyze_module(parse_module(program.hlo_text)))


def _q_param_line(program) -> str:
    q = next(p for p in program.parameters if p.path.endswith("attn/q/kernel"))
    assert q.byte_size == Q_BYTES
    entry = program.hlo_text[program.hlo_text.index("\nENTRY"):]
    return next(line for line in entry.splitlines()[1:] if f" parameter({q.number})" in line)


def test_auto_layouts_take_the_layout_the_dots_read(programs):
    # default: the q kernel arrives major-to-minor {2,1,0} and XLA:TPU copies it to {2,0,1}
    # (heads outermost) in every step; auto: the parameter itself is {2,0,1}
    assert "bf16[16384,8,128]{2,1,0:" in _q_param_line(programs["default"])
    assert "bf16[16384,8,128]{2,0,1:" in _q_param_line(programs["auto"])
    d, a = _excess(programs["default"]), _excess(programs["auto"])
    assert d.bytes_of("layout_change") >= 2 * Q_BYTES            # at least one copy: read + write
    assert a.bytes_of("layout_change") < Q_BYTES // 32          # tile-sized remnants only
    # what the program must move does not depend on the layouts
    assert a.by_role["weights"].compulsory_bytes == d.by_role["weights"].compulsory_bytes
    assert a.by_role["weights"].compiled_bytes <= d.by_role["weights"].compiled_bytes - 2 * Q_BYTES


def test_donated_weights_keep_the_default_layout():
    # a training step donates its weights and writes them back: their output must share the
    # input's layout, so only weights that are not donated get Layout.AUTO
    from jax.experimental.layout import Format
    import jax.numpy as jnp
    args = ({"w": jax.ShapeDtypeStruct((4, 4), jnp.float32), "b": jax.ShapeDtypeStruct((4,), jnp.float32)},
            jax.ShapeDtypeStruct((2, 4), jnp.float32))
    leaves = [_Leaf("b", "b", "weights", True, (4,), jnp.float32, argnum=0),
              _Leaf("w", "w", "weights", False, (4, 4), jnp.float32, argnum=0),
              _Leaf("x", "x", "activations", False, (2, 4), jnp.float32, argnum=1)]
    got = _auto_weight_layouts({}, args, (), leaves)["in_shardings"]
    assert got[0]["b"] is None and got[1] is None
    assert isinstance(got[0]["w"], Format)


def test_weight_layouts_from_the_environment_and_bad_values(monkeypatch):
    import jax.numpy as jnp
    x = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    monkeypatch.setenv(WEIGHT_LAYOUTS_ENV, "sideways")
    with pytest.raises(ValueError, match="weight_layouts='sideways': expected one of default, auto"):
        capture(lambda x: x * 2, x)
    with pytest.raises(ValueError, match="expected one of default, auto"):
        capture(lambda x: x * 2, x, weight_layouts="AUTO")
    monkeypatch.setenv(WEIGHT_LAYOUTS_ENV, "auto")   # XLA:CPU keeps its layouts; the capture works
    p = capture(lambda x, w: x @ w, x, jax.ShapeDtypeStruct((4, 3), jnp.float32),
                roles=("activations", "weights"))
    assert [q.role for q in p.parameters] == ["activations", "weights"]


def test_the_program_says_its_weights_layouts(programs):
    assert any("Layout.AUTO" in n for n in programs["auto"].notes)
    assert not any("Layout.AUTO" in n for n in programs["default"].notes)


def test_inference_presets_on_accelerators_default_to_auto(programs):
    # weight_layouts=None (no --weight-layouts, no environment): a decode preset compiled for a
    # TPU is the auto program, byte for byte
    assert programs[None].hlo_text == programs["auto"].hlo_text
    assert "bf16[16384,8,128]{2,0,1:" in _q_param_line(programs[None])


def test_default_weight_layouts_rule():
    from jaxmove import zoo
    decode = zoo.build("llama3-8b-decode", {"layers": "1", "d_model": "64", "heads": "2", "kv_heads": "1",
                                            "d_ff": "128", "vocab": "128", "seq_len": "16", "batch": "1"})
    train = zoo.build("llama3-8b-train", {"layers": "1", "d_model": "64", "heads": "2", "kv_heads": "1",
                                          "d_ff": "128", "vocab": "128", "seq_len": "16", "batch": "1"})
    assert decode.config["mode"] == "decode" and train.config["mode"] == "train"
    assert default_weight_layouts(decode, "tpu-v5e:2x2") == "auto"
    assert default_weight_layouts(decode, "h100-sxm") == "auto"
    assert default_weight_layouts(decode, None) == "default"       # XLA:CPU
    assert default_weight_layouts(decode, "cpu") == "default"
    assert default_weight_layouts(train, "tpu-v5e:2x2") == "default"
    assert default_weight_layouts(lambda x: x, "tpu-v5e:2x2") == "default"


def test_roles_per_argument_trace_once_with_the_formats_of_the_traced_roles(monkeypatch):
    """weight_layouts='auto' needs each leaf's role and donation before it traces with the
    weights' Layout.AUTO. Roles given per argument (every zoo preset: pytrees of role strings)
    are known without tracing: one trace, and the formats are those the roles found by tracing
    give (the program traced twice before). Roles that read argument names (a callable) still
    take the trace that names them, then the one with the formats."""
    import jax.numpy as jnp
    from jax.experimental.layout import Format

    import jaxmove.capture.program as prog

    traces = []
    real = prog._trace_leaves

    def counting(fn, args, roles, donate, static, shardings=None):
        traces.append(shardings)
        return real(fn, args, roles, donate, static, shardings)

    monkeypatch.setattr(prog, "_trace_leaves", counting)
    monkeypatch.delenv(WEIGHT_LAYOUTS_ENV, raising=False)
    params = {"w": jax.ShapeDtypeStruct((4, 3), jnp.float32), "b": jax.ShapeDtypeStruct((3,), jnp.float32)}
    cache = jax.ShapeDtypeStruct((2, 3), jnp.float32)
    x = jax.ShapeDtypeStruct((2, 4), jnp.float32)

    def step(p, c, x):
        y = x @ p["w"] + p["b"]
        return y, c + y

    per_arg = ({"w": "weights", "b": "weights"}, "kv_cache", "activations")
    p1 = capture(step, params, cache, x, roles=per_arg, donate_argnums=(1,), weight_layouts="auto")
    assert len(traces) == 1
    early = traces[0]["in_shardings"]
    # the formats the traced roles give (what the second trace used)
    by_name = {"weights": "weights", "cache": "kv_cache", "x": "activations"}
    traces.clear()
    p2 = capture(step, params, cache, x, donate_argnums=(1,), weight_layouts="auto",
                 roles=lambda path, leaf: by_name["weights" if path.startswith("p") else
                                                  "cache" if path.startswith("c") else "x"])
    assert len(traces) == 2
    traced = traces[1]["in_shardings"]
    for got, want in ((early[0]["w"], traced[0]["w"]), (early[0]["b"], traced[0]["b"])):
        assert isinstance(got, Format) and isinstance(want, Format)
    assert early[1] is None and traced[1] is None and early[2] is None and traced[2] is None
    assert [(q.path, q.role, q.donated) for q in p1.parameters] == \
        [(q.path, q.role, q.donated) for q in p2.parameters]
    assert p1.hlo_text.split("\n", 1)[1] == p2.hlo_text.split("\n", 1)[1]
