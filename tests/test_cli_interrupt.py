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


def test_a_swallowed_interrupt_wakes_a_main_thread_that_waits():
    """A sweep's main thread waits in ``queue.get`` for its workers. An interrupt swallowed in
    a callback (``sys.unraisablehook``) was re-delivered with ``_thread.interrupt_main``,
    which only sets Python's flag: the waiting thread slept on (a SIGTERM'd sweep of slow
    points did not end within 60 s). Re-delivered as a signal to the main thread, it ends the
    wait at once; a SIGTERM stays a SIGTERM (``Terminated``: exit 143, not 130)."""
    import queue
    import signal
    import threading
    import time
    import types

    from jaxmove._cli_start import Terminated, _on_sigterm
    from jaxmove.cli import _SwallowedInterrupts

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the test runs outside the main thread")
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for exc, expect in ((KeyboardInterrupt(), KeyboardInterrupt), (Terminated(), Terminated)):
            interrupts = _SwallowedInterrupts()
            caught = None
            with interrupts:
                threading.Timer(0.05, sys.unraisablehook,
                                [types.SimpleNamespace(exc_value=exc, exc_type=type(exc))]).start()
                t0 = time.monotonic()
                try:
                    queue.Queue().get(timeout=5)
                except queue.Empty:
                    pass
                except KeyboardInterrupt as e:
                    caught = e
                waited_s = time.monotonic() - t0
            assert type(caught) is expect, (exc, caught)
            assert waited_s < 2.5, waited_s   # woken by the signal, not by get's 5 s timeout
            assert interrupts.terminated is (expect is Terminated)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def test_a_ctrl_c_after_the_command_finished_keeps_its_status():
    """A Ctrl-C while the interpreter finalizes (after every file is written) ended the command
    with 130 and no line, as if interrupted (a user trial, 4 of 4 runs); the command is done,
    so its own status stands."""
    code = ("import os, signal, sys, time\n"
            "sys.argv = ['jaxmove', 'models']\n"
            "from jaxmove.cli import main\n"
            "rc = main()\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "time.sleep(0.2)\n"
            "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "interrupted" not in r.stderr
