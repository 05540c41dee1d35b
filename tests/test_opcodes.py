"""The one opcode table (jaxmove/hlo/opcodes.py): every pass and the validator agree with it."""

from __future__ import annotations

import pytest

from jaxmove.hlo import opcodes, parse_module
from jaxmove.hlo import parser as hlo_parser
from jaxmove.hlo import validate
from jaxmove.hlo.opcodes import CUSTOM_CALL_TARGETS, OPCODES, names
from jaxmove.passes import collectives, first_touch, flops, multiplicity, roles, timing, traffic
from jaxmove.passes.pipeline import analyze_module

# XLA's HLO_OPCODE_LIST (xla/hlo/ir/hlo_opcode.h), copied by hand: the table must know them all.
XLA_OPCODES = """abs acos acosh add add-dependency after-all all-gather all-gather-done
all-gather-start all-reduce all-reduce-done all-reduce-start all-to-all and asin asinh async-done
async-start async-update atan atan2 atanh batch-norm-grad batch-norm-inference batch-norm-training
bitcast bitcast-convert broadcast call cbrt ceil cholesky clamp count-leading-zeros
collective-broadcast collective-permute collective-permute-done collective-permute-start
collective-reduce compare complex concatenate conditional constant convert convolution copy
copy-done copy-start cosine cosh custom-call divide domain dot dynamic-reshape dynamic-slice
dynamic-update-slice erf exponential exponential-minus-one fft floor fusion gather
get-dimension-size get-tuple-element imag infeed iota is-finite log log-plus-one logistic map
maximum minimum mulhi multiply negate not opt-barrier or outfeed pad parameter partition-id popcnt
power ragged-all-to-all ragged-dot real recv recv-done reduce reduce-precision reduce-scatter
reduce-window remainder replica-id reshape reverse rng rng-bit-generator rng-get-and-update-state
round-nearest-afz round-nearest-even rsqrt scaled-dot scatter select select-and-scatter send
send-done set-dimension-size shift-left shift-right-arithmetic shift-right-logical sign sine sinh
slice sort sqrt stochastic-convert subtract tan tanh topk transpose triangular-solve tuple while
xor""".split()


def test_table_knows_every_xla_opcode():
    missing = [op for op in XLA_OPCODES if op not in OPCODES]
    assert not missing, missing


def test_every_record_is_well_formed():
    for name, op in OPCODES.items():
        assert op.name == name
        assert op.category in opcodes.CATEGORIES, name
        assert op.arity == "variadic" or isinstance(op.arity, int) or op.arity in opcodes._ARITY_RULES
        if op.transcendental:
            assert op.elementwise, name
        if op.async_part is not None:
            assert op.async_part in ("start", "update", "done"), name
        if op.async_part == "start":
            assert op.async_queue in ("network", "copy", "async_call"), name
        if not op.moves_data:
            assert not op.element_preserving or name == "bitcast", name


def test_async_sugar_families_are_complete():
    for w in opcodes.ASYNC_WRAPPED:
        assert w in OPCODES
        for part in ("start", "update", "done"):
            rec = OPCODES[f"{w}-{part}"]
            assert rec.async_part == part and rec.async_of == w
            assert opcodes.is_async_sugar(rec.name)
        assert not OPCODES[f"{w}-done"].moves_data  # the start carries the transfer
    assert not opcodes.is_async_sugar("all-reduce-start")  # a native pair, not sugar


def test_every_rule_table_key_is_a_known_opcode():
    tables = {
        "traffic.TRAFFIC_RULES": traffic.TRAFFIC_RULES,
        "traffic._RULE_OF": traffic._RULE_OF,
        "flops.FLOP_RULES": flops.FLOP_RULES,
        "collectives._KIND_OF": collectives._KIND_OF,
        "timing._ASYNC_STARTS": timing._ASYNC_STARTS,
    }
    sets = {
        "traffic.FREE_OPCODES": traffic.FREE_OPCODES,
        "traffic.ELEMENT_PRESERVING": traffic.ELEMENT_PRESERVING,
        "flops.ZERO_FLOP_OPCODES": flops.ZERO_FLOP_OPCODES,
        "flops.ELEMENTWISE_OPCODES": flops.ELEMENTWISE_OPCODES,
        "roles.PASSTHROUGH": roles.PASSTHROUGH,
        "roles._FUSED_PASSTHROUGH": roles._FUSED_PASSTHROUGH,
        "roles._BACK_THROUGH": roles._BACK_THROUGH,
        "timing.COLLECTIVE_OPCODES": timing.COLLECTIVE_OPCODES,
        "timing._ASYNC_DONES": timing._ASYNC_DONES,
        "first_touch._ALIAS_OPCODES": first_touch._ALIAS_OPCODES,
        "multiplicity.CONTROL_FLOW_OPCODES": multiplicity.CONTROL_FLOW_OPCODES,
        "validate._ARITY": set(validate._ARITY),
        "validate._SAME_DIMS": validate._SAME_DIMS,
        "parser._SAME_SHAPE_AS_OPERAND0": hlo_parser._SAME_SHAPE_AS_OPERAND0,
    }
    for where, keys in {**tables, **sets}.items():
        unknown = sorted(set(keys) - set(OPCODES))
        assert not unknown, f"{where}: {unknown}"


def test_every_opcode_has_a_rule_in_every_pass_or_moves_nothing():
    for name, op in OPCODES.items():
        # traffic: a rule for every opcode; the ones declared as moving nothing get _free
        assert name in traffic._RULE_OF, name
        assert (traffic._RULE_OF[name] is traffic._free) == (not op.moves_data), name
        # flops: a rule for every opcode; the ones declared as computing nothing get _zero
        assert name in flops.FLOP_RULES, name
        if not op.computes:
            assert flops.FLOP_RULES[name] is flops._zero, name
        # collectives: every collective but a *-done has a kind
        want = op.collective if op.async_part != "done" else None
        assert collectives.collective_kind(name) == want, name
    assert traffic.FREE_RULE_OPCODES == names(moves_data=False)


def test_scaled_dot_has_a_traffic_rule():
    # (drifted before the table: a flop rule but "opcode 'scaled-dot' has no traffic rule")
    text = """HloModule m
ENTRY e {
  a = bf16[8,64]{1,0} parameter(0)
  b = bf16[64,16]{1,0} parameter(1)
  sa = f32[8,2]{1,0} parameter(2)
  sb = f32[2,16]{1,0} parameter(3)
  ROOT d = bf16[8,16]{1,0} scaled-dot(a, b, sa, sb), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}"""
    an = analyze_module(parse_module(text, "sd.hlo"))
    row = next(r for r in an.rows if r.instr.name == "d")
    assert not row.unmodeled, row.unmodeled
    assert row.per_execution.hbm_read_bytes == 8 * 64 * 2 + 64 * 16 * 2 + 8 * 2 * 4 + 2 * 16 * 4
    assert row.per_execution.hbm_write_bytes == 8 * 16 * 2
    assert row.per_execution.flops == 2 * 8 * 16 * 64


def test_an_opcode_outside_the_table_is_unmodeled_not_guessed():
    text = """HloModule m
ENTRY e {
  a = f32[4]{0} parameter(0)
  ROOT w = f32[4]{0} widget(a)
}"""
    an = analyze_module(parse_module(text, "w.hlo"))
    row = next(r for r in an.rows if r.instr.name == "w")
    assert "opcode 'widget' has no traffic rule" in row.unmodeled
    assert "opcode 'widget' has no cost rule" in row.unmodeled
    assert row.per_execution.hbm_bytes == 0


def test_custom_call_records_have_rules():
    for name, rec in CUSTOM_CALL_TARGETS.items():
        has_rule = name in flops.CUSTOM_CALL_RULES or any(
            name == p for p, _r in flops.CUSTOM_CALL_PREFIX_RULES)
        if rec.computes:
            assert has_rule, f"{name} computes but has no flop rule"
        else:
            assert not has_rule, f"{name} is declared as computing nothing but has a flop rule"
    for name in flops.CUSTOM_CALL_RULES:
        assert name in CUSTOM_CALL_TARGETS, name
    for p, _r in flops.CUSTOM_CALL_PREFIX_RULES:
        assert p in CUSTOM_CALL_TARGETS and p in opcodes.CUSTOM_CALL_PREFIXES
    assert opcodes.custom_call_target("__cudnn$fmhaSoftmaxBackward").name == "__cudnn$fmha"
    assert opcodes.custom_call_target("NoSuchTarget") is None


@pytest.mark.parametrize("target", sorted(n for n, r in CUSTOM_CALL_TARGETS.items() if not r.moves_data))
def test_custom_calls_that_move_nothing(target):
    text = f"""HloModule m
ENTRY e {{
  a = bf16[16,128]{{1,0}} parameter(0)
  ROOT c = bf16[16,128]{{1,0}} custom-call(a), custom_call_target="{target}"
}}"""
    an = analyze_module(parse_module(text, "cc.hlo"))
    row = next(r for r in an.rows if r.instr.name == "c")
    assert not row.unmodeled
    assert row.per_execution.hbm_bytes == 0 and row.per_execution.flops == 0


def test_names_rejects_unknown_attributes():
    with pytest.raises(AttributeError):
        names(no_such_flag=True)


def test_arity_descriptions_match_the_validator_messages():
    assert opcodes.arity_check("add")[0] == "2 operands"
    assert opcodes.arity_check("negate")[0] == "1 operand"
    assert opcodes.arity_check("iota")[0] == "no operands"
    assert opcodes.arity_check("reduce")[0] == "an even number (>= 2) of operands: inputs then init values"
    assert opcodes.arity_check("conditional")[0] == "at least 1 operand (the predicate or branch index)"
    assert opcodes.arity_check("tuple") is None and opcodes.arity_check("widget") is None
