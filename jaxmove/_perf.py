"""Pausing Python's cyclic garbage collector around bulk object construction.

Parsing a module of a million instructions allocates millions of objects that all
survive; each cyclic collection of the older generations walks all of them, which made
parse + analysis 1.5-2x slower on 100k-1M instruction modules (benchmarks/parse_speed.py).
The IR holds no reference cycles (operands are names), so nothing waits on the cyclic
collector while it is paused; reference counting still frees everything else at once.
"""

from __future__ import annotations

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
