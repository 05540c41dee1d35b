"""A new user's bad input: every mistake ends in exit status 2 and one line
``jaxmove: error: ...`` naming the file or argument; no traceback, no partial output file,
no silently wrong number. Also the wording fixes of the table/JSON found the same way."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from jaxmove import zoo as models
from jaxmove.cli import build_parser, main
from jaxmove.report.outputs import OutputPathError, check_output_path, write_text_atomic
from jaxmove.plans import (MAX_SIMULATED_DEVICES, PlanError, check_plan_mesh, parse_mesh,
                           parse_plan)

ROOT = Path(__file__).resolve().parents[1]

# `python -P`: do NOT put the current directory on sys.path (like the `jaxmove` script),
# so the tests see what an installed `jaxmove` does.
_CLI = [sys.executable, "-P", "-c", "import sys; from jaxmove.cli import main; sys.exit(main(sys.argv[1:]))"]


def run_cli(args, cwd=None):
    return subprocess.run(_CLI + list(args), capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("jaxmove: error: ") and "Traceback" not in err, err
    return lines[0]


# A tiny HLO module, counted by hand: parameter, constant, add, multiply, tuple.
# Kernel-level instructions (the JSON `instructions`): add, multiply = 2.
TINY_HLO = textwrap.dedent("""\
    HloModule tiny
    ENTRY e {
      p = f32[4]{0} parameter(0)
      c = f32[] constant(2)
      b = f32[4]{0} broadcast(c), dimensions={}
      a = f32[4]{0} add(p, p)
      m = f32[4]{0} multiply(a, b)
      ROOT t = (f32[4]{0}) tuple(m)
    }
    """)


@pytest.fixture
def tiny_hlo(tmp_path):
    path = tmp_path / "tiny.hlo"
    path.write_text(TINY_HLO)
    return path


# ---- 1. module:function targets ------------------------------------------------------------

USER_CODE = textwrap.dedent("""\
    import jax, jax.numpy as jnp
    def ret_lowered():
        return jax.jit(lambda x: x * 2).lower(jax.ShapeDtypeStruct((128,), jnp.float32))
    def ret_int():
        return 42
    def ret_none():
        return None
    def ret_fn():
        return lambda x: x
    def needs_arg(x):
        return x
    def raises():
        raise RuntimeError("boom inside user code")
    not_callable = 5
    """)


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """A directory with a fresh module (unique name: sys.modules caches imports) and a
    module with a syntax error; the test runs in that directory."""
    name = f"jm_user_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(USER_CODE)
    (tmp_path / f"{name}_broken.py").write_text("def f(:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    return name


def test_module_target_found_in_cwd_like_python_m(tmp_path):
    name = f"jm_user_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(USER_CODE)
    proc = run_cli(["analyze", f"{name}:ret_lowered", "--json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # x * 2 on f32[128]: reads 512 bytes, writes 512 bytes, 128 flops
    assert out["totals"]["hbm_read_bytes"] == 512 and out["totals"]["flops"] == 128
    assert str(tmp_path) not in sys.path  # nothing leaks into this process either


@pytest.mark.parametrize("fn,expect", [
    ("ret_int", "returned an int; expected a jaxmove.workload.Workload"),
    ("ret_none", "returned None"),
    ("ret_fn", "returned a function"),
    ("needs_arg", "needs arguments (x)"),
    ("raises", "raised RuntimeError: boom inside user code"),
    ("not_callable", "is an int, not a function"),
    ("no_such_fn", "has no function 'no_such_fn'"),
    ("ret_int:x", "expected package.module:function"),
])
def test_module_target_errors_are_one_line(user_pkg, capsys, fn, expect):
    assert main(["analyze", f"{user_pkg}:{fn}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert expect in line and f"{user_pkg}:{fn}" in line


def test_module_target_syntax_error_names_file_line_col(user_pkg, capsys):
    assert main(["analyze", f"{user_pkg}_broken:f"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert re.search(rf"{user_pkg}_broken\.py:1:\d+: SyntaxError", line), line


@pytest.mark.parametrize("target,expect", [
    ("os:getcwd", "returned a str"),
    ("json:loads", "needs arguments (s)"),
    ("no_such_module_jm:f", "no module named 'no_such_module_jm'"),
])
def test_stdlib_and_missing_module_targets(capsys, target, expect):
    assert main(["analyze", target]) == 2
    assert expect in one_error_line(capsys.readouterr().err)


def test_user_exception_has_no_traceback_in_a_real_process(tmp_path):
    name = f"jm_user_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(USER_CODE)
    proc = run_cli(["analyze", f"{name}:raises"], cwd=tmp_path)
    assert proc.returncode == 2
    line = next(i for i, t in enumerate(USER_CODE.splitlines(), 1) if "raise RuntimeError" in t)
    assert one_error_line(proc.stderr) == (
        f"jaxmove: error: {name}:raises raised RuntimeError: boom inside user code (at {name}.py:{line})")


# ---- 2. --set ranges -----------------------------------------------------------------------

@pytest.mark.parametrize("preset,setting", [
    ("mlp-tiny", "batch=99999999999999999999"),
    ("gpt-tiny-decode", "vocab=3000000000"),
    ("mlp-tiny", "batch=0"),
    ("mlp-tiny", "batch=-3"),
])
def test_set_out_of_range_names_the_bounds(capsys, preset, setting):
    assert main(["analyze", preset, "--set", setting]) == 2
    line = one_error_line(capsys.readouterr().err)
    key = setting.split("=")[0]
    assert f"--set {key}=" in line and "[1, 2147483647]" in line


@pytest.mark.parametrize("command", [["analyze"], ["plans", "--mesh", "data=2"], ["annotate"]])
def test_set_key_given_twice_is_one_line_naming_both(capsys, command):
    """`--set layers=1 --set layers=3` ran with the last (as --spec repeats are refused)."""
    argv = [command[0], "mlp-tiny", *command[1:], "--set", "layers=1", "--set", "layers=3"]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--set layers given twice (layers=1 and layers=3)" in line


def test_set_values_whose_arrays_overflow_are_rejected_before_xla():
    # x: f32[batch, d_model] = (2**31-1)**2 * 4 bytes > 2**62: XLA would abort the process
    with pytest.raises(ValueError, match=r"float32\[2147483647, 2147483647\].*2\*\*62"):
        models.build("mlp-tiny", {"batch": "2147483647", "d_model": "2147483647"})
    with pytest.raises(ValueError, match="at most 256 unrolled layers"):
        models.build("mlp-tiny", {"layers": "100000000"})
    assert models.build("mlp-tiny", {"batch": "2147483647"}).args[1].shape == (2147483647, 32)


# ---- 3. --top -------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["analyze", "mlp-tiny", "--top", "-5"],
                                  ["analyze", "mlp-tiny", "--top", "0"],
                                  ["compare", "mlp-tiny", "--top", "0"]])
def test_top_must_be_positive(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--top" in line and "positive integer" in line


# ---- 4. output paths ------------------------------------------------------------------------

def test_output_that_is_a_directory_is_named_as_output(tmp_path, tiny_hlo, capsys):
    d = tmp_path / "adir"
    d.mkdir()
    assert main(["analyze", str(tiny_hlo), "--html", str(d)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{d}: is a directory; --html file" in line and "HLO" not in line
    assert main(["annotate", str(tiny_hlo), "-o", str(d)]) == 2
    assert f"{d}: is a directory; -o file" in one_error_line(capsys.readouterr().err)


def test_missing_parent_directory_is_an_error_for_every_output(tmp_path, tiny_hlo, capsys):
    missing = tmp_path / "nonexistent" / "d"
    cases = [["analyze", str(tiny_hlo), "--html", str(missing / "r.html")],
             ["analyze", str(tiny_hlo), "--hardware", "h100-sxm", "--trace", str(missing / "t.json")],
             ["annotate", str(tiny_hlo), "-o", str(missing / "a.hlo")],
             ["calibrate", "--quick", "-o", str(missing / "x.toml")],
             ["compare", "mlp-tiny", "--fit", "--save-fit", str(missing / "f.toml")]]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        line = one_error_line(err)  # nothing measured first: calibrate prints no progress
        assert str(missing) in line and "does not exist" in line, line
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_unwritable_directory_names_the_users_path_not_a_temp_file(tiny_hlo, capsys):
    for argv, path in ((["annotate", str(tiny_hlo), "-o", "/proc/x"], "/proc/x"),
                       (["calibrate", "--quick", "-o", "/proc/x.toml"], "/proc/x.toml")):
        assert main(argv) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"jaxmove: error: {path}: cannot write") and ".tmp" not in line


def test_trace_without_hardware_leaves_no_file(tmp_path, tiny_hlo, capsys):
    out = tmp_path / "t.json"
    assert main(["analyze", str(tiny_hlo), "--trace", str(out)]) == 2
    assert "--trace needs --hardware" in one_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_outputs_are_written_whole(tmp_path, tiny_hlo, capsys):
    html, trace, ann = tmp_path / "r.html", tmp_path / "t.json", tmp_path / "a.hlo"
    assert main(["analyze", str(tiny_hlo), "--hardware", "h100-sxm", "--html", str(html),
                 "--trace", str(trace), "--json"]) == 0
    assert main(["annotate", str(tiny_hlo), "-o", str(ann)]) == 0
    capsys.readouterr()
    assert html.read_text().rstrip().endswith("</html>")
    assert json.loads(trace.read_text())["traceEvents"]
    from jaxmove.hlo import parse_module
    assert len(parse_module(ann.read_text()).entry.instructions) == 6   # whole: every instruction back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.hlo", "r.html", "t.json", "tiny.hlo"]


def test_atomic_write_keeps_the_old_file_when_the_rename_fails(tmp_path, monkeypatch):
    target = tmp_path / "keep.txt"
    target.write_text("old")
    os.chmod(target, 0o640)

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OutputPathError, match=r"keep\.txt: cannot write .*No space left"):
        write_text_atomic(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["keep.txt"]
    write_text_atomic(target, "new")
    assert target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640


def test_only_the_default_calibrate_location_creates_its_directory(tmp_path):
    with pytest.raises(OutputPathError, match="does not exist"):
        check_output_path(tmp_path / "a" / "b.toml")
    assert check_output_path(tmp_path / "a" / "b.toml", create_parent=True).parent.is_dir()


# ---- 5. mesh size ---------------------------------------------------------------------------

def test_mesh_above_the_device_limit_is_rejected_at_once(capsys):
    with pytest.raises(PlanError, match=f"100000 devices; at most {MAX_SIMULATED_DEVICES}"):
        parse_mesh("data=100000")
    assert parse_mesh(f"data={MAX_SIMULATED_DEVICES}") == {"data": MAX_SIMULATED_DEVICES}
    assert main(["plans", "mlp-tiny", "--mesh", "data=64,model=64"]) == 2
    assert "4096 devices; at most 2048" in one_error_line(capsys.readouterr().err)


# ---- 6. plan files --------------------------------------------------------------------------

def test_plan_file_unknown_logical_axis_names_file_line_and_choices(tmp_path, capsys):
    f = tmp_path / "typo.toml"
    f.write_text('name = "typo"\n[rules]\nbatch = ["data"]\nbatchh = ["data"]\n')
    assert main(["plans", "mlp-tiny", "--mesh", "data=2", "--plan", str(f)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{f}:4:" in line and "'batchh'" in line and "batch, length, embed" in line


def test_plan_file_mesh_axis_not_in_the_mesh(tmp_path, capsys):
    f = tmp_path / "p.toml"
    f.write_text('[rules]\nbatch = ["dta"]\n')
    assert main(["plans", "mlp-tiny", "--mesh", "data=2", "--plan", str(f)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(f) in line and "'dta'" in line and "mesh axes: data" in line


def test_readme_plan_example_is_consistent():
    readme = (ROOT / "README.md").read_text()
    toml = re.search(r"```toml\n# my_plan.toml\n(.*?)```", readme, re.S).group(1)
    mesh = re.search(r"jaxmove plans mlp --mesh (\S+) --plan my_plan.toml", readme).group(1)
    plan = parse_plan(toml, "my_plan.toml")
    check_plan_mesh(plan, parse_mesh(mesh))  # every axis the file names is in the mesh
    assert plan.params["mlp"] == ("model",)
    with pytest.raises(PlanError, match="'model' is not in --mesh data=8"):
        check_plan_mesh(plan, parse_mesh("data=8"))


# ---- 7. instruction count -------------------------------------------------------------------

def test_table_counts_the_json_instructions(tiny_hlo, capsys):
    assert main(["analyze", str(tiny_hlo), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["instructions"]
    # hand count: broadcast, add, multiply (parameter, constant, tuple are not listed)
    assert sorted(r["name"] for r in rows) == ["a", "b", "m"]
    assert main(["analyze", str(tiny_hlo)]) == 0
    out = capsys.readouterr().out
    assert "(3 instructions = JSON `instructions`" in out
    assert "All 3 instructions by HBM bytes" in out


# ---- 8. compare wording ---------------------------------------------------------------------

def test_compare_help_and_table_title(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--help"])
    helptext = capsys.readouterr().out
    assert ">= 1% of the run" in " ".join(helptext.split()) and "%%" not in helptext

    from jaxmove.report.compare_table import render_comparison
    from jaxmove.report.table import make_console

    row = SimpleNamespace(name="f", opcode="fusion", bound="memory", executions=1, measured_time_s=1e-6,
                          share=0.5, est_time_s=1e-6, ratio=1.0, excluded=None)
    prof = SimpleNamespace(runs=1, device_time_s=2e-6, coverage=1.0, span_s=None, unjoined_s={})
    m = SimpleNamespace(program=SimpleNamespace(name="p"), device_kind="cpu", wall_iqr_s=(1e-6, 1e-6),
                        wall_median_s=1e-6, wall_min_s=1e-6, wall_max_s=1e-6, wall_times_s=[1e-6],
                        warmup_runs=0, profile=prof, notes=[])
    stats = SimpleNamespace(est_program_s=1e-6, measured_wall_s=1e-6, program_error=0.0, measured_span_s=None,
                            est_sum_s=1e-6, measured_sum_s=1e-6, mdape=0.0, n_significant=2,
                            weighted_error=0.0, n_measured=2, spearman=1.0, est_is_lower_bound=False)
    c = SimpleNamespace(measurement=m, stats=stats, spec=SimpleNamespace(name="x"), spec_note="test",
                        rows=[row, row], baseline_s=None, fit=None,
                        report=SimpleNamespace(incomplete_headline=lambda: None))
    console = make_console()
    with console.capture() as cap:
        render_comparison(c, top=20, console=console)
    assert "(all 2)" in cap.get() and "top 20" not in cap.get()
    with console.capture() as cap:
        render_comparison(c, top=1, console=console)
    assert "(top 1 of 2)" in cap.get()


# ---- 9. program bound -----------------------------------------------------------------------

def test_program_bound_includes_overhead(tiny_hlo, capsys):
    assert main(["analyze", str(tiny_hlo), "--hardware", "h100-sxm", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)["time"]
    # 3 kernels x 2 us launch (h100-sxm spec) against 16-48 bytes each at 3.35 TB/s
    assert t["overhead_s"] == pytest.approx(3 * 2e-6)
    assert t["memory_time_s"] < 1e-9
    assert t["bound"] == "overhead"


# ---- 10. README -----------------------------------------------------------------------------

def test_readme_is_self_contained_and_documents_specs_and_targets():
    readme = (ROOT / "README.md").read_text()
    assert "DESIGN.md" not in readme
    assert "sys.path" in readme and "current directory" in readme
    assert "`vendor`" in readme and "`[sources]`" in readme


# ---- 11. backend vs hardware kind -----------------------------------------------------------

def test_cpu_program_costed_on_a_gpu_spec_says_so():
    import jaxmove

    note = "program compiled by XLA:CPU; costed on h100-sxm as compiled"
    on_gpu = jaxmove.analyze("mlp-tiny", hardware="h100-sxm").to_json()
    assert any(n.startswith(note) and "bf16→f32 weight converts" in n for n in on_gpu["notes"])
    on_cpu = jaxmove.analyze("mlp-tiny", hardware="cpu-generic").to_json()
    assert not any("program compiled by XLA" in n for n in on_cpu["notes"])


def test_internal_error_is_one_line_exit_1(monkeypatch, capsys):
    import jaxmove.api
    from jaxmove.cli import main

    def boom(*a, **k):
        raise ZeroDivisionError("planted")
    monkeypatch.setattr(jaxmove.api, "analyze", boom)
    monkeypatch.delenv("JAXMOVE_DEBUG", raising=False)
    assert main(["analyze", "gpt-tiny-decode"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error: ZeroDivisionError: planted" in err[0]


@pytest.mark.parametrize("exc", [ValueError("planted bug"), KeyError("planted bug"), TypeError("planted bug")])
def test_builtin_exceptions_are_bugs_not_bad_input(monkeypatch, capsys, exc):
    """Only JaxmoveInputError (and its subclasses) is bad input, exit 2; a builtin ValueError /
    KeyError raised inside jaxmove is our bug: exit 1 with the internal-error line."""
    import jaxmove.api
    from jaxmove.cli import main

    def boom(*a, **k):
        raise exc
    monkeypatch.setattr(jaxmove.api, "analyze", boom)
    monkeypatch.delenv("JAXMOVE_DEBUG", raising=False)
    assert main(["analyze", "gpt-tiny-decode"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"internal error: {type(exc).__name__}" in err[0]


def test_every_input_error_is_one_family():
    """The errors the CLI reports as bad input all derive from JaxmoveInputError."""
    from jaxmove import zoo
    from jaxmove.capture import CaptureError, TargetError, UserCodeError
    from jaxmove.errors import JaxmoveInputError, UsageError
    from jaxmove.hardware import HardwareSpecError
    from jaxmove.hlo import HloParseError
    from jaxmove.plans import PlanError
    from jaxmove.report.outputs import OutputPathError

    for cls in (CaptureError, TargetError, UserCodeError, UsageError, HardwareSpecError, HloParseError,
                PlanError, OutputPathError, zoo.PresetError):
        assert issubclass(cls, JaxmoveInputError), cls
    with pytest.raises(JaxmoveInputError, match="kv_heads"):
        zoo.build("gpt-tiny-decode", {"kv_heads": "3"})   # 3 does not divide heads=4


def test_a_mistyped_xla_flag_is_reported_not_swallowed():
    """XLA ends the process (exit status 1) on an unknown flag in XLA_FLAGS when jax starts its
    backend, while jaxmove filters the plugins' start-up noise from stderr: XLA's one line must
    still reach the user (it was swallowed with the noise, and the run ended silently)."""
    env = dict(os.environ, XLA_FLAGS="--xla_no_such_flag=1")
    env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run(_CLI + ["analyze", "gpt2-small-decode", "--set", "layers=1"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode != 0
    assert "Unknown flag in XLA_FLAGS: --xla_no_such_flag=1" in proc.stderr, proc.stderr
    assert "cudart_stub" not in proc.stderr


def test_a_hardware_spec_of_another_accelerator_than_the_target_is_refused():
    """``--target tpu-v5e --hardware h100-sxm`` costed the TPU program with the GPU's models
    (CUDA-graph command buffers on TPU kernels): refused before anything compiles."""
    import jaxmove
    from jaxmove.errors import UsageError
    from jaxmove.plans import PlanError, compare_plans
    with pytest.raises(UsageError, match=r"^--hardware h100-sxm is a GPU spec, but --target tpu-v5e:2x2 "
                                         r"compiles the program for TPU: drop --hardware"):
        jaxmove.analyze("gpt-tiny-decode", target="tpu-v5e", hardware="h100-sxm")
    with pytest.raises(PlanError, match=r"^--hardware tpu-v5p is a TPU spec, but --target h100-sxm"):
        compare_plans("gpt-tiny-decode", {"model": 2}, ["tp"], target="h100-sxm:1x1x2", hardware="tpu-v5p")


@pytest.mark.parametrize("argv, want", [
    (["analyze", "{hlo}", "--bogus"],
     "jaxmove: error: jaxmove analyze: unrecognized arguments: --bogus (see jaxmove analyze --help)"),
    (["hardware", "--csv"],
     "jaxmove: error: jaxmove hardware: unrecognized arguments: --csv (see jaxmove hardware --help)"),
    (["bogus"], "jaxmove: error: argument command: invalid choice: 'bogus'"),
])
def test_unknown_options_name_their_command_once(argv, want, tmp_path, capsys):
    """An option a command does not take names that command and its --help (it said
    'jaxmove: error: jaxmove: unrecognized arguments ... (see jaxmove --help)')."""
    from jaxmove.cli import main
    hlo = tmp_path / "ok.hlo"
    hlo.write_text("HloModule m\nENTRY e {\n  ROOT p = f32[4] parameter(0)\n}\n")
    with pytest.raises(SystemExit) as e:
        main([a.format(hlo=hlo) for a in argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith(want) and len(err.splitlines()) == 1, err


def test_hardware_json_lists_every_spec_with_values_and_sources(capsys):
    """``jaxmove hardware --json`` (a trial found none): every built-in spec, its numbers in SI
    units by dotted key, each with its source; one spec with NAME."""
    import json

    from jaxmove.cli import main
    assert main(["hardware", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    names = {s["name"] for s in d["specs"]}
    assert {"h100-sxm", "b200", "tpu-v5e", "tpu-v5p", "cpu-generic"} <= names
    assert main(["hardware", "h100-sxm", "--json"]) == 0
    h = json.loads(capsys.readouterr().out)
    assert h["kind"] == "gpu" and h["values"]["hbm_bytes_per_s"] == 3.35e12   # the datasheet's 3.35 TB/s
    assert h["values"]["hbm_capacity_bytes"] == 80e9 and "datasheet" in h["sources"]["hbm_bytes_per_s"]
    assert h["target"].startswith("h100-sxm")
    # --spec shows the numbers analyze --spec would cost with (it was refused as an unknown
    # argument, after taking the override for NAME when given first)
    for args in (["hardware", "h100-sxm", "--spec", "hbm_bytes_per_s=1e12", "--json"],
                 ["hardware", "--spec", "hbm_bytes_per_s=1e12", "h100-sxm", "--json"]):
        assert main(args) == 0
        h = json.loads(capsys.readouterr().out)
        assert h["values"]["hbm_bytes_per_s"] == 1e12 and h["sources"]["hbm_bytes_per_s"].startswith("user override")
    assert main(["hardware", "--spec", "hbm_bytes_per_s=1e12"]) == 2     # which spec?
    assert main(["hardware", "h100-sxm", "--spec", "vmem_bytes=1"]) == 2  # a key it never reads


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("args", [["hardware"], ["analyze", "mlp-tiny", "--json"]])
def test_stdout_that_cannot_be_written_is_one_line_exit_2(args):
    """`jaxmove ... > /dev/full` (a full disk): the report cannot be written; as for a file
    output, one line and exit 2 (it said 'internal error', exit 1)."""
    with open("/dev/full", "w") as full:
        r = subprocess.run(_CLI + args, stdout=full, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert r.returncode == 2, r.stderr
    assert one_error_line(r.stderr) == "jaxmove: error: cannot write to standard output (No space left on device)"


def test_output_through_a_symlink_writes_its_target(tmp_path):
    """An output path that is a symbolic link: the file it names is written (atomically) and the
    link stays a link (it was replaced by a regular file, the target left as it was); a
    dangling link creates its target."""
    target = tmp_path / "real.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    write_text_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "made.json")
    write_text_atomic(dangling, "{}")
    assert dangling.is_symlink() and (tmp_path / "made.json").read_text() == "{}"


def test_an_empty_dtype_override_is_an_error_not_none():
    # a user trial: `--set weights_dtype=` ran bf16 weights and exited 0
    import pytest

    import models
    with pytest.raises(Exception, match="weights_dtype=''.*empty value"):
        models.check_overrides("llama3-8b-decode", {"weights_dtype": ""})
    models.check_overrides("llama3-8b-decode", {"weights_dtype": "none"})   # (none is spelled out)


def test_a_python_file_without_a_function_says_to_name_one(tmp_path, capsys):
    # a user trial: `jaxmove analyze myq.py` was parsed as HLO ("expected '{' opening the body
    # of computation 'import'")
    from jaxmove.cli import main
    f = tmp_path / "myq.py"
    f.write_text("import jax\n")
    assert main(["analyze", str(f)]) == 2
    err = capsys.readouterr().err
    assert "is a Python file" in err and f"{f}:FUNCTION" in err
