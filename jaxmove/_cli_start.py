"""Signals while the ``jaxmove`` command is still starting (``import jaxmove`` imports jax: 2 s
on a quiet machine, more under load).

A Ctrl-C or SIGTERM then used to print a raw 25-line traceback from inside jax's import (or
be lost in a callback that cannot raise). When the process is the ``jaxmove`` command itself
(the console script, or ``python -m jaxmove.cli``), :func:`guard_import` turns both into the
command's one line and exit status (130 interrupted, 143 terminated), as ``jaxmove.cli.main``
does once it runs. Imported as a library, nothing changes.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by the command's handler, so that it unwinds like a
    Ctrl-C: temporary output files removed (report/outputs.py), sweep workers killed
    (sweep/executors.py), exit 143 (128 + SIGTERM) with one line."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated


def launched_as_cli() -> bool:
    """True when this process is the ``jaxmove`` command: the console script (``argv[0]``
    named ``jaxmove``) or ``python -m jaxmove.cli``."""
    if sys.argv and os.path.basename(sys.argv[0]) == "jaxmove":
        return True
    orig = list(getattr(sys, "orig_argv", ()))
    return any(a == "-m" and b in ("jaxmove.cli", "jaxmove.cli.__main__") for a, b in zip(orig, orig[1:]))


def install_sigterm_handler() -> None:
    """SIGTERM raises ``Terminated`` in the main thread (no-op elsewhere)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def exit_interrupted(terminated: bool, stderr_fd: int | None = None) -> None:
    """Say ``jaxmove: interrupted`` (``terminated``) on stderr and end the process at once
    with 130 (143), ignoring further signals; no interpreter finalization (it crashed with
    XLA's state half torn down). ``stderr_fd``: write the line there (a duplicate of the real
    stderr, while fd 2 is captured by ``_platform.quiet_stderr``)."""
    import signal

    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(s, signal.SIG_IGN)
        except (ValueError, OSError):
            pass
    line = "jaxmove: terminated\n" if terminated else "jaxmove: interrupted\n"
    try:
        if stderr_fd is not None:
            os.write(stderr_fd, line.encode())
        else:
            sys.stderr.write(line)
    except (OSError, ValueError):
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(143 if terminated else 130)


@contextlib.contextmanager
def guard_import() -> Iterator[None]:
    """Around ``import jaxmove``'s heavy imports: in the ``jaxmove`` command, a Ctrl-C or
    SIGTERM ends the process at once with one line (``exit_interrupted``).

    The handlers exit from the signal handler itself rather than raise: a KeyboardInterrupt
    raised inside an extension module's initialisation (jaxlib importing numpy) comes out as
    an unrelated ImportError traceback, and nothing is written yet that would need cleaning up.
    Afterwards Ctrl-C raises KeyboardInterrupt again and SIGTERM ``Terminated``.
    """
    if not launched_as_cli():
        yield
        return
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        real = os.dup(2)   # fd 2 itself is captured while the plugins start (quiet_stderr)
    except OSError:
        real = None
    signal.signal(signal.SIGINT, lambda signum, frame: exit_interrupted(False, real))
    signal.signal(signal.SIGTERM, lambda signum, frame: exit_interrupted(True, real))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        install_sigterm_handler()
        if real is not None:
            os.close(real)
