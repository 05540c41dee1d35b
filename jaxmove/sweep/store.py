"""The result file of a sweep (``-o``): rows written as they arrive, read back for ``--resume``.

Two formats, chosen by the file's extension:

* ``.jsonl`` / ``.json`` / ``.ndjson`` (JSON lines): one row (``point.py``'s JSON, nested
  dicts kept) per line, appended and flushed (``fsync``) as each point finishes. A last line
  cut short by a kill is ignored when the file is read back.
* ``.parquet`` (pyarrow): the flat form of the rows (``flatten_row``: ``set.<key>``,
  ``hbm_bytes.<role>``, ``wire_bytes.<kind>`` columns), rewritten to a temporary file and
  renamed over the path after every point, so the file on disk is always a complete table.

Rows are keyed by ``key`` (``spec.point_key``: the point's inputs and jaxmove's version).
Reading keeps the last row of each key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import JaxmoveInputError

__all__ = ["ResultStore", "ResultFileError", "flatten_row", "unflatten_row", "FINISHED"]

#: Statuses of points that need not run again on ``--resume`` (a died / timed-out worker does).
FINISHED = ("ok", "error")
_NESTED = {"overrides": "set.", "hbm_bytes_by_role": "hbm_bytes.", "wire_bytes_by_kind": "wire_bytes."}
_JSONL = (".jsonl", ".json", ".ndjson")


class ResultFileError(JaxmoveInputError):
    """A result file that cannot be used (wrong extension, exists without --resume, unreadable)."""


def flatten_row(row: dict) -> dict:
    """A row with its nested dicts spread into columns: ``overrides`` -> ``set.<key>``,
    ``hbm_bytes_by_role`` -> ``hbm_bytes.<role>``, ``wire_bytes_by_kind`` -> ``wire_bytes.<kind>``."""
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

        suffix = self.path.suffix.lower()
        if suffix in _JSONL:
            self.format = "jsonl"
        elif suffix == ".parquet":
            self.format = "parquet"
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise ResultFileError(f"{path}: Parquet needs pyarrow (pip install 'jaxmove[ray]' or "
                                      "pyarrow); or write JSON lines (-o results.jsonl)") from None
        else:
            raise ResultFileError(f"{path}: unknown result format {suffix or '(no extension)'!r}; "
                                  "expected .parquet or .jsonl")
        check_output_path(self.path, "-o result file")
        if self.path.exists() and self.path.stat().st_size > 0:
            if resume:
                self.rows = self._read()
            elif not overwrite:
                raise ResultFileError(f"{path}: exists; pass --resume to continue that sweep (finished "
                                      "points are not compiled again) or --overwrite to start anew")
        if not resume or not self.path.exists():
            self._reset()

    # ---- reading ------------------------------------------------------------------------

    def _read(self) -> dict[str, dict]:
        rows: dict[str, dict] = {}
        if self.format == "jsonl":
            lines = self.path.read_text(encoding="utf-8").splitlines()
            for i, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    if i == len(lines):  # the last write was cut short (killed sweep)
                        self.notes.append(f"{self.path}:{i}: incomplete last line ignored")
                        continue
                    raise ResultFileError(f"{self.path}:{i}: not a JSON row") from None
                if not isinstance(row, dict) or "key" not in row:
                    raise ResultFileError(f"{self.path}:{i}: not a sweep row (no 'key')")
                rows[row["key"]] = row
            if lines and not self.path.read_text(encoding="utf-8").endswith("\n"):
                self._rewrite_jsonl(rows)  # appends start on a fresh line
            return rows
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(self.path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise ResultFileError(f"{self.path}: cannot read the Parquet result file ({e})") from None
        if "key" not in table.column_names:
            raise ResultFileError(f"{self.path}: not a sweep result file (no 'key' column)")
        for flat in table.to_pylist():
            rows[flat["key"]] = unflatten_row(flat)
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

    def _rewrite_jsonl(self, rows: dict[str, dict]) -> None:
        self._atomic(lambda f: f.write("".join(json.dumps(r) + "\n" for r in rows.values()).encode()))

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
