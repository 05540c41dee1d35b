"""Output files of the CLI: checked before long work, written atomically.

Every file jaxmove writes (``--html``, ``--trace``, ``annotate -o``, ``calibrate -o``,
``compare --save-fit``) goes through here, so they behave alike:

* ``check_output_path`` runs before any analysis or measurement: the path must not be a
  directory, its parent directory must exist (only the default cache location of
  ``jaxmove calibrate`` is created) and must accept a new file (probed by creating and
  removing an empty temporary file there);
* ``write_text_atomic`` writes to a temporary file in the destination directory and
  renames it over the path (``os.replace``, atomic on POSIX), so a failure, a Ctrl-C or a
  SIGTERM never leaves a half-written or empty file, nor the temporary file, behind. A path that exists and is not a regular file
  (``/dev/null``, a FIFO) is written in place instead of being replaced; a symbolic link is
  followed (the file it names is replaced, the link stays, as writing through it would).

Errors are ``OutputPathError`` naming the user's path, never a temporary file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ..errors import JaxmoveInputError

__all__ = ["OutputPathError", "check_output_path", "write_atomic", "write_text_atomic"]


#: Called just before a complete output file is renamed into place (and by the CLI before it
#: says "wrote"): the CLI registers a check that raises a pending interrupt here, so an
#: interrupted command never leaves a new file behind (cli/__init__.py).
BEFORE_COMMIT: list[Callable[[], None]] = []


def before_commit() -> None:
    """Run the ``BEFORE_COMMIT`` checks (each may raise KeyboardInterrupt)."""
    for check in list(BEFORE_COMMIT):
        check()


class OutputPathError(JaxmoveInputError):
    """An output path that cannot be written (names the path and why)."""


def _display(path) -> str:
    return os.fspath(path)


def _is_special(p: Path) -> bool:
    """An existing path that is not a regular file or directory (device, FIFO, socket)."""
    try:
        mode = p.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def check_output_path(path, what: str = "output file", create_parent: bool = False) -> Path:
    """Check that ``path`` can be written as ``what``; return it (``~`` expanded).

    Args:
      path: the user's path (str or PathLike).
      what: how the error names the file, e.g. ``--html file``.
      create_parent: create a missing parent directory (only for default locations).
    Raises:
      OutputPathError: the path is a directory, its parent does not exist or is not a
        directory, or a file cannot be created there (permissions, read-only or virtual
        file system such as /proc).
    """
    shown = _display(path)
    p = Path(path).expanduser()
    if p.is_symlink():  # write the file the link names (as open() would), keeping the link
        p = Path(os.path.realpath(p))
    if p.is_dir():
        raise OutputPathError(f"{shown}: is a directory; {what} must be a file path")
    if _is_special(p):
        if not os.access(p, os.W_OK):
            raise OutputPathError(f"{shown}: cannot write {what} (permission denied)")
        return p
    parent = p.parent
    if not parent.exists():
        if not create_parent:
            raise OutputPathError(f"{shown}: directory {_display(parent)} does not exist "
                                  f"(create it first; {what})")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputPathError(f"{shown}: cannot create directory {_display(parent)} "
                                  f"({e.strerror or e})") from None
    if not parent.is_dir():
        raise OutputPathError(f"{shown}: {_display(parent)} is not a directory ({what})")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".probe", dir=parent)
    except OSError as e:
        raise OutputPathError(f"{shown}: cannot write {what} in {_display(parent)} "
                              f"({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)
    return p


def _new_file_mode(existing: Path) -> int:
    try:
        return stat.S_IMODE(existing.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path, write: Callable[[IO], None], what: str = "output file", *,
                 binary: bool = False) -> Path:
    """Write ``path`` through ``write(file)`` on a temporary file in its directory + rename.

    ``binary``: the file is opened ``"wb"`` (else text, UTF-8). The file keeps the mode of the
    file it replaces (else 0666 minus the umask); a special file (``/dev/stdout``...) is written
    in place.
    Raises:
      OutputPathError: as ``check_output_path``, or the write failed (disk full...);
        no temporary file is left behind.
    """
    shown = _display(path)
    p = check_output_path(path, what)
    how, kw = ("wb", {}) if binary else ("w", {"encoding": "utf-8"})
    if _is_special(p):
        try:
            with open(p, how, **kw) as f:
                write(f)
        except OSError as e:
            raise OutputPathError(f"{shown}: cannot write {what} ({e.strerror or e})") from None
        return p
    mode = _new_file_mode(p)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        with os.fdopen(fd, how, **kw) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        before_commit()
        os.replace(tmp, p)
        tmp = None
    except OSError as e:
        raise OutputPathError(f"{shown}: cannot write {what} ({e.strerror or e})") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


def write_text_atomic(path, text: str, what: str = "output file") -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (``write_atomic``)."""
    return write_atomic(path, lambda f: f.write(text), what)
