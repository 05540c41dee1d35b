"""Simulated CPU devices for SPMD compilation, and re-running in a subprocess when needed.

XLA:CPU exposes N devices when jax's CPU client is created with ``jax_num_cpu_devices=N``
(equivalently ``XLA_FLAGS=--xla_force_host_platform_device_count=N``). Both are read
once, when jax creates its backends; a process that has already created them with too
few devices must run the compilation in a fresh process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\d+")

#: Set in the environment of a ``run_cli_with_devices`` child: the parent has already printed
#: the command's "compiling ..." line, so the child does not print it again.
CHILD_ENV = "JAXMOVE_DEVICES_CHILD"


def in_devices_child() -> bool:
    """True in a child process started by ``run_cli_with_devices``."""
    return bool(os.environ.get(CHILD_ENV))


def ensure_cpu_devices(n: int) -> bool:
    """Make at least ``n`` CPU devices available in this process if still possible.

    Returns True when ``jax.devices("cpu")`` has (now) at least ``n`` devices, False when
    jax's backends were already created with fewer (run in a subprocess instead).
    """
    import jax
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        flags = os.environ.get("XLA_FLAGS", "")
        m = _COUNT_FLAG.search(flags)
        if m is None or int(m.group(0).rsplit("=", 1)[1]) < n:
            os.environ["XLA_FLAGS"] = _COUNT_FLAG.sub("", flags) + f" --xla_force_host_platform_device_count={n}"
            jax.config.update("jax_num_cpu_devices", n)
    try:
        return len(jax.devices("cpu")) >= n
    except RuntimeError:
        return False


def subprocess_env(n: int) -> dict[str, str]:
    """The environment of a child process that sees ``n`` simulated CPU devices."""
    env = dict(os.environ)
    flags = _COUNT_FLAG.sub("", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={n}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    # No current directory on the child's sys.path (python -P): a ./json.py must not run in
    # place of the standard library's; user targets are imported from it explicitly
    # (capture/resolve.py's _cwd_on_path).
    env["PYTHONSAFEPATH"] = "1"
    return env


def run_cli_with_devices(n: int, argv: list[str], capture_stdout: bool = False) -> subprocess.CompletedProcess:
    """Run ``jaxmove ARGV`` in a child process with ``n`` simulated CPU devices.

    stderr (progress, errors) passes through; stdout is captured when asked. The child's
    environment has ``CHILD_ENV`` set (it does not repeat the parent's "compiling ..." line).
    """
    cmd = [sys.executable, "-P", "-c", "import sys; from jaxmove.cli import main; sys.exit(main(sys.argv[1:]))",
           *argv]
    env = {**subprocess_env(n), CHILD_ENV: "1"}
    return subprocess.run(cmd, env=env, text=True,
                          stdout=subprocess.PIPE if capture_stdout else None)
