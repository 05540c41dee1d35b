"""Reading hardware specs from TOML: built-in names, the calibrated ``local`` spec, or a path.

File format (see ``specs/h100-sxm.toml`` for a complete example)::

    name = "h100-sxm"
    vendor = "NVIDIA"
    kind = "gpu"                      # gpu | tpu | cpu
    hbm_bytes_per_s = 3.35e12
    ...
    [flops_per_s]
    bf16 = 989.4e12
    [sources]                         # one citation per numeric key
    hbm_bytes_per_s = "NVIDIA H100 Tensor Core GPU datasheet, https://..."
    "flops_per_s.bf16" = "..."
    [[alternatives]]                  # published values we do not use, and why
    key = "hbm_bytes_per_s"
    value = 3.0e12
    source = "..."
    note = "..."

Every error is a `HardwareSpecError` naming the file, and the key and line when known
(``file:line: ...``; a TOML syntax error ``file:line:col: invalid TOML: ...``).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from jaxmove._toml import toml_error_message
from jaxmove.hardware.spec import (FLOPS_DTYPES, GPU_TARGET_KEYS, KINDS, TPU_TARGET_KEYS, ZERO_ALLOWED_KEYS,
                                   Alternative, HardwareSpec, HardwareSpecError)

__all__ = [
    "builtin_name_note",
    "builtin_spec_names",
    "list_specs",
    "load_spec",
    "local_spec_path",
    "parse_spec",
    "spec_for_device_kind",
]

LOCAL_SPEC_NAME = "local"
_CACHE_ENV = "JAXMOVE_CACHE_DIR"

_FIELDS = {f.name: f for f in dataclasses.fields(HardwareSpec)}
# Keys a file may hold at top level (``path`` is set by the loader, never read).
_TOP_LEVEL_KEYS = [n for n in _FIELDS if n != "path"]
_INT_FIELDS = {n for n, f in _FIELDS.items() if f.metadata.get("numeric") and str(f.type).startswith("int")}
_FLOAT_FIELDS = {n for n, f in _FIELDS.items() if f.metadata.get("numeric") and n not in _INT_FIELDS}
_STR_FIELDS = {"name", "vendor", "kind", "display_name", "notes"}
_ALTERNATIVE_KEYS = ("key", "value", "source", "note")

# Physical range of a value per unit (the fields' ``unit`` metadata, spec.py): a value outside
# is a typo (1e-300 bytes/s made every time infinite and the JSON invalid), refused with its
# line. Each bound is orders of magnitude past any device that exists: HBM3e is ~8e12 B/s and
# a wafer-scale chip's SRAM ~2e16 B/s (Cerebras WSE-3: 21 PB/s); B200 fp4 peaks near 2e16
# FLOP/s, WSE-3 at 1.25e17; launch overheads and link latencies are microseconds.
_PHYSICAL_RANGE: dict[str, tuple[float, float]] = {
    "bytes/s": (1e3, 1e18),
    "FLOP/s": (1e3, 1e20),
    "s": (1e-12, 1e3),
    "bytes": (1.0, 1e17),
    "Hz": (1e3, 1e12),
    "devices": (1.0, float(1 << 20)),
    "SMs": (1.0, 1e6),
    "cores": (1.0, 1e6),
    "dimensions": (1.0, 16.0),
    "links": (1.0, 1e4),
}


def local_spec_path() -> Path:
    """Where `jaxmove calibrate` writes the calibrated spec of this machine:
    ``$JAXMOVE_CACHE_DIR/local.toml``, else ``~/.cache/jaxmove/local.toml``."""
    base = os.environ.get(_CACHE_ENV)
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "jaxmove"
    return root / "local.toml"


def _specs_dir() -> Any:
    return importlib.resources.files("jaxmove.hardware") / "specs"


def builtin_spec_names() -> list[str]:
    """Names of the specs shipped in ``jaxmove/hardware/specs``, sorted."""
    return sorted(
        p.name[: -len(".toml")] for p in _specs_dir().iterdir() if p.name.endswith(".toml")
    )


def list_specs(*, include_local: bool = False) -> list[HardwareSpec]:
    """Every built-in spec, sorted by name; with `include_local`, the calibrated
    ``local`` spec too when it exists."""
    specs = [load_spec(n) for n in builtin_spec_names()]
    if include_local and local_spec_path().is_file():
        specs.append(load_spec(LOCAL_SPEC_NAME))
    return specs


def load_spec(name_or_path: str | os.PathLike[str]) -> HardwareSpec:
    """Load a spec by built-in name (``h100-sxm``, ``tpu-v5e``; case-insensitive), the
    name ``local`` (the file `jaxmove calibrate` wrote, see `local_spec_path`), or a path
    to a ``.toml`` file.

    Raises HardwareSpecError for an unknown name, a missing file, invalid TOML, or a
    missing / mistyped / unknown key.
    """
    if isinstance(name_or_path, os.PathLike):
        return _load_path(Path(name_or_path))
    text = str(name_or_path).strip()
    looks_like_path = text.endswith(".toml") or os.sep in text or "/" in text
    if looks_like_path:
        return _load_path(Path(text).expanduser())
    name = text.lower()
    if name == LOCAL_SPEC_NAME:
        path = local_spec_path()
        if not path.is_file():
            raise HardwareSpecError(
                f"{path}: no calibrated spec for this machine; run `jaxmove calibrate` "
                f"(or `jaxmove calibrate --quick`) to measure the local device first"
            )
        return _load_path(path)
    names = builtin_spec_names()
    if name in names:
        resource = _specs_dir() / f"{name}.toml"
        spec = parse_spec(resource.read_text(encoding="utf-8"), str(resource))
        if spec.name != name:
            raise HardwareSpecError(f"{resource}: key 'name' is {spec.name!r} but the file is {name}.toml")
        return spec
    raise HardwareSpecError(
        f"unknown hardware {text!r}: expected a built-in name ({', '.join(names)}), "
        f"'local', or a path to a .toml file"
    )


def spec_for_device_kind(device_kind: str) -> HardwareSpec | None:
    """The built-in spec whose ``device_kinds`` lists `device_kind` (a jax
    ``Device.device_kind`` such as ``"NVIDIA H100 80GB HBM3"`` or ``"TPU v5 lite"``),
    compared case-insensitively; None when no built-in spec matches."""
    want = device_kind.strip().lower()
    for spec in list_specs():
        if any(want == k.lower() for k in spec.device_kinds):
            return spec
    return None


def _load_path(path: Path) -> HardwareSpec:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise HardwareSpecError(f"{path}: no such hardware spec file") from None
    except OSError as e:
        raise HardwareSpecError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HardwareSpecError(f"{path}: not UTF-8 text (byte {e.start})") from None
    return _mark_builtin_name_reuse(parse_spec(text, str(path)), path)


def builtin_name_note(spec: HardwareSpec) -> str | None:
    """``spec NAME loaded from FILE, not the built-in NAME`` when ``spec`` came from a user's
    file that reuses a built-in spec's name (``_mark_builtin_name_reuse``), else None. Read
    from the spec's ``notes``, so it survives the spec's TOML round trip to plans' child
    processes."""
    for line in (getattr(spec, "notes", "") or "").splitlines():
        if line.startswith(f"spec {spec.name} loaded from ") and line.endswith(f", not the built-in {spec.name}"):
            return line
    return None


def _mark_builtin_name_reuse(spec: HardwareSpec, path: Path) -> HardwareSpec:
    """A file that is not the built-in spec of its ``name`` (``name = "h100-sxm"`` in the
    user's own TOML) gets the path in its display name and a ``notes`` line saying so
    (``builtin_name_note``): reports name a spec by ``name``, and would pass the file off as
    the datasheet's. Not for a spec that says so already or carries ``--spec`` overrides
    (plans' child processes read an overridden spec from a file jaxmove wrote: its notes name
    the overrides, and the original file where there was one)."""
    if spec.name not in builtin_spec_names() or builtin_name_note(spec) is not None:
        return spec
    if any(str(s).startswith("user override (--spec ") for s in spec.sources.values()):
        return spec
    builtin = _specs_dir() / f"{spec.name}.toml"
    try:
        if os.path.realpath(str(builtin)) == os.path.realpath(str(path)):
            return spec
    except (OSError, ValueError):
        pass
    line = f"spec {spec.name} loaded from {path}, not the built-in {spec.name}"
    return dataclasses.replace(spec, display_name=f"{spec.label} ({path})",
                               notes=f"{spec.notes}\n{line}" if spec.notes else line)


# --------------------------------------------------------------------------- parsing


def _line_of(text: str, table: str | None, key: str) -> int | None:
    """1-based line of ``key = ...`` inside ``[table]`` (None: top level), if found."""
    current: str | None = None
    key_re = re.compile(r"""^\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_\-.]+))\s*=""")
    for i, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("[["):
            current = stripped.strip("[] \t")
            continue
        if stripped.startswith("["):
            current = stripped.split("]")[0].strip("[ \t")
            continue
        m = key_re.match(line)
        if m and current == table and (m.group(1) or m.group(2) or m.group(3)) == key:
            return i
    return None


class _Ctx:
    def __init__(self, text: str, origin: str) -> None:
        self.text = text
        self.origin = origin

    def error(self, msg: str, table: str | None = None, key: str | None = None) -> HardwareSpecError:
        where = self.origin
        if key is not None:
            line = _line_of(self.text, table, key)
            if line is not None:
                where += f":{line}"
        return HardwareSpecError(f"{where}: {msg}")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _number(ctx: _Ctx, value: Any, key: str, *, integer: bool, table: str | None = None,
            unit: str | None = None) -> float | int:
    """A positive finite number (a whole one when ``integer``; 0 too for a top-level key of
    ``ZERO_ALLOWED_KEYS``, an ideal link or launch), within ``_PHYSICAL_RANGE`` of ``unit``
    when given; else the HardwareSpecError naming the key and its line."""
    shown = f"{table}.{key}" if table else key
    zero_ok = table is None and key in ZERO_ALLOWED_KEYS
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ctx.error(f"key {shown!r} must be a number, got {_describe(value)}", table, key)
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        want = "a finite number >= 0" if zero_ok else "a positive finite number"
        raise ctx.error(f"key {shown!r} must be {want}, got {value!r}", table, key)
    lo_hi = _PHYSICAL_RANGE.get(unit or "")
    if lo_hi is not None and not (value == 0 and zero_ok) and not lo_hi[0] <= value <= lo_hi[1]:
        raise ctx.error(f"key {shown!r} = {value!r} {unit} is outside the physical range "
                        f"[{lo_hi[0]:g}, {lo_hi[1]:g}] {unit} of any real device (a typo?)"
                        + (" or exactly 0" if zero_ok else ""), table, key)
    if integer:
        if isinstance(value, float):
            if not value.is_integer():
                raise ctx.error(f"key {shown!r} must be a whole number, got {value!r}", table, key)
            value = int(value)
        return value
    return float(value)


def _string(ctx: _Ctx, value: Any, key: str, table: str | None = None) -> str:
    if not isinstance(value, str):
        shown = f"{table}.{key}" if table else key
        raise ctx.error(f"key {shown!r} must be a string, got {_describe(value)}", table, key)
    return value


def parse_spec(text: str, origin: str = "<string>") -> HardwareSpec:
    """Parse the TOML `text` of a spec; `origin` (a file name) prefixes every error.

    Raises HardwareSpecError for invalid TOML (with tomllib's line and column), a
    missing required key, an unknown key, a value of the wrong type or sign, a numeric
    key without a ``[sources]`` entry, or a source for a key that does not exist.
    """
    ctx = _Ctx(text, origin)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HardwareSpecError(toml_error_message(origin, e, text)) from None

    for key in doc:
        if key not in _TOP_LEVEL_KEYS:
            raise ctx.error(
                f"unknown key {key!r}; expected one of: {', '.join(_TOP_LEVEL_KEYS)}", None, key
            )
    for name, f in _FIELDS.items():
        if f.metadata.get("required") and name not in doc:
            unit = f.metadata.get("unit")
            raise ctx.error(f"missing required key {name!r}" + (f" ({unit})" if unit else ""))

    kwargs: dict[str, Any] = {"path": origin}
    for key, value in doc.items():
        if key in _STR_FIELDS:
            kwargs[key] = _string(ctx, value, key)
        elif key in _INT_FIELDS:
            kwargs[key] = _number(ctx, value, key, integer=True,
                                  unit=_FIELDS[key].metadata.get("unit"))
        elif key in _FLOAT_FIELDS:
            kwargs[key] = _number(ctx, value, key, integer=False,
                                  unit=_FIELDS[key].metadata.get("unit"))
        elif key == "ici_topology":
            if not isinstance(value, list) or not value or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
                raise ctx.error(f"key 'ici_topology' must be a list of positive integers (chips per "
                                f"torus dimension, e.g. [8, 4]), got {_describe(value)}", None, key)
            kwargs[key] = tuple(value)
        elif key == "device_kinds":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ctx.error(f"key 'device_kinds' must be a list of strings, got {_describe(value)}", None, key)
            kwargs[key] = tuple(value)
        elif key == "flops_per_s":
            kwargs[key] = _parse_flops(ctx, value)
        elif key == "sources":
            kwargs[key] = _parse_str_table(ctx, value, "sources")
        elif key == "calibration":
            kwargs[key] = _parse_calibration(ctx, value)
        elif key == "alternatives":
            kwargs[key] = _parse_alternatives(ctx, value)
        elif key == "target":
            kwargs[key] = _parse_target(ctx, value, doc.get("kind"))

    if kwargs["kind"] not in KINDS:
        raise ctx.error(f"key 'kind' must be one of {', '.join(KINDS)}, got {kwargs['kind']!r}", None, "kind")

    try:
        spec = HardwareSpec(**kwargs)
    except HardwareSpecError as e:
        raise HardwareSpecError(f"{origin}: {e}") from None

    numeric = spec.numeric_fields()
    for key in numeric:
        if not spec.sources.get(key, "").strip():
            table, _, sub = key.rpartition(".")
            raise ctx.error(
                f"no source for {key!r}: every number needs a [sources] entry citing a "
                f"datasheet, documentation page, paper or measurement",
                table or None,
                sub,
            )
    for key in spec.sources:
        if key not in numeric:
            raise ctx.error(
                f"[sources] cites {key!r}, which is not a numeric key of this spec "
                f"(known: {', '.join(numeric)})",
                "sources",
                key,
            )
    for alt in spec.alternatives:
        if alt.key not in numeric:
            raise ctx.error(f"[[alternatives]] names key {alt.key!r}, which is not a numeric key of this spec")
    return spec


def _parse_flops(ctx: _Ctx, value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ctx.error(f"'flops_per_s' must be a table of dtype = FLOP/s, got {_describe(value)}", None, "flops_per_s")
    if not value:
        raise ctx.error("table [flops_per_s] is empty; give at least one dtype's peak FLOP/s")
    out: dict[str, float] = {}
    for k, v in value.items():
        if k not in FLOPS_DTYPES:
            raise ctx.error(
                f"unknown dtype {k!r} in [flops_per_s]; expected one of: {', '.join(FLOPS_DTYPES)}",
                "flops_per_s",
                k,
            )
        out[k] = float(_number(ctx, v, k, integer=False, table="flops_per_s", unit="FLOP/s"))
    return out


def _parse_str_table(ctx: _Ctx, value: Any, table: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ctx.error(f"'{table}' must be a table of strings, got {_describe(value)}", None, table)
    return {k: _string(ctx, v, k, table) for k, v in value.items()}


def _parse_calibration(ctx: _Ctx, value: Any) -> dict[str, str | int | float | bool]:
    if not isinstance(value, dict):
        raise ctx.error(f"'calibration' must be a table, got {_describe(value)}", None, "calibration")
    out: dict[str, str | int | float | bool] = {}
    for k, v in value.items():
        if not isinstance(v, (str, int, float, bool)):
            raise ctx.error(
                f"key 'calibration.{k}' must be a string, number or boolean, got {_describe(v)}", "calibration", k
            )
        out[k] = v
    return out


def _parse_target(ctx: _Ctx, value: Any, kind: Any) -> dict[str, str | int]:
    """The ``[target]`` table: ``TPU_TARGET_KEYS`` for a TPU, ``GPU_TARGET_KEYS`` for a GPU."""
    if not isinstance(value, dict):
        raise ctx.error(f"'target' must be a table, got {_describe(value)}", None, "target")
    if kind not in KINDS:  # the kind is wrong, not the [target] table
        raise ctx.error(f"key 'kind' must be one of {', '.join(KINDS)}, got {kind!r}", None, "kind")
    keys = {"tpu": TPU_TARGET_KEYS, "gpu": GPU_TARGET_KEYS}.get(kind)
    if keys is None:
        raise ctx.error(f"a [target] table is for kind 'gpu' or 'tpu' specs, not {kind!r}", None, "target")
    out: dict[str, str | int] = {}
    for k, v in value.items():
        if k not in keys:
            raise ctx.error(f"unknown key {k!r} in [target] of a {kind} spec; expected one of: "
                            f"{', '.join(keys)}", "target", k)
        if keys[k] is str:
            out[k] = _string(ctx, v, k, "target")
        else:
            out[k] = _number(ctx, v, k, integer=keys[k] is int, table="target")
    if kind == "tpu" and "tpu_family" not in out:
        raise ctx.error("[target] of a TPU spec needs 'tpu_family' (e.g. \"v5e\")", None, "target")
    cc = out.get("compute_capability")
    if cc is not None and not re.fullmatch(r"\d+\.\d+", str(cc)):
        raise ctx.error(f"[target] compute_capability must be 'major.minor' such as \"9.0\", got {cc!r}",
                        "target", "compute_capability")
    dnn = out.get("dnn_version")
    if dnn is not None and not re.fullmatch(r"\d+(\.\d+){0,2}", str(dnn)):
        raise ctx.error(f"[target] dnn_version must be 'major.minor.patch' such as \"8.9.4\", got {dnn!r}",
                        "target", "dnn_version")
    if kind == "gpu":
        missing = [k for k in GPU_TARGET_KEYS if k not in out]
        if missing:
            raise ctx.error(f"[target] of a GPU spec misses {', '.join(missing)}", None, "target")
    return out


def _parse_alternatives(ctx: _Ctx, value: Any) -> tuple[Alternative, ...]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ctx.error("'alternatives' must be an array of tables ([[alternatives]])", None, "alternatives")
    out = []
    for i, entry in enumerate(value, start=1):
        for k in _ALTERNATIVE_KEYS:
            if k not in entry:
                raise ctx.error(f"[[alternatives]] entry {i} misses key {k!r} (needs {', '.join(_ALTERNATIVE_KEYS)})")
        for k in entry:
            if k not in _ALTERNATIVE_KEYS:
                raise ctx.error(f"[[alternatives]] entry {i} has unknown key {k!r}", "alternatives", k)
        out.append(
            Alternative(
                key=_string(ctx, entry["key"], "key", "alternatives"),
                value=float(_number(ctx, entry["value"], "value", integer=False, table="alternatives")),
                source=_string(ctx, entry["source"], "source", "alternatives"),
                note=_string(ctx, entry["note"], "note", "alternatives"),
            )
        )
    return tuple(out)
