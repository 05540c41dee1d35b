"""XLA dump directories (``XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text``) and the
backend their file names tell.

XLA names each dumped file ``module_<NNNN>.<module name>.<suffix>`` (xla/service/dump.cc,
``FilenameFor``); the optimized module's suffix says which compiler wrote it:

  * XLA:CPU: ``module_0004.jit_f.cpu_after_optimizations.txt``;
  * XLA:GPU: ``module_0001.jit_f.sm_9.0a_gpu_after_optimizations.txt`` (the CUDA compute
    capability; ROCm: ``gfx90a_gpu_...``);
  * XLA:TPU: ``module_0000.jit_f.cl_933746096.after_optimizations.txt`` -- no backend in the
    name, but the TPU compiler dumps ``<same prefix>.tpu_comp_env.txt`` beside it.

Beside it lie ``before_optimizations.txt``, ``...after_optimizations-buffer-assignment.txt``,
``-live-range.txt``, ``-memory-usage-report.txt``, ``after_optimizations_after_buffer_assignment
.txt`` (TPU) and the compilers' own files; only ``*after_optimizations.txt`` is the program
that runs. jax compiles (and dumps) small helper programs too (``jit_convert_element_type``,
``jit_broadcast_in_dim`` for ``jnp.ones``...), so a directory often holds several modules:
one is analysed when it is the only one, else ``module`` names it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import TargetError

AFTER = "after_optimizations.txt"
_MODULE = re.compile(r"^module_(\d+)\.(.+)$")
# the backend tag between a module's name and ``after_optimizations.txt`` (module docstring): a
# module name may hold dots (``jit_step.v2``), so the tag is cut off, not the name at a dot
_BACKEND_TAG = re.compile(r"(?:\.cpu_|\.sm_\d+\.\d+[a-z]?_gpu_|\.gfx[0-9a-z]+_gpu_|\.[a-z0-9]+_gpu_"
                          r"|\.cl_\d+\.|\.tpu_|\.)$")


@dataclass(frozen=True)
class DumpedModule:
    """One ``*after_optimizations.txt`` file of a dump directory.

    Attributes:
      path: the file.
      number: XLA's module number (``module_0004`` -> ``0004``), or "" when the name has none.
      name: the module name (``jit_f``), or the file name without the suffix.
      backend: from the file name (``cpu`` / ``gpu`` / ``tpu``), or ``unknown``.
    """

    path: Path
    number: str
    name: str
    backend: str

    @property
    def label(self) -> str:
        """``module_0004.jit_f``: what a listing shows and ``--module`` accepts."""
        return f"module_{self.number}.{self.name}" if self.number else self.name


def is_optimized_dump(name: str) -> bool:
    """True for an optimized-module file name (``...after_optimizations.txt``)."""
    return name.endswith(AFTER)


def backend_from_name(path: Path) -> str:
    """``cpu`` / ``gpu`` / ``tpu`` from a dumped file's name (module docstring), ``unknown``
    when the name does not say (a renamed file, or an XLA that writes no such name)."""
    name = path.name
    stem = name[:-len(AFTER)] if name.endswith(AFTER) else name
    if re.search(r"(^|[._])cpu_$", stem):
        return "cpu"
    if re.search(r"(^|[._])gpu_$", stem):
        return "gpu"
    if re.search(r"(^|[._])tpu_$", stem):
        return "tpu"
    if stem.endswith("."):   # TPU: <prefix>.after_optimizations.txt with <prefix>.tpu_comp_env.txt beside it
        try:
            if (path.parent / f"{stem}tpu_comp_env.txt").is_file():
                return "tpu"
        except OSError:
            pass
    return "unknown"


def dumped_module(path: Path) -> DumpedModule:
    stem = path.name[:-len(AFTER)] if path.name.endswith(AFTER) else path.name
    m = _MODULE.match(stem)
    number, rest = (m.group(1), m.group(2)) if m else ("", stem)
    name = _BACKEND_TAG.sub("", rest).rstrip("._") or rest.rstrip("._")
    return DumpedModule(path, number, name, backend_from_name(path))


def list_modules(directory: Path) -> list[DumpedModule]:
    """The optimized modules of a dump directory, by module number (then name).

    Raises:
      TargetError: the directory holds none (with what it holds instead, when telling).
    """
    try:
        files = sorted(p for p in directory.iterdir() if p.is_file() and is_optimized_dump(p.name))
    except OSError as e:
        raise TargetError(f"{directory}: cannot list the directory ({e.strerror or e})") from None
    if not files:
        try:
            names = [p.name for p in directory.iterdir()]
        except OSError:
            names = []
        hint = (" (only binary .pb dumps: add --xla_dump_hlo_as_text to XLA_FLAGS)"
                if any(n.endswith(".pb") for n in names) else
                " (before_optimizations only: the program was not compiled?)"
                if any(n.endswith("before_optimizations.txt") for n in names) else "")
        raise TargetError(f"{directory}: a directory with no *{AFTER} file; expected an XLA dump "
                          f"(XLA_FLAGS='--xla_dump_to={directory} --xla_dump_hlo_as_text'){hint}")
    mods = [dumped_module(p) for p in files]
    mods.sort(key=lambda d: (d.number == "", int(d.number) if d.number else 0, d.name))
    return mods


def choose_module(mods: list[DumpedModule], module: str | None, directory: Path) -> DumpedModule:
    """The module ``module`` names (its label ``module_0004.jit_f``, its name ``jit_f``,
    its number ``0004`` or ``4``, or its file name), or the only one when ``module`` is None.

    Raises:
      TargetError: several modules and no ``module``; a ``module`` that names none, or
        several (a function compiled twice: then name it by number).
    """
    def listing(ms):
        shown = ", ".join(f"{d.label} ({d.backend})" for d in ms[:30])
        return shown + (f", ... and {len(ms) - 30} more" if len(ms) > 30 else "")

    if module is None:
        if len(mods) == 1:
            return mods[0]
        raise TargetError(f"{directory} holds {len(mods)} optimized modules; choose one with "
                          f"--module NAME (name, module_NNNN.name or number): {listing(mods)}")
    want = module.strip()
    found = [d for d in mods if want in (d.label, d.name, d.path.name)
             or (want.isascii() and want.isdigit() and d.number and int(want) == int(d.number))]
    if len(found) == 1:
        return found[0]
    if not found:
        raise TargetError(f"--module {module}: {directory} has no such module; it holds: {listing(mods)}")
    raise TargetError(f"--module {module} names {len(found)} modules of {directory} (compiled more "
                      f"than once); choose one by its number: {listing(found)}")


def with_name_backend(program, path: Path):
    """``program`` (read from the file ``path``) with the backend its file name tells, when
    its text did not say (``backend == "unknown"``)."""
    if getattr(program, "backend", None) != "unknown":
        return program
    backend = backend_from_name(Path(path))
    return dataclasses.replace(program, backend=backend) if backend != "unknown" else program


def program_from_dump(path, module: str | None = None):
    """A ``Program`` from a dump directory (the one optimized module, or the one ``module``
    names) or from one dumped file; the backend from the file name when the text does not
    say.

    Raises:
      TargetError: see ``list_modules`` / ``choose_module``; ``module`` given for a file.
      FileNotFoundError, HloParseError: as ``program_from_hlo_file``.
    """
    from .program import program_from_hlo_file

    p = Path(path)
    if p.is_dir():
        chosen = choose_module(list_modules(p), module, p).path
    else:
        if module is not None:
            raise TargetError(f"--module {module}: applies to a dump directory, and {p} is a file")
        chosen = p
    return with_name_backend(program_from_hlo_file(chosen), chosen)
