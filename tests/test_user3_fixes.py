"""Defects two new-user trials found (session of 2026-12-06), each with the check that keeps
it fixed: the Python API's errors name what the user called, and spec files are written with
the usual file mode."""

from __future__ import annotations

import os
import stat

import pytest


def _f(w, x):
    return x @ w


def test_analyze_refuses_an_unknown_option_and_names_the_options():
    import jax.numpy as jnp

    import jaxmove
    w, x = jnp.ones((4, 4)), jnp.ones((2, 4))
    with pytest.raises(TypeError) as ei:
        jaxmove.analyze(_f, w, x, rolez=("weights", "activations"))
    msg = str(ei.value)
    assert "'rolez'" in msg and "roles" in msg and "capture()" not in msg
    # the option spelled right works: flops of [2,4] x [4,4]
    assert jaxmove.analyze(_f, w, x, roles=("weights", "activations")).totals.flops == 2 * 2 * 4 * 4


def test_overrides_on_a_function_are_refused_not_ignored():
    import jax.numpy as jnp

    import jaxmove
    from jaxmove.capture.resolve import TargetError
    with pytest.raises(TargetError, match="apply to zoo presets only"):
        jaxmove.analyze(_f, jnp.ones((4, 4)), jnp.ones((2, 4)), overrides={"layers": "2"})


def test_a_written_spec_has_the_umask_mode_not_0600(tmp_path):
    from jaxmove.hardware import load_spec, write_spec
    old = os.umask(0o022)
    try:
        out = write_spec(load_spec("cpu-generic"), tmp_path / "s.toml")
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert load_spec(str(out)).name == "cpu-generic"
    os.chmod(out, 0o640)                       # a file it replaces keeps its mode
    write_spec(load_spec("cpu-generic"), out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
