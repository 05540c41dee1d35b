"""Tiled layouts: physical (tile-padded) sizes, validation by physical size, padded HBM traffic.

Expected sizes are computed here in closed form from dims, dtypes and the tile printed in the
layout (``ceil(dim / tile) * tile`` for the most-minor dimensions, XLA's
``ShapeUtil::ArraySize``), and on real TPU programs against XLA's own
``memory_analysis().argument_size_in_bytes``.
"""

from __future__ import annotations

import math
import re

import pytest

from jaxmove.hlo import HloParseError, parse_module
from jaxmove.passes.pipeline import analyze_module

from .device_compile import abstract, compile_tpu, tpu_mesh


def up(n: int, t: int) -> int:
    return -(-n // t) * t


def shape_of(text: str):
    return parse_module(f"HloModule m\nENTRY e {{\n  ROOT p = {text} parameter(0)\n}}\n").entry.root.shape


# (shape text, physical bytes in closed form, logical bytes)
CASES = [
    # f32[16,8] with dim 0 minor, T(8,128): stored as [8 (dim 1), 128 (dim 0 padded)] x 4 B
    ("f32[16,8]{0,1:T(8,128)}", up(8, 8) * up(16, 128) * 4, 16 * 8 * 4),
    ("bf16[3,5]{1,0:T(8,128)(2,1)}", up(3, 8) * up(5, 128) * 2, 3 * 5 * 2),
    ("s8[7,33]{1,0:T(32,128)(4,1)}", up(7, 32) * up(33, 128), 7 * 33),
    ("f32[100]{0:T(1024)}", up(100, 1024) * 4, 400),
    ("f32[100]{0:T(128)}", up(100, 128) * 4, 400),
    ("f32[]{:T(128)}", 128 * 4, 4),                 # a scalar fills one 128-element tile
    ("pred[]{:T(512)}", 512, 1),
    ("pred[16]{0:T(512)(128)(4,1)S(1)}", 512, 16),  # sub-tiles pack, the top tile pads
    ("u32[1,1,128]{2,1,0:T(1,128)S(1)}", 1 * 1 * 128 * 4, 512),
    ("s4[16,300]{1,0:T(8,128)(8,1)E(4)}", up(16, 8) * up(300, 128) // 2, 16 * 300 // 2),
    ("u32[128]{0:T(2,128)}", 2 * 128 * 4, 512),      # tile rank > array rank: size-1 dim padded
    ("f32[3,5,7]{2,0,1:T(8,128)}", up(3, 8) * up(7, 128) * 5 * 4, 3 * 5 * 7 * 4),
    ("f32[10]{0:T(128)L(1024)}", 1024 * 4, 40),      # L(n): tail padding alignment
    ("f32[16,8]{1,0}", 512, 512),                     # untiled: physical = logical
]


@pytest.mark.parametrize("text,physical,logical", CASES)
def test_physical_and_logical_sizes(text, physical, logical):
    s = shape_of(text)
    assert (s.byte_size, s.logical_byte_size) == (physical, logical)
    assert s.padding_bytes == physical - logical


def test_tuple_sizes_sum_leaves():
    s = shape_of("(f32[16,8]{0,1:T(8,128)}, pred[]{:T(512)})")
    assert (s.byte_size, s.logical_byte_size) == (4096 + 512, 512 + 1)


def test_bitcast_between_equal_physical_sizes_is_accepted():
    # issue 18: XLA:TPU's own output, once rejected as "changes the byte size"
    m = parse_module("""HloModule m
ENTRY e {
  a = u32[1,1,128]{2,1,0:T(1,128)S(1)} parameter(0)
  ROOT b = pred[16]{0:T(512)(128)(4,1)S(1)} bitcast(a)
}
""")
    assert m.entry.root.shape.byte_size == 512


def test_bitcast_changing_both_sizes_is_rejected():
    with pytest.raises(HloParseError, match="changes the byte size.*tile padding"):
        parse_module("""HloModule m
ENTRY e {
  a = f32[16,8]{0,1:T(8,128)} parameter(0)
  ROOT b = f32[64]{0:T(128)} bitcast(a)
}
""")


PADDED_FUSION = """HloModule m
fused {
  p = f32[16,8]{0,1:T(8,128)} parameter(0)
  ROOT n = f32[16,8]{0,1:T(8,128)} negate(p)
}
ENTRY e {
  x = f32[16,8]{0,1:T(8,128)} parameter(0)
  ROOT f = f32[16,8]{0,1:T(8,128)} fusion(x), kind=kLoop, calls=fused
}
"""


def test_padded_traffic_and_logical_bytes():
    a = analyze_module(parse_module(PADDED_FUSION))
    phys, data = up(8, 8) * up(16, 128) * 4, 16 * 8 * 4
    t = a.totals
    assert (t.hbm_read_bytes, t.hbm_write_bytes) == (phys, phys)
    assert (t.hbm_padding_read_bytes, t.hbm_padding_write_bytes) == (phys - data, phys - data)
    assert t.hbm_logical_bytes == 2 * data
    pct = 100 * 2 * (phys - data) / (2 * phys)
    assert any(n.startswith(f"{pct:.1f}% of HBM traffic is tile padding") for n in a.notes)


def test_padding_figures_in_json():
    from jaxmove.report.report import ProgramInfo, Report
    a = analyze_module(parse_module(PADDED_FUSION))
    j = Report(ProgramInfo("m", "tpu", 1, "hlo:m"), a).to_json()
    phys, data = 4096, 512
    assert j["totals"]["hbm_padding_bytes"] == 2 * (phys - data)
    assert j["totals"]["hbm_logical_read_bytes"] == data
    assert j["totals"]["hbm_padding_fraction"] == pytest.approx((phys - data) / phys)
    row = next(r for r in j["instructions"] if r["name"] == "f")
    assert (row["hbm_logical_read_bytes"], row["hbm_logical_write_bytes"]) == (data, data)


def test_slice_of_tiled_minor_dimension_reads_whole_tiles():
    # a [8,1] column of f32[8,1024]{1,0:T(8,128)} lies in one 8x128 tile: 4 KiB moved, 32 B data
    a = analyze_module(parse_module("""HloModule m
ENTRY e {
  x = f32[8,1024]{1,0:T(8,128)} parameter(0)
  ROOT s = f32[8,1]{1,0:T(8,128)} slice(x), slice={[0:8], [5:6]}
}
"""))
    r = next(r for r in a.rows if r.instr.name == "s")
    read = r.traffic.reads[0]
    assert (read.nbytes, read.logical_nbytes) == (8 * 128 * 4, 8 * 1 * 4)


def test_dynamic_slice_of_stacked_layers_reads_one_layer_padded():
    # a layer of a stacked bf16[4,100,100] weight: its share of the padded buffer
    a = analyze_module(parse_module("""HloModule m
fused {
  w = bf16[4,100,100]{2,1,0:T(8,128)(2,1)} parameter(0)
  i = s32[] parameter(1)
  z = s32[] constant(0)
  d = bf16[1,100,100]{2,1,0:T(8,128)(2,1)} dynamic-slice(w, i, z, z), dynamic_slice_sizes={1,100,100}
  ROOT n = bf16[1,100,100]{2,1,0:T(8,128)(2,1)} negate(d)
}
ENTRY e {
  w = bf16[4,100,100]{2,1,0:T(8,128)(2,1)} parameter(0)
  i = s32[] parameter(1)
  ROOT f = bf16[1,100,100]{2,1,0:T(8,128)(2,1)} fusion(w, i), kind=kLoop, calls=fused
}
"""))
    r = next(r for r in a.rows if r.instr.name == "f")
    read = next(x for x in r.traffic.reads if x.operand == 0)
    assert (read.nbytes, read.logical_nbytes) == (up(100, 8) * up(100, 128) * 2, 100 * 100 * 2)


# ---- real TPU programs: padded argument bytes equal XLA's memory_analysis ---------------

PROGRAMS = {
    # name: (list of (shape, dtype name)), all reduced to f32 sums
    "mixed": [((16, 8), "float32"), ((3, 5), "bfloat16"), ((7, 33), "int8"), ((5, 9), "bool"),
              ((100,), "float32"), ((), "float32"), ((), "bool"), ((3,), "bfloat16"),
              ((2, 3, 5), "int8"), ((1000,), "bool")],
    "wide": [((1, 1000), "bfloat16"), ((129, 257), "float32"), ((17,), "int8"),
             ((4, 1, 130), "float32"), ((33, 2), "bool"), ((2, 2, 2, 2), "bfloat16")],
    "subbyte": [((16, 300), "int4"), ((3, 5, 7), "float8_e4m3fn"), ((7,), "uint4"),
                ((5, 9), "float16"), ((4, 4), "int32")],
}


@pytest.fixture(scope="module")
def tpu_programs():
    import jax.numpy as jnp
    mesh = tpu_mesh(1)
    out = {}
    for name, leaves in PROGRAMS.items():
        args = [abstract(mesh, s, getattr(jnp, d)) for s, d in leaves]
        c = compile_tpu(lambda *xs: [x.astype(jnp.float32).sum() for x in xs], *args)
        out[name] = (c, parse_module(c.as_text()), leaves)
    return out


_LAYOUT = re.compile(r"\{([0-9,]*):T\(([0-9,]+)\)")


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_padded_argument_bytes_equal_memory_analysis(tpu_programs, name):
    compiled, module, _leaves = tpu_programs[name]
    params = module.entry.parameters
    assert sum(p.shape.byte_size for p in params) == compiled.memory_analysis().argument_size_in_bytes


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_padded_bytes_closed_form_from_printed_tiles(tpu_programs, name):
    # recompute each parameter's size in closed form from dims, dtype and the printed tile
    import numpy as np
    compiled, module, leaves = tpu_programs[name]
    bits = {"float32": 32, "bfloat16": 16, "int8": 8, "bool": 8, "int4": 4, "uint4": 4,
            "float8_e4m3fn": 8, "float16": 16, "int32": 32}
    for p in module.entry.parameters:
        dims, dt = leaves[p.parameter_number]
        m = _LAYOUT.search(str(p.shape))
        assert m, f"{p.shape} has no tiled layout"
        m2m = [int(x) for x in m.group(1).split(",") if x]
        tile = [int(x) for x in m.group(2).split(",")]
        minor_first = [dims[d] for d in m2m] + [1] * max(0, len(tile) - len(dims))
        elems = 1
        for j, n in enumerate(minor_first):
            elems *= up(n, tile[-1 - j]) if j < len(tile) else n
        assert p.shape.byte_size == math.ceil(elems * bits[dt] / 8), str(p.shape)
        assert p.shape.logical_byte_size == math.ceil(int(np.prod(dims)) * bits[dt] / 8)


def test_tpu_program_reads_padded_arguments(tpu_programs):
    # every argument of "mixed" is read (reduced): HBM reads at least the padded argument bytes,
    # and the analysis reports the padding among them
    compiled, module, _ = tpu_programs["mixed"]
    a = analyze_module(module)
    assert not a.unmodeled
    args = sum(p.shape.byte_size for p in module.entry.parameters)
    data = sum(p.shape.logical_byte_size for p in module.entry.parameters)
    assert a.totals.hbm_read_bytes >= args
    assert a.totals.hbm_padding_read_bytes >= args - data


def test_slices_of_an_edge_padded_weight_read_only_their_data():
    # XLA:TPU's windowed einsum: the weight is padded (0_0x0_1x0_0: dim 1 grows 1 -> 2) and two
    # dynamic-slices of [64,2,16] are read; each covers at most 64 x 1 x 16 weight elements
    a = analyze_module(parse_module("""HloModule m
fused {
  w = bf16[64,1,128]{2,0,1} parameter(0)
  i = s32[] parameter(1)
  z = s32[] constant(0)
  c = bf16[] constant(0)
  p0 = bf16[64,2,128]{2,0,1} pad(w, c), padding=0_0x0_1x0_0
  p1 = bf16[64,2,128]{2,0,1} pad(w, c), padding=0_0x1_0x0_0
  d0 = bf16[64,2,16]{2,0,1} dynamic-slice(p0, z, z, i), dynamic_slice_sizes={64,2,16}
  d1 = bf16[64,2,16]{2,0,1} dynamic-slice(p1, z, z, i), dynamic_slice_sizes={64,2,16}
  ROOT m = bf16[64,2,16]{2,0,1} maximum(d0, d1)
}
ENTRY e {
  w = bf16[64,1,128]{2,0,1} parameter(0)
  i = s32[] parameter(1)
  ROOT f = bf16[64,2,16]{2,0,1} fusion(w, i), kind=kLoop, calls=fused
}
"""))
    r = next(r for r in a.rows if r.instr.name == "f")
    read = next(x for x in r.traffic.reads if x.operand == 0)
    assert read.nbytes == 2 * (64 * 1 * 16) * 2
