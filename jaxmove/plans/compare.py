"""Compile a workload under sharding plans on a device mesh and compare them.

For each plan: build the workload (a zoo preset, or a user's Workload with logical axes),
turn its logical axes into ``NamedSharding`` s on a mesh (``in_shardings`` for the
arguments, ``out_shardings`` for the outputs, ``constrain`` for marked intermediates), let
XLA's SPMD partitioner produce the per-device program, and analyse that program: per-device
memory (XLA's ``memory_analysis``), HBM bytes, collectives and their wire bytes and time on a
hardware spec. Every figure is per device for one program run.

The mesh is made of simulated CPU devices (target ``cpu``, the default) or of the
compile-only devices of a ``--target`` (``tpu-v5e:2x4``, ``h100-sxm:1x1x8``;
capture/targets.py), whose compiler then partitions and compiles the program: the
collectives are the device's own (groups, dtypes, async forms), and ``fits`` is that
compiler's verdict (XLA:TPU refuses a program that does not fit its HBM; XLA:GPU does not
check, so its ``fits`` compares ``memory_analysis`` with the spec's HBM capacity).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field

from ..capture.targets import spec_target_mismatch  # noqa: F401  (re-exported by plans)
from ..errors import Unmodeled
from .plan import MAX_SIMULATED_DEVICES, PRESETS, Plan, PlanError, check_plan_mesh, load_plan

DEFAULT_HARDWARE = "h100-sxm"


class PlanChildError(PlanError):
    """The child process that compiles the plans with more simulated devices failed; an exit
    status of 2 means it printed its own ``jaxmove: error:`` line (the CLI adds none)."""

    def __init__(self, returncode: int):
        super().__init__(f"the child process compiling the plans exited with {returncode}"
                         + (" (its error is above)" if returncode == 2 else ""))
        self.returncode = returncode


@dataclass
class CollectiveSummary:
    """One collective instruction of a plan's program (totals over one program run)."""

    name: str
    kind: str
    group_size: int
    executions: int
    wire_bytes: int
    time_s: float | None
    source: str | None


@dataclass
class PlanResult:
    """One plan, per device, per program run.

    Memory fields are XLA:CPU's ``memory_analysis`` of the partitioned program;
    ``peak_bytes`` is ``capture.program.memory_analysis_peak_bytes``: arguments + outputs -
    aliased + temporaries (all live at once), or XLA's ``peak_memory_in_bytes`` where that is
    larger; never below the compiler's own peak; on XLA:TPU its ``peak_memory_in_bytes``
    alone (its temp size is no HBM figure to add).
    ``collective_time_s`` sums every collective's time, the one the step time uses
    (passes/timing.py: NCCL's model on GPU specs, passes/collectives.py otherwise), with no
    overlap with compute assumed; None when the spec lacks interconnect numbers.

    Step time (passes/timing.py ``estimate_times`` on the spec, the per-device program's
    schedule with its async overlap): ``step_time_s``, and the summed components over its
    kernels ``step_compute_s``, ``step_memory_s``, ``step_network_s`` (collectives; on GPU
    specs NCCL's model, hardware/nccl.py), ``step_launch_s`` (launch gaps + the GPU GEMM
    model's fixed cost), ``step_bound`` (the largest); ``step_time_complete`` False when some
    instruction's time is unmodeled (the step time is then a lower bound). None without a
    time estimate.
    ``collectives_note``: what the partitioner did when the program's collectives are not
    those the plan implies (``plan_collective_note``), else None. ``plan_source``: ``preset``
    or the TOML file the plan was read from.
    """

    plan: str
    description: str
    num_devices: int
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    temp_bytes: int | None = None
    xla_peak_bytes: int | None = None  # XLA's own peak_memory_in_bytes (None where not reported)
    peak_bytes: int | None = None
    fits: bool | None = None
    hbm_bytes: int = 0
    flops: int = 0
    wire_bytes: int = 0
    # per device, {role: read + write HBM bytes} for every role of vocab.ROLES (as a sweep row)
    hbm_bytes_by_role: dict[str, int] = field(default_factory=dict)
    wire_bytes_by_kind: dict[str, int] = field(default_factory=dict)
    collective_time_s: float | None = None
    top_collectives: list[CollectiveSummary] = field(default_factory=list)
    shardings: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    compile_s: float = 0.0
    # bytes beyond the compulsory minimum (passes/excess.py) and their share of all bytes moved
    excess_bytes: int | None = None
    excess_fraction: float | None = None
    # the target compiler refused the plan for lack of memory: its figures (fits is False)
    does_not_fit: str | None = None
    needs_bytes: int | None = None
    has_bytes: int | None = None
    # estimated step time on the spec (passes/timing.py) and its components, seconds
    step_time_s: float | None = None
    step_compute_s: float | None = None
    step_memory_s: float | None = None
    step_network_s: float | None = None
    step_launch_s: float | None = None
    step_bound: str | None = None
    # where the plan came from: "preset" or its TOML file (a file may be named like a preset)
    plan_source: str = "preset"
    step_time_complete: bool | None = None
    collectives_note: str | None = None

    @classmethod
    def from_json(cls, d: dict) -> "PlanResult":
        """From ``asdict``'s JSON; keys this version does not know are left out (JSON keys are
        only ever added: a newer jaxmove's child process may send more)."""
        from dataclasses import fields
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["top_collectives"] = [CollectiveSummary(**c) for c in d.get("top_collectives", [])]
        return cls(**d)


@dataclass
class PlanComparison:
    """Every plan's result for one model and mesh, on one hardware spec."""

    model: str
    overrides: dict[str, str]
    mesh: dict[str, int]
    hardware: str
    hbm_capacity_bytes: int
    results: list[PlanResult]
    target: str = "cpu"
    notes: list[str] = field(default_factory=list)
    #: TPU/GPU targets: {"dir": the compile cache directory or None (off), "reused": compiles
    #: read from it, "compiled": compiles run} (capture/compile_cache.py); None for cpu
    compile_cache: dict | None = None

    def to_json(self) -> dict:
        return {"model": self.model, "overrides": dict(self.overrides), "mesh": dict(self.mesh),
                "hardware": self.hardware, "hbm_capacity_bytes": self.hbm_capacity_bytes,
                "target": self.target, "notes": list(self.notes),
                "plans": [asdict(r) for r in self.results], "compile_cache": self.compile_cache}

    @classmethod
    def from_json(cls, d: dict) -> "PlanComparison":
        return cls(d["model"], d["overrides"], d["mesh"], d["hardware"], d["hbm_capacity_bytes"],
                   [PlanResult.from_json(r) for r in d["plans"]], d.get("target", "cpu"),
                   list(d.get("notes", [])), d.get("compile_cache"))


# ---- shardings --------------------------------------------------------------------------

#: the words of the note that a plan shards nothing over its mesh (sweep/render.py prints it)
SHARDS_NOTHING = "shards no argument or result"


def make_mesh(mesh_shape: dict[str, int], target=None):
    """A ``jax.sharding.Mesh`` of the first prod(sizes) devices, row-major: CPU devices, or
    the compile-only devices of ``target`` (a name or ``Target``; capture/targets.py).

    Raises:
      PlanError: too few CPU devices in this process.
      TargetNameError: a mesh larger than the target's topology (names both).
    """
    import jax
    import numpy as np

    from ..capture.targets import Target

    t = Target.parse(target)
    if t.platform != "cpu":
        return t.mesh(mesh_shape)
    n = math.prod(mesh_shape.values())
    devices = jax.devices("cpu")
    if len(devices) < n:
        raise PlanError(f"mesh {mesh_shape} needs {n} devices but jax has {len(devices)} CPU devices "
                        "(set XLA_FLAGS=--xla_force_host_platform_device_count before jax starts)")
    return jax.sharding.Mesh(np.array(devices[:n]).reshape(tuple(mesh_shape.values())),
                             tuple(mesh_shape))


def _spec_text(spec: tuple) -> str:
    return "P(" + ", ".join("None" if s is None else repr(s) for s in spec) + ")"


#: Roles laid out by a plan's parameter rules: the weights, and the optimizer state shaped
#: like them (ZeRO shards both: Rajbhandari et al. 2020).
PARAM_ROLES = frozenset({"weights", "optimizer_state"})


def _nnx_param_roles(arg, n: int) -> list:
    """``weights`` for each leaf of ``arg`` held by a Flax ``nnx.Param``, else None."""
    import jax

    try:
        from flax import nnx
    except ImportError:  # pragma: no cover
        return [None] * n
    out: list = []
    for item in jax.tree_util.tree_leaves(arg, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        k = len(jax.tree_util.tree_leaves(item)) if isinstance(item, nnx.Variable) else 1
        out.extend(["weights" if isinstance(item, nnx.Param) else None] * k)
    return out if len(out) == n else [None] * n


def _out_roles(workload, treedef, n: int) -> list:
    """One role (or None) per output leaf from ``workload.out_roles``
    (``capture.workload.flatten_out_roles``)."""
    from ..capture.workload import flatten_out_roles

    try:
        return flatten_out_roles(workload.out_roles, treedef, n, f"workload {workload.name!r}")
    except ValueError as e:
        raise PlanError(str(e)) from None


def workload_shardings(workload, plan: Plan, mesh, notes: list[str], param_axes: set | None = None,
                       param_leaves: list | None = None):
    """(in_shardings, out_shardings or None, {path: spec text}) of a workload under a plan;
    ``param_axes`` (when given) receives the mesh axes some parameter leaf is sharded over,
    ``param_leaves`` (when given) ``(role, PartitionSpec entries, whole bytes)`` of each
    parameter leaf some mesh axis shards.

    Raises:
      PlanError: the workload has no logical axes.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from ..capture.workload import with_module_axes
    from .plan import LOGICAL_AXES

    workload = with_module_axes(workload)
    if workload.logical_axes is None:
        raise PlanError(f"workload {workload.name!r} names no logical axes; plans need them "
                        "(Workload.logical_axes, or Flax NNX variables with sharding metadata, "
                        "nnx.with_partitioning / nnx.Param(..., sharding=...), passed as an "
                        "nnx.State or module argument)")
    mesh_shape = dict(mesh.shape)
    specs: dict[str, str] = {}

    def named(leaf, axes, role, path, argument=True):
        is_param = role in PARAM_ROLES
        def known(a):   # (a tuple names a merged dimension: plan.py, step 4)
            return all(n in LOGICAL_AXES for n in a) if isinstance(a, (tuple, list)) else a in LOGICAL_AXES

        # (a string is one name, not one per dimension: partition_spec refuses it by name)
        unknown = [] if isinstance(axes, str) else [a for a in (axes or ()) if a is not None and not known(a)]
        if unknown:
            notes.append(f"logical axis {unknown[0]!r} is not one plans map ({', '.join(LOGICAL_AXES)}): "
                         "that dimension stays replicated")
            axes = tuple(a if known(a) else None for a in axes)
        spec = plan.partition_spec(axes, leaf.shape, mesh_shape, is_param, notes, path)
        if any(s is not None for s in spec):
            specs[path] = _spec_text(spec)
            if is_param and argument and param_axes is not None:
                for s in spec:
                    if s is not None:
                        param_axes.update((s,) if isinstance(s, str) else s)
            if is_param and argument and param_leaves is not None:
                from ..capture.program import _leaf_byte_size   # (in bits: int4 is half a byte)
                nbytes = _leaf_byte_size(leaf.shape, leaf.dtype)
                param_leaves.append((role, tuple(spec), nbytes))
        return NamedSharding(mesh, PartitionSpec(*spec))

    roles = workload.roles
    in_sh = []
    for i, arg in enumerate(workload.args):
        axes = workload.logical_axes[i]
        role = roles[i] if isinstance(roles, (tuple, list)) else roles
        flat, treedef = jax.tree_util.tree_flatten_with_path(arg)
        axes_flat = treedef.flatten_up_to(axes) if axes is not None else [None] * len(flat)
        roles_flat = ([role] * len(flat) if isinstance(role, str) or role is None
                      else treedef.flatten_up_to(role))
        if role is None:  # no roles given: an NNX Param is a parameter (capture/program.py's rule)
            roles_flat = _nnx_param_roles(arg, len(flat))
        leaves = [named(leaf, ax, r, f"arg{i}{jax.tree_util.keystr(kp)}")
                  for (kp, leaf), ax, r in zip(flat, axes_flat, roles_flat)]
        in_sh.append(jax.tree_util.tree_unflatten(treedef, leaves))
    out_sh = None
    if workload.out_logical_axes is not None:
        out = jax.eval_shape(workload.fn, *workload.args)
        flat, treedef = jax.tree_util.tree_flatten_with_path(out)
        axes_flat = treedef.flatten_up_to(workload.out_logical_axes)
        out_roles = _out_roles(workload, treedef, len(flat))
        out_sh = jax.tree_util.tree_unflatten(treedef, [
            named(leaf, ax, r, f"out{jax.tree_util.keystr(kp)}", argument=False)
            for (kp, leaf), ax, r in zip(flat, axes_flat, out_roles)])
    return tuple(in_sh), out_sh, specs


def check_workload_axes(workload) -> None:
    """Refuse, before any plan compiles, logical axes that would fail every plan the same way:
    none at all, not one entry per argument, an argument's axes not shaped like the argument,
    a leaf's axes not one entry per dimension (``Plan.partition_spec``'s checks, with no rules).
    Only the arguments are checked (the outputs' axes need a trace: ``workload_shardings``).

    Raises:
      PlanError: what is wrong, naming the argument leaf as the plans' errors do (``arg0['w']``).
    """
    import jax

    from ..capture.workload import with_module_axes
    from .plan import LOGICAL_AXES

    workload = with_module_axes(workload)
    axes_all = workload.logical_axes
    if axes_all is None:
        raise PlanError(f"workload {workload.name!r} names no logical axes; plans need them "
                        "(Workload.logical_axes, or Flax NNX variables with sharding metadata, "
                        "nnx.with_partitioning / nnx.Param(..., sharding=...), passed as an "
                        "nnx.State or module argument)")
    if not isinstance(axes_all, (tuple, list)) or len(axes_all) != len(workload.args):
        got = f"{len(axes_all)} entries" if isinstance(axes_all, (tuple, list)) else repr(axes_all)
        raise PlanError(f"workload {workload.name!r}: logical_axes is {got} for {len(workload.args)} "
                        "argument(s); expected one entry per argument (None for one no rule shards)")
    probe = Plan("check", "")

    def known(a):
        return all(n in LOGICAL_AXES for n in a) if isinstance(a, (tuple, list)) else a in LOGICAL_AXES

    for i, (arg, axes) in enumerate(zip(workload.args, axes_all)):
        flat, treedef = jax.tree_util.tree_flatten_with_path(arg)
        try:
            axes_flat = treedef.flatten_up_to(axes) if axes is not None else [None] * len(flat)
        except (ValueError, TypeError) as e:
            why = str(e).splitlines()[0] if str(e) else repr(e)
            raise PlanError(f"workload {workload.name!r}: arg{i}: its logical axes are not shaped "
                            f"like the argument (one tuple of names per array): {why}") from None
        for (kp, leaf), ax in zip(flat, axes_flat):
            path = f"arg{i}{jax.tree_util.keystr(kp)}"
            if not (ax is None or isinstance(ax, (str, tuple, list))):
                raise PlanError(f"workload {workload.name!r}: {path}: logical axes {ax!r}; expected a "
                                "tuple of one entry per dimension (a name, None or a tuple of names)")
            if isinstance(ax, (tuple, list)):  # (names plans do not map: replicated, with a note)
                ax = tuple(a if known(a) else None for a in ax)
            shape = getattr(leaf, "shape", None)
            if shape is not None:
                try:
                    probe.partition_spec(ax, tuple(shape), {}, False, None, path)
                except PlanError as e:
                    raise PlanError(f"workload {workload.name!r}: {e}") from None


def load_workload(model, overrides: dict[str, str] | None = None):
    """The Workload ``plans`` partitions: a zoo preset name, a ``module:function`` /
    ``file.py:function`` returning a Workload with logical axes, or a Workload.

    Raises:
      PlanError: an unknown preset name (no ``:``), ``--set`` for a non-preset, a
        module:function that returns no Workload.
      TargetError, UserCodeError: see ``capture.resolve.load_target``.
    """
    from jaxmove import zoo as models

    from ..capture.workload import Workload

    from ..capture.workload import with_module_axes

    if isinstance(model, Workload):
        return with_module_axes(model)
    s = str(model)
    if s in models.PRESETS:
        return models.build(s, overrides or {})
    if ":" not in s:
        from ..capture.resolve import TargetError, check_plan_target
        try:
            check_plan_target(s)  # an HLO file, or an unknown name (the presets listed, capped)
        except TargetError as e:
            raise PlanError(str(e)) from None
    if overrides:
        raise PlanError(f"--set applies to zoo presets only, not to '{s}'")
    from ..capture.resolve import load_target
    made = load_target(s)
    if not isinstance(made, Workload):
        raise PlanError(f"{s} returned a {type(made).__name__}; sharding plans need a "
                        "jaxmove.workload.Workload with logical_axes (a compiled stage is already "
                        "partitioned)")
    return with_module_axes(made)


def capture_with_plan(preset, overrides: dict[str, str] | None, plan: Plan,
                      mesh_shape: dict[str, int], notes: list[str] | None = None,
                      specs: dict[str, str] | None = None, target=None, weight_layouts: str | None = None,
                      param_axes: set | None = None, param_leaves: list | None = None):
    """Capture ``preset`` (a zoo preset, ``module:function`` or Workload; ``load_workload``)
    partitioned by ``plan`` over ``mesh_shape``.

    Target ``cpu`` (default) needs prod(mesh sizes) CPU devices in this process (see
    ``devices.ensure_cpu_devices``); an accelerator target builds the mesh from its
    compile-only devices. Returns the ``Program`` (its HLO is the per-device SPMD program);
    ``notes`` receives dropped rules, ``specs`` the PartitionSpec of every sharded argument /
    output leaf, ``param_axes`` the mesh axes some parameter leaf is sharded over,
    ``param_leaves`` the sharded parameter leaves (``workload_shardings``). ``weight_layouts``: as ``capture`` (``auto``: XLA picks the weights' layouts).
    Raises:
      PlanError, KeyError (unknown preset), ValueError (bad override), CaptureError,
      TargetNameError (mesh larger than the topology), DoesNotFitError (the target compiler
      ran out of device memory).
    """
    from jaxmove.zoo.sharding import logical_sharding

    from ..capture import capture
    from jax.sharding import NamedSharding, PartitionSpec

    notes = [] if notes is None else notes
    check_plan_mesh(plan, mesh_shape)
    mesh = make_mesh(mesh_shape, target)
    workload = load_workload(preset, overrides)
    # jax caches traces by function: a fresh wrapper per plan, so no plan reuses a trace made
    # under another plan's ``constrain`` resolver (functools.wraps keeps the argument names)
    fn = workload.fn
    workload = dataclasses.replace(workload, fn=functools.wraps(fn)(lambda *a, **k: fn(*a, **k)))

    def resolver(axes, shape):
        spec = plan.partition_spec(axes, shape, dict(mesh.shape), False, notes, "intermediate")
        return NamedSharding(mesh, PartitionSpec(*spec))

    # workload_shardings traces workload.fn (jax.eval_shape) and jax caches that trace for
    # the jit below: both must run under the resolver, or the cached trace has no
    # sharding constraints and every ``constrain`` in the model is silently dropped.
    with logical_sharding(resolver):
        in_sh, out_sh, leaf_specs = workload_shardings(workload, plan, mesh, notes, param_axes, param_leaves)
        if specs is not None:
            specs.update(leaf_specs)
        if not leaf_specs and math.prod(mesh_shape.values()) > 1:
            mesh_text = ",".join(f"{a}={n}" for a, n in mesh_shape.items())
            notes.append(f"plan {plan.name} {SHARDS_NOTHING} over mesh {mesh_text} (none of "
                         "its rules maps a dimension to these mesh axes, or none divides): every device "
                         "holds and computes the whole program, with no collectives")
        return capture(workload, in_shardings=in_sh, out_shardings=out_sh, target=target,
                       weight_layouts=weight_layouts)


# ---- one plan -----------------------------------------------------------------------------

def _source(report, row) -> str | None:
    module = report.module
    loc = module.source_location(row.instr)
    if loc is None and row.instr.opcode == "fusion" and row.collective is not None:
        for cname in row.instr.called_computations:
            inner = module.computations[cname].by_name.get(row.collective.instruction)
            if inner is not None:
                loc = module.source_location(inner)
                break
    return f"{loc.file}:{loc.line}" if loc else None


def summarize(report, plan: Plan, spec, num_devices: int, memory_stats: dict[str, int],
              platform: str = "cpu", mesh_shape: dict[str, int] | None = None,
              param_axes: set | None = None, param_leaves: list | None = None) -> PlanResult:
    """A PlanResult from ``report = analyze(program, hardware=spec)`` of a plan's partitioned
    program: its step time and excess are the report's (on ``spec``), not computed again.

    ``fits``: on a TPU target the compiler's verdict (it compiled, so it fits; a refusal is
    ``run_plan``'s DoesNotFitError) unless the user overrode ``hbm_capacity_bytes`` (``--spec``:
    the compiler checked its own chip's); elsewhere ``peak_bytes <= spec.hbm_capacity_bytes``,
    and a plan that does not fit gets those two figures as ``needs_bytes`` / ``has_bytes`` (a
    note says where each comes from); a program compiled for another kind of device than the
    spec's (XLA:CPU's, costed on h100-sxm) fits when its arguments + outputs - aliased do (its
    temporaries are not the spec's device's); without ``memory_analysis`` ``fits`` is None and a note says why
    both are null.

    Raises:
      ValueError: ``report`` has no times (it was analysed without a hardware spec).
    """
    from ..passes.collectives import collective_time_s

    if report.times is None or report.excess is None:
        raise ValueError("summarize needs analyze(program, hardware=spec)'s report (it has no times)")

    res = PlanResult(plan.name, plan.description, num_devices, plan_source=plan.source)
    ms = memory_stats
    if ms:
        res.argument_bytes = ms.get("argument_size_in_bytes")
        res.output_bytes = ms.get("output_size_in_bytes")
        res.alias_bytes = ms.get("alias_size_in_bytes", 0)
        res.temp_bytes = ms.get("temp_size_in_bytes")
        res.xla_peak_bytes = ms.get("peak_memory_in_bytes")
        from ..capture.program import memory_analysis_peak_bytes
        res.peak_bytes = memory_analysis_peak_bytes(ms, platform)
    from ..hardware.overrides import capacity_overridden
    if platform == "tpu" and not capacity_overridden(spec):
        res.fits = True  # XLA:TPU checks device memory and refuses what does not fit
    elif res.peak_bytes is not None and platform != spec.kind:
        # XLA:CPU's temporaries are no accelerator's (f32 copies of bf16 weights): arguments +
        # outputs - aliased decide (api.does_not_fit_note's rule)
        from ..capture.program import memory_analysis_peak_bytes, without_temporaries
        need = memory_analysis_peak_bytes(without_temporaries(ms, platform), platform)
        res.fits = need <= spec.hbm_capacity_bytes
        res.notes.append(f"fits judged by arguments + outputs - aliased ({need:,} B per device): the "
                         f"program is XLA:{platform.upper()}'s, whose temporaries are not {spec.name}'s "
                         f"(compile with --target for its own)")
        if not res.fits:
            from ..api import capacity_source
            res.needs_bytes, res.has_bytes = int(need), int(spec.hbm_capacity_bytes)
            res.notes.append(f"does not fit: arguments + outputs - aliased take {res.needs_bytes:,} B "
                             f"per device, has {capacity_source(spec)}")
    elif res.peak_bytes is not None:  # (on TPU too when the user gave another capacity: the
        # compiler checked its own chip's)
        res.fits = res.peak_bytes <= spec.hbm_capacity_bytes
        if not res.fits:  # the verdict's own figures (a compiler's refusal gives its: run_plan)
            from ..api import capacity_source
            res.needs_bytes, res.has_bytes = int(res.peak_bytes), int(spec.hbm_capacity_bytes)
            how = ("its own peak_memory_in_bytes" if platform == "tpu" and res.xla_peak_bytes else
                   "arguments + outputs - aliased + temporaries, or its own peak where larger")
            res.notes.append(f"does not fit: needs {res.needs_bytes:,} B per device (XLA:{platform.upper()} "
                             f"memory_analysis: {how}), has {capacity_source(spec)}")
    else:  # no verdict, so no figures for needs_bytes / has_bytes
        res.notes.append(f"fits unknown: XLA:{platform.upper()} gave no memory_analysis for this program, "
                         "so needs_bytes / has_bytes are null")
    t = report.totals
    res.hbm_bytes, res.flops, res.wire_bytes = t.hbm_bytes, t.flops, t.device_to_device_bytes
    from ..vocab import ROLES
    res.hbm_bytes_by_role = {r: sum(t.role_bytes(r)) for r in ROLES}
    te = report.times
    colls = []
    total_time: float | None = 0.0
    for row in report.rows:
        c = row.collective
        if c is None:
            continue
        k = row.multiplicity.count
        res.wire_bytes_by_kind[c.kind] = res.wire_bytes_by_kind.get(c.kind, 0) + c.wire_bytes * k
        tr = te.rows.get((row.computation, row.instr.name))
        if tr is not None and "network time unmodeled" not in " ".join(tr.unmodeled):
            ts = tr.network_time_s  # the step time's figure (GPU specs: NCCL's model), per run
        else:
            try:
                ts = collective_time_s(c, spec)
            except Unmodeled:
                ts = None
            ts = None if ts is None else ts * k
        total_time = None if (total_time is None or ts is None) else total_time + ts
        colls.append(CollectiveSummary(row.instr.name, c.kind, c.group_size, k, c.wire_bytes * k, ts,
                                       _source(report, row)))
    res.collective_time_s = total_time
    if total_time is None:
        res.notes.append(f"{spec.name} lacks interconnect bandwidth or latency: no collective time")
    colls.sort(key=lambda s: (s.time_s or 0.0, s.wire_bytes), reverse=True)
    res.top_collectives = colls[:3]
    ex = report.excess
    res.excess_bytes, res.excess_fraction = ex.excess_bytes, ex.excess_fraction
    res.step_time_s, res.step_bound = te.est_time_s, te.bound
    res.step_compute_s, res.step_memory_s = te.compute_time_s, te.memory_time_s
    res.step_network_s, res.step_launch_s = te.network_time_s, te.overhead_s + te.dispatch_overhead_s
    res.step_time_complete = not te.unmodeled and not any(
        m.unknown_trip_count for m in report.analysis.multiplicity.values())
    if mesh_shape is not None:
        from .explain import plan_collective_note
        res.collectives_note = plan_collective_note(plan, report, mesh_shape, param_axes, param_leaves)
        if res.collectives_note:
            res.notes.append(res.collectives_note)
    if te.unmodeled:
        res.notes.append(f"step time is a lower bound: {len(te.unmodeled)} instruction time(s) unmodeled, "
                         f"e.g. {te.unmodeled[0]}")
    return res


def step_time_order(results: list[PlanResult]) -> list[PlanResult]:
    """``results`` ranked for the table: plans that fit (or may fit) by estimated step time,
    fastest first (those without one after them), then plans that do not fit, then failures;
    ties keep their order."""
    def key(r: PlanResult):
        group = 2 if r.error else 1 if r.fits is False else 0
        return (group, r.step_time_s is None, r.step_time_s or 0.0)
    return sorted(results, key=key)


def run_plan(preset, overrides: dict[str, str] | None, plan: Plan, mesh_shape: dict[str, int],
             spec, target=None) -> PlanResult:
    """Compile and analyse one plan (in this process; devices must be available).

    A plan the target compiler refuses for lack of device memory is a result, not an error:
    ``fits`` False with the compiler's ``needs_bytes`` / ``has_bytes``; one that fails to
    compile is a result with ``error`` set.

    Raises:
      XlaOptionError, MissingExtraError: not the plan's fault (an ``--xla-option`` the compiler
        refuses, a missing compiler plugin): every plan would fail the same way.
    """
    from ..api import analyze
    from ..capture.targets import DoesNotFitError, MissingExtraError, Target, XlaOptionError

    t0 = time.perf_counter()
    notes: list[str] = []
    specs: dict[str, str] = {}
    param_axes: set = set()
    param_leaves: list = []
    n = math.prod(mesh_shape.values())
    try:
        program = capture_with_plan(preset, overrides, plan, mesh_shape, notes, specs, target,
                                    param_axes=param_axes, param_leaves=param_leaves)
        report = analyze(program, hardware=spec)  # (its times and excess are the plan's: summarize)
    except DoesNotFitError as e:
        res = PlanResult(plan.name, plan.description, n, fits=False, does_not_fit=e.compiler_message,
                         needs_bytes=e.needs_bytes, has_bytes=e.has_bytes, plan_source=plan.source)
        res.notes = _count_notes(notes) + [str(e)]
        res.shardings = specs
        res.compile_s = time.perf_counter() - t0
        return res
    except (XlaOptionError, MissingExtraError):
        raise  # not the plan's: every plan would fail the same way (compare_plans: no table)
    except (PlanError, ValueError, KeyError, NotImplementedError) as e:  # CaptureError is a ValueError;
        # NotImplementedError: what jax raises for what it cannot partition (a failed row, ranked last)
        res = PlanResult(plan.name, plan.description, n, error=f"{type(e).__name__}: {e}",
                         plan_source=plan.source)
        res.compile_s = time.perf_counter() - t0
        return res
    res = summarize(report, plan, spec, n, dict(program.memory_stats), Target.parse(target).platform,
                    mesh_shape, param_axes, param_leaves)
    res.notes = _count_notes(notes) + res.notes
    res.shardings = specs
    res.compile_s = time.perf_counter() - t0
    return res


def _count_notes(notes: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    for n in notes:
        counts[n] = counts.get(n, 0) + 1
    return [n if k == 1 else f"{n} ({k} tensors)" for n, k in counts.items()]


# ---- many plans -----------------------------------------------------------------------------

def default_jobs(num_plans: int) -> int:
    """Processes ``compare_plans`` compiles ``num_plans`` plans in by default: 1 (serial) on a
    machine with 2 CPUs or fewer, else min(plans, CPUs // 2, 4) (a compile uses more than one
    core at times, and a GPT-2-sized compile holds about 1.5 GiB: benchmarks/targets.md)."""
    import os
    cpus = os.cpu_count() or 1
    return 1 if cpus <= 2 else max(1, min(num_plans, cpus // 2, 4))


def _run_plan_job(model: str, overrides, plan: Plan, mesh_shape, spec, target) -> tuple:
    """One plan in a worker process (``compare_plans(jobs=N)``): the workload is built there.
    Returns (PlanResult, compile cache hits, misses) of the job."""
    from ..capture.compile_cache import cache_stats
    before = cache_stats()
    res = run_plan(load_workload(model, overrides), overrides, plan, mesh_shape, spec, target)
    after = cache_stats()
    return res, after["hits"] - before["hits"], after["compiles"] - before["compiles"]


def _run_parallel(model: str, overrides, loaded: list[Plan], mesh_shape, spec, target: str, jobs: int,
                  advance) -> tuple[list[PlanResult], int, int]:
    """``run_plan`` of each plan in ``jobs`` spawned processes: (results in ``loaded``'s order,
    compile cache hits, misses); ``advance(plan_name)`` as each finishes.

    Raises:
      PlanError: a worker process died (killed, out of memory): names the plan and --jobs 1.
      whatever run_plan raises in a worker (re-raised here).
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    out: list[PlanResult | None] = [None] * len(loaded)
    hits = misses = 0
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_run_plan_job, model, overrides, p, mesh_shape, spec, target): i
                   for i, p in enumerate(loaded)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                out[i], h, m = fut.result()
                hits, misses = hits + h, misses + m
            except BrokenProcessPool:
                raise PlanError(f"the worker process compiling plan {loaded[i].name} died (killed or "
                                "out of memory?); rerun with --jobs 1") from None
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)  # (an --xla-option error: no more plans)
                raise
            advance(loaded[i].name)
    return [r for r in out if r is not None], hits, misses


def compare_plans(model, mesh_shape: dict[str, int] | None, plans: list[str | Plan] | None = None,
                  overrides: dict[str, str] | None = None, hardware=None,
                  progress: bool = False, target=None, jobs: int | None = None) -> PlanComparison:
    """Compile ``model`` under each plan and compare them per device.

    Args:
      model: a zoo preset name (``models.PRESETS``), ``module:function`` returning a
        Workload with logical axes, or such a Workload (``load_workload``).
      mesh_shape: mesh axis name -> size, e.g. {"data": 2, "model": 4}; None with a target:
        every device of its topology (``Target.default_mesh``).
      plans: preset names, TOML paths or Plans (default: dp, fsdp, tp, fsdp_tp, and ep when
        the model has an ``expert`` axis).
      overrides: ``--set`` values for the preset.
      hardware: spec name, path or HardwareSpec (e.g. one with ``--spec`` overrides,
        hardware/overrides.py) for capacity and time (default: the target's spec, h100-sxm
        for the cpu target).
      progress: show a rich progress bar on stderr.
      target: compile target (capture/targets.py): None / ``cpu`` (simulated CPU devices),
        ``tpu-v5e:2x4``, ``h100-sxm:1x1x8``...: the mesh is made of its devices.
      jobs: processes to compile the plans in (None: ``default_jobs``, serial on 2 CPUs); used
        for a TPU/GPU target and a model given by name (the cpu target and a Workload object
        compile in this process, one plan after the other).
    Returns:
      A PlanComparison, its plans ranked by estimated step time (``step_time_order``: those
      that fit first, fastest first); a plan that fails to compile has ``error`` set (never
      dropped); a plan the target compiler refuses for lack of memory has ``fits`` False.
      On the cpu target, when this process's jax already has fewer CPU devices than the mesh
      needs, the work runs in a child process with
      ``XLA_FLAGS=--xla_force_host_platform_device_count=N``.
    Raises:
      PlanError (bad mesh or plan, unknown preset), HardwareSpecError, TargetNameError (bad
      target, mesh larger than its topology), MissingExtraError.
    """
    from ..capture.targets import Target, target_notes
    from ..capture.workload import Workload
    from ..hardware import HardwareSpec, load_spec
    from .devices import ensure_cpu_devices, in_devices_child, run_cli_with_devices

    tgt = Target.parse(target)
    if mesh_shape is None:
        if tgt.platform == "cpu":
            raise PlanError("--mesh is needed for the cpu target (e.g. --mesh data=2,model=4); with "
                            "--target the default mesh covers the target's devices")
        mesh_shape = tgt.default_mesh()
    workload = load_workload(model, overrides)
    check_workload_axes(workload)  # axes that fail every plan alike: one error, no table
    label = model if isinstance(model, str) else workload.name
    hardware = hardware or (tgt.spec_name if tgt.platform != "cpu" else DEFAULT_HARDWARE)
    spec = hardware if isinstance(hardware, HardwareSpec) else load_spec(hardware)
    mismatch = spec_target_mismatch(spec, tgt, "the plans")
    if mismatch:
        raise PlanError(mismatch)
    if tgt.platform == "tpu":  # the slice's chip grid: which ICI axes have wraparound links
        from ..hardware.overrides import with_slice_topology
        spec = with_slice_topology(spec, tgt.topology)
    loaded = [p if isinstance(p, Plan) else load_plan(p) for p in (plans or default_plans(workload))]
    seen: dict[str, Plan] = {}
    for p in loaded:  # the table names each plan: two of one name would compile twice or mislead
        first = seen.get(p.name)
        seen.setdefault(p.name, p)
        if first is not None:
            where = " and ".join(dict.fromkeys(q.source if q.source != "preset" else "preset"
                                               for q in (first, p)))
            raise PlanError(f"plan {p.name!r} is given twice ({where}): give each plan once; plans "
                            "from files are named by their `name =` (else the file name)")
    n = math.prod(mesh_shape.values())
    if tgt.platform == "cpu" and n > MAX_SIMULATED_DEVICES:
        raise PlanError(f"mesh {mesh_shape}: {n} devices; at most {MAX_SIMULATED_DEVICES} simulated "
                        "CPU devices are supported")
    for p in loaded:
        check_plan_mesh(p, mesh_shape)
    where = "simulated CPU devices" if tgt.platform == "cpu" else f"{tgt.name} devices"
    if tgt.platform != "cpu":
        tgt.mesh(mesh_shape)  # a mesh larger than the topology fails here, before any compile
    if progress and not in_devices_child():  # a child re-run: the parent said it
        print(f"jaxmove: compiling {label} under {len(loaded)} plan(s) on {n} {where}"
              + (" (starting the devices first)" if tgt.platform == "cpu" else ""),
              file=sys.stderr, flush=True)
    if tgt.platform == "cpu" and not ensure_cpu_devices(n):
        if any(p.source == "preset" and PRESETS.get(p.name) != p for p in loaded):
            raise PlanError("in-memory Plan objects cannot be sent to a subprocess; use presets or files")
        if isinstance(model, Workload):
            raise PlanError(f"a Workload object cannot be sent to a subprocess with {n} CPU devices; "
                            "pass its module:function name, or start jax with enough devices")
        spec_dir = None
        if isinstance(hardware, HardwareSpec):  # an overridden spec travels as a TOML file
            import tempfile
            from pathlib import Path
            from ..hardware import write_spec
            spec_dir = tempfile.mkdtemp(prefix="jaxmove-spec-")
            hardware = str(Path(spec_dir) / f"{spec.name}.toml")
            write_spec(spec, hardware)
        argv = ["plans", model, "--mesh", ",".join(f"{k}={v}" for k, v in mesh_shape.items()),
                "--hardware", hardware, "--json"]
        for p in loaded:
            argv += ["--plan", p.name if p.source == "preset" else p.source]
        for k, v in (overrides or {}).items():
            argv += ["--set", f"{k}={v}"]
        if not progress:
            argv.append("--no-progress")
        try:
            proc = run_cli_with_devices(n, argv, capture_stdout=True)
        finally:
            if spec_dir is not None:
                import shutil
                shutil.rmtree(spec_dir, ignore_errors=True)
        # (exit 1 with a table: a plan failed, cli/plans.py; the rows are the result)
        if proc.returncode not in (0, 1) or not proc.stdout.strip():
            raise PlanChildError(proc.returncode)
        return PlanComparison.from_json(json.loads(proc.stdout))
    source = workload  # built once; capture_with_plan traces a fresh wrapper of it per plan
    jobs = default_jobs(len(loaded)) if jobs is None else int(jobs)
    if jobs < 1:
        raise PlanError(f"jobs={jobs}: expected a number of processes >= 1")
    parallel = min(jobs, len(loaded)) > 1 and tgt.platform != "cpu" and isinstance(model, str)
    jobs = min(jobs, len(loaded)) if parallel else 1
    from ..capture.compile_cache import cache_dir, cache_stats
    before = cache_stats()
    worker_hits = worker_misses = 0
    results = []
    if progress:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(f"compiling {label} on {n} {where}", total=len(loaded))
            if parallel:
                done: list[str] = []
                bar.update(task, description=f"compiling {label} under {len(loaded)} plans in {jobs} "
                                             f"processes ({n} devices)")

                def advance(name: str) -> None:
                    done.append(name)
                    bar.update(task, advance=1, description=f"compiling {label} in {jobs} processes "
                                                            f"({n} devices): done {', '.join(done)}")
                results, worker_hits, worker_misses = _run_parallel(
                    model, overrides, loaded, mesh_shape, spec, tgt.name, jobs, advance)
            else:
                for p in loaded:
                    bar.update(task, description=f"compiling {label} under plan {p.name} ({n} devices)")
                    results.append(run_plan(source, overrides, p, mesh_shape, spec, tgt.name))
                    bar.advance(task)
    elif parallel:
        results, worker_hits, worker_misses = _run_parallel(
            model, overrides, loaded, mesh_shape, spec, tgt.name, jobs, lambda name: None)
    else:
        results = [run_plan(source, overrides, p, mesh_shape, spec, tgt.name) for p in loaded]
    cmp = PlanComparison(label, dict(overrides or {}), dict(mesh_shape), spec.name,
                         spec.hbm_capacity_bytes, step_time_order(results), tgt.name)
    cmp.notes = target_notes(tgt)
    from ..hardware.overrides import spec_notes
    # (the header names the spec; the figures are the user's file's / the overridden ones)
    cmp.notes.extend(spec_notes(spec))
    if tgt.platform == "cpu" and spec.kind != "cpu":
        from ..api import backend_mismatch_note
        try:
            as_target = f"--target {Target.parse(spec.name).name}"
        except Exception:  # noqa: BLE001 - a spec that names no target (a TOML file's)
            as_target = f"a {spec.kind.upper()} --target"
        cmp.notes.append(backend_mismatch_note("cpu", spec.name) + "; the collectives too are XLA:CPU's "
                         "(it can all-reduce bf16 values in f32, twice the bytes on the wire, and "
                         f"partition differently): compare the plans with {as_target} (compiled "
                         "without the device) for the accelerator's program")
    if tgt.platform != "cpu":
        after = cache_stats()
        root = cache_dir()
        cmp.compile_cache = {"dir": str(root) if root is not None else None,
                             "reused": after["hits"] - before["hits"] + worker_hits,
                             "compiled": after["compiles"] - before["compiles"] + worker_misses}
    return cmp


def default_plans(model, overrides: dict[str, str] | None = None) -> list[str]:
    """dp, fsdp, tp, fsdp_tp, plus ep for models with an ``expert`` logical axis (``model``:
    see ``load_workload``)."""
    import jax

    out = ["dp", "fsdp", "tp", "fsdp_tp"]
    wl = load_workload(model, overrides)
    # an axes tuple holds names (or None); the per-argument container is a tuple of pytrees
    def axes_tuple(x):
        return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)

    names = {a for t in jax.tree_util.tree_leaves(wl.logical_axes, is_leaf=axes_tuple)
             if isinstance(t, tuple) for a in t if isinstance(a, str)}
    if "expert" in names:
        out.append("ep")
    return out
