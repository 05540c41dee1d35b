"""Profile events -> per-instruction measured time.

``record_events`` runs a callable under ``jax.profiler.trace`` and reads the XSpace it
wrote with ``jax.profiler.ProfileData``; ``join_events`` assigns each event to the HLO
instruction it executed and sums the time per instruction per program run.

What the backends emit (read from the traces; see ``tests/test_measure.py``):

- XLA:CPU (jaxlib 0.10): the thunk executor records one event per executed thunk on the
  host plane ``/host:CPU``, on the thread that ran it, named after the HLO instruction,
  with stats ``hlo_module`` (the ``HloModule`` name, e.g. ``jit_decode``), ``hlo_op``
  (the instruction name), ``program_id`` and ``run_id`` (one per execution of the
  program) and ``device_ordinal``. Thunks of one run spread over the pool's threads.
  A ``while`` thunk's event spans its whole loop: the body's and condition's thunks are
  their own events, once per iteration, nested inside its interval (possibly on other
  threads). ``ThunkExecutor::Execute (wait for completion)`` carries ``run_id`` but no
  ``hlo_op``: it is the caller waiting, not work, and is not counted.
- GPU: kernels are events on ``/device:GPU:N`` planes carrying the same ``hlo_module`` /
  ``hlo_op`` stats; the host plane also holds launch annotations with those stats, so
  when any device plane has matching events only device planes are used.

Time per event is *exclusive*: a control-flow instruction (``while``, ``conditional``,
``call``) is charged its duration minus the union of the intervals of the events of the
computations it calls (transitively), so no time is counted twice. Times are in seconds
per program run: the median over the profiled runs of the per-run sum.
"""

from __future__ import annotations

import glob
import os
import re
import statistics
import tempfile
from dataclasses import dataclass, field
from typing import Callable

from ..hlo import Module
from ..hlo.opcodes import names

__all__ = [
    "TraceEvent", "InstructionTiming", "ProfileJoin", "ProfileError", "CONTAINER_OPCODES",
    "record_events", "read_xspace", "module_events", "join_events",
]

#: Opcodes whose thunk runs the thunks of the computations it calls inside its own interval.
CONTAINER_OPCODES = names(control_flow=True) - {"async-start"}  # hlo/opcodes.py
# callers whose computation runs as part of them: events naming an instruction inside are theirs
_WRAPPING_OPCODES = frozenset({"fusion", "async-start"})

# Lines that xprof derives from the stream lines of a device plane (their events repeat
# the kernels'); only raw lines are read.
_DERIVED_LINES = frozenset({"XLA Ops", "XLA Modules", "Steps", "Framework Ops", "Framework Name Scope",
                            "Source code", "Launch Stats", "XLA TraceMe", "TensorFlow Ops"})


class ProfileError(RuntimeError):
    """The profile holds no usable events for the program (names what it did hold)."""


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One profile event that names an HLO module.

    Attributes:
      hlo_module: the ``hlo_module`` stat (the HloModule name).
      hlo_op: the ``hlo_op`` stat (an instruction name), or None when absent.
      name: the event name as recorded.
      start_ns, duration_ns: absolute start and duration, nanoseconds.
      run_id: the ``run_id`` stat (one per program execution) or None.
      device_ordinal: the ``device_ordinal`` stat or None.
      plane, line: where it was recorded (``/host:CPU``, a thread / stream name).
    """

    hlo_module: str
    hlo_op: str | None
    name: str
    start_ns: float
    duration_ns: float
    run_id: int | None
    device_ordinal: int | None
    plane: str
    line: str

    @property
    def end_ns(self) -> float:
        return self.start_ns + self.duration_ns


def read_xspace(path: str | os.PathLike) -> list[TraceEvent]:
    """Every event with an ``hlo_module`` stat in an ``.xplane.pb`` file.

    Raises:
      FileNotFoundError: no such file.
    """
    import jax

    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    data = jax.profiler.ProfileData.from_file(os.fspath(path))
    out: list[TraceEvent] = []
    for plane in data.planes:
        for line in plane.lines:
            if line.name in _DERIVED_LINES:
                continue
            for ev in line.events:
                stats = dict(ev.stats)
                mod = stats.get("hlo_module")
                if mod is None:
                    continue
                op = stats.get("hlo_op")
                run = stats.get("run_id")
                dev = stats.get("device_ordinal")
                out.append(TraceEvent(str(mod), str(op) if op is not None else None, ev.name,
                                      float(ev.start_ns), float(ev.duration_ns),
                                      int(run) if run is not None else None,
                                      int(dev) if dev is not None else None,
                                      plane.name, line.name))
    return out


def record_events(fn: Callable[[], object], logdir: str | None = None) -> list[TraceEvent]:
    """Run ``fn()`` under ``jax.profiler.trace`` and return the module events it recorded.

    ``fn`` must block until its device work is done (``jax.block_until_ready``).
    The trace goes to ``logdir`` (kept) or to a temporary directory (removed).

    Raises:
      ProfileError: the profiler wrote no ``.xplane.pb`` file.
    """
    import jax

    def _run(d: str) -> list[TraceEvent]:
        with jax.profiler.trace(d):
            fn()
        files = sorted(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True),
                       key=os.path.getmtime)
        if not files:
            raise ProfileError(f"jax.profiler.trace wrote no .xplane.pb under {d}")
        return read_xspace(files[-1])

    if logdir is not None:
        return _run(logdir)
    with tempfile.TemporaryDirectory(prefix="jaxmove-profile-") as d:
        return _run(d)


def module_events(events: list[TraceEvent], module_name: str) -> list[TraceEvent]:
    """The events of one HloModule, from device planes when any device plane has them.

    Raises:
      ProfileError: no event names ``module_name`` (the message lists the modules seen).
    """
    mine = [e for e in events if e.hlo_module == module_name and e.hlo_op is not None]
    if not mine:
        seen = sorted({e.hlo_module for e in events})
        raise ProfileError(f"the profile has no events of HLO module '{module_name}'; "
                           f"modules seen: {', '.join(seen) or 'none'}")
    on_device = [e for e in mine if e.plane.startswith("/device:")]
    mine = on_device or mine
    ordinals = {e.device_ordinal for e in mine if e.device_ordinal is not None}
    if len(ordinals) > 1:  # one device's view: the estimate is per device
        first = min(ordinals)
        mine = [e for e in mine if e.device_ordinal in (first, None)]
    return mine


@dataclass(frozen=True)
class InstructionTiming:
    """Measured time of one instruction.

    Attributes:
      computation, name, opcode: the instruction.
      time_s: exclusive time per program run, seconds (median over profiled runs).
      executions: events per program run (median; a while body's instruction runs once
        per iteration).
      run_times_s: exclusive time in each profiled run, seconds.
    """

    computation: str
    name: str
    opcode: str
    time_s: float
    executions: float
    run_times_s: tuple[float, ...]


@dataclass(frozen=True)
class ProfileJoin:
    """Profile events joined to a module's instructions.

    Attributes:
      module_name: the HloModule name the events were selected by.
      runs: program runs found in the profile (distinct ``run_id`` s, or the expected
        count when the backend records none).
      instructions: ``(computation, instruction name)`` -> InstructionTiming.
      device_time_s: exclusive event time per run (median), seconds: all events of the
        module, joined or not. Summed over threads, so it can exceed ``span_s`` when
        thunks run concurrently.
      joined_time_s: the part of it whose events name an instruction of the module.
      unjoined_s: event name -> time per run (mean over runs) of events naming no instruction.
      span_s: first event start to last event end of a run (median), seconds; None
        when the events carry no ``run_id``.
      busy_s: length of the union of the run's event intervals (median), seconds:
        ``span_s - busy_s`` is time with no thunk running (executor scheduling, waits);
        None without ``run_id``.
      joined_share: joined over device time, both summed over every run (``coverage``).
    """

    module_name: str
    runs: int
    instructions: dict[tuple[str, str], InstructionTiming]
    device_time_s: float
    joined_time_s: float
    unjoined_s: dict[str, float] = field(default_factory=dict)
    span_s: float | None = None
    busy_s: float | None = None
    joined_share: float | None = None

    @property
    def coverage(self) -> float:
        """The share of the device time whose events name an instruction: ``joined_share``
        (over every run: joined / device time summed, not a ratio of two medians, which may
        come from different runs), else joined_time_s / device_time_s (1.0 when no device
        time was recorded)."""
        if self.joined_share is not None:
            return self.joined_share
        return self.joined_time_s / self.device_time_s if self.device_time_s > 0 else 1.0

    @property
    def unjoined_time_s(self) -> float:
        return sum(self.unjoined_s.values())


def _union_ns(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


_KERNEL_SUFFIX = re.compile(r"\.kd$")       # an AMD kernel descriptor's suffix
_KERNEL_NUMBER = re.compile(r"_([0-9]+)$")  # XLA:GPU's kernel name of instruction 'name.N'


def _by_kernel_name(kernel: str, where: dict, memo: dict):
    """The (computation, instruction) an event without ``hlo_op`` names by its kernel name, or
    None: XLA:GPU names a fusion's kernel after the instruction with '.' made '_'
    (``input_transpose_fusion.1`` -> ``input_transpose_fusion_1``; rocprofiler adds ``.kd``).
    Only an exact instruction name after that counts (``Im3d2Col.kd``, a library kernel,
    names none)."""
    if kernel in memo:
        return memo[kernel]
    base = _KERNEL_SUFFIX.sub("", kernel or "")
    hit = where.get(base)
    if hit is None:
        dotted = _KERNEL_NUMBER.sub(r".\1", base)
        hit = where.get(dotted) if dotted != base else None
    memo[kernel] = hit
    return hit


def join_events(events: list[TraceEvent], module: Module, expected_runs: int | None = None,
                exclusive: bool = False, aliases: dict[str, str] | None = None) -> ProfileJoin:
    """Join one module's events to its instructions by instruction name.

    An event that names an instruction inside a fusion or an async op's wrapped computation
    (a reduction fusion's second kernel, ``#hlo_op=reduce.1773.1#``; the collective an
    ``async-start`` wraps) is charged to the fusion / the start: the instruction the estimate
    is for. ``aliases`` maps names the HLO text does not show to an instruction that it does
    (``hloproto.async_wrapped_names``: jaxlib prints async ops without the computation they
    wrap).

    Args:
      events: events of this module only (``module_events``).
      module: the parsed HLO that ran (instruction names are unique in a module).
      expected_runs: program runs inside the trace; used when events carry no ``run_id``
        (then per-run times are totals divided by it, and every run reads the same).
      exclusive: the events' durations are already exclusive (a reader that knows the
        nesting, e.g. nsys-jax's NVTX parent ids, subtracted the children): no container
        subtraction here.

    Returns:
      A ProfileJoin; per-instruction and per-run times in seconds per program run.

    Raises:
      ProfileError: no events, or no run_id and no ``expected_runs``.
    """
    if not events:
        raise ProfileError(f"no profile events for module '{module.name}'")
    where: dict[str, tuple[str, object]] = {}
    caller: dict[str, tuple[str, object]] = {}  # fused / async-wrapped computation -> its caller
    for comp in module.computations.values():
        for instr in comp.instructions:
            where.setdefault(instr.name, (comp.name, instr))
            if instr.opcode in _WRAPPING_OPCODES:
                for c in instr.called_computations:
                    caller.setdefault(c, (comp.name, instr))
    if caller:
        for name, hit in where.items():
            seen = 0
            while hit[0] in caller and seen < len(caller):  # (up through nested fusions)
                hit = caller[hit[0]]
                seen += 1
            where[name] = hit
    for alias, name in (aliases or {}).items():
        if alias not in where and name in where:
            where[alias] = where[name]
    by_kernel: dict[str, tuple | None] = {}  # kernel name of an event without hlo_op -> its hit
    by_run: dict[int | None, list[TraceEvent]] = {}
    for e in events:
        by_run.setdefault(e.run_id, []).append(e)
    if None in by_run and len(by_run) > 1:  # a mix: fold the id-less events into the total
        by_run = {None: events}
    if None in by_run:
        if not expected_runs:
            raise ProfileError("profile events carry no run_id; pass expected_runs")
        runs, scale = [by_run[None]], 1.0 / expected_runs
        n_runs = expected_runs
    else:
        runs, scale = [by_run[k] for k in sorted(by_run)], 1.0
        n_runs = len(runs)

    desc_cache: dict[str, set[str]] = {}
    per_instr: dict[tuple[str, str], list[tuple[float, int]]] = {}
    device, joined, spans, busy = [], [], [], []
    unjoined: dict[str, float] = {}
    for run in runs:
        times: dict[tuple[str, str], list] = {}
        run_total = run_joined = 0.0
        for e in run:
            hit = where.get(e.hlo_op) if e.hlo_op else _by_kernel_name(e.name, where, by_kernel)
            dur = e.duration_ns
            if hit is not None:
                cname, instr = hit
                if instr.opcode in CONTAINER_OPCODES and not exclusive:
                    if instr.name not in desc_cache:
                        desc_cache[instr.name] = module.reachable_computations(
                            instr.called_computations, through_fusions=False)
                    inner = desc_cache[instr.name]
                    nested = [(max(c.start_ns, e.start_ns), min(c.end_ns, e.end_ns)) for c in run
                              if c is not e and c.hlo_op in where and where[c.hlo_op][0] in inner
                              and c.start_ns < e.end_ns and c.end_ns > e.start_ns]
                    dur = max(0.0, dur - _union_ns(nested))
                acc = times.setdefault((cname, instr.name), [0.0, 0])
                acc[0] += dur
                acc[1] += 1
                run_joined += dur
            else:
                unjoined[e.hlo_op or e.name] = unjoined.get(e.hlo_op or e.name, 0.0) + dur * 1e-9 / len(runs) * scale
            run_total += dur
        for key, (t, n) in times.items():
            per_instr.setdefault(key, []).append((t * 1e-9 * scale, n))
        device.append(run_total * 1e-9 * scale)
        joined.append(run_joined * 1e-9 * scale)
        spans.append((max(e.end_ns for e in run) - min(e.start_ns for e in run)) * 1e-9)
        busy.append(_union_ns([(e.start_ns, e.end_ns) for e in run]) * 1e-9)

    instructions: dict[tuple[str, str], InstructionTiming] = {}
    for (cname, name), vals in per_instr.items():
        # an instruction missing from some run counts 0 there
        ts = [t for t, _ in vals] + [0.0] * (len(runs) - len(vals))
        ns = [n for _, n in vals] + [0] * (len(runs) - len(vals))
        n_exec = statistics.median(ns) * scale
        instructions[(cname, name)] = InstructionTiming(
            cname, name, where[name][1].opcode, statistics.median(ts), n_exec, tuple(ts))
    single = scale != 1.0
    return ProfileJoin(
        module_name=module.name, runs=n_runs, instructions=instructions,
        device_time_s=statistics.median(device), joined_time_s=statistics.median(joined),
        unjoined_s=dict(sorted(unjoined.items(), key=lambda kv: -kv[1])),
        span_s=None if single else statistics.median(spans),
        busy_s=None if single else statistics.median(busy),
        joined_share=sum(joined) / sum(device) if sum(device) > 0 else None)
