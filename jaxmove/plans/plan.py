"""Sharding plans: logical axis names -> mesh axes, as presets or TOML files.

A zoo workload names every dimension of its arguments, outputs and marked
intermediates with a logical axis (``batch``, ``length``, ``embed``, ``mlp``,
``heads``, ``kv_heads``, ``kv``, ``vocab``, ``expert``, ``layers``). A plan maps those
names to mesh axes, separately for parameters (role ``weights``) and for everything
else (activations, KV cache, outputs): rules in the style of Flax's
``logical_axis_rules`` and MaxText's ``logical_axis_rules``.

Resolution of one tensor (``Plan.partition_spec``), dimension by dimension:
  1. the rule's mesh axes, in order, keeping those the mesh has (size > 1) and that no
     earlier dimension of the same tensor already uses (a mesh axis shards one dim);
  2. while the product of their sizes does not divide the dimension, the last one is
     dropped (and a note says so): the dimension stays replicated over it;
  3. (activations only) a dropped mesh axis goes to the first dimension named in the plan's
     ``fallbacks`` for that logical axis that it divides and that does not use it yet
     (``tp``: ``kv_heads`` -> ``batch``, ``length``), so a KV cache with fewer kv heads than
     the model axis is split over batch (or sequence) instead of replicated (the serving
     layout: jax-ml/scaling-book, "applied inference", splits a 70B model's cache over
     batch when 16 chips exceed its 8 KV heads). The note names the dimension that took it.
     Parameters keep step 2: the k/v projection kernels stay replicated over the axis (split
     over their embed or head dim, XLA:TPU all-gathers them whole in every layer).
  4. a dimension named by a tuple ``(name, unit, ...)`` is ``name``'s dimension with size-1
     dimensions named ``unit, ...`` folded into it: resolved as if those dimensions were
     there, and their mesh axes (none: size 1) and fallbacks land on it. DeepSeek's latent
     cache [B, S, r] is ``(("batch", "kv_heads"), "length", None)``: one kv head, which
     ``tp``'s model axis cannot split, so batch takes it (``models/transformer.py``).

Presets (mesh axes ``data``, ``model`` and ``expert``; axes a mesh lacks are skipped):

=========  ==============================================================================
dp         batch over every mesh axis; parameters replicated
fsdp       batch over every mesh axis; parameters' ``embed`` dim over every mesh axis
           (ZeRO-3 / FSDP: weights are all-gathered where used)
tp         Megatron tensor parallelism: ``mlp``, ``heads``, ``kv_heads``, ``vocab`` over
           ``model``; batch over ``data``; ``kv_heads`` falls back to batch, length
fsdp_tp    2-D: tp's rules plus parameters' ``embed`` over ``data``; tp's fallbacks
ep         experts over ``expert``/``model``; batch over every mesh axis (tokens move to
           their experts by all-to-all); other parameters replicated
=========  ==============================================================================

TOML plan file::

    name = "my-plan"
    description = "tp inside a node, fsdp across"
    [rules]            # both parameters and activations
    batch = ["data"]
    [params]           # parameters only (overrides [rules])
    embed = ["data"]
    mlp = "model"
    [activations]      # everything that is not a parameter (overrides [rules])
    [fallbacks]        # where a logical axis's mesh axes go when they do not divide it
    kv_heads = ["batch", "length"]
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import JaxmoveInputError

Rules = dict[str, tuple[str, ...]]


class PlanError(JaxmoveInputError):
    """A plan or mesh that cannot be read (names the file and line when there is one)."""


@dataclass(frozen=True)
class Plan:
    """A named mapping of logical axes to mesh axes.

    Attributes:
      name, description: for reports.
      params: rules for parameters (role ``weights``): logical name -> mesh axes.
      activations: rules for every other tensor.
      source: ``preset`` or the TOML path.
      fallbacks: logical name -> logical names (in order) whose dimension takes the mesh
        axes the name's own dimension cannot (step 3 of the module docstring; activations).
    """

    name: str
    description: str
    params: Rules = field(default_factory=dict)
    activations: Rules = field(default_factory=dict)
    source: str = "preset"
    fallbacks: Rules = field(default_factory=dict)

    def rules(self, is_param: bool) -> Rules:
        return self.params if is_param else self.activations

    def partition_spec(self, logical_axes, shape, mesh_shape: dict[str, int], is_param: bool,
                       notes: list[str] | None = None, what: str = "") -> tuple:
        """Mesh axes per dimension (None, a name, or a tuple of names) for one tensor.

        Args:
          logical_axes: a tuple (or list) of one entry per dimension: a logical axis name,
            None, or a tuple (list) of names for a merged dimension (step 4).
          shape: the tensor's global shape.
          mesh_shape: mesh axis name -> size.
          is_param: use the parameter rules.
          notes: receives a line for each rule dropped because a size does not divide.
        Raises:
          PlanError: ``logical_axes`` and ``shape`` differ in length; ``logical_axes`` is a
            string (one name, not one per dimension); an entry is an empty tuple or not a
            name, None or a tuple of names.
        """
        what = what or "tensor"
        if isinstance(logical_axes, str):
            raise PlanError(f"{what}: logical axes must be one entry per dimension (a tuple), got "
                            f"the string {logical_axes!r}; for one dimension write "
                            f"({logical_axes!r},)")
        axes = tuple(logical_axes) if logical_axes is not None else (None,) * len(shape)
        for j, a in enumerate(axes):
            if a is None or isinstance(a, str):
                continue
            if not isinstance(a, (tuple, list)) or not all(isinstance(x, str) for x in a):
                raise PlanError(f"{what}: logical axis {j} is {a!r}; expected a name, None or a "
                                f"tuple of names (a merged dimension)")
            if not a:
                raise PlanError(f"{what}: logical axis {j} is an empty tuple; write None for a "
                                f"dimension no rule shards")
        if len(axes) == len(shape) and any(not (a is None or isinstance(a, str)) for a in axes):
            # a merged dimension (name, *unit names): ``name``'s dimension with size-1
            # dimensions of the unit names folded into it (module docstring, step 4)
            exp_axes, exp_shape, host, units = [], [], [], set()
            for j, (a, n) in enumerate(zip(axes, shape)):
                names = (a,) if a is None or isinstance(a, str) else tuple(a)
                for i, name in enumerate(names):
                    exp_axes.append(name)
                    exp_shape.append(n if i == 0 else 1)
                    host.append(j)
                    if i:
                        units.add(name)
            got: list[str] | None = [] if notes is not None else None
            spec = self.partition_spec(tuple(exp_axes), tuple(exp_shape), mesh_shape, is_param, got, what)
            if notes is not None:
                # a folded unit dimension that only stays replicated is not a dimension of the
                # tensor: no note (one whose mesh axis went to a fallback keeps its note)
                notes += [n for n in got if not any(n.startswith(f"{u} (1) ") for u in units)
                          or " takes " in n]
            merged: list[list[str]] = [[] for _ in shape]
            for j, s in zip(host, spec):
                merged[j] += [] if s is None else [s] if isinstance(s, str) else list(s)
            return tuple(None if not c else c[0] if len(c) == 1 else tuple(c) for c in merged)
        if len(axes) != len(shape):
            raise PlanError(f"{what}: {len(axes)} logical axes {axes} for shape {tuple(shape)}")
        rules = self.rules(is_param)
        used: set[str] = set()
        taken: list[list[str]] = []
        lost: list[tuple[str, int, list[str], list[str]]] = []   # (name, size, kept, dropped)
        for name, size in zip(axes, shape):
            cands = [a for a in rules.get(name, ()) if mesh_shape.get(a, 1) > 1 and a not in used]
            dropped = []
            while cands and size % math.prod(mesh_shape[a] for a in cands):
                dropped.insert(0, cands.pop())
            if dropped:
                lost.append((name, size, cands, dropped))
            used.update(cands)
            taken.append(cands)
        for name, size, cands, dropped in lost:
            moved: dict[str, str] = {}
            for a in dropped:
                if a in used or is_param:
                    continue
                for fb in self.fallbacks.get(name, ()):
                    j = next((j for j, n in enumerate(axes) if n == fb
                              and not shape[j] % math.prod(mesh_shape[x] for x in taken[j] + [a])), None)
                    if j is not None:
                        taken[j].append(a)
                        used.add(a)
                        moved[a] = fb
                        break
            if notes is not None:
                kept = [a for a in dropped if a not in moved]
                how = "; ".join(([f"kept replicated over {', '.join(kept)}"] if kept else [])
                                + [f"{fb} takes {a} instead" for a, fb in moved.items()])
                # (a parameter's and an activation's note differ where fallbacks apply: say which)
                notes.append(f"{name} ({size}){' of the parameters' if is_param else ''} is not divisible by "
                             f"{'x'.join(f'{a}={mesh_shape[a]}' for a in cands + dropped)}: {how}")
        return tuple(None if not c else c[0] if len(c) == 1 else tuple(c) for c in taken)


_ALL = ("data", "expert", "model")
_TP = {"mlp": ("model",), "heads": ("model",), "kv_heads": ("model",), "vocab": ("model",)}
#: tp's fallbacks: a cache (and the k/v activations) with fewer kv heads than the model axis
#: is split over batch, else sequence.
_TP_FALLBACKS = {"kv_heads": ("batch", "length")}

PRESETS: dict[str, Plan] = {
    "dp": Plan("dp", "data parallel: batch over every mesh axis, parameters replicated",
               params={}, activations={"batch": _ALL}),
    "fsdp": Plan("fsdp", "fully sharded data parallel: batch and parameters' embed over every mesh axis",
                 params={"embed": _ALL}, activations={"batch": _ALL}),
    "tp": Plan("tp", "Megatron tensor parallel: mlp/heads/vocab over model, batch over data",
               params=dict(_TP), activations={"batch": ("data",), **_TP}, fallbacks=_TP_FALLBACKS),
    "fsdp_tp": Plan("fsdp_tp", "2-D: tp over model, parameters' embed and batch over data",
                    params={**_TP, "embed": ("data",)}, activations={"batch": ("data",), **_TP},
                    fallbacks=_TP_FALLBACKS),
    "ep": Plan("ep", "expert parallel: experts over expert/model, batch over every mesh axis",
               params={"expert": ("expert", "model")},
               activations={"batch": ("data", "expert", "model"), "expert": ("expert", "model")}),
}


#: The logical axis names the zoo models use (a plan rule for any other name would
#: never apply, so plan files may name only these).
LOGICAL_AXES = ("batch", "length", "embed", "mlp", "heads", "kv_heads", "kv", "vocab", "expert",
                "layers")

#: Most simulated CPU devices a mesh may have: XLA:CPU (jax 0.10.2) compiles SPMD programs
#: for at most 2048 devices of one process; from 2049 on, compilation fails with
#: "Multiprocess computations aren't implemented on the CPU backend" (measured:
#: `jaxmove plans mlp-tiny --mesh data=2048` takes ~2 s on 2 CPUs, data=2049 fails).
MAX_SIMULATED_DEVICES = 2048


def parse_mesh(text: str, target: str | None = None) -> dict[str, int]:
    """``data=2,model=4`` -> {"data": 2, "model": 4} (insertion order is the mesh order).

    ``target``: the compile target; on ``cpu`` (None) the mesh is simulated CPU devices, at
    most ``MAX_SIMULATED_DEVICES``; an accelerator target's topology bounds it instead
    (``Target.mesh``).

    Raises:
      PlanError: not ``name=size`` pairs of positive integer sizes (the message says which
        axis's size is not), a repeated name, or (cpu) more
        than ``MAX_SIMULATED_DEVICES`` devices in all.
    """
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)", part)
        if not m:
            raise PlanError(f"--mesh {text!r}: expected name=size pairs such as data=2,model=4, "
                            f"got {part!r}")
        size = m.group(2).strip()
        if not re.fullmatch(r"[0-9]+", size) or not size.strip("0"):
            raise PlanError(f"--mesh {text!r}: the size of axis {m.group(1)!r} must be a positive "
                            f"integer (the devices along it), got {size!r}")
        if len(size.lstrip("0")) > 30:  # (int() of thousands of digits raises)
            raise PlanError(f"--mesh {text!r}: the size of axis {m.group(1)!r} is more devices than "
                            "any mesh has")
        if m.group(1) in out:
            raise PlanError(f"--mesh {text!r}: axis {m.group(1)!r} given twice")
        out[m.group(1)] = int(size)
    n = math.prod(out.values())
    if n > MAX_SIMULATED_DEVICES and (target is None or str(target).lower() == "cpu"):
        raise PlanError(f"--mesh {text!r}: {n} devices; at most {MAX_SIMULATED_DEVICES} simulated "
                        "CPU devices are supported")
    return out


def check_plan_mesh(plan: Plan, mesh_shape: dict[str, int]) -> None:
    """A plan file must name only mesh axes the mesh has (presets skip absent axes).

    Raises:
      PlanError: a rule of a TOML plan names a mesh axis that ``mesh_shape`` lacks; the
        message names the file, the table and key, and the mesh's axes.
    """
    if plan.source == "preset":
        return
    for where, rules in (("params", plan.params), ("activations", plan.activations)):
        for logical, axes in rules.items():
            for a in axes:
                if a not in mesh_shape:
                    mesh = ",".join(f"{k}={v}" for k, v in mesh_shape.items())
                    table, line = _rule_line(plan.source, logical, where)
                    raise PlanError(f"{_at(plan.source, line)}: [{table}] {logical} = {list(axes)}: "
                                    f"mesh axis {a!r} is not in --mesh {mesh} "
                                    f"(mesh axes: {', '.join(mesh_shape)})")


def _rule_line(path: str, logical: str, where: str) -> tuple[str, int | None]:
    """(table, line) where the plan file ``path`` writes the rule for ``logical`` that applies
    to ``where`` (``params`` / ``activations`` override ``rules``); line None when the file
    cannot be read again."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return where, None
    for table in (where, "rules"):
        line = _line_of(text, logical, table)
        if line is not None:
            return table, line
    return where, None


def _line_of(text: str, key: str, table: str | None = None) -> int | None:
    """1-based line where ``key`` is written: as ``key = ...`` (inside ``[table]`` when
    given, else anywhere) or as a table header ``[key]`` / ``[key.sub]``; None when not found."""
    current = ""
    key_re = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    header_re = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
    for i, line in enumerate(text.splitlines(), 1):
        h = header_re.match(line)
        if h:
            current = h.group(1).replace('"', "").replace("'", "").replace(" ", "")
            if table is None and current.split(".")[0] == key:
                return i
            continue
        if key_re.match(line) and (table is None or current == table):
            return i
    return None


def _at(path: str, line: int | None) -> str:
    """``path:line`` when the line is known, else ``path``."""
    return f"{path}:{line}" if line else path


def _toml_error(path: str, e: tomllib.TOMLDecodeError, text: str) -> PlanError:
    """``path:line:col: what`` from tomllib's ``what (at line L, column C)`` (or ``(at end of
    document)``: the last line)."""
    msg = str(e)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
    if m:
        return PlanError(f"{path}:{m.group(1)}:{m.group(2)}: invalid TOML: {msg[:m.start()]}")
    m = re.search(r"\s*\(at end of document\)$", msg)
    if m:
        last = max(1, len(text.splitlines()))
        return PlanError(f"{path}:{last}: invalid TOML: {msg[:m.start()]} (at end of file)")
    return PlanError(f"{path}: invalid TOML: {msg}")


def _rules(table, where: str, path: str, text: str) -> Rules:
    if not isinstance(table, dict):
        raise PlanError(f"{_at(path, _line_of(text, where))}: [{where}] must be a table of "
                        "logical_axis = [mesh axes]")
    out: Rules = {}
    for k, v in table.items():
        if k not in LOGICAL_AXES:
            line = _line_of(text, k, where)
            raise PlanError(f"{_at(path, line)}: [{where}] unknown logical axis {k!r}; "
                            f"expected one of {', '.join(LOGICAL_AXES)}")
        # [fallbacks] maps a logical axis to logical axes; the other tables to mesh axes
        kind = "logical axis" if where == "fallbacks" else "mesh axis"
        vals = [v] if isinstance(v, str) else v
        if not isinstance(vals, list) or not all(isinstance(x, str) for x in vals):
            line = _line_of(text, k, where)
            raise PlanError(f"{_at(path, line)}: [{where}] {k} must be a {kind} name or a "
                            f"list of names, got {v!r}")
        dup = next((x for i, x in enumerate(vals) if x in vals[:i]), None)
        if dup is not None:  # jax rejects a mesh axis used twice in one dimension's sharding
            line = _line_of(text, k, where)
            raise PlanError(f"{_at(path, line)}: [{where}] {k} = {vals!r} names {kind} "
                            f"{dup!r} twice; each {kind} may appear once")
        out[k] = tuple(vals)
    return out


def parse_plan(text: str, path: str = "<string>") -> Plan:
    """A Plan from TOML text (module docstring format).

    Raises:
      PlanError: invalid TOML (with line), unknown top-level keys, a logical axis not in
        ``LOGICAL_AXES``, rules that are not names / lists of names, or a rule naming
        one mesh axis twice.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _toml_error(path, e, text) from None
    known = {"name", "description", "rules", "params", "activations", "fallbacks"}
    for k in data:
        if k not in known:
            raise PlanError(f"{_at(path, _line_of(text, k))}: unknown key {k!r}; expected "
                            f"{', '.join(sorted(known))}")
    both = _rules(data.get("rules", {}), "rules", path, text)
    params = {**both, **_rules(data.get("params", {}), "params", path, text)}
    acts = {**both, **_rules(data.get("activations", {}), "activations", path, text)}
    if not (params or acts):
        raise PlanError(f"{path}: no [rules], [params] or [activations] table")
    fallbacks = _rules(data.get("fallbacks", {}), "fallbacks", path, text)
    for k, names in fallbacks.items():
        bad = next((n for n in names if n not in LOGICAL_AXES), None)
        if bad is not None:
            mesh_axes = {a for rules in (params, acts) for axes in rules.values() for a in axes}
            hint = (f" ({bad!r} is a mesh axis of the rules: a fallback names the logical axis whose "
                    "dimension takes the mesh axes instead)" if bad in mesh_axes else "")
            raise PlanError(f"{_at(path, _line_of(text, k, 'fallbacks'))}: [fallbacks] {k}: unknown "
                            f"logical axis {bad!r}; expected one of {', '.join(LOGICAL_AXES)}{hint}")
        if k in names:  # its own dimension already refused the mesh axis
            raise PlanError(f"{_at(path, _line_of(text, k, 'fallbacks'))}: [fallbacks] {k} names "
                            f"itself; a fallback is another logical axis whose dimension takes "
                            f"the mesh axes {k}'s dimension does not divide")
    name = data.get("name", Path(path).stem)
    if "name" in data and (not isinstance(name, str) or not name.strip()
                           or any(not ch.isprintable() for ch in name)):
        raise PlanError(f"{_at(path, _line_of(text, 'name'))}: name = {name!r}: expected a non-empty "
                        "string of printable characters (the plan's row in the table)")
    return Plan(str(name), str(data.get("description", "")), params, acts, path, fallbacks)


def load_plan(name_or_path: str | os.PathLike) -> Plan:
    """A preset name (``dp``, ``fsdp``, ``tp``, ``fsdp_tp``, ``ep``) or a TOML file.

    Raises:
      PlanError: neither a preset nor a readable plan file (``plan PATH: no such file`` for a
        path or ``.toml`` name that does not exist, a directory, not UTF-8), or see ``parse_plan``.
    """
    s = os.fspath(name_or_path)
    if s in PRESETS:
        return PRESETS[s]
    p = Path(s)
    if p.is_dir():
        raise PlanError(f"plan {s}: is a directory, expected a TOML plan file")
    if not p.is_file():
        if s.endswith(".toml") or os.sep in s or "/" in s:
            raise PlanError(f"plan {s}: no such file")
        raise PlanError(f"plan {s!r} is not a preset ({', '.join(PRESETS)}) or a TOML file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"plan {s}: not UTF-8 text (expected a TOML plan file)") from None
    return parse_plan(text, s)
