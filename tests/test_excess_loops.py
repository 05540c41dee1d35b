"""Loops over stacked weights and loop-carried values: the compulsory bytes are the unrolled
program's (a user trial: on XLA:TPU a scan over f32 ws[4,K,K], converted whole into VMEM as
bf16 and sliced a layer per iteration, counted half of ws as compulsory -- the lookups' reads,
in bf16 bytes, were taken for the table's f32 footprint -- and the other half as
``whole_table_read``).

Closed form: read ws and x once, write the result once."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import pytest

import jaxmove

L, K, M = 4, 256, 16


def _targets():
    out = [None]
    if importlib.util.find_spec("libtpu") is not None:
        out.append("tpu-v5e:1x1")
    if importlib.util.find_spec("jax_plugins") is not None and importlib.util.find_spec("jax_plugins.xla_cuda12"):
        out.append("h100-sxm")
    return out


def _scan(ws, x):
    return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0]


def _unrolled(ws, x):
    for i in range(L):
        x = jnp.tanh(x @ ws[i])
    return x


@pytest.mark.parametrize("target", _targets())
@pytest.mark.parametrize("fn", [_scan, _unrolled], ids=["scan", "unrolled"])
def test_stacked_weights_are_read_once_whatever_the_loop(fn, target):
    args = (jax.ShapeDtypeStruct((L, K, K), jnp.float32), jax.ShapeDtypeStruct((M, K), jnp.float32))
    kw = {"target": target} if target else {}
    ex = jaxmove.analyze(fn, *args, roles=("weights", "activations"), **kw).excess
    assert ex.by_role["weights"].compulsory_bytes == L * K * K * 4
    assert ex.compulsory_bytes == L * K * K * 4 + 2 * M * K * 4
    assert ex.cause("whole_table_read") is None
