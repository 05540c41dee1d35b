"""What every ``jaxmove`` command shares: the parser class, argument types, ``--set``, output checks."""

from __future__ import annotations

import argparse
import os

from ..errors import UsageError


class _Parser(argparse.ArgumentParser):
    """argparse with jaxmove's error format: one line ``jaxmove: error: ...``, exit 2."""

    def error(self, message: str):  # noqa: D102 - argparse API
        where = "" if self.prog == "jaxmove" else f"{self.prog}: "   # (not "jaxmove: error: jaxmove:")
        self.exit(2, f"jaxmove: error: {where}{message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def check_outputs(args: argparse.Namespace) -> None:
    """Check every output path of ``args`` (``--html``, ``--trace``, ``-o``) before any work.

    Raises:
      jaxmove.errors.UsageError: ``--trace`` without ``--hardware`` or a device ``--target``.
      jaxmove.outputs.OutputPathError: a path that cannot be written.
    """
    from ..report.outputs import check_output_path

    target = str(getattr(args, "compile_target", None) or "cpu").strip().lower()
    implied = target not in ("cpu", "cpu-generic", "")  # a device --target implies its --hardware
    if getattr(args, "trace", None) and not getattr(args, "hardware", None) and not implied:
        raise UsageError("--trace needs --hardware or a device --target (the trace is the "
                         "estimated timeline on a device)")
    outputs = [(what.split()[0], getattr(args, attr, None)) for attr, what in
               (("html", "--html file"), ("trace", "--trace file"), ("output", "-o file"))]
    check_distinct_outputs(outputs)
    for attr, what in (("html", "--html file"), ("trace", "--trace file"), ("output", "-o file")):
        path = getattr(args, attr, None)
        if path and path != "-":
            check_output_path(path, what)


def check_distinct_outputs(outputs) -> None:
    """Two output options of one command must not name one file (``--html r.jsonl`` wrote the
    page over ``-o r.jsonl``'s results; ``--html p.png --plot p.png`` wrote the file twice).

    ``outputs``: (option, path or None) pairs; None and ``-`` (stdout) are skipped. Paths are
    compared resolved (``./a/../r.html`` is ``r.html``, symbolic links followed), and existing
    files by identity too (hard links).

    Raises:
      UsageError: the two options and the file they share.
    """
    seen: list[tuple[str, str, str]] = []
    for option, path in outputs:
        if not path or path == "-":
            continue
        resolved = os.path.realpath(os.path.expanduser(str(path)))
        for other, other_path, other_resolved in seen:
            same = resolved == other_resolved
            if not same:
                try:
                    same = os.path.samefile(resolved, other_resolved)
                except OSError:  # (one of them does not exist yet)
                    same = False
            if same:
                shown = (f"{other_path}" if str(other_path) == str(path)
                         else f"{other_path} and {path} are both {resolved}")
                raise UsageError(f"{other} and {option} name the same file ({shown}): give each "
                                 "output a file of its own")
        seen.append((option, path, resolved))


class _Once(argparse.Action):
    """An option a command takes once: given twice it is an error (argparse keeps the last
    silently: ``analyze --plan tp --plan dp`` compiled dp)."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        if before is not None:
            parser.error(f"{option_string} given twice ({before} and {values}): this command takes one")
        setattr(namespace, self.dest, values)


def fit_status(report) -> int:
    """The one does-not-fit rule of every target and command that renders a report (``analyze``
    in every form, ``--xla`` and ``--json`` too, and ``annotate``; README "Does it fit?"): a
    program that does not fit the device memory exits 2 with one line on stderr, after the
    output where the compiler still produced a program (XLA:GPU without the device checks no
    memory; an XLA:CPU program costed on ``--hardware``). XLA:TPU refuses such a program itself
    (capture/targets.py ``DoesNotFitError``: the same line, the same status, no output).

    Returns 2 when ``report`` has the ``does not fit:`` note (``api.does_not_fit_note``), else 0.
    """
    import sys

    from ..report.render_helpers import one_line

    fit = next((n for n in report.notes if n.startswith("does not fit:")), None)
    if fit is None:
        return 0
    sys.stdout.flush()
    print(one_line(f"jaxmove: error: {report.program.name} {fit}"), file=sys.stderr)
    return 2


def parse_sets(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--set expects key=value, got '{item}'")
        key = key.strip()
        if key in out:  # (as --spec: a repeated key is a mistake, not an override of the first)
            raise UsageError(f"--set {key} given twice ({key}={out[key]} and {key}={value.strip()}): "
                             "expected each key once")
        out[key] = value.strip()
    return out


def parse_roles(items: list[str]) -> dict[str, str]:
    """``--role GLOB=ROLE`` items -> {GLOB: ROLE} in order (the last '=' splits: globs may hold '=')."""
    out: dict[str, str] = {}
    for item in items:
        glob, eq, role = item.rpartition("=")
        if not eq or not glob.strip() or not role.strip():
            raise UsageError(f"--role expects GLOB=ROLE, got '{item}'")
        out[glob.strip()] = role.strip()
    return out


_parse_sets = parse_sets  # the name the command modules used before the cli/ package


def add_target_argument(p: argparse.ArgumentParser) -> None:
    """TARGET and ``--set`` (the arguments every analysing command takes)."""
    p.add_argument("target")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset's config (batch, seq_len, layers, d_model, heads, "
                        "kv_heads, dtype, scan_layers, ...); repeatable")


def add_compile_target_option(p: argparse.ArgumentParser) -> None:
    """``--target NAME``: the device to compile for, without it (jaxmove/capture/targets.py);
    stored as ``args.compile_target`` (``args.target`` is the TARGET program)."""
    p.add_argument("--target", dest="compile_target", metavar="NAME", default=None,
                   help="compile for this device without it: cpu (default, XLA:CPU), h100-sxm, h200, "
                        "b200, a100-80gb, a100-40gb (optionally :SxHxD = slices x hosts x GPUs, e.g. "
                        "h100-sxm:1x2x8), tpu-v5e / tpu-v6e (:AxB chips, e.g. tpu-v5e:4x4), tpu-v4 / "
                        "tpu-v5p (:AxBxC, e.g. tpu-v5p:4x4x4); implies --hardware of the same spec. "
                        'TPU targets need pip install "jaxmove[tpu]", GPU targets "jaxmove[gpu]"')
    add_no_compile_cache_option(p)
    p.add_argument("--weight-layouts", choices=("default", "auto"), action=_WeightLayouts, default=None,
                   help="default: weights in jit's default layout (XLA may copy one into the layout "
                        "its kernels read, every step: layout_change); auto: XLA picks the layout of "
                        "each weights argument that is not donated (Layout.AUTO), as a server that "
                        "loads weights once for the compiled program does")
    p.add_argument("--xla-option", action=_XlaOption, metavar="KEY=VALUE", default=None,
                   help="an XLA compile option for every compile (jax's compiler_options; e.g. "
                        "xla_gpu_experimental_force_split_k=1 turns XLA:GPU's split-K of skinny dots "
                        "off); repeatable. An option the compiler does not know is an error")


def add_no_compile_cache_option(p: argparse.ArgumentParser) -> None:
    """``--no-compile-cache`` (capture/compile_cache.py); part of ``add_compile_target_option``."""
    p.add_argument("--no-compile-cache", action=_NoCompileCache, nargs=0,
                   help="compile again even when jaxmove's compile cache holds the program (the "
                        "cache keeps TPU/GPU compiles in $JAXMOVE_COMPILE_CACHE_DIR, default "
                        "~/.cache/jaxmove/xla; JAXMOVE_NO_COMPILE_CACHE=1 does the same)")


class _WeightLayouts(argparse.Action):
    """Sets JAXMOVE_WEIGHT_LAYOUTS (capture/program.py) while parsing, so the command and every
    process it starts (plans on simulated devices, sweep workers) compile the same way."""

    def __call__(self, parser, namespace, values, option_string=None):
        from ..capture.program import WEIGHT_LAYOUTS_ENV
        os.environ[WEIGHT_LAYOUTS_ENV] = values
        setattr(namespace, self.dest, values)


class _XlaOption(argparse.Action):
    """Adds KEY=VALUE to JAXMOVE_XLA_OPTIONS (capture/targets.py) while parsing, so the command
    and every process it starts compile with the same options."""

    def __call__(self, parser, namespace, values, option_string=None):
        import json

        from ..capture.targets import XLA_OPTIONS_ENV
        key, sep, value = values.partition("=")
        if not sep or not key.strip() or not value.strip():
            parser.error(f"--xla-option {values!r}: expected KEY=VALUE, e.g. "
                         "xla_gpu_experimental_force_split_k=1")
        # (the options of this command line only: the first replaces what the environment held)
        got = {**(getattr(namespace, self.dest, None) or {}), key.strip(): value.strip()}
        os.environ[XLA_OPTIONS_ENV] = json.dumps(got)
        setattr(namespace, self.dest, got)


class _NoCompileCache(argparse.Action):
    """Sets JAXMOVE_NO_COMPILE_CACHE=1 (capture/compile_cache.py) while parsing, so the command
    and every process it starts compile without the cache."""

    def __call__(self, parser, namespace, values, option_string=None):
        from ..capture.compile_cache import DISABLE_ENV
        os.environ[DISABLE_ENV] = "1"
        setattr(namespace, "no_compile_cache", True)


def add_module_option(p: argparse.ArgumentParser) -> None:
    """``--module NAME``: which module of an XLA dump directory TARGET (capture/dumps.py)."""
    p.add_argument("--module", metavar="NAME", default=None,
                   help="with a TARGET that is an --xla_dump_to directory holding several optimized "
                        "modules: the one to analyse (its name jit_f, module_0004.jit_f, or number 4)")


def module_kwargs(args: argparse.Namespace) -> dict:
    """``{"module": NAME}`` for ``resolve_program`` when ``--module`` was given, else {}.

    Raises:
      UsageError: ``--module ""`` (an empty name; it read as no --module at all).
    """
    module = getattr(args, "module", None)
    if module is not None and not module.strip():
        from ..errors import UsageError
        raise UsageError("--module needs a module name or number (e.g. jit_f, module_0004.jit_f or 4), got ''")
    return {"module": module} if module else {}

