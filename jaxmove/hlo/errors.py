"""Errors raised while reading HLO text."""

from __future__ import annotations

from ..errors import JaxmoveInputError


class HloParseError(JaxmoveInputError):
    """Malformed or invalid HLO text.

    Attributes:
      filename: the file (or ``<string>``) the text came from.
      line, column: 1-based position of the problem.
      expected: what the parser expected there (or what is wrong).
    """

    def __init__(self, filename: str, line: int, column: int, expected: str):
        self.filename = filename
        self.line = line
        self.column = column
        self.expected = expected
        super().__init__(f"{filename}:{line}:{column}: {expected}")


class HloFileError(JaxmoveInputError):
    """An HLO input that cannot be read as a text file: not a regular file (a directory, a
    device such as /dev/zero, a FIFO), or larger than the size jaxmove reads.

    Attributes:
      filename: the path given.
    """

    def __init__(self, filename: str, problem: str):
        self.filename = filename
        super().__init__(f"{filename}: {problem}")
