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
     dropped (and a note says so): the dimension stays replicated over it.

Presets (mesh axes ``data``, ``model`` and ``expert``; axes a mesh lacks are skipped):

=========  ==============================================================================
dp         batch over every mesh axis; parameters replicated
fsdp       batch over every mesh axis; parameters' ``embed`` dim over every mesh axis
           (ZeRO-3 / FSDP: weights are all-gathered where used)
tp         Megatron tensor parallelism: ``mlp``, ``heads``, ``kv_heads``, ``vocab`` over
           ``model``; batch over ``data``
fsdp_tp    2-D: tp's rules plus parameters' ``embed`` over ``data``
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
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

Rules = dict[str, tuple[str, ...]]


class PlanError(ValueError):
    """A plan or mesh that cannot be read (names the file and line when there is one)."""


@dataclass(frozen=True)
class Plan:
    """A named mapping of logical axes to mesh axes.

    Attributes:
      name, description: for reports.
      params: rules for parameters (role ``weights``): logical name -> mesh axes.
      activations: rules for every other tensor.
      source: ``preset`` or the TOML path.
    """

    name: str
    description: str
    params: Rules = field(default_factory=dict)
    activations: Rules = field(default_factory=dict)
    source: str = "preset"

    def rules(self, is_param: bool) -> Rules:
        return self.params if is_param else self.activations

    def partition_spec(self, logical_axes, shape, mesh_shape: dict[str, int], is_param: bool,
                       notes: list[str] | None = None, what: str = "") -> tuple:
        """Mesh axes per dimension (None, a name, or a tuple of names) for one tensor.

        Args:
          logical_axes: one name (or None) per dimension.
          shape: the tensor's global shape.
          mesh_shape: mesh axis name -> size.
          is_param: use the parameter rules.
          notes: receives a line for each rule dropped because a size does not divide.
        Raises:
          PlanError: ``logical_axes`` and ``shape`` differ in length.
        """
        axes = tuple(logical_axes) if logical_axes is not None else (None,) * len(shape)
        if len(axes) != len(shape):
            raise PlanError(f"{what or 'tensor'}: {len(axes)} logical axes {axes} for shape {tuple(shape)}")
        rules = self.rules(is_param)
        used: set[str] = set()
        out = []
        for name, size in zip(axes, shape):
            cands = [a for a in rules.get(name, ()) if mesh_shape.get(a, 1) > 1 and a not in used]
            dropped = []
            while cands and size % math.prod(mesh_shape[a] for a in cands):
                dropped.insert(0, cands.pop())
            if dropped and notes is not None:
                notes.append(f"{name} ({size}) is not divisible by "
                             f"{'x'.join(f'{a}={mesh_shape[a]}' for a in cands + dropped)}: "
                             f"kept replicated over {', '.join(dropped)}")
            used.update(cands)
            out.append(None if not cands else cands[0] if len(cands) == 1 else tuple(cands))
        return tuple(out)


_ALL = ("data", "expert", "model")
_TP = {"mlp": ("model",), "heads": ("model",), "kv_heads": ("model",), "vocab": ("model",)}

PRESETS: dict[str, Plan] = {
    "dp": Plan("dp", "data parallel: batch over every mesh axis, parameters replicated",
               params={}, activations={"batch": _ALL}),
    "fsdp": Plan("fsdp", "fully sharded data parallel: batch and parameters' embed over every mesh axis",
                 params={"embed": _ALL}, activations={"batch": _ALL}),
    "tp": Plan("tp", "Megatron tensor parallel: mlp/heads/vocab over model, batch over data",
               params=dict(_TP), activations={"batch": ("data",), **_TP}),
    "fsdp_tp": Plan("fsdp_tp", "2-D: tp over model, parameters' embed and batch over data",
                    params={**_TP, "embed": ("data",)}, activations={"batch": ("data",), **_TP}),
    "ep": Plan("ep", "expert parallel: experts over expert/model, batch over every mesh axis",
               params={"expert": ("expert", "model")},
               activations={"batch": ("data", "expert", "model"), "expert": ("expert", "model")}),
}


def parse_mesh(text: str) -> dict[str, int]:
    """``data=2,model=4`` -> {"data": 2, "model": 4} (insertion order is the mesh order).

    Raises:
      PlanError: not ``name=size`` pairs of positive sizes, or a repeated name.
    """
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)", part)
        if not m or int(m.group(2)) < 1:
            raise PlanError(f"--mesh {text!r}: expected name=size pairs such as data=2,model=4, "
                            f"got {part!r}")
        if m.group(1) in out:
            raise PlanError(f"--mesh {text!r}: axis {m.group(1)!r} given twice")
        out[m.group(1)] = int(m.group(2))
    return out


def _line_of(text: str, key: str) -> int | None:
    m = re.search(rf"^\s*\"?{re.escape(key)}\"?\s*=", text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else None


def _rules(table, where: str, path: str, text: str) -> Rules:
    if not isinstance(table, dict):
        raise PlanError(f"{path}: [{where}] must be a table of logical_axis = [mesh axes]")
    out: Rules = {}
    for k, v in table.items():
        vals = [v] if isinstance(v, str) else v
        if not isinstance(vals, list) or not all(isinstance(x, str) for x in vals):
            line = _line_of(text, k)
            raise PlanError(f"{path}:{line or '?'}: [{where}] {k} must be a mesh axis name or a "
                            f"list of names, got {v!r}")
        out[k] = tuple(vals)
    return out


def parse_plan(text: str, path: str = "<string>") -> Plan:
    """A Plan from TOML text (module docstring format).

    Raises:
      PlanError: invalid TOML (with line), unknown top-level keys, or rules that are not
        names / lists of names.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"{path}: {e}") from None
    known = {"name", "description", "rules", "params", "activations"}
    for k in data:
        if k not in known:
            raise PlanError(f"{path}:{_line_of(text, k) or '?'}: unknown key {k!r}; expected "
                            f"{', '.join(sorted(known))}")
    both = _rules(data.get("rules", {}), "rules", path, text)
    params = {**both, **_rules(data.get("params", {}), "params", path, text)}
    acts = {**both, **_rules(data.get("activations", {}), "activations", path, text)}
    if not (params or acts):
        raise PlanError(f"{path}: no [rules], [params] or [activations] table")
    name = data.get("name", Path(path).stem)
    return Plan(str(name), str(data.get("description", "")), params, acts, path)


def load_plan(name_or_path: str | os.PathLike) -> Plan:
    """A preset name (``dp``, ``fsdp``, ``tp``, ``fsdp_tp``, ``ep``) or a TOML file.

    Raises:
      PlanError: neither a preset nor a readable plan file.
    """
    s = os.fspath(name_or_path)
    if s in PRESETS:
        return PRESETS[s]
    p = Path(s)
    if not p.is_file():
        raise PlanError(f"plan {s!r} is not a preset ({', '.join(PRESETS)}) or a TOML file")
    return parse_plan(p.read_text(encoding="utf-8"), s)
