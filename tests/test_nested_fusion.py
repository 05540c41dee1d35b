"""Slice footprints, read-once and in-place updates through nested fusions (issue 23 item 1).

XLA:TPU wraps a stacked int8 weight / KV parameter of a scanned model in a nested kLoop fusion
(a retiling ``copy`` T(32,128) -> T(8,128), with ``output_to_operand_aliasing``), takes one
layer of it with a dynamic-slice, then dequantizes: the kernel reads one layer, not the stack.
Each expected figure below is counted by hand from the shapes in the HLO text.
"""

from __future__ import annotations

import pytest

from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import analyze_module


def _row(text: str, name: str):
    a = analyze_module(parse_module(text))
    return {r.instr.name: r for r in a.rows}[name]


# openxla/xla xla/service/hlo_cost_analysis_test.cc, FusionCostAnalysis.NestedCopyFusion: the
# nested fusion's bytes must equal those of the same fusion without the nested copy.
_XLA_NESTED = """HloModule temp, is_scheduled=true

copy_fusion.1291.clone {
  input.1291 = s8[2,6144,2,256]{3,1,0,2:T(32,128)(4,1)S(1)} parameter(0)
  ROOT copy.74276 = s8[2,6144,2,256]{3,1,0,2:T(8,128)(4,1)} copy(input.1291)
}

fused_computation.4150.clone {
  param_0.185389 = s8[2,6144,2,256]{3,1,0,2:T(32,128)(4,1)} parameter(0)
  fusion.103344 = s8[2,6144,2,256]{3,1,0,2:T(8,128)(4,1)} fusion(param_0.185389), kind=kLoop, calls=copy_fusion.1291.clone
  constant.230138 = s32[]{:T(128)} constant(0)
  param_1.219146 = s32[]{:T(128)S(6)} parameter(1)
  ROOT dynamic-slice.40526 = s8[2,384,2,256]{3,1,0,2:T(8,128)(4,1)} dynamic-slice(fusion.103344, constant.230138, param_1.219146, constant.230138, constant.230138), dynamic_slice_sizes={2,384,2,256}
}

ENTRY temp {
  param_2.123719 = s8[2,6144,2,256]{3,1,0,2:T(32,128)(4,1)} parameter(0)
  param_3.66279 = s32[]{:T(128)S(6)} parameter(1)
  ROOT fusion.85943 = s8[2,384,2,256]{3,1,0,2:T(8,128)(4,1)} fusion(param_2.123719, param_3.66279), kind=kLoop, calls=fused_computation.4150.clone
}
"""

_XLA_FLAT = """HloModule temp, is_scheduled=true

fused_computation.4150.clone {
  param_0.185389 = s8[2,6144,2,256]{3,1,0,2:T(8,128)(4,1)} parameter(0)
  constant.230138 = s32[]{:T(128)} constant(0)
  param_1.219146 = s32[]{:T(128)S(6)} parameter(1)
  ROOT dynamic-slice.40526 = s8[2,384,2,256]{3,1,0,2:T(8,128)(4,1)} dynamic-slice(param_0.185389, constant.230138, param_1.219146, constant.230138, constant.230138), dynamic_slice_sizes={2,384,2,256}
}

ENTRY temp {
  param_2.123719 = s8[2,6144,2,256]{3,1,0,2:T(8,128)(4,1)} parameter(0)
  param_3.66279 = s32[]{:T(128)S(6)} parameter(1)
  ROOT fusion.85943 = s8[2,384,2,256]{3,1,0,2:T(8,128)(4,1)} fusion(param_2.123719, param_3.66279), kind=kLoop, calls=fused_computation.4150.clone
}
"""


def test_xla_nested_copy_fusion_reads_the_dynamic_slice_footprint():
    # s8[2,6144,2,256] in layout {3,1,0,2}: physical [2,2,6144,256], (32,128) tiles fit exactly:
    # 6,291,456 bytes. The dynamic-slice takes [2,384,2,256] = 393,216 elements = 393,216 bytes
    # (1/16 of the buffer); the result s8[2,384,2,256] (physical [2,2,384,256], (8,128) tiles
    # exact) is 393,216 bytes. The S(6) index is on chip. jaxmove read 6,291,456 before.
    nested = _row(_XLA_NESTED, "fusion.85943").total
    flat = _row(_XLA_FLAT, "fusion.85943").total
    assert nested.hbm_read_bytes == 2 * 384 * 2 * 256 == 393_216
    assert nested.hbm_write_bytes == 393_216
    assert (nested.hbm_read_bytes, nested.hbm_write_bytes) == (flat.hbm_read_bytes, flat.hbm_write_bytes)


# The dequant GEMM XLA:TPU emits in the loop body of a scanned int8 layer stack (copied from the
# deviceless compile of the program in test_real_tpu_scanned_int8_weights_read_once, names
# shortened, metadata dropped): convolution fusion -> bitcast_multiply fusion (dynamic-slice of
# one layer, convert, scale) -> copy_fusion (retiling copy of the whole stack).
_TPU_DEQUANT_GEMM = """HloModule dequant, is_scheduled=true

copy_fusion {
  input = s8[4,512,512]{2,1,0:T(32,128)(4,1)} parameter(0)
  ROOT copy.9 = s8[4,512,512]{2,1,0:T(8,128)(4,1)} copy(input)
}

dequant {
  param_1.24 = s8[4,512,512]{2,1,0:T(32,128)(4,1)} parameter(1)
  fusion.11 = s8[4,512,512]{2,1,0:T(8,128)(4,1)} fusion(param_1.24), kind=kLoop, output_to_operand_aliasing={{}: (0, {})}, calls=copy_fusion
  param_2.14 = s32[]{:T(128)S(6)} parameter(2)
  constant.28 = s32[]{:T(128)} constant(0)
  dynamic_slice.14 = s8[1,512,512]{2,1,0:T(8,128)(4,1)} dynamic-slice(fusion.11, param_2.14, constant.28, constant.28), dynamic_slice_sizes={1,512,512}
  convert.9 = bf16[1,512,512]{2,1,0:T(8,128)(2,1)} convert(dynamic_slice.14)
  bitcast.8 = bf16[512,512]{1,0:T(8,128)(2,1)} bitcast(convert.9)
  convert.10 = f32[512,512]{1,0:T(8,128)} convert(bitcast.8)
  param_0.24 = bf16[512]{0:T(512)(128)(2,1)S(1)} parameter(0)
  mul.21 = bf16[512,512]{1,0:T(8,128)(2,1)} broadcast(param_0.24), dimensions={1}
  convert.11 = f32[512,512]{1,0:T(8,128)} convert(mul.21)
  mul.20 = f32[512,512]{1,0:T(8,128)} multiply(convert.10, convert.11)
  ROOT convert.12 = bf16[512,512]{1,0:T(8,128)(2,1)} convert(mul.20)
}

gemm {
  param_0.25 = bf16[8,512]{1,0:T(8,128)(2,1)S(1)} parameter(0)
  param_1.25 = bf16[512]{0:T(512)(128)(2,1)S(1)} parameter(1)
  param_2.15 = s8[4,512,512]{2,1,0:T(32,128)(4,1)} parameter(2)
  param_3.8 = s32[]{:T(128)S(6)} parameter(3)
  bitcast_multiply_fusion.5 = bf16[512,512]{1,0:T(8,128)(2,1)} fusion(param_1.25, param_2.15, param_3.8), kind=kLoop, calls=dequant
  ROOT convolution.5 = bf16[8,512]{1,0:T(8,128)(2,1)S(1)} convolution(param_0.25, bitcast_multiply_fusion.5), dim_labels=bf_io->bf
}

ENTRY e {
  x = bf16[8,512]{1,0:T(8,128)(2,1)S(1)} parameter(0)
  s = bf16[512]{0:T(512)(128)(2,1)S(1)} parameter(1)
  w = s8[4,512,512]{2,1,0:T(32,128)(4,1)} parameter(2)
  i = s32[]{:T(128)S(6)} parameter(3)
  ROOT f = bf16[8,512]{1,0:T(8,128)(2,1)S(1)} fusion(x, s, w, i), kind=kOutput, calls=gemm
}
"""


def test_tpu_dequant_gemm_reads_one_layer_through_two_nested_fusions():
    # w: s8[4,512,512], (32,128) tiles exact: 1,048,576 bytes; the dynamic-slice takes one layer
    # [1,512,512] = 262,144 bytes. x, s, the result (S(1), VMEM) and i (S(6)) are on chip, so the
    # kernel's HBM traffic is that one layer. jaxmove read the whole stack (1,048,576) before.
    t = _row(_TPU_DEQUANT_GEMM, "f").total
    assert t.hbm_read_bytes == 512 * 512 == 262_144
    assert t.hbm_write_bytes == 0


def _chain_module(depth: int) -> str:
    """A dynamic-slice of one row of 64 taken of ``depth`` fusions nested one in another, each
    (but the innermost, a copy) applying one of bitcast / convert / reshape / copy to the next."""
    ops = ["bitcast", "convert", "reshape", "copy"]
    comps = ["inner0 {\n  p = f32[64,256]{1,0} parameter(0)\n  ROOT r = f32[64,256]{1,0} copy(p)\n}\n"]
    for d in range(1, depth):
        op = ops[d % len(ops)]
        comps.append(f"inner{d} {{\n  p = f32[64,256]{{1,0}} parameter(0)\n"
                     f"  n = f32[64,256]{{1,0}} fusion(p), kind=kLoop, calls=inner{d - 1}\n"
                     f"  ROOT r = f32[64,256]{{1,0}} {op}(n)\n}}\n")
    comps.append(f"outer {{\n  p = f32[64,256]{{1,0}} parameter(0)\n  i = s32[] parameter(1)\n"
                 f"  z = s32[] constant(0)\n"
                 f"  n = f32[64,256]{{1,0}} fusion(p), kind=kLoop, calls=inner{depth - 1}\n"
                 f"  ROOT d = f32[1,256]{{1,0}} dynamic-slice(n, i, z), dynamic_slice_sizes={{1,256}}\n}}\n")
    return ("HloModule chain\n\n" + "\n".join(comps) +
            "\nENTRY e {\n  x = f32[64,256]{1,0} parameter(0)\n  i = s32[] parameter(1)\n"
            "  ROOT f = f32[1,256]{1,0} fusion(x, i), kind=kLoop, calls=outer\n}\n")


@pytest.mark.parametrize("depth", [1, 6, 400])
def test_footprint_carries_through_any_depth_of_nesting(depth):
    # one row of f32[64,256]: 256 x 4 = 1,024 bytes read of x (65,536), plus the s32 index (4);
    # writes the f32[1,256] result (1,024). Depth 400 also shows no Python recursion limit.
    t = _row(_chain_module(depth), "f").total
    assert t.hbm_read_bytes == 256 * 4 + 4
    assert t.hbm_write_bytes == 256 * 4


def test_nested_fusion_that_is_the_fusion_root_reads_its_operand_whole():
    # the outer fusion's root is the nested fusion itself (negate of x): its result leaves the
    # kernel whole, so x (f32[64,256], 65,536 B) is read whole and the result written whole.
    text = """HloModule m
inner {
  p = f32[64,256]{1,0} parameter(0)
  ROOT c = f32[64,256]{1,0} negate(p)
}
outer {
  p = f32[64,256]{1,0} parameter(0)
  ROOT n = f32[64,256]{1,0} fusion(p), kind=kLoop, calls=inner
}
ENTRY e {
  x = f32[64,256]{1,0} parameter(0)
  ROOT f = f32[64,256]{1,0} fusion(x), kind=kLoop, calls=outer
}
"""
    t = _row(text, "f").total
    assert (t.hbm_read_bytes, t.hbm_write_bytes) == (64 * 256 * 4, 64 * 256 * 4)


def test_parameter_read_once_through_nested_and_direct_uses():
    # p (f32[64,256], 65,536 B) is used whole by a nested fusion (negate) and by the outer
    # multiply: read once, 65,536 bytes; q (same shape) is used only by a nested fusion whose
    # root is a 1-row slice and by an outer 1-row dynamic-slice: 2 rows, 2 x 1,024 bytes.
    text = """HloModule once
neg {
  a = f32[64,256]{1,0} parameter(0)
  ROOT n = f32[64,256]{1,0} negate(a)
}
row {
  a = f32[64,256]{1,0} parameter(0)
  ROOT s = f32[1,256]{1,0} slice(a), slice={[3:4], [0:256]}
}
outer {
  p = f32[64,256]{1,0} parameter(0)
  q = f32[64,256]{1,0} parameter(1)
  i = s32[] parameter(2)
  z = s32[] constant(0)
  n = f32[64,256]{1,0} fusion(p), kind=kLoop, calls=neg
  m = f32[64,256]{1,0} multiply(p, n)
  r0 = f32[1,256]{1,0} fusion(q), kind=kLoop, calls=row
  r1 = f32[1,256]{1,0} dynamic-slice(q, i, z), dynamic_slice_sizes={1,256}
  r = f32[1,256]{1,0} add(r0, r1)
  ROOT t = (f32[64,256]{1,0}, f32[1,256]{1,0}) tuple(m, r)
}
ENTRY e {
  p = f32[64,256]{1,0} parameter(0)
  q = f32[64,256]{1,0} parameter(1)
  i = s32[] parameter(2)
  ROOT f = (f32[64,256]{1,0}, f32[1,256]{1,0}) fusion(p, q, i), kind=kLoop, calls=outer
}
"""
    r = _row(text, "f")
    by_operand = {a.operand: a.nbytes for a in r.traffic.reads}
    assert by_operand == {0: 64 * 256 * 4, 1: 2 * 256 * 4, 2: 4}
    assert r.total.hbm_write_bytes == (64 * 256 + 256) * 4


def test_tuple_rooted_nested_fusion_footprint_per_element():
    # the nested fusion returns (copy(a), negate(b)); outside, element 0 is used only through a
    # 1-row dynamic-slice, element 1 whole: a is read for one row (1,024 B of 65,536), b whole.
    text = """HloModule tup
pair {
  a = f32[64,256]{1,0} parameter(0)
  b = f32[64,256]{1,0} parameter(1)
  ca = f32[64,256]{1,0} copy(a)
  nb = f32[64,256]{1,0} negate(b)
  ROOT t = (f32[64,256]{1,0}, f32[64,256]{1,0}) tuple(ca, nb)
}
outer {
  a = f32[64,256]{1,0} parameter(0)
  b = f32[64,256]{1,0} parameter(1)
  i = s32[] parameter(2)
  z = s32[] constant(0)
  n = (f32[64,256]{1,0}, f32[64,256]{1,0}) fusion(a, b), kind=kLoop, calls=pair
  g0 = f32[64,256]{1,0} get-tuple-element(n), index=0
  g1 = f32[64,256]{1,0} get-tuple-element(n), index=1
  d = f32[1,256]{1,0} dynamic-slice(g0, i, z), dynamic_slice_sizes={1,256}
  z2 = f32[] constant(0)
  s = f32[256]{0} reduce(g1, z2), dimensions={0}, to_apply=add
  sb = f32[1,256]{1,0} reshape(s)
  ROOT r = f32[1,256]{1,0} add(d, sb)
}
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
ENTRY e {
  a = f32[64,256]{1,0} parameter(0)
  b = f32[64,256]{1,0} parameter(1)
  i = s32[] parameter(2)
  ROOT f = f32[1,256]{1,0} fusion(a, b, i), kind=kLoop, calls=outer
}
"""
    r = _row(text, "f")
    by_operand = {a.operand: a.nbytes for a in r.traffic.reads}
    assert by_operand == {0: 256 * 4, 1: 64 * 256 * 4, 2: 4}


# The KV-cache update XLA:TPU emits in the loop body of a scanned int8-KV decode (from the
# deviceless compile of llama3-70b-decode, layers=4, int8 weights and KV, tpu-v5e:4x4, plan tp;
# reduced to seq 64, the quantisation arithmetic dropped): the buffer operand of the root
# dynamic-update-slice is a nested retiling copy (T(32,128) -> T(8,128), aliased to its operand)
# of the cache parameter, and the result has the parameter's own layout T(32,128).
_TPU_KV_UPDATE = """HloModule kv, is_scheduled=true

copy_fusion {
  input = s8[4,32,2,64,128]{4,1,2,3,0:T(32,128)(4,1)} parameter(0)
  ROOT copy.107 = s8[4,32,2,64,128]{4,1,2,3,0:T(8,128)(4,1)} copy(input)
}

update {
  param_0.590 = s8[4,32,2,64,128]{4,1,2,3,0:T(32,128)(4,1)} parameter(0)
  fusion.170 = s8[4,32,2,64,128]{4,1,2,3,0:T(8,128)(4,1)} fusion(param_0.590), kind=kLoop, output_to_operand_aliasing={{}: (0, {})}, calls=copy_fusion
  new = s8[1,32,2,1,128]{4,1,2,3,0:T(8,128)(4,1)} parameter(3)
  l = s32[]{:T(128)S(6)} parameter(1)
  z = s32[]{:T(128)} constant(0)
  pos = s32[]{:T(128)S(6)} parameter(2)
  ROOT dus = s8[4,32,2,64,128]{4,1,2,3,0:T(32,128)(4,1)} dynamic-update-slice(fusion.170, new, l, z, z, pos, z)
}

ENTRY e {
  cache = s8[4,32,2,64,128]{4,1,2,3,0:T(32,128)(4,1)} parameter(0)
  l = s32[]{:T(128)S(6)} parameter(1)
  pos = s32[]{:T(128)S(6)} parameter(2)
  new = s8[1,32,2,1,128]{4,1,2,3,0:T(8,128)(4,1)} parameter(3)
  ROOT f = s8[4,32,2,64,128]{4,1,2,3,0:T(32,128)(4,1)} fusion(cache, l, pos, new), kind=kLoop, calls=update
}
"""


def test_tpu_kv_update_through_nested_retiling_copy_is_in_place():
    # cache: physical [4,64,2,32,128], (32,128) tiles exact: 2,097,152 bytes; the update
    # s8[1,32,2,1,128] (physical [1,1,2,32,128], (8,128) tiles exact): 8,192 bytes. In place:
    # the cache is not read, only the update is written; indices are on chip (S(6)).
    # jaxmove read 2,097,152 + 8,192 and wrote 2,097,152 before.
    r = _row(_TPU_KV_UPDATE, "f")
    assert (r.total.hbm_read_bytes, r.total.hbm_write_bytes) == (8192, 8192)
    assert any("updated in place" in n for n in r.notes)
    assert r.traffic.inplace_buffer_bytes == 2_097_152


def test_update_through_a_computing_nested_fusion_is_not_in_place():
    # the same, but the nested fusion adds 1 to the cache: its result is a new value, so the
    # kernel reads the whole cache (2,097,152 B) and the update (8,192 B), and writes the whole
    # result (2,097,152 B).
    text = _TPU_KV_UPDATE.replace(
        "  ROOT copy.107 = s8[4,32,2,64,128]{4,1,2,3,0:T(8,128)(4,1)} copy(input)",
        "  one = s8[] constant(1)\n  b = s8[4,32,2,64,128]{4,1,2,3,0:T(8,128)(4,1)} broadcast(one), dimensions={}\n"
        "  ROOT copy.107 = s8[4,32,2,64,128]{4,1,2,3,0:T(8,128)(4,1)} add(input, b)")
    r = _row(text, "f")
    assert (r.total.hbm_read_bytes, r.total.hbm_write_bytes) == (2_097_152 + 8192, 2_097_152)


def test_update_whose_result_layout_differs_is_not_in_place():
    # the same copy, but the result keeps the copy's T(8,128) layout, not the cache's T(32,128):
    # every untouched element moves to a new place, so the whole cache is read and written.
    text = _TPU_KV_UPDATE.replace(
        "ROOT dus = s8[4,32,2,64,128]{4,1,2,3,0:T(32,128)(4,1)}",
        "ROOT dus = s8[4,32,2,64,128]{4,1,2,3,0:T(8,128)(4,1)}").replace(
        "ROOT f = s8[4,32,2,64,128]{4,1,2,3,0:T(32,128)(4,1)}",
        "ROOT f = s8[4,32,2,64,128]{4,1,2,3,0:T(8,128)(4,1)}")
    r = _row(text, "f")
    assert (r.total.hbm_read_bytes, r.total.hbm_write_bytes) == (2_097_152 + 8192, 2_097_152)


# ---- a real deviceless TPU compile ---------------------------------------------------------

_L, _D, _B = 4, 512, 8  # layers, width, batch


@pytest.fixture(scope="module")
def scanned_int8_tpu():
    pytest.importorskip("jax")
    from tests.device_compile import abstract, tpu_mesh
    import jax
    import jax.numpy as jnp

    import jaxmove
    from jaxmove._platform import quiet_stderr

    def step(params, x):
        def body(h, layer):
            w = layer["w"].astype(jnp.bfloat16) * layer["s"]
            return jnp.tanh(h @ w), None
        h, _ = jax.lax.scan(body, x, params)
        return h

    mesh = tpu_mesh(1)
    params = {"w": abstract(mesh, (_L, _D, _D), jnp.int8), "s": abstract(mesh, (_L, _D), jnp.bfloat16)}
    x = abstract(mesh, (_B, _D), jnp.bfloat16)
    with quiet_stderr():
        return jaxmove.analyze(step, params, x)


def test_real_tpu_scanned_int8_weights_read_once(scanned_int8_tpu):
    # A scan over 4 layers of an int8 [512,512] weight with a bf16 [512] scale: the step needs
    # each layer once, L*D*D int8 bytes + L*D*2 bf16 bytes = 1,048,576 + 4,096 = 1,052,672 (both
    # unpadded under their (32,128) / (4,128) tiles). XLA:TPU's loop body reads layer i of the
    # stacked weight through copy_fusion -> dynamic-slice -> dequant (nested fusions): one
    # [512,512] layer per iteration. jaxmove counted the whole stack per iteration before
    # (4,198,400 bytes of weights).
    rep = scanned_int8_tpu
    assert rep.program.backend == "tpu" and not rep.unmodeled
    assert rep.totals.weights_read_bytes == _L * _D * _D + _L * _D * 2
    gemm = [r for r in rep.rows if r.instr.opcode == "fusion" and r.total.weights_read_bytes
            and r.per_execution.weights_read_bytes == _D * _D]
    assert len(gemm) == 1 and gemm[0].total.weights_read_bytes == _L * _D * _D
