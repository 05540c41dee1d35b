"""Integers as XLA's HLO lexer reads them: ASCII digits only.

XLA's lexer (xla/hlo/parser/hlo_lexer.cc, ``LexNumberOrPattern``) takes ``[-]?[0-9]+``.
Python's ``int()`` and ``str.isdigit()`` also take other scripts' digits (``int('٣') == 3``),
``+``, ``_`` separators and Unicode blanks, and ``isdigit()`` is true for superscripts that
``int()`` refuses (``'²'``): every integer of HLO text goes through these functions instead.
"""

from __future__ import annotations

import re

_INT = re.compile(r"[ \t]*+(-?[0-9]++)[ \t]*+")


def is_uint(text: str) -> bool:
    """True when ``text`` is a non-empty run of ASCII digits ``[0-9]+`` (nothing else)."""
    return text.isascii() and text.isdigit()


def ascii_int(text: str) -> int:
    """``text`` (``-?[0-9]+``, blanks or tabs around it allowed) as an int.

    Raises:
      ValueError: anything else (other scripts' digits, superscripts, '+', '_', empty).
    """
    m = _INT.fullmatch(text)
    if m is None:
        raise ValueError(f"expected an integer of ASCII digits, found {text!r}")
    return int(m.group(1))
