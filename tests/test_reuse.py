"""On-chip reuse of fusions and the tiling model of dots / convolutions.

Every expected value is counted by hand from the HLO text or from the closed-form
formulas in the test (bytes = elements x element size), never read from the code.
"""

from __future__ import annotations

import math

import pytest

from jaxmove.hardware import load_spec
from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import analyze_module
from jaxmove.passes.reuse import (fusion_reuse, matmul_traffic, onchip_capacity_bytes, reuse_pass,
                                  tile_edge)

H100_L2_BYTES = 50 * 2**20  # NVIDIA: 50 MB (binary) L2 on H100 SXM5

_CHAIN_OPS = ("negate", "exponential", "tanh", "abs", "sqrt", "negate", "log", "cosine")


def chain_module(k: int, n: int, dtype: str = "f32") -> str:
    """A loop fusion of k elementwise ops in a row on an array of n elements."""
    lines = [f"  p0 = {dtype}[{n}]{{0}} parameter(0)"]
    prev = "p0"
    for i in range(k):
        root = "ROOT " if i == k - 1 else ""
        lines.append(f"  {root}e{i} = {dtype}[{n}]{{0}} {_CHAIN_OPS[i]}({prev})")
        prev = f"e{i}"
    body = "\n".join(lines)
    return f"""HloModule chain

fused_chain {{
{body}
}}

ENTRY main {{
  x = {dtype}[{n}]{{0}} parameter(0)
  ROOT f = {dtype}[{n}]{{0}} fusion(x), kind=kLoop, calls=fused_chain
}}
"""


def _fusion(text: str, name: str = "f"):
    m = parse_module(text)
    entry = m.entry
    return fusion_reuse(entry.by_name[name], entry, m), m


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n,dtype,b", [(1024, "f32", 4), (4096, "bf16", 2), (333, "f16", 2)])
def test_elementwise_chain_fused_vs_unfused(k, n, dtype, b):
    fr, _ = _fusion(chain_module(k, n, dtype))
    assert fr.fused_bytes == 2 * n * b            # read x once, write the result once
    assert fr.unfused_bytes == 2 * k * n * b      # each op reads and writes n elements
    assert fr.onchip_reuse_bytes == (2 * k - 2) * n * b
    assert len(fr.intermediates) == k - 1         # every op but the root stayed on chip
    assert fr.intermediate_bytes == (k - 1) * n * b
    assert fr.working_set_bytes == 2 * n * b


def test_chain_reuse_in_a_while_loop_counts_trip_count():
    n, k, trips = 256, 3, 7
    text = f"""HloModule loop

fused_chain {{
  p0 = f32[{n}]{{0}} parameter(0)
  a = f32[{n}]{{0}} negate(p0)
  b = f32[{n}]{{0}} exponential(a)
  ROOT c = f32[{n}]{{0}} tanh(b)
}}

body {{
  t = (s32[], f32[{n}]{{0}}) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  x = f32[{n}]{{0}} get-tuple-element(t), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  y = f32[{n}]{{0}} fusion(x), kind=kLoop, calls=fused_chain
  ROOT r = (s32[], f32[{n}]{{0}}) tuple(i1, y)
}}

cond {{
  t = (s32[], f32[{n}]{{0}}) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  lim = s32[] constant({trips})
  ROOT lt = pred[] compare(i, lim), direction=LT
}}

ENTRY main {{
  x = f32[{n}]{{0}} parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[{n}]{{0}}) tuple(zero, x)
  w = (s32[], f32[{n}]{{0}}) while(init), condition=cond, body=body, backend_config={{"known_trip_count":{{"n":"{trips}"}}}}
  ROOT out = f32[{n}]{{0}} get-tuple-element(w), index=1
}}
"""
    analysis = analyze_module(parse_module(text))
    ra = reuse_pass(analysis)
    assert ra.rows[("body", "y")].onchip_reuse_bytes == (2 * k - 2) * n * 4
    assert ra.total_onchip_reuse_bytes == trips * (2 * k - 2) * n * 4


def test_slice_footprint_fused_and_unfused():
    # p0 f32[1024] -> slice [0:256] -> negate: both versions read only the 256-element footprint.
    text = """HloModule s

fused {
  p0 = f32[1024]{0} parameter(0)
  s = f32[256]{0} slice(p0), slice={[0:256]}
  ROOT n = f32[256]{0} negate(s)
}

ENTRY main {
  x = f32[1024]{0} parameter(0)
  ROOT f = f32[256]{0} fusion(x), kind=kLoop, calls=fused
}
"""
    fr, _ = _fusion(text)
    assert fr.fused_bytes == 256 * 4 + 256 * 4
    # slice kernel: reads 256*4, writes 256*4; negate kernel: reads 256*4, writes 256*4
    assert fr.unfused_bytes == 4 * 256 * 4
    assert fr.onchip_reuse_bytes == 2 * 256 * 4
    assert fr.intermediates == (("s", 256 * 4),)


def test_inplace_dynamic_update_slice_fusion():
    # buffer f32[1024] updated in place with mul(u, u), u f32[16]; index s32[].
    text = """HloModule d

fused {
  buf = f32[1024]{0} parameter(0)
  u = f32[16]{0} parameter(1)
  i = s32[] parameter(2)
  m = f32[16]{0} multiply(u, u)
  ROOT d = f32[1024]{0} dynamic-update-slice(buf, m, i)
}

ENTRY main {
  b = f32[1024]{0} parameter(0)
  u = f32[16]{0} parameter(1)
  i = s32[] parameter(2)
  ROOT f = f32[1024]{0} fusion(b, u, i), kind=kLoop, calls=fused
}
"""
    fr, _ = _fusion(text)
    # fused: read u (64) and i (4), write the 16-element update (64); buffer not read
    assert fr.fused_bytes == 64 + 4 + 64
    # unfused: multiply reads u (64) writes 64; DUS reads m (64) + i (4), writes the update (64)
    assert fr.unfused_bytes == (64 + 64) + (64 + 4 + 64)
    assert fr.onchip_reuse_bytes == 128


def test_multi_output_fusion_outputs_are_not_intermediates():
    text = """HloModule mo

fused {
  p0 = f32[100]{0} parameter(0)
  a = f32[100]{0} negate(p0)
  b = f32[100]{0} exponential(a)
  c = f32[100]{0} tanh(b)
  ROOT t = (f32[100]{0}, f32[100]{0}) tuple(a, c)
}

ENTRY main {
  x = f32[100]{0} parameter(0)
  ROOT f = (f32[100]{0}, f32[100]{0}) fusion(x), kind=kLoop, calls=fused
}
"""
    fr, _ = _fusion(text)
    assert fr.fused_bytes == 400 + 2 * 400          # read x, write a and c
    assert fr.unfused_bytes == 3 * (400 + 400)      # three ops, each reads and writes 100 f32
    assert [n for n, _ in fr.intermediates] == ["b"]


def test_working_set_against_onchip_capacity():
    spec = load_spec("h100-sxm")
    assert onchip_capacity_bytes(spec) == (H100_L2_BYTES, "l2_bytes")
    assert onchip_capacity_bytes(load_spec("tpu-v5e")) == (128 * 2**20, "vmem_bytes")
    small = analyze_module(parse_module(chain_module(2, 1024)))
    big_n = 16 * 2**20  # 64 MiB in, 64 MiB out: more than a 50 MiB L2
    big = analyze_module(parse_module(chain_module(2, big_n)))
    assert reuse_pass(small, spec).rows[("main", "f")].fusion.fits_on_chip is True
    fr = reuse_pass(big, spec).rows[("main", "f")].fusion
    assert fr.working_set_bytes == 2 * big_n * 4 and fr.fits_on_chip is False
    assert reuse_pass(small).rows[("main", "f")].fusion.fits_on_chip is None  # no spec, no verdict


# ---- tiling model -------------------------------------------------------------------------

def _dot_module(m: int, k: int, n: int, dtype: str = "bf16") -> str:
    return f"""HloModule mm

ENTRY main {{
  a = {dtype}[{m},{k}]{{1,0}} parameter(0)
  b = {dtype}[{k},{n}]{{1,0}} parameter(1)
  ROOT d = {dtype}[{m},{n}]{{1,0}} dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""


def test_tile_edge_fits_accumulators_and_two_strips():
    for s in (1, 10, 1000, 26_214_400):
        a = tile_edge(s)
        assert a * a + 2 * a <= s + 1 or a == 1
        assert (a + 1) ** 2 + 2 * (a + 1) > s + 1


def test_8192_cubed_bf16_matmul_between_compulsory_and_no_reuse():
    n = 8192
    ra = reuse_pass(analyze_module(parse_module(_dot_module(n, n, n))), load_spec("h100-sxm"))
    (t,) = ra.rows[("main", "d")].tilings
    operand = n * n * 2
    compulsory = 3 * operand
    no_reuse = n**3 * (2 + 2) + operand          # every multiply-add fetches a and b
    s_elems = H100_L2_BYTES // 2
    lower = 2 * n**3 / math.sqrt(s_elems) * 2 + n * n * 2  # Kwasniewski et al. 2019 bound, bytes
    assert (t.m, t.n, t.k, t.batch) == (n, n, n, 1)
    assert t.compulsory_bytes == compulsory and t.no_reuse_bytes == no_reuse
    assert compulsory < t.tiled_bytes < no_reuse
    assert t.tiled_bytes >= lower
    # a = floor(sqrt(S+1) - 1) = 5119 for S = 26,214,400; 8192 / 5119 -> 2 passes over A and B
    assert t.tile == 5119 and t.lhs_passes == 2 and t.rhs_passes == 2
    assert t.tiled_bytes == 2 * operand + 2 * operand + operand


def test_matmul_that_fits_on_chip_is_compulsory():
    ra = reuse_pass(analyze_module(parse_module(_dot_module(512, 512, 512))), load_spec("h100-sxm"))
    (t,) = ra.rows[("main", "d")].tilings
    assert t.tiled_bytes == t.compulsory_bytes == 3 * 512 * 512 * 2
    assert ra.rows[("main", "d")].tiling_extra_read_bytes == 0


def test_decode_shaped_matmul_reads_weights_once():
    # [1, 4096] x [4096, 50304]: one row of A, the weight matrix B streamed once.
    ra = reuse_pass(analyze_module(parse_module(_dot_module(1, 4096, 50304))), load_spec("h100-sxm"))
    (t,) = ra.rows[("main", "d")].tilings
    assert t.rhs_passes == 1
    assert t.tiled_bytes == t.compulsory_bytes == (4096 + 4096 * 50304 + 50304) * 2


def test_small_fast_memory_rereads_more():
    # S = 64 KiB of f32: a = floor(sqrt(16385) - 1) = 127; M = N = 1024 -> ceil(1024/127) = 9 passes
    t = matmul_traffic(1, 1024, 1024, 1024, 4 * 2**20, 4 * 2**20, 4 * 2**20, (4, 4, 4), 64 * 2**10)
    assert t.tile == 127 and t.lhs_passes == 9 and t.rhs_passes == 9
    assert t.tiled_bytes == 9 * 4 * 2**20 * 2 + 4 * 2**20


def test_batched_dot_and_fused_dot():
    text = """HloModule bmm

fused_dot {
  p0 = bf16[8,256,512]{2,1,0} parameter(0)
  p1 = bf16[8,512,128]{2,1,0} parameter(1)
  d = bf16[8,256,128]{2,1,0} dot(p0, p1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT n = bf16[8,256,128]{2,1,0} negate(d)
}

ENTRY main {
  a = bf16[8,256,512]{2,1,0} parameter(0)
  b = bf16[8,512,128]{2,1,0} parameter(1)
  ROOT f = bf16[8,256,128]{2,1,0} fusion(a, b), kind=kOutput, calls=fused_dot
}
"""
    ra = reuse_pass(analyze_module(parse_module(text)), load_spec("h100-sxm"))
    row = ra.rows[("main", "f")]
    (t,) = row.tilings
    assert (t.batch, t.m, t.n, t.k) == (8, 256, 128, 512)
    assert t.tiled_bytes == t.compulsory_bytes  # everything fits in 50 MiB
    # the fused negate kept the dot's result on chip: unfused = dot (r a, r b, w d) + negate (r d, w n)
    a, b, d = 8 * 256 * 512 * 2, 8 * 512 * 128 * 2, 8 * 256 * 128 * 2
    assert row.fusion.unfused_bytes == (a + b + d) + (d + d)
    assert row.fusion.fused_bytes == a + b + d
    assert row.onchip_reuse_bytes == 2 * d


def test_cublas_gemm_custom_call_dims_from_shapes():
    text = """HloModule g

ENTRY main {
  a = f16[2048,1024]{1,0} parameter(0)
  b = f16[1024,4096]{1,0} parameter(1)
  ROOT g = (f16[2048,4096]{1,0}, s8[4194304]{0}) custom-call(a, b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
}
"""
    ra = reuse_pass(analyze_module(parse_module(text)), load_spec("a100-80gb"))
    (t,) = ra.rows[("main", "g")].tilings
    assert (t.batch, t.m, t.n, t.k) == (1, 2048, 4096, 1024)
    assert t.compulsory_bytes == (2048 * 1024 + 1024 * 4096 + 2048 * 4096) * 2


def test_convolution_as_implicit_gemm():
    # 1x1 convolution NHWC [8,32,32,256] with kernel [1,1,256,512]: a GEMM M=8*32*32, N=512, K=256
    text = """HloModule c

ENTRY main {
  x = bf16[8,32,32,256]{3,2,1,0} parameter(0)
  w = bf16[1,1,256,512]{3,2,1,0} parameter(1)
  ROOT c = bf16[8,32,32,512]{3,2,1,0} convolution(x, w), window={size=1x1}, dim_labels=b01f_01io->b01f
}
"""
    ra = reuse_pass(analyze_module(parse_module(text)), load_spec("tpu-v4"))
    (t,) = ra.rows[("main", "c")].tilings
    assert (t.m, t.n, t.k) == (8 * 32 * 32, 512, 256)
    x, w, y = 8 * 32 * 32 * 256 * 2, 256 * 512 * 2, 8 * 32 * 32 * 512 * 2
    assert t.compulsory_bytes == x + w + y
    assert t.compulsory_bytes <= t.tiled_bytes <= t.no_reuse_bytes


def test_no_spec_no_tiling():
    ra = reuse_pass(analyze_module(parse_module(_dot_module(64, 64, 64))))
    assert ra.rows[("main", "d")].tilings == ()


def test_structurally_identical_fusions_share_bytes_but_name_their_own_intermediates():
    """Two copies of one fused computation under other names (an unrolled model's layers):
    the pass answers the second from the first's class (hlo/structure.py); its intermediates
    are its own instructions, and its bytes are the same hand count: 3 ops on n f32 elements,
    unfused 2*3*n*4, fused 2*n*4."""
    n = 512
    text = f"""HloModule two

fused_a {{
  p0 = f32[{n}]{{0}} parameter(0)
  a1 = f32[{n}]{{0}} negate(p0)
  a2 = f32[{n}]{{0}} exponential(a1)
  ROOT a3 = f32[{n}]{{0}} tanh(a2)
}}

fused_b {{
  q0 = f32[{n}]{{0}} parameter(0)
  b1 = f32[{n}]{{0}} negate(q0)
  b2 = f32[{n}]{{0}} exponential(b1)
  ROOT b3 = f32[{n}]{{0}} tanh(b2)
}}

ENTRY main {{
  x = f32[{n}]{{0}} parameter(0)
  f = f32[{n}]{{0}} fusion(x), kind=kLoop, calls=fused_a
  ROOT g = f32[{n}]{{0}} fusion(f), kind=kLoop, calls=fused_b
}}
"""
    m = parse_module(text)
    assert m.structural_classes["fused_b"] == "fused_a"
    ru = reuse_pass(analyze_module(m))
    for fusion, names in (("f", {"a1", "a2"}), ("g", {"b1", "b2"})):
        fr = ru.rows[("main", fusion)].fusion
        assert (fr.fused_bytes, fr.unfused_bytes) == (2 * n * 4, 2 * 3 * n * 4)
        assert {name for name, _b in fr.intermediates} == names
        assert fr.intermediate_bytes == 2 * n * 4
    assert ru.total_onchip_reuse_bytes == 2 * (2 * 3 - 2) * n * 4
