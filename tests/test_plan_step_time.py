"""plans ranked by estimated step time (issue 26) and what the partitioner did (issue 29 item 6)."""

from __future__ import annotations

import pytest

import jaxmove
from jaxmove.plans import load_plan
from jaxmove.plans.compare import PlanResult, step_time_order
from jaxmove.plans.explain import plan_collective_note, weight_gathers_implied

_SUM = """%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""

# fsdp over data=2: x [8,16] (batch-sharded), w's embed dim 16 sharded to 8 per device; the
# partitioner computed on the shard (a partial sum) and all-reduced it, gathering no weight
PARTIAL_SUM = """HloModule m, is_scheduled=true

""" + _SUM + """
ENTRY %e (x: f32[8,8], w: f32[8,32]) -> f32[8,32] {
  %x = f32[8,8] parameter(0)
  %w = f32[8,32] parameter(1)
  %d = f32[8,32] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %ar = f32[8,32] all-reduce(%d), replica_groups={{0,1}}, to_apply=%sum
}
"""

# the textbook fsdp program: the weight shard all-gathered, then used whole
GATHERED = """HloModule m, is_scheduled=true

ENTRY %e (x: f32[4,16], w: f32[8,32]) -> f32[4,32] {
  %x = f32[4,16] parameter(0)
  %w = f32[8,32] parameter(1)
  %ag = f32[16,32] all-gather(%w), replica_groups={{0,1}}, dimensions={0}
  ROOT %d = f32[4,32] dot(%x, %ag), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def _report(tmp_path, text):
    p = tmp_path / "m.hlo"
    p.write_text(text)
    return jaxmove.analyze(str(p), role_globs={"w": "weights", "x": "activations"})


def test_fsdp_without_weight_gathers_says_what_the_partitioner_did(tmp_path):
    rep = _report(tmp_path, PARTIAL_SUM)
    fsdp = load_plan("fsdp")
    assert weight_gathers_implied(fsdp, {"data": 2}) == ["data"]
    note = plan_collective_note(fsdp, rep, {"data": 2})
    assert note is not None and "gathered no weights" in note
    # one all-reduce of f32[8,32] = 1 KiB over 2 devices: 2 (n-1)/n x 1 KiB = 1 KiB on the wire
    assert "1 all-reduce (1.00 KiB on the wire)" in note
    # gathering would move (n - 1) x the 1 KiB weight shard read per step
    assert "about 1.00 KiB per device per step" in note
    assert plan_collective_note(fsdp, rep, {"data": 1}) is None  # nothing sharded: nothing implied
    assert plan_collective_note(load_plan("dp"), rep, {"data": 2}) is None


def test_textbook_fsdp_needs_no_note_and_tp_gathering_weights_gets_one(tmp_path):
    rep = _report(tmp_path, GATHERED)
    assert plan_collective_note(load_plan("fsdp"), rep, {"data": 2}) is None
    note = plan_collective_note(load_plan("tp"), rep, {"model": 2})
    # all-gather of f32[16,32]: (n-1)/n x 2 KiB = 1 KiB on the wire
    assert note is not None and "all-gathered 1.00 KiB of them" in note and "ag -> f32[16,32]" in note


def test_step_time_order():
    def r(name, t, fits=True, error=None):
        return PlanResult(name, "", 2, fits=fits, step_time_s=t, error=error)
    got = step_time_order([r("slow", 3.0), r("broken", None, error="x"), r("fast", 1.0),
                           r("big", 0.5, fits=False), r("unknown", None), r("mid", 2.0, fits=None)])
    assert [x.plan for x in got] == ["fast", "mid", "slow", "unknown", "big", "broken"]


def test_cli_plans_ranks_by_step_time(capsys):
    from jaxmove.plans import compare_plans
    cmp = compare_plans("mlp-tiny", {"data": 2}, ["tp", "dp", "fsdp"], {"batch": "64"}, "h100-sxm")
    ts = [r.step_time_s for r in cmp.results]
    assert None not in ts and ts == sorted(ts)
    for r in cmp.results:
        # a kernel costs launch + max(compute, memory, network) in schedule order: the step is at
        # least the summed compute and memory and at most the sum of all four (overlap only helps)
        assert r.step_time_s <= r.step_compute_s + r.step_memory_s + r.step_network_s + r.step_launch_s + 1e-12
        assert r.step_time_s >= r.step_memory_s and r.step_time_s >= r.step_compute_s
        assert r.step_bound in ("compute", "memory", "network", "overhead")
        # the coll. time column is the step time's network figure (NCCL's model on h100-sxm),
        # not a second model (it was the roofline's: 5.5 us against 28.5 us for one NNX fsdp MLP)
        assert r.collective_time_s == pytest.approx(r.step_network_s)
    from jaxmove.report.plans_table import render_plans
    render_plans(cmp)
    out = capsys.readouterr().out
    assert "step time" in out and "fastest estimated step first" in out


def test_a_weight_shard_gathered_from_on_chip_memory_is_a_weight_gather(tmp_path):
    """XLA:TPU prefetches the weight shard into VMEM (copy-start/done to S(1)) and all-gathers
    it there: the all-gather reads no HBM, but it gathers a weight (its operand's role). The
    fsdp plan did what it implies: no note (a user trial saw 'gathered no weights' on
    tpu-v5e:2x2, where 4 all-gathers sent 3/4 of each 512 KiB kernel)."""
    text = GATHERED.replace(
        "  %ag = f32[16,32] all-gather(%w)",
        "  %cs = (f32[8,32]{1,0:S(1)}, f32[8,32]{1,0}, u32[]) copy-start(%w)\n"
        "  %cd = f32[8,32]{1,0:S(1)} copy-done(%cs)\n"
        "  %ag = f32[16,32]{1,0:S(1)} all-gather(%cd)")
    rep = _report(tmp_path, text)
    ag = next(r for r in rep.rows if r.instr.name == "ag")
    assert ag.total.hbm_read_bytes == 0 and ag.collective.wire_bytes == 8 * 32 * 4   # (n-1)/n x 2 KiB
    assert plan_collective_note(load_plan("fsdp"), rep, {"data": 2}) is None


def test_no_implied_gather_where_the_embed_rule_was_dropped(tmp_path):
    """fsdp's embed rule dropped for every weight (it does not divide the mesh axis: the
    weights stay replicated) implies no all-gather: the note said the plan implied gathering
    (n - 1) x the weights and that XLA 'kept every weight sharded', contradicting the dropped
    rule's own note (mlp-tiny over data=3)."""
    rep = _report(tmp_path, PARTIAL_SUM)
    fsdp = load_plan("fsdp")
    assert weight_gathers_implied(fsdp, {"data": 3}, set()) == []
    assert plan_collective_note(fsdp, rep, {"data": 3}, set()) is None
    # a weight sharded over data: implied as before
    assert weight_gathers_implied(fsdp, {"data": 2}, {"data"}) == ["data"]
    assert "gathered no weights" in plan_collective_note(fsdp, rep, {"data": 2}, {"data"})


def test_plans_json_mlp_tiny_fsdp_over_three_has_no_gather_note(capsys):
    """End to end: mlp-tiny's embed (32) does not divide data=3, so fsdp shards nothing."""
    import json

    from jaxmove.cli import main

    assert main(["plans", "mlp-tiny", "--mesh", "data=3", "--plan", "fsdp", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    plans = got["plans"] if isinstance(got, dict) else got
    (fsdp,) = [p for p in plans if p["plan"] == "fsdp"]
    assert fsdp["collectives_note"] is None
    assert not any("implies all-gathering" in n for n in fsdp["notes"])
    assert any("not divisible by data=3" in n for n in fsdp["notes"])


def test_a_plan_jax_cannot_partition_is_a_failed_row(monkeypatch):
    """jax raises NotImplementedError for what it cannot partition (a Mosaic kernel outside
    shard_map): that plan's row fails, the others are still compared (plans aborted)."""
    from jaxmove.hardware import load_spec
    from jaxmove.plans import compare

    def refuse(*a, **k):
        raise NotImplementedError("Mosaic kernels cannot be automatically partitioned.")
    monkeypatch.setattr(compare, "capture_with_plan", refuse)
    res = compare.run_plan("mlp-tiny", None, load_plan("tp"), {"model": 1}, load_spec("h100-sxm"))
    assert res.error.startswith("NotImplementedError: Mosaic kernels")


def test_implied_gather_counts_only_the_weights_the_axes_shard(tmp_path):
    """ZeRO-3 gathers (n - 1) shards of each weight the axes shard; a replicated bias adds
    nothing (a user trial: mlp-tiny fsdp over model=8 on h100-sxm said about 63.22 KiB, the
    replicated up/bias counted; closed form 7/8 x 2 x (16384 + 16384 + 128) B = 56.22 KiB)."""
    from jaxmove.plans.explain import implied_gather_bytes
    mesh = {"data": 2, "model": 4}
    leaves = [("weights", ("data", None), 4096),            # embed over data: 2 shards of 2 KiB
              ("weights", ("data", "model"), 8192),         # data x model: shards of 1 KiB
              ("weights", (None, "model"), 4096),           # model only (tp): no gather implied
              ("optimizer_state", ("data", None), 4096)]    # not a weight the step reads
    # over data: (2 - 1) x 2 KiB + (2 - 1) x 1 KiB
    assert implied_gather_bytes(["data"], mesh, leaves) == 2048 + 1024
    assert implied_gather_bytes(["data"], mesh, []) == 0
    rep = _report(tmp_path, PARTIAL_SUM)
    note = plan_collective_note(load_plan("fsdp"), rep, {"data": 2}, {"data"},
                                [("weights", ("data", None), 16 * 32 * 4), ("weights", (None,), 128)])
    assert "about 1.00 KiB per device per step" in note   # (2 - 1) x the 1 KiB shard; bias: none


def test_plans_mlp_tiny_fsdp_on_h100_note_counts_the_sharded_weights(capsys):
    """End to end (XLA:GPU keeps mlp-tiny's weights sharded under fsdp over model=8): the note's
    implied gather is 7/8 of the weights the plan shards, 2 layers x (up kernel 32 x 128 + down
    kernel 128 x 32 + down bias 32) x 4 B; the replicated up bias (128) adds nothing."""
    import importlib.util
    import json

    from jaxmove.cli import main
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is None:
        pytest.skip("the CUDA plugin is not installed (the gpu extra)")
    assert main(["plans", "mlp-tiny", "--target", "h100-sxm", "--plan", "fsdp", "--json"]) == 0
    (fsdp,) = json.loads(capsys.readouterr().out)["plans"]
    sharded = 2 * (32 * 128 + 128 * 32 + 32) * 4
    assert f"about {sharded * 7 / 8 / 1024:.2f} KiB per device per step" in fsdp["collectives_note"]


def test_sharded_leaves_are_sized_in_bits():
    """int4 weights take 4 bits per element (numpy's itemsize says 1 byte: a user trial's int4
    MLP under fsdp said about 14.00 KiB to gather, the closed form is 7.00 KiB)."""
    import importlib.util

    import jax
    import jax.numpy as jnp

    from jaxmove.capture.targets import Target
    from jaxmove.plans.compare import workload_shardings
    from jaxmove.workload import Workload
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (the tpu extra): no 4-device mesh to shard over")
    mesh = Target.parse("tpu-v5e:2x2").mesh({"data": 4})
    leaves: list = []
    for dt, nbytes in ((jnp.int4, 128 * 128 // 2), (jnp.bfloat16, 128 * 128 * 2)):
        leaves.clear()
        wl = Workload("w", lambda w: w, (jax.ShapeDtypeStruct((128, 128), dt),), ("weights",),
                      logical_axes=(("embed", "mlp"),), out_logical_axes=("embed", "mlp"),
                      out_roles="weights")
        in_sh, out_sh, _ = workload_shardings(wl, load_plan("fsdp"), mesh, [], set(), leaves)
        assert leaves == [("weights", ("data", None), nbytes)]     # (the argument only)
        # a returned weight is sharded as the argument (so a donated one can take its buffer:
        # the outputs were once sharded as activations, and a train step lost its donation)
        assert out_sh.spec == in_sh[0].spec
