"""Time of one NCCL collective on NVIDIA GPUs: ring steps, a per-step latency, a protocol
efficiency, and the slowest link the group spans.

The model is NCCL's own (``src/graph/tuning.cc``: a base latency per algorithm and protocol,
a per-hop latency times the algorithm's steps, and the bus bandwidth times a protocol
efficiency; bus-bandwidth factors from nccl-tests' doc/PERFORMANCE.md), with the
alpha-beta form of Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
Operations in MPICH" (IJHPCA 2005)::

    time = base_latency_s + steps(kind, n) * step_latency_s
           + wire_bytes / (bandwidth_efficiency * link_bytes_per_s)

* ``wire_bytes`` is what one device sends (``passes/collectives.py``: all-reduce
  2(n-1)/n S, all-gather / reduce-scatter / all-to-all (n-1)/n S, collective-permute S).
* ``steps``: ring all-reduce 2(n-1) (reduce-scatter then all-gather), all-gather /
  reduce-scatter (n-1), all-to-all (n-1) (point-to-point exchanges, one per peer),
  collective-permute 1. NCCL's tree and NVLS (NVSwitch multicast) all-reduce are not modeled:
  inside one NVSwitch node the ring's bandwidth term dominates from a few MiB up.
* ``link_bytes_per_s``: ``intra_node_bytes_per_s`` (NVLink through NVSwitch, per GPU per
  direction) when every group stays in one node, else ``inter_node_bytes_per_s``
  (InfiniBand, one NIC per GPU); both from the spec, with sources.
* ``base_latency_s``, ``step_latency_s``, ``bandwidth_efficiency`` are fitted (`NcclParams`,
  `FITTED`) by ``benchmarks/gpu_kernels.py`` on a random half of XLA's measured H100 table
  (``../shared/data/xla_collectives_h100.csv``); the other half is the reported error.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["FITTED", "NcclParams", "collective_time_s", "nccl_model_applies", "steps"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NcclParams:
    """Fitted constants.

    base_latency_s: fixed cost of one collective kernel (launch, the NCCL proxy handshake), s.
    step_latency_s: latency of one algorithm step (a hop through NVSwitch, its flag
      synchronisation), s.
    bandwidth_efficiency: fraction of the link's per-direction bandwidth the protocol
      sustains (NCCL's Simple protocol moves data in chunks with flags between them).
    """

    base_latency_s: float
    step_latency_s: float
    bandwidth_efficiency: float


#: Fitted by benchmarks/gpu_kernels.py (seed 0, the fitting half of xla_collectives_h100.csv).
FITTED = NcclParams(base_latency_s=15.937e-6, step_latency_s=1.231e-6, bandwidth_efficiency=0.5958)

_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
          "collective-permute", "collective-broadcast", "send")


def steps(kind: str, n: int, algorithm: str = "ring") -> int:
    """Latency steps of ``kind`` over a group of ``n`` devices with ``algorithm`` ("ring" or
    "tree"; tree applies to all-reduce only: 2 ceil(log2 n), up the tree and down)."""
    if n <= 1:
        return 0
    if kind in ("collective-permute", "send"):
        return 1
    if kind == "all-reduce":
        return 2 * math.ceil(math.log2(n)) if algorithm == "tree" else 2 * (n - 1)
    return n - 1


def nccl_model_applies(spec) -> bool:
    """True for a GPU spec with an intra-node bandwidth."""
    return getattr(spec, "kind", None) == "gpu" and bool(spec.intra_node_bytes_per_s)


def collective_time_s(kind: str, wire_bytes: float, group_size: int, spec, *,
                      spans_nodes: bool = False, params: NcclParams = FITTED) -> float | None:
    """Seconds for one execution of a collective (module docstring).

    Args:
      kind: ``all-reduce`` | ``all-gather`` | ``reduce-scatter`` | ``all-to-all`` |
        ``ragged-all-to-all`` | ``collective-permute`` | ``collective-broadcast`` | ``send``
        (``recv`` moves nothing of its own: 0).
      wire_bytes: bytes one device sends (``CollectiveInfo.wire_bytes``).
      group_size: devices per group (2 for point-to-point).
      spec: a GPU HardwareSpec.
      spans_nodes: a group holds devices of more than one node (then the inter-node link).
      params: fitted constants.
    Returns:
      seconds; 0.0 when nothing moves; None when the spec lacks the link bandwidth.
    Raises:
      ValueError: an unknown kind or a negative size.
    """
    if kind == "recv":
        return 0.0
    if kind not in _KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(_KINDS)}")
    if wire_bytes < 0 or group_size < 1:
        raise ValueError(f"collective {kind}: wire_bytes={wire_bytes}, group_size={group_size}")
    if wire_bytes == 0 or group_size <= 1:
        return 0.0
    bw = spec.inter_node_bytes_per_s if spans_nodes else spec.intra_node_bytes_per_s
    if not bw:
        return None
    return (params.base_latency_s + steps(kind, group_size) * params.step_latency_s
            + wire_bytes / (params.bandwidth_efficiency * bw))
