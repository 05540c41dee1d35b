"""Speed tricks behind one small API: ``gc_paused`` and ``slots_constructor``.

Parsing and analysing a module of a million instructions allocates millions of objects that
all survive; each cyclic collection walks them all, which made parse + analysis 1.5-2x slower
on 100k-1M instruction modules (benchmarks/parse_speed.py). The IR holds no reference cycles
(operands are names), so nothing waits on the paused collector; reference counting frees the
rest at once. Records built once per instruction are set through their slot descriptors
instead of the frozen ``__init__``.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def gc_paused(fn: F) -> F:
    """Decorator: run ``fn`` with the cyclic GC disabled (restored afterwards, also on error)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()
    return wrapper  # type: ignore[return-value]


def slots_constructor(cls: type, *, from_sequence: bool = False) -> Callable:
    """A constructor for a frozen, slotted dataclass without ``__post_init__`` that sets
    each slot through its descriptor, which is what the generated ``__init__`` does via
    ``object.__setattr__``, without keyword handling (about 3x faster; the passes build
    one record per instruction). Every field must be given, in declaration order; values
    are not checked.

    Returns ``make(v0, v1, ...)``, or with ``from_sequence=True`` ``make(values)`` taking one
    sequence of the field values (IndexError when it is shorter than the field count).

    Raises:
      TypeError: ``cls`` is not a slotted dataclass, or has a ``__post_init__``.
    """
    if not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__, which this would skip")
    names = [f.name for f in dataclasses.fields(cls)]
    ns = {"_new": object.__new__, "_cls": cls}
    ns.update({f"_s{i}": cls.__dict__[n].__set__ for i, n in enumerate(names)})
    if from_sequence:
        args, vals = "v", [f"v[{i}]" for i in range(len(names))]
    else:
        vals = [f"v{i}" for i in range(len(names))]
        args = ", ".join(vals)
    body = "".join(f"    _s{i}(c, {v})\n" for i, v in enumerate(vals))
    exec(f"def make({args}):\n    c = _new(_cls)\n{body}    return c\n", ns)  # noqa: S102
    make = ns["make"]
    make.__name__ = make.__qualname__ = f"new_{cls.__name__}"
    return make
