"""Call-graph walks without recursion: callees before callers, linear in the module size.

The passes fold costs up the call graph (a while's body before the while, a nested fusion
before the fusion that holds it). Walking it recursively fails on a 10,000-deep call chain
(Python's recursion limit); these walks keep their own stack.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..hlo import Instruction, Module


def post_order(module: Module, roots: Iterable[str],
               follow: Callable[[Instruction], bool] | None = None) -> list[str]:
    """Computations reachable from ``roots`` (included), every callee before its callers.

    Args:
      follow: which instructions' called computations to enter (default: all of them).
    A computation on a cycle (a malformed module; the validator rejects those) is listed
    once, where the walk closes it.
    """
    comps = module.computations

    def callees(name: str) -> list[str]:
        out: list[str] = []
        for instr in comps[name].instructions:
            if follow is None or follow(instr):
                out.extend(c for c in instr.called_computations if c in comps)
        return out

    state: dict[str, int] = {}  # 1: on the stack, 2: listed
    order: list[str] = []
    for root in roots:
        if root not in comps or root in state:
            continue
        state[root] = 1
        stack = [[root, callees(root), 0]]
        while stack:
            frame = stack[-1]
            cs, i = frame[1], frame[2]
            while i < len(cs) and cs[i] in state:
                i += 1
            if i < len(cs):
                frame[2] = i + 1
                c = cs[i]
                state[c] = 1
                stack.append([c, callees(c), 0])
                continue
            stack.pop()
            state[frame[0]] = 2
            order.append(frame[0])
    return order
