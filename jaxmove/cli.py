"""The ``jaxmove`` command line. Thin: parses arguments, calls the Python API, renders.

Exit status: 0 success, 2 bad input (missing or malformed file, unknown target, bad
``--set``), with one line on stderr naming file:line:col and what was expected.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .hlo import HloParseError


class _Parser(argparse.ArgumentParser):
    """argparse with jaxmove's error format: one line ``jaxmove: error: ...``, exit 2."""

    def error(self, message: str):  # noqa: D102 - argparse API
        self.exit(2, f"jaxmove: error: {self.prog}: {message} (see {self.prog} --help)\n")


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
      ValueError: ``--trace`` without ``--hardware``.
      jaxmove.outputs.OutputPathError: a path that cannot be written.
    """
    from .outputs import check_output_path

    if getattr(args, "trace", None) and not getattr(args, "hardware", None):
        raise ValueError("--trace needs --hardware (the trace is the estimated timeline on a device)")
    for attr, what in (("html", "--html file"), ("trace", "--trace file"), ("output", "-o file")):
        path = getattr(args, attr, None)
        if path and path != "-":
            check_output_path(path, what)


def _parse_sets(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--set expects key=value, got '{item}'")
        out[key.strip()] = value.strip()
    return out


def _cmd_analyze(args: argparse.Namespace) -> int:
    from .api import analyze
    from .report.table import render_report

    target = args.target
    check_outputs(args)
    if getattr(args, "mesh", None) or getattr(args, "plan", None):
        from .cli_plans import program_for_plan
        target = program_for_plan(args)
        if isinstance(target, int):  # re-ran in a child process with enough simulated devices
            return target
    report = analyze(target, overrides=_parse_sets(args.set), hardware=args.hardware)
    _write_outputs(report, args)
    if args.json:
        out = report.to_json()
        if args.by:
            from .report.attribution import by_json
            out.update(by_json(report, args.by, out))
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.by:
        from .report.table import render_groups
        render_groups(report, args.by)
    else:
        render_report(report, top=args.top)
    return 0


def _write_outputs(report, args: argparse.Namespace) -> None:
    """``--html FILE`` and ``--trace FILE`` (issue 6 renderings; report/html.py, report/trace.py)."""
    if getattr(args, "html", None):
        from .report.html import write_html
        write_html(report, args.html)
        print(f"jaxmove: wrote {args.html}", file=sys.stderr)
    if getattr(args, "trace", None):
        from .report.trace import write_trace
        write_trace(report, args.trace)
        print(f"jaxmove: wrote {args.trace}", file=sys.stderr)


def _cmd_annotate(args: argparse.Namespace) -> int:
    from .api import analyze, resolve_program
    from .report.annotate import annotate

    check_outputs(args)
    program = resolve_program(args.target, overrides=_parse_sets(args.set))
    text = annotate(analyze(program, hardware=args.hardware), program.hlo_text)
    if args.output and args.output != "-":
        from .outputs import write_text_atomic
        write_text_atomic(args.output, text, "-o file")
        print(f"jaxmove: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from jaxmove import zoo as models
    from rich.console import Console
    from rich.table import Table

    table = Table(title="jaxmove model zoo (use: jaxmove analyze NAME [--set key=value])")
    table.add_column("preset", style="bold")
    table.add_column("description")
    for name, desc in models.list_presets():
        table.add_row(name, desc)
    Console().print(table)
    print(f"--set keys: {', '.join(models.OVERRIDE_KEYS)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="jaxmove",
        description="Where do the bytes of a compiled JAX/XLA program go? Per-instruction HBM "
                    "traffic by path and tensor role, from a Flax model or an HLO dump.")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("analyze", help="per-instruction HBM traffic and flops of a program",
                       description="Analyse TARGET: a zoo preset (see `jaxmove models`), a path to an "
                                   "HLO text file, or package.module:function / path/file.py:function "
                                   "returning a Workload (or a jax Lowered/Compiled).")
    a.add_argument("target")
    a.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset's config (batch, seq_len, layers, d_model, heads, "
                        "kv_heads, dtype, scan_layers, ...); repeatable")
    a.add_argument("--top", type=positive_int, default=15, help="instructions to show (default 15)")
    a.add_argument("--json", action="store_true", help="print the stable JSON report instead")
    a.add_argument("--hardware", metavar="NAME|path.toml|local",
                   help="estimate time on a device: a spec from `jaxmove hardware`, a .toml file, or "
                        "'local' (written by `jaxmove calibrate`); adds time, bound, reuse columns")
    a.add_argument("--by", choices=("source", "module", "opcode", "fusion_kind", "role"),
                   help="aggregate instructions by source line, module path (op_name), opcode, "
                        "fusion kind or tensor role (table; with --json adds by_<key>)")
    a.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    a.add_argument("--trace", metavar="FILE",
                   help="also write a Chrome trace (JSON, opens in Perfetto) of the estimated timeline")
    from .cli_plans import add_plan_options
    add_plan_options(a)
    a.set_defaults(func=_cmd_analyze)

    n = sub.add_parser("annotate", help="the optimized HLO with each instruction's figures as a comment",
                       description="Print TARGET's optimized HLO text with a // comment after each "
                                   "kernel-level instruction: multiplicity, flops, HBM bytes read and "
                                   "written, role, data paths, source line and op_name (and time, "
                                   "bound, collective figures when known). Totals over one program run; "
                                   "the output parses back as HLO.")
    n.add_argument("target")
    n.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset's config; repeatable")
    n.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    n.add_argument("--hardware", metavar="NAME|path.toml|local",
                   help="also annotate estimated time, bound and arithmetic intensity on this device")
    n.set_defaults(func=_cmd_annotate)

    m = sub.add_parser("models", help="list the built-in model presets")
    m.set_defaults(func=_cmd_models)

    from .cli_hardware import add_hardware_commands
    add_hardware_commands(sub)
    from .cli_compare import add_compare_command
    add_compare_command(sub)
    from .cli_plans import add_plans_command
    add_plans_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for attr in ("html", "trace", "output", "save_fit"):  # an empty path would be skipped silently
        value = getattr(args, attr, None)
        if isinstance(value, str) and not value.strip():
            print(f"jaxmove: error: --{attr.replace('_', '-')} needs a file path, got {value!r}",
                  file=sys.stderr)
            return 2
    from .api import TargetError

    try:
        return args.func(args)
    except HloParseError as e:
        print(f"jaxmove: error: {e}", file=sys.stderr)
    except FileNotFoundError as e:
        name = e.filename if e.filename else str(e)
        print(f"jaxmove: error: {name}: no such file", file=sys.stderr)
    except IsADirectoryError as e:
        print(f"jaxmove: error: {e.filename}: is a directory, expected an HLO text file", file=sys.stderr)
    except (TargetError, KeyError, ValueError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"jaxmove: error: {msg}", file=sys.stderr)
    except BrokenPipeError:  # e.g. `jaxmove analyze ... | head`
        return 0
    except KeyboardInterrupt:
        print("jaxmove: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours, not bad input: one line, exit 1, traceback on request
        if os.environ.get("JAXMOVE_DEBUG"):
            raise
        print(f"jaxmove: internal error: {type(e).__name__}: {e} (set JAXMOVE_DEBUG=1 for the "
              "traceback, and please report it)", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
