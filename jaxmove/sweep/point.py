"""One point of a sweep, compiled and analysed in this process: the row of the results.

The work is the existing API's, not a copy of it: a point with a mesh is
``plans.capture_with_plan`` (the plan's partitioned per-device program) then ``api.analyze``
on the point's hardware spec, summarised by ``plans.compare.summarize`` (the same memory,
``fits`` and wire-bytes figures as ``jaxmove plans``); a point without a mesh is
``capture.resolve_program`` + ``api.analyze`` (what ``jaxmove analyze`` does), summarised
the same way.

Row (``run_point``'s dict; JSON keys are stable, keys may be added, never removed). Figures
are per device, for one program run:

======================  ========================================================================
key                     ``point_key``: hash of the point's inputs and of jaxmove/jax versions
status                  ``ok`` (analysed; ``fits`` may be False), ``error`` (the point cannot be
                        compiled: bad ``--set`` value, compile error), ``died`` / ``timeout``
                        (its worker process died or ran out of time, twice)
error                   the error line, or None
model, target,          the point's inputs (``mesh`` as ``data=2,model=4``; ``plan`` None without
hardware, mesh, plan,   a mesh; ``overrides`` the ``--set`` values as text)
overrides
mesh_axes               the mesh as ``{axis: size}`` (as ``jaxmove plans --json`` gives ``mesh``;
                        ``{}`` without a mesh; DataFrame / Parquet columns ``mesh.<axis>``)
num_devices, backend    devices of the mesh (1 without); the backend that compiled it
fits                    peak_bytes <= the spec's HBM capacity (None when XLA gave no memory stats);
                        on a TPU target the compiler's verdict (``plans.compare.summarize``)
does_not_fit,           the target compiler refused the program for lack of device memory: its
needs_bytes, has_bytes  message and figures (``capture.targets.DoesNotFitError``); where no compiler
                        refused it but ``fits`` is false, needs/has are ``peak_bytes`` and the
                        spec's capacity (as ``jaxmove plans --json`` gives them); else None
peak_bytes              memory per device: arguments + outputs - aliased + temporaries (XLA's
                        ``memory_analysis`` of the compiled program), or ``xla_peak_bytes`` where
                        larger; on TPU targets ``xla_peak_bytes`` (see ``plans.PlanResult``)
xla_peak_bytes          XLA's own ``peak_memory_in_bytes``, where the compiler reports one
argument_bytes,         XLA's memory_analysis fields
output_bytes,
alias_bytes, temp_bytes
hbm_capacity_bytes      the spec's HBM per device
flops, hbm_bytes,       jaxmove's totals (``report.totals``)
hbm_read_bytes,
hbm_write_bytes
hbm_bytes_by_role       {role: read + write HBM bytes} for every role of ``vocab.ROLES``
excess_bytes,           bytes moved beyond the compulsory minimum (compiled - compulsory, every
compulsory_bytes,       path) and the costliest cause of the excess (``report.excess``,
excess_top_cause        ``passes/excess.py``); None when the point was not analysed (an error,
                        a compile the target refused) or its report has no excess analysis
wire_bytes,             bytes one device sends over the interconnect, in all and by collective
wire_bytes_by_kind      kind (``all-reduce``, ``all-gather``, ...)
collective_time_s       summed collective time (no overlap), None without interconnect figures
est_time_s, bound       estimated step time on the spec (``passes/timing``: schedule with async
                        overlap) and its bound (compute / memory / network / overhead)
compute_time_s,         summed components of that estimate
memory_time_s,
network_time_s
unmodeled               instructions jaxmove could not model (listed in ``analyze``)
time_unmodeled          instructions whose time estimate is incomplete
compile_s               seconds to trace, lower and compile the program (capture)
analysis_s              seconds of jaxmove's analysis
wall_s                  seconds of the whole point in its worker (imports excluded)
attempts                worker processes used (2 when the first died or timed out)
notes                   plan notes (dropped rules) and the report's notes
jaxmove_version,        versions in the worker
jax_version
======================  ========================================================================
"""

from __future__ import annotations

import time
from importlib import metadata

from .spec import Point

#: Row keys every row has, in order (figures None where a point has none: a failed point's row
#: has every key of an analysed one, so JSON readers can index any row).
ROW_KEYS = (
    "key", "status", "error", "model", "target", "hardware", "mesh", "plan", "overrides",
    "num_devices", "backend", "fits", "peak_bytes", "argument_bytes", "output_bytes", "alias_bytes",
    "temp_bytes", "hbm_capacity_bytes", "flops", "hbm_bytes", "hbm_read_bytes", "hbm_write_bytes",
    "hbm_bytes_by_role", "wire_bytes", "wire_bytes_by_kind", "collective_time_s", "est_time_s",
    "bound", "compute_time_s", "memory_time_s", "network_time_s", "unmodeled", "time_unmodeled",
    "compile_s", "analysis_s", "wall_s", "attempts", "notes", "jaxmove_version", "jax_version",
    "does_not_fit", "needs_bytes", "has_bytes", "excess_bytes", "compulsory_bytes", "excess_top_cause",
    "xla_peak_bytes", "mesh_axes",
)


def empty_row(point: Point, status: str = "ok", error: str | None = None) -> dict:
    """A row with the point's inputs and every figure None (for failed points)."""
    from .. import __version__

    row = dict.fromkeys(ROW_KEYS)
    row.update(key=point.key, status=status, error=error, model=point.model, target=point.target,
               hardware=point.hardware, mesh=point.mesh_text, plan=point.plan,
               mesh_axes=dict(point.mesh or ()),
               overrides=dict(point.overrides), num_devices=point.num_devices,
               hbm_bytes_by_role={}, wire_bytes_by_kind={}, notes=[], attempts=1,
               jaxmove_version=__version__, jax_version=metadata.version("jax"))
    return row


def _is_out_of_memory(e: BaseException) -> bool:
    """A compile that ran out of device memory (XLA's RESOURCE_EXHAUSTED): a result, not a failure."""
    return "RESOURCE_EXHAUSTED" in str(e) or "Ran out of memory" in str(e)


def _excess(report) -> dict:
    """``excess_bytes``, ``compulsory_bytes`` and ``excess_top_cause`` of the report's excess
    analysis (``passes/excess.py``: compiled minus compulsory bytes); {} when it has none
    (the row's keys then stay None)."""
    ex = getattr(report, "excess", None)
    if ex is None:
        return {}
    causes = [c for c in ex.causes if c.bytes]
    return {"excess_bytes": ex.excess_bytes, "compulsory_bytes": ex.compulsory_bytes,
            "excess_top_cause": causes[0].kind if causes else None}


def run_point(point: Point) -> dict:
    """Compile and analyse one point here; the row described in the module docstring.

    Needs ``point.num_devices`` CPU devices in this process when the point has a mesh (the
    worker process is started with ``--xla_force_host_platform_device_count``).
    Errors of the point itself (bad ``--set`` value, a program that does not compile) are
    rows with ``status="error"``; an out-of-memory compile is a row with ``fits=False``.
    """
    from ..api import analyze
    from ..capture import resolve_program
    from ..capture.targets import DoesNotFitError, Target
    from ..hardware import load_spec
    from ..plans import Plan, capture_with_plan, ensure_cpu_devices, load_plan
    from ..plans.compare import _count_notes, summarize

    t0 = time.perf_counter()
    row = empty_row(point)
    notes: list[str] = []
    try:
        spec = load_spec(point.hardware)
        row["hbm_capacity_bytes"] = spec.hbm_capacity_bytes
        target = Target.parse(point.target)
        if target.platform == "tpu":  # the slice's chip grid: which ICI axes have wraparound links
            from ..hardware.overrides import with_slice_topology
            spec = with_slice_topology(spec, target.topology)
        overrides = dict(point.overrides)
        if point.mesh:
            mesh = dict(point.mesh)
            if target.platform == "cpu" and not ensure_cpu_devices(point.num_devices):
                raise RuntimeError(f"this worker has fewer than {point.num_devices} CPU devices (jax "
                                   "started before XLA_FLAGS was set)")
            plan = load_plan(point.plan or "dp")
            program = capture_with_plan(point.model, overrides, plan, mesh, notes, target=target.name)
        else:
            plan = Plan("none", "unsharded, one device")
            program = resolve_program(point.model, overrides=overrides or None, target=target.name)
        t1 = time.perf_counter()
        report = analyze(program, hardware=spec)
        t2 = time.perf_counter()
    except DoesNotFitError as e:  # the target compiler's verdict: a result, not a failure
        row.update(fits=False, does_not_fit=e.compiler_message, needs_bytes=e.needs_bytes,
                   has_bytes=e.has_bytes, notes=_count_notes(notes) + [str(e)],
                   wall_s=time.perf_counter() - t0)
        return row
    except Exception as e:  # noqa: BLE001 - a point's failure is its row, whatever raised
        row["wall_s"] = time.perf_counter() - t0
        if _is_out_of_memory(e):
            row.update(fits=False, does_not_fit=(str(e).strip().splitlines() or [""])[0],
                       notes=[f"the compiler ran out of device memory: {e}"])
        else:
            row.update(status="error", error=f"{type(e).__name__}: {e}")
        return row
    res = summarize(report, plan, spec, program.num_devices, dict(program.memory_stats), target.platform)
    t = report.totals
    row.update(
        backend=program.backend, num_devices=program.num_devices, fits=res.fits,
        peak_bytes=res.peak_bytes, argument_bytes=res.argument_bytes, output_bytes=res.output_bytes,
        alias_bytes=res.alias_bytes, temp_bytes=res.temp_bytes, xla_peak_bytes=res.xla_peak_bytes,
        flops=t.flops, hbm_bytes=t.hbm_bytes,
        hbm_read_bytes=t.hbm_read_bytes, hbm_write_bytes=t.hbm_write_bytes,
        hbm_bytes_by_role=dict(res.hbm_bytes_by_role),
        wire_bytes=res.wire_bytes, wire_bytes_by_kind=dict(sorted(res.wire_bytes_by_kind.items())),
        collective_time_s=res.collective_time_s, unmodeled=len(report.unmodeled),
        compile_s=t1 - t0, analysis_s=t2 - t1,
        notes=_count_notes(notes) + res.notes + report.notes)
    if res.fits is False and getattr(res, "needs_bytes", None) is not None:  # (plans' summarize:
        # the memory_analysis peak against the spec's capacity, where no compiler refused it)
        row.update(needs_bytes=res.needs_bytes, has_bytes=res.has_bytes)
    tm = report.times
    if tm is not None:
        row.update(est_time_s=tm.est_time_s, bound=tm.bound, compute_time_s=tm.compute_time_s,
                   memory_time_s=tm.memory_time_s, network_time_s=tm.network_time_s,
                   time_unmodeled=len(tm.unmodeled))
    row.update(_excess(report))
    row["wall_s"] = time.perf_counter() - t0
    return row
