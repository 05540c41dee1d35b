"""``jaxmove plans`` and the ``--mesh``/``--plan`` options of ``jaxmove analyze``."""

from __future__ import annotations

import argparse
import math
import sys


def _sets(items: list[str]) -> dict[str, str]:
    from .common import _parse_sets
    return _parse_sets(items)


def _cmd_plans(args: argparse.Namespace) -> int:
    from ..capture.resolve import check_plan_target
    from ..plans import compare_plans, parse_mesh
    from .spec_option import hardware_from_args

    check_plan_target(args.model)  # an HLO file or unknown name: one line before anything else
    target = getattr(args, "compile_target", None)
    from ..plans.compare import PlanChildError
    try:
        cmp = compare_plans(args.model, parse_mesh(args.mesh, target) if args.mesh else None,
                            args.plan or None, _sets(args.set), hardware_from_args(args),
                            progress=not args.no_progress, target=target, jobs=args.jobs)
    except PlanChildError as e:
        if e.returncode == 2:  # the child process said what was wrong (one line): no second line
            return 2
        raise
    if args.json:
        from ..report.json_out import dumps_json
        sys.stdout.write(dumps_json(cmp.to_json()))  # strict JSON: no Infinity
    else:
        from ..report.plans_table import render_plans
        render_plans(cmp)
    cache = cmp.compile_cache
    if cache is not None:  # TPU/GPU targets: where the compiles came from
        if cache["dir"] is None:
            print("jaxmove: compile cache off (--no-compile-cache or JAXMOVE_NO_COMPILE_CACHE)",
                  file=sys.stderr)
        else:
            total = cache["reused"] + cache["compiled"]
            print(f"jaxmove: compile cache {cache['dir']}: {cache['reused']} of {total} compiles "
                  "reused (--no-compile-cache to compile again)", file=sys.stderr)
    failed = [r for r in cmp.results if r.error]
    if failed:  # a plan that did not compile is no result (one that does not fit is): as sweep
        from ..plans.devices import in_devices_child
        if not in_devices_child():  # (the parent that re-ran us says it, under its own table)
            from ..report.render_helpers import one_line
            sys.stdout.flush()
            print(one_line(f"jaxmove: {len(failed)} of {len(cmp.results)} plans failed (first: "
                           f"{failed[0].plan}: {failed[0].error}); exit status 1"), file=sys.stderr)
        return 1
    return 0


def add_plans_command(sub) -> None:
    """Register ``jaxmove plans``."""
    from ..plans import DEFAULT_HARDWARE, PRESETS

    p = sub.add_parser(
        "plans", help="compare sharding plans of a model on simulated or target devices",
        description="Compile MODEL (a zoo preset, or package.module:function / file.py:function "
                    "returning a Workload with logical_axes) under each sharding plan on a mesh of "
                    "simulated CPU devices, or of the devices of --target, and print, per device: "
                    "memory (arguments, temporaries, peak), HBM bytes, bytes on the wire by "
                    "collective kind, estimated collective time and the three costliest "
                    "collectives. Plans that do not fit the device's HBM are marked NO (exit 0); exit "
                    "status 1 when a plan failed to compile (the table first), 2 for bad input. "
                    f"Preset plans: {', '.join(PRESETS)}; or a TOML plan file.")
    p.add_argument("model")
    p.add_argument("--mesh", metavar="AXIS=N,...",
                   help="e.g. data=2,model=4 (needed for the cpu target; with --target the default "
                        "is every device of the topology in id order: model of the size of its last "
                        "dimension, data over the rest)")
    from .common import add_compile_target_option
    add_compile_target_option(p)
    p.add_argument("--plan", action="append", default=[], metavar="NAME|plan.toml",
                   help="a preset or TOML plan; repeatable (default: dp, fsdp, tp, fsdp_tp, and ep "
                        "for models with experts)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override the preset's config; repeatable")
    p.add_argument("--hardware", default=None, metavar="NAME|path.toml",
                   help="device for HBM capacity and collective time (default: the --target's spec, "
                        f"else {DEFAULT_HARDWARE})")
    from .spec_option import add_spec_override_option
    add_spec_override_option(p)
    from .common import positive_int
    p.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                   help="compile the plans in N processes (TPU/GPU targets; default: one on a machine "
                        "with 2 CPUs or fewer, else min(plans, CPUs/2, 4)); each holds its own compile "
                        "(about 1.5 GiB for GPT-2 small)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_cmd_plans)


def add_plan_options(a: argparse.ArgumentParser) -> None:
    """``--mesh`` and ``--plan`` for ``jaxmove analyze`` and ``jaxmove annotate``."""
    from .common import _Once
    a.add_argument("--mesh", metavar="AXIS=N,...", action=_Once,
                   help="analyse the per-device program of TARGET (a zoo preset or a module:function "
                        "Workload with logical axes) partitioned over this mesh of simulated CPU "
                        "devices, or of --target devices (with --plan; default plan dp)")
    a.add_argument("--plan", metavar="NAME|plan.toml", action=_Once,
                   help="sharding plan for --mesh: dp, fsdp, tp, fsdp_tp, ep or a TOML file (one; "
                        "`jaxmove plans` compares several)")


def program_for_plan(args: argparse.Namespace):
    """The Program of ``args.target`` under ``--plan`` over ``--mesh`` (on ``--target``
    devices when given), or an exit status when the command re-ran itself in a child process
    with enough simulated devices."""
    from ..capture.resolve import check_plan_target
    from ..capture.targets import Target
    from ..plans import (PlanError, capture_with_plan, check_plan_mesh, ensure_cpu_devices, load_plan,
                        load_workload, parse_mesh)
    from ..plans.devices import in_devices_child

    check_plan_target(args.target)
    from jaxmove import zoo
    if args.target in zoo.PRESETS:  # a bad --set value: one line before "compiling ..."
        zoo.check_overrides(args.target, _sets(args.set))
    tgt = Target.parse(getattr(args, "compile_target", None))
    if not args.mesh and tgt.platform == "cpu":
        raise PlanError("--plan needs --mesh (e.g. --mesh data=2,model=4)")
    mesh = parse_mesh(args.mesh, tgt.name) if args.mesh else tgt.default_mesh()
    plan = load_plan(args.plan or "dp")
    check_plan_mesh(plan, mesh)
    n = math.prod(mesh.values())
    if tgt.platform != "cpu" and n > tgt.num_devices:
        tgt.mesh(mesh)  # raises TargetNameError naming both, before anything is printed
    where = "simulated CPU devices" if tgt.platform == "cpu" else f"{tgt.name} devices"
    if not in_devices_child():  # the child re-run does not say it twice
        print(f"jaxmove: compiling {args.target} under plan {plan.name} on {n} {where}",
              file=sys.stderr, flush=True)
    notes: list[str] = []  # (the plan's dropped rules, or that it shards nothing)
    if tgt.platform != "cpu":
        program = capture_with_plan(load_workload(args.target, _sets(args.set)), None, plan, mesh,
                                    notes, target=tgt.name)
    else:
        if not ensure_cpu_devices(n):
            from ..plans import run_cli_with_devices
            return run_cli_with_devices(n, sys.argv[1:]).returncode
        program = capture_with_plan(args.target, _sets(args.set), plan, mesh, notes)
    import dataclasses

    from ..plans.compare import _count_notes
    mesh_text = ",".join(f"{a}={k}" for a, k in mesh.items())
    return dataclasses.replace(program, notes=program.notes + (
        f"compiled under plan {plan.name} over mesh {mesh_text} ({n} devices): the per-device program",
        *_count_notes(notes)))
