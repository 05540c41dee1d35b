"""The input errors of TARGET resolution, in a module of their own: ``resolve.py`` (presets,
``module:function``, files) and ``dumps.py`` (XLA dump directories) both raise them, and
neither imports the other for them."""

from __future__ import annotations

from ..errors import JaxmoveInputError

__all__ = ["TargetError", "UserCodeError", "did_you_mean"]


class TargetError(JaxmoveInputError):
    """A TARGET that names no preset, HLO file or workload function."""


class UserCodeError(TargetError):
    """User code named by a ``module:function`` TARGET raised while being imported or called."""


def did_you_mean(name: str, choices=None) -> str:
    """`` (did you mean 'llama3-8b-decode'?)`` for a mistyped name, "" when nothing is close.

    ``choices`` default to the zoo's presets; the closest (at most 3) are those of
    ``difflib.get_close_matches`` (ratio >= 0.6, its default cutoff)."""
    import difflib

    if choices is None:
        from jaxmove import zoo
        choices = list(zoo.PRESETS)
    close = difflib.get_close_matches(str(name), list(choices), n=3)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
