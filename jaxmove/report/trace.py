"""Chrome trace JSON of the estimated timeline (and a measured lane), for ui.perfetto.dev.

Trace Event Format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
``ts``/``dur`` in microseconds. Process 1 ("estimate"): one ``"ph": "X"`` event per entry of
``report.times.timeline``, while loops expanded per iteration and calls inline (up to
``MAX_EVENTS``); async operations on "async" threads from start to done. Process 2
("measured", with a Measurement): measured exclusive times of the same entries laid end to end
(the profile's start times are not kept). Without ``report.times`` there is no timeline.
"""

from __future__ import annotations


from ..hlo.opcodes import names
from ..passes.multiplicity import callee_counts
from .attribution import attribute

#: At most this many instruction events (while loops beyond it stay one block each).
MAX_EVENTS = 200_000
# Deepest nest of while / call bodies laid out inside their blocks (each level is two Python
# frames here: a 10,000-deep call chain hit the recursion limit); deeper ones are one block.
MAX_EXPAND_DEPTH = 64

_ASYNC_STARTS = names(async_part="start")  # the opcode table (hlo/opcodes.py)


def _is_async(opcode: str) -> bool:
    return opcode in _ASYNC_STARTS


def _measured_s(report, measurement, comp: str, name: str) -> float | None:
    """Measured seconds per program run of one timeline entry, or None when not measured."""
    table = measurement.instructions
    t = table.get((comp, name))
    if t is not None:
        return t.time_s
    instr = report.module.computations.get(comp)
    instr = instr.by_name.get(name) if instr is not None else None
    if instr is None or not instr.called_computations or instr.opcode == "fusion":
        return None
    inside = report.module.reachable_computations(instr.called_computations)
    ts = [v.time_s for (c, _n), v in table.items() if c in inside]
    return sum(ts) if ts else None


class _SubTimelines:
    """Schedules of called computations (start/end relative to the computation's start),
    from the time model's own walker so that they agree with the program timeline."""

    def __init__(self, module, rows, branches):
        self.module, self.rows, self.branches = module, rows, branches
        self._cache: dict[str, tuple[list, float]] = {}

    def _get(self, cname: str) -> tuple[list, float]:
        if cname not in self._cache:
            from ..passes.timing import _Walker  # the walker that built times.timeline
            w = _Walker(self.module, self.rows, self.branches)
            length = w.comp_time(cname, record=True)
            self._cache[cname] = (list(w.timeline), length)
        return self._cache[cname]

    def timeline(self, cname: str) -> list:
        return self._get(cname)[0]

    def length(self, cname: str) -> float:
        return self._get(cname)[1]


def chrome_trace(report, measurement=None) -> dict:
    """The trace as a dict (``json_out.dumps_json`` it).

    Args:
      report: a Report with ``times`` (analysed with a hardware spec).
      measurement: a ``jaxmove.measure.Measurement`` for the measured lane; defaults to
        ``report.measurement`` when present.
    Returns:
      ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}`` with one
      ``"ph": "X"`` event per timeline entry in process 1 (plus, with a measurement, one per
      measured entry in process 2) and ``"ph": "M"`` name events.
    Raises:
      jaxmove.errors.UsageError: the report has no estimated times.
    """
    times = report.times
    if times is None:
        from ..errors import UsageError
        raise UsageError("a trace needs the estimated timeline: analyse with a hardware spec "
                         "(--hardware NAME|path.toml|local, or jaxmove.analyze(..., hardware=...))")
    module = report.module
    spec_name = times.spec_name
    events: list[dict] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"estimate ({spec_name})"}},
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "stream"}},
    ]
    lanes_end: list[float] = []   # async lanes: end time of their last event
    rows = times.rows
    notes: list[str] = []
    budget = [MAX_EVENTS]
    sub = _SubTimelines(module, rows, report.analysis.branches)

    def lane(opcode: str, start_s: float, end_s: float) -> int:
        if not _is_async(opcode):
            return 1
        for k, end in enumerate(lanes_end):
            if end <= start_s:
                lanes_end[k] = end_s
                return 2 + k
        lanes_end.append(end_s)
        events.append({"ph": "M", "pid": 1, "tid": 1 + len(lanes_end), "name": "thread_name",
                       "args": {"name": f"async {len(lanes_end)}"}})
        return 1 + len(lanes_end)

    def emit(comp: str, name: str, start_s: float, end_s: float, depth: int = 0) -> None:
        c = module.computations.get(comp)
        instr = c.by_name.get(name) if c is not None else None
        opcode = instr.opcode if instr is not None else "?"
        args = {"computation": comp, "opcode": opcode}
        it = rows.get((comp, name))
        if it is not None:
            args.update(est_time_s=it.est_time_s, per_execution_s=it.per_execution_s)
            for k, v in (("bound", it.bound), ("flops", it.flops), ("hbm_bytes", it.hbm_bytes),
                         ("arithmetic_intensity", it.arithmetic_intensity),
                         ("multiplicity", it.multiplicity)):
                if v is not None:
                    args[k] = v
        if instr is not None:
            att = attribute(module, instr)
            if att.source is not None:
                args["source"] = att.source_key
            if att.op_name:
                args["op_name"] = att.op_name
        budget[0] -= 1
        events.append({"name": name, "cat": (it.bound if it is not None else None) or opcode, "ph": "X",
                       "ts": start_s * 1e6, "dur": max(end_s - start_s, 0.0) * 1e6,
                       "pid": 1, "tid": lane(opcode, start_s, end_s), "args": args})
        if instr is not None and instr.opcode in ("while", "call"):
            if depth >= MAX_EXPAND_DEPTH:
                notes.append(f"{instr.name}: calls nested deeper than {MAX_EXPAND_DEPTH} levels "
                             "not expanded; shown as one block")
                return
            expand(instr, start_s, depth)

    def expand(instr, start_s: float, depth: int) -> None:
        """Lay out the computations a while (every iteration) or call runs, inside its block."""
        if instr.opcode == "call":
            plan = [(c, 1) for c in instr.called_computations]
        else:
            counts = callee_counts(instr, module)   # [(body, n, ...), (condition, n + 1, ...)]
            (body, n, *_), (cond, _n1, *_) = counts
            plan = [(cond, 1)] + [(body, 1), (cond, 1)] * n
        needed = sum(len(sub.timeline(c)) for c, _k in plan)
        if needed > budget[0]:
            notes.append(f"{instr.name}: {needed} executed instructions inside not expanded "
                         f"(trace limit {MAX_EVENTS} events); shown as one block")
            return
        cursor = start_s
        for c, _k in plan:
            for comp, name, s0, e0 in sub.timeline(c):
                emit(comp, name, cursor + s0, cursor + e0, depth + 1)
            cursor += sub.length(c)

    for comp, name, start_s, end_s in times.timeline:
        emit(comp, name, start_s, end_s)

    m = measurement if measurement is not None else report.measurement
    other = {"program": report.program.name, "hardware": spec_name,
             "est_time_s": times.est_time_s, "notes": notes}
    if m is not None:
        events += [{"ph": "M", "pid": 2, "name": "process_name",
                    "args": {"name": f"measured ({m.device_kind}; durations laid end to end)"}},
                   {"ph": "M", "pid": 2, "tid": 1, "name": "thread_name", "args": {"name": "measured"}}]
        cursor = 0.0
        for comp, name, _s, _e in times.timeline:
            ms = _measured_s(report, m, comp, name)
            if ms is None:
                continue
            events.append({"name": name, "cat": "measured", "ph": "X", "ts": cursor * 1e6,
                           "dur": ms * 1e6, "pid": 2, "tid": 1,
                           "args": {"computation": comp, "measured_s": ms}})
            cursor += ms
        other["measured_wall_median_s"] = m.wall_median_s
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def write_trace(report, path, measurement=None) -> None:
    """Write ``chrome_trace(report, measurement)`` as JSON to ``path`` (a temporary file
    renamed over it, so an error never leaves a partial trace).

    Raises:
      ValueError: the report has no time estimates (``chrome_trace``).
      jaxmove.report.outputs.OutputPathError: ``path`` cannot be written.
    """
    from .json_out import Streamed, write_json
    from .outputs import write_atomic
    trace = chrome_trace(report, measurement)
    events = trace["traceEvents"]  # written a batch at a time: the text is never one string
    trace["traceEvents"] = Streamed(lambda: iter(events), len(events))
    write_atomic(path, lambda f: write_json(trace, f), "--trace file")
