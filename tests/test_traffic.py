"""Traffic, multiplicity and roles on hand-written and corpus HLO, against hand-counted bytes."""

from __future__ import annotations

import pytest

from jaxmove.hlo import HloParseError, parse_file, parse_module
from jaxmove.passes.multiplicity import multiplicity_pass
from jaxmove.passes.pipeline import analyze_module
from jaxmove.passes.roles import role_from_name, roles_pass

from .conftest import corpus_file


def rows_by_name(analysis):
    return {r.instr.name: r for r in analysis.rows}


def test_fused_slice_reads_footprint_and_param_used_twice_is_read_once():
    # p0: f32[1024,256] (1 MiB) used only through a slice of 8 rows; p1 f32[8,256] used twice.
    a = analyze_module(parse_module("""HloModule t
fused {
  p0 = f32[1024,256]{1,0} parameter(0)
  p1 = f32[8,256]{1,0} parameter(1)
  s = f32[8,256]{1,0} slice(p0), slice={[16:24], [0:256]}
  m = f32[8,256]{1,0} multiply(p1, p1)
  ROOT a = f32[8,256]{1,0} add(s, m)
}
ENTRY e {
  x = f32[1024,256]{1,0} parameter(0)
  y = f32[8,256]{1,0} parameter(1)
  ROOT f = f32[8,256]{1,0} fusion(x, y), kind=kLoop, calls=fused
}
"""))
    f = rows_by_name(a)["f"].total
    assert f.hbm_read_bytes == 8 * 256 * 4 + 8 * 256 * 4   # footprint of x + y once
    assert f.hbm_write_bytes == 8 * 256 * 4
    assert a.totals.hbm_read_bytes == f.hbm_read_bytes     # parameter / root fusion only


def test_footprint_through_elementwise_and_gather():
    # convert then dynamic-slice: only the sliced elements of the bf16 parameter are read.
    a = analyze_module(parse_module("""HloModule t
fused {
  p0 = bf16[64,1024]{1,0} parameter(0)
  i = s32[] parameter(1)
  c = f32[64,1024]{1,0} convert(p0)
  z = s32[] constant(0)
  ROOT d = f32[1,1024]{1,0} dynamic-slice(c, i, z), dynamic_slice_sizes={1,1024}
}
gfused {
  t = f32[50000,128]{1,0} parameter(0)
  ids = s32[4,1]{1,0} parameter(1)
  ROOT g = f32[4,128]{1,0} gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,128}
}
ENTRY e {
  x = bf16[64,1024]{1,0} parameter(0)
  i = s32[] parameter(1)
  table = f32[50000,128]{1,0} parameter(2)
  ids = s32[4,1]{1,0} parameter(3)
  f = f32[1,1024]{1,0} fusion(x, i), kind=kLoop, calls=fused
  g = f32[4,128]{1,0} fusion(table, ids), kind=kLoop, calls=gfused
  ROOT t = (f32[1,1024]{1,0}, f32[4,128]{1,0}) tuple(f, g)
}
"""))
    r = rows_by_name(a)
    assert r["f"].total.hbm_read_bytes == 1024 * 2 + 4          # one bf16 row + the index
    assert r["f"].total.hbm_write_bytes == 1024 * 4
    assert r["g"].total.hbm_read_bytes == 4 * 128 * 4 + 4 * 4    # 4 embedding rows + ids
    assert r["t"].total.hbm_bytes == 0                            # tuple moves nothing


def test_footprint_through_a_reduce_then_a_slice():
    """XLA:GPU's split-K q/k/v GEMM writes f32[4, 32, 6144] partial sums; each consumer
    reduces the 4 partials, converts and slices its own columns (q 0:4096, k and v 1024 each).
    Each reads 4 x 32 x its columns x 4 B of the partials, together the buffer once (a user
    trial saw each charged the whole buffer: +12,582,912 B of split_k_partials at 2 layers)."""
    def consumer(name, lo, hi):
        return f"""{name} {{
  p = f32[4,32,6144]{{2,1,0}} parameter(0)
  z = f32[] constant(0)
  r = f32[32,6144]{{1,0}} reduce(p, z), dimensions={{0}}, to_apply=add
  c = bf16[32,6144]{{1,0}} convert(r)
  ROOT s = bf16[32,{hi - lo}]{{1,0}} slice(c), slice={{[0:32], [{lo}:{hi}]}}
}}
"""
    a = analyze_module(parse_module("HloModule t\nadd {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
                                    "  ROOT s = f32[] add(a, b)\n}\n"
                                    + consumer("fq", 0, 4096) + consumer("fk", 4096, 5120) + consumer("fv", 5120, 6144)
                                    + """ENTRY e {
  parts = f32[4,32,6144]{2,1,0} parameter(0)
  q = bf16[32,4096]{1,0} fusion(parts), kind=kLoop, calls=fq
  k = bf16[32,1024]{1,0} fusion(parts), kind=kLoop, calls=fk
  v = bf16[32,1024]{1,0} fusion(parts), kind=kLoop, calls=fv
  ROOT t = (bf16[32,4096]{1,0}, bf16[32,1024]{1,0}, bf16[32,1024]{1,0}) tuple(q, k, v)
}
"""))
    r = rows_by_name(a)
    for name, cols in (("q", 4096), ("k", 1024), ("v", 1024)):
        assert r[name].total.hbm_read_bytes == 4 * 32 * cols * 4, name
        assert r[name].total.hbm_write_bytes == 32 * cols * 2, name
    assert sum(r[n].total.hbm_read_bytes for n in "qkv") == 4 * 32 * 6144 * 4   # the buffer once


def test_inplace_dus_and_whole_buffer_rewrite():
    # cache f32[8,1024,64]: in-place update writes one row; converting around the update
    # (what XLA:CPU does to a bf16 cache) rewrites the whole buffer.
    text = """HloModule t, input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, may-alias) }
inplace {
  c = f32[8,1024,64]{2,1,0} parameter(0)
  u = f32[8,1,64]{2,1,0} parameter(1)
  i = s32[] parameter(2)
  z = s32[] constant(0)
  ROOT d = f32[8,1024,64]{2,1,0} dynamic-update-slice(c, u, z, i, z)
}
converted {
  c = bf16[8,1024,64]{2,1,0} parameter(0)
  u = f32[8,1,64]{2,1,0} parameter(1)
  i = s32[] parameter(2)
  z = s32[] constant(0)
  cf = f32[8,1024,64]{2,1,0} convert(c)
  d = f32[8,1024,64]{2,1,0} dynamic-update-slice(cf, u, z, i, z)
  ROOT back = bf16[8,1024,64]{2,1,0} convert(d)
}
ENTRY e {
  cache = f32[8,1024,64]{2,1,0} parameter(0), metadata={op_name="cache['k_cache']"}
  cache16 = bf16[8,1024,64]{2,1,0} parameter(1), metadata={op_name="cache['v_cache']"}
  upd = f32[8,1,64]{2,1,0} parameter(2)
  pos = s32[] parameter(3)
  a = f32[8,1024,64]{2,1,0} fusion(cache, upd, pos), kind=kLoop, calls=inplace
  b = bf16[8,1024,64]{2,1,0} fusion(cache16, upd, pos), kind=kLoop, calls=converted
  ROOT t = (f32[8,1024,64]{2,1,0}, bf16[8,1024,64]{2,1,0}) tuple(a, b)
}
"""
    a = analyze_module(parse_module(text))
    r = rows_by_name(a)
    row_bytes = 8 * 1 * 64 * 4
    assert r["a"].total.hbm_read_bytes == row_bytes + 4          # update + index; cache not read
    assert r["a"].total.hbm_write_bytes == row_bytes             # only the new entries
    assert r["a"].total.kv_cache_write_bytes == row_bytes
    assert r["a"].total.kv_cache_read_bytes == 0
    whole16 = 8 * 1024 * 64 * 2
    assert r["b"].total.kv_cache_read_bytes == whole16           # whole bf16 cache read
    assert r["b"].total.kv_cache_write_bytes == whole16          # and rewritten
    assert any(n.startswith("rewrites the whole KV-cache buffer") for n in r["b"].notes)
    assert not any("KV-cache buffer" in n or "copy of the KV cache" in n for n in r["a"].notes)


def test_unfused_dus_is_in_place():
    a = analyze_module(parse_module("""HloModule t
ENTRY e {
  c = f32[100,10]{1,0} parameter(0)
  u = f32[1,10]{1,0} parameter(1)
  i = s32[] parameter(2)
  ROOT d = f32[100,10]{1,0} dynamic-update-slice(c, u, i, i)
}
"""))
    d = rows_by_name(a)["d"].total
    assert (d.hbm_read_bytes, d.hbm_write_bytes) == (40 + 4, 40)


def test_memory_spaces_on_chip_and_host():
    a = analyze_module(parse_module("""HloModule t
ENTRY e {
  v = f32[256]{0:S(1)} parameter(0)
  h = f32[256]{0:S(5)} parameter(1)
  x = f32[256]{0} add(v, v)
  y = f32[256]{0} copy(h)
  z = f32[256]{0:S(5)} copy(x)
  ROOT t = (f32[256]{0}, f32[256]{0:S(5)}) tuple(y, z)
}
"""))
    t = a.totals
    assert t.onchip_read_bytes == 1024                  # VMEM operand read once
    assert t.host_to_device_bytes == 1024               # copy from host memory
    assert t.device_to_host_bytes == 1024               # copy to host memory
    assert t.hbm_read_bytes == 1024                     # x read by the copy to host
    assert t.hbm_write_bytes == 1024 + 1024             # x and y written to HBM


def test_unknown_opcode_is_unmodeled_not_a_crash():
    a = analyze_module(parse_module("""HloModule t
ENTRY e {
  p = f32[4]{0} parameter(0)
  ROOT q = f32[4]{0} frobnicate(p)
}
"""))
    assert [r.instr.name for r in a.unmodeled] == ["q"]
    assert a.totals.hbm_bytes == 0


def test_multiplicity_nested_loops_multiply_and_unknown_flagged():
    m = parse_module("""HloModule t
inner_body {
  p = (s32[], f32[16]{0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[16]{0} get-tuple-element(p), index=1
  y = f32[16]{0} add(x, x)
  ROOT t = (s32[], f32[16]{0}) tuple(i, y)
}
inner_cond {
  p = (s32[], f32[16]{0}) parameter(0)
  ROOT c = pred[] constant(true)
}
outer_body {
  p = (s32[], f32[16]{0}) parameter(0)
  ROOT w = (s32[], f32[16]{0}) while(p), condition=inner_cond, body=inner_body, backend_config={"known_trip_count":{"n":"5"}}
}
outer_cond {
  p = (s32[], f32[16]{0}) parameter(0)
  ROOT c = pred[] constant(true)
}
unknown_body {
  p = (s32[], f32[16]{0}) parameter(0)
  ROOT q = (s32[], f32[16]{0}) copy(p)
}
ENTRY e {
  a = (s32[], f32[16]{0}) parameter(0)
  w = (s32[], f32[16]{0}) while(a), condition=outer_cond, body=outer_body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT u = (s32[], f32[16]{0}) while(w), condition=outer_cond, body=unknown_body
}
""")
    mult = multiplicity_pass(m)
    assert mult["outer_body"].count == 3
    assert mult["inner_body"].count == 15 and mult["inner_cond"].count == 3 * 6
    assert mult["unknown_body"].unknown_trip_count and mult["unknown_body"].count == 1
    a = analyze_module(m)
    y = rows_by_name(a)["y"]
    assert y.total.flops == 15 * 16
    assert y.total.hbm_read_bytes == 15 * 64 and y.total.hbm_write_bytes == 15 * 64
    assert a.totals.flops == 15 * 16


def test_corpus_known_trip_count_while(corpus_dir):
    # body: add reads two s32 (8 B), writes 4 B, x7; condition: compare reads 8 B, writes 1 B, x8.
    a = analyze_module(parse_file(corpus_file("xla__multihost_runner__while_with_known_trip_count.hlo")))
    assert a.multiplicity["body"].count == 7 and a.multiplicity["condition"].count == 8
    assert a.totals.hbm_read_bytes == 7 * 8 + 8 * 8
    assert a.totals.hbm_write_bytes == 7 * 4 + 8 * 1
    assert a.totals.flops == 7 + 8          # XLA's cost_analysis counts each once: 2


def test_conditional_totals_use_costliest_branch(corpus_dir):
    a = analyze_module(parse_file(corpus_file("xla__spmd_partitioner_test__ParallelDimFromOutsideConditionalPositive.hlo")))
    assert a.multiplicity["gather_comp"].branch_of == ("conditional", 0)
    assert a.multiplicity["scatter_comp"].branch_of == ("conditional", 1)
    branch = {c: sum(r.per_execution.hbm_bytes for r in a.rows if r.computation == c)
              for c in ("gather_comp", "scatter_comp")}
    entry = sum(r.per_execution.hbm_bytes for r in a.rows if r.computation == a.module.entry.name)
    assert a.totals.hbm_bytes == entry + max(branch.values())
    assert any("costliest branch" in n for n in a.notes)


def test_corpus_ground_truth_inplace_dus(corpus_dir):
    # XLA's test: operand 0 (the aliased DUS buffer) is not read, and the fusion's bytes equal
    # a plain DUS of a bf16[1,32,256,1152] update: read 1x the update (dynamic-slice footprint
    # of operand 2), the s32 index, write 1x the update. jaxmove agrees, except that the s32[]
    # index {:T(128)} is stored (and moved) as a padded 128-element tile: 512 bytes, not 4.
    a = analyze_module(parse_file(corpus_file("xla__hlo_cost_analysis_test__LoopFusionDynUpdateSlice.hlo")))
    upd = 1 * 32 * 256 * 1152 * 2
    root = a.module.entry.root
    r = rows_by_name(a)[root.name]
    assert all(acc.operand != 0 for acc in r.traffic.reads)
    assert (r.total.hbm_read_bytes, r.total.hbm_write_bytes) == (upd + 128 * 4, upd)
    assert r.total.hbm_padding_bytes == 128 * 4 - 4


def test_corpus_multiple_inplace_dus(corpus_dir):
    # two in-place DUS roots: read p1, p3 (bf16[1,11,12] = 264 B each) and p4 (4 B);
    # write two 264-byte slices; the bf16[10,11,12] / bf16[8,11,12] buffers are not touched.
    a = analyze_module(parse_file(corpus_file("xla__dynamic_update_slice_inplace_bf16__MultipleInplaceDus.hlo")))
    assert (a.totals.hbm_read_bytes, a.totals.hbm_write_bytes) == (264 + 264 + 4, 2 * 264)


def test_corpus_nested_copy_fusion_dus_deliberately_differs_from_xla(corpus_dir):
    # The DUS buffer is a nested fusion that re-tiles param 0 from T(32,128) to T(8,128): the
    # result cannot alias the parameter, so the kernel reads all of s8[2,6144,2,256] and writes
    # all of it. XLA's cost analysis treats the DUS as in place (9,437,184 bytes); jaxmove counts
    # 6,291,456 + 3,145,728 read (param 0, param 2) and 6,291,456 written; the S(6) scalar
    # index lives in on-chip scalar memory, stored as its {:T(128)} tile of 128 s32 (512 bytes).
    a = analyze_module(parse_file(corpus_file("xla__hlo_cost_analysis_test__NestedCopyFusionDUS.hlo")))
    full, upd = 2 * 6144 * 2 * 256, 2 * 6144 * 1 * 256
    assert (a.totals.hbm_read_bytes, a.totals.hbm_write_bytes) == (full + upd, full)
    assert a.totals.onchip_read_bytes == 128 * 4


def test_corpus_gemm_workspace_not_counted(corpus_dir):
    a = analyze_module(parse_file(corpus_file("xla__gpu_profiler_test__gemm_fusion_dot.1.hlo")))
    gemm = rows_by_name(a)["custom-call.1"]
    # reads bf16[3072,512] + bf16[3840,3072]; writes bf16[512,3840]; not the s8[26738688] scratch
    assert gemm.total.hbm_read_bytes == (3072 * 512 + 3840 * 3072) * 2
    assert gemm.total.hbm_write_bytes == 512 * 3840 * 2
    assert any("26738688" in n for n in gemm.notes)


def test_corpus_variadic_all_reduce_bytes_match_xla(corpus_dir):
    # XLA ground truth: bytes_accessed = 64 (two f32[2,2] operands in, two out).
    a = analyze_module(parse_file(corpus_file("xla__hlo_cost_analysis_test__AllReduceTupleBytesAccessed.hlo")))
    assert a.totals.hbm_read_bytes + a.totals.hbm_write_bytes == 64


def test_corpus_multioutput_fusion_reads_param_once(corpus_dir):
    # one f32[2,32,32] parameter (8 KiB) feeds a reduce and two elementwise outputs: read once.
    a = analyze_module(parse_file(corpus_file("xla__multioutput_fusion_test__MultiOutputReduceFusionScalarWithExtraOutput.hlo")))
    fusion = [r for r in a.rows if r.instr.opcode == "fusion"][0]
    assert fusion.total.hbm_read_bytes == 2 * 32 * 32 * 4


@pytest.mark.parametrize("name,role", [
    ("cache['layers'][0]['k_cache']", "kv_cache"), ("cached_key", "kv_cache"),
    ("params['wte']['embedding']", "weights"), ("layer/kernel", "weights"), ("params__layers___0___kernel", "weights"),
    ("x", "unknown"), ("Arg_0.1", "unknown"), ("tokens", "unknown"),
    ("cache_position", "unknown"), ("scale_factor_input", "unknown"), ("layer_norm_scale", "weights"),
    ("cache__layers___0___k_cache__.1", "kv_cache"), ("attn/kv/kernel", "weights"),
])
def test_role_from_name(name, role):
    assert role_from_name(name) == role


def test_roles_flow_through_while_carry_and_slicing():
    m = parse_module("""HloModule t
body {
  p = (s32[], f32[4,64]{1,0}, f32[8,64]{1,0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  w = f32[4,64]{1,0} get-tuple-element(p), index=1
  x = f32[8,64]{1,0} get-tuple-element(p), index=2
  z = s32[] constant(0)
  row = f32[1,64]{1,0} dynamic-slice(w, i, z), dynamic_slice_sizes={1,64}
  b = f32[8,64]{1,0} broadcast(f32[64]{0} bitcast(row)), dimensions={1}
  y = f32[8,64]{1,0} add(x, b)
  ROOT t = (s32[], f32[4,64]{1,0}, f32[8,64]{1,0}) tuple(i, w, y)
}
cond {
  p = (s32[], f32[4,64]{1,0}, f32[8,64]{1,0}) parameter(0)
  ROOT c = pred[] constant(true)
}
ENTRY e {
  i = s32[] parameter(0)
  w = f32[4,64]{1,0} parameter(1), metadata={op_name="params['layers']['kernel']"}
  x = f32[8,64]{1,0} parameter(2)
  t = (s32[], f32[4,64]{1,0}, f32[8,64]{1,0}) tuple(i, w, x)
  ROOT r = (s32[], f32[4,64]{1,0}, f32[8,64]{1,0}) while(t), condition=cond, body=body, backend_config={"known_trip_count":{"n":"4"}}
}
""")
    roles = roles_pass(m)
    assert roles[("body", "w")] == ("weights",)
    assert roles[("body", "row")] == ("weights",)
    assert roles[("body", "x")] == ("unknown",)           # parameter 'x' cannot be told
    assert roles[("body", "y")] == ("activations",)       # computed by the program
    a = analyze_module(m)
    ds = rows_by_name(a)["row"]
    assert ds.total.weights_read_bytes == 4 * 64 * 4      # 4 iterations x one 256-byte row


def test_scatter_fusion_root_is_in_place():
    # embedding-gradient style: scatter-add 4 rows of 128 into a f32[50000,128] table.
    a = analyze_module(parse_module("""HloModule t
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
fused {
  t = f32[50000,128]{1,0} parameter(0)
  ids = s32[4,1]{1,0} parameter(1)
  u = f32[4,128]{1,0} parameter(2)
  two = f32[] constant(2)
  b = f32[4,128]{1,0} broadcast(two), dimensions={}
  m = f32[4,128]{1,0} multiply(u, b)
  ROOT s = f32[50000,128]{1,0} scatter(t, ids, m), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
}
ENTRY e {
  t = f32[50000,128]{1,0} parameter(0)
  ids = s32[4,1]{1,0} parameter(1)
  u = f32[4,128]{1,0} parameter(2)
  ROOT f = f32[50000,128]{1,0} fusion(t, ids, u), kind=kLoop, calls=fused
}
"""))
    f = rows_by_name(a)["f"].total
    rows = 4 * 128 * 4
    assert f.hbm_read_bytes == rows + 4 * 4 + rows     # touched table rows, ids, updates
    assert f.hbm_write_bytes == rows                  # only the scattered rows


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_a_scatter_that_overwrites_reads_no_old_elements(fused):
    # x.at[ids].set(u): the combiner returns its update (parameter 1), so the touched rows are
    # written, not read (a review: XLA:GPU's scatter-set fusion counted 800 B of old rows read,
    # 3,216 B against 2,416 by closed form). The same scatter with an add reads them.
    combiners = """
set {
  x = f32[] parameter(0)
  ROOT y = f32[] parameter(1)
}
"""
    scatter = ("scatter(t, ids, u), update_window_dims={1}, inserted_window_dims={0}, "
               "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=set")
    if fused:
        text = f"""HloModule t
{combiners}
fused {{
  t = f32[50000,128]{{1,0}} parameter(0)
  ids = s32[4,1]{{1,0}} parameter(1)
  u = f32[4,128]{{1,0}} parameter(2)
  ROOT s = f32[50000,128]{{1,0}} {scatter}
}}
ENTRY e {{
  t = f32[50000,128]{{1,0}} parameter(0)
  ids = s32[4,1]{{1,0}} parameter(1)
  u = f32[4,128]{{1,0}} parameter(2)
  ROOT f = f32[50000,128]{{1,0}} fusion(t, ids, u), kind=kLoop, calls=fused
}}
"""
    else:
        text = f"""HloModule t
{combiners}
ENTRY e {{
  t = f32[50000,128]{{1,0}} parameter(0)
  ids = s32[4,1]{{1,0}} parameter(1)
  u = f32[4,128]{{1,0}} parameter(2)
  ROOT f = f32[50000,128]{{1,0}} {scatter}
}}
"""
    f = rows_by_name(analyze_module(parse_module(text)))["f"].total
    rows = 4 * 128 * 4
    assert f.hbm_read_bytes == 4 * 4 + rows     # ids and updates only
    assert f.hbm_write_bytes == rows            # the scattered rows


def test_a_slice_of_a_buffer_rebuilt_around_a_window_reads_the_slice_only():
    # return dus(cache, row, pos)[0:16] as one fusion (a review: XLA:GPU and XLA:CPU): the
    # slice's 16 rows come from the cache or the row, so the fusion reads 16 rows of the cache
    # (8 KiB), not all 64 (32 KiB, as counted before)
    text = """HloModule t
fused {
  c = f32[64,128]{1,0} parameter(0)
  r = f32[128]{0} parameter(1)
  p = s32[] parameter(2)
  b = f32[1,128]{1,0} bitcast(r)
  z = s32[] constant(0)
  u = f32[64,128]{1,0} dynamic-update-slice(c, b, p, z)
  ROOT s = f32[16,128]{1,0} slice(u), slice={[0:16], [0:128]}
}
ENTRY e {
  c = f32[64,128]{1,0} parameter(0)
  r = f32[128]{0} parameter(1)
  p = s32[] parameter(2)
  ROOT f = f32[16,128]{1,0} fusion(c, r, p), kind=kLoop, calls=fused
}
"""
    f = rows_by_name(analyze_module(parse_module(text)))["f"].total
    assert f.hbm_read_bytes == 16 * 128 * 4 + 128 * 4 + 4
    assert f.hbm_write_bytes == 16 * 128 * 4


def test_output_aliased_to_the_cache_is_kv_cache_even_when_rebuilt():
    # A scan-style decode: the new stacked cache starts as zeros and is filled one layer
    # slice per iteration; it is returned in place of the donated cache (input_output_alias).
    m = parse_module("""HloModule t, input_output_alias={ {}: (0, {}, may-alias) }
body {
  p = (s32[], f32[2,8,16]{2,1,0}, f32[2,8,16]{2,1,0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  old = f32[2,8,16]{2,1,0} get-tuple-element(p), index=1
  new = f32[2,8,16]{2,1,0} get-tuple-element(p), index=2
  z = s32[] constant(0)
  layer = f32[1,8,16]{2,1,0} dynamic-slice(old, i, z, z), dynamic_slice_sizes={1,8,16}
  upd = f32[2,8,16]{2,1,0} dynamic-update-slice(new, layer, i, z, z)
  ROOT t = (s32[], f32[2,8,16]{2,1,0}, f32[2,8,16]{2,1,0}) tuple(i, old, upd)
}
cond {
  p = (s32[], f32[2,8,16]{2,1,0}, f32[2,8,16]{2,1,0}) parameter(0)
  ROOT c = pred[] constant(true)
}
ENTRY e {
  cache = f32[2,8,16]{2,1,0} parameter(0), metadata={op_name="cache['k_cache']"}
  zero = f32[] constant(0)
  fresh = f32[2,8,16]{2,1,0} broadcast(zero), dimensions={}
  i = s32[] constant(0)
  t = (s32[], f32[2,8,16]{2,1,0}, f32[2,8,16]{2,1,0}) tuple(i, cache, fresh)
  w = (s32[], f32[2,8,16]{2,1,0}, f32[2,8,16]{2,1,0}) while(t), condition=cond, body=body, backend_config={"known_trip_count":{"n":"2"}}
  ROOT out = f32[2,8,16]{2,1,0} get-tuple-element(w), index=2
}
""")
    roles = roles_pass(m)
    assert roles[("e", "fresh")] == ("kv_cache",)
    assert roles[("body", "upd")] == ("kv_cache",)
    a = analyze_module(m)
    layer = 8 * 16 * 4
    assert a.totals.kv_cache_write_bytes == 2 * layer + 2 * layer + 2 * layer  # zeros, slices, updates
    assert a.totals.activations_write_bytes == 0


def test_unused_fusion_parameter_is_not_read_and_said_so():
    a = analyze_module(parse_module("""HloModule t
fused {
  p0 = f32[16]{0} parameter(0)
  p1 = f32[16]{0} parameter(1)
  ROOT n = f32[16]{0} negate(p0)
}
ENTRY e {
  x = f32[16]{0} parameter(0)
  y = f32[16]{0} parameter(1)
  ROOT f = f32[16]{0} fusion(x, y), kind=kLoop, calls=fused
}
"""))
    f = rows_by_name(a)["f"]
    assert not f.unmodeled
    assert (f.total.hbm_read_bytes, f.total.hbm_write_bytes) == (64, 64)
    assert any("not used inside the fusion" in n for n in f.notes)
    assert not any("in place" in n for n in f.notes)


def test_trip_count_must_be_plausible():
    base = """HloModule t
body {
  p = (s32[], f32[4]{0}) parameter(0)
  ROOT q = (s32[], f32[4]{0}) copy(p)
}
cond {
  p = (s32[], f32[4]{0}) parameter(0)
  ROOT c = pred[] constant(true)
}
ENTRY e {
  a = (s32[], f32[4]{0}) parameter(0)
  ROOT w = (s32[], f32[4]{0}) while(a), condition=cond, body=body, backend_config={"known_trip_count":{"n":"TRIPS"}}
}
"""
    for bad in ("-5", "99999999999999999999", "abc"):
        with pytest.raises(HloParseError) as ei:
            parse_module(base.replace("TRIPS", bad), "kt.hlo")
        assert (ei.value.line, ei.value.column) == (12, 8) and "known_trip_count" in ei.value.expected
    nested = """HloModule t
inner {
  p = (s32[], f32[4]{0}) parameter(0)
  ROOT q = (s32[], f32[4]{0}) copy(p)
}
cond {
  p = (s32[], f32[4]{0}) parameter(0)
  ROOT c = pred[] constant(true)
}
outer {
  p = (s32[], f32[4]{0}) parameter(0)
  ROOT w = (s32[], f32[4]{0}) while(p), condition=cond, body=inner, backend_config={"known_trip_count":{"n":"4611686018427387904"}}
}
ENTRY e {
  a = (s32[], f32[4]{0}) parameter(0)
  ROOT w = (s32[], f32[4]{0}) while(a), condition=cond, body=outer, backend_config={"known_trip_count":{"n":"4"}}
}
"""
    with pytest.raises(HloParseError, match="2\\^63"):
        analyze_module(parse_module(nested, "nested.hlo"))


def test_no_entry_marker_is_said_and_truncation_by_shape_is_caught():
    a = analyze_module(parse_module("""HloModule t
helper {
  ROOT x = f32[4]{0} parameter(0)
}
main {
  p = f32[4]{0} parameter(0)
  ROOT n = f32[4]{0} negate(p)
}
"""))
    assert any("no ENTRY marker" in n for n in a.notes)
    with pytest.raises(HloParseError, match="parameter 0 is s8\\[8\\]"):
        parse_module("HloModule t, entry_computation_layout={(s8[8]{0})->s8[8]{0}}\n"
                     "helper {\n  ROOT x = s32[] parameter(0)\n}\n", "cut.hlo")


def test_recomputed_while_carry_is_activations_not_its_inits_role():
    # A scanned decode's hidden state starts as the embedding lookup (a gather of a weight: role
    # weights) and the body computes a new value of it each iteration: from then on it is an
    # activation. The weight passed through unchanged keeps its role; the 2 x 8 x 64 f32 state
    # re-read by the 4 iterations is activation traffic (4 x 2,048 B), not weight traffic.
    m = parse_module("""HloModule t
body {
  p = (s32[], f32[4,64]{1,0}, f32[8,64]{1,0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  w = f32[4,64]{1,0} get-tuple-element(p), index=1
  x = f32[8,64]{1,0} get-tuple-element(p), index=2
  y = f32[8,64]{1,0} fusion(x), kind=kLoop, calls=neg
  ROOT t = (s32[], f32[4,64]{1,0}, f32[8,64]{1,0}) tuple(i, w, y)
}
neg {
  a = f32[8,64]{1,0} parameter(0)
  ROOT n = f32[8,64]{1,0} negate(a)
}
cond {
  p = (s32[], f32[4,64]{1,0}, f32[8,64]{1,0}) parameter(0)
  ROOT c = pred[] constant(true)
}
ENTRY e {
  i = s32[] parameter(0)
  w = f32[64,64]{1,0} parameter(1), metadata={op_name="params['embed']['embedding']"}
  ids = s32[8,1]{1,0} parameter(2)
  x = f32[8,64]{1,0} gather(w, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
  s = f32[4,64]{1,0} slice(w), slice={[0:4], [0:64]}
  t = (s32[], f32[4,64]{1,0}, f32[8,64]{1,0}) tuple(i, s, x)
  ROOT r = (s32[], f32[4,64]{1,0}, f32[8,64]{1,0}) while(t), condition=cond, body=body, backend_config={"known_trip_count":{"n":"4"}}
}
""")
    roles = roles_pass(m)
    assert roles[("e", "x")] == ("weights",)              # the gathered rows, as read
    assert roles[("body", "w")] == ("weights",)           # passed through: still a weight
    assert roles[("body", "x")] == ("activations",)       # the recomputed carry
    assert roles[("e", "r")][1:] == ("weights", "activations")
    a = analyze_module(m)
    fusion = rows_by_name(a)["y"]
    assert fusion.total.weights_read_bytes == 0
    assert fusion.total.activations_read_bytes == 4 * 8 * 64 * 4
