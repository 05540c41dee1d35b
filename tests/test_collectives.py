"""Collectives pass: kinds, groups in every printed form, ring wire bytes, topology time.

Every expected number is computed here from the shapes and the ring formulas
(all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n, permute whole).
"""

from __future__ import annotations

import dataclasses

import pytest

from jaxmove.hardware import load_spec
from jaxmove.hlo import HloParseError, parse_file, parse_module
from jaxmove.hlo.replica_groups import ReplicaGroupsError, parse_replica_groups
from jaxmove.passes.collectives import (
    collective_info,
    collective_kind,
    collective_time_s,
)
from jaxmove.passes.pipeline import analyze_module

from .conftest import corpus_file, corpus_files

ADD = """
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT a = f32[] add(x, y)
}
"""


def _module(body: str, header: str = "") -> tuple:
    text = f"HloModule m{header}\n{ADD}\nENTRY e {{\n{body}\n}}\n"
    m = parse_module(text)
    return m, m.entry


def _info(m, comp, name):
    return collective_info(comp.by_name[name], comp, m)


# ---- replica group forms ----------------------------------------------------------------

def test_iota_and_explicit_forms():
    assert parse_replica_groups("[2,4]<=[4,2]T(1,0)") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert parse_replica_groups("{{0,1},{2,3}}") == [[0, 1], [2, 3]]
    assert parse_replica_groups("{}") == []
    with pytest.raises(ReplicaGroupsError, match="2x2 = 4 devices"):
        parse_replica_groups("[2,2]<=[16]")


def test_mesh_axes_form_of_jax_0_10():
    # mesh [x=2, y=2] row-major: x has stride 2, y stride 1 (XLA replica_group_test).
    assert parse_replica_groups("mesh[x=2,y=2] {x}") == [[0, 2], [1, 3]]
    assert parse_replica_groups("mesh['x'=2,'y'=2] {'y'}") == [[0, 1], [2, 3]]
    # what jax 0.10.2 prints for a reduction over 'model' of a data=2, model=4 mesh:
    # the mesh is [4,1,2] with device ids iota([2,4]).T, i.e. rows {0..3} and {4..7}.
    text = "mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}"
    assert parse_replica_groups(text) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # sub-axis a:(1)2 of a=8 is the major factor 2: stride 4.
    assert parse_replica_groups("mesh[a=8] {a:(1)2}") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # explicit device ids
    assert parse_replica_groups("mesh[a=2,b=2], device_ids=(3,2,1,0) {b}") == [[3, 2], [1, 0]]
    with pytest.raises(ReplicaGroupsError, match="not one of"):
        parse_replica_groups("mesh[a=2] {b}")
    with pytest.raises(ReplicaGroupsError, match="permutation"):
        parse_replica_groups("mesh[a=2,b=2], device_ids=(0,0,1,2) {b}")


def test_parser_keeps_the_whole_mesh_value():
    m, e = _module("  p = f32[16]{0} parameter(0)\n"
                   "  ROOT ar = f32[16]{0} all-reduce(p), channel_id=1, replica_groups="
                   "mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_0'}, "
                   "use_global_device_ids=true, to_apply=add", ", num_partitions=8")
    ar = e.by_name["ar"]
    assert ar.attrs["use_global_device_ids"] == "true"
    info = _info(m, e, "ar")
    assert info.groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert info.group_size == 4 and info.num_groups == 2
    assert info.wire_bytes == 2 * 3 * 64 // 4


# ---- wire bytes by kind -----------------------------------------------------------------

def test_ring_wire_bytes_per_kind():
    body = """  p = f32[64,32]{1,0} parameter(0)
  ar = f32[64,32]{1,0} all-reduce(p), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=add
  ag = f32[512,32]{1,0} all-gather(p), channel_id=2, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  rs = f32[16,32]{1,0} reduce-scatter(p), channel_id=3, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, use_global_device_ids=true, to_apply=add
  a2a = f32[64,32]{1,0} all-to-all(p), channel_id=4, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}
  cp = f32[64,32]{1,0} collective-permute(p), channel_id=5, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  cb = f32[64,32]{1,0} collective-broadcast(p), channel_id=6, replica_groups={{0,1,2,3,4,5,6,7}}
  ROOT t = (f32[64,32]{1,0}, f32[512,32]{1,0}, f32[16,32]{1,0}, f32[64,32]{1,0}, f32[64,32]{1,0}, f32[64,32]{1,0}) tuple(ar, ag, rs, a2a, cp, cb)"""
    m, e = _module(body, ", num_partitions=8")
    s = 64 * 32 * 4
    ar = _info(m, e, "ar")
    assert (ar.kind, ar.group_size, ar.num_groups, ar.wire_bytes) == ("all-reduce", 4, 2, 2 * 3 * s // 4)
    ag = _info(m, e, "ag")   # 8 shards of s bytes; sends 7 of them
    assert (ag.group_size, ag.buffer_bytes, ag.wire_bytes) == (8, 8 * s, 7 * s)
    rs = _info(m, e, "rs")
    assert rs.groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert (rs.group_size, rs.wire_bytes) == (4, 3 * s // 4)
    a2a = _info(m, e, "a2a")
    assert (a2a.mode, a2a.group_size, a2a.num_groups, a2a.wire_bytes) == ("cross_partition", 2, 4, s // 2)
    cp = _info(m, e, "cp")
    assert (cp.kind, cp.group_size, cp.num_groups, cp.wire_bytes) == ("collective-permute", 2, 4, s)
    cb = _info(m, e, "cb")
    assert cb.wire_bytes == s
    assert _info(m, e, "p") is None


def test_group_modes_and_empty_groups():
    body = """  p = f32[8]{0} parameter(0)
  cr = f32[8]{0} all-reduce(p), replica_groups={}, to_apply=add
  crp = f32[8]{0} all-reduce(p), channel_id=1, replica_groups={{0},{1}}, to_apply=add
  cpart = f32[8]{0} all-to-all(p), channel_id=2, replica_groups={}, dimensions={0}
  ROOT t = (f32[8]{0}, f32[8]{0}, f32[8]{0}) tuple(cr, crp, cpart)"""
    m, e = _module(body, ", replica_count=2, num_partitions=4")
    cr = _info(m, e, "cr")   # across the 2 replicas, separately per partition
    assert (cr.mode, cr.group_size, cr.num_groups) == ("cross_replica", 2, 4)
    assert cr.device_groups[0] == (0, 4)
    crp = _info(m, e, "crp")  # each replica group spans all 4 partitions
    assert (crp.mode, crp.group_size, crp.num_groups) == ("cross_replica_and_partition", 4, 2)
    assert crp.device_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    cpart = _info(m, e, "cpart")
    assert (cpart.mode, cpart.group_size, cpart.num_groups) == ("cross_partition", 4, 2)


def test_async_pair_counted_once_and_done_carries_nothing():
    body = """  p = f32[256]{0} parameter(0)
  s = f32[256]{0} all-reduce-start(p), replica_groups={{0,1}}, to_apply=add
  ROOT d = f32[256]{0} all-reduce-done(s)"""
    m, e = _module(body, ", replica_count=2")
    assert _info(m, e, "d") is None
    s = _info(m, e, "s")
    assert s.is_async and s.kind == "all-reduce" and s.wire_bytes == 2 * 1 * 1024 // 2
    a = analyze_module(m)
    assert a.totals.device_to_device_bytes == 1024


def test_collective_in_while_body_scales_with_trip_count():
    text = f"""HloModule m, num_partitions=4
{ADD}
cond {{
  c = (s32[], f32[128]) parameter(0)
  i = s32[] get-tuple-element(c), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(i, n), direction=LT
}}

body {{
  b = (s32[], f32[128]) parameter(0)
  i = s32[] get-tuple-element(b), index=0
  x = f32[128] get-tuple-element(b), index=1
  ag = f32[512] all-gather(x), channel_id=1, replica_groups={{{{0,1,2,3}}}}, dimensions={{0}}, use_global_device_ids=true
  y = f32[128] slice(ag), slice={{[0:128]}}
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], f32[128]) tuple(j, y)
}}

ENTRY e {{
  z = s32[] constant(0)
  p = f32[128] parameter(0)
  t = (s32[], f32[128]) tuple(z, p)
  ROOT w = (s32[], f32[128]) while(t), condition=cond, body=body, backend_config={{"known_trip_count":{{"n":"5"}}}}
}}
"""
    a = analyze_module(parse_module(text))
    assert a.totals.device_to_device_bytes == 5 * 3 * 128 * 4


def test_bad_groups_name_the_instruction():
    # the parser refuses them on the one-line fast path as on the general path (issue 29)
    with pytest.raises(HloParseError, match=r"<string>:\d+:\d+: source_target_pairs=.*pairs"):
        _module("  p = f32[8]{0} parameter(0)\n"
                "  ROOT cp = f32[8]{0} collective-permute(p), channel_id=1, "
                "source_target_pairs={{0,1,2}}")


@pytest.mark.parametrize("line, expected", [
    # f32[1024] gathered over groups of 4 (iota [2,4]) along 0 is f32[4096], not f32[3000]
    ("ROOT ag = f32[3000]{0} all-gather(p), channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}, "
     "use_global_device_ids=true", r"'ag': result f32\[3000\] .*gathered over the 4 devices.*expected f32\[4096\]"),
    # an all-reduce's result is its operand's shape
    ("ROOT ar = f32[2048]{0} all-reduce(p), channel_id=1, replica_groups=[1,8]<=[8], "
     "use_global_device_ids=true, to_apply=add", r"'ar': result f32\[2048\] .*expected f32\[1024\]"),
    ("ROOT ar = f32[1024]{0} all-reduce-start(p), channel_id=1, replica_groups=[1,8]<=[8], "
     "use_global_device_ids=true, to_apply=add", None),
    # f32[1024] scattered over 8 is f32[128]
    ("ROOT rs = f32[1000]{0} reduce-scatter(p), channel_id=1, replica_groups=[1,8]<=[8], "
     "use_global_device_ids=true, dimensions={0}, to_apply=add", r"'rs': .*expected f32\[128\]"),
    # 1024 is not divisible by 3 devices
    ("ROOT rs = f32[341]{0} reduce-scatter(p), channel_id=1, replica_groups={{0,1,2}}, "
     "use_global_device_ids=true, dimensions={0}, to_apply=add", r"dimension 0 \(1024\) is not divisible by the 3"),
    # the async form: (operand, result)
    ("ROOT ags = (f32[1024]{0}, f32[2048]{0}) all-gather-start(p), channel_id=1, replica_groups=[2,4]<=[8], "
     "dimensions={0}, use_global_device_ids=true", r"'ags': .*expected f32\[4096\]"),
    ("ROOT ags = (f32[1024]{0}, f32[4096]{0}) all-gather-start(p), channel_id=1, replica_groups=[2,4]<=[8], "
     "dimensions={0}, use_global_device_ids=true", None),
    # the element type may change (XLA:TPU all-reduces an f32 operand into a bf16 result)
    ("ROOT ar = bf16[1024]{0} all-reduce(p), channel_id=1, replica_groups=[1,8]<=[8], "
     "use_global_device_ids=true, to_apply=add", None),
    ("ROOT ag = bf16[4096]{0} all-gather(p), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, "
     "use_global_device_ids=true", r"expected bf16\[8192\]"),
])
def test_result_shapes_follow_from_operands_and_groups(tmp_path, line, expected):
    """A collective whose result is not its operand gathered / reduced / scattered over its
    groups (XLA's verifier rejects it) is an input error naming the file and line: jaxmove
    counted the printed result's bytes against wire bytes from the groups, two figures that
    disagreed (an all-gather of f32[1024] over 4 printed as f32[3000]: 12,000 B written, a
    16,384 B buffer). Valid forms are counted as before."""
    from jaxmove.cli import main
    from jaxmove.errors import JaxmoveInputError
    from jaxmove.passes.collectives import CollectiveError

    text = f"HloModule m, num_partitions=8\n{ADD}\nENTRY e {{\n  p = f32[1024]{{0}} parameter(0)\n  {line}\n}}\n"
    path = tmp_path / "c.hlo"
    path.write_text(text)
    m = parse_module(text)
    if expected is None:
        a = analyze_module(m)
        root = m.entry.root
        info = collective_info(root, m.entry, m)
        n = info.group_size
        if info.kind == "all-gather":  # (n - 1) shards of 4096 B
            assert (n, info.wire_bytes) == (4, 3 * 4096)
        else:  # all-reduce over 8: 2 (n - 1) / n of 4096 B
            assert (n, info.wire_bytes) == (8, 2 * 7 * 4096 // 8)
        assert a.totals.device_to_device_bytes == info.wire_bytes
        return
    with pytest.raises(CollectiveError, match=expected) as e:
        analyze_module(m)
    assert isinstance(e.value, JaxmoveInputError) and "<string>:11:" in str(e.value)  # (the line of the collective)
    assert main(["analyze", str(path)]) == 2


# ---- the corpus ---------------------------------------------------------------------------

def test_every_corpus_collective_has_kind_group_and_wire_bytes(corpus_dir):
    seen = 0
    for path in corpus_files():
        m = parse_file(path)
        for comp in m.computations.values():
            for instr in comp.instructions:
                kind = collective_kind(instr.opcode)
                if kind is None:
                    continue
                info = collective_info(instr, comp, m)
                assert info is not None, (path.name, instr.name)
                assert info.kind == kind
                assert info.group_size >= 1 and info.num_groups >= 1
                assert isinstance(info.wire_bytes, int) and info.wire_bytes >= 0
                seen += 1
    assert seen >= 20


def test_corpus_fused_collectives_are_found_on_the_fusion():
    # Triton all-gather fusion: f32[128,128] per device, group {0,1}: sends its 64 KiB shard once.
    a = analyze_module(parse_file(corpus_file("xla__triton_collectives__all_gather.hlo")))
    fusion = next(r for r in a.rows if r.instr.name == "fusion")
    assert fusion.collective.kind == "all-gather" and fusion.collective.group_size == 2
    assert fusion.per_execution.device_to_device_bytes == 128 * 128 * 4
    # all-reduce of bf16[1024,6144] inside a DUS output fusion over 8 devices.
    a = analyze_module(parse_file(corpus_file("xla__hlo_dataflow_analysis_test__DUSOutputFusionWithCollective.hlo")))
    fusion = next(r for r in a.rows if r.instr.name == "fusion")
    s = 1024 * 6144 * 2
    assert fusion.collective.group_size == 8
    assert a.totals.device_to_device_bytes == 2 * 7 * s // 8


def test_corpus_generic_async_all_to_all_counted_once():
    a = analyze_module(parse_file(corpus_file("xla__latency_hiding_scheduler_test__AllToAllAsyncBalance.hlo")))
    s = 2 * 8 * 256 * 256 * 4
    colls = [r for r in a.rows if r.collective is not None]
    assert sorted(r.instr.name for r in colls) == ["ata", "ata.1"]
    assert all(r.collective.is_async for r in colls)
    assert a.totals.device_to_device_bytes == 2 * (s // 2)


def test_corpus_iota_all_reduce_over_8_partitions():
    a = analyze_module(parse_file(corpus_file("xla__host_offloader_test__DynamicUpdateSliceAllGatherDecomposer.hlo")))
    r = next(r for r in a.rows if r.collective is not None)
    assert (r.collective.mode, r.collective.group_size) == ("flattened_id", 8)
    assert r.collective.wire_bytes == 2 * 7 * (32 * 4) // 8


# ---- topology and time ---------------------------------------------------------------------

def _ar(devices: tuple[int, ...], nbytes: int):
    m, e = _module("  p = f32[%d]{0} parameter(0)\n"
                   "  ROOT ar = f32[%d]{0} all-reduce(p), channel_id=1, replica_groups={{%s}}, "
                   "use_global_device_ids=true, to_apply=add" % (nbytes // 4, nbytes // 4,
                                                                 ",".join(map(str, devices))),
                   ", num_partitions=16")
    return _info(m, e, "ar")


def test_collective_time_inside_and_across_nodes():
    h100 = load_spec("h100-sxm")   # 8 GPUs per node, NVLink 450e9, IB 50e9, 2 us per step
    s = 1 << 24
    inside = _ar(tuple(range(8)), s)
    t = collective_time_s(inside, h100)
    assert t == pytest.approx(2 * 7 * 2e-6 + (2 * 7 * s // 8) / 450e9)
    across = _ar((6, 7, 8, 9), s)   # devices 8, 9 sit in the second node
    assert collective_time_s(across, h100) == pytest.approx(2 * 3 * 2e-6 + (2 * 3 * s // 4) / 50e9)
    # a custom device -> node map puts them back in one node
    assert collective_time_s(across, h100, device_to_node=lambda d: 0) == pytest.approx(
        2 * 3 * 2e-6 + (2 * 3 * s // 4) / 450e9)


def test_collective_time_tpu_ring_and_missing_numbers():
    v5p = load_spec("tpu-v5p")     # ICI 1e11 per link per direction, bidirectional ring: 2 links
    info = _ar((0, 1, 2, 3), 1 << 20)
    assert collective_time_s(info, v5p) == pytest.approx(6 * 1e-6 + info.wire_bytes / 2e11)
    cpu = load_spec("cpu-generic")  # no link latency: no time rather than a guess
    assert collective_time_s(info, cpu) is None
    no_bw = dataclasses.replace(load_spec("h100-sxm"), intra_node_bytes_per_s=None, sources={})
    assert collective_time_s(info, no_bw) is None


def test_cpu_promoted_bf16_all_reduce_is_noted():
    from jaxmove.hlo import parse_module
    from jaxmove.passes.pipeline import analyze_module
    a = analyze_module(parse_module("""HloModule t, num_partitions=4
sum {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
ENTRY e {
  p = bf16[64,32]{1,0} parameter(0)
  c = f32[64,32]{1,0} convert(p)
  ar = f32[64,32]{1,0} all-reduce(c), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=sum
  ROOT b = bf16[64,32]{1,0} convert(ar)
}
"""))
    ar = [r for r in a.rows if r.instr.name == "ar"][0]
    assert ar.collective.wire_bytes == 2 * 3 * 64 * 32 * 4 // 4     # ring: 2(n-1)/n of f32 buffer
    assert any("XLA:CPU promotes" in n for n in ar.notes)


# ---- XLA:TPU's fused reduce-scatter: an all-reduce, then each device's 1/n dynamic-slice ----

# The form of libtpu 0.0.42's fsdp training step (llama3-8b-train, tpu-v5e:2x2): the gradient
# reduce-scatter is a kCustom fusion ("SingleInputAllReduceScatterFusion" /
# "AllReduceScatterFusion") whose all-reduce result is only read through dynamic-slices at
# partition-id x shard, so each device keeps its own quarter of the sum.
ARS = """HloModule ars, num_partitions=4
add {
  x = bf16[] parameter(0)
  y = bf16[] parameter(1)
  ROOT a = bf16[] add(x, y)
}
one {
  in = bf16[1024,2048] parameter(0)
  ar = bf16[1024,2048] all-reduce(in), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  pid = u32[] partition-id()
  c = u32[] constant(256)
  off = u32[] multiply(pid, c)
  z = u32[] constant(0)
  ROOT ds = bf16[256,2048] dynamic-slice(ar, off, z), dynamic_slice_sizes={256,2048}
}
two {
  a0 = bf16[1024,4,128] parameter(0)
  a1 = bf16[8,128,1024] parameter(1)
  ar = (bf16[1024,4,128], bf16[8,128,1024]) all-reduce(a0, a1), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  g0 = bf16[1024,4,128] get-tuple-element(ar), index=0
  g1 = bf16[8,128,1024] get-tuple-element(ar), index=1
  pid = u32[] partition-id()
  c = u32[] constant(256)
  off = u32[] multiply(pid, c)
  z = u32[] constant(0)
  d0 = bf16[256,4,128] dynamic-slice(g0, off, z, z), dynamic_slice_sizes={256,4,128}
  d1 = bf16[8,128,256] dynamic-slice(g1, z, z, off), dynamic_slice_sizes={8,128,256}
  ROOT t = (bf16[256,4,128], bf16[8,128,256]) tuple(d0, d1)
}
fixed {
  in = bf16[1024,2048] parameter(0)
  ar = bf16[1024,2048] all-reduce(in), channel_id=3, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  c = u32[] constant(256)
  z = u32[] constant(0)
  ROOT ds = bf16[256,2048] dynamic-slice(ar, c, z), dynamic_slice_sizes={256,2048}
}
ENTRY e {
  p = bf16[1024,2048] parameter(0)
  q0 = bf16[1024,4,128] parameter(1)
  q1 = bf16[8,128,1024] parameter(2)
  f1 = bf16[256,2048] fusion(p), kind=kCustom, calls=one
  f2 = (bf16[256,4,128], bf16[8,128,256]) fusion(q0, q1), kind=kCustom, calls=two
  f3 = bf16[256,2048] fusion(p), kind=kCustom, calls=fixed
  ROOT r = (bf16[256,2048], (bf16[256,4,128], bf16[8,128,256]), bf16[256,2048]) tuple(f1, f2, f3)
}
"""


def test_fused_all_reduce_then_own_shard_is_a_reduce_scatter():
    m = parse_module(ARS)
    e = m.entry
    n, bf16 = 4, 2
    one = _info(m, e, "f1")
    assert one.kind == "reduce-scatter" and one.group_size == n
    assert one.buffer_bytes == 1024 * 2048 * bf16
    assert one.wire_bytes == (n - 1) * 1024 * 2048 * bf16 // n  # ring reduce-scatter, not 2(n-1)/n
    two = _info(m, e, "f2")
    both = (1024 * 4 * 128 + 8 * 128 * 1024) * bf16
    assert two.kind == "reduce-scatter" and two.wire_bytes == (n - 1) * both // n
    # a slice at a fixed offset keeps the same quarter on every device: an all-reduce it stays
    fixed = _info(m, e, "f3")
    assert fixed.kind == "all-reduce" and fixed.wire_bytes == 2 * (n - 1) * 1024 * 2048 * bf16 // n
    a = analyze_module(m)
    assert a.totals.device_to_device_bytes == one.wire_bytes + two.wire_bytes + fixed.wire_bytes


def test_a_combined_permute_with_s32_data_sends_every_operand():
    # a user trial: XLA:GPU's CollectivePermuteCombiner joins permutes of any type; four
    # operands with an s32 third one were taken for the in-place form (data, output buffer,
    # start indices, start indices) and only operand 0 counted: 4,096 B against 30,720.
    # The in-place form has slice_sizes= (XLA's parser requires it of that form).
    m, entry = _module(
        "  a = f32[1024]{0} parameter(0)\n  b = f32[2048]{0} parameter(1)\n"
        "  c = s32[4096]{0} parameter(2)\n  d = f32[512]{0} parameter(3)\n"
        "  ROOT cp = (f32[1024]{0}, f32[2048]{0}, s32[4096]{0}, f32[512]{0}) collective-permute(a, b, c, d), "
        "channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}", ", num_partitions=4")
    cp = _info(m, entry, "cp")
    assert cp.wire_bytes == cp.buffer_bytes == 4 * (1024 + 2048 + 4096 + 512)
    assert not any("in-place" in n for n in cp.notes)


def test_a_bf16_all_reduce_into_f32_sends_f32_partials():
    # a user trial: XLA:TPU's f32[4,128] all-reduce(bf16[4,128]) with an f32 reduction
    # (llama3-8b-train --plan tp) was counted at bf16: 1,536 B over 4 devices. Its partial
    # results are f32: 2 x 3/4 x 4 x 128 x 4 B = 3,072. An f32 operand keeps its width.
    m, entry = _module(
        "  p = bf16[4,128]{1,0} parameter(0)\n  q = f32[4,128]{1,0} parameter(1)\n"
        "  ar = f32[4,128]{1,0} all-reduce(p), channel_id=1, replica_groups=[2,4]<=[8], "
        "use_global_device_ids=true, to_apply=add\n"
        "  ar2 = f32[4,128]{1,0} all-reduce(q), channel_id=2, replica_groups=[2,4]<=[8], "
        "use_global_device_ids=true, to_apply=add\n"
        "  ROOT t = (f32[4,128]{1,0}, f32[4,128]{1,0}) tuple(ar, ar2)", ", num_partitions=8")
    assert _info(m, entry, "ar").wire_bytes == 2 * 3 * 4 * 128 * 4 // 4 == 3072
    assert _info(m, entry, "ar2").wire_bytes == 3072 and not _info(m, entry, "ar2").notes
