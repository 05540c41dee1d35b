"""Signatures of called computations, scatter shapes, replica-group ids, E(n) and unreadable paths.

Found by a user trial: HLO that XLA's verifier rejects was analysed with numbers read from the
declared (wrong) shapes, with exit 0: a fusion fed f32[64,256] through a f32[128,256] parameter,
a fusion declaring f32[4096] around a computation that returns f32[8], a while whose body drops
half the loop state, a conditional branch taking f32[16] for an f32[8] operand, a scatter whose
update window (99999) is wider than its operand (8), replica groups naming device 7 in a module
of 4 replicas, ``E(4)`` on f32 (counted at an eighth of its bytes), and a symbolic link loop
that ended in "internal error". Each bad module below is an ``HloParseError`` at the
instruction (or shape) with what was expected; each corrected one parses.
"""

from __future__ import annotations

import os

import pytest

from jaxmove.cli import main
from jaxmove.hlo import HloParseError, parse_module
from jaxmove.hlo.errors import HloFileError
from jaxmove.hlo.parser import read_hlo_text

ADD = """add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""


def _raises(text: str, line: int, col: int, *parts: str) -> str:
    with pytest.raises(HloParseError) as ei:
        parse_module(text, "t.hlo")
    e = ei.value
    msg = str(e)
    assert msg.startswith(f"t.hlo:{line}:{col}: "), msg
    assert "expected" in e.expected, msg
    for p in parts:
        assert p in msg, msg
    return msg


# ---- fusion and call: operands vs parameters, result vs root ---------------------------------

FUSION = """HloModule m
fused {
  p = f32[128,256]{1,0} parameter(0)
  ROOT n = f32[128,256]{1,0} negate(p)
}
ENTRY main {
  a = OPERAND parameter(0)
  ROOT f = RESULT fusion(a), kind=kLoop, calls=fused
}
"""


def _fusion(operand: str = "f32[128,256]{1,0}", result: str = "f32[128,256]{1,0}") -> str:
    return FUSION.replace("OPERAND", operand).replace("RESULT", result)


def test_fusion_operand_dims_differ_from_parameter():
    _raises(_fusion(operand="f32[64,256]{1,0}"), 8, 8,
            "fusion 'f' passes operand 0 'a' f32[64,256]{1,0} to parameter 0 'p'",
            "of computation 'fused'", "expected the operand to have the parameter's shape f32[128,256]")


def test_fusion_operand_element_type_differs_from_parameter():
    _raises(_fusion(operand="bf16[128,256]{1,0}"), 8, 8, "operand 0 'a' bf16[128,256]",
            "expected the operand to have the parameter's shape f32[128,256]")


def test_fusion_result_differs_from_root():
    _raises(_fusion(result="f32[4096]{0}"), 8, 8,
            "fusion 'f' has shape f32[4096]{0} but its computation 'fused' returns f32[128,256]{1,0} "
            "(root 'n'): expected f32[128,256]")


def test_fusion_matching_and_layout_only_differences_parse():
    parse_module(_fusion(), "t.hlo")
    # XLA:TPU: operands in HBM, tiled; the fused parameter in VMEM (S(1)) with another tiling
    text = _fusion(operand="f32[128,256]{0,1:T(8,128)}", result="f32[128,256]{1,0:T(8,128)S(1)}")
    parse_module(text.replace("p = f32[128,256]{1,0}", "p = f32[128,256]{1,0:T(8,128)S(1)}"), "t.hlo")


MULTI = """HloModule m
fused {
  p = (f32[8]{0}, s32[4]{0}) parameter(0)
  x = f32[8]{0} get-tuple-element(p), index=0
  i = s32[4]{0} get-tuple-element(p), index=1
  n = f32[8]{0} negate(x)
  ROOT t = (f32[8]{0}, s32[4]{0}) tuple(n, i)
}
ENTRY main {
  a = f32[8]{0:S(1)} parameter(0)
  b = s32[4]{0} parameter(1)
  t = (f32[8]{0:S(1)}, s32[4]{0}) tuple(a, b)
  ROOT f = RESULT fusion(t), kind=kLoop, calls=fused
}
"""


def test_tuple_parameters_and_roots_are_compared_element_by_element():
    parse_module(MULTI.replace("RESULT", "(f32[8]{0}, s32[4]{0:S(1)})"), "t.hlo")
    _raises(MULTI.replace("RESULT", "(f32[8]{0}, s32[40]{0})"), 13, 8,
            "has shape (f32[8]{0}, s32[40]{0}) (element {1}: s32[40])", "expected (f32[8], s32[4])")
    _raises(MULTI.replace("RESULT", "(f32[8]{0})"), 13, 8, "expected (f32[8], s32[4])")
    bad = MULTI.replace("RESULT", "(f32[8]{0}, s32[4]{0})").replace(
        "b = s32[4]{0} parameter(1)", "b = u32[4]{0} parameter(1)").replace(
        "s32[4]{0}) tuple(a, b)", "u32[4]{0}) tuple(a, b)")
    _raises(bad, 13, 8, "passes operand 0 't'", "(element {1}: u32[4])",
            "expected the operand to have the parameter's shape (f32[8], s32[4])")


CALL = """HloModule m
body {
  p = f32[8]{0} parameter(0)
  ROOT n = f32[8]{0} negate(p)
}
ENTRY main {
  a = OPERAND parameter(0)
  ROOT c = RESULT call(a), to_apply=body
}
"""


def test_call_operands_and_result_must_match_the_computation():
    parse_module(CALL.replace("OPERAND", "f32[8]{0}").replace("RESULT", "f32[8]{0}"), "t.hlo")
    _raises(CALL.replace("OPERAND", "f32[9]{0}").replace("RESULT", "f32[8]{0}"), 8, 8,
            "call 'c' passes operand 0 'a' f32[9]{0} to parameter 0 'p' f32[8]{0} of computation "
            "'body'", "expected the operand to have the parameter's shape f32[8]")
    _raises(CALL.replace("OPERAND", "f32[8]{0}").replace("RESULT", "s32[8]{0}"), 8, 8,
            "call 'c' has shape s32[8]{0} but its computation 'body' returns f32[8]{0}",
            "expected f32[8]")


# ---- while ------------------------------------------------------------------------------------

WHILE = """HloModule m
body {
  p = BODY_PARAM parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8]{0} get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = BODY_ROOT
}
cond {
  p = COND_PARAM parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT c = COND_ROOT
}
ENTRY main {
  z = s32[] constant(0)
  x = f32[8]{0:S(1)} parameter(0)
  t = (s32[], f32[8]{0:S(1)}) tuple(z, x)
  ROOT w = WHILE_SHAPE while(t), condition=cond, body=body
}
"""
STATE = "(s32[], f32[8]{0})"
GOOD_WHILE = {"BODY_PARAM": STATE, "BODY_ROOT": f"{STATE} tuple(j, x)", "COND_PARAM": STATE,
              "COND_ROOT": "pred[] compare(i, n), direction=LT", "WHILE_SHAPE": "(s32[], f32[8]{0:S(1)})"}


def _while(**changes: str) -> str:
    text = WHILE
    for k, v in {**GOOD_WHILE, **changes}.items():
        text = text.replace(k, v)
    return text


def test_while_with_one_loop_state_parses():
    parse_module(_while(), "t.hlo")


def test_while_body_root_drops_part_of_the_state():
    _raises(_while(BODY_ROOT="(s32[]) tuple(j)"), 20, 8,
            "while 'w': its body 'body' returns (s32[]) (root 't') but the loop state 't'",
            "expected the body to return (s32[], f32[8])")


def test_while_body_and_condition_parameters_must_be_the_state():
    _raises(_while(BODY_PARAM="(s32[], f32[8]{0}, f32[2]{0})"), 20, 8,
            "parameter 'p' of its body 'body' is (s32[], f32[8]{0}, f32[2]{0}) but the loop state "
            "'t' is (s32[], f32[8]{0:S(1)}): expected (s32[], f32[8])")
    _raises(_while(COND_PARAM="(s32[], f32[8]{0}, s32[])"), 20, 8,
            "parameter 'p' of its condition 'cond'", "expected (s32[], f32[8])")


def test_while_condition_must_return_a_scalar_pred():
    _raises(_while(COND_ROOT="s32[] add(i, n)"), 20, 8,
            "its condition 'cond' returns s32[] (root 'c'): expected pred[]")


def test_while_shape_must_be_its_operands():
    _raises(_while(WHILE_SHAPE="(s32[], f32[80]{0})"), 20, 8,
            "while 'w' has shape (s32[], f32[80]{0})", "expected (s32[], f32[8])")


# ---- conditional --------------------------------------------------------------------------------

COND = """HloModule m
b0 {
  p = f32[8]{0} parameter(0)
  ROOT n = f32[8]{0} negate(p)
}
b1 {
  p = B1_PARAM parameter(0)
  ROOT n = B1_ROOT negate(p)
}
ENTRY main {
  i = INDEX parameter(0)
  x = f32[8]{0:S(1)} parameter(1)
  ROOT c = f32[8]{0} conditional(i, x, x), branch_computations={b0, b1}
}
"""


def _cond(b1_param="f32[8]{0}", b1_root="f32[8]{0}", index="s32[]") -> str:
    return COND.replace("B1_PARAM", b1_param).replace("B1_ROOT", b1_root).replace("INDEX", index)


def test_conditional_with_matching_branches_parses():
    parse_module(_cond(), "t.hlo")
    parse_module(_cond(index="pred[]"), "t.hlo")  # two branches: a pred index is allowed


def test_conditional_branch_parameter_must_be_its_operand():
    _raises(_cond(b1_param="f32[16]{0}", b1_root="f32[16]{0}"), 13, 8,
            "conditional 'c' passes operand 2 'x' f32[8]{0:S(1)} to branch 1 'b1', whose parameter "
            "'p' is f32[16]{0}: expected the parameter to have the operand's shape f32[8]")


def test_conditional_branch_root_must_be_its_shape():
    text = _cond().replace("ROOT n = f32[8]{0} negate(p)\n}\nENTRY",
                           "n = f32[8]{0} negate(p)\n  ROOT r = f32[4]{0} slice(n), slice={[0:4]}\n}\nENTRY")
    _raises(text, 14, 8, "conditional 'c' has shape f32[8]{0} but branch 1 'b1' returns f32[4]{0} "
            "(root 'r'): expected every branch to return f32[8]")


def test_conditional_branch_index_must_be_a_scalar_s32_or_pred():
    _raises(_cond(index="s32[2]{0}"), 13, 8, "its branch index 'i' is s32[2]{0}",
            "expected s32[] (or pred[] with 2 branches)")


# ---- scatter ----------------------------------------------------------------------------------

SCATTER = ADD + """ENTRY main {
  acc = f32[1000,8]{1,0} parameter(0)
  sidx = s32[20,1]{1,0} parameter(1)
  upd = UPDATES parameter(2)
  ROOT sc = RESULT scatter(acc, sidx, upd), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
}
"""


def _scatter(updates="f32[20,8]{1,0}", result="f32[1000,8]{1,0}") -> str:
    return SCATTER.replace("UPDATES", updates).replace("RESULT", result)


def test_scatter_matching_shapes_parse():
    parse_module(_scatter(), "t.hlo")
    parse_module(_scatter(updates="f32[20,3]{1,0}"), "t.hlo")  # a window narrower than the operand


def test_scatter_update_window_wider_than_the_operand():
    _raises(_scatter(updates="f32[20,99999]{1,0}"), 10, 8,
            "scatter 'sc' of f32[1000,8]{1,0} with indices s32[20,1]{1,0} and updates "
            "f32[20,99999]{1,0}: update window dimension 1 (size 99999) is written into operand "
            "dimension 1 (size 8): expected at most 8")


def test_scatter_result_is_the_operands_shape():
    _raises(_scatter(result="f32[2000,8]{1,0}"), 10, 8,
            "scatter 'sc' has shape f32[2000,8]{1,0} but its operand is f32[1000,8]{1,0}: "
            "expected f32[1000,8]")


def test_scatter_updates_must_follow_the_indices():
    _raises(_scatter(updates="f32[21,8]{1,0}"), 10, 8,
            "are [21]: expected the indices' batch dimensions [20]")
    _raises(_scatter(updates="f32[20,1,8]{2,1,0}"), 10, 8, "expected updates of rank 2")


# ---- replica groups against the module header -------------------------------------------------

def _all_reduce(header: str, groups: str, channel: str = "") -> str:
    return (f"HloModule m{header}\n" + ADD + "ENTRY main {\n  a = f32[128]{0} parameter(0)\n"
            f"  ROOT r = f32[128]{{0}} all-reduce(a), {channel}replica_groups={groups}, to_apply=add\n}}\n")


def _value_at(text: str, value: str) -> tuple[int, int]:
    """(line, column) of ``value``'s first character in ``text``, 1-based."""
    k = text.index(value)
    return text.count("\n", 0, k) + 1, k - text.rfind("\n", 0, k)


def test_replica_group_ids_beyond_the_header_device_count():
    text = _all_reduce(", replica_count=4", "{{0,1,2,3,4,5,6,7}}")
    assert _value_at(text, "{{0,1,2") == (9, 54)
    _raises(text, 9, 54, "replica_groups={{0,1,2,3,4,5,6,7}} of instruction 'r' names device 7",
            "replica_count=4 x num_partitions=1 = 4 devices: expected ids in [0, 4)")
    text = _all_reduce(", num_partitions=2", "[2,4]<=[8]", "channel_id=1, ")
    _raises(text, *_value_at(text, "[2,4]<=[8]"), "names device 7", "expected ids in [0, 2)")


def test_replica_group_ids_within_the_header_or_without_one_parse():
    parse_module(_all_reduce(", replica_count=4", "{{0,1},{2,3}}"), "t.hlo")
    # replicas x partitions: global device ids with channel_id / use_global_device_ids
    parse_module(_all_reduce(", replica_count=2, num_partitions=4", "{{0,1,2,3,4,5,6,7}}",
                             "channel_id=1, use_global_device_ids=true, "), "t.hlo")
    parse_module(_all_reduce("", "{{0,1,2,3,4,5,6,7}}"), "t.hlo")  # no counts: not checked


def test_source_target_pairs_beyond_the_header_device_count():
    text = ("HloModule m, num_partitions=2\nENTRY main {\n  a = f32[8]{0} parameter(0)\n"
            "  ROOT p = f32[8]{0} collective-permute(a), channel_id=1,\n"
            "    source_target_pairs={{0,1},{1,2}}\n}\n")
    _raises(text, *_value_at(text, "{{0,1},{1,2}}"),
            "source_target_pairs={{0,1},{1,2}} of instruction 'p' names device 2",
            "expected ids in [0, 2)")
    parse_module(text.replace("{1,2}", "{1,0}"), "t.hlo")


# ---- E(n) element sizes -----------------------------------------------------------------------

def _negate(shape: str) -> str:
    return f"HloModule m\nENTRY main {{\n  x = {shape} parameter(0)\n  ROOT n = {shape} negate(x)\n}}\n"


def test_element_size_on_a_type_of_a_byte_or_more():
    _raises(_negate("f32[64]{0:E(4)}"), 3, 14, "layout {0:E(4)} of f32[64]: E(4) sets a 4-bit "
            "element size on f32 (32-bit); expected E(n) only on sub-byte types (s1, s2, s4")
    _raises(_negate("bf16[2,64]{1,0:T(8,128)(2,1)E(8)}"), 3, 17, "E(8)", "on bf16 (16-bit)")


def test_element_size_on_sub_byte_types_parses():
    for shape in ("s4[64]{0:E(4)}", "u4[8,64]{1,0:E(4)}", "f4e2m1fn[64]{0:E(4)}", "s2[64]{0:E(2)}",
                  "f32[64]{0:E(32)}"):  # (E(32) on f32 is the type's own width: no change)
        m = parse_module(_negate(shape), "t.hlo")
        assert m.entry.root.shape.layout.element_size_bits is not None


# ---- unreadable paths -------------------------------------------------------------------------

def test_symlink_loop_is_an_input_error(tmp_path, capsys):
    a, b = tmp_path / "loop1", tmp_path / "loop2"
    os.symlink(b, a)
    os.symlink(a, b)
    with pytest.raises(HloFileError, match="too many levels of symbolic links"):
        read_hlo_text(a)
    assert main(["analyze", str(a)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxmove: error: {a}: cannot be opened") and "internal error" not in err


def test_cli_exit_2_for_a_signature_error(tmp_path, capsys):
    p = tmp_path / "wrongshape.hlo"
    p.write_text(_fusion(operand="f32[64,256]{1,0}"))
    assert main(["analyze", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxmove: error: {p}:8:8: fusion 'f' passes operand 0"), err
