"""Bad input a user trial found accepted without a word: layouts that are no permutation of
the dimensions (XLA's LayoutUtil::ValidateLayoutForShape rejects them; jaxmove costed them as
the default layout), and positional arguments after a target that takes none (dropped)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxmove
from jaxmove.capture.errors import TargetError
from jaxmove.hlo import HloParseError, parse_module


def _text(layout: str, shape: str = "f32[8,1024]") -> str:
    return f"HloModule m\n\nENTRY e {{\n  p = {shape}{layout} parameter(0)\n  ROOT n = {shape} negate(p)\n}}\n"


@pytest.mark.parametrize("layout", ["{5,0:T(8,128)}", "{1,1}", "{0,0}", "{7,9}", "{1,0,2}", "{0}"])
def test_layout_must_permute_the_dimensions(layout):
    with pytest.raises(HloParseError, match=r"<string>:4:\d+: layout .* of f32\[8,1024\]: expected the "
                                            r"dimension numbers 0\.\.1 in some order"):
        parse_module(_text(layout))


def test_scalar_layout_names_no_dimension():
    with pytest.raises(HloParseError, match="a scalar's layout names no dimension"):
        parse_module(_text("{0}", "f32[]"))


@pytest.mark.parametrize("layout, nbytes", [
    ("{1,0}", 8 * 1024 * 4), ("{0,1}", 8 * 1024 * 4),
    # TPU tiles (8,128): in {0,1} the minor dimension 0 (size 8) pads to 128, dimension 1
    # (1024) is a multiple of 8; in {1,0} nothing pads
    ("{0,1:T(8,128)}", 1024 * 128 * 4), ("{1,0:T(8,128)}", 8 * 1024 * 4),
])
def test_valid_layouts_keep_their_sizes(layout, nbytes):
    m = parse_module(_text(layout))
    assert m.entry.by_name["p"].shape.byte_size == nbytes


def test_positional_arguments_after_a_path_are_an_error(tmp_path):
    path = tmp_path / "m.hlo"
    path.write_text(_text("{1,0}"))
    w = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    with pytest.raises(TargetError, match=r"1 positional argument\(s\) after '.*m\.hlo'"):
        jaxmove.analyze(str(path), w)
    with pytest.raises(TargetError, match="positional argument"):
        jaxmove.analyze("mlp-tiny", w)
    assert jaxmove.analyze(str(path)).totals.hbm_bytes == 2 * 8 * 1024 * 4  # negate: read + write


def test_unknown_memory_space_is_counted_as_hbm_with_a_note(tmp_path):
    """S(99) is no memory space jaxmove knows: its bytes were counted as HBM without a word."""
    path = tmp_path / "m.hlo"
    path.write_text(_text("{1,0:S(99)}"))
    rep = jaxmove.analyze(str(path))
    assert rep.totals.hbm_bytes == 2 * 8 * 1024 * 4
    assert any("S(99) are none jaxmove knows" in n for n in rep.notes)
    path.write_text(_text("{1,0:S(5)}"))   # host memory: known, no note
    assert not any("none jaxmove knows" in n for n in jaxmove.analyze(str(path)).notes)


@pytest.mark.parametrize("const, ok", [
    ("s8[] constant(200)", False), ("s8[] constant(-128)", True), ("u8[] constant(255)", True),
    ("u8[] constant(-1)", False), ("s32[] constant(3000000000)", False),
    ("u32[] constant(3000000000)", True), ("s4[] constant(8)", False), ("pred[] constant(true)", True),
])
def test_scalar_integer_constants_fit_their_type(const, ok):
    """XLA's parser refuses an integer constant out of its type's range; jaxmove took it (such
    constants bound while loops: a trip count read from s32[] constant(3000000000) is wrong)."""
    text = f"HloModule m\n\nENTRY e {{\n  ROOT c = {const}\n}}\n"
    if ok:
        parse_module(text)
    else:
        with pytest.raises(HloParseError, match=r"<string>:4:\d+: constant 'c': -?\d+ is out of range for"):
            parse_module(text)
