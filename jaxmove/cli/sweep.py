"""``jaxmove sweep SWEEP.toml``: compile a grid of points locally or on Ray, rank the results."""

from __future__ import annotations

import argparse
import sys

from .common import positive_int


def _positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a positive number), got {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds (a positive number), got {text!r}")
    return v


def check_plot_path(path: str) -> None:
    """``--plot FILE``: matplotlib must be installed and FILE's extension one of the image
    formats it writes (``Figure.canvas.get_supported_filetypes()``: png, svg, pdf, ...);
    checked before the sweep runs (it was an internal error after it).

    Raises:
      UsageError: no or an unknown extension, or matplotlib is missing.
    """
    from pathlib import Path

    from ..errors import UsageError
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(f"--plot {path}: the Pareto plot needs matplotlib (pip install matplotlib)") from None
    formats = Figure().canvas.get_supported_filetypes()
    ext = Path(path).suffix.lower().lstrip(".")
    if ext not in formats:
        shown = ", ".join(f".{f}" for f in sorted(formats))
        raise UsageError(f"--plot {path}: " + (f"unknown image format '.{ext}'" if ext else "no extension")
                         + f"; expected a file name ending in one of {shown}")


def _cmd_sweep(args: argparse.Namespace) -> int:
    from ..report.outputs import check_output_path
    from ..sweep import load_sweep, sweep
    from .common import check_distinct_outputs

    check_distinct_outputs([("-o", args.output), ("--html", args.html), ("--plot", args.plot)])
    for path, what in ((args.html, "--html file"), (args.plot, "--plot file")):
        if path:
            check_output_path(path, what)
    if args.plot:
        check_plot_path(args.plot)
    spec = load_sweep(args.sweep)  # bad SWEEP.toml: one line before anything starts
    if args.resume and not args.output:   # (said before the sweep's first line, as the rest)
        from ..sweep.run import SweepError
        raise SweepError("--resume needs the result file of the sweep to continue (-o FILE)")
    if args.output:  # a result file in the way or unreadable: said before the sweep's first line
        from ..sweep.store import check_result_file
        check_result_file(args.output, args.resume, args.overwrite)
    if not args.json and not args.no_progress:
        print(f"jaxmove: sweep {spec.name}: {len(spec.points)} points, {args.executor} executor",
              file=sys.stderr, flush=True)
    result = sweep(spec, executor=args.executor, jobs=args.jobs, address=args.address,
                   timeout_s=args.timeout, output=args.output, resume=args.resume,
                   overwrite=args.overwrite, progress=not args.no_progress)
    if args.html:
        result.write_html(args.html)
        print(f"jaxmove: wrote {args.html}", file=sys.stderr)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        result.pareto_plot(path=args.plot)
        print(f"jaxmove: wrote {args.plot}", file=sys.stderr)
    if args.output:
        print(f"jaxmove: results in {args.output}", file=sys.stderr)
    if args.json:
        from ..report.json_out import dumps_json
        sys.stdout.write(dumps_json(result.to_json()))  # strict JSON: no Infinity
    else:
        from ..sweep.render import render_table
        render_table(result, top=args.top)
    counts = result.counts()
    failed = counts["error"] + counts["died"] + counts["timeout"]
    if failed:  # a point that does not fit is a result; one that did not compile is not
        print(f"jaxmove: {failed} of {counts['points']} points failed (error {counts['error']}, died "
              f"{counts['died']}, timeout {counts['timeout']}); exit status 1", file=sys.stderr)
        return 1
    return 0


def add_sweep_command(sub) -> None:
    """Register ``jaxmove sweep``."""
    p = sub.add_parser(
        "sweep", help="compile a grid of models x configs x meshes x plans (local or Ray), rank them",
        description="Compile and analyse every point of SWEEP.toml (a [grid] and/or [[points]] over "
                    "model, --set values, target, mesh and plan), each in its own process, and rank "
                    "them: fastest estimated step time that fits the device's memory first. Per point: "
                    "fits, memory per device, HBM bytes by role, wire bytes by collective kind, step "
                    "time and bound, compile time, or the error. Exit status 1 when any point failed "
                    "(error, died, timeout; a point that does not fit is a result), 2 for a bad "
                    "SWEEP.toml.")
    p.add_argument("sweep", metavar="SWEEP.toml")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local: a pool of --jobs worker processes here (default); ray: Ray tasks "
                        "(pip install 'jaxmove[ray]')")
    p.add_argument("--jobs", type=positive_int, metavar="N",
                   help="points at once (default: CPU count here; for ray the cluster's CPUs)")
    p.add_argument("--address", metavar="auto|ray://HOST:PORT",
                   help="ray cluster to use (default: start a local Ray instance for the sweep)")
    p.add_argument("--timeout", type=_positive_seconds, metavar="SECONDS",
                   help="per point, from when its worker has started (Python and jax imported); a worker "
                        "past it is killed and the point retried once")
    p.add_argument("-o", "--output", metavar="FILE.parquet|FILE.jsonl",
                   help="write each point's row as it finishes (Parquet or JSON lines)")
    existing = p.add_mutually_exclusive_group()  # (what to do with an existing -o file: one)
    existing.add_argument("--resume", action="store_true",
                          help="continue the sweep in -o: finished points are not compiled again")
    existing.add_argument("--overwrite", action="store_true", help="replace an existing -o file")
    from .common import add_no_compile_cache_option
    add_no_compile_cache_option(p)  # local workers inherit it (JAXMOVE_NO_COMPILE_CACHE=1)
    p.add_argument("--json", action="store_true", help="print JSON (ranked points) instead of the table")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page of the sweep")
    p.add_argument("--plot", metavar="FILE.png|.svg",
                   help="also write the Pareto plot (step time vs memory per device)")
    p.add_argument("--top", type=positive_int, default=30, help="points in the table (default 30)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_cmd_sweep)
