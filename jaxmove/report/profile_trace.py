"""Perfetto / Chrome trace of ``compare --profile``: the estimated timeline beside the capture's own.

``profile_trace(c)`` is ``chrome_trace(c.report)`` (process 1: the estimate along the schedule;
process 2: the measured times per instruction laid end to end) plus process 3: the events of one
execution of the program as the capture recorded them (the execution whose device span is the
median), at their recorded offsets from its first event, one thread per recorded line (stream).
"""

from __future__ import annotations

import json
import statistics

__all__ = ["profile_trace", "write_profile_trace"]


def profile_trace(c) -> dict:
    """The trace dict (see the module docstring). Times in microseconds (``ts``/``dur``)."""
    from .trace import chrome_trace

    out = chrome_trace(c.report)
    events = out["traceEvents"]
    by_run: dict[int, list] = {}
    for e in c.program.events:
        by_run.setdefault(e.run_id if e.run_id is not None else -1, []).append(e)
    if not by_run:
        return out
    spans = {r: max(e.end_ns for e in es) - min(e.start_ns for e in es) for r, es in by_run.items()}
    med = statistics.median_low(sorted(spans.values()))
    run = min(r for r, s in spans.items() if s == med)
    evs = sorted(by_run[run], key=lambda e: e.start_ns)
    t0 = evs[0].start_ns
    order = sorted(by_run, key=lambda r: min(e.start_ns for e in by_run[r]))
    nth = order.index(run) + 1   # (in time, 1-based: run ids may start at 0, or be none)
    events.append({"ph": "M", "pid": 3, "name": "process_name",
                   "args": {"name": f"capture: execution {nth} of {len(order)} of {c.program.label} on "
                                    f"{c.program.device}, the one of median span (as recorded)"}})
    tids: dict[str, int] = {}
    for e in evs:
        if e.line not in tids:
            tids[e.line] = len(tids) + 1
            events.append({"ph": "M", "pid": 3, "tid": tids[e.line], "name": "thread_name",
                           "args": {"name": e.line}})
        events.append({"name": e.hlo_op or e.name, "cat": "capture", "ph": "X",
                       "ts": (e.start_ns - t0) * 1e-3, "dur": e.duration_ns * 1e-3, "pid": 3,
                       "tid": tids[e.line], "args": {"kernel": e.name, "hlo_op": e.hlo_op}})
    out["otherData"]["capture"] = {"path": c.capture.path, "format": c.capture.format,
                                   "execution": run, "span_s": med * 1e-9}
    return out


def write_profile_trace(c, path) -> None:
    """Write ``profile_trace(c)`` as JSON to ``path`` (atomically: a temporary file renamed over it).

    Raises:
      jaxmove.report.outputs.OutputPathError: ``path`` cannot be written.
    """
    from .outputs import write_text_atomic
    write_text_atomic(path, json.dumps(profile_trace(c), allow_nan=False), "--trace file")
