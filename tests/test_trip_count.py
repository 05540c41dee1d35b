"""Trip counts derived from a loop's induction variable when ``known_trip_count`` is absent.

Each hand-written loop states its trip count as the number of values the counter takes, counted
here by running the loop in Python; a TPU scan over N layers counts N trips and N layers' FLOPs.
"""

from __future__ import annotations

import pytest

from jaxmove.hlo import parse_module
from jaxmove.passes.multiplicity import callee_counts, loop_notes, multiplicity_pass
from jaxmove.passes.pipeline import analyze_module
from jaxmove.passes.trip_count import trip_count

from .device_compile import abstract, compile_tpu, tpu_mesh

OPS = {"LT": lambda a, b: a < b, "LE": lambda a, b: a <= b, "GT": lambda a, b: a > b,
       "GE": lambda a, b: a >= b, "NE": lambda a, b: a != b, "EQ": lambda a, b: a == b}


def python_trips(init: int, step: int, direction: str, bound: int, limit: int = 10_000) -> int:
    i, n = init, 0
    while OPS[direction](i, bound):
        i += step
        n += 1
        assert n < limit
    return n


def loop(init: int, step: int, direction: str, bound: int, *, update: str = "add",
         swap: bool = False, ktc: int | None = None) -> str:
    """A while over (s32 counter, f32[8] value) whose body runs f32 work once per trip."""
    op = "subtract" if update == "subtract" else "add"
    c = -step if update == "subtract" else step
    cmp = f"compare(b, i), direction={direction}" if swap else f"compare(i, b), direction={direction}"
    bc = f', backend_config={{"known_trip_count":{{"n":"{ktc}"}}}}' if ktc is not None else ""
    return f"""HloModule m
body {{
  p = (s32[], f32[8]{{0}}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8]{{0}} get-tuple-element(p), index=1
  s = s32[] constant({c})
  j = s32[] {op}(i, s)
  y = f32[8]{{0}} multiply(x, x)
  ROOT t = (s32[], f32[8]{{0}}) tuple(j, y)
}}
cond {{
  p = (s32[], f32[8]{{0}}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  b = s32[] constant({bound})
  ROOT c = pred[] {cmp}
}}
ENTRY e {{
  a = s32[] constant({init})
  x = f32[8]{{0}} parameter(0)
  t = (s32[], f32[8]{{0}}) tuple(a, x)
  ROOT w = (s32[], f32[8]{{0}}) while(t), condition=cond, body=body{bc}
}}
"""


def body_count(text: str) -> tuple[int, bool]:
    m = multiplicity_pass(parse_module(text))
    return m["body"].count, m["body"].unknown_trip_count


@pytest.mark.parametrize("init,step,direction,bound", [
    (0, 1, "LT", 8),      # a scan: 8 trips
    (2147483600, 10, "LT", 2147483637),   # 4 trips, ends at 2147483640 <= 2^31 - 1: no wrap
    (0, 2, "LT", 4),      # the windowed einsum of issue 12: 2 trips
    (0, 2, "LT", 5),      # step not dividing the range: 0, 2, 4
    (1, 3, "LE", 10),     # 1, 4, 7, 10
    (7, -1, "GT", 0),     # decreasing: 7..1
    (9, -2, "GE", 0),     # 9, 7, 5, 3, 1
    (0, 4, "NE", 12),     # 0, 4, 8
    (5, 1, "LT", 5),      # the condition fails at once: 0 trips
    (3, 1, "EQ", 3),      # runs once
])
def test_derived_trip_counts(init, step, direction, bound):
    n = python_trips(init, step, direction, bound)
    assert body_count(loop(init, step, direction, bound)) == (n, False)
    # and with the counter on the right of the comparison
    swapped = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "NE": "NE", "EQ": "EQ"}[direction]
    assert body_count(loop(init, step, swapped, bound, swap=True)) == (n, False)


def test_decreasing_counter_by_subtract():
    n = python_trips(10, -3, "GT", 0)  # 10, 7, 4, 1
    assert body_count(loop(10, -3, "GT", 0, update="subtract")) == (n, False)


def test_flops_multiply_by_derived_trips():
    a = analyze_module(parse_module(loop(0, 2, "LT", 4)))
    mul = next(r for r in a.rows if r.instr.name == "y")
    assert mul.multiplicity.count == 2 and mul.total.flops == 2 * 8
    assert a.totals.flops >= 2 * 8
    assert any("2 trips derived" in n and "step +2" in n for n in a.notes)


def test_known_trip_count_wins():
    assert body_count(loop(0, 1, "LT", 8, ktc=3)) == (3, False)
    m = parse_module(loop(0, 1, "LT", 8, ktc=3))
    assert trip_count(m.entry.root, m).source == "known_trip_count"


def test_known_trip_count_the_condition_contradicts_is_noted():
    """XLA's annotation is kept, but a loop condition that gives another count (a hand-edited
    dump: init 0, `> 128` runs 0 times, annotated 5) is a note, not silence."""
    a = analyze_module(parse_module(loop(0, 1, "GT", 128, ktc=5)))
    mul = next(r for r in a.rows if r.instr.name == "y")
    assert mul.multiplicity.count == 5
    assert any("known_trip_count 5, but its loop condition gives 0" in n for n in a.notes), a.notes
    agree = analyze_module(parse_module(loop(0, 1, "LT", 8, ktc=8)))
    assert not any("known_trip_count" in n for n in agree.notes), agree.notes


@pytest.mark.parametrize("init,step,direction,bound,why", [
    (0, -1, "LT", 8, "never reaches the bound"),   # moves away: would wrap
    (0, 3, "NE", 8, "never reaches the bound"),    # skips over the bound
    # s32: 2147483600 + 10 k stays below the bound until 2147483640; the next step, 2^31 + 2,
    # wraps negative and the loop runs on (a user trial got "5 trips, complete")
    (2147483600, 10, "LT", 2147483647, "overflow s32"),
    (-2147483600, -10, "GT", -2147483647, "overflow s32"),
])
def test_not_derived_when_the_loop_would_wrap(init, step, direction, bound, why):
    text = loop(init, step, direction, bound)
    assert body_count(text) == (1, True)
    notes = loop_notes(parse_module(text))
    assert len(notes) == 1 and "trip count unknown" in notes[0] and why in notes[0]


def test_not_derived_when_init_is_a_parameter():
    text = loop(0, 1, "LT", 8).replace("a = s32[] constant(0)", "a = s32[] parameter(1)")
    assert body_count(text) == (1, True)
    (note,) = loop_notes(parse_module(text))
    assert "initial value" in note and "not a constant" in note


def test_not_derived_when_step_is_not_constant():
    text = loop(0, 1, "LT", 8).replace("s = s32[] constant(1)", "s = s32[] get-tuple-element(p), index=0")
    assert body_count(text) == (1, True)
    assert "stepped by a constant" in loop_notes(parse_module(text))[0]


def test_not_derived_when_condition_is_not_a_comparison():
    text = loop(0, 1, "LT", 8).replace("ROOT c = pred[] compare(i, b), direction=LT",
                                        "ROOT c = pred[] constant(true)")
    assert body_count(text) == (1, True)
    assert "not a comparison" in loop_notes(parse_module(text))[0]


# The forms XLA:TPU prints: the counter copied to SMEM and the step added inside a fusion, the
# comparison fused, the bound a loop-invariant state element, the init a copy of a constant.
TPU_FORM = """HloModule m
add_fused {
  a = s32[]{:T(128)S(6)} parameter(0)
  one = s32[]{:T(128)} constant(2)
  ROOT r = s32[]{:T(128)} add(a, one)
}
cmp_fused {
  a = s32[]{:T(128)} parameter(0)
  b = s32[]{:T(128)} parameter(1)
  ROOT c = pred[]{:T(512)} compare(a, b), direction=LT
}
body {
  p = (s32[]{:T(128)}, f32[8]{0:T(128)}, s32[]{:T(128)}) parameter(0)
  i = s32[]{:T(128)} get-tuple-element(p), index=0
  c = s32[]{:T(128)S(6)} copy(i)
  j = s32[]{:T(128)} fusion(c), kind=kLoop, calls=add_fused
  x = f32[8]{0:T(128)} get-tuple-element(p), index=1
  y = f32[8]{0:T(128)} multiply(x, x)
  n = s32[]{:T(128)} get-tuple-element(p), index=2
  ROOT t = (s32[]{:T(128)}, f32[8]{0:T(128)}, s32[]{:T(128)}) tuple(j, y, n)
}
cond {
  p = (s32[]{:T(128)}, f32[8]{0:T(128)}, s32[]{:T(128)}) parameter(0)
  i = s32[]{:T(128)} get-tuple-element(p), index=0
  n = s32[]{:T(128)} get-tuple-element(p), index=2
  ROOT c = pred[]{:T(512)} fusion(i, n), kind=kLoop, calls=cmp_fused
}
ENTRY e {
  z = s32[]{:T(128)} constant(0)
  a = s32[]{:T(128)} copy(z)
  bound = s32[]{:T(128)} constant(11)
  x = f32[8]{0:T(128)} parameter(0)
  t = (s32[]{:T(128)}, f32[8]{0:T(128)}, s32[]{:T(128)}) tuple(a, x, bound)
  ROOT w = (s32[]{:T(128)}, f32[8]{0:T(128)}, s32[]{:T(128)}) while(t), condition=cond, body=body
}
"""


def test_tpu_form_through_copies_fusions_and_invariant_bound():
    assert body_count(TPU_FORM) == (python_trips(0, 2, "LT", 11), False)


def test_nested_derived_loops_multiply():
    inner = loop(0, 1, "LT", 3)
    m = parse_module(inner)
    assert trip_count(m.entry.root, m).n == 3
    outer_body = """outer_body {
  p = (s32[], f32[8]{0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8]{0} get-tuple-element(p), index=1
  a = s32[] constant(0)
  t = (s32[], f32[8]{0}) tuple(a, x)
  w = (s32[], f32[8]{0}) while(t), condition=cond, body=body
  y = f32[8]{0} get-tuple-element(w), index=1
  s = s32[] constant(1)
  j = s32[] add(i, s)
  ROOT r = (s32[], f32[8]{0}) tuple(j, y)
}
outer_cond {
  p = (s32[], f32[8]{0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  b = s32[] constant(5)
  ROOT c = pred[] compare(i, b), direction=LT
}
"""
    head, entry = inner.split("ENTRY e {")
    text = head + outer_body + """ENTRY e {
  a = s32[] constant(0)
  x = f32[8]{0} parameter(0)
  t = (s32[], f32[8]{0}) tuple(a, x)
  ROOT w = (s32[], f32[8]{0}) while(t), condition=outer_cond, body=outer_body
}
"""
    mult = multiplicity_pass(parse_module(text))
    assert mult["outer_body"].count == 5 and mult["body"].count == 5 * 3
    assert mult["cond"].count == 5 * (3 + 1) and not mult["body"].unknown_trip_count


def test_callee_counts_with_module():
    m = parse_module(loop(0, 2, "LT", 4))
    w = m.entry.root
    assert callee_counts(w, m)[0][:3] == ("body", 2, False)
    assert callee_counts(w)[0][:3] == ("body", 1, True)  # without the module: not derived


# ---- a scan over N layers compiled for TPU ------------------------------------------------

N_LAYERS, BATCH, D = 6, 16, 256


@pytest.fixture(scope="module")
def tpu_scan():
    import jax
    import jax.numpy as jnp
    mesh = tpu_mesh(1)

    def scanned(ws, x):
        def body(x, w):
            return jnp.tanh(x @ w), None
        return jax.lax.scan(body, x, ws)[0]

    c = compile_tpu(scanned, abstract(mesh, (N_LAYERS, D, D), jnp.bfloat16),
                    abstract(mesh, (BATCH, D), jnp.bfloat16))
    return parse_module(c.as_text())


def test_tpu_scan_counts_n_trips_and_n_layers_of_flops(tpu_scan):
    a = analyze_module(tpu_scan)
    (w,) = [i for c in tpu_scan.computations.values() for i in c.instructions if i.opcode == "while"]
    tc = trip_count(w, tpu_scan)
    assert w.known_trip_count is None and tc.source == "derived"  # XLA:TPU wrote none
    assert tc.n == N_LAYERS
    body = w.attrs["body"].lstrip("%")
    assert a.multiplicity[body].count == N_LAYERS and not a.multiplicity[body].unknown_trip_count
    one_layer = 2 * BATCH * D * D  # the matmul; tanh and converts add BATCH * D per layer each
    assert N_LAYERS * one_layer <= a.totals.flops <= N_LAYERS * (one_layer + 8 * BATCH * D)
    # the stacked weights are read once in all: one layer's slice per trip
    assert a.totals.hbm_read_bytes >= N_LAYERS * D * D * 2


def test_unknown_trip_count_makes_the_report_incomplete(tmp_path, capsys):
    # the body's multiply is counted once (f32[8]: 32 bytes read, 32 written, 8 flops) where it
    # runs an unknown number of times: the report says its totals are lower bounds
    import json

    from jaxmove.cli import main

    text = loop(0, 1, "LT", 8).replace("a = s32[] constant(0)", "a = s32[] parameter(1)")
    p = tmp_path / "unknown.hlo"
    p.write_text(text)
    import jaxmove
    rep = jaxmove.analyze(str(p))
    assert rep.unknown_trip_loops == [{"computation": "e", "while": "w",
                                       "why": rep.unknown_trip_loops[0]["why"]}]
    assert "initial value" in rep.unknown_trip_loops[0]["why"]
    assert not rep.unmodeled and not rep.complete
    assert rep.incomplete_headline().startswith("incomplete: 1 while loop with an unknown trip count")
    (mul,) = [r for r in rep.analysis.rows if r.instr.name == "y"]
    assert mul.total.flops == 8 and mul.total.hbm_read_bytes == 32  # once, for 8 trips
    assert main(["analyze", str(p), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["complete"] is False and d["unmodeled_count"] == 0
    assert [(x["computation"], x["while"]) for x in d["unknown_trip_count_loops"]] == [("e", "w")]
    # a loop whose count is derived leaves the report complete
    p.write_text(loop(0, 1, "LT", 8))
    rep = jaxmove.analyze(str(p))
    assert rep.unknown_trip_loops == [] and rep.complete and rep.incomplete_headline() is None
    assert main(["analyze", str(p)]) == 0
    assert "incomplete" not in capsys.readouterr().out
