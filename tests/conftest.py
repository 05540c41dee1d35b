"""Shared fixtures: the HLO corpus in ../shared/corpus/hlo (skipped cleanly where absent)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

# jaxmove's compile cache (capture/compile_cache.py): one fresh directory per test session, never
# the user's ~/.cache/jaxmove/xla (no stale entries read, nothing left behind); tests that compile
# the same TPU/GPU program share its compile. Under pytest-xdist the controller makes the
# directory and its workers inherit it (_SESSION_CACHE_ENV in their environment), so a compile
# one worker made is a hit in the other (the cache writes each entry atomically); the process
# that made it removes it.
_SESSION_CACHE_ENV = "JAXMOVE_TEST_SESSION_COMPILE_CACHE"
_INHERITED = os.environ.get(_SESSION_CACHE_ENV)
_OWNS_CACHE = not (_INHERITED and os.environ.get("PYTEST_XDIST_WORKER") and os.path.isdir(_INHERITED))
_COMPILE_CACHE = tempfile.mkdtemp(prefix="jaxmove-test-xla-") if _OWNS_CACHE else _INHERITED
os.environ[_SESSION_CACHE_ENV] = _COMPILE_CACHE
os.environ["JAXMOVE_COMPILE_CACHE_DIR"] = _COMPILE_CACHE
os.environ.pop("JAXMOVE_NO_COMPILE_CACHE", None)


# XLA:CPU's LLVM back end at -O0 (DebugOptions.xla_backend_optimization_level): the optimized HLO
# every test reads is the same (checked for XLA:CPU, XLA:TPU and XLA:GPU programs: identical text
# with and without it), only the machine code XLA:CPU makes from it is less optimized, and its
# compiles take ~35% less time (most of the suite's time is XLA compiles). Appended to what the
# caller set (jax reads XLA_FLAGS once, at its first backend start, after this); subprocesses the
# tests start inherit it.
_OPT_FLAG = "--xla_backend_optimization_level"
if _OPT_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_OPT_FLAG}=0").strip()


def pytest_sessionfinish(session, exitstatus):
    if _OWNS_CACHE:
        shutil.rmtree(_COMPILE_CACHE, ignore_errors=True)

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus" / "hlo"


def corpus_files() -> list[Path]:
    return sorted(CORPUS.glob("*.hlo")) if CORPUS.is_dir() else []


@pytest.fixture
def corpus_dir() -> Path:
    if not CORPUS.is_dir():
        pytest.skip(f"HLO corpus not found at {CORPUS} (it lives in ../shared/corpus/hlo)")
    return CORPUS


def corpus_file(name: str) -> Path:
    p = CORPUS / name
    if not p.is_file():
        pytest.skip(f"corpus file {p} not found (the corpus lives in ../shared/corpus/hlo)")
    return p


@pytest.fixture(scope="session")
def gpt2_small_decode():
    """``jaxmove.resolve_program("gpt2-small-decode")``, compiled once per session (~2 s on
    XLA:CPU) for the tests that analyze it (test_analyze, test_annotate, test_timing):
    ``analyze("gpt2-small-decode", ...)`` is ``analyze`` of this program (api.analyze resolves
    the name the same way), and a Program is a frozen dataclass, so sharing it changes nothing."""
    import jaxmove
    return jaxmove.resolve_program("gpt2-small-decode")


def run_side_by_side(commands: list[list[str]], at_once: int = 2, **run_kwargs) -> list:
    """``subprocess.run(command, **run_kwargs)`` for each command, ``at_once`` at a time (each
    a process of its own: running them side by side changes nothing they compute); the
    CompletedProcesses in the order of ``commands``."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=at_once) as pool:
        return list(pool.map(lambda cmd: subprocess.run(cmd, **run_kwargs), commands))


def cpu_devices_env(device_count: int | None, **extra: str) -> dict[str, str]:
    """``os.environ`` for a child process with ``device_count`` simulated CPU devices (None:
    no count flag, so the child decides), ``extra`` set. The rest of XLA_FLAGS is kept: the
    session's ``--xla_backend_optimization_level=0`` above (a child given only the count flag
    compiled at XLA:CPU's default -O2, ~35% slower)."""
    import re

    env = dict(os.environ, **extra)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).split()
    if device_count is not None:
        flags.append(f"--xla_force_host_platform_device_count={device_count}")
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    return env


def compile_targets() -> list[str | None]:
    """The compile targets a test runs its program on: None (XLA:CPU), and the compile-only
    ``tpu-v5e:1x1`` and ``h100-sxm`` where their plugins are installed (the tpu / gpu extras)."""
    import importlib.util
    out: list[str | None] = [None]
    if importlib.util.find_spec("libtpu") is not None:
        out.append("tpu-v5e:1x1")
    if importlib.util.find_spec("jax_plugins") is not None and importlib.util.find_spec("jax_plugins.xla_cuda12"):
        out.append("h100-sxm")
    return out
