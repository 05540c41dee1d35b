"""The one table of HLO opcodes: what each opcode is, for every pass and the validator.

One :class:`Opcode` record per opcode XLA prints (xla/hlo/ir/hlo_opcode.h, ``HLO_OPCODE_LIST``,
plus the older spellings jaxmove keeps reading), and one :class:`CustomCallTarget` record per
custom-call target the TPU and GPU compilers emit that jaxmove models. The passes derive their
opcode sets from here (``names(...)``) instead of keeping their own lists; tests/test_opcodes.py
checks that every opcode here has a rule in every pass's table (or is declared as moving /
computing nothing) and that every rule table key is an opcode of this table.

Asynchronous forms (xla/hlo/ir/hlo_instructions.h, ``HloAsyncInstruction``): XLA prints an
``async-start`` that wraps one instruction with the wrapped opcode as prefix (syntax sugar):
``slice-start`` / ``slice-done`` is an async ``slice``, ``reduce-scatter-start`` an async
``reduce-scatter``. The start's shape is ``((operands...), result, context...)``; the done's is
the result. :data:`ASYNC_WRAPPED` lists the opcodes XLA:TPU and XLA:GPU wrap so; their
``*-start`` carries the wrapped op's work, ``*-update`` / ``*-done`` move nothing. Older opcodes
with their own start/done (``all-reduce-start``, ``copy-start``, ``send``/``send-done`` ...)
have records of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

# Categories (one per opcode).
CATEGORIES = ("structural", "elementwise", "data-movement", "matrix", "reduction", "control-flow",
              "collective", "async", "io", "random", "linear-algebra", "other")


@dataclass(frozen=True, slots=True)
class Opcode:
    """One HLO opcode.

    Attributes:
      name: the opcode as printed (``dynamic-update-slice``).
      arity: operand count rule: an int (exactly n), or ``">=1"``, ``"even>=2"``, ``"odd>=3"``,
        ``"1|4"``, ``"variadic"`` (no check); from ``HloOpcodeArity`` and the ``Create*``
        factories.
      category: one of :data:`CATEGORIES`.
      moves_data: False when the instruction moves no bytes itself (parameter, bitcast, tuple,
        control flow whose bodies are costed, the ``*-done`` of an async pair ...).
      computes: False when it does no arithmetic (HloCostAnalysis sets no flops).
      elementwise: one operation per output element (``HandleElementwiseOp``).
      transcendental: counted as a transcendental, not a flop.
      same_dims: every array operand has the result's dimensions (no implicit broadcast).
      element_preserving: a footprint demanded of its result is demanded of its operands
        (keeps the element count, touches each operand element at most once per output).
      roles_pass: the result holds the role of operand 0 (data moved or re-typed, not computed).
      fused_roles_pass: the same inside a fused computation (tracing a fusion root back).
      roles_back: an aliased output's role flows back through it to operand 0.
      same_shape_as_operand0: the parser may take the result shape from operand 0.
      async_part: ``"start"`` / ``"update"`` / ``"done"`` for async pairs, else None.
      async_of: the wrapped opcode (``slice`` for ``slice-start``) or the synchronous op of a
        native pair (``all-reduce`` for ``all-reduce-start``); None otherwise.
      async_queue: the side queue an async start runs on: ``"network"``, ``"copy"`` or
        ``"async_call"`` (a ``call-start``'s callee on another execution thread).
      collective: the collective kind it runs (``all-gather`` ...), or None.
      control_flow: calls computations that run as their own kernels (while, call ...).
      quiet: the report's short list leaves it out (moves and computes nothing of interest).
      aliases_operand: its result is (part of) an operand's buffer, not a new buffer.
    """

    name: str
    arity: int | str = "variadic"
    category: str = "other"
    moves_data: bool = True
    computes: bool = True
    elementwise: bool = False
    transcendental: bool = False
    same_dims: bool = False
    element_preserving: bool = False
    roles_pass: bool = False
    fused_roles_pass: bool = False
    roles_back: bool = False
    same_shape_as_operand0: bool = False
    async_part: str | None = None
    async_of: str | None = None
    async_queue: str | None = None
    collective: str | None = None
    control_flow: bool = False
    quiet: bool = False
    aliases_operand: bool = False


OPCODES: dict[str, Opcode] = {}


def _add(name: str, **kw) -> None:
    if name in OPCODES:
        raise ValueError(f"opcode {name!r} defined twice")
    OPCODES[name] = Opcode(name, **kw)


# ---- structural: move and compute nothing -----------------------------------------------
for _n, _a in (("parameter", 0), ("constant", 0), ("tuple", "variadic"), ("get-tuple-element", 1),
               ("after-all", "variadic")):
    _add(_n, arity=_a, category="structural", moves_data=False, computes=False, quiet=True,
         aliases_operand=_n in ("tuple", "get-tuple-element"))
_add("bitcast", arity=1, category="structural", moves_data=False, computes=False, quiet=True,
     element_preserving=True, roles_pass=True, fused_roles_pass=True, roles_back=True,
     same_shape_as_operand0=True, aliases_operand=True)
_add("add-dependency", arity=2, category="structural", moves_data=False, computes=False,
     quiet=True, aliases_operand=True)
_add("domain", arity=1, category="structural", moves_data=False, computes=False,
     aliases_operand=True)
for _n in ("opt-barrier", "optimization-barrier"):  # XLA prints opt-barrier; older dumps the long name
    _add(_n, arity=1, category="structural", moves_data=False, computes=False, roles_pass=True,
         same_shape_as_operand0=True, aliases_operand=True)
_add("get-dimension-size", arity=1, category="structural", moves_data=False, computes=False)
_add("partition-id", arity=0, category="structural", moves_data=False, computes=False)
_add("replica-id", arity=0, category="structural", moves_data=False, computes=False)

# ---- elementwise (HloCostAnalysis::HandleElementwiseOp and friends) -----------------------
_TRANSCENDENTAL_UNARY = ("erf", "exponential", "exponential-minus-one", "log", "log-plus-one",
                         "logistic", "sqrt", "cbrt", "rsqrt", "tanh", "sine", "cosine", "tan",
                         "acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh")
_PLAIN_UNARY = ("abs", "ceil", "floor", "negate", "not", "sign", "round-nearest-afz",
                "round-nearest-even", "is-finite", "popcnt", "count-leading-zeros", "real", "imag",
                "reduce-precision", "convert", "bitcast-convert")
_TRANSCENDENTAL_BINARY = ("power", "atan2")
_PLAIN_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "remainder", "and",
                 "or", "xor", "shift-left", "shift-right-arithmetic", "shift-right-logical",
                 "compare", "complex", "stochastic-convert", "mulhi")
# Result shape = operand 0's (the parser's shape-less forms); compare/convert/complex change types.
_SAME_SHAPE = {"negate", "abs", "log", "sqrt", "rsqrt", "tanh", "sine", "cosine", "tan", "not",
               "add", "subtract", "multiply", "divide", "maximum", "minimum", "and", "or", "xor"}
# No same-dims check: complex/real/imag/bitcast-convert/reduce-precision/stochastic-convert
# change types or sizes, and XLA's verifier checks them elsewhere; the rest keep dims.
_NO_SAME_DIMS = {"complex", "real", "imag", "bitcast-convert", "reduce-precision",
                 "stochastic-convert"}
for _names, _arity, _tr in ((_TRANSCENDENTAL_UNARY, 1, True), (_PLAIN_UNARY, 1, False),
                            (_TRANSCENDENTAL_BINARY, 2, True), (_PLAIN_BINARY, 2, False)):
    for _n in _names:
        _add(_n, arity=_arity, category="elementwise", elementwise=True, transcendental=_tr,
             element_preserving=True, same_dims=_n not in _NO_SAME_DIMS,
             same_shape_as_operand0=_n in _SAME_SHAPE,
             roles_pass=_n in ("convert", "bitcast-convert"),
             fused_roles_pass=_n in ("convert", "bitcast-convert"),
             roles_back=_n in ("convert", "bitcast-convert"))
for _n in ("select", "clamp"):
    _add(_n, arity=3, category="elementwise", elementwise=True, element_preserving=True)

# ---- data movement: no arithmetic --------------------------------------------------------
for _n, _a in (("reshape", 1), ("transpose", 1), ("copy", 1)):
    _add(_n, arity=_a, category="data-movement", computes=False, element_preserving=True,
         roles_pass=True, fused_roles_pass=True, roles_back=True,
         same_shape_as_operand0=_n == "copy")
for _n, _a in (("slice", 1), ("dynamic-slice", "variadic"), ("gather", 2)):
    _add(_n, arity=_a, category="data-movement", computes=False, roles_pass=True,
         fused_roles_pass=True)
_add("dynamic-update-slice", arity="variadic", category="data-movement", computes=False,
     roles_pass=True, fused_roles_pass=True, roles_back=True)
for _n, _a in (("broadcast", 1), ("reverse", 1), ("concatenate", ">=1"), ("pad", 2),
               ("dynamic-reshape", ">=1"), ("set-dimension-size", 2), ("iota", 0),
               ("shuffle", 1)):
    _add(_n, arity=_a, category="data-movement", computes=False)
_add("copy-start", arity=1, category="async", computes=False, roles_pass=True,
     roles_back=True,  # an aliased output's role reaches the buffer it evicts / prefetches
     async_part="start", async_of="copy", async_queue="copy")
_add("copy-done", arity=1, category="async", moves_data=False, computes=False, roles_pass=True,
     roles_back=True, async_part="done", async_of="copy")

# ---- arithmetic with their own rules -----------------------------------------------------
# dot: 2 operands, or up to 4 with sparsity metadata (validate.py checks that case itself)
for _n, _a in (("dot", "variadic"), ("ragged-dot", 3), ("scaled-dot", 4), ("convolution", 2)):
    _add(_n, arity=_a, category="matrix")
_add("reduce", arity="even>=2", category="reduction")
_add("reduce-window", arity="even>=2", category="reduction")
_add("select-and-scatter", arity=3, category="reduction")
_add("scatter", arity="odd>=3", category="data-movement")
_add("map", arity=">=1", category="elementwise")
_add("sort", arity=">=1", category="other")
_add("topk", arity=1, category="other")
_add("fft", arity=1, category="linear-algebra")
_add("triangular-solve", arity=2, category="linear-algebra")
_add("cholesky", arity=1, category="linear-algebra")
_add("batch-norm-training", arity=3, category="other")
_add("batch-norm-inference", arity=5, category="other")
_add("batch-norm-grad", arity=5, category="other")
_add("rng", arity=2, category="random")
_add("rng-bit-generator", arity=1, category="random")
_add("rng-get-and-update-state", arity=0, category="random", computes=False)
_add("fusion", arity="variadic", category="other")
_add("custom-call", arity="variadic", category="other")

# ---- control flow: the called computations are costed, the instruction itself moves nothing
for _n, _a in (("while", 1), ("conditional", ">=1"), ("call", "variadic")):
    _add(_n, arity=_a, category="control-flow", moves_data=False, computes=False,
         control_flow=True, same_shape_as_operand0=_n == "while", aliases_operand=_n == "while")
_add("async-start", arity="variadic", category="async", moves_data=False, computes=False,
     control_flow=True, async_part="start", async_queue="network")
_add("async-update", arity=1, category="async", moves_data=False, computes=False,
     async_part="update")
_add("async-done", arity=1, category="async", moves_data=False, computes=False,
     async_part="done")
# ``call-start`` / ``call-done``: an async-start wrapping a ``call`` (syntax sugar, printed with the
# call's ``to_apply`` and ``async_execution_thread``): XLA:TPU runs a SparseCore computation
# (``execution_thread="sparsecore"``, e.g. an offloaded scatter-add) beside the TensorCore. The
# callee's instructions carry the bytes (costed once per start, like a call's); the pair itself
# moves nothing, and the stream waits for the callee at its done (its own side queue).
_add("call-start", arity="variadic", category="async", moves_data=False, computes=False,
     control_flow=True, async_part="start", async_of="call", async_queue="async_call")
_add("call-update", arity=1, category="async", moves_data=False, computes=False,
     async_part="update", async_of="call")
_add("call-done", arity=1, category="async", moves_data=False, computes=False,
     async_part="done", async_of="call")

# ---- collectives -------------------------------------------------------------------------
COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
                    "collective-permute", "collective-broadcast", "send", "recv")
_add("all-reduce", arity=">=1", category="collective", collective="all-reduce")
_add("all-gather", arity=">=1", category="collective", computes=False, collective="all-gather",
     roles_pass=True, fused_roles_pass=True)  # XLA:TPU fuses it (AsyncCollectiveStart fusions)
_add("reduce-scatter", arity=">=1", category="collective", computes=False,
     collective="reduce-scatter")
_add("all-to-all", arity=">=1", category="collective", computes=False, collective="all-to-all")
_add("ragged-all-to-all", arity=6, category="collective", computes=False,
     collective="ragged-all-to-all")
_add("collective-permute", arity=">=1",  # combined (XLA:GPU CollectivePermuteCombiner): N; in place: 4
     category="collective", computes=False,
     collective="collective-permute", roles_pass=True, fused_roles_pass=True)
_add("collective-broadcast", arity=">=1", category="collective", computes=False,
     collective="collective-broadcast")
_add("collective-reduce", arity=">=1", category="collective")  # no rule yet: unmodeled
# native async pairs (their own opcodes)
_add("all-reduce-start", arity=">=1", category="collective", collective="all-reduce",
     async_part="start", async_of="all-reduce", async_queue="network")
_add("all-gather-start", arity=">=1", category="collective", computes=False,
     collective="all-gather", roles_pass=True, async_part="start", async_of="all-gather",
     async_queue="network")
_add("collective-permute-start", arity=">=1",  # combined (XLA:GPU CollectivePermuteCombiner): N; in place: 4
     category="collective", computes=False,
     collective="collective-permute", roles_pass=True, async_part="start",
     async_of="collective-permute", async_queue="network")
for _n in ("all-reduce", "all-gather", "collective-permute"):
    _add(f"{_n}-done", arity=1, category="collective", moves_data=False, computes=False,
         roles_pass=_n != "all-reduce", async_part="done", async_of=_n)
# point to point (send/recv carry a token; is_host_transfer=true: to/from the host)
_add("send", arity=2, category="collective", computes=False, collective="send",
     async_part="start", async_of="send", async_queue="network")
_add("recv", arity=1, category="collective", computes=False, collective="recv",
     async_part="start", async_of="recv", async_queue="network")
_add("send-done", arity=1, category="collective", moves_data=False, computes=False,
     async_part="done", async_of="send")
_add("recv-done", arity=1, category="collective", moves_data=False, computes=False,
     async_part="done", async_of="recv")
# host I/O
_add("infeed", arity=1, category="io", computes=False)
_add("outfeed", arity=2, category="io", computes=False)

# ---- async syntax sugar: X-start / X-update / X-done wrap X ------------------------------
#: Opcodes XLA wraps in ``async-start`` and prints as ``X-start``: XLA:TPU streams slices and
#: dynamic slices between HBM and VMEM (``slice-start``), XLA:GPU runs these collectives async.
ASYNC_WRAPPED = ("slice", "dynamic-slice", "dynamic-update-slice", "reduce-scatter", "all-to-all",
                 "ragged-all-to-all", "collective-broadcast")
for _w in ASYNC_WRAPPED:
    _base = OPCODES[_w]
    _queue = "network" if _base.collective else "copy"
    _add(f"{_w}-start", arity="variadic", category="async", computes=_base.computes,
         roles_pass=_base.roles_pass, collective=_base.collective, async_part="start",
         async_of=_w, async_queue=_queue)
    _add(f"{_w}-update", arity=1, category="async", moves_data=False, computes=False,
         roles_pass=_base.roles_pass, async_part="update", async_of=_w)
    _add(f"{_w}-done", arity=1, category="async", moves_data=False, computes=False,
         roles_pass=_base.roles_pass, async_part="done", async_of=_w)


def names(**flags) -> frozenset[str]:
    """Opcodes whose record has every given attribute value, e.g. ``names(moves_data=False)``,
    ``names(async_part="start")``. Raises AttributeError for an unknown attribute."""
    for k in flags:
        if k not in Opcode.__slots__:
            raise AttributeError(f"Opcode has no attribute {k!r}")
    return frozenset(n for n, op in OPCODES.items()
                     if all(getattr(op, k) == v for k, v in flags.items()))


_ARITY_RULES = {
    ">=1": ("at least 1 operand", lambda n: n >= 1),
    "even>=2": ("an even number (>= 2) of operands", lambda n: n >= 2 and n % 2 == 0),
    "odd>=3": ("an odd number (>= 3) of operands", lambda n: n >= 3 and n % 2 == 1),
    "1|4": ("1 or 4 operands", lambda n: n in (1, 4)),
}
# What the operands are, where the count alone does not say it.
_ARITY_WHAT = {"reduce": "inputs then init values", "reduce-window": "inputs then init values",
               "scatter": "inputs, indices, updates",
               "conditional": "the predicate or branch index"}


def arity_check(opcode: str):
    """(description, predicate on the operand count) of ``opcode``'s arity, or None when any
    count is accepted (variadic, or an opcode not in the table)."""
    op = OPCODES.get(opcode)
    if op is None or op.arity == "variadic":
        return None
    a = op.arity
    if isinstance(a, int):
        text = "no operands" if a == 0 else "1 operand" if a == 1 else f"{a} operands"
        return text, (lambda n, a=a: n == a)
    text, pred = _ARITY_RULES[a]
    what = _ARITY_WHAT.get(opcode)
    if what:
        text = f"{text}: {what}" if a != ">=1" else f"{text} ({what})"
    return text, pred


def info(opcode: str) -> Opcode | None:
    """The record of ``opcode``, or None for an opcode XLA does not print."""
    return OPCODES.get(opcode)


def is_async_sugar(opcode: str) -> bool:
    """``slice-start``, ``reduce-scatter-done`` ...: a generic async op printed with the
    wrapped opcode (its record's ``async_of`` is in :data:`ASYNC_WRAPPED`)."""
    op = OPCODES.get(opcode)
    return op is not None and op.async_part is not None and op.async_of in ASYNC_WRAPPED


# ---- custom-call targets -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CustomCallTarget:
    """A custom-call target a compiler emits, and what jaxmove knows of it.

    Attributes:
      name: ``custom_call_target``.
      platform: ``tpu`` | ``gpu`` | ``cpu`` | ``any``.
      moves_data: False when the call moves no bytes (a bitcast of adjacent buffers, an
        allocation, an assertion): its traffic is nothing.
      computes: False when it does no arithmetic (flops 0); True targets need a flop rule.
      roles_pass: its result holds the role of operand 0.
      what: one line on what it does, with the source.
    """

    name: str
    platform: str
    moves_data: bool
    computes: bool
    roles_pass: bool
    what: str


CUSTOM_CALL_TARGETS: dict[str, CustomCallTarget] = {}


def _cc(name: str, platform: str, moves_data: bool, computes: bool, roles_pass: bool,
        what: str) -> None:
    if name in CUSTOM_CALL_TARGETS:
        raise ValueError(f"custom-call target {name!r} defined twice")
    CUSTOM_CALL_TARGETS[name] = CustomCallTarget(name, platform, moves_data, computes, roles_pass,
                                                 what)


# XLA:TPU (seen in the programs libtpu 0.0.42 compiles for the zoo; libtpu is closed source,
# so what each does is read from the HLO: operand and result shapes and memory spaces).
_cc("ConcatBitcast", "tpu", False, False, True,
    "joins the slice-done buffers of one array (adjacent in VMEM, S(1)) into that array: "
    "a bitcast, result and operands in the same on-chip buffer")
_cc("AllocateBuffer", "tpu", False, False, False,
    "reserves an (on-chip) buffer the next instructions fill; no operands, no data moved")
_cc("AssumeGatherIndicesInBound", "tpu", False, False, True,
    "marks gather indices as in bounds (its result is its operand), so no clamp is emitted")
_cc("AsyncCollectiveStart", "tpu", False, False, True,
    "starts the collective fused with it (inside a collective fusion); the fused "
    "collective and the fusion's operands and results carry the bytes")
_cc("AsyncCollectiveDone", "tpu", False, False, True,
    "waits for the collective its fusion started; moves nothing itself")
_cc("PrepareAsyncCallStart", "tpu", False, False, False,
    "reserves the sync flag of an async call (a scalar in S(2), semaphore memory; no operands) "
    "before its call-start: no HBM data moved")
_cc("PrepareAsyncCallDone", "tpu", False, False, False,
    "waits for that flag and gives the call-start its token operand: a token[] result, no data "
    "moved")
_cc("tpu_custom_call", "tpu", True, True, False,
    "a Pallas TPU (Mosaic) kernel: its grid, BlockSpecs and cost estimate are in "
    "backend_config.custom_call_config (passes/pallas.py, passes/mosaic.py)")
_cc("__gpu$xla.gpu.triton", "gpu", True, True, False,
    "a Pallas Triton kernel: grid_x/y/z and the Triton module (ir) in backend_config "
    "(passes/triton.py)")
_cc("mosaic_gpu_v2", "gpu", True, True, False,
    "a Pallas Mosaic GPU kernel (jax/experimental/mosaic/gpu/core.py): not decoded, its "
    "operand + result bytes a lower bound (passes/pallas.py)")
# host offload (xla/service/host_offload_utils.h: memory_annotations)
_cc("MoveToHost", "any", True, False, True,
    "annotation of host offloading: copies operand 0 to host memory S(5)")
_cc("MoveToDevice", "any", True, False, True,
    "annotation of host offloading: copies operand 0 from host memory S(5) back to the device")

# Library calls of XLA:GPU and XLA:CPU, costed from their shapes and backend_config
# (passes/flops.py CUSTOM_CALL_RULES; traffic: every operand read, every result written,
# a trailing u8/s8 workspace result not counted).
for _t in ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8", "__cublas$lt$matmul$mx"):
    _cc(_t, "gpu", True, True, False, "cuBLAS / cuBLASLt gemm (xla/service/gpu/cublas_cudnn.cc)")
for _t in ("__cudnn$convForward", "__cudnn$convBackwardInput", "__cudnn$convBackwardFilter",
           "__cudnn$convBiasActivationForward", "__cudnn$convForwardGraph"):
    _cc(_t, "gpu", True, True, False, "cuDNN convolution (xla/service/gpu/cublas_cudnn.cc)")
_cc("__cudnn$blockScaledDot", "gpu", True, True, False, "cuDNN block-scaled dot")
_cc("__op$block_scaled_dot", "gpu", True, True, False,
    "block-scaled dot before cuDNN/cuBLAS lowering (block_scaling_rewriter.cc)")
_cc("__cudnn$fmha", "gpu", True, True, False,
    "cuDNN fused attention, every __cudnn$fmha* target (forward and backward)")
_cc("__onednn$matmul", "cpu", True, True, False, "oneDNN matmul (onednn_matmul_rewriter.cc)")
_cc("__onednn$convolution", "cpu", True, True, False, "oneDNN convolution")

#: Targets named by their start: ``__cudnn$fmhaSoftmaxBackward`` is a ``__cudnn$fmha``.
CUSTOM_CALL_PREFIXES = ("__cudnn$fmha",)


def custom_call_target(target: str | None) -> CustomCallTarget | None:
    """The record of a custom-call target (by exact name, else by prefix), or None."""
    if not target:
        return None
    rec = CUSTOM_CALL_TARGETS.get(target)
    if rec is None:
        for p in CUSTOM_CALL_PREFIXES:
            if target.startswith(p):
                return CUSTOM_CALL_TARGETS[p]
    return rec


def custom_call_targets(**flags) -> frozenset[str]:
    """Targets whose record has every given attribute value (``moves_data=False`` ...)."""
    return frozenset(n for n, r in CUSTOM_CALL_TARGETS.items()
                     if all(getattr(r, k) == v for k, v in flags.items()))
