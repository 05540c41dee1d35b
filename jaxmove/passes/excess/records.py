"""The results of the excess pass: ``ExcessAnalysis`` (per role and per path an ``ExcessLine``
of compulsory, compiled and unattributed bytes; the causes, each an ``ExcessCause`` with its
costliest ``CauseInstruction`` s) and its JSON / DataFrame forms (stable keys: may be added to,
never removed)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ...vocab import PATHS, ROLES


def group_sums(key, *values):
    """(unique keys in the order of their first element, index of that first element, the sum
    of each of ``values`` per key): exact sums (numpy arrays in, int64 or Python-int object
    arrays; arrays out, of the values' dtypes)."""
    if not len(key):
        return key, key, tuple(v for v in values)
    order = np.argsort(key)
    sk = key[order]
    starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    firsts = np.minimum.reduceat(order, starts)
    sums = [np.add.reduceat(v[order], starts) for v in values]
    by_first = np.argsort(firsts)
    return sk[starts][by_first], firsts[by_first], tuple(s[by_first] for s in sums)


class _PerInstruction(Mapping):
    """``ExcessAnalysis.per_instruction``: (computation, instruction) -> excess bytes, the
    dict built on first use from the pass's charges (``by_row``: numpy arrays of row numbers
    and bytes, in the order charged; most callers never read it: ``jaxmove analyze`` without a
    frame). Read-only; iterates in the order the rows were first charged; pickles and
    deep-copies as a plain dict."""

    __slots__ = ("_rows", "_by_row", "_dict")

    def __init__(self, rows, by_row):
        self._rows, self._by_row, self._dict = rows, by_row, None

    def _d(self) -> dict[tuple[str, str], int]:
        d = self._dict
        if d is None:
            rows = self._rows
            ks, _first, (nbytes,) = group_sums(*self._by_row)
            d = self._dict = {(rows[k].computation, rows[k].instr.name): b
                              for k, b in zip(ks.tolist(), nbytes.tolist())}
            self._rows = self._by_row = None
        return d

    def __getitem__(self, key):
        return self._d()[key]

    def get(self, key, default=None):
        return self._d().get(key, default)

    def __contains__(self, key) -> bool:
        return key in self._d()

    def __iter__(self):
        return iter(self._d())

    def __len__(self) -> int:
        return len(self._d())

    def keys(self):
        return self._d().keys()

    def items(self):
        return self._d().items()

    def values(self):
        return self._d().values()

    def __eq__(self, other):
        return self._d() == (other._d() if isinstance(other, _PerInstruction) else other)

    def __repr__(self) -> str:
        return repr(self._d())

    def __reduce__(self):
        return dict, (self._d(),)


@dataclass(frozen=True, slots=True)
class CauseInstruction:
    """One instruction responsible for (part of) a cause: bytes per program run."""

    computation: str
    name: str
    opcode: str
    bytes: int
    source: str | None
    op_name: str | None
    #: True when ``source`` is a neighbouring instruction's line (the report's attribution,
    #: report/attribution.py ``attribute``: this instruction's metadata has none)
    source_inferred: bool = False

    def source_label(self, basename: bool = False) -> str:
        """``file:line`` of ``source`` (its base name with ``basename``), prefixed with ``≈``
        when inferred (the convention of report/attribution.py ``Attribution.source_label``);
        ``""`` when there is no source."""
        if not self.source:
            return ""
        src = self.source.rsplit("/", 1)[-1] if basename else self.source
        return ("≈ " if self.source_inferred else "") + src


@dataclass(frozen=True)
class ExcessCause:
    """Bytes moved for one reason, per program run.

    Attributes:
      kind: one of ``CAUSE_KINDS`` or ``unattributed``.
      subject: what it is about (a parameter path, an argument name; "" for program-wide).
      bytes: all paths together; by_role: HBM bytes per role; by_path: bytes per path.
      time_s: HBM bytes / hbm_bytes_per_s + wire bytes / link bandwidth (None without a
        spec, or when no part of it can be timed); untimed_bytes: bytes not in time_s.
      fix: the change that would remove it, in the words a JAX user acts on.
      flops: flops of the instructions responsible (recomputation for remat), else 0.
      instructions: the costliest instructions responsible (at most ``ledger.MAX_LISTED``);
        num_instructions: how many there are.
    """

    kind: str
    subject: str
    bytes: int
    by_role: dict[str, int]
    by_path: dict[str, int]
    time_s: float | None
    untimed_bytes: int
    fix: str
    flops: int
    instructions: tuple[CauseInstruction, ...]
    num_instructions: int

    def to_json(self) -> dict:
        return {"kind": self.kind, "subject": self.subject, "bytes": self.bytes,
                "time_s": self.time_s, "untimed_bytes": self.untimed_bytes,
                "by_role": dict(self.by_role), "by_path": dict(self.by_path), "fix": self.fix,
                "flops": self.flops, "num_instructions": self.num_instructions,
                "instructions": [{"computation": i.computation, "name": i.name, "opcode": i.opcode,
                                  "bytes": i.bytes, "source": i.source, "op_name": i.op_name,
                                  "source_inferred": i.source_inferred}
                                 for i in self.instructions]}


@dataclass(frozen=True, slots=True)
class ExcessLine:
    """Compulsory, compiled and excess bytes of one role or path, per program run."""

    compulsory_bytes: int
    compiled_bytes: int
    unattributed_bytes: int

    @property
    def excess_bytes(self) -> int:
        return self.compiled_bytes - self.compulsory_bytes

    @property
    def excess_fraction(self) -> float:
        """excess / compiled (0.0 when nothing moves)."""
        return self.excess_bytes / self.compiled_bytes if self.compiled_bytes else 0.0

    def to_json(self) -> dict:
        return {"compulsory_bytes": self.compulsory_bytes, "compiled_bytes": self.compiled_bytes,
                "excess_bytes": self.excess_bytes, "excess_fraction": self.excess_fraction,
                "unattributed_bytes": self.unattributed_bytes}


@dataclass
class ExcessAnalysis:
    """Excess movement of one program run (module docstring).

    Attributes:
      by_role: role -> ExcessLine of HBM bytes (read + written); by_path: path -> ExcessLine.
      causes: every cause with bytes, costliest first (by time with a spec, else bytes).
      unattributed: the excess no rule explains (kind ``unattributed``).
      hardware: the spec's name, or None; onchip_capacity_bytes: the capacity intermediates
        are compared with (None without a spec).
      per_instruction: (computation, instruction) -> excess bytes per program run (a
        read-only mapping, built on first use).
      notes: how the figures were derived where it is not obvious.
    """

    by_role: dict[str, ExcessLine]
    by_path: dict[str, ExcessLine]
    causes: list[ExcessCause]
    unattributed: ExcessCause
    hardware: str | None
    onchip_capacity_bytes: int | None
    per_instruction: Mapping[tuple[str, str], int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def compulsory_bytes(self) -> int:
        return sum(v.compulsory_bytes for v in self.by_path.values())

    @property
    def compiled_bytes(self) -> int:
        return sum(v.compiled_bytes for v in self.by_path.values())

    @property
    def excess_bytes(self) -> int:
        return self.compiled_bytes - self.compulsory_bytes

    @property
    def excess_fraction(self) -> float:
        return self.excess_bytes / self.compiled_bytes if self.compiled_bytes else 0.0

    @property
    def excess_time_s(self) -> float | None:
        """Sum of the causes' times (None without a spec)."""
        if self.hardware is None:
            return None
        return sum(c.time_s or 0.0 for c in (*self.causes, self.unattributed))

    def cause(self, kind: str, subject: str | None = None) -> ExcessCause | None:
        """The (first) cause of ``kind`` (and ``subject``), or None."""
        for c in self.causes:
            if c.kind == kind and (subject is None or c.subject == subject):
                return c
        return None

    def bytes_of(self, kind: str) -> int:
        """Bytes of every cause of ``kind`` together."""
        return sum(c.bytes for c in self.causes if c.kind == kind)

    def to_json(self) -> dict:
        """The ``excess`` object of ``jaxmove analyze --json`` (stable keys)."""
        return {"compulsory_bytes": self.compulsory_bytes, "compiled_bytes": self.compiled_bytes,
                "excess_bytes": self.excess_bytes, "excess_fraction": self.excess_fraction,
                "excess_time_s": self.excess_time_s, "hardware": self.hardware,
                "onchip_capacity_bytes": self.onchip_capacity_bytes,
                "by_role": {r: v.to_json() for r, v in self.by_role.items()},
                "by_path": {p: v.to_json() for p, v in self.by_path.items()},
                "causes": [c.to_json() for c in self.causes],
                "unattributed": self.unattributed.to_json(),
                "notes": list(self.notes)}

    def to_dataframe(self):
        """One pandas row per cause (kind, subject, bytes, time_s, HBM bytes per role, bytes
        per path, fix, instructions); the unattributed excess last when it is not zero.

        Raises ImportError without pandas (naming the extra that installs it)."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("ExcessAnalysis.to_dataframe needs pandas: pip install 'jaxmove[notebooks]'") from e

        rows = []
        for c in (*self.causes, *((self.unattributed,) if self.unattributed.bytes else ())):
            rec = {"kind": c.kind, "subject": c.subject, "bytes": c.bytes, "time_s": c.time_s,
                   "flops": c.flops, "num_instructions": c.num_instructions, "fix": c.fix,
                   "instructions": ", ".join(i.name for i in c.instructions)}
            rec.update({f"{r}_bytes": c.by_role.get(r, 0) for r in ROLES})
            rec.update({f"{p}_bytes": c.by_path.get(p, 0) for p in PATHS})
            rows.append(rec)
        cols = ["kind", "subject", "bytes", "time_s", "flops", "num_instructions", "fix",
                "instructions", *(f"{r}_bytes" for r in ROLES), *(f"{p}_bytes" for p in PATHS)]
        return pd.DataFrame.from_records(rows, columns=cols)
