"""A training step's new parameters and optimizer state are compulsory writes (issue 23's net
found them charged as ``whole_rewrite``: the llama3-8b-train programs' compulsory weights and
optimizer-state bytes were half the closed form, read once + written once)."""

from __future__ import annotations

import pytest

from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import run_pipeline

N = 1024  # f32[N] parameter: 4 KiB

# SGD: p' = p - 0.1 * g, the parameter donated (aliased to the output). Compulsory: p read once
# (4 KiB), g read once (4 KiB), p' written once (4 KiB): every element of p' is new.
SGD_GPU = f"""HloModule sgd, input_output_alias={{ {{}}: (0, {{}}, must-alias) }}

%f (p0: f32[{N}], p1: f32[{N}]) -> f32[{N}] {{
  %p0 = f32[{N}]{{0}} parameter(0)
  %p1 = f32[{N}]{{0}} parameter(1)
  %c = f32[] constant(0.1)
  %b = f32[{N}]{{0}} broadcast(%c), dimensions={{}}
  %m = f32[{N}]{{0}} multiply(%b, %p1)
  ROOT %s = f32[{N}]{{0}} subtract(%p0, %m)
}}

ENTRY %e (params: f32[{N}], grads: f32[{N}]) -> f32[{N}] {{
  %params = f32[{N}]{{0}} parameter(0)
  %grads = f32[{N}]{{0}} parameter(1)
  ROOT %u = f32[{N}]{{0}} fusion(%params, %grads), kind=kLoop, calls=%f
}}
"""

# XLA:TPU's form: the update is computed into VMEM (S(1)) and copied to the donated HBM buffer
SGD_TPU = f"""HloModule sgd, input_output_alias={{ {{}}: (0, {{}}, must-alias) }}

%f (p0: f32[{N}], p1: f32[{N}]) -> f32[{N}] {{
  %p0 = f32[{N}]{{0}} parameter(0)
  %p1 = f32[{N}]{{0}} parameter(1)
  %c = f32[] constant(0.1)
  %b = f32[{N}]{{0}} broadcast(%c), dimensions={{}}
  %m = f32[{N}]{{0}} multiply(%b, %p1)
  %s = f32[{N}]{{0}} subtract(%p0, %m)
  ROOT %t = (f32[{N}]{{0:S(1)}}) tuple(%s)
}}

ENTRY %e (params: f32[{N}], grads: f32[{N}]) -> f32[{N}] {{
  %params = f32[{N}]{{0}} parameter(0)
  %grads = f32[{N}]{{0}} parameter(1)
  %u = (f32[{N}]{{0:S(1)}}) fusion(%params, %grads), kind=kLoop, calls=%f
  %g = f32[{N}]{{0:S(1)}} get-tuple-element(%u), index=0
  %cs = (f32[{N}]{{0}}, f32[{N}]{{0:S(1)}}, u32[]) copy-start(%g)
  ROOT %cd = f32[{N}]{{0}} copy-done(%cs)
}}
"""

# the contrast: a masked write (select) of a donated cache keeps the unselected old values, so
# rewriting it whole is still excess (whole_rewrite): only the selected element is the update
MASKED = f"""HloModule masked, input_output_alias={{ {{}}: (0, {{}}, must-alias) }}

%f (p0: f32[{N}], p1: f32[], p2: s32[]) -> f32[{N}] {{
  %p0 = f32[{N}]{{0}} parameter(0)
  %p1 = f32[] parameter(1)
  %p2 = s32[] parameter(2)
  %i = s32[{N}]{{0}} iota(), iota_dimension=0
  %bp = s32[{N}]{{0}} broadcast(%p2), dimensions={{}}
  %eq = pred[{N}]{{0}} compare(%i, %bp), direction=EQ
  %bv = f32[{N}]{{0}} broadcast(%p1), dimensions={{}}
  ROOT %sel = f32[{N}]{{0}} select(%eq, %bv, %p0)
}}

ENTRY %e (cache: f32[{N}], v: f32[], pos: s32[]) -> f32[{N}] {{
  %cache = f32[{N}]{{0}} parameter(0)
  %v = f32[] parameter(1)
  %pos = s32[] parameter(2)
  ROOT %u = f32[{N}]{{0}} fusion(%cache, %v, %pos), kind=kLoop, calls=%f
}}
"""


def _excess(text):
    m = parse_module(text)
    return run_pipeline(m, None).excess


@pytest.mark.parametrize("text", [SGD_GPU, SGD_TPU], ids=["fusion", "vmem_then_copy"])
def test_parameter_update_written_once_is_compulsory(text):
    ex = _excess(text)
    # p read (4 KiB), g read (4 KiB), p' written (4 KiB); nothing is excess
    assert ex.compulsory_bytes == 3 * N * 4
    assert ex.compiled_bytes == 3 * N * 4
    assert not [c for c in ex.causes if c.kind == "whole_rewrite"]


def test_masked_rewrite_of_a_donated_buffer_stays_excess():
    ex = _excess(MASKED)
    wr = [c for c in ex.causes if c.kind == "whole_rewrite"]
    assert wr, [(c.kind, c.bytes) for c in ex.causes]
    # the cache written whole (4 KiB): at most one element of it (4 B) is the update
    assert sum(c.bytes for c in wr) >= N * 4 - 4
