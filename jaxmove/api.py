"""The Python API: ``jaxmove.analyze(target)`` -> Report."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from .hlo import parse_module
from .passes.pipeline import analyze_module
from .report.report import ProgramInfo, Report

HLO_SUFFIXES = (".hlo", ".txt", ".hlo.txt")


class TargetError(ValueError):
    """A TARGET that names no preset, HLO file or workload function."""


def _load_function(spec: str):
    """``package.module:function`` or ``path/file.py:function`` -> the function object."""
    mod_name, _, fn_name = spec.rpartition(":")
    if mod_name.endswith(".py") or os.sep in mod_name:
        path = Path(mod_name)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (from target '{spec}')")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules.setdefault(path.stem, module)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(mod_name)
    try:
        return getattr(module, fn_name)
    except AttributeError:
        raise TargetError(f"{mod_name} has no function '{fn_name}' (from target '{spec}')") from None


def resolve_program(target, *args, overrides: dict[str, str] | None = None, **capture_kwargs):
    """Turn any TARGET into a captured ``Program``.

    TARGET is a zoo preset name, a path to an HLO text file, ``module:function`` or
    ``file.py:function`` (the function is called with no arguments and must return a
    Workload, a ``jax.stages.Lowered``/``Compiled``), a Workload, a Program, or anything
    ``jaxmove.capture.capture`` accepts (a callable with ``args``, a Flax NNX module...).

    Raises:
      FileNotFoundError: a path that does not exist.
      TargetError: a string that is neither a preset, a file nor ``module:function``.
    """
    from . import capture as cap

    if isinstance(target, cap.Program):
        return target
    if isinstance(target, (str, os.PathLike)):
        s = os.fspath(target)
        import models

        if s in models.PRESETS:
            return cap.capture(models.build(s, overrides or {}))
        if overrides:
            raise TargetError(f"--set applies to zoo presets only, not to '{s}'")
        if ":" in s and not Path(s).exists():
            obj = _load_function(s)
            made = obj() if callable(obj) and not hasattr(obj, "lower") else obj
            return cap.capture(made, **capture_kwargs)
        p = Path(s)
        if p.exists() or s.endswith(HLO_SUFFIXES) or os.sep in s:
            return cap.program_from_hlo_file(p)
        presets = ", ".join(models.PRESETS)
        raise TargetError(f"'{s}' is not a zoo preset ({presets}), an HLO file, or module:function")
    return cap.capture(target, *args, **capture_kwargs)


def analyze(target, *args, overrides: dict[str, str] | None = None, hardware=None,
            **capture_kwargs) -> Report:
    """Analyse a program: where its bytes go, per instruction and in total.

    Args:
      target: see ``resolve_program`` (preset name, HLO path, ``module:function``,
        Workload, Program, callable + ``args``, jax Lowered/Compiled, NNX module).
      overrides: ``--set`` values for a zoo preset, e.g. ``{"layers": "2"}``.
      hardware: a spec name (``h100-sxm``, ``tpu-v5e``, ``local`` = the calibrated spec of
        this machine), a path to a spec ``.toml``, or a ``HardwareSpec``; sets
        ``report.times`` (per-instruction and program time estimates, passes/timing.py)
        and the tiling model of ``report.reuse``.
    Returns:
      A Report: per-instruction rows (totals over one program run) and program totals
      by path and by role; ``report.reuse`` (on-chip reuse of fusions) always,
      ``report.times`` when ``hardware`` is given.
    Raises:
      FileNotFoundError, TargetError, jaxmove.hlo.HloParseError, jaxmove.capture.CaptureError,
      jaxmove.hardware.HardwareSpecError (unknown hardware name, bad spec file).
    """
    spec = None
    if hardware is not None:
        from .hardware import HardwareSpec, load_spec
        spec = hardware if isinstance(hardware, HardwareSpec) else load_spec(hardware)
    program = resolve_program(target, *args, overrides=overrides, **capture_kwargs)
    filename = program.source[4:] if program.source.startswith("hlo:") else f"<{program.name}>"
    module = parse_module(program.hlo_text, filename)
    entry_roles = {p.number: p.role for p in program.parameters} if program.parameters else None
    analysis = analyze_module(module, entry_roles)
    from .passes.reuse import reuse_pass
    from .passes.timing import estimate_times
    reuse = reuse_pass(analysis, spec)
    times = estimate_times(analysis, spec, reuse) if spec is not None else None
    return Report(ProgramInfo(program.name, program.backend, program.num_devices, program.source),
                  analysis, program.parameters, dict(program.memory_stats), program.xla_cost_analysis,
                  reuse=reuse, times=times)
