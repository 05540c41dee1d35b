"""Where the points run: a local pool of worker processes, or Ray tasks on a cluster.

Both run every point through ``worker.run_point_process`` (a fresh process per point, with
that point's simulated device count), so they give the same rows. A worker that dies
(killed, crashed, out of host memory) or runs past the per-point timeout is retried once in
a new process; a second failure is reported as the point's row (``status`` ``died`` or
``timeout``, with the error), never dropped.

``Events`` receives what happens (started, retried, finished) for the progress bar and the
result file; the executors call it from the thread that runs ``run``.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import threading
import time
import warnings
from typing import Protocol

from .point import empty_row
from .spec import Point
from .worker import run_point_process

__all__ = ["Events", "run_local", "run_ray", "EXECUTORS", "RayUnavailableError"]

EXECUTORS = ("local", "ray")
#: Attempts per point: the first, and one retry after a worker died or timed out.
MAX_ATTEMPTS = 2


class Events(Protocol):
    def started(self, point: Point, attempt: int) -> None: ...
    def retrying(self, point: Point, outcome: dict) -> None: ...
    def finished(self, point: Point, row: dict) -> None: ...


class RayUnavailableError(Exception):
    """``--executor ray`` without ray installed, or no cluster at ``--address``."""


def _row_of(point: Point, outcome: dict, attempt: int) -> dict:
    """The row for a worker's outcome (a failed row after the last attempt)."""
    if outcome["outcome"] == "row":
        row = outcome["row"]
    else:
        row = empty_row(point, status=outcome["outcome"], error=outcome["error"])
        row["wall_s"] = outcome.get("wall_s")
    row["attempts"] = attempt
    return row


def run_local(points: list[Point], events: Events, jobs: int, timeout_s: float | None) -> None:
    """Run ``points`` on this machine, at most ``jobs`` worker processes at once."""
    todo: queue.Queue = queue.Queue()
    for p in points:
        todo.put(p)
    done: queue.Queue = queue.Queue()
    stop = threading.Event()

    def worker_thread():
        while not stop.is_set():
            try:
                point = todo.get_nowait()
            except queue.Empty:
                return
            for attempt in range(1, MAX_ATTEMPTS + 1):
                done.put(("started", point, attempt))
                try:
                    out = run_point_process(point.to_json(), timeout_s)
                except BaseException as e:  # noqa: BLE001 - reported to the main thread
                    done.put(("crash", point, e))
                    return
                if out["outcome"] == "row" or attempt == MAX_ATTEMPTS or stop.is_set():
                    done.put(("finished", point, _row_of(point, out, attempt)))
                    break
                done.put(("retrying", point, out))

    threads = [threading.Thread(target=worker_thread, daemon=True, name=f"jaxmove-sweep-{i}")
               for i in range(max(1, min(jobs, len(points))))]
    for t in threads:
        t.start()
    remaining = len(points)
    try:
        while remaining:
            kind, point, payload = done.get()
            if kind == "started":
                events.started(point, payload)
            elif kind == "retrying":
                events.retrying(point, payload)
            elif kind == "finished":
                remaining -= 1
                events.finished(point, payload)
            else:
                raise payload
    finally:
        stop.set()
        from .worker import kill_live_workers
        if remaining:
            kill_live_workers()
        for t in threads:
            t.join(timeout=10)


# ---- ray -----------------------------------------------------------------------------------

#: Seconds past the per-point timeout after which the driver cancels a Ray task itself (the
#: task's own process timeout normally fires first).
_RAY_GRACE_S = 60.0


def _ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("--executor ray needs ray: pip install 'jaxmove[ray]'") from None
    return ray


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _first_line(text: str) -> str:
    lines = [ln for ln in _ANSI.sub("", text).strip().splitlines() if ln.strip()]
    return lines[0].strip() if lines else ""


def _ray_error_text(e: BaseException) -> str:
    """One line for a failed Ray task: the task's own exception when it raised one (a
    ``RayTaskError`` carries it as ``cause``; its first line is only ``ray::task() (pid=...)``),
    else Ray's error; terminal colour codes removed."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(e).__name__}({type(cause).__name__}): {_first_line(str(cause)) or type(cause).__name__}"
    return f"{type(e).__name__}: {_first_line(str(e)) or type(e).__name__}"


def run_ray(points: list[Point], events: Events, jobs: int | None, timeout_s: float | None,
            address: str | None = None) -> None:
    """Run ``points`` as Ray tasks (one CPU each), at most ``jobs`` in flight (default: the
    cluster's CPUs). Connects to ``address`` (``auto``, ``ray://host:port``) unless ray is
    already initialised in this process; without an address a local Ray instance is started
    for the sweep and stopped after it. Every node needs this version of jaxmove installed.
    """
    ray = _ray()
    started_here = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "log_to_driver": False}
        if address:
            kwargs = {"address": address, "log_to_driver": False}
        else:
            kwargs["num_cpus"] = jobs or os.cpu_count() or 1
        try:
            with warnings.catch_warnings():  # jax warns on any fork; ray's are fork + exec
                warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
                ray.init(logging_level=logging.ERROR, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise RayUnavailableError(f"--address {address}: cannot connect to a Ray cluster ({e})") from None
        started_here = True
    pending: dict = {}           # ref -> (point, attempt, submitted at)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        limit = max(1, jobs or cpus)
        task = ray.remote(num_cpus=1, max_retries=0)(run_point_process)
        todo = list(reversed(points))
        retries: list[Point] = []

        def submit(point: Point, attempt: int):
            ref = task.remote(point.to_json(), timeout_s)
            pending[ref] = (point, attempt, time.monotonic())
            events.started(point, attempt)

        while todo or retries or pending:
            while (todo or retries) and len(pending) < limit:
                if retries:
                    submit(retries.pop(), 2)
                else:
                    submit(todo.pop(), 1)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            now = time.monotonic()
            for ref in list(pending):
                point, attempt, t0 = pending[ref]
                if ref in ready:
                    try:
                        out = ray.get(ref)
                    except ray.exceptions.RayError as e:
                        out = {"outcome": "died", "error": f"ray task failed: {_ray_error_text(e)}",
                               "wall_s": now - t0}
                elif timeout_s is not None and now - t0 > timeout_s + _RAY_GRACE_S:
                    ray.cancel(ref, force=True)
                    out = {"outcome": "timeout", "wall_s": now - t0,
                           "error": f"timed out after {timeout_s:g} s (ray task cancelled)"}
                else:
                    continue
                del pending[ref]
                if out["outcome"] != "row" and attempt < MAX_ATTEMPTS:
                    events.retrying(point, out)
                    retries.append(point)
                else:
                    events.finished(point, _row_of(point, out, attempt))
    finally:
        for ref in list(pending):  # interrupted: cancel what still runs
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - best effort while unwinding
                pass
        if started_here:
            ray.shutdown()
