"""The one family of input errors: what the CLI reports as bad input (one line, exit 2).

Every error that means "the user's input is wrong" (a malformed HLO file, an unknown target or
preset, a bad ``--set``, a bad spec or plan file, an unwritable output path, user code that
raised) derives from :class:`JaxmoveInputError`. Any other exception is a bug of jaxmove's and
the CLI reports it as an internal error (exit 1).
"""

from __future__ import annotations


class JaxmoveInputError(ValueError):
    """Bad input: the message names the file, line or argument and what was expected.

    It subclasses ``ValueError`` so that code catching ``ValueError`` keeps working.
    """


class UsageError(JaxmoveInputError):
    """A bad combination of options or arguments (e.g. ``--trace`` without ``--hardware``)."""


class Unmodeled(Exception):
    """A pass rule cannot cost an instruction: the reason is the message.

    The pipeline catches this, and only this, and lists the instruction as unmodeled with the
    reason. It is not an input error: the input is valid, jaxmove has no model for it. Any other
    exception raised inside a pass is a bug of jaxmove's and propagates.
    """
