"""Structural checks of a parsed HLO module, as XLA's parser and ``HloVerifier`` make them.

Each failed check is an :class:`HloParseError` naming the file, and the line and column of
the offending instruction's name (or computation header). XLA's own parser aborts the
process on some of these inputs (a reshape whose element counts differ hits a
``CHECK`` in ``HloInstruction::CreateReshape``); jaxmove reports them.

Checks, with their XLA source:

* operands are defined, before their use (``HloParserImpl::ParseOperands``: "instruction
  does not exist"); a use before the definition that closes a loop is an *operand cycle*;
* called computations exist, and the call graph has no cycle (``CallGraph``; a computation
  that calls itself would make every pass recurse forever);
* parameter numbers of a computation are unique and contiguous from 0
  (``HloComputation::AddParameter`` / the parser's "parameter number already used");
* operand counts of opcodes with a fixed arity (``HloOpcodeArity``, xla/hlo/ir/hlo_opcode.h,
  and the ``Create*`` factories; dynamic-slice takes 1 + rank operands, dynamic-update-slice
  2 + rank, or the older 2 / 3 with one index vector);
* element counts: reshape keeps the element count (``ShapeUtil::StaticExtentProduct``,
  ``HloInstruction::CreateReshape``); bitcast keeps the byte size (``HloVerifier::
  HandleBitcast``: "Bitcast cannot have different shape sizes of output and operand"): the
  *physical* size where layouts are tiled (the backend's shape-size function; XLA:TPU bitcasts
  between layouts of equal padded size and different data size), or else the data size;
  bitcast-convert follows ``ShapeInference::InferBitcastConvertShape`` (same dims for equal
  bit widths, else one trailing dimension of size ratio added or removed);
* get-tuple-element indexes a tuple element that exists, with that element's shape; a
  tuple's shape is the tuple of its operands' shapes; control flow and fusions call
  computations with as many parameters as they pass operands (``HloVerifier::
  CheckParameterCount`` / ``HandleWhile`` / ``HandleConditional``); the attributes that name
  the called computations are present (``calls=``, ``condition=``/``body=``, ``to_apply=``);
* called computations' signatures (``HloVerifier::HandleFusion`` / ``HandleCall`` /
  ``HandleWhile`` / ``HandleConditional``, ``ShapeInference::InferCallShape`` /
  ``InferWhileShape`` / ``InferConditionalShape``), compared by tuple structure, element type
  and dimensions, layouts and memory spaces ignored (``_shape_difference``): a fusion's or
  call's operands have its computation's parameter shapes and its shape is that computation's
  root shape; a while's operand, shape, body and condition parameters and body root are one
  loop state, and its condition returns ``pred[]``; a conditional's index is ``s32[]`` (or
  ``pred[]`` with two branches), branch ``k`` takes operand ``k + 1``'s shape and every branch
  returns the conditional's shape. Element types are compared exactly here: XLA builds a
  called computation's parameters from its caller's operands, so they agree after float
  normalization too;
* string literals hold only the escapes XLA's lexer unescapes (``attrs.c_unescape``, after
  ``absl::CUnescape``; hlo_lexer.cc "Failed unescaping string");
* the result shapes of the data-movement opcodes whose shapes jaxmove's byte counts read
  (``ShapeInference::InferSliceShape`` / ``InferDynamicSliceShape`` /
  ``InferDynamicUpdateSliceShape`` / ``InferConcatOpShape`` / ``InferBroadcastShape`` /
  ``InferTransposeShape``, and ``HloVerifier::HandleBroadcast``): a slice's ranges lie in
  its operand and give its result's dimensions; a dynamic-slice's ``dynamic_slice_sizes``
  fit its operand and are its result's dimensions; a dynamic-update-slice's update fits in
  its operand, whose shape is the result's; a concatenation's operands agree off its
  dimension and sum along it; a broadcast maps each operand dimension to a result dimension
  of the same size; a transpose's ``dimensions`` permute its operand's into the result's;
* the result shapes of the opcodes whose bytes and FLOPs the passes read from their result
  (``ShapeInference::InferDotOpShape`` / ``InferUnaryOpShape`` / ``InferSelectShape`` /
  ``InferPadShape`` / ``InferReduceShape`` / ``InferGatherShape`` / ``InferReverseShape`` /
  ``InferBinaryOpShape``, ``HloVerifier::HandleIota``): a plain ``dot``'s result is its batch
  dimensions, then lhs's and then rhs's other non-contracted ones (sparse dots, ragged-dot,
  scaled-dot and cuBLAS custom calls: dimension numbers only); a copy keeps its operand's
  shape up to the layout; a select's on_true/on_false have the result's shape and its pred the
  result's dimensions (or is a scalar pred); a scatter has its operand's shape and update
  windows that fit in the operand (``InferScatterShape``, ``_check_scatter``); a pad adds
  ``lo + hi + interior * (n - 1)`` per dimension and pads with a scalar; a reduce removes its
  ``dimensions`` from each input (one result per input); a gather's result holds its slice sizes (less the collapsed and batching
  ones) at ``offset_dims`` and its indices' batch dimensions elsewhere; a reverse keeps its
  operand's shape and names distinct dimensions of it; an iota's ``iota_dimension`` is a
  result dimension; a compare gives ``pred``. Element types are compared only where the rule
  fixes them (copy, select, compare), and between floating-point types not at all: XLA's
  float-normalization passes narrow results to bf16 in place, which its verifier accepts
  with ``allow_mixed_precision``.
  Shapes with dynamic (``<=``) dimensions are not compared.
"""

from __future__ import annotations

import re

from .attrs import EscapeError, c_unescape
from .errors import HloParseError
from .ints import ascii_int, is_uint
from .ir import CALLED_COMPUTATION_ATTRS, Computation, Instruction, Module
from .opcodes import OPCODES, arity_check, names
from .shape import FLOAT_TYPES, PRIMITIVE_BIT_WIDTHS, Shape, shape_text

# opcode -> (description, predicate on the operand count): the arity column of the opcode
# table (opcodes.py, after HloOpcodeArity and the Create* factories)
_ARITY: dict[str, tuple[str, object]] = {
    op: chk for op in OPCODES if (chk := arity_check(op)) is not None}

# Attributes that must be present, per opcode, because they name the called computations.
_REQUIRED_CALLS: dict[str, tuple[str, ...]] = {
    "fusion": ("calls",), "while": ("condition", "body"), "call": ("to_apply",),
    "map": ("to_apply",), "reduce": ("to_apply",), "reduce-window": ("to_apply",),
    "all-reduce": ("to_apply",), "all-reduce-start": ("to_apply",),
    "reduce-scatter": ("to_apply",), "scatter": ("to_apply",), "sort": ("to_apply",),
    "select-and-scatter": ("select", "scatter"),
}


_CALLED_KEYS = frozenset(CALLED_COMPUTATION_ATTRS)


def _err(filename: str, instr: Instruction, msg: str) -> HloParseError:
    return HloParseError(filename, instr.line, instr.column, msg)


def compatible(a: Shape, b: Shape) -> bool:
    """Same element types and dimensions, recursively, ignoring layouts (``ShapeUtil::Compatible``)."""
    if a is b:  # (the parser shares one Shape per distinct text)
        return True
    if a.is_tuple or b.is_tuple:
        return (a.is_tuple and b.is_tuple and len(a.tuple_shapes) == len(b.tuple_shapes)
                and all(compatible(x, y) for x, y in zip(a.tuple_shapes, b.tuple_shapes)))
    return a.element_type == b.element_type and a.dims == b.dims


def _unbounded(s: Shape) -> bool:
    return True in s.dynamic and any(d and n == 0 for n, d in zip(s.dims, s.dynamic))


def _check_elements(filename: str, instr: Instruction, src: Shape) -> None:
    op, out = instr.opcode, instr.shape
    if not (src.is_array and out.is_array):
        if op != "bitcast" or src.is_array != out.is_array:
            raise _err(filename, instr, f"{op} '{instr.name}' of {src} to {out}: both must be arrays")
        return
    if _unbounded(src) or _unbounded(out):
        return
    if op == "reshape":
        if src.num_elements != out.num_elements:
            raise _err(filename, instr, f"reshape '{instr.name}' changes the element count: operand "
                       f"{src} has {src.num_elements} elements, result {out} has {out.num_elements}")
    elif op == "bitcast":
        # physical sizes (tile padding included) where layouts are tiled: XLA:TPU bitcasts
        # u32[1,1,128]{2,1,0:T(1,128)} to pred[16]{0:T(512)(128)(4,1)}, 512 bytes each
        if src.byte_size != out.byte_size and src.logical_byte_size != out.logical_byte_size:
            raise _err(filename, instr, f"bitcast '{instr.name}' changes the byte size: operand {src} "
                       f"is {_size_text(src)}, result {out} is {_size_text(out)}")
    else:  # bitcast-convert
        ib, ob = src.bit_width, out.bit_width
        if ib == ob:
            ok = src.dims == out.dims
            want = f"the operand's dimensions {list(src.dims)}"
        elif ib > ob:
            ok = ob > 0 and ib % ob == 0 and out.dims == src.dims + (ib // ob,)
            want = f"dimensions {list(src.dims) + [ib // ob if ob else '?']}"
        else:
            ok = ib > 0 and ob % ib == 0 and src.dims[-1:] == (ob // ib,) and out.dims == src.dims[:-1]
            want = (f"the operand's dimensions without a last dimension of size {ob // ib if ib else '?'}")
        if not ok:
            raise _err(filename, instr, f"bitcast-convert '{instr.name}' of {src} ({ib}-bit) to {out} "
                       f"({ob}-bit): the result must have {want} "
                       f"({src.num_elements * ib} bits in, {out.num_elements * ob} bits out)")


def _size_text(s: Shape) -> str:
    if s.byte_size == s.logical_byte_size:
        return f"{s.byte_size} bytes"
    return f"{s.byte_size} bytes with tile padding ({s.logical_byte_size} of data)"


# attribute text -> its dimension numbers, for the texts _dims_attr read without error (the
# layers of a model repeat the same few: '{1}', '{1,1024,1024}'); cleared when it fills
_DIMS_CACHE: dict[str, tuple[int, ...]] = {}
_DIMS_CACHE_MAX = 4096


def _dims_attr(filename: str, instr: Instruction, key: str) -> tuple[int, ...]:
    v = instr.attrs.get(key)
    if v is None:
        return ()
    hit = _DIMS_CACHE.get(v)
    if hit is not None:
        return hit
    if len(v) > 2 and v[0] == "{" and v[-1] == "}" and is_uint(v[1:-1]):
        out = (int(v[1:-1]),)  # the usual '{1}', without the general split below
    else:
        t = v.strip()
        if not (t.startswith("{") and t.endswith("}")):
            raise _err(filename, instr, f"{key}={v} of '{instr.name}': expected {{d0,d1,...}}")
        try:
            out = tuple(ascii_int(x) for x in t[1:-1].split(",") if x.strip())
        except ValueError:
            raise _err(filename, instr, f"{key}={v} of '{instr.name}': expected integers") from None
    if len(_DIMS_CACHE) >= _DIMS_CACHE_MAX:
        _DIMS_CACHE.clear()
    _DIMS_CACHE[v] = out
    return out


_DOT_DIM_KEYS = {side: tuple((kind, f"{side}_{kind}_dims") for kind in ("contracting", "batch"))
                  for side in ("lhs", "rhs")}


def _check_dot_dims(filename: str, instr: Instruction, lhs: Shape, rhs: Shape) -> None:
    """Dimension numbers name dimensions the operands have, contracted/batch sizes agree, and a
    plain ``dot``'s result has the batch dimensions (in ``lhs_batch_dims`` order), then lhs's
    and then rhs's other dimensions, each in operand order (``ShapeInference::InferDotOpShape``).
    Element types are not compared (``preferred_element_type`` picks the result's). A sparse
    dot (``sparsity=L.1@2:4``) stores its sparse operand compressed along a contracting
    dimension: only its dimension numbers are checked; ragged-dot and scaled-dot likewise."""
    if not (lhs.is_array and rhs.is_array):
        raise _err(filename, instr, f"'{instr.opcode}' '{instr.name}' of {lhs} and {rhs}: operands "
                   "must be arrays")
    pairs = []
    for side, shape in (("lhs", lhs), ("rhs", rhs)):
        rank = len(shape.dims)
        got = []  # (contracting, batch)
        for _kind, key in _DOT_DIM_KEYS[side]:
            dims = _dims_attr(filename, instr, key)
            for d in dims:
                if not 0 <= d < rank:
                    raise _err(filename, instr, f"{key}={{{','.join(map(str, dims))}}} of "
                               f"'{instr.name}': operand {shape} has no dimension {d}")
            got.append(dims)
        pairs.append(got)
    if instr.opcode != "dot" or "sparsity" in instr.attrs:
        return
    for j, kind in enumerate(("contracting", "batch")):
        ls, rs = pairs[0][j], pairs[1][j]
        if len(ls) != len(rs) or any(lhs.dims[a] != rhs.dims[b] for a, b in zip(ls, rs)):
            raise _err(filename, instr, f"dot '{instr.name}': {kind} dimensions {list(ls)} of {lhs} "
                       f"and {list(rs)} of {rhs} differ in number or size")
    out = instr.shape
    if any(lhs.dynamic) or any(rhs.dynamic) or (out.is_array and any(out.dynamic)):
        return
    (lc, lb), (rc, rb) = pairs
    want = (tuple(lhs.dims[d] for d in lb)
            + tuple(n for d, n in enumerate(lhs.dims) if d not in lc and d not in lb)
            + tuple(n for d, n in enumerate(rhs.dims) if d not in rc and d not in rb))
    if not out.is_array or out.dims != want:
        attrs = instr.attrs
        dnums = ", ".join(f"{k}={attrs[k]}" for k in _DOT_PRINT_ORDER if k in attrs)
        raise _err(filename, instr, f"dot '{instr.name}' has shape {out} but {lhs} x {rhs} with "
                   f"{dnums or 'no dimension numbers'} gives dimensions {_dims_text(want)} (the "
                   "batch dimensions, then lhs's and then rhs's that are neither batch nor contracting)")


_DOT_PRINT_ORDER = ("lhs_batch_dims", "lhs_contracting_dims", "rhs_batch_dims",
                    "rhs_contracting_dims")


_GEMM_DIM_KEYS = {"lhs": ("lhs_contracting_dimensions", "lhs_batch_dimensions"),
                  "rhs": ("rhs_contracting_dimensions", "rhs_batch_dimensions")}


def _check_cublas_gemm(filename: str, instr: Instruction, by_name: dict) -> None:
    """A cuBLAS gemm custom call (``__cublas$gemm``, ``__cublas$lt$matmul*``) takes at least
    two array operands, lhs and rhs (XLA's GemmRewriter creates it so; cuBLASLt adds bias and
    scales after them), and its ``gemm_backend_config.dot_dimension_numbers`` lists integers
    (the proto's int64 printed as JSON numbers or digit strings) naming dimensions of those
    operands, contracted and batch sizes agreeing (as for a ``dot``). A missing or unreadable
    backend_config is left to the passes (listed as unmodeled there)."""
    ops = [by_name[o].shape for o in instr.operands]
    if len(ops) < 2 or not (ops[0].is_array and ops[1].is_array):
        raise _err(filename, instr, f"cuBLAS gemm '{instr.name}' ({instr.custom_call_target}) takes "
                   f"lhs and rhs array operands, got {len(ops)} operand(s)")
    bc = instr.backend_config
    gemm = bc.get("gemm_backend_config") if isinstance(bc, dict) else None
    dnums = gemm.get("dot_dimension_numbers") if isinstance(gemm, dict) else None
    if not isinstance(dnums, dict):
        return
    got: dict[str, tuple[int, ...]] = {}
    for side, shape in (("lhs", ops[0]), ("rhs", ops[1])):
        for key in _GEMM_DIM_KEYS[side]:
            v = dnums.get(key, [])
            ok = isinstance(v, list) and all(
                (isinstance(d, int) and not isinstance(d, bool)) or (isinstance(d, str) and is_uint(d))
                for d in v)
            if not ok:
                raise _err(filename, instr, f"cuBLAS gemm '{instr.name}': {key}={v!r} in its "
                           "backend_config: expected a list of dimension numbers")
            dims = tuple(int(d) for d in v)
            for d in dims:
                if not 0 <= d < len(shape.dims):
                    raise _err(filename, instr, f"cuBLAS gemm '{instr.name}': {key}={list(dims)}: "
                               f"operand {shape} has no dimension {d}")
            got[key] = dims
    for kind in ("contracting", "batch"):
        ls, rs = got[f"lhs_{kind}_dimensions"], got[f"rhs_{kind}_dimensions"]
        if len(ls) != len(rs) or any(ops[0].dims[a] != ops[1].dims[b] for a, b in zip(ls, rs)):
            raise _err(filename, instr, f"cuBLAS gemm '{instr.name}': {kind} dimensions {list(ls)} "
                       f"of {ops[0]} and {list(rs)} of {ops[1]} differ in number or size")


def _check_int_constant(filename: str, instr: Instruction) -> None:
    """A scalar integer constant's value fits its type (XLA's parser refuses ``s8[] constant(200)``;
    such constants bound loops: passes/trip_count.py)."""
    et = instr.shape.element_type
    bits = PRIMITIVE_BIT_WIDTHS.get(et)
    text = (instr.literal or "").strip()
    if not bits or not text or not (text.lstrip("-").isdigit() and text.isascii()):
        return
    v = int(text)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if et[0] == "s" else (0, (1 << bits) - 1)
    if not lo <= v <= hi:
        raise _err(filename, instr, f"constant '{instr.name}': {text} is out of range for {et} "
                   f"[{lo}, {hi}]")


def _check_instruction(filename: str, mod: Module, comp: Computation, instr: Instruction,
                       dots_ok: set | None = None) -> tuple[str, ...]:
    """Check one instruction; returns the computations it calls. ``dots_ok``: the keys of the
    dots checked so far in this module (operand shapes and dimension attributes), whose
    dimension checks pass again."""
    op = instr.opcode
    n = len(instr.operands)
    if op == "fusion":  # the checks below that apply to a fusion, without the others' tests
        if "calls" not in instr.attrs:
            raise _err(filename, instr, f"'fusion' instruction '{instr.name}' has no calls= attribute")
        called = instr.called_computations
        computations = mod.computations
        for c in called:
            if c not in computations:
                raise _err(filename, instr, f"instruction '{instr.name}' calls undefined computation '{c}'")
        if called:
            callee = computations[called[0]]
            if len(callee.parameters) != n:
                raise _err(filename, instr, f"fusion '{instr.name}' passes {n} operands to computation "
                           f"'{callee.name}', which has {len(callee.parameters)} parameters")
            _check_call_signature(filename, comp, instr, callee)
        return called
    by_name = comp.by_name
    arity = _ARITY.get(op)
    if arity is not None and not arity[1](n):
        raise _err(filename, instr, f"'{op}' instruction '{instr.name}' takes {arity[0]}, got {n}")
    if op in ("dynamic-slice", "dynamic-update-slice"):
        base = 1 if op == "dynamic-slice" else 2
        if n < base:
            raise _err(filename, instr, f"'{op}' instruction '{instr.name}' takes at least {base} "
                       f"operands, got {n}")
        src = by_name[instr.operands[0]].shape
        rank = len(src.dims) if src.is_array else 0
        idx = by_name[instr.operands[base]].shape if n == base + 1 else None
        # the older form passes one rank-1 index vector of length rank
        vector_form = idx is not None and idx.is_array and idx.dims == (rank,)
        if n != base + rank and not vector_form:
            raise _err(filename, instr, f"'{op}' instruction '{instr.name}' of a rank-{rank} operand "
                       f"takes {base + rank} operands ({base - 1 and 'operand, update' or 'operand'}"
                       f" and one scalar index per dimension), got {n}")
    elif op == "dot" and n != 2 and not ("sparsity" in instr.attrs and 2 < n <= 4):
        raise _err(filename, instr, f"'dot' instruction '{instr.name}' takes 2 operands, got {n}")
    if op == "constant" and not instr.shape.dims and instr.shape.element_type[:1] in ("s", "u"):
        _check_int_constant(filename, instr)
    if op == "custom-call" and (instr.custom_call_target or "").startswith("__cublas$"):
        _check_cublas_gemm(filename, instr, by_name)
    if op in ("dot", "ragged-dot", "scaled-dot") and n >= 2:
        lhs, rhs = by_name[instr.operands[0]].shape, by_name[instr.operands[1]].shape
        if dots_ok is None:
            _check_dot_dims(filename, instr, lhs, rhs)
        else:  # (the layers of a model repeat a few dots: each checked once)
            attrs = instr.attrs
            key = (op, id(lhs), id(rhs), id(instr.shape), attrs.get("lhs_contracting_dims"),
                   attrs.get("lhs_batch_dims"), attrs.get("rhs_contracting_dims"),
                   attrs.get("rhs_batch_dims"), "sparsity" in attrs)
            if key not in dots_ok:
                _check_dot_dims(filename, instr, lhs, rhs)
                dots_ok.add(key)
    if op in ("reshape", "bitcast", "bitcast-convert") and n == 1:
        _check_elements(filename, instr, by_name[instr.operands[0]].shape)
    elif op == "get-tuple-element" and n == 1:
        src = by_name[instr.operands[0]].shape
        k = instr.index_first()  # (XLA's form, read without splitting the attributes)
        if k is None:
            idx = instr.attrs.get("index", "").strip()
            if not is_uint(idx):
                raise _err(filename, instr, f"get-tuple-element '{instr.name}' needs index=<integer>, "
                           f"got {instr.attrs.get('index')!r}")
            k = int(idx)
        if not src.is_tuple or k >= len(src.tuple_shapes):
            raise _err(filename, instr, f"get-tuple-element '{instr.name}': index={k} is not an "
                       f"element of its operand's shape {src}")
        if not compatible(src.tuple_shapes[k], instr.shape):
            raise _err(filename, instr, f"get-tuple-element '{instr.name}' has shape {instr.shape} "
                       f"but element {k} of its operand is {src.tuple_shapes[k]}")
    elif op == "tuple":
        if not instr.shape.is_tuple or len(instr.shape.tuple_shapes) != n or not all(
                compatible(by_name[o].shape, s) for o, s in zip(instr.operands, instr.shape.tuple_shapes)):
            raise _err(filename, instr, f"tuple '{instr.name}' has shape {instr.shape}, which is not "
                       f"the tuple of its {n} operands' shapes")
    rule = _SHAPE_RULES.get(op)
    if rule is not None and n >= 1:
        shape, src = instr.shape, by_name[instr.operands[0]].shape
        if shape.is_array and src.is_array:
            if not any(shape.dynamic) and not any(src.dynamic):
                rule(filename, comp, instr, src)
        elif op == "copy" and not _compatible_up_to_fp(src, shape):  # a tuple copy
            raise _err(filename, instr, f"copy '{instr.name}' has shape {shape} but its operand is "
                       f"{src}: a copy keeps its operand's shape; only layouts may differ")
    elif rule is None:
        rule = _OWN_SHAPE_RULES.get(op)
        if rule is not None:
            rule(filename, comp, instr)
    for key in _REQUIRED_CALLS.get(op, ()):
        if key not in instr.attrs:
            raise _err(filename, instr, f"'{op}' instruction '{instr.name}' has no {key}= attribute")
    called = instr.called_computations  # () without such attributes
    for c in called:
        if c not in mod.computations:
            raise _err(filename, instr, f"instruction '{instr.name}' calls undefined computation '{c}'")
    if op in ("fusion", "call") and called:
        callee = mod.computations[called[0]]
        if len(callee.parameters) != n:
            raise _err(filename, instr, f"{op} '{instr.name}' passes {n} operands to computation "
                       f"'{callee.name}', which has {len(callee.parameters)} parameters")
        _check_call_signature(filename, comp, instr, callee)
    elif op == "while":
        _check_trip_count(filename, instr)
        loop = {}
        for key in ("condition", "body"):
            callee = loop[key] = mod.computations[instr.attrs[key].strip().lstrip("%")]
            if len(callee.parameters) != 1:
                raise _err(filename, instr, f"while '{instr.name}': its {key} '{callee.name}' must have "
                           f"1 parameter, has {len(callee.parameters)}")
        if n == 1:
            _check_while_signature(filename, comp, instr, loop["condition"], loop["body"])
    elif op == "conditional":
        if n != len(called) + 1:
            raise _err(filename, instr, f"conditional '{instr.name}' has {len(called)} branches and "
                       f"so takes {len(called) + 1} operands, got {n}")
        for c in called:
            if len(mod.computations[c].parameters) != 1:
                raise _err(filename, instr, f"conditional '{instr.name}': branch '{c}' must have 1 "
                           f"parameter, has {len(mod.computations[c].parameters)}")
        _check_conditional_signature(filename, comp, instr, [mod.computations[c] for c in called])
    return called


def _shape_difference(a: Shape, b: Shape, index: tuple[int, ...] = ()) -> tuple[int, ...] | None:
    """The ShapeIndex of the first place where ``a`` and ``b`` differ in tuple structure,
    element type or dimensions, else None (``ShapeUtil::Compatible``: layouts, tiles and
    memory spaces are ignored, and bounded dynamic dimensions compare by their bounds). An
    array with an unbounded (``?``) dimension matches any array of its element type."""
    if a is b:  # (the parser shares one Shape per distinct text)
        return None
    if a.is_tuple or b.is_tuple:
        if not (a.is_tuple and b.is_tuple and len(a.tuple_shapes) == len(b.tuple_shapes)):
            return index
        for k, (x, y) in enumerate(zip(a.tuple_shapes, b.tuple_shapes)):
            where = _shape_difference(x, y, index + (k,))
            if where is not None:
                return where
        return None
    if a.element_type != b.element_type:
        return index
    if a.dims != b.dims and not (a.has_unbounded_dim or b.has_unbounded_dim):
        return index
    return None


def _at(shape: Shape, index: tuple[int, ...]) -> str:
    """`` (element {i,j}: f32[8])`` naming where in a tuple shape a difference lies; ''
    at the top."""
    if not index:
        return ""
    return f" (element {{{','.join(map(str, index))}}}: {shape_text(shape.subshape(index))})"


def _check_call_signature(filename: str, comp: Computation, instr: Instruction,
                          callee: Computation) -> None:
    """A fusion's or call's operand ``k`` has the shape of parameter ``k`` of the computation
    it calls, and its own shape is that computation's root shape (``HloVerifier``'s
    ``HandleFusion`` / ``HandleCall``, ``ShapeInference::InferCallShape``; compared as
    ``_shape_difference`` does, so TPU operands that differ from the parameters only in layout
    or memory space ``S(n)`` pass). The parameter counts agree (checked before)."""
    by_name = comp.by_name
    ops = instr.operands
    for p in callee.parameters:
        k = p.parameter_number
        if k is None or k >= len(ops):
            continue
        src = by_name[ops[k]].shape
        where = _shape_difference(src, p.shape)
        if where is not None:
            raise _err(filename, instr, f"{instr.opcode} '{instr.name}' passes operand {k} '{ops[k]}' "
                       f"{src} to parameter {k} '{p.name}' {p.shape} of computation '{callee.name}'"
                       f"{_at(src, where)}: expected the operand to have the parameter's shape "
                       f"{shape_text(p.shape)} (only layouts may differ)")
    root = callee.root.shape
    where = _shape_difference(instr.shape, root)
    if where is not None:
        raise _err(filename, instr, f"{instr.opcode} '{instr.name}' has shape {instr.shape}"
                   f"{_at(instr.shape, where)} but its computation '{callee.name}' returns {root} (root '{callee.root.name}'): "
                   f"expected {shape_text(root)}, the shape of the called computation's root")


def _check_while_signature(filename: str, comp: Computation, instr: Instruction,
                           cond: Computation, body: Computation) -> None:
    """A while's loop state has one shape: its operand's, its own, its body's and condition's
    parameter's and its body's root's; its condition returns ``pred[]`` (``HloVerifier::
    HandleWhile``, ``ShapeInference::InferWhileShape``: "While condition should have shape
    PRED"). Compared as ``_shape_difference`` does (layouts ignored)."""
    state_name = instr.operands[0]
    state = comp.by_name[state_name].shape
    where = _shape_difference(instr.shape, state)
    if where is not None:
        raise _err(filename, instr, f"while '{instr.name}' has shape {instr.shape}{_at(instr.shape, where)} "
                   f"but its operand (the initial loop state) '{state_name}' is {state}: expected "
                   f"{shape_text(state)}")
    for key, callee in (("body", body), ("condition", cond)):
        p = callee.parameters[0]
        where = _shape_difference(p.shape, state)
        if where is not None:
            raise _err(filename, instr, f"while '{instr.name}': parameter '{p.name}' of its {key} "
                       f"'{callee.name}' is {p.shape}{_at(p.shape, where)} but the loop state "
                       f"'{state_name}' is {state}: expected {shape_text(state)}")
    root = body.root.shape
    where = _shape_difference(root, state)
    if where is not None:
        raise _err(filename, instr, f"while '{instr.name}': its body '{body.name}' returns {root}"
                   f"{_at(root, where)} (root '{body.root.name}') but the loop state "
                   f"'{state_name}' is {state}: expected the body to return {shape_text(state)}")
    pred = cond.root.shape
    if pred.element_type != "pred" or pred.dims:
        raise _err(filename, instr, f"while '{instr.name}': its condition '{cond.name}' returns "
                   f"{pred} (root '{cond.root.name}'): expected pred[]")


def _check_conditional_signature(filename: str, comp: Computation, instr: Instruction,
                                 branches: list[Computation]) -> None:
    """``conditional(index, operand_0, ..., operand_{n-1})``: the index is a scalar ``pred``
    (two branches: true, then false) or ``s32``; branch ``k``'s parameter has operand ``k``'s
    shape and every branch returns the conditional's shape (``ShapeInference::
    InferConditionalShape``, ``HloVerifier::HandleConditional``). Compared as
    ``_shape_difference`` does (layouts ignored)."""
    by_name = comp.by_name
    ops = instr.operands
    idx = by_name[ops[0]].shape
    if not idx.is_array or idx.dims or idx.element_type not in ("pred", "s32") or (
            idx.element_type == "pred" and len(branches) != 2):
        raise _err(filename, instr, f"conditional '{instr.name}': its branch index '{ops[0]}' is "
                   f"{idx} with {len(branches)} branches: expected s32[] (or pred[] with 2 branches)")
    out = instr.shape
    for k, branch in enumerate(branches):
        p = branch.parameters[0]
        src = by_name[ops[k + 1]].shape
        where = _shape_difference(src, p.shape)
        if where is not None:
            raise _err(filename, instr, f"conditional '{instr.name}' passes operand {k + 1} "
                       f"'{ops[k + 1]}' {src} to branch {k} '{branch.name}', whose parameter "
                       f"'{p.name}' is {p.shape}{_at(p.shape, where)}: expected the parameter to "
                       f"have the operand's shape {shape_text(src)}")
        root = branch.root.shape
        where = _shape_difference(root, out)
        if where is not None:
            raise _err(filename, instr, f"conditional '{instr.name}' has shape {out} but branch {k} "
                       f"'{branch.name}' returns {root}{_at(root, where)} (root "
                       f"'{branch.root.name}'): expected every branch to return {shape_text(out)}")


def _dims_text(dims) -> str:
    return "[" + ",".join(map(str, dims)) + "]"


def _result_error(filename: str, instr: Instruction, want, why: str) -> HloParseError:
    return _err(filename, instr, f"{instr.opcode} '{instr.name}' has shape {instr.shape} but {why} "
                f"gives dimensions {_dims_text(want)}")


def _check_slice(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """``slice={[start:limit(:stride)], ...}``: one range per operand dimension, 0 <= start <=
    limit <= size, stride >= 1; result dimension ceil((limit - start) / stride)
    (``ShapeInference::InferSliceShape``)."""
    text = instr.attrs.get("slice")
    if text is None:
        raise _err(filename, instr, f"slice '{instr.name}' has no slice={{[start:limit], ...}} attribute")
    ranges = []
    for part in text.strip().strip("{}").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            nums = [ascii_int(x) for x in part.strip("[]").split(":")]
        except ValueError:
            nums = []
        if not (part.startswith("[") and part.endswith("]") and len(nums) in (2, 3)):
            raise _err(filename, instr, f"slice '{instr.name}': expected [start:limit] or "
                       f"[start:limit:stride] in slice={text}, found '{part}'")
        ranges.append((nums if len(nums) == 3 else nums + [1], part))
    if len(ranges) != len(src.dims):
        raise _err(filename, instr, f"slice '{instr.name}' of a rank-{len(src.dims)} operand {src} "
                   f"needs {len(src.dims)} ranges, slice={text} has {len(ranges)}")
    want = []
    for d, (((start, limit, stride), part), size) in enumerate(zip(ranges, src.dims)):
        if not (0 <= start <= limit <= size and stride >= 1):
            raise _err(filename, instr, f"slice '{instr.name}': range {part} of "
                       f"dimension {d} does not lie in [0:{size}] of operand {src} (need 0 <= start "
                       "<= limit <= size, stride >= 1)")
        want.append(-(-(limit - start) // stride))
    if tuple(want) != instr.shape.dims:
        raise _result_error(filename, instr, want, f"slice={text} of {src}")


def _check_dynamic_slice(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """``dynamic_slice_sizes``: one per operand dimension, each at most its size; they are the
    result's dimensions (``ShapeInference::InferDynamicSliceShape``)."""
    if "dynamic_slice_sizes" not in instr.attrs:
        raise _err(filename, instr, f"dynamic-slice '{instr.name}' has no dynamic_slice_sizes= attribute")
    sizes = _dims_attr(filename, instr, "dynamic_slice_sizes")
    if len(sizes) != len(src.dims) or any(not 0 <= k <= n for k, n in zip(sizes, src.dims)):
        raise _err(filename, instr, f"dynamic-slice '{instr.name}': dynamic_slice_sizes="
                   f"{{{','.join(map(str, sizes))}}} must give one size in [0, n] per dimension of "
                   f"its operand {src}")
    if sizes != instr.shape.dims:
        raise _result_error(filename, instr, sizes, f"dynamic_slice_sizes of {src}")


def _check_dynamic_update_slice(filename: str, comp: Computation, instr: Instruction,
                                src: Shape) -> None:
    """The update has the operand's rank and fits in it; the result is the operand's shape
    (``ShapeInference::InferDynamicUpdateSliceShape``)."""
    if len(instr.operands) < 2:
        return
    upd = comp.by_name[instr.operands[1]].shape
    if upd.is_array and not any(upd.dynamic) and (
            len(upd.dims) != len(src.dims) or any(u > n for u, n in zip(upd.dims, src.dims))):
        raise _err(filename, instr, f"dynamic-update-slice '{instr.name}': update {upd} does not fit "
                   f"in operand {src} (same rank, each dimension at most the operand's)")
    if src.dims != instr.shape.dims:
        raise _result_error(filename, instr, src.dims, f"its operand {src}")


def _check_concatenate(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """Operands of one rank, equal off the concatenated dimension; the result sums along it
    (``ShapeInference::InferConcatOpShape``)."""
    dims = _dims_attr(filename, instr, "dimensions")
    rank = len(src.dims)
    if len(dims) != 1 or not 0 <= dims[0] < rank:
        raise _err(filename, instr, f"concatenate '{instr.name}': dimensions= must name one "
                   f"dimension of its rank-{rank} operands, got {instr.attrs.get('dimensions')}")
    d = dims[0]
    total = 0
    for o in instr.operands:
        s = comp.by_name[o].shape
        if not s.is_array or any(s.dynamic):
            return
        if len(s.dims) != rank or any(a != b for k, (a, b) in enumerate(zip(s.dims, src.dims)) if k != d):
            raise _err(filename, instr, f"concatenate '{instr.name}' along dimension {d}: operand "
                       f"'{o}' {s} does not match {src} in the other dimensions")
        total += s.dims[d]
    want = src.dims[:d] + (total,) + src.dims[d + 1:]
    if want != instr.shape.dims:
        raise _result_error(filename, instr, want, f"concatenating its operands along dimension {d}")


def _check_broadcast(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """``dimensions``: operand dimension i is result dimension dimensions[i], of the same size
    (``HloVerifier::HandleBroadcast``)."""
    if not src.dims:  # a scalar: dimensions={} and any result (the common constant splat)
        return
    dims = _dims_attr(filename, instr, "dimensions")
    out = instr.shape.dims
    if len(dims) != len(src.dims):
        raise _err(filename, instr, f"broadcast '{instr.name}' of a rank-{len(src.dims)} operand {src} "
                   f"needs {len(src.dims)} dimensions=, got {{{','.join(map(str, dims))}}}")
    for i, (k, size) in enumerate(zip(dims, src.dims)):
        if not 0 <= k < len(out) or out[k] != size:
            raise _err(filename, instr, f"broadcast '{instr.name}': operand {src} dimension {i} (size "
                       f"{size}) maps to dimension {k} of result {instr.shape}, which "
                       + ("does not exist" if not 0 <= k < len(out) else f"has size {out[k]}"))


def _check_transpose(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """``dimensions`` is a permutation p of the operand's; result dimension i is operand
    dimension p[i] (``ShapeInference::InferTransposeShape``)."""
    perm = _dims_attr(filename, instr, "dimensions")
    if sorted(perm) != list(range(len(src.dims))):
        raise _err(filename, instr, f"transpose '{instr.name}': dimensions="
                   f"{{{','.join(map(str, perm))}}} is not a permutation of the {len(src.dims)} "
                   f"dimensions of its operand {src}")
    want = tuple(src.dims[p] for p in perm)
    if want != instr.shape.dims:
        raise _result_error(filename, instr, want, f"transposing {src} by {{{','.join(map(str, perm))}}}")


# Floating-point element types (complex ones excluded): XLA's float-normalization passes
# (BFloat16Propagation) narrow some results to bf16 in place, and the verifier built with
# ``allow_mixed_precision`` compares such shapes with ``ShapeUtil::CompatibleIgnoringFpPrecision``.
_FP_TYPES = frozenset(t for t in FLOAT_TYPES if not t.startswith("c"))


def _same_type_up_to_fp(a: str, b: str) -> bool:
    """``ShapeUtil::SameElementTypeIgnoringFpPrecision``: equal, or both floating point."""
    return a == b or (a in _FP_TYPES and b in _FP_TYPES)


def _compatible_up_to_fp(a: Shape, b: Shape) -> bool:
    """``ShapeUtil::CompatibleIgnoringFpPrecision``, not comparing dynamic dimensions."""
    if a.is_tuple or b.is_tuple:
        return (a.is_tuple and b.is_tuple and len(a.tuple_shapes) == len(b.tuple_shapes)
                and all(_compatible_up_to_fp(x, y) for x, y in zip(a.tuple_shapes, b.tuple_shapes)))
    if not (a.is_array and b.is_array):
        return a.element_type == b.element_type
    return _same_type_up_to_fp(a.element_type, b.element_type) and (
        a.dims == b.dims or any(a.dynamic) or any(b.dynamic))


def _dims_list(dims) -> str:
    return "{" + ",".join(map(str, dims)) + "}"


def _check_copy(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """A copy's result is its operand's shape; only the layout may differ
    (``ShapeInference::InferUnaryOpShape`` returns the operand's shape for kCopy), and the
    element type only between floating-point types (``_FP_TYPES``)."""
    out = instr.shape
    if src.dims != out.dims:
        raise _result_error(filename, instr, src.dims, f"copying its operand {src}")
    if not _same_type_up_to_fp(src.element_type, out.element_type):
        raise _err(filename, instr, f"copy '{instr.name}' has shape {out} but its operand is {src}: a "
                   f"copy keeps its operand's element type ({src.element_type}); only the layout "
                   "may differ")


def _check_select(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """``select(pred, on_true, on_false)``: pred is a ``pred`` array of the result's dimensions
    (or a scalar ``pred[]``, which older XLA broadcast), on_true and on_false have the
    result's dimensions and its element type, up to floating-point precision
    (``ShapeInference::InferSelectShape``). ``src`` is pred's shape."""
    out = instr.shape
    if src.element_type != "pred" or (src.dims and src.dims != out.dims):
        raise _err(filename, instr, f"select '{instr.name}' has shape {out} but its predicate "
                   f"'{instr.operands[0]}' is {src}: expected pred{_dims_text(out.dims)} (or a "
                   "scalar pred[])")
    by_name = comp.by_name
    for role, o in zip(("on_true", "on_false"), instr.operands[1:]):
        s = by_name[o].shape
        if not s.is_array or any(s.dynamic):
            continue
        if s.dims != out.dims or not _same_type_up_to_fp(s.element_type, out.element_type):
            raise _err(filename, instr, f"select '{instr.name}' has shape {out} but its {role} "
                       f"operand '{o}' is {s}: on_true and on_false must have the result's "
                       "shape")


def _padding_config(filename: str, instr: Instruction, text: str) -> list[tuple[int, int, int]]:
    """``padding=lo_hi[_interior]x...`` (one per dimension, ``x`` between them; lo and hi may
    be negative) as (lo, hi, interior) triples; XLA's parser (``ParsePaddingConfig``)."""
    out = []
    for part in text.strip().split("x") if text.strip() else ():
        try:
            nums = [ascii_int(x) for x in part.split("_")]
        except ValueError:
            nums = []
        if len(nums) not in (2, 3):
            raise _err(filename, instr, f"pad '{instr.name}': expected lo_hi or lo_hi_interior per "
                       f"dimension in padding={text}, found '{part}'")
        out.append((nums[0], nums[1], nums[2] if len(nums) == 3 else 0))
    return out


def _check_pad(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """The padding value is a scalar; ``padding=`` has one ``lo_hi[_interior]`` per operand
    dimension, interior >= 0; result dimension d is ``n + lo + hi + interior * max(n - 1, 0)``
    for operand size n, never negative (``ShapeInference::InferPadShape``)."""
    value = comp.by_name[instr.operands[1]].shape
    if not value.is_array or value.dims:
        raise _err(filename, instr, f"pad '{instr.name}': its padding value '{instr.operands[1]}' is "
                   f"{value}, expected a scalar")
    text = instr.attrs.get("padding", "")
    config = _padding_config(filename, instr, text)
    if len(config) != len(src.dims):
        raise _err(filename, instr, f"pad '{instr.name}' of a rank-{len(src.dims)} operand {src} needs "
                   f"{len(src.dims)} lo_hi[_interior] entries, padding={text} has {len(config)}")
    want = []
    for d, ((lo, hi, interior), n) in enumerate(zip(config, src.dims)):
        size = n + lo + hi + interior * max(n - 1, 0)
        if interior < 0 or size < 0:
            raise _err(filename, instr, f"pad '{instr.name}': padding {lo}_{hi}_{interior} of dimension "
                       f"{d} (size {n}) of {src} " + ("has negative interior padding" if interior < 0
                                                       else f"gives a negative size {size}"))
        want.append(size)
    if tuple(want) != instr.shape.dims:
        raise _result_error(filename, instr, want, f"padding={text} of {src}")


def _check_reverse(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """``dimensions`` names distinct dimensions of the operand, whose shape is the result's
    (``ShapeInference::InferReverseShape``)."""
    dims = _dims_attr(filename, instr, "dimensions")
    if len(set(dims)) != len(dims) or any(not 0 <= d < len(src.dims) for d in dims):
        raise _err(filename, instr, f"reverse '{instr.name}': dimensions={_dims_list(dims)} must name "
                   f"distinct dimensions of its operand {src}")
    if src.dims != instr.shape.dims:
        raise _result_error(filename, instr, src.dims, f"reversing its operand {src}")


def _check_compare(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """A comparison gives ``pred`` of its operands' dimensions (``ShapeInference::
    InferBinaryOpShape``, ``ChangeElementType(shape, PRED)``)."""
    out = instr.shape
    if out.element_type != "pred" or out.dims != src.dims:
        raise _err(filename, instr, f"compare '{instr.name}' has shape {out} but comparing {src} "
                   f"gives pred{_dims_text(src.dims)}")


_GATHER_REQUIRED = ("offset_dims", "collapsed_slice_dims", "start_index_map", "index_vector_dim",
                    "slice_sizes")


def _check_gather(filename: str, comp: Computation, instr: Instruction, src: Shape) -> None:
    """The result of ``gather(operand, start_indices)`` (``ShapeInference::InferGatherShape``):
    the indices' dimensions without ``index_vector_dim`` (which may be their rank: an implicit
    trailing 1) are the batch dimensions; ``slice_sizes`` without ``collapsed_slice_dims`` and
    ``operand_batching_dims`` are the offset dimensions, at the result positions
    ``offset_dims`` (ascending); batch dimensions fill the other positions in order. Each slice
    size is at most its operand dimension; collapsed and batching ones at most 1. A gather
    printed without these attributes (the 2018 names ``output_window_dims`` ...) is not
    checked."""
    attrs = instr.attrs
    if any(k not in attrs for k in _GATHER_REQUIRED):
        return
    idx = comp.by_name[instr.operands[1]].shape
    if not idx.is_array or any(idx.dynamic):
        return
    ivd_text = attrs["index_vector_dim"].strip()
    if not is_uint(ivd_text) or int(ivd_text) > len(idx.dims):
        raise _err(filename, instr, f"gather '{instr.name}': index_vector_dim={ivd_text} must lie in "
                   f"[0, {len(idx.dims)}] for start indices {idx}")
    ivd = int(ivd_text)
    offset = _dims_attr(filename, instr, "offset_dims")
    collapsed = _dims_attr(filename, instr, "collapsed_slice_dims")
    batching = _dims_attr(filename, instr, "operand_batching_dims")
    start_map = _dims_attr(filename, instr, "start_index_map")
    sizes = _dims_attr(filename, instr, "slice_sizes")
    batch = idx.dims[:ivd] + idx.dims[ivd + 1:]
    vector = idx.dims[ivd] if ivd < len(idx.dims) else 1
    rank = len(src.dims)
    result_rank = len(offset) + len(batch)

    def bad(what: str) -> HloParseError:
        return _err(filename, instr, f"gather '{instr.name}' of {src} with start indices {idx}: {what}")

    if len(sizes) != rank or any(not 0 <= k <= n for k, n in zip(sizes, src.dims)):
        raise bad(f"slice_sizes={_dims_list(sizes)} must give one size in [0, n] per operand dimension")
    for key, dims in (("collapsed_slice_dims", collapsed), ("operand_batching_dims", batching)):
        if any(not 0 <= d < rank or sizes[d] > 1 for d in dims):
            raise bad(f"{key}={_dims_list(dims)} must name operand dimensions of slice size 0 or 1")
    if len(offset) + len(collapsed) + len(batching) != rank:
        raise bad(f"offset_dims={_dims_list(offset)} ({len(offset)}), collapsed_slice_dims "
                  f"({len(collapsed)}) and operand_batching_dims ({len(batching)}) must account for "
                  f"the {rank} operand dimensions")
    if list(offset) != sorted(set(offset)) or any(not 0 <= d < result_rank for d in offset):
        raise bad(f"offset_dims={_dims_list(offset)} must be ascending dimensions of the rank-"
                  f"{result_rank} result")
    if len(start_map) != vector or any(not 0 <= d < rank for d in start_map):
        raise bad(f"start_index_map={_dims_list(start_map)} must map the {vector} index component(s) "
                  "to operand dimensions")
    dropped = set(collapsed) | set(batching)
    window = iter([k for d, k in enumerate(sizes) if d not in dropped])
    batches = iter(batch)
    want = tuple(next(window) if i in offset else next(batches) for i in range(result_rank))
    if want != instr.shape.dims:
        raise _result_error(filename, instr, want, f"gathering slices {_dims_list(sizes)} of {src} at "
                            f"start indices {idx} (offset_dims={_dims_list(offset)})")


def _check_reduce(filename: str, comp: Computation, instr: Instruction) -> None:
    """``reduce(inputs..., init_values...)``: the inputs share their dimensions, ``dimensions``
    names dimensions of theirs, and the result (one array for one input, else a tuple of one
    per input) has the inputs' dimensions without the reduced ones; the element types are
    ``to_apply``'s (``ShapeInference::InferReduceShape``)."""
    n = len(instr.operands) // 2
    by_name = comp.by_name
    ins = [by_name[o].shape for o in instr.operands[:n]]
    if any(not s.is_array or any(s.dynamic) for s in ins):
        return
    src = ins[0]
    for o, s in zip(instr.operands[1:n], ins[1:]):
        if s.dims != src.dims:
            raise _err(filename, instr, f"reduce '{instr.name}': input '{o}' {s} does not have the "
                       f"dimensions of input '{instr.operands[0]}' {src}")
    dims = _dims_attr(filename, instr, "dimensions")
    if any(not 0 <= d < len(src.dims) for d in dims):
        raise _err(filename, instr, f"reduce '{instr.name}': dimensions={_dims_list(dims)} names a "
                   f"dimension its input {src} does not have")
    want = tuple(k for d, k in enumerate(src.dims) if d not in dims)
    out = instr.shape
    leaves = out.tuple_shapes if out.is_tuple else (out,)
    if len(leaves) != n:
        raise _err(filename, instr, f"reduce '{instr.name}' of {n} input(s) has shape {out}: expected "
                   + ("one array" if n == 1 else f"a tuple of {n} arrays"))
    for k, leaf in enumerate(leaves):
        if leaf.is_array and any(leaf.dynamic):
            continue
        if not leaf.is_array or leaf.dims != want:
            which = f" (element {k} is {leaf})" if out.is_tuple else ""
            raise _err(filename, instr, f"reduce '{instr.name}' has shape {out}{which} but reducing "
                       f"{src} over dimensions={_dims_list(dims)} gives dimensions {_dims_text(want)}")


def _check_iota(filename: str, comp: Computation, instr: Instruction) -> None:
    """``iota_dimension`` is a dimension of the (array) result (``HloVerifier::HandleIota``)."""
    out = instr.shape
    text = instr.attrs.get("iota_dimension")
    if text is None:
        raise _err(filename, instr, f"iota '{instr.name}' has no iota_dimension= attribute")
    rank = len(out.dims) if out.is_array else 0
    t = text.strip()
    if not is_uint(t) or int(t) >= rank:
        raise _err(filename, instr, f"iota '{instr.name}': iota_dimension={t} is not a dimension of "
                   f"its result {out}" + (f" (rank {rank})" if out.is_array else ""))


_SCATTER_REQUIRED = ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                     "index_vector_dim")


def _check_scatter(filename: str, comp: Computation, instr: Instruction) -> None:
    """``scatter(operands..., scatter_indices, updates...)`` (``ShapeInference::
    InferScatterShape``, ``ValidateScatterDimensionNumbers``): the result is the operand's
    shape (a tuple of them for several operands); ``update_window_dims`` are ascending
    dimensions of the updates, and with ``inserted_window_dims`` and ``input_batching_dims``
    account for the operand's dimensions; ``scatter_dims_to_operand_dims`` has one operand
    dimension per index component; the updates' other dimensions are the indices' batch
    dimensions (all but ``index_vector_dim``, which may be their rank), in order; each update
    window dimension is at most the operand dimension it is written into (the operand's
    dimensions that are neither inserted nor batching, in order). Element types are compared
    up to floating-point precision (``_FP_TYPES``). A scatter printed without these attributes,
    or with dynamic shapes, is not checked."""
    attrs = instr.attrs
    if any(k not in attrs for k in _SCATTER_REQUIRED):
        return
    by_name = comp.by_name
    n = len(instr.operands) // 2
    operands = [by_name[o].shape for o in instr.operands[:n]]
    idx = by_name[instr.operands[n]].shape
    updates = [by_name[o].shape for o in instr.operands[n + 1:]]
    shapes = operands + [idx] + updates
    if any(not s.is_array or any(s.dynamic) for s in shapes):
        return
    out = instr.shape
    want = operands[0] if n == 1 else Shape("tuple", tuple_shapes=tuple(operands))
    if not _compatible_up_to_fp(out, want):
        raise _err(filename, instr, f"scatter '{instr.name}' has shape {out} but its operand"
                   f"{'s are' if n > 1 else ' is'} {want}: expected {shape_text(want)} (a scatter's "
                   "result has its operands' shapes)")
    src, upd = operands[0], updates[0]

    def bad(what: str) -> HloParseError:
        return _err(filename, instr, f"scatter '{instr.name}' of {src} with indices {idx} and "
                    f"updates {upd}: {what}")

    for o, s in zip(instr.operands[1:n], operands[1:]):
        if s.dims != src.dims:
            raise bad(f"operand '{o}' is {s}: expected every operand to have dimensions "
                      f"{_dims_text(src.dims)}")
    for o, s in zip(instr.operands[n + 2:], updates[1:]):
        if s.dims != upd.dims:
            raise bad(f"updates '{o}' is {s}: expected every updates operand to have dimensions "
                      f"{_dims_text(upd.dims)}")
    ivd_text = attrs["index_vector_dim"].strip()
    if not is_uint(ivd_text) or int(ivd_text) > len(idx.dims):
        raise bad(f"index_vector_dim={ivd_text}: expected a dimension in [0, {len(idx.dims)}] of the "
                  "indices")
    ivd = int(ivd_text)
    window = _dims_attr(filename, instr, "update_window_dims")
    inserted = _dims_attr(filename, instr, "inserted_window_dims")
    batching = _dims_attr(filename, instr, "input_batching_dims")
    to_operand = _dims_attr(filename, instr, "scatter_dims_to_operand_dims")
    rank, urank = len(src.dims), len(upd.dims)
    batch = idx.dims[:ivd] + idx.dims[ivd + 1:]
    vector = idx.dims[ivd] if ivd < len(idx.dims) else 1
    if list(window) != sorted(set(window)) or any(not 0 <= d < urank for d in window):
        raise bad(f"update_window_dims={_dims_list(window)}: expected ascending dimensions of the "
                  f"rank-{urank} updates")
    for key, dims in (("inserted_window_dims", inserted), ("input_batching_dims", batching)):
        if len(set(dims)) != len(dims) or any(not 0 <= d < rank for d in dims):
            raise bad(f"{key}={_dims_list(dims)}: expected distinct dimensions of the rank-{rank} "
                      "operand")
    if len(window) + len(inserted) + len(batching) != rank or set(inserted) & set(batching):
        raise bad(f"update_window_dims={_dims_list(window)} ({len(window)}), inserted_window_dims="
                  f"{_dims_list(inserted)} and input_batching_dims={_dims_list(batching)}: expected "
                  f"them to account for the {rank} operand dimensions, each once")
    if len(to_operand) != vector or any(not 0 <= d < rank for d in to_operand):
        raise bad(f"scatter_dims_to_operand_dims={_dims_list(to_operand)}: expected {vector} "
                  f"operand dimension(s), one per index component")
    if urank != len(window) + len(batch):
        raise bad(f"expected updates of rank {len(window) + len(batch)} ({len(window)} window "
                  f"dimension(s) and the indices' {len(batch)} batch dimension(s)), got rank {urank}")
    scatter_sizes = tuple(k for d, k in enumerate(upd.dims) if d not in window)
    if scatter_sizes != batch:
        raise bad(f"the updates' dimensions other than update_window_dims={_dims_list(window)} are "
                  f"{_dims_text(scatter_sizes)}: expected the indices' batch dimensions "
                  f"{_dims_text(batch)}")
    dropped = set(inserted) | set(batching)
    targets = [d for d in range(rank) if d not in dropped]
    for w, d in zip(window, targets):
        if upd.dims[w] > src.dims[d]:
            raise bad(f"update window dimension {w} (size {upd.dims[w]}) is written into operand "
                      f"dimension {d} (size {src.dims[d]}): expected at most {src.dims[d]}")


# opcode -> the check of its result shape against its operands (called with operand 0's shape)
_SHAPE_RULES = {
    "slice": _check_slice,
    "dynamic-slice": _check_dynamic_slice,
    "dynamic-update-slice": _check_dynamic_update_slice,
    "concatenate": _check_concatenate,
    "broadcast": _check_broadcast,
    "transpose": _check_transpose,
    "copy": _check_copy,
    "select": _check_select,
    "pad": _check_pad,
    "reverse": _check_reverse,
    "compare": _check_compare,
    "gather": _check_gather,
}

# opcode -> the check of its result shape that reads its operands itself (a variadic reduce's
# result is a tuple; an iota has no operand)
_OWN_SHAPE_RULES = {
    "reduce": _check_reduce,
    "iota": _check_iota,
    "scatter": _check_scatter,
}


# Opcodes whose only check is a fixed operand count (no shapes to compare, nothing called):
# validate_module skips _check_instruction for them. Every opcode with a shape rule above, or
# a check of its own in _check_instruction, is left out, so no rule can be skipped.
_CHEAP: dict[str, int] = {
    op: rec.arity for op, rec in OPCODES.items() if isinstance(rec.arity, int)
    and op not in _SHAPE_RULES and op not in _OWN_SHAPE_RULES
    and op not in ("reshape", "bitcast", "bitcast-convert", "get-tuple-element", "while",
                   "ragged-dot", "scaled-dot", "constant")
}


MAX_TRIP_COUNT = (1 << 63) - 1  # XLA stores trip counts as int64 (WhileLoopBackendConfig)


def _check_trip_count(filename: str, instr: Instruction) -> None:
    """``known_trip_count.n`` must be an integer in [0, 2^63) (XLA's int64 field)."""
    bc = instr.backend_config
    ktc = bc.get("known_trip_count") if isinstance(bc, dict) else None
    if not isinstance(ktc, dict) or "n" not in ktc:
        return
    n = ktc["n"]
    text = str(n).strip()
    if isinstance(n, bool) or not is_uint(text) or int(text) > MAX_TRIP_COUNT:
        raise _err(filename, instr, f"while '{instr.name}': known_trip_count n={n!r} is not an "
                   "integer in [0, 2^63)")


def _operand_error(filename: str, comp: Computation, instr: Instruction, o: str) -> HloParseError:
    """The error for operand ``o`` of ``instr``, not defined before ``instr``."""
    d = comp.by_name.get(o)
    if d is None:
        return _err(filename, instr, f"instruction '{instr.name}' uses undefined operand '{o}' "
                    f"in computation '{comp.name}'")
    cycle = _operand_cycle(comp, instr)
    if cycle:
        return _err(filename, instr, "operand cycle: " + " -> ".join(cycle))
    return _err(filename, instr, f"instruction '{instr.name}' uses operand '{o}' before its "
                f"definition at line {d.line} (HLO text defines operands first)")


def _operand_cycle(comp: Computation, start: Instruction) -> list[str] | None:
    """A path start -> ... -> start through operands, or None."""
    stack = [(start.name, iter(start.operands))]
    on_path = {start.name}
    seen: set[str] = set()
    while stack:
        name, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            stack.pop()
            on_path.discard(name)
            seen.add(name)
            continue
        if nxt == start.name:
            return [s for s, _ in stack] + [start.name]
        if nxt in on_path or nxt in seen or nxt not in comp.by_name:
            continue
        on_path.add(nxt)
        stack.append((nxt, iter(comp.by_name[nxt].operands)))
    return None


def _parameters(filename: str, comp: Computation) -> None:
    k = 0
    for p in comp.parameters:  # the usual case, 0, 1, 2, ...: nothing to report
        if p.parameter_number != k:
            break
        k += 1
    else:
        return
    seen: dict[int, Instruction] = {}
    for p in comp.parameters:
        if p.parameter_number in seen:
            raise _err(filename, p, f"parameter number {p.parameter_number} of computation "
                       f"'{comp.name}' is already used by '{seen[p.parameter_number].name}'")
        seen[p.parameter_number] = p
    for k, p in enumerate(comp.parameters):
        if p.parameter_number != k:
            raise _err(filename, p, f"computation '{comp.name}' has parameter({p.parameter_number}) "
                       f"but no parameter({k}): parameter numbers must be 0, 1, ... without gaps")


def _call_graph_cycles(filename: str, mod: Module,
                       calls: dict[str, list[tuple[str, Instruction]]]) -> None:
    """Iterative DFS over the call graph; a back edge is a cycle, reported at its call."""
    state: dict[str, int] = {}  # 1 on the DFS path, 2 done
    for root in mod.computations:
        if root in state:
            continue
        if not calls[root]:  # calls nothing (most fused computations): on no cycle
            state[root] = 2
            continue
        path: list[tuple[str, Instruction | None]] = [(root, None)]
        stack = [iter(calls[root])]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                state[path.pop()[0]] = 2
                continue
            callee, instr = nxt
            st = state.get(callee)
            if st == 1:
                names = [p for p, _ in path]
                cyc = names[names.index(callee):] + [callee]
                raise _err(filename, instr, f"call graph cycle: {' -> '.join(cyc)} (instruction "
                           f"'{instr.name}' calls '{callee}', which is already running)")
            if st is None:
                if not calls[callee]:  # a leaf (e.g. a reducer): done at once
                    state[callee] = 2
                    continue
                state[callee] = 1
                path.append((callee, instr))
                stack.append(iter(calls[callee]))


# Elementwise opcodes whose operands all have the result's dimensions (HLO has no implicit
# broadcasting: ShapeInference::InferElementwiseBinaryOpShape / InferUnaryOpShape).
_SAME_DIMS = names(same_dims=True)


_QUOTED = re.compile(r'"(?:[^"\\]++|\\.)*+"')
# An escape other than \" and \\ (every one XLA could refuse, and some it takes): strings whose
# only escapes are those two (older XLA's backend_config="{\"a\":1}") need no unescaping check.
_ESCAPE_TO_CHECK = re.compile(r'\\[^"\\]')


def _check_strings(filename: str, instr: Instruction) -> None:
    """Every string literal of the attributes (``metadata``'s values, ``custom_call_target``,
    ``frontend_attributes``' values, a quoted ``backend_config``...) has only escapes XLA's lexer
    accepts (``attrs.c_unescape``: absl::CUnescape, xla/hlo/parser/hlo_lexer.cc ``LexString``,
    which fails the parse: "Failed unescaping string"). A ``backend_config={...}`` JSON dict is
    read raw by XLA (``LexJsonDict``): its JSON escapes are not checked here."""
    for key, value in instr.attrs.items():
        if "\\" not in value or (key == "backend_config" and value.lstrip().startswith("{")):
            continue
        for m in _QUOTED.finditer(value):
            try:
                c_unescape(m.group(0)[1:-1])
            except EscapeError as e:
                raise _err(filename, instr, f"bad escape in a string of {key}=: {e} (XLA's lexer "
                           "unescapes strings as absl::CUnescape does)") from None


def _check_same_dims(filename: str, comp: Computation, instr: Instruction) -> None:
    dims = instr.shape.dims
    for o in instr.operands:
        s = comp.by_name[o].shape
        if s.is_array and s.dims != dims:
            raise _err(filename, instr, f"elementwise '{instr.opcode}' instruction '{instr.name}' has "
                       f"shape {instr.shape} but operand '{o}' is {s}: operands must have the "
                       "result's dimensions (HLO does not broadcast implicitly)")


def validate_module(mod: Module) -> None:
    """Run every check above on ``mod``; raises HloParseError at the first failure."""
    filename = mod.filename
    calls: dict[str, list[tuple[str, Instruction]]] = {}
    cheap, same_dims = _CHEAP, _SAME_DIMS
    classes = mod.structural_classes
    calls_at: dict[str, list[tuple[str, int]]] = {}  # class -> its calls, by instruction position
    dots_ok: set[tuple] = set()  # (_check_instruction's; the shapes' ids hold while mod lives)
    for comp in mod.computations.values():
        cls = classes[comp.name]
        if cls != comp.name:
            # structurally identical to ``cls``, checked above (hlo/structure.py): every check
            # passes here too; its calls are the same callees, made by its own instructions
            at = calls_at.get(cls)
            if at is None:
                done = calls[cls]
                index = {id(i): k for k, i in enumerate(mod.computations[cls].instructions)} if done else {}
                at = calls_at[cls] = [(c, index[id(i)]) for c, i in done]
            instrs = comp.instructions
            calls[comp.name] = [(c, instrs[k]) for c, k in at]
            continue
        _parameters(filename, comp)
        out = calls[comp.name] = []
        defined: set[str] = set()
        by_name = comp.by_name
        for instr in comp.instructions:
            ops = instr.operands
            for o in ops:
                if o not in defined:
                    raise _operand_error(filename, comp, instr, o)
            if instr.opcode in same_dims:
                shape = instr.shape
                if shape.is_array:
                    dims = shape.dims
                    for o in ops:
                        if by_name[o].shape.dims != dims:  # maybe a mismatch: check in full
                            _check_same_dims(filename, comp, instr)
                            break
            text = instr._attr_text  # escapes first: the checks below read strings
            if (text is not None and "\\" in text and _ESCAPE_TO_CHECK.search(text)) or (
                    text is None and instr._attrs
                    and any("\\" in v and _ESCAPE_TO_CHECK.search(v) for v in instr._attrs.values())):
                _check_strings(filename, instr)
            # most instructions need only their operand count checked
            if cheap.get(instr.opcode, -1) != len(ops) or (
                    (instr._attr_text is not None or instr._attrs) and instr.names_computations()):
                for c in _check_instruction(filename, mod, comp, instr, dots_ok):
                    out.append((c, instr))
            defined.add(instr.name)
    _call_graph_cycles(filename, mod, calls)
