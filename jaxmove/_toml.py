"""Positions of TOML syntax errors, for ``file:line:col: what`` messages.

Python 3.11's ``tomllib.TOMLDecodeError`` carries its position only in its text, as
``what (at line L, column C)`` or ``what (at end of document)`` (Lib/tomllib/_parser.py,
``suffixed_err``); ``lineno`` / ``colno`` attributes arrive in Python 3.14.
"""

from __future__ import annotations

import re
import tomllib

_AT = re.compile(r"\s*\(at line ([0-9]+), column ([0-9]+)\)$")
_AT_END = re.compile(r"\s*\(at end of document\)$")


def toml_error_message(path: str, e: tomllib.TOMLDecodeError, text: str) -> str:
    """``path:line:col: invalid TOML: what`` (``path:LAST: ... (at end of file)`` for an error
    at the end; ``path: invalid TOML: ...`` when tomllib gave no position)."""
    msg = str(e)
    m = _AT.search(msg)
    if m:
        return f"{path}:{m.group(1)}:{m.group(2)}: invalid TOML: {msg[:m.start()]}"
    m = _AT_END.search(msg)
    if m:
        last = max(1, len(text.splitlines()))
        return f"{path}:{last}: invalid TOML: {msg[:m.start()]} (at end of file)"
    return f"{path}: invalid TOML: {msg}"
