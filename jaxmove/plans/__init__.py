"""Sharding plans: map a model's logical axes to a device mesh, compile each plan on
simulated CPU devices or a ``--target``'s devices, and compare memory, HBM bytes and
collectives per device.

    >>> from jaxmove.plans import compare_plans, parse_mesh
    >>> cmp = compare_plans("mlp-tiny", parse_mesh("data=2,model=2"), ["dp", "tp"])
    >>> [(r.plan, r.wire_bytes_by_kind) for r in cmp.results]      # doctest: +SKIP
"""

from .compare import (
    DEFAULT_HARDWARE,
    CollectiveSummary,
    PlanComparison,
    PlanResult,
    capture_with_plan,
    compare_plans,
    default_plans,
    load_workload,
    make_mesh,
    spec_target_mismatch,
    workload_shardings,
)
from .devices import ensure_cpu_devices, run_cli_with_devices
from .plan import (
    LOGICAL_AXES,
    MAX_SIMULATED_DEVICES,
    PRESETS,
    Plan,
    PlanError,
    check_plan_mesh,
    load_plan,
    parse_mesh,
    parse_plan,
)

__all__ = [
    "DEFAULT_HARDWARE", "LOGICAL_AXES", "MAX_SIMULATED_DEVICES", "PRESETS", "check_plan_mesh", "CollectiveSummary", "Plan", "PlanComparison", "PlanError",
    "PlanResult", "capture_with_plan", "compare_plans", "default_plans", "ensure_cpu_devices",
    "load_plan", "load_workload", "make_mesh", "parse_mesh", "parse_plan", "run_cli_with_devices",
    "spec_target_mismatch", "workload_shardings",
]
