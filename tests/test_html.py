"""The HTML report: self-contained, escaped, sortable, rendered by headless Chromium.

The browser is found on PATH or installed with apt-get (as root); the rendering tests skip
with a message only where neither works.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

import jaxmove
from jaxmove.cli import main
from jaxmove.report.frame import repr_html
from jaxmove.report.html import render_html

# A planted payload: if it ever runs, it adds a <pwned-marker> element to the page.
PAYLOAD = "<script>document.body.appendChild(document.createElement('pwned-marker'))</script>"
IMG_PAYLOAD = "<img src=x onerror=\"document.body.appendChild(document.createElement('pwned-img'))\">"

HLO = """\
HloModule hostile, entry_computation_layout={(f32[32,32]{1,0})->f32[32,32]{1,0}}

ENTRY %main (x: f32[32,32]) -> f32[32,32] {
  %x = f32[32,32]{1,0} parameter(0)
  %a = f32[32,32]{1,0} negate(%x), metadata={op_name="jit(f)/PAYLOAD/neg" source_file="</td>PAYLOAD" source_line=3}
  %b = f32[32,32]{1,0} add(%a, %a), metadata={op_name="jit(f)/add"}
  %c = f32[32,32]{1,0} custom-call(%b), custom_call_target="PAYLOAD"
  ROOT %d = f32[32,32]{1,0} multiply(%c, %x)
}
""".replace("PAYLOAD", PAYLOAD.replace('"', "'"))


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("hlo") / "hostile.hlo"
    path.write_text(HLO)
    report = jaxmove.analyze(str(path))
    # HLO names cannot hold '<' (the parser refuses them), but a report built by other code
    # might: plant one in an instruction name and a note as well.
    row = next(r for r in report.rows if r.instr.name == "b")
    row.instr.name = PAYLOAD
    report.analysis.notes.append(IMG_PAYLOAD)
    return report


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def chromium():
    exe = _chromium()
    if exe is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        try:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
            subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env,
                           capture_output=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired):
            pass
        exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium/Chrome on PATH and it could not be installed with apt-get "
                    "(needs root and network); the HTML rendering tests need a browser")
    return exe


def dump_dom(exe: str, url: str, tmp_path) -> str:
    """The DOM after the page's scripts ran (``--dump-dom``)."""
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={tmp_path / 'chrome-profile'}", "--dump-dom", url]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "<html" in res.stdout, res.stderr[-2000:]
    return res.stdout


class _Rows(HTMLParser):
    """The ``data-v`` values of column ``col`` of table ``table_id``, in DOM order."""

    def __init__(self, table_id: str, col: int):
        super().__init__()
        self.table_id, self.col = table_id, col
        self.inside = False
        self.in_body = False
        self.cell = -1
        self.values: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.inside = a.get("id") == self.table_id
        elif self.inside and tag == "tbody":
            self.in_body = True
        elif self.inside and self.in_body and tag == "tr":
            self.cell = -1
        elif self.inside and self.in_body and tag == "td":
            self.cell += 1
            if self.cell == self.col:
                self.values.append(a.get("data-v", ""))

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = self.in_body = False


def test_program_strings_are_escaped(hostile_report):
    page = render_html(hostile_report)
    # the payload never appears as markup, only escaped
    assert PAYLOAD not in page and "<img src=x" not in page
    assert "&lt;script&gt;document.body.appendChild" in page
    assert "&lt;img src=x onerror=" in page
    assert page.count("<script>") == 1      # ours, at the end
    # self-contained: nothing is fetched
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "Content-Security-Policy" in page
    summary = repr_html(hostile_report)
    assert PAYLOAD not in summary and "<script" not in summary


def test_chromium_renders_escaped_and_sortable(chromium, hostile_report, tmp_path):
    path = tmp_path / "report.html"
    path.write_text(render_html(hostile_report), encoding="utf-8")
    dom = dump_dom(chromium, path.as_uri(), tmp_path)
    assert 'data-ready="1"' in dom                       # our script ran
    assert "<pwned-marker" not in dom and "<pwned-img" not in dom   # the planted ones did not
    assert "&lt;script&gt;document.body.appendChild" in dom       # shown as text
    # The page sorts on load by #sort=TABLE:COLUMN:DIR. Column 6 is "HBM read".
    for direction in ("asc", "desc"):
        dom = dump_dom(chromium, f"{path.as_uri()}#sort=instructions:6:{direction}", tmp_path)
        p = _Rows("instructions", 6)
        p.feed(dom)
        vals = [float(v) for v in p.values]
        assert len(vals) == 4     # negate, add, custom-call (unmodeled, but listed), multiply
        assert vals == sorted(vals, reverse=direction == "desc")
        assert len(set(vals)) > 1


def test_cli_html_for_a_zoo_model(chromium, tmp_path):
    out = tmp_path / "tiny.html"
    assert main(["analyze", "gpt-tiny-decode", "--html", str(out)]) == 0
    dom = dump_dom(chromium, out.as_uri(), tmp_path)
    assert 'data-ready="1"' in dom
    p = _Rows("instructions", 1)
    p.feed(dom)
    # one row per JSON instruction
    n = len(jaxmove.analyze("gpt-tiny-decode").to_json()["instructions"])
    assert len(p.values) == n
    assert dom.count("<svg") >= 4        # breakdown charts


def test_dataframe_matches_json():
    pd = pytest.importorskip("pandas")
    report = jaxmove.analyze("gpt-tiny-decode", hardware="h100-sxm")
    df = report.to_dataframe()
    rows = report.to_json()["instructions"]
    assert isinstance(df, pd.DataFrame) and len(df) == len(rows)
    by_name = df.set_index("name")
    for r in rows:
        got = by_name.loc[r["name"]]
        assert got["hbm_read_bytes"] == r["hbm_read_bytes"] and got["flops"] == r["flops"]
        assert got["est_time_s"] == r["est_time_s"] and got["bound"] == r["bound"]
    # bytes by role add up to the HBM bytes of every row
    roles = sum(df[f"{role}_{d}_bytes"] for role in ("weights", "kv_cache", "activations", "unknown")
                for d in ("read", "write"))
    assert (roles == df["hbm_bytes"]).all()
    assert "<table>" in report._repr_html_()


def test_plots_draw(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxmove.report import plots

    report = jaxmove.analyze("gpt-tiny-decode", hardware="h100-sxm")
    fig, axes = plt.subplots(1, 3)
    ax = plots.roofline(report, ax=axes[0])
    assert len(ax.collections) >= 1 and ax.get_xscale() == "log"
    plots.traffic_by_path(report, ax=axes[1])
    plots.traffic_by_role(report, ax=axes[2])
    fig.savefig(tmp_path / "p.png")
    plt.close(fig)
    with pytest.raises(ValueError, match="hardware"):
        plots.roofline(jaxmove.analyze("gpt-tiny-decode"))
