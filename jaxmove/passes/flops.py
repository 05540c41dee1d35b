"""FLOPs: arithmetic operations per single execution of each HLO instruction.

Conventions follow XLA's ``HloCostAnalysis`` (xla/service/hlo_cost_analysis.cc) so that
totals agree with ``cost_analysis()["flops"]`` on loop-free, custom-call-free modules:

* a fused multiply-add counts 2 flops (``kFmaFlops``);
* elementwise ops (including ``compare``, ``select``, ``clamp``, ``convert``) count one op
  per output element; the transcendental opcodes of ``HandleElementwiseOp`` count as
  ``transcendentals`` instead of ``flops``;
* data movement (reshape, transpose, slice, gather, copy, pad, concatenate ...) is free;
* the program is costed as compiled, not as written: XLA:TPU turns a 1-row dot
  ``[1,K] x [K,N]`` (decode) into a ``multiply_reduce_fusion`` (broadcast, bf16->f32
  converts of both operands, multiply, convert back, reduce), which counts
  ``3KN + KN + (K-1)N = 5KN - N`` flops, about 2.5x the dot's ``2KN``, exactly what
  XLA:TPU's own ``cost_analysis()["flops"]`` reports (tests/test_device_correctness.py);
  the converts are work the vector unit does.

Where jaxmove departs from XLA it says so in the rule's docstring:

* custom calls are costed from their shapes and ``backend_config`` (cuBLAS / cuBLASLt /
  oneDNN matmuls, block-scaled dots, cuDNN convolutions and fused attention) where XLA's
  base analysis answers -1; an unknown target is listed in ``unmodeled`` with 0 flops;
* an opcode without a rule (or one XLA leaves as a TODO with 0, e.g. batch-norm) is listed
  in ``unmodeled`` rather than silently counted as 0;
* ``ragged-dot`` counts ``2 * output elements * K`` (XLA's handler drops an output dimension);
* ``all-reduce`` costs ``flops(to_apply)`` per output element (XLA: 1 per element, which is
  the same for the usual single-op reducers);
* ``while``, ``conditional``, ``call`` and ``async-start`` cost nothing themselves: their
  called computations are costed by the caller (see ``passes/multiplicity.py``), which
  applies trip counts; XLA folds one iteration of the body into the while.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Literal

from .._perf import slots_constructor
from ..hlo import Computation, Instruction, Module, Shape
from ..hlo.attrs import parse_kv_block
from ..hlo.opcodes import custom_call_targets, names
from .callgraph import post_order
from .memo import memo_of

KFMA_FLOPS = 2  # xla/service/hlo_cost_analysis.h: kFmaFlops


@dataclass(frozen=True, slots=True, kw_only=True)
class FlopCount:
    """Arithmetic work of one execution of an instruction (or computation).

    Attributes:
      flops: floating-point and integer arithmetic operations; an FMA counts 2.
      transcendentals: exp, log, tanh, sqrt, rsqrt, power, ... and rng elements, counted
        separately as XLA does (one transcendental may cost many flops).
      unmodeled: reasons some work could not be counted; non-empty means the numbers
        are a lower bound.
    """

    flops: int = 0
    transcendentals: int = 0
    unmodeled: tuple[str, ...] = ()

    def __add__(self, other: FlopCount) -> FlopCount:
        if not isinstance(other, FlopCount):
            return NotImplemented
        unmodeled = self.unmodeled + tuple(r for r in other.unmodeled if r not in self.unmodeled)
        return FlopCount(flops=self.flops + other.flops,
                         transcendentals=self.transcendentals + other.transcendentals,
                         unmodeled=unmodeled)

    def __mul__(self, k: int) -> FlopCount:
        if not isinstance(k, int):
            return NotImplemented
        return FlopCount(flops=self.flops * k, transcendentals=self.transcendentals * k,
                         unmodeled=self.unmodeled)

    __rmul__ = __mul__


ZERO = FlopCount()
# FlopCount(flops, transcendentals, unmodeled), positional, without the keyword-only __init__
_flop_count = slots_constructor(FlopCount)

Rule = Callable[[Instruction, Module], FlopCount]


# ---- shape helpers ------------------------------------------------------------------

def _elements(shape: Shape) -> int:
    """ShapeUtil::ElementsIn for arrays; 0 for tokens/opaque."""
    return shape.num_elements if shape.is_array else 0


def _elements_recursive(shape: Shape) -> int:
    """ShapeUtil::ElementsInRecursive: elements summed over all array leaves."""
    return sum(_elements(s) for s in shape.leaves())


def _first_array(shape: Shape) -> Shape:
    """The shape itself, or tuple element 0 (XLA's convention for multi-output ops)."""
    return shape.tuple_shapes[0] if shape.is_tuple else shape


def _operand(instr: Instruction, module: Module, i: int) -> Instruction:
    return module.computations[instr.computation].by_name[instr.operands[i]]


def _operand_shape(instr: Instruction, module: Module, i: int) -> Shape:
    return _operand(instr, module, i).shape


def _unmodeled(reason: str) -> FlopCount:
    return FlopCount(unmodeled=(reason,))


def _called(instr: Instruction, module: Module, key: str) -> Computation | None:
    v = instr.attrs.get(key)
    if v is None:
        return None
    return module.computations.get(v.strip().lstrip("%"))


def _per_call(instr: Instruction, module: Module, key: str) -> FlopCount:
    """Cost of one application of the computation named by attribute ``key`` (memoized per
    module: reducers like ``add_f32`` are applied by thousands of reduces and all-reduces)."""
    comp = _called(instr, module, key)
    if comp is None:
        return _unmodeled(f"{instr.opcode} '{instr.name}' has no {key} computation")
    memo = memo_of(module).per_call_flops
    fc = memo.get(comp)
    if fc is None:
        fc = memo[comp] = computation_flops(comp, module)
    return fc


# ---- elementwise ----------------------------------------------------------------------

# HloCostAnalysis::HandleElementwiseOp: these count as transcendentals, not flops.
TRANSCENDENTAL_OPCODES = names(transcendental=True)

# Opcodes that DfsHloVisitor routes to HandleElementwiseUnary/Binary (xla/hlo/ir/
# dfs_hlo_visitor.h) and that HloCostAnalysis does not override, plus HandleCompare,
# HandleClamp, HandleSelect, HandleConvert, HandleReducePrecision.
ELEMENTWISE_OPCODES = names(elementwise=True, category="elementwise")


def _elementwise(instr: Instruction, module: Module) -> FlopCount:
    """One op per output element (HloCostAnalysis::HandleElementwiseOp)."""
    n = _elements(instr.shape)
    if instr.opcode in TRANSCENDENTAL_OPCODES:
        return _flop_count(0, n, ())
    return _flop_count(n, 0, ())


# Free: HloCostAnalysis handlers that set no flops.
ZERO_FLOP_OPCODES = names(computes=False)  # incl. control flow: callees are costed by the caller


def _zero(instr: Instruction, module: Module) -> FlopCount:
    return ZERO


# ---- dot ------------------------------------------------------------------------------

def dot_flops(lhs: Shape, result: Shape, lhs_contracting: tuple[int, ...]) -> int:
    """2 * output elements * product of lhs contracting dim sizes.

    Source: HloCostAnalysis::GetDotFlops (xla/service/hlo_cost_analysis.cc). Complex
    operands are not special-cased (a complex FMA counts 2, as in XLA).
    """
    width = math.prod(lhs.dims[d] for d in lhs_contracting)
    return KFMA_FLOPS * _elements(result) * width


def _dot(instr: Instruction, module: Module) -> FlopCount:
    """HloCostAnalysis::HandleDot. ``scaled-dot`` is costed as the dot on its first two operands."""
    contracting = instr.int_list("lhs_contracting_dims") or ()
    return _flop_count(dot_flops(_operand_shape(instr, module, 0), _first_array(instr.shape),
                                 contracting), 0, ())


def _ragged_dot(instr: Instruction, module: Module) -> FlopCount:
    """``2 * output elements * K``: each lhs row meets exactly one group's rhs matrix.

    Deliberately differs from HloCostAnalysis::HandleRaggedDot, which deletes output
    dimension 0 per rhs group dimension and so drops the M factor.
    """
    contracting = instr.int_list("lhs_contracting_dims") or ()
    return FlopCount(flops=dot_flops(_operand_shape(instr, module, 0), instr.shape, contracting))


# ---- convolution ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class WindowDim:
    size: int = 1
    stride: int = 1
    padding_low: int = 0
    padding_high: int = 0
    window_dilation: int = 1
    base_dilation: int = 1


def parse_window(text: str | None) -> list[WindowDim]:
    """``{size=3x3 stride=2x2 pad=1_1x0_1 lhs_dilate=1x1 rhs_dilate=2x2}`` -> per-dimension list.

    Raises ValueError on a malformed window.
    """
    if not text:
        return []
    kv = parse_kv_block(text)
    if "size" not in kv:
        raise ValueError(f"window without size: {text!r}")
    sizes = [int(x) for x in kv["size"].split("x")]
    n = len(sizes)

    def ints(key: str, default: int) -> list[int]:
        if key not in kv:
            return [default] * n
        vals = [int(x) for x in kv[key].split("x")]
        if len(vals) != n:
            raise ValueError(f"window {key}={kv[key]} has {len(vals)} dims, size has {n}")
        return vals

    if "pad" in kv:
        pads = [tuple(int(v) for v in p.split("_")) for p in kv["pad"].split("x")]
        if len(pads) != n or any(len(p) != 2 for p in pads):
            raise ValueError(f"window pad={kv['pad']} does not match size={kv['size']}")
    else:
        pads = [(0, 0)] * n
    stride, lhs_d, rhs_d = ints("stride", 1), ints("lhs_dilate", 1), ints("rhs_dilate", 1)
    if min(sizes + stride + lhs_d + rhs_d) < 1:
        raise ValueError(f"window {text!r}: sizes, strides and dilations must be >= 1")
    return [WindowDim(sizes[i], stride[i], pads[i][0], pads[i][1], rhs_d[i], lhs_d[i])
            for i in range(n)]


def parse_dim_labels(text: str) -> tuple[int, int, list[int], int, int, list[int], int, int, list[int]]:
    """``b01f_01io->b01f`` -> (lhs batch, lhs feature, lhs spatial, rhs in-feature,
    rhs out-feature, rhs spatial, out batch, out feature, out spatial); spatial dims are
    ordered by their label digit. Raises ValueError when malformed."""
    try:
        lhs, rest = text.strip().split("_", 1)
        rhs, out = rest.split("->")
    except ValueError:
        raise ValueError(f"dim_labels={text!r} is not of the form lhs_rhs->out") from None

    def spatial(labels: str) -> list[int]:
        digits = sorted((int(c), i) for i, c in enumerate(labels) if c.isdigit())
        return [i for _, i in digits]

    return (lhs.index("b"), lhs.index("f"), spatial(lhs), rhs.index("i"), rhs.index("o"),
            spatial(rhs), out.index("b"), out.index("f"), spatial(out))


# Positions _valid_positions counts one by one at most (a few seconds of Python); a larger
# window (only seen in malformed modules) is reported as unmodeled instead.
MAX_WINDOW_STEPS = 10_000_000


def _valid_positions(window: WindowDim, input_limit: int, kernel_limit: int, output_limit: int) -> int:
    """Kernel/output position pairs that land on a real (non-padding, non-hole) input."""
    w = window
    # The two shortcuts of GetConvolutionFlops (same result as the loop, only faster).
    if (input_limit == output_limit and kernel_limit == output_limit
            and input_limit == w.base_dilation and w.window_dilation == 1
            and max(1, input_limit - 1) == w.stride and w.padding_low == 0 and w.padding_high == 0):
        return input_limit
    if (input_limit == 1 and kernel_limit == output_limit and w.window_dilation == 1
            and w.base_dilation == 1 and w.stride == 1
            and w.padding_high == output_limit - 1 and w.padding_low == output_limit - 1):
        return output_limit
    steps = kernel_limit if w.stride == 1 and w.base_dilation == 1 else kernel_limit * output_limit
    if steps > MAX_WINDOW_STEPS:
        raise ValueError(f"window of {kernel_limit} x {output_limit} positions is too large to count")
    count = 0
    for k in range(kernel_limit):
        if w.stride == 1 and w.base_dilation == 1:
            base = w.padding_low - k * w.window_dilation
            count += max(min(input_limit + base, output_limit) - max(base, 0), 0)
            continue
        for o in range(output_limit):
            undilated = o * w.stride - w.padding_low + k * w.window_dilation
            if undilated % w.base_dilation:
                continue  # lands in a hole made by lhs (base) dilation
            idx = undilated // w.base_dilation
            if 0 <= idx < input_limit:
                count += 1
    return count


def convolution_flops(instr: Instruction, lhs: Shape, rhs: Shape, result: Shape) -> int:
    """2 * (C_in / feature_groups) * C_out * (N / batch_groups) * prod(valid positions).

    A valid position is a (kernel index, output index) pair per spatial dimension whose
    input index falls inside the unpadded, undilated input. Source:
    HloCostAnalysis::GetConvolutionFlops (xla/service/hlo_cost_analysis.cc). Used for
    ``convolution`` and for cuDNN/oneDNN convolution custom calls, which carry the same
    ``window`` and ``dim_labels`` attributes (GpuHloCostAnalysis::HandleCustomCall).
    C_in and C_out include the vector dimension of cuDNN's vectorized int8 layouts (a
    dimension no label names, ``?`` in ``b01f?_01i?o->b01f?``), which XLA leaves out.

    Raises ValueError when ``window`` or ``dim_labels`` is malformed or missing.
    """
    labels = instr.attrs.get("dim_labels")
    if labels is None:
        raise ValueError("no dim_labels")
    (in_b, in_f, in_sp, _k_in, _k_out, k_sp, out_b, out_f, out_sp) = parse_dim_labels(labels)
    window = parse_window(instr.attrs.get("window"))
    if window:
        if not (len(window) == len(in_sp) == len(k_sp) == len(out_sp)):
            raise ValueError(f"window has {len(window)} dims, dim_labels={labels}")
        limits = [(lhs.dims[i], rhs.dims[k], result.dims[o]) for i, k, o in zip(in_sp, k_sp, out_sp)]
    else:
        window, limits = [WindowDim()], [(1, 1, 1)]
    valid = math.prod(_valid_positions(w, i, k, o) for w, (i, k, o) in zip(window, limits))
    fgc = int(instr.attrs.get("feature_group_count", "1"))
    bgc = int(instr.attrs.get("batch_group_count", "1"))
    if fgc < 1 or bgc < 1:
        raise ValueError(f"feature_group_count={fgc}, batch_group_count={bgc}: must be >= 1")
    # cuDNN's vectorized int8 layouts (NCHW_VECT_C, int8x4 / int8x32; XLA's
    # cudnn_vectorize_convolutions prints the vector dimension as '?' in dim_labels, e.g.
    # b01f?_01i?o->b01f?, or leaves it out): a dimension no label names is a vector of
    # features, so the input features are C x 4 and the output features F x 4. XLA's
    # GetConvolutionFlops reads only the labelled feature dimension (16x too few flops for
    # int8x4; gpu_hlo_cost_analysis_test.cc ConvCustomCall).
    c_in = lhs.dims[in_f] * _vector_elements(lhs, (in_b, in_f, *in_sp))
    c_out = result.dims[out_f] * _vector_elements(result, (out_b, out_f, *out_sp))
    fma = (c_in // fgc) * c_out * (lhs.dims[in_b] // bgc) * valid
    return KFMA_FLOPS * fma


def _vector_elements(shape: Shape, labelled: tuple[int, ...]) -> int:
    """Product of the dimensions of ``shape`` that no dim_labels letter names (1 if none)."""
    named = set(labelled)
    return math.prod(d for i, d in enumerate(shape.dims) if i not in named)


def _convolution(instr: Instruction, module: Module) -> FlopCount:
    """HloCostAnalysis::HandleConvolution."""
    try:
        return FlopCount(flops=convolution_flops(
            instr, _operand_shape(instr, module, 0), _operand_shape(instr, module, 1),
            _first_array(instr.shape)))
    except (ValueError, IndexError) as e:
        return _unmodeled(f"{instr.opcode} '{instr.name}': cannot read window/dim_labels ({e})")


# ---- reductions and computations applied per element ----------------------------------

def _reduce(instr: Instruction, module: Module) -> FlopCount:
    """flops(to_apply) * (input elements - output elements), HloCostAnalysis::HandleReduce.

    A variadic reduce applies its to_apply once per reduced position (not once per input):
    the counts come from operand 0 and output element 0.
    """
    count = _elements(_operand_shape(instr, module, 0)) - _elements(_first_array(instr.shape))
    return _per_call(instr, module, "to_apply") * count


def _reduce_window(instr: Instruction, module: Module) -> FlopCount:
    """flops(to_apply) * (window elements - 1) * output elements.

    Includes XLA's special case for a reduce-window that is a reduce followed by a
    broadcast along one padded dimension (HloCostAnalysis::HandleReduceWindow: window size
    2s-1 padded s-1 on both sides of a dimension of size s, so every output element of a row
    reduces the whole row): each of the output/s rows is reduced once, (s - 1) applications,
    then broadcast. XLA adds the two factors (output/s + (s - 1)); jaxmove multiplies them
    (hlo_cost_analysis_test.cc ReduceWindowSingleDimReduceBroadcast: 6,144 rows of 1,024,
    XLA 7,167 applications, jaxmove 6,144 x 1,023).
    """
    try:
        window = parse_window(instr.attrs.get("window"))
    except ValueError as e:
        return _unmodeled(f"reduce-window '{instr.name}': {e}")
    out = _first_array(instr.shape)
    window_elements = math.prod(w.size for w in window)
    out_elements = _elements(out)
    count = (window_elements - 1) * out_elements
    reduction_dims = [w for w in window if w.size != 1]
    padded_dims = [w for w in window if w.padding_low != 0 or w.padding_high != 0]
    if len(reduction_dims) == 1 and len(padded_dims) == 1 and not instr.shape.is_tuple:
        for d, w in enumerate(window):
            if (w.size != 1 and w.padding_low != 0 and w.padding_high != 0
                    and w.padding_low == w.padding_high and w.size == 2 * w.padding_low + 1):
                if w.padding_low == out.dims[d] - 1:
                    span = out.dims[d]
                    count = (out_elements // span) * (span - 1)  # rows x (s - 1)
                break
    return _per_call(instr, module, "to_apply") * count


def _select_and_scatter(instr: Instruction, module: Module) -> FlopCount:
    """select * source elements * (window elements - 1) + scatter * source elements.

    HloCostAnalysis::HandleSelectAndScatter.
    """
    try:
        window = parse_window(instr.attrs.get("window"))
    except ValueError as e:
        return _unmodeled(f"select-and-scatter '{instr.name}': {e}")
    source = _elements(_operand_shape(instr, module, 1))
    window_elements = math.prod(w.size for w in window)
    return (_per_call(instr, module, "select") * (source * (window_elements - 1))
            + _per_call(instr, module, "scatter") * source)


def _map(instr: Instruction, module: Module) -> FlopCount:
    """flops(to_apply) * output elements (HloCostAnalysis::HandleMap)."""
    return _per_call(instr, module, "to_apply") * _elements(instr.shape)


def _scatter(instr: Instruction, module: Module) -> FlopCount:
    """flops(to_apply) * elements of the first updates operand (HloCostAnalysis::HandleScatter).

    Operands are N inputs, the indices, then N updates: updates[0] is operand N + 1.
    """
    n = (len(instr.operands) - 1) // 2
    updates = _elements(_operand_shape(instr, module, n + 1))
    return _per_call(instr, module, "to_apply") * updates


def _all_reduce(instr: Instruction, module: Module) -> FlopCount:
    """flops(to_apply) per element of every array in the output.

    HloCostAnalysis::HandleAllReduce counts 1 flop per output element (it assumes two
    replicas and a single-op reducer); jaxmove scales by the reducer's own cost, which is
    the same number for add/max/min/or reducers.
    """
    return _per_call(instr, module, "to_apply") * _elements_recursive(instr.shape)


def _sort(instr: Instruction, module: Module) -> FlopCount:
    """n * ceil(log2 n), n = elements of operand 0 (HloCostAnalysis::HandleSort)."""
    n = _elements(_operand_shape(instr, module, 0))
    return FlopCount(flops=n * (n - 1).bit_length() if n > 0 else 0)  # Log2Ceiling(n)


def _fft(instr: Instruction, module: Module) -> FlopCount:
    """2 * 4 * prod(floor(log2 fft_length)) * elements of operand 0 (HloCostAnalysis::HandleFft)."""
    lengths = instr.int_list("fft_length") or ()
    log_factors = math.prod(max(n, 1).bit_length() - 1 for n in lengths)
    return FlopCount(flops=KFMA_FLOPS * 4 * log_factors * _elements(_operand_shape(instr, module, 0)))


def _triangular_solve(instr: Instruction, module: Module) -> FlopCount:
    """2 * a.dims[-1] * elements(b) (HloCostAnalysis::HandleTriangularSolve)."""
    a, b = _operand_shape(instr, module, 0), _operand_shape(instr, module, 1)
    return FlopCount(flops=KFMA_FLOPS * a.dims[-1] * _elements(b))


def _cholesky(instr: Instruction, module: Module) -> FlopCount:
    """a.dims[-1] * elements(a) / 3, i.e. batch * n^3 / 3 (HloCostAnalysis::HandleCholesky)."""
    a = _operand_shape(instr, module, 0)
    return FlopCount(flops=a.dims[-1] * _elements(a) // 3)


def _rng(instr: Instruction, module: Module) -> FlopCount:
    """One transcendental per generated element (HloCostAnalysis::HandleRng / HandleRngBitGenerator)."""
    return FlopCount(transcendentals=_elements_recursive(instr.shape))


def _fusion(instr: Instruction, module: Module) -> FlopCount:
    """Sum over the fused computation, recursively (HloCostAnalysis::HandleFusion).

    As in XLA, a ``kCustom`` fusion that contains a gather or scatter is costed as that
    gather (0 flops) or scatter alone.
    """
    comps = instr.called_computations
    if not comps or comps[0] not in module.computations:
        return _unmodeled(f"fusion '{instr.name}' has no fused computation")
    fused = module.computations[comps[0]]
    if instr.fusion_kind == "kCustom":
        for inner in fused.instructions:
            if inner.opcode == "gather":
                return ZERO
            if inner.opcode == "scatter":
                return _scatter(inner, module)
    memo = memo_of(module).fused_flops  # nested fusions are costed once, bottom up
    hit = memo.get(fused.name)
    if hit is not None:
        return hit
    # structurally identical fused computations (hlo/structure.py) cost the same: one count
    # per class, kept under the class's name, where it names no instruction (unmodeled
    # reasons name theirs)
    cls = module.structural_classes[fused.name]
    if cls != fused.name:
        hit = memo.get(cls)
        if hit is not None and not hit.unmodeled:
            memo[fused.name] = hit
            return hit
    if "fusion" not in map(_opcode, fused.instructions):  # the common case: no nesting
        c = memo[fused.name] = computation_flops(fused, module)
        if not c.unmodeled:
            memo.setdefault(cls, c)
        return c
    # nested fused computations first, innermost first (iterative: any nesting depth); each
    # then finds its inner fusions memoized here instead of recursing
    for name in post_order(module, [fused.name], _is_fusion):
        if name not in memo:
            memo[name] = computation_flops(module.computations[name], module)
    return memo[fused.name]


_opcode = attrgetter("opcode")


def _is_fusion(instr: Instruction) -> bool:
    return instr.opcode == "fusion"


def _no_rule(reason: str) -> Rule:
    def rule(instr: Instruction, module: Module) -> FlopCount:
        return _unmodeled(f"{instr.opcode} '{instr.name}': {reason}")
    return rule


# ---- custom calls ---------------------------------------------------------------------

def _dnums_from_config(d: dict) -> tuple[int, ...] | None:
    v = d.get("lhs_contracting_dimensions")
    return tuple(int(x) for x in v) if isinstance(v, list) else None


def _cc_gemm(instr: Instruction, module: Module) -> FlopCount:
    """cuBLAS / cuBLASLt gemm: GetDotFlops(operand 0, output 0, gemm dot_dimension_numbers).

    Source: GpuHloCostAnalysis::HandleCustomCall (xla/service/gpu/model/gpu_hlo_cost_analysis.cc);
    the alpha/beta scaling and bias epilogue are not counted, as in XLA.
    """
    bc = instr.backend_config or {}
    gemm = bc.get("gemm_backend_config", bc)
    dnums = gemm.get("dot_dimension_numbers") if isinstance(gemm, dict) else None
    contracting = _dnums_from_config(dnums) if isinstance(dnums, dict) else None
    if contracting is None:
        return _unmodeled(f"custom-call '{instr.name}' ({instr.custom_call_target}): "
                          "no dot_dimension_numbers in backend_config")
    return FlopCount(flops=dot_flops(_operand_shape(instr, module, 0), _first_array(instr.shape),
                                     contracting))


def _cc_onednn_matmul(instr: Instruction, module: Module) -> FlopCount:
    """oneDNN matmul (xla/service/cpu/onednn_matmul_rewriter.cc): lhs [..., M, K] x rhs [..., K, N].

    K is lhs's last dimension, or its second-to-last with
    ``onednn_matmul_config.transpose_a``. Fused epilogues (bias, activations) are not counted.
    """
    lhs = _operand_shape(instr, module, 0)
    cfg = (instr.backend_config or {}).get("onednn_matmul_config", {})
    transpose_a = bool(cfg.get("transpose_a", False)) if isinstance(cfg, dict) else False
    if len(lhs.dims) < 2 and transpose_a:
        return _unmodeled(f"custom-call '{instr.name}' (__onednn$matmul): lhs rank < 2 with transpose_a")
    k = lhs.dims[-2] if transpose_a else lhs.dims[-1]
    return FlopCount(flops=KFMA_FLOPS * _elements(_first_array(instr.shape)) * k)


def _cc_block_scaled_dot(instr: Instruction, module: Module) -> FlopCount:
    """Block-scaled dot (``__op$block_scaled_dot``): the dot of operands 0 and 1.

    Operands: lhs [B?, M, K], rhs [B?, N, K], then per-block scales. With no
    dot_dimension_numbers in backend_config the contracting dimension is the last dimension
    of both operands (xla/service/gpu/transforms/block_scaling_rewriter.cc builds it so);
    jaxmove checks that the two last dims agree. Flops are 2 * output elements * K; the
    scale multiplications (one per operand element) are not counted, like cuBLAS's alpha.
    """
    lhs, rhs = _operand_shape(instr, module, 0), _operand_shape(instr, module, 1)
    bc = instr.backend_config or {}
    dnums = bc.get("dot_dimension_numbers")
    contracting = _dnums_from_config(dnums) if isinstance(dnums, dict) else None
    if contracting is None:
        if not lhs.dims or not rhs.dims or lhs.dims[-1] != rhs.dims[-1]:
            return _unmodeled(f"custom-call '{instr.name}' (__op$block_scaled_dot): cannot infer the "
                              f"contracting dimension of {lhs} x {rhs}")
        contracting = (len(lhs.dims) - 1,)
    return FlopCount(flops=dot_flops(lhs, _first_array(instr.shape), contracting))


def _cc_convolution(instr: Instruction, module: Module) -> FlopCount:
    """cuDNN / oneDNN convolution: GetConvolutionFlops on operands 0, 1 and output 0.

    GpuHloCostAnalysis::HandleCustomCall (IsCustomCallToDnnConvolution). The fused bias,
    side input and activation of convBiasActivationForward are not counted, as in XLA.
    """
    return _convolution(instr, module)


def _cc_fmha(instr: Instruction, module: Module) -> FlopCount:
    """cuDNN fused attention (``__cudnn$fmha*``).

    Forward: two batched matmuls, S = Q K^T and O = P V:
    ``2*BH*Sq*Sk*D + 2*BH*Sq*Sk*Dv`` (= 4*B*H*Sq*Sk*D when Dv == D).
    Backward (``...Backward``): five matmuls, the count FlashAttention-2 uses (Dao 2023,
    arXiv:2307.08691, sec. 4.1: backward FLOPs are 2.5x forward, 5 matmuls vs 2, because
    of recomputation):
    recompute S = Q K^T (D), dV = P^T dO (Dv), dP = dO V^T (Dv), dQ = dS K (D),
    dK = dS^T Q (D) -> ``2*BH*Sq*Sk*(3*D + 2*Dv)``.

    BH*Sq and Sk come from ``cudnn_fmha_backend_config.intermediate_tensor_shape``
    ([B, H, Sq, Sk]) when present, else from Q, K and ``bmm1_dot_dimension_numbers``
    (BH*Sq = Q's non-contracting dims, Sk = K's free dims). With Q, K, V = operands 0, 1, 2:
    D = elements(Q) / (BH*Sq) and Dv = D * elements(V) / elements(K) (K and V share
    batch, KV heads and Sk, so this also holds for grouped-query attention).
    Softmax, scale, bias, mask and dropout are not counted (they are O(BH*Sq*Sk), a 1/D
    fraction). A causal mask is not halved. Unmodeled when the shapes cannot be read.
    """
    target = instr.custom_call_target or ""
    cfg = (instr.backend_config or {}).get("cudnn_fmha_backend_config")
    if not isinstance(cfg, dict) or len(instr.operands) < 3:
        return _unmodeled(f"custom-call '{instr.name}' ({target}): no cudnn_fmha_backend_config")
    q, k, v = (_operand_shape(instr, module, i) for i in range(3))
    bh_sq = sk = 0
    its = cfg.get("intermediate_tensor_shape")
    d1 = cfg.get("bmm1_dot_dimension_numbers")
    if isinstance(its, dict) and isinstance(its.get("dimensions"), list) and len(its["dimensions"]) >= 2:
        dims = [int(x) for x in its["dimensions"]]
        bh_sq, sk = math.prod(dims[:-1]), dims[-1]
    elif isinstance(d1, dict):
        lc = {int(x) for x in d1.get("lhs_contracting_dimensions", [])}
        rc = {int(x) for x in d1.get("rhs_contracting_dimensions", [])}
        rb = {int(x) for x in d1.get("rhs_batch_dimensions", [])}
        bh_sq = math.prod(n for i, n in enumerate(q.dims) if i not in lc)
        sk = math.prod(n for i, n in enumerate(k.dims) if i not in rc | rb)
    d_qk = _elements(q) // bh_sq if bh_sq else 0
    d_v = d_qk * _elements(v) // _elements(k) if _elements(k) else 0
    if not (bh_sq and sk and d_qk and d_v):
        return _unmodeled(f"custom-call '{instr.name}' ({target}): cannot read the attention shape")
    if "Backward" in target:
        return FlopCount(flops=KFMA_FLOPS * bh_sq * sk * (3 * d_qk + 2 * d_v))
    return FlopCount(flops=KFMA_FLOPS * bh_sq * sk * (d_qk + d_v))


def _pallas_flops(instr: Instruction, module: Module) -> FlopCount:
    """Pallas TPU kernels: the kernel author's cost_estimate (passes/pallas.py)."""
    from .pallas import pallas_flops
    return pallas_flops(instr, module)


def _triton_flops(instr: Instruction, module: Module) -> FlopCount:
    """Pallas Triton kernels: their tt.dot ops per program x grid (passes/triton.py)."""
    from .pallas import triton_flops
    return triton_flops(instr, module)


def _mosaic_gpu_flops(instr: Instruction, module: Module) -> FlopCount:
    """Pallas Mosaic GPU kernels: not decoded, unmodeled (passes/pallas.py)."""
    from .pallas import mosaic_gpu_flops
    return mosaic_gpu_flops(instr, module)


CUSTOM_CALL_RULES: dict[str, Rule] = {
    "__cublas$gemm": _cc_gemm,
    "__cublas$lt$matmul": _cc_gemm,
    "__cublas$lt$matmul$f8": _cc_gemm,
    "__cublas$lt$matmul$mx": _cc_gemm,
    "__onednn$matmul": _cc_onednn_matmul,
    "__op$block_scaled_dot": _cc_block_scaled_dot,
    "__cudnn$blockScaledDot": _cc_block_scaled_dot,
    "__cudnn$convForward": _cc_convolution,
    "__cudnn$convBackwardInput": _cc_convolution,
    "__cudnn$convBackwardFilter": _cc_convolution,
    "__cudnn$convBiasActivationForward": _cc_convolution,
    "__cudnn$convForwardGraph": _cc_convolution,
    "__onednn$convolution": _cc_convolution,
    "tpu_custom_call": _pallas_flops,
    "__gpu$xla.gpu.triton": _triton_flops,
    "mosaic_gpu_v2": _mosaic_gpu_flops,
}

# Targets that do no arithmetic (the opcode table's custom-call records, hlo/opcodes.py).
_NO_ARITHMETIC_TARGETS = custom_call_targets(computes=False)

# Prefix rules, tried in order when no exact target matches.
CUSTOM_CALL_PREFIX_RULES: tuple[tuple[str, Rule], ...] = (
    ("__cudnn$fmha", _cc_fmha),
)

#: The work a library custom call does, by the rule that costs it: a matmul (gemm, block-scaled
#: dot), a convolution, or fused attention. reuse.py's tiling model and timing's matrix peaks
#: read it through :func:`custom_call_kind`.
CustomCallKind = Literal["matmul", "convolution", "attention"]
CUSTOM_CALL_KINDS: dict[Rule, CustomCallKind] = {
    _cc_gemm: "matmul", _cc_onednn_matmul: "matmul", _cc_block_scaled_dot: "matmul",
    _cc_convolution: "convolution", _cc_fmha: "attention",
}
#: Rules of user kernels (Pallas Mosaic / Triton, Mosaic GPU) costed from their own grid and
#: blocks (passes/pallas.py, passes/triton.py): no library kind, by design.
KERNEL_RULES: frozenset = frozenset({_pallas_flops, _triton_flops, _mosaic_gpu_flops})


def custom_call_rule(target: str | None) -> Rule | None:
    """The flop rule of a custom-call target (exact name, else the first matching prefix), or None."""
    target = target or ""
    rule = CUSTOM_CALL_RULES.get(target)
    if rule is None:
        rule = next((r for p, r in CUSTOM_CALL_PREFIX_RULES if target.startswith(p)), None)
    return rule


def custom_call_kind(target: str | None) -> CustomCallKind | None:
    """"matmul", "convolution" or "attention" for a library custom call with a flop rule,
    else None (``CUSTOM_CALL_KINDS``)."""
    return CUSTOM_CALL_KINDS.get(custom_call_rule(target))


def _custom_call(instr: Instruction, module: Module) -> FlopCount:
    """Library custom calls by target; an unknown target is unmodeled (XLA answers -1)."""
    target = instr.custom_call_target or ""
    rule = custom_call_rule(target)
    if rule is None:
        if target in _NO_ARITHMETIC_TARGETS:  # e.g. XLA:TPU's ConcatBitcast (hlo/opcodes.py)
            return ZERO
        return _unmodeled(f"custom-call target '{target}' has no cost rule")
    try:
        return rule(instr, module)
    except (ValueError, IndexError, KeyError, TypeError) as e:
        return _unmodeled(f"custom-call '{instr.name}' ({target}): {e}")


# ---- the rule table -------------------------------------------------------------------

FLOP_RULES: dict[str, Rule] = {
    **{op: _elementwise for op in ELEMENTWISE_OPCODES},
    **{op: _zero for op in ZERO_FLOP_OPCODES},
    "dot": _dot,
    "scaled-dot": _dot,
    "ragged-dot": _ragged_dot,
    "convolution": _convolution,
    "reduce": _reduce,
    "reduce-window": _reduce_window,
    "select-and-scatter": _select_and_scatter,
    "map": _map,
    "scatter": _scatter,
    "sort": _sort,
    "all-reduce": _all_reduce,
    "all-reduce-start": _all_reduce,
    "fft": _fft,
    "triangular-solve": _triangular_solve,
    "cholesky": _cholesky,
    "rng": _rng,
    "rng-bit-generator": _rng,
    "fusion": _fusion,
    "custom-call": _custom_call,
    # XLA counts these as 0 with a TODO (b/62294698, TopK); jaxmove says so instead.
    "batch-norm-training": _no_rule("no cost rule (XLA counts 0: TODO b/62294698)"),
    "batch-norm-inference": _no_rule("no cost rule (XLA counts 0: TODO b/62294698)"),
    "batch-norm-grad": _no_rule("no cost rule (XLA counts 0: TODO b/62294698)"),
    "topk": _no_rule("no cost rule (XLA counts 0)"),
    "collective-reduce": _no_rule("no cost rule"),
}


# The opcodes FLOP_RULES sends to _zero (-> ZERO) / _elementwise (computation_flops inlines both).
_ZERO_RULE_OPS = ZERO_RULE_OPCODES = frozenset(op for op, rule in FLOP_RULES.items() if rule is _zero)
_ELEMENTWISE_RULE_OPS = frozenset(op for op, rule in FLOP_RULES.items() if rule is _elementwise)


def instruction_flops(instr: Instruction, module: Module) -> FlopCount:
    """FLOPs and transcendentals of one execution of ``instr``.

    A fusion costs the sum over its fused computation (recursively through nested
    fusions); reduce/map/scatter/sort-like ops include their applied computation per
    application. ``while``, ``conditional``, ``call`` and ``async-start`` return
    ``FlopCount()``: their called computations are costed separately by the caller,
    which applies trip counts. Never raises for an unknown opcode or custom-call target:
    the result lists it in ``unmodeled``.
    """
    rule = FLOP_RULES.get(instr.opcode)
    if rule is None:
        return _unmodeled(f"opcode '{instr.opcode}' has no cost rule")
    return rule(instr, module)


def computation_flops(comp: Computation, module: Module) -> FlopCount:
    """Sum of :func:`instruction_flops` over every instruction of ``comp`` (one execution).

    Used for fused computations and for the per-application cost of ``to_apply``.
    """
    flops = transcendentals = 0
    unmodeled: dict[str, None] = {}
    zero, elementwise, transcendental = _ZERO_RULE_OPS, _ELEMENTWISE_RULE_OPS, TRANSCENDENTAL_OPCODES
    for instr in comp.instructions:
        op = instr.opcode
        if op in zero:
            continue
        if op in elementwise:  # _elementwise, inlined: most fused instructions
            shape = instr.shape
            if shape.is_array:
                if op in transcendental:
                    transcendentals += shape.num_elements
                else:
                    flops += shape.num_elements
            continue
        fc = instruction_flops(instr, module)
        flops += fc.flops
        transcendentals += fc.transcendentals
        if fc.unmodeled:
            unmodeled.update(dict.fromkeys(fc.unmodeled))
    return _flop_count(flops, transcendentals, tuple(unmodeled))
