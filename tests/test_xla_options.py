"""``--xla-option KEY=VALUE``: XLA compile options for every compile of a command (jax's
``compiler_options``), passed to the processes it starts through ``$JAXMOVE_XLA_OPTIONS``,
part of the compile cache's key, named in the report's notes; an option XLA does not know is
one error line."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from jaxmove.capture.targets import XLA_OPTIONS_ENV, XlaOptionError, xla_options
from tests.conftest import run_side_by_side

_CLI = [sys.executable, "-P", "-c", "import sys; from jaxmove.cli import main; sys.exit(main(sys.argv[1:]))"]
SMALL = dict(layers="1", d_model="2048", heads="16", kv_heads="4", d_ff="2048", vocab="1024",
             seq_len="128", batch="4")


def test_bad_options_are_one_error_line(monkeypatch):
    env = {k: v for k, v in os.environ.items() if k != XLA_OPTIONS_ENV}
    env["JAX_PLATFORMS"] = "cpu"
    base = _CLI + ["analyze", "gpt2-small-decode", "--set", "layers=1"]
    no_value, unknown = run_side_by_side(
        [base + ["--xla-option", "xla_cpu_enable_fast_math"],
         base + ["--xla-option", "xla_no_such_option=1"]],
        capture_output=True, text=True, env=env)
    assert no_value.returncode == 2 and "expected KEY=VALUE" in no_value.stderr
    lines = unknown.stderr.strip().splitlines()
    assert unknown.returncode != 0 and len(lines) == 1, unknown.stderr
    assert lines[0] == ("jaxmove: error: --xla-option xla_no_such_option=1: XLA refused it: "
                        "No such compile option: 'xla_no_such_option'"), unknown.stderr
    # a value XLA refuses (the API: the environment variable the option sets)
    import jax.numpy as jnp
    from jaxmove.capture import capture
    monkeypatch.setenv(XLA_OPTIONS_ENV, json.dumps({"xla_cpu_enable_fast_math": "maybe"}))
    with pytest.raises(XlaOptionError, match="'maybe' is not a valid bool value"):
        capture(lambda x: x * 2, jnp.ones(4))


def test_the_environment_variable_must_be_a_json_object(monkeypatch):
    monkeypatch.setenv(XLA_OPTIONS_ENV, "xla_gpu_experimental_force_split_k=1")
    with pytest.raises(XlaOptionError, match="expected a JSON object"):
        xla_options()
    monkeypatch.setenv(XLA_OPTIONS_ENV, json.dumps({"xla_gpu_experimental_force_split_k": 1}))
    assert xla_options() == {"xla_gpu_experimental_force_split_k": "1"}


def test_force_split_k_off_removes_the_split_k_partials(monkeypatch):
    """A 1-layer Llama decode step (d_model 2048) for h100-sxm: its skinny [4, 2048] GEMMs are
    split by XLA's SplitkRewriter (split_k_partials > 0); compiled with the option the excess
    pass's fix text names, no dot is split and the report's notes say how it was compiled."""
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        pytest.skip('the CUDA plugin is not installed (pip install "jaxmove[gpu]")')
    import jaxmove
    monkeypatch.delenv(XLA_OPTIONS_ENV, raising=False)
    split = jaxmove.analyze("llama3-8b-decode", overrides=SMALL, target="h100-sxm")
    monkeypatch.setenv(XLA_OPTIONS_ENV, json.dumps({"xla_gpu_experimental_force_split_k": "1"}))
    whole = jaxmove.analyze("llama3-8b-decode", overrides=SMALL, target="h100-sxm")
    assert split.excess.bytes_of("split_k_partials") > 0
    assert whole.excess.bytes_of("split_k_partials") == 0
    assert any("xla_gpu_experimental_force_split_k=1 (--xla-option)" in n for n in whole.notes)
    assert not any("--xla-option" in n for n in split.notes)
    # the weights and the cache are still read once (within their tile padding): the partial
    # sums are what went
    for role in ("weights", "kv_cache"):
        line = whole.excess.by_role[role]
        assert line.compulsory_bytes == split.excess.by_role[role].compulsory_bytes
        assert line.compiled_bytes <= 1.002 * line.compulsory_bytes, role


def test_an_in_process_command_leaves_no_options_to_the_next(monkeypatch, tmp_path, capsys):
    """``jaxmove.cli.main([...])`` in a process that goes on (a notebook): the options its line
    set for its child processes end with it, and what the environment held before comes back."""
    from jaxmove.capture.compile_cache import DISABLE_ENV
    from jaxmove.capture.program import WEIGHT_LAYOUTS_ENV
    from jaxmove.cli import COMMAND_ENV, main
    assert set(COMMAND_ENV) == {XLA_OPTIONS_ENV, WEIGHT_LAYOUTS_ENV, DISABLE_ENV}
    monkeypatch.delenv(XLA_OPTIONS_ENV, raising=False)
    monkeypatch.delenv(DISABLE_ENV, raising=False)
    monkeypatch.setenv(WEIGHT_LAYOUTS_ENV, "default")
    hlo = tmp_path / "m.hlo"
    hlo.write_text("HloModule m\nENTRY %main (x: f32[8]) -> f32[8] {\n"
                   "  %x = f32[8] parameter(0)\n  ROOT %y = f32[8] negate(%x)\n}\n")
    rc = main(["analyze", str(hlo), "--xla-option", "xla_cpu_enable_fast_math=false",
               "--weight-layouts", "auto", "--no-compile-cache", "--json"])
    assert rc == 0
    assert XLA_OPTIONS_ENV not in os.environ and DISABLE_ENV not in os.environ
    assert os.environ[WEIGHT_LAYOUTS_ENV] == "default"
