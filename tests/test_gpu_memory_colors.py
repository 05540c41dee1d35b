"""XLA:GPU's memory-space colours are HBM: S(1) (collective buffers in NCCL-registered memory,
printed with --xla_gpu_enable_nccl_user_buffers) and S(2) (temp buffers) must not be read as
TPU VMEM / semaphore memory (xla/service/gpu/gpu_memory_space_assignment.h)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from jaxmove.hlo import parse_module
from jaxmove.hlo.parser import is_xla_gpu_text

N = 1 << 20  # f32 elements per device: 4 MiB


@pytest.fixture(scope="module")
def programs():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from jaxmove.capture.targets import Target
    try:
        devs = Target.parse("h100-sxm:1x1x8").devices()
    except Exception as e:  # noqa: BLE001 - no CUDA plugin here
        pytest.skip(f"deviceless GPU compilation unavailable: {e}")
    mesh = Mesh(np.array(devs), ("x",))
    f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x * 2, "x") + 1, mesh=mesh, in_specs=P(),
                              out_specs=P(), check_vma=False))
    lowered = f.lower(jax.ShapeDtypeStruct((N,), jnp.float32, sharding=NamedSharding(mesh, P())))
    from jaxmove._platform import quiet_stderr
    with quiet_stderr():
        plain = lowered.compile().as_text()
        user = lowered.compile(compiler_options={"xla_gpu_enable_nccl_user_buffers": True}).as_text()
    return plain, user


def _analyze(text, tmp_path, name):
    import jaxmove
    p = tmp_path / f"{name}.hlo"
    p.write_text(text)
    return jaxmove.analyze(str(p))


def test_nccl_user_buffers_are_hbm(programs, tmp_path):
    plain, user = programs
    assert "S(1)" in user and "S(1)" not in plain and is_xla_gpu_text(user)
    a, b = _analyze(plain, tmp_path, "plain"), _analyze(user, tmp_path, "user")
    rows = {r.instr.name: r for r in b.analysis.rows}
    # the multiply fusion reads x and writes x * 2 into the all-reduce's (S(1)) buffer: 4 MiB
    # each way in HBM; the add fusion reads the all-reduce's result (S(1)) and writes the output
    mul = next(r for n, r in rows.items() if "multiply" in n)
    add = next(r for n, r in rows.items() if "add" in n and r.instr.opcode == "fusion")
    for r in (mul, add):
        assert (r.per_execution.hbm_read_bytes, r.per_execution.hbm_write_bytes) == (4 * N, 4 * N)
        assert r.per_execution.onchip_read_bytes == r.per_execution.onchip_write_bytes == 0
    assert b.analysis.totals.hbm_bytes == a.analysis.totals.hbm_bytes
    assert any("XLA:GPU memory-space colours S(1)" in n for n in b.notes)
    assert not any("memory-space colours" in n for n in a.notes)


def test_tpu_text_keeps_on_chip_spaces():
    # the same S(1) without XLA:GPU's markers is TPU VMEM (no HBM traffic for the negate)
    tpu = """HloModule m
ENTRY e {
  a = f32[256]{0:S(1)} parameter(0)
  ROOT n = f32[256]{0:S(1)} negate(a)
}
"""
    gpu = tpu.replace("negate(a)", 'negate(a), backend_config={"operation_queue_id":"0"}')
    assert not is_xla_gpu_text(tpu) and is_xla_gpu_text(gpu)
    assert parse_module(tpu).entry.root.shape.memory_space == 1
    m = parse_module(gpu)
    assert m.entry.root.shape.memory_space == 0 and m.gpu_memory_colors == (1,)
