"""The structure of the passes (issue 28): no pass imports the pipeline (the pipeline imports
the passes; ModuleAnalysis lives in passes/analysis.py), so pipeline <-> reuse <-> timing <->
excess is no import circle. Read from the source with ast: every ``from .x import`` counts,
inside functions and under TYPE_CHECKING too."""

from __future__ import annotations

import ast
from pathlib import Path

PASSES = Path(__file__).resolve().parents[1] / "jaxmove" / "passes"


def _imports(path: Path) -> set[str]:
    """Modules under jaxmove/passes that ``path`` imports (its relative imports), dotted
    from jaxmove/passes (``excess.rules`` for passes/excess/rules.py)."""
    pkg = list(path.parent.relative_to(PASSES).parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.level or node.level - 1 > len(pkg):
            continue  # absolute, or above jaxmove/passes
        base = pkg[:len(pkg) - (node.level - 1)]
        if node.module:
            out.add(".".join([*base, *node.module.split(".")]))
        else:
            out.update(".".join([*base, a.name]) for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    g = {}
    for f in PASSES.rglob("*.py"):
        rel = f.relative_to(PASSES).with_suffix("")
        name = ".".join(rel.parts[:-1]) if rel.name == "__init__" else ".".join(rel.parts)
        g[name] = _imports(f) - {name}
    return g


def test_no_pass_imports_the_pipeline():
    g = _graph()
    assert "analysis" in g and "pipeline" in g
    importers = sorted(m for m, deps in g.items() if "pipeline" in deps and m != "pipeline")
    assert importers == []


def test_no_import_circle_through_the_pipeline_or_the_excess_pass():
    g = _graph()
    # (passes/analysis.py imports only the passes that build rows; a circle of flops/traffic
    # -> pallas -> timing -> reuse, through pallas.py's lazy import of timing, is not this one)
    consumers = {"pipeline", "reuse", "timing", "first_touch"} | {m for m in g if m.split(".")[0] == "excess"}
    assert not g["analysis"] & consumers
    watched = {m for m in g if m == "pipeline" or m.split(".")[0] == "excess"}

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            m = stack.pop()
            for d in g.get(m, ()):
                while d not in g and "." in d:  # a name imported from a package
                    d = d.rsplit(".", 1)[0]
                if d == goal:
                    return True
                if d not in seen and d in g:
                    seen.add(d)
                    stack.append(d)
        return False

    assert sorted(m for m in watched if reaches(m, m)) == []


# ---- the excess pass's rule table ------------------------------------------------------------

def test_cause_table_keeps_the_json_kinds_and_refuses_a_duplicate():
    import pytest

    from jaxmove.passes.excess import CAUSE_KINDS, CAUSES
    from jaxmove.passes.excess.causes import CauseRule, FixContext, register
    # the JSON's stable keys, in the order they always had (may be added to, never removed)
    assert CAUSE_KINDS[:19] == (
        "not_donated", "donated_but_copied", "materialized_intermediate", "layout_change",
        "dtype_conversion", "re_read", "tiling_re_read", "whole_rewrite", "tile_padding",
        "split_k_partials", "rematerialization", "all_gather_partly_used",
        "collective_wider_than_data", "host_round_trip", "dot_as_multiply_reduce", "slice_copy",
        "whole_table_read", "concatenated_copy", "spilled_intermediate")
    for kind, rule in CAUSES.items():
        assert rule.kind == kind and rule.matches and rule.bytes
        text = rule.fix(FixContext(kind, "params/w", 3 * 2**20, "fusion.1", argnum=0))
        assert "saves 3.00 MiB per step" in text, (kind, text)
        assert rule.matcher is None or rule.kernel, kind  # only kernel causes have matchers
    # the spill's fix says what it can: without a spec, which values fit is unknown
    spill = CAUSES["spilled_intermediate"].fix
    assert "without a hardware spec" in spill(FixContext("spilled_intermediate", "", 1, "f"))
    assert "larger than the 50.00 MiB of on-chip memory" in spill(
        FixContext("spilled_intermediate", "", 1, "f", onchip_capacity_bytes=50 * 2**20))
    # the README's cause table names every cause the pass can report (a user trial met
    # whole_table_read in a report and found no word of it there)
    from pathlib import Path
    readme = Path(__file__).resolve().parents[1] / "README.md"
    if readme.is_file():
        rows = [ln for ln in readme.read_text().splitlines() if ln.startswith("| `")]
        for kind in (*CAUSE_KINDS, "unattributed"):
            assert any(f"`{kind}`" in ln.split("|")[1] for ln in rows), f"{kind} is not in README's cause table"
    with pytest.raises(ValueError, match="slice_copy"):
        register(CauseRule("slice_copy", "", "", lambda c: ""))
    with pytest.raises(ValueError, match="unattributed"):
        register(CauseRule("unattributed", "", "", lambda c: ""))


def test_excess_package_keeps_its_public_names():
    import jaxmove.passes.excess as ex
    for name in ("CAUSE_KINDS", "UNATTRIBUTED", "MAX_LISTED", "ExcessAnalysis", "ExcessCause",
                 "ExcessLine", "CauseInstruction", "excess_pass"):
        assert hasattr(ex, name), name
    assert ex.UNATTRIBUTED == "unattributed" and ex.MAX_LISTED == 10
