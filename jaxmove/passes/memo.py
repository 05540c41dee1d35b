"""The passes' memo caches of one module, held by the module itself (``Module.memo``).

A module is not changed after parsing, so what a pass derives from it once (the flops of an
applied reducer, the collectives inside a fusion, trip counts...) holds for the module's life
and goes away with it. A copy or pickle of a module starts with empty caches.
"""

from __future__ import annotations


class ModuleMemo:
    """The memo caches of one module (each filled on first use by the pass named).

    Attributes:
      per_call_flops: flops: applied computation (``to_apply``...) -> FlopCount of one application.
      fused_flops: flops: fused computation name -> FlopCount.
      async_wrapped: collectives: computations run by a generic ``async-start``, or None.
      fused_collectives: collectives: fused computation name -> its (instruction, computation)s.
      collective_chains: collectives: computation name -> {channel_id: the fusion that carries
        a decomposed collective's transfer} (XLA:TPU's start/continuation/done fusions).
      while_bodies: traffic: names of the computations that are a ``while`` body, or None.
      trip_counts: trip_count: (computation, while name) -> TripCount.
      attribution: report/attribution.py's index of the module (owners, inferred sources), or None.
      fusion_traffic: traffic: a fusion's key (its fused computation's structural class and
        what of the call site decides its traffic) -> its traffic, notes naming an operand
        left to name.
      default_traffic: traffic: (result shape, repeated operands, operand shapes) -> the
        traffic of an instruction that reads its operands and writes its result whole.
      fusion_kinds: excess: a fusion's key (its fused computation's structural class, result
        shape, operand count, what its attributes say) -> its kernel kind (kernels.classify).
    """

    __slots__ = ("per_call_flops", "fused_flops", "async_wrapped", "fused_collectives",
                 "collective_chains",
                 "while_bodies", "trip_counts", "attribution", "fusion_traffic",
                 "default_traffic", "fusion_kinds")

    def __init__(self) -> None:
        self.per_call_flops: dict = {}
        self.fused_flops: dict = {}
        self.async_wrapped: frozenset[str] | None = None
        self.fused_collectives: dict = {}
        self.collective_chains: dict = {}
        self.while_bodies: frozenset[str] | None = None
        self.trip_counts: dict = {}
        self.attribution: object | None = None
        self.fusion_traffic: dict = {}
        self.default_traffic: dict = {}
        self.fusion_kinds: dict = {}

    def __reduce__(self):
        return ModuleMemo, ()  # caches are not copied: a copy fills its own


def memo_of(module) -> ModuleMemo:
    """``module.memo``, made on first use."""
    m = module.memo
    if m is None:
        m = module.memo = ModuleMemo()
    return m
