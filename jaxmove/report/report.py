"""The Report: per-instruction rows and program totals, and its stable JSON contract.

The report only arranges what the passes computed; it computes no figure itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..passes.cost import PATHS, Cost
from ..passes.pipeline import InstructionCost, ModuleAnalysis
from ..workload import ROLES

# Opcodes that never appear as their own rows in tables: they move nothing and compute nothing.
_QUIET = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
                    "add-dependency"})


@dataclass(frozen=True)
class ProgramInfo:
    """What was analysed: name, backend ("cpu", "gpu", "tpu" or "unknown"), devices, source."""

    name: str
    backend: str
    num_devices: int
    source: str


@dataclass
class Report:
    """Where the bytes of one program run go.

    Attributes:
      program: ProgramInfo.
      analysis: the passes' ModuleAnalysis (module, rows, totals).
      parameters: entry parameters with pytree path, role and donation (empty for HLO files).
      memory_stats: XLA's compiled memory statistics in bytes (empty for HLO files).
      xla_cost_analysis: ``Compiled.cost_analysis()`` when captured from JAX, else None.
    """

    program: ProgramInfo
    analysis: ModuleAnalysis
    parameters: tuple = ()
    memory_stats: dict[str, int] = field(default_factory=dict)
    xla_cost_analysis: dict | None = None

    @property
    def module(self):
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

    def top(self, n: int = 20) -> list[InstructionCost]:
        """The n kernel-level instructions that move the most HBM bytes per program run."""
        rows = [r for r in self.rows if r.instr.opcode not in _QUIET]
        rows.sort(key=lambda r: (r.total.hbm_bytes, r.total.flops), reverse=True)
        return rows[:n]

    @property
    def unmodeled(self) -> list[InstructionCost]:
        return self.analysis.unmodeled

    def to_json(self) -> dict:
        """The stable JSON contract of ``jaxmove analyze --json`` (keys may be added, never removed)."""
        t = self.totals
        return {
            "program": {"name": self.program.name, "backend": self.program.backend,
                        "num_devices": self.program.num_devices, "source": self.program.source},
            "totals": {"flops": t.flops, "transcendentals": t.transcendentals,
                       "hbm_read_bytes": t.hbm_read_bytes, "hbm_write_bytes": t.hbm_write_bytes,
                       "onchip_read_bytes": t.onchip_read_bytes,
                       "onchip_write_bytes": t.onchip_write_bytes,
                       "collective_wire_bytes": t.device_to_device_bytes},
            "by_path": {p: t.path_bytes(p) for p in PATHS},
            "by_role": {r: dict(zip(("read_bytes", "write_bytes"), t.role_bytes(r))) for r in ROLES},
            "instructions": [self._row_json(r) for r in self.rows if r.instr.opcode not in _QUIET],
            "unmodeled": [r.instr.name for r in self.unmodeled],
            "parameters": [{"number": p.number, "path": p.path, "role": p.role,
                            "donated": p.donated, "shape": p.shape, "byte_size": p.byte_size}
                           for p in self.parameters],
            "memory_stats": dict(self.memory_stats),
            "notes": self.notes,
        }

    def _row_json(self, r: InstructionCost) -> dict:
        t = r.total
        loc = self.module.source_location(r.instr)
        md = r.instr.metadata
        return {
            "name": r.instr.name, "computation": r.computation, "opcode": r.instr.opcode,
            "fusion_kind": r.instr.fusion_kind, "multiplicity": r.multiplicity.count,
            "flops": t.flops, "transcendentals": t.transcendentals,
            "hbm_read_bytes": t.hbm_read_bytes, "hbm_write_bytes": t.hbm_write_bytes,
            "by_role": {role: dict(zip(("read_bytes", "write_bytes"), t.role_bytes(role)))
                        for role in ROLES if any(t.role_bytes(role))},
            "by_path": {p: t.path_bytes(p) for p in PATHS if t.path_bytes(p)},
            "role": dominant_role(t),
            "unmodeled": bool(r.unmodeled), "unmodeled_reasons": list(r.unmodeled),
            "unknown_trip_count": r.multiplicity.unknown_trip_count,
            "branch_of": list(r.multiplicity.branch_of) if r.multiplicity.branch_of else None,
            "notes": list(r.notes),
            "source": f"{loc.file}:{loc.line}" if loc else None,
            "op_name": md.op_name if md else None,
            "hlo_line": r.instr.line,
            "collective": _collective_json(r),
        }


def _collective_json(r: InstructionCost) -> dict | None:
    """kind, group_size, num_groups, wire_bytes (per program run, like every row number)
    and wire_bytes_per_execution of the row's collective, or None."""
    c = r.collective
    if c is None:
        return None
    return {"kind": c.kind, "group_size": c.group_size, "num_groups": c.num_groups,
            "wire_bytes": c.wire_bytes * r.multiplicity.count,
            "wire_bytes_per_execution": c.wire_bytes, "buffer_bytes": c.buffer_bytes,
            "mode": c.mode, "is_async": c.is_async, "instruction": c.instruction}


def dominant_role(c: Cost) -> str:
    """The role that accounts for the most HBM bytes of a cost ("-" when it moves none)."""
    best = max(ROLES, key=lambda r: sum(c.role_bytes(r)))
    return best if sum(c.role_bytes(best)) else "-"
