"""The causes of excess movement: one rule per cause, in one table (``CAUSES``).

Each rule has its JSON ``kind`` (``CAUSE_KINDS``: stable keys, may be added to, never removed),
what it matches, how its bytes are counted, how it takes part in the accounting
(``compulsory.py`` reads these fields, never a cause's name), and its fix text: the change that
would remove it, in the words a JAX user acts on. A kernel cause (a kernel's own kind) also
names its matcher, the function of ``kernels.py`` that recognises it. A new cause is a new
``@cause(...)`` rule here (and, for a kernel cause, its matcher in ``kernels.classify``).

``register`` refuses a duplicate kind (as torch's ``register_flop_formula`` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...units import human_bytes
from . import kernels

UNATTRIBUTED = "unattributed"


@dataclass(frozen=True, slots=True)
class FixContext:
    """What a fix text is written from: the cause's kind and subject (a parameter path or an
    argument name; "" program-wide), its bytes per step, the costliest instruction's name
    (``first``), the argument number of a not-donated argument (or None), whether the
    costliest instruction evicts a buffer from on-chip memory (a TPU ``copy-start`` VMEM -> HBM)
    and the spec's on-chip capacity in bytes (None: no spec, so no capacity known)."""

    kind: str
    subject: str
    nbytes: int
    first: str
    argnum: int | None = None
    vmem_eviction: bool = False
    onchip_capacity_bytes: int | None = None
    #: (the result jax would give the argument's buffer if donated, the result that updates it)
    #: where those differ (``not_donated``), else None
    paired_elsewhere: tuple[int, int] | None = None
    #: the argument is held in VMEM and read there in a loop or whole (``not_donated``)
    read_on_chip_in_a_loop: bool = False

    @property
    def saves(self) -> str:
        return f"saves {human_bytes(self.nbytes)} per step"

    def named(self, what: str) -> str:
        """The subject in backticks, else ``what``."""
        return f"`{self.subject}`" if self.subject else what


@dataclass(frozen=True, slots=True)
class CauseRule:
    """One cause.

    Attributes:
      kind: the JSON key (``excess.causes[].kind``).
      matches: which bytes it takes (documentation, shown by ``jaxmove`` nowhere else).
      bytes: how its bytes are computed.
      fix: FixContext -> the fix text.
      program_wide: its bytes are grouped without a subject (one cause per program).
      kernel: a cause of a kernel's own kind (``kernels.classify`` returns it): what the kernel
        writes into an intermediate is this cause's.
      reads_compulsory: the kernel's operand reads are compulsory as any kernel's (only its
        writes, and reading them back, are this cause's).
      read_priority: the order in which a buffer's compulsory read is granted among kernels
        that read it: 0 first; 1 a copy kernel (its reader claims what it reads); 2
        (``RECOMPUTE_PRIORITY``) a recomputation, granted last (its reads count in a
        parameter's footprint only for a clone whose original is gone).
      matcher: the function of ``kernels.py`` that recognises a kernel cause, or None.
    """

    kind: str
    matches: str
    bytes: str
    fix: Callable[[FixContext], str]
    program_wide: bool = False
    kernel: bool = False
    reads_compulsory: bool = False
    read_priority: int = 0
    matcher: Callable | None = None


CAUSES: dict[str, CauseRule] = {}
RECOMPUTE_PRIORITY = 2


def register(rule: CauseRule) -> CauseRule:
    """Add ``rule`` to ``CAUSES``. Raises ValueError for a kind already registered."""
    if rule.kind in CAUSES or rule.kind == UNATTRIBUTED:
        raise ValueError(f"excess cause {rule.kind!r} is registered twice")
    CAUSES[rule.kind] = rule
    return rule


def cause(kind: str, *, matches: str, bytes: str, **flags):
    """Decorator: register the decorated fix function as the rule of ``kind``."""
    def deco(fix: Callable[[FixContext], str]) -> Callable[[FixContext], str]:
        register(CauseRule(kind, matches, bytes, fix, **flags))
        return fix
    return deco


# ---- the rules, in the order of the JSON's CAUSE_KINDS ------------------------------------------

@cause("not_donated", read_priority=1,
       matches="a copy kernel of a parameter whose update the program returns, the argument not "
               "donated (XLA copies an argument it may not overwrite)",
       bytes="the copy's write, and its reads of the parameter beyond the parameter's footprint")
def _not_donated(c: FixContext) -> str:
    how = f"donate_argnums=({c.argnum},)" if c.argnum is not None else "donate_argnums / donate_argnames"
    if c.paired_elsewhere is not None:
        paired, update = c.paired_elsewhere
        return (f"donate `{c.subject}` -- jax.jit(..., {how}) -- and return its update (result {update}) "
                f"before result {paired}: jax pairs a donated argument with the first unpaired result of "
                f"its shape and dtype, in output order, so donated as the results stand its buffer goes to "
                f"result {paired} and XLA copies it out and the update in instead -- {c.saves} once paired")
    if c.read_on_chip_in_a_loop:
        return (f"donating `{c.subject}` -- jax.jit(..., {how}) -- removes this copy ({human_bytes(c.nbytes)} "
                "per step), but kept, XLA:TPU holds it in VMEM for the kernels that read it (in a loop, or "
                "whole), and donated it may leave it in HBM and read it there instead, which can cost "
                "more: compile both and compare")
    return f"donate `{c.subject}` -- jax.jit(..., {how}) -- {c.saves}"


@cause("donated_but_copied", read_priority=1,
       matches="as not_donated, but the argument is donated; and a copy that keeps its source's "
               "layout of a donated argument whose buffer a result takes, or into that result "
               "(XLA's copy insertion where the program reads the argument after that result is "
               "written)",
       bytes="as not_donated; a copy's write, and its reads beyond the source's footprint")
def _donated_but_copied(c: FixContext) -> str:
    return (f"`{c.subject}` is donated but XLA still copies it (`{c.first}`) before updating it: the "
            "program also reads the old value after the update is scheduled, or returns it with "
            "another layout or sharding, or the result jax gave its buffer is not its update (jax "
            "pairs each donated argument with the first unpaired result of its shape and dtype, in "
            "output order); read it before updating it, return it as it came in and in that "
            f"position, or do not donate it -- {c.saves}")


@cause("materialized_intermediate",
       matches="an intermediate (written by one kernel, read by others) that fits on chip (its data "
               "bytes at most the spec's on-chip capacity)",
       bytes="its writes and reads (none of them compulsory)")
def _materialized_intermediate(c: FixContext) -> str:
    return (f"values written by one kernel and read back by the next fit on chip (e.g. `{c.first}`): "
            "a fusion boundary; let XLA fuse the pair (avoid optimization barriers, custom calls and "
            f"sharding constraints between them) or write one Pallas kernel -- {c.saves}")


@cause("layout_change", kernel=True, read_priority=1, matcher=kernels.copy_kind,
       matches="a copy kernel (copy / transpose / reshape, or a fusion whose root is a chain of them "
               "from one parameter) that keeps the element type and the whole buffer",
       bytes="its write, and the reads of the copy beyond the source's footprint")
def _layout_change(c: FixContext) -> str:
    return (f"`{c.first}` copies {c.named('a buffer')} into another layout: "
            "store it in the layout its consumer reads (e.g. a KV cache as [B, H, S, D] for attention "
            f"over S) or drop the transpose/swapaxes -- {c.saves}")


@cause("dtype_conversion", kernel=True, read_priority=1, matcher=kernels.copy_kind,
       matches="a copy kernel whose chain converts the element type",
       bytes="as layout_change (the source's footprint in the source's width)")
def _dtype_conversion(c: FixContext) -> str:
    return (f"`{c.first}` converts {c.named('a value')} to another dtype and "
            "back or before use: keep it in the dtype it is used in (store it so, or compute in it with "
            f"preferred_element_type) -- {c.saves}")


@cause("re_read",
       matches="a parameter read beyond its footprint, or a spilled intermediate read more often than "
               "written (several kernels, or every loop iteration)",
       bytes="the reads beyond the buffer's read budget")
def _re_read(c: FixContext) -> str:
    return (f"{c.named('buffers')} read again by several kernels or loop "
            f"iterations (e.g. `{c.first}`): fuse the consumers or reorder the work so it is read once -- "
            f"{c.saves}")


@cause("tiling_re_read",
       matches="a dot whose operands exceed on-chip memory (passes/reuse.py's tiling model)",
       bytes="the operand re-reads per output tile, split between the operands' roles")
def _tiling_re_read(c: FixContext) -> str:
    return (f"dot operands exceed on-chip memory and are re-read per output tile (e.g. `{c.first}`): "
            f"split the dot into blocks whose operands fit, or reuse each block -- {c.saves}")


@cause("whole_rewrite",
       matches="a write of a parameter's update (the result aliased to it, or built on a copy of it) "
               "beyond the update's bytes; a result rebuilt around a window, or copied whole from a "
               "buffer updated in place, in every run of a loop (a scan's ys stack: XLA:CPU's bf16 "
               "rebuild, XLA:TPU's copy out of VMEM) beyond the result's bytes; an in-place patch of "
               "a result a copy wrote whole (``return x, x.at[i].set(v)``: the row after the copy)",
       bytes="the written bytes beyond the in-place update's")
def _whole_rewrite(c: FixContext) -> str:
    if c.vmem_eviction:
        return (f"{c.named('a buffer')} is updated in place on chip, but XLA:TPU's memory-space assignment "
                f"placed the whole buffer in VMEM (S(1)) and `{c.first}` copies it back to HBM "
                "whole: a compiler choice, not the program's (its dynamic_update_slice is already in "
                "place); a cache too large for VMEM, or a Pallas kernel that writes only the new "
                f"rows, avoids it -- {c.saves}")
    return (f"{c.named('a result')} is rewritten whole (`{c.first}`) though only part of it changes: update it in "
            "place with jax.lax.dynamic_update_slice / .at[].set on the donated buffer (no concatenate, "
            f"no restacking in a scan) -- {c.saves}")


@cause("tile_padding",
       matches="tiled layouts (TPU T(8,128)): physical bytes beyond the data bytes",
       bytes="physical minus logical bytes of every HBM access")
def _tile_padding(c: FixContext) -> str:
    return ("tiled layouts move whole tiles: make the minor dimensions multiples of the tile (128 lanes; "
            f"8 sublanes for 32-bit, 16 for bf16) or put large dimensions last -- {c.saves}")


@cause("split_k_partials", kernel=True, program_wide=True, reads_compulsory=True,
       matcher=kernels.split_k,
       matches="a Triton gemm fusion with split_k > 1 (xla/service/gpu/split_k_gemm_rewriter.cc), or "
               "whose root dot's [S, M, N] result every consumer sums over S "
               "(xla/service/gpu/transforms/splitk_rewriter.cc)",
       bytes="its partial sums written, and read back by the reduction")
def _split_k_partials(c: FixContext) -> str:
    return (f"split-K writes partial sums (`{c.first}`) and reads them back to reduce them. A dot "
            f"with an [S, M, N] result summed over S is XLA:GPU's SplitkRewriter "
            f"(xla/service/gpu/transforms/splitk_rewriter.cc): its heuristics choose S from the "
            f"dot's M, N, K and the GPU's core count, the same with or without the device; "
            f"compiler_options={{'xla_gpu_experimental_force_split_k': 1}} turns it off (time both "
            f"on the device: for a skinny GEMM the split buys parallelism). A Triton gemm config's "
            f"split_k is the autotuner's choice (compiled without the device, its default). A "
            f"larger output (M·N) or a shorter contraction needs no split -- {c.saves}")


@cause("rematerialization", kernel=True, program_wide=True, read_priority=RECOMPUTE_PRIORITY,
       matcher=kernels.is_remat,
       matches="an instruction XLA's rematerialization cloned (*.remat*) or one of a jax.checkpoint's "
               "recomputation (op_name rematted_computation)",
       bytes="all its traffic beyond what the buffers' first readers were granted")
def _rematerialization(c: FixContext) -> str:
    return (f"recomputed forward work (`{c.first}`, jax.checkpoint or XLA's rematerialization): save these "
            "values instead (a jax.checkpoint policy such as dots_saveable, or more memory) -- "
            f"{c.saves}")


@cause("all_gather_partly_used",
       matches="an all-gather whose result the program reads only in part",
       bytes="the wire bytes in proportion to the unread part of the result")
def _all_gather_partly_used(c: FixContext) -> str:
    return (f"only part of the all-gather's result is read (`{c.first}`): gather just that part, or shard "
            f"the consumer like the operand -- {c.saves}")


@cause("collective_wider_than_data",
       matches="a collective whose operand was converted from a narrower float to be sent",
       bytes="the wire bytes beyond the data's width")
def _collective_wider_than_data(c: FixContext) -> str:
    return (f"`{c.first}` sends data wider than it is (converted to f32 to be sent): XLA:CPU promotes bf16 "
            "collectives; on TPU/GPU keep the dtype, or convert after the collective -- "
            f"{c.saves}")


@cause("host_round_trip", kernel=True, program_wide=True, read_priority=1,
       matcher=kernels.is_host_round_trip,
       matches="a host offload and its return (MoveToHost / MoveToDevice, copies between host and "
               "device memory); the program's own infeed/outfeed/send/recv are compulsory",
       bytes="all its traffic")
def _host_round_trip(c: FixContext) -> str:
    return (f"data goes to host memory and back (`{c.first}`): keep it on device if it fits (drop the "
            f"host offload / memory_kind='pinned_host' or the checkpoint offload policy) -- {c.saves}")


@cause("dot_as_multiply_reduce", kernel=True, program_wide=True, reads_compulsory=True,
       matcher=kernels.is_dot_as_multiply_reduce,
       matches="a dot with a 1-row operand XLA compiled as a multiply kernel whose product a reduce "
               "kernel reads back (AlgebraicSimplifier's dot strength reduction)",
       bytes="the product written, and read back by the reduce")
def _dot_as_multiply_reduce(c: FixContext) -> str:
    return (f"XLA rewrote a dot with a 1-row operand into a multiply (`{c.first}`) and a reduce in two "
            f"kernels: the [K,N] product goes to HBM and back; give the dot at least 2 rows "
            f"(batch >= 2 decode stays a GEMM on XLA:GPU) or write the GEMV as one Pallas kernel -- "
            f"{c.saves}")


@cause("slice_copy", kernel=True, read_priority=1, matcher=kernels.copy_kind,
       matches="a (dynamic-)slice kernel, or a fusion (or every element of a multi-output fusion) "
               "slicing a window of a parameter or of a copy of one (a scanned layer's window of a "
               "stacked weight or KV cache)",
       bytes="the copy's read of the source and its write; the reader's read of the window is the "
             "source's compulsory read")
def _slice_copy(c: FixContext) -> str:
    return (f"`{c.first}` copies a window of {c.named('a buffer')} "
            "(a slice / dynamic_slice, e.g. a scanned layer's slice of a stacked KV cache or "
            "weight) into a buffer of its own that the next kernel reads back: XLA did not fuse "
            "the slice into its consumer; index the stacked array inside the consuming op, keep "
            "one array per layer (scan_layers=false), or read the window in a Pallas kernel -- "
            f"{c.saves}")


@cause("whole_table_read",
       matches="a weights parameter the program uses only as the table of lookups (gather / "
               "dynamic-slice of rows, a one-hot dot; excess/lookups.py) read beyond the rows the "
               "lookups touch: copied whole into on-chip memory (XLA:TPU's layout copy of a table "
               "sharded over d_model into VMEM), or read whole by a one-hot matmul",
       bytes="the table's reads beyond the lookups' footprint (the gathered rows: tokens x "
             "d_model x width)")
def _whole_table_read(c: FixContext) -> str:
    return (f"the lookup of {c.named('a table')} reads the whole local table shard (`{c.first}`) "
            "to use a few rows: XLA copies the shard into on-chip memory (its layout does not keep "
            "rows contiguous: a table sharded over d_model is stored vocab-minor) or multiplies it "
            "by a one-hot matrix; shard the table over vocab with a vocab-parallel lookup (each "
            "device gathers the rows of its vocab range, then a psum), keep the per-device d_model "
            f"a multiple of 128, or use jnp.take instead of a one-hot matmul -- {c.saves}")


@cause("concatenated_copy", kernel=True, program_wide=True, reads_compulsory=True,
       matcher=kernels.is_concatenated_copy,
       matches="a kernel that only concatenates buffers (a concatenate, or a fusion whose root is "
               "one of copy chains from its parameters) into an intermediate, e.g. XLA's DotMerger "
               "merging two dots that share an operand by concatenating their weights "
               "(xla/hlo/transforms/simplifiers/dot_merger.cc)",
       bytes="the concatenation written, and read back by its consumers (its reads of the sources "
             "are compulsory as any kernel's)")
def _concatenated_copy(c: FixContext) -> str:
    return (f"`{c.first}` concatenates buffers into a new one that the next kernel reads back (XLA's "
            "DotMerger concatenates the weights of two dots that share an input, every step): give "
            "the dots different result types (e.g. preferred_element_type=float32 on the smaller "
            "one), or store the weights concatenated ahead of time and slice the result -- "
            f"{c.saves}")


SPILL = "spilled_intermediate"


@cause(SPILL,
       matches="an intermediate larger than the spec's on-chip capacity (or any intermediate when "
               "no capacity is known: no spec), written to HBM and read back once per byte written "
               "(reading it more often is re_read)",
       bytes="its writes and its first read of each byte written (none of them compulsory: "
             "compulsory traffic depends on the program's semantics alone, not on the on-chip "
             "capacity, DESIGN.md)")
def _spilled_intermediate(c: FixContext) -> str:
    if c.onchip_capacity_bytes is None:
        return (f"values written by one kernel to HBM and read back by another (e.g. `{c.first}`); "
                "without a hardware spec jaxmove cannot tell which fit on chip: pass --hardware "
                "(or --target) to split them into fusion boundaries (materialized_intermediate) "
                f"and spills -- {c.saves}")
    return (f"values larger than the {human_bytes(c.onchip_capacity_bytes)} of on-chip memory are "
            f"written to HBM and read back (e.g. `{c.first}`): compute them where they are consumed, "
            "tile by tile (a fused or Pallas kernel: flash attention for attention scores); in a "
            f"training step, recompute saved activations in the backward pass (jax.checkpoint) -- "
            f"{c.saves}")


@cause("end_of_program_prefetch", kernel=True, read_priority=1,
       matcher=kernels.is_end_of_program_prefetch,
       matches="XLA:TPU's end-of-program prefetch: a copy-start that refills a freed "
               "cross-program-prefetched parameter in on-chip memory for the next run (its "
               "copy-done unused); the run's own cross-program prefetch holds the parameter's "
               "compulsory read",
       bytes="its read of the parameter (one run moves it twice; in back-to-back runs the next "
             "run's cross-program prefetch is skipped, so this read replaces that one)")
def _end_of_program_prefetch(c: FixContext) -> str:
    return (f"XLA refills {c.named('a parameter')} in on-chip memory at the end of the program "
            f"(`{c.first}`) for the next run, whose own cross-program prefetch is then skipped: in "
            "back-to-back runs (a decode loop) this read replaces that one, nothing to change; a "
            f"single run moves the parameter twice -- {c.saves} on a single run only")


@cause("whole_prefetch",
       matches="a parameter other than a weights table that XLA copies whole into on-chip memory "
               "(XLA:TPU's cross-program prefetch into VMEM) while the program reads only windows "
               "of it there (dynamic-slice / gather of rows; excess/lookups.py)",
       bytes="the copy's read beyond the windows' footprint")
def _whole_prefetch(c: FixContext) -> str:
    return (f"XLA copies all of {c.named('a parameter')} into on-chip memory (`{c.first}`) to read "
            "a window of it: pass the program only the window it needs (slice it where it is made), "
            f"or make the array too large to prefetch whole -- {c.saves}")


@cause("buffer_copy", read_priority=1,
       matches="a ``copy`` kernel that moves its source as it is (the same dimensions, layout, tiles "
               "and memory space: nothing relaid out), not a donation's (``donated_but_copied``) nor "
               "a not-donated argument's: XLA's copy insertion (hlo/copy_insertion.cc), which copies a "
               "value that an in-place write would otherwise overwrite while it is still read -- a "
               "while loop's state initialised from a constant, a broadcast or a value read after "
               "the loop, a loop-carried value read after the body updates it, a value returned twice",
       bytes="as layout_change: its write, and the reads of the copy beyond the source's footprint")
def _buffer_copy(c: FixContext) -> str:
    return (f"`{c.first}` copies {c.named('a buffer')} as it is (the same layout: no relayout): XLA's "
            "copy insertion keeps a value that an in-place write would overwrite -- a while loop's "
            "state (a scan's carry initialised from zeros or from a value also read after the loop, "
            "a loop-carried value read after the body updates it) or a value returned twice; make "
            "the carry's initial value inside the loop, read the old value before it is updated, or "
            f"return one value once -- {c.saves}")


@cause("overwritten_fill",
       matches="a result buffer first written with a constant (a broadcast: XLA's zero initial "
               "value of a scan's stacked outputs, ``jax.lax.scan``'s ys) that in-place "
               "dynamic-update-slices then overwrite, row by row",
       bytes="the fill's write (the result's compulsory write is the data the updates write)")
def _overwritten_fill(c: FixContext) -> str:
    return (f"`{c.first}` fills a result with a constant that the loop then overwrites in place (XLA's "
            "initial value of a scan's stacked outputs): the fill is written and never read. For a "
            "large stacked output (a prefill's KV cache returned as scan ys), write into a donated, "
            "preallocated buffer with dynamic_update_slice in a fori_loop instead, or stack fewer "
            f"outputs -- {c.saves}")


#: Stable cause keys of the JSON ``excess.causes[].kind`` (may be added to, never removed).
CAUSE_KINDS = tuple(CAUSES)


def fix_text(c: FixContext) -> str:
    """The fix of ``c.kind``'s rule; for the unattributed excess, where to look."""
    rule = CAUSES.get(c.kind)
    if rule is None:
        return f"excess no rule explains (e.g. `{c.first}`) -- {human_bytes(c.nbytes)} per step"
    return rule.fix(c)


# the accounting's view of the table (compulsory.py): sets of kinds by the flags above
PROGRAM_WIDE = frozenset(k for k, r in CAUSES.items() if r.program_wide)
KERNEL_WRITES = frozenset(k for k, r in CAUSES.items() if r.kernel)
READS_COMPULSORY = frozenset(k for k, r in CAUSES.items() if r.reads_compulsory)
READ_PRIORITY = {k: r.read_priority for k, r in CAUSES.items()}
