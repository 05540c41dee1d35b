"""Estimate against a profile captured elsewhere (``jaxmove compare --profile PATH``).

``compare_profile(path)`` reads the capture (``profiles.py``), picks one program, takes its HLO
from the capture (or ``hlo=``), joins the measured kernel time to its instructions
(``profile.join_events``: per instruction per execution, kernels of one instruction summed,
nested ranges counted once), costs the same HLO with the time model on a hardware spec and puts
the two side by side, as ``compare`` does for programs run here.

What is compared:

- per instruction, on GPUs and TPUs the estimated **kernel duration** per program execution
  (``est_time_s`` less its launch gaps, ``InstructionTime.duration_s``) against the measured kernel
  time per execution (median over the executions in the capture): a profiler's kernel events
  measure the kernels, not the gaps between them. On XLA:CPU, whose thunk events hold the
  executor's per-thunk work that the per-kernel overhead models, ``est_time_s`` as ``compare``
  uses for programs run here;
- per program, the estimated program time (launch gaps and overlap included) against the
  measured **device span** of an execution (first kernel start to last kernel end, median over
  executions); a capture has no host wall time of its own;
- per-kernel error ``|est - meas| / meas``; its median and 90th percentile (linear
  interpolation, numpy's default) overall and per opcode, fusion kind and bound, with the
  time-weighted error ``sum |est - meas| / sum meas`` of each group.

The joined fraction is the part of the program's device time whose events name an instruction
of the HLO; what did not join is listed by event name, and device time that belongs to no
program (argument copies before an execution) separately.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from .compare import ErrorStats, InstructionComparison, _rows, error_stats, excluded_rows
from .profile import ProfileJoin, join_events
from .profiles import Capture, CaptureProgram, program_hlo_text, read_capture, select_program
from .run import Measurement
from .xplane import CaptureFormatError

__all__ = ["GroupError", "ProfileComparison", "compare_profile", "group_errors", "MATCH_MIN"]

#: With ``hlo=``, a capture whose program has less than this fraction of its device time on
#: events naming instructions of the HLO does not match it (an error, not a comparison).
MATCH_MIN = 0.5


@dataclass(frozen=True)
class GroupError:
    """Per-kernel errors of one group of instructions (an opcode, fusion kind or bound).

    Attributes:
      key: the group's value (``fusion``, ``kLoop``, ``memory``; ``-`` for none).
      n: instructions with an estimate and a measured time.
      median_error, p90_error: median and 90th percentile of ``|est - meas| / meas``.
      est_s, measured_s: summed estimate and measurement, seconds per execution of the program.
      weighted_error: ``sum |est - meas| / sum meas``.
    """

    key: str
    n: int
    median_error: float | None
    p90_error: float | None
    est_s: float
    measured_s: float
    weighted_error: float | None

    def to_json(self) -> dict:
        return {"key": self.key, "n": self.n, "median_error": self.median_error, "p90_error": self.p90_error,
                "est_s": self.est_s, "measured_s": self.measured_s, "weighted_error": self.weighted_error}


@dataclass(frozen=True)
class KernelFloorFit:
    """``kernel_min_duration_s`` fitted to a capture, judged on held-out kernels.

    Attributes:
      floor_s: the median measured duration per kernel of the fit half's *trivial* kernels
        (those the model gives less than ``trivial_s`` of work per kernel).
      n_fit, n_holdout: fusion instructions in each half (CRC-32 of the name even: fit).
      n_trivial_fit: trivial kernels the median is over; p10_s, p90_s: their spread.
      holdout_before, holdout_after: (median, p90) per-instruction error of the held-out
        fusions without the floor and with it.
    """

    floor_s: float
    n_fit: int
    n_holdout: int
    n_trivial_fit: int
    p10_s: float
    p90_s: float
    holdout_before: tuple[float, float]
    holdout_after: tuple[float, float]


def _floor_halves(c: "ProfileComparison") -> tuple[list, list]:
    """(fit, held out): ``c``'s fusion rows with both times and no reason to be left out,
    split by the CRC-32 of their names (even: fit, odd: held out)."""
    import zlib

    rows = [r for r in c.rows if r.opcode == "fusion" and r.measured_time_s and r.executions
            and r.est_time_s is not None and not r.excluded]
    odd = [zlib.crc32(r.name.encode()) % 2 == 1 for r in rows]
    return [r for r, o in zip(rows, odd) if not o], [r for r, o in zip(rows, odd) if o]


def fit_kernel_floor(c: "ProfileComparison", trivial_s: float = 0.5e-6) -> KernelFloorFit:
    """Fit the spec's ``kernel_min_duration_s`` to a ProfileComparison made without one
    (``dataclasses.replace(spec, kernel_min_duration_s=None)``): the fusions are split by the
    CRC-32 of their names (even: fit, odd: held out); the floor is the median measured duration
    per kernel of the fit half's kernels whose estimate per kernel is below ``trivial_s``; the
    held-out half's per-instruction errors are given without and with it.

    Raises:
      ValueError: the comparison has a floor already, or too few trivial kernels (< 10)."""
    if getattr(c.spec, "kernel_min_duration_s", None):
        raise ValueError(f"spec {c.spec.name} has a kernel_min_duration_s already: fit without it")
    fit, held = _floor_halves(c)
    trivial = sorted(r.measured_time_s / r.executions for r in fit if r.est_time_s / r.executions < trivial_s)
    if len(trivial) < 10:
        raise ValueError(f"{len(trivial)} trivial kernels in the fit half: too few to fit a floor")
    floor = float(np.median(trivial))

    def errors(fl: float) -> tuple[float, float]:
        e = np.array([abs(max(r.est_time_s, fl * r.executions) - r.measured_time_s) / r.measured_time_s
                      for r in held])
        return float(np.median(e)), float(np.percentile(e, 90))

    return KernelFloorFit(floor, len(fit), len(held), len(trivial), float(np.percentile(trivial, 10)),
                          float(np.percentile(trivial, 90)), errors(0.0), errors(floor))


def kernel_floor_holdout_errors(c: "ProfileComparison") -> tuple[float, float]:
    """(median, p90) per-instruction error of ``fit_kernel_floor``'s held-out fusions (odd
    CRC-32 of their names) in ``c``, a comparison made with the fitted floor in the spec: the
    errors ``compare`` gives. ``fit_kernel_floor``'s own ``holdout_after`` applies the floor
    per *measured* execution (max(estimate, floor x executions)); the timing pass applies it
    per modeled execution, and where a capture ran a kernel more often than the model counts
    (a100-40gb's Pax step: 30 held-out fusions measured twice per run) the two differ (p90 55%
    vs 58%)."""
    e = np.array([abs(r.est_time_s - r.measured_time_s) / r.measured_time_s for r in _floor_halves(c)[1]])
    if not len(e):
        raise ValueError("no held-out fusion with both times")
    return float(np.median(e)), float(np.percentile(e, 90))


def group_errors(rows: list[InstructionComparison], key) -> list[GroupError]:
    """GroupError per value of ``key(row)`` over the rows with both times and no reason to be
    left out (``InstructionComparison.excluded``), largest measured first."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r.est_time_s is None or not r.measured_time_s or r.excluded:
            continue
        groups.setdefault(str(key(r) or "-"), []).append((r.est_time_s, r.measured_time_s))
    out = []
    for k, pairs in groups.items():
        apes = np.array([abs(e - m) / m for e, m in pairs])
        ms = sum(m for _, m in pairs)
        out.append(GroupError(k, len(pairs), float(np.median(apes)), float(np.percentile(apes, 90)),
                              sum(e for e, _ in pairs), ms,
                              sum(abs(e - m) for e, m in pairs) / ms if ms > 0 else None))
    out.sort(key=lambda g: (-g.measured_s, g.key))
    return out


@dataclass
class ProfileComparison:
    """A program of a capture against the time model.

    Attributes:
      capture: the Capture read; program: the CaptureProgram compared.
      measurement: a Measurement built from the capture: ``wall_times_s`` are the device spans
        of the executions (no host wall time exists in a capture), ``profile`` the join.
      report: the analysis of the HLO (``report.times`` on ``spec``); report.measurement is set.
      spec, spec_note: the hardware spec and why it was chosen.
      hlo_source: where the HLO came from (the capture's HloProto, or the ``--hlo`` file).
      rows: per instruction, estimated kernel duration (``est_time_s`` on XLA:CPU) vs measured
        time per execution.
      est_field: ``duration_s`` or ``est_time_s``: which estimate the rows hold.
      stats: ErrorStats over those rows (``compare``'s definitions).
      overall: GroupError over every row; by_opcode, by_fusion_kind, by_bound: per group.
      notes: caveats.
    """

    capture: Capture
    program: CaptureProgram
    measurement: Measurement
    report: object
    spec: object
    spec_note: str
    hlo_source: str
    rows: list[InstructionComparison]
    stats: ErrorStats
    overall: GroupError | None
    by_opcode: list[GroupError]
    by_fusion_kind: list[GroupError]
    by_bound: list[GroupError]
    notes: list[str] = field(default_factory=list)
    est_field: str = "duration_s"

    @property
    def join(self) -> ProfileJoin:
        return self.measurement.profile

    def worst(self, n: int = 10) -> list[InstructionComparison]:
        """The n rows with the largest |est - meas| (seconds per execution), both times known
        and the row in the statistics (not ``excluded``)."""
        both = [r for r in self.rows if r.est_time_s is not None and r.measured_time_s and not r.excluded]
        return sorted(both, key=lambda r: -abs(r.est_time_s - r.measured_time_s))[:n]

    def to_json(self) -> dict:
        m, j, c, p = self.measurement, self.join, self.capture, self.program
        meas = m.to_json()
        meas["span"] = meas.pop("wall")
        meas["span"]["note"] = ("device span of each execution in the capture (first kernel start to "
                                "last kernel end); a capture records no host wall time")
        total_dev = sum(q.device_time_s for q in c.programs) + sum(c.outside_s.values())
        mult = {k: t.multiplicity for k, t in self.report.times.rows.items()}
        out = self._json(m, j, c, p, meas, total_dev, mult)
        for r in out["instructions"]:  # the first name of the per-instruction-execution figure
            r["measured_per_execution_s"] = r["measured_per_instruction_execution_s"]
        return out

    def _json(self, m, j, c, p, meas, total_dev, mult) -> dict:
        from .compare import instruction_figures
        analysed = instruction_figures(self.report)
        return {
            "program": {"name": m.program.name, "source": m.program.source},
            "hardware": self.spec.name, "hardware_note": self.spec_note,
            "measurement": meas,
            "stats": self.stats.to_json(),
            "baseline": {"est_time_s": None, "error": None,
                         "method": "none: a capture carries no XLA cost_analysis()"},
            "instructions": [
                {"computation": r.computation, "name": r.name, "opcode": r.opcode,
                 "est_time_s": r.est_time_s, "measured_time_s": r.measured_time_s,
                 "ratio": r.ratio, "executions": r.executions, "bound": r.bound, "share": r.share,
                 # executions = measured kernels per program execution (a while body's: per
                 # iteration; a split instruction's: each of its kernels); multiplicity = the
                 # instruction's own executions per program execution (trip counts)
                 "measured_per_kernel_s": (r.measured_time_s / r.executions
                                           if r.measured_time_s is not None and r.executions else None),
                 "multiplicity": mult.get((r.computation, r.name)),
                 "measured_per_instruction_execution_s": (
                     r.measured_time_s / mult[(r.computation, r.name)]
                     if r.measured_time_s is not None and mult.get((r.computation, r.name)) else None),
                 "excluded": r.excluded, **analysed((r.computation, r.name))}
                for r in self.rows],
            "complete": self.report.complete,
            "incomplete": self.report.incomplete_headline(),
            "capture": {
                "path": c.path, "format": c.format, "device_kind": c.device_kind,
                "device_info": dict(c.device_info), "backend": c.backend,
                "program_id": p.program_id, "module": p.module_name, "device": p.device,
                "n_devices": p.n_devices, "executions": j.runs, "hlo_source": self.hlo_source,
                "joined_fraction": j.coverage,
                "program_share_of_device_time": p.device_time_s / total_dev if total_dev > 0 else None,
                "unjoined_s": dict(j.unjoined_s),
                "outside_programs_s": dict(sorted(c.outside_s.items(), key=lambda kv: -kv[1])),
                "programs": [{"program_id": q.program_id, "module": q.module_name,
                              "device_time_s": q.device_time_s, "executions": q.runs,
                              "has_hlo": q.hlo_proto is not None or hasattr(q, "_loader")}
                             for q in c.programs],
                "notes": list(c.notes),
            },
            "errors": {
                "definition": "|est - meas| / meas per instruction; est = " + (
                    "estimated kernel duration (est_time_s less launch gaps)" if self.est_field == "duration_s"
                    else "est_time_s (XLA:CPU thunks include their per-thunk overhead)")
                    + ", meas = measured kernel time, both per execution of the program",
                "estimate": self.est_field,
                "overall": self.overall.to_json() if self.overall else None,
                "by_opcode": [g.to_json() for g in self.by_opcode],
                "by_fusion_kind": [g.to_json() for g in self.by_fusion_kind],
                "by_bound": [g.to_json() for g in self.by_bound],
            },
            "worst": [{"computation": r.computation, "name": r.name, "opcode": r.opcode,
                       "est_time_s": r.est_time_s, "measured_time_s": r.measured_time_s, "ratio": r.ratio}
                      for r in self.worst(10)],
            "notes": list(self.notes),
        }


def _spec_for(cap: Capture, hardware):
    from ..hardware import HardwareSpec, load_spec, spec_for_device_kind
    from ..errors import UsageError

    if isinstance(hardware, HardwareSpec):
        return hardware, f"spec '{hardware.name}' given"
    if hardware is not None:
        spec = load_spec(hardware)
        note = f"spec '{spec.name}' ({hardware})"
        if cap.device_kind and cap.device_kind != "cpu" and cap.device_kind.lower() not in (
                k.lower() for k in spec.device_kinds):
            note += f"; WARNING: the capture ran on {cap.device_kind}, which this spec does not list"
        return spec, note
    if cap.backend == "cpu":
        from .compare import default_hardware
        return default_hardware("cpu")
    spec = spec_for_device_kind(cap.device_kind) if cap.device_kind else None
    if spec is None:
        what = f"device '{cap.device_kind}'" if cap.device_kind else "the capture's device (it is not named)"
        raise UsageError(f"{cap.path}: no built-in hardware spec for {what}; pass --hardware NAME|path.toml "
                         "(`jaxmove hardware` lists the specs)")
    return spec, f"built-in spec for the capture's device '{cap.device_kind}'"


def _spans_s(events) -> list[float]:
    by: dict[int, list] = {}
    for e in events:
        if e.run_id is not None:
            by.setdefault(e.run_id, []).append(e)
    return [(max(e.end_ns for e in es) - min(e.start_ns for e in es)) * 1e-9 for _, es in sorted(by.items())]


def _check_shapes_against_capture(prog, module, join, hlo_source: str, cap_path: str) -> None:
    """With ``--hlo`` and a capture that carries the program's own HLO: the joined
    instructions must have the shapes the capture's HLO gives them (names alone match any
    program that happens to use them: a user trial joined a one-dot module to an 8192 x 8192 x
    4096 GEMM at 100%). Raises CaptureFormatError naming the first instructions that differ."""
    from ..hlo import HloParseError, parse_module

    try:
        own_text = program_hlo_text(prog)
    except CaptureFormatError:
        return
    if own_text is None:
        return
    try:
        own = parse_module(own_text, prog.hlo_where or cap_path)
    except HloParseError:
        return
    own_shape = {i.name: i.shape for c in own.computations.values() for i in c.instructions}
    differ = []
    for (cname, name) in join.instructions:
        a, b = own_shape.get(name), module.computations[cname].by_name[name].shape
        if a is not None and (a.element_type, a.dims, a.is_tuple) != (b.element_type, b.dims, b.is_tuple):
            differ.append(f"{name}: {b} in {hlo_source}, {a} in the capture")
    if differ:
        raise CaptureFormatError(
            f"{cap_path}: program {prog.label} does not match {hlo_source}: {len(differ)} joined "
            f"instruction(s) have other shapes there than in the capture's own HLO ("
            + "; ".join(differ[:3]) + ")")


def compare_profile(path: str | os.PathLike, *, hlo: str | os.PathLike | None = None,
                    program: str | int | None = None, hardware=None,
                    capture: Capture | None = None) -> ProfileComparison:
    """Compare the time model with a capture (module docstring).

    Args:
      path: an XProf profile directory or ``.xplane.pb``, a ``jax.profiler`` trace JSON(.gz),
        or an nsys-jax archive / directory.
      hlo: an HLO text file (or binary HloProto ``.pb``/``.pb.xz``) of the program; default: the
        HloProto the capture carries.
      program: program id or HloModule name (``profiles.select_program``).
      hardware: spec name / path / HardwareSpec; default: the built-in spec of the capture's
        device (the calibrated or cpu-generic spec for a CPU capture).
      capture: an already read Capture of ``path``.

    Raises:
      FileNotFoundError; CaptureFormatError (bad or unknown capture, no such program, an HLO
      that does not match the capture); UsageError (no HLO in the capture and none given, no
      spec for the device); HloParseError; HardwareSpecError.
    """
    from ..api import analyze
    from ..capture.program import Program, infer_backend
    from ..errors import UsageError
    from ..hlo import parse_module

    cap = capture or read_capture(path)
    hlo_text, hlo_module_name = None, None
    aliases: dict[str, str] = {}  # names only the proto shows (async ops' wrapped instructions)
    if hlo is not None:
        h = os.fspath(hlo)
        if h.endswith((".pb", ".pb.xz")):
            import lzma
            from .hloproto import async_wrapped_names, hlo_text_from_proto
            with open(h, "rb") as f:
                data = f.read()
            if h.endswith(".xz"):
                try:
                    data = lzma.decompress(data)
                except lzma.LZMAError as e:
                    raise CaptureFormatError(f"{h}: not a readable .xz file ({e})") from None
            hlo_text = hlo_text_from_proto(data, h)
            aliases = async_wrapped_names(data)
        else:
            from ..hlo.parser import read_hlo_text
            hlo_text = read_hlo_text(h)
        module = parse_module(hlo_text, h)
        hlo_module_name = module.name
        hlo_source = h
    prog = select_program(cap, program, hlo_module_name)
    if hlo is None:
        hlo_text = program_hlo_text(prog)
        if hlo_text is None:
            why = " (a trace JSON never does)" if cap.format == "trace-json" else ""
            raise UsageError(f"{cap.path}: the capture carries no HLO of program {prog.label}{why}; "
                             "pass --hlo FILE (the optimized HLO of the same run)")
        hlo_source = prog.hlo_where or cap.path
        module = parse_module(hlo_text, hlo_source)
        if prog.hlo_proto is not None:
            from .hloproto import async_wrapped_names
            aliases = async_wrapped_names(prog.hlo_proto)
    if not prog.events:
        raise CaptureFormatError(f"{cap.path}: program {prog.label} has no events in the capture")
    runs = prog.runs
    join = join_events(prog.events, module, expected_runs=max(runs, 1), exclusive=prog.exclusive,
                       aliases=aliases)
    notes = []
    if hlo is not None and join.coverage < MATCH_MIN:
        names = {i.name for c in module.computations.values() for i in c.instructions}
        missing = sorted({e.hlo_op for e in prog.events if e.hlo_op and e.hlo_op not in names})[:5]
        raise CaptureFormatError(
            f"{cap.path}: program {prog.label} does not match {hlo_source}: only "
            f"{join.coverage:.0%} of its device time names instructions of that HLO "
            f"(module '{module.name}'; the capture names e.g. {', '.join(missing) or 'no instruction'})")
    if hlo is not None:
        _check_shapes_against_capture(prog, module, join, hlo_source, cap.path)
    if runs == 0:
        notes.append("the capture does not tell the executions apart: per-execution figures are "
                     "totals over the whole capture")
    if prog.n_devices > 1:
        notes.append(f"the program ran on {prog.n_devices} devices; {prog.device} is compared "
                     "(the estimate is per device)")
    spec, spec_note = _spec_for(cap, hardware)
    backend = infer_backend(hlo_text)
    if backend == "unknown":
        backend = cap.backend
    prg = Program(name=module.name, hlo_text=hlo_text, backend=backend, num_devices=1, memory_stats={},
                  parameters=(), source=f"hlo:{hlo_source}", xla_cost_analysis=None, config={}, target=None,
                  notes=(f"measured in the {cap.format} capture {cap.path}",))
    report = analyze(prg, hardware=spec)
    spans = _spans_s(prog.events) or [join.busy_s or join.device_time_s]
    m = Measurement(prg, cap.device_kind or cap.backend, cap.backend, 0, tuple(spans), join,
                    tuple(notes))
    report.measurement = m
    times = report.times
    field_ = "est_time_s" if cap.backend == "cpu" else "duration_s"
    dur_rows = {k: SimpleNamespace(est_time_s=getattr(r, field_)) for k, r in times.rows.items()}
    shim = SimpleNamespace(rows=dur_rows, est_time_s=times.est_time_s,
                           dispatch_overhead_s=getattr(times, "dispatch_overhead_s", 0.0))
    excluded = excluded_rows(report)
    stats = error_stats(shim, m, exclude=excluded, lower_bound=not report.complete)
    rows = _rows(report, m, field_, excluded)
    fk = {(r.computation, r.instr.name): r.instr.fusion_kind for r in report.rows}
    overall = group_errors(rows, lambda r: "all")
    return ProfileComparison(
        cap, prog, m, report, spec, spec_note, hlo_source, rows, stats,
        overall[0] if overall else None,
        group_errors(rows, lambda r: r.opcode),
        group_errors(rows, lambda r: fk.get((r.computation, r.name))),
        group_errors(rows, lambda r: r.bound), notes, field_)


