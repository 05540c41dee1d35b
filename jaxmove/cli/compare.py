"""``jaxmove compare``: run TARGET here and put the time model's estimates beside measurements.

Thin, like ``cli.py``: calls ``jaxmove.measure.compare`` and renders with rich.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import UsageError


def cmd_compare(args: argparse.Namespace) -> int:
    from .common import _parse_sets
    from ..measure.compare import compare
    from ..measure.profile import ProfileError

    if args.save_fit and not args.fit:
        raise UsageError("--save-fit needs --fit")
    if args.runs < 1 or args.profile_runs < 1 or args.warmup < 0:
        raise UsageError("--runs and --profile-runs must be >= 1, --warmup >= 0")
    if args.save_fit:  # before measuring: a bad path must not cost the whole run
        from ..report.outputs import check_output_path
        check_output_path(args.save_fit, "--save-fit file")
    try:
        c = compare(args.target, hardware=args.hardware, runs=args.runs, warmup=args.warmup,
                    profile_runs=args.profile_runs, overrides=_parse_sets(args.set), fit=args.fit)
    except ProfileError as e:
        print(f"jaxmove: error: {e}", file=sys.stderr)
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
        json.dump(c.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        from ..report.compare_table import render_comparison
        render_comparison(c, top=args.top)
    return 0


def add_compare_command(sub) -> None:
    """Register ``compare`` on the CLI's subparsers."""
    from .common import positive_int

    c = sub.add_parser(
        "compare", help="run TARGET here: per-instruction estimated vs measured time, errors, fit",
        description="Run TARGET (a zoo preset, module:function or file.py:function) on the local "
                    "device with random inputs: warm-up, timed runs, then profiled runs whose events "
                    "are joined to the HLO instructions. Prints per instruction the estimated and "
                    "measured time per program run and their ratio, and per program the estimated vs "
                    "measured time, the median absolute percentage error (MdAPE) over instructions "
                    "taking >= 1% of the run, the time-weighted error and Spearman's rank correlation.")
    c.add_argument("target")
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
    c.add_argument("--save-fit", metavar="PATH", help="with --fit: write the fitted spec as TOML")
    c.set_defaults(func=cmd_compare)
