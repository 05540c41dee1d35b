"""What every renderer shares: safe text for a terminal, the console, HTML cells.

Computes nothing and imports no other module of ``report/`` (the renderers import it, never
the reverse), so it closes no import circle.

* :func:`printable` -- program-derived strings (instruction names, ``op_name``,
  ``source_file``, paths) may hold control characters: a raw ESC (``\\x1b``) reaching a
  terminal is an escape sequence (it can recolour, retitle or clear the terminal, "terminal
  escape injection"). They are shown as Python-style escapes (``\\x1b``, ``\\u202e``), as
  XLA's own HLO printer shows them in strings (``absl::CEscape``).
* :func:`make_console` -- a ``rich`` console whose every string passes through
  :func:`printable`, and which raises ``BrokenPipeError`` when the reader has gone
  (``jaxmove analyze X | head``) instead of rich's ``SystemExit(1)``.
* ``e``, ``fmt_s``, ``th``, ``td_num`` -- HTML escaping and table cells of the HTML reports
  (report/html.py, report/excess_html.py, sweep/render.py).
"""

from __future__ import annotations

import html as _html
import os
import re
import sys

from rich.console import Console

__all__ = ["e", "fmt_s", "make_console", "one_line", "printable", "td_num", "th"]

# C0 controls but tab and newline, DEL, C1 controls (U+0080-U+009F: U+009B is a one-byte CSI on
# some terminals), Unicode line/paragraph separators and the bidirectional overrides and
# isolates that reorder what is displayed ("Trojan Source", CVE-2021-42574), and lone surrogates
# (a string escape such as \377 gives a byte that is not UTF-8: hlo/attrs.py ``c_unescape`` keeps
# it as U+DC80-U+DCFF, which no terminal encoding can write; shown as the byte, \xff).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                      "\ud800-\udfff]")
_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                                 "\ud800-\udfff]")


def _escape_char(m: re.Match) -> str:
    c = m.group(0)
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:  # surrogateescape of one byte
        return f"\\x{o - 0xDC00:02x}"
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c) or (f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}")


def printable(text: str) -> str:
    """``text`` with every control character (but newline and tab) written as an escape.

    ``"a\\x1b[2Jb"`` -> ``"a\\\\x1b[2Jb"`` (the four characters ``\\x1b``); ``\\r`` -> ``\\\\r``.
    Newlines and tabs are kept (tables and multi-line notes use them).
    """
    return _CONTROL.sub(_escape_char, text) if _CONTROL.search(text) else text


def one_line(text: str) -> str:
    """``text`` as one line: :func:`printable`, and newlines and tabs escaped too (an error
    message echoing a value with a newline stays one line)."""
    return _CONTROL_OR_NEWLINE.sub(_escape_char, text)


class SafeConsole(Console):
    """``rich.console.Console`` for program-derived text: every string it renders (print
    arguments, table cells, titles) passes through :func:`printable` before markup is read;
    a closed pipe raises ``BrokenPipeError`` (the CLI exits 0 quietly), with stdout pointed
    at /dev/null so the interpreter's final flush does not fail again."""

    def render_str(self, text: str, *args, **kwargs):  # noqa: D102 - rich API
        return super().render_str(printable(text), *args, **kwargs)

    def on_broken_pipe(self) -> None:  # noqa: D102 - rich API (its default raises SystemExit(1))
        self.quiet = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass
        raise BrokenPipeError("the reader of the output has gone")


def make_console(stderr: bool = False) -> Console:
    """A console for tables: the terminal's width, or 200 columns when output is not a
    terminal (the instruction table with time columns, shapes and whole source paths);
    ``stderr``: write to stderr (progress, warnings)."""
    c = SafeConsole(emoji=False, stderr=stderr)  # program-derived strings are no emoji codes
    return c if c.is_terminal else SafeConsole(width=200, emoji=False, stderr=stderr)


# ---- HTML ------------------------------------------------------------------------------------

def e(s) -> str:
    """Escape a string for HTML text and attribute values (quotes included); control characters
    and lone surrogates as :func:`printable` writes them (the page is UTF-8, which has no
    encoding of a lone surrogate)."""
    return _html.escape(printable("" if s is None else str(s)), quote=True)


def fmt_s(x: float | None) -> str:
    """Seconds as text with a unit: 0.0123 -> ``12.3 ms``, 4e-9 -> ``4 ns``; None -> ""."""
    if x is None:
        return ""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "\u00b5s")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x * 1e9:.3g} ns"


def th(label: str, num: bool = False) -> str:
    """A header cell; ``num``: the column sorts numerically (the reports' sort script)."""
    attrs = ' class="n" data-type="num"' if num else ""
    return f"<th{attrs}>{e(label)}</th>"


def td_num(value, text: str | None = None) -> str:
    """A numeric cell: ``value`` for sorting (``data-v``), ``text`` shown (default the value)."""
    if value is None:
        return '<td class="n" data-v=""></td>'
    return f'<td class="n" data-v="{e(value)}">{e(text if text is not None else value)}</td>'
