"""JSON text of the CLI's outputs (``--json``, ``--trace``): valid JSON, fast at scale.

* Strict JSON: Python's ``json`` writes ``Infinity`` / ``NaN`` for non-finite floats, which
  no JSON parser accepts (RFC 8259 section 6 has no such numbers). They are written as
  ``null`` instead, and the document's ``notes`` list says which keys held them.
* Speed: ``json.dump(obj, indent=...)`` runs the pure-Python encoder (CPython's C encoder
  is used only without ``indent``); on a 100k-instruction report that was 2/3 of
  ``analyze --json``. Here the top level is indented one key per line, and every long list
  (``instructions``, ``traceEvents``...) is written one element per line, each element by
  the C encoder (``json.dumps`` without indent). The keys and values are those of the
  object: only the white space differs from ``json.dump(obj, indent=1)``.
* Memory: a top-level value may be a ``Streamed`` list (``Report.to_json(stream=True)``'s
  ``instructions``), whose elements are made, encoded and written one batch at a time by
  ``write_json``: a 1M-instruction report is never held as a list of dicts nor as one string
  (benchmarks/cli_speed.md). The text written is the same as for the list itself.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterable
from typing import IO

from .._perf import gc_paused

__all__ = ["Streamed", "dump_json", "dumps_json", "finite", "write_json"]

#: Lists longer than this are written one element per line, each element compact.
LONG_LIST = 32
#: Elements of a ``Streamed`` list encoded and written per ``file.write``.
_BATCH = 512


class Streamed:
    """A list of a JSON document made on demand: ``make()`` returns an iterable of its
    ``length`` elements (each a dict, list or scalar); it may be called more than once."""

    __slots__ = ("make", "length")

    def __init__(self, make: Callable[[], Iterable], length: int):
        self.make = make
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return iter(self.make())


def finite(obj, path: str = "", replaced: list[str] | None = None):
    """A copy of ``obj`` (dicts, lists, tuples, scalars) with every non-finite float as None;
    the JSON paths replaced (``instructions[3].time_s``) are appended to ``replaced``."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        if replaced is not None:
            replaced.append(path or "(top level)")
        return None
    if isinstance(obj, dict):
        return {k: finite(v, f"{path}.{k}" if path else str(k), replaced) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, Streamed)):
        return [finite(v, f"{path}[{i}]", replaced) for i, v in enumerate(obj)]
    return obj


#: ``json.dumps(v, allow_nan=False)`` without building an encoder per call (one per row), and
#: without the C encoder's reference-cycle bookkeeping (the documents are trees: no cycles)
_compact = json.JSONEncoder(allow_nan=False, check_circular=False).encode


def _pretty(v, depth: int) -> str:
    """``v`` indented as ``json.dumps(v, indent=1)`` at ``depth``, long lists one element per line."""
    pad = " " * depth
    if isinstance(v, (list, tuple)) and len(v) > LONG_LIST:
        inner = ",\n".join(pad + " " + _compact(x) for x in v)
        return "[\n" + inner + "\n" + pad + "]"
    if isinstance(v, dict) and any(isinstance(x, (list, tuple)) and len(x) > LONG_LIST for x in v.values()):
        items = ",\n".join(f"{pad} {json.dumps(str(k))}: {_pretty(x, depth + 1)}" for k, x in v.items())
        return "{\n" + items + "\n" + pad + "}" if v else "{}"
    return json.dumps(v, indent=1, allow_nan=False).replace("\n", "\n" + pad)


def dumps_json(obj) -> str:
    """``obj`` as strict JSON text ending in a newline (module docstring).

    Non-finite floats become ``null``; when ``obj`` is a dict, a note naming the keys is
    appended to its ``notes`` list (created if absent). ``obj`` itself is not changed.
    """
    if _has_streamed(obj):
        buf = io.StringIO()
        write_json(obj, buf)
        return buf.getvalue()
    try:
        return _pretty(obj, 0) + "\n"
    except ValueError:  # "Out of range float values are not JSON compliant"
        pass
    replaced: list[str] = []
    clean = finite(obj, "", replaced)
    if isinstance(clean, dict):
        notes = clean.get("notes")
        clean["notes"] = ([*notes] if isinstance(notes, list) else []) + [_replaced_note(replaced)]
    return _pretty(clean, 0) + "\n"


def _replaced_note(replaced: list[str]) -> str:
    shown = ", ".join(replaced[:5]) + (f" and {len(replaced) - 5} more" if len(replaced) > 5 else "")
    return (f"{len(replaced)} non-finite number(s) (infinite or NaN) written as null: {shown} "
            "(JSON has no infinite numbers; a hardware figure of 0 or near 0 gives an infinite time)")


def _has_streamed(obj) -> bool:
    return isinstance(obj, dict) and any(isinstance(v, Streamed) for v in obj.values())


def _checked(v, depth: int, path: str, replaced: list[str]) -> str:
    """``_pretty(v, depth)``, with non-finite floats as null (their paths into ``replaced``)."""
    try:
        return _pretty(v, depth)
    except ValueError:
        return _pretty(finite(v, path, replaced), depth)


def _write_streamed(v: Streamed, key: str, replaced: list[str], file: IO[str]) -> None:
    """A top-level ``Streamed`` value as ``_pretty`` writes the list (one element a line)."""
    if len(v) <= LONG_LIST:
        file.write(_checked(list(v), 1, key, replaced))
        return
    file.write("[\n")
    batch: list[str] = []
    first = True
    for i, x in enumerate(v):
        try:
            batch.append("  " + _compact(x))
        except ValueError:
            batch.append("  " + _compact(finite(x, f"{key}[{i}]", replaced)))
        if len(batch) >= _BATCH:
            file.write(("" if first else ",\n") + ",\n".join(batch))
            batch, first = [], False
    if batch:
        file.write(("" if first else ",\n") + ",\n".join(batch))
    file.write("\n ]")


@gc_paused  # the elements are made and dropped one batch at a time; none holds a cycle
def write_json(obj, file: IO[str]) -> None:
    """Write ``dumps_json(obj)`` to ``file``, the elements of each top-level ``Streamed``
    value made and written a batch at a time (the module docstring; the same text).

    Non-finite floats are written as null and noted as ``dumps_json`` does: the values other
    than the streamed ones before ``notes`` are encoded first, so the note is complete when
    ``notes`` is written (a streamed value after ``notes`` is encoded before it too).
    """
    if not _has_streamed(obj):
        file.write(dumps_json(obj))
        return
    keys = list(obj)
    notes_at = keys.index("notes") if "notes" in keys else len(keys)
    replaced: dict[str, list[str]] = {k: [] for k in keys}
    texts: dict[str, str] = {}
    for i, k in enumerate(keys):
        v = obj[k]
        if isinstance(v, Streamed) and i < notes_at:
            continue  # written as it streams
        if k == "notes":
            continue  # written last of all, with what was replaced
        if isinstance(v, Streamed):
            buf = io.StringIO()
            _write_streamed(v, k, replaced[k], buf)
            texts[k] = buf.getvalue()
        else:
            texts[k] = _checked(v, 1, k, replaced[k])

    def notes_text() -> str:
        found = [p for k in keys for p in replaced[k]]
        notes = obj.get("notes", [])
        if found:
            notes = ([*notes] if isinstance(notes, list) else []) + [_replaced_note(found)]
        return _checked(notes, 1, "notes", [])

    file.write("{\n")
    for i, k in enumerate(keys):
        file.write(f" {json.dumps(str(k))}: ")
        if k == "notes":
            file.write(notes_text())
        elif k in texts:
            file.write(texts[k])
        else:
            _write_streamed(obj[k], k, replaced[k], file)
        if i < len(keys) - 1:
            file.write(",\n")
    if "notes" not in obj and any(replaced.values()):
        file.write(f",\n \"notes\": {notes_text()}")
    file.write("\n}\n")


def dump_json(obj, file: IO[str]) -> None:
    """Write ``dumps_json(obj)`` to ``file`` (``write_json``)."""
    write_json(obj, file)
