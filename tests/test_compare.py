"""compare: error statistics, Spearman, the overhead/bandwidth/peak fit, and the CLI.

Statistics and the fit are checked on hand-made estimates and measurements (values worked
out by hand or generated from known coefficients); the CLI runs real programs but asserts
only on structure and coverage, never on speed.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from jaxmove.cli import main
from jaxmove.hardware import load_spec
from jaxmove.measure.compare import _nnls_small, error_stats, fit_spec, spearman
from jaxmove.measure.profile import InstructionTiming, ProfileJoin
from jaxmove.measure.run import Measurement


def test_spearman_by_hand():
    # d = (0, 1, 1, 0): rho = 1 - 6 * 2 / (4 * (16 - 1)) = 0.8
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    # ties: ranks (1.5, 1.5, 3) vs (1, 2, 3) -> 1.5 / sqrt(1.5 * 2)
    assert spearman([5, 5, 9], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3.0))
    assert spearman([1], [2]) is None and spearman([1, 1], [1, 2]) is None


def test_nnls_small_clamps_negative_coefficients():
    A = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # the unconstrained solution of A x = (1, -1, 0) is (1, -1); NNLS sets x2 = 0 and fits
    # x1 alone: column (1, 0, 1) against (1, -1, 0) gives x1 = (1 + 0 + 0) / 2 = 0.5
    x = _nnls_small(A, np.array([1.0, -1.0, 0.0]))
    assert x == pytest.approx([0.5, 0.0])


def _measurement(times_s: dict, wall_s: float = 1.0) -> Measurement:
    instrs = {k: InstructionTiming(k[0], k[1], "fusion", t, 1, (t,)) for k, t in times_s.items()}
    total = sum(times_s.values())
    prof = ProfileJoin("m", 1, instrs, total, total, {}, total, total)
    program = SimpleNamespace(name="p", source="test")
    return Measurement(program, "cpu", "cpu", 0, (wall_s,), prof)


def _times(est: dict, program_s: float):
    rows = {k: SimpleNamespace(est_time_s=v, **extra) for k, (v, extra) in est.items()}
    return SimpleNamespace(rows=rows, est_time_s=program_s)


def test_error_stats_by_hand():
    meas = {("e", "a"): 50.0, ("e", "b"): 30.0, ("e", "c"): 19.5, ("e", "d"): 0.5}
    est = {("e", "a"): (60.0, {}), ("e", "b"): (15.0, {}), ("e", "c"): (19.5, {}),
           ("e", "d"): (5.0, {}), ("e", "x"): (7.0, {})}   # x never ran: not in the statistics
    s = error_stats(_times(est, 120.0), _measurement(meas, wall_s=100.0))
    assert s.n_measured == 4
    assert s.n_significant == 3            # d is 0.5% of the 100 s measured
    # APE: a 10/50 = 0.2, b 15/30 = 0.5, c 0 -> median 0.2
    assert s.mdape == pytest.approx(0.2)
    # time-weighted over all four: (10 + 15 + 0 + 4.5) / 100
    assert s.weighted_error == pytest.approx(0.295)
    # ranks over a, b, c: est (3, 1, 2) vs meas (3, 2, 1): d^2 = 0 + 1 + 1 -> 1 - 12/24
    assert s.spearman == pytest.approx(0.5)
    assert s.program_error == pytest.approx(0.2)
    assert s.est_sum_s == pytest.approx(99.5) and s.measured_sum_s == pytest.approx(100.0)


def test_fit_recovers_known_overhead_bandwidth_and_peak():
    spec = load_spec("cpu-generic")
    a, beta, gamma = 2e-6, 1.7, 4.0     # true overhead, 1/bandwidth scale, 1/peak scale
    rng = np.random.default_rng(0)
    est, meas = {}, {}
    for i in range(12):
        launches = float(rng.integers(1, 4))
        mem = float(rng.uniform(1e-6, 5e-5))
        comp = float(rng.uniform(1e-6, 5e-5))
        key = ("e", f"k{i}")
        est[key] = (0.0, dict(overhead_s=launches * spec.kernel_launch_overhead_s, memory_time_s=mem,
                              compute_time_s=comp, network_time_s=0.0))
        meas[key] = a * launches + max(beta * mem, gamma * comp)
    fitted, info = fit_spec(_times(est, 0.0), _measurement(meas), spec, "synthetic")
    assert info["kept"] == ()
    assert fitted.kernel_launch_overhead_s == pytest.approx(a, rel=1e-6)
    assert fitted.hbm_bytes_per_s == pytest.approx(spec.hbm_bytes_per_s / beta, rel=1e-6)
    assert fitted.flops_per_s["f32"] == pytest.approx(spec.flops_per_s["f32"] / gamma, rel=1e-6)
    assert "jaxmove compare --fit" in fitted.source("hbm_bytes_per_s")


def test_fit_needs_three_instructions():
    spec = load_spec("cpu-generic")
    est = {("e", "a"): (1.0, dict(overhead_s=1e-6, memory_time_s=1.0, compute_time_s=0.0, network_time_s=0.0))}
    with pytest.raises(ValueError, match="at least 3"):
        fit_spec(_times(est, 1.0), _measurement({("e", "a"): 1.0}), spec, "p")


# ----------------------------------------------------------------------------- CLI (real runs)

@pytest.fixture
def no_local_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXMOVE_CACHE_DIR", str(tmp_path / "cache"))


def test_cli_compare_json_and_save_fit(tmp_path, capsys, no_local_spec):
    out = tmp_path / "fit.toml"
    rc = main(["compare", "mlp-tiny", "--runs", "2", "--warmup", "1", "--profile-runs", "2",
               "--json", "--fit", "--save-fit", str(out)])
    assert rc == 0
    js = json.loads(capsys.readouterr().out)
    assert js["hardware"] == "cpu-generic"          # no calibrated spec: the device kind's built-in
    assert js["measurement"]["profile"]["coverage"] >= 0.95
    assert len(js["instructions"]) == 8             # 2 layers x 4 kernel-level fusions
    assert {"est_time_s", "measured_time_s", "ratio"} <= set(js["instructions"][0])
    # each row says what the instruction is and moves (shape, flops, HBM bytes per run, as
    # `jaxmove analyze --json`; a trial found compare's rows gave only times): mlp-tiny is
    # 32 -> 128 -> 32 at batch 4, f32, so each layer's up-projection dot does 2 x 4 x 32 x 128
    # flops reading x and W (4 x 32 + 32 x 128 floats) and writing [4, 128]; the down one
    # reads [4, 128] and W (128 x 32) and writes [4, 32]
    rows = {(r["shape"], r["flops"], r["hbm_read_bytes"], r["hbm_write_bytes"]) for r in js["instructions"]}
    up = ("f32[4,128]", 2 * 4 * 32 * 128, (4 * 32 + 32 * 128) * 4, 4 * 128 * 4)
    down = ("f32[4,32]", 2 * 4 * 128 * 32, (4 * 128 + 128 * 32) * 4, 4 * 32 * 4)
    assert {up, down} <= rows, rows
    assert sum((r["shape"], r["flops"], r["hbm_read_bytes"], r["hbm_write_bytes"]) in (up, down)
               for r in js["instructions"]) == 4   # two layers
    assert {"mdape", "weighted_error", "spearman", "program_error"} <= set(js["stats"])
    assert {"before", "after"} <= set(js["fit"])
    spec = load_spec(str(out))
    assert spec.name == "cpu-generic-fit"


def test_cli_compare_table_mlp_and_gpt2_decode(capsys, no_local_spec):
    # the mlp preset's bf16 MLP (4 layers, 25 kernel-level instructions: more rows than the top
    # 20 the table lists) at batch 8 and d_ff 2048: its full size (batch 128, d_ff 8192) ran
    # 34 GFLOP of bf16 dots per run on the CPU, three runs for the same table (10 s -> 2.5 s)
    assert main(["compare", "mlp", "--set", "batch=8", "--set", "d_ff=2048", "--runs", "1", "--warmup", "1",
                 "--profile-runs", "1"]) == 0
    text = capsys.readouterr().out
    assert "MdAPE" in text and "Spearman" in text and "joined to instructions" in text
    # GPT-2 small's width, heads and bf16, with 2 layers, a 4096-token vocabulary and a 128-token
    # cache: the table's code paths for a decode step, without running 77 MB of embedding on CPU
    assert main(["compare", "gpt2-small-decode", "--set", "layers=2", "--set", "vocab=4096",
                 "--set", "seq_len=128", "--runs", "1", "--warmup", "1",
                 "--profile-runs", "1", "--hardware", "cpu-generic"]) == 0
    assert "gpt2-small-decode" in capsys.readouterr().out


def test_cli_compare_hlo_file_is_bad_input(tmp_path, capsys):
    p = tmp_path / "m.hlo"
    p.write_text("HloModule m\nENTRY %e () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}\n")
    assert main(["compare", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be run" in err[0]
    assert main(["compare", "mlp-tiny", "--save-fit", "x.toml"]) == 2
    capsys.readouterr()
    # a fitted spec is TOML and --hardware reads it by its .toml name: fit.json could not be
    # read back (a user trial: rc 0, then 'unknown hardware fit.json')
    assert main(["compare", "mlp-tiny", "--fit", "--save-fit", str(tmp_path / "fit.json")]) == 2
    err = capsys.readouterr().err
    assert "ending in .toml" in err and not (tmp_path / "fit.json").exists()


def test_compare_of_a_loop_of_unknown_trip_count_says_at_least_and_keeps_it_out(no_local_spec):
    """A fori_loop whose bound is an argument: its body is counted once, so the program
    estimate is a lower bound ('at least', ``complete`` False) and the body's instructions and
    the while itself (control flow, estimated 0) are left out of the error statistics with
    the reason (a user trial found neither said)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from jaxmove.measure.compare import compare

    def step(w, x, n):
        return lax.fori_loop(0, n, lambda i, c: jnp.tanh(c @ w), x)

    w, x = jnp.ones((64, 64), jnp.float32) * 0.01, jnp.ones((8, 64), jnp.float32)
    c = compare(jax.jit(step), w, x, jnp.int32(3), runs=2, warmup=1, profile_runs=1, hardware="cpu-generic")
    assert c.stats.est_is_lower_bound and not c.report.complete
    why = {r.name: r.excluded for r in c.rows if r.excluded}
    loop = [r for r in c.report.rows if r.instr.opcode == "while"]
    assert len(loop) == 1 and why[loop[0].instr.name] == "control flow (its time is its body's)"
    body = [r.instr.name for r in c.report.rows if r.multiplicity.unknown_trip_count and r.instr.opcode == "fusion"]
    assert body and all(why[n] == "in a while loop of unknown trip count (counted once)" for n in body)
    measured_out = sum(1 for r in c.rows if r.excluded and r.measured_time_s)
    assert c.stats.n_excluded == measured_out >= 1
    js = c.to_json()
    assert js["complete"] is False and "unknown trip count" in js["incomplete"]
    assert {r["name"] for r in js["instructions"] if r["excluded"]} == set(why)
