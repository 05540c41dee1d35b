"""The ``jaxmove`` command line: one module per command; each parses, calls the Python API, renders.

Exit status: 0 success, 2 bad input (missing or malformed file, unknown target, bad
``--set``), with one line on stderr naming file:line:col and what was expected.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys

from .._cli_start import Terminated, install_sigterm_handler  # noqa: F401  (re-exported)
from ..hlo import HloParseError
from ..report.render_helpers import one_line
from .common import _Parser, check_outputs, parse_sets, positive_int  # noqa: F401  (re-exported)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="jaxmove",
        description="Where do the bytes of a compiled JAX/XLA program go? Per-instruction HBM "
                    "traffic by path and tensor role, from a Flax model or an HLO dump.")
    sub = p.add_subparsers(dest="command", required=True)

    from .analyze import add_analyze_command
    from .annotate import add_annotate_command
    from .zoo import add_models_command
    add_analyze_command(sub)
    add_annotate_command(sub)
    add_models_command(sub)
    from .hardware import add_hardware_commands
    add_hardware_commands(sub)
    from .compare import add_compare_command
    add_compare_command(sub)
    from .plans import add_plans_command
    add_plans_command(sub)
    from .sweep import add_sweep_command
    add_sweep_command(sub)
    return p


class _SwallowedInterrupts:
    """``sys.unraisablehook`` while a command runs, for a Ctrl-C that Python would lose.

    A KeyboardInterrupt raised inside a callback that cannot propagate it (jax's
    ``_xla_gc_callback``, which the garbage collector runs, or a ``__del__``) is printed as
    "Exception ignored in ..." and dropped, and the command used to run on to exit 0 as if
    never interrupted. Here it is re-delivered to the main thread once the callback has
    returned (a signal sent to it from a short-lived thread: ``_redeliver``), and the command
    ends as interrupted (exit 130; 143 for a SIGTERM) even if it finished first.
    """

    def __init__(self) -> None:
        import threading

        self.swallowed = False
        self._swallowed_exc: BaseException | None = None   # the interrupt swallowed
        self.active = True
        self._lock = threading.Lock()
        self._previous = sys.unraisablehook

    def __enter__(self) -> _SwallowedInterrupts:
        from ..report import outputs

        sys.unraisablehook = self._hook
        outputs.BEFORE_COMMIT.append(self.check)
        return self

    def __exit__(self, *exc) -> None:
        from ..report import outputs

        with self._lock:  # no re-delivery once the command is over
            self.active = False
        sys.unraisablehook = self._previous
        if self.check in outputs.BEFORE_COMMIT:
            outputs.BEFORE_COMMIT.remove(self.check)

    def check(self) -> None:
        """Raise the swallowed interrupt now, if there is one (called before an output file is
        renamed into place and before "wrote" is said: an interrupted command writes nothing,
        whichever of the re-delivery and the write comes first)."""
        if self.swallowed:
            with self._lock:
                self.active = False  # raised here: the re-delivering thread must not raise it again
            raise Terminated if self.terminated else KeyboardInterrupt

    @property
    def terminated(self) -> bool:
        """The swallowed interrupt was a SIGTERM (``Terminated``), not a Ctrl-C."""
        return isinstance(self._swallowed_exc, Terminated)

    def _hook(self, unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            self._previous(unraisable)
            return
        import threading

        self.swallowed = True
        self._swallowed_exc = unraisable.exc_value
        threading.Thread(target=self._redeliver, daemon=True).start()

    def _redeliver(self) -> None:
        """Deliver the interrupt to the main thread again as a real signal sent to that thread
        (``signal.pthread_kill``), which wakes it where it waits (a sweep's main thread waits in
        ``queue.get`` for its workers). ``_thread.interrupt_main`` only sets Python's flag: a main
        thread already waiting slept on until something else woke it (a SIGTERM'd sweep of
        points that take minutes did not end; tests/test_cli_newuser.py). SIGTERM where the
        command's handler turns it into ``Terminated``, else SIGINT where Python handles it, else
        ``interrupt_main``."""
        import _thread
        import signal
        import threading
        import time

        from .._cli_start import _on_sigterm

        time.sleep(0.01)  # let the callback that swallowed it return first
        with self._lock:
            if not self.active:
                return
            sig = None
            if self.terminated and signal.getsignal(signal.SIGTERM) is _on_sigterm:
                sig = signal.SIGTERM
            elif callable(signal.getsignal(signal.SIGINT)):
                sig = signal.SIGINT
            if sig is None:
                _thread.interrupt_main()
            else:
                signal.pthread_kill(threading.main_thread().ident, sig)


def _error(message: str) -> None:
    """``jaxmove: error: MESSAGE`` on stderr as one line: control characters and newlines of
    echoed values (file names, op_name...) are escaped (report/render_helpers.one_line)."""
    print("jaxmove: error: " + one_line(message), file=sys.stderr)


def _stdout_to_devnull() -> None:
    """After a closed pipe: point stdout at /dev/null, so the interpreter's last flush of what
    is still buffered does not fail again ("Exception ignored ... BrokenPipeError", exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


#: errors of a write that has no file name: the report going to stdout (``> /dev/full``, a full
#: disk or quota, an I/O error); files jaxmove writes itself name theirs (report/outputs.py)
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _interrupted(console: bool, exc: BaseException | None = None) -> int:
    """One line, and status 130 (Ctrl-C) or 143 (SIGTERM, ``Terminated``). The console command
    leaves at once without interpreter finalization (after a Ctrl-C in the middle of a compile,
    finalizing with XLA's state half torn down crashed: SIGSEGV, exit -11); output files are
    never half-written (report/outputs.py renames complete files)."""
    terminated = isinstance(exc, Terminated)
    if console:
        from .._cli_start import exit_interrupted
        exit_interrupted(terminated)
    print("jaxmove: terminated" if terminated else "jaxmove: interrupted", file=sys.stderr)
    return 143 if terminated else 130


#: environment variables a command line sets for itself and its child processes:
#: capture/targets.XLA_OPTIONS_ENV, capture/program.WEIGHT_LAYOUTS_ENV,
#: capture/compile_cache.DISABLE_ENV (literals here: the CLI starts without importing jax)
COMMAND_ENV = ("JAXMOVE_XLA_OPTIONS", "JAXMOVE_WEIGHT_LAYOUTS", "JAXMOVE_NO_COMPILE_CACHE")


def main(argv: list[str] | None = None) -> int:
    """Run the ``jaxmove`` command; returns its exit status (0, 1 internal error, 2 bad input,
    130 interrupted, 143 terminated). With ``argv`` None (the console script: the process's own
    arguments) a Ctrl-C ends the process at once with status 130 and SIGTERM with 143
    (``_interrupted``), leaving no temporary file and no worker process."""
    interrupts = _SwallowedInterrupts()
    if argv is None:
        install_sigterm_handler()
    # the options a command line passes to the processes it starts through the environment
    # (--xla-option, --weight-layouts, --no-compile-cache) end with it when main() is called in
    # a process that goes on (a notebook, a test): the next call compiles as its own line says
    saved = {k: os.environ.get(k) for k in COMMAND_ENV} if argv is not None else None
    try:
        with interrupts:
            rc = _main(argv)
    except KeyboardInterrupt as e:
        return _interrupted(argv is None, e)
    finally:
        if saved is not None:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    if interrupts.swallowed:  # re-delivered too late to stop the command: still interrupted
        return _interrupted(argv is None, interrupts._swallowed_exc)
    if argv is None:
        # the command is done and its files written: a Ctrl-C now, while the interpreter
        # finalizes (jax's exit handlers, ~0.3 s), would end it with 130 and no line, as if
        # interrupted; it changes nothing, so the status is the command's
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return rc


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:   # name the command whose options these are not (argparse names only "jaxmove")
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    for attr in ("html", "trace", "output", "save_fit"):  # an empty path would be skipped silently
        value = getattr(args, attr, None)
        if isinstance(value, str) and not value.strip():
            _error(f"--{attr.replace('_', '-')} needs a file path, got {value!r}")
            return 2
    from ..errors import JaxmoveInputError

    try:  # a KeyboardInterrupt goes up to main()
        return args.func(args)
    except HloParseError as e:
        _error(f"{e}")
    except FileNotFoundError as e:
        if e.filename:
            msg = f"{e.filename}: no such file"
        else:  # raised with a message of ours, which already says it (capture/resolve.py)
            msg = str(e) if "no such file" in str(e) else f"{e}: no such file"
        _error(msg)
    except IsADirectoryError as e:
        _error(f"{e.filename}: is a directory, expected an HLO text file")
    except JaxmoveInputError as e:  # every input error; anything else is a bug (below)
        _error(f"{e}")
    except BrokenPipeError:  # e.g. `jaxmove analyze ... | head`: the reader has what it wanted
        _stdout_to_devnull()
        return 0
    except Exception as e:  # a bug of ours, not bad input: one line, exit 1, traceback on request
        if isinstance(e, OSError) and e.filename is None and e.errno in _WRITE_ERRNOS:
            # the report could not be written where stdout goes (`> /dev/full`, a full disk): as
            # for a file output (report/outputs.py), one line and exit 2, not a bug of ours
            _stdout_to_devnull()
            _error(f"cannot write to standard output ({e.strerror or e})")
            return 2
        if os.environ.get("JAXMOVE_DEBUG"):
            raise
        print(one_line(f"jaxmove: internal error: {type(e).__name__}: {e} (set JAXMOVE_DEBUG=1 for "
                       "the traceback, and please report it)"), file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
