"""Parsers for attribute values that XLA prints as text (metadata, backend_config, aliasing).

These work on the raw value text the HLO parser stored in ``Instruction.attrs``.
"""

from __future__ import annotations

import json
import re

# Possessive (Python >= 3.11): a quoted value keeps no backtracking state per character, so
# memory stays bounded by the text's size (the backtracking form took ~150 bytes a character).
_KV = re.compile(r'([A-Za-z_][A-Za-z0-9_]*+)=("(?:[^"\\]++|\\.)*+"|\{[^{}]*+\}|[^\s{}]++)')


def unquote(s: str) -> str:
    """Strip quotes from an HLO string literal and undo C escapes (``\\'``, ``\\"``, ``\\n``)."""
    s = s.strip()
    if len(s) >= 2 and s[0] == '"' and s[-1] == '"':
        s = s[1:-1]
        if "\\" in s:
            s = re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), s)
    return s


def parse_kv_block(value: str) -> dict[str, str]:
    """``{op_type="x" op_name="y" source_line=3}`` -> {"op_type": "x", ...} (strings unquoted)."""
    v = value.strip()
    if v.startswith("{") and v.endswith("}"):
        v = v[1:-1]
    return {m.group(1): unquote(m.group(2)) for m in _KV.finditer(v)}


_UNQUOTED_KEY = re.compile(r'([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)(\s*:)')


def parse_backend_config(value: str) -> dict | None:
    """backend_config text -> dict.

    XLA prints JSON (``backend_config={"a":1}``); older versions print an escaped JSON
    string (``backend_config="{\\"a\\":1}"``); Triton fusions in tests use relaxed JSON
    with unquoted keys. Returns None when the text is not JSON of any of these forms.
    """
    v = value.strip()
    if v.startswith('"'):
        v = unquote(v)
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
