"""The kernel causes' matchers: which kernels are of a cause's own kind (``causes.py`` names
each rule's matcher), and which are copy kernels (a chain of copy / transpose / convert /
reshape / slice ops from one parameter) of what kind.

``classify`` runs once per kernel that moves bytes: one walk from a fusion's root decides which
matchers can apply, then each matcher checks the rest. Pure functions of an instruction, its
computation, the module and its traffic (``passes/traffic.py``'s InstrTraffic).
"""

from __future__ import annotations

from ...hlo import Computation, Instruction, Module
from ...hlo.shape import HOST_MEMORY_SPACE
from ..memo import memo_of

COPY_OPS = frozenset({"copy", "transpose", "convert", "reshape", "bitcast-convert"})
_FUSED_COPY_OPS = COPY_OPS | {"bitcast"}
# a window of a buffer copied out (a copy kernel only when the buffer is a parameter or a copy of one)
SLICE_OPS = frozenset({"slice", "dynamic-slice"})
HOST_IO = frozenset({"infeed", "outfeed", "send", "recv"})
_HOST_TARGETS = frozenset({"MoveToHost", "MoveToDevice"})
# kernels that never stage through host memory themselves (the program's own host I/O, and
# fusions/dots, whose operands a host copy would have moved first)
_NO_HOST_CHECK = HOST_IO | {"fusion", "dot", "convolution"}
_COPY_OR_SLICE_OPS = COPY_OPS | SLICE_OPS
# what a fused copy's root is through bitcasts and converts (``_fused_chain``'s ops, or its parameter)
_FUSED_CHAIN_OPS = _FUSED_COPY_OPS | SLICE_OPS
_COPY_CHAIN_OPS = _FUSED_CHAIN_OPS | {"parameter"}
#: opcodes whose ``classify`` answer is (None, None) unless the kernel is a remat clone:
#: no fusion, copy, slice, concatenate, copy-start or custom call, and no host check
PLAIN_KERNELS = frozenset(_NO_HOST_CHECK - HOST_IO - _COPY_OR_SLICE_OPS - {"fusion", "concatenate", "copy-start", "custom-call"})
#: ``classify``'s copy kind of a fusion that rebuilds an operand whole around its update:
#: (REBUILD, operand number)
REBUILD = "rebuild"


def _fused_chain(module: Module, fused: Computation, instr: Instruction, ops) -> tuple[int | None, bool, bool]:
    """(parameter number, changes the element type, takes a window) when ``instr`` of
    ``fused`` is a chain of ``ops`` from one parameter (through operand 0: a slice's or
    dynamic-slice's data operand); (None, False, False) otherwise."""
    dtype_change = sliced = False
    seen = 0
    while seen < 10_000:
        seen += 1
        if instr.opcode == "parameter":
            return instr.parameter_number, dtype_change, sliced
        if instr.opcode not in ops or not instr.operands:
            return None, False, False
        src = fused.by_name.get(instr.operands[0])
        if src is None:
            return None, False, False
        if instr.opcode in ("convert", "bitcast-convert") and src.shape.element_type != instr.shape.element_type:
            dtype_change = True
        if instr.opcode in SLICE_OPS:
            sliced = True
        instr = src
    return None, False, False


def through_bitcast(comp: Computation, instr: Instruction) -> Instruction:
    while instr.opcode == "bitcast" and instr.operands and instr.operands[0] in comp.by_name:
        instr = comp.by_name[instr.operands[0]]
    return instr


def copy_kind(instr: Instruction, comp: Computation, module: Module) -> tuple[str, int, bool] | None:
    """(kind, source operand, takes a window) of a copy kernel, else None: kind
    ``dtype_conversion`` when the element type changes, else ``slice_copy`` for a window
    (slice / dynamic-slice) of its source, else ``layout_change``."""
    op = instr.opcode
    if not instr.shape.is_array:
        return None
    if op in _COPY_OR_SLICE_OPS and instr.operands:
        src = comp.by_name.get(instr.operands[0])
        if src is None or not src.shape.is_array:
            return None
        dtype = src.shape.element_type != instr.shape.element_type
        sliced = op in SLICE_OPS
        return ("dtype_conversion" if dtype else "slice_copy" if sliced else "layout_change"), 0, sliced
    if op == "fusion" and instr.called_computations:
        fused = module.computations.get(instr.called_computations[0])
        if fused is None:
            return None
        return _fused_copy_kind(instr, fused, module)
    return None


def _fused_copy_kind(instr: Instruction, fused: Computation, module: Module) -> tuple[str, int, bool] | None:
    """``copy_kind`` of a fusion of array shape whose fused computation is ``fused``."""
    if fused.root.opcode == "tuple":
        return None
    k, dtype, sliced = _fused_chain(module, fused, fused.root, _FUSED_CHAIN_OPS)
    if k is None or k >= len(instr.operands) or fused.root.opcode == "parameter":
        return None
    if fused.root.opcode == "bitcast" and through_bitcast(fused, fused.root).opcode == "parameter":
        return None
    return ("dtype_conversion" if dtype else "slice_copy" if sliced else "layout_change"), k, sliced


def _tuple_copy_kinds(instr: Instruction, fused: Computation, module: Module) -> list | None:
    """Copy kinds of a multi-output fusion every root leaf of which is a copy chain from a
    parameter (``_fused_copy_kind`` per element: XLA:GPU slices a scanned layer's K and V
    windows out of the stacked caches in one ``(bf16[1,...], bf16[1,...])`` fusion): a list of
    (leaf position, kind, source operand, takes a window), else None (any element computed)."""
    root, shape = fused.root, instr.shape
    if not shape.is_tuple or len(root.operands) != len(shape.tuple_shapes):
        return None
    out = []
    for e, o in enumerate(root.operands):
        leaf = fused.by_name.get(o)
        if leaf is None or not leaf.shape.is_array or not shape.tuple_shapes[e].is_array:
            return None
        if through_bitcast(fused, leaf).opcode == "parameter":
            return None  # a parameter passed through (or bitcast): no copy
        k, dtype, sliced = _fused_chain(module, fused, leaf, _FUSED_CHAIN_OPS)
        if k is None or k >= len(instr.operands):
            return None
        out.append((shape.leaf_offsets[e],
                    "dtype_conversion" if dtype else "slice_copy" if sliced else "layout_change", k, sliced))
    return out or None


def is_end_of_program_prefetch(instr: Instruction, comp: Computation, module: Module) -> bool:
    """XLA's end-of-program prefetch of a freed cross-program-prefetched buffer: an ENTRY
    ``copy-start`` (no ``cross_program_prefetch_index``) of a parameter that a copy-start with
    ``cross_program_prefetch_index`` also copies, whose ``copy-done`` nothing reads. Memory-
    space assignment frees the cross-program-prefetched buffer after its last use and refills
    it at the same offset at the end of the program for the next run, whose own prefetch the
    runtime then skips (``AllocateCrossProgramPrefetchBuffer``, ``free_buffer``,
    xla/service/memory_space_assignment/algorithm.cc): in back-to-back runs the parameter is
    read once per run, by this copy."""
    if instr.opcode != "copy-start" or comp is not module.entry or not instr.operands:
        return False
    if instr.attrs.get("cross_program_prefetch_index") is not None:
        return False
    src = comp.by_name.get(instr.operands[0])
    if src is None or through_bitcast(comp, src).opcode != "parameter":
        return False
    dones = comp.users(instr.name)
    if not dones or any(d.opcode != "copy-done" or comp.users(d.name) for d in dones):
        return False
    for other in comp.users(src.name):
        if (other is not instr and other.opcode == "copy-start"
                and other.attrs.get("cross_program_prefetch_index") is not None):
            return True
    return False


def _raw_attrs_have(instr: Instruction, key: str, needle: str) -> bool:
    """``needle`` occurs in attribute ``key`` (in the attribute text when not yet split: a
    cheap test before parsing metadata or backend_config)."""
    a = instr._attrs
    if a is None:
        t = instr._attr_text
        return bool(t) and needle in t
    v = a.get(key)
    return v is not None and needle in v


def _split_k(instr: Instruction) -> int:
    """``split_k`` of a Triton gemm fusion's config (xla/autotuning.proto TritonGemmKey), else 1."""
    if instr.opcode != "fusion" or not _raw_attrs_have(instr, "backend_config", "split_k"):
        return 1
    bc = instr.backend_config
    if not isinstance(bc, dict):
        return 1
    cfg = bc.get("fusion_backend_config", {})
    cfg = cfg.get("triton_gemm_config") if isinstance(cfg, dict) else None
    if not isinstance(cfg, dict):
        return 1
    try:
        return int(cfg.get("split_k", 1))
    except (TypeError, ValueError):
        return 1


def _split_k_by_shape(instr: Instruction, comp: Computation, module: Module) -> int:
    """Split-K of a Triton gemm fusion that prints no ``split_k`` (the nested-gemm form of
    XLA:GPU's split-K rewriter, xla/service/gpu/split_k_gemm_rewriter.cc): its root dot's
    result ``[S, M, N]`` carries a batch dimension S > 1 (the contraction cut into S parts)
    that every consumer sums over (a reduce over dimension 0, inside a consumer fusion);
    S, else 1."""
    if instr.opcode != "fusion" or not _raw_attrs_have(instr, "backend_config", "__triton"):
        return 1
    fused = module.computations.get(instr.called_computations[0]) if instr.called_computations else None
    if fused is None:
        return 1
    root = fused.root
    while root.opcode in ("bitcast", "convert") and root.operands:
        root = fused.by_name[root.operands[0]]
    if root.opcode != "dot" or "lhs_batch_dims" not in root.attrs or not instr.shape.is_array:
        return 1
    dims = instr.shape.dims
    if len(dims) < 3 or dims[0] < 2:
        return 1
    users = comp.users(instr.name)
    if not users:
        return 1
    for u in users:
        if u.opcode == "reduce":
            ok = u.attrs.get("dimensions", "").strip("{} ") == "0"
        elif u.opcode == "fusion" and u.called_computations:
            uc = module.computations.get(u.called_computations[0])
            ok = uc is not None and _reduces_dim0(uc, [uc.parameters[j] for j, o in enumerate(u.operands)
                                                        if o == instr.name and j < len(uc.parameters)])
        else:
            ok = False
        if not ok:
            return 1
    return dims[0]


def _reduces_dim0(fused: Computation, params: list) -> bool:
    """Every use of ``params`` inside ``fused`` (through bitcast/convert) is a reduce over dim 0."""
    return bool(params) and _only_reduced(fused, params, dim0=True)


def is_dot_as_multiply_reduce(instr: Instruction, comp: Computation, module: Module) -> bool:
    """A dot XLA rewrote into an elementwise multiply and a reduce in two kernels (XLA:GPU,
    a dot with a 1-row operand, e.g. batch-1 decode: AlgebraicSimplifier's dot strength
    reduction): a loop fusion whose root (through bitcast/convert) multiplies for a
    ``dot_general`` (op_name) and whose every consumer reduces the product."""
    if instr.opcode != "fusion" or not instr.called_computations:
        return False
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return False
    root = fused.root
    for leaf in ([fused.by_name[o] for o in root.operands] if root.opcode == "tuple" else [root]):
        while leaf.opcode in ("bitcast", "convert") and leaf.operands:
            leaf = fused.by_name[leaf.operands[0]]
        if leaf.opcode != "multiply":
            return False
    # the fused root first, then the op_name (splitting every fusion's metadata is slow)
    if not _raw_attrs_have(instr, "metadata", "dot_general"):
        return False
    md = instr.metadata
    if md is None or not md.op_name or not md.op_name.endswith("dot_general"):
        return False
    users = [u for u in comp.users(instr.name) if u.opcode != "get-tuple-element"]
    for g in comp.users(instr.name):  # a multi-output fusion (q, k, v): the users of each element
        if g.opcode == "get-tuple-element":
            users.extend(comp.users(g.name))
    if not users:
        return False
    for u in users:
        name = instr.name if instr.name in u.operands else next(
            (o for o in u.operands if comp.by_name[o].opcode == "get-tuple-element"
             and comp.by_name[o].operands[0] == instr.name), None)
        if u.opcode == "fusion" and u.called_computations:
            uc = module.computations.get(u.called_computations[0])
            params = [uc.parameters[j] for j, o in enumerate(u.operands)
                      if o == name and uc is not None and j < len(uc.parameters)]
            if uc is None or not params or not _only_reduced(uc, params):
                return False
        elif u.opcode != "reduce":
            return False
    return True


def _only_reduced(fused: Computation, params: list, dim0: bool = False) -> bool:
    """Every use of ``params`` (through bitcast/convert) is a reduce's operand (with ``dim0``:
    the reduced operand, over dimension 0 alone)."""
    users: dict[str, list[Instruction]] = {}
    for i in fused.instructions:
        for o in i.operands:
            users.setdefault(o, []).append(i)
    stack = list(params)
    while stack:
        v = stack.pop()
        us = users.get(v.name, ())
        if not us:
            return False
        for u in us:
            if u.opcode in ("bitcast", "convert"):
                stack.append(u)
            elif u.opcode != "reduce" or dim0 and not (
                    u.operands[0] == v.name and u.attrs.get("dimensions", "").strip("{} ") == "0"):
                return False
    return True


def is_remat(instr: Instruction) -> bool:
    """Cloned by XLA's rematerialization (``.remat`` suffix, xla/service/hlo_rematerialization.cc)
    or recomputed by a ``jax.checkpoint`` (``rematted_computation`` in op_name)."""
    if ".remat" in instr.name:
        return True
    if not _raw_attrs_have(instr, "metadata", "rematted_computation"):
        return False
    md = instr.metadata
    return bool(md is not None and md.op_name and "rematted_computation" in md.op_name)


def classify(instr: Instruction, comp: Computation, module: Module, t) -> tuple[str | None, tuple | None]:
    """(kernel cause, copy kind) of a kernel with traffic ``t``: the cause of the kernel's own
    kind (module docstring, rule 2: rematerialization, host round trip, split-K partials, a dot
    as multiply + reduce), else None and ``copy_kind``'s answer for a copy kernel, or
    (``REBUILD``, operand) for a fusion that rebuilds an operand around its update (else None).

    One walk from a fusion's root decides which rules can apply: split-K by shape needs a dot
    root, a dot as multiply + reduce multiply roots (each rule's own function then checks the
    rest), a fused copy a chain of copy ops to a parameter (``_fused_copy_kind``, here
    continued from where the walk through bitcasts and converts stopped)."""
    # the attribute texts (_raw_attrs_have's tests, inline: this runs for every kernel)
    attrs = instr._attrs
    if attrs is None:
        md_text = bc_text = instr._attr_text or ""
    else:
        md_text, bc_text = attrs.get("metadata") or "", None
    if ".remat" in instr.name or ("rematted_computation" in md_text and is_remat(instr)):
        return "rematerialization", None
    op = instr.opcode
    if op != "fusion":
        if op == "copy-start" and is_end_of_program_prefetch(instr, comp, module):
            return "end_of_program_prefetch", None
        if is_host_round_trip(instr, t):
            return "host_round_trip", None
        if op == "concatenate":
            return ("concatenated_copy" if is_concatenated_copy(instr, comp, module) else None), None
        if op in _COPY_OR_SLICE_OPS:
            return None, copy_kind(instr, comp, module)
        return None, None
    if bc_text is None:
        bc_text = attrs.get("backend_config") or ""
    # the fusion's Triton gemm config prints split_k: then it, not the shape, decides
    split_field = "split_k" in bc_text
    if split_field and _split_k(instr) > 1:
        return "split_k_partials", None
    called = instr._called  # (Instruction.called_computations, once computed)
    if called is None:
        called = instr.called_computations
    fused = module.computations.get(called[0]) if called else None
    if fused is None:
        return None, None
    # what follows reads the fused computation, the fusion's result shape and operand count,
    # and (asking only where these are not enough) its computation: answered once per key for
    # structurally identical fused computations (hlo/structure.py)
    key = (module.structural_classes[fused.name], id(instr.shape), len(instr.operands),
           "dot_general" in md_text, split_field)
    kinds = memo_of(module).fusion_kinds
    hit = kinds.get(key)
    if hit is not None:
        return hit
    out = _fused_kind(instr, comp, module, fused, md_text, split_field)
    if out is not _ASKED:
        kinds[key] = out
        return out
    return _fused_kind(instr, comp, module, fused, md_text, split_field, ask=True)


# _fused_kind's answer where the fusion's computation decides (not kept for other fusions)
_ASKED = object()


def _fused_kind(instr: Instruction, comp: Computation, module: Module, fused: Computation,
                md_text: str, split_field: bool, ask: bool = False):
    """classify's answer for a fusion from its fused computation on; without ``ask``,
    ``_ASKED`` where the answer reads the fusion's own computation (the users of its result,
    the producers of its operands)."""
    root = fused.root
    by_name = fused.by_name
    if root.opcode == "tuple":
        multiply = True  # every root leaf (through bitcast/convert) multiplies
        for o in root.operands:
            leaf = by_name[o]
            while leaf.opcode in ("bitcast", "convert") and leaf.operands:
                leaf = by_name[leaf.operands[0]]
            if leaf.opcode != "multiply":
                multiply = False
                break
        # (is_dot_as_multiply_reduce asks the op_name for dot_general first: asked here)
        if multiply and "dot_general" in md_text:
            if not ask:
                return _ASKED
            if is_dot_as_multiply_reduce(instr, comp, module):
                return "dot_as_multiply_reduce", None
        return None, _tuple_copy_kinds(instr, fused, module)
    base = root  # the root through bitcast/convert
    bitcasts = True  # the way has bitcasts only (then through_bitcast(root) is base)
    while True:
        bop = base.opcode
        if bop != "bitcast" and bop != "convert" or not base.operands:
            break
        if bop == "convert":
            bitcasts = False
        base = by_name[base.operands[0]]
    bop = base.opcode
    if bop == "concatenate":
        if not ask:
            return _ASKED
        return ("concatenated_copy" if _concatenates_parameters(instr, comp, fused, base, module)
                else None), None
    if bop == "dynamic-update-slice":  # a rebuild of a buffer around its update?
        n = _rebuilt_operand(instr, by_name, base)
        return None, (REBUILD, n) if n is not None else None
    if bop == "dot":
        if not split_field and not ask:
            return _ASKED
        if not split_field and _split_k_by_shape(instr, comp, module) > 1:
            return "split_k_partials", None
        return None, None
    if bop == "multiply":
        if "dot_general" in md_text:
            if not ask:
                return _ASKED
            if is_dot_as_multiply_reduce(instr, comp, module):
                return "dot_as_multiply_reduce", None
        return None, None
    if bop not in _COPY_CHAIN_OPS or not instr.shape.is_array:
        return None, None
    # _fused_copy_kind, from ``base`` on (the walk so far passed bitcasts and converts only)
    k, dtype, sliced = _fused_chain(module, fused, base, _FUSED_CHAIN_OPS)
    if k is None or k >= len(instr.operands) or root.opcode == "parameter":
        return None, None
    if root.opcode == "bitcast" and bitcasts and bop == "parameter":  # (through_bitcast(root) is base)
        return None, None
    if not dtype and not bitcasts:  # a convert between root and base changes the element type?
        node = root
        while node is not base:
            src = by_name[node.operands[0]]
            if node.opcode == "convert" and src.shape.element_type != node.shape.element_type:
                dtype = True
                break
            node = src
    return None, (("dtype_conversion" if dtype else "slice_copy" if sliced else "layout_change"), k, sliced)


def _is_result(instr: Instruction, comp: Computation) -> bool:
    root = comp.root
    return instr is root or (root.opcode == "tuple" and instr.name in root.operands)


def _is_argument(comp: Computation, name: str) -> bool:
    """``name`` is, through bitcasts, a parameter of ``comp`` (in ENTRY: a program argument)."""
    i = comp.by_name.get(name)
    return i is not None and through_bitcast(comp, i).opcode == "parameter"


def _concatenates_parameters(instr: Instruction, comp: Computation, fused: Computation,
                             concat: Instruction, module: Module) -> bool:
    """``concat`` (the root of ``fused``, through bitcast / convert) joins only copy chains
    (``_fused_chain``) from parameters of ``fused`` whose operands at the call site are
    parameters of ``comp`` (weights, not computed values), and ``instr`` (its fusion) is no
    result of ``comp``."""
    if len(concat.operands) < 2 or not instr.shape.is_array or _is_result(instr, comp):
        return False
    for o in concat.operands:
        src = fused.by_name.get(o)
        k = None if src is None else _fused_chain(module, fused, src, _FUSED_CHAIN_OPS)[0]
        if k is None or k >= len(instr.operands) or not _is_argument(comp, instr.operands[k]):
            return False
    return True


def is_concatenated_copy(instr: Instruction, comp: Computation, module: Module) -> bool:
    """A kernel that only concatenates parameters of its computation (in ENTRY: arguments, such
    as weights) into an intermediate: a ``concatenate`` of them that is no result of its
    computation, or a fusion whose root is (through bitcast / convert) a concatenate of copy
    chains from them (XLA's DotMerger concatenating two dots' weights,
    xla/hlo/transforms/simplifiers/dot_merger.cc, fused by XLA:GPU into an
    ``input_concatenate_fusion``). Concatenations of computed values keep the other rules."""
    if instr.opcode == "concatenate":
        return (len(instr.operands) >= 2 and instr.shape.is_array and not _is_result(instr, comp)
                and all(_is_argument(comp, o) for o in instr.operands))
    if instr.opcode != "fusion" or not instr.called_computations:
        return False
    fused = module.computations.get(instr.called_computations[0])
    if fused is None or fused.root.opcode == "tuple":
        return False
    base = fused.root
    while base.opcode in ("bitcast", "convert") and base.operands:
        base = fused.by_name[base.operands[0]]
    return base.opcode == "concatenate" and _concatenates_parameters(instr, comp, fused, base, module)


def _rebuilt_operand(instr: Instruction, by_name: dict, dus: Instruction) -> int | None:
    """The operand a fusion rebuilds whole around ``dus``, its root's dynamic-update-slice
    (through bitcast / convert), when the update's buffer operand is (through bitcast /
    convert) a fusion parameter of the result's dimensions (XLA:CPU updates a bf16 cache as
    convert(dynamic-update-slice(convert(cache) to f32, ...)) to bf16, writing it whole; with
    unrolled layers over a stacked cache, once per layer). The result holds the operand's
    elements, updated: the same buffer for the accounting. None otherwise."""
    if not dus.operands or not instr.shape.is_array:
        return None
    buf = by_name[dus.operands[0]]
    # (through bitcast / convert, and the dynamic-update-slices of several windows before it)
    while buf.opcode in ("bitcast", "convert", "dynamic-update-slice") and buf.operands:
        buf = by_name[buf.operands[0]]
    n = buf.parameter_number if buf.opcode == "parameter" else None
    if n is None or n >= len(instr.operands) or buf.shape.dims != instr.shape.dims \
            or buf.shape.element_type != instr.shape.element_type:
        return None   # (another element type: a new value made of it, e.g. the f32 cache a dot reads)
    return n


def _touches_host(t) -> bool:
    for a in t.reads:
        if a.memory_space == HOST_MEMORY_SPACE:
            return True
    for a in t.writes:
        if a.memory_space == HOST_MEMORY_SPACE:
            return True
    return False


def split_k(instr: Instruction, comp: Computation, module: Module) -> int:
    """Split-K of a Triton gemm fusion (its config's ``split_k``, else by its result's shape,
    ``_split_k_by_shape``); 1 when it is none."""
    if instr.opcode != "fusion":
        return 1
    if _raw_attrs_have(instr, "backend_config", "split_k"):
        return _split_k(instr)
    return _split_k_by_shape(instr, comp, module)


def is_host_round_trip(instr: Instruction, t) -> bool:
    """A MoveToHost / MoveToDevice custom call, or a kernel (no fusion, dot or host I/O) that
    reads or writes host memory (``t``: its InstrTraffic)."""
    op = instr.opcode
    if op == "custom-call" and (instr.custom_call_target or "") in _HOST_TARGETS:
        return True
    return op not in _NO_HOST_CHECK and _touches_host(t)
