"""``jaxmove annotate``: the optimized HLO with each instruction's figures as a ``//`` comment."""

from __future__ import annotations

import argparse
import sys

from .common import add_compile_target_option, add_target_argument, check_outputs, parse_sets
from .common import add_module_option, fit_status, module_kwargs


def _cmd_annotate(args: argparse.Namespace) -> int:
    from ..api import analyze, resolve_program
    from ..report.annotate import annotate

    check_outputs(args)
    compile_target = getattr(args, "compile_target", None)
    if getattr(args, "mesh", None) or getattr(args, "plan", None):
        from .plans import program_for_plan
        program = program_for_plan(args)
        if isinstance(program, int):  # re-ran in a child process with enough simulated devices
            return program
    else:
        program = resolve_program(args.target, overrides=parse_sets(args.set), **module_kwargs(args), target=compile_target)
    report = analyze(program, hardware=args.hardware, target=compile_target)
    text = annotate(report, program.hlo_text)
    if args.output and args.output != "-":
        from ..report.outputs import write_text_atomic
        write_text_atomic(args.output, text, "-o file")
        from ..report.render_helpers import one_line
        print(one_line(f"jaxmove: wrote {args.output}"), file=sys.stderr)
    else:
        sys.stdout.write(text)
    return fit_status(report)  # the does-not-fit rule of analyze: exit 2, one line, after the text


def add_annotate_command(sub) -> None:
    """Register ``jaxmove annotate``."""
    n = sub.add_parser("annotate", help="the optimized HLO with each instruction's figures as a comment",
                       description="Print TARGET's optimized HLO text with a // comment after each "
                                   "kernel-level instruction: multiplicity, flops, HBM bytes read and "
                                   "written, role, data paths, source line and op_name (and time, "
                                   "bound, collective figures when known). Totals over one program run; "
                                   "the output parses back as HLO.")
    add_target_argument(n)
    add_module_option(n)
    add_compile_target_option(n)
    n.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    n.add_argument("--hardware", metavar="NAME|path.toml|local",
                   help="also annotate estimated time, bound and arithmetic intensity on this device")
    from .plans import add_plan_options
    add_plan_options(n)
    n.set_defaults(func=_cmd_annotate)
