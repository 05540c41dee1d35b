"""Defects a second new-user review found in sweep and compare, each checked on its own input.

- a SWEEP.toml naming a ``file.py:function`` model whose file does not exist, or an HLO file
  as the model, is one line naming the file, line and key (exit 2, no result file), not an
  ``error`` row per point after the workers start;
- every sweep row has the excess keys (None where the point was not analysed), so a JSON
  reader can index any row;
- ``jaxmove compare --hardware SPEC`` says so when SPEC is for another kind of device than
  the one measured (an H100 estimate against a CPU measurement);
- the Pareto plot's labels stay inside the axes (measured on the rendered figure).
"""

from __future__ import annotations

import textwrap

import pytest

from jaxmove.sweep import SweepSpecError, load_sweep


def _cli(argv, capsys):
    from jaxmove.cli import main
    rc = main(argv)
    return rc, capsys.readouterr()


def test_missing_model_file_is_a_spec_error_before_any_worker(tmp_path, capsys):
    (tmp_path / "wl.py").write_text("def make():\n    raise SystemExit('never called')\n")
    sweep_toml = tmp_path / "SWEEP.toml"
    sweep_toml.write_text(textwrap.dedent("""\
        [grid]
        model = ["wl.py:make", "nosuch.py:make"]
    """))
    with pytest.raises(SweepSpecError) as e:
        load_sweep(sweep_toml)
    msg = str(e.value)
    # the line of the key, the key, and the path as resolved against the SWEEP.toml's folder
    assert msg.startswith(f"{sweep_toml}:2: grid.model: {tmp_path / 'nosuch.py'}: no such file"), msg
    out = tmp_path / "r.jsonl"
    rc, cap = _cli(["sweep", str(sweep_toml), "-o", str(out), "--no-progress"], capsys)
    err = cap.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0] == f"jaxmove: error: {msg}" and cap.out == ""
    assert not out.exists()                          # nothing half-written
    # the file that exists passes (its function is not called while parsing)
    sweep_toml.write_text('[[points]]\nmodel = "wl.py:make"\n')
    assert [p.model for p in load_sweep(sweep_toml).points] == [f"{tmp_path / 'wl.py'}:make"]


def test_hlo_file_as_a_sweep_model_says_what_a_sweep_needs(tmp_path):
    (tmp_path / "m.hlo").write_text("HloModule m\n")
    (tmp_path / "SWEEP.toml").write_text('model = "m.hlo"\n[[points]]\n')
    with pytest.raises(SweepSpecError, match=r"SWEEP\.toml:1: model: 'm\.hlo' is a path, not a "
                                             r"workload: .*already compiled.*jaxmove analyze"):
        load_sweep(tmp_path / "SWEEP.toml")


def test_every_row_has_the_excess_keys(tmp_path):
    from types import SimpleNamespace

    from jaxmove.sweep import Point
    from jaxmove.sweep.point import ROW_KEYS, _excess, empty_row, run_point

    # the keys an analysed row gets from a report with an excess analysis
    cause = SimpleNamespace(kind="not_donated", bytes=16)
    report = SimpleNamespace(excess=SimpleNamespace(excess_bytes=16, compulsory_bytes=100, causes=[cause]))
    analysed = _excess(report)
    assert analysed == {"excess_bytes": 16, "compulsory_bytes": 100, "excess_top_cause": "not_donated"}
    assert set(analysed) <= set(ROW_KEYS)
    # a point that fails (its module does not exist) has them too, as None
    row = run_point(Point("no_such_module_jaxmove_x:make", "cpu", "h100-sxm", None, None, ()))
    assert row["status"] == "error" and "no_such_module_jaxmove_x" in row["error"]
    assert set(ROW_KEYS) <= set(row) and all(row[k] is None for k in analysed)
    assert set(empty_row(Point("mlp-tiny", "cpu", "h100-sxm", None, None, ()))) == set(ROW_KEYS)


def test_sweep_table_says_what_excess_counts():
    from rich.console import Console

    from jaxmove.sweep import SweepResult
    from jaxmove.sweep.render import render_table

    def row(key, excess):
        return {"key": key, "status": "ok", "fits": True, "est_time_s": 1e-3, "peak_bytes": 10,
                "model": "mlp-tiny", "overrides": {}, "mesh": None, "plan": None, "target": "cpu",
                "hbm_bytes": 100, "wire_bytes_by_kind": {"all-gather": 50}, "excess_bytes": excess,
                "compile_s": 1.0, "bound": "memory"}

    for excess, shown in ((120, True), (None, False)):
        con = Console(record=True, width=300)
        render_table(SweepResult("t", "t.toml", [row("a", excess)]), console=con)
        text = con.export_text()
        assert ("excess = bytes moved beyond the compulsory minimum on every path" in text) is shown
        assert ("120 B" in text) is shown


def test_compare_warns_when_the_spec_is_for_another_device_kind():
    from jaxmove.hardware import load_spec
    from jaxmove.measure.compare import kind_mismatch_note

    h100, cpu = load_spec("h100-sxm"), load_spec("cpu-generic")
    assert h100.kind == "gpu" and cpu.kind == "cpu"
    note = kind_mismatch_note(h100, "cpu")
    assert note is not None and "h100-sxm is a GPU spec" in note and "runs here on CPU" in note
    assert kind_mismatch_note(cpu, "cpu") is None
    assert kind_mismatch_note(h100, "gpu") is None and kind_mismatch_note(h100, "cuda") is None
    assert "TPU spec" in kind_mismatch_note(load_spec("tpu-v5e"), "cuda")


def test_pareto_labels_stay_inside_the_axes():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxmove.sweep import SweepResult

    def row(key, t, kib):
        return {"key": key, "status": "ok", "fits": True, "est_time_s": t, "peak_bytes": kib * 1024,
                "model": "gpt-tiny-decode", "overrides": {"batch": 8, "dtype": "bfloat16"},
                "mesh": "data=2,model=2", "plan": key, "target": "cpu"}

    # the fastest point sits near the right edge but below the median memory (the sweep
    # that showed it: its label ran past the right edge)
    rows = [row("tp", 3.07e-4, 359), row("tp2", 3.07e-4, 384), row("dp", 2.24e-4, 695),
            row("dp2", 2.24e-4, 713), row("dp3", 2.24e-4, 713), row("dp4", 2.24e-4, 713),
            row("fsdp", 6.96e-4, 729), row("fsdp2", 6.96e-4, 766), row("fsdp3", 7.51e-4, 784),
            row("fsdp4", 7.51e-4, 766), row("fsdp5", 7.78e-4, 532)]
    res = SweepResult("t", "t.toml", rows)
    assert {r["key"] for r in res.rows if r["pareto"]} == {"dp", "tp"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    res.pareto_plot(ax=ax)
    fig.tight_layout()
    fig.canvas.draw()
    box = ax.get_window_extent()
    labels = [t for t in ax.texts]
    assert len(labels) == 2
    for t in labels:
        ext = t.get_window_extent()
        assert box.x0 <= ext.x0 and ext.x1 <= box.x1, (t.get_text(), ext, box)
    plt.close(fig)


@pytest.mark.parametrize("name, why", [("p.xyz", "unknown image format '.xyz'"), ("p", "no extension")])
def test_bad_plot_file_name_is_refused_before_the_sweep(tmp_path, capsys, name, why):
    (tmp_path / "SWEEP.toml").write_text('[[points]]\nmodel = "mlp-tiny"\n')
    out = tmp_path / "r.jsonl"
    rc, cap = _cli(["sweep", str(tmp_path / "SWEEP.toml"), "-o", str(out), "--no-progress",
                    "--plot", str(tmp_path / name)], capsys)
    err = cap.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and cap.out == "", err
    assert err[0].startswith(f"jaxmove: error: --plot {tmp_path / name}: {why}; expected a file name "
                             "ending in one of ") and ".png" in err[0] and ".svg" in err[0]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["SWEEP.toml"]


def test_pareto_plot_file_is_written_whole_or_not_at_all(tmp_path):
    import matplotlib
    matplotlib.use("Agg")

    from jaxmove.sweep import SweepResult

    res = SweepResult("t", "t.toml", [{"key": "a", "status": "ok", "fits": True, "est_time_s": 1e-3,
                                       "peak_bytes": 1024, "model": "mlp", "target": "cpu"}])
    res.pareto_plot(path=tmp_path / "p.svg")
    assert (tmp_path / "p.svg").read_text().lstrip().startswith("<?xml")
    with pytest.raises(ValueError, match="not supported"):
        res.pareto_plot(path=tmp_path / "q.xyz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.svg"]   # no partial or temporary file


def test_compare_unknown_target_lists_presets_as_analyze_does(capsys):
    from jaxmove import zoo
    from jaxmove.capture.resolve import SHOWN_PRESETS

    rc, cap = _cli(["compare", "no-such-preset"], capsys)
    err = cap.err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    names = list(zoo.PRESETS)
    assert ", ".join(names[:SHOWN_PRESETS]) in err[0] and names[-1] not in err[0]
    assert f"and {len(names) - SHOWN_PRESETS} more; see `jaxmove models`" in err[0]


def test_sweep_dataframe_without_pandas_names_the_extra(monkeypatch):
    import sys

    from jaxmove.sweep import SweepResult

    monkeypatch.setitem(sys.modules, "pandas", None)        # as if pandas were not installed
    res = SweepResult("t", "t.toml", [{"key": "a", "status": "ok", "fits": True, "est_time_s": 1.0,
                                       "peak_bytes": 1}])
    with pytest.raises(ImportError, match=r"^SweepResult\.to_dataframe needs pandas: pip install "
                                          r"'jaxmove\[notebooks\]'$"):
        res.to_dataframe()
