"""Deviceless compilation of small programs for TPU (libtpu topologies), for the tests of
tiled layouts, trip counts and the device corpus. No accelerator is needed: XLA:TPU
compiles for a topology description (jax.experimental.topologies).

Skips the calling test cleanly when libtpu is not installed.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # never start an accelerator client here
# several processes (other test runs, benchmarks) may load libtpu at once on one machine
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import functools  # noqa: E402

import pytest  # noqa: E402


@functools.lru_cache(maxsize=None)
def tpu_devices(topology: str = "v5e:2x2"):
    """The devices of a TPU topology (``v5e:2x2`` = 4 chips); skips without libtpu."""
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install jaxmove[tpu])")
    from jax.experimental import topologies

    from jaxmove._platform import quiet_stderr
    try:
        with quiet_stderr():
            return topologies.get_topology_desc(topology_name=topology, platform="tpu").devices
    except Exception as e:  # noqa: BLE001 - a plugin that cannot start here: skip, not fail
        pytest.skip(f"TPU topology {topology} not available: {type(e).__name__}: {e}")


def tpu_mesh(n: int = 1, topology: str = "v5e:2x2", axis: str = "x"):
    """A 1-D mesh over the first ``n`` chips of ``topology``."""
    import numpy as np
    from jax.sharding import Mesh
    return Mesh(np.array(tpu_devices(topology)[:n]), (axis,))


def abstract(mesh, shape, dtype, spec=()):
    """A ``jax.ShapeDtypeStruct`` placed on ``mesh`` with PartitionSpec ``spec``."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=NamedSharding(mesh, P(*spec)))


def compile_tpu(fn, *args, donate_argnums=()):
    """``jax.jit(fn).lower(*args).compile()`` for the device the args are placed on."""
    import jax

    from jaxmove._platform import quiet_stderr
    with quiet_stderr():
        return jax.jit(fn, donate_argnums=donate_argnums).lower(*args).compile()
