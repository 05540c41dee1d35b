"""Bad or extreme input found by the re-check: deep nesting, plan files repeating a mesh
axis, user code that prints or exits, empty output paths, markup in program strings."""

from __future__ import annotations

import io
import json
import sys
import textwrap

import pytest
from rich.console import Console

from jaxmove.api import analyze
from jaxmove.cli import main
from jaxmove.hlo import HloParseError, parse_module
from jaxmove.hlo.parser import MAX_TUPLE_DEPTH
from jaxmove.plans import PlanError
from jaxmove.plans.plan import parse_plan

_CLI = [sys.executable, "-P", "-c", "import sys; from jaxmove.cli import main; sys.exit(main(sys.argv[1:]))"]


def _chain(n: int, op: str) -> str:
    """HLO of n computations, each calling (or fusing) the previous one: nesting depth n."""
    call = "call(p), to_apply=c{}" if op == "call" else "fusion(p), kind=kLoop, calls=c{}"
    out = ["HloModule m\n", "c0 {\n  p = f32[4]{0} parameter(0)\n  ROOT r = f32[4]{0} negate(p)\n}\n"]
    for k in range(1, n):
        out.append(f"c{k} {{\n  p = f32[4]{{0}} parameter(0)\n  ROOT r = f32[4]{{0}} {call.format(k - 1)}\n}}\n")
    out.append(f"ENTRY main {{\n  p = f32[4]{{0}} parameter(0)\n  ROOT r = f32[4]{{0}} {call.format(n - 1)}\n}}\n")
    return "\n".join(out)


def _nested_tuple(depth: int) -> str:
    sh = "f32[4]"
    for _ in range(depth):
        sh = f"({sh})"
    return f"HloModule m\n\nENTRY main {{\n  ROOT p0 = {sh} parameter(0)\n}}\n"


def test_tuple_nested_too_deep_is_a_parse_error_with_position():
    with pytest.raises(HloParseError, match=f"nested deeper than {MAX_TUPLE_DEPTH}") as e:
        parse_module(_nested_tuple(MAX_TUPLE_DEPTH + 1), "deep.hlo")
    assert e.value.line == 4


def test_tuple_nested_to_the_limit_parses():
    m = parse_module(_nested_tuple(MAX_TUPLE_DEPTH), "ok.hlo")
    assert m.entry.root.shape.byte_size == 16  # one f32[4] leaf


@pytest.mark.parametrize("n, op", [(10_000, "call"), (3_000, "fusion")])
def test_deep_nesting_is_analysed(tmp_path, n, op):
    # every walk is iterative: a 10,000-deep call chain and 3,000 nested fusions are analysed
    # (they used to end in NestingTooDeepError at Python's recursion limit)
    f = tmp_path / "chain.hlo"
    f.write_text(_chain(n, op))
    report = analyze(str(f), hardware="tpu-v5e")
    assert report.totals.flops == 4  # one negate of f32[4], at the innermost level
    assert report.totals.hbm_read_bytes == 16 and report.totals.hbm_write_bytes == 16
    assert not [r for r in report.rows if r.unmodeled]
    assert report.times is not None and report.times.est_time_s > 0
    render = io.StringIO()
    from jaxmove.report.table import render_report
    render_report(report, console=Console(file=render, width=200, emoji=False))
    assert "Unmodeled: none" in render.getvalue()


def test_nested_fusions_are_not_exponential(tmp_path):
    # source_location used to visit a fused root twice per level: 2**60 steps here
    f = tmp_path / "fused.hlo"
    f.write_text(_chain(60, "fusion"))
    report = analyze(str(f))
    assert report.totals.flops == 4  # one negate of f32[4], at the innermost level
    render = io.StringIO()
    from jaxmove.report.table import render_report
    render_report(report, console=Console(file=render, width=200, emoji=False))
    assert "Unmodeled: none" in render.getvalue()


def test_plan_repeating_a_mesh_axis_names_file_and_key():
    with pytest.raises(PlanError, match=r"p\.toml:3: \[rules\] batch .* 'data' twice"):
        parse_plan('name = "x"\n[rules]\nbatch = ["data", "data"]\n', "p.toml")


USER = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    def exits0():
        sys.exit(0)
    def prints():
        print("hello from user code")
        return jax.jit(lambda x: x * 2).lower(jax.ShapeDtypeStruct((128,), jnp.float32))
""")


def test_user_code_that_exits_or_prints(tmp_path):
    from .conftest import run_side_by_side

    (tmp_path / "u.py").write_text(USER)
    exits, p = run_side_by_side([_CLI + ["analyze", "u.py:exits0"], _CLI + ["analyze", "u.py:prints", "--json"]],
                                cwd=tmp_path, capture_output=True, text=True)
    assert exits.returncode == 2 and exits.stdout == ""
    assert exits.stderr.strip().splitlines() == ["jaxmove: error: u.py:exits0 called sys.exit(0)"]
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["totals"]  # stdout is only the JSON
    assert "hello from user code" in p.stderr


@pytest.mark.parametrize("args", [["--html", ""], ["--trace", " "]])
def test_empty_output_path_is_an_error(tmp_path, capsys, args):
    f = tmp_path / "a.hlo"
    f.write_text("HloModule m\n\nENTRY main {\n  ROOT p = f32[4]{0} parameter(0)\n}\n")
    assert main(["analyze", str(f), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxmove: error: --")


def test_program_strings_are_not_markup_or_emoji(tmp_path):
    f = tmp_path / "[red]m.hlo"
    f.write_text(textwrap.dedent(f"""\
        HloModule m

        ENTRY main {{
          p0 = f32[4,8]{{1,0}} parameter(0)
          ROOT a = f32[4,8]{{1,0}} negate(p0), metadata={{op_name="jit(f)/[red]a/:x:/[/]" source_file="/s/[red]b:x:.py" source_line=3}}
        }}
    """))
    report = analyze(str(f))
    from jaxmove.report.table import make_console, render_groups, render_report
    out = io.StringIO()
    console = make_console()
    console.file = out
    console.width = 300
    render_report(report, console=console)
    render_groups(report, "module", console=console)
    render_groups(report, "source", console=console)
    text = out.getvalue()
    assert "[red]m.hlo" in text                 # file name verbatim
    assert "[red]b:x:.py:3" in text              # source file verbatim, no emoji
    assert "[red]a/:x:/[" in text                # module path of op_name "jit(f)/[red]a/:x:/[/]", verbatim
    assert "\u274c" not in text                  # :x: is not rendered as an emoji


def test_one_line_module_positions_match_the_text():
    # One line (XLA never prints this, users paste it): linecol's cache must only move
    # forward, else every instruction re-counts the line from its start (quadratic).
    parts = ["HloModule m ENTRY main { p0 = f32[4,8]{1,0} parameter(0)"]
    prev = "p0"
    for i in range(300):
        parts.append(f"a{i} = f32[4,8]{{1,0}} add({prev}, p0)")
        prev = f"a{i}"
    parts[-1] = "ROOT " + parts[-1]
    text = " ".join(parts) + " }"
    m = parse_module(text, "oneline.hlo")
    instrs = m.entry.instructions
    assert len(instrs) == 301
    for instr in instrs:
        assert instr.line == 1
        assert text[instr.column - 1:].startswith(f"{instr.name} = ")
    assert m.entry.root.name == "a299"
