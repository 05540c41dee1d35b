"""Shapes and dtypes of an instruction's result and operands, as the renderings show them.

``shape_text(shape)`` is the HLO shape without its layout: ``bf16[1,768]``, ``s32[]``,
``f32[<=8,128]`` (a bounded dynamic dimension), ``(f32[8], s32[])`` (a tuple); ``token[]``
and ``opaque[]`` as printed. The layout (``{1,0:T(8,128)}``) is left out: it changes the
bytes (tile padding; the report's figures include it), not what the tensor is.
"""

from __future__ import annotations

from ..hlo import Instruction, Module
from ..hlo.shape import shape_text  # noqa: F401  (re-exported: the renderers' name for it)


def operand_shapes(module: Module, computation: str, instr: Instruction) -> list[str]:
    """``shape_text`` of each operand of ``instr`` (an instruction of ``computation``), in
    operand order; ``?`` for an operand the computation does not define."""
    comp = module.computations.get(computation)
    by_name = comp.by_name if comp is not None else {}
    return [shape_text(by_name[o].shape) if o in by_name else "?" for o in instr.operands]


def short_shapes(texts: list[str], limit: int = 3, width: int = 40) -> str:
    """Up to ``limit`` shape texts joined by ``, `` (``… +N`` for the rest); a tuple longer
    than ``width`` characters is shown as ``(N-tuple)``: a compact cell for tables."""
    shown = [t if len(t) <= width or not t.startswith("(") else f"(tuple of {t.count('[')})"
             for t in texts[:limit]]
    more = f", … +{len(texts) - limit}" if len(texts) > limit else ""
    return ", ".join(shown) + more
