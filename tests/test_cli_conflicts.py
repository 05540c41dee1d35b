"""Conflicting or impossible inputs a user trial found accepted: each is one line
``jaxmove: error: ...`` with exit status 2 (no traceback, no output file), before anything
compiles where it can be; ``plans`` exits 1 when every plan failed.

1. an ``--xla-option`` value XLA:TPU refuses ("Failed to parse 'maybe' into flag ...")
2. ``plans`` where every plan fails alike (an ``--xla-option`` error, bad logical axes), or fails
3. a SWEEP.toml whose ``hardware`` is another accelerator than its ``target``
4. two output options naming one file
5. ``sweep --resume --overwrite``; ``analyze --plan tp --plan dp``
6. ``--resume`` on a result file with a complete line that is not JSON
7. ``--mesh data=0`` / ``data=-2``
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from jaxmove.cli import main
from tests.conftest import run_side_by_side

_CLI = [sys.executable, "-P", "-c", "import sys; from jaxmove.cli import main; sys.exit(main(sys.argv[1:]))"]
_ENV = {**{k: v for k, v in os.environ.items() if k != "JAXMOVE_XLA_OPTIONS"}, "JAX_PLATFORMS": "cpu"}


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxmove: error: ") and "Traceback" not in err, err
    return lines[0]


def _run_main(argv, capsys) -> tuple[int, str, str]:
    """``main(argv)`` in this process: (status, stdout, stderr); argparse's exit is a status."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---- 1: an option value XLA:TPU refuses -----------------------------------------------------

def test_refused_option_is_named_whatever_the_compiler_says_it_with():
    from jaxmove.capture.targets import _refused_options
    opts = {"xla_tpu_enable_latency_hiding_scheduler": "maybe", "xla_other": "1"}
    tpu = "INVALID_ARGUMENT: Failed to parse 'maybe' into flag xla_tpu_enable_latency_hiding_scheduler: "
    assert _refused_options(tpu, opts) == {"xla_tpu_enable_latency_hiding_scheduler": "maybe"}
    assert _refused_options("No such compile option: 'xla_other'", opts) == {"xla_other": "1"}
    # an INVALID_ARGUMENT about the program, naming no option given, stays the compiler's error
    assert _refused_options("INVALID_ARGUMENT: bad sharding for parameter 0", opts) == {}
    assert _refused_options(tpu, {}) == {}


def test_tpu_option_value_xla_refuses_is_an_input_error(capsys):
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (the tpu extra)")
    rc, out, err = _run_main(["analyze", "mlp-tiny", "--target", "tpu-v5e:2x2", "--xla-option",
                              "xla_tpu_enable_latency_hiding_scheduler=maybe"], capsys)
    line = _one_error_line(err)
    assert rc == 2 and out == "", err
    assert line == ("jaxmove: error: --xla-option xla_tpu_enable_latency_hiding_scheduler=maybe: XLA "
                    "compiling for tpu-v5e:2x2 refused it: Failed to parse 'maybe' into flag "
                    "xla_tpu_enable_latency_hiding_scheduler")


# ---- 2: plans that all fail -----------------------------------------------------------------

_WORKLOADS = '''
import jax, jax.numpy as jnp
from jaxmove.workload import Workload

ARGS = (jax.ShapeDtypeStruct((64, 64), jnp.float32), jax.ShapeDtypeStruct((8, 64), jnp.float32))

def _f(w, x):
    return jnp.tanh(x @ w)

def arg_axes():      # three names for a 2-D weight: every plan fails alike
    return Workload("bad-arg", _f, ARGS, roles=("weights", "activations"),
                    logical_axes=(("embed", "mlp", "heads"), ("batch", "embed")))

def no_axes():
    return Workload("no-axes", _f, ARGS, roles=("weights", "activations"))

def out_axes():      # the output's axes are wrong: found per plan (they need a trace)
    return Workload("bad-out", _f, ARGS, roles=("weights", "activations"),
                    logical_axes=(("embed", "mlp"), ("batch", "embed")),
                    out_logical_axes=("batch", "mlp", "heads"))
'''


def test_plans_that_all_fail_alike_are_one_error_and_all_failed_exits_1(tmp_path):
    (tmp_path / "wl.py").write_text(_WORKLOADS)
    base = ["--mesh", "model=2", "--plan", "tp", "--plan", "dp", "--no-progress"]
    option, arg_axes, no_axes, out_axes = run_side_by_side(
        [_CLI + ["plans", "mlp-tiny", "--mesh", "model=2", "--plan", "tp", "--no-progress",
                 "--xla-option", "nonsense_flag=1"],
         _CLI + ["plans", "wl.py:arg_axes", *base],
         _CLI + ["plans", "wl.py:no_axes", *base],
         _CLI + ["plans", "wl.py:out_axes", *base]],
        capture_output=True, text=True, env=_ENV, cwd=tmp_path, timeout=300)
    # an --xla-option XLA refuses: no table of failed rows, one line, exit 2
    assert option.returncode == 2 and option.stdout == "", option.stderr
    assert _one_error_line(option.stderr) == ("jaxmove: error: --xla-option nonsense_flag=1: XLA compiling "
                                              "for cpu refused it: No such compile option: 'nonsense_flag'")
    # logical axes that fail every plan alike: refused before compiling
    assert arg_axes.returncode == 2 and arg_axes.stdout == "", arg_axes.stderr
    assert _one_error_line(arg_axes.stderr) == ("jaxmove: error: workload 'bad-arg': arg0: 3 logical axes "
                                                "('embed', 'mlp', 'heads') for shape (64, 64)")
    assert no_axes.returncode == 2 and "names no logical axes" in _one_error_line(no_axes.stderr)
    # every plan failed (found per plan): the table, then a line, exit 1 (as sweep's failed points)
    assert out_axes.returncode == 1, out_axes.stderr
    assert out_axes.stdout.count("failed: PlanError") == 2, out_axes.stdout
    last = out_axes.stderr.strip().splitlines()[-1]
    assert last.startswith("jaxmove: 2 of 2 plans failed (first: tp: PlanError: out: 3 logical axes")
    assert last.endswith("; exit status 1") and "Traceback" not in out_axes.stderr


# ---- 3: a sweep's hardware of another accelerator than its target ---------------------------

def test_sweep_refuses_a_spec_of_another_accelerator_than_the_target(tmp_path, capsys):
    if importlib.util.find_spec("libtpu") is not None:
        target, hardware = "tpu-v5e:2x2", "h100-sxm"
        msg = "hardware h100-sxm is a GPU spec, but target tpu-v5e:2x2 compiles the point for TPU"
    elif importlib.util.find_spec("jax_plugins.xla_cuda12") is not None:
        target, hardware = "h100-sxm", "tpu-v5e"
        msg = "hardware tpu-v5e is a TPU spec, but target h100-sxm:1x1x8 compiles the point for GPU"
    else:
        pytest.skip("neither libtpu nor the CUDA plugin is installed")
    from jaxmove.sweep import SweepSpecError, load_sweep
    path = tmp_path / "SWEEP.toml"
    path.write_text(f'model = "mlp-tiny"\nhardware = "{hardware}"\ntarget = "{target}"\n'
                    '[grid]\nplan = ["dp"]\nmesh = ["data=2"]\n')
    with pytest.raises(SweepSpecError) as e:
        load_sweep(path)
    shown = msg.removeprefix("hardware ")   # (after the key: "SWEEP.toml:2: hardware: h100-sxm is ...")
    assert str(e.value).startswith(f"{path}:2: hardware: {shown}: drop hardware"), str(e.value)
    rc, out, err = _run_main(["sweep", str(path), "-o", str(tmp_path / "r.jsonl")], capsys)
    assert rc == 2 and out == "" and shown in _one_error_line(err)
    assert not (tmp_path / "r.jsonl").exists()
    # the check analyze and plans make (the same words, their option names)
    from jaxmove.hardware import load_spec
    from jaxmove.plans import spec_target_mismatch
    plans = spec_target_mismatch(load_spec(hardware), target, "the plans")
    assert plans == "--" + msg.replace("target", "--target").replace("the point", "the plans") + \
        plans[plans.index(": drop"):] and ": drop --hardware (the target's own spec" in plans
    assert spec_target_mismatch(load_spec(hardware), "cpu") is None


# ---- 4: two outputs naming one file ---------------------------------------------------------

def test_two_outputs_naming_one_file_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "SWEEP.toml").write_text('model = "mlp-tiny"\n[grid]\nplan = ["dp"]\nmesh = ["data=2"]\n')
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "p.png", tmp_path / "link.png")
    cases = [
        (["sweep", "SWEEP.toml", "-o", "same.jsonl", "--html", "same.jsonl"], "-o and --html", "same.jsonl"),
        (["sweep", "SWEEP.toml", "--html", "p.png", "--plot", "sub/../p.png"], "--html and --plot", "p.png"),
        (["sweep", "SWEEP.toml", "--html", "link.png", "--plot", "p.png"], "--html and --plot", "p.png"),
        (["analyze", "mlp-tiny", "--hardware", "h100-sxm", "--html", "r.html", "--trace", "./r.html"],
         "--html and --trace", "r.html"),
        (["compare", "--profile", "nowhere.json", "--trace", "t.json", "--html", "t.json"],
         "--trace and --html", "t.json"),
    ]
    for argv, options, name in cases:
        rc, out, err = _run_main(argv, capsys)
        line = _one_error_line(err)
        assert rc == 2 and out == "", (argv, err)
        assert f"error: {options} name the same file (" in line and name in line, line
        assert line.endswith("give each output a file of its own"), line
    assert sorted(os.listdir(tmp_path)) == ["SWEEP.toml", "link.png", "sub"]   # nothing written
    from jaxmove.cli.common import check_distinct_outputs
    check_distinct_outputs([("-o", "a.jsonl"), ("--html", "a.html"), ("--plot", None), ("--json", "-")])


# ---- 5: options that exclude each other, or are taken once ---------------------------------

def test_resume_and_overwrite_exclude_each_other(tmp_path, capsys):
    rc, out, err = _run_main(["sweep", str(tmp_path / "S.toml"), "-o", "r.jsonl", "--resume",
                              "--overwrite"], capsys)
    assert rc == 2 and _one_error_line(err) == (
        "jaxmove: error: jaxmove sweep: argument --overwrite: not allowed with argument --resume "
        "(see jaxmove sweep --help)")
    from jaxmove.sweep import SweepError, sweep
    with pytest.raises(SweepError, match="--resume and --overwrite exclude each other"):
        sweep([], output=tmp_path / "r.jsonl", resume=True, overwrite=True)


@pytest.mark.parametrize("command", ["analyze", "annotate"])
def test_one_plan_and_one_mesh_per_analyze(command, capsys):
    rc, out, err = _run_main([command, "mlp-tiny", "--mesh", "model=2", "--plan", "tp", "--plan", "dp"],
                             capsys)
    assert rc == 2 and _one_error_line(err) == (
        f"jaxmove: error: jaxmove {command}: --plan given twice (tp and dp): this command takes one "
        f"(see jaxmove {command} --help)")
    rc, out, err = _run_main([command, "mlp-tiny", "--mesh", "model=2", "--mesh", "data=2"], capsys)
    assert rc == 2 and "--mesh given twice (model=2 and data=2)" in _one_error_line(err)
    # plans compares several
    from jaxmove.cli import build_parser
    assert build_parser().parse_args(["plans", "mlp-tiny", "--plan", "tp", "--plan", "dp"]).plan == ["tp", "dp"]


# ---- 6: --resume on a complete line that is not JSON -----------------------------------------

def test_resume_refuses_a_complete_line_that_is_not_json(tmp_path, capsys):
    from jaxmove.sweep.store import ResultFileError, ResultStore
    row = {"key": "k1", "status": "ok", "est_time_s": 1.0}
    out = tmp_path / "r.jsonl"
    for text, line in ((json.dumps(row) + "\nnot json\n", 2),
                       ("oops\n" + json.dumps(row) + "\n", 1)):
        out.write_text(text)
        with pytest.raises(ResultFileError, match=rf"r\.jsonl:{line}: not a JSON row \(.*\); the file "
                                                  "is left as it is"):
            ResultStore(out, resume=True)
        assert out.read_text() == text
        assert not (tmp_path / ".r.jsonl.lock").exists()
    # the CLI: before the sweep says anything
    (tmp_path / "SWEEP.toml").write_text('model = "mlp-tiny"\n[grid]\nplan = ["dp"]\nmesh = ["data=2"]\n')
    rc, stdout, err = _run_main(["sweep", str(tmp_path / "SWEEP.toml"), "-o", str(out), "--resume"], capsys)
    assert rc == 2 and stdout == "" and ":1: not a JSON row" in _one_error_line(err)
    assert out.read_text() == text
    # a last line without its newline is a write cut short: dropped, as before
    out.write_text(json.dumps(row) + "\n" + '{"key": "k2", "sta')
    with ResultStore(out, resume=True) as s:
        assert list(s.rows) == ["k1"] and "incomplete last line dropped" in s.notes[0]
    assert out.read_text() == json.dumps(row) + "\n"


# ---- 7: mesh sizes ---------------------------------------------------------------------------

@pytest.mark.parametrize("mesh,axis,size", [("data=0", "data", "0"), ("data=-2", "data", "-2"),
                                            ("data=2,model=0", "model", "0"), ("data=x", "data", "x")])
def test_mesh_sizes_must_be_positive_integers(mesh, axis, size, capsys):
    rc, out, err = _run_main(["analyze", "mlp-tiny", "--mesh", mesh, "--plan", "dp"], capsys)
    assert rc == 2 and _one_error_line(err) == (
        f"jaxmove: error: --mesh '{mesh}': the size of axis '{axis}' must be a positive integer "
        f"(the devices along it), got '{size}'")


def test_plans_exits_1_when_one_plan_of_several_failed(monkeypatch, capsys):
    # as sweep with a failed point: the table with every plan's row, then one stderr line, exit
    # 1 (before: exit 0 unless every plan failed, so a script missed the failed plan)
    import dataclasses

    import jaxmove.plans as plans_pkg
    from jaxmove.cli import main

    real = plans_pkg.compare_plans

    def one_fails(*a, **kw):
        cmp = real(*a, **kw)
        cmp.results[1] = dataclasses.replace(cmp.results[1], error="RuntimeError: boom")
        return cmp

    monkeypatch.setattr(plans_pkg, "compare_plans", one_fails)
    rc = main(["plans", "mlp-tiny", "--mesh", "model=1", "--plan", "tp", "--plan", "dp", "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "tp" in out and "boom" in out
    assert err.strip().splitlines()[-1] == "jaxmove: 1 of 2 plans failed (first: dp: RuntimeError: boom); exit status 1"
