"""The records the passes share: one kernel-level instruction's cost (``InstructionCost``) and
everything ``pipeline.analyze_module`` computed for a module (``ModuleAnalysis``).

Passes that read a ModuleAnalysis (reuse, first touch, timing, excess) import it from here, not
from ``passes/pipeline.py``: the pipeline imports the passes, no pass imports the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..hlo import Instruction, Module
from .collectives import CollectiveInfo
from .cost import Cost
from .flops import FlopCount
from .multiplicity import Multiplicity
from .roles import RoleMap
from .traffic import InstrTraffic


@dataclass(frozen=True, slots=True)
class InstructionCost:
    """One kernel-level instruction: its cost per execution and per program run.

    Attributes:
      instr: the instruction; computation: its computation's name.
      multiplicity: executions per program run.
      per_execution: Cost of one execution; total: per_execution * multiplicity.count.
      traffic: the traffic pass's accesses; flop_count: the flops pass's result.
      unmodeled: reasons this instruction's figures are incomplete (empty when modeled).
      notes: how the figures were derived where it is not obvious (in-place updates...).
      collective: the collective it runs (groups, wire bytes per execution), or None;
        its wire bytes are ``per_execution.device_to_device_bytes``.
    """

    instr: Instruction
    computation: str
    multiplicity: Multiplicity
    per_execution: Cost
    total: Cost
    traffic: InstrTraffic
    flop_count: FlopCount
    unmodeled: tuple[str, ...]
    notes: tuple[str, ...]
    collective: CollectiveInfo | None = None



@dataclass
class ModuleAnalysis:
    """Everything ``analyze_module`` computed for one module: its rows, the program totals, the
    multiplicity of each computation, notes, the roles pass's RoleMap (which later passes such as
    ``passes/excess.py`` read) and the branch of each conditional the totals count."""

    module: Module
    rows: list[InstructionCost]
    totals: Cost
    multiplicity: dict[str, Multiplicity]
    notes: list[str] = field(default_factory=list)
    roles: RoleMap | None = None
    # (computation, conditional instruction name) -> the branch computation the totals count
    branches: dict[tuple[str, str], str] = field(default_factory=dict)
    # while loops whose trip count is neither given nor derived (bodies counted once):
    # {"computation", "while", "why"} each (Report.unknown_trip_loops)
    unknown_trip_loops: tuple[dict, ...] = ()

    @property
    def unmodeled(self) -> list[InstructionCost]:
        return [r for r in self.rows if r.unmodeled]
