"""The Report: one program's pass results and their stable JSON contract (README "JSON contract").

Besides arranging the passes' figures it derives only ratios and labels from them: the tile
padding fraction, a row's dominant role, and a row's arithmetic intensity without a spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..hlo import Module
from ..passes.cost import PATHS, Cost
from ..passes.pipeline import InstructionCost, ModuleAnalysis
from ..vocab import ROLES
from .attribution import attribute
from .columns import QUIET_OPCODES, dominant_role  # noqa: F401  (dominant_role re-exported)
from .shapes import operand_shapes, shape_text

if TYPE_CHECKING:
    from ..capture.program import EntryParameter
    from ..capture.xla_figures import XlaFigures
    from ..measure.run import Measurement
    from ..passes.excess import ExcessAnalysis
    from ..passes.reuse import ReuseAnalysis
    from ..passes.timing import TimeEstimate

_QUIET = QUIET_OPCODES
#: (role, Cost field of its read bytes, of its write bytes) and (path, Cost field), for the rows
_ROLE_ATTRS = tuple((r, f"{r}_read_bytes", f"{r}_write_bytes") for r in ROLES)
_PATH_ATTRS = tuple((p, f"{p}_bytes") for p in PATHS)


@dataclass(frozen=True)
class ProgramInfo:
    """What was analysed: name, backend ("cpu", "gpu", "tpu" or "unknown"), devices, source,
    and the compile target it was compiled for (``cpu``, ``tpu-v5e:2x2``...; None for HLO files)."""

    name: str
    backend: str
    num_devices: int
    source: str
    target: str | None = None
    output_roles: tuple = ()  # Program.output_roles: a role (or None) per output leaf; () when none given


@dataclass
class Report:
    """Where the bytes of one program run go.

    Attributes:
      program: ProgramInfo.
      analysis: the passes' ModuleAnalysis (module, rows, totals).
      parameters: entry parameters with pytree path, role and donation (empty for HLO files).
      memory_stats: XLA's compiled memory statistics in bytes (empty for HLO files).
      xla_cost_analysis: ``Compiled.cost_analysis()`` when captured from JAX, else None.
      reuse: on-chip reuse per fusion and tiling of dots (``passes/reuse.py``), or None.
      excess: compulsory traffic, excess and its causes (``passes/excess.py``), or None.
      xla: the compiler's own figures beside jaxmove's (cost_analysis, XLA:TPU's per-kernel
        estimated_cycles; ``capture/xla_figures.py``), or None.
      times: estimated times on a hardware spec (``passes/timing.py``), or None when no
        hardware was given.
      measurement: what the program did on the local device (``jaxmove.measure``; set by
        ``jaxmove compare``), or None.
    """

    program: ProgramInfo
    analysis: ModuleAnalysis
    parameters: tuple[EntryParameter, ...] = ()
    memory_stats: dict[str, int] = field(default_factory=dict)
    xla_cost_analysis: dict | None = None
    reuse: ReuseAnalysis | None = None
    times: TimeEstimate | None = None
    excess: ExcessAnalysis | None = None
    xla: XlaFigures | None = None
    measurement: Measurement | None = None

    @property
    def module(self) -> Module:
        return self.analysis.module

    @property
    def totals(self) -> Cost:
        return self.analysis.totals

    @property
    def rows(self) -> list[InstructionCost]:
        return self.analysis.rows

    @property
    def notes(self) -> list[str]:
        return list(dict.fromkeys(self.analysis.notes))

    def listed_rows(self) -> list[InstructionCost]:
        """The rows of the JSON ``instructions``: every instruction except those that move
        and compute nothing (parameter, constant, tuple, get-tuple-element, bitcast,
        after-all, add-dependency)."""
        return [r for r in self.rows if r.instr.opcode not in _QUIET]

    def top(self, n: int = 20) -> list[InstructionCost]:
        """The n kernel-level instructions that move the most HBM bytes per program run."""
        rows = [r for r in self.rows if r.instr.opcode not in _QUIET]
        rows.sort(key=lambda r: (r.total.hbm_bytes, r.total.flops), reverse=True)
        return rows[:n]

    @property
    def unmodeled(self) -> list[InstructionCost]:
        return self.analysis.unmodeled

    def time_unmodeled_rows(self) -> list[InstructionCost]:
        """Rows whose estimated time is incomplete (a figure the spec or a pass lacks),
        besides the unmodeled rows; empty without a hardware spec."""
        tm = self.times
        if tm is None:
            return []
        rows = tm.rows
        return [r for r in self.rows if not r.unmodeled
                and (it := rows.get((r.computation, r.instr.name))) is not None and it.unmodeled]

    @property
    def unknown_trip_loops(self) -> list[dict]:
        """The while loops whose trip count is neither given (``known_trip_count``) nor
        derived from an induction variable (passes/trip_count.py): ``{"computation", "while",
        "why"}`` each. Their bodies are counted once per execution of the loop, so the totals
        are lower bounds."""
        return [dict(d) for d in self.analysis.unknown_trip_loops]

    @property
    def complete(self) -> bool:
        """True when every instruction is modeled (and, with a hardware spec, timed in
        full) and every while loop's trip count is known; else the totals are lower bounds
        and the estimated time is "at least"."""
        return not self.unmodeled and not self.time_unmodeled_rows() and not self.unknown_trip_loops

    def incomplete_headline(self) -> str | None:
        """The first line a rendering prints when the report is incomplete, else None:
        ``incomplete: N instructions unmodeled (...)``."""
        n, m = len(self.unmodeled), len(self.time_unmodeled_rows())
        k = len(self.unknown_trip_loops)
        if not n and not m and not k:
            return None
        parts = []
        if n:
            parts.append(f"{n} instruction{'s' if n != 1 else ''} unmodeled")
        if m:
            parts.append(f"{m} {'more ' if n else ''}instruction{'s' if m != 1 else ''} with "
                         "incomplete time")
        if k:
            parts.append(f"{k} while loop{'s' if k != 1 else ''} with an unknown trip count (its body "
                         "counted once)")
        # what is a lower bound: the byte totals only where bytes are missing (an unmodeled
        # instruction, a loop counted once); a row without a full time leaves the bytes whole
        if n or k:
            what = "totals and time are lower bounds" if self.times is not None else "totals are lower bounds"
        else:
            what = "the estimated time is a lower bound; the byte totals are complete"
        return f"incomplete: {', '.join(parts)} ({what}; listed below)"

    def to_dataframe(self):
        """One pandas row per instruction of the JSON ``instructions`` (report/frame.py)."""
        from .frame import to_dataframe
        return to_dataframe(self)

    def _repr_html_(self) -> str:
        """Jupyter's rich display: a compact, escaped summary (report/html.py)."""
        from .frame import repr_html
        return repr_html(self)

    def to_json(self, *, stream: bool = False) -> dict:
        """The stable JSON contract of ``jaxmove analyze --json`` (keys may be added, never removed).

        With ``stream=True`` the ``instructions`` value is a ``json_out.Streamed`` that makes
        each row when iterated (``json_out.write_json`` writes it a batch at a time, so a
        report of 1M instructions is never held as dicts: benchmarks/cli_speed.md).
        """
        t = self.totals
        listed = self.listed_rows()
        if stream:
            from .json_out import Streamed
            instructions = Streamed(lambda: map(self._row_json, listed), len(listed))
        else:
            instructions = [self._row_json(r) for r in listed]
        return {
            "program": {"name": self.program.name, "backend": self.program.backend,
                        "num_devices": self.program.num_devices, "source": self.program.source,
                        "target": self.program.target,
                        "output_roles": list(self.program.output_roles)},
            "totals": {"flops": t.flops, "transcendentals": t.transcendentals,
                       "hbm_read_bytes": t.hbm_read_bytes, "hbm_write_bytes": t.hbm_write_bytes,
                       "onchip_read_bytes": t.onchip_read_bytes,
                       "onchip_write_bytes": t.onchip_write_bytes,
                       "collective_wire_bytes": t.device_to_device_bytes,
                       **_padding_json(t),
                       "hbm_padding_fraction": (t.hbm_padding_bytes / t.hbm_bytes
                                                if t.hbm_bytes else 0.0),
                       **_totals_timing(self)},
            "by_path": {p: t.path_bytes(p) for p in PATHS},
            "by_role": {r: dict(zip(("read_bytes", "write_bytes"), t.role_bytes(r))) for r in ROLES},
            "instructions": instructions,
            "unmodeled": [r.instr.name for r in self.unmodeled],
            "parameters": [{"number": p.number, "path": p.path, "role": p.role,
                            "donated": p.donated, "shape": p.shape, "byte_size": p.byte_size}
                           for p in self.parameters],
            "memory_stats": dict(self.memory_stats),
            "notes": self.notes,
            # False when anything is unmodeled: totals (and est_time_s) are then lower bounds
            "complete": self.complete,
            "unmodeled_count": len(self.unmodeled),
            "time_unmodeled_count": len(self.time_unmodeled_rows()),
            # while loops whose bodies are counted once: trip count neither given nor derived
            "unknown_trip_count_loops": list(self.unknown_trip_loops),
            **_timing_json(self),
            # compulsory traffic, excess and its causes (passes/excess.py); None when not computed
            "excess": self.excess.to_json() if self.excess is not None else None,
            # the compiler's own figures (cost_analysis, XLA:TPU estimated_cycles); None when not read
            "xla": self.xla.to_json() if self.xla is not None else None,
        }

    def _row_json(self, r: InstructionCost) -> dict:
        t = r.total
        att = attribute(self.module, r.instr)   # source inferred from neighbours when absent
        loc = att.source
        md = r.instr.metadata
        by_role, role, most = {}, "-", 0   # dominant_role: the first role of the most bytes
        for name, ra, wa in _ROLE_ATTRS:
            rd, wr = getattr(t, ra), getattr(t, wa)
            if rd or wr:
                by_role[name] = {"read_bytes": rd, "write_bytes": wr}
                if rd + wr > most:
                    role, most = name, rd + wr
        return {
            "name": r.instr.name, "computation": r.computation, "opcode": r.instr.opcode,
            "fusion_kind": r.instr.fusion_kind, "multiplicity": r.multiplicity.count,
            "flops": t.flops, "transcendentals": t.transcendentals,
            "hbm_read_bytes": t.hbm_read_bytes, "hbm_write_bytes": t.hbm_write_bytes,
            **_padding_json(t),
            "by_role": by_role,
            "by_path": {p: v for p, a in _PATH_ATTRS if (v := getattr(t, a))},
            "role": role,
            "unmodeled": bool(r.unmodeled), "unmodeled_reasons": list(r.unmodeled),
            "unknown_trip_count": r.multiplicity.unknown_trip_count,
            "branch_of": list(r.multiplicity.branch_of) if r.multiplicity.branch_of else None,
            "notes": _row_notes(self, r),
            "source": f"{loc.file}:{loc.line}" if loc else None,
            "source_inferred": att.source_inferred,
            "source_inferred_from": att.source_inferred_from or None,
            "module": att.module_key, "module_inferred": att.module_inferred,
            "shape": shape_text(r.instr.shape),
            "operand_shapes": operand_shapes(self.module, r.computation, r.instr),
            "op_name": md.op_name if md else None,
            "hlo_line": r.instr.line,
            "collective": _collective_json(r),
            **_row_timing_json(self, r),
            "xla": _row_xla_json(self, r),
        }


def _row_notes(report: Report, r: InstructionCost) -> list[str]:
    """The row's notes: the pipeline's (traffic, collectives) then the timing pass's (e.g. the
    GPU GEMM model's b, m, n, k, tile, CTAs, waves and bound), each once."""
    tm = report.times.rows.get((r.computation, r.instr.name)) if report.times is not None else None
    return list(dict.fromkeys([*r.notes, *(tm.notes if tm is not None else ())]))


def _row_xla_json(report: Report, r: InstructionCost) -> dict | None:
    """XLA:TPU's ``estimated_cycles`` (per execution), ``executions`` and ``estimated_s`` (per
    program run, at the spec's clock; None without one) of a row, or None when XLA gave none."""
    fig = report.xla.row(r.computation, r.instr.name) if report.xla is not None else None
    return fig.to_json() if fig is not None else None


def _padding_json(t: Cost) -> dict:
    """Data (logical) HBM bytes and the tile padding among ``hbm_read_bytes`` /
    ``hbm_write_bytes`` (which are physical: tiled layouts move whole tiles)."""
    return {"hbm_logical_read_bytes": t.hbm_read_bytes - t.hbm_padding_read_bytes,
            "hbm_logical_write_bytes": t.hbm_write_bytes - t.hbm_padding_write_bytes,
            "hbm_padding_bytes": t.hbm_padding_bytes}


def _collective_json(r: InstructionCost) -> dict | None:
    """kind, group_size, num_groups, wire_bytes (per program run, like every row number)
    and wire_bytes_per_execution of the row's collective, or None."""
    c = r.collective
    if c is None:
        return None
    return {"kind": c.kind, "group_size": c.group_size, "num_groups": c.num_groups,
            "wire_bytes": c.wire_bytes * r.multiplicity.count,
            "wire_bytes_per_execution": c.wire_bytes, "buffer_bytes": c.buffer_bytes,
            "mode": c.mode, "is_async": c.is_async, "instruction": c.instruction,
            "counted_on": c.counted_on}


def _totals_timing(report: Report) -> dict:
    """``totals.onchip_reuse_bytes`` (bytes fusion kept on chip per program run) and
    ``totals.est_time_s`` (None without a hardware spec)."""
    return {"onchip_reuse_bytes": report.reuse.total_onchip_reuse_bytes if report.reuse is not None else None,
            "est_time_s": report.times.est_time_s if report.times is not None else None}


def _timing_json(report: Report) -> dict:
    """``hardware`` (the spec's name or None) and, with a spec, the ``time`` section."""
    tm = report.times
    out: dict = {"hardware": tm.spec_name if tm is not None else None}
    if tm is not None:
        from ..hardware.overrides import user_overrides
        # the --spec KEY=VALUE texts that replaced the spec's numbers ([] for the spec as named)
        out["hardware_overrides"] = user_overrides(tm.spec) if tm.spec is not None else []
        out["time"] = {"est_time_s": tm.est_time_s, "serial_time_s": tm.serial_time_s,
                       "compute_time_s": tm.compute_time_s, "memory_time_s": tm.memory_time_s,
                       "network_time_s": tm.network_time_s, "overhead_s": tm.overhead_s,
                       "kernels": tm.kernels, "bound": tm.bound,
                       "launch_gap_s": tm.launch_gap_s, "kernel_duration_s": tm.kernel_duration_s,
                       "command_buffers": tm.command_buffers,
                       "command_buffer_kernels": tm.command_buffer_kernels,
                       "dispatch_overhead_s": tm.dispatch_overhead_s,
                       "first_touch_bytes": tm.first_touch.total_bytes if tm.first_touch else 0,
                       "timeline": [list(t) for t in tm.timeline],
                       "unmodeled": list(tm.unmodeled), "notes": list(tm.notes),
                       "est_time_is_lower_bound": not report.complete}
    return out


def _row_timing_json(report: Report, r: InstructionCost) -> dict:
    """Per instruction: ``onchip_reuse_bytes`` (per program run) and, with a hardware spec,
    ``est_time_s``, ``bound``, ``arithmetic_intensity`` and the time components."""
    key = (r.computation, r.instr.name)
    mult = r.multiplicity.count
    out: dict = {}
    ru = report.reuse.rows.get(key) if report.reuse is not None else None
    out["onchip_reuse_bytes"] = ru.onchip_reuse_bytes * mult if ru is not None else 0
    if ru is not None and ru.fusion is not None:
        f = ru.fusion
        out["fusion_reuse"] = {"fused_bytes": f.fused_bytes * mult, "unfused_bytes": f.unfused_bytes * mult,
                               "intermediates": len(f.intermediates),
                               "intermediate_bytes": f.intermediate_bytes,
                               "working_set_bytes": f.working_set_bytes,
                               "onchip_capacity_bytes": f.onchip_capacity_bytes,
                               "fits_on_chip": f.fits_on_chip}
    if ru is not None and ru.tilings:
        out["tiling"] = [{"instruction": t.instruction, "kind": t.kind, "batch": t.batch, "m": t.m,
                          "n": t.n, "k": t.k, "tile": t.tile, "lhs_passes": t.lhs_passes,
                          "rhs_passes": t.rhs_passes, "compulsory_bytes": t.compulsory_bytes * mult,
                          "tiled_bytes": t.tiled_bytes * mult, "no_reuse_bytes": t.no_reuse_bytes * mult}
                         for t in ru.tilings]
    tm = report.times.rows.get(key) if report.times is not None else None
    out.update({"est_time_s": None, "bound": None, "arithmetic_intensity": None})
    if tm is None:
        if r.total.hbm_bytes:
            out["arithmetic_intensity"] = r.total.flops / r.total.hbm_bytes
        return out
    out.update({"est_time_s": tm.est_time_s, "bound": tm.bound,
                "arithmetic_intensity": tm.arithmetic_intensity,
                "compute_time_s": tm.compute_time_s, "memory_time_s": tm.memory_time_s,
                "network_time_s": tm.network_time_s, "overhead_s": tm.overhead_s,
                "launch_gap_s": tm.launch_gap_s, "duration_s": tm.duration_s,
                "in_command_buffer": tm.in_command_buffer,
                "modeled_hbm_bytes": tm.hbm_bytes, "time_unmodeled": list(tm.unmodeled),
                "first_touch_bytes": tm.first_touch_bytes, "first_touch_s": tm.first_touch_s})
    return out
