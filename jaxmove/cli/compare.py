"""``jaxmove compare``: run TARGET here and put the time model's estimates beside measurements.

Thin, like ``cli.py``: calls ``jaxmove.measure.compare`` and renders with rich.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import UsageError


def cmd_compare(args: argparse.Namespace) -> int:
    from .common import _parse_sets, check_distinct_outputs
    from ..measure.compare import compare
    from ..measure.profile import ProfileError

    check_distinct_outputs([("--trace", args.trace), ("--html", args.html), ("--save-fit", args.save_fit)])

    if args.profile is not None:
        return _cmd_compare_profile(args)
    if args.target is None:
        raise UsageError("compare needs TARGET (a preset, module:function or file.py:function to run "
                         "here) or --profile PATH (a capture made elsewhere)")
    if args.hlo is not None or args.program is not None or args.trace or args.html:
        raise UsageError("--hlo, --program, --trace and --html go with --profile")
    if args.save_fit and not args.fit:
        raise UsageError("--save-fit needs --fit")
    if args.save_fit and not str(args.save_fit).endswith(".toml"):
        # (--hardware takes a spec by a path ending in .toml: another name could not be read back)
        raise UsageError(f"--save-fit {args.save_fit}: the fitted spec is TOML; give a file name "
                         "ending in .toml (what --hardware reads)")
    if args.runs < 1 or args.profile_runs < 1 or args.warmup < 0:
        raise UsageError("--runs and --profile-runs must be >= 1, --warmup >= 0")
    if args.save_fit:  # before measuring: a bad path must not cost the whole run
        from ..report.outputs import check_output_path
        check_output_path(args.save_fit, "--save-fit file")
    try:
        c = compare(args.target, hardware=args.hardware, runs=args.runs, warmup=args.warmup,
                    profile_runs=args.profile_runs, overrides=_parse_sets(args.set), fit=args.fit)
    except ProfileError as e:
        from ..report.render_helpers import one_line
        print(one_line(f"jaxmove: error: {e}"), file=sys.stderr)
        return 2
    if args.save_fit:
        from ..hardware import write_spec
        from ..report.outputs import OutputPathError, check_output_path
        check_output_path(args.save_fit, "--save-fit file")
        try:
            write_spec(c.fit.spec, args.save_fit)
        except OSError as e:
            raise OutputPathError(f"{args.save_fit}: cannot write --save-fit file ({e.strerror or e})") from None
        print(f"jaxmove: wrote fitted spec {args.save_fit}", file=sys.stderr)
    if args.json:
        from ..report.json_out import dumps_json
        sys.stdout.write(dumps_json(c.to_json()))  # strict JSON: no Infinity
    else:
        from ..report.compare_table import render_comparison
        render_comparison(c, top=args.top)
    return 0


def _cmd_compare_profile(args: argparse.Namespace) -> int:
    """``compare --profile PATH``: a capture made elsewhere against the time model."""
    from ..measure.profile_compare import compare_profile

    if args.target is not None:
        raise UsageError(f"--profile compares a capture; TARGET ('{args.target}') runs a program here: "
                         "give one or the other")
    if args.fit or args.save_fit or args.set:
        raise UsageError("--fit, --save-fit and --set do not apply to --profile")
    from ..report.outputs import check_output_path
    for path, what in ((args.trace, "--trace file"), (args.html, "--html file")):
        if path:  # before reading: a bad path must not cost the whole join
            check_output_path(path, what)
    c = compare_profile(args.profile, hlo=args.hlo, program=args.program, hardware=args.hardware)
    if args.trace:
        from ..report.profile_trace import write_profile_trace
        write_profile_trace(c, args.trace)
        print(f"jaxmove: wrote {args.trace}", file=sys.stderr)
    if args.html:
        from ..report.html import write_html
        write_html(c.report, args.html)
        print(f"jaxmove: wrote {args.html}", file=sys.stderr)
    if args.json:
        from ..report.json_out import dumps_json
        sys.stdout.write(dumps_json(c.to_json()))  # strict JSON: no Infinity
    else:
        from ..report.profile_table import render_profile_comparison
        render_profile_comparison(c, top=args.top)
    return 0


def add_compare_command(sub) -> None:
    """Register ``compare`` on the CLI's subparsers."""
    from .common import positive_int

    c = sub.add_parser(
        "compare", help="run TARGET here (or read a --profile captured elsewhere): per-instruction "
                        "estimated vs measured time, errors, fit",
        description="Run TARGET (a zoo preset, module:function or file.py:function) on the local "
                    "device with random inputs: warm-up, timed runs, then profiled runs whose events "
                    "are joined to the HLO instructions. Prints per instruction the estimated and "
                    "measured time per program run and their ratio, and per program the estimated vs "
                    "measured time, the median absolute percentage error (MdAPE) over instructions "
                    "taking >= 1% of the run, the time-weighted error and Spearman's rank correlation. "
                    "With --profile PATH nothing runs: the kernel times of a capture made on a GPU or "
                    "TPU are joined to the HLO it carries (or --hlo) and compared the same way.")
    c.add_argument("target", nargs="?", default=None)
    c.add_argument("--profile", metavar="PATH",
                   help="compare a capture made elsewhere instead of running TARGET: an XProf profile "
                        "directory or .xplane.pb, a jax.profiler trace JSON(.gz), or an nsys-jax "
                        "archive / directory")
    c.add_argument("--hlo", metavar="FILE",
                   help="with --profile: the program's optimized HLO (text, or a binary HloProto .pb[.xz]) "
                        "when the capture carries none (a trace JSON) or to use another")
    c.add_argument("--program", metavar="NAME|ID",
                   help="with --profile: the program to compare (HloModule name or program id; default: "
                        "the one with the most device time, or the --hlo file's module)")
    c.add_argument("--trace", metavar="FILE",
                   help="with --profile: also write a Chrome trace (JSON, opens in Perfetto): the "
                        "estimated timeline, the measured times, and one execution as captured")
    c.add_argument("--html", metavar="FILE",
                   help="with --profile: also write the HTML report with the measured column")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset's config; repeatable")
    c.add_argument("--hardware", metavar="NAME|path.toml|local",
                   help="spec for the estimates (default: 'local' when `jaxmove calibrate` wrote one, "
                        "else the built-in spec of this device kind, else cpu-generic)")
    c.add_argument("--runs", type=int, default=10, help="timed runs (default 10)")
    c.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    c.add_argument("--profile-runs", type=int, default=3, help="profiled runs (default 3)")
    c.add_argument("--top", type=positive_int, default=20, help="instructions to show (default 20)")
    c.add_argument("--json", action="store_true", help="print JSON instead of tables")
    c.add_argument("--fit", action="store_true",
                   help="fit per-kernel overhead, bandwidth and a FLOP/s scale to the measurements "
                        "(least squares) and report the errors before and after")
    c.add_argument("--save-fit", metavar="PATH.toml", help="with --fit: write the fitted spec as TOML (a name ending in .toml, for --hardware)")
    c.set_defaults(func=cmd_compare)
