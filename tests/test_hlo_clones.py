"""The parser's reading of repeated computations (hlo/clones.py) and the structural classes
(hlo/structure.py): a module parsed with the clone reader equals the same module read line by
line, instruction for instruction; edge cases fall back to the line-by-line parse; classes
group exactly the computations that differ only in names."""

from __future__ import annotations

import pytest

from jaxmove.hlo import parse_module
from jaxmove.hlo import clones as clones_mod
from jaxmove.hlo.structure import structural_classes


def _fp(m):
    out = [m.entry.name]
    for c in m.computations.values():
        out.append((c.name, c.root.name, c.is_entry, c.line, c.execution_thread,
                    tuple(p.name for p in c.parameters)))
        for i in c.instructions:
            out.append((i.name, i.opcode, repr(i.shape), tuple(i.operands), tuple(sorted(i.attrs.items())),
                        i.literal, i.is_root, i.line, i.column, i.computation, i.parameter_number,
                        tuple(i.called_computations)))
    return out


def _line_by_line(text, monkeypatch):
    """Parse with the clone reader declining every body (the parser reads each line by line)."""
    with monkeypatch.context() as mp:
        def decline(self, name, line, is_entry, start):
            self._pending = None
            end = self.text.find("\n}", start)
            return None, end
        mp.setattr(clones_mod.CloneReader, "read", decline)
        return parse_module(text)


def _layer(k, a="%p0.{k}", b="%p1.{k}", extra=""):
    a, b = a.format(k=k), b.format(k=k)
    return f"""%fused.{k} (p0.{k}: f32[8,16], p1.{k}: f32[8,16]) -> f32[8,16] {{
  %p0.{k} = f32[8,16]{{1,0}} parameter(0)
  %p1.{k} = f32[8,16]{{1,0}} parameter(1)
  %m.{k} = f32[8,16]{{1,0}} multiply({a}, {b}){extra}
  ROOT %e.{k} = f32[8,16]{{1,0}} exponential(%m.{k})
}}
"""


def _module(bodies):
    entry = ["ENTRY %main (x: f32[8,16]) -> f32[8,16] {", "  %x = f32[8,16]{1,0} parameter(0)"]
    prev = "%x"
    for k in range(len(bodies)):
        entry.append(f"  %f.{k} = f32[8,16]{{1,0}} fusion({prev}, %x), kind=kLoop, calls=%fused.{k}")
        prev = f"%f.{k}"
    entry[-1] = entry[-1].replace(f"  %f.{len(bodies) - 1}", f"  ROOT %f.{len(bodies) - 1}")
    return "HloModule m\n\n" + "\n".join(bodies) + "\n" + "\n".join(entry) + "\n}\n"


def test_repeated_bodies_are_clones_equal_to_the_line_by_line_parse(monkeypatch):
    text = _module([_layer(k) for k in range(5)])
    m = parse_module(text)
    assert "fused.0" not in m.clones and {"fused.2", "fused.3", "fused.4"} <= set(m.clones)
    assert _fp(m) == _fp(_line_by_line(text, monkeypatch))
    assert m.computations["fused.4"].root.name == "e.4"
    assert tuple(m.computations["fused.4"].by_name["m.4"].operands) == ("p0.4", "p1.4")


@pytest.mark.parametrize("variant", [
    dict(a="%p1.{k}", b="%p0.{k}"),                       # swapped operands: another body
    dict(extra=', metadata={op_name="%p0.{k}"}'),           # a name inside an attribute text
])
def test_bodies_that_differ_in_more_than_names_are_read_as_written(variant, monkeypatch):
    bodies = [_layer(k) for k in range(3)]
    bodies.append(_layer(3, **{k: v for k, v in variant.items()}).replace("{k}", "3"))
    text = _module(bodies)
    m = parse_module(text)
    assert _fp(m) == _fp(_line_by_line(text, monkeypatch))
    mul = m.computations["fused.3"].by_name["m.3"]
    if "a" in variant:
        assert tuple(mul.operands) == ("p1.3", "p0.3")
    else:
        assert "%p0.3" in mul.attrs["metadata"]


def test_structural_classes_group_bodies_equal_up_to_names():
    bodies = [_layer(k) for k in range(3)] + [_layer(3, a="%p1.{k}", b="%p0.{k}")]
    m = parse_module(_module(bodies))
    classes = structural_classes(m)
    assert classes["fused.0"] == classes["fused.1"] == classes["fused.2"] == "fused.0"
    assert classes["fused.3"] == "fused.3"          # operands swapped: a class of its own
    assert classes["main"] == "main"


def test_a_real_unrolled_program_parses_the_same_with_clones(monkeypatch):
    """XLA:CPU's program of a 3-layer unrolled decoder repeats its layers' fusions."""
    from jaxmove import zoo
    from jaxmove.capture import capture
    prog = capture(zoo.build("llama3-8b-decode", {"layers": "3", "d_model": "64", "heads": "4",
                                                  "kv_heads": "2", "d_ff": "96", "vocab": "128",
                                                  "seq_len": "16", "batch": "2", "dtype": "f32"}))
    m = parse_module(prog.hlo_text)
    assert m.clones, "expected repeated layer computations"
    assert _fp(m) == _fp(_line_by_line(prog.hlo_text, monkeypatch))
