"""A GPU compile target after jax has already run on the CPU in the same process (a notebook
that ran anything before ``--target h100-sxm``): jax's start-up with ``JAX_PLATFORMS`` unset
tried the CUDA plugin, whose CUDA-runtime check fails without a driver, and never registered
it, so the deviceless topology was "not implemented for cuda" (capture/targets.py
``_register_cuda_plugin``). Run in a fresh process: the plugins register once per process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp
    assert float(jax.jit(lambda x: x + 1)(jnp.ones(3)).sum()) == 6.0   # backends started first
    from jaxmove.capture import capture
    from jaxmove import zoo
    program = capture(zoo.build("gpt2-small-decode", {"layers": "1"}), target="h100-sxm")
    assert program.target.startswith("h100-sxm"), program.target
    assert "__triton" in program.hlo_text or "fusion" in program.hlo_text
    print("ok", program.backend)
""")


def test_gpu_target_compiles_after_jax_ran_on_the_cpu():
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        pytest.skip('the CUDA plugin is not installed (pip install "jaxmove[gpu]")')
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK")}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().startswith("ok"), proc.stdout
