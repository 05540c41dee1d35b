"""jaxmove's compile cache (capture/compile_cache.py): a deviceless TPU/GPU compile is kept and
reused, its key follows what the compiler's output depends on, and it can be turned off."""

from __future__ import annotations

import gzip
import os

import pytest

from tests import device_compile  # noqa: F401 - JAX_PLATFORMS=cpu, ALLOW_MULTIPLE_LIBTPU_LOAD

from jaxmove.capture import compile_cache as cc

TPU = "tpu-v5e:2x2"


def _tpu():
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install jaxmove[tpu])")
    from jaxmove.capture.targets import Target
    t = Target.parse(TPU)
    try:
        t.devices()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"{TPU} not available: {e}")
    return t


def _fn(w, x):
    import jax.numpy as jnp
    return jnp.tanh(x @ w).sum(0)


def _args():
    import jax
    import jax.numpy as jnp
    return (jax.ShapeDtypeStruct((256, 256), jnp.float32), jax.ShapeDtypeStruct((64, 256), jnp.float32))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv(cc.DISABLE_ENV, raising=False)
    monkeypatch.setenv(cc.DIR_ENV, str(tmp_path / "xla"))
    return tmp_path / "xla"


def _entries(d):
    return sorted(d.glob("*.json.gz")) if d.is_dir() else []


def test_cache_dir_default_env_and_off(monkeypatch, tmp_path):
    monkeypatch.delenv(cc.DIR_ENV, raising=False)
    monkeypatch.delenv(cc.DISABLE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cc.cache_dir() == tmp_path / ".cache" / "jaxmove" / "xla"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cc.cache_dir() == tmp_path / "x" / "jaxmove" / "xla"
    monkeypatch.setenv(cc.DIR_ENV, str(tmp_path / "mine"))
    assert cc.cache_dir() == tmp_path / "mine"
    for off in ("1", "true", "yes"):
        monkeypatch.setenv(cc.DISABLE_ENV, off)
        assert cc.cache_dir() is None
    monkeypatch.setenv(cc.DISABLE_ENV, "0")
    assert cc.cache_dir() == tmp_path / "mine"


def test_tpu_compile_is_kept_and_reused_without_compiling(cache, monkeypatch):
    from jaxmove.capture import capture
    from jaxmove.capture import targets

    t = _tpu()
    before = cc.cache_stats()
    cold = capture(_fn, *_args(), roles=("weights", "activations"), target=t.name)
    assert len(_entries(cache)) == 1
    assert cc.cache_stats()["writes"] == before["writes"] + 1

    def no_compile(*a, **k):
        raise AssertionError("compiled although the cache holds the program")
    monkeypatch.setattr(targets, "compile_lowered", no_compile)
    warm = capture(_fn, *_args(), roles=("weights", "activations"), target=t.name)
    assert cc.cache_stats()["hits"] == before["hits"] + 1
    assert warm.hlo_text == cold.hlo_text
    assert warm.parameters == cold.parameters
    assert warm.memory_stats == cold.memory_stats and warm.memory_stats
    assert warm.xla_cost_analysis == cold.xla_cost_analysis
    assert (warm.backend, warm.num_devices, warm.target, warm.notes) == (
        cold.backend, cold.num_devices, cold.target, cold.notes)
    # the program as XLA:TPU compiled it: 256*256 f32 weights read whole (closed form)
    w = next(p for p in warm.parameters if p.role == "weights")
    assert w.byte_size == 256 * 256 * 4


def test_sharded_shapes_survive_the_cache(cache, monkeypatch):
    """Per-device argument shapes come from the executable's input shardings: a hit gives
    the same ones (x split over 4 chips on its first axis: 64/4 rows each)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxmove.capture import capture

    t = _tpu()
    mesh = jax.sharding.Mesh(np.array(t.devices()[:4]), ("d",))
    ins = (NamedSharding(mesh, P()), NamedSharding(mesh, P("d", None)))
    cold = capture(_fn, *_args(), in_shardings=ins, target=t.name)
    warm = capture(_fn, *_args(), in_shardings=ins, target=t.name)
    assert len(_entries(cache)) == 1
    x = [p for p in warm.parameters if p.argnum == 1]
    assert [p.byte_size for p in x] == [16 * 256 * 4]
    assert warm.parameters == cold.parameters


def test_key_follows_source_lines_flags_and_target(cache, monkeypatch):
    import jax
    from jaxmove.capture.targets import Target

    t = _tpu()

    def f1(w, x):
        return _fn(w, x)

    def f2(w, x):  # the same program, defined on other lines: other metadata, other key
        return _fn(w, x)

    def lower(f, target):
        from jaxmove.capture.program import _target_shardings
        return jax.jit(f, **_target_shardings(None, target)).lower(*_args())

    k1 = cc.cache_key(lower(f1, t.name), t)
    assert cc.cache_key(lower(f1, t.name), t) == k1
    assert cc.cache_key(lower(f2, t.name), t) != k1
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_hlo_as_text")
    assert cc.cache_key(lower(f1, t.name), t) != k1
    monkeypatch.delenv("XLA_FLAGS")
    other = Target.parse("tpu-v5e:1x1")
    assert cc.cache_key(lower(f1, other.name), other) != k1


def test_unreadable_entry_is_a_miss_and_rewritten(cache):
    from jaxmove.capture import capture

    t = _tpu()
    cold = capture(_fn, *_args(), target=t.name)
    (entry,) = _entries(cache)
    entry.write_bytes(entry.read_bytes()[:40])  # truncated gzip
    before = cc.cache_stats()
    again = capture(_fn, *_args(), target=t.name)
    assert cc.cache_stats()["misses"] == before["misses"] + 1
    assert again.hlo_text == cold.hlo_text
    with gzip.open(entry, "rt") as f:  # rewritten whole
        assert cc.CompiledFacts.from_json(__import__("json").load(f)).hlo_text == cold.hlo_text


def test_off_and_cpu_write_nothing(cache, monkeypatch):
    import jax.numpy as jnp

    from jaxmove.capture import capture

    capture(lambda x: x * 2, jnp.ones((8,), jnp.float32))  # cpu: never cached
    assert _entries(cache) == []
    t = _tpu()
    monkeypatch.setenv(cc.DISABLE_ENV, "1")
    capture(_fn, *_args(), target=t.name)
    assert _entries(cache) == []


def test_cli_no_compile_cache_flag(cache, monkeypatch):
    """--no-compile-cache turns the cache off for the command and the processes it starts."""
    import argparse

    from jaxmove.cli.common import add_compile_target_option

    monkeypatch.setenv(cc.DISABLE_ENV, "")  # restored after the test
    p = argparse.ArgumentParser()
    add_compile_target_option(p)
    p.parse_args(["--target", TPU])
    assert cc.cache_dir() == cache
    p.parse_args(["--target", TPU, "--no-compile-cache"])
    assert os.environ[cc.DISABLE_ENV] == "1" and cc.cache_dir() is None


@pytest.mark.parametrize("argv", [["analyze", "mlp", "--target", TPU, "--no-compile-cache"],
                                  ["plans", "mlp", "--target", TPU, "--no-compile-cache"],
                                  ["annotate", "mlp", "--target", TPU, "--no-compile-cache"],
                                  ["sweep", "s.toml", "--no-compile-cache"]])
def test_every_compiling_command_takes_no_compile_cache(argv, cache, monkeypatch):
    from jaxmove.cli import build_parser

    monkeypatch.setenv(cc.DISABLE_ENV, "")
    build_parser().parse_args(argv)
    assert cc.cache_dir() is None
