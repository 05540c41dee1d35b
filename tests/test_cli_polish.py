"""A new user's trial of the CLI (second round): errors before any "compiling ..." line, one
line naming the file / line / key, capped preset lists, sweep exit status, plan TOML lines,
and the small wording fixes (no-such-file said once, where user code raised, annotate paths)."""

from __future__ import annotations

import os
import textwrap

import pytest

from jaxmove import zoo
from jaxmove.cli import main
from jaxmove.errors import JaxmoveInputError


def _error_line(capsys) -> str:
    """The one stderr line of a failed command (and nothing on stdout)."""
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("jaxmove: error: ") and not out, (out, err)
    return lines[0]


# ---- 1. the mesh is checked against the target before anything is printed -----------------

def test_mesh_larger_than_the_target_is_refused_before_the_compiling_line(capsys):
    rc = main(["analyze", "gpt2-small-decode", "--target", "h100-sxm", "--mesh", "data=16",
               "--plan", "dp"])
    line = _error_line(capsys)
    assert rc == 2 and "compiling" not in line
    # h100-sxm's default topology is one host of 8 GPUs (1x1x8)
    assert "needs 16 devices" in line and "has 8" in line


def test_bad_set_value_is_refused_before_the_compiling_line(capsys):
    assert main(["analyze", "gpt-tiny-decode", "--set", "heads=3", "--mesh", "data=2"]) == 2
    line = _error_line(capsys)
    assert "heads=3" in line and "d_model=64" in line   # gpt-tiny: d_model 64, 3 does not divide it


# ---- 2. an HLO file under --mesh/--plan; capped preset lists --------------------------------

_HLO = "HloModule m\nENTRY e { ROOT p = f32[2] parameter(0) }\n"
_HLO_MSG = ("jaxmove: error: --mesh/--plan need a zoo preset or a module:function returning a "
            "Workload with logical axes, not an HLO file (some.hlo)")


@pytest.mark.parametrize("argv", [["analyze", "some.hlo", "--mesh", "data=2"],
                                  ["annotate", "some.hlo", "--plan", "dp", "--mesh", "data=2"],
                                  ["plans", "some.hlo"], ["plans", "some.hlo", "--mesh", "data=2"]])
def test_hlo_file_with_a_plan_is_one_line(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "some.hlo").write_text(_HLO)
    assert main(argv) == 2
    assert _error_line(capsys) == _HLO_MSG


@pytest.mark.parametrize("argv", [["analyze", "gpt3"], ["plans", "gpt3", "--mesh", "data=2"],
                                  ["analyze", "gpt3", "--mesh", "data=2"]])
def test_unknown_preset_lists_a_capped_choice(argv, capsys):
    from jaxmove.capture.resolve import SHOWN_PRESETS

    assert main(argv) == 2
    line = _error_line(capsys)
    names = list(zoo.PRESETS)
    assert len(names) > SHOWN_PRESETS   # else there is nothing to cap
    assert f"... and {len(names) - SHOWN_PRESETS} more; see `jaxmove models`" in line
    assert names[0] in line and names[-1] not in line and len(line) < 400


# ---- 3. sweep: --set values checked when the file is read; exit status of failed points -----

def _sweep(tmp_path, text: str):
    path = tmp_path / "SWEEP.toml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


@pytest.mark.parametrize("text, where, key, said", [
    ("""
     model = "gpt-tiny-decode"
     [grid]
     mesh = ["data=2"]
     [grid.set]
     batch = [0, 2]
     """, 5, "grid.set.batch", "batch='0'"),
    ("""
     model = "gpt-tiny-decode"
     [set]
     heads = 3
     [grid]
     mesh = ["data=2"]
     """, 3, "set.heads", "heads=3 must divide d_model=64"),
    ("""
     model = "gpt-tiny-decode"
     [[points]]
     set = {layers = 2}
     [[points]]
     set = {kv_heads = 3}
     """, 5, "points[1].set.kv_heads", "kv_heads=3 must divide heads=4"),   # gpt-tiny: 4 heads
])
def test_sweep_bad_set_value_names_file_line_and_key(text, where, key, said, tmp_path, capsys):
    from jaxmove.sweep import SweepSpecError, load_sweep

    path = _sweep(tmp_path, text)
    with pytest.raises(SweepSpecError) as e:
        load_sweep(path)
    assert isinstance(e.value, JaxmoveInputError)
    assert str(e.value).startswith(f"{path}:{where}: {key}: ") and said in str(e.value), str(e.value)
    assert main(["sweep", str(path), "--no-progress"]) == 2
    assert _error_line(capsys) == f"jaxmove: error: {e.value}"


def test_sweep_exits_1_when_a_point_failed(tmp_path, capsys):
    (tmp_path / "boom.py").write_text("def make():\n    raise ValueError('boom')\n")
    path = _sweep(tmp_path, """
        model = "boom.py:make"
        [[points]]
        hardware = "h100-sxm"
        """)
    assert main(["sweep", str(path), "--no-progress", "--jobs", "1"]) == 1
    out, err = capsys.readouterr()
    assert "boom" in out and "1 of 1 points failed (error 1, died 0, timeout 0)" in err


def test_sweep_exit_status_counts_failures_not_points_that_do_not_fit(tmp_path, monkeypatch, capsys):
    import jaxmove.sweep as sweep_pkg
    from jaxmove.sweep.result import SweepResult

    path = _sweep(tmp_path, """
        model = "mlp-tiny"
        [[points]]
        hardware = "h100-sxm"
        """)
    rows = {"fits": [{"key": "a", "status": "ok", "fits": False, "error": None}],
            "died": [{"key": "a", "status": "ok", "fits": True, "error": None},
                     {"key": "b", "status": "died", "fits": None, "error": "killed"}]}
    for case, want in (("fits", 0), ("died", 1)):
        monkeypatch.setattr(sweep_pkg, "sweep", lambda spec, **kw: SweepResult("s", str(path),
                                                                                [dict(r) for r in rows[case]]))
        assert main(["sweep", str(path), "--no-progress", "--json"]) == want, case
        capsys.readouterr()


# ---- 4. plan TOML errors ------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ('name = "x"\n[rulez]\nbatch = ["data"]\n', "p.toml:2: unknown key 'rulez'"),
    ('[rules]\nbatch = ["data"\n', "p.toml:2: invalid TOML: Unclosed array"),   # end of document
    ('[rules]\nbatch = ["data"]\n[params]\nembed = = 2\n', "p.toml:4:9: invalid TOML: Invalid value"),
    ('[params]\nembed = ["data"]\n[activations]\n\nbatch = ["pod"]\n',
     "p.toml:5: [activations] batch = ['pod']: mesh axis 'pod' is not in --mesh data=2"),
    ('[rules]\nbatch = ["pod"]\n', "p.toml:2: [rules] batch = ['pod']: mesh axis 'pod'"),
])
def test_plan_file_errors_name_file_and_line(text, want, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text(text)
    assert main(["analyze", "mlp-tiny", "--mesh", "data=2", "--plan", "p.toml"]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"jaxmove: error: {want}"), line
    assert ":?" not in line


def test_missing_plan_file_says_no_such_file(tmp_path, capsys):
    missing = tmp_path / "nonexist.toml"
    assert main(["analyze", "mlp-tiny", "--mesh", "data=2", "--plan", str(missing)]) == 2
    assert _error_line(capsys) == f"jaxmove: error: plan {missing}: no such file"


# ---- 5. the small ones -------------------------------------------------------------------

def test_missing_module_file_is_said_once(tmp_path, capsys):
    target = f"{tmp_path}/nonexist/x.py:f"
    assert main(["analyze", target]) == 2
    line = _error_line(capsys)
    assert line.count("no such file") == 1 and f"{tmp_path}/nonexist/x.py" in line


def test_user_code_error_names_the_line_that_raised(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "polish_raises.py").write_text(
        "def helper():\n    raise ValueError('boom')\n\n\ndef raises():\n    x = 1\n    return helper()\n")
    assert main(["analyze", "polish_raises:raises"]) == 2
    # the innermost frame of the user's file: helper's raise on line 2
    assert _error_line(capsys) == ("jaxmove: error: polish_raises:raises raised ValueError: boom "
                                    "(at polish_raises.py:2)")


def test_devices_child_does_not_repeat_the_compiling_line(monkeypatch, capsys):
    import subprocess

    from jaxmove.plans import devices

    seen = {}
    monkeypatch.setattr(subprocess, "run", lambda cmd, env, **kw: seen.update(env=env))
    devices.run_cli_with_devices(4, ["plans", "mlp-tiny", "--mesh", "data=4"])
    assert seen["env"].get(devices.CHILD_ENV) == "1"
    assert devices.CHILD_ENV not in os.environ            # the parent's environment is untouched

    argv = ["plans", "mlp-tiny", "--mesh", "data=1", "--plan", "dp", "--json"]
    assert main(argv) == 0
    assert capsys.readouterr().err.count("jaxmove: compiling") == 1
    monkeypatch.setenv(devices.CHILD_ENV, "1")             # as in the child re-run
    assert main(argv) == 0
    assert "jaxmove: compiling" not in capsys.readouterr().err


def test_rollup_without_by_module_is_an_error(tmp_path, capsys):
    (tmp_path / "m.hlo").write_text(_HLO)
    for argv in (["--rollup"], ["--rollup", "--by", "opcode"]):
        assert main(["analyze", str(tmp_path / "m.hlo"), *argv]) == 2
        line = _error_line(capsys)
        assert "--rollup" in line and "needs --by module" in line


def test_annotate_source_paths_are_shown_as_in_the_tables(tmp_path, monkeypatch, capsys):
    from jaxmove.report.attribution import display_path

    monkeypatch.chdir(tmp_path)
    src = tmp_path / "pkg_model.py"
    (tmp_path / "m.hlo").write_text(textwrap.dedent(f"""\
        HloModule m
        ENTRY e {{
          p = f32[8,16]{{1,0}} parameter(0)
          ROOT n = f32[8,16]{{1,0}} negate(p), metadata={{op_name="jit(f)/neg" source_file="{src}" source_line=12}}
        }}
        """))
    assert main(["annotate", "m.hlo"]) == 0
    out = capsys.readouterr().out
    assert display_path(str(src)) == "pkg_model.py"        # below the current directory
    assert 'src="pkg_model.py:12"' in out and f'src="{src}' not in out   # the metadata keeps its path
