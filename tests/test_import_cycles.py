"""Issue 28: no import circle inside ``jaxmove/report/`` nor between ``capture/dumps.py`` and
``capture/resolve.py``.

The import graph is read from the source (every ``import`` and ``from ... import`` at any depth,
including the deferred ones inside functions; those under ``if TYPE_CHECKING:`` are types only
and never run) and checked with the standard library's ``graphlib``, which names a cycle.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "jaxmove"


def _module_name(p: Path) -> str:
    name = ".".join(p.relative_to(PKG.parent).with_suffix("").parts)
    return name.removesuffix(".__init__")


def _imports(p: Path) -> set[str]:
    tree = ast.parse(p.read_text(encoding="utf-8"))
    me = _module_name(p)
    package = me if p.name == "__init__.py" else me.rpartition(".")[0]
    types_only = {id(n) for node in ast.walk(tree)
                  if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                  for n in ast.walk(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in types_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - (node.level - 1)] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            if node.module:  # `from . import x` imports the submodule x (the package is loaded)
                out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def import_graph(subpackage: str) -> dict[str, set[str]]:
    """module -> the modules of ``jaxmove.<subpackage>`` it imports."""
    mods = {_module_name(p): p for p in (PKG / subpackage).glob("*.py")}
    return {m: {i for i in _imports(p) if i in mods and i != m} for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return e.args[1]
    return None


def test_the_checker_finds_a_cycle():  # the check itself can fail
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("subpackage", ["report", "capture"])
def test_no_import_circle(subpackage):
    graph = import_graph(subpackage)
    assert len(graph) > 5
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_renderers_import_no_private_names_of_each_other():
    """excess_html.py used ``_e, _fmt_s, _td_num, _th`` of html.py; they live in the public
    report/render_helpers.py now."""
    bad = []
    for p in (PKG / "report").glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module != "render_helpers":
                bad += [f"{p.name}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and a.name != "__future__"]
    assert bad == []
