"""Run a program on the local device: inputs, warm-up, timed runs, a profiled run.

``measure(target)`` compiles the same program ``jaxmove analyze`` analyses (the HLO that
ran is kept in ``Measurement.program.hlo_text``), gives it random inputs of the right
shapes and dtypes, and returns wall times per run plus, from a ``jax.profiler`` trace,
the measured time of every instruction (``jaxmove.measure.profile``).

Donation: a donated argument's buffer is consumed by the run, so every run gets a fresh
device copy of each donated argument (``Array.copy()``), made before its timer starts.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..capture import Program, capture
from ..hlo import parse_module
from ..capture.workload import Workload
from ..errors import UsageError
from .profile import ProfileJoin, join_events, module_events, record_events

__all__ = ["Measurement", "Prepared", "measure", "prepare", "random_like", "time_runs"]


# ----------------------------------------------------------------------------- inputs

def random_like(tree, seed: int = 0):
    """Concrete arrays for every ``jax.ShapeDtypeStruct`` leaf of ``tree``.

    Floating leaves are N(0, 0.02^2) in their dtype; integer leaves are 0 (a valid index
    for any gather, slice or cache position); boolean leaves are False. Concrete array
    leaves are kept as they are.

    Raises:
      ValueError: a leaf of an unsupported dtype (complex, opaque key types...).
    """
    import jax
    import jax.numpy as jnp

    key = jax.random.key(seed)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    out = []
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            out.append(leaf)
            continue
        shape, dtype = tuple(leaf.shape), jnp.dtype(leaf.dtype)
        if jnp.issubdtype(dtype, jnp.floating):
            k = jax.random.fold_in(key, i)
            out.append((0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dtype))
        elif jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
            out.append(jnp.zeros(shape, dtype))
        else:
            raise UsageError(f"cannot make random inputs of dtype {dtype} (leaf {i})")
    return jax.tree_util.tree_unflatten(treedef, out)


@dataclass
class Prepared:
    """A compiled program ready to run.

    Attributes:
      program: the captured Program; ``hlo_text`` is the HLO of ``compiled``.
      compiled: the ``jax.stages.Compiled`` executable.
      args: its positional (non-static) arguments, concrete.
      donated: positions in ``args`` whose buffers the executable consumes.
      notes: what differs from a plain ``jaxmove analyze`` of the same target.
    """

    program: Program
    compiled: Any
    args: tuple
    donated: tuple[int, ...]
    notes: list[str]

    def fresh_args(self) -> tuple:
        """``args`` with a new device copy of every donated argument (blocks until ready)."""
        import jax

        if not self.donated:
            return self.args
        out = list(self.args)
        for i in self.donated:
            out[i] = jax.tree_util.tree_map(lambda x: x.copy(), self.args[i])
        jax.block_until_ready(out)
        return tuple(out)


def _from_workload(wl: Workload, seed: int, concrete: tuple | None) -> Prepared:
    import jax

    if concrete is None:
        if "preset" in wl.config:
            from jaxmove import zoo as models

            concrete = models.materialize(wl, seed)
        else:
            concrete = random_like(wl.args, seed)
    program = capture(wl)
    static = {i % len(concrete) for i in wl.static_argnums} if concrete else set()
    donate = {i % len(concrete) for i in wl.donate_argnums} if concrete else set()
    jitted = jax.jit(wl.fn, donate_argnums=wl.donate_argnums, static_argnums=wl.static_argnums)
    compiled = jitted.lower(*concrete).compile()
    dyn = [i for i in range(len(concrete)) if i not in static]
    notes = []
    text = compiled.as_text()
    if text != program.hlo_text:
        notes.append("the executable compiled for the run differs from the analysed one; "
                     "the HLO that ran is analysed")
        program = dataclasses.replace(program, hlo_text=text)
    return Prepared(program, compiled, tuple(concrete[i] for i in dyn),
                    tuple(j for j, i in enumerate(dyn) if i in donate), notes)


def _from_stage(stage, seed: int, name: str | None) -> Prepared:
    import jax

    compiled = stage.compile() if isinstance(stage, jax.stages.Lowered) else stage
    program = capture(compiled, name=name)
    infos = compiled.args_info[0]
    abstract = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), infos,
                                      is_leaf=lambda x: hasattr(x, "donated"))
    donated = tuple(i for i, arg in enumerate(infos)
                    if any(a.donated for a in jax.tree_util.tree_leaves(
                        arg, is_leaf=lambda x: hasattr(x, "donated"))))
    return Prepared(program, compiled, tuple(random_like(abstract, seed)), donated, [])


def prepare(target, *args, overrides: dict[str, str] | None = None, seed: int = 0,
            roles=None, donate_argnums=(), static_argnums=(), name=None) -> Prepared:
    """Compile TARGET and give it concrete inputs.

    Args:
      target: a zoo preset name (``models.materialize`` inputs: weights N(0, 0.02^2),
        valid token ids and cache positions), ``module:function`` / ``file.py:function``
        returning a Workload or a jax Lowered/Compiled, a Workload, a Lowered/Compiled,
        or a callable with ``args`` (arrays, or ``jax.ShapeDtypeStruct`` leaves that
        ``random_like`` fills).
      overrides: ``--set`` values for a zoo preset.
      seed: seed of the random inputs.
      roles, donate_argnums, static_argnums, name: as ``jaxmove.capture.capture``, for a
        callable target.

    Raises:
      TargetError: an HLO text dump or a Program (nothing to run), or an unknown name.
      FileNotFoundError: a path that does not exist.
    """
    import jax

    from ..capture.resolve import TargetError, load_target

    if isinstance(target, Program):
        raise TargetError(f"cannot run program '{target.name}': a captured Program holds HLO "
                          "text only; measure its preset, workload or function instead")
    if isinstance(target, (str, os.PathLike)):
        s = os.fspath(target)
        from jaxmove import zoo as models

        if s in models.PRESETS:
            return _from_workload(models.build(s, overrides or {}), seed, None)
        if overrides:
            raise TargetError(f"--set applies to zoo presets only, not to '{s}'")
        if ":" in s and not Path(s).exists():
            target = load_target(s)
        elif Path(s).exists() or os.sep in s or s.endswith((".hlo", ".txt")):
            if not Path(s).exists():
                raise FileNotFoundError(s)
            raise TargetError(f"{s}: an HLO text dump cannot be run (its inputs and executable "
                              "are not in it); measure a preset or module:function instead")
        else:
            from ..capture.resolve import did_you_mean, preset_choices
            raise TargetError(f"'{s}' is not a zoo preset{did_you_mean(s)} ({preset_choices()}) "
                              "or module:function")
    if isinstance(target, Workload):
        return _from_workload(target, seed, None)
    if isinstance(target, (jax.stages.Lowered, jax.stages.Compiled)):
        return _from_stage(target, seed, name)
    if callable(target):
        concrete = tuple(random_like(a, seed) for a in args)
        fname = name or getattr(target, "__name__", "fn")
        wl = Workload(fname, target, tuple(args), roles, tuple(donate_argnums), tuple(static_argnums))
        return _from_workload(wl, seed, concrete)
    raise TargetError(f"cannot run a {type(target).__name__}")


# ----------------------------------------------------------------------------- timing

def time_runs(prepared: Prepared, runs: int) -> list[float]:
    """Wall time of ``runs`` executions, seconds each: dispatch to results ready.

    Fresh copies of donated arguments are made before each timer starts.
    """
    import jax

    out_s = []
    for _ in range(runs):
        args = prepared.fresh_args()
        t0 = time.perf_counter()
        out = prepared.compiled(*args)
        jax.block_until_ready(out)
        out_s.append(time.perf_counter() - t0)
        del out
    return out_s


def profile_program(prepared: Prepared, runs: int, logdir: str | None = None) -> ProfileJoin:
    """Profile ``runs`` executions and join their events to the program's instructions.

    Donated arguments for every run are copied before the trace starts, so the copies'
    own programs stay out of it.
    """
    import jax

    argsets = [prepared.fresh_args() for _ in range(runs)]

    def body():
        for a in argsets:
            jax.block_until_ready(prepared.compiled(*a))

    events = record_events(body, logdir)
    module = parse_module(prepared.program.hlo_text, f"<{prepared.program.name}>")
    return join_events(module_events(events, module.name), module, expected_runs=runs)


# ----------------------------------------------------------------------------- result

def _quantile(xs: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default method 'linear')."""
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Measurement:
    """What one program did on the local device.

    Attributes:
      program: the Program that ran (its ``hlo_text`` is the executable's HLO).
      device_kind: ``jax.devices()[0].device_kind``; backend: ``jax.default_backend()``.
      warmup_runs: untimed runs before the timed ones.
      wall_times_s: wall time of each timed run (dispatch to outputs ready), seconds.
      profile: per-instruction times from the profiled runs (None when not profiled).
      notes: caveats (e.g. the executable differs from the analysed one).
    """

    program: Program
    device_kind: str
    backend: str
    warmup_runs: int
    wall_times_s: tuple[float, ...]
    profile: ProfileJoin | None
    notes: tuple[str, ...] = ()

    @property
    def wall_median_s(self) -> float:
        return statistics.median(self.wall_times_s)

    @property
    def wall_min_s(self) -> float:
        return min(self.wall_times_s)

    @property
    def wall_max_s(self) -> float:
        return max(self.wall_times_s)

    @property
    def wall_iqr_s(self) -> tuple[float, float]:
        """(25th, 75th) percentile of the wall times, seconds."""
        return _quantile(list(self.wall_times_s), 0.25), _quantile(list(self.wall_times_s), 0.75)

    @property
    def instructions(self):
        """``(computation, instruction name)`` -> InstructionTiming (empty when unprofiled)."""
        return self.profile.instructions if self.profile else {}

    @property
    def coverage(self) -> float | None:
        """Fraction of measured device time joined to instructions (None when unprofiled)."""
        return self.profile.coverage if self.profile else None

    def to_json(self) -> dict:
        p = self.profile
        p25, p75 = self.wall_iqr_s
        out = {
            "program": {"name": self.program.name, "source": self.program.source},
            "device_kind": self.device_kind, "backend": self.backend,
            "warmup_runs": self.warmup_runs,
            "wall": {"runs": len(self.wall_times_s), "median_s": self.wall_median_s,
                     "min_s": self.wall_min_s, "max_s": self.wall_max_s, "p25_s": p25, "p75_s": p75,
                     "times_s": list(self.wall_times_s)},
            "notes": list(self.notes),
        }
        if p is not None:
            out["profile"] = {
                "module": p.module_name, "runs": p.runs, "device_time_s": p.device_time_s,
                "joined_time_s": p.joined_time_s, "coverage": p.coverage,
                "unjoined_s": dict(p.unjoined_s), "span_s": p.span_s, "busy_s": p.busy_s,
                "instructions": [
                    {"computation": t.computation, "name": t.name, "opcode": t.opcode,
                     "time_s": t.time_s, "executions": t.executions}
                    for t in sorted(p.instructions.values(), key=lambda t: -t.time_s)],
            }
        return out


def measure(target, *args, runs: int = 10, warmup: int = 2, profile_runs: int = 3,
            overrides: dict[str, str] | None = None, seed: int = 0, logdir: str | None = None,
            prepared: Prepared | None = None, **capture_kwargs) -> Measurement:
    """Run TARGET on the local device and measure it.

    Args:
      target, args, overrides, seed, capture_kwargs: see ``prepare``.
      runs: timed runs (wall time each); at least 1.
      warmup: untimed runs first (compilation caches, allocator, thread pool).
      profile_runs: runs recorded under ``jax.profiler`` (0: no per-instruction times).
      logdir: keep the profile there (default: a temporary directory, removed).
      prepared: an already prepared program (then target/args are ignored).

    Returns:
      A Measurement: wall times and per-instruction times per program run, seconds.

    Raises:
      ValueError: runs < 1 or warmup / profile_runs < 0.
      TargetError, FileNotFoundError: see ``prepare``.
      ProfileError: the profile holds no events of the program.
    """
    import jax

    if runs < 1 or warmup < 0 or profile_runs < 0:
        raise UsageError(f"runs must be >= 1 and warmup, profile_runs >= 0 "
                         f"(got runs={runs}, warmup={warmup}, profile_runs={profile_runs})")
    prep = prepared or prepare(target, *args, overrides=overrides, seed=seed, **capture_kwargs)
    time_runs(prep, warmup)
    walls = time_runs(prep, runs)
    prof = profile_program(prep, profile_runs, logdir) if profile_runs else None
    dev = jax.devices()[0]
    return Measurement(prep.program, dev.device_kind, jax.default_backend(), warmup,
                       tuple(walls), prof, tuple(prep.notes))
