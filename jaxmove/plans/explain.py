"""What the partitioner did, when a plan's program moves other tensors than the plan implies.

A plan names where each tensor lives; XLA's SPMD partitioner decides which collectives make
the program correct. They need not be the textbook ones: under ``fsdp`` (weights' ``embed``
dimension sharded, ZeRO-3) the partitioner may keep every weight sharded and, because the
sharded ``embed`` dimension is the contracting dimension of the dots that use it, compute
partial sums on the local shards and all-reduce those (activations move, weights do not);
under ``tp`` it may all-gather a weight whole (an embedding lookup over a vocab-sharded table)
although the plan keeps weights sharded. ``plan_collective_note`` compares the program's
collectives (by kind and by the role of the bytes they read: passes/roles.py) with what the
plan implies and says what happened instead, with the bytes.
"""

from __future__ import annotations

import math

from ..units import human_bytes

__all__ = ["implied_gather_bytes", "plan_collective_note", "weight_gathers_implied"]


def _live_axes(axes, mesh_shape: dict[str, int]) -> list[str]:
    if isinstance(axes, str):
        axes = (axes,)
    return [a for a in axes or () if mesh_shape.get(a, 1) > 1]


def weight_gathers_implied(plan, mesh_shape: dict[str, int], param_axes: set | None = None) -> list[str]:
    """The mesh axes over which ``plan`` shards the weights' ``embed`` dimension (FSDP /
    ZeRO-3: each weight is all-gathered over them where it is used); [] when it shards none.
    ``param_axes``: the mesh axes some parameter leaf was sharded over when the plan was
    applied (``compare.workload_shardings``; a rule that does not divide a dimension is
    dropped, the tensor replicated): only those are implied. None: not known, every axis
    of the rule."""
    axes = _live_axes(plan.params.get("embed"), mesh_shape)
    return axes if param_axes is None else [a for a in axes if a in param_axes]


def _collectives(report) -> list[tuple]:
    """(row, info, role of the bytes it reads, wire bytes per program run) per collective that
    sends bytes (an async pair's start; its done and wrapping rows send none). The role is that
    of its HBM reads, else, for a collective that reads none (XLA:TPU all-gathers a weight shard
    it prefetched into VMEM), that of its operand (the roles pass)."""
    from ..report.report import dominant_role

    roles = getattr(report.analysis, "roles", None) or {}
    out = []
    for row in report.rows:
        c = row.collective
        if c is None or not c.wire_bytes:
            continue
        role = dominant_role(row.total)
        if role == "-" and row.instr.operands:
            rl = roles.get((row.computation, row.instr.operands[0]))
            role = rl[0] if rl else role
        out.append((row, c, role, c.wire_bytes * row.multiplicity.count))
    return out


def implied_gather_bytes(axes: list[str], mesh_shape: dict[str, int], param_leaves: list) -> int:
    """Bytes per device per step that all-gathering the weights over ``axes`` moves (ZeRO-3,
    Rajbhandari et al. 2020, section 5: each device receives the (n - 1) shards it lacks of
    every weight it uses, n = devices over the axes that shard that weight): the sum over
    ``param_leaves`` (``(role, PartitionSpec entries, whole bytes)``, plans/compare.py
    ``workload_shardings``) of role ``weights`` of shard bytes x (n - 1); a leaf those axes do
    not shard (a replicated bias) adds nothing."""
    total = 0
    for role, spec, nbytes in param_leaves:
        if role != "weights":
            continue
        every = [a for s in spec if s is not None for a in ((s,) if isinstance(s, str) else s)]
        n_all = math.prod(mesh_shape.get(a, 1) for a in every)
        n = math.prod(mesh_shape.get(a, 1) for a in every if a in axes)
        if n > 1:
            total += nbytes // n_all * (n - 1)
    return total


def plan_collective_note(plan, report, mesh_shape: dict[str, int], param_axes: set | None = None,
                         param_leaves: list | None = None) -> str | None:
    """A sentence saying what the partitioner did when the plan's program does not move what
    the plan implies, else None.

    * The plan shards the weights' ``embed`` dimension (fsdp, fsdp_tp) but no all-gather reads
      weights: the partitioner computed on the local shards; the note gives the collectives it
      used instead (kinds, counts, wire bytes) and the weight bytes per device that gathering
      would have moved (``implied_gather_bytes`` of ``param_leaves`` when given: (n - 1) x
      the shard of each weight those axes shard; else (n - 1) x the weight bytes the step
      reads, its local shards; n = devices over those axes).
    * The plan does not imply gathering weights but all-gathers read weights: the note names
      the bytes and the largest such collective (instruction, result shape, source line).

    Args:
      plan: a Plan (plans/plan.py).
      report: the Report of the plan's per-device program (roles from the workload).
      mesh_shape: mesh axis name -> size.
      param_axes: the mesh axes some parameter leaf was sharded over (``weight_gathers_implied``);
        None: not known.
      param_leaves: ``(role, PartitionSpec entries, whole bytes)`` of the sharded parameter
        leaves (``implied_gather_bytes``); None: not known.
    Returns None for programs that read no weights (no bytes of role ``weights``).
    """
    weight_bytes = report.totals.role_bytes("weights")[0]  # weight bytes read per step (local shards)
    if not weight_bytes:
        return None
    colls = _collectives(report)
    gathers = [(row, c, b) for row, c, role, b in colls if c.kind == "all-gather" and role == "weights"]
    gathered = sum(b for _r, _c, b in gathers)
    axes = weight_gathers_implied(plan, mesh_shape, param_axes)
    if axes:
        if gathered:
            return None
        n = 1
        for a in axes:
            n *= mesh_shape[a]
        kinds: dict[str, list[int]] = {}
        for row, c, _role, b in colls:
            k = kinds.setdefault(c.kind, [0, 0])
            k[0] += row.multiplicity.count
            k[1] += b
        did = ", ".join(f"{cnt} {kind}{'s' if cnt != 1 else ''} ({human_bytes(b)} on the wire)"
                        for kind, (cnt, b) in sorted(kinds.items(), key=lambda kv: -kv[1][1]))
        where = ",".join(f"{a}={mesh_shape[a]}" for a in axes)
        if kinds:
            how = (f"it kept every weight sharded and computed on the local shards; its collectives are "
                   f"{did}: where the sharded embed dimension is a dot's contracting dimension, each "
                   "device gets a partial sum that an all-reduce completes, so activations move instead "
                   "of weights")
        else:
            how = "it kept every weight sharded and computed on the local shards with no collective at all"
        implied = (implied_gather_bytes(axes, mesh_shape, param_leaves) if param_leaves is not None
                   else weight_bytes * (n - 1))
        return (f"plan {plan.name} shards the weights' embed dimension over {where}, which implies "
                f"all-gathering each weight where it is used (ZeRO-3: about {human_bytes(implied)} "
                f"per device per step for the {human_bytes(weight_bytes)} of weight shards it reads); XLA's "
                f"partitioner gathered no weights: {how}")
    if gathered:
        row, c, b = max(gathers, key=lambda g: g[2])
        loc = report.module.source_location(row.instr)
        src = f" at {loc.file}:{loc.line}" if loc is not None else ""
        return (f"plan {plan.name} does not gather weights, but XLA's partitioner all-gathered "
                f"{human_bytes(gathered)} of them per step ({len(gathers)} all-gather(s); the largest "
                f"{row.instr.name} -> {row.instr.shape}, {human_bytes(b)}{src}): the computation using "
                "that weight could not run on its shards")
    return None
