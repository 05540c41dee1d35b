"""Writing a `HardwareSpec` as TOML that `jaxmove.hardware.loader` reads back unchanged.

Only the shapes a spec uses are written (strings, ints, floats, booleans, lists of
strings, flat tables, one array of tables), so no TOML library is needed. Floats are
written with ``repr``, the shortest text that round-trips exactly.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from jaxmove.hardware.spec import FLOPS_DTYPES, HardwareSpec

__all__ = ["spec_to_toml", "write_spec"]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")

# Top-level scalar keys, in the order a reader expects them.
_ORDER = (
    "name",
    "display_name",
    "vendor",
    "kind",
    "device_kinds",
    "notes",
    "hbm_bytes_per_s",
    "hbm_capacity_bytes",
    "l2_bytes",
    "smem_per_sm_bytes",
    "num_sms",
    "sm_clock_hz",
    "vmem_bytes",
    "tensor_cores_per_chip",
    "kernel_launch_overhead_s",
    "command_buffer_launch_overhead_s",
    "kernel_min_duration_s",
    "devices_per_node",
    "intra_node_bytes_per_s",
    "inter_node_bytes_per_s",
    "link_latency_s",
    "torus_dims",
    "ici_links",
    "ici_bytes_per_s_per_link",
    "ici_topology",
    "first_touch_bytes_per_s",
    "mmap_threshold_bytes",
    "dispatch_overhead_s",
)


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else _string(k)


def _string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write non-finite number {v!r} to a hardware spec")
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")


def spec_to_toml(spec: HardwareSpec) -> str:
    """The TOML text of `spec` (``path`` is not written)."""
    lines: list[str] = []
    for k in _ORDER:
        v = getattr(spec, k)
        if v is None or v == "" or v == ():
            continue
        lines.append(f"{k} = {_value(v)}")
    lines += ["", "[flops_per_s]"]
    for k in FLOPS_DTYPES:
        if k in spec.flops_per_s:
            lines.append(f"{k} = {_value(float(spec.flops_per_s[k]))}")
    if spec.target:
        lines += ["", "[target]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in spec.target.items()]
    if spec.calibration:
        lines += ["", "[calibration]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in spec.calibration.items()]
    lines += ["", "[sources]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in spec.sources.items()]
    for alt in spec.alternatives:
        lines += [
            "",
            "[[alternatives]]",
            f"key = {_value(alt.key)}",
            f"value = {_value(float(alt.value))}",
            f"source = {_value(alt.source)}",
            f"note = {_value(alt.note)}",
        ]
    return "\n".join(lines) + "\n"


def write_spec(spec: HardwareSpec, path: str | os.PathLike[str]) -> Path:
    """Write `spec` as TOML to `path`, creating parent directories.

    The text goes to a temporary file in the same directory which is then renamed
    over `path` (``os.replace``, atomic on POSIX), so a crash never leaves a
    half-written spec behind; the file gets the mode of the one it replaces, else 0666 less
    the umask (report/outputs.py ``write_atomic``). Returns the path written.

    Raises:
      OutputPathError: the path cannot be written (a directory, no permission, disk full).
    """
    from ..report.outputs import write_text_atomic

    target = Path(path).expanduser()
    text = spec_to_toml(spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    # (report/outputs.py: the mode of the file it replaces, else 0666 minus the umask; a user
    # trial found specs written 0600, mkstemp's mode)
    write_text_atomic(target, text, "spec file")
    return target
