"""Capture: JAX / Flax -> ``Program`` (optimized HLO text + entry parameter roles).

``capture`` lowers and compiles a target with ``jax.jit`` (abstract
``jax.ShapeDtypeStruct`` arguments are fine: nothing is allocated), then maps every
HLO ENTRY parameter back to the argument leaf it came from.

Parameter mapping.  ``jax.jit`` flattens the non-static arguments into leaves
(``jax.tree_util`` order) and *drops* leaves the function never uses.  The kept
leaves are ``lowered._lowering.compile_args["kept_var_idx"]`` (a set of flat
leaf indices; ``compiled._executable._kept_var_idx`` on a ``Compiled``), and HLO
entry parameter ``i`` is the ``i``-th kept leaf in increasing order.  capture
checks that the number of ENTRY parameters equals the number of kept leaves, and
that each parameter's ``metadata={op_name=...}`` (jax writes the leaf's pytree
path there, e.g. ``p['w']``) equals the expected path; either mismatch raises
``CaptureError`` instead of guessing.

Path scheme (``EntryParameter.path``): the Python parameter name of the argument,
then each pytree key, joined by ``/``: dict keys and attribute names as written,
sequence indices as numbers.  A trailing Flax ``Variable`` ``.value`` is dropped.
Examples: ``params/layers/0/attn/query/kernel``, ``cache/layers/0/k_cache``,
``tokens``, ``pos``; for ``def f(*args)`` the leaves are ``args/0``, ``args/1/w``.
It is jax's own argument naming (``debug_info.arg_names``, the same string as the
HLO metadata) with ``['k']`` / ``[i]`` / ``.a`` turned into ``/k`` / ``/i`` / ``/a``.
"""

from __future__ import annotations

import inspect
import os
import math
import re
from dataclasses import dataclass, field
from dataclasses import replace as dataclasses_replace
from typing import Any

import jax
from jax.experimental.layout import Format
import numpy as np

from ..errors import JaxmoveInputError

from ..vocab import unlabeled_role
from .workload import ROLES, Workload, role_from_name

__all__ = [
    "CaptureError", "EntryParameter", "Program", "capture", "program_from_hlo_file",
    "role_from_name", "keystr_to_path",
]


class CaptureError(JaxmoveInputError):
    """The compiled program cannot be mapped back to its arguments unambiguously."""


@dataclass(frozen=True)
class EntryParameter:
    """One HLO ENTRY parameter of a captured program.

    Attributes:
      number: the HLO entry parameter number.
      path: the argument leaf's path (module docstring scheme).
      role: ``weights`` | ``kv_cache`` | ``activations`` | ``unknown``.
      donated: the caller donated the buffer (``donate_argnums``).
      shape: the HLO shape without layout, e.g. ``bf16[1,1024,12,64]``.
      byte_size: bytes of the array, ``ceil(num_elements * bit_width / 8)``.
      aliased: XLA aliases it to an output (``input_output_alias`` in the HLO
        module header), i.e. the donation is honoured in place.
      argnum: the positional argument it is a leaf of (what ``donate_argnums`` names),
        or None when unknown (captured from a Lowered/Compiled).
    """

    number: int
    path: str
    role: str
    donated: bool
    shape: str
    byte_size: int
    aliased: bool = False
    argnum: int | None = None


@dataclass(frozen=True)
class Program:
    """A compiled program and what capture knows about it.

    Attributes:
      name: program name (workload name, function name or HLO module name).
      hlo_text: optimized HLO text (``compiled.as_text()``).
      backend: ``cpu`` | ``gpu`` | ``tpu`` | ``unknown``.
      num_devices: devices the executable runs on (1 for a plain jit).
      memory_stats: ``compiled.memory_analysis()`` fields, in bytes.
      parameters: one ``EntryParameter`` per ENTRY parameter, by number.
      source: ``zoo:<preset>``, ``workload:<name>``, ``callable:<module>.<qualname>``,
        ``module:<class>``, ``lowered:<name>``, ``compiled:<name>`` or ``hlo:<path>``.
      xla_cost_analysis: ``compiled.cost_analysis()`` (None if unavailable).
      config: the model configuration (empty if none).
      target: the compile target it was compiled for (``cpu``, ``h100-sxm:1x1x8``,
        ``tpu-v5e:2x2``; capture/targets.py); None for HLO files.
      notes: what a report must say about how it was compiled (e.g. no GPU autotuning).
      output_roles: one role (or None: none given) per output leaf, in jax's flattening order
        (the leaves of the ENTRY root), from a Workload's ``out_roles``; empty when none were
        given. The roles pass gives each output's values its role (passes/roles.py).
    """

    name: str
    hlo_text: str
    backend: str
    num_devices: int
    memory_stats: dict[str, int]
    parameters: tuple[EntryParameter, ...]
    source: str
    xla_cost_analysis: dict | None = None
    config: dict = field(default_factory=dict)
    target: str | None = "cpu"
    notes: tuple[str, ...] = ()
    output_roles: tuple[str | None, ...] = ()


# ----------------------------------------------------------------------------- paths

_KEY_TOKEN = re.compile(
    r"""\[\s*'((?:[^'\\]|\\.)*)'\s*\]"""     # ['key']
    r"""|\[\s*"((?:[^"\\]|\\.)*)"\s*\]"""    # ["key"]
    r"""|\[([^\]]*)\]"""                     # [0] or [other]
    r"""|\.([A-Za-z_]\w*)"""                 # .attr
)


def without_temporaries(memory_stats: dict, backend: str) -> dict:
    """``memory_stats`` of a program costed on another kind of device than its compiler's
    (XLA:CPU's program on an H100 spec): arguments, outputs and aliased bytes kept (they are the
    function's own on any device), temporaries 0 (XLA:CPU's hold f32 copies of bf16 weights no
    accelerator's program has), ``temporaries_not_counted`` naming ``backend``. The one rule of
    ``api.does_not_fit_note`` and ``plans`` (``summarize``)."""
    out = {k: memory_stats[k] for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                        "alias_size_in_bytes") if k in memory_stats}
    out["temp_size_in_bytes"] = 0
    out["temporaries_not_counted"] = backend
    return out


def memory_analysis_peak_bytes(memory_stats: dict | None, platform: str | None = None) -> int | None:
    """Bytes a compiled program needs on one device: the larger of (a) arguments + outputs -
    aliased + temporaries of XLA's ``memory_analysis()`` (``Program.memory_stats``), everything
    live at once, and (b) XLA's own ``peak_memory_in_bytes`` where the compiler reports one, so
    the figure is never below the compiler's. (a) is the larger on XLA:GPU (whose peak frees
    some temporaries before others are made) and on XLA:CPU (whose peak leaves temporaries
    out); (b) on XLA:TPU, whose ``temp_size_in_bytes`` is 0 in jax 0.10.2's deviceless compiles
    while its peak counts the temporaries (gpt2-small-prefill layers=2 under tp on
    tpu-v5e:2x4: (a) 190,413,312 B, (b) 284,052,992 B). None where (a)'s figures are missing
    (an HLO file has none). The one rule of ``plans`` (``fits``) and ``analyze``
    (``api.does_not_fit_note``).

    ``platform="tpu"`` (the program's compiler is XLA:TPU): XLA's ``peak_memory_in_bytes``
    alone where reported, the HBM peak of its buffer assignment, which it checks when it
    refuses a program. Its ``temp_size_in_bytes`` is no HBM figure to add: 0 where temporaries
    take 94 MB of the peak (above), and 1,838,592 B in gpt-tiny-decode under tp on
    tpu-v5e:2x2 (data=2, model=2), whose weights XLA prefetches into VMEM, where the peak is
    576,512 B, below arguments + outputs - aliased (417,792 B) + that temp size (a sum of
    2,256,384 B that no HBM peak of this program reaches)."""
    ms = memory_stats or {}
    if platform == "tpu" and ms.get("peak_memory_in_bytes"):
        return ms["peak_memory_in_bytes"]
    parts = [ms.get(k) for k in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")]
    if None in parts:
        return None
    live = parts[0] + parts[1] - (ms.get("alias_size_in_bytes") or 0) + parts[2]
    return max(live, ms.get("peak_memory_in_bytes") or 0)


def keystr_to_path(name: str) -> str:
    """``p['layers'][0].w.value`` -> ``p/layers/0/w`` (trailing ``.value`` dropped).

    ``name`` is jax's argument naming (``jax.tree_util.keystr`` after the Python
    parameter name), as found in ``debug_info.arg_names`` and HLO parameter
    metadata (whose ``\\'`` escapes are undone first).  An unparseable name is
    returned unchanged.
    """
    s = name.replace("\\'", "'").replace('\\"', '"')
    m = re.match(r"[A-Za-z_]\w*", s)
    parts, pos, last_attr = ([m.group(0)], m.end(), False) if m else ([], 0, False)
    while pos < len(s):
        t = _KEY_TOKEN.match(s, pos)
        if t is None:
            return name
        parts.append(next(g for g in t.groups() if g is not None))
        last_attr = t.group(4) is not None
        pos = t.end()
    if last_attr and len(parts) > 1 and parts[-1] == "value":
        parts.pop()
    return "/".join(parts)


def _bit_width(dtype) -> int:
    dtype = np.dtype(dtype)
    try:
        return int(jax.dtypes.itemsize_bits(dtype))
    except (AttributeError, TypeError):  # pragma: no cover - older jax
        return dtype.itemsize * 8


def _leaf_byte_size(shape, dtype) -> int:
    return math.ceil(math.prod(shape) * _bit_width(dtype) / 8)


# ----------------------------------------------------------------------------- HLO text

_PARAM_LINE = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*(?P<shape>.+?)\s+parameter\((?P<num>\d+)\)(?P<rest>.*)$")
_LAYOUT = re.compile(r"\{[^{}]*\}")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
#: an operation's op_name (``jit(f)/.../while``), never an argument's (``params['w']``)
_OP_PATH = re.compile(r"^[\w.<>-]*jit\([^)]*\)/")


def _entry_block(hlo_text: str) -> list[str]:
    lines = hlo_text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("ENTRY"):
            block = []
            for body in lines[i + 1:]:
                if body.startswith("}"):
                    return block
                block.append(body)
            return block
    raise CaptureError("optimized HLO has no ENTRY computation")


def _entry_parameters(hlo_text: str) -> list[tuple[int, str, str | None]]:
    """[(number, shape without layout, op_name metadata or None)] sorted by number."""
    out = []
    for line in _entry_block(hlo_text):
        m = _PARAM_LINE.match(line)
        if not m:
            continue
        shape = m.group("shape").strip()
        if shape.startswith("("):
            raise CaptureError(
                f"ENTRY parameter {m.group('num')} is a tuple {shape}: tupled arguments "
                "(jax tuple_args) are not supported")
        op = _OP_NAME.search(m.group("rest"))
        out.append((int(m.group("num")), _LAYOUT.sub("", shape), op.group(1) if op else None))
    out.sort()
    if [n for n, _, _ in out] != list(range(len(out))):
        raise CaptureError(f"ENTRY parameter numbers are not 0..N-1: {[n for n, _, _ in out]}")
    return out


def _header(hlo_text: str) -> str:
    """The ``HloModule`` header, which may continue over several lines."""
    m = re.search(r"^\s*HloModule\b", hlo_text, re.M)
    if not m:
        return ""
    ends = [i for i in (hlo_text.find(t, m.start()) for t in ("\n\n", "\nENTRY", "\n%")) if i >= 0]
    return hlo_text[m.start():min(ends) if ends else len(hlo_text)]


def _aliased_parameters(hlo_text: str) -> set[int]:
    """Parameter numbers named in the module header's ``input_output_alias``."""
    header = _header(hlo_text)
    m = re.search(r"input_output_alias=\{(.*?)\}\s*(?:,\s*\w+=|$)", header, re.S)
    if not m:
        return set()
    return {int(p) for p in re.findall(r":\s*\((\d+)\s*,", m.group(1))}


def _header_num_devices(hlo_text: str) -> int | None:
    header = _header(hlo_text)
    parts = re.search(r"num_partitions=(\d+)", header)
    reps = re.search(r"replica_count=(\d+)", header)
    if not parts and not reps:
        return None
    return (int(parts.group(1)) if parts else 1) * (int(reps.group(1)) if reps else 1)


# ----------------------------------------------------------------------------- capture core


@dataclass(frozen=True)
class _Leaf:
    """A flat, non-static argument leaf as jax.jit sees it."""

    name: str          # jax's naming, e.g. "p['w']"
    path: str          # our path, e.g. "p/w"
    role: str
    donated: bool
    shape: tuple
    dtype: Any
    shard_shape: tuple | None = None   # per-device shape when captured with in_shardings
    argnum: int | None = None          # the positional argument the leaf belongs to


def _check_role(role: Any, where: str) -> str:
    if role not in ROLES:
        raise CaptureError(f"role {role!r} for {where} is not one of {ROLES}")
    return role


def _resolve_roles(roles, args: tuple, leaves_by_arg: list[list[tuple[str, Any]]],
                   static: set[int]) -> list[list[str]]:
    """Roles per leaf of every argument.

    ``roles``: None (``vocab.unlabeled_role`` of each leaf's path: ``weights`` / ``kv_cache``
    when its name says so, as for an HLO dump of the same program, else ``activations``),
    a role string (all), a callable
    ``(path, leaf) -> role``, or a tuple/list with one entry per positional
    argument, each a role string (the whole argument) or a pytree like the
    argument with role-string leaves.  Static arguments get no roles.
    """
    out: list[list[str]] = []
    if roles is None or isinstance(roles, str) or callable(roles):
        for i, leaves in enumerate(leaves_by_arg):
            if i in static:
                out.append([])
            elif roles is None:
                out.append([unlabeled_role(p) for p, _ in leaves])
            elif isinstance(roles, str):
                out.append([_check_role(roles, "all arguments")] * len(leaves))
            else:
                out.append([_check_role(roles(p, leaf), p) for p, leaf in leaves])
        return out
    if not isinstance(roles, (tuple, list)) or len(roles) != len(args):
        raise CaptureError(f"roles must have one entry per positional argument ({len(args)}), got {roles!r}")
    for i, (arg, r) in enumerate(zip(args, roles)):
        if i in static:
            out.append([])
        elif isinstance(r, str):
            out.append([_check_role(r, f"argument {i}")] * len(leaves_by_arg[i]))
        else:
            treedef = jax.tree_util.tree_structure(arg)
            try:
                flat = treedef.flatten_up_to(r)
            except (ValueError, TypeError) as e:
                raise CaptureError(f"roles[{i}] does not match the structure of argument {i}: {e}") from None
            out.append([_check_role(x, f"argument {i} leaf {j}") for j, x in enumerate(flat)])
    return out


def _trace_leaves(fn, args, roles, donate_argnums, static_argnums, shardings=None):
    """Trace ``fn`` with jit; return (lowered, flat non-static leaves with names/roles).

    ``shardings``: optional ``{"in_shardings": ..., "out_shardings": ...}`` for ``jax.jit``.
    """
    jitted = jax.jit(fn, donate_argnums=donate_argnums, static_argnums=static_argnums,
                     **(shardings or {}))
    traced = jitted.trace(*args)
    names = list(traced.jaxpr.debug_info.arg_names or ())
    static = {i % len(args) for i in static_argnums} if args else set()
    donate = {i % len(args) for i in donate_argnums} if args else set()
    dyn = [i for i in range(len(args)) if i not in static]
    flat_by_arg = [jax.tree_util.tree_flatten_with_path(args[i])[0] for i in range(len(args))]
    n = sum(len(flat_by_arg[i]) for i in dyn)
    if len(names) != n:  # no usable debug names: fall back to our own keystr naming
        names = [f"args[{i}]{jax.tree_util.keystr(p)}" for i in dyn for p, _ in flat_by_arg[i]]
    # Role callables see our path strings; compute them per argument first.
    it = iter(names)
    leaves_by_arg: list[list[tuple[str, Any]]] = []
    names_by_arg: list[list[str]] = []
    for i in range(len(args)):
        if i in static:
            leaves_by_arg.append([])
            names_by_arg.append([])
            continue
        arg_names = [next(it) for _ in flat_by_arg[i]]
        names_by_arg.append(arg_names)
        leaves_by_arg.append([(keystr_to_path(nm), leaf) for nm, (_, leaf) in zip(arg_names, flat_by_arg[i])])
    role_lists = _resolve_roles(roles, args, leaves_by_arg, static)
    # jax's own view of each dynamic leaf (dtype after weak-type canonicalisation, donation).
    infos = jax.tree_util.tree_leaves(traced.args_info[0])
    if len(infos) != n:
        raise CaptureError(f"jax sees {len(infos)} argument leaves, capture flattened {n}")
    leaves, infos = [], iter(infos)
    for i in dyn:
        for nm, (path, _), role in zip(names_by_arg[i], leaves_by_arg[i], role_lists[i]):
            info = next(infos)
            leaves.append(_Leaf(nm, path, role, bool(info.donated) or i in donate,
                                tuple(info.shape), info.dtype, argnum=i))
    in_sh = (shardings or {}).get("in_shardings")
    if in_sh is not None:
        shard = iter(_leaf_shardings(in_sh, args, dyn))
        leaves = [dataclasses_replace(lf, shard_shape=_shard_shape(next(shard), lf.shape))
                  for lf in leaves]
    return traced.lower(), leaves


def _leaf_shardings(in_shardings, args, dyn) -> list:
    """One sharding (or None) per dynamic argument leaf; ``in_shardings`` has one entry per
    non-static positional argument: a Sharding for the whole argument or a pytree like it."""
    if not isinstance(in_shardings, (tuple, list)):
        in_shardings = (in_shardings,) * len(dyn)
    out = []
    for k, i in enumerate(dyn):
        sh = in_shardings[k] if k < len(in_shardings) else None
        n = len(jax.tree_util.tree_leaves(args[i]))
        if sh is None or isinstance(sh, (jax.sharding.Sharding, Format)):
            out.extend([sh] * n)
        else:
            out.extend(jax.tree_util.tree_structure(args[i]).flatten_up_to(sh))
    return out


def _shard_shape(sharding, shape: tuple) -> tuple:
    if isinstance(sharding, Format):   # weight_layouts='auto': the sharding inside the format
        sharding = sharding.sharding
    return tuple(sharding.shard_shape(tuple(shape))) if sharding is not None else tuple(shape)


def _build_parameters(hlo_text: str, leaves: list[_Leaf], kept: set[int] | None) -> tuple[EntryParameter, ...]:
    """Map ENTRY parameters to kept leaves and cross-check with HLO metadata."""
    entry = _entry_parameters(hlo_text)
    kept_idx = sorted(kept) if kept is not None else list(range(len(leaves)))
    if any(k >= len(leaves) for k in kept_idx):
        raise CaptureError(f"kept_var_idx {kept_idx} refers past the {len(leaves)} argument leaves")
    if len(entry) != len(kept_idx):
        raise CaptureError(
            f"the optimized HLO ENTRY has {len(entry)} parameters but jax kept {len(kept_idx)} of "
            f"{len(leaves)} argument leaves (kept_var_idx={kept_idx}); cannot map parameters to "
            "arguments (extra effect tokens or tupled arguments?)")
    aliased = _aliased_parameters(hlo_text)
    params = []
    for (number, shape, op_name), k in zip(entry, kept_idx):
        leaf = leaves[k]
        if op_name is not None and _OP_PATH.match(op_name):
            # XLA gave the parameter an operation's metadata (XLA:TPU does for loop-carried
            # parameters of SPMD programs: 'jit(train_step)/jvp(layers)/while'): no argument
            # name to check; the count and the shape check below still hold
            op_name = None
        if op_name is not None and op_name.replace("\\'", "'").replace('\\"', '"') != leaf.name:
            raise CaptureError(
                f"ENTRY parameter {number} has metadata op_name={op_name!r} but the kept-leaf "
                f"mapping gives {leaf.name!r}; refusing to guess the parameter-to-argument mapping")
        dims = re.search(r"\[([^\]]*)\]", shape)
        hlo_dims = tuple(int(d.lstrip("<=")) for d in dims.group(1).split(",") if d) if dims else ()
        local = leaf.shard_shape if leaf.shard_shape is not None else leaf.shape
        if hlo_dims != local:
            raise CaptureError(
                f"ENTRY parameter {number} ({leaf.path}) has HLO shape {shape} but the argument "
                f"leaf has {'per-device ' if leaf.shard_shape is not None else ''}shape {list(local)}")
        params.append(EntryParameter(
            number=number, path=leaf.path, role=leaf.role, donated=leaf.donated, shape=shape,
            byte_size=_leaf_byte_size(local, leaf.dtype), aliased=number in aliased,
            argnum=leaf.argnum))
    return tuple(params)


def _compiled_info(compiled: jax.stages.Compiled) -> tuple[str, int, dict[str, int], dict | None]:
    """(backend, num_devices, memory_stats, cost_analysis) of a compiled executable."""
    devices = set()
    for shardings in (compiled.input_shardings, compiled.output_shardings):
        for s in jax.tree.leaves(shardings):
            devices |= set(getattr(s, "device_set", ()))
    backend = next(iter(devices)).platform if devices else jax.default_backend()
    num_devices = max(1, len(devices))
    stats: dict[str, int] = {}
    try:
        mem = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not implemented on some backends
        mem = None
    if mem is not None:
        for k in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                  "temp_size_in_bytes", "generated_code_size_in_bytes", "peak_memory_in_bytes"):
            v = getattr(mem, k, None)
            if v is not None:
                stats[k] = int(v)
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001
        cost = None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    return backend, num_devices, stats, (dict(cost) if cost is not None else None)


def _facts(compiled: jax.stages.Compiled, leaves: list | None = None):
    """The CompiledFacts (capture/compile_cache.py) of a compiled executable; ``leaves``: the
    argument leaves whose per-device shapes to record (None: none recorded)."""
    from .compile_cache import CompiledFacts

    backend, num_devices, stats, cost = _compiled_info(compiled)
    shapes = None
    if leaves is not None:
        shard = _stage_input_shardings(compiled, len(leaves))
        if shard is not None:
            shapes = tuple(_shard_shape(sh, lf.shape) for lf, sh in zip(leaves, shard))
    return CompiledFacts(compiled.as_text(), backend, num_devices, stats, cost, shapes)


def _program(name, source, config, facts, parameters, target=None) -> Program:
    from .targets import Target, target_notes

    backend, num_devices, stats, cost = (facts.backend, facts.num_devices, facts.memory_stats,
                                         facts.cost_analysis)
    if target is None:  # a Lowered/Compiled made elsewhere: its devices say what it was built for
        tname = "cpu" if backend == "cpu" else backend
        notes: tuple[str, ...] = ()
    else:
        t = Target.parse(target)
        tname, notes = t.name, tuple(target_notes(t))
    # a workload's notes for the platform it was compiled for (Workload.config "platform_notes":
    # {platform: [note]}; the zoo's decode says how its attention runs there)
    platform_notes = (config or {}).get("platform_notes")
    if isinstance(platform_notes, dict):
        notes += tuple(str(n) for n in platform_notes.get(backend, ()))
    return Program(name=name, hlo_text=facts.hlo_text, backend=backend, num_devices=num_devices,
                   memory_stats=stats, parameters=parameters, source=source,
                   xla_cost_analysis=cost, config=dict(config), target=tname, notes=notes)


def _target_shardings(shardings, target, args=()) -> dict:
    """``shardings`` with, for an accelerator target, no ``in_shardings`` and no argument that
    carries its own sharding (``jax.ShapeDtypeStruct(..., sharding=...)`` on the target's
    devices), every argument placed on the target's first compile-only device (so jit
    compiles for that device).

    Raises:
      CaptureError: ``target`` is given and an argument (or ``in_shardings``) is sharded over
        devices of another platform (jit would compile for them: a CPU program labelled TPU);
        without a target the shardings' devices are the program's.
    """
    from .targets import Target

    t = Target.parse(target)
    out = dict(shardings or {})
    # (_capture_fn made an uncommitted array for an accelerator target its shape and dtype)
    own = [(f"argument leaf {i}", x.sharding) for i, x in enumerate(jax.tree_util.tree_leaves(args))
           if isinstance(getattr(x, "sharding", None), jax.sharding.Sharding)]
    given = out.get("in_shardings")
    if given is not None:
        own += [(f"in_shardings entry {i}", sh) for i, sh in enumerate(
            given if isinstance(given, (tuple, list)) else (given,))
            if isinstance(sh, jax.sharding.Sharding)]
    for what, sh in own if target is not None else ():   # (jit compiles for those devices)
        platforms = sorted({d.platform for d in sh.device_set})
        if platforms != [t.platform]:
            raise CaptureError(
                f"--target {t.name}: {what} is sharded over {'/'.join(platforms)} "
                f"devices, so jax would compile for those, not for {t.name}; shard it over the "
                f"target's compile-only devices (a mesh of jaxmove.capture.targets.Target.parse("
                f"{t.name!r}).mesh({{...}}), and any shard_map over that mesh) or leave target out")
    if t.platform != "cpu" and given is None and not own:
        out["in_shardings"] = t.replicated()
    return out


#: ``weight_layouts`` values of ``capture``: the layouts XLA gives weight arguments.
WEIGHT_LAYOUTS = ("default", "auto")
#: the environment variable ``capture`` reads when ``weight_layouts`` is None (set by the CLI's
#: ``--weight-layouts``, so the processes a command starts compile the same way)
WEIGHT_LAYOUTS_ENV = "JAXMOVE_WEIGHT_LAYOUTS"


#: zoo modes that serve (weights loaded once, never written): ``default_weight_layouts`` gives
#: them ``auto`` on an accelerator target
INFERENCE_MODES = ("prefill", "decode")


def default_weight_layouts(obj, target=None) -> str:
    """The ``weight_layouts`` ``capture`` uses when neither the call nor
    ``$JAXMOVE_WEIGHT_LAYOUTS`` names one: ``auto`` for a zoo inference preset (a ``Workload``
    whose config ``mode`` is prefill or decode) compiled for a TPU or GPU target, the program
    a serving engine runs (it loads the weights once, in the layout the compiled program asks
    for: ``Compiled.input_formats``); ``default`` (jit's layouts) for everything else: a
    user's own function, a training step (its weights are donated and written back), XLA:CPU.

    Raises:
      TargetNameError: ``target`` is not a target name.
    """
    if not isinstance(obj, Workload) or obj.config.get("mode") not in INFERENCE_MODES:
        return "default"
    if target is None:
        return "default"
    from .targets import Target
    return "default" if Target.parse(target).platform == "cpu" else "auto"


def _roles_before_tracing(args, roles, donate_argnums, static_argnums) -> list[_Leaf] | None:
    """The (role, donated) of every dynamic argument leaf, in ``_trace_leaves``' order, where
    they are known without tracing: ``roles`` a role string or one entry per positional
    argument (a role string or a pytree of them) need no argument names. None where they do
    (``roles`` None or a callable of the leaf's path): those names come from jax's trace.
    Only ``role`` and ``donated`` of the leaves returned are meaningful."""
    if roles is None or callable(roles):
        return None
    static = {i % len(args) for i in static_argnums} if args else set()
    donate = {i % len(args) for i in donate_argnums} if args else set()
    leaves_by_arg = [[] if i in static else [("", leaf) for leaf in jax.tree_util.tree_leaves(a)]
                     for i, a in enumerate(args)]
    role_lists = _resolve_roles(roles, args, leaves_by_arg, static)
    return [_Leaf("", "", role, i in donate, (), None, argnum=i)
            for i in range(len(args)) if i not in static for role in role_lists[i]]


def _auto_weight_layouts(shardings: dict, args, static_argnums, leaves) -> dict:
    """``shardings`` with each weights-role leaf that is not donated compiled with
    ``Format(Layout.AUTO, its sharding)``: XLA picks the parameter's layout (what a serving
    engine does when it loads weights once for a compiled program) instead of the default
    major-to-minor one it may copy every step into the layout its dots want. Donated weights
    (a training step's, written back in place) keep the default: their output must share it."""
    from jax.experimental.layout import Layout

    static = {i % len(args) for i in static_argnums} if args else set()
    dyn = [i for i in range(len(args)) if i not in static]
    in_sh = shardings.get("in_shardings")
    flat = _leaf_shardings(in_sh, args, dyn) if in_sh is not None else [None] * len(leaves)
    if len(flat) != len(leaves):
        raise CaptureError(f"weight_layouts='auto': {len(flat)} shardings for {len(leaves)} argument leaves")
    per_leaf = [Format(Layout.AUTO, sh) if lf.role == "weights" and not lf.donated
                else sh for lf, sh in zip(leaves, flat)]
    out, k = [], 0
    for i in dyn:
        treedef = jax.tree_util.tree_structure(args[i])
        out.append(jax.tree_util.tree_unflatten(treedef, per_leaf[k:k + treedef.num_leaves]))
        k += treedef.num_leaves
    return {**shardings, "in_shardings": tuple(out)}


def _jit_donate_argnums(jitted, args) -> tuple[int, ...]:
    """The positional arguments a ``jax.jit(f, donate_argnums=...)`` function donates (some leaf
    donated in its ``Lowered.args_info``); () where it cannot be lowered with ``args`` (the
    capture that follows then says why)."""
    try:
        info = jitted.lower(*args).args_info[0]
    except Exception:  # noqa: BLE001 - the capture below reports the same failure
        return ()
    return tuple(i for i, a in enumerate(info)
                 if any(getattr(leaf, "donated", False) for leaf in jax.tree_util.tree_leaves(a)))


def _capture_fn(fn, args, roles, donate_argnums, static_argnums, name, source, config,
                shardings=None, target=None, weight_layouts: str = "default", out_roles=None) -> Program:
    from .compile_cache import cached_compile
    from .targets import Target, compile_lowered

    if target is not None and Target.parse(target).platform != "cpu":
        # an uncommitted array (jnp.ones: nobody placed it) is its shape and dtype there: jit
        # would keep it on the CPU ("memory kinds ... does not match" on a GPU target)
        static = set(static_argnums)
        args = tuple(a if i in static else jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
            if isinstance(x, jax.Array) and not x.committed else x, a) for i, a in enumerate(args))
    shardings = _target_shardings(shardings, target, args)
    early = (_roles_before_tracing(args, roles, tuple(donate_argnums), tuple(static_argnums))
             if weight_layouts == "auto" else None)
    if early is not None and any(lf.role == "weights" and not lf.donated for lf in early):
        # roles given per argument (every zoo preset): the weights' layouts are left to XLA in
        # the one trace
        shardings = _auto_weight_layouts(shardings, tuple(args), tuple(static_argnums), early)
    lowered, leaves = _trace_leaves(fn, tuple(args), roles, tuple(donate_argnums), tuple(static_argnums),
                                    shardings)
    if (weight_layouts == "auto" and early is None
            and any(lf.role == "weights" and not lf.donated for lf in leaves)):
        # roles from the argument names (None or a callable): known once traced, so trace again
        # with the weights' layouts left to XLA
        shardings = _auto_weight_layouts(shardings, tuple(args), tuple(static_argnums), leaves)
        lowered, leaves = _trace_leaves(fn, tuple(args), roles, tuple(donate_argnums),
                                        tuple(static_argnums), shardings)
    output_roles: tuple = ()
    if out_roles is not None:  # (checked before the compile: a bad structure fails at once)
        from .workload import flatten_out_roles
        tree = lowered.out_tree
        output_roles = tuple(flatten_out_roles(out_roles, tree, tree.num_leaves, name))
    kept = lowered._lowering.compile_args["kept_var_idx"]
    # an accelerator target's compile comes from jaxmove's compile cache when it holds it
    facts = cached_compile(lowered, target or "cpu",
                           lambda: _facts(compile_lowered(lowered, target, name), leaves))
    # per-device shapes from the executable's own input shardings (in_shardings, shardings the
    # arguments carry, or what the partitioner chose)
    if facts.input_shard_shapes is not None:
        leaves = [dataclasses_replace(lf, shard_shape=s) for lf, s in zip(leaves, facts.input_shard_shapes)]
    params = _build_parameters(facts.hlo_text, leaves, set(kept))
    program = _program(name, source, config, facts, params, target or "cpu")
    if output_roles:
        program = dataclasses_replace(program, output_roles=output_roles)
    if weight_layouts == "auto":
        program = dataclasses_replace(program, notes=program.notes + (
            "weights compiled with Layout.AUTO (--weight-layouts auto, the default of inference "
            "presets on TPU/GPU targets; --weight-layouts default gives jit's layouts): XLA chose "
            "the layout of every weights argument that is not donated",))
    return program


def _capture_stage(stage, roles, name, target=None) -> Program:
    """A ``Lowered`` / ``Compiled``: paths from HLO metadata, roles from names.

    A sharded stage (``in_shardings`` over several devices) has per-device ENTRY parameters:
    each leaf's shard shape comes from the compiled input shardings. ``target`` (if given)
    must be the platform the stage was lowered for (a stage cannot be recompiled for
    another device).
    """
    from .targets import Target, TargetNameError, compile_lowered

    if isinstance(stage, jax.stages.Lowered):
        kept = stage._lowering.compile_args["kept_var_idx"]
        compiled, kind = compile_lowered(stage, None, name or "the program"), "lowered"
    else:
        compiled, kind = stage, "compiled"
        kept = compiled._executable._kept_var_idx
    if target is not None:
        t = Target.parse(target)
        platform = _compiled_info(compiled)[0]
        if platform != t.platform:
            raise TargetNameError(
                f"--target {t.name}: this {kind} program was built for {platform.upper()} devices; a "
                f"jax {kind.capitalize()} cannot be recompiled for {t.platform.upper()} (return a Workload "
                "or a function from the module:function target instead)")
    infos = jax.tree_util.tree_flatten_with_path(compiled.args_info[0])[0]
    in_shardings = _stage_input_shardings(compiled, len(infos))
    hlo = compiled.as_text()
    metadata = {k: op for k, (_, _, op) in zip(sorted(kept), _entry_parameters(hlo))}
    leaves = []
    for j, (kp, info) in enumerate(infos):
        op = metadata.get(j)
        nm = op.replace("\\'", "'").replace('\\"', '"') if op else f"args{jax.tree_util.keystr(kp)}"
        path = keystr_to_path(nm)
        role = roles(path, info) if callable(roles) else role_from_name(path)
        sh = in_shardings[j] if in_shardings is not None else None
        leaves.append(_Leaf(nm, path, _check_role(role, path), bool(info.donated),
                            tuple(info.shape), info.dtype,
                            shard_shape=_shard_shape(sh, tuple(info.shape)) if sh is not None else None))
    mod = re.match(r"HloModule\s+([^\s,]+)", hlo)
    name = name or (mod.group(1) if mod else kind)
    return _program(name, f"{kind}:{name}", {}, _facts(compiled), _build_parameters(hlo, leaves, set(kept)),
                    target)


def _stage_input_shardings(compiled, n: int) -> list | None:
    """One Sharding per argument leaf of a Compiled (``compiled.input_shardings``), or None
    when jax does not give one per leaf."""
    try:
        flat = jax.tree_util.tree_leaves(compiled.input_shardings[0],
                                         is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
    except Exception:  # noqa: BLE001 - private structure of older/newer jax
        return None
    if len(flat) != n or not all(isinstance(s, jax.sharding.Sharding) for s in flat):
        return None
    return flat


def _capture_module(module, args, name, target=None) -> Program:
    """A Flax NNX module called as ``module(*args)``.

    Roles: ``nnx.Param`` -> weights; a variable whose type name contains ``Cache``
    or whose path contains a ``cache`` component -> kv_cache; other variables ->
    activations; call inputs -> activations.  The state is passed as a pure dict
    argument named ``state`` (paths ``state/<attr>/...``); the inputs as ``args/<i>``.
    """
    from flax import nnx

    graphdef, state = nnx.split(module)
    kinds = {}
    for kp, var in jax.tree_util.tree_flatten_with_path(
            state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]:
        path = "state/" + "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in kp)
        if isinstance(var, nnx.Param):
            role = "weights"
        elif "cache" in type(var).__name__.lower() or any(
                "cache" in c for c in path.lower().split("/")):
            role = "kv_cache"
        else:
            role = "activations"
        kinds[path] = role
    pure = nnx.to_pure_dict(state)

    def call(state, *args):
        m = nnx.merge(graphdef, state)
        return m(*args)

    def role_of(path, leaf):
        return kinds.get(path, "activations")

    cls = type(module).__qualname__
    return _capture_fn(call, (pure, *args), role_of, (), (), name or cls, f"module:{cls}", {},
                       target=target)


def capture(obj, /, *args, roles=None, donate_argnums=(), static_argnums=(), name=None,
            in_shardings=None, out_shardings=None, target=None, weight_layouts: str | None = None,
            out_roles=None) -> Program:
    """Lower and compile ``target`` and label its ENTRY parameters.

    Args:
      obj: a ``Workload``; a Python callable (``args`` are its positional
        arguments, arrays or ``jax.ShapeDtypeStruct``); a ``jax.stages.Lowered``;
        a ``jax.stages.Compiled``; or a Flax NNX module (``args`` are the call
        inputs; see ``_capture_module`` for its roles).
      roles: for a callable: None (weights / kv_cache where a leaf's path names one, the rule
        HLO dumps use, else ``activations``), a role string, a callable
        ``(path, leaf) -> role``, or one entry per positional argument (a role
        string or a pytree like the argument).  For Lowered/Compiled: None
        (``role_from_name`` of each path) or a callable.  Ignored for Workload
        (it has its own) and modules.
      donate_argnums, static_argnums: as ``jax.jit`` (callables only). A ``jax.jit``-wrapped
        function keeps the donation it was given when ``donate_argnums`` is empty.
      out_roles: for a callable: the roles of its outputs, as ``Workload.out_roles`` (a role
        string, or a pytree prefix of the output with a role or None per entry; e.g.
        ``("activations", "kv_cache")`` for a prefill returning (logits, cache)): what the
        program writes into them is counted as that role (``Program.output_roles``). Ignored
        for Workload (it has its own), Lowered / Compiled and modules.
      name: program name (default: workload name / function ``__name__``).
      in_shardings, out_shardings: passed to ``jax.jit`` (Workloads and callables only;
        None leaves them unspecified). With ``in_shardings`` the ENTRY parameters are
        per-device shards: ``EntryParameter.byte_size`` is then the per-device size.
      target: the compile target (capture/targets.py): None or ``cpu`` (XLA:CPU, the
        default), ``h100-sxm[:SxHxD]``, ``tpu-v5e[:AxB]``... For an accelerator, arguments
        without ``in_shardings`` are placed on the target's first compile-only device and
        the program is compiled by that device's compiler, without the device. A Lowered /
        Compiled keeps the devices it was built for (``target`` must match them).
      weight_layouts: ``default`` (jit's: each argument in the default major-to-minor layout)
        or ``auto`` (Workloads and callables: every weights-role argument that is not donated
        is compiled with ``jax.experimental.layout.Format(Layout.AUTO, ...)``, so XLA stores it
        in the layout its kernels read, as a server that loads weights once for a compiled
        program does; with ``default`` XLA:TPU may copy a weight into another layout in every
        step, e.g. a q projection bf16[16384,8,128] into {2,0,1}: ``layout_change``).
        None: ``$JAXMOVE_WEIGHT_LAYOUTS`` (the CLI's ``--weight-layouts``), else
        ``default_weight_layouts(obj, target)``: ``auto`` for a zoo prefill / decode preset on a
        TPU or GPU target, ``default`` otherwise.

    Returns:
      A ``Program``; ``parameters`` has one entry per HLO ENTRY parameter in
      parameter-number order (unused, pruned arguments have none).

    Raises:
      CaptureError: ENTRY parameters cannot be mapped to argument leaves
        (count, metadata or shape disagree).
      ValueError: a role is not one of ``ROLES`` or ``roles`` has the wrong structure.
      TypeError: unsupported object.
      TargetNameError, MissingExtraError: a bad ``target`` or its plugin is not installed.
      DoesNotFitError: the target compiler ran out of device memory.
    """
    device_target = target
    target = obj
    if weight_layouts is None:
        weight_layouts = os.environ.get(WEIGHT_LAYOUTS_ENV, "").strip() or default_weight_layouts(obj, device_target)
    if weight_layouts not in WEIGHT_LAYOUTS:
        raise ValueError(f"weight_layouts={weight_layouts!r}: expected one of {', '.join(WEIGHT_LAYOUTS)}")
    if isinstance(target, Workload):
        if args:
            raise TypeError("capture(Workload) takes no extra positional arguments")
        src = f"zoo:{target.config['preset']}" if "preset" in target.config else f"workload:{target.name}"
        return _capture_fn(target.fn, target.args, target.roles, target.donate_argnums,
                           target.static_argnums, name or target.name, src, target.config,
                           _jit_shardings(in_shardings, out_shardings), device_target, weight_layouts,
                           out_roles=target.out_roles)
    if isinstance(target, (jax.stages.Lowered, jax.stages.Compiled)):
        if args:
            raise TypeError("capture(Lowered/Compiled) takes no arguments")
        return _capture_stage(target, roles, name, device_target)
    try:
        from flax import nnx
        is_module = isinstance(target, nnx.Module)
    except ImportError:  # pragma: no cover
        is_module = False
    if is_module:
        return _capture_module(target, args, name, device_target)
    if callable(target):
        if hasattr(target, "lower") and not donate_argnums:
            # a jax.jit-wrapped function: its own donation holds (jaxmove jits it again)
            donate_argnums = _jit_donate_argnums(target, args)
        fn = inspect.unwrap(target) if not hasattr(target, "lower") else target
        qual = getattr(fn, "__qualname__", type(fn).__name__)
        src = f"callable:{getattr(fn, '__module__', '?')}.{qual}"
        return _capture_fn(target, args, roles, donate_argnums, static_argnums,
                           name or getattr(fn, "__name__", "fn"), src, {},
                           _jit_shardings(in_shardings, out_shardings), device_target, weight_layouts,
                           out_roles=out_roles)
    raise TypeError(f"cannot capture a {type(target).__name__}: expected a Workload, callable, "
                    "jax.stages.Lowered, jax.stages.Compiled or flax.nnx.Module")


def _jit_shardings(in_shardings, out_shardings) -> dict:
    out = {}
    if in_shardings is not None:
        out["in_shardings"] = in_shardings
    if out_shardings is not None:
        out["out_shardings"] = out_shardings
    return out


# What each XLA backend writes into its optimized HLO (and the others do not):
#  TPU: tiled layouts ``{1,0:T(8,128)(2,1)}``, memory spaces ``S(1)`` (VMEM) ..., the TPU
#       compiler's ``estimated_cycles`` in backend_config, ``tpu_custom_call`` (Pallas/Mosaic);
#  GPU: GpuBackendConfig keys (``operation_queue_id``, ``fusion_backend_config``), cuBLAS /
#       cuDNN custom calls, Triton fusions;
#  CPU: the CPU BackendConfig's ``outer_dimension_partitions``, oneDNN / YNNPACK fusions and
#       custom calls, ``xla.cpu.`` custom calls.
_BACKEND_MARKS = (
    ("tpu", re.compile(r"\{[\d,]*:T\(\d+(?:,\d+)*\)|:S\(\d+\)\}|estimated_cycles|"
                       r'custom_call_target="tpu_custom_call"')),
    ("gpu", re.compile(r'"operation_queue_id"|"fusion_backend_config"|'
                       r'custom_call_target="(?:__cublas|__cudnn|__triton|__gpu)|"kind":"__triton')),
    ("cpu", re.compile(r'"outer_dimension_partitions"|"kind":"__(?:ynn|onednn)|'
                       r'custom_call_target="(?:__onednn|xla\.cpu\.|__xla_cpu|__ynn)')),
)


# Literal text every match of the backend's marks contains: where none is in the text, the
# regex need not scan it (a substring test is a fast memory scan; a 100k-instruction module
# of 11 MB without marks took 0.2 s of regex search)
_MARK_LITERALS = {
    "tpu": (":T(", ":S(", "estimated_cycles", "tpu_custom_call"),
    "gpu": ('"operation_queue_id"', '"fusion_backend_config"', 'custom_call_target="__', '"kind":"__triton'),
    "cpu": ('"outer_dimension_partitions"', '"kind":"__', 'custom_call_target="'),
}


def infer_backend(hlo_text: str) -> str:
    """``tpu`` | ``gpu`` | ``cpu`` from what each backend writes into optimized HLO (tiled
    layouts and memory spaces, GPU backend configs / custom calls / Triton fusions, CPU
    backend configs and oneDNN/YNNPACK fusions), or ``unknown`` when the text has none."""
    for backend, mark in _BACKEND_MARKS:
        if any(lit in hlo_text for lit in _MARK_LITERALS[backend]) and mark.search(hlo_text):
            return backend
    return "unknown"


def program_from_hlo_file(path) -> Program:
    """A ``Program`` from an HLO text dump (no Python objects: parameters left empty).

    ``name`` is the ``HloModule`` name; ``num_devices`` is ``num_partitions *
    replica_count`` from the module header (1 if absent); ``backend`` is inferred from the
    text (``infer_backend``; ``unknown`` when nothing says).

    Raises:
      FileNotFoundError: the file does not exist (propagated unchanged).
      HloParseError: the file is not UTF-8 text.
    """
    from jaxmove.hlo.parser import read_hlo_text

    text = read_hlo_text(path)
    mod = re.search(r"^\s*HloModule\s+([^\s,]+)", text, re.M)
    backend = infer_backend(text)
    return Program(name=mod.group(1) if mod else str(path), hlo_text=text, backend=backend,
                   num_devices=_header_num_devices(text) or 1, memory_stats={}, parameters=(),
                   source=f"hlo:{path}", xla_cost_analysis=None, config={}, target=None)
