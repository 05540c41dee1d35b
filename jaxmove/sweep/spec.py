"""SWEEP.toml: what a sweep compiles, expanded into points, each keyed by a hash of its inputs.

A sweep is a grid (every combination of the lists under ``[grid]``) and/or a list of
``[[points]]`` over one or more models, ``--set`` values, compile targets, meshes and plans::

    # SWEEP.toml
    model = "gpt-tiny-decode"       # zoo preset (or module:function / file.py:function)
    hardware = "h100-sxm"           # spec for HBM capacity and time (default: the target's spec,
                                    # h100-sxm for cpu)
    target = "cpu"                  # where the program is compiled (default cpu; tpu-v5e:2x4,
                                    # h100-sxm:1x1x8...: the device's compiler, capture/targets.py)
    [set]                           # --set values of every point
    dtype = "bfloat16"
    [grid]                          # the cartesian product of these lists
    plan = ["dp", "tp"]             # presets or plan .toml files (relative to this file)
    mesh = ["data=8", "data=2,model=4"]
    [grid.set]
    batch = [8, 16]
    [[points]]                      # explicit points (their keys override the top level)
    mesh = "data=8"
    plan = "fsdp"
    set = {batch = 32}

Top-level keys are defaults of every point; ``[grid]`` takes the same keys with lists;
``[[points]]`` entries take the same keys with single values. A point with a ``mesh`` and
no ``plan`` uses ``dp``; a point without a mesh is the unsharded program on one device.

Errors (``SweepSpecError``, a ``JaxmoveInputError``) are one line naming the file, the line
when it can be found, and the key: unknown keys, wrong types, an empty grid axis, unknown
presets / ``--set`` keys / plans / hardware / targets, a hardware spec of another accelerator
than the point's target (``tpu-v5e`` costing an ``h100-sxm`` program), a bad ``--set`` value of any point
(``batch = [0, 2]``, ``heads = 3`` not dividing ``d_model``: ``zoo.check_overrides``), a plan naming mesh axes the mesh
lacks, a mesh larger than the target, more points than ``max_points`` (default
``MAX_POINTS``; a top-level ``max_points = N`` raises it), a TOML syntax error
(``file:line:col: invalid TOML: ...``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .._toml import toml_error_message
from ..errors import JaxmoveInputError

__all__ = ["SweepSpecError", "Point", "SweepSpec", "parse_sweep", "load_sweep", "point_key",
           "POINT_KEYS", "DEFAULT_TARGET", "mesh_text"]

#: Keys a point takes (top level, ``[grid]`` lists, ``[[points]]`` entries).
POINT_KEYS = ("model", "target", "hardware", "mesh", "plan", "set")
_TOP_KEYS = POINT_KEYS + ("name", "description", "grid", "points", "max_points")
DEFAULT_TARGET = "cpu"
#: Most points a sweep expands to unless its file says ``max_points = N``: each point is a
#: compile of seconds to minutes, and a 10^6-point grid took 1.6 GB and 4 minutes before its
#: first point ran.
MAX_POINTS = 10_000


class SweepSpecError(JaxmoveInputError):
    """A SWEEP.toml that cannot be expanded into points (one line: file[:line]: key: what)."""


def mesh_text(mesh: tuple[tuple[str, int], ...] | None) -> str | None:
    """(("data", 2), ("model", 4)) -> ``data=2,model=4`` (None stays None)."""
    return None if mesh is None else ",".join(f"{k}={v}" for k, v in mesh)


@dataclass(frozen=True)
class Point:
    """One compile of a sweep: a model with ``--set`` values, on a target, over a mesh, under a plan.

    Attributes:
      model: zoo preset name, or ``module:function`` / ``file.py:function`` (returning a
        Workload; with a mesh it needs ``logical_axes``, see ``plans.load_workload``).
      target: where the program is compiled: ``cpu`` (XLA:CPU with simulated devices) or a
        compile target's canonical name (``tpu-v5e:2x2``, ``h100-sxm:1x1x8``; capture/targets.py).
      hardware: spec name or ``.toml`` path: HBM capacity (``fits``) and time estimates
        (default: the target's spec; ``h100-sxm`` for ``cpu``).
      mesh: ((axis, size), ...) in mesh order, or None for the unsharded one-device program.
      plan: a plan preset name or an absolute plan ``.toml`` path (None without a mesh).
      overrides: sorted ((key, value-as-text), ...), the ``--set`` values.
    """

    model: str
    target: str = DEFAULT_TARGET
    hardware: str = "h100-sxm"
    mesh: tuple[tuple[str, int], ...] | None = None
    plan: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()

    @property
    def num_devices(self) -> int:
        """Devices of the mesh (1 without a mesh)."""
        return math.prod(v for _, v in self.mesh) if self.mesh else 1

    @property
    def mesh_text(self) -> str | None:
        return mesh_text(self.mesh)

    def label(self) -> str:
        """A short human label: ``mlp-tiny batch=8 data=8 dp @cpu``."""
        parts = [self.model, *(f"{k}={v}" for k, v in self.overrides)]
        if self.mesh:
            parts += [self.mesh_text, Path(self.plan).stem if self.plan else "dp"]
        return " ".join(parts) + (f" @{self.target}" if self.target != DEFAULT_TARGET else "")

    def to_json(self) -> dict:
        """The point's inputs as JSON (what the worker process receives)."""
        return {"model": self.model, "target": self.target, "hardware": self.hardware,
                "mesh": [[k, v] for k, v in self.mesh] if self.mesh else None,
                "plan": self.plan, "overrides": dict(self.overrides)}

    @classmethod
    def from_json(cls, d: dict) -> "Point":
        mesh = tuple((str(k), int(v)) for k, v in d["mesh"]) if d.get("mesh") else None
        return cls(d["model"], d.get("target", DEFAULT_TARGET), d["hardware"], mesh, d.get("plan"),
                   tuple(sorted((str(k), str(v)) for k, v in (d.get("overrides") or {}).items())))

    @cached_property
    def key(self) -> str:
        """``point_key(self)``, computed once (file contents as first read)."""
        return point_key(self)


def _file_digest(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _versions() -> dict[str, str]:
    from importlib import metadata

    from .. import __version__

    out = {"jaxmove": __version__}
    for dist in ("jax", "jaxlib"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:  # pragma: no cover - jax is a dependency
            out[dist] = "?"
    return out


def point_key(point: Point) -> str:
    """The result key of a point: 16 hex digits of the SHA-256 of its inputs and versions.

    Hashed: the point's fields, the contents of the files it names (plan ``.toml``, spec
    ``.toml``, the calibrated ``local`` spec, a ``file.py:function`` model), and the versions
    of jaxmove, jax and jaxlib (a new version recompiles every point on ``--resume``).
    """
    files = {}
    if point.plan and point.plan.endswith(".toml"):
        files["plan"] = _file_digest(point.plan)
    hw = point.hardware
    if hw.endswith(".toml") or "/" in hw or os.sep in hw:
        files["hardware"] = _file_digest(hw)
    elif hw.lower() == "local":
        from ..hardware import local_spec_path
        files["hardware"] = _file_digest(str(local_spec_path()))
    model_file = point.model.rsplit(":", 1)[0] if ":" in point.model else ""
    if model_file.endswith(".py"):
        files["model"] = _file_digest(model_file)
    blob = json.dumps({"point": point.to_json(), "files": files, "versions": _versions()},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class SweepSpec:
    """A parsed SWEEP.toml: its points (grid product, then listed points; duplicates dropped)."""

    path: str
    points: list[Point]
    name: str = ""
    description: str = ""
    notes: list[str] = field(default_factory=list)


# ---- parsing -------------------------------------------------------------------------------

class _Where:
    """Finds the line of a key in the TOML text, within the table it belongs to."""

    def __init__(self, path: str, text: str):
        self.path, self.lines = path, text.splitlines()

    @staticmethod
    def _header(line: str) -> tuple[str, bool] | None:
        m = re.match(r"\s*(\[\[?)\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$", line)
        if not m:
            return None
        return m.group(2).replace('"', "").replace("'", "").replace(" ", ""), m.group(1) == "[["

    def line(self, table: str, key: str | None, index: int | None = None) -> int | None:
        """1-based line where ``key`` is written in ``table`` ('' = top level, ``set``,
        ``grid``, ``grid.set``, ``points`` / ``points.set`` of entry ``index``); with
        ``key`` None the table's header line. An inline table (``set = {batch = 8}``)
        counts as its parent's line. None when not written there."""
        current, entry = "", -1
        for i, ln in enumerate(self.lines, 1):
            h = self._header(ln)
            if h is not None:
                current = h[0]
                if h[1] and current == "points":
                    entry += 1
                if key is None and current == table and (index is None or entry == index):
                    return i
                continue
            if key is None or (index is not None and entry != index):
                continue
            lhs, eq, rhs = ln.partition("=")
            if not eq:
                continue
            lhs_key = lhs.strip().strip("\"'")
            if current == table and lhs_key == key:
                return i
            parent, _, sub = table.rpartition(".")
            if sub and current == parent and lhs_key.replace(" ", "") == f"{sub}.{key}":  # dotted key
                return i
            if sub and current == parent and lhs_key == sub:
                values = re.sub(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'', '""', rhs)  # inline sub-table
                if re.search(rf"[{{,]\s*{re.escape(key)}\s*=", values):
                    return i
        return None

    def error(self, table: str, key: str | None, msg: str, index: int | None = None) -> SweepSpecError:
        """``file:line: shown.key: msg`` for ``key`` written in ``table``."""
        line = self.line(table, key, index) or self.line(table, None, index)
        if line is None and "." in table:
            line = self.line(*table.rsplit(".", 1), index)
        base = table.split(".", 1)[0]
        shown = {"": "", "set": "", "grid": "grid.", "points": f"points[{index}]."}[base]
        if table.endswith("set"):
            shown += "set."
        shown = f"{shown}{key}" if key else (f"[{table}]" if table else "")
        loc = f"{self.path}:{line}" if line else self.path
        return SweepSpecError(f"{loc}: {shown}: {msg}" if shown else f"{loc}: {msg}")

    def error_for(self, table: str, index: int | None, key: str, msg: str) -> SweepSpecError:
        """The error for ``key`` (``set.K`` for a --set key) of a merged point, located in
        the table that gave the value: the listed point, the grid, else the top level."""
        sub = key[4:] if key.startswith("set.") else None
        name = sub or key
        order = {"points": [("points", index), ("", None)], "grid": [("grid", None), ("", None)]}[table]
        cands = [((t + ".set") if (sub and t) else ("set" if sub else t), i) for t, i in order]
        for t, i in cands:
            if self.line(t, name, i) is not None:
                return self.error(t, name, msg, i)
        return self.error(cands[0][0], name, msg, cands[0][1])


def _target_devices(target: str) -> tuple[str, int, str]:
    """(canonical target name, the most devices a mesh may have on it, its spec's name).

    ``cpu``: XLA:CPU with up to ``MAX_SIMULATED_DEVICES`` simulated devices; any other name is
    a compile target of ``capture/targets.py`` (``tpu-v5e:4x4``: 16 chips, ``h100-sxm:1x2x8``:
    16 GPUs), whose compiler plugin must be installed.

    Raises:
      jaxmove.capture.targets.TargetNameError / MissingExtraError (message names the choices,
      or the pip command).
    """
    from ..capture.targets import Target, _check_extra
    from ..plans.plan import MAX_SIMULATED_DEVICES

    t = Target.parse(target)
    if t.platform == "cpu":
        return t.name, MAX_SIMULATED_DEVICES, t.spec_name
    _check_extra(t.platform)
    return t.name, t.num_devices, t.spec_name


def _scalar_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _check_point_table(w: _Where, table: str, d: dict, *, lists: bool, index: int | None = None) -> None:
    """Keys and value types of one table of point keys (``lists``: a [grid], values are lists)."""
    set_table = f"{table}.set" if table else "set"
    for k, v in d.items():
        if k not in POINT_KEYS:
            raise w.error(table, k, f"unknown key; expected one of {', '.join(POINT_KEYS)}", index)
        if k == "set":
            if not isinstance(v, dict):
                raise w.error(table, k, "must be a table of --set key = value", index)
            for sk, sv in v.items():
                if lists and not isinstance(sv, list):
                    raise w.error(set_table, sk, f"a [grid] value must be a list, got {sv!r}", index)
                if lists and not sv:
                    raise w.error(set_table, sk, "empty list: a grid axis needs at least one value", index)
                for x in (sv if lists else [sv]):
                    if not isinstance(x, (str, int, bool)):
                        raise w.error(set_table, sk, f"expected a string, integer or boolean, got {x!r}",
                                      index)
            continue
        if lists and not isinstance(v, list):
            raise w.error(table, k, f"a [grid] value must be a list, got {v!r}", index)
        if lists and not v:
            raise w.error(table, k, "empty list: a grid axis needs at least one value", index)
        for x in (v if lists else [v]):
            if not isinstance(x, str) or not x.strip():
                raise w.error(table, k, f"expected a non-empty string, got {x!r}", index)


def parse_sweep(text: str, path: str = "<string>", base_dir: str | os.PathLike | None = None) -> SweepSpec:
    """Expand SWEEP.toml text into validated points (module docstring format).

    Args:
      text: the TOML text.
      path: the file name errors show.
      base_dir: where relative plan / spec / model paths are resolved (default: the
        directory of ``path``).
    Returns:
      A SweepSpec; its points keep the grid's order (last key varies fastest), then the
      listed points; a point equal to an earlier one is dropped (a note says how many).
    Raises:
      SweepSpecError: see the module docstring.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SweepSpecError(toml_error_message(path, e, text)) from None
    w = _Where(path, text)
    base = Path(base_dir) if base_dir is not None else Path(path).resolve().parent
    for k in data:
        if k not in _TOP_KEYS:
            raise w.error("", k, f"unknown key; expected one of {', '.join(_TOP_KEYS)}")
    for k in ("name", "description"):
        if k in data and not isinstance(data[k], str):
            raise w.error("", k, f"expected a string, got {data[k]!r}")
    top = {k: data[k] for k in POINT_KEYS if k in data}
    _check_point_table(w, "", top, lists=False)
    grid = data.get("grid")
    listed = data.get("points")
    if grid is None and listed is None:
        raise w.error("", None, "no [grid] or [[points]]: nothing to sweep")
    raw: list[tuple[dict, str, int | None]] = []   # (point dict, table, index) for errors
    cap = data.get("max_points", MAX_POINTS)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise w.error("", "max_points", f"expected a positive integer, got {cap!r}")
    _check_size(w, grid, listed, cap)
    if grid is not None:
        if not isinstance(grid, dict):
            raise w.error("", "grid", "must be a table of key = [values]")
        if not grid:
            raise w.error("grid", None, "empty grid: give at least one key = [values]")
        _check_point_table(w, "grid", grid, lists=True)
        axes: list[tuple[str, list]] = []
        for k, v in grid.items():
            if k == "set":
                if not v:
                    raise w.error("grid", "set", "empty table: give at least one key = [values]")
                axes += [(f"set.{sk}", sv) for sk, sv in v.items()]
            else:
                axes.append((k, v))
        for combo in itertools.product(*(vals for _, vals in axes)):
            d = {**top, "set": dict(top.get("set", {}))}
            for (k, _), v in zip(axes, combo):
                if k.startswith("set."):
                    d["set"][k[4:]] = v
                else:
                    d[k] = v
            raw.append((d, "grid", None))
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(p, dict) for p in listed):
            raise w.error("", "points", "must be an array of tables ([[points]])")
        if not listed:
            raise w.error("", "points", "empty list of points")
        for i, p in enumerate(listed):
            _check_point_table(w, "points", p, lists=False, index=i)
            raw.append(({**top, **p, "set": {**top.get("set", {}), **p.get("set", {})}}, "points", i))
    points: list[Point] = []
    seen: set[Point] = set()
    checked: dict = {}
    for d, table, index in raw:
        pt = _make_point(w, d, table, index, base, checked)
        if pt not in seen:
            seen.add(pt)
            points.append(pt)
    notes = []
    if len(points) < len(raw):
        notes.append(f"{len(raw) - len(points)} duplicate point(s) dropped")
    return SweepSpec(path, points, str(data.get("name", Path(path).stem)),
                     str(data.get("description", "")), notes)


def _check_size(w: "_Where", grid, listed, cap: int) -> None:
    """Refuse, before expanding anything, a sweep of more than ``cap`` points (grid product
    plus listed points; duplicates are not yet dropped, so this is an upper bound)."""
    n_grid = 0
    sizes: list[int] = []
    if isinstance(grid, dict) and grid:
        for k, v in grid.items():
            if k == "set" and isinstance(v, dict):
                sizes += [len(sv) for sv in v.values() if isinstance(sv, list)]
            elif isinstance(v, list):
                sizes.append(len(v))
        n_grid = math.prod(sizes)
    n = n_grid + (len(listed) if isinstance(listed, list) else 0)
    if n > cap:
        shape = " x ".join(map(str, sizes)) if sizes else "0"
        raise w.error("grid" if n_grid else "", None if n_grid else "points",
                      f"{n} points ({shape} grid + {n - n_grid} listed), more than the "
                      f"{cap} a sweep runs; set max_points = {n} at the top of the file to run "
                      "them all")


def _resolve_file(value: str, base: Path) -> str:
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def _looks_like_path(s: str) -> bool:
    return s.endswith(".toml") or "/" in s or os.sep in s


def _override_key(msg: str, overrides: dict[str, str]) -> str:
    """The ``--set`` key a zoo error is about: the one it names (``--set batch='0': ...``,
    ``heads=3 must divide d_model=64``), else the first one given."""
    for k in overrides:
        if re.search(rf"(?<![\w.]){re.escape(k)}\s*=", msg):
            return k
    return next(iter(overrides))


def _make_point(w: _Where, d: dict, table: str, index: int | None, base: Path, checked: dict) -> Point:
    """One validated Point from the merged keys of a grid combination or a listed point.
    ``checked`` caches the validation of targets, specs and plans by value."""
    import dataclasses

    from jaxmove import zoo

    from ..plans import DEFAULT_HARDWARE, PlanError, check_plan_mesh, load_plan, parse_mesh

    def err(key: str, msg: str) -> SweepSpecError:
        return w.error_for(table, index, key, msg)

    model = d.get("model")
    if model is None:
        raise w.error("", "model", "missing: every point needs a model (a zoo preset, "
                      "module:function or file.py:function)")
    is_preset = model in zoo.PRESETS
    if not is_preset and ":" not in model:
        from ..capture.resolve import HLO_SUFFIXES, did_you_mean, preset_choices
        if model.endswith(HLO_SUFFIXES) or Path(_resolve_file(model, base)).exists():
            raise err("model", f"{model!r} is a path, not a workload: a sweep compiles each point "
                               "(an HLO file or dump is already compiled; analyse it with `jaxmove "
                               "analyze`); "
                               "expected a zoo preset, module:function or file.py:function")
        raise err("model", f"unknown preset {model!r}{did_you_mean(model)}; presets: {preset_choices()} "
                           "(or module:function)")
    if not is_preset:
        mod, _, fn = model.rpartition(":")
        if mod.endswith(".py"):
            path = _resolve_file(mod, base)
            if not Path(path).is_file():  # checked here: the worker would fail on every point
                raise err("model", f"{path}: no such file (model {model!r}; a relative file.py "
                                   "is read from the SWEEP.toml's directory)")
            model = f"{path}:{fn}"
    overrides = {str(k): _scalar_text(v) for k, v in (d.get("set") or {}).items()}
    if overrides and not is_preset:
        k = next(iter(overrides))
        raise err(f"set.{k}", f"--set values apply to zoo presets only, not to {model!r}")
    if overrides:
        fields = {f.name for f in dataclasses.fields(zoo.PRESETS[model].config_cls)}
        valid = [k for k in zoo.OVERRIDE_KEYS if k in fields]
        for k in overrides:
            if k not in valid:
                raise err(f"set.{k}", f"unknown --set key for preset {model!r}; valid keys: "
                                      f"{', '.join(valid)}")
        if ("set", model, tuple(sorted(overrides.items()))) not in checked:
            try:  # the values, as the zoo parses them, and the config's own checks; no tracing
                zoo.check_overrides(model, overrides)
            except zoo.PresetError as e:
                raise err(f"set.{_override_key(str(e), overrides)}",
                          f"{e} (preset {model!r})") from None
            checked[("set", model, tuple(sorted(overrides.items())))] = True
    target = d.get("target", DEFAULT_TARGET)
    if ("target", target) not in checked:
        try:
            checked[("target", target)] = _target_devices(target)
        except JaxmoveInputError as e:
            msg = re.sub(r"^--target '[^']*': ", "", str(e))
            raise err("target", f"{target!r}: {msg}") from None
    target, max_devices, target_spec = checked[("target", target)]
    # the hardware a target implies (as analyze --target does); h100-sxm for cpu (as plans)
    hardware = d.get("hardware", DEFAULT_HARDWARE if target == DEFAULT_TARGET else target_spec)
    if _looks_like_path(hardware):
        hardware = _resolve_file(hardware, base)
    if ("hw", hardware) not in checked:
        from ..hardware import HardwareSpecError, load_spec
        try:
            checked[("hw", hardware)] = load_spec(hardware)
        except HardwareSpecError as e:
            raise err("hardware", str(e)) from None
    if ("hw-target", hardware, target) not in checked:  # (analyze's and plans' check)
        from ..capture.targets import spec_target_mismatch
        mismatch = spec_target_mismatch(checked[("hw", hardware)], target, "the point",
                                        "hardware", "target")
        if mismatch:
            raise err("hardware", mismatch.removeprefix("hardware "))  # (the key is said first)
        checked[("hw-target", hardware, target)] = True
    mesh = None
    plan = d.get("plan")
    if "mesh" in d:
        text = d["mesh"]
        sizes = re.findall(r"=\s*(\d+)", text)
        n = math.prod(int(s) for s in sizes) if sizes else 0
        if n > max_devices:
            what = (f"at most {max_devices} simulated CPU devices" if target == DEFAULT_TARGET
                    else f"{max_devices} devices")
            raise err("mesh", f"mesh {text!r} has {n} devices, more than target {target!r} has "
                              f"({what})")
        try:
            mesh = tuple(parse_mesh(text).items())
        except PlanError as e:
            raise err("mesh", str(e).replace("--mesh ", "mesh ")) from None
        plan = plan or "dp"
        if _looks_like_path(plan):
            plan = _resolve_file(plan, base)
        try:
            if ("plan", plan) not in checked:
                checked[("plan", plan)] = load_plan(plan)
            check_plan_mesh(checked[("plan", plan)], dict(mesh))
        except PlanError as e:
            raise err("plan", str(e).replace("--mesh ", "mesh ")) from None
        if not is_preset and ("axes", model) not in checked:
            # a model of the user's under a plan: what `plans` refuses before compiling (a
            # function that returns no Workload, logical axes that fail every plan alike) is
            # refused here too, not stored as the same error in every row. This runs the
            # model's function, as the workers would
            from ..plans.compare import check_workload_axes, load_workload
            try:
                check_workload_axes(load_workload(model))
            except (PlanError, JaxmoveInputError) as e:
                raise err("model", f"{model!r}: {e}") from None
            checked[("axes", model)] = True
    elif plan is not None:
        raise err("plan", "a plan needs a mesh (e.g. mesh = \"data=8\")")
    return Point(model, target, hardware, mesh, plan, tuple(sorted(overrides.items())))


def load_sweep(path: str | os.PathLike) -> SweepSpec:
    """Read and expand a SWEEP.toml file (relative paths inside resolve against its directory).

    Raises:
      FileNotFoundError: no such file.
      SweepSpecError: see ``parse_sweep``.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SweepSpecError(f"{path}: not UTF-8 text (expected a SWEEP.toml)") from None
    except IsADirectoryError:
        raise SweepSpecError(f"{path}: is a directory, expected a SWEEP.toml file") from None
    return parse_sweep(text, os.fspath(path), p.resolve().parent)
