"""Sweeps (jaxmove/sweep/): SWEEP.toml expansion and errors, a local sweep whose rows equal the
same points run one by one through ``plans.compare_plans`` / ``api.analyze`` (and closed-form
bytes), the same rows from Ray, retry-once of a worker that dies or hangs, and ``--resume``.

Closed forms for mlp-tiny (2 layers of Linear 32->128, gelu, Linear 128->32, f32) on the mesh
data=2 x model=4, batch B:
  dp: batch over all 8 devices, parameters replicated: 2 * (2*32*128 + 128 + 32) * 4 B =
      66,816 B of weights per device, read once; no collective; input [B/8, 32] per device.
  tp: up kernel/bias and down kernel sharded over model=4, down bias replicated:
      2 * (2*32*32 + 32 + 32) * 4 B = 16,896 B of weights per device; one all-reduce per layer
      of the [B/2, 32] f32 block output over the 4 model devices: ring wire bytes
      2 (n-1)/n * (B/2 * 32 * 4) per layer (DESIGN.md, collectives); input [B/2, 32].
Each grid point costs a fresh worker process (jax import + compile), so the grid is 4 points
compiled once per module (local), once on Ray, plus a reference process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jaxmove.sweep import Point, ResultFileError, SweepSpecError, load_sweep, parse_sweep
from tests.conftest import cpu_devices_env

ROOT = Path(__file__).resolve().parents[1]
MESH = {"data": 2, "model": 4}
BATCHES = (8, 16)
PLANS = ("dp", "tp")
HW = "h100-sxm"

GRID = f"""\
model = "mlp-tiny"
hardware = "{HW}"
[grid]
plan = ["dp", "tp"]
mesh = ["data=2,model=4"]
[grid.set]
batch = [8, 16]
"""


def _weights_bytes(plan: str) -> int:
    d, f = 32, 128
    if plan == "dp":
        return 2 * (2 * d * f + f + d) * 4
    return 2 * (2 * d * (f // 4) + f // 4 + d) * 4


def _all_reduce_wire_bytes(batch: int) -> int:
    n = MESH["model"]
    buffer = batch // MESH["data"] * 32 * 4
    return 2 * (2 * (n - 1) * buffer // n)


# ---- SWEEP.toml -------------------------------------------------------------------------

def test_grid_and_points_expand_in_order_with_stable_keys(tmp_path):
    (tmp_path / "mine.toml").write_text('[rules]\nbatch = ["data"]\n')
    text = GRID + '[[points]]\nmesh = "data=8"\nplan = "mine.toml"\nset = {batch = 32}\n' \
                  '[[points]]\nplan = "dp"\nmesh = "data=2,model=4"\nset = {batch = 8}\n'  # a duplicate
    spec = parse_sweep(text, str(tmp_path / "SWEEP.toml"))
    assert [(p.plan, dict(p.overrides)["batch"]) for p in spec.points] == [
        ("dp", "8"), ("dp", "16"), ("tp", "8"), ("tp", "16"), (str(tmp_path / "mine.toml"), "32")]
    assert spec.notes == ["1 duplicate point(s) dropped"]
    assert all(p.target == "cpu" and p.hardware == HW for p in spec.points)
    assert spec.points[0].mesh == (("data", 2), ("model", 4)) and spec.points[0].num_devices == 8
    # the key hashes the inputs: equal points, equal keys; any input changed, another key
    keys = [p.key for p in spec.points]
    again = parse_sweep(text, str(tmp_path / "SWEEP.toml"))
    assert [p.key for p in again.points] == keys
    assert len({p.key for p in spec.points}) == 5
    # ... including the plan file's contents
    (tmp_path / "mine.toml").write_text('[rules]\nbatch = ["data"]\nembed = ["data"]\n')
    assert parse_sweep(text, str(tmp_path / "SWEEP.toml")).points[4].key != keys[4]
    assert Point.from_json(spec.points[2].to_json()) == spec.points[2]


@pytest.mark.parametrize("edit, expected", [
    (("hardware =", "hardwre ="), r"SWEEP\.toml:2: hardwre: unknown key"),
    (('plan = ["dp", "tp"]', "plan = []"), r"SWEEP\.toml:4: grid\.plan: empty list"),
    (("batch = [8, 16]", "batchsize = [8, 16]"), r"SWEEP\.toml:7: grid\.set\.batchsize: unknown --set key"),
    (('mesh = ["data=2,model=4"]', 'mesh = ["data=64,model=64"]'),
     r"SWEEP\.toml:5: grid\.mesh: mesh 'data=64,model=64' has 4096 devices, more than target 'cpu' has"),
    (('plan = ["dp", "tp"]', 'plan = ["dp", "nope"]'), r"SWEEP\.toml:4: grid\.plan: plan 'nope' is not a preset"),
    (('model = "mlp-tiny"', 'model = "mlp-huge"'), r"SWEEP\.toml:1: model: unknown preset 'mlp-huge'"),
    (('[grid]\nplan = ["dp", "tp"]\nmesh = ["data=2,model=4"]\n[grid.set]\nbatch = [8, 16]\n', "[grid]\n"),
     r"SWEEP\.toml:3: \[grid\]: empty grid"),
    (('hardware = "h100-sxm"', 'hardware = "h100-sxm"\ntarget = "warp-drive"'),
     r"SWEEP\.toml:3: target: 'warp-drive': unknown target; expected one of cpu, "),
])
def test_bad_sweep_file_is_one_line_naming_file_and_key(tmp_path, capsys, edit, expected):
    import re

    from jaxmove.cli import main

    path = tmp_path / "SWEEP.toml"
    assert edit[0] in GRID
    path.write_text(GRID.replace(edit[0], edit[1]))
    with pytest.raises(SweepSpecError, match=expected):
        load_sweep(path)
    assert main(["sweep", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"jaxmove: error: {path}:"), err
    assert re.search(expected, err[0])


def test_bad_result_file_and_arguments(tmp_path):
    from jaxmove.sweep import SweepError, sweep

    spec = parse_sweep(GRID, str(tmp_path / "SWEEP.toml"))
    with pytest.raises(ResultFileError, match="unknown result format '.csv'"):
        sweep(spec, output=tmp_path / "r.csv")
    (tmp_path / "r.jsonl").write_text('{"key": "x", "status": "ok"}\n')
    with pytest.raises(ResultFileError, match="exists; pass --resume"):
        sweep(spec, output=tmp_path / "r.jsonl")
    with pytest.raises(SweepError, match="--resume needs"):
        sweep(spec, resume=True)
    with pytest.raises(SweepError, match="--executor 'slurm'"):
        sweep(spec, executor="slurm")


def test_result_file_survives_a_cut_last_line(tmp_path):
    from jaxmove.sweep.store import ResultStore

    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"key": "a", "status": "ok", "est_time_s": 1.5}) + '\n{"key": "b", "sta')
    store = ResultStore(path, resume=True)
    assert list(store.rows) == ["a"] and "incomplete last line" in store.notes[0]
    store.add({"key": "c", "status": "error"})
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["a", "c"]


def test_ranking_and_pareto_front():
    from jaxmove.sweep import SweepResult

    def row(key, t, m, fits=True, status="ok"):
        return {"key": key, "status": status, "fits": fits, "est_time_s": t, "peak_bytes": m}

    rows = [row("slow-small", 3.0, 10), row("fast-big", 1.0, 100), row("dominated", 2.0, 200),
            row("fastest-no-fit", 0.5, 1000, fits=False), row("failed", None, None, None, "error"),
            row("mid", 2.0, 50)]
    res = SweepResult("t", "t.toml", rows)
    assert [r["key"] for r in res.rows] == ["fast-big", "mid", "dominated", "slow-small",
                                            "fastest-no-fit", "failed"]
    assert res.best["key"] == "fast-big"
    assert {r["key"] for r in res.rows if r["pareto"]} == {"fastest-no-fit", "fast-big", "mid", "slow-small"}


def test_text_table_says_which_points_shard_nothing():
    """A point whose plan shards nothing over its mesh (every device holds the whole program)
    gets that note under the text table (README: sweep reports it); other per-point notes stay
    in --json / -o / --html."""
    from rich.console import Console

    from jaxmove.plans.compare import SHARDS_NOTHING
    from jaxmove.sweep import SweepResult
    from jaxmove.sweep.render import render_table

    nothing = f"plan tp {SHARDS_NOTHING} over mesh data=3 (...)"
    rows = [{"key": "a", "status": "ok", "fits": True, "est_time_s": 1.0, "peak_bytes": 10,
             "model": "mlp-tiny", "overrides": {}, "mesh": "data=3", "plan": "tp",
             "notes": [nothing, "embed (32) of the parameters is not divisible by data=3: kept replicated over data"]},
            {"key": "b", "status": "ok", "fits": True, "est_time_s": 2.0, "peak_bytes": 10,
             "model": "mlp-tiny", "overrides": {}, "mesh": "data=2", "plan": "tp", "notes": []}]
    con = Console(record=True, width=250)
    render_table(SweepResult("t", "t.toml", rows), console=con)
    text = con.export_text()
    assert text.count(SHARDS_NOTHING) == 1 and nothing in text
    assert "kept replicated" not in text


# ---- one point at a time through the API (the reference) ----------------------------------

_REFERENCE = textwrap.dedent(f"""
    import json, sys
    from jaxmove.api import analyze
    from jaxmove.plans import capture_with_plan, compare_plans, ensure_cpu_devices, load_plan
    assert ensure_cpu_devices(8)
    out = {{}}
    for batch in {BATCHES!r}:
        cmp = compare_plans("mlp-tiny", {MESH!r}, {list(PLANS)!r}, {{"batch": str(batch)}}, {HW!r})
        for r in cmp.results:
            report = analyze(capture_with_plan("mlp-tiny", {{"batch": str(batch)}}, load_plan(r.plan),
                                               {MESH!r}), hardware={HW!r})
            t = report.totals
            out[f"{{r.plan}}/{{batch}}"] = dict(
                peak_bytes=r.peak_bytes, fits=r.fits, argument_bytes=r.argument_bytes,
                temp_bytes=r.temp_bytes, hbm_bytes=r.hbm_bytes, flops=r.flops, wire_bytes=r.wire_bytes,
                wire_bytes_by_kind=r.wire_bytes_by_kind, collective_time_s=r.collective_time_s,
                est_time_s=report.times.est_time_s, bound=report.times.bound,
                weights_bytes=sum(t.role_bytes("weights")), hbm_bytes_by_role_total=t.hbm_bytes,
                excess_bytes=getattr(getattr(report, "excess", None), "excess_bytes", None))
    json.dump(out, sys.stdout)
""")


@pytest.fixture(scope="module")
def reference():
    env = cpu_devices_env(8, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _REFERENCE], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    from jaxmove import sweep

    d = tmp_path_factory.mktemp("sweep")
    (d / "SWEEP.toml").write_text(GRID)
    out = d / "results.parquet"
    arrived = []
    res = sweep(d / "SWEEP.toml", jobs=2, output=out, timeout_s=300, on_row=lambda r: arrived.append(
        len(__import__("pyarrow.parquet", fromlist=["x"]).read_table(out))))
    return res, out, arrived


def _by_point(result) -> dict:
    return {f"{r['plan']}/{r['overrides']['batch']}": r for r in result.rows}


def test_local_sweep_equals_points_run_one_by_one(local_sweep, reference):
    res, _, _ = local_sweep
    rows = _by_point(res)
    assert sorted(rows) == sorted(reference) and len(rows) == 4
    for name, ref in reference.items():
        row = rows[name]
        assert row["status"] == "ok" and row["error"] is None, row
        for k in ("peak_bytes", "fits", "argument_bytes", "temp_bytes", "hbm_bytes", "flops", "wire_bytes",
                  "wire_bytes_by_kind", "collective_time_s", "est_time_s", "bound"):
            assert row[k] == ref[k], (name, k, row[k], ref[k])
        assert row.get("excess_bytes") == ref["excess_bytes"]  # present when jaxmove has the pass
        assert row["hbm_bytes_by_role"]["weights"] == ref["weights_bytes"]
        assert sum(row["hbm_bytes_by_role"].values()) == ref["hbm_bytes_by_role_total"]
        assert row["num_devices"] == 8 and row["mesh"] == "data=2,model=4" and row["target"] == "cpu"
        assert row["compile_s"] > 0 and row["attempts"] == 1
    # independent closed forms (module docstring)
    for batch in BATCHES:
        for plan in PLANS:
            row = rows[f"{plan}/{batch}"]
            assert row["hbm_bytes_by_role"]["weights"] == _weights_bytes(plan)
            rows_per_device = batch // 8 if plan == "dp" else batch // MESH["data"]
            assert row["argument_bytes"] == _weights_bytes(plan) + rows_per_device * 32 * 4
        assert rows[f"dp/{batch}"]["wire_bytes_by_kind"] == {}
        assert rows[f"tp/{batch}"]["wire_bytes_by_kind"] == {"all-reduce": _all_reduce_wire_bytes(batch)}


def test_local_sweep_outputs(local_sweep, tmp_path):
    import pyarrow.parquet as pq

    from jaxmove.sweep.store import unflatten_row

    res, out, arrived = local_sweep
    # written as each point arrived, one more row each time
    assert arrived == [1, 2, 3, 4]
    stored = {r["key"]: unflatten_row(r) for r in pq.read_table(out).to_pylist()}
    for r in res.rows:
        s = stored[r["key"]]
        assert {k: s[k] for k in s if k in r} == {k: r[k] for k in s if k in r}
    # ranked: fastest that fits first
    times = [r["est_time_s"] for r in res.rows]
    assert all(r["fits"] for r in res.rows) and times == sorted(times) and res.best is res.rows[0]
    # JSON: stable keys; DataFrame: flat columns, integer --set values
    js = res.to_json()
    assert set(js) == {"sweep", "counts", "points"} and js["counts"]["ok"] == 4
    from jaxmove.sweep.point import ROW_KEYS
    assert all(set(ROW_KEYS) | {"rank", "pareto"} <= set(p) for p in js["points"])
    json.dumps(js)
    df = res.to_dataframe()
    assert list(df["rank"]) == [1, 2, 3, 4] and str(df["set.batch"].dtype) == "Int64"
    # XLA:CPU's programs costed on an H100 spec: the ranking is XLA:CPU's, and the sweep says so
    assert [n for n in res.notes if "programs costed on" in n] == [
        "4 point(s) are XLA:CPU programs costed on h100-sxm: their step times and ranking are of "
        "XLA:CPU's kernels and launches as compiled, not h100-sxm's program; give the points "
        'target = "h100-sxm" (compiled without the device) to rank the accelerator\'s programs']
    # the mesh as plans --json gives it ({axis: size}), and as integer columns
    assert all(p["mesh_axes"] == {"data": 2, "model": 4} for p in js["points"])
    assert list(df["mesh.data"]) == [2] * 4 and list(df["mesh.model"]) == [4] * 4
    assert list(df["wire_bytes.all-reduce"].fillna(0)) == [r["wire_bytes_by_kind"].get("all-reduce", 0)
                                                          for r in res.rows]
    # HTML page: self-contained, escaped; the Pareto plot as inline SVG
    import dataclasses
    page = dataclasses.replace(res, name="<script>alert(1)</script>").to_html()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)" in page
    assert "<svg" in page and page.count("<script>") == 1            # the page's own script only
    assert not any(s in page for s in ("src=", 'href="http', "url(http", "@import"))
    assert page.count("<tr>") == 1 + 4
    # the terminal table: every point ranked, with the excess column when rows have it
    from rich.console import Console

    from jaxmove.sweep.render import render_table
    con = Console(record=True, width=250)
    render_table(res, console=con)
    text = con.export_text()
    for r in res.rows:
        assert f"mlp-tiny batch={r['overrides']['batch']} data=2,model=4 {r['plan']}" in text
    assert ("excess" in text) == ("excess_bytes" in res.rows[0])
    from jaxmove.units import human_bytes
    for r in res.rows:  # excess and its share of the bytes compiled, as plans shows it
        if r.get("excess_bytes") is not None:
            n, c = r["excess_bytes"], r["compulsory_bytes"]
            assert f"{human_bytes(n)} ({100 * n / (n + c):.0f}%)" in text
    res.pareto_plot(path=tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# ---- ray ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'jaxmove[ray]'; the "
                                            "test extra installs it)")
    import warnings
    with warnings.catch_warnings():  # jax warns about any fork; ray's processes fork + exec
        warnings.simplefilter("ignore", RuntimeWarning)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def test_ray_sweep_gives_the_same_rows(ray_instance, local_sweep, tmp_path):
    from jaxmove import sweep

    res, _, _ = local_sweep
    (tmp_path / "SWEEP.toml").write_text(GRID.replace("batch = [8, 16]", "batch = [8]"))  # 2 of the 4
    got = sweep(tmp_path / "SWEEP.toml", executor="ray", timeout_s=300, output=tmp_path / "r.jsonl")
    assert got.executor == "ray" and ray_instance.is_initialized()  # it used the running instance
    assert len(got.rows) == 2 and all(r["status"] == "ok" for r in got.rows)
    local = {r["key"]: r for r in res.rows}
    skip = {"compile_s", "analysis_s", "wall_s", "rank", "pareto"}
    for b in got.rows:
        a = local[b["key"]]                                          # the same key: the same point
        assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


def test_ray_task_failures_are_retried_then_reported(ray_instance, tmp_path, monkeypatch):
    # the Ray task itself fails (not the worker process it would start): one point's task
    # raises, the other's process dies; each is retried once, then reported as died
    import os

    from jaxmove import sweep
    from jaxmove.sweep import executors

    calls = tmp_path / "calls"
    calls.mkdir()

    def broken_task(point_json, timeout_s=None):  # a closure: Ray ships it by value
        (calls / f"{point_json['plan']}.{len(list(calls.iterdir()))}").write_text("")
        if point_json["plan"] == "dp":
            raise RuntimeError("boom in the task")
        os._exit(3)

    monkeypatch.setattr(executors, "run_point_process", broken_task)
    (tmp_path / "SWEEP.toml").write_text(GRID.replace("batch = [8, 16]", "batch = [8]"))
    got = sweep(tmp_path / "SWEEP.toml", executor="ray", timeout_s=120, output=tmp_path / "r.jsonl")
    rows = {r["plan"]: r for r in got.rows}
    assert set(rows) == {"dp", "tp"}
    assert all(r["status"] == "died" and r["attempts"] == 2 and r["est_time_s"] is None for r in rows.values())
    assert rows["dp"]["error"].startswith("ray task failed: RayTaskError") and "boom in the task" in rows["dp"]["error"]
    assert rows["tp"]["error"].startswith("ray task failed: ")
    assert sorted(p.name.split(".")[0] for p in calls.iterdir()) == ["dp", "dp", "tp", "tp"]
    stored = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted(r["status"] for r in stored if "status" in r) == ["died", "died"]


# ---- retry, report, resume ------------------------------------------------------------------

_FLAKY = textwrap.dedent("""
    import os, signal, time
    from pathlib import Path
    import jax, jax.numpy as jnp
    from jaxmove.workload import Workload

    def _attempt(name):
        counter = Path(__file__).with_name(name + ".count")
        n = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(n + 1))
        return n

    def _workload():
        return Workload("double", lambda x: x * 2, (jax.ShapeDtypeStruct((256,), jnp.float32),),
                        ("activations",))

    def dies_twice():            # the first two worker processes are killed
        if _attempt("dies") < 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return _workload()

    def hangs_once():            # the first worker process runs past the timeout
        if _attempt("hangs") < 1:
            time.sleep(120)
        return _workload()
""")


def test_dead_and_hung_workers_retry_once_then_report_and_resume(tmp_path):
    from jaxmove import sweep

    TIMEOUT_S = 10

    (tmp_path / "flaky.py").write_text(_FLAKY)
    (tmp_path / "SWEEP.toml").write_text(textwrap.dedent("""
        [[points]]
        model = "flaky.py:dies_twice"
        [[points]]
        model = "flaky.py:hangs_once"
    """))
    out = tmp_path / "r.jsonl"
    # the hanging attempt costs its start-up and the whole timeout (a sleep: wall time, no CPU).
    # The timeout counts from the worker's READY line (Python, jax and jaxmove imported), so a
    # slow start-up on a loaded machine (more than 15 s once, at a load average of 8) cannot
    # turn 'died' into 'timeout'; the point's own work here (x * 2 traced, compiled, analysed)
    # takes well under a second
    first = sweep(tmp_path / "SWEEP.toml", jobs=2, timeout_s=TIMEOUT_S, output=out)
    rows = {r["model"].rsplit(":", 1)[-1]: r for r in first.rows}
    died, hung = rows["dies_twice"], rows["hangs_once"]
    assert died["status"] == "died" and died["attempts"] == 2 and "SIGKILL" in died["error"]
    assert hung["status"] == "ok" and hung["attempts"] == 2            # the retry finished it
    assert hung["hbm_read_bytes"] == 256 * 4 and hung["hbm_write_bytes"] == 256 * 4
    assert first.rows[-1] is died and "retried once" in first.notes[0]
    assert (tmp_path / "dies.count").read_text() == "2" and (tmp_path / "hangs.count").read_text() == "2"
    # resume: only the point whose worker died runs again (its third process succeeds)
    new_rows = []
    second = sweep(tmp_path / "SWEEP.toml", jobs=2, timeout_s=TIMEOUT_S, output=out, resume=True,
                   on_row=new_rows.append)
    assert [r["model"].rsplit(":", 1)[-1] for r in new_rows] == ["dies_twice"]
    assert second.resumed == 1 and all(r["status"] == "ok" for r in second.rows)
    assert (tmp_path / "hangs.count").read_text() == "2"                 # not compiled again
    again = {r["key"]: r for r in second.rows}
    ranked = ("rank", "pareto")                                           # depend on the other rows
    assert {k: v for k, v in again[hung["key"]].items() if k not in ranked} == \
        {k: v for k, v in hung.items() if k not in ranked}                # read back unchanged


# ---- a compile target: XLA:TPU without the device --------------------------------------------

def _libtpu():
    import importlib.util
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install 'jaxmove[tpu]'; the test extra installs it)")


def test_tpu_target_points_equal_plans_and_a_refused_compile_is_a_result(tmp_path):
    """tp on tpu-v5e:2x2 (data=2 x model=2): one all-reduce per layer of the [B/2, 32] f32
    block output over n=2 chips, ring wire bytes 2 (n-1)/n * B/2*32*4 per layer; the same MLP
    with d_model = d_ff = 32768 needs 2 * 2 * 32768^2 * 4 B = 16 GiB of weights per chip under
    dp, more than a v5e chip's HBM: XLA:TPU refuses it, and that is the point's result."""
    _libtpu()
    from jaxmove import sweep
    from jaxmove.api import analyze
    from jaxmove.plans import capture_with_plan, compare_plans, load_plan

    tgt, mesh = "tpu-v5e:2x2", {"data": 2, "model": 2}
    (tmp_path / "SWEEP.toml").write_text(textwrap.dedent(f"""
        model = "mlp-tiny"
        target = "{tgt}"
        mesh = "data=2,model=2"
        [[points]]
        plan = "tp"
        set = {{batch = 8}}
        [[points]]
        plan = "dp"
        set = {{batch = 8, d_model = 32768, d_ff = 32768}}
    """))
    res = sweep(tmp_path / "SWEEP.toml", jobs=2, timeout_s=300)
    fits, refused = res.rows
    assert fits["status"] == "ok" and refused["status"] == "ok", (fits["error"], refused["error"])
    assert fits["target"] == tgt and fits["hardware"] == "tpu-v5e" and fits["backend"] == "tpu"
    ref = compare_plans("mlp-tiny", mesh, ["tp"], {"batch": "8"}, target=tgt).results[0]
    report = analyze(capture_with_plan("mlp-tiny", {"batch": "8"}, load_plan("tp"), mesh, target=tgt),
                     hardware="tpu-v5e")
    for k in ("fits", "peak_bytes", "hbm_bytes", "wire_bytes", "wire_bytes_by_kind"):
        assert fits[k] == getattr(ref, k), k
    assert fits["est_time_s"] == report.times.est_time_s and fits["bound"] == report.times.bound
    assert fits["wire_bytes_by_kind"] == {"all-reduce": 2 * (2 * (2 - 1) * (8 // 2 * 32 * 4) // 2)}
    assert refused["status"] == "ok" and refused["error"] is None and refused["fits"] is False
    assert "RESOURCE_EXHAUSTED" in refused["does_not_fit"]
    assert refused["needs_bytes"] >= 2 * 2 * 32768 ** 2 * 4 > refused["has_bytes"]
    assert not any("programs costed on" in n for n in res.notes)   # XLA:TPU's on a TPU spec


def test_mesh_larger_than_a_tpu_target_names_file_and_key(tmp_path):
    _libtpu()
    path = tmp_path / "SWEEP.toml"
    path.write_text(GRID.replace('hardware = "h100-sxm"', 'target = "tpu-v5e:2x2"')
                    .replace('mesh = ["data=2,model=4"]', 'mesh = ["data=2,model=2", "data=8"]'))
    with pytest.raises(SweepSpecError, match=r"SWEEP\.toml:5: grid\.mesh: mesh 'data=8' has 8 devices, "
                                             r"more than target 'tpu-v5e:2x2' has \(4 devices\)"):
        load_sweep(path)
    spec = load_sweep(path.write_text(GRID.replace('hardware = "h100-sxm"', 'target = "tpu-v5e:2x4"'))
                      and path)
    assert {p.target for p in spec.points} == {"tpu-v5e:2x4"} and spec.points[0].hardware == "tpu-v5e"


def test_cli_resume_of_a_finished_sweep_compiles_nothing(local_sweep, tmp_path, capsys):
    from jaxmove.cli import main

    res, out, _ = local_sweep
    html, plot = tmp_path / "s.html", tmp_path / "s.svg"
    assert main(["sweep", str(out.parent / "SWEEP.toml"), "-o", str(out), "--resume", "--json",
                 "--no-progress", "--html", str(html), "--plot", str(plot)]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["sweep"]["resumed"] == 4 and js["counts"]["ok"] == 4
    assert [p["key"] for p in js["points"]] == [r["key"] for r in res.rows]
    assert [p["est_time_s"] for p in js["points"]] == [r["est_time_s"] for r in res.rows]
    assert html.read_text().startswith("<!DOCTYPE html>") and "<svg" in plot.read_text()
    # without --resume an existing result file is not overwritten; said first, before the
    # sweep's own header line (a user trial saw the header, then the error)
    assert main(["sweep", str(out.parent / "SWEEP.toml"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists; pass --resume" in err[0]


def test_a_point_over_the_specs_capacity_gives_needs_and_has_bytes(tmp_path):
    """No compiler refused it (XLA:CPU checks no capacity), but its memory_analysis peak is over
    the spec's HBM: fits is false and needs/has are those two figures, as `plans --json` gives."""
    import dataclasses

    from jaxmove.hardware import load_spec
    from jaxmove.hardware.toml_write import write_spec
    from jaxmove.sweep.point import run_point
    from jaxmove.sweep.spec import Point

    small = dataclasses.replace(load_spec("cpu-generic"), name="cpu-1kb", hbm_capacity_bytes=1000)
    path = write_spec(small, tmp_path / "cpu-1kb.toml")
    row = run_point(Point("mlp-tiny", target="cpu", hardware=str(path)))
    assert row["status"] == "ok" and row["fits"] is False, row
    assert row["peak_bytes"] > 1000
    assert (row["needs_bytes"], row["has_bytes"]) == (row["peak_bytes"], 1000)
    assert row["does_not_fit"] is None  # (no compiler's refusal to quote)
    # XLA:CPU's program costed on a GPU spec: its temporaries are not the GPU's, arguments +
    # outputs - aliased decide (api.does_not_fit_note's rule)
    small = dataclasses.replace(load_spec("h100-sxm"), name="h100-1kb", hbm_capacity_bytes=1000)
    path = write_spec(small, tmp_path / "h100-1kb.toml")
    row = run_point(Point("mlp-tiny", target="cpu", hardware=str(path)))
    assert row["status"] == "ok" and row["fits"] is False, row
    need = row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"]
    assert (row["needs_bytes"], row["has_bytes"]) == (need, 1000)
    assert need < row["peak_bytes"]


def test_a_model_of_yours_that_plans_would_refuse_is_refused_when_the_file_is_read(tmp_path):
    """A file.py model without logical axes (or returning no Workload) under a plan: `plans`
    refuses it before compiling; a sweep compiled every point and stored the same PlanError in
    each row (exit 1, a user trial). Now one error naming the file's line, nothing compiled."""
    (tmp_path / "wl.py").write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp
        from jaxmove.workload import Workload
        def noaxes():
            w = jax.ShapeDtypeStruct((64, 64), jnp.float32)
            return Workload("noaxes", lambda w, x: x @ w, (w, w), ("weights", "activations"))
        def withaxes():
            w = jax.ShapeDtypeStruct((64, 64), jnp.float32)
            return Workload("withaxes", lambda w, x: x @ w, (w, w), ("weights", "activations"),
                            logical_axes=(("embed", "mlp"), ("batch", "embed")))
        def notaworkload():
            return {"w": 1}
    """))
    for fn, want in (("noaxes", "names no logical axes"), ("notaworkload", "returned a dict")):
        text = f'[grid]\nmodel = ["wl.py:{fn}"]\nplan = ["dp"]\nmesh = ["data=2"]\n'
        with pytest.raises(SweepSpecError, match=rf"SWEEP.toml:2: grid.model: .*wl.py:{fn}'?: .*{want}"):
            parse_sweep(text, str(tmp_path / "SWEEP.toml"), tmp_path)
    ok = '[grid]\nmodel = ["wl.py:withaxes"]\nplan = ["dp"]\nmesh = ["data=2"]\n'
    assert len(parse_sweep(ok, str(tmp_path / "SWEEP.toml"), tmp_path).points) == 1
    # without a plan no axes are needed: a single-device point of the same model reads fine
    single = '[grid]\nmodel = ["wl.py:noaxes"]\n'
    assert len(parse_sweep(single, str(tmp_path / "SWEEP.toml"), tmp_path).points) == 1


@pytest.mark.parametrize("args, expected", [
    (["-o", "{tmp}/nodir/r.jsonl"], "directory {tmp}/nodir does not exist"),
    (["-o", "{tmp}/r.txt"], "unknown result format '.txt'; expected .parquet or .jsonl"),
    (["--resume"], "--resume needs the result file of the sweep to continue (-o FILE)"),
])
def test_bad_result_file_is_said_before_the_sweeps_first_line(tmp_path, capsys, args, expected):
    # a user trial: these printed "jaxmove: sweep sw: 1 points, local executor" first, then the
    # error (the README: output files are checked before any work)
    from jaxmove.cli import main
    f = tmp_path / "sw.toml"
    f.write_text('name = "sw"\nmodel = "mlp-tiny"\n[grid]\nhardware = ["h100-sxm"]\n')
    rc = main(["sweep", str(f)] + [a.format(tmp=tmp_path) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert expected.format(tmp=tmp_path) in err[0]
