"""Issue 29: a new user's hour with the README, and the CLI attacked on purpose.

Each test names the item it covers; every one failed on the code before the fix.
"""

from __future__ import annotations

import argparse

import pytest

from jaxmove.cli import main


def _err_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.strip()]


# ---- item 3: --trace with a device --target needs no --hardware ------------------------------

def test_trace_with_a_device_target_implies_its_hardware(tmp_path):
    from jaxmove.cli.common import check_outputs
    from jaxmove.errors import UsageError

    out = str(tmp_path / "t.json")
    for target in ("h100-sxm", "tpu-v5e:2x2", "H100-SXM:1x1x2"):   # implies --hardware (README)
        check_outputs(argparse.Namespace(trace=out, hardware=None, compile_target=target))
    for target in (None, "cpu"):  # XLA:CPU has no device spec to time on: still refused
        with pytest.raises(UsageError, match="--trace needs --hardware or a device --target"):
            check_outputs(argparse.Namespace(trace=out, hardware=None, compile_target=target))


# ---- item 5: did you mean ----------------------------------------------------------------------

def test_a_mistyped_preset_gets_a_did_you_mean(capsys):
    assert main(["analyze", "llama3-8b-decod"]) == 2
    (line,) = _err_lines(capsys.readouterr().err)
    assert "did you mean 'llama3-8b-decode'" in line, line
    assert main(["analyze", "zzzz-qqqq"]) == 2  # nothing close: no suggestion
    (line,) = _err_lines(capsys.readouterr().err)
    assert "did you mean" not in line and "is not a zoo preset" in line


def test_a_mistyped_target_gets_a_did_you_mean(capsys):
    assert main(["analyze", "mlp-tiny", "--target", "h100-sx"]) == 2
    (line,) = _err_lines(capsys.readouterr().err)
    assert "did you mean 'h100-sxm'?" in line, line


# ---- adversarial: terminal escape injection, one-line errors -----------------------------------

_ESC_HLO = """HloModule m

ENTRY main {
  p0 = f32[4,8]{1,0} parameter(0)
  ROOT a = f32[4,8]{1,0} negate(p0), metadata={op_name="jit(f)/\x1b]0;PWNED\x07blk/neg" source_file="/s/\x1b[2Jb\u202e.py" source_line=3}
}
"""


@pytest.mark.parametrize("extra", [[], ["--by", "module"], ["--by", "source"], ["--top", "5"]])
def test_control_characters_of_the_program_never_reach_the_terminal(tmp_path, capsys, extra):
    f = tmp_path / "esc\x1b[31m.hlo"   # the file name too
    f.write_text(_ESC_HLO, encoding="utf-8")
    assert main(["analyze", str(f), *extra]) == 0
    out = capsys.readouterr().out
    for bad in ("\x1b", "\x07", "\u202e"):
        assert bad not in out, (bad, out)
    assert "\\x1b" in out      # shown, escaped: the user still sees what the program holds


def test_an_error_echoing_a_value_with_a_newline_is_one_line(capsys):
    assert main(["analyze", "no\nsuch\x1b[2J.hlo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err, repr(err)
    assert "no\\nsuch\\x1b[2J.hlo" in err


# ---- adversarial: `jaxmove analyze X | head` ---------------------------------------------------

@pytest.fixture(scope="module")
def synth_hlo(tmp_path_factory):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "synth_hlo.py"
    spec = importlib.util.spec_from_file_location("synth_hlo", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    f = tmp_path_factory.mktemp("synth") / "s.hlo"
    f.write_text(mod.generate(1000))
    return f


def test_a_closed_pipe_exits_0_quietly(synth_hlo):
    """rich's console answered a closed pipe with SystemExit(1) (text mode exited 1)."""
    import os
    import subprocess
    import sys

    # more than a pipe's buffer (64 KiB), so the writes meet the closed pipe
    p = subprocess.Popen([sys.executable, "-P", "-m", "jaxmove.cli", "analyze", str(synth_hlo), "--top", "400"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    first = p.stdout.readline()
    p.stdout.close()   # `| head -1`
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert first and err == "", err


# ---- adversarial: Infinity in --json / --trace -------------------------------------------------

def _strict(text: str):
    import json

    def refuse(c):
        raise AssertionError(f"{c} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_json_and_trace_never_hold_infinity(tmp_path, capsys):
    from pathlib import Path

    spec = (Path(__file__).resolve().parents[1] / "jaxmove" / "hardware" / "specs" / "h100-sxm.toml").read_text()
    # the smallest positive double: 16 B / 5e-324 B/s overflows to an infinite time
    bad = spec.replace("\nhbm_bytes_per_s = 3.35e12\n", "\nhbm_bytes_per_s = 5e-324\n")
    assert bad != spec
    (tmp_path / "slow.toml").write_text(bad)
    (tmp_path / "t.hlo").write_text("HloModule t\nENTRY e {\n  p = f32[4]{0} parameter(0)\n"
                                    "  ROOT a = f32[4]{0} add(p, p)\n}\n")
    rc = main(["analyze", str(tmp_path / "t.hlo"), "--hardware", str(tmp_path / "slow.toml"), "--json",
               "--trace", str(tmp_path / "tr.json")])
    cap = capsys.readouterr()
    if rc == 2:   # refusing such a spec is the other allowed answer: one line naming it
        assert len(_err_lines(cap.err)) == 1 and "slow.toml" in cap.err
        return
    assert rc == 0, cap.err
    d = _strict(cap.out)
    assert d["totals"]["est_time_s"] is None
    assert any("non-finite" in n and "totals.est_time_s" in n for n in d["notes"])
    tr = _strict((tmp_path / "tr.json").read_text())
    assert any("non-finite" in n for n in tr["notes"])


def test_dumps_json_is_json_dump_up_to_white_space():
    import json

    from jaxmove.report.json_out import LONG_LIST, dumps_json

    obj = {"a": [{"x": i, "y": [i, "s\n\x1b"]} for i in range(LONG_LIST + 5)], "b": {"c": 1.5, "d": None},
           "e": {"long": list(range(LONG_LIST * 2)), "short": [1, 2]}, "f": [], "g": {}}
    text = dumps_json(obj)
    assert json.loads(text) == obj and text.endswith("}\n")
    assert len(text.splitlines()) >= 2 * LONG_LIST   # long lists one element per line
    inf = {"x": [1.0, float("inf")], "notes": ["n"], "y": float("nan")}
    d = _strict(dumps_json(inf))
    assert d["x"] == [1.0, None] and d["y"] is None and len(d["notes"]) == 2
    assert "x[1]" in d["notes"][1] and "y" in d["notes"][1]
    assert inf["x"][1] == float("inf") and inf["notes"] == ["n"]   # the caller's object unchanged


# ---- issue 28: tests never install system software --------------------------------------------

def test_no_test_runs_a_package_manager():
    import ast
    from pathlib import Path

    managers = {"apt-get", "apt", "yum", "dnf", "apk", "brew", "snap"}
    found = []
    for p in Path(__file__).resolve().parent.glob("*.py"):
        if p.name == Path(__file__).name:   # this file names them
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in managers:
                found.append(f"{p.name}:{node.lineno}: {node.value!r}")
    assert found == [], found   # .ci/run installs the browser; tests skip without one


# ---- adversarial: interrupts and signals -------------------------------------------------------

def _jaxmove_process(args, cwd, **kw):
    import os
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "jaxmove.cli", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"}, **kw)


@pytest.mark.parametrize("sig, rc, line", [("SIGINT", 130, "jaxmove: interrupted\n"),
                                           ("SIGTERM", 143, "jaxmove: terminated\n")])
def test_a_signal_while_jax_imports_is_one_line(tmp_path, sig, rc, line):
    import signal
    import time

    (tmp_path / "t.hlo").write_text("HloModule t\nENTRY e {\n  p = f32[4]{0} parameter(0)\n"
                                    "  ROOT a = f32[4]{0} add(p, p)\n}\n")
    p = _jaxmove_process(["analyze", "t.hlo"], tmp_path)
    maps = f"/proc/{p.pid}/maps"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:   # until jax's import is under way
        try:
            with open(maps) as f:
                if "_multiarray_umath" in f.read():   # numpy's extension: jax imports it first thing
                    break
        except OSError:
            break
        time.sleep(0.005)
    p.send_signal(getattr(signal, sig))
    out, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (rc, line), (p.returncode, err[-2000:])  # not a 25-line traceback
    assert out == ""


_SIGTERM_MID_WRITE = '''
import os, signal
import jax, jax.numpy as jnp

_fsync = os.fsync

def _fsync_then_sigterm(fd):   # the temporary file is complete, the rename not yet done
    _fsync(fd)
    os.kill(os.getpid(), signal.SIGTERM)

def make():
    os.fsync = _fsync_then_sigterm
    return jax.jit(lambda x: x + 1).lower(jax.ShapeDtypeStruct((4,), jnp.float32))
'''


def test_sigterm_mid_write_keeps_the_old_file_and_no_temporary(tmp_path):
    (tmp_path / "wl_term.py").write_text(_SIGTERM_MID_WRITE)
    (tmp_path / "out.html").write_text("old")
    p = _jaxmove_process(["analyze", "wl_term.py:make", "--html", "out.html"], tmp_path)
    out, err = p.communicate(timeout=180)
    assert (p.returncode, err) == (143, "jaxmove: terminated\n"), (p.returncode, err[-2000:])
    assert (tmp_path / "out.html").read_text() == "old"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["out.html", "wl_term.py"]  # no .out.html.*.tmp


def test_a_pending_interrupt_is_raised_before_the_rename(tmp_path):
    """The swallowed-interrupt race (a Ctrl-C dropped by a callback, re-delivered after the file
    was written and "wrote" said): the CLI's check runs before the rename, so it cannot win."""
    from jaxmove.report import outputs

    path = tmp_path / "o.txt"
    path.write_text("old")

    def pending():
        raise KeyboardInterrupt

    outputs.BEFORE_COMMIT.append(pending)
    try:
        with pytest.raises(KeyboardInterrupt):
            outputs.write_text_atomic(path, "new")
    finally:
        outputs.BEFORE_COMMIT.remove(pending)
    assert path.read_text() == "old" and [f.name for f in tmp_path.iterdir()] == ["o.txt"]
    outputs.write_text_atomic(path, "new")   # nothing pending: written
    assert path.read_text() == "new"


# ---- adversarial: code from the current directory ----------------------------------------------

def test_child_processes_do_not_import_from_the_current_directory(tmp_path, monkeypatch):
    import subprocess
    import sys

    from jaxmove.plans import devices

    (tmp_path / "json.py").write_text("raise SystemExit('the cwd json.py ran')\n")
    r = subprocess.run([sys.executable, "-c", "import json; print(json.__file__)"], cwd=tmp_path,
                       env=devices.subprocess_env(2), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and str(tmp_path) not in r.stdout, (r.stdout, r.stderr)
    seen = {}
    monkeypatch.setattr(devices.subprocess, "run", lambda cmd, **kw: seen.setdefault("cmd", cmd))
    devices.run_cli_with_devices(2, ["analyze", "x"])
    assert seen["cmd"][1] == "-P"    # the plans / --mesh re-exec (python -P -c ...)


# ---- item 2: XLA's C++ log lines ---------------------------------------------------------------

def test_xla_cpp_info_and_warning_lines_are_filtered_errors_pass():
    from jaxmove._platform import _filter

    text = ("W1201 10:11:12.345678   4242 hlo_rematerialization.cc:3011] Can't reduce memory use "
            "below 80.01GiB (85917337027 bytes) by rematerialization; only reduced to 81.34GiB\n"
            "I0000 00:00:1796182735.722619    8912 cudart_stub.cc:31] Could not find cuda drivers\n"
            "I1201 10:11:12.000001  77 service.cc:152] XLA service 0x55d initialized\n"
            "E1201 10:11:12.345678   4242 pjrt_client.cc:99] a real error\n"
            "a line of the user's own\n")
    assert _filter(text) == ("E1201 10:11:12.345678   4242 pjrt_client.cc:99] a real error\n"
                             "a line of the user's own\n")


# ---- item 1: one "does not fit" rule for every target --------------------------------------------

# f32[2^17, 2^17] = 2^34 x 4 B = 64 GiB of weights, x f32[8, 2^17]: 68.7e9 B + 4 MiB of arguments;
# more than a 40 GB A100's 40e9 B (abstract: nothing is allocated). XLA:GPU compiles it without
# the device (it checks no memory); XLA:CPU compiles it too.
_BIG = '''
import jax, jax.numpy as jnp
from jaxmove.workload import Workload

def make():
    S = jax.ShapeDtypeStruct
    return Workload("big", lambda w, x: x @ w, (S((2**17, 2**17), jnp.float32), S((8, 2**17), jnp.float32)),
                    roles=("weights", "activations"))
'''


def _fit_case(tmp_path, capsys, monkeypatch, *extra):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bigwl.py").write_text(_BIG)
    rc = main(["analyze", "bigwl.py:make", *extra])
    return rc, capsys.readouterr()


def test_does_not_fit_exits_2_after_the_report_on_cpu_with_hardware(tmp_path, capsys, monkeypatch):
    from jaxmove.hardware import load_spec

    rc, cap = _fit_case(tmp_path, capsys, monkeypatch, "--hardware", "a100-40gb")
    assert rc == 2                                   # was 0 (TPU exits 2): one rule
    (line,) = _err_lines(cap.err)
    cap_bytes = load_spec("a100-40gb").hbm_capacity_bytes
    assert line.startswith("jaxmove: error: big does not fit:") and "a100-40gb" in line
    assert f"hbm_capacity_bytes = {cap_bytes:,} B of spec a100-40gb" in line   # one capacity, its source
    need = 2**34 * 4 + 8 * 2**17 * 4
    assert f"({need / cap_bytes:.3g}x;" in line
    assert cap.out.startswith("does not fit:")      # the report is still printed, headline first
    rc, cap = _fit_case(tmp_path, capsys, monkeypatch, "--hardware", "b200")   # 180 GB: fits
    assert rc == 0 and "does not fit" not in cap.out + cap.err


def test_does_not_fit_exits_2_on_a_gpu_target(tmp_path, capsys, monkeypatch):
    pytest.importorskip("jax_plugins.xla_cuda12", reason='GPU targets need pip install "jaxmove[gpu]"')
    rc, cap = _fit_case(tmp_path, capsys, monkeypatch, "--target", "a100-40gb", "--json")
    assert rc == 2, cap.err
    (line,) = _err_lines(cap.err)
    assert "does not fit:" in line and "of spec a100-40gb" in line
    import json
    assert any(n.startswith("does not fit:") for n in json.loads(cap.out)["notes"])


# ---- item 4: --excess adds its section; the instruction table stays -------------------------------

def test_excess_adds_its_section_after_the_table(tmp_path, capsys):
    (tmp_path / "t.hlo").write_text("HloModule t\nENTRY e {\n  p = f32[4]{0} parameter(0)\n"
                                    "  ROOT a = f32[4]{0} add(p, p)\n}\n")
    assert main(["analyze", str(tmp_path / "t.hlo"), "--excess"]) == 0
    out = capsys.readouterr().out
    assert "HBM read 16 B, written 16 B" in out           # the headline of the instruction table
    assert out.index("HBM read") < out.lower().index("compulsory")   # then the excess section


# ---- item 7: sweep output ---------------------------------------------------------------------

def _rows():
    # two analysed points on the Pareto front, far apart on the log x axis, long labels
    common = {"status": "ok", "fits": True, "pareto": True, "overrides": {}, "mesh": None,
              "target": "cpu", "hbm_capacity_bytes": None}
    return [{**common, "model": "/very/long/absolute/path/to/an/experiment/dir/workload_file.py:make",
             "peak_bytes": 2**20, "est_time_s": 1e-3},
            {**common, "model": "/very/long/absolute/path/to/an/experiment/dir/workload_file.py:make_big",
             "peak_bytes": 2**34, "est_time_s": 1e-5}]


def test_point_names_carry_no_absolute_paths():
    from jaxmove.sweep.render import point_label

    (r, _) = _rows()
    assert point_label(r) == "workload_file.py:make"   # table, HTML and Pareto labels
    assert point_label({**r, "model": "llama3-8b-decode"}) == "llama3-8b-decode"   # presets as they are
    assert point_label({**r, "model": "pkg.mod:make"}) == "pkg.mod:make"


# ---- item 8: calibrate --quick's launch-overhead spread ------------------------------------------

def test_the_overhead_spread_is_robust_to_one_busy_repeat():
    from jaxmove.hardware.calibrate import SPREAD_LIMITS, _Plan, robust_spread, spread

    # 7 repeats of a per-kernel overhead, one of them on a busy core (x1.8)
    values = [0.30e-6, 0.31e-6, 0.29e-6, 0.305e-6, 0.295e-6, 0.30e-6, 0.54e-6]
    assert spread(values) > SPREAD_LIMITS["overhead"]          # (max - min) / median = 0.82: refused
    q1, q3 = sorted(values)[1] + (sorted(values)[2] - sorted(values)[1]) * 0.5, 0.3075e-6
    assert robust_spread(values) == pytest.approx((q3 - q1) / 0.30e-6, rel=1e-9)   # IQR / median
    assert robust_spread(values) < 0.1
    assert robust_spread([1.0, 1.1, 1.2]) == spread([1.0, 1.1, 1.2])   # too few for quartiles
    assert _Plan(quick=True).overhead_repeats >= 5                     # was 3


def test_sigterm_to_a_sweep_leaves_no_worker(tmp_path):
    import os
    import signal
    import time

    (tmp_path / "slow.py").write_text("import time\n\ndef a():\n    time.sleep(300)\n\n\ndef b():\n"
                                      "    time.sleep(300)\n")
    (tmp_path / "s.toml").write_text('name = "s"\n[grid]\nmodel = ["slow.py:a", "slow.py:b"]\n')
    p = _jaxmove_process(["sweep", "s.toml", "--jobs", "2"], tmp_path)

    def workers():
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        cmd = f.read()
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except OSError:
                    continue
                if b"jaxmove.sweep.worker" in cmd and ppid == p.pid:
                    out.append(int(d))
        return out

    deadline = time.monotonic() + 120
    while not (found := workers()) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.1)
    assert found, p.communicate()[1][-2000:]
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143 and err.rstrip().endswith("jaxmove: terminated"), (p.returncode, err[-2000:])

    def alive():
        out = []
        for w in found:
            try:
                with open(f"/proc/{w}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        out.append(w)
            except OSError:
                pass
        return out

    deadline = time.monotonic() + 10   # SIGKILLed by the sweep before it exits; let the kernel reap
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive() == []   # killed with the sweep, not left compiling for nothing


def test_plugin_noise_is_filtered_in_a_notebook_whose_stderr_has_no_descriptor():
    """ipykernel's sys.stderr has no fileno(); the CUDA plugin's C++ lines went to fd 2, which
    the kernel forwards into the notebook ("Could not find cuda drivers", item 2)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("jax_plugins.xla_cuda12", reason="the CUDA plugin is what prints the lines")
    code = ("import io, sys\n"
            "class NotebookStream:\n"
            "    def write(self, s): sys.__stdout__.write(s)\n"
            "    def flush(self): pass\n"
            "    def fileno(self): raise io.UnsupportedOperation('fileno')\n"
            "sys.stderr = NotebookStream()\n"
            "import jaxmove, jax\n"
            "print(jax.devices()[0].platform)\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    r = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    both = r.stdout + r.stderr
    assert "cuda drivers" not in both and "absl::InitializeLog" not in both, both[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "cpu"
