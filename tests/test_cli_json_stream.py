"""``analyze --json`` at scale (issue 29): the instruction rows are made and written a batch at a
time (report/json_out.py ``Streamed`` / ``write_json``), the text is byte for byte the one of the
whole list, and attribution by neighbours is computed on demand (report/attribution.py)."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import time
from pathlib import Path

import pytest

import jaxmove
from jaxmove.report import json_out
from jaxmove.report.json_out import Streamed, dumps_json, write_json


@pytest.fixture(scope="module")
def synth_report(tmp_path_factory):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "synth_hlo.py"
    spec = importlib.util.spec_from_file_location("synth_hlo", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    f = tmp_path_factory.mktemp("synth") / "s.hlo"
    f.write_text(mod.generate(3000))
    return jaxmove.analyze(str(f))


def test_streamed_json_is_the_text_of_the_whole_list(synth_report):
    whole = dumps_json(synth_report.to_json())
    buf = io.StringIO()
    write_json(synth_report.to_json(stream=True), buf)
    assert buf.getvalue() == whole
    doc = json.loads(whole)
    assert len(doc["instructions"]) == len(synth_report.listed_rows()) > json_out.LONG_LIST


def test_rows_are_made_a_batch_at_a_time(monkeypatch):
    """At each write, fewer than two batches of rows were made and not yet written (the old
    writer built every row, then one string of the whole document)."""
    monkeypatch.setattr(json_out, "_BATCH", 10)
    made = []

    def rows():
        for i in range(1000):
            made.append(i)
            yield {"name": f"i{i}", "bytes": i}

    class Recorder(io.StringIO):
        def write(self, s):
            rows_written = self.getvalue().count('"name"') + s.count('"name"')
            assert len(made) - rows_written < 2 * 10, (len(made), rows_written)
            return super().write(s)

    out = Recorder()
    write_json({"program": {"name": "p"}, "instructions": Streamed(rows, 1000), "notes": []}, out)
    doc = json.loads(out.getvalue())
    assert [r["bytes"] for r in doc["instructions"]] == list(range(1000))


@pytest.mark.parametrize("n", [0, 5, 33, 1200])
def test_non_finite_numbers_in_streamed_rows_are_null_and_noted_in_order(n):
    rows = [{"i": i, "t": math.inf if i % 7 == 3 else 1.5} for i in range(n)]
    obj = {"a": [math.nan], "instructions": rows, "notes": ["kept"], "after": {"x": -math.inf}}
    lazy = {**obj, "instructions": Streamed(lambda: iter(rows), n)}
    text = dumps_json(lazy)
    assert text == dumps_json(obj)
    doc = json.loads(text)   # strict: no Infinity / NaN
    bad = [f"instructions[{i}].t" for i in range(n) if i % 7 == 3]
    assert doc["a"] == [None] and doc["after"] == {"x": None}
    assert doc["notes"][0] == "kept"
    note = doc["notes"][1]
    assert note.startswith(f"{len(bad) + 2} non-finite number(s)")
    assert ("a[0], " + ", ".join([*bad, "after.x"][:4])) in note


def test_streamed_value_after_notes_is_still_noted():
    rows = [{"t": math.inf}] * 40
    doc = json.loads(dumps_json({"notes": [], "late": Streamed(lambda: iter(rows), 40)}))
    assert doc["late"] == [{"t": None}] * 40
    assert doc["notes"] and doc["notes"][0].startswith("40 non-finite")


def _chain_module(n: int) -> str:
    """n instructions without metadata between a parameter and one with a source line."""
    lines = ["  p = f32[4]{0} parameter(0)", "  c0 = f32[4]{0} negate(p)"]
    lines += [f"  c{i} = f32[4]{{0}} negate(c{i - 1})" for i in range(1, n)]
    lines.append(f'  ROOT r = f32[4]{{0}} exponential(c{n - 1}), metadata={{op_name="jit(f)/blk/exp" '
                 'source_file="/s/m.py" source_line=7}')
    return "HloModule m\n\nENTRY main {\n" + "\n".join(lines) + "\n}\n"


def test_neighbour_attribution_of_a_long_chain(tmp_path):
    """Every instruction of a 20,000-long chain without metadata takes the one source line and
    module path of its only user path's end (by hand: /s/m.py:7, blk); first asked about the
    first of the chain (the deepest walk: no recursion, no RecursionError)."""
    from jaxmove.report.attribution import attribute

    f = tmp_path / "chain.hlo"
    f.write_text(_chain_module(20_000))
    r = jaxmove.analyze(str(f))
    comp = r.module.computations["main"]
    t = time.perf_counter()
    first = attribute(r.module, comp.by_name["c0"])
    assert (first.source.file, first.source.line) == ("/s/m.py", 7)
    assert first.source_inferred and first.module_path == "blk" and first.module_inferred
    for name in ("c1", "c9999", "c19999"):
        a = attribute(r.module, comp.by_name[name])
        assert (a.source.line, a.module_path) == (7, "blk")
    assert time.perf_counter() - t < 20


def test_one_instruction_without_metadata_does_not_walk_the_computation(synth_report):
    """The synthetic module's ``while`` has no metadata; inferring it walks its users' chain,
    not the 2,000-instruction entry (the old tables did: 1.1 s of a 100k report's 2.8 s)."""
    from jaxmove.report.attribution import _inference, attribute

    m = synth_report.module
    entry = next(c for c in m.computations.values() if c.is_entry)
    w = next(i for i in entry.instructions if i.opcode == "while")
    attribute(m, w)
    inf = _inference(m, entry)
    walked = set().union(*(inf._memo[k] for k in inf._memo))
    assert w.name in walked and len(walked) < len(entry.instructions) // 4


@pytest.mark.parametrize("op_name,parts", [
    ("jit(forward)/layers_3/dot", ["jit(forward)", "layers_3", "dot"]),
    ("transpose(jvp(a/b))/c", ["transpose(jvp(a/b))", "c"]),
    ("a/b(c/d)/e", ["a", "b(c/d)", "e"]),
    ("x)/(y/z", ["x)", "(y/z"]),          # a ')' with none open is ignored; '(' stays open to the end
    ("//a(b//c)//", ["a(b//c)"]),
    ("jit(f)/(", ["jit(f)", "("]),
])
def test_split_name_stack_by_hand(op_name, parts):
    from jaxmove.report.attribution import split_name_stack
    assert split_name_stack(op_name) == parts


def test_a_closed_pipe_during_the_streamed_rows_exits_0_quietly(tmp_path):
    """``jaxmove analyze X --json | head -1``: the pipe closes while the rows stream (the document
    is over a pipe's 64 KiB buffer)."""
    import os
    import subprocess
    import sys

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "synth_hlo.py"
    spec = importlib.util.spec_from_file_location("synth_hlo", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    f = tmp_path / "s.hlo"
    f.write_text(mod.generate(2000))
    p = subprocess.Popen([sys.executable, "-P", "-m", "jaxmove.cli", "analyze", str(f), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert first == b"{\n" and err == "", err
