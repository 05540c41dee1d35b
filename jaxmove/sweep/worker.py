"""Each point in its own process: ``python -m jaxmove.sweep.worker`` and the code that starts it.

jax reads the number of simulated CPU devices (``--xla_force_host_platform_device_count``)
and its other XLA flags once, when it creates its backends, so a process can compile for
one device count only: every point gets a fresh process, started with the environment of
``plans.devices.subprocess_env(n)``. The point's JSON goes in on stdin; the row comes back
as one line ``JAXMOVE-SWEEP-ROW <json>`` on stdout (anything else printed there, by user
code or libraries, is ignored; stderr is kept for the report of a worker that died), after a
``JAXMOVE-SWEEP-READY`` line that says its imports are done: the per-point timeout counts
from that line.

Both executors (local process pool, Ray tasks) call ``run_point_process``, so a point gives
the same row whichever ran it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from .spec import Point

MARKER = "JAXMOVE-SWEEP-ROW "
#: The worker's line once its imports are done: the point's timeout counts from there.
READY = "JAXMOVE-SWEEP-READY"
#: Seconds a worker may take to start (Python, jax and jaxmove imported) before it is killed,
#: when the per-point timeout is shorter (jax's import alone is seconds, more on a busy machine).
STARTUP_LIMIT_S = 300.0
#: Seconds a worker gets to exit after SIGTERM (on timeout) before SIGKILL.
_KILL_GRACE_S = 5.0
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def run_point_process(point_json: dict, timeout_s: float | None = None) -> dict:
    """Run one point in a fresh ``python -m jaxmove.sweep.worker`` process; its outcome.

    The worker first imports Python's, jax's and jaxmove's modules, then says it is ready
    (``READY`` on stdout): ``timeout_s`` counts from there, so it limits the point's own work
    (trace, compile, analysis), not the interpreter's start-up, which on a loaded machine
    can take many seconds. The start-up has its own limit, ``max(STARTUP_LIMIT_S, timeout_s)``.

    Args:
      point_json: ``Point.to_json()``.
      timeout_s: wall-clock limit of the point's work in the process (None: no limit).
    Returns:
      ``{"outcome": "row", "row": {...}}`` when the worker answered (the row may itself be a
      failed point: ``row["status"] == "error"``), else ``{"outcome": "died" | "timeout",
      "error": one line, "wall_s": seconds}`` for a worker that exited without a row (killed,
      crashed, out of host memory), ran past ``timeout_s``, or did not start within its
      start-up limit (it is killed, with its children).
    """
    from ..plans.devices import subprocess_env

    point = Point.from_json(point_json)
    env = subprocess_env(max(point.num_devices, 1))
    env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-P", "-m", "jaxmove.sweep.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    with _LIVE_LOCK:
        _LIVE.add(proc)
    out: list[str] = []
    err: list[str] = []
    ready = threading.Event()

    def read_stdout():
        for line in proc.stdout:
            if line.startswith(READY):
                ready.set()
            else:
                out.append(line)
        ready.set()  # (end of output: the worker exited, ready or not)

    readers = [threading.Thread(target=read_stdout, daemon=True),
               threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)]
    try:
        for t in readers:
            t.start()
        try:
            proc.stdin.write(json.dumps(point_json))
            proc.stdin.close()
        except BrokenPipeError:  # (it died at once: its exit status says how)
            pass
        startup_s = max(STARTUP_LIMIT_S, timeout_s or 0.0)
        if not ready.wait(startup_s):
            _kill(proc)
            return {"outcome": "timeout", "wall_s": time.perf_counter() - t0,
                    "error": f"the worker did not start within {startup_s:g} s (worker killed)"}
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return {"outcome": "timeout", "wall_s": time.perf_counter() - t0,
                    "error": f"timed out after {timeout_s:g} s (worker killed)"}
    except BaseException:  # interrupted (Ctrl-C, cancelled task): leave no worker behind
        _kill(proc)
        raise
    finally:
        for t in readers:
            t.join(timeout=_KILL_GRACE_S)
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    wall = time.perf_counter() - t0
    for line in reversed(out):
        if line.startswith(MARKER):
            return {"outcome": "row", "row": json.loads(line[len(MARKER):]), "wall_s": wall}
    tail = " | ".join(ln.strip() for ln in "".join(err).strip().splitlines()[-3:] if ln.strip())
    how = (f"killed by {_signal_name(proc.returncode)}" if proc.returncode < 0
           else f"exited with status {proc.returncode}")
    return {"outcome": "died", "wall_s": wall,
            "error": f"worker process {how} without a result" + (f": {tail}" if tail else "")}


def _kill(proc: subprocess.Popen) -> None:
    """SIGTERM the worker, SIGKILL it after a grace period."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def kill_live_workers() -> None:
    """Kill every worker process this process started that is still running (interrupted sweep)."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()


def _exit_with_parent() -> None:
    """End this worker when the process that started it is gone (a killed sweep, a cancelled
    Ray task): an orphan would compile on for nothing."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="jaxmove-sweep-parent-watch").start()


def main() -> int:
    """The worker: a point's JSON on stdin -> ``READY`` once its imports are done, then
    ``MARKER`` + row JSON on stdout."""
    _exit_with_parent()
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # whatever the compile prints must not be taken for the row
    point = Point.from_json(json.loads(sys.stdin.read()))
    import jax  # noqa: F401  (what every point imports, before the point's timeout starts)

    from .. import api  # noqa: F401
    from .point import empty_row, run_point
    real_stdout.write(READY + "\n")
    real_stdout.flush()

    try:
        row = run_point(point)
    except Exception as e:  # noqa: BLE001 - a bug of jaxmove's: the point's row says so, no retry
        row = empty_row(point, "error", f"internal error: {type(e).__name__}: {e}")
    real_stdout.write(MARKER + json.dumps(row) + "\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
