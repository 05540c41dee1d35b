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
"""

from __future__ import annotations

import json
import math
from typing import IO

__all__ = ["dumps_json", "finite"]

#: Lists longer than this are written one element per line, each element compact.
LONG_LIST = 32


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
    if isinstance(obj, (list, tuple)):
        return [finite(v, f"{path}[{i}]", replaced) for i, v in enumerate(obj)]
    return obj


def _compact(v) -> str:
    return json.dumps(v, allow_nan=False)


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
    try:
        return _pretty(obj, 0) + "\n"
    except ValueError:  # "Out of range float values are not JSON compliant"
        pass
    replaced: list[str] = []
    clean = finite(obj, "", replaced)
    if isinstance(clean, dict):
        shown = ", ".join(replaced[:5]) + (f" and {len(replaced) - 5} more" if len(replaced) > 5 else "")
        note = (f"{len(replaced)} non-finite number(s) (infinite or NaN) written as null: {shown} "
                "(JSON has no infinite numbers; a hardware figure of 0 or near 0 gives an infinite time)")
        notes = clean.get("notes")
        clean["notes"] = ([*notes] if isinstance(notes, list) else []) + [note]
    return _pretty(clean, 0) + "\n"


def dump_json(obj, file: IO[str]) -> None:
    """Write ``dumps_json(obj)`` to ``file``."""
    file.write(dumps_json(obj))
