"""``jaxmove.sweep(...)``: expand a SWEEP.toml, skip finished points, run the rest, rank them."""

from __future__ import annotations

import os
import threading
import time

from ..errors import JaxmoveInputError
from .executors import EXECUTORS, RayUnavailableError, run_local, run_ray
from .result import SweepResult
from .spec import Point, SweepSpec, load_sweep
from .store import FINISHED, ResultStore

__all__ = ["sweep", "SweepError"]


class SweepError(JaxmoveInputError):
    """Bad sweep arguments (executor, jobs, timeout, ray missing or unreachable)."""


class _Progress:
    """Counts (done / running / failed) and, when asked, a rich progress bar with an ETA on stderr."""

    def __init__(self, total: int, show: bool, label: str):
        self.done = self.running = self.failed = self.retried = 0
        self.total = total
        self._lock = threading.Lock()
        self._bar = None
        if show and total:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("running {task.fields[running]}  failed {task.fields[failed]}"),
                                 TextColumn("ETA"), TimeRemainingColumn(), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=False)
            self._task = self._bar.add_task(label, total=total, running=0, failed=0)
            self._bar.start()

    def _update(self, advance: int = 0) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, running=self.running, failed=self.failed)

    def started(self, point: Point, attempt: int) -> None:
        with self._lock:
            self.running += 1
            self._update()

    def retrying(self, point: Point, outcome: dict) -> None:
        with self._lock:
            self.running -= 1
            self.retried += 1
            if self._bar is not None:
                self._bar.console.print(f"jaxmove: {point.label()}: {outcome['error']}; retrying once",
                                        markup=False, highlight=False)
            self._update()

    def finished(self, point: Point, row: dict) -> None:
        with self._lock:
            self.running -= 1
            self.done += 1
            self.failed += row["status"] != "ok"
            self._update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class _Recorder:
    """Executor events -> the result file (as each point finishes) and the progress bar."""

    def __init__(self, store: ResultStore, progress: _Progress, on_row=None):
        self.store, self.progress, self.on_row = store, progress, on_row

    def started(self, point, attempt):
        self.progress.started(point, attempt)

    def retrying(self, point, outcome):
        self.progress.retrying(point, outcome)

    def finished(self, point, row):
        self.store.add(row)
        self.progress.finished(point, row)
        if self.on_row is not None:
            self.on_row(row)


def sweep(spec: str | os.PathLike | SweepSpec | list[Point], *, executor: str = "local",
          jobs: int | None = None, address: str | None = None, timeout_s: float | None = None,
          output: str | os.PathLike | None = None, resume: bool = False, overwrite: bool = False,
          progress: bool = False, on_row=None) -> SweepResult:
    """Compile and analyse every point of a sweep, each in its own process; rank the results.

    Args:
      spec: a SWEEP.toml path, a parsed ``SweepSpec``, or a list of ``Point`` s.
      executor: ``local`` (a pool of ``jobs`` worker processes here) or ``ray`` (Ray tasks;
        needs ``pip install 'jaxmove[ray]'``). Both give the same rows.
      jobs: points at once (local default: the CPU count; ray default: the cluster's CPUs).
      address: ray only: ``auto`` (a running cluster) or ``ray://host:10001``; default: a
        Ray instance is started here for the sweep (unless ray is already initialised).
      timeout_s: wall-clock seconds per point; a worker past it is killed and the point
        retried once (then reported with ``status="timeout"``). Default: no limit.
      output: result file (``.parquet`` or ``.jsonl``), written as each point finishes.
      resume: read ``output`` first and run only points without a finished row there (rows
        of died / timed-out workers run again); keys hash the point's inputs and jaxmove's
        version, so a changed point or a new version recompiles.
      overwrite: replace an existing ``output`` (without it or ``resume`` that is an error; not
        with ``resume``).
      progress: show a progress bar (done / running / failed, ETA) on stderr.
      on_row: called with each new row as it arrives (in the calling thread).
    Returns:
      A SweepResult (rows ranked, fastest that fits first).
    Raises:
      SweepSpecError (bad SWEEP.toml), SweepError (bad arguments, ray missing/unreachable),
      ResultFileError / OutputPathError (bad ``output``), FileNotFoundError.
    """
    if executor not in EXECUTORS:
        raise SweepError(f"--executor {executor!r}: expected one of {', '.join(EXECUTORS)}")
    if jobs is not None and jobs < 1:
        raise SweepError(f"--jobs {jobs}: expected a positive integer")
    if timeout_s is not None and not timeout_s > 0:
        raise SweepError(f"--timeout {timeout_s}: expected a positive number of seconds")
    if resume and overwrite:
        raise SweepError("--resume and --overwrite exclude each other: --resume continues the sweep "
                         "in the result file, --overwrite starts it anew")
    if resume and output is None:
        raise SweepError("--resume needs the result file of the sweep to continue (-o FILE)")
    if address and executor != "ray":
        raise SweepError("--address applies to --executor ray")
    if isinstance(spec, (str, os.PathLike)):
        spec = load_sweep(spec)
    elif isinstance(spec, list):
        spec = SweepSpec("<points>", list(spec), "points")
    if executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise SweepError("--executor ray needs ray: pip install 'jaxmove[ray]'") from None
    store = ResultStore(output, resume=resume, overwrite=overwrite)
    try:
        return _run_with_store(spec, store, output, resume, executor, jobs, timeout_s, address,
                               progress, on_row)
    finally:
        store.close()  # the file's lock: another sweep may write it now


def _run_with_store(spec, store, output, resume, executor, jobs, timeout_s, address, progress,
                    on_row) -> SweepResult:
    notes = list(spec.notes) + list(store.notes)
    keys = {p.key: p for p in spec.points}
    kept = {k: r for k, r in store.rows.items() if k in keys and r.get("status") in FINISHED}
    todo = [p for k, p in keys.items() if k not in kept]
    if resume and output is not None:
        stale = sum(1 for k in store.rows if k not in keys)
        if stale:
            notes.append(f"{stale} row(s) of {output} belong to other points or another jaxmove "
                         "version; kept in the file, left out of this result")
    bar = _Progress(len(todo), progress, f"sweep {spec.name}")
    rec = _Recorder(store, bar, on_row)
    t0 = time.perf_counter()
    try:
        if todo:
            if executor == "local":
                run_local(todo, rec, jobs or os.cpu_count() or 1, timeout_s)
            else:
                try:
                    run_ray(todo, rec, jobs, timeout_s, address)
                except RayUnavailableError as e:
                    raise SweepError(str(e)) from None
    finally:
        bar.close()
    if bar.retried:
        notes.append(f"{bar.retried} worker(s) died or timed out and were retried once")
    rows = [store.rows[k] for k in keys if k in store.rows]
    notes.extend(_backend_mismatch_notes(rows))
    return SweepResult(spec.name, spec.path, rows, executor, time.perf_counter() - t0, len(kept),
                       None if output is None else str(output), notes)


def _backend_mismatch_notes(rows: list[dict]) -> list[str]:
    """One note per (backend, hardware spec) pair of analysed points whose program another
    backend compiled than the spec's (the default ``cpu`` target costed on ``h100-sxm``): their
    step times rank XLA:CPU's kernels and launches, not the accelerator's program (a user
    trial's sweep ranked batch 8 of gpt-tiny-decode before batch 1 on XLA:CPU's kernel counts)."""
    from ..capture.targets import Target
    from ..hardware import load_spec

    counts: dict[tuple[str, str], int] = {}
    kinds: dict[str, str | None] = {}
    for r in rows:
        backend, hw = r.get("backend"), r.get("hardware")
        if r.get("status") != "ok" or backend not in ("cpu", "gpu", "tpu") or not hw:
            continue
        if hw not in kinds:
            try:
                kinds[hw] = load_spec(hw).kind
            except Exception:  # noqa: BLE001 - a spec that no longer loads: no note
                kinds[hw] = None
        if kinds[hw] not in (None, backend):
            counts[(backend, hw)] = counts.get((backend, hw), 0) + 1
    out = []
    for (backend, hw), n in counts.items():
        try:
            Target.parse(hw)
            target = f'target = "{hw}"'
        except Exception:  # noqa: BLE001 - a spec file that names no target
            target = f"a {kinds[hw].upper()} target"
        out.append(f"{n} point(s) are XLA:{backend.upper()} programs costed on {hw}: their step times "
                   f"and ranking are of XLA:{backend.upper()}'s kernels and launches as compiled, not "
                   f"{hw}'s program; give the points {target} (compiled without the device) to rank "
                   "the accelerator's programs")
    return out
