"""The HTML report: self-contained, escaped, sortable, rendered by headless Chromium.

The browser is found on PATH (chromium, chromium-browser, google-chrome, chrome); the
rendering tests skip with a message where there is none. Tests never install software:
``.ci/run`` installs Chromium (apt-get), and the README says how to get one.
"""

from __future__ import annotations

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
    if exe is None:
        pytest.skip("no Chromium/Chrome on PATH: the HTML rendering tests need a browser "
                    "(e.g. apt-get install chromium; see the README's Tests section)")
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
    # The page sorts on load by #sort=TABLE:COLUMN:DIR. Column 7 is "HBM read".
    for direction in ("asc", "desc"):
        dom = dump_dom(chromium, f"{path.as_uri()}#sort=instructions:7:{direction}", tmp_path)
        p = _Rows("instructions", 7)
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


def test_roofline_draws_the_spec_the_times_used_not_the_builtin_of_that_name():
    """A spec with --spec overrides (or a user's file named like a built-in) keeps its name; the
    roof is drawn from the numbers the times used (it reloaded the built-in by name)."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxmove.hardware import load_spec
    from jaxmove.hardware.overrides import override_spec
    from jaxmove.report import plots

    spec = override_spec(load_spec("h100-sxm"), {"hbm_bytes_per_s": 1.0e12})
    report = jaxmove.analyze("gpt-tiny-decode", hardware=spec)
    ax = plots.roofline(report)
    x, y = ax.lines[0].get_data()
    assert y[0] / x[0] == pytest.approx(1.0e12)  # the memory roof: bytes/s x flops/byte
    plt.close(ax.figure)


# ---- layout (issue 16): labels not clipped, names not broken, shapes shown ------------------

LONG_SRC = ("/home/someone/projects/a-rather-long-project-name/.venv/lib/python3.11/site-packages/"
            "flax/nnx/nn/a_module_with_a_long_file_name_for_the_layout_test.py")
LAYOUT_HLO = f"""\
HloModule layout, entry_computation_layout={{(f32[256,256]{{1,0}})->(f32[256,256]{{1,0}}, f32[256,256]{{1,0}})}}

ENTRY %main (x: f32[256,256]) -> (f32[256,256], f32[256,256]) {{
  %x = f32[256,256]{{1,0}} parameter(0)
  %dynamic-update-slice_convert_bitcast_fusion.12345 = f32[256,256]{{1,0}} negate(%x), metadata={{op_name="jit(f)/layers_0/attn/neg" source_file="{LONG_SRC}" source_line=1342}}
  %a = f32[256,256]{{1,0}} add(%dynamic-update-slice_convert_bitcast_fusion.12345, %x), metadata={{op_name="jit(f)/layers_0/attn/add" source_file="/tmp/m.py" source_line=3}}
  %big_without_source = f32[256,256]{{1,0}} exponential(%x)
  %big_without_source.2 = f32[256,256]{{1,0}} multiply(%big_without_source, %x)
  ROOT %out = (f32[256,256]{{1,0}}, f32[256,256]{{1,0}}) tuple(%a, %big_without_source.2)
}}
"""

# Measures the rendered page and writes the findings onto <body> (the page's CSP allows
# inline scripts; nothing is fetched).
_MEASURE = r"""<script>
window.addEventListener("load", function(){
  var clipped = [], wrapped = [], first = {}, labels = 0;
  document.querySelectorAll("svg").forEach(function(svg){
    var box = svg.getBoundingClientRect();
    svg.querySelectorAll("text.label").forEach(function(t){
      var r = t.getBoundingClientRect(); labels += 1;
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5) clipped.push(t.textContent);
    });
    var title = svg.querySelector("title"), lab = svg.querySelector("text.label");
    if (title && lab) first[title.textContent] = lab.lastChild.textContent;
  });
  document.querySelectorAll("#instructions td.name").forEach(function(td){
    var range = document.createRange(); range.selectNodeContents(td);
    if (range.getClientRects().length > 1) wrapped.push(td.textContent);
  });
  document.body.setAttribute("data-clipped", JSON.stringify(clipped));
  document.body.setAttribute("data-wrapped", JSON.stringify(wrapped));
  document.body.setAttribute("data-first-bars", JSON.stringify(first));
  document.body.setAttribute("data-labels", String(labels));
  document.body.setAttribute("data-measured", "1");
});
</script>"""


def _attr(dom: str, name: str) -> str:
    import html as _h
    m = re.search(name + r'="([^"]*)"', dom)
    assert m, f"{name} not in the DOM"
    return _h.unescape(m.group(1))


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_chromium_layout(chromium, tmp_path):
    import json as _json

    src = tmp_path / "layout.hlo"
    src.write_text(LAYOUT_HLO)
    report = jaxmove.analyze(str(src), hardware="h100-sxm")
    page = render_html(report)
    path = tmp_path / "layout.html"
    path.write_text(page.replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    for width in (900, 1400):   # a narrow window and a wide one
        # the flags dump_dom uses: without them Chromium's background connections, refused on
        # a closed network, can stall a headless run past the timeout
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", "--disable-extensions", "--disable-quic",
               f"--window-size={width},1600", f"--user-data-dir={tmp_path / 'chrome-profile'}",
               "--run-all-compositor-stages-before-draw", "--virtual-time-budget=5000"]
        dom = subprocess.run(cmd + ["--dump-dom", path.as_uri()], capture_output=True, text=True,
                             timeout=120).stdout
        assert _attr(dom, "data-measured") == "1" and int(_attr(dom, "data-labels")) >= 10
        assert _json.loads(_attr(dom, "data-clipped")) == [], f"chart labels cut at {width}px"
        assert _json.loads(_attr(dom, "data-wrapped")) == [], f"instruction names broken at {width}px"
        first = _json.loads(_attr(dom, "data-first-bars"))
        # the two instructions without a source line move the most bytes, yet "(no source)" is
        # no place in the program: it is not the first bar of the by-source chart
        src_chart = next(v for k, v in first.items() if k.startswith("HBM bytes by source line"))
        assert src_chart != "(no source)"
        shot = tmp_path / f"layout-{width}.png"
        res = subprocess.run(cmd + [f"--screenshot={shot}", path.as_uri()], capture_output=True,
                             timeout=120)
        assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
        assert _png_size(shot) == (width, 1600)
    # the whole path is on the page (relative to the package root), and the shapes are shown
    assert "a_module_with_a_long_file_name_for_the_layout_test.py:1342" in page
    assert "f32[256,256]" in page and "\u2190" in page
    # the chart's label is the path relative to the package root, whole (the tooltip has it all)
    assert "</title>flax/nnx/nn/a_module_with_a_long_file_name_for_the_layout_test.py:1342</text>" in page
