"""A kernel that only concatenates parameters is a copy of them, not compulsory traffic.

XLA's DotMerger (xla/hlo/transforms/simplifiers/dot_merger.cc) merges two dots that share an
operand by concatenating their other operands: with a weight there, the merged program writes
a new weight matrix every step and reads it back. Counted by hand from the shapes below: the
compulsory bytes are each parameter read once plus the result written once; the concat's write
and the dot's read of it are excess, whatever the buffer's size against the on-chip capacity.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from jaxmove.hardware import load_spec  # noqa: E402

from .test_excess import excess_of  # noqa: E402

M, K, N1, N2 = 32, 1024, 8, 4096          # x [M, K]; router [K, N1]; w_gate [K, N2] (f32)
CONCAT = f"""HloModule merged
%cat (p0: f32[{K},{N1}], p1: f32[{K},{N2}]) -> f32[{K},{N1 + N2}] {{
  %p0 = f32[{K},{N1}] parameter(0)
  %p1 = f32[{K},{N2}] parameter(1)
  ROOT %c = f32[{K},{N1 + N2}] concatenate(%p0, %p1), dimensions={{1}}
}}
%mm (a: f32[{M},{K}], b: f32[{K},{N1 + N2}]) -> f32[{M},{N1 + N2}] {{
  %a = f32[{M},{K}] parameter(0)
  %b = f32[{K},{N1 + N2}] parameter(1)
  ROOT %d = f32[{M},{N1 + N2}] dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
ENTRY %main (x: f32[{M},{K}], router: f32[{K},{N1}], w_gate: f32[{K},{N2}]) -> f32[{M},{N1 + N2}] {{
  %x = f32[{M},{K}] parameter(0)
  %router = f32[{K},{N1}] parameter(1)
  %w_gate = f32[{K},{N2}] parameter(2)
  %cat = f32[{K},{N1 + N2}] fusion(%router, %w_gate), kind=kInput, calls=%cat
  ROOT %y = f32[{M},{N1 + N2}] fusion(%x, %cat), kind=kOutput, calls=%mm
}}
"""


@pytest.mark.parametrize("spec", ["cpu-generic", "h100-sxm"])
def test_a_concatenation_of_parameters_is_a_copy_not_compulsory(spec):
    """16.8 MB concat: larger than cpu-generic's 8 MiB L2, smaller than the H100's 50 MiB."""
    ex, _ = excess_of(CONCAT, load_spec(spec))
    weights = K * (N1 + N2) * 4
    compulsory = M * K * 4 + weights + M * (N1 + N2) * 4
    assert ex.compulsory_bytes == compulsory
    assert ex.excess_bytes == 2 * weights            # the concat written, and read by the dot
    c = ex.cause("concatenated_copy")
    assert c is not None and c.bytes == 2 * weights
    assert [i.name for i in c.instructions] == ["cat", "y"]   # the concat, and the dot reading it back
    assert "concatenat" in c.fix


def test_a_concatenation_the_program_returns_or_computes_is_no_copy():
    """Controls: the concatenation as the program's result is its compulsory write; a fusion that
    computes what it concatenates (negate) is an ordinary kernel."""
    returned = f"""HloModule ret
ENTRY %main (a: f32[{K},{N1}], b: f32[{K},{N2}]) -> f32[{K},{N1 + N2}] {{
  %a = f32[{K},{N1}] parameter(0)
  %b = f32[{K},{N2}] parameter(1)
  ROOT %c = f32[{K},{N1 + N2}] concatenate(%a, %b), dimensions={{1}}
}}
"""
    ex, _ = excess_of(returned, load_spec("h100-sxm"))
    assert ex.cause("concatenated_copy") is None
    assert ex.excess_bytes == 0 and ex.compulsory_bytes == 2 * K * (N1 + N2) * 4
    computed = CONCAT.replace("%p0 = f32[{0},{1}] parameter(0)".format(K, N1),
                              "%p0q = f32[{0},{1}] parameter(0)\n  %p0 = f32[{0},{1}] negate(%p0q)".format(K, N1))
    assert computed != CONCAT
    ex, _ = excess_of(computed, load_spec("h100-sxm"))
    assert ex.cause("concatenated_copy") is None
