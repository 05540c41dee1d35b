"""The compulsory-traffic model of the excess pass, and the accounting that applies it to every
access of every kernel (``Accounting.run``); the causes are the rules of ``causes.py``, the sums
the ``ledger.py``'s, tiling and collectives the rules of ``wire.py``.

*Compulsory* traffic of one program run (per device) is what the program's semantics need
(DESIGN.md, "Compulsory and excess"):

* each ENTRY parameter is read once, for the footprint the program needs of it: the sum over
  the kernels that read it (directly, or through a copy of it) of the bytes each touches,
  at most the parameter's data bytes (a gathered row, a sliced window, a whole weight);
* each result leaf is written once (its data bytes); a result that updates a parameter (the
  output aliased to it, or built on a copy of it) writes only the update: the bytes of its
  in-place dynamic-update-slice / scatter writes (in a fusion that rebuilds the buffer, the
  update operand of its dynamic-update-slice);
* an intermediate (a value written by one kernel and read by others) costs nothing, whatever
  its size: compulsory traffic depends on the program's semantics alone, never on the on-chip
  capacity (DESIGN.md); its round trip is excess, ``materialized_intermediate`` when it fits
  on chip (its data bytes at most ``reuse.onchip_capacity_bytes(spec)``), else (or without a
  spec) ``spilled_intermediate`` for its writes and one read of each byte written;
* a collective sends its wire bytes (``passes/collectives.py``) at the width of the data
  (a bf16 value converted to f32 to be sent counts at bf16) and only the part of an
  all-gather's result that the program reads;
* the program's own host I/O (infeed, outfeed, host send/recv) is compulsory; a host
  offload and its return are not.

*Compiled* traffic is what the traffic pass counts (``passes/traffic.py``, the report's
totals; a conditional counts its costliest branch, as the totals do) plus, with a spec, the
operand re-reads of the tiling model of dots (``passes/reuse.py``), the bytes the time model
charges. Every access of every kernel is split into a compulsory part and *excess*, and each
excess byte gets one cause, so per role and per path

    compiled = compulsory + sum of causes + unattributed

holds exactly (``ledger.py``). Causes (``causes.CAUSES``; the first that applies):

1. ``tile_padding``: physical minus data bytes of tiled layouts (TPU ``T(8,128)``).
2. The kernel's own kind: ``rematerialization`` (an instruction XLA's rematerialization
   cloned, named ``*.remat*``, or one from a ``jax.checkpoint``'s recomputation, op_name
   ``rematted_computation``), ``host_round_trip`` (MoveToHost / MoveToDevice, copies between
   host and device memory), ``split_k_partials`` (a Triton gemm fusion with ``split_k`` > 1,
   or whose root dot's ``[S, M, N]`` result every consumer sums over S: its partial sums,
   written and read back), ``dot_as_multiply_reduce`` (a dot with a 1-row operand that XLA
   compiled as a multiply kernel whose product a reduce kernel reads back),
   ``concatenated_copy`` (a kernel that only concatenates arguments into an intermediate: XLA's
   DotMerger joining two dots' weights) -- these three are causes of what the kernel writes
   and of reading it back: its operand reads are compulsory as any kernel's (a
   split-K gemm reads its weight as the gemm would) --, and the copy kernels -- ``copy`` /
   ``transpose`` / ``convert`` / ``reshape``, or a fusion whose root (or, multi-output, every
   root element) is a chain of them from one parameter:
   ``not_donated`` when the copy is of a parameter whose update the program returns (XLA
   copies an argument it may not overwrite; ``donated_but_copied`` when donated; so too a
   ``copy`` that keeps its layout of a donated parameter whose buffer a result takes, or into
   that result: XLA's copy insertion where jax paired the argument with a result that is not
   its update), else ``dtype_conversion``, ``buffer_copy`` (a ``copy`` that keeps its source's
   layout: XLA's copy insertion for a loop's state, a value returned twice) or ``layout_change``;
   a (dynamic-)slice kernel of a parameter or of a copy of one (XLA:TPU copies a scanned
   layer's window of a stacked KV cache out before attention) is ``slice_copy``: its reader's
   read is the parameter's compulsory read, the window's write and read-back are no spill.
   An in-place update of a copy of an updated parameter (copied into another layout or into
   VMEM, updated, copied back) is the compulsory update write; an update made on chip is
   credited to the kernel that writes the result back to HBM. A result that updates a
   parameter in a buffer of its own (rebuilt whole) is read from the parameter's read budget.
3. A read of a copy of a buffer beyond that buffer's footprint: the copy's cause, for one
   read of the copy's value (its read-back: what the copy adds); reading it again (in every
   iteration of a loop) is ``re_read`` of what it copies, as the program without the copy
   reads it (so ``not_donated`` is what donating saves).
4. The buffer: a parameter read again beyond its footprint (several kernels looking up the
   same rows of a table -- an embedding gather fused into each consumer -- need them once), or
   a spilled intermediate read more often than written, is ``re_read`` (the same buffer read
   by several kernels, or in every loop iteration); an intermediate that fits on chip is
   ``materialized_intermediate`` (a fusion boundary), one that does not
   ``spilled_intermediate``; an update of a parameter written
   beyond its update bytes is ``whole_rewrite``, and so is the read of the parameter by a
   fusion that rebuilds it around a dynamic-update-slice and needs none of its old values
   (``_rewrite_reads``: XLA:CPU's bf16 update through f32); a kernel that computes every element of the
   update anew (elementwise arithmetic: a training step's new parameters and optimizer state,
   on TPU computed in VMEM and copied to their buffers; on GPU, for a kernel read in another
   element order, computed in an ``input_transpose_fusion`` into a buffer of its own and copied
   into the donated one: the copy's write is the update, the fusion's write and the copy's
   read excess) writes update bytes only. A loop's state -- a parameter's buffer or a copy's
   that kernels in the loop write new values into (a scan's carry) -- holds intermediates:
   the values written anew in every iteration but the last (the update), and the reads of
   them back, are ``materialized_intermediate`` / ``spilled_intermediate``, not the copy's
   cause, ``whole_rewrite`` or ``re_read`` (the unrolled loop's figures). A weights
   parameter used only as the table of lookups (``lookups.py``: gather / dynamic-slice of
   rows, a one-hot dot) is needed for the rows the lookups touch (tokens x d_model x width):
   the rest of a whole read of it (copied whole into VMEM, multiplied by a one-hot matrix)
   is ``whole_table_read``.
5. Tiling: ``tiling_re_read``; collectives: ``collective_wider_than_data``,
   ``all_gather_partly_used``.
6. Anything else: ``unattributed`` (reported, never dropped).

Time: a cause's HBM bytes at the spec's ``hbm_bytes_per_s`` plus its wire bytes at the link
bandwidth of the collective (``collectives.link_bandwidth_bytes_per_s``): the memory time the
bytes add (the saving is that much where the kernel is memory-bound). Host bytes have no
bandwidth in the specs: their time is unmodeled (``untimed_bytes``).

The pass is a pure function of (analysis, entry parameters, spec, reuse); passes never print.
"""

from __future__ import annotations

import re
from collections import defaultdict
from operator import itemgetter
from typing import NamedTuple

from ...hlo import Instruction, Module
from ...hlo.opcodes import OPCODES
from ...hlo.shape import HOST_MEMORY_SPACE
from ..memo import memo_of
from ..roles import entry_parameter_name, leaf_position, roles_pass
from ..traffic import NO_TRAFFIC, ON_CHIP_MEMORY_SPACES
from .buffers import NATIVE_STARTS, Buffers, gathered_leaves, resolve_copy, union_all, write_key
from .causes import (SPILL, RECOMPUTE_PRIORITY, KERNEL_WRITES, PROGRAM_WIDE, READ_PRIORITY, READS_COMPULSORY, UNATTRIBUTED,
                     FixContext, fix_text)
from .kernels import PLAIN_KERNELS as _PLAIN_KERNELS, REBUILD, classify, copy_kind
from .layouts import keeps_row_major
from .lookups import lookup_rows, table_lookup
from .ledger import HBM_READ, HBM_WRITE, Ledger, build_result
from .records import ExcessAnalysis
from .wire import collective_excess, tiling_excess

_ZERO = (0,)  # range(1)
_NONE = object()  # no value yet


def _inner_update_bytes(instr: Instruction, module: Module, element: int | None = None) -> int:
    """Update bytes of a fusion that rebuilds a buffer around a dynamic-update-slice (root,
    through bitcasts, converts, transposes, reshapes and copies: XLA:CPU updates a bf16 cache as
    convert(dynamic-update-slice(convert(cache) to f32, ...)) to bf16, XLA:GPU an int8 cache of
    head_dim 32 as transpose(dynamic-update-slice(transpose(cache), ...)) instead of updating it
    in place, in the root's element width; 0 for anything else. ``element``: of a multi-output
    fusion, that element of its root tuple (None: the root itself)."""
    if instr.opcode != "fusion" or not instr.called_computations:
        return 0
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return 0
    out = root = fused.root
    if element is not None and root.opcode == "tuple":
        if not 0 <= element < len(root.operands) or root.operands[element] not in fused.by_name:
            return 0
        out = root = fused.by_name[root.operands[element]]
    total = 0
    for _ in range(1000):   # (several windows: a chain of dynamic-update-slices, each of the last)
        while root.opcode in _PERMUTES and root.operands and root.operands[0] in fused.by_name:
            root = fused.by_name[root.operands[0]]
        if root.opcode == "fusion" and root.called_computations and root.shape.is_array \
                and out.shape.is_array and root.shape.dims == out.shape.dims:
            inner = _inner_update_bytes(root, module)   # (a nested fusion: XLA:TPU's scatter)
            bits, obits = root.shape.element_bits, out.shape.element_bits
            return total + (inner * obits // bits if inner and bits and obits else inner)
        if root.opcode == "scatter" and len(root.operands) == 3:
            # (XLA:TPU's scatter fusion rewrites the whole buffer: its update is the rows its
            # updates operand scatters, in the result's width)
            upd = fused.by_name.get(root.operands[2])
            if upd is None or not upd.shape.is_array or not out.shape.is_array:
                return 0
            n = min(upd.shape.num_elements, out.shape.num_elements)
            return total + out.shape.logical_footprint_bytes(n)
        if root.opcode != "dynamic-update-slice" or len(root.operands) < 2:
            break
        upd = fused.by_name.get(root.operands[1])
        if upd is None or not upd.shape.is_array:
            return 0
        out_bits, upd_bits = out.shape.element_bits, upd.shape.element_bits
        if not out_bits or not upd_bits or not out.shape.is_array:
            total += upd.shape.logical_byte_size
        else:
            total += upd.shape.logical_byte_size * out_bits // upd_bits
        if root.operands[0] not in fused.by_name:
            break
        root = fused.by_name[root.operands[0]]
    return total


class _EntryRow(NamedTuple):
    """An ENTRY instruction where a helper takes a row (``instr``, ``computation``)."""

    instr: Instruction
    computation: str


def _is_fill(instr: Instruction, module: Module) -> bool:
    """``instr`` writes a constant: a broadcast of a scalar constant, or a fusion whose root (or
    every element of its root tuple), through bitcasts and copies, is a broadcast of a scalar
    constant or parameter fed by a constant (XLA:CPU's ``wrapped_broadcast(constant)``, XLA:GPU's
    operand-less ``loop_broadcast_fusion``)."""
    def constant(comp, e, outer) -> bool:
        while e is not None and e.opcode in ("bitcast", "copy", "convert") and e.operands:
            e = comp.by_name.get(e.operands[0])
        if e is None:
            return False
        if e.opcode == "constant":
            return e.shape.is_array and not e.shape.dims
        if e.opcode == "parameter" and outer is not None:   # (a fused parameter: the operand)
            n = e.parameter_number
            src = outer[1].by_name.get(outer[0].operands[n]) if 0 <= n < len(outer[0].operands) else None
            return src is not None and src.opcode == "constant" and src.shape.is_array and not src.shape.dims
        return False

    def filled(comp, e, outer) -> bool:
        while e is not None and e.opcode in ("bitcast", "copy") and e.operands:
            e = comp.by_name.get(e.operands[0])
        return e is not None and e.opcode == "broadcast" and bool(e.operands) \
            and constant(comp, comp.by_name.get(e.operands[0]), outer)

    comp = module.computations.get(instr.computation)
    if comp is None:
        return False
    if instr.opcode == "broadcast":
        return filled(comp, instr, None)
    if instr.opcode != "fusion" or not instr.called_computations:
        return False
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return False
    root = fused.root
    if root.opcode != "tuple":
        return filled(fused, root, (instr, comp))
    return bool(root.operands) and all(filled(fused, fused.by_name.get(o), (instr, comp)) for o in root.operands)


def _through_permutes(by_name, e):
    """``e`` followed back through bitcasts, converts, transposes, reshapes and copies
    (``_PERMUTES``: each element one of its operand's, in another place or type)."""
    while e is not None and e.opcode in _PERMUTES and e.operands:
        e = by_name.get(e.operands[0])
    return e


def _updated_window(fused, w, bits: int) -> tuple[int, int] | None:
    """(update bytes in ``bits``-wide elements, the fused parameter number it slices) where
    ``w`` (a value of ``fused``) is ``dynamic-update-slice(dynamic-slice(parameter, ...), new,
    ...)`` -- a chain of them, their updates summed -- through permutes: a window of an
    operand, updated (a scanned layer's cache window with its new position); else None."""
    by_name, total = fused.by_name, 0
    for _ in range(64):
        if w is None or w.opcode != "dynamic-update-slice" or len(w.operands) < 2:
            break
        upd = by_name.get(w.operands[1])
        if upd is None or not upd.shape.is_array:
            return None
        ub = upd.shape.element_bits
        total += upd.shape.logical_byte_size * bits // ub if ub and bits else upd.shape.logical_byte_size
        w = _through_permutes(by_name, by_name.get(w.operands[0]))
    if not total or w is None or w.opcode != "dynamic-slice" or not w.operands:
        return None
    p = _through_permutes(by_name, by_name.get(w.operands[0]))
    return (total, p.parameter_number) if p is not None and p.opcode == "parameter" else None


def _window_update(instr: Instruction, module: Module) -> tuple[int, str] | None:
    """(update bytes in ``instr``'s element width, the operand it slices) of a fusion whose
    root is an updated window of an operand (``_updated_window``); None otherwise."""
    if not instr.called_computations or not instr.shape.is_array:
        return None
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return None
    got = _updated_window(fused, _through_permutes(fused.by_name, fused.root), instr.shape.element_bits)
    if got is None or not 0 <= got[1] < len(instr.operands):
        return None
    return got[0], instr.operands[got[1]]


def _stacked_update(instr: Instruction, module: Module) -> tuple[int, str] | None:
    """(update bytes, the operand it is a slice of) of a fusion whose root (through permutes)
    is ``dynamic-update-slice(stack, w, ...)`` with ``w`` an updated window of an operand
    (``_updated_window``), in the stack's element width -- computed in this fusion (XLA:GPU's
    scanned decode stacks each layer's cache, its new position written, so) or by the kernel
    that produces the operand ``w`` is (XLA:CPU's bf16 scan, ``_window_update``). None for
    anything else."""
    if not instr.called_computations:
        return None
    fused = module.computations.get(instr.called_computations[0])
    if fused is None:
        return None
    by_name = fused.by_name
    root = _through_permutes(by_name, fused.root)
    if root is None or root.opcode != "dynamic-update-slice" or len(root.operands) < 2 \
            or not root.shape.is_array:
        return None
    out_bits = root.shape.element_bits
    w = _through_permutes(by_name, by_name.get(root.operands[1]))
    if w is not None and w.opcode == "parameter" and 0 <= w.parameter_number < len(instr.operands):
        # (the window updated by another kernel of the loop body, stacked by this one: XLA:CPU's
        # bf16 scan, convert(dynamic-update-slice(convert(ys), layer)))
        comp = module.computations.get(instr.computation)
        prod = comp.by_name.get(instr.operands[w.parameter_number]) if comp is not None else None
        while prod is not None and prod.opcode in ("bitcast", "copy") and prod.operands:
            prod = comp.by_name.get(prod.operands[0])
        got = _window_update(prod, module) if prod is not None and prod.opcode == "fusion" else None
        if got is None:
            return None
        nbytes, base = got
        ebits = prod.shape.element_bits if prod.shape.is_array else 0
        return (nbytes * out_bits // ebits if ebits and out_bits else nbytes), base
    got = _updated_window(fused, w, out_bits)
    if got is None or not 0 <= got[1] < len(instr.operands):
        return None
    return got[0], instr.operands[got[1]]


# elementwise arithmetic (hlo/opcodes.py's elementwise category less select / clamp / convert,
# which pass old values through or only change their type)
_PASS_THROUGH = frozenset({"select", "clamp", "convert", "bitcast-convert", "copy", "bitcast", "reshape",
                           "transpose", "reduce-precision"})
_ARITHMETIC = frozenset(n for n, rec in OPCODES.items() if rec.elementwise) - _PASS_THROUGH
# ops whose every result element is new arithmetic too, though not elementwise (a scan's carry
# computed by a reduction or a contraction: ``x = jnp.sum(w[i] * x, 1)``; ``_update_bytes``)
_COMPUTES = frozenset({"reduce", "dot", "convolution", "reduce-window"})
# ops a fusion's root element is followed through to the value it holds (each element of it
# one element of the operand, in another place or type)
_PERMUTES = frozenset({"bitcast", "convert", "transpose", "reshape", "copy"})


def _copy_source(r, module: Module) -> tuple[Instruction, int | None] | None:
    """(the kernel, its root tuple element or None) whose value row ``r`` copies, when ``r`` is
    a ``copy-start`` / ``copy`` or a copy fusion (a chain of copy ops from one operand, no
    window); its source is followed through bitcasts, copies and one get-tuple-element. None:
    not a copy, or one of a parameter or of a window."""
    instr = r.instr
    if not instr.operands:
        return None
    comp = module.computations.get(r.computation)
    if comp is None:
        return None
    if instr.opcode in ("copy-start", "copy"):
        src_k = 0
    elif instr.opcode == "fusion":
        ck = copy_kind(instr, comp, module)
        if ck is None or ck[2] or ck[1] >= len(instr.operands):
            return None  # no copy fusion, or one that copies a window out (not every element)
        src_k = ck[1]
    else:
        return None
    by_name = comp.by_name
    src = by_name.get(instr.operands[src_k])
    element = None
    for _ in range(1000):  # (bitcasts and copies of the value, then one get-tuple-element)
        if src is None or not src.operands:
            return None
        if src.opcode in ("bitcast", "copy"):
            src = by_name.get(src.operands[0])
            continue
        if src.opcode == "get-tuple-element":
            try:
                element = int(src.attrs.get("index"))
            except (TypeError, ValueError):
                return None
            src = by_name.get(src.operands[0])
        break
    if src is None or src.opcode in ("get-tuple-element", "parameter"):
        return None
    return src, element


def _copies_new_values(r, module: Module) -> bool:
    """Row ``r`` is a copy (``_copy_source``) of a value that a kernel computed every element of
    (``_computes_every_element``), so the copy's write into a result that updates a parameter is
    the update (compulsory), and the kernel's own write and the copy's read are the excess:

    * XLA:TPU computes a training step's new parameters in VMEM and copies them (``copy-start``
      / ``copy``) to their HBM buffers;
    * XLA:GPU computes the new value of a parameter it reads in another element order (the
      AdamW update of a transposed kernel, ``input_transpose_fusion``) into an HBM buffer of its
      own, which it cannot write in place, and copies it into the donated output buffer."""
    got = _copy_source(r, module)
    return got is not None and _computes_every_element(got[0], module, got[1], reductions=True)


def _copied_update_bytes(r, module: Module) -> int:
    """Update bytes (per run) of the value row ``r`` copies (``_copy_source``) when a fusion
    rebuilt it around a dynamic-update-slice (``_inner_update_bytes``): XLA:GPU updates a
    transposed int8 cache of head_dim 32 in a multi-output fusion (element 0: the updated cache,
    transposed back; element 1: the dequantized keys for the dot) and copies element 0 into the
    donated result, so the copy's write into the result is what carries the new position
    (compulsory); the fusion's whole write and the copy's rest are the excess. 0 otherwise."""
    got = _copy_source(r, module)
    if got is None:
        return 0
    n = _inner_update_bytes(got[0], module, got[1])
    if n:   # (in the copy's element width: XLA:CPU updates a bf16 cache in f32, then converts it)
        src = got[0].shape
        if got[1] is not None and src.is_tuple:
            src = src.tuple_shapes[got[1]] if 0 <= got[1] < len(src.tuple_shapes) else src
        dst = r.instr.shape
        if src.is_array and dst.is_array and src.element_bits and dst.element_bits:
            n = n * dst.element_bits // src.element_bits
    return n * r.multiplicity.count


def _computes_every_element(instr: Instruction, module: Module, element: int | None = None,
                            reductions: bool = False) -> bool:
    """The kernel's result (every element of every result leaf) is new arithmetic on its operands,
    not an old value passed through: an elementwise arithmetic op (``p - lr * g``, an optimizer's
    moment update) as the kernel or as each root element of its fusion (through bitcasts,
    converts, transposes, reshapes and copies: ``_PERMUTES``). A training step's new parameters and optimizer state are written so: every element
    changes, so every element written is the update (compulsory). Not so for a
    dynamic-update-slice / scatter (the update is the slice), a select (a masked write keeps the
    unselected old values: ``whole_rewrite``), a copy or a concatenate."""
    if instr.opcode != "fusion":
        if instr.opcode == "select" and len(instr.operands) == 3:   # (as in a fusion, below)
            comp = module.computations.get(instr.computation)
            return comp is not None and all(_new_value(comp, comp.by_name.get(o)) for o in instr.operands[1:])
        return instr.opcode in _ARITHMETIC or reductions and instr.opcode in _COMPUTES
    fused = module.computations.get(instr.called_computations[0]) if instr.called_computations else None
    if fused is None:
        return False
    root = fused.root
    elems = [fused.by_name.get(o) for o in root.operands] if root.opcode == "tuple" else [root]
    if element is not None and root.opcode == "tuple":
        elems = elems[element:element + 1] if 0 <= element < len(elems) else [None]
    for e in elems:
        # (a transposed, reshaped or copied new value is new in every element too: XLA:GPU's
        # input_transpose_fusion computes the update of a transposed kernel, then transposes it)
        while e is not None and e.opcode in _PERMUTES and e.operands:
            e = fused.by_name.get(e.operands[0])
        if e is not None and e.opcode == "select" and len(e.operands) == 3:
            # a select between new values (optax's saturating step count: select(count < max,
            # count + 1, max)) computes every element; one with an operand passed through
            # (select(mask, new, old)) keeps old values
            if all(_new_value(fused, fused.by_name.get(o)) for o in e.operands[1:]):
                continue
            return False
        if e is None or e.opcode not in _ARITHMETIC and not (reductions and e.opcode in _COMPUTES):
            return False
    return True


def _new_value(comp, e) -> bool:
    """``e`` (through bitcast / convert / broadcast) is arithmetic or a constant, not a
    parameter of ``comp`` passed through."""
    while e is not None and e.opcode in ("bitcast", "convert", "broadcast") and e.operands:
        e = comp.by_name.get(e.operands[0])
    return e is not None and (e.opcode in _ARITHMETIC or e.opcode in ("constant", "iota"))


def _update_bytes(r, logical: int, module: Module) -> int:
    """The update bytes among the ``logical`` bytes a write of row ``r`` puts into a buffer:
    all of them for an in-place update or a kernel that computes every element anew
    (``_computes_every_element``: a training step's parameter update), a rebuilding fusion's
    update (``_inner_update_bytes``), else 0."""
    if r.traffic.inplace_buffer_bytes:
        return logical
    inner = _inner_update_bytes(r.instr, module)
    if inner:
        return min(logical, inner * r.multiplicity.count)
    # (a reduction or contraction computes every element too: a scan's carry x = sum(w[i] * x))
    return logical if _computes_every_element(r.instr, module, reductions=True) else 0


def _slice_ranges(text: str) -> list[tuple[int, int]] | None:
    """``[a:b]`` per dimension of a ``slice={[a:b], ...}`` attribute (stride 1), else None."""
    got = re.findall(r"\[\s*(\d+)\s*:\s*(\d+)\s*(?::\s*(\d+)\s*)?\]", text)
    if not got or any(st not in ("", "1") for _a, _b, st in got):
        return None
    return [(int(a), int(b)) for a, b, _st in got]


def _tile_in_order(ranges: list, shape) -> bool:
    """The slices ``ranges`` (one list of per-dimension ranges each) put back together in order
    along one dimension are ``shape`` whole: each covers every other dimension, and along the
    split one they are contiguous, increasing and cover it (XLA:TPU's ConcatBitcast of a
    cache staged by batch row)."""
    if not ranges or any(rg is None or len(rg) != len(shape.dims) for rg in ranges) or not shape.is_array:
        return False
    dims = shape.dims
    split = [d for d in range(len(dims)) if any(rg[d] != (0, dims[d]) for rg in ranges)]
    if len(split) > 1:
        return False
    if not split:
        return len(ranges) == 1
    d = split[0]
    at = 0
    for rg in ranges:
        if rg[d][0] != at or rg[d][1] <= at:
            return False
        at = rg[d][1]
    return at == dims[d]


def _leaf_shapes(shape) -> list:
    """The leaves of ``shape`` in tuple order (``Shape.leaves``, without a call per array)."""
    if not shape.is_tuple:
        return [shape]
    out = []
    for s in shape.tuple_shapes:
        if s.is_tuple:
            out.extend(_leaf_shapes(s))
        else:
            out.append(s)
    return out


def _leaves(shape) -> list:
    if not shape.is_tuple:
        return [((), shape)]
    return list(shape.leaves_with_index())


def _logical(a, leaf) -> int:
    """Data bytes of an access (``Access.logical_nbytes``, else the leaf's share)."""
    lg = a.logical_nbytes
    if lg is not None:
        return lg
    if leaf is None or not leaf.byte_size or leaf.byte_size == leaf.logical_byte_size:
        return a.nbytes
    return a.nbytes * leaf.logical_byte_size // leaf.byte_size


def _entry_value(entry, instr: Instruction, v):
    """An index expression of ``lookups.lookup_rows`` (a kernel operand number, a constant, or a
    pure expression of them) with each kernel operand replaced by the ENTRY value it is: a
    ``parameter`` (its number) or a constant, also through copies, reshapes and bitcasts
    between row-major layouts of one (XLA:TPU reads a decode step's token through
    ``bitcast(copy(tokens))`` in each kernel that looks it up); None when an operand is any
    other value (one a loop or an in-place update may change between readers)."""
    if isinstance(v, int):
        src = entry.by_name.get(instr.operands[v]) if v < len(instr.operands) else None
        if src is not None:   # (the same values, in another buffer or shape)
            src = _value_source(src, entry.by_name)[-1]
        if src is not None and src.opcode == "parameter":
            return ("entry_parameter", src.parameter_number)
        if src is not None and src.opcode == "constant" and src.literal is not None \
                and "..." not in src.literal:   # (an elided literal, ``{...}``, names no value)
            return ("constant", src.literal.strip(), str(src.shape))
        return None
    if v[0] == "expr":
        kids = tuple(_entry_value(entry, instr, k) for k in v[4])
        return None if any(k is None for k in kids) else (*v[:4], kids)
    return v   # a constant


def _descending(shape) -> bool:
    """No layout, or its dimensions major to minor in order (``{1,0}``): a bitcast between two
    such shapes keeps the elements' row-major order (a reshape); between others it may be a
    transpose."""
    lay = shape.layout
    m2m = lay.minor_to_major if lay is not None else ()
    return not m2m or tuple(m2m) == tuple(range(len(m2m) - 1, -1, -1))


def _value_source(instr, by_name, any_bitcast: bool = False) -> list:
    """``instr`` and the ENTRY instructions it takes its elements from in their row-major
    order, until the first that is no such step (the chain's last element: a parameter, a
    constant, or a value computed there): ``reshape``, ``copy`` (which keeps the dimensions:
    hlo/validate.py), bitcasts between row-major layouts, copy-start / done, and elements of
    tuple instructions (XLA:GPU returns ``copy(gte(tuple(bitcast(x), ...)))``)."""
    node, chain = instr, []
    for _ in range(64):
        chain.append(node)
        op = node.opcode
        if op not in ("reshape", "copy", "bitcast", "copy-start", "copy-done", "get-tuple-element") \
                or not node.operands:
            return chain
        src = by_name.get(node.operands[0])
        if src is None:
            return chain
        if op == "get-tuple-element":   # (an element of a tuple instruction: that operand)
            i = node.tuple_index
            if src.opcode != "tuple" or i is None or not 0 <= i < len(src.operands) \
                    or src.operands[i] not in by_name:
                return chain
            chain.append(src)
            src = by_name[src.operands[i]]
        elif op == "bitcast" and not any_bitcast and not (_descending(node.shape) and _descending(src.shape)):
            return chain   # (a bitcast between other layouts may transpose)
        node = src
    return chain


def _value_chain(instr, module) -> list | None:
    """``_value_source`` of ENTRY instruction ``instr`` when it ends at an ENTRY parameter
    (``instr`` first, the parameter last): ``instr`` holds that parameter's elements in their
    row-major order; None where some step computes a new value (or for None)."""
    if instr is None:
        return None
    chain = _value_source(instr, module.entry.by_name)
    if chain[-1].opcode == "parameter":
        return chain
    if chain[-1].opcode != "bitcast":
        return None
    # a bitcast between tiled or other layouts (XLA:TPU's reshape of x: bitcast into its tiles,
    # a relayout copy, a bitcast out): the elements followed through the buffers
    # (layouts.keeps_row_major)
    chain = _value_source(instr, module.entry.by_name, any_bitcast=True)
    return chain if chain[-1].opcode == "parameter" and keeps_row_major(chain) else None


def _reshaped_parameter(instr, leaf, pleaf, module) -> bool:
    """ENTRY instruction ``instr`` (a result) holds an ENTRY parameter's elements in their
    row-major order (a reshape of it, ``leaf`` of the parameter's element type and count): through ``reshape``,
    bitcasts between row-major layouts, copies that keep the dimensions and copy-start / done
    (``_value_chain``; XLA:CPU and XLA:GPU copy ``bitcast(x)``, XLA:TPU runs ``reshape(x)``
    into its tiles). As the parameter itself, such a result is the parameter's value, not a
    new one, on every backend (donated, XLA:CPU / GPU alias it, a bitcast)."""
    if instr is None or not (leaf.is_array and pleaf.is_array and leaf.element_type == pleaf.element_type
                             and leaf.num_elements == pleaf.num_elements):
        return False
    return _value_chain(instr, module) is not None


#: the kinds of copy kernels (kernels.copy_kind)
_COPY_KINDS = frozenset(("layout_change", "dtype_conversion", "slice_copy", "buffer_copy"))


def _same_order(a, b) -> bool:
    """Arrays ``a`` and ``b`` of one element count hold their elements in the same order in
    memory (a bitcast between them moves nothing): the same dimensions and layout (tiles
    too), or both untiled and row-major (a reshape). Else a copy between them relays the
    elements out (XLA:TPU's reshape of an (8,128)-tiled array into other tiles)."""
    la, lb = a.layout, b.layout
    ta = la.tiles if la is not None else ()
    tb = lb.tiles if lb is not None else ()
    if a.dims == b.dims and ta == tb and (la.minor_to_major if la is not None else None) == (
            lb.minor_to_major if lb is not None else None):
        return True
    return not ta and not tb and _descending(a) and _descending(b)


def _same_layout(a, b) -> bool:
    """Arrays ``a`` and ``b`` of the same dimensions, layout (``minor_to_major`` and tiles)
    and memory space: a ``copy`` from one to the other moves the bytes as they are."""
    return a.is_array and b.is_array and a.dims == b.dims and a.memory_space == b.memory_space \
        and _same_order(a, b)


def _moves_only(instr, module) -> bool:
    """``instr`` is a ``copy`` of an array into another memory space in the same layout (HBM
    to VMEM): it relays nothing out."""
    if instr.opcode != "copy" or not instr.operands or not instr.shape.is_array:
        return False
    comp = module.computations.get(instr.computation)
    src = comp.by_name.get(instr.operands[0]) if comp is not None else None
    return src is not None and src.shape.is_array and src.shape.dims == instr.shape.dims \
        and src.shape.element_type == instr.shape.element_type and _same_order(src.shape, instr.shape)


def _reshaped_buffer(leaf, pleaf) -> bool:
    """A result leaf in a copy's buffer of a parameter (a bitcast of it: the same buffer) holds
    the parameter's element type and count in the same element order (row-major, untiled): a
    reshape of the copy, updated in place or not (``x.at[i].set(v).reshape(...)`` kept)."""
    return leaf.is_array and pleaf.is_array and leaf.element_type == pleaf.element_type \
        and leaf.num_elements == pleaf.num_elements and _same_order(leaf, pleaf)


def _same_array(a, b) -> bool:
    """Both arrays of one element type and the same dimensions (layouts aside): a result that
    could be its parameter updated (and take its buffer, donated)."""
    return a.is_array and b.is_array and a.dims == b.dims and a.element_type == b.element_type


class Accounting:
    """One run of the excess pass over a ModuleAnalysis: the compulsory-traffic model (module
    docstring) applied to every access of every kernel, each byte put into the ledger with its
    compulsory part and its cause (``run``)."""

    def __init__(self, analysis, parameters, spec, reuse, roles):
        self.analysis = analysis
        self.module: Module = analysis.module
        self.params = {p.number: p for p in parameters}
        self.spec = spec
        self.reuse = reuse
        if roles is None:
            roles = getattr(analysis, "roles", None)
        if roles is None:
            entry_roles = {p.number: p.role for p in parameters} if parameters else None
            roles = roles_pass(self.module, entry_roles)
        self.roles = roles
        self.capacity: int | None = None
        if spec is not None:
            from ..reuse import onchip_capacity_bytes
            cap = onchip_capacity_bytes(spec)
            self.capacity = cap[0] if cap else None
        self.notes: list[str] = []
        self._entry_names: dict | None = None
        self._subjects: dict[int, str] = {}  # entry parameter number -> _param_subject
        self.ledger = Ledger(1.0 / spec.hbm_bytes_per_s if spec is not None else None)

    # -- buffers ---------------------------------------------------------------------------

    def _kernel_computations(self) -> list[str]:
        """Kernel-level computations whose rows count, as the totals count them: of a
        conditional, the branch the totals take (its costliest)."""
        mult = self.analysis.multiplicity
        module = self.module
        skip: set[str] = set()
        chosen = self.analysis.branches  # the one branch choice of the pipeline's totals
        if not chosen:  # (the pipeline chooses for every conditional of these computations)
            return list(mult)
        conds = [(c, i) for c in mult for i in module.computations[c].instructions
                 if i.opcode == "conditional"]
        if conds:
            keep: set[str] = set()
            for cname, ci in conds:
                best = chosen[(cname, ci.name)]
                keep |= module.reachable_computations([best], through_fusions=False)
                for b in ci.called_computations:
                    if b != best:
                        skip |= module.reachable_computations([b], through_fusions=False)
            skip -= keep
            if skip:
                self.notes.append("conditionals: the branch the totals take (the costliest) is "
                                  "counted, as in the report's totals")
        return [c for c in mult if c not in skip]



    # -- naming ----------------------------------------------------------------------------

    def _param_subject(self, number: int) -> str:
        got = self._subjects.get(number)
        if got is not None:
            return got
        p = self.params.get(number)
        if p is not None:
            got = p.path
        else:
            names = self._entry_names
            if names is None:
                names = self._entry_names = {i.parameter_number: i for i in self.module.entry.parameters}
            instr = names.get(number)
            got = entry_parameter_name(instr) if instr is not None else f"parameter {number}"
        self._subjects[number] = got
        return got

    def _argument(self, number: int) -> tuple[str, int | None, bool]:
        """(argument name, argnum or None, donated) of an entry parameter."""
        p = self.params.get(number)
        if p is None:
            return self._param_subject(number), None, number in self.module.input_output_alias
        arg = p.path.split("/", 1)[0]
        if arg == "args" and "/" in p.path:
            arg = "/".join(p.path.split("/")[:2])
        return arg, getattr(p, "argnum", None), p.donated

    # -- run -------------------------------------------------------------------------------

    def run(self) -> ExcessAnalysis:
        """The pass, in four phases: the rows and their kernel causes (``_scan_rows``), the
        buffers they share (``buffers.union_all``), the entry's parameter and result leaves
        (``_entry_leaves``) and the copies of them (``_copy_buffers``), then every access
        accounted (``_account``) and the ledger's result built."""
        module = self.module
        self.buffers = Buffers()
        comps = self._kernel_computations()
        active, collective_rows, kcause, copy_rows, inplace, rebuilds = self._scan_rows(comps)
        self.root_tuple_skipped = union_all(module, self.buffers, comps, inplace, rebuilds)
        self._entry_leaves()
        special = self._copy_buffers(copy_rows, kcause, active)
        self._account(active, collective_rows, special)
        return build_result(self.ledger, module, self.rows, self.notes, self.capacity, self.any_unmodeled,
                            self.spec.name if self.spec is not None else None, self.fix)

    def _scan_rows(self, comps: list[str]):
        """(rows that move bytes, collective rows, row -> kernel cause, copy kernels' (row,
        kind, result leaf), in-place fusions, rebuilding fusions) of the rows of ``comps``; sets
        ``self.rows``."""
        module = self.module
        self.comps = comps_set = set(comps)
        # the rows counted; those that move bytes (most rows of a module are parameters, tuples,
        # constants...), the collectives, and the fusions that update a buffer in place
        active: list[int] = []  # (row numbers)
        collective_rows: list[tuple[int, object]] = []
        inplace: set[tuple[str, str]] = set()
        unmodeled = False
        if len(comps_set) == len(self.analysis.multiplicity):  # no branch left out: every row
            rows = self.analysis.rows
        else:
            rows = [r for r in self.analysis.rows if r.computation in comps_set]
        # and each such row's kernel cause or copy kind (_classify: of the row alone), in the
        # same pass; the copy kernels' buffers are resolved below, after the unions
        kcause: dict[int, str] = {}
        copy_rows: list[tuple[int, tuple, int]] = []  # (row number, copy kind, result leaf)
        self.copy_starts = copy_starts = []  # copy-start rows (a prefetch into on-chip memory?)
        self.rebuild_rows = rebuild_rows = {}  # row -> the operand it rebuilds around an update
        rebuilds: dict[tuple[str, str], int] = {}  # fusions that rebuild an operand: its number
        computations = module.computations
        sclasses = module.structural_classes
        fusion_kinds = memo_of(module).fusion_kinds
        cname = None
        for k, r in enumerate(rows):
            t = r.traffic
            if t is NO_TRAFFIC:  # (the one record of every instruction that moves nothing)
                pass
            elif t.reads or t.writes:
                active.append(k)
                instr = r.instr
                if r.computation is not cname:  # (rows come computation by computation)
                    cname = r.computation
                    comp = computations[cname]
                if t.inplace_buffer_bytes and instr.opcode == "fusion":
                    inplace.add((cname, instr.name))
                op = instr.opcode
                if op == "copy-start":
                    copy_starts.append(k)
                # classify's answer; for the common kernels without its rare forms (no remat
                # clone, no split_k field, a fusion's memoized kind), its own memo read inline
                attrs = instr._attrs
                c = ck = None
                if attrs is None or ".remat" in instr.name:
                    c, ck = classify(instr, comp, module, t)
                elif op == "fusion":
                    md_text = attrs.get("metadata") or ""
                    called = instr._called
                    if called is None:
                        called = instr.called_computations
                    sc = sclasses.get(called[0]) if called else None
                    hit = None if sc is None or "rematted_computation" in md_text \
                        or "split_k" in (attrs.get("backend_config") or "") else fusion_kinds.get(
                            (sc, id(instr.shape), len(instr.operands), "dot_general" in md_text, False))
                    if hit is not None:
                        c, ck = hit
                    else:
                        c, ck = classify(instr, comp, module, t)
                elif op not in _PLAIN_KERNELS or "rematted_computation" in (attrs.get("metadata") or ""):
                    c, ck = classify(instr, comp, module, t)
                if c is not None:
                    kcause[k] = c
                elif ck is not None:
                    if isinstance(ck, list):  # a multi-output copy fusion: each element a copy
                        copy_rows.extend((k, (kind, src_k, sliced), pos) for pos, kind, src_k, sliced in ck)
                    elif ck[0] == REBUILD:  # rebuilds an operand around its update: that buffer
                        if not t.inplace_buffer_bytes:
                            rebuilds[(cname, instr.name)] = ck[1]
                            rebuild_rows[k] = ck[1]
                    else:
                        copy_rows.append((k, ck, 0))
            elif t.inplace_buffer_bytes and r.instr.opcode == "fusion":
                inplace.add((r.computation, r.instr.name))
            if r.collective is not None:
                collective_rows.append((k, r))
            if r.unmodeled:
                unmodeled = True
        self.rows = rows
        self.inplace_fusions = inplace
        self.any_unmodeled = unmodeled
        return active, collective_rows, kcause, copy_rows, inplace, rebuilds

    def _entry_leaves(self) -> None:
        """The buffers of the ENTRY parameters' leaves (``param_root``: root -> (number, leaf,
        shape)) and of the result's leaves (``out_root``: root -> (leaf, shape)), and which
        result leaf is aliased to which parameter (``alias_of_out``)."""
        module = self.module
        B = self.buffers
        find = B.find
        parent = B.parent
        entry = module.entry
        ename = entry.name
        # entry parameter leaves
        param_root: dict[tuple, tuple[int, int, object]] = {}
        for p in entry.parameters:
            if p.shape.is_tuple:
                for j, (_idx, leaf) in enumerate(_leaves(p.shape)):
                    param_root.setdefault(find((ename, p.name, j)), (p.parameter_number, j, leaf))
            else:
                key = (ename, p.name, 0)
                param_root.setdefault(find(key) if key in parent else key, (p.parameter_number, 0, p.shape))
        # result leaves
        out_root: dict[tuple, tuple[int, object]] = {}
        rname = entry.root.name
        leaves = _leaf_shapes(entry.root.shape)
        if self.root_tuple_skipped:
            # leaf j of the root tuple is leaf i of its operand o (the union union_all skipped)
            j, n_leaves, eby = 0, len(leaves), entry.by_name
            rshape = entry.root.shape
            # the operands' leaf counts from the root's own shape (hlo/validate.py: a tuple's
            # shape is the tuple of its operands' shapes), without a lookup per operand
            elems = rshape.tuple_shapes if rshape.is_tuple and len(rshape.tuple_shapes) == len(
                entry.root.operands) else [eby[o].shape for o in entry.root.operands]
            for o, oshape in zip(entry.root.operands, elems):
                n = oshape.num_leaves
                for i in (_ZERO if n == 1 else range(n)):
                    if j >= n_leaves:
                        break
                    key = (ename, o, i)
                    pk = parent.get(key)
                    if pk is not None:
                        key = pk if pk not in parent else find(key)
                    if key not in out_root:
                        out_root[key] = (j, leaves[j])
                    j += 1
            for j in range(j, n_leaves):  # (leaves no operand fills: their own buffers)
                key = (ename, rname, j)
                if key not in out_root:
                    out_root[key] = (j, leaves[j])
        else:
            for j, leaf in enumerate(leaves):
                key = (ename, rname, j)
                pk = parent.get(key)
                if pk is not None:
                    key = pk if pk not in parent else find(key)
                if key not in out_root:
                    out_root[key] = (j, leaf)
        alias_of_out: dict[int, int] = {}
        for pnum, pairs in module.input_output_alias.items():
            for out_idx, _pidx in pairs:
                try:
                    alias_of_out[leaf_position(entry.root.shape, tuple(out_idx))
                                 if entry.root.shape.is_tuple else 0] = pnum
                except (IndexError, AttributeError):
                    continue
        self.param_root, self.out_root, self.alias_of_out = param_root, out_root, alias_of_out

    def _may_update(self, leaf, pnum: int, j: int) -> bool:
        """Result leaf ``j`` (``leaf``) can be an update of ENTRY parameter ``pnum``: an array of
        its dimensions and element type, or a reshape of it (``_reshaped_parameter``); a tuple
        parameter is not told apart (True)."""
        shapes = getattr(self, "_param_shapes", None)
        if shapes is None:
            shapes = self._param_shapes = {p.parameter_number: p.shape for p in self.module.entry.parameters}
        pshape = shapes.get(pnum)
        return (pshape is None or pshape.is_tuple or _same_array(leaf, pshape)
                or _reshaped_parameter(self._result_instr(j), leaf, pshape, self.module))

    def _copied_back(self, j: int, prefetched: dict) -> tuple | None:
        """(parameter root, row number of the copy-start, row number of the prefetch or None)
        when result leaf ``j`` is ``copy-done(copy-start(v))`` of an on-chip buffer ``v`` that is
        a parameter's prefetch (``prefetched``: on-chip root -> parameter root; an in-place
        update of it shares its buffer), else None. The prefetch's row is given where only
        in-place updates lie between it and the copy back, nothing else reading them."""
        instr = self._result_instr(j)
        entry = self.module.entry
        # (through in-place updates of the copy back made in HBM: a window written after it)
        find = self.buffers.find
        for _ in range(64):
            if instr is None or instr.opcode == "copy-done" or not instr.operands:
                break
            if instr.opcode == "dynamic-update-slice":
                instr = entry.by_name.get(instr.operands[0])
            elif (entry.name, instr.name) in self.inplace_fusions:
                mine = find((entry.name, instr.name, 0))
                instr = next((entry.by_name.get(o) for o in instr.operands
                              if find((entry.name, o, 0)) == mine), None)
            else:
                break
        if instr is None or instr.opcode != "copy-done" or not instr.operands:
            return None
        start = entry.by_name.get(instr.operands[0])
        if start is None or start.opcode != "copy-start" or not start.operands:
            return None
        proot = prefetched.get(self.buffers.find((entry.name, start.operands[0], 0)))
        if proot is None:
            return None
        row_of = self._entry_rows()
        k = row_of.get(start.name)
        if k is None:
            return None
        # the prefetch's copy-start when nothing but in-place updates and this copy back use the
        # prefetched value (none of its elements is needed but to be copied back: donated, the
        # update would need no read of them), else None
        by_name = entry.by_name
        node, prev, prefetch = by_name.get(start.operands[0]), start, None
        for _ in range(64):
            if node is None or [u.name for u in entry.users(node.name)] != [prev.name]:
                break
            if node.opcode == "copy-done":
                cs = by_name.get(node.operands[0]) if node.operands else None
                if cs is not None and cs.opcode == "copy-start" \
                        and [u.name for u in entry.users(cs.name)] == [node.name]:
                    prefetch = row_of.get(cs.name)
                break
            if node.opcode != "dynamic-update-slice" and (entry.name, node.name) not in self.inplace_fusions:
                break
            node, prev = by_name.get(node.operands[0]) if node.operands else None, node
        if prefetch is None:
            # (the prefetched buffer itself, updated in place, read on chip, carried through a
            # loop: XLA:TPU keeps a kept cache in VMEM through a fori_loop, then copies it back;
            # what kernels read of it there is the parameter's need, ``carried_need``)
            droot = self.buffers.find((entry.name, start.operands[0], 0))
            pf = self.prefetch_of.get(droot)
            if pf is not None and pf[0] == proot and self._updated_in_place_only(droot, (pf[1], k)):
                prefetch = pf[1]
        return proot, k, prefetch

    def _updated_in_place_only(self, root, exclude) -> bool:
        """Every kernel that writes buffer ``root`` (but the rows of ``exclude``) updates it in
        place (a dynamic-update-slice, or a fusion that writes part of its buffer operand): the
        value it holds at the end is the first one, updated -- not a new one computed every
        iteration of a loop (``h = tanh(h @ W)``)."""
        rows = self.rows
        for k in self._writers().get(root, ()):
            if k in exclude:
                continue
            r = rows[k]
            if r.instr.opcode == "dynamic-update-slice" or r.traffic.inplace_buffer_bytes:
                continue
            return False
        return True

    def _no_need(self) -> set[int]:
        """The rows whose reads need nothing of what they copy: the rows carrying a parameter's
        value into its update (``same_value_rows``) and the copy kernels (not the slice copies,
        whose windows are read); built once, on first use."""
        got = self.__dict__.get("_no_need_rows")
        if got is None:
            got = self._no_need_rows = set(self.same_value_rows)
            got.update(k for k, c in self.kcause.items() if c in _COPY_KINDS and c != "slice_copy"
                       or c in ("not_donated", "donated_but_copied"))
        return got

    def _onchip_readers(self, root, exclude=()) -> dict[int, int]:
        """Row number -> data bytes per run, of the kernels (but the rows of ``exclude``) that
        read buffer ``root`` from on-chip memory (an in-place update writes it without reading
        it)."""
        index = self.__dict__.get("_onchip_read_index")
        if index is None:   # (buffer root -> {row: bytes}, every on-chip read once: built on first use)
            index = self._onchip_read_index = {}
            find = self.buffers.find
            computations = self.module.computations
            for k, r in enumerate(self.rows):
                for a in r.traffic.reads:
                    if a.memory_space in ON_CHIP_MEMORY_SPACES and a.operand is not None:
                        comp = computations[r.computation]
                        oname = r.instr.operands[a.operand]
                        pos = 0
                        if a.index:
                            shape = comp.by_name[oname].shape
                            if shape.is_tuple:
                                pos = leaf_position(shape, a.index)
                        lg = a.logical_nbytes if a.logical_nbytes is not None else a.nbytes
                        got = index.setdefault(find((r.computation, oname, pos)), {})
                        got[k] = got.get(k, 0) + lg * r.multiplicity.count
        return {k: b for k, b in index.get(root, {}).items() if k not in exclude}

    def _rebuilt_parameter(self, j: int) -> tuple[tuple, list[int]] | None:
        """(the root of the ENTRY parameter (an array) that result leaf ``j``'s value rebuilds,
        the rows of the copies of it the rebuild starts from): the leaf is a copy or conversion
        (``_copy_source``) of a fusion -- or the fusion itself -- whose root is a
        dynamic-update-slice or scatter of that parameter or of a copy of it (through bitcasts,
        converts, transposes, reshapes and copies); else None."""
        instr = self._result_instr(j)
        if instr is None or instr.opcode not in ("copy", "fusion", "convert"):
            return None
        # (_copy_source reads a row's instruction and computation only: no row lookup)
        got = _copy_source(_EntryRow(instr, self.module.entry.name), self.module)
        if got is None and instr.opcode == "fusion":
            got = (instr, None)   # (the result itself rebuilt: XLA:TPU's kept scatter fusion)
        if got is None or got[0].opcode != "fusion" or not got[0].called_computations:
            return None
        src = got[0]
        fused = self.module.computations.get(src.called_computations[0])
        if fused is None or got[1] is not None:
            return None
        e = _through_permutes(fused.by_name, fused.root)
        if e is not None and e.opcode == "fusion" and e.called_computations and src is instr:
            inner = self.module.computations.get(e.called_computations[0])   # (a nested scatter)
            if inner is not None and inner.root.opcode == "scatter" and e.operands:
                b = fused.by_name.get(e.operands[0])
                e = inner.root if b is not None else None
            else:
                e = None
        else:
            b = fused.by_name.get(e.operands[0]) if e is not None and e.operands else None
        if e is None or e.opcode not in ("dynamic-update-slice", "scatter") or not e.operands \
                or e.opcode == "scatter" and src is not instr:
            return None
        b = _through_permutes(fused.by_name, b)
        if b is None or b.opcode != "parameter" or not 0 <= b.parameter_number < len(src.operands):
            return None
        root = self.buffers.find((self.module.entry.name, src.operands[b.parameter_number], 0))
        node, n, via = root, 0, []   # (or a copy of one: the kept argument copied before the rebuild)
        while node not in self.param_root and node in self.copy_chain and n < 8:
            via.append(self.copy_chain[node][4])
            node, n = self.copy_chain[node][0], n + 1
        return (node, via) if node in self.param_root else None

    def _entry_rows(self) -> dict[str, int]:
        """ENTRY instruction name -> its row number (built once, on first use)."""
        row_of = getattr(self, "_entry_row_of", None)
        if row_of is None:
            name = self.module.entry.name
            row_of = self._entry_row_of = {r.instr.name: k for k, r in enumerate(self.rows)
                                           if r.computation == name}
        return row_of

    def _result_instr(self, j: int):
        """The ENTRY instruction whose value is result leaf ``j`` (the root, or the operand of a
        root tuple of array operands), or None."""
        got = self.__dict__.get("_result_instrs")
        if got is None:   # (once: the root tuple's operands, when each is one leaf)
            root, by_name = self.module.entry.root, self.module.entry.by_name
            if root.opcode != "tuple":
                got = [root] if not root.shape.is_tuple else []
            elif len(root.operands) == root.shape.num_leaves:
                got = [by_name.get(o) for o in root.operands]
            else:
                got = []
            self._result_instrs = got
        return got[j] if 0 <= j < len(got) else None

    def _copy_buffers(self, copy_rows, kcause: dict, active: list[int]) -> set:
        """The copy kernels' buffers traced to their origin (``derived``), the results that
        update a parameter (``update_of``), the buffers whose readers read a kernel cause's
        output (``produced_cause``) and those that read a parameter's budget
        (``budget_root``); each copy kernel's cause into ``kcause``. Returns the special buffers
        (parameters, results, copies, updates): those the accounting does not treat as
        intermediates."""
        module, rows = self.module, self.rows
        self.kcause = kcause   # (the same dict, filled below: _no_need reads it)
        B = self.buffers
        find, parent = B.find, B.parent
        param_root, out_root, alias_of_out = self.param_root, self.out_root, self.alias_of_out
        computations = module.computations
        # cause kernels, and copy kernels: derived buffers (origin root, width num, den, kind, row)
        derived: dict[tuple, tuple] = {}
        copies: dict[tuple, tuple] = {}   # copy kernels' buffers: (source root, num, den, kind, row, sliced)
        onchip_dst: list[tuple] = []      # those in on-chip memory
        # a parameter prefetched into on-chip memory (XLA:TPU's copy-start / done, its
        # cross-program prefetch): on-chip root -> (parameter root, the copy-start's row). A copy
        # of it read there is a copy of the parameter (the prefetch moves it, changes nothing)
        prefetch_of: dict[tuple, tuple] = {}
        self.eviction_of: dict[int, int] = {}   # copy-back row -> the row of the copy into VMEM
        self.copy_chain = copies   # (a copy kernel's buffer -> (its source's root, ..., row))
        evictions = []   # copy-starts out of on-chip memory back to HBM
        for k in self.copy_starts:
            r = rows[k]
            instr = r.instr
            shape = instr.shape
            if instr.operands and shape.is_tuple and shape.tuple_shapes \
                    and shape.tuple_shapes[0].memory_space in ON_CHIP_MEMORY_SPACES:
                sroot = find((r.computation, instr.operands[0], 0))
                if sroot in param_root:
                    prefetch_of[find((r.computation, instr.name, 0))] = (sroot, k)
            elif instr.operands and shape.is_tuple and shape.tuple_shapes and shape.tuple_shapes[0].is_array:
                src = computations[r.computation].by_name.get(instr.operands[0])
                if src is not None and src.shape.is_array and src.shape.memory_space in ON_CHIP_MEMORY_SPACES \
                        and src.shape.dims == shape.tuple_shapes[0].dims:
                    evictions.append((k, find((r.computation, instr.operands[0], 0)),
                                      find((r.computation, instr.name, 0)), shape.tuple_shapes[0], src.shape))
        prefetched = {droot: sroot for droot, (sroot, _k) in prefetch_of.items()}
        self.prefetch_of = prefetch_of
        in_order: set[int] = set()   # copy kernels that keep their source's element order
        self.self_copies = self_copies = []   # copy kernels into their own source's buffer
        cname = None
        for k, (kind, src_k, sliced), pos in copy_rows:
            r = rows[k]
            instr = r.instr
            if r.computation is not cname:  # (rows come computation by computation)
                cname = r.computation
                comp = computations[cname]
            src = comp.by_name[instr.operands[src_k]]
            sroot = (cname, src.name, 0)
            p = parent.get(sroot)
            if p is not None:
                sroot = p if p not in parent else find(sroot)
            if prefetched:
                sroot = prefetched.get(sroot, sroot)
            droot = (cname, instr.name, pos)
            p = parent.get(droot)
            if p is not None:
                droot = p if p not in parent else find(droot)
            if droot == sroot:
                # a copy into the buffer it copies (XLA:CPU copies a loop's state in the body
                # before a fusion rebuilds it, which then writes the state's buffer): no
                # copy of another buffer -- it must not hide the state's own origin
                self_copies.append(k)
                continue
            if droot in param_root:
                continue  # writes into a parameter's own buffer: not a copy of it
            dshape = instr.shape if not instr.shape.is_tuple else _leaf_shapes(instr.shape)[pos]
            prev = copies.get(droot)
            if prev is not None and sroot not in param_root and (prev[0] in param_root or prev[0] in copies):
                # (two copy kernels write one buffer -- a loop's state copied in from x, then
                # converted back into it every iteration: the copy from x is its origin)
                continue
            copies[droot] = (sroot, dshape.element_bits, src.shape.element_bits, kind, k, sliced)
            if kind == "layout_change" and instr.opcode == "copy" and _same_layout(src.shape, dshape):
                in_order.add(k)   # (no relayout: a buffer copied as it is)
            if dshape.memory_space in ON_CHIP_MEMORY_SPACES:
                onchip_dst.append(droot)
        # XLA:TPU's copy-start of a parameter's plain copy in VMEM back to HBM (kept x copied
        # into VMEM and back, then updated in HBM): a copy kernel of that copy
        for k, sroot, droot, dshape, sshape in evictions:
            if sroot in copies and copies[sroot][0] in param_root and copies[sroot][3] == "layout_change" \
                    and not copies[sroot][5] and droot not in copies and droot not in param_root:
                copies[droot] = (sroot, dshape.element_bits, sshape.element_bits, "layout_change", k, False)
                self.eviction_of[k] = copies[sroot][4]   # (the copy into VMEM it copies back)
        # chains of copies lead to their origin (in any row order: a layout copy before a loop,
        # a slice of it inside); a window copied out of an intermediate is no copy kernel (the
        # intermediate's own rules decide), one of a parameter or of a copy of one is
        for droot in copies:
            got = resolve_copy(droot, copies, param_root)
            if got is not None:
                derived[droot] = got
                kcause[got[4]] = got[3]
        # The results that update a parameter. An update has the parameter's dimensions and
        # element type (it could take its buffer); a slice, transpose or conversion of it is a
        # new value, written once (compulsory). A parameter has at most one update: its own
        # buffer returned (or written in place), else the result XLA aliased to it, else one
        # written into a copy of it (an update before the parameter's value returned as such);
        # another result holding its value is a new value, written once (``(x, x)`` needs two
        # buffers however donated). A copy of the parameter into its update: not donated
        cands = []   # (preference, result order, result root, parameter number, its leaf, how)
        # (the result leaves _rebuilt_parameter may take: a copy, conversion or fusion)
        eroot = module.entry.root
        if eroot.opcode == "tuple":
            eby = module.entry.by_name
            rebuilt_leaves = {j for j, o in enumerate(eroot.operands)
                              if eby[o].opcode in ("copy", "fusion", "convert")}
        else:
            rebuilt_leaves = {0} if eroot.opcode in ("copy", "fusion", "convert") else set()
        copied_back: dict[tuple, tuple] = {}   # result root -> (parameter root, copy-back row)
        rebuilt_via: dict[tuple, list[int]] = {}   # result root -> the copies its rebuild starts from
        for order, (oroot, (j, leaf)) in enumerate(out_root.items()):
            if oroot in param_root:
                pr = param_root[oroot]
                cands.append((0, order, oroot, pr[0], pr[1], "own"))
            elif oroot in derived and derived[oroot][0] in param_root \
                    and (_same_array(leaf, param_root[derived[oroot][0]][2])
                         or _reshaped_parameter(self._result_instr(j), leaf, param_root[derived[oroot][0]][2],
                                                module)
                         or derived[oroot][4] in in_order   # (one copy of it that keeps the order)
                         and copies.get(oroot, (None,))[0] == derived[oroot][0]
                         and _reshaped_buffer(leaf, param_root[derived[oroot][0]][2])):
                pr = param_root[derived[oroot][0]]
                same = _value_chain(self._result_instr(j), module) is not None
                cands.append((3 if same else 2, order, oroot, pr[0], pr[1], "copy"))
            elif j in alias_of_out and self._may_update(leaf, alias_of_out[j], j):
                # (XLA aliases a donated buffer to a result of its byte size whatever its
                # shape: a transpose written into it is a new value, not an update; the leaf
                # of a tuple parameter it aliases is not told apart: a key of its own)
                cands.append((1, order, oroot, alias_of_out[j], ("result", order), "alias"))
            elif j in rebuilt_leaves and (rp := self._rebuilt_parameter(j)) is not None \
                    and _same_array(leaf, param_root[rp[0]][2]):
                # a copy or conversion of a fusion that rebuilds a parameter around its update
                # (XLA:CPU updates a kept bf16 cache in f32, then converts it): its update
                pr = param_root[rp[0]]
                rebuilt_via[oroot] = rp[1]
                cands.append((2, order, oroot, pr[0], pr[1], "rebuilt"))
            elif prefetched and leaf.is_array:
                # XLA:TPU's kept update: the parameter prefetched into VMEM, updated there in
                # place, and copied back to HBM into a result buffer of its own
                back = self._copied_back(j, prefetched)
                if back is not None and _same_array(leaf, param_root[back[0]][2]):
                    pr = param_root[back[0]]
                    copied_back[oroot] = back
                    cands.append((2, order, oroot, pr[0], pr[1], "back"))
        chosen: dict[tuple, tuple] = {}   # (parameter number, leaf) -> its update
        # (of several copies that could be a kept parameter's update, the result jax would
        # give its buffer if donated: ``return x, x.at[i].set(v)`` pairs x with x itself)
        pairing = {}
        if sum(1 for c in cands if c[0] >= 2) > 1:
            pairing = {c[3]: self._jax_pairing(c[3]) for c in cands if c[0] >= 2}

        def rank(c):
            if c[0] >= 2 and pairing.get(c[3]) is not None and out_root[c[2]][0] == pairing[c[3]]:
                return (1.5, c[1])
            return (c[0], c[1])
        for c in sorted(cands, key=rank):
            chosen.setdefault((c[3], c[4]), c)
        update_of: dict[tuple, int] = {}
        back_origin: dict[int, tuple] = {}   # copy-back row -> the parameter's buffer
        carried: set[int] = set()   # prefetches that only carry the value to its copy back
        self.carried_need: dict[tuple, int] = {}   # parameter root -> bytes its carrying copies are read on chip
        for _pref, _order, oroot, pnum, pleaf, how in cands:
            if chosen[(pnum, pleaf)][2] != oroot:
                continue
            update_of[oroot] = pnum
            if how == "copy":
                leaf = out_root[oroot][1]
                if self._read_beside_copy(derived[oroot][0], derived[oroot][4]) \
                        or self._from_onchip(derived[oroot][4]) \
                        and self._read_beside_copy(derived[oroot][0], self._first_copy(oroot)):
                    # (XLA:TPU: the carry, copied from x into VMEM, read beside x, is copied
                    # back to HBM donated or not)
                    # the parameter is read beside its copy (a loop reading x in every
                    # iteration while its carry, copied from x, is updated): the copy is needed
                    # however donated -- XLA's copy insertion, not a donation's
                    if derived[oroot][3] == "layout_change" and derived[oroot][4] in in_order:
                        kcause[derived[oroot][4]] = "buffer_copy"
                elif derived[oroot][3] != "dtype_conversion" and (
                        derived[oroot][3] != "layout_change" or _same_order(leaf, param_root[derived[oroot][0]][2])):
                    # (a conversion into the result -- XLA:CPU's f32 copy of a bf16 argument
                    # converted back -- is made donated or not: dtype_conversion)
                    donated = self._argument(pnum)[2]
                    kcause[derived[oroot][4]] = "donated_but_copied" if donated else "not_donated"
                # (else the elements relaid out, which donating would not save: layout_change)
            elif how == "rebuilt":
                # (the kept argument copied before the fusion that rebuilds it: that copy is
                # what donating saves, and it carries x's value only)
                for k_copy in rebuilt_via.get(oroot, ()):
                    if k_copy in in_order and kcause.get(k_copy) in ("layout_change", "buffer_copy"):
                        kcause[k_copy] = "donated_but_copied" if self._argument(pnum)[2] else "not_donated"
                        carried.add(k_copy)
            elif how == "back":
                proot, k_back, k_prefetch = copied_back[oroot]
                kcause[k_back] = "donated_but_copied" if self._argument(pnum)[2] else "not_donated"
                back_origin[k_back] = proot
                if k_prefetch is not None:   # (its read carries x's value into the update only)
                    kcause[k_prefetch] = kcause[k_back]
                    back_origin[k_prefetch] = proot
                    carried.add(k_prefetch)
        for oroot in [o for o in derived if o in out_root and o not in update_of]:
            # a result written by a copy kernel: the result itself, a new value; one made of a
            # parameter reads what it needs of it as any kernel does (compulsory; the copy of
            # an intermediate keeps its kind: the layout copy XLA made of a computed value)
            origin, _n, _d, _kind, k_copy = derived.pop(oroot)
            if origin in param_root and kcause.get(k_copy) in _COPY_KINDS:
                del kcause[k_copy]
        self.copied_in = {}   # (_donation_copies: an intermediate computed only to be copied in)
        donation_copies = self._donation_copies(copies, in_order, kcause) if in_order and alias_of_out else {}
        for k in in_order:   # the other copies that relay nothing out: XLA's copy insertion
            if kcause.get(k) == "layout_change":
                kcause[k] = "buffer_copy"
        if in_order:   # (a copy's buffer keeps its kernel's kind: its other writers and readers')
            for droot, d in derived.items():
                if d[4] in in_order and d[3] != kcause.get(d[4], d[3]):
                    derived[droot] = (*d[:3], kcause[d[4]], *d[4:])
        self.same_value_rows, same_origin = self._same_value_rows(update_of, kcause, derived)
        if carried:
            self.same_value_rows = self.same_value_rows | carried
        # what kernels read on chip of a copy that only carries x into its update (x copied or
        # prefetched into VMEM, updated there or copied back): the old row an x.at[i].add reads
        # there is x's need, that copy's to read (the other rows carrying x excluded)
        # copies of a parameter into on-chip memory (XLA:TPU's layout copy of a table into VMEM):
        # their readers' on-chip reads say how much of the parameter the program needs (lookups)
        self.onchip_copy = {droot: derived[droot] for droot in onchip_dst
                            if droot in derived and derived[droot][0] in param_root}
        # a prefetch of a parameter into on-chip memory (a table, a cache): its copy-done's
        # readers are the copy's
        for droot, (sroot, k) in prefetch_of.items():
            self.onchip_copy[droot] = (sroot, 1, 1, None, k)
        self.onchip_copy_row = {d[4]: droot for droot, d in self.onchip_copy.items()}  # row -> its copy
        self.derived, self.kcause, self.update_of = derived, kcause, update_of
        self.update_root = {pnum: oroot for oroot, pnum in update_of.items()}
        self.onchip_update = self._onchip_updates([rows[k] for k in active] if self.update_of else ())
        self.copy_origin = {v[4]: v[0] for v in derived.values()}
        self.copy_origin.update(donation_copies)
        for k, origin in (*same_origin.items(), *back_origin.items()):
            self.copy_origin.setdefault(k, origin)
        # (summed per parameter over its chain of such copies: XLA:TPU prefetches a kept
        # cache into VMEM, relays it out there for attention, and copies it back; attention's
        # reads of the relaid copy are the prefetch's to claim)
        for k in self.same_value_rows:
            instr = rows[k].instr
            shape = instr.shape.tuple_shapes[0] if instr.opcode == "copy-start" and instr.shape.is_tuple \
                and instr.shape.tuple_shapes else instr.shape
            origin = self.copy_origin.get(k)
            if origin is not None and shape.is_array and shape.memory_space in ON_CHIP_MEMORY_SPACES:
                need = sum(self._onchip_readers(find((rows[k].computation, instr.name, 0)),
                                                exclude=self._no_need()).values())
                if need:
                    self.carried_need[origin] = self.carried_need.get(origin, 0) + need
        self._returned_as_is(kcause, derived, update_of)
        # what a kernel of a reads_compulsory cause writes exists only to be read back (split-K
        # partial sums to be reduced, a concatenation of weights): reading it is that cause's too
        produced_cause: dict[tuple, str] = {}
        for k, c in kcause.items():
            if c not in READS_COMPULSORY:
                continue
            r = rows[k]
            for j in range(r.instr.shape.num_leaves):
                produced_cause.setdefault(B.find((r.computation, r.instr.name, j)), c)
        self.produced_cause = produced_cause
        special = set(param_root)
        special.update(out_root)
        special.update(derived)
        special.update(update_of)
        # a result that updates a parameter in a buffer of its own (XLA:CPU rebuilds a donated
        # cache: dynamic-update-slice in a fusion that writes it whole): reading it back reads
        # the parameter (and its update), so it draws on the parameter's read budget
        budget_root = {}
        own_buffer = [(oroot, pnum) for oroot, pnum in update_of.items() if oroot not in param_root]
        if own_buffer:  # (most programs update in place, or update nothing)
            leaf_root = {(pnum, j): proot for proot, (pnum, j, _leaf) in param_root.items()}
            budget_root = {oroot: leaf_root[(pnum, 0)] for oroot, pnum in own_buffer
                           if (pnum, 0) in leaf_root}
        self.budget_root = budget_root
        return special

    def _returned_as_is(self, kcause: dict, derived: dict, update_of: dict) -> None:
        """A parameter whose old value a result also holds (returned as it came, or a copy of
        it returned, beside its update: ``return x.at[i].set(v), x``) must keep that value
        however donated: XLA copies it, donated or not, so its copies are ``buffer_copy`` (a
        value returned twice), neither ``not_donated`` nor ``donated_but_copied``."""
        param_root, out_root = self.param_root, self.out_root
        if not update_of:
            return
        kept: set[int] = set()   # parameters (numbers) whose old value is a result too
        for oroot, (j, leaf) in out_root.items():
            if oroot in update_of:
                continue
            if oroot in param_root:
                pnum = param_root[oroot][0]
            else:
                node, n = oroot, 0   # (a chain of copies of it, nothing else writing them)
                while node in self.copy_chain and n < 64 and not self.new_values_in(node):
                    node, n = self.copy_chain[node][0], n + 1
                if not n or node not in param_root or not _same_array(leaf, param_root[node][2]):
                    continue   # (a window or a conversion of it is a new value, not its old one)
                pnum = param_root[node][0]
            # (unless jax would give x's buffer to that result: then donating x saves the copy
            # -- ``return x, x.at[i].set(v)`` -- and its copies are the donation's)
            if self._jax_pairing(pnum) != j:
                kept.add(pnum)
        if not kept:
            return
        # (and updated: a result with new values in it; ``(x, x)`` returns two copies of x,
        # and donating x saves one)
        kept &= {pnum for uroot, pnum in update_of.items()
                 if uroot not in param_root and self.new_values_in(uroot)}
        for k, c in list(kcause.items()):
            if c not in ("not_donated", "donated_but_copied"):
                continue
            origin = self.copy_origin.get(k)
            if origin in param_root and param_root[origin][0] in kept:
                kcause[k] = "buffer_copy"
        for droot, d in derived.items():
            if kcause.get(d[4]) == "buffer_copy" and d[3] != "buffer_copy":
                derived[droot] = (*d[:3], "buffer_copy", *d[4:])

    def new_values_in(self, root) -> bool:
        """Some kernel other than the copy kernel that made buffer ``root`` (``copy_chain``)
        writes it."""
        d = self.copy_chain.get(root)
        k_copy = d[4] if d is not None else None
        return any(k != k_copy for k in self._writers().get(root, ()))

    def _writers(self) -> dict[tuple, list[int]]:
        """Buffer root -> the rows that write it (each write's leaf; built once, on first use)."""
        got = self.__dict__.get("_writer_index")
        if got is None:
            got = self._writer_index = {}
            find, computations = self.buffers.find, self.module.computations
            for k, r in enumerate(self.rows):
                if not r.traffic.writes:
                    continue
                instr = r.instr
                for a in r.traffic.writes:
                    wkey = write_key(instr, computations[r.computation], a.index)[0] if a.index \
                        else (r.computation, instr.name, 0)
                    rows_of = got.setdefault(find(wkey), [])
                    if not rows_of or rows_of[-1] != k:
                        rows_of.append(k)
        return got

    def _donation_copies(self, copies: dict, in_order: set, kcause: dict) -> dict[int, tuple]:
        """The copy kernels a donation makes (their cause set to ``donated_but_copied`` in
        ``kcause``): row -> the donated parameter's buffer. A copy that keeps its source's
        element order (the same layout and memory: no relayout, so not ``layout_change``) of a
        donated parameter whose buffer a result takes, or into such a result: XLA's copy
        insertion. jax pairs each donated argument with the first unpaired result of its shape
        and dtype, in output order (``input_output_alias``); where the program still reads the
        argument after that result is written -- the result is not the argument's update, as in
        ``f(x, y) -> (y + 1, x * 2)`` with ``x`` donated -- XLA copies the old value out first,
        and writes the result elsewhere and copies it in: without the donation, neither copy."""
        param_root, out_root, alias_of_out = self.param_root, self.out_root, self.alias_of_out
        taken = set(alias_of_out.values())   # donated parameters a result's buffer takes
        leaf0 = {pr[0]: proot for proot, pr in param_root.items() if pr[1] == 0}
        out: dict[int, tuple] = {}
        for droot, (sroot, _num, _den, _kind, k, _sliced) in copies.items():
            if k not in in_order or kcause.get(k) != "layout_change":
                continue
            into = False
            if sroot in param_root and param_root[sroot][0] in taken:
                if self._read_beside_copy(sroot, k):
                    continue   # (needed however donated: buffer_copy)
                pnum = param_root[sroot][0]   # the old value copied out of the buffer
            elif droot in out_root and out_root[droot][0] in alias_of_out:
                pnum, into = alias_of_out[out_root[droot][0]], True   # a value copied into the buffer
            else:
                continue
            if not self._argument(pnum)[2] or pnum not in leaf0:
                continue
            kcause[k] = "donated_but_copied"
            out[k] = leaf0[pnum]
            if into and sroot not in param_root and sroot[2] == 0:
                # the value was computed into a buffer of its own only to be copied in (its
                # one reader this copy): that buffer's write is the donation's too
                r = self.rows[k]
                comp = self.module.computations[r.computation]
                if [u.name for u in comp.users(sroot[1])] == [r.instr.name] and sroot[0] == r.computation:
                    self.copied_in[sroot] = self._param_subject(pnum)
        return out

    def _from_onchip(self, k: int) -> bool:
        """Row ``k`` (a copy kernel) copies a value out of on-chip memory."""
        r = self.rows[k]
        comp = self.module.computations[r.computation]
        src = comp.by_name.get(r.instr.operands[0]) if r.instr.operands else None
        return src is not None and src.shape.is_array and src.shape.memory_space in ON_CHIP_MEMORY_SPACES

    def _first_copy(self, root) -> int | None:
        """The row of the first copy kernel in the chain of copies ``root`` is made by
        (``copy_chain``: the one that reads its origin), or None."""
        chain, k, n = self.copy_chain, None, 0
        while root in chain and n < 64:
            root, k, n = chain[root][0], chain[root][4], n + 1
        return k

    def _read_beside_copy(self, proot, k: int | None) -> bool:
        """ENTRY parameter root ``proot``, which the copy kernel of row ``k`` copies (through
        bitcasts), is also passed into a while loop itself (beside the carry copied from it, as
        ``fori_loop(0, n, lambda i, c: f(c) + x, x)``): live all through the loop while the copy
        is updated, so no donation removes the copy."""
        pr = self.param_root.get(proot)
        if k is None:
            return False
        r = self.rows[k]
        entry = self.module.entry
        if pr is None or r.computation != entry.name:
            return False
        p = next((i for i in entry.parameters if i.parameter_number == pr[0]), None)
        if p is None:
            return False
        todo, seen = [p], set()
        other = reached = False
        while todo:
            node = todo.pop()
            for u in entry.users(node.name):
                if u.name in seen:
                    continue
                seen.add(u.name)
                if u is r.instr:
                    reached = True
                elif u.opcode in ("bitcast", "copy-start", "copy-done"):
                    todo.append(u)   # (XLA:TPU's prefetch of x into VMEM carries x)
                elif u.opcode == "while" or u.opcode == "tuple" and any(
                        w.opcode == "while" for w in entry.users(u.name)):
                    other = True   # (passed into a loop: live all through it)
        return reached and other   # (a copy of another value made of it: not this rule's)

    def _same_value_rows(self, update_of: dict, kcause: dict, derived: dict) -> tuple[frozenset, dict]:
        """The rows that only carry a parameter's own value into a result leaf that updates
        it (``_value_chain``: a copy of ``x`` returned without donation, XLA:TPU's reshape of a
        donated ``x`` into its tiles, its prefetch into VMEM before): no computation needs
        what they read, so they draw nothing of the parameter's compulsory read budget
        (returned donated, the program moves nothing on XLA:CPU / GPU); and the copy kernel
        of a parameter into the buffer of its update (kept, ``x.at[i].set(v)`` copies ``x``
        first): donated, the update needs none of ``x``'s other elements read. Each such row
        without a cause of its own takes that of the chain's kernel nearest the result.
        Returns (those rows, row -> the parameter's buffer)."""
        module = self.module
        entry = module.entry
        chains = []
        copies = {}   # the copy kernel of a parameter into its update's buffer -> the parameter
        for oroot, pnum in update_of.items():
            d = derived.get(oroot)
            if d is not None and d[0] in self.param_root and (
                    kcause.get(d[4]) in ("not_donated", "donated_but_copied")
                    or kcause.get(d[4]) == "dtype_conversion"   # (XLA:CPU's f32 copy converted back)
                    and self.rows[d[4]].instr.shape.is_array
                    and self.rows[d[4]].instr.shape.dims == self.param_root[d[0]][2].dims):
                copies[d[4]] = d[0]
                # (and the copies before it in the chain: x copied out of a buffer a result
                # takes, updated in place, copied into the result that updates it)
                node, n = self.copy_chain[oroot][0] if oroot in self.copy_chain else None, 0
                while node in self.copy_chain and n < 64:
                    k_prev = self.copy_chain[node][4]
                    kp = kcause.get(k_prev)
                    if self._read_beside_copy(d[0], k_prev):
                        break   # (a loop's carry copied from x, x live beside it: no donation's)
                    if kp == "layout_change" and _moves_only(self.rows[k_prev].instr, module):
                        # (XLA:TPU copies x into VMEM, updates it there, copies it into the
                        # result: the round trip is the copy into the update's buffer)
                        kp = kcause[k_prev] = kcause[d[4]]
                    if kp in ("not_donated", "donated_but_copied") or kp in _COPY_KINDS and kp != "slice_copy" \
                            and self.rows[k_prev].instr.shape.is_array \
                            and self.rows[k_prev].instr.shape.dims == self.param_root[d[0]][2].dims:
                        # (a whole copy, converted or relaid out, carries x into its update too:
                        # XLA:CPU scatters into an f32 copy of a bf16 cache; it keeps its kind)
                        copies[k_prev] = d[0]
                        # (a copy of x's prefetch into VMEM: the prefetch carries x too)
                        r_prev = self.rows[k_prev]
                        pf = self.prefetch_of.get(self.buffers.find(
                            (r_prev.computation, r_prev.instr.operands[0], 0))) if r_prev.instr.operands else None
                        if pf is not None and pf[0] == d[0] and kcause.get(pf[1]) in (None, "layout_change"):
                            kcause[pf[1]] = kp
                            copies[pf[1]] = d[0]
                    node, n = self.copy_chain[node][0], n + 1
                k_in = self.eviction_of.get(d[4])
                if k_in is not None and kcause.get(k_in) == "layout_change" \
                        and not self._read_beside_copy(d[0], k_in):
                    # (x copied into VMEM only to be copied back: the round trip is the copy)
                    kcause[k_in] = kcause[d[4]]
                    copies[k_in] = d[0]
            j = self.out_root[oroot][0]
            chain = _value_chain(self._result_instr(j), module)
            if chain is not None and len(chain) > 1 and chain[-1].parameter_number == pnum \
                    and chain[-1].shape.is_array:
                chains.append(chain)
        if not chains and not copies:
            return frozenset(), {}
        row_of = self._entry_rows() if chains else {}
        same, origin = set(copies), dict(copies)
        for chain in chains:
            # (up to the first step whose value other instructions read too: what it reads
            # feeds them, e.g. a prefetch into VMEM that attention reads as well)
            carried = [chain[0]]
            for prev, node in zip(chain, chain[1:-1]):
                if [u.name for u in entry.users(node.name)] != [prev.name]:
                    break
                carried.append(node)
            ks = [row_of[i.name] for i in carried if i.name in row_of]
            cause = next((kcause[k] for k in ks if k in kcause), None)
            proot = self.buffers.find((entry.name, chain[-1].name, 0))
            for k in ks:
                same.add(k)
                origin[k] = proot
                if cause is not None:
                    kcause.setdefault(k, cause)
        return frozenset(same), origin

    def _account(self, active: list[int], collective_rows, special: set) -> None:
        """Every access of every row that moves bytes into the ledger (the module docstring's
        rules), then the reads' budgets settled, tiling re-reads and collectives."""
        module, rows = self.module, self.rows
        B = self.buffers
        find, parent = B.find, B.parent
        param_root, out_root = self.param_root, self.out_root
        derived, kcause, update_of = self.derived, self.kcause, self.update_of
        produced_cause, budget_root = self.produced_cause, self.budget_root
        cap = self.capacity
        ledger = self.ledger
        roles = self.roles
        update_root = self.update_root
        # budget root -> [(prio, units, logical, k, role, phys, root)] in schedule order
        reads: dict[tuple, list] = defaultdict(list)
        # buffer root -> [data bytes written into it, of those granted to reads so far]
        tally: dict[tuple, list[int]] = {}
        # a parameter's buffer or a copy's -> data bytes other kernels (no copy kernels) wrote
        # into it: new values in it (a loop's state, copied in from its initial value or the
        # donated argument itself, updated every iteration)
        self.new_written = new_written = {}
        self.update_counted = {}   # (_special_write: a buffer -> update bytes counted compulsory in it)
        read_units: dict[tuple, int] = {}  # buffer root -> data bytes its readers touch
        update_left: dict[tuple, int] = {}
        tilings = []
        gathered = set()  # buffers all-gathers write: how much of them is read decides their excess
        for _k, r in collective_rows:
            if r.collective.kind == "all-gather":
                for wkey, _leaf in gathered_leaves(r.instr, module.computations[r.computation]):
                    gathered.add(find(wkey))
        reuse_rows = self.reuse.rows if self.reuse is not None else None
        # the kernels with a tiling estimate (none without an on-chip capacity): their re-reads
        tiled = {key for key, ru in reuse_rows.items() if ru.tilings} if reuse_rows is not None else ()
        add = ledger.add
        events = ledger.events  # (ledger.add's events, appended inline below for the common causes)
        spill_r = ledger.codes_for(SPILL, "", HBM_READ)
        spill_w = ledger.codes_for(SPILL, "", HBM_WRITE)
        re_read_r = ledger.codes_for("re_read", "", HBM_READ)
        write_both = ledger.write_both
        computations = module.computations
        no_cause = "materialized_intermediate"
        kernel_write_causes = KERNEL_WRITES  # (causes.py: the kernel causes' writes are theirs)
        onchip_copy = self.onchip_copy
        copied_in = self.copied_in
        onchip_reads: dict[tuple, list] = {}  # on-chip copy root -> [(row, operand, data bytes)]
        kc_of = [None] * len(rows)  # kcause as a list: row number -> cause kind or None
        fill_rows: dict[int, bool] = {}   # row -> it writes a constant fill (_fill_row), asked once
        for k, c in kcause.items():
            kc_of[k] = c
        cname = None
        for k in active:
            r = rows[k]
            t = r.traffic
            t_reads, t_writes = t.reads, t.writes
            instr = r.instr
            if r.computation is not cname:  # (rows come computation by computation)
                cname = r.computation
                comp = computations[cname]
                by_name = comp.by_name
                count = r.multiplicity.count  # (one Multiplicity per computation)
                # a leaf-0 value read or written in this computation: name -> (its role, its
                # buffer's root, whether that buffer is special), resolved at its first access
                vinfo: dict[str, tuple] = {}
            operands = instr.operands
            kc = kc_of[k]
            # the cause of the kernel's reads: a split-K gemm, or a dot computed as multiply +
            # reduce, reads its operands as the dot would (compulsory; only its output is excess)
            if kc is None:
                rkc, prio, rsubj = None, 0, ""
            else:
                rkc = None if kc in READS_COMPULSORY else kc
                prio = 0 if rkc is None else READ_PRIORITY[rkc]
                # (a donation's copy reading an intermediate: about the donated argument)
                rsubj = self._not_donated_subject(k) if rkc in ("not_donated", "donated_but_copied") else ""
            for a in t_reads:
                ms = a.memory_space
                if ms:  # not HBM (0)
                    if ms in ON_CHIP_MEMORY_SPACES:
                        if onchip_copy and a.operand is not None and not a.index:
                            oroot = find((cname, operands[a.operand], 0))
                            if oroot in onchip_copy:
                                lg = a.logical_nbytes if a.logical_nbytes is not None else a.nbytes
                                onchip_reads.setdefault(oroot, []).append((k, a.operand, lg * count))
                        if gathered and a.operand is not None:
                            # an all-gather's result read from VMEM (XLA:TPU gathers a weight
                            # into it): how much of it is read still decides its excess
                            oname = operands[a.operand]
                            leaf = by_name[oname].shape
                            pos = 0
                            if a.index and leaf.is_tuple:
                                pos = leaf_position(leaf, a.index)
                                leaf = leaf.subshape(a.index)
                            groot = find((cname, oname, pos))
                            if groot in gathered:
                                lg = a.logical_nbytes if a.logical_nbytes is not None else _logical(a, leaf)
                                read_units[groot] = read_units.get(groot, 0) + min(
                                    lg * count, leaf.logical_byte_size * count)
                        continue
                    if ms == HOST_MEMORY_SPACE:
                        phys = a.nbytes * count
                        add(None, "host_to_device", phys, phys if rkc is None else 0, phys,
                            rkc or "host_round_trip", rsubj, k)
                        continue
                if a.operand is None:  # a constant inside a fusion (traffic.py): read once is needed
                    phys = a.nbytes * count
                    lg = a.logical_nbytes if a.logical_nbytes is not None else a.nbytes
                    add("activations", HBM_READ, phys, lg if rkc is None else 0, lg * count,
                        rkc or "re_read", rsubj, k)
                    continue
                oname = operands[a.operand]
                # the leaf's shape only where a rule asks (a tuple index, no logical size, an
                # all-gather's buffer, an on-chip capacity): reading it touches the operand
                idx = a.index
                if idx:
                    leaf = by_name[oname].shape
                    if leaf.is_tuple:
                        pos = leaf_position(leaf, idx)
                        leaf = leaf.subshape(idx)
                        rl = roles[(cname, oname)]
                        role = rl[pos] if pos < len(rl) else rl[0]
                        root = (cname, oname, pos)
                    else:
                        role = roles[(cname, oname)][0]
                        root = (cname, oname, 0)
                    p = parent.get(root)
                    if p is not None:
                        root = p if p not in parent else find(root)
                    is_special = root in special
                    wt = None
                else:
                    leaf = None
                    v = vinfo.get(oname)
                    if v is None:
                        root = (cname, oname, 0)
                        p = parent.get(root)
                        if p is not None:
                            root = p if p not in parent else find(root)
                        v = vinfo[oname] = (roles[(cname, oname)][0], root, root in special, None)
                    role, root, is_special, wt = v
                phys = a.nbytes * count
                lg = a.logical_nbytes
                if lg is None:
                    if leaf is None:
                        leaf = by_name[oname].shape
                    lg = _logical(a, leaf)
                logical = lg * count
                if gathered and root in gathered:
                    if leaf is None:
                        leaf = by_name[oname].shape
                    read_units[root] = read_units.get(root, 0) + min(logical, leaf.logical_byte_size * count)
                if not is_special:
                    if cap is not None and (leaf if leaf is not None else by_name[oname].shape).logical_byte_size <= cap:
                        # an intermediate that fits on chip: reading it back is excess
                        add(role, HBM_READ, phys, 0, logical,
                            rkc if rkc is not None else produced_cause.get(root, no_cause), rsubj, k)
                        continue
                    if prio == 0 and (not produced_cause or root not in produced_cause):
                        if wt is None:  # (vinfo holds the tally of a value written before)
                            wt = tally.get(root)
                        if wt is not None:  # a spilled intermediate already written: read it back once
                            g = wt[1]
                            give = wt[0] - g
                            if logical < give:
                                give = logical  # (min(logical, written - granted))
                            if give > 0:
                                wt[1] = g + give
                            else:
                                give = 0
                            # read back once: the spill's (excess, as its write); beyond: re_read
                            # (the tile padding goes with the first part charged)
                            pad = phys - logical
                            if give:  # (a kernel cause of the reader's own names it, as where it fits)
                                if rkc is None:
                                    events += (k, spill_r[role], give + pad, 0, give)
                                else:
                                    add(role, HBM_READ, give + pad, 0, give, rkc, rsubj, k)
                                pad = 0
                            if logical > give:
                                events += (k, re_read_r[role], logical - give + pad, 0, logical - give)
                            continue
                    reads[root].append((prio, logical, logical, k, role, phys, root))
                elif root in derived:  # (derived buffers are special)
                    broot, num, den = derived[root][0], derived[root][1], derived[root][2]
                    units = logical * den // num if num else logical
                    reads[budget_root.get(broot, broot) if budget_root else broot].append(
                        (prio, units, logical, k, role, phys, root))
                else:
                    reads[budget_root.get(root, root) if budget_root else root].append(
                        (prio, logical, logical, k, role, phys, root))
            if t_writes:
                out_roles = roles[(cname, instr.name)]
                shape = instr.shape
                start = instr.opcode in NATIVE_STARTS
                elements = None  # (the tuple elements, read at the first write with an index)
                iname = instr.name
            for a in t_writes:
                ms = a.memory_space
                if ms:  # not HBM (0)
                    if ms in ON_CHIP_MEMORY_SPACES:
                        continue
                    if ms == HOST_MEMORY_SPACE:
                        phys = a.nbytes * count
                        add(None, "device_to_host", phys, phys if kc is None else 0, phys,
                            kc or "host_round_trip", "", k)
                        continue
                idx = a.index
                if start or idx:
                    if elements is None:
                        elements = shape.tuple_shapes if shape.is_tuple else ()  # (non-tuple: _write_key)
                        n_elements = len(elements)
                        n_roles = len(out_roles) if out_roles else 0
                    if not start and len(idx) == 1 and 0 <= idx[0] < n_elements:
                        # one element of a tuple result (``_write_key``'s answer, without the call)
                        e = idx[0]
                        pos = shape.leaf_offsets[e]
                        wkey, leaf = (cname, iname, pos), elements[e]
                        role = out_roles[pos] if pos < n_roles else "activations"
                    else:
                        wkey, leaf = write_key(instr, comp, idx)
                        rl = roles.get((wkey[0], wkey[1]))
                        role = rl[wkey[2]] if rl and wkey[2] < len(rl) else "activations"
                    p = parent.get(wkey)
                    root = wkey if p is None else p if p not in parent else find(wkey)
                    is_special = root in special
                else:
                    wkey, leaf = (cname, iname, 0), shape
                    role = out_roles[0]
                    p = parent.get(wkey)
                    root = wkey if p is None else p if p not in parent else find(wkey)
                    is_special = root in special
                phys = a.nbytes * count
                lg = a.logical_nbytes
                logical = (lg if lg is not None else _logical(a, leaf)) * count
                wt = tally.get(root)
                if wt is None:
                    wt = tally[root] = [logical, 0]
                else:
                    wt[0] += logical
                if not (start or idx):  # (for its readers: its buffer's tally too)
                    vinfo[iname] = (role, root, is_special, wt)
                if not is_special:  # an intermediate
                    if copied_in and root in copied_in:   # (computed only to be copied in)
                        add(role, HBM_WRITE, phys, 0, logical, "donated_but_copied", copied_in[root], k)
                    elif kc is not None and kc in kernel_write_causes:
                        add(role, HBM_WRITE, phys, 0, logical, kc, "", k)
                    elif cap is not None and (leaf.logical_byte_size if leaf is not None else logical) <= cap:
                        add(role, HBM_WRITE, phys, 0, logical, no_cause, "", k)
                    else:  # too large for on chip (or no capacity known): a spill, excess all the same
                        events += (k, spill_w[role], phys, 0, logical)
                    continue
                # (wt[0] - logical: the data bytes written into the buffer before this write)
                if kc is None and (root in param_root or root in derived and k != derived[root][4]):
                    new_written[root] = new_written.get(root, 0) + logical
                o = out_root.get(root) if kc is None else None
                if o is not None and root not in update_of:
                    # a result leaf that updates no parameter (_special_write's rule, inline):
                    # its data bytes are written once
                    if wt[0] == logical and (fill_rows[k] if k in fill_rows else fill_rows.setdefault(
                            k, self._fill_row(r))) and root in self._overwritten_fill_roots() \
                            and self._overwritten_whole(root, k, o[1].logical_byte_size):
                        # (a constant fill the loop then overwrites in place -- a scan's ys
                        # initialised to zeros: no data of the result's; the writes after it are)
                        add(role, HBM_WRITE, phys, 0, logical, "overwritten_fill", "", k)
                        wt[0] = 0
                        continue
                    left = o[1].logical_byte_size - (wt[0] - logical)
                    comp_b = 0 if left <= 0 else logical if logical < left else left
                    if comp_b == logical == phys:
                        write_both[role] += phys
                    else:   # (a result rebuilt around each window, or copied whole from a buffer
                        # updated in place, in every run of a loop, rewrites the rest: a scan's ys
                        # stack on XLA:CPU in bf16 and on XLA:TPU through VMEM)
                        # (or patched in place after a copy wrote it whole: return x, x.at[i].set(v)
                        # kept, the copy of x into the second result, then the row)
                        add(role, HBM_WRITE, phys, comp_b, logical,
                            "whole_rewrite" if k in self.rebuild_rows or self._rewrites_stack(r)
                            or t.inplace_buffer_bytes or instr.opcode == "dynamic-update-slice" else UNATTRIBUTED,
                            "", k)
                    continue
                if o is None and kc is not None and wt[0] == logical and root in out_root \
                        and root not in update_of and (fill_rows[k] if k in fill_rows else fill_rows.setdefault(
                            k, self._fill_row(r))) and root in self._overwritten_fill_roots() \
                        and self._overwritten_whole(root, k, out_root[root][1].logical_byte_size):
                    # (a copy of a fill into a result the loop overwrites: its own cause's, no
                    # data of the result's)
                    add(role, HBM_WRITE, phys, 0, logical, kc, "", k)
                    wt[0] = 0
                    continue
                d = derived.get(root)
                if d is not None and root not in update_of:
                    # a copy kernel's write into a copy of a parameter or intermediate
                    # (_special_write's last rule, inline) when the program returns no update of
                    # that parameter: no compulsory bytes
                    pr = param_root.get(d[0])
                    if pr is None or not update_root or update_root.get(pr[0]) is None:
                        if kc is None and k != d[4]:
                            # a new value written into the copy's buffer (a loop's state updated
                            # in place): an intermediate, not the copy's
                            add(role, HBM_WRITE, phys, 0, logical, self._intermediate_kind(
                                leaf.logical_byte_size if leaf is not None else logical), "", k)
                            continue
                        kind = kc if kc is not None else d[3]
                        if kind in ("not_donated", "donated_but_copied"):
                            subject = self._not_donated_subject(k)
                        elif kind in PROGRAM_WIDE:
                            subject = ""
                        else:
                            subject = self._param_subject(pr[0]) if pr is not None else ""
                        add(role, HBM_WRITE, phys, 0, logical, kind, subject, k)
                        continue
                self._special_write(root, k, role, phys, logical, r, wt[0] - logical, update_left)
            if tiled and (cname, instr.name) in tiled:
                tilings.append((k, r, reuse_rows[(cname, instr.name)]))
        self.onchip_reads = onchip_reads
        self.settle_reads(reads, tally)
        for k, r, ru in tilings:
            tiling_excess(self, k, r, ru)
        for k, r in collective_rows:
            collective_excess(self, k, r, read_units)

    # -- accesses ------------------------------------------------------------------------

    def _special_write(self, root, k, role, phys, logical, r, before, update_left) -> None:
        """A write into a result, a parameter or a copy of one (see the module docstring) by
        row ``r`` (number ``k``), after ``before`` data bytes were written into it."""
        kc = self.kcause.get(k)
        subject = ""
        if root in self.update_of or (root in self.param_root and root not in self.out_root):
            update = _update_bytes(r, logical, self.module)
            pnum = self.update_of.get(root)
            if pnum is None:
                pnum = self.param_root[root][0]
            left = update_left.get(root)
            if left is None:
                left = self._out_size(root)
            if not update and root in self.onchip_update:
                # a whole write of the result after its updates ran on chip: it carries those
                # made to the on-chip buffers it copies from (not a copy of the unchanged value)
                made = self.onchip_update[root]
                find = self.buffers.find
                for o in dict.fromkeys(r.instr.operands):
                    oroot = find((r.computation, o, 0))
                    update += made.pop(oroot, 0)
                    if made:   # (and those made in buffers that flow into it: a scan's ys stack)
                        for x in self._feeding(oroot) & made.keys():
                            update += made.pop(x)
                update = min(logical, update)
            if not update and _copies_new_values(r, self.module):
                update = logical  # new values computed elsewhere (on chip, transposed), copied here
            if not update:  # a buffer rebuilt around an update elsewhere, copied here: the update
                update = min(logical, _copied_update_bytes(r, self.module))
                if update and r.instr.operands and self.update_counted.get(
                        self.buffers.find((r.computation, r.instr.operands[0], 0)), 0) >= update:
                    update = 0   # (the rebuild wrote it into a buffer counted already: not again)
            comp_b = min(update, left)
            update_left[root] = left - comp_b
            if comp_b:
                self.update_counted[root] = self.update_counted.get(root, 0) + comp_b
            own, subject = "whole_rewrite", self._param_subject(pnum)
            count = r.multiplicity.count
            if update >= logical and count > 1 and logical > comp_b:
                # every element written anew in every run of a loop (a scan's carry): each run's
                # value is an intermediate the next run reads, the last one the update -- no
                # rewrite of unchanged bytes (the unrolled loop's materialized intermediates)
                own, subject = self._intermediate_kind(logical // count), ""
        elif root in self.out_root:  # written once: the first bytes written are compulsory
            left = self.out_root[root][1].logical_byte_size - before
            comp_b = 0 if left <= 0 else min(logical, left)
            if kc is None and comp_b == logical == phys:  # the result written once: compulsory
                self.ledger.write_both[role] += phys
                return
            own = UNATTRIBUTED
        else:  # a copy of a parameter or intermediate
            comp_b, own = 0, self.derived[root][3]
            o = self.derived[root][0]
            subject = self._param_subject(self.param_root[o][0]) if o in self.param_root else ""
            uroot = self.update_root.get(self.param_root[o][0]) if o in self.param_root else None
            if uroot is not None and not self._flows_into(root, uroot):
                uroot = None   # (a copy updated for another reader; the result computes its own)
            update = _update_bytes(r, logical, self.module) if uroot is not None else 0
            num, den = self.derived[root][1], self.derived[root][2]
            if update and num and den and num != den:
                update = update * den // num   # (in the parameter's width: XLA:CPU's f32 copy of bf16)
            if update:
                # an in-place update of a copy of a parameter whose update the program returns
                # (copied into another layout, updated, copied back): the update is compulsory
                left = update_left.get(uroot)
                if left is None:
                    left = self._out_size(uroot)
                comp_b = min(update, left)
                update_left[uroot] = left - comp_b
                if comp_b:   # (a later copy of this buffer into the result carries it: not again)
                    self.update_counted[root] = self.update_counted.get(root, 0) + comp_b
        kind = kc if kc is not None else own
        if kind in ("not_donated", "donated_but_copied"):
            subject = self._not_donated_subject(k)
        elif kind in PROGRAM_WIDE:
            subject = ""
        self.ledger.add(role, HBM_WRITE, phys, comp_b, logical, kind, subject, k)

    def _assembled_in_vmem(self) -> dict[tuple, tuple]:
        """On-chip buffer root -> parameter root, for XLA:TPU's ``ConcatBitcast`` custom calls
        that put a parameter's slices, each prefetched into VMEM by a ``slice-start`` (a cache
        staged per batch row), back together in place: the buffer is the parameter's on-chip
        copy (an update made to it is the parameter's, ``_onchip_updates``)."""
        out: dict[tuple, tuple] = {}
        find, param_root = self.buffers.find, self.param_root
        computations = self.module.computations
        for r in self.rows:
            instr = r.instr
            if instr.opcode != "custom-call" or instr.custom_call_target != "ConcatBitcast" \
                    or not instr.shape.is_array or instr.shape.memory_space not in ON_CHIP_MEMORY_SPACES:
                continue
            by_name = computations[r.computation].by_name
            srcs = set()
            ranges = []
            for o in instr.operands:
                done = by_name.get(o)
                start = by_name.get(done.operands[0]) if done is not None and done.opcode == "slice-done" \
                    and done.operands else None
                if start is None or start.opcode != "slice-start" or not start.operands:
                    srcs = set()
                    break
                srcs.add(find((r.computation, start.operands[0], 0)))
                ranges.append(_slice_ranges(start.attrs.get("slice", "")))
            if len(srcs) == 1 and next(iter(srcs)) in param_root \
                    and _tile_in_order(ranges, param_root[next(iter(srcs))][2]):
                out[find((r.computation, instr.name, 0))] = next(iter(srcs))
        return out

    def _onchip_updates(self, rows) -> dict[tuple, dict[tuple, int]]:
        """Update result root -> {on-chip buffer root: bytes of in-place updates made to it}:
        updates made in on-chip memory to the result or to a copy of its parameter (XLA:TPU: a
        cache copied into VMEM, updated there, and copied back whole): the kernel that writes
        the result to HBM from that buffer carries them, and they are its compulsory part."""
        out: dict[tuple, dict[tuple, int]] = {}
        if not self.update_of:
            return out
        B, module = self.buffers, self.module
        assembled = self._assembled_in_vmem()
        for r in rows:
            t = r.traffic
            if not t.writes:
                continue
            instr = r.instr
            if not any(a.memory_space in ON_CHIP_MEMORY_SPACES for a in t.writes):
                continue
            if not t.inplace_buffer_bytes:
                inner = _inner_update_bytes(instr, module)
                if not inner and not _computes_every_element(instr, module, reductions=True):
                    continue
            else:
                inner = 0
            comp = module.computations[r.computation]
            for a in t.writes:
                if a.memory_space not in ON_CHIP_MEMORY_SPACES:
                    continue
                wkey = write_key(instr, comp, a.index)[0] if a.index else (r.computation, instr.name, 0)
                root = B.find(wkey)
                uroot = root if root in self.update_of else None
                if uroot is None and root in assembled:   # (its slices' parameter, below)
                    uroot = self.update_root.get(self.param_root[assembled[root]][0])
                if uroot is None and (root in self.derived or root in self.onchip_copy):
                    # a copy of the parameter, or its prefetch into on-chip memory (XLA:TPU:
                    # copy-start into VMEM, updated there, or in a layout copy there, and
                    # copied back), or a copy of that prefetch
                    o = self.derived[root][0] if root in self.derived else root
                    if o not in self.param_root and o in self.onchip_copy:
                        o = self.onchip_copy[o][0]
                    elif o not in self.param_root and o in assembled:   # (a copy of such a buffer)
                        o = assembled[o]
                    if o in self.param_root:
                        uroot = self.update_root.get(self.param_root[o][0])
                if uroot is None:
                    continue
                lg = a.logical_nbytes if a.logical_nbytes is not None else a.nbytes
                nbytes = (min(lg, inner) if inner else lg) * r.multiplicity.count
                made = out.setdefault(uroot, {})
                made[root] = made.get(root, 0) + nbytes
        # a result copied from a stack of its parameter's slices, each updated in the kernel
        # that stacks it (XLA:GPU's scan of a decode: dynamic-update-slice(ys, dynamic-update-
        # slice(dynamic-slice(cache, i), k_new), i) in one fusion, the ys copied into the
        # donated cache): the new values stacked are the update the copy carries
        staged = {}
        for oroot, pnum in self.update_of.items():
            c = self.copy_chain.get(oroot)
            if c is not None and c[0] not in self.param_root and c[0] not in self.derived:
                staged[c[0]] = (oroot, pnum)
        if staged:
            row_of = {id(q): kq for kq, q in enumerate(self.rows)}
            for r in rows:
                instr = r.instr
                if instr.opcode != "fusion" or not (r.traffic.inplace_buffer_bytes
                                                    or row_of.get(id(r)) in self.rebuild_rows):
                    continue
                got = _stacked_update(instr, module)
                if got is None:
                    continue
                nbytes, base = got
                root = B.find((r.computation, instr.name, 0))
                broot = B.find((r.computation, base, 0))
                if broot not in self.param_root and broot in self.derived:   # (a copy of it: f32)
                    broot = self.derived[broot][0]
                pr = self.param_root.get(broot)
                if root not in staged or pr is None or pr[0] != staged[root][1]:
                    continue
                logical = sum(a.logical_nbytes if a.logical_nbytes is not None else a.nbytes
                              for a in r.traffic.writes if not a.index)
                made = out.setdefault(staged[root][0], {})
                made[root] = made.get(root, 0) + min(nbytes, logical) * r.multiplicity.count
        return out

    def settle_reads(self, reads: dict, tally: dict) -> None:
        """Grant each buffer's compulsory read budget: kernels that are no copies first, in
        schedule order, then copies, then recomputation; the rest is excess."""
        derived, kcause, ledger = self.derived, self.kcause, self.ledger
        cap = self.capacity
        add, param_root = ledger.add, self.param_root
        read_both, read_compiled, read_compulsory = ledger.read_both, ledger.read_compiled, ledger.read_compulsory
        l_kind = l_subj = l_role = _NONE  # the cause of the last claim charged, and its code
        l_code = None
        code = ledger.code
        events = ledger.events
        same_rows = self.same_value_rows
        onchip_row = self.onchip_copy_row   # (rows copying a parameter into on-chip memory)
        # new values written into a parameter's or a copy's buffer that its readers read back:
        # all of them but the last value of a result (returned, not read again)
        new_left = {root: n - (self._out_size(root) if root in self.out_root else 0)
                    for root, n in self.new_written.items()}
        copy_back: dict[tuple, int] = {}   # a copy's buffer -> bytes of its one read-back left
        rebuild_rows = self.rebuild_rows
        for broot, claims in reads.items():
            if rebuild_rows and broot in param_root:
                claims = self._rewrite_reads(broot, claims)
                if not claims:
                    continue
            if len(claims) == 1:
                c0 = claims[0]
                pr = param_root.get(broot) if not c0[0] and c0[6] is broot \
                    and (not same_rows or c0[3] not in same_rows) \
                    and (not new_left or new_left.get(broot, 0) <= 0) else None
                if pr is not None:
                    # the common case: one kernel reads a parameter, no copy in between
                    _p, units, logical, k, role, phys, _root = c0
                    if role == "weights" or k in onchip_row:  # (a lookup table? lookups.py)
                        foot = self._table_footprint(broot, claims)
                        if foot is not None:
                            self._settle_table(broot, claims, foot)
                            continue
                    if phys == logical == units <= pr[2].logical_byte_size:  # read once, all needed
                        read_both[role] += phys
                        continue
                    comp_b = min(units, logical, pr[2].logical_byte_size)
                    if comp_b < logical:
                        add(role, HBM_READ, phys, comp_b, logical, "re_read", self._param_subject(pr[0]), k)
                    elif phys == logical:  # read once, all of it needed
                        read_both[role] += phys
                    else:
                        add(role, HBM_READ, phys, comp_b, logical, "re_read", "", k)
                    continue
            mixed = any(c[0] for c in claims)
            if mixed:
                claims.sort(key=itemgetter(0))  # by priority, then schedule order (stable)
            if broot in self.param_root:
                if claims[0][4] == "weights" or claims[0][3] in onchip_row:  # (a lookup table?)
                    foot = self._table_footprint(broot, claims)
                    if foot is not None:
                        self._settle_table(broot, claims, foot)
                        continue
                pnum, _j, leaf = self.param_root[broot]
                size = leaf.logical_byte_size
                # the footprint its first readers need (a copy's reader claims the window it
                # reads), and that of XLA's rematerialization clones whose original is gone
                # (the clone is then the only reader of what it reads: XLA:GPU can leave a
                # layer's window of a stacked cache to a .remat clone); granted to clones last
                # (never the rows that only carry the parameter's own value into its update:
                # _same_value_rows)
                normal = [c for c in claims if c[0] <= 0 and c[3] not in same_rows]
                if normal:
                    normal += [c for c in claims if c[0] == RECOMPUTE_PRIORITY and self._orphan_clone(c[3])]
                else:
                    normal = [c for c in claims if c[3] not in same_rows] if same_rows else claims
                if len(normal) > 1 and self._same_lookups(broot, normal):
                    # every reader looks up the same rows (an embedding gather XLA fused into
                    # each consumer): needed once, the other reads re_read
                    budget = min(size, max(c[1] for c in normal))
                else:
                    budget = min(size, sum(min(size, c[1]) for c in normal))
                if self.carried_need and broot in self.carried_need and any(c[3] in same_rows for c in claims):
                    # (copies carrying x to its update: what kernels read of them on chip)
                    budget = min(size, budget + self.carried_need[broot])
                spill = 0
                subject = self._param_subject(pnum)
                own = "re_read"
            else:
                size = self._logical_size(broot)
                fits = cap is not None and size is not None and size <= cap
                wt = tally.get(broot)
                # a spilled intermediate: each byte written is read back once as the spill's
                # excess (never compulsory: DESIGN.md), more often as re_read
                spill = 0 if fits or wt is None else wt[0] - wt[1]
                budget = 0
                own = "materialized_intermediate" if fits else "re_read"
                if broot in self.produced_cause:
                    spill, own = 0, self.produced_cause[broot]
                subject = ""
            acc_role, acc = _NONE, 0  # compulsory bytes of a run of claims of one role, added once
            for prio, units, logical, k, role, phys, root in claims:
                if spill > 0 and (not derived or root not in derived):
                    # (a read of a copy of the intermediate: the copy's read-back, below, with a
                    # spec or without)
                    g = units if units < spill else spill
                    spill -= g
                    s_b = g if g < logical else logical
                    # (named as where the intermediate fits, below: the reader's kernel cause,
                    # else the cause of the copy it reads; a layout copy of a spilled
                    # intermediate is layout_change with a spec or without)
                    rk = kcause.get(k)
                    if rk is None or rk in READS_COMPULSORY:
                        rk = kcause.get(derived[root][4], derived[root][3]) if root in derived else SPILL
                    add(role, HBM_READ, phys - (logical - s_b), 0, s_b, rk,
                        self._not_donated_subject(k if kcause.get(k) == rk else derived[root][4])
                        if rk in ("not_donated", "donated_but_copied") else "", k)
                    phys = logical = logical - s_b
                    if not logical:
                        continue
                if budget > 0:
                    g = units if units < budget else budget
                    # granted in the origin's bytes (a wider copy: the rest is excess; a
                    # narrower one, read whole, stands for no more of the origin than it holds:
                    # the rest of the budget is the copy kernel's read, at the origin's width)
                    comp_b = g if g < logical else logical
                    budget -= g if units <= logical else comp_b
                    if comp_b == logical == phys:  # all of it needed: no cause
                        if derived and root in derived:   # (it reads the copy's value)
                            left = copy_back.get(root)
                            copy_back[root] = max(0, (self._logical_size(root) or 0 if left is None else left)
                                                  - logical)
                        if role == acc_role:
                            acc += phys
                        else:
                            if acc_role is not _NONE:
                                read_both[acc_role] += acc
                            acc_role, acc = role, phys
                        continue
                else:
                    comp_b = 0
                if new_left and logical > comp_b and phys == logical and new_left.get(root, 0) > 0 \
                        and (kcause.get(k) is None or kcause.get(k) in READS_COMPULSORY):
                    # a parameter's or a copy's buffer that kernels also wrote new values into
                    # (a loop's state): reading those back is an intermediate's read-back, not
                    # the copy's nor a re-read of the parameter
                    t = min(logical - comp_b, new_left[root])
                    new_left[root] -= t
                    add(role, HBM_READ, t, 0, t, self._intermediate_kind(self._logical_size(root)), "", k)
                    phys = logical = logical - t
                    if not logical:
                        continue
                kind = kcause.get(k)
                if kind in READS_COMPULSORY:
                    kind = None  # (its reads are a kernel's like any other: the buffer's cause)
                subj = subject
                if kind is None:
                    if root in derived:
                        kind = kcause.get(derived[root][4], derived[root][3])
                        if phys == logical:
                            # the copy read back once is the copy's; reading its value more
                            # (every iteration of a loop) is the re-read the program makes
                            # without the copy too: re_read of what it copies (the part granted
                            # above reads the copy too; new values written into it, above, not)
                            left = copy_back.get(root)
                            if left is None:
                                left = self._logical_size(root) or 0
                            back = min(left, logical)
                            copy_back[root] = left - back
                            over = logical - comp_b - max(0, back - comp_b)
                            if over > 0:
                                origin = derived[root][0]
                                add(role, HBM_READ, over, 0, over, "re_read",
                                    self._param_subject(param_root[origin][0]) if origin in param_root else "", k)
                                phys = logical = logical - over
                    else:
                        kind = own
                if kind in ("not_donated", "donated_but_copied"):
                    subj = self._not_donated_subject(k if kcause.get(k) == kind else derived[root][4])
                elif kind in PROGRAM_WIDE:
                    subj = ""
                if phys != logical:
                    add(role, HBM_READ, phys, comp_b, logical, kind, subj, k)
                    continue
                # (ledger.add inline, the same steps: no tile padding here)
                if logical > comp_b:
                    if kind is not l_kind or subj is not l_subj or role is not l_role:
                        l_kind, l_subj, l_role = kind, subj, role
                        l_code = code(kind, subj, role, HBM_READ)
                    events += (k, l_code, phys, comp_b, logical)
                else:
                    read_compiled[role] += phys
                    if comp_b:
                        read_compulsory[role] += comp_b
            if acc_role is not _NONE:
                read_both[acc_role] += acc

    def _rewrite_reads(self, broot, claims: list) -> list:
        """``claims`` of parameter root ``broot`` less the reads of it that only rebuild it
        around an update, charged here as ``whole_rewrite``: a
        fusion whose root is a dynamic-update-slice (through bitcast / convert) of the
        parameter (through bitcast / convert) that reads the parameter for nothing else
        (XLA:CPU updates a donated bf16 array as convert(dynamic-update-slice(convert(s) to
        f32, ...)) to bf16, reading and writing it whole): none of its old values is needed --
        the window is overwritten, the rest stays where it is (XLA:TPU and XLA:GPU update in
        place, reading nothing)."""
        pnum = self.param_root[broot][0]
        # (donated or not: XLA:CPU rebuilds the array whole either way -- donating saves none
        # of it there, so not ``not_donated`` -- where an update in place reads nothing)
        kind, subject = "whole_rewrite", self._param_subject(pnum)
        keep = []
        self_copies = set(getattr(self, "self_copies", ()))
        for c in claims:
            prio, units, logical, k, role, phys, root = c
            if k in self_copies and (root == broot or root in self.derived and self.derived[root][0] == broot):
                # (XLA:CPU's copy of the rebuilt buffer into the loop state, its own buffer:
                # it reads the rebuild's output to copy it, needing none of x's old values)
                self.ledger.add(role, HBM_READ, phys, 0, logical, "buffer_copy", "", k)
                continue
            n = self.rebuild_rows.get(k)
            # (of the parameter, or of the copy XLA made of it: XLA:CPU copies a donated bf16
            # array it rebuilds whole around an x.at[i].add)
            of = root == broot or root in self.derived and self.derived[root][0] == broot
            need = None if n is None or not of or phys != logical else self._rebuild_need(k, n, root, broot)
            if need is None or need >= logical:
                keep.append(c)
                continue
            self.ledger.add(role, HBM_READ, logical - need, 0, logical - need, kind, subject, k)
            if need:   # (the old windows it reads: a read like any kernel's)
                keep.append((prio, min(units, need), need, k, role, need, root))
        return keep

    def _rebuild_need(self, k: int, n: int, root, broot) -> int | None:
        """Bytes (per program run, in the parameter's width) of its old values that row
        ``k``'s fusion needs when it reads its operand ``n`` (of buffer ``broot``) only as the
        buffer its root dynamic-update-slice updates and for windows of it (dynamic-slice /
        slice: ``x.at[i].add(v)`` reads the old window), through bitcast / convert, and writes
        into that buffer (``broot``, or ``root``, the copy of it the operand is): the windows'
        elements; None for any other use."""
        r = self.rows[k]
        instr = r.instr
        find = self.buffers.find
        if n >= len(instr.operands) or find((r.computation, instr.operands[n], 0)) != root:
            return None
        if find((r.computation, instr.name, 0)) not in (root, broot):
            # (or copied into it by its one user: XLA:CPU rebuilds a bf16 loop state into a
            # buffer of its own and copies it into the state, ``x.at[i].add`` in a fori_loop)
            comp = self.module.computations[r.computation]
            users = comp.users(instr.name)
            if len(users) != 1 or users[0].opcode != "copy" \
                    or find((r.computation, users[0].name, 0)) not in (root, broot):
                return None
        if instr.operands.count(instr.operands[n]) != 1:
            return None
        fused = self.module.computations.get(instr.called_computations[0]) if instr.called_computations else None
        if fused is None:
            return None
        param = next((i for i in fused.parameters if i.parameter_number == n), None)
        if param is None or not param.shape.is_array:
            return None
        todo, window_elems, updated = [param], 0, False
        while todo:   # the parameter and its bitcasts / converts: what reads them
            node = todo.pop()
            for u in fused.users(node.name):
                op = u.opcode
                if op in ("bitcast", "convert"):
                    todo.append(u)
                elif op == "dynamic-update-slice" and u.operands[0] == node.name and node.name not in u.operands[1:]:
                    updated = True
                    todo.append(u)   # (its result: the buffer, for the next window's update)
                elif op in ("dynamic-slice", "slice") and u.operands[0] == node.name \
                        and node.name not in u.operands[1:]:
                    window_elems += u.shape.num_elements
                else:
                    return None
        if not updated:
            return None
        pshape = param.shape
        return window_elems * pshape.logical_byte_size // max(1, pshape.num_elements) * r.multiplicity.count

    def _same_lookups(self, broot, claims) -> bool:
        """Every claim reads parameter root ``broot`` directly, once per program run, through
        lookups of the same rows: ``lookups.lookup_rows``'s signatures equal, and each index an
        ENTRY ``parameter`` instruction (the same one: its value is the program's input, the
        same for every reader) or a constant of the same literal. An index read from any other buffer may hold other values (a
        loop carry, an in-place update), so such lookups count once each."""
        rows, find, module = self.rows, self.buffers.find, self.module
        entry = module.entry
        first = None
        for c in claims:
            k, root = c[3], c[6]
            if root != broot:
                return False
            r = rows[k]
            if r.computation != entry.name or r.multiplicity.count != 1:
                return False
            instr = r.instr
            ops = [i for i, o in enumerate(instr.operands) if find((r.computation, o, 0)) == broot]
            if len(ops) != 1:
                return False
            sig = lookup_rows(instr, ops[0], module)
            if sig is None:
                return False
            resolved = set()
            for op, attrs, idx in sig:
                vals = tuple(_entry_value(entry, instr, i) for i in idx)
                if any(v is None for v in vals):
                    return False
                resolved.add((op, attrs, vals))
            sig = frozenset(resolved)
            if first is None:
                first = sig
            elif sig != first:
                return False
        return True

    def _table_footprint(self, broot, claims) -> int | None:
        """The lookup footprint (data bytes) of parameter root ``broot`` when the program uses
        it only as the table of lookups (``lookups.py``: a gather / dynamic-slice of rows, a
        one-hot dot) and its ``claims`` read more of it than those lookups touch: copied whole
        into on-chip memory (every reader of the copy a lookup), or read whole from HBM by a
        one-hot dot; else None. A parameter of another role than weights only through its
        copy into on-chip memory (XLA:TPU's prefetch of ``x`` for ``dynamic_slice(x, ...)``:
        ``whole_prefetch``). The footprint is the sum of the lookups' elements in the
        parameter's width (the gathered rows: tokens x d_model x width), at most the
        parameter's bytes."""
        leaf = self.param_root[broot][2]
        size, n = leaf.logical_byte_size, leaf.num_elements
        if not n or not size:
            return None
        rows, onchip_copy, onchip_reads = self.rows, self.onchip_copy, self.onchip_reads
        copy_root = self.onchip_copy_row
        foot = claimed = 0
        for _p, units, _lg, k, role, _phys, root in claims:
            claimed += units
            droot = copy_root.get(k)
            if role != "weights" and droot is None:
                return None   # (another role: only its copy into on-chip memory, whole_prefetch)
            if droot is not None and onchip_copy[droot][0] == broot:
                readers = onchip_reads.get(droot)
                if not readers:
                    return None  # (a copy whose readers are not seen: no footprint to take)
                num, den = onchip_copy[droot][1], onchip_copy[droot][2]
                if num and num != den:   # (read in the copy's width: in the parameter's, as units)
                    readers = [(kr, op, nb * den // num) for kr, op, nb in readers]
                got = self._lookups_bytes(readers, size, n)
            else:
                r = rows[k]
                if root != broot or r.instr.opcode != "fusion":
                    return None  # (a direct gather already reads only its rows: traffic.py)
                find = self.buffers.find
                ops = [i for i, o in enumerate(r.instr.operands) if find((r.computation, o, 0)) == broot]
                got = self._lookups_bytes([(k, i, units) for i in ops], size, n) if ops else None
            if got is None:
                return None
            foot += got
        return foot if foot < min(size, claimed) else None

    def _lookups_bytes(self, readers, size: int, n: int) -> int | None:
        """Bytes of a table of ``size`` bytes and ``n`` elements that ``readers`` ((row,
        operand, bytes read) each) touch through lookups, or None when one is no lookup."""
        total = 0
        for k, operand, nbytes in readers:
            r = self.rows[k]
            elems = table_lookup(r.instr, operand, self.module)
            if elems is None:
                return None
            total += min(nbytes, elems * size // n * r.multiplicity.count)
        return total

    def _settle_table(self, broot, claims, footprint: int) -> None:
        """A lookup table's reads (``_table_footprint``): its footprint granted in schedule order,
        the rest of every read ``whole_table_read``."""
        subject = self._param_subject(self.param_root[broot][0])
        budget = footprint
        add = self.ledger.add
        for _p, units, logical, k, role, phys, _root in claims:
            g = min(units, budget, logical)
            budget -= g
            add(role, HBM_READ, phys, g, logical,
                "whole_table_read" if role == "weights" else "whole_prefetch", subject, k)

    def _orphan_clone(self, k: int) -> bool:
        """Row ``k`` is a clone XLA's rematerialization made (``NAME.remat``, ``NAME.remat2``;
        xla/service/hlo_rematerialization.cc) whose original ``NAME`` is no longer in its
        computation."""
        r = self.rows[k]
        name = r.instr.name
        i = name.find(".remat")
        return i > 0 and name[:i] not in self.module.computations[r.computation].by_name

    def _not_donated_subject(self, k: int) -> str:
        """The subject of copy row ``k`` of cause ``not_donated`` (the argument to donate) or
        ``donated_but_copied`` (the donated leaf copied: ``params/lm_head/kernel``)."""
        origin = self.copy_origin.get(k)
        if origin is not None and origin in self.param_root:
            pnum = self.param_root[origin][0]
            if self.kcause.get(k) == "donated_but_copied":
                return self._param_subject(pnum)
            return self._argument(pnum)[0]
        return ""

    def _logical_size(self, root: tuple) -> int | None:
        comp = self.module.computations.get(root[0])
        instr = comp.by_name.get(root[1]) if comp is not None else None
        if instr is None:
            return None
        shape = instr.shape
        if not shape.is_tuple:
            return shape.logical_byte_size
        leaves = _leaves(shape)
        return leaves[root[2]][1].logical_byte_size if root[2] < len(leaves) else None

    def _flows_into(self, root, uroot) -> bool:
        """Buffer ``root`` (a copy of a parameter) flows into ``uroot`` (the result that updates
        the parameter): it is ``uroot``, one of the copies ``uroot`` is copied from
        (``copy_chain``), or a value written into one of those as a dynamic-update-slice's
        update (``_feeding``: a scan stacks each layer's updated cache into its ys, which
        XLA:CPU copies into the donated result): an update made in it is the result's. Else
        the result is computed apart (XLA:GPU's input_transpose_fusion) and the copy's update
        serves another reader."""
        return root in self._feeding(uroot)

    def _feeding(self, root) -> set:
        """``root`` and the buffers whose values flow into it, transitively: copied into it
        (``copy_chain``) or written into it as the update of an in-place dynamic-update-slice
        (``_update_sources``)."""
        memo = self.__dict__.setdefault("_feeding_memo", {})
        got = memo.get(root)
        if got is not None:
            return got
        chain, sources = self.copy_chain, self._update_sources()
        got, todo = {root}, [root]
        while todo and len(got) < 256:
            node = todo.pop()
            nxt = list(sources.get(node, ()))
            if node in chain:
                nxt.append(chain[node][0])
            for src in nxt:
                if src not in got:
                    got.add(src)
                    todo.append(src)
        memo[root] = got
        return got

    def _rewrites_stack(self, r) -> bool:
        """Row ``r`` runs more than once and copies (``copy`` / ``copy-start``) a buffer that
        in-place updates write, whole, every time (XLA:TPU evicts a scan's ys stack from VMEM
        to HBM in every iteration)."""
        instr = r.instr
        if r.multiplicity.count <= 1 or instr.opcode not in ("copy", "copy-start") or not instr.operands:
            return False
        self._overwritten_fill_roots()
        return self.buffers.find((r.computation, instr.operands[0], 0)) in self._inplace_roots

    def _overwritten_fill_roots(self) -> set:
        """The buffers in-place updates write (found once, on first use)."""
        got = getattr(self, "_inplace_roots", None)
        if got is None:
            find = self.buffers.find
            got = self._inplace_roots = {
                find((q.computation, q.instr.name, 0)) for kq, q in enumerate(self.rows)
                if q.traffic.inplace_buffer_bytes or q.instr.opcode == "dynamic-update-slice"
                or kq in self.rebuild_rows}   # (XLA:CPU rebuilds a bf16 stack around each window)
        return got

    def _overwritten_whole(self, root, k: int, size: int) -> bool:
        """The kernels other than row ``k`` write at least ``size`` data bytes into buffer
        ``root`` per run (the loop's updates cover the filled result: a scan's ys; not
        ``zeros(n).at[i].set(v)``, whose zeros stay in the result)."""
        find, computations = self.buffers.find, self.module.computations
        total = 0
        for kw in self._writers().get(root, ()):
            if kw == k:
                continue
            r = self.rows[kw]
            for a in r.traffic.writes:
                wkey = write_key(r.instr, computations[r.computation], a.index)[0] if a.index \
                    else (r.computation, r.instr.name, 0)
                if find(wkey) == root:
                    total += (a.logical_nbytes if a.logical_nbytes is not None else a.nbytes) * r.multiplicity.count
            if total >= size:
                return True
        return False

    def _fill_row(self, r) -> bool:
        """Row ``r`` writes a constant fill (``_is_fill``), or copies one (XLA:CPU's second
        ys): with its result buffer among those in-place updates then overwrite
        (``_overwritten_fill_roots``), XLA's zero initial value of a scan's stacked outputs,
        which the loop's dynamic-update-slices fill row by row."""
        instr = r.instr
        if instr.opcode == "copy" and instr.operands:
            src = self.module.computations[r.computation].by_name.get(instr.operands[0])
            return src is not None and _is_fill(src, self.module)
        return _is_fill(instr, self.module)

    def _update_sources(self) -> dict[tuple, list]:
        """Buffer root -> the buffer roots of the values written into it as the update of an
        in-place dynamic-update-slice (the instruction, or a fusion that updates its buffer
        operand in place with one at its root, through bitcasts, converts, transposes,
        reshapes and copies; built once, on first use)."""
        got = getattr(self, "_update_srcs", None)
        if got is not None:
            return got
        got = self._update_srcs = {}
        find, module = self.buffers.find, self.module
        for k_row, r in enumerate(self.rows):
            instr = r.instr
            if instr.opcode == "dynamic-update-slice" and len(instr.operands) > 1:
                upd = instr.operands[1]
            elif instr.opcode == "fusion" and instr.called_computations and (
                    r.traffic.inplace_buffer_bytes or k_row in self.rebuild_rows):
                # (in place, or rebuilding its operand's buffer around the window: XLA:CPU's
                # bf16 stack, convert(dynamic-update-slice(convert(ys), layer)))
                fused = module.computations.get(instr.called_computations[0])
                if fused is None:
                    continue
                e = _through_permutes(fused.by_name, fused.root)
                if e is None or e.opcode != "dynamic-update-slice" or len(e.operands) < 2:
                    continue
                u = _through_permutes(fused.by_name, fused.by_name.get(e.operands[1]))
                if u is None or u.opcode != "parameter" or not 0 <= u.parameter_number < len(instr.operands):
                    continue
                upd = instr.operands[u.parameter_number]
            else:
                continue
            got.setdefault(find((r.computation, instr.name, 0)), []).append(find((r.computation, upd, 0)))
        return got

    def _intermediate_kind(self, nbytes: int | None) -> str:
        """An intermediate of ``nbytes`` data bytes: ``materialized_intermediate`` where it fits
        the spec's on-chip capacity, else ``spilled_intermediate``."""
        return "materialized_intermediate" if self.capacity is not None and nbytes is not None \
            and nbytes <= self.capacity else SPILL

    def _out_size(self, root: tuple) -> int:
        return self.out_root[root][1].logical_byte_size if root in self.out_root else \
            self.param_root[root][2].logical_byte_size

    # -- fix texts -------------------------------------------------------------------------

    def fix(self, kind: str, subject: str, nbytes: int, items) -> str:
        """The fix text of a cause (``causes.fix_text``) with what its rule needs of the
        program: a not-donated argument's number, whether the costliest instruction evicts a
        buffer from on-chip memory, the on-chip capacity (None: no spec)."""
        argnum = None
        paired = None
        if kind == "not_donated":
            p = next((p for p in self.params.values() if self._argument(p.number)[0] == subject), None)
            argnum = getattr(p, "argnum", None) if p is not None else None
            paired = self._paired_elsewhere(subject)
        evicts = kind == "whole_rewrite" and bool(items) and self._is_vmem_eviction(items[0])
        in_loop = kind == "not_donated" and self._read_on_chip_in_a_loop(subject)
        return fix_text(FixContext(kind, subject, nbytes, items[0].name if items else "?", argnum, evicts,
                                   self.capacity, paired, in_loop))

    def _subject_params(self) -> dict[str, list[int]]:
        """Argument name (``_argument``) -> its ENTRY parameter numbers (built once)."""
        got = self.__dict__.get("_subjects_of")
        if got is None:
            got = self._subjects_of = {}
            for q in self.module.entry.parameters:
                got.setdefault(self._argument(q.parameter_number)[0], []).append(q.parameter_number)
        return got

    def _read_on_chip_in_a_loop(self, subject: str) -> bool:
        """Argument ``subject`` is prefetched or copied into on-chip memory and read there by a
        kernel that runs more than once, or read there whole (XLA:TPU keeps a kept cache in
        VMEM for the kernels that read it, through a loop that attends to it; donated, it may
        leave the cache in HBM and read it there, every iteration)."""
        mine = set(self._subject_params().get(subject, ()))
        proots = {proot for proot, pr in self.param_root.items() if pr[0] in mine}
        rows = self.rows
        onchip = [(droot, sroot) for droot, (sroot, _k) in getattr(self, "prefetch_of", {}).items()]
        onchip += [(droot, d[0]) for droot, d in self.onchip_copy.items()]
        for droot, sroot in onchip:
            if sroot not in proots:
                continue
            readers = self._onchip_readers(droot, exclude=self._no_need())
            size = self.param_root[sroot][2].logical_byte_size
            # (read in a loop, or whole: donated, XLA may read it from HBM for those kernels)
            if any(rows[k].multiplicity.count > 1 for k in readers) or sum(readers.values()) >= size:
                return True
        return False

    def _jax_pairing(self, pnum: int, all_updated: bool = False) -> int | None:
        """The result leaf jax gives the buffer of ENTRY parameter ``pnum`` if it is donated (with
        the parameters donated already; ``all_updated``: and every argument the program updates,
        as their fix texts advise): each donated argument, in argument order, takes the first
        result of its shape and dtype not yet taken, in output order (jax ``_set_up_aliases``).
        None: a tuple parameter, or no such result."""
        memo = "_pairings_all" if all_updated else "_pairings"
        got = self.__dict__.get(memo)
        if got is None:   # (every parameter's answer in one pass, in argument order)
            got = {}
            self.__dict__[memo] = got
            entry = self.module.entry
            free: dict[tuple, list[int]] = {}   # (dims, type) -> result leaves not yet taken, in order
            for j, leaf in enumerate(_leaf_shapes(entry.root.shape)):
                if leaf.is_array:
                    free.setdefault((leaf.dims, leaf.element_type), []).append(j)
            pos = dict.fromkeys(free, 0)
            for q in sorted(entry.parameters, key=lambda q: q.parameter_number):
                n = q.parameter_number
                if not q.shape.is_array:
                    got[n] = None
                    continue
                key = (q.shape.dims, q.shape.element_type)
                i = pos.get(key, 0)
                got[n] = free[key][i] if key in free and i < len(free[key]) else None
                # (donated -- or, for a fix text, to be donated as every updated argument's
                # fix says -- it takes that one)
                if got[n] is not None and (self._argument(n)[2] or all_updated and n in self.update_root):
                    pos[key] = i + 1
        return got.get(pnum)

    def _paired_elsewhere(self, subject: str) -> tuple[int, int] | None:
        """(the result jax would give the buffer of argument ``subject`` if it were donated
        (``_jax_pairing``), the result that updates it) where the two differ, else None. A
        subject of several leaves is not told apart (None)."""
        mine = self._subject_params().get(subject, [])
        if len(mine) != 1 or mine[0] not in self.update_root:
            return None
        update = self.out_root.get(self.update_root[mine[0]], (None,))[0]
        paired = self._jax_pairing(mine[0], all_updated=True)
        return (paired, update) if paired is not None and update is not None and paired != update else None

    def _is_vmem_eviction(self, item) -> bool:
        """``item`` (a listed instruction) is a copy-start from on-chip memory to HBM."""
        comp = self.module.computations.get(item.computation)
        instr = comp.by_name.get(item.name) if comp is not None else None
        if instr is None or instr.opcode != "copy-start" or not instr.operands:
            return False
        src = comp.by_name[instr.operands[0]].shape
        dst = instr.shape.tuple_shapes[0] if instr.shape.is_tuple else instr.shape
        return src.memory_space in ON_CHIP_MEMORY_SPACES and dst.memory_space not in ON_CHIP_MEMORY_SPACES
