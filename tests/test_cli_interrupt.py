"""Ctrl-C: a command that is interrupted says so in one line, exits 130 and leaves no output file.

Found by a new user's review: a Ctrl-C that landed in jax's garbage-collector callback
(``_xla_gc_callback``) was printed as "Exception ignored in ... KeyboardInterrupt" and lost,
and the command ran on to write its files and exit 0; one that landed during a compile or
the analysis exited 130 and then crashed in interpreter finalization (SIGSEGV, exit -11).
The interrupts here are raised from a ``module:function`` target, so they land at a known
point: directly (the ordinary case) and inside a ``__del__`` (the swallowed case, like the
gc callback's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from jaxmove.cli import main

# main() with no argv, as the console script calls it (the process's own arguments)
_CONSOLE = [sys.executable, "-P", "-c", "import sys; from jaxmove.cli import main; sys.exit(main())"]

_TARGETS = textwrap.dedent("""\
    import time

    import jax
    import jax.numpy as jnp


    def _program():
        return jax.jit(lambda x: x + 1).lower(jax.ShapeDtypeStruct((4,), jnp.float32))


    def direct():
        raise KeyboardInterrupt


    class _Swallows:
        def __del__(self):
            raise KeyboardInterrupt  # Python prints "Exception ignored in ..." and drops it


    def swallowed():
        _Swallows()  # deleted at once: the interrupt is raised in __del__
        for _ in range(50):  # the command would go on to finish if nothing re-delivered it
            time.sleep(0.01)
        return _program()


    def fine():
        return _program()
    """)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    d = tmp_path_factory.mktemp("interrupt")
    (d / "wl.py").write_text(_TARGETS)
    return d


def _console(args, cwd):
    return subprocess.run(_CONSOLE + list(args), capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)


def _leftovers(d):
    return sorted(p.name for p in d.iterdir() if p.name.startswith(".out.html"))


@pytest.mark.parametrize("fn", ["direct", "swallowed"])
def test_interrupt_exits_130_with_one_line_and_no_file(targets, fn):
    r = _console(["analyze", f"wl.py:{fn}", "--html", "out.html"], targets)
    assert r.returncode == 130, (r.returncode, r.stderr)  # not 0 (swallowed), not -11 (crash)
    assert r.stderr == "jaxmove: interrupted\n", r.stderr  # no traceback, no "Exception ignored"
    assert not (targets / "out.html").exists()
    assert _leftovers(targets) == []


def test_control_same_target_without_interrupt_writes_the_file(targets):
    r = _console(["analyze", "wl.py:fine", "--html", "ok.html"], targets)
    assert r.returncode == 0, r.stderr
    assert (targets / "ok.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_in_process_main_returns_130(targets, capsys, monkeypatch):
    monkeypatch.chdir(targets)
    hook = sys.unraisablehook
    assert main(["analyze", "wl.py:direct"]) == 130  # returned, not os._exit: the caller lives on
    assert capsys.readouterr().err == "jaxmove: interrupted\n"
    assert sys.unraisablehook is hook  # the command's hook is removed again
