"""The ledger of the excess pass: every access of every kernel split into a compulsory part and
excess with one cause, summed per role and path, and the identity it holds by construction,

    compiled = compulsory + sum of causes + unattributed     (per role and per path)

(``build_result`` turns the sums into an ExcessAnalysis). The ledger only adds: it decides
nothing (``compulsory.py`` decides what is compulsory, ``causes.py`` names the causes).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from operator import itemgetter

from ...hlo import Module
from ...vocab import PATHS, ROLES
from .causes import UNATTRIBUTED
from .records import CauseInstruction, ExcessAnalysis, ExcessCause, ExcessLine, _PerInstruction

#: Instructions listed per cause (the costliest); ``num_instructions`` counts them all.
MAX_LISTED = 10

HBM_READ, HBM_WRITE = "hbm_to_onchip", "onchip_to_hbm"

class Ledger:
    """Bytes per role and path: compiled, compulsory, per cause and per instruction (by its
    row number in the pass's row list). (defaultdicts: only ever added to, then iterated.)"""

    def __init__(self, hbm_s_per_byte: float | None):
        self.compiled: dict[tuple, int] = defaultdict(int)      # (role, path) -> bytes
        self.compulsory: dict[tuple, int] = defaultdict(int)
        # role -> bytes of HBM reads / writes all of whose bytes are data and needed (each
        # counts in compiled and compulsory alike: ``fold`` adds them there)
        self.read_both: dict = defaultdict(int)
        self.write_both: dict = defaultdict(int)
        # role -> compiled / compulsory bytes of other HBM reads (``compulsory.Accounting.settle_reads``; ``fold``)
        self.read_compiled: dict = defaultdict(int)
        self.read_compulsory: dict = defaultdict(int)
        self.cause_rp: dict[tuple, int] = defaultdict(int)      # (kind, subject, role, path) -> bytes
        # (kind, subject) -> {row number: bytes}, and row number -> bytes of every cause
        self.cause_instr: dict[tuple, dict[int, int]] = {}
        self.by_row: dict[int, int] = defaultdict(int)
        self.cause_s: dict[tuple, float] = {}     # (kind, subject) -> seconds of wire bytes
        self.hbm_s_per_byte = hbm_s_per_byte

    def add(self, role, path: str, phys: int, compulsory: int, logical: int, kind: str,
            subject: str, k: int) -> None:
        """One access of row ``k``: ``phys`` bytes moved, ``logical`` of them data,
        ``compulsory`` of those needed; the padding is ``tile_padding``, the rest of the data
        ``kind``."""
        rp = (role, path)
        self.compiled[rp] += phys
        if compulsory:
            self.compulsory[rp] += compulsory
        if phys > logical:
            self._cause("tile_padding", "", role, path, phys - logical, k)
        if logical > compulsory:  # (_cause, inline)
            nbytes = logical - compulsory
            self.cause_rp[(kind, subject, role, path)] += nbytes
            g = self.cause_instr.get((kind, subject))
            if g is None:
                g = self.cause_instr[(kind, subject)] = defaultdict(int)
            g[k] += nbytes
            self.by_row[k] += nbytes

    def fold(self) -> None:
        """Add ``read_both`` / ``write_both`` into compiled and compulsory (once, at the end)."""
        for both, path in ((self.read_both, HBM_READ), (self.write_both, HBM_WRITE)):
            for role, nbytes in both.items():
                self.compiled[(role, path)] += nbytes
                self.compulsory[(role, path)] += nbytes
            both.clear()
        for part, into in ((self.read_compiled, self.compiled), (self.read_compulsory, self.compulsory)):
            for role, nbytes in part.items():
                into[(role, HBM_READ)] += nbytes
            part.clear()

    def add_compulsory(self, role, path: str, nbytes: int) -> None:
        """An access all of whose ``nbytes`` are data and needed (``add`` with phys =
        compulsory = logical)."""
        rp = (role, path)
        self.compiled[rp] += nbytes
        self.compulsory[rp] += nbytes

    def _cause(self, kind, subject, role, path, nbytes, k: int) -> None:
        self.cause_rp[(kind, subject, role, path)] += nbytes
        g = self.cause_instr.get((kind, subject))
        if g is None:
            g = self.cause_instr[(kind, subject)] = defaultdict(int)
        g[k] += nbytes
        self.by_row[k] += nbytes

    def add_wire(self, path: str, wire: int, compulsory: int, parts, k: int, s_per_byte) -> None:
        """A collective's wire bytes (row ``k``): ``parts`` are (kind, bytes) of the excess."""
        rp = (None, path)
        self.compiled[rp] += wire
        self.compulsory[rp] += compulsory
        for kind, nbytes in parts:
            if nbytes > 0:
                self._cause(kind, "", None, path, nbytes, k)
                if s_per_byte is not None:
                    self.cause_s[(kind, "")] = self.cause_s.get((kind, ""), 0.0) + nbytes * s_per_byte




def build_result(ledger: Ledger, module: Module, rows, notes: list[str], capacity: int | None,
                 any_unmodeled: bool, spec_name: str | None, fix) -> ExcessAnalysis:
    """The ExcessAnalysis of a settled ledger: per role and per path, compiled = compulsory +
    causes + unattributed (each from the ledger's sums), the causes grouped by (kind, subject)
    with their costliest ``MAX_LISTED`` instructions (``rows``: the pass's row list) and
    ``fix(kind, subject, bytes, items)``'s text, timed at the ledger's seconds per HBM byte and
    per wire byte."""
    ledger.fold()
    groups: dict[tuple[str, str], list] = {}  # (kind, subject) -> [by_role, by_path, instrs]
    for (kind, subject, role, path), nbytes in ledger.cause_rp.items():
        g = groups.setdefault((kind, subject), [{}, {}, {}])
        if role is not None:
            g[0][role] = g[0].get(role, 0) + nbytes
        g[1][path] = g[1].get(path, 0) + nbytes
    for ks, by_k in ledger.cause_instr.items():
        groups[ks][2] = by_k  # row number -> bytes, in the order the rows were charged
    # (built on first use; a copy of the row list, which may be the analysis's own)
    per_instruction = _PerInstruction(rows[:], ledger.by_row)
    causes: list[ExcessCause] = []
    unattributed = None
    spb = ledger.hbm_s_per_byte
    for (kind, subject), (by_role, by_path, instrs) in groups.items():
        total = sum(by_path.values())
        if not total:
            continue
        items = []
        flops = 0
        if kind == "rematerialization":
            flops = sum(rows[k].total.flops for k in instrs)
        # the costliest MAX_LISTED, ties in row order (= a stable sort by -bytes, cut)
        for k, b in heapq.nlargest(MAX_LISTED, instrs.items(), key=itemgetter(1)):
            row = rows[k]
            loc = module.source_location(row.instr)
            md = row.instr.metadata
            items.append(CauseInstruction(row.computation, row.instr.name, row.instr.opcode, b,
                                          f"{loc.file}:{loc.line}" if loc else None,
                                          md.op_name if md is not None and md.op_name else None))
        hbm = by_path.get(HBM_READ, 0) + by_path.get(HBM_WRITE, 0)
        wire = by_path.get("device_to_device", 0)
        wire_s = ledger.cause_s.get((kind, subject))
        untimed = total - hbm - (wire if wire_s is not None else 0)
        time_s = None
        if spb is not None and untimed < total:
            time_s = hbm * spb + (wire_s or 0.0)
        if spb is None:
            untimed = total
        cause = ExcessCause(kind, subject, total, by_role, by_path, time_s, untimed,
                            fix(kind, subject, total, items), flops, tuple(items), len(instrs))
        if kind == UNATTRIBUTED:
            unattributed = cause
        else:
            causes.append(cause)
    if unattributed is None:
        unattributed = ExcessCause(UNATTRIBUTED, "", 0, {}, {}, 0.0 if spb is not None else None,
                                   0, "", 0, (), 0)
    if spb is not None:
        causes.sort(key=lambda c: (-(c.time_s or 0.0), -c.bytes, c.kind, c.subject))
    else:
        causes.sort(key=lambda c: (-c.bytes, c.kind, c.subject))
    un_rp: dict[tuple, int] = {}
    for (kind, _s, role, path), nbytes in ledger.cause_rp.items():
        if kind == UNATTRIBUTED:
            un_rp[(role, path)] = un_rp.get((role, path), 0) + nbytes

    def line(pick):
        return ExcessLine(sum(v for rp, v in ledger.compulsory.items() if pick(rp)),
                          sum(v for rp, v in ledger.compiled.items() if pick(rp)),
                          sum(v for rp, v in un_rp.items() if pick(rp)))

    by_role = {r: line(lambda rp, r=r: rp[0] == r and rp[1] in (HBM_READ, HBM_WRITE)) for r in ROLES}
    by_path = {p: line(lambda rp, p=p: rp[1] == p) for p in PATHS}
    notes = list(notes)
    if capacity is None:
        notes.append("no on-chip capacity (no hardware spec, or one without l2_bytes/vmem_bytes): "
                     "every intermediate written to HBM and read back is counted as spilled_intermediate "
                     "(compulsory traffic is the same with or without a spec); give a hardware spec "
                     "to find the ones that fit on chip (materialized_intermediate)")
    if any_unmodeled:
        notes.append("unmodeled instructions move bytes jaxmove cannot count: they are in neither "
                     "compiled nor compulsory")
    if spb is not None and any(c.untimed_bytes for c in causes):
        notes.append("host transfer bytes are not timed (the hardware specs give no host link "
                     "bandwidth), nor wire bytes on a spec without link figures")
    return ExcessAnalysis(by_role, by_path, causes, unattributed,
                          spec_name, capacity,
                          per_instruction, notes)
