"""Sharding plans: rule resolution, TOML plans, and closed-form collectives of partitioned
programs compiled on simulated CPU devices (in subprocesses, as the device count is fixed
when jax starts).

Closed forms (b bytes per element, n devices in the group):
  tp MLP, one all-reduce per layer of the [B, d] block output: B*d*b bytes, wire 2(n-1)/n of it;
  fsdp: every sharded weight all-gathered once, wire (n-1)/n of its full bytes; dp: nothing;
  ep MoE: two all-to-alls per layer of the per-device dispatched buffer E*(B/n)*C*d*b,
  wire (n-1)/n of it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jaxmove.plans import PRESETS, PlanError, parse_mesh, parse_plan
from tests.conftest import cpu_devices_env

ROOT = Path(__file__).resolve().parents[1]


# ---- pure rule resolution -----------------------------------------------------------------

def test_partition_spec_rules_conflicts_and_divisibility():
    mesh = {"data": 2, "model": 4}
    tp = PRESETS["tp"]
    assert tp.partition_spec(("embed", "mlp"), (64, 256), mesh, True) == (None, "model")
    assert tp.partition_spec(("batch", "embed"), (8, 64), mesh, False) == ("data", None)
    fsdp = PRESETS["fsdp"]
    # batch takes every axis; embed of an activation is not a parameter rule
    assert fsdp.partition_spec(("batch", "embed"), (8, 64), mesh, False) == (("data", "model"), None)
    assert fsdp.partition_spec(("embed", "mlp"), (64, 256), mesh, True) == (("data", "model"), None)
    notes: list[str] = []
    # 50257 is odd: vocab stays replicated, and the note says why
    assert tp.partition_spec(("vocab", "embed"), (50257, 768), mesh, True, notes) == (None, None)
    assert notes and "50257" in notes[0] and "model" in notes[0]
    # 6 is divisible by data=2 but not by data*model=8: the last axis is dropped
    assert fsdp.partition_spec(("batch",), (6,), mesh, False) == ("data",)
    # a mesh axis shards at most one dimension of a tensor
    both = parse_plan('[rules]\nbatch = ["data"]\nembed = ["data"]\n')
    assert both.partition_spec(("batch", "embed"), (8, 8), mesh, False) == ("data", None)
    # axes the mesh lacks are skipped
    assert PRESETS["ep"].partition_spec(("expert", "embed", "mlp"), (4, 8, 8), {"model": 4}, True) == \
        ("model", None, None)
    with pytest.raises(PlanError, match="logical axes"):
        tp.partition_spec(("batch",), (2, 2), mesh, False)


def test_toml_plans_and_mesh_errors(tmp_path):
    p = parse_plan('name = "mine"\n[rules]\nbatch = ["data"]\n[params]\nembed = "model"\n', "x.toml")
    assert p.name == "mine"
    assert p.params == {"batch": ("data",), "embed": ("model",)}
    assert p.activations == {"batch": ("data",)}
    with pytest.raises(PlanError, match=r"x.toml:3: \[params\] mlp must be"):
        parse_plan('name = "bad"\n[params]\nmlp = 3\n', "x.toml")
    with pytest.raises(PlanError, match=r"x.toml:1: unknown key 'rulez'"):
        parse_plan('rulez = 1\n', "x.toml")
    with pytest.raises(PlanError, match="x.toml"):
        parse_plan('[rules\n', "x.toml")
    assert parse_mesh("data=2, model=4") == {"data": 2, "model": 4}
    with pytest.raises(PlanError, match="name=size"):
        parse_mesh("data:2")
    with pytest.raises(PlanError, match="twice"):
        parse_mesh("data=2,data=4")


# ---- partitioned programs (subprocess with 8 simulated devices) ----------------------------

_WORKER = textwrap.dedent("""
    import json, sys
    from jaxmove.plans import PRESETS, capture_with_plan, ensure_cpu_devices
    from jaxmove.api import analyze
    assert ensure_cpu_devices(8)
    out = {}
    for key, preset, sets, plan, mesh in [
            ("tp", "mlp-tiny", {"batch": "64"}, "tp", {"model": 4}),
            ("fsdp", "mlp-tiny", {"batch": "64"}, "fsdp", {"data": 8}),
            ("dp", "mlp-tiny", {"batch": "64"}, "dp", {"data": 8}),
            ("ep", "moe-tiny", {}, "ep", {"model": 4})]:
        rep = analyze(capture_with_plan(preset, sets, PRESETS[plan], mesh))
        out[key] = {"num_devices": rep.program.num_devices,
                    "wire": rep.totals.device_to_device_bytes,
                    "colls": [[r.collective.kind, r.collective.group_size, r.collective.buffer_bytes,
                               r.collective.wire_bytes, r.multiplicity.count]
                              for r in rep.rows if r.collective is not None]}
    json.dump(out, sys.stdout)
""")


@pytest.fixture(scope="module")
def partitioned(processes):
    proc = processes["partitioned"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_tp_mlp_one_all_reduce_per_layer(partitioned):
    b, d, layers, n, elem = 64, 32, 2, 4, 4   # mlp-tiny: d_model 32, 2 layers, f32
    got = partitioned["tp"]
    assert got["num_devices"] == n
    buffer = b * d * elem
    assert got["colls"] == [["all-reduce", n, buffer, 2 * (n - 1) * buffer // n, 1]] * layers
    assert got["wire"] == layers * 2 * (n - 1) * buffer // n


def test_fsdp_all_gathers_each_weight_once_and_dp_has_none(partitioned):
    d, f, layers, n, elem = 32, 128, 2, 8, 4
    got = partitioned["fsdp"]
    # sharded weights (embed dim): up kernel [d, f], down kernel [f, d], down bias [d];
    # the up bias [f] has no embed dim and stays replicated.
    weights = sorted([d * f * elem, f * d * elem, d * elem] * layers)
    assert all(k == "all-gather" and g == n for k, g, *_ in got["colls"])
    assert sorted(c[2] for c in got["colls"]) == weights
    for _, _, full, wire, mult in got["colls"]:
        assert wire == (n - 1) * full // n and mult == 1
    assert got["wire"] == sum((n - 1) * w // n for w in weights)
    assert partitioned["dp"]["colls"] == [] and partitioned["dp"]["wire"] == 0


def test_ep_moe_all_to_all_moves_three_quarters_of_dispatched_tokens(partitioned):
    e, b, s, d, k, layers, n, elem = 4, 4, 16, 32, 2, 2, 4, 4   # moe-tiny
    c = math.ceil(k * s * 1.0 / e)                            # capacity per expert and row
    dispatched = e * (b // n) * c * d * elem                  # per-device token buffer
    a2a = [x for x in partitioned["ep"]["colls"] if x[0] == "all-to-all"]
    assert len(a2a) == 2 * layers                             # dispatch and combine
    for _, g, buffer, wire, mult in a2a:
        assert (g, buffer, wire, mult) == (n, dispatched, (n - 1) * dispatched // n, 1)


# ---- the CLI ----------------------------------------------------------------------------------

def _cli(*argv, env_extra=None, timeout=900):
    env = cpu_devices_env(None, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "jaxmove.cli", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _partitioned_worker():
    env = cpu_devices_env(8, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", _WORKER], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


_RERUN_CODE = textwrap.dedent("""
    import jax, json
    assert len(jax.devices()) == 1          # jax is up with one CPU device
    from jaxmove.plans import compare_plans
    cmp = compare_plans("mlp-tiny", {"data": 2, "model": 2}, ["tp"], {"batch": "8"})
    r = cmp.results[0]
    print(json.dumps([r.num_devices, r.wire_bytes_by_kind]))
""")


def _rerun_with_one_device():
    env = cpu_devices_env(None)
    return subprocess.run([sys.executable, "-c", _RERUN_CODE], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def _tiny_hbm_spec(directory: Path) -> Path:
    """h100-sxm with 1 KiB of HBM: smaller than any program."""
    import dataclasses

    from jaxmove.hardware import load_spec, spec_to_toml
    small = directory / "tiny-hbm.toml"
    spec = dataclasses.replace(load_spec("h100-sxm"), name="tiny-hbm", hbm_capacity_bytes=1024)
    small.write_text(spec_to_toml(spec))
    return small


#: the processes of this module's tests: (the tests that read it, how to run it), longest first
_PROCESSES = {
    # GPT-2 small's widths at 2 layers and 128 tokens: the four default plans' table as at full
    # size (12 layers, 1024 tokens: 17 s of CPU, 10 s here)
    "gpt2_plans": (("test_cli_plans_gpt2_small_prefill_on_2x4_mesh",), lambda d: _cli(
        "plans", "gpt2-small-prefill", "--set", "layers=2", "--set", "seq_len=128", "--mesh", "data=2,model=4",
        "--json", "--no-progress")),
    "plans_64": (("test_cli_plans_64_devices_and_marks_what_does_not_fit",), lambda d: _cli(
        "plans", "gpt-tiny-prefill", "--set", "batch=8", "--mesh", "data=8,model=8",
        "--plan", "dp", "--plan", "tp", "--hardware", "tpu-v5e", "--json", "--no-progress")),
    "rerun": (("test_reruns_itself_when_jax_has_too_few_devices",), lambda d: _rerun_with_one_device()),
    "analyze_mesh": (("test_analyze_mesh_plan_json_has_collectives",), lambda d: _cli(
        "analyze", "mlp-tiny", "--set", "batch=16", "--mesh", "model=2", "--plan", "tp", "--json")),
    "partitioned": (("test_tp_mlp_one_all_reduce_per_layer",
                     "test_fsdp_all_gathers_each_weight_once_and_dp_has_none",
                     "test_ep_moe_all_to_all_moves_three_quarters_of_dispatched_tokens"),
                    lambda d: _partitioned_worker()),
    "analyze_unused_mesh": (("test_analyze_mesh_plan_json_has_collectives",), lambda d: _cli(
        "analyze", "mlp-tiny", "--set", "batch=16", "--mesh", "foo=2", "--plan", "tp", "--json")),
    "analyze_bad_plan": (("test_analyze_mesh_plan_json_has_collectives",), lambda d: _cli(
        "analyze", "mlp-tiny", "--mesh", "data=2", "--plan", "nonesuch")),
    "plans_tiny_hbm": (("test_cli_plans_64_devices_and_marks_what_does_not_fit",), lambda d: _cli(
        "plans", "mlp-tiny", "--mesh", "data=2", "--plan", "dp", "--hardware", str(_tiny_hbm_spec(d)))),
}


@pytest.fixture(scope="module")
def processes(request, tmp_path_factory):
    """{name: Future of the CompletedProcess} for the subprocesses (python, jax, compiles: 2 to
    10 s each) of the tests selected, all started when the first is needed, two at a time:
    each is a process of its own, so running them side by side changes nothing they compute,
    and the machine's second core is used (30 s one after the other, ~17 s so)."""
    from concurrent.futures import ThreadPoolExecutor

    selected = {item.originalname for item in request.session.items if item.module is request.module}
    tmp = tmp_path_factory.mktemp("plans_cli")
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-plans")
    futures = {name: pool.submit(run, tmp) for name, (tests, run) in _PROCESSES.items()
               if selected & set(tests)}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def test_cli_plans_gpt2_small_prefill_on_2x4_mesh(processes):
    proc = processes["gpt2_plans"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["mesh"] == {"data": 2, "model": 4} and out["hardware"] == "h100-sxm"
    # XLA:CPU's partitioned program costed on an H100 says so (its collectives are XLA:CPU's)
    assert any(n.startswith("program compiled by XLA:CPU; costed on h100-sxm") and "--target h100-sxm:1x1x8" in n
               for n in out["notes"]), out["notes"]
    plans = {r["plan"]: r for r in out["plans"]}
    assert set(plans) == {"dp", "fsdp", "tp", "fsdp_tp"}
    for r in plans.values():
        assert r["error"] is None and r["num_devices"] == 8 and r["fits"] is True
        live = r["argument_bytes"] + r["output_bytes"] - r["alias_bytes"] + r["temp_bytes"]
        assert r["xla_peak_bytes"] is not None and r["peak_bytes"] == max(live, r["xla_peak_bytes"])
    # dp with batch 1 cannot shard: every device holds the whole model, and nothing moves
    assert plans["dp"]["wire_bytes"] == 0
    # tp shards the weights over model=4: fewer argument bytes per device than dp
    assert plans["tp"]["argument_bytes"] < plans["dp"]["argument_bytes"]
    assert plans["tp"]["wire_bytes_by_kind"].get("all-reduce", 0) > 0


def test_cli_plans_64_devices_and_marks_what_does_not_fit(processes):
    proc = processes["plans_64"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert [r["plan"] for r in out["plans"]] == ["dp", "tp"]
    assert all(r["num_devices"] == 64 and r["error"] is None for r in out["plans"])
    # a spec whose HBM is smaller than the program (_tiny_hbm_spec): the plan is kept and marked
    proc = processes["plans_tiny_hbm"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NO" in proc.stdout and "tiny-hbm" in proc.stdout


def test_reruns_itself_when_jax_has_too_few_devices(processes):
    proc = processes["rerun"].result()           # _RERUN_CODE: jax up with one device first
    assert proc.returncode == 0, proc.stderr[-3000:]
    n, kinds = json.loads(proc.stdout.strip().splitlines()[-1])
    # batch 8 over data=2: each model=2 group all-reduces a [4, 32] f32 block per layer
    layers, groups, local = 2, 2, (8 // 2) * 32 * 4
    assert n == 4 and kinds == {"all-reduce": layers * 2 * (groups - 1) * local // groups}


def test_analyze_mesh_plan_json_has_collectives(processes):
    proc = processes["analyze_mesh"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    buffer = 16 * 32 * 4
    colls = [i["collective"] for i in out["instructions"] if i["collective"]]
    assert [(c["kind"], c["group_size"], c["wire_bytes"]) for c in colls] == [("all-reduce", 2, buffer)] * 2
    assert out["totals"]["collective_wire_bytes"] == 2 * buffer
    # the JSON says which plan and mesh made the program; tp over model=2 shards the weights
    assert "compiled under plan tp over mesh model=2 (2 devices): the per-device program" in out["notes"]
    assert not any("shards no argument" in n for n in out["notes"])
    # a mesh axis no rule of the plan names: every device computes everything, and it says so
    unused = processes["analyze_unused_mesh"].result()
    assert unused.returncode == 0, unused.stderr[-3000:]
    u = json.loads(unused.stdout)
    assert u["totals"]["collective_wire_bytes"] == 0
    assert any(n.startswith("plan tp shards no argument or result over mesh foo=2") for n in u["notes"]), u["notes"]
    bad = processes["analyze_bad_plan"].result()
    assert bad.returncode == 2 and "nonesuch" in bad.stderr and "Traceback" not in bad.stderr


def test_default_plans_offer_ep_for_models_with_experts():
    # the per-argument container of logical_axes is itself a tuple: it was taken for an axes
    # tuple, so 'expert' was never seen and ep never offered (moe-tiny: dp, fsdp, tp, fsdp_tp)
    from jaxmove.plans import default_plans
    assert default_plans("moe-tiny") == ["dp", "fsdp", "tp", "fsdp_tp", "ep"]
    assert default_plans("mlp-tiny") == ["dp", "fsdp", "tp", "fsdp_tp"]


def test_a_plan_given_twice_is_refused_before_compiling(tmp_path):
    # the table names each plan: the same name twice compiled twice (or, for a file named like a
    # preset, gave two rows of one name)
    from jaxmove.plans import PlanError, compare_plans
    f = tmp_path / "tp.toml"
    f.write_text('[rules]\nmlp = "model"\n')
    with pytest.raises(PlanError, match=r"^plan 'tp' is given twice \(preset\)"):
        compare_plans("gpt2-small-prefill", {"model": 2}, ["tp", "dp", "tp"])
    with pytest.raises(PlanError, match=r"^plan 'tp' is given twice \(preset and .*tp\.toml\): .*`name =`"):
        compare_plans("gpt2-small-prefill", {"model": 2}, ["tp", str(f)])


@pytest.mark.parametrize("value", ["3", '"x\\ny"', '""', '"  "'])
def test_a_plan_name_that_is_no_printable_string_is_refused(tmp_path, value):
    from jaxmove.plans import load_plan
    f = tmp_path / "p.toml"
    f.write_text(f'name = {value}\n[rules]\nmlp = "model"\n')
    with pytest.raises(PlanError, match=r"p\.toml:1: name = .*: expected a non-empty string of printable"):
        load_plan(str(f))


def test_a_plan_from_a_file_is_labelled_with_its_file():
    from dataclasses import asdict

    from jaxmove.plans.compare import PlanResult
    from jaxmove.report.plans_table import _label
    r = PlanResult("tp", "", 2, plan_source="/some/dir/tp.toml")
    assert _label(r) == "tp [dim](tp.toml)[/dim]" and _label(PlanResult("tp", "", 2)) == "tp"
    assert PlanResult.from_json(asdict(r)).plan_source == "/some/dir/tp.toml"
    old = asdict(PlanResult("tp", "", 2))
    del old["plan_source"]            # JSON of an older jaxmove: keys are only ever added
    assert PlanResult.from_json(old).plan_source == "preset"
