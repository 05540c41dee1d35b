"""The HTML report's flops/byte is the JSON's arithmetic_intensity: the time model's, over its
modeled HBM bytes (with a GEMM's tiling re-reads) when the report has times (a trial found the
HTML dividing by the traffic pass's bytes instead: 2.05e3 against the JSON's 1024)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

import jaxmove
from jaxmove.report.html import render_html


def test_html_flops_per_byte_is_the_json_arithmetic_intensity():
    n = 8192  # f32 [n, n] @ [n, n] on h100-sxm: too large for one pass over the operands
    r = jaxmove.analyze(lambda a, b: a @ b, jax.ShapeDtypeStruct((n, n), jnp.float32),
                        jax.ShapeDtypeStruct((n, n), jnp.float32), hardware="h100-sxm")
    (row,) = [x for x in r.to_json()["instructions"] if x["flops"]]
    assert row["flops"] == 2 * n ** 3
    moved = row["hbm_read_bytes"] + row["hbm_write_bytes"]
    ai = row["arithmetic_intensity"]
    assert ai is not None and ai < row["flops"] / moved  # (the tiling re-reads are in the model's bytes)
    html = render_html(r)
    assert f'data-v="{ai}"' in html
    assert f'data-v="{row["flops"] / moved}"' not in html
    assert re.search(rf">{ai:.3g}</td>", html)
