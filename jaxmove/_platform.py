"""Which platform jax starts on when jaxmove runs, and the accelerator plugins' start-up noise.

The ``gpu`` and ``tpu`` extras install the CUDA plugin and libtpu for *deviceless* compilation
(``--target h100-sxm``, ``--target tpu-v5e:2x2``). On a machine without an NVIDIA driver, jax's
plugin discovery prints "Could not find cuda drivers" lines on stderr at import, and would try
to start a CUDA client at the first ``jax.devices()``; libtpu prints warnings about
TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES when a topology is loaded. These are written by C++
before logging is initialised, so no log level silences them: :func:`quiet_stderr` captures
file descriptor 2 around such calls and passes every other line through.
A user's own ``JAX_PLATFORMS`` always wins.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# Lines the CUDA plugin and libtpu print when started on a machine without the device.
_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called"
    r"|cudart_stub\.cc.*Could not find cuda drivers"
    r"|TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|Logging before InitGoogle"
    r"|=== Source Location Trace: ===|libtpu_init_utils\.cc|Failed to find host bounds"
    r"|Unable to initialize backend 'cuda'|Jax plugin configuration error"
    r"|cuda_versions|Unable to load CUDA|GPU will not be used"
    # XLA:GPU compiling for a compile-only GPU (--target) logs its scheduler's memory guess
    r"|gpu_hlo_schedule\.cc"
    # Any INFO or WARNING line of XLA's C++ logging (absl format "W1201 12:00:00.123456  42
    # file.cc:123] ..."), e.g. hlo_rematerialization.cc's "Can't reduce memory use below ...":
    # absl writes them before InitializeLog() whatever TF_CPP_MIN_LOG_LEVEL says (checked on
    # jaxlib 0.10). ERROR and FATAL lines pass; what they say that matters (a program that does
    # not fit) the report says itself.
    r"|^[IW]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w./-]+:\d+\]"
)


def has_nvidia_driver() -> bool:
    """True when the CUDA driver library (libcuda) can be found on this machine."""
    return ctypes.util.find_library("cuda") is not None or os.path.exists("/dev/nvidia0")


def default_platforms() -> None:
    """Set ``JAX_PLATFORMS=cpu`` when unset, jax not yet imported and no NVIDIA driver present."""
    if "JAX_PLATFORMS" in os.environ or "jax" in sys.modules:
        return
    if not has_nvidia_driver():
        os.environ["JAX_PLATFORMS"] = "cpu"


@contextlib.contextmanager
def quiet_stderr(survive_exit: bool = False) -> Iterator[None]:
    """Capture fd 2 for the duration; re-emit every line that is not known plugin noise.

    A Python traceback printed by the plugins' own ``except`` blocks (jax logs the failed CUDA
    plugin initialisation as a warning with its traceback) is dropped with the noise line that
    introduced it.

    ``survive_exit``: where the C++ code may end the process itself (XLA parses ``XLA_FLAGS``
    when a backend or a plugin starts, and an unknown flag ends the process with exit status 1
    after one ``F`` log line: parse_flags_from_env.cc), fd 2 goes to a small filtering process
    instead of a file, which still writes what was kept when this process is gone; without it
    a mistyped XLA_FLAGS exited silently. Costs one Python start-up (~20 ms).
    """
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        # A notebook's sys.stderr has no descriptor, but the plugins' C++ writes to the
        # process's fd 2 all the same (which ipykernel forwards into the notebook's output):
        # capture fd 2 itself, and write the lines kept to sys.stderr.
        fd = 2
    try:
        os.fstat(fd)
    except OSError:  # no fd 2 at all: nothing to capture
        yield
        return
    _flush_stderr()
    child = _filter_process(fd) if survive_exit else None
    if child is not None:  # the child writes what it keeps to fd 2 when its input ends
        try:
            with _fd_redirected(fd, child.stdin.fileno()):
                yield
        finally:
            child.stdin.close()
            child.wait()
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        with _fd_redirected(fd, tmp.fileno()):
            yield
        tmp.seek(0)
        text = tmp.read().decode("utf-8", "replace")
    kept = _filter(text)
    if kept:
        sys.stderr.write(kept)
        sys.stderr.flush()


def _flush_stderr() -> None:
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


@contextlib.contextmanager
def _fd_redirected(fd: int, to: int) -> Iterator[None]:
    """``fd`` pointing at ``to`` for the duration (Python's buffered stderr flushed at the end)."""
    saved = os.dup(fd)
    os.dup2(to, fd)
    try:
        yield
    finally:
        _flush_stderr()
        os.dup2(saved, fd)
        os.close(saved)


def _filter_process(fd: int):
    """A child Python process that reads its stdin to the end, applies ``_filter`` and writes
    the rest to ``fd`` (``quiet_stderr(survive_exit=True)``); None where none can start."""
    import inspect
    import subprocess

    code = (f"import re, sys\n_NOISE = re.compile({_NOISE.pattern!r})\n{inspect.getsource(_filter)}\n"
            "sys.stderr.write(_filter(sys.stdin.buffer.read().decode('utf-8', 'replace')))\n")
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=fd)
    except OSError:  # no Python to start: the temporary file, as without survive_exit
        return None


def _filter(text: str) -> str:
    out: list[str] = []
    in_traceback = False
    for line in text.splitlines(keepends=True):
        if _NOISE.search(line):
            in_traceback = True  # a traceback the plugin logs after its noise line goes with it
            continue
        if line.startswith("Traceback (most recent call last)") or (
                in_traceback and (line.startswith((" ", "\t")) or not line.strip()
                                  or re.match(r"^\w+(Error|Exception):", line)
                                  or line.startswith("The above exception")
                                  or line.startswith("During handling of the above exception"))):
            in_traceback = True
            continue
        in_traceback = False
        out.append(line)
    return "".join(out)


def import_jax_quietly() -> None:
    """Import jax and start its backends with the plugins' noise filtered (no-op once imported).

    As with jax itself, ``XLA_FLAGS`` (e.g. simulated device counts) must be set before this.
    """
    if "jax" in sys.modules:
        return
    default_platforms()
    with quiet_stderr(survive_exit="XLA_FLAGS" in os.environ):
        import jax
        import jax.extend  # noqa: F401

        jax.devices()  # plugin discovery runs at the first backend start; keep it inside
