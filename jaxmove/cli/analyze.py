"""``jaxmove analyze``: the per-instruction table, ``--json``, ``--by``, ``--html``, ``--trace``."""

from __future__ import annotations

import argparse
import sys

from .common import add_compile_target_option, add_target_argument, check_outputs, parse_sets, positive_int
from .common import add_module_option, fit_status, module_kwargs, parse_roles
from .spec_option import add_spec_override_option, hardware_from_args
from ..report.outputs import before_commit
from ..report.render_helpers import one_line


def _cmd_analyze(args: argparse.Namespace) -> int:
    from ..api import analyze
    from ..report.table import render_report

    target = args.target
    check_outputs(args)
    if getattr(args, "rollup", False) and args.by != "module":
        from ..errors import UsageError
        raise UsageError("--rollup merges repeated layers of module paths: it needs --by module"
                         + (f", not --by {args.by}" if args.by else ""))
    if getattr(args, "mesh", None) or getattr(args, "plan", None):
        from .plans import program_for_plan
        target = program_for_plan(args)
        if isinstance(target, int):  # re-ran in a child process with enough simulated devices
            return target
    report = analyze(target, overrides=parse_sets(args.set), hardware=hardware_from_args(args),
                     role_globs=parse_roles(getattr(args, "role", None) or []), **module_kwargs(args),
                     target=getattr(args, "compile_target", None))
    _write_outputs(report, args)
    if args.json:
        out = report.to_json(stream=True)  # rows made as they are written: memory of one batch
        if args.by:
            from ..report.attribution import by_json
            out.update(by_json(report, args.by, out, rollup=getattr(args, "rollup", False)))
        from ..report.json_out import write_json
        write_json(out, sys.stdout)  # strict JSON: no Infinity
    elif args.by:
        from ..report.table import render_groups
        render_groups(report, args.by, rollup=getattr(args, "rollup", False))
    elif getattr(args, "excess", False):  # its section after the instruction table and headline
        from ..report.excess_table import render_excess
        render_report(report, top=args.top)
        render_excess(report)
    elif getattr(args, "xla", False):
        from ..report.xla_table import render_xla
        render_xla(report, top=args.top)
    else:
        render_report(report, top=args.top)
    return fit_status(report)


def _write_outputs(report, args: argparse.Namespace) -> None:
    """``--html FILE`` and ``--trace FILE`` (issue 6 renderings; report/html.py, report/trace.py)."""
    if getattr(args, "html", None):
        from ..report.html import write_html
        write_html(report, args.html)
        before_commit()  # a pending interrupt is said, not "wrote"
        print(one_line(f"jaxmove: wrote {args.html}"), file=sys.stderr)
    if getattr(args, "trace", None):
        from ..report.trace import write_trace
        write_trace(report, args.trace)
        before_commit()
        print(one_line(f"jaxmove: wrote {args.trace}"), file=sys.stderr)


def add_analyze_command(sub) -> None:
    """Register ``jaxmove analyze``."""
    a = sub.add_parser("analyze", help="per-instruction HBM traffic and flops of a program",
                       description="Analyse TARGET: a zoo preset (see `jaxmove models`), a path to an "
                                   "HLO text file, or package.module:function / path/file.py:function "
                                   "returning a Workload (or a jax Lowered/Compiled).")
    add_target_argument(a)
    add_module_option(a)
    add_compile_target_option(a)
    a.add_argument("--top", type=positive_int, default=15, help="instructions to show (default 15)")
    a.add_argument("--json", action="store_true", help="print the stable JSON report instead")
    a.add_argument("--hardware", metavar="NAME|path.toml|local",
                   help="estimate time on a device: a spec from `jaxmove hardware`, a .toml file, or "
                        "'local' (written by `jaxmove calibrate`); adds time, bound, reuse columns")
    add_spec_override_option(a)
    a.add_argument("--by", choices=("source", "module", "opcode", "fusion_kind", "role"),
                   help="aggregate instructions by source line, module path (op_name), opcode, "
                        "fusion kind or tensor role (table; with --json adds by_<key>)")
    a.add_argument("--rollup", action="store_true",
                   help="with --by module: merge repeated layers (layers_3/attn -> layers_*/attn); "
                        "with --json adds by_module_rollup")
    a.add_argument("--role", action="append", default=[], metavar="GLOB=ROLE",
                   help="give the ENTRY parameters whose path or name matches GLOB (fnmatch, e.g. "
                        "\"state*.value=weights\") a role: weights, kv_cache, optimizer_state, "
                        "activations, unknown; repeatable, the first matching glob wins")
    a.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    a.add_argument("--excess", action="store_true",
                   help="add the excess movement after the instruction table: compulsory vs "
                        "compiled bytes per role and path, then the causes ranked by time (with "
                        "--hardware) and the change that removes each")
    a.add_argument("--xla", action="store_true",
                   help="show the compiler's own figures beside jaxmove's instead of the instruction "
                        "table: cost_analysis() flops, bytes accessed, optimal_seconds, and per kernel "
                        "XLA:TPU's estimated_cycles (seconds at the TPU spec's clock); --json has them "
                        "under 'xla' keys")
    a.add_argument("--trace", metavar="FILE",
                   help="also write a Chrome trace (JSON, opens in Perfetto) of the estimated timeline")
    from .plans import add_plan_options
    add_plan_options(a)
    a.set_defaults(func=_cmd_analyze)
