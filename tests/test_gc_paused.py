"""The passes that build one record per instruction run with the cyclic GC paused
(``_perf.gc_paused``): with the collector running, a 100k-instruction module's
``analyze_module`` took 0.43 s instead of 0.14 s (benchmarks/parse_speed.py), after a helper
function was inserted between the decorator and the function it decorated."""

from __future__ import annotations

import gc

import pytest

from jaxmove._perf import gc_paused
from jaxmove.hlo import parser as parser_mod
from jaxmove.passes import excess as excess_mod
from jaxmove.passes import pipeline, reuse
from jaxmove.report import json_out

_WRAPPER_CODE = gc_paused(lambda: None).__code__


@pytest.mark.parametrize("fn", [parser_mod.parse_module, pipeline.analyze_module, reuse.reuse_pass,
                                excess_mod.excess_pass, json_out.write_json],
                         ids=lambda f: f.__name__)
def test_the_per_instruction_passes_are_wrapped_by_gc_paused(fn):
    assert fn.__code__ is _WRAPPER_CODE, f"{fn.__name__} is not decorated with gc_paused"
    assert not hasattr(fn.__wrapped__, "__wrapped__")   # (the function itself, once)


def test_gc_paused_pauses_and_restores():
    seen = []
    gc_paused(lambda: seen.append(gc.isenabled()))()
    assert seen == [False] and gc.isenabled()
