"""Escaped control characters in HLO strings (issue 29): ``\\033`` is read as ESC, as XLA reads it
(hlo/attrs.py ``c_unescape``), and still never reaches the terminal; a ``\\377`` byte that is not
UTF-8 is carried (surrogateescape) and every rendering writes it without failing."""

from __future__ import annotations

import json

import pytest

from jaxmove.cli import main

_HLO = r"""HloModule m

ENTRY main {
  p0 = f32[4,8]{1,0} parameter(0)
  ROOT a = f32[4,8]{1,0} negate(p0), metadata={op_name="jit(f)/\033]0;PWNED\007blk/neg" source_file="/s/b\377d\x1b[2J.py" source_line=3}
}
"""


@pytest.mark.parametrize("extra", [[], ["--by", "module"], ["--by", "source"]])
def test_escaped_control_characters_are_shown_escaped(tmp_path, capsys, extra):
    f = tmp_path / "esc.hlo"
    f.write_text(_HLO)
    assert main(["analyze", str(f), *extra]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\udcff" not in out
    if extra != ["--by", "module"]:
        assert "\\x1b" in out or "\\xff" in out, out


def test_json_carries_the_values_xla_reads(tmp_path, capsys):
    f = tmp_path / "esc.hlo"
    f.write_text(_HLO)
    assert main(["analyze", str(f), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = [r for r in doc["instructions"] if r["name"] == "a"]
    assert row["op_name"] == "jit(f)/\x1b]0;PWNED\x07blk/neg"
    assert row["source"] == "/s/b\udcffd\x1b[2J.py:3"   # the byte 0xff, surrogateescape


def test_html_and_annotate_write_a_byte_that_is_not_utf8(tmp_path, capsys):
    f = tmp_path / "esc.hlo"
    f.write_text(_HLO)
    html = tmp_path / "r.html"
    assert main(["analyze", str(f), "--html", str(html)]) == 0
    page = html.read_text(encoding="utf-8")
    assert "\x1b" not in page and "\\xff" in page
    assert main(["annotate", str(f)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out.split("ENTRY")[1]
