"""Result shapes of dot, copy, select, pad, reduce, gather, reverse, iota and compare, checked as
XLA's shape inference checks them.

Found by a user's trial: each wrong module below parsed with exit 0 and its passes counted bytes
and FLOPs from the impossible declared shape (a ``dot`` of 128x256 by 256x64 declared
f32[128,65]; a ``pad`` of 4 elements by 1 on each side declared f32[100]). Each case is one
hand-made module: the wrong one is an error at the instruction's line (the message names the
instruction and the shape XLA infers), the corrected one parses. Every expected shape is worked
out by hand in the comment beside it, from the rule in xla/service/shape_inference.cc.
"""

from __future__ import annotations

import pytest

from jaxmove.hlo import HloParseError, parse_module

# a reducer for reduce; the entry computation's first line is line 9 (1-based)
_HEADER = ["HloModule m", "", "add {", "  x = f32[] parameter(0)", "  y = f32[] parameter(1)",
           "  ROOT s = f32[] add(x, y)", "}", ""]


def _module(params: list[str], body: list[str]) -> tuple[str, int]:
    """An entry computation with ``params`` ('name: shape') then ``body``; returns the text and
    the line number of the last body line (the instruction under test)."""
    lines = _HEADER + ["ENTRY main {"]
    lines += [f"  {p.split(': ')[0]} = {p.split(': ')[1]} parameter({k})" for k, p in enumerate(params)]
    lines += ["  " + b for b in body]
    last = len(lines)
    lines.append("}")
    return "\n".join(lines) + "\n", last


def _parses(params: list[str], *body: str) -> None:
    parse_module(_module(params, list(body))[0], "ok.hlo")


def _fails(params: list[str], *body: str) -> HloParseError:
    text, line = _module(params, list(body))
    with pytest.raises(HloParseError) as e:
        parse_module(text, "bad.hlo")
    assert e.value.filename == "bad.hlo"
    assert e.value.line == line, str(e.value)
    assert e.value.column == 8, str(e.value)  # the instruction's name, after '  ROOT '
    return e.value


# ---- dot -------------------------------------------------------------------------------
MM = ["p0: f32[128,256]{1,0}", "p1: f32[256,64]{1,0}"]
MM_DIMS = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"


@pytest.mark.parametrize("declared", ["f32[128,65]{1,0}", "f32[128,64,2]{2,1,0}", "f32[64,128]{1,0}"])
def test_dot_result_must_be_lhs_then_rhs_free_dims(declared):
    # [128,256] x [256,64], contracting 256: [128] then [64] -> f32[128,64]
    e = _fails(MM, f"ROOT d = {declared} dot(p0, p1), {MM_DIMS}")
    assert "dot 'd'" in str(e) and f"has shape {declared}" in str(e)
    assert "gives dimensions [128,64]" in str(e)


def test_dot_valid_forms():
    _parses(MM, f"ROOT d = f32[128,64]{{1,0}} dot(p0, p1), {MM_DIMS}")
    # preferred_element_type: bf16 operands, f32 result (only dimensions are compared)
    _parses(["a: bf16[128,256]", "b: bf16[256,64]"], f"ROOT d = f32[128,64]{{0,1}} dot(a, b), {MM_DIMS}")
    # batch dims first, in lhs_batch_dims order: lhs [4,8,16] batch 0, contract 2; rhs [4,16,5]
    # batch 0, contract 1 -> [4] + [8] + [5]
    _parses(["a: bf16[4,8,16]", "b: bf16[4,16,5]"],
            "ROOT d = f32[4,8,5] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
            "rhs_batch_dims={0}, rhs_contracting_dims={1}")
    # batch dims not leading: lhs [5,3,7] batch 2 (7), contract 0 (5); rhs [7,5,2] batch 0,
    # contract 1 -> [7] + lhs free [3] + rhs free [2]
    _parses(["a: f32[5,3,7]", "b: f32[7,5,2]"],
            "ROOT d = f32[7,3,2] dot(a, b), lhs_batch_dims={2}, lhs_contracting_dims={0}, "
            "rhs_batch_dims={0}, rhs_contracting_dims={1}")
    # no contraction: an outer product [3] x [4,2] -> [3,4,2]
    _parses(["a: f32[3]", "b: f32[4,2]"], "ROOT d = f32[3,4,2] dot(a, b)")
    # a vector-matrix dot: [256] x [256,64] -> [64]
    _parses(["a: f32[256]", "b: f32[256,64]"],
            "ROOT d = f32[64] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}")


def test_dot_batch_dims_wrong_order_is_an_error():
    # batch dims come first: [4] + [8] + [5], not [8,4,5]
    e = _fails(["a: f32[4,8,16]", "b: f32[4,16,5]"],
               "ROOT d = f32[8,4,5] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
               "rhs_batch_dims={0}, rhs_contracting_dims={1}")
    assert "gives dimensions [4,8,5]" in str(e)


def test_repeated_dot_with_another_result_shape_is_still_checked():
    # the validator checks repeated (operands, dimension numbers) once: the result shape is part
    # of that key, so a second dot of the same operands with a wrong result is still an error
    e = _fails(MM, f"d1 = f32[128,64]{{1,0}} dot(p0, p1), {MM_DIMS}",
               f"d2 = f32[128,64]{{1,0}} dot(p0, p1), {MM_DIMS}",
               f"ROOT d3 = f32[128,63]{{1,0}} dot(p0, p1), {MM_DIMS}")
    assert "dot 'd3'" in str(e) and "gives dimensions [128,64]" in str(e)


def test_sparse_dot_parses():
    # 2:4 structured sparsity: lhs holds 16 of the 32 contracted elements per row, with
    # u16 metadata (xla/hlo/parser tests' form); the result is still [10] + [20]
    _parses(["a: f32[10,16]", "b: f32[32,20]", "meta: u16[10,2]"],
            "ROOT d = f32[10,20] dot(a, b, meta), lhs_contracting_dims={1}, rhs_contracting_dims={0}, "
            "sparsity=L.1@2:4")


# ---- copy ------------------------------------------------------------------------------
def test_copy():
    e = _fails(["p0: f32[4,8]{1,0}"], "ROOT c = f32[8,8]{1,0} copy(p0)")
    assert "copy 'c' has shape f32[8,8]{1,0}" in str(e) and "gives dimensions [4,8]" in str(e)
    e = _fails(["p0: f32[4,8]{1,0}"], "ROOT c = s32[4,8]{1,0} copy(p0)")
    assert "copy 'c'" in str(e) and "element type (f32)" in str(e)
    _parses(["p0: f32[4,8]{1,0}"], "ROOT c = f32[4,8]{0,1} copy(p0)")  # a layout change
    # bf16 propagation narrows a copy's result in place (mixed precision)
    _parses(["p0: f32[4,8]{1,0}"], "ROOT c = bf16[4,8]{1,0} copy(p0)")
    _parses(["p0: (f32[4], s32[2])"], "ROOT c = (f32[4], s32[2]) copy(p0)")
    e = _fails(["p0: (f32[4], s32[2])"], "ROOT c = (f32[4], s32[3]) copy(p0)")
    assert "copy 'c'" in str(e) and "(f32[4], s32[2])" in str(e)
    e = _fails(["p0: (f32[4], s32[2])"], "ROOT c = f32[4] copy(p0)")
    assert "copy 'c' has shape f32[4]" in str(e)


# ---- select ----------------------------------------------------------------------------
def test_select():
    e = _fails(["p: pred[4]", "a: f32[4]", "b: f32[5]"], "ROOT s = f32[4] select(p, a, b)")
    assert "select 's'" in str(e) and "on_false operand 'b' is f32[5]" in str(e)
    e = _fails(["p: pred[5]", "a: f32[4]", "b: f32[4]"], "ROOT s = f32[4] select(p, a, b)")
    assert "select 's'" in str(e) and "expected pred[4]" in str(e)
    e = _fails(["p: s32[4]", "a: f32[4]", "b: f32[4]"], "ROOT s = f32[4] select(p, a, b)")
    assert "expected pred[4]" in str(e)
    e = _fails(["p: pred[4]", "a: f32[4]", "b: f32[4]"], "ROOT s = f32[5] select(p, a, b)")
    assert "select 's' has shape f32[5]" in str(e)
    _parses(["p: pred[4,2]", "a: f32[4,2]", "b: f32[4,2]"], "ROOT s = f32[4,2] select(p, a, b)")
    _parses(["p: pred[]", "a: f32[4]", "b: f32[4]"], "ROOT s = f32[4] select(p, a, b)")  # scalar pred
    _parses(["p: pred[]", "a: s32[]", "b: s32[]"], "ROOT s = s32[] select(p, a, b)")


# ---- pad -------------------------------------------------------------------------------
def test_pad():
    # 4 + 1 + 1 = 6
    e = _fails(["p0: f32[4]", "z: f32[]"], "ROOT s = f32[100]{0} pad(p0, z), padding=1_1")
    assert "pad 's' has shape f32[100]{0}" in str(e) and "gives dimensions [6]" in str(e)
    _parses(["p0: f32[4]", "z: f32[]"], "ROOT s = f32[6]{0} pad(p0, z), padding=1_1")
    # interior and negative: dim 0: 4 - 1 + 2 + 1 * (4 - 1) = 8; dim 1: 8 + 0 - 3 = 5
    _parses(["p0: f32[4,8]", "z: f32[]"], "ROOT s = f32[8,5] pad(p0, z), padding=-1_2_1x0_-3")
    e = _fails(["p0: f32[4,8]", "z: f32[]"], "ROOT s = f32[9,5] pad(p0, z), padding=-1_2_1x0_-3")
    assert "gives dimensions [8,5]" in str(e)
    # interior on a size-1 dimension adds nothing: 1 + 0 + 0 + 3 * 0 = 1; 0 + 2 + 0 = 2
    _parses(["p0: f32[1,0]", "z: f32[]"], "ROOT s = f32[1,2] pad(p0, z), padding=0_0_3x2_0_5")
    e = _fails(["p0: f32[4,8]", "z: f32[]"], "ROOT s = f32[6] pad(p0, z), padding=1_1")
    assert "needs 2 lo_hi[_interior] entries" in str(e)
    e = _fails(["p0: f32[4]", "z: f32[]"], "ROOT s = f32[0] pad(p0, z), padding=-3_-3")  # 4 - 6 < 0
    assert "negative size -2" in str(e)
    e = _fails(["p0: f32[4]", "z: f32[2]"], "ROOT s = f32[6] pad(p0, z), padding=1_1")
    assert "padding value 'z' is f32[2], expected a scalar" in str(e)


# ---- reduce ----------------------------------------------------------------------------
def test_reduce():
    # [4,8] without dimension 1 -> [4]
    e = _fails(["p0: f32[4,8]", "z: f32[]"], "ROOT r = f32[5] reduce(p0, z), dimensions={1}, to_apply=add")
    assert "reduce 'r' has shape f32[5]" in str(e) and "gives dimensions [4]" in str(e)
    _parses(["p0: f32[4,8]", "z: f32[]"], "ROOT r = f32[4] reduce(p0, z), dimensions={1}, to_apply=add")
    # [2,3,5] without 0 and 2 -> [3]; without all -> []
    _parses(["p0: f32[2,3,5]", "z: f32[]"], "ROOT r = f32[3] reduce(p0, z), dimensions={0,2}, to_apply=add")
    _parses(["p0: f32[2,3,5]", "z: f32[]"], "ROOT r = f32[] reduce(p0, z), dimensions={0,1,2}, to_apply=add")
    e = _fails(["p0: f32[4,8]", "z: f32[]"], "ROOT r = f32[4] reduce(p0, z), dimensions={2}, to_apply=add")
    assert "dimensions={2}" in str(e)


ARGMAX = ["HloModule m", "", "argmax {", "  v0 = f32[] parameter(0)", "  i0 = s32[] parameter(1)",
          "  v1 = f32[] parameter(2)", "  i1 = s32[] parameter(3)",
          "  c = pred[] compare(v0, v1), direction=GE", "  v = f32[] select(c, v0, v1)",
          "  i = s32[] select(c, i0, i1)", "  ROOT t = (f32[], s32[]) tuple(v, i)", "}", "",
          "ENTRY main {", "  x = f32[4,8] parameter(0)", "  n = s32[4,8] iota(), iota_dimension=1",
          "  a = f32[] constant(-inf)", "  b = s32[] constant(0)"]


def test_reduce_of_a_tuple():
    # a variadic (argmax) reduce: one result per input, each [4,8] without dimension 1 -> [4]
    ok = ARGMAX + ["  ROOT r = (f32[4], s32[4]) reduce(x, n, a, b), dimensions={1}, to_apply=argmax", "}"]
    parse_module("\n".join(ok) + "\n", "ok.hlo")
    bad = ARGMAX + ["  ROOT r = (f32[4], s32[8]) reduce(x, n, a, b), dimensions={1}, to_apply=argmax", "}"]
    with pytest.raises(HloParseError) as e:
        parse_module("\n".join(bad) + "\n", "bad.hlo")
    assert e.value.line == len(bad) - 1
    assert "reduce 'r'" in str(e.value) and "(element 1 is s32[8])" in str(e.value)
    assert "gives dimensions [4]" in str(e.value)
    bad = ARGMAX + ["  ROOT r = f32[4] reduce(x, n, a, b), dimensions={1}, to_apply=argmax", "}"]
    with pytest.raises(HloParseError) as e:
        parse_module("\n".join(bad) + "\n", "bad.hlo")
    assert "expected a tuple of 2 arrays" in str(e.value)


# ---- gather ----------------------------------------------------------------------------
G = "offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}"


def test_gather():
    # rows of [16,8] at 2 indices: batch [2] (indices [2,1] without index_vector_dim 1), offset
    # slice sizes {1,8} without collapsed 0 -> [8] at result position 1 -> [2,8]
    e = _fails(["o: f32[16,8]", "i: s32[2,1]"], f"ROOT g = f32[1000,8] gather(o, i), {G}")
    assert "gather 'g' has shape f32[1000,8]" in str(e) and "gives dimensions [2,8]" in str(e)
    _parses(["o: f32[16,8]", "i: s32[2,1]"], f"ROOT g = f32[2,8] gather(o, i), {G}")
    # index_vector_dim = rank of the indices (an implicit trailing 1): indices [2] -> batch [2]
    _parses(["o: f32[16,8]", "i: s32[2]"], "ROOT g = f32[2,8] gather(o, i), offset_dims={1}, "
            "collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}")
    # nothing collapsed, offset dims at 1 and 2: batch [3], offsets {1,1} -> [3,1,1] (jax's
    # x[i, j] on CPU before simplification)
    _parses(["o: f32[8,16]", "i: s32[3,2]"], "ROOT g = f32[3,1,1] gather(o, i), offset_dims={1,2}, "
            "collapsed_slice_dims={}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}")
    # offset dim first: result position 0 is the offset (8), batch [5,3] fills 1 and 2
    _parses(["o: f32[16,8]", "i: s32[5,3,1]"], "ROOT g = f32[8,5,3] gather(o, i), offset_dims={0}, "
            "collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,8}")
    # index_vector_dim in the middle: indices [5,1,3] -> batch [5,3]
    _parses(["o: f32[16,8]", "i: s32[5,1,3]"], "ROOT g = f32[5,3,2] gather(o, i), offset_dims={2}, "
            "collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,2}")
    # operand batching dims (vmap of a take): operand [4,8,16], indices [4,3,1]; batch [4,3];
    # slice sizes {1,1,16} without collapsed 1 and batching 0 -> [16] at position 2 -> [4,3,16]
    _parses(["o: bf16[4,8,16]", "i: s32[4,3,1]"],
            "ROOT g = bf16[4,3,16] gather(o, i), offset_dims={2}, collapsed_slice_dims={1}, "
            "start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, "
            "index_vector_dim=2, slice_sizes={1,1,16}")
    e = _fails(["o: bf16[4,8,16]", "i: s32[4,3,1]"],
               "ROOT g = bf16[4,3,1,16] gather(o, i), offset_dims={2}, collapsed_slice_dims={1}, "
               "start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, "
               "index_vector_dim=2, slice_sizes={1,1,16}")
    assert "gives dimensions [4,3,16]" in str(e)


def test_gather_dimension_numbers_must_fit():
    o_i = ["o: f32[16,8]", "i: s32[2,1]"]
    e = _fails(o_i, "ROOT g = f32[2,9] gather(o, i), offset_dims={1}, collapsed_slice_dims={0}, "
               "start_index_map={0}, index_vector_dim=1, slice_sizes={1,9}")  # 9 > 8
    assert "gather 'g'" in str(e) and "slice_sizes={1,9}" in str(e)
    e = _fails(o_i, "ROOT g = f32[2,8] gather(o, i), offset_dims={1}, collapsed_slice_dims={}, "
               "start_index_map={0}, index_vector_dim=1, slice_sizes={2,8}")  # 1 + 0 != 2 dims
    assert "must account for the 2 operand dimensions" in str(e)
    e = _fails(["o: f32[16,8]", "i: s32[2,2]"], "ROOT g = f32[2,8] gather(o, i), offset_dims={1}, "
               "collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}")
    assert "start_index_map={0} must map the 2 index component(s)" in str(e)
    e = _fails(o_i, "ROOT g = f32[2,8] gather(o, i), offset_dims={1}, collapsed_slice_dims={0}, "
               "start_index_map={0}, index_vector_dim=3, slice_sizes={1,8}")
    assert "index_vector_dim=3 must lie in [0, 2]" in str(e)
    # nothing collapsed, a 2-row window: batch [2], offsets [2,8] at positions 1, 2 -> [2,2,8]
    _parses(o_i, "ROOT g = f32[2,2,8] gather(o, i), offset_dims={1,2}, collapsed_slice_dims={}, "
            "start_index_map={0}, index_vector_dim=1, slice_sizes={2,8}")


def test_gather_in_old_spelling_is_not_checked():
    # 2018 HLO spelled the dimension numbers output_window_dims / elided_window_dims /
    # gather_dims_to_operand_dims / window_bounds: left alone, never an error
    _parses(["o: f32[16,8]", "i: s32[2]"], "ROOT g = f32[2,8] gather(o, i), output_window_dims={1}, "
            "elided_window_dims={0}, gather_dims_to_operand_dims={0}, index_vector_dim=1, "
            "window_bounds={1,8}")


# ---- reverse, iota, compare ------------------------------------------------------------
def test_reverse():
    e = _fails(["p0: f32[16,8]"], "ROOT r = f32[16,9] reverse(p0), dimensions={1}")
    assert "reverse 'r' has shape f32[16,9]" in str(e) and "gives dimensions [16,8]" in str(e)
    e = _fails(["p0: f32[16,8]"], "ROOT r = f32[16,8] reverse(p0), dimensions={2}")
    assert "reverse 'r': dimensions={2}" in str(e)
    e = _fails(["p0: f32[16,8]"], "ROOT r = f32[16,8] reverse(p0), dimensions={0,0}")
    assert "distinct dimensions" in str(e)
    _parses(["p0: f32[16,8]"], "ROOT r = f32[16,8]{0,1} reverse(p0), dimensions={0,1}")
    _parses(["p0: f32[16,8]"], "ROOT r = f32[16,8] reverse(p0), dimensions={}")


def test_iota():
    e = _fails([], "ROOT i = f32[4,8]{1,0} iota(), iota_dimension=5")
    assert "iota 'i': iota_dimension=5" in str(e) and "f32[4,8]{1,0} (rank 2)" in str(e)
    e = _fails([], "ROOT i = s32[4] iota()")
    assert "no iota_dimension=" in str(e)
    _parses([], "ROOT i = s32[4,8] iota(), iota_dimension=1")
    _parses([], "ROOT i = u64[8] iota(), iota_dimension=0")


def test_compare():
    e = _fails(["a: f32[4]{0}", "b: f32[4]{0}"], "ROOT s = f32[4]{0} compare(a, b), direction=LT")
    assert "compare 's' has shape f32[4]{0}" in str(e) and "gives pred[4]" in str(e)
    _parses(["a: bf16[4,8]", "b: bf16[4,8]"], "ROOT c = pred[4,8] compare(a, b), direction=LT")
    _parses(["a: s32[]", "b: s32[]"], "ROOT c = pred[] compare(a, b), direction=EQ")


def test_dynamic_dimensions_are_not_compared():
    # bounded dynamic shapes (<=n) are left alone, as for the other shape rules
    _parses(["p0: f32[<=4,8]", "z: f32[]"], "ROOT r = f32[<=4] reduce(p0, z), dimensions={1}, to_apply=add")
    _parses(["p0: f32[<=4,8]"], "ROOT c = f32[4,8] copy(p0)")


def test_no_shape_rule_is_skipped_by_the_fast_path():
    # validate_module skips _check_instruction for the opcodes of _CHEAP (operand count only)
    from jaxmove.hlo import validate
    ruled = set(validate._SHAPE_RULES) | set(validate._OWN_SHAPE_RULES)
    assert not ruled & set(validate._CHEAP)
    assert {"copy", "select", "pad", "reduce", "gather", "reverse", "iota", "compare"} <= ruled
