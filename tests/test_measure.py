"""measure: inputs and donation, profile events joined to instructions, coverage.

The join is checked two ways: on hand-made events for a hand-written HLO module (exclusive
times of a while loop worked out by hand), and on real XLA:CPU profiles, against the
kernel-level instructions read from the HLO and the trip count the config implies.
No assertion depends on how fast anything ran.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmove.api import TargetError
from jaxmove.hlo import parse_module
from jaxmove.measure import ProfileError, TraceEvent, join_events, measure, prepare, random_like
from jaxmove.measure.profile import module_events

# ----------------------------------------------------------------------------- synthetic join

LOOP_HLO = """HloModule m

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4] get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %y = f32[4] exponential(%x)
  ROOT %t = (s32[], f32[4]) tuple(%i1, %y)
}

%cond (q: (s32[], f32[4])) -> pred[] {
  %q = (s32[], f32[4]) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], f32[4]) tuple(%z, %a)
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  %r = f32[4] get-tuple-element(%w), index=1
  ROOT %neg = f32[4] negate(%r)
}
"""


def _ev(op, start, dur, run, line="t0", module="m", plane="/host:CPU", dev=0):
    return TraceEvent(module, op, op or "wait", float(start), float(dur), run, dev, plane, line)


def _loop_run(run: int, t0: float, neg_ns: float) -> list[TraceEvent]:
    """One run: a 3-iteration while spanning [t0+100, t0+1100), then negate.

    Iteration k (offset 250k): i1 [150,200) on thread t1, y [180,280) on thread t2 (they
    overlap by 20 ns), lt [300,320); a 4th condition check lt at [900,920).
    """
    evs = [_ev("w", t0 + 100, 1000, run)]
    for k in range(3):
        o = t0 + 250 * k
        evs += [_ev("i1", o + 150, 50, run, "t1"), _ev("y", o + 180, 100, run, "t2"),
                _ev("lt", o + 300, 20, run)]
    evs += [_ev("lt", t0 + 900, 20, run), _ev("neg", t0 + 1200, neg_ns, run),
            _ev("mystery", t0 + 1300, 10, run)]
    return evs


def test_join_while_loop_exclusive_times_by_hand():
    module = parse_module(LOOP_HLO)
    events = _loop_run(1, 0, 40) + _loop_run(2, 10_000, 60) + _loop_run(3, 20_000, 50)
    j = join_events(events, module)
    ns = 1e-9
    # Union of the loop's inner events: 3 x ([150,280) + [300,320)) + [900,920) = 3*150 + 20.
    assert j.instructions[("main", "w")].time_s == pytest.approx((1000 - 470) * ns)
    assert j.instructions[("body", "i1")].time_s == pytest.approx(150 * ns)
    assert j.instructions[("body", "y")].time_s == pytest.approx(300 * ns)
    assert j.instructions[("cond", "lt")].time_s == pytest.approx(80 * ns)
    assert j.instructions[("main", "neg")].time_s == pytest.approx(50 * ns)   # median of 40, 60, 50
    assert j.instructions[("main", "neg")].run_times_s == pytest.approx((40 * ns, 60 * ns, 50 * ns))
    assert j.instructions[("body", "i1")].executions == 3
    assert j.instructions[("cond", "lt")].executions == 4
    assert j.runs == 3
    assert j.unjoined_s == pytest.approx({"mystery": 10 * ns})
    # per run: joined 530 + 150 + 300 + 80 + neg; device = joined + 10 (the unjoined event)
    assert j.joined_time_s == pytest.approx((1060 + 50) * ns)
    assert j.device_time_s == pytest.approx((1070 + 50) * ns)
    assert j.coverage == pytest.approx(1110 / 1120)
    assert j.span_s == pytest.approx((1300 + 10 - 100) * ns)


def test_join_without_run_ids_divides_by_expected_runs():
    module = parse_module(LOOP_HLO)
    events = [dataclass_replace(e, run_id=None) for e in _loop_run(1, 0, 40) + _loop_run(2, 10_000, 60)]
    with pytest.raises(ProfileError, match="run_id"):
        join_events(events, module)
    j = join_events(events, module, expected_runs=2)
    assert j.runs == 2
    assert j.instructions[("main", "neg")].time_s == pytest.approx(50e-9)   # (40 + 60) / 2
    assert j.instructions[("body", "y")].executions == 3
    assert j.span_s is None


def dataclass_replace(e, **kw):
    import dataclasses
    return dataclasses.replace(e, **kw)


_WRAPPED = """HloModule w

%fused_red (p: f32[8,4]) -> f32[8] {
  %p = f32[8,4] parameter(0)
  %c = f32[] constant(0)
  ROOT %reduce.7 = f32[8] reduce(%p, %c), dimensions={1}, to_apply=%add
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%wrapped (q: f32[8]) -> f32[8] {
  %q = f32[8] parameter(0)
  ROOT %all-reduce.3 = f32[8] all-reduce(%q), replica_groups={}, to_apply=%add
}

ENTRY %main (a: f32[8,4]) -> f32[8] {
  %a = f32[8,4] parameter(0)
  %fusion.1 = f32[8] fusion(%a), kind=kLoop, calls=%fused_red
  %ars = ((f32[8]), f32[8]) async-start(%fusion.1), calls=%wrapped
  ROOT %ard = f32[8] async-done(%ars), calls=%wrapped
}
"""


def test_join_charges_events_inside_a_fusion_or_an_async_op_to_it():
    """A kernel named after an instruction inside a fusion (a reduction's second kernel) is the
    fusion's; one named after the collective an async-start wraps is the start's; a name the
    text does not show joins through ``aliases`` (a user trial found 3.3 ms of a Pax capture's
    reduce-scatters left unjoined)."""
    m = parse_module(_WRAPPED)
    evs = [_ev("fusion.1", 0, 30, 0), _ev("reduce.7", 40, 12, 0), _ev("all-reduce.3", 60, 25, 0),
           _ev("reduce-scatter.9", 90, 7, 0), _ev("nowhere", 100, 1, 0)]
    j = join_events(evs, m, aliases={"reduce-scatter.9": "ars"})
    t = {name: it.time_s for (_c, name), it in j.instructions.items()}
    assert t == {"fusion.1": pytest.approx(42e-9), "ars": pytest.approx(32e-9)}
    assert j.instructions[("main", "fusion.1")].executions == 2   # two kernels per run
    assert j.unjoined_s == {"nowhere": pytest.approx(1e-9)}
    assert j.joined_time_s == pytest.approx(74e-9) and j.device_time_s == pytest.approx(75e-9)


def test_module_events_prefers_device_planes_and_names_what_it_saw():
    host = [_ev("neg", 0, 5, 1, plane="/host:CPU"), _ev("neg", 0, 5, 1, module="other")]
    dev = [_ev("neg", 1, 3, 1, plane="/device:GPU:0", line="Stream #1")]
    assert module_events(host + dev, "m") == dev
    assert module_events(host, "m") == host[:1]
    with pytest.raises(ProfileError, match="modules seen: m, other"):
        module_events(host, "jit_missing")


# ----------------------------------------------------------------------------- inputs

def test_random_like_shapes_dtypes_and_concrete_leaves_kept():
    S = jax.ShapeDtypeStruct
    keep = jnp.arange(3)
    out = random_like({"w": S((2, 3), jnp.bfloat16), "i": S((4,), jnp.int32),
                       "m": S((2,), jnp.bool_), "k": keep})
    assert out["w"].shape == (2, 3) and out["w"].dtype == jnp.bfloat16
    assert np.all(np.asarray(out["i"]) == 0) and out["i"].dtype == jnp.int32
    assert out["m"].dtype == jnp.bool_ and out["k"] is keep


def test_hlo_file_cannot_be_measured(tmp_path):
    p = tmp_path / "m.hlo"
    p.write_text(LOOP_HLO)
    with pytest.raises(TargetError, match="cannot be run"):
        prepare(str(p))


def test_donated_arguments_are_fresh_each_run():
    def step(w, cache):
        return cache.at[0].add(w.sum())

    S = jax.ShapeDtypeStruct
    prep = prepare(step, S((8,), jnp.float32), S((16,), jnp.float32), donate_argnums=(1,))
    assert prep.donated == (1,)
    a, b = prep.fresh_args(), prep.fresh_args()
    assert a[1] is not b[1] and a[0] is b[0]
    prep.compiled(*a)
    assert a[1].is_deleted() and not prep.args[1].is_deleted()


# ----------------------------------------------------------------------------- real profiles

_QUIET = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}


@pytest.fixture(scope="module")
def mlp_tiny():
    return measure("mlp-tiny", runs=3, warmup=1, profile_runs=3)


def test_mlp_tiny_join_covers_every_kernel(mlp_tiny):
    m = mlp_tiny
    module = parse_module(m.program.hlo_text)
    kernels = {(module.entry.name, i.name) for i in module.entry.instructions if i.opcode not in _QUIET}
    # 2 layers x (up dot, bias + GELU, down dot, bias) = 8 kernel-level fusions, each run once
    assert len(kernels) == 8
    assert set(m.instructions) == kernels
    assert all(t.executions == 1 for t in m.instructions.values())
    assert m.coverage >= 0.95
    assert m.profile.runs == 3 and len(m.wall_times_s) == 3
    assert m.wall_min_s <= m.wall_median_s <= m.wall_max_s
    js = m.to_json()
    assert js["profile"]["coverage"] == m.coverage and len(js["profile"]["instructions"]) == 8


@pytest.mark.parametrize("scan", ["false", "true"])
def test_gpt_tiny_decode_join(scan):
    # decode donates its KV cache: three profiled runs after warm-up and timed runs only
    # succeed when every run gets a fresh cache.
    m = measure("gpt-tiny-decode", overrides={"scan_layers": scan, "layers": "2"},
                runs=2, warmup=1, profile_runs=3)
    module = parse_module(m.program.hlo_text)
    names = {(c.name, i.name): i for c in module.computations.values() for i in c.instructions}
    assert set(m.instructions) <= set(names)
    assert m.coverage >= 0.95
    entry_kernels = {(module.entry.name, i.name) for i in module.entry.instructions
                     if i.opcode not in _QUIET}
    assert entry_kernels <= set(m.instructions)
    loops = [i for i in module.entry.instructions if i.opcode == "while"]
    if scan == "true":
        (loop,) = loops
        body = loop.attrs["body"].lstrip("%")
        in_body = [t for t in m.instructions.values() if t.computation == body]
        assert in_body and all(t.executions == 2 for t in in_body)   # layers=2 iterations
        assert m.instructions[(module.entry.name, loop.name)].executions == 1
    else:
        assert not loops


@pytest.mark.parametrize("preset", [p for p in __import__("jaxmove.zoo", fromlist=["PRESETS"]).PRESETS if "tiny" in p])
def test_every_tiny_preset_join_covers_95_percent(preset):
    m = measure(preset, runs=1, warmup=1, profile_runs=2)
    module = parse_module(m.program.hlo_text)
    names = {(c.name, i.name) for c in module.computations.values() for i in c.instructions}
    assert m.instructions and set(m.instructions) <= names
    assert m.coverage >= 0.95


def test_join_by_kernel_name_where_an_event_has_no_hlo_op():
    """rocprofiler drops ``hlo_op`` for some kernels of an execution: XLA:GPU names a kernel
    after its instruction with '.' made '_' (plus '.kd' there), so ``fusion_1.kd`` is
    ``fusion.1``; a library kernel (``Im3d2Col.kd``) names no instruction and stays unjoined."""
    m = parse_module(_WRAPPED)
    evs = [_ev("fusion.1", 0, 30, 0), _ev(None, 50, 10, 1), _ev(None, 70, 4, 1)]
    evs[1] = TraceEvent("m", None, "fusion_1.kd", 50.0, 10.0, 1, 0, "/host:CPU", "t0")
    evs[2] = TraceEvent("m", None, "Im3d2Col.kd", 70.0, 4.0, 1, 0, "/host:CPU", "t0")
    j = join_events(evs, m)
    assert j.instructions[("main", "fusion.1")].run_times_s == pytest.approx((30e-9, 10e-9))
    assert list(j.unjoined_s) == ["Im3d2Col.kd"]
