"""The Python API: ``jaxmove.analyze(target)`` -> Report (resolve, parse, run the passes)."""

from __future__ import annotations

from .capture.resolve import (NestingTooDeepError, TargetError, UserCodeError,  # noqa: F401
                              load_target, resolve_program)
from .hlo import parse_module
from .passes.pipeline import run_pipeline
from .report.attribution import excess_with_sources
from .report.report import ProgramInfo, Report


def backend_mismatch_note(backend: str, spec_name: str) -> str:
    """The note a report carries when the program was compiled for another backend than
    the hardware spec it is costed on (e.g. a zoo preset compiled by XLA:CPU on h100-sxm)."""
    example = " (e.g. bf16→f32 weight converts)" if backend == "cpu" else ""
    return (f"program compiled by XLA:{backend.upper()}; costed on {spec_name} as compiled — "
            f"{backend.upper()}-specific ops{example} are included; use an HLO dump from the "
            "target backend for device-accurate figures")


def does_not_fit_note(module, spec, memory_stats: dict | None = None, backend: str | None = None) -> str | None:
    """A note when the program does not fit the spec's ``hbm_capacity_bytes`` per device, else
    None. Starts with ``does not fit:``.

    The rule ``plans`` applies (plans/compare.py ``summarize``): where the compiler's
    ``memory_analysis()`` is known (``memory_stats``, a program jaxmove compiled), the program
    needs ``capture.program.memory_analysis_peak_bytes`` (arguments + outputs - aliased +
    temporaries, all live at once, or XLA's own peak where larger); an XLA:TPU program is
    the exception, its compiler checked the memory itself and refuses what does not fit
    (``backend="tpu"`` with ``memory_stats``: no note; its refusal is capture/targets.py
    ``DoesNotFitError``), unless the user overrode ``hbm_capacity_bytes`` (``--spec``). A
    program compiled for another kind of device than the spec's is judged by its arguments +
    outputs - aliased (``analyze`` passes ``memory_stats`` without the temporaries then, with
    ``temporaries_not_counted`` naming its backend: XLA:CPU's hold f32 copies of bf16 buffers
    that no GPU program has). Otherwise, for an HLO file (no ``memory_analysis``), arguments
    larger than the capacity do not fit: the bytes that must sit in device memory before the
    program runs (its ENTRY parameters)."""
    cap = getattr(spec, "hbm_capacity_bytes", None)
    if not cap:
        return None
    ms = memory_stats or {}
    from .hardware.overrides import capacity_overridden
    if backend == "tpu" and ms and not capacity_overridden(spec):
        return None  # (XLA:TPU compiled it: it fits by the compiler's own figures, unless the
        # user gave another capacity with --spec: the compiler checked its own chip's)
    from .report.table import human_bytes
    need = sum(p.shape.byte_size for p in module.entry.parameters)
    fix = "it cannot run there as compiled (shard it over more devices, e.g. --mesh/--plan, or shrink it)"
    from .capture.program import memory_analysis_peak_bytes
    peak = memory_analysis_peak_bytes(ms, backend)
    if need > cap and (peak is None or peak <= need):  # (the compiler's figure where it has one)
        return (f"does not fit: the program's arguments take {human_bytes(need)} per device, more than the "
                f"{human_bytes(cap)} of device memory of {spec.name} ({need / cap:.3g}x; {capacity_source(spec)}); "
                + fix)
    if peak is None or peak <= cap:
        return None
    arg, out, temp = ms["argument_size_in_bytes"], ms["output_size_in_bytes"], ms["temp_size_in_bytes"]
    alias = ms.get("alias_size_in_bytes") or 0
    other = ms.get("temporaries_not_counted")
    live = (f"arguments {human_bytes(arg)} + outputs {human_bytes(out)} - aliased {human_bytes(alias)}"
            + (f"; XLA:{other.upper()}'s temporaries not counted, they are no {spec.kind.upper()} "
               "program's" if other else f" + temporaries {human_bytes(temp)}"))
    how = (f"XLA's memory_analysis: peak_memory_in_bytes, above {live}" if peak > arg + out - alias + temp
           else "XLA:TPU's memory_analysis: peak_memory_in_bytes (its HBM peak)" if peak < arg + out - alias + temp
           else f"XLA's memory_analysis: {live}")
    return (f"does not fit: the program needs {human_bytes(peak)} per device ({how}), more than the "
            f"{human_bytes(cap)} of device memory of {spec.name} ({peak / cap:.3g}x; {capacity_source(spec)}); "
            + fix)


def capacity_source(spec) -> str:
    """Where a spec's device memory comes from, for messages: ``hbm_capacity_bytes =
    80,000,000,000 B of spec h100-sxm (NVIDIA H100 Tensor Core GPU datasheet)``. It is also
    the ``device_memory_size`` jaxmove gives XLA:GPU for a GPU ``--target``
    (capture/targets.py ``gpu_target_config``)."""
    src = _first_clause(str((getattr(spec, "sources", None) or {}).get("hbm_capacity_bytes", "")))
    return (f"hbm_capacity_bytes = {int(spec.hbm_capacity_bytes):,} B of spec {spec.name}"
            + (f" ({src})" if src else ""))


def _first_clause(text: str) -> str:
    """``text`` up to its first comma or semicolon outside brackets (a source's first clause:
    "NVIDIA H100 datasheet, table 1" -> "NVIDIA H100 datasheet"; "user override (--spec K=V);
    the spec's value was ..." -> "user override (--spec K=V)"; one inside "(...)" does not
    cut it, so the brackets stay balanced)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch in ",;" and depth == 0:
            return text[:i].strip()
    return text.strip()


def _apply_role_globs(module, parameters, entry_roles, role_globs):
    """(entry roles, captured parameters) with the user's ``role_globs`` applied (``analyze``)."""
    import dataclasses

    from .passes.roles import entry_parameter_name
    from .vocab import roles_from_globs

    by_num = {p.number: p for p in parameters or ()}
    names = {}
    for p in module.entry.parameters:
        ns = [entry_parameter_name(p), p.name]
        if p.parameter_number in by_num:
            ns.insert(0, by_num[p.parameter_number].path)
        names[p.parameter_number] = tuple(dict.fromkeys(ns))
    given = roles_from_globs(names, role_globs)
    roles = dict(entry_roles or {})
    roles.update(given)
    if parameters:
        parameters = [dataclasses.replace(p, role=given[p.number]) if p.number in given else p
                      for p in parameters]
    return roles, parameters


def analyze(obj, /, *args, overrides: dict[str, str] | None = None, hardware=None,
            target=None, role_globs: dict[str, str] | None = None, **capture_kwargs) -> Report:
    """Analyse a program: where its bytes go, per instruction and in total.

    Args:
      obj: see ``resolve_program`` (preset name, HLO path, ``module:function``,
        Workload, Program, callable + ``args``, jax Lowered/Compiled, NNX module).
      overrides: ``--set`` values for a zoo preset, e.g. ``{"layers": "2"}``.
      hardware: a spec name (``h100-sxm``, ``tpu-v5e``, ``local`` = the calibrated spec of
        this machine), a path to a spec ``.toml``, or a ``HardwareSpec``; sets
        ``report.times`` (per-instruction and program time estimates, passes/timing.py)
        and the tiling model of ``report.reuse``.
      target: the compile target (``jaxmove/capture/targets.py``): None / ``cpu`` (XLA:CPU),
        ``h100-sxm``, ``h100-sxm:1x2x8``, ``tpu-v5e:2x2``...: the program is compiled by that
        device's compiler, without the device; ``hardware`` defaults to the target's spec.
      role_globs: ``{GLOB: ROLE}`` (the CLI's ``--role GLOB=ROLE``): ENTRY parameters whose
        pytree path / ``op_name`` or HLO name matches GLOB (``fnmatch``; the first matching
        glob wins) get ROLE, over the roles capture or the naming rule gave them.
    Returns:
      A Report: per-instruction rows (totals over one program run) and program totals
      by path and by role; ``report.reuse`` (on-chip reuse of fusions) always,
      ``report.times`` when ``hardware`` is given.
    Raises:
      FileNotFoundError, TargetError, jaxmove.hlo.HloParseError, jaxmove.capture.CaptureError,
      jaxmove.hardware.HardwareSpecError (unknown hardware name, bad spec file),
      jaxmove.capture.targets.TargetNameError / MissingExtraError (bad target, plugin not
      installed), DoesNotFitError (the target compiler ran out of device memory),
      ValueError (a ``role_globs`` role that is not a role, or a glob matching no parameter),
      jaxmove.errors.UsageError (a ``hardware`` spec of another accelerator than the ``target``'s).
    """
    spec = None
    tgt = None
    if target is not None:
        from .capture.targets import Target
        tgt = Target.parse(target)
        target = tgt.name
        if hardware is None and tgt.platform != "cpu":
            hardware = tgt.spec_name
        capture_kwargs["target"] = target
    if hardware is not None:
        from .hardware import HardwareSpec, load_spec
        spec = hardware if isinstance(hardware, HardwareSpec) else load_spec(hardware)
        if tgt is not None:
            from .capture.targets import spec_target_mismatch
            mismatch = spec_target_mismatch(spec, tgt)
            if mismatch:
                from .errors import UsageError
                raise UsageError(mismatch)
    program = resolve_program(obj, *args, overrides=overrides, **capture_kwargs)
    if spec is not None and spec.kind == "tpu" and getattr(program, "target", None):
        spec = _with_target_topology(spec, program.target)  # which ICI axes have wraparound links
    filename = program.source[4:] if program.source.startswith("hlo:") else f"<{program.name}>"
    module = parse_module(program.hlo_text, filename)
    if program.backend == "gpu" and getattr(program, "target", None) not in (None, "cpu"):
        module.compiled_without_device = True   # (capture/targets.py: compile-only GPU devices)
    entry_roles = {p.number: p.role for p in program.parameters} if program.parameters else None
    if role_globs:
        import dataclasses
        entry_roles, parameters = _apply_role_globs(module, program.parameters, entry_roles, role_globs)
        program = dataclasses.replace(program, parameters=tuple(parameters) if parameters else program.parameters)
    results = run_pipeline(module, entry_roles, program.parameters, spec,
                           output_roles=getattr(program, "output_roles", None) or None)
    analysis = results.analysis
    analysis.notes.extend(getattr(program, "notes", ()))
    if spec is not None and program.backend in ("cpu", "gpu", "tpu") and program.backend != spec.kind:
        analysis.notes.append(backend_mismatch_note(program.backend, spec.name))
    elif spec is not None and tgt is not None and tgt.platform != "cpu" and tgt.spec_name != spec.name:
        # (the same compiler family, another chip: tiles, fusions and layouts are the target's)
        analysis.notes.append(f"program compiled for {tgt.name} ({tgt.spec_name}) and costed on "
                              f"{spec.name}, another chip: the program is {tgt.spec_name}'s as its "
                              f"compiler chose it; compile with --target {spec.name} for {spec.name}'s own")
    # (XLA:CPU's temporaries are no accelerator's: they hold f32 copies of bf16 weights; a
    # program costed on another kind of device is judged by its arguments and outputs alone)
    ms = getattr(program, "memory_stats", None)
    if spec is not None and ms and program.backend != spec.kind:
        from .capture.program import without_temporaries
        ms = without_temporaries(ms, program.backend)
    fit = does_not_fit_note(module, spec, ms, program.backend) if spec is not None else None
    if fit:
        analysis.notes.insert(0, fit)
    from .capture.xla_figures import xla_figures
    xla = xla_figures(analysis, program.xla_cost_analysis, program.backend,
                      _clock_spec(getattr(program, "target", None), spec), program.source,
                      program.hlo_text)
    if results.times is not None and xla is not None:  # ours vs XLA:TPU's own estimate (> 2x: say where)
        from .passes.timing import xla_comparison_note
        note = xla_comparison_note(results.times, xla)
        if note:
            results.times.notes.append(note)
    return Report(ProgramInfo(program.name, program.backend, program.num_devices, program.source,
                              getattr(program, "target", None),
                              tuple(getattr(program, "output_roles", ()) or ())),
                  analysis, program.parameters, dict(program.memory_stats), program.xla_cost_analysis,
                  reuse=results.reuse, times=results.times, excess=excess_with_sources(module, results.excess), xla=xla)


def _with_target_topology(spec, target_name):
    """``spec`` with the chip grid of the TPU slice the program was compiled for
    (hardware/overrides.with_slice_topology); ``spec`` when the name is not a TPU target."""
    from .capture.targets import Target, TargetNameError
    from .hardware.overrides import with_slice_topology
    try:
        t = Target.parse(target_name)
    except TargetNameError:  # a stage built elsewhere is named by its platform only
        return spec
    return with_slice_topology(spec, t.topology) if t.platform == "tpu" else spec


def _clock_spec(target_name, spec):
    """The TPU spec whose clock turns XLA:TPU's estimated_cycles into seconds: the compile
    target's spec (the chip XLA estimated for), else the ``--hardware`` spec when it is a TPU."""
    if target_name:
        from .capture.targets import Target, TargetNameError
        try:
            t = Target.parse(target_name)
        except TargetNameError:  # a stage built elsewhere is named by its platform only
            t = None
        if t is not None and t.platform == "tpu":
            return t.spec()
    return spec if getattr(spec, "kind", None) == "tpu" else None


def compare(target=None, /, *args, profile=None, hlo=None, program=None, hardware=None, **kwargs):
    """Estimated against measured time, per instruction and per program.

    Args:
      target: what to run here (``jaxmove.measure.compare.compare``: a preset, ``module:function``,
        Workload, callable + ``args``...); leave it None with ``profile``.
      profile: a capture made elsewhere instead (an XProf profile directory or ``.xplane.pb``, a
        ``jax.profiler`` trace JSON(.gz), or an nsys-jax archive / directory): nothing runs; its
        kernel times are joined to the HLO it carries (``jaxmove.measure.profile_compare``).
      hlo: with ``profile``: the program's HLO file when the capture carries none.
      program: with ``profile``: the program id or HloModule name to compare.
      hardware: the spec for the estimates (default: the device's built-in or calibrated spec).
      kwargs: ``runs``, ``warmup``, ``profile_runs``, ``fit``... of ``measure.compare.compare``.

    Returns:
      A ``Comparison`` (run here) or a ``ProfileComparison`` (``profile=``).

    Raises:
      UsageError: both or neither of ``target`` and ``profile``; ``hlo`` / ``program`` without
        ``profile``. The errors of ``measure.compare.compare`` / ``profile_compare.compare_profile``.
    """
    from .errors import UsageError

    if profile is not None:
        if target is not None or args or kwargs:
            raise UsageError("compare(profile=...) reads a capture: no target, arguments or run options")
        from .measure.profile_compare import compare_profile
        return compare_profile(profile, hlo=hlo, program=program, hardware=hardware)
    if target is None:
        raise UsageError("compare needs a target to run here or profile=PATH")
    if hlo is not None or program is not None:
        raise UsageError("hlo= and program= go with profile=")
    from .measure.compare import compare as _compare
    return _compare(target, *args, hardware=hardware, **kwargs)
