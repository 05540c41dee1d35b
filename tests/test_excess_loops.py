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


def _cache_and_scale_update(c, s, k, pos):
    c = jax.lax.dynamic_update_slice(c, k, (0, pos, 0))
    s = jax.lax.dynamic_update_slice(s, jnp.ones((8, 1), jnp.bfloat16), (0, pos))
    return c, s


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
@pytest.mark.parametrize("target", _targets())
@pytest.mark.parametrize("donate", [(), (0, 1)], ids=["kept", "donated"])
def test_a_bf16_update_needs_no_read_of_the_array(donate, target):
    # a user trial: XLA:CPU updates a bf16 array as convert(dynamic-update-slice(convert(s) to
    # f32)) to bf16, reading and writing s whole; its read of s was taken as compulsory (67,604
    # B on cpu against 2,068 on tpu-v5e and h100). Closed form: write the int8 cache's new row
    # (8 x 128 B) and the scale's (8 x 2 B), read k (1,024 B) and pos (4 B) -- no old value of
    # either array is needed
    args = (jax.ShapeDtypeStruct((8, 4096, 128), jnp.int8), jax.ShapeDtypeStruct((8, 4096), jnp.bfloat16),
            jax.ShapeDtypeStruct((8, 1, 128), jnp.int8), jax.ShapeDtypeStruct((), jnp.int32))
    kw = {"target": target} if target else {}
    ex = jaxmove.analyze(_cache_and_scale_update, *args, roles=("kv_cache", "kv_cache", "activations", "activations"),
                         donate_argnums=donate, **kw).excess
    assert ex.compulsory_bytes == 8 * 128 + 8 * 2 + 1024 + 4
    if target is None:   # XLA:CPU rewrites s whole, donated or not: what is beyond the update
        assert ex.bytes_of("whole_rewrite") == 2 * 8 * 4096 * 2 - 8 * 2
