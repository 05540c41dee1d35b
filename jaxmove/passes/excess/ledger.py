"""The ledger of the excess pass: every access of every kernel split into a compulsory part and
excess with one cause, summed per role and path, and the identity it holds by construction,

    compiled = compulsory + sum of causes + unattributed     (per role and per path)

(``build_result`` turns the sums into an ExcessAnalysis). The ledger only adds: it decides
nothing (``compulsory.py`` decides what is compulsory, ``causes.py`` names the causes).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ...hlo import Module
from ...vocab import PATHS, ROLES
from .causes import UNATTRIBUTED
from .records import CauseInstruction, ExcessAnalysis, ExcessCause, ExcessLine, _PerInstruction, group_sums

#: Instructions listed per cause (the costliest); ``num_instructions`` counts them all.
MAX_LISTED = 10

HBM_READ, HBM_WRITE = "hbm_to_onchip", "onchip_to_hbm"


def _event_array(events: list[int]):
    """The events as an [n, 5] array: int64 where every sum of them fits (each value and 4x the
    count times the largest below 2**63: the charges sum up to two parts per event), else
    Python ints (dtype object: exact at any size, e.g. a loop of 5e8 trips over 16 GiB)."""
    n = len(events)
    if not n:
        return np.zeros((0, 5), np.int64)
    try:
        ev = np.fromiter(events, np.int64, n)
    except OverflowError:
        ev = None
    if ev is not None and max(int(ev.max()), -int(ev.min())) * 4 * n < 2 ** 63:
        return ev.reshape(-1, 5)
    return np.array(events, dtype=object).reshape(-1, 5)


class _Codes(dict):
    """role -> event code of one (kind, subject, path) (``Ledger.codes_for``), interned on
    first use."""

    __slots__ = ("_ledger", "_kind", "_subject", "_path")

    def __init__(self, ledger, kind, subject, path):
        super().__init__()
        self._ledger, self._kind, self._subject, self._path = ledger, kind, subject, path

    def __missing__(self, role):
        c = self[role] = self._ledger.code(self._kind, self._subject, role, self._path)
        return c


class Ledger:
    """Bytes per role and path: compiled, compulsory, per cause and per instruction (by its
    row number in the pass's row list).

    Accesses with excess are kept as events, five ints each in ``events`` (row number, code of
    (kind, subject, role, path), physical bytes, compulsory bytes, data bytes: ``add``'s
    arguments), summed once by ``build_result`` (numpy): appending one is a few times cheaper
    than the five dict updates it replaces, and the pass makes one per access of every
    intermediate. Accesses without excess are summed per role at once (``read_both`` ...)."""

    def __init__(self, hbm_s_per_byte: float | None):
        # (role, path) -> bytes of the accesses that are no events (add_compulsory, add_wire)
        self.compiled: dict[tuple, int] = defaultdict(int)
        self.compulsory: dict[tuple, int] = defaultdict(int)
        # role -> bytes of HBM reads / writes all of whose bytes are data and needed (each
        # counts in compiled and compulsory alike: ``fold`` adds them there)
        self.read_both: dict = defaultdict(int)
        self.write_both: dict = defaultdict(int)
        # role -> compiled / compulsory bytes of other HBM reads without excess
        self.read_compiled: dict = defaultdict(int)
        self.read_compulsory: dict = defaultdict(int)
        self.events: list[int] = []   # (row, code, phys, compulsory, logical) per access, flat
        self.codes: dict[tuple, int] = {}  # (kind, subject, role, path) -> code
        self.keys: list[tuple] = []        # code -> (kind, subject, role, path)
        self.cause_s: dict[tuple, float] = {}     # (kind, subject) -> seconds of wire bytes
        self.hbm_s_per_byte = hbm_s_per_byte

    def code(self, kind: str, subject: str, role, path: str) -> int:
        """The event code of (kind, subject, role, path), interned."""
        key = (kind, subject, role, path)
        c = self.codes.get(key)
        if c is None:
            c = self.codes[key] = len(self.keys)
            self.keys.append(key)
        return c

    def codes_for(self, kind: str, subject: str, path: str) -> dict:
        """role -> code of (kind, subject, role, path): for a loop that charges one cause."""
        return _Codes(self, kind, subject, path)

    def add(self, role, path: str, phys: int, compulsory: int, logical: int, kind: str,
            subject: str, k: int) -> None:
        """One access of row ``k``: ``phys`` bytes moved, ``logical`` of them data,
        ``compulsory`` of those needed; the padding is ``tile_padding``, the rest of the data
        ``kind``."""
        c = self.codes.get((kind, subject, role, path))
        if c is None:
            c = self.code(kind, subject, role, path)
        self.events += (k, c, phys, compulsory, logical)

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

    def add_wire(self, path: str, wire: int, compulsory: int, parts, k: int, s_per_byte) -> None:
        """A collective's wire bytes (row ``k``): ``parts`` are (kind, bytes) of the excess."""
        rp = (None, path)
        excess = 0
        for kind, nbytes in parts:
            if nbytes > 0:
                excess += nbytes
                self.events += (k, self.code(kind, "", None, path), nbytes, 0, nbytes)
                if s_per_byte is not None:
                    self.cause_s[(kind, "")] = self.cause_s.get((kind, ""), 0.0) + nbytes * s_per_byte
        self.compiled[rp] += wire - excess
        self.compulsory[rp] += compulsory

    def charges(self):
        """The excess of the events, settled (once, after ``fold``): the events' compiled and
        compulsory bytes added into ``compiled`` / ``compulsory``, and per charge (the tile
        padding of an event, then the rest of its excess, each where positive), in the order
        charged, numpy arrays (code, row, bytes)."""
        ev = _event_array(self.events)
        self.events = []
        row, code, phys, comp, logical = ev.T
        if ev.dtype == object:  # (Python ints: the row numbers and codes index)
            row, code = row.astype(np.int64), code.astype(np.int64)
        s_phys, s_comp = np.zeros(len(self.keys), ev.dtype), np.zeros(len(self.keys), ev.dtype)
        np.add.at(s_phys, code, phys)
        np.add.at(s_comp, code, comp)
        codes = np.flatnonzero(np.bincount(code, minlength=len(self.keys)))
        s_phys, s_comp = s_phys[codes], s_comp[codes]
        keys = self.keys
        for c, p, q in zip(codes.tolist(), s_phys.tolist(), s_comp.tolist()):
            _kind, _subj, role, path = keys[c]
            self.compiled[(role, path)] += p
            if q:
                self.compulsory[(role, path)] += q
        pad, exc = phys - logical, logical - comp
        # (each code's tile_padding code; interning may append to keys: a copy is walked)
        pad_code = np.array([self.code("tile_padding", "", role, path) for _k, _s, role, path in list(keys)],
                            np.int64) if keys else np.zeros(0, np.int64)
        # (interleaved: event i's padding, then its excess)
        ch_code = np.stack([pad_code[code] if len(code) else code, code], axis=1).ravel()
        ch_row = np.repeat(row, 2)
        ch_bytes = np.stack([pad, exc], axis=1).ravel()
        keep = ch_bytes > 0
        return ch_code[keep], ch_row[keep], ch_bytes[keep]


def build_result(ledger: Ledger, module: Module, rows, notes: list[str], capacity: int | None,
                 any_unmodeled: bool, spec_name: str | None, fix) -> ExcessAnalysis:
    """The ExcessAnalysis of a settled ledger: per role and per path, compiled = compulsory +
    causes + unattributed (each from the ledger's sums), the causes grouped by (kind, subject)
    with their costliest ``MAX_LISTED`` instructions (``rows``: the pass's row list) and
    ``fix(kind, subject, bytes, items)``'s text, timed at the ledger's seconds per HBM byte and
    per wire byte."""
    ledger.fold()
    ch_code, ch_row, ch_bytes = ledger.charges()
    keys = ledger.keys
    # per (kind, subject, role, path), in the order first charged
    per_code = np.zeros(len(keys), ch_bytes.dtype)
    np.add.at(per_code, ch_code, ch_bytes)
    first_code = np.full(len(keys), len(ch_code), np.int64)
    np.minimum.at(first_code, ch_code, np.arange(len(ch_code)))
    codes = np.flatnonzero(first_code < len(ch_code))
    codes = codes[np.argsort(first_code[codes])]
    per_code = per_code[codes]
    groups: dict[tuple[str, str], list] = {}  # (kind, subject) -> [by_role, by_path, (rows, bytes)]
    un_rp: dict[tuple, int] = {}
    for c, nbytes in zip(codes.tolist(), per_code.tolist()):
        kind, subject, role, path = keys[c]
        g = groups.setdefault((kind, subject), [{}, {}, None])
        if role is not None:
            g[0][role] = g[0].get(role, 0) + nbytes
        g[1][path] = g[1].get(path, 0) + nbytes
        if kind == UNATTRIBUTED:
            un_rp[(role, path)] = un_rp.get((role, path), 0) + nbytes
    # per (kind, subject) and row, in the order first charged; each cause's rows sorted by
    # bytes, ties in that order (the costliest MAX_LISTED are listed)
    ks_id = {ks: i for i, ks in enumerate(groups)}
    ks_of_code = np.array([ks_id.get(key[:2], -1) for key in keys], np.int64)
    span = len(rows) + 1
    kr, first, (kr_bytes,) = group_sums(ks_of_code[ch_code] * span + ch_row, ch_bytes)
    g_ks, g_row = kr // span, kr % span
    order = np.lexsort((first, -kr_bytes, g_ks))
    s_ks, s_row, s_bytes = g_ks[order], g_row[order], kr_bytes[order]
    bounds = np.searchsorted(s_ks, np.arange(len(groups) + 1)).tolist()
    for i, g in enumerate(groups.values()):
        a, b = bounds[i], bounds[i + 1]
        g[2] = (s_row[a:b], s_bytes[a:b])
    # (built on first use; a copy of the row list, which may be the analysis's own)
    per_instruction = _PerInstruction(rows[:], (ch_row, ch_bytes))
    causes: list[ExcessCause] = []
    unattributed = None
    spb = ledger.hbm_s_per_byte
    for (kind, subject), (by_role, by_path, (g_rows, g_bytes)) in groups.items():
        total = sum(by_path.values())
        if not total:
            continue
        items = []
        flops = 0
        if kind == "rematerialization":
            flops = sum(rows[k].total.flops for k in g_rows.tolist())
        for k, b in zip(g_rows[:MAX_LISTED].tolist(), g_bytes[:MAX_LISTED].tolist()):
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
                            fix(kind, subject, total, items), flops, tuple(items), len(g_rows))
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
