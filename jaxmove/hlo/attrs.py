"""Parsers for attribute values that XLA prints as text (metadata, backend_config, aliasing).

These work on the raw value text the HLO parser stored in ``Instruction.attrs``.
"""

from __future__ import annotations

import json
import re

# Possessive (Python >= 3.11): a quoted value keeps no backtracking state per character, so
# memory stays bounded by the text's size (the backtracking form took ~150 bytes a character).
_KV = re.compile(r'([A-Za-z_][A-Za-z0-9_]*+)=("(?:[^"\\]++|\\.)*+"|\{[^{}]*+\}|[^\s{}]++)')


# absl::CUnescape's escapes (absl/strings/escaping.cc ``CUnescapeInternal``), which XLA's lexer
# applies to every string token (xla/hlo/parser/hlo_lexer.cc ``HloLexer::LexString``):
# \ooo (1-3 octal digits), \xH... (any number of hex digits), \uHHHH, \UHHHHHHHH, one letter.
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|[xX]([0-9A-Fa-f]*+)|u([0-9A-Fa-f]{0,4})|U([0-9A-Fa-f]{0,8})|(.)|\Z)",
                     re.S)
_SIMPLE_ESCAPES = {"a": b"\a", "b": b"\b", "f": b"\f", "n": b"\n", "r": b"\r", "t": b"\t",
                   "v": b"\v", "\\": b"\\", "?": b"?", "'": b"'", '"': b'"'}


class EscapeError(ValueError):
    """A string literal with an escape sequence XLA's lexer refuses (absl::CUnescape's message)."""


def _rune(hexdigits: str, want: int, letter: str) -> bytes:
    if len(hexdigits) < want:
        raise EscapeError(f"\\{letter} must be followed by {want} hex digits: \\{letter}{hexdigits}")
    rune = int(hexdigits, 16)
    if rune > 0x10FFFF:
        raise EscapeError(f"Value of \\{letter}{hexdigits} exceeds Unicode limit (0x10FFFF)")
    if 0xD800 <= rune <= 0xDFFF:
        raise EscapeError(f"invalid surrogate character (0xD800-DFFF): \\{letter}{hexdigits}")
    return chr(rune).encode("utf-8")


def c_unescape(s: str) -> str:
    """The value of an HLO string literal's contents, as XLA's lexer reads it: ``absl::CUnescape``
    (absl/strings/escaping.cc ``CUnescapeInternal``, called by xla/hlo/parser/hlo_lexer.cc
    ``LexString``): ``\\n \\t \\r \\a \\b \\f \\v \\\\ \\' \\" \\?``, ``\\ooo`` (1 to 3 octal
    digits, at most 0xff), ``\\xH...`` (hex digits, at most 0xff), ``\\uHHHH`` / ``\\UHHHHHHHH``
    (a code point, UTF-8 encoded). Escapes give bytes: ``\\033`` is ESC, ``\\303\\251`` is "é".

    XLA's value is a byte string; here it is decoded as UTF-8 with ``surrogateescape`` (bytes
    that are not UTF-8, e.g. from ``\\377``, become U+DC80-U+DCFF, and
    ``value.encode("utf-8", "surrogateescape")`` is XLA's bytes). Renderings escape control
    characters and those (report/render_helpers.py ``printable``).

    Raises:
      EscapeError: an escape XLA refuses (unknown letter, value past 0xff, a trailing ``\\``,
        a short ``\\u``...), with absl's message.
    """
    if "\\" not in s:
        return s
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(s):
        out += s[pos:m.start()].encode("utf-8", "surrogateescape")
        pos = m.end()
        octal, hexdigits, u4, u8, letter = m.groups()
        if octal is not None:
            v = int(octal, 8)
            if v > 0xFF:
                raise EscapeError(f"Value of \\{octal} exceeds 0xff")
            out.append(v)
        elif hexdigits is not None:
            if not hexdigits:
                raise EscapeError("String cannot end with \\x" if m.end() == len(s)
                                  else "\\x cannot be followed by a non-hex digit")
            if len(hexdigits.lstrip("0")) > 2:
                raise EscapeError(f"Value of \\x{hexdigits} exceeds 0xff")
            out.append(int(hexdigits, 16))
        elif u4 is not None:
            out += _rune(u4, 4, "u")
        elif u8 is not None:
            out += _rune(u8, 8, "U")
        elif letter is not None:
            b = _SIMPLE_ESCAPES.get(letter)
            if b is None:
                raise EscapeError(f"Unknown escape sequence: \\{letter}")
            out += b
        else:
            raise EscapeError("String cannot end with \\")
    out += s[pos:].encode("utf-8", "surrogateescape")
    return out.decode("utf-8", "surrogateescape")


def unquote(s: str) -> str:
    """Strip quotes from an HLO string literal and undo its escapes as XLA does (``c_unescape``).

    Raises:
      EscapeError: an escape XLA's lexer refuses.
    """
    s = s.strip()
    if len(s) >= 2 and s[0] == '"' and s[-1] == '"':
        s = c_unescape(s[1:-1])
    return s


def parse_kv_block(value: str) -> dict[str, str]:
    """``{op_type="x" op_name="y" source_line=3}`` -> {"op_type": "x", ...} (strings unquoted)."""
    v = value.strip()
    if v.startswith("{") and v.endswith("}"):
        v = v[1:-1]
    out: dict[str, str] = {}
    for key, x in _KV.findall(v):
        if len(x) >= 2 and x[0] == '"':  # a whole string literal (_KV): unquote(x), inline
            x = x[1:-1]
            if "\\" in x:
                x = c_unescape(x)
        out[key] = x
    return out


_UNQUOTED_KEY = re.compile(r'([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)(\s*:)')


def parse_backend_config(value: str) -> dict | None:
    """backend_config text -> dict.

    XLA prints JSON (``backend_config={"a":1}``); older versions print an escaped JSON
    string (``backend_config="{\\"a\\":1}"``); Triton fusions in tests use relaxed JSON
    with unquoted keys. Returns None when the text is not JSON of any of these forms.
    """
    v = value.strip()
    if v.startswith('"'):
        try:
            v = unquote(v)
        except EscapeError:  # (validate.py refuses such a module; None for one built by hand)
            return None
    if not v.startswith("{"):
        return None
    try:
        out = json.loads(v)
    except json.JSONDecodeError:
        try:
            out = json.loads(_UNQUOTED_KEY.sub(r'\1"\2"\3', v))
        except json.JSONDecodeError:
            return None
    return out if isinstance(out, dict) else None


_ALIAS = re.compile(r"\{([0-9,\s]*)\}\s*:\s*\(\s*([0-9]+)\s*,\s*\{([0-9,\s]*)\}")


def _index(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x.strip())


def parse_input_output_alias(value: str) -> dict[int, list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """``{ {0}: (1, {}, may-alias) }`` -> {1: [((0,), ())]}: parameter -> [(output index, param index)]."""
    out: dict[int, list] = {}
    for m in _ALIAS.finditer(value):
        out.setdefault(int(m.group(2)), []).append((_index(m.group(1)), _index(m.group(3))))
    return out
