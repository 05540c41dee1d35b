"""Rules for what XLA:TPU and XLA:GPU emit (issue 12): async slices and copies between HBM and
VMEM, host transfers, async collectives, TPU custom calls; and real device programs compiled
here without the device, checked against closed-form bytes from their shapes and dtypes."""

from __future__ import annotations

import math

import pytest

from jaxmove.hlo import parse_module
from jaxmove.passes.pipeline import analyze_module


def _rows(text: str, roles: dict[int, str] | None = None):
    an = analyze_module(parse_module(text, "dev.hlo"), roles)
    return an, {r.instr.name: r for r in an.rows}


# ---- hand-written snippets: one per rule --------------------------------------------------

# bf16[768,3072] in HBM streamed into VMEM (S(1)) as 4 async slices of 192 rows, joined by
# XLA:TPU's ConcatBitcast (a bitcast of adjacent VMEM buffers), then used on chip.
SLICES = """HloModule s
fused {
  a = bf16[768,3072]{1,0:S(1)} parameter(0)
  ROOT n = bf16[768,3072]{1,0:S(1)} negate(a)
}
ENTRY e {
  w = bf16[768,3072]{1,0} parameter(0)
%s
  c = bf16[768,3072]{1,0:S(1)} custom-call(d0, d1, d2, d3), custom_call_target="ConcatBitcast"
  ROOT f = bf16[768,3072]{1,0:S(1)} fusion(c), kind=kLoop, calls=fused
}""" % "\n".join(
    f"  s{k} = ((bf16[768,3072]{{1,0}}), bf16[192,3072]{{1,0:S(1)}}, s32[]{{:S(2)}}) slice-start(w), "
    f"slice={{[{192 * k}:{192 * (k + 1)}], [0:3072]}}\n"
    f"  d{k} = bf16[192,3072]{{1,0:S(1)}} slice-done(s{k})" for k in range(4))


def test_async_slices_are_hbm_to_vmem_reads_of_the_weights():
    an, rows = _rows(SLICES, {0: "weights"})
    slice_bytes = 192 * 3072 * 2
    for k in range(4):
        pe = rows[f"s{k}"].per_execution
        assert pe.hbm_read_bytes == pe.hbm_to_onchip_bytes == pe.weights_read_bytes == slice_bytes
        assert pe.onchip_write_bytes == slice_bytes and pe.hbm_write_bytes == 0
        assert rows[f"d{k}"].per_execution.hbm_bytes == 0  # the start carries the transfer
    assert rows["c"].per_execution.hbm_bytes == 0 and rows["c"].per_execution.onchip_read_bytes == 0
    assert rows["f"].per_execution.hbm_bytes == 0  # reads and writes VMEM only
    assert an.totals.weights_read_bytes == 768 * 3072 * 2  # each weight byte once
    assert not [r for r in an.rows if r.unmodeled]


COPIES = """HloModule c
ENTRY e {
  w = f32[256,512]{1,0} parameter(0)
  cs = (f32[256,512]{1,0:S(1)}, f32[256,512]{1,0}, u32[]{:S(2)}) copy-start(w)
  cd = f32[256,512]{1,0:S(1)} copy-done(cs)
  n = f32[256,512]{1,0:S(1)} negate(cd)
  back = (f32[256,512]{1,0}, f32[256,512]{1,0:S(1)}, u32[]{:S(2)}) copy-start(n)
  ROOT out = f32[256,512]{1,0} copy-done(back)
}"""


def test_copy_start_both_directions():
    an, rows = _rows(COPIES, {0: "weights"})
    nbytes = 256 * 512 * 4
    to_vmem = rows["cs"].per_execution
    assert to_vmem.hbm_to_onchip_bytes == to_vmem.weights_read_bytes == nbytes
    assert to_vmem.onchip_write_bytes == nbytes and to_vmem.onchip_to_hbm_bytes == 0
    to_hbm = rows["back"].per_execution
    assert to_hbm.onchip_read_bytes == nbytes and to_hbm.hbm_read_bytes == 0
    assert to_hbm.onchip_to_hbm_bytes == to_hbm.hbm_write_bytes == nbytes
    assert rows["cd"].per_execution.hbm_bytes == rows["out"].per_execution.hbm_bytes == 0
    assert rows["cd"].per_execution.onchip_write_bytes == 0


DUS_START = """HloModule d
ENTRY e {
  cache = bf16[16,1024,256]{2,1,0} parameter(0)
  new = bf16[16,16,256]{2,1,0:S(1)} parameter(1)
  i = s32[]{:S(6)} parameter(2)
  z = s32[]{:S(6)} constant(0)
  st = ((bf16[16,1024,256]{2,1,0}, bf16[16,16,256]{2,1,0:S(1)}, s32[]{:S(6)}, s32[]{:S(6)}, s32[]{:S(6)}), bf16[16,1024,256]{2,1,0}, u32[]{:S(2)}) dynamic-update-slice-start(cache, new, z, i, z)
  ROOT dn = bf16[16,1024,256]{2,1,0} dynamic-update-slice-done(st)
}"""


def test_async_dynamic_update_slice_writes_the_update_into_hbm_in_place():
    an, rows = _rows(DUS_START, {0: "kv_cache", 1: "activations"})
    pe = rows["st"].per_execution
    upd = 16 * 16 * 256 * 2
    assert pe.onchip_read_bytes == upd + 2 * 4  # the update and two s32 indices (i, z) in S(6)
    assert pe.hbm_read_bytes == 0  # the cache buffer is not read
    assert pe.onchip_to_hbm_bytes == pe.kv_cache_write_bytes == upd
    assert rows["dn"].per_execution.hbm_bytes == 0
    assert not rows["st"].unmodeled


DS_START = """HloModule ds
ENTRY e {
  table = bf16[1024,768]{1,0} parameter(0)
  i = s32[]{:S(6)} parameter(1)
  z = s32[]{:S(6)} constant(0)
  st = ((bf16[1024,768]{1,0}, s32[]{:S(6)}, s32[]{:S(6)}), bf16[16,768]{1,0:S(1)}, u32[]{:S(2)}) dynamic-slice-start(table, i, z), dynamic_slice_sizes={16,768}
  ROOT dn = bf16[16,768]{1,0:S(1)} dynamic-slice-done(st)
}"""


def test_async_dynamic_slice_reads_its_footprint_into_vmem():
    an, rows = _rows(DS_START, {0: "weights"})
    pe = rows["st"].per_execution
    assert pe.weights_read_bytes == pe.hbm_to_onchip_bytes == 16 * 768 * 2
    assert pe.onchip_write_bytes == 16 * 768 * 2


HOST = """HloModule h
ENTRY e {
  x = f32[1024]{0} parameter(0)
  t = token[] after-all()
  s = (f32[1024]{0}, u32[], token[]) send(x, t), channel_id=1, is_host_transfer=true
  sd = token[] send-done(s), channel_id=1, is_host_transfer=true
  r = (f32[512]{0}, u32[], token[]) recv(t), channel_id=2, is_host_transfer=true
  rd = (f32[512]{0}, token[]) recv-done(r), channel_id=2, is_host_transfer=true
  off = (f32[1024]{0:S(5)}, f32[1024]{0}, u32[]) copy-start(x)
  od = f32[1024]{0:S(5)} copy-done(off)
  ROOT g = f32[512]{0} get-tuple-element(rd), index=0
}"""


def test_host_transfers_and_host_offload():
    an, rows = _rows(HOST)
    send = rows["s"].per_execution
    assert send.hbm_read_bytes == 1024 * 4 and send.device_to_host_bytes == 1024 * 4
    assert send.hbm_write_bytes == 0
    recv = rows["r"].per_execution
    assert recv.hbm_write_bytes == 512 * 4 and recv.hbm_read_bytes == 0
    off = rows["off"].per_execution  # host offload: HBM -> host memory S(5)
    assert off.hbm_read_bytes == 1024 * 4 and off.device_to_host_bytes == 1024 * 4
    for done in ("sd", "rd", "od"):
        assert rows[done].per_execution.hbm_bytes == 0
    assert not [r for r in an.rows if r.unmodeled]


ASYNC_COLLECTIVES = """HloModule ac, num_partitions=4
add {
  a = bf16[] parameter(0)
  b = bf16[] parameter(1)
  ROOT s = bf16[] add(a, b)
}
ENTRY e {
  g = bf16[2048,512]{1,0} parameter(0)
  rs = ((bf16[2048,512]{1,0}), bf16[512,512]{1,0}) reduce-scatter-start(g), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, dimensions={0}, to_apply=add
  rd = bf16[512,512]{1,0} reduce-scatter-done(rs)
  a2a = ((bf16[16,4,512]{2,1,0}), bf16[16,4,512]{2,1,0}) all-to-all-start(g2), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={1}
  g2 = bf16[16,4,512]{2,1,0} parameter(1)
  ad = bf16[16,4,512]{2,1,0} all-to-all-done(a2a)
  ROOT t = (bf16[512,512]{1,0}, bf16[16,4,512]{2,1,0}) tuple(rd, ad)
}"""


def test_async_collectives_read_operands_and_write_results_like_the_sync_op():
    text = ASYNC_COLLECTIVES.replace("  a2a = ", "  g2 = bf16[16,4,512]{2,1,0} parameter(1)\n  a2a = ", 1)
    text = text.replace("  g2 = bf16[16,4,512]{2,1,0} parameter(1)\n  ad", "  ad", 1)
    an, rows = _rows(text)
    rs = rows["rs"].per_execution
    assert rs.hbm_read_bytes == 2048 * 512 * 2 and rs.hbm_write_bytes == 512 * 512 * 2
    assert rs.device_to_device_bytes == 3 * 2048 * 512 * 2 // 4  # (n-1)/n of the buffer
    a2a = rows["a2a"].per_execution
    assert a2a.hbm_read_bytes == a2a.hbm_write_bytes == 16 * 4 * 512 * 2
    assert rows["rd"].per_execution.hbm_bytes == rows["ad"].per_execution.hbm_bytes == 0
    assert not [r for r in an.rows if r.unmodeled]


def test_tpu_custom_calls_move_no_hbm_bytes():
    text = """HloModule t
ENTRY e {
  idx = s32[1024]{0} parameter(0)
  a = s32[1024]{0} custom-call(idx), custom_call_target="AssumeGatherIndicesInBound"
  b = bf16[8,128]{1,0:S(1)} custom-call(), custom_call_target="AllocateBuffer"
  ROOT t = (s32[1024]{0}, bf16[8,128]{1,0:S(1)}) tuple(a, b)
}"""
    an, rows = _rows(text)
    for n in ("a", "b"):
        assert not rows[n].unmodeled and rows[n].per_execution.hbm_bytes == 0


def test_unknown_custom_call_is_unmodeled_with_its_target():
    text = """HloModule u
ENTRY e {
  x = f32[16]{0} parameter(0)
  ROOT y = f32[16]{0} custom-call(x), custom_call_target="SomeVendorKernel"
}"""
    _an, rows = _rows(text)
    assert any("SomeVendorKernel" in u for u in rows["y"].unmodeled)


def test_zero_flops_read_as_zero_in_the_table(tmp_path):
    import io

    from rich.console import Console

    import jaxmove
    from jaxmove.report.table import render_report
    no_compute = COPIES.replace("negate(cd)", "copy(cd)")
    for text, want in ((COPIES, "131 kFLOP"), (no_compute, "0 FLOP")):  # negate: 256*512 flops
        f = tmp_path / "c.hlo"
        f.write_text(text)
        buf = io.StringIO()
        render_report(jaxmove.analyze(str(f)), console=Console(file=buf, width=220, emoji=False))
        out = buf.getvalue()
        assert "0FLOP" not in out and want in out


# ---- real device programs, compiled here without the device ---------------------------------

jax = pytest.importorskip("jax")


def _have(platform: str) -> bool:
    try:
        from jaxmove.capture.targets import _check_extra
        _check_extra(platform)
        return True
    except Exception:
        return False


TARGETS = [t for t, p in (("tpu-v5e", "tpu"), ("h100-sxm", "gpu")) if _have(p)]
if not TARGETS:
    pytest.skip("neither libtpu nor the CUDA plugin is installed", allow_module_level=True)


def _param_bytes(tree) -> dict[str, int]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p): math.prod(x.shape) * x.dtype.itemsize for p, x in flat}


@pytest.fixture(scope="module", params=TARGETS)
def gpt(request):
    import jaxmove
    from jaxmove import zoo
    out = {}
    # one layer: every layer is the same instructions (two took a quarter longer to compile)
    for mode, over in (("decode", {"layers": "1"}), ("prefill", {"layers": "1", "seq_len": "128"})):
        w = zoo.build(f"gpt2-small-{mode}", over)
        out[mode] = (w, jaxmove.analyze(w, target=request.param, hardware=request.param))
    return request.param, out


def _wpe_bytes(params) -> tuple[int, int]:
    sizes = _param_bytes(params)
    wpe = [k for k in sizes if "wpe" in k]
    assert len(wpe) == 1, wpe
    return sum(sizes.values()), sizes[wpe[0]]


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_gpt2_small_weights_read_once_and_nothing_unmodeled(gpt, mode):
    target, progs = gpt
    w, rep = progs[mode]
    assert not [r for r in rep.rows if r.unmodeled], target
    assert rep.times is not None and not rep.times.unmodeled  # every instruction gets time
    # one HBM: the program (no conditionals) takes at least its summed memory time, whatever
    # the schedule runs beside the stream (XLA:TPU's async weight prefetches)
    assert rep.times.est_time_s >= rep.times.memory_time_s * (1 - 1e-9), target
    total, wpe = _wpe_bytes(w.args[0])
    d_model = 768
    rows_used = 1 if mode == "decode" else 128  # positions the program reads from wpe
    touched = total - wpe + rows_used * d_model * 2
    assert rep.totals.weights_read_bytes == pytest.approx(touched, rel=0.01), target


def _mlp(params, x):
    jnp = jax.numpy
    for w1, w2 in params:
        x = jnp.maximum(x @ w1, 0) @ w2
    return x


@pytest.fixture(scope="module", params=TARGETS)
def small(request):
    """TP and FSDP MLPs on 4 devices, int8 weights, an in-place KV update, a scan and an FSDP
    training step (adam), compiled for the target."""
    import numpy as np
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxmove
    from jaxmove.capture.targets import Target, _load_devices
    jnp = jax.numpy
    Sd = jax.ShapeDtypeStruct
    bf = jnp.bfloat16
    D, F, B = 512, 2048, 64
    target = request.param
    multi = f"{target}:{'2x2' if target.startswith('tpu') else '1x1x4'}"
    out = {}

    def run(name, fn, args, roles, specs=None, donate=()):
        kw = dict(roles=roles, donate_argnums=donate, target=target)
        if specs is not None:
            mesh = jax.sharding.Mesh(np.array(_load_devices(Target.parse(multi))[:4]), ("x",))
            kw["in_shardings"] = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                                              is_leaf=lambda s: isinstance(s, P))
            kw["target"] = multi
        out[name] = (args, jaxmove.analyze(fn, *args, hardware=target, **kw))

    params = [(Sd((D, F), bf), Sd((F, D), bf)) for _ in range(2)]
    x = Sd((B, D), bf)
    run("int8", lambda w, s, x: (x @ w.astype(bf)) * s,
        (Sd((D, F), jnp.int8), Sd((F,), bf), x), ("weights", "weights", "activations"))
    run("kv", lambda c, u, i: jax.lax.dynamic_update_slice(c, u, (0, i, 0)),
        (Sd((16, 1024, 256), bf), Sd((16, 16, 256), bf), Sd((), jnp.int32)),
        ("kv_cache", "activations", "activations"), donate=(0,))

    def scanned(ws, x):
        return jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x, ws)[0]
    run("scan", scanned, (Sd((8, D, D), bf), x), ("weights", "activations"))
    run("tp", _mlp, (params, x), ("weights", "activations"),
        specs=([(P(None, "x"), P("x", None))] * 2, P()))
    opt = optax.adam(1e-3)

    def step(params, state, x):
        g = jax.grad(lambda p, x: jnp.mean(_mlp(p, x).astype(jnp.float32) ** 2))(params, x)
        u, state = opt.update(g, state, params)
        return optax.apply_updates(params, u), state
    state = jax.eval_shape(opt.init, params)
    sspec = jax.tree.map(lambda a: P("x", None) if a.ndim == 2 else P(), state)
    run("train", step, (params, state, x), ("weights", "optimizer_state", "activations"),
        specs=([(P("x", None), P("x", None))] * 2, sspec, P("x", None)), donate=(0, 1))
    return target, out


def test_small_device_programs_have_nothing_unmodeled(small):
    target, progs = small
    for name, (_args, rep) in progs.items():
        assert not [r for r in rep.rows if r.unmodeled], (target, name)
        assert rep.times is not None and not rep.times.unmodeled, (target, name)


def test_int8_weights_read_once(small):
    target, progs = small
    _args, rep = progs["int8"]
    D, F = 512, 2048
    assert rep.totals.weights_read_bytes == pytest.approx(D * F * 1 + F * 2, rel=0.01), target


def test_in_place_kv_update_writes_only_the_update(small):
    target, progs = small
    _args, rep = progs["kv"]
    assert rep.totals.kv_cache_read_bytes == 0, target
    assert rep.totals.kv_cache_write_bytes == 16 * 16 * 256 * 2, target


def test_tp_mlp_reads_its_weight_shards_once(small):
    target, progs = small
    _args, rep = progs["tp"]
    D, F = 512, 2048
    assert rep.totals.weights_read_bytes == pytest.approx(2 * 2 * D * F * 2 / 4, rel=0.01), target


def test_fsdp_training_step_async_collectives_move_hbm_bytes(small):
    target, progs = small
    _args, rep = progs["train"]
    coll = [r for r in rep.rows if r.collective is not None]
    assert coll, target
    for r in coll:  # every collective (async, or fused on TPU) reads and writes its buffers
        pe = r.per_execution
        if any("continuation of an async collective" in n for n in r.notes):
            continue  # XLA:TPU's decomposed collective: its start fusion moves the buffers
        assert pe.hbm_read_bytes + pe.onchip_read_bytes > 0, r.instr.name
        assert pe.hbm_write_bytes + pe.onchip_write_bytes > 0, r.instr.name
    if target.startswith("h100"):
        module = rep.analysis.module
        starts = [r for r in coll if r.instr.opcode in ("reduce-scatter-start", "all-to-all-start")]
        assert starts
        for r in starts:  # operands read, the result (the start's element 1) written, in full
            comp = module.computations[r.computation]
            reads = sum(comp.by_name[o].shape.byte_size for o in set(r.instr.operands))
            assert r.per_execution.hbm_read_bytes == reads, r.instr.name
            assert r.per_execution.hbm_write_bytes == r.instr.shape.tuple_shapes[1].byte_size
