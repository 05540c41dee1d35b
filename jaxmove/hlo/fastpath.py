"""The parser's fast path: regular expressions for the one-line forms XLA prints.

``[ROOT] %name = shape opcode(%a, %b), key=value, ...`` with no comments, no operand
shapes, no nested instructions. A line that does not match in full is parsed by the
general recursive-descent code (``parser.py``), which also reports every error, so the
fast path never changes what is accepted or how it is read (a computation written in place
as an attribute value, ``calls={ ... }``, is such a line). Possessive quantifiers (``*+``,
``++``, Python >= 3.11) keep every match linear in the line length, whatever the input.

Kept apart from ``parser.py`` so that the IR (``ir.py``) can read attribute text that the
fast path matched but did not split (``parse_attr_text``) without importing the parser.
"""

from __future__ import annotations

import re

_F_NAME = r"%?(?:[A-Za-z_][A-Za-z0-9_.\-$]*+|[0-9][A-Za-z0-9_.\-$]*+)"
_F_ARRAY = r"[a-z][a-z0-9]*+\[[^\]\[\n]*+\](?:\{[^{}\n]*+\})?"
_F_SHAPE = rf"(?:{_F_ARRAY}|\((?:{_F_ARRAY}(?:,[ \t]*+{_F_ARRAY})*+)?\))"
_F_STR = r'"(?:[^"\\\n]++|\\.)*+"'
_F_BRACE = rf'\{{(?:[^{{}}"\n]++|{_F_STR})*+\}}'
for _ in range(3):  # up to four levels of nested braces (GPU backend_config JSON)
    _F_BRACE = rf'\{{(?:[^{{}}"\n]++|{_F_STR}|{_F_BRACE})*+\}}'
_F_VALUE = (rf'(?:[^\s,(){{}}\[\]"]++|{_F_STR}|{_F_BRACE}|\[[^\[\](){{}}"\n]*+\]'
            rf'|\([^\[\](){{}}"\n]*+\))++')
_F_ATTR = rf'[ \t]*+,[ \t]*+([A-Za-z_][A-Za-z0-9_\-.]*+)[ \t]*+=[ \t]*+({_F_VALUE})'
# A computation written in place (``calls={ ... }``: a '{' after a key naming one computation,
# parser.py _INLINE_KEYS) is left to the general code, which parses it as a computation.
_F_INLINE = (r'(?:calls|to_apply|condition|body|true_computation|false_computation|select|scatter)'
             r'[ \t]*+=[ \t]*+\{')
_F_ATTR_NC = rf'[ \t]*+,[ \t]*+(?!{_F_INLINE})[A-Za-z_][A-Za-z0-9_\-.]*+[ \t]*+=[ \t]*+{_F_VALUE}'
_F_OPERANDS = rf"[ \t]*+(?:{_F_NAME}[ \t]*+(?:,[ \t]*+{_F_NAME}[ \t]*+)*+)?"
# groups: ROOT, name, shape, opcode, operand names | literal text, attributes, next indent
_FAST_LINE = re.compile(
    rf'(ROOT[ \t]++)?({_F_NAME})[ \t]*+=[ \t]*+({_F_SHAPE})[ \t]++([a-z][a-z0-9\-]*+)'
    rf'\((?:({_F_OPERANDS})|([^()"\n]*+))\)((?:{_F_ATTR_NC})*+)[ \t\r]*+(?:\n([ \t]*+)|\Z)')
_FAST_ATTR = re.compile(_F_ATTR)


def parse_attr_text(text: str) -> dict[str, str]:
    """The attributes of a line ``FAST_LINE`` matched: its attribute group (``, key=value``
    repeated, as matched, so every value is well formed) -> {key: value text}; a key given
    twice keeps its last value, as the general parser's ``attrs`` does."""
    return dict(_FAST_ATTR.findall(text))
