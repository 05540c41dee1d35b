"""The result file of a sweep (``-o``): rows written as they arrive, read back for ``--resume``.

Two formats, chosen by the file's extension:

* ``.jsonl`` / ``.json`` / ``.ndjson`` (JSON lines): one row (``point.py``'s JSON, nested
  dicts kept) per line, appended and flushed (``fsync``) as each point finishes. A last line
  cut short by a kill (no newline after it) is dropped when the file is read back; any other
  line that is not JSON is an error naming it (the file is left untouched).
* ``.parquet`` (pyarrow): the flat form of the rows (``flatten_row``: ``set.<key>``,
  ``hbm_bytes.<role>``, ``wire_bytes.<kind>`` columns), rewritten to a temporary file and
  renamed over the path after every point, so the file on disk is always a complete table.

Rows are keyed by ``key`` (``spec.point_key``: the point's inputs and jaxmove's version).
Reading keeps the last row of each key. A row read back is checked (``row_problem``: a string
key, numbers where numbers belong, ``fits`` a boolean); a bad one (hand-edited) is skipped with
a note naming its line, and a last line cut short is dropped from the file, so the next
``--resume`` does not trip on it once rows follow it.

One sweep writes a file at a time: the store holds an exclusive ``fcntl.flock`` on a lock
file beside it (``.NAME.lock``, removed when the store closes); a second sweep on the same
file is refused (two concurrent sweeps on one .parquet each rewrote it from their own rows,
and one sweep's rows were lost).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..errors import JaxmoveInputError

__all__ = ["ResultStore", "ResultFileError", "check_result_file", "flatten_row", "unflatten_row",
           "FINISHED"]

#: Statuses of points that need not run again on ``--resume`` (a died / timed-out worker does).
FINISHED = ("ok", "error")
_NESTED = {"overrides": "set.", "hbm_bytes_by_role": "hbm_bytes.", "wire_bytes_by_kind": "wire_bytes.",
           "mesh_axes": "mesh."}
_JSONL = (".jsonl", ".json", ".ndjson")


class ResultFileError(JaxmoveInputError):
    """A result file that cannot be used (wrong extension, exists without --resume, unreadable,
    written by another sweep now)."""


_NUMBER_KEYS = ("flops", "num_devices", "unmodeled", "time_unmodeled")


def row_problem(row) -> str | None:
    """What is wrong with a row read back from a result file, or None when it is usable: it
    must be an object with a string ``key``; ``status`` a string; ``fits`` true, false or
    null; every ``*_s`` / ``*_bytes`` field, ``flops``, ``num_devices``, ``unmodeled``,
    ``time_unmodeled`` and each value of ``hbm_bytes_by_role`` / ``wire_bytes_by_kind`` a
    finite number >= 0 or null (a string ``est_time_s`` made the ranking raise TypeError)."""
    if not isinstance(row, dict):
        return f"not a JSON object ({type(row).__name__})"
    if not isinstance(row.get("key"), str):
        return "no string 'key'"
    if "status" in row and not isinstance(row["status"], str):
        return f"status is {row['status']!r}, expected a string"
    if row.get("fits") not in (None, True, False):
        return f"fits is {row['fits']!r}, expected true, false or null"

    def bad(v) -> bool:
        return v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or v < 0)
    for k, v in row.items():
        if (k.endswith(("_s", "_bytes")) or k in _NUMBER_KEYS) and bad(v):
            return f"{k} is {v!r}, expected a number >= 0 or null"
    for k in ("hbm_bytes_by_role", "wire_bytes_by_kind"):
        d = row.get(k)
        if d is None:
            continue
        if not isinstance(d, dict):
            return f"{k} is {d!r}, expected an object of numbers"
        for sk, v in d.items():
            if bad(v):
                return f"{k}.{sk} is {v!r}, expected a number >= 0 or null"
    return None


def flatten_row(row: dict) -> dict:
    """A row with its nested dicts spread into columns: ``overrides`` -> ``set.<key>``,
    ``hbm_bytes_by_role`` -> ``hbm_bytes.<role>``, ``wire_bytes_by_kind`` -> ``wire_bytes.<kind>``,
    ``mesh_axes`` -> ``mesh.<axis>``."""
    out = {}
    for k, v in row.items():
        prefix = _NESTED.get(k)
        if prefix is None:
            out[k] = v
        else:
            out.update({prefix + sk: sv for sk, sv in (v or {}).items()})
    return out


def unflatten_row(flat: dict) -> dict:
    """The inverse of ``flatten_row``; null cells (columns other rows have) are dropped."""
    row: dict = {k: {} for k in _NESTED}
    for k, v in flat.items():
        for nested, prefix in _NESTED.items():
            if k.startswith(prefix):
                if v is not None and v == v:  # not None / NaN
                    row[nested][k[len(prefix):]] = str(v) if nested == "overrides" else v
                break
        else:
            row[k] = list(v) if k == "notes" and v is not None else v
    return row


def refuse_existing(path, resume: bool, overwrite: bool) -> None:
    """Raise ResultFileError when ``path`` holds results and neither ``resume`` nor
    ``overwrite`` says what to do with them (the CLI asks before it starts, the store again
    when it opens)."""
    p = Path(path)
    if not resume and not overwrite and p.exists() and p.is_file() and p.stat().st_size > 0:
        raise ResultFileError(f"{path}: exists; pass --resume to continue that sweep "
                              "(finished points are not compiled again) or --overwrite "
                              "to start anew")


def _read_jsonl(path: Path) -> tuple[dict[str, dict], list[str], list[str], bool]:
    """(rows by key, notes, the file's lines split at newlines, whether its last line is a
    write cut short) of a JSON-lines result file; writes nothing.

    Only a last line without its newline can be a write a killed sweep cut short: when it is
    not JSON it is dropped (a note says so). Any other line that is not JSON (a complete
    line: hand-edited, or another file) is an error; a JSON line that is not a sweep row
    (``row_problem``) is skipped with a note.

    Raises:
      ResultFileError: unreadable, or a complete line that is not JSON (``FILE:LINE``).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ResultFileError(f"{path}: cannot read the result file ({e})") from None
    lines = text.split("\n") if text else []   # [..., ""] when the last line has its newline
    rows: dict[str, dict] = {}
    notes: list[str] = []
    cut_last = False
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            if i == len(lines):  # no newline after it: the last write was cut short (killed sweep)
                notes.append(f"{path}:{i}: incomplete last line dropped (no newline: a write cut "
                             "short)")
                cut_last = True
                continue
            why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            raise ResultFileError(f"{path}:{i}: not a JSON row ({why}); the file is left as it is: "
                                  "fix or delete that line, or start anew with --overwrite") from None
        problem = row_problem(row)
        if problem is not None:
            notes.append(f"{path}:{i}: not a sweep row ({problem}); skipped")
            continue
        rows[row["key"]] = row
    return rows, notes, lines, cut_last


def _result_format(path) -> str:
    """``jsonl`` or ``parquet`` by ``path``'s extension; ResultFileError for another one, or for
    Parquet without pyarrow."""
    suffix = Path(path).suffix.lower()
    if suffix in _JSONL:
        return "jsonl"
    if suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ResultFileError(f"{path}: Parquet needs pyarrow (pip install 'jaxmove[ray]' or "
                                  "pyarrow); or write JSON lines (-o results.jsonl)") from None
        return "parquet"
    raise ResultFileError(f"{path}: unknown result format {suffix or '(no extension)'!r}; "
                          "expected .parquet or .jsonl")


def check_result_file(path, resume: bool, overwrite: bool) -> None:
    """What the CLI checks of ``-o`` before the sweep says anything: its format
    (``_result_format``), that it can be written (``check_output_path``), ``refuse_existing``,
    and with ``resume`` a JSON-lines file must read back (``_read_jsonl``; nothing is written)."""
    from ..report.outputs import check_output_path
    _result_format(path)
    check_output_path(Path(path), "-o result file")
    refuse_existing(path, resume, overwrite)
    p = Path(path)
    if (resume and p.suffix.lower() in _JSONL and p.is_file() and p.stat().st_size > 0):
        _read_jsonl(p)


class ResultStore:
    """Rows of one sweep in a file (``path``), or in memory only (``path`` None).

    Args:
      path: ``.jsonl`` / ``.json`` / ``.ndjson`` or ``.parquet`` file, or None.
      resume: read the rows already there (``rows``); else the file must not exist unless
        ``overwrite``.
      overwrite: start a new file over an existing one.
    Raises:
      ResultFileError: another extension; the file exists without ``resume``/``overwrite``;
        the file cannot be read; Parquet without pyarrow.
      jaxmove.report.outputs.OutputPathError: a path that cannot be written.
    """

    def __init__(self, path: str | os.PathLike | None, resume: bool = False, overwrite: bool = False):
        self.path = Path(path) if path is not None else None
        self.rows: dict[str, dict] = {}
        self.notes: list[str] = []
        self.format = None
        if self.path is None:
            return
        from ..report.outputs import check_output_path

        self.format = _result_format(self.path)
        check_output_path(self.path, "-o result file")
        self._lock()
        try:
            if self.path.exists() and self.path.stat().st_size > 0:
                if resume:
                    self.rows = self._read()
                else:
                    refuse_existing(path, resume, overwrite)
            if not resume or not self.path.exists():
                self._reset()
        except BaseException:
            self.close()  # no lock left behind by a store that could not open
            raise

    # ---- one writer at a time --------------------------------------------------------------

    _lock_fd: int | None = None

    def _lock(self) -> None:
        """Take the exclusive lock of this result file (``.NAME.lock`` beside it), or raise
        ResultFileError when another sweep holds it. The lock file is checked to still be
        the one at its path after locking (a closing store removes it)."""
        import fcntl
        lock = self.path.with_name(f".{self.path.name}.lock")
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise ResultFileError(f"{self.path}: cannot create its lock file {lock}: "
                                      f"{e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise ResultFileError(f"{self.path}: another sweep is writing this file (it holds "
                                      f"{lock}); wait for it, or write to another file") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(lock).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._lock_fd, self._lock_path = fd, lock
                return
            os.close(fd)  # removed by the store that held it: lock the new one

    def close(self) -> None:
        """Release the lock (removing the lock file); the rows stay readable in memory."""
        fd = self._lock_fd
        if fd is None:
            return
        self._lock_fd = None
        try:
            os.unlink(self._lock_path)
        except OSError:
            pass
        os.close(fd)  # closing releases the flock

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit os may be gone
            pass

    # ---- reading ------------------------------------------------------------------------

    def _read(self) -> dict[str, dict]:
        rows: dict[str, dict] = {}
        if self.format == "jsonl":
            rows, notes, lines, cut_last = _read_jsonl(self.path)
            self.notes += notes
            if lines and lines[-1] != "":  # the last line has no newline (a write cut short)
                # appends start on a fresh line, after no broken last line
                kept = lines[:-1] if cut_last else lines
                self._atomic(lambda f: f.write("".join(l + "\n" for l in kept).encode()))
            return rows
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(self.path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise ResultFileError(f"{self.path}: cannot read the Parquet result file ({e})") from None
        if "key" not in table.column_names:
            raise ResultFileError(f"{self.path}: not a sweep result file (no 'key' column)")
        for i, flat in enumerate(table.to_pylist()):
            row = unflatten_row(flat)
            problem = row_problem(row)
            if problem is not None:
                self.notes.append(f"{self.path}: row {i}: not a sweep row ({problem}); skipped")
                continue
            rows[row["key"]] = row
        return rows

    # ---- writing ------------------------------------------------------------------------

    def _reset(self) -> None:
        if self.format == "jsonl":
            self.path.write_text("", encoding="utf-8")
        else:
            self._write_parquet()

    def add(self, row: dict) -> None:
        """Record a finished point's row (replacing an earlier row of the same key) and write it."""
        self.rows[row["key"]] = row
        if self.path is None:
            return
        if self.format == "jsonl":
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row, sort_keys=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        else:
            self._write_parquet()

    def _write_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = [flatten_row(r) for r in self.rows.values()]
        columns: dict[str, None] = {}
        for r in flat:
            columns.update(dict.fromkeys(r))
        table = (pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in flat]) if flat
                 else pa.table({"key": pa.array([], pa.string())}))
        self._atomic(lambda f: pq.write_table(table, f))

    def _atomic(self, write) -> None:
        """Write through a temporary file in the same directory, then rename over the path."""
        from ..report.outputs import write_atomic
        write_atomic(self.path, write, "sweep results file", binary=True)
