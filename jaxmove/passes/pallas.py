"""Pallas TPU kernels (``tpu_custom_call``): HBM traffic from the grid and BlockSpecs, the author's
FLOPs, and a pipelined time.

Traffic, as Pallas's TPU pipeline moves it (docs/pallas/tpu/details.rst, "BlockSpecs and grid
iteration"; docs/pallas/pipelining.md, "Reductions and accumulation", jax-ml/jax):

* the grid runs sequentially in lexicographic order (the last grid dimension fastest);
* an input block is copied HBM -> VMEM at a step when its block index differs from the previous
  step's ("when two consecutive grid indices use the same slice of an input, the HBM transfer for
  the second iteration is skipped"); the first step fetches every input block;
* an output block is copied VMEM -> HBM when its index changes and once at the end;
* a block's bytes are the tiles it covers in the operand's HBM layout (``Shape.sliced_byte_size``:
  padding to the ``T(8,128)`` tiles counts), clipped at the array's edge for a partial last block;
* scalar-prefetch operands are read once whole (into SMEM); scratch operands are on chip;
* operands in ``ANY`` / HBM memory space are moved by the kernel's own DMAs: when the kernel
  body can be walked over the grid (passes/mosaic_body.py: its loops' bounds known, e.g. paged
  attention with its lengths given) they cost the bytes of its ``tpu.enqueue_dma`` ops; else
  they are costed as read (input) / written (output) once whole, an assumption stated in the
  row's notes;
* an index map that reads scalar-prefetch values (page tables, group offsets) is data-dependent:
  unless their contents are given (:func:`set_prefetch_values`), distinct entries are assumed to
  hold distinct values (every looked-up page a different page), stated in the notes.

FLOPs and transcendentals are the kernel author's ``pl.CostEstimate`` (XLA's ``cost_analysis()``
repeats it); the notes compare the author's ``bytes_accessed`` with the modeled bytes, and give
the MXU / vector work of the kernel body walked over the grid (its ``pl.when`` branches evaluated
per step), which a kernel without an estimate takes as its flops.

Pallas Triton kernels on GPU (``__gpu$xla.gpu.triton``) are costed by passes/triton.py; the
traffic / flop / time rules for both targets are the hooks at the end of this module.

Time (:func:`pallas_time`): Pallas TPU double-buffers every block, so the DMAs of step t+1's
inputs and step t-1's outputs overlap step t's compute; after docs/pallas/pipelining.md
("Analyzing the performance": a pipeline of N steps takes ``alpha + X/beta + N * Y/F`` compute
bound, ``alpha + N * X/beta`` memory bound):

    time = (fetch of step 0 + write-back after the last step) / hbm_bytes_per_s
           + sum over steps t of max(DMA bytes issued during t / hbm_bytes_per_s, compute_t)
           + steps * PALLAS_TPU_STEP_OVERHEAD_S + kernel_launch_overhead_s

``compute_t`` is the step's own work in the kernel body walked over the grid (its MXU flops at
the MXU peak of the kernel's input dtype, vector flops and transcendentals at the vector
(``f32``) peak; passes/mosaic_body.py); where the body cannot be walked, the author's flops spread
evenly over the steps (the estimate is per call).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from ..hlo import Instruction, Module, Shape
from .mosaic import (SYMBOL_BASE, TPU_CUSTOM_CALL_TARGET, CostEstimate, MosaicDecodeError,
                     MosaicKernel, cost_estimate_of, decode_body, evaluate_index_map, reads_prefetch)

#: Per grid step overhead of a Pallas TPU kernel, seconds: the "~0.35 us per grid step" figure
#: quoted for Pallas on TPU (issue 25 of this project attributes it to Pallas's TPU docs; it is
#: not in jax-ml/jax's docs/pallas at cec06d1 (2026-08-08), so it is reported as unverified in the
#: time notes). Replace with a measured value where one is available.
PALLAS_TPU_STEP_OVERHEAD_S = 0.35e-6

#: Grids larger than this many steps are not walked: the kernel's traffic is a lower bound.
MAX_GRID_STEPS = 1 << 26
_CHUNK = 1 << 20
#: Grids up to this many steps keep per-step DMA bytes for the pipelined time; larger ones use
#: the mean bytes per step (said in the notes).
_MAX_STEP_PROFILE = 1 << 22

# Run-time values given by the user: kernel name -> (prefetch contents, dynamic grid dimensions).
_PREFETCH_VALUES: dict[str, tuple[tuple, tuple[int, ...] | None]] = {}


def set_prefetch_values(kernel_name: str, values: list | tuple | None,
                        dynamic_grid: tuple[int, ...] | None = None) -> None:
    """Give the run-time values of a kernel's scalar-prefetch operands (page tables, lengths,
    group metadata) and of its dynamic grid dimensions, so its data-dependent index maps are
    evaluated exactly rather than under the distinct-entries assumption.

    Args:
      kernel_name: the Mosaic kernel function's name (the row's notes print it).
      values: one array-like (or None: unknown) per scalar-prefetch operand, in order; None
        (with ``dynamic_grid`` None) removes what was given.
      dynamic_grid: the value of each dynamic grid dimension (``iteration_bounds`` entries
        that are dynamic, in order), e.g. megablox gmm's number of active tiles.

    Applies to every later analysis in this process.
    """
    if values is None and dynamic_grid is None:
        _PREFETCH_VALUES.pop(kernel_name, None)
    else:
        vals = tuple(None if v is None else np.asarray(v) for v in (values or ()))
        _PREFETCH_VALUES[kernel_name] = (vals, None if dynamic_grid is None
                                         else tuple(int(g) for g in dynamic_grid))
    _COST_CACHE.clear()


def _literal_values(instr: Instruction | None) -> np.ndarray | None:
    """The contents of an HLO ``constant`` printed in full (not ``{...}``), else None."""
    if instr is None or instr.opcode != "constant" or not instr.literal or "..." in instr.literal:
        return None
    if not instr.shape.is_array or instr.shape.element_type not in (
            "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "pred"):
        return None
    import re
    nums = [int(x) for x in re.findall(r"-?\d+", instr.literal.replace("true", "1").replace("false", "0"))]
    dims = instr.shape.dims
    if len(nums) != math.prod(dims):
        return None
    return np.asarray(nums, dtype=np.int64).reshape(dims)


@dataclass(frozen=True, slots=True)
class WindowTraffic:
    """HBM traffic of one input or output window over the whole grid, per call.

    Attributes:
      operand: the HLO operand number (inputs), or None for an output.
      result_index: the ShapeIndex of the output in the custom call's result (outputs).
      transfers: block copies (HBM -> VMEM for inputs, VMEM -> HBM for outputs).
      nbytes: physical bytes moved (tile-padded blocks).
      logical_nbytes: data bytes among them.
      assumption: why the figure rests on an assumption (manual DMA, data-dependent blocks), or None.
    """

    operand: int | None
    result_index: tuple[int, ...]
    transfers: int
    nbytes: int
    logical_nbytes: int
    memory_space: int
    assumption: str | None = None


@dataclass(frozen=True, slots=True)
class PallasCost:
    """What one Pallas TPU kernel call moves and computes.

    Attributes:
      kernel: the decoded kernel, or None when its body could not be decoded.
      windows: per input / output window.
      prefetch_read_bytes: bytes of the scalar-prefetch operands (read once).
      flops, transcendentals: the author's cost estimate (0 without one).
      author_bytes: the author's ``bytes_accessed``, or None.
      steps: grid steps.
      first_bytes: DMA bytes outside the overlap (step 0's fetch + the last write-back).
      step_dma: (bytes issued during a step, number of such steps) pairs for the pipelined time.
      notes: assumptions and comparisons.
      unmodeled: non-empty when the traffic is a lower bound.
      leading_operands: the HLO operands before the windows' inputs: dynamic grid bounds and
        scalar-prefetch operands.
      body_flops, body_mxu_flops, body_transcendentals: the work of the kernel body walked over
        the grid with its branches evaluated per step (passes/mosaic_body.py), or None when it
        could not be walked; the flops when the kernel has no cost estimate.
    """

    kernel: MosaicKernel | None
    windows: tuple[WindowTraffic, ...]
    prefetch_read_bytes: int
    flops: int
    transcendentals: int
    author_bytes: int | None
    steps: int
    first_bytes: int
    step_dma: tuple[tuple[int, int], ...]
    notes: tuple[str, ...]
    unmodeled: tuple[str, ...] = ()
    leading_operands: int = 0  # dynamic grid bounds + scalar-prefetch operands (read once whole)
    body_flops: int | None = None        # the kernel body walked over the grid (mosaic_body.py)
    body_mxu_flops: int | None = None
    body_transcendentals: int | None = None
    # (DMA bytes issued during a step, its MXU flops, vector flops, transcendentals, steps): the
    # pipelined time's per-step profile when the body was walked (else step_dma, uniform work)
    step_profile: tuple[tuple[int, int, int, int, int], ...] = ()
    body_exact: bool = True  # False: the walk took the larger side of a branch it could not decide

    @property
    def read_bytes(self) -> int:
        return self.prefetch_read_bytes + sum(w.nbytes for w in self.windows if w.operand is not None)

    @property
    def write_bytes(self) -> int:
        return sum(w.nbytes for w in self.windows if w.operand is None)


def is_pallas_tpu(instr: Instruction) -> bool:
    return instr.opcode == "custom-call" and instr.custom_call_target == TPU_CUSTOM_CALL_TARGET


def _result_leaves(shape: Shape) -> list[tuple[tuple[int, ...], Shape]]:
    if not shape.is_tuple:
        return [((), shape)]
    return [(idx, leaf) for idx, leaf in shape.leaves_with_index() if leaf.is_array]


def _lower_bound(instr: Instruction, operand_shapes: list[Shape], why: str,
                 ce: CostEstimate | None) -> PallasCost:
    wins = [WindowTraffic(i, (), 1, s.byte_size, s.logical_byte_size, s.memory_space)
            for i, s in enumerate(operand_shapes) if s.is_array]
    wins += [WindowTraffic(None, idx, 1, s.byte_size, s.logical_byte_size, s.memory_space)
             for idx, s in _result_leaves(instr.shape)]
    total = sum(w.nbytes for w in wins)
    return PallasCost(None, tuple(wins), 0, ce.flops if ce else 0, ce.transcendentals if ce else 0,
                      ce.bytes_accessed if ce else None, 1, total, (), (),
                      (f"Pallas kernel '{instr.name}' not decoded ({why}): its HBM traffic is its "
                       "operand + result bytes once, a lower bound",))


def _block_bytes(shape: Shape, block: tuple[int, ...], idx: np.ndarray, element: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Physical and logical bytes of the blocks at block indices ``idx`` (rows) of ``shape``."""
    dims = shape.dims
    if len(block) != len(dims) or not shape.is_array:  # extended dtypes: the footprint share
        e = math.prod(block)
        nb = shape.footprint_bytes(min(e, shape.num_elements))
        lg = shape.logical_footprint_bytes(min(e, shape.num_elements))
        return np.full(len(idx), nb, dtype=np.int64), np.full(len(idx), lg, dtype=np.int64)
    bl = np.asarray(block, dtype=np.int64)
    sym = idx >= SYMBOL_BASE // 2  # a data-dependent index: assume an in-bounds block
    start = np.where(sym, 0, idx if element else idx * bl)
    ext = np.clip(np.asarray(dims, dtype=np.int64) - start, 0, bl)
    uniq, inv = np.unique(ext, axis=0, return_inverse=True)
    inv = np.asarray(inv).reshape(-1)
    phys = np.array([shape.sliced_byte_size(tuple(int(x) for x in u)) for u in uniq], dtype=np.int64)
    bits = shape.element_bits or 8
    logi = np.array([(int(np.prod(u)) * bits + 7) // 8 for u in uniq], dtype=np.int64)
    return phys[inv], logi[inv]


def _walk(kernel: MosaicKernel, shapes: list[Shape | None], n_in: int, prefetch: tuple | None):
    """Per window: (transfers, bytes, logical bytes) and per-step (in, out) DMA byte arrays."""
    n = kernel.num_steps
    grid = kernel.grid
    nw = len(kernel.windows)
    transfers = [0] * nw
    nbytes = [0] * nw
    lbytes = [0] * nw
    prev: list[np.ndarray | None] = [None] * nw
    profile = n <= _MAX_STEP_PROFILE
    in_steps = np.zeros(n if profile else 0, dtype=np.int64)
    out_steps = np.zeros(n if profile else 0, dtype=np.int64)
    for s0 in range(0, n, _CHUNK):
        s1 = min(n, s0 + _CHUNK)
        steps = np.arange(s0, s1, dtype=np.int64)
        gidx = [np.asarray(a, dtype=np.int64) for a in np.unravel_index(steps, grid)] if grid else []
        for w, win in enumerate(kernel.windows):
            shape = shapes[w]
            if shape is None or win.index_map is None or win.block_shape is None:
                continue
            idx = np.stack(evaluate_index_map(win.index_map, gidx, list(prefetch) if prefetch else None),
                           axis=1) if gidx else np.zeros((1, len(win.block_shape)), dtype=np.int64)
            if idx.shape[1] != len(win.block_shape):
                raise MosaicDecodeError(f"index map {win.index_map.name} returns {idx.shape[1]} indices "
                                        f"for a rank-{len(win.block_shape)} block")
            before = np.concatenate([prev[w], idx[:-1]]) if prev[w] is not None else None
            if before is None:
                changed = np.ones(len(idx), dtype=bool)
                if len(idx) > 1:
                    changed[1:] = np.any(idx[1:] != idx[:-1], axis=1)
            else:
                changed = np.any(idx != before, axis=1)
            is_out = w >= n_in
            if not is_out:
                sel = idx[changed]
                pb, lb = _block_bytes(shape, win.block_shape, sel, win.element_window)
                transfers[w] += int(changed.sum())
                nbytes[w] += int(pb.sum())
                lbytes[w] += int(lb.sum())
                if profile:
                    np.add.at(in_steps, steps[changed], pb)
            else:
                # written back after step t when the index changes at t+1 (the block of t), and
                # after the last step: within this chunk, steps t where idx[t+1] != idx[t]
                wb = np.zeros(len(idx), dtype=bool)
                if len(idx) > 1:
                    wb[:-1] = np.any(idx[1:] != idx[:-1], axis=1)
                if before is not None and changed[0]:  # the previous chunk's last block
                    pb0, lb0 = _block_bytes(shape, win.block_shape, prev[w], win.element_window)
                    transfers[w] += 1
                    nbytes[w] += int(pb0.sum())
                    lbytes[w] += int(lb0.sum())
                    if profile:
                        out_steps[s0 - 1] += int(pb0.sum())
                if s1 == n:
                    wb[-1] = True
                sel = idx[wb]
                pb, lb = _block_bytes(shape, win.block_shape, sel, win.element_window)
                transfers[w] += int(wb.sum())
                nbytes[w] += int(pb.sum())
                lbytes[w] += int(lb.sum())
                if profile:
                    np.add.at(out_steps, steps[wb], pb)
            prev[w] = idx[-1:]
    return transfers, nbytes, lbytes, (in_steps, out_steps) if profile else None


def _fmt(n: int) -> str:
    return f"{n:,}"


def kernel_cost(instr: Instruction, operand_shapes: list[Shape],
                operand_instrs: list[Instruction | None] | None = None) -> PallasCost:
    """The :class:`PallasCost` of one ``tpu_custom_call`` given its operands' shapes (and the
    operand instructions, whose printed constants give scalar-prefetch contents).

    Never raises for an unreadable kernel: it returns the operand + result bytes as a lower
    bound with an ``unmodeled`` reason.
    """
    cc = (instr.backend_config or {}).get("custom_call_config")
    body = cc.get("body") if isinstance(cc, dict) else None
    ce = cost_estimate_of(instr.backend_config)
    if not isinstance(body, str) or not body:
        return _lower_bound(instr, operand_shapes, "no custom_call_config.body", ce)
    consts = tuple(_literal_values(i) for i in (operand_instrs or [None] * len(operand_shapes)))
    key = (body, tuple(str(s) for s in operand_shapes), str(instr.shape),
           tuple(None if c is None else c.tobytes() for c in consts))
    try:
        return _kernel_cost_cached(key, instr, tuple(operand_shapes), ce, consts)
    except MosaicDecodeError as e:
        return _lower_bound(instr, operand_shapes, str(e), ce)
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError) as e:
        return _lower_bound(instr, operand_shapes, f"{type(e).__name__}: {e}", ce)


@functools.lru_cache(maxsize=256)
def _decode_cached(body: str) -> MosaicKernel:
    return decode_body(body)


def _kernel_cost_cached(key, instr, operand_shapes, ce, consts) -> PallasCost:
    hit = _COST_CACHE.get(key)
    if hit is None:
        hit = _COST_CACHE[key] = _kernel_cost(instr, list(operand_shapes), ce, consts)
        if len(_COST_CACHE) > 512:
            _COST_CACHE.pop(next(iter(_COST_CACHE)))
    return hit


_COST_CACHE: dict = {}


def _kernel_cost(instr: Instruction, operand_shapes: list[Shape], ce: CostEstimate | None,
                 consts: tuple = ()) -> PallasCost:
    k = _decode_cached(key_body(instr))
    notes: list[str] = []
    given, given_grid = _PREFETCH_VALUES.get(k.name, ((), None))
    n_dyn = k.num_dynamic_grid_dims
    if n_dyn:
        if given_grid is None or len(given_grid) != n_dyn:
            raise MosaicDecodeError(f"grid {tuple('?' if g < 0 else g for g in k.grid)} has {n_dyn} dynamic "
                                    "dimension(s), known only at run time: give them with "
                                    f"jaxmove.passes.pallas.set_prefetch_values({k.name!r}, [...], "
                                    "dynamic_grid=(...))")
        it = iter(given_grid)
        k = dataclasses.replace(k, grid=tuple(next(it) if g < 0 else g for g in k.grid))
        notes.append(f"dynamic grid dimension(s) given: {given_grid}")
    n_pref = n_dyn + k.num_scalar_prefetch  # dynamic grid bounds, then the prefetch operands
    n_in = len(operand_shapes) - n_pref
    outs = _result_leaves(instr.shape)
    if n_in < 0 or n_in + len(outs) != len(k.windows):
        raise MosaicDecodeError(f"{len(k.windows)} windows for {n_in} inputs + {len(outs)} outputs")
    if k.num_steps > MAX_GRID_STEPS:
        raise MosaicDecodeError(f"grid {k.grid} has {k.num_steps} steps, over {MAX_GRID_STEPS}")
    shapes: list[Shape | None] = list(operand_shapes[n_pref:]) + [s for _, s in outs]
    # prefetch contents: the user's, else a constant printed in the HLO, else unknown
    prefetch = []
    sources = []
    for j in range(k.num_scalar_prefetch):
        v = given[j] if j < len(given) else None
        src = "given" if v is not None else None
        if v is None and n_dyn + j < len(consts) and consts[n_dyn + j] is not None:
            v, src = consts[n_dyn + j], "HLO constant"
        prefetch.append(v)
        sources.append(src)
    transfers, nbytes, lbytes, profile = _walk(k, shapes, n_in, tuple(prefetch))
    # the kernel body walked over the grid: its MXU / vector work (and a check of the author's)
    body = None
    try:
        from .mosaic_body import BodyWalkError, walk_body
        try:
            body = walk_body(key_body(instr), k.grid, k.num_scalar_prefetch, prefetch)
        except (BodyWalkError, MosaicDecodeError, ValueError, KeyError, IndexError, TypeError) as e:
            notes.append(f"kernel body not walked ({e}): its work is the author's estimate only")
    except ImportError:  # pragma: no cover
        body = None
    if body is not None:
        notes.append(f"kernel body over the grid (branches evaluated per step): {_fmt(body.mxu_flops)} "
                     f"MXU flops, {_fmt(body.flops - body.mxu_flops)} vector flops, "
                     f"{_fmt(body.transcendentals)} transcendentals"
                     + (f"; {'; '.join(body.notes)}" if body.notes else ""))
        if ce is None:
            notes.append("no cost estimate: FLOPs are the kernel body's count")
    windows: list[WindowTraffic] = []
    data_dep = []
    manual = []
    walked = []
    for w, win in enumerate(k.windows):
        shape = shapes[w]
        is_in = w < n_in
        operand = n_pref + w if is_in else None
        ridx = () if is_in else outs[w - n_in][0]
        if win.block_shape is None and body is not None:
            # manual DMA (ANY / HBM): the bytes of the kernel's own DMAs, walked over the grid
            nb = (body.dma_read_bytes if is_in else body.dma_write_bytes).get(w, 0)
            walked.append(f"{'input' if is_in else 'output'} {w if is_in else w - n_in}")
            windows.append(WindowTraffic(operand, ridx, 1, nb, nb * shape.logical_byte_size
                                         // max(1, shape.byte_size), shape.memory_space, "manual DMA walked"))
            continue
        if win.block_shape is None or win.index_map is None:
            # manual DMA (ANY / HBM) or a grid-free whole-array window: once whole
            assumption = None
            if win.block_shape is None:
                assumption = "manual DMA"
                manual.append(f"{'input' if is_in else 'output'} {w if is_in else w - n_in}")
            windows.append(WindowTraffic(operand, ridx, 1, shape.byte_size, shape.logical_byte_size,
                                         shape.memory_space, assumption))
            continue
        assumption = None
        if reads_prefetch(win.index_map):
            assumption = "data-dependent blocks"
            data_dep.append(f"{'input' if is_in else 'output'} {w if is_in else w - n_in}")
        windows.append(WindowTraffic(operand, ridx, transfers[w], nbytes[w], lbytes[w],
                                     shape.memory_space, assumption))
    pref_bytes = sum(s.byte_size for s in operand_shapes[:n_pref] if s.is_array)
    grid_txt = "x".join(str(g) for g in k.grid) if k.grid else "none (one invocation)"
    notes.append(f"Pallas TPU kernel {k.name}: grid {grid_txt} ({_fmt(k.num_steps)} steps, "
                 f"{', '.join(k.dimension_semantics) or 'no dimension semantics'}); blocks copied when "
                 "their block index changes between consecutive steps (docs/pallas/tpu/details.rst)")
    for wt, win in zip(windows, k.windows):
        if win.block_shape is None:
            continue
        what = f"operand {wt.operand}" if wt.operand is not None else f"result {list(wt.result_index)}"
        notes.append(f"{what}: block {tuple(win.block_shape)}, {_fmt(wt.transfers)} copies, "
                     f"{_fmt(wt.nbytes)} bytes")
    if manual:
        notes.append(f"{', '.join(manual)} in ANY/HBM memory space, moved by the kernel's own DMAs "
                     f"({k.manual_dma_ops} DMA ops in its body): assumed moved once whole")
    if walked:
        notes.append(f"{', '.join(walked)} in ANY/HBM memory space: the bytes of the kernel's own DMAs "
                     f"({body.dma_ops} DMAs over the grid, the body walked with its scalar-prefetch "
                     "contents)")
    if data_dep:
        if all(src is not None for src in sources):
            notes.append(f"{', '.join(data_dep)}: index maps read scalar-prefetch values, evaluated "
                         f"with their contents ({', '.join(sorted(set(sources)))})")
        else:
            notes.append(f"{', '.join(data_dep)}: index maps read scalar-prefetch values (data-dependent): "
                         "assumed distinct entries hold distinct values; give the contents with "
                         f"jaxmove.passes.pallas.set_prefetch_values({k.name!r}, [...]) for exact counts")
    if any(s in ("parallel", "core_parallel") for s in k.dimension_semantics):
        notes.append("counted for one TensorCore walking the whole grid; on a chip with 2 TensorCores "
                     "(megacore) the parallel dimension is split and a block shared across the split "
                     "is fetched by each core")
    total = pref_bytes + sum(w.nbytes for w in windows)
    if ce is not None:
        notes.append(f"FLOPs are the kernel author's cost_estimate ({_fmt(ce.flops)} flops, "
                     f"{_fmt(ce.transcendentals)} transcendentals)")
        if ce.bytes_accessed:
            ratio = total / ce.bytes_accessed
            notes.append(f"author's bytes_accessed {_fmt(ce.bytes_accessed)} vs {_fmt(total)} modeled "
                         f"({ratio:.2f}x)")
    # pipelined DMA profile
    step_dma: tuple[tuple[int, int], ...] = ()
    step_profile: tuple = ()
    fixed_in = sum(w.nbytes for w, win in zip(windows, k.windows) if win.index_map is None
                   and w.operand is not None) + pref_bytes
    fixed_out = sum(w.nbytes for w, win in zip(windows, k.windows) if win.index_map is None
                    and w.operand is None)
    if profile is not None and k.num_steps >= 1:
        ins, outs_b = profile
        d = np.zeros(k.num_steps, dtype=np.int64)
        d[:-1] += ins[1:]
        d[1:] += outs_b[:-1]
        first = int(ins[0]) + int(outs_b[-1]) + fixed_in + fixed_out
        u, c = np.unique(d, return_counts=True)
        step_dma = tuple((int(a), int(b)) for a, b in zip(u, c))
        if body is not None and body.per_step is not None and len(body.per_step[0]) == k.num_steps:
            rows = np.stack([d, *body.per_step], axis=1)
            ur, cr = np.unique(rows, axis=0, return_counts=True)
            step_profile = tuple((int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(n))
                                 for r, n in zip(ur, cr))
    else:
        moved = sum(w.nbytes for w, win in zip(windows, k.windows) if win.index_map is not None)
        first = fixed_in + fixed_out
        step_dma = ((moved // max(1, k.num_steps), k.num_steps),)
        notes.append("grid too long for a per-step DMA profile: the time uses the mean bytes per step")
    notes.sort(key=lambda x: not x.startswith("Pallas TPU kernel"))  # the kernel's line first
    return PallasCost(k, tuple(windows), pref_bytes, ce.flops if ce else 0, ce.transcendentals if ce else 0,
                      ce.bytes_accessed if ce else None, k.num_steps, first, step_dma, tuple(notes), (),
                      n_pref, None if body is None else body.flops,
                      None if body is None else body.mxu_flops,
                      None if body is None else body.transcendentals, step_profile,
                      body is None or not any("larger side" in x for x in body.notes))


def key_body(instr: Instruction) -> str:
    return instr.backend_config["custom_call_config"]["body"]


# ---- the passes' hooks -----------------------------------------------------------------------

def instruction_cost(instr: Instruction, comp, module: Module) -> PallasCost:
    """The :class:`PallasCost` of a ``tpu_custom_call`` in computation ``comp``."""
    ops = [comp.by_name[o] for o in instr.operands]
    return kernel_cost(instr, [o.shape for o in ops], ops)


def pallas_traffic(instr: Instruction, comp, module: Module):
    """The traffic rule of ``tpu_custom_call`` (passes/traffic.py's custom-call rule)."""
    from .traffic import Access, InstrTraffic

    cost = instruction_cost(instr, comp, module)
    reads = []
    for i in range(cost.leading_operands):
        s = comp.by_name[instr.operands[i]].shape
        if s.is_array:
            reads.append(Access(s.byte_size, i, (), s.memory_space, s.logical_byte_size))
    writes = []
    for w in cost.windows:
        if w.operand is not None:
            reads.append(Access(w.nbytes, w.operand, (), w.memory_space, w.logical_nbytes))
        else:
            writes.append(Access(w.nbytes, None, w.result_index, w.memory_space, w.logical_nbytes))
    notes = cost.notes if cost.kernel is not None else ()
    return InstrTraffic(tuple(reads), tuple(writes), tuple(notes), cost.unmodeled)


def pallas_flops(instr: Instruction, module: Module):
    """The flop rule of ``tpu_custom_call``: the author's cost_estimate (passes/flops.py)."""
    from .flops import FlopCount

    ce = cost_estimate_of(instr.backend_config)
    if ce is None:
        comp = module.computations.get(getattr(instr, "computation", None) or "")
        if comp is not None and instr.name in comp.by_name:
            cost = instruction_cost(instr, comp, module)
            if cost.body_flops is not None:
                unm = () if cost.body_exact else (
                    f"custom-call '{instr.name}' (tpu_custom_call): no cost_estimate; the kernel body's "
                    f"{cost.body_flops} flops count the larger side of branches on values not known "
                    "here (give them with set_prefetch_values): an upper bound",)
                return FlopCount(flops=cost.body_flops, transcendentals=cost.body_transcendentals or 0,
                                 unmodeled=unm)
        return FlopCount(flops=0, transcendentals=0,
                         unmodeled=(f"custom-call '{instr.name}' (tpu_custom_call): no cost_estimate "
                                    "in backend_config and its body could not be walked: the Pallas "
                                    "kernel's flops are unknown",))
    return FlopCount(flops=ce.flops, transcendentals=ce.transcendentals)


def pallas_time(cost: PallasCost, spec, dtype: str) -> tuple[float, float, float, list[str], list[str]]:
    """(time_s, compute_s, dma_s, notes, unmodeled) of one call on ``spec`` (see the module doc).

    ``compute_s`` is the author's work at the spec's peaks; ``dma_s`` the modeled bytes at
    ``hbm_bytes_per_s``; ``time_s`` the pipelined total with the per-step overhead (without the
    spec's kernel launch overhead, which the caller adds).
    """
    from .timing import matrix_peak

    notes: list[str] = []
    unmodeled: list[str] = []
    bw = spec.hbm_bytes_per_s
    peak, key, how = matrix_peak(spec, dtype if dtype in spec.flops_per_s else "bf16")
    compute = 0.0
    if cost.flops:
        if peak is None:
            unmodeled.append(f"compute time of the Pallas kernel: {how}")
        else:
            compute += cost.flops / peak
            notes.append(f"the author's flops timed at the {key} peak ({peak:.4g} FLOP/s): the "
                         "cost estimate does not split MXU and vector work")
    if cost.transcendentals:
        vpeak = spec.flops_per_s.get("f32")
        if vpeak is None:
            unmodeled.append(f"spec '{spec.name}' has no f32 (vector unit) peak: the Pallas kernel's "
                             f"{cost.transcendentals} transcendentals untimed")
        else:
            compute += cost.transcendentals / vpeak
    steps = max(1, cost.steps)
    c = compute / steps
    dma_total = cost.read_bytes + cost.write_bytes
    vpeak = spec.flops_per_s.get("f32")
    if cost.step_profile and peak is not None and vpeak is not None:
        # each step's own work, from the kernel body walked over the grid
        per = [(b, mx / peak + (vf + tr) / vpeak, n) for b, mx, vf, tr, n in cost.step_profile]
        compute = sum(ct * n for _, ct, n in per)
        t = cost.first_bytes / bw + sum(n * max(b / bw, ct) for b, ct, n in per)
        notes[:] = [x for x in notes if not x.startswith("the author's flops timed")]
        notes.append(f"each step's compute is its work in the kernel body (MXU flops at the {key} "
                     f"peak, vector flops and transcendentals at the f32 vector peak), not the "
                     "author's estimate spread evenly")
    elif cost.kernel is None or not cost.step_dma:
        t = max(dma_total / bw, compute)
    else:
        t = cost.first_bytes / bw + sum(cnt * max(b / bw, c) for b, cnt in cost.step_dma)
    t += steps * PALLAS_TPU_STEP_OVERHEAD_S
    notes.append(f"pipelined over {steps} grid steps: per step max(DMA, compute) + "
                 f"{PALLAS_TPU_STEP_OVERHEAD_S * 1e6:.2f} us per-step overhead (the ~0.35 us figure "
                 "quoted for Pallas TPU; unverified, not found in jax's docs); "
                 "docs/pallas/pipelining.md 'Analyzing the performance'")
    return t, compute, dma_total / bw, notes, unmodeled


def pallas_instruction_time(row, module: Module, spec):
    """The timing pass's row for a ``tpu_custom_call`` (passes/timing.py calls it)."""
    from .timing import InstructionTime

    instr = row.instr
    comp = module.computations[row.computation]
    pe = row.per_execution
    mult = row.multiplicity.count
    cost = instruction_cost(instr, comp, module)
    ops = [comp.by_name[o].shape for o in instr.operands]
    dtypes = [s.element_type for s in ops[cost.leading_operands:] if s.is_array]
    dtype = dtypes[0] if dtypes else "bf16"
    t, comp_t, mem, notes, unmodeled = pallas_time(cost, spec, dtype)
    unmodeled = list(cost.unmodeled) + unmodeled
    overhead = spec.kernel_launch_overhead_s + cost.steps * PALLAS_TPU_STEP_OVERHEAD_S
    per_exec = t + spec.kernel_launch_overhead_s
    work = per_exec - overhead
    parts = {"compute": comp_t, "memory": mem}
    bound = "overhead" if overhead > work else max(parts, key=lambda k: parts[k])
    hbm = pe.hbm_bytes
    ai = (pe.flops / hbm) if hbm else None
    key = None
    # (the launch is the launch gap; the per-step overhead runs inside the kernel)
    return InstructionTime(
        row.computation, instr.name, instr.opcode, mult, per_exec * mult, comp_t * mult, mem * mult,
        0.0, overhead * mult, bound, ai, hbm * mult, pe.flops * mult, per_exec, key,
        tuple(dict.fromkeys(unmodeled)), tuple(dict.fromkeys(notes)),
        launch_gap_s=spec.kernel_launch_overhead_s * mult)


# ---- Pallas Triton (GPU) ---------------------------------------------------------------------

def triton_traffic(instr: Instruction, comp, module: Module):
    """The traffic rule of ``__gpu$xla.gpu.triton`` (passes/triton.py's per-program walk); an
    undecodable kernel: operand + result bytes once, a lower bound, unmodeled."""
    from .traffic import Access, InstrTraffic
    from .triton import TritonDecodeError

    ops = [comp.by_name[o].shape for o in instr.operands]
    outs = _result_leaves(instr.shape)
    try:
        tc = _triton_cost(instr, len(ops), len(outs))
    except (TritonDecodeError, ValueError, KeyError, TypeError, IndexError) as e:
        lb = _lower_bound(instr, ops, str(e), None)
        reads = tuple(Access(w.nbytes, w.operand, (), w.memory_space, w.logical_nbytes)
                      for w in lb.windows if w.operand is not None)
        writes = tuple(Access(w.nbytes, None, w.result_index, w.memory_space, w.logical_nbytes)
                       for w in lb.windows if w.operand is None)
        return InstrTraffic(reads, writes, (), lb.unmodeled)
    reads = []
    writes = []
    for i, s in enumerate(ops):
        if tc.read_bytes[i] and s.is_array:
            reads.append(Access(tc.read_bytes[i], i, (), s.memory_space,
                                tc.read_bytes[i] * s.logical_byte_size // max(1, s.byte_size)))
    for j, (idx, s) in enumerate(outs):
        k = len(ops) + j
        if tc.read_bytes[k]:  # an output the kernel reads back (accumulation)
            reads.append(Access(tc.read_bytes[k], None, idx, s.memory_space))
        if tc.write_bytes[k]:
            writes.append(Access(tc.write_bytes[k], None, idx, s.memory_space))
    written_inputs = [i for i in range(len(ops)) if tc.write_bytes[i]]
    notes = list(tc.notes)
    if written_inputs:
        notes.append(f"the kernel stores into operand(s) {written_inputs} (aliased outputs): "
                     "counted with the outputs' writes")
        extra = sum(tc.write_bytes[i] for i in written_inputs)
        if outs:
            idx, s = outs[0]
            writes.append(Access(extra, None, idx, s.memory_space))
    return InstrTraffic(tuple(reads), tuple(writes), tuple(notes))


def triton_flops(instr: Instruction, module: Module):
    """The flop rule of ``__gpu$xla.gpu.triton``: its tt.dot ops (passes/triton.py)."""
    from .flops import FlopCount
    from .triton import TritonDecodeError

    comp_outs = _result_leaves(instr.shape)
    try:
        tc = _triton_cost(instr, len(instr.operands), len(comp_outs))
    except (TritonDecodeError, ValueError, KeyError, TypeError, IndexError) as e:
        return FlopCount(flops=0, transcendentals=0,
                         unmodeled=(f"custom-call '{instr.name}' (Pallas Triton): {e}",))
    return FlopCount(flops=tc.flops, transcendentals=0)


def _triton_cost(instr: Instruction, n_ops: int, n_outs: int):
    from .triton import decode_and_cost

    text = instr.attrs.get("backend_config", "") or ""
    key = ("triton", text, n_ops, n_outs)
    hit = _COST_CACHE.get(key)
    if hit is None:
        hit = _COST_CACHE[key] = decode_and_cost(text, n_ops, n_outs)
    return hit


def triton_instruction_time(row, module: Module, spec, launch_s: float | None = None,
                            in_command_buffer: bool = False):
    """The timing pass's row for a Pallas Triton call: launch overhead + max(its tt.dot flops at
    the matrix peak of its first operand's dtype, its modeled HBM bytes / hbm_bytes_per_s)
    (the roofline of passes/timing.py, with the kernel's dots on the tensor cores). The launch
    is ``launch_s`` when given (in a GPU command buffer), else the spec's
    ``kernel_launch_overhead_s``: the row's ``launch_gap_s``, not its kernel duration."""
    from .timing import InstructionTime, matrix_peak

    instr = row.instr
    comp = module.computations[row.computation]
    pe = row.per_execution
    mult = row.multiplicity.count
    ops = [comp.by_name[o].shape for o in instr.operands]
    dtype = next((s.element_type for s in ops if s.is_array), "f32")
    unmodeled = list(row.unmodeled)
    notes: list[str] = []
    comp_t = 0.0
    key = None
    if pe.flops:
        peak, key, how = matrix_peak(spec, dtype)
        if peak is None:
            unmodeled.append(f"compute time of the Pallas Triton kernel: {how}")
        else:
            comp_t = pe.flops / peak
            notes.append(f"its tt.dot flops timed at the {key} matrix peak ({peak:.4g} FLOP/s)")
    mem = pe.hbm_bytes / spec.hbm_bytes_per_s
    overhead = spec.kernel_launch_overhead_s if launch_s is None else launch_s
    work = max(comp_t, mem)
    per_exec = overhead + work
    bound = "overhead" if overhead > work else ("compute" if comp_t >= mem else "memory")
    ai = (pe.flops / pe.hbm_bytes) if pe.hbm_bytes else None
    return InstructionTime(
        row.computation, instr.name, instr.opcode, mult, per_exec * mult, comp_t * mult, mem * mult,
        0.0, overhead * mult, bound, ai, pe.hbm_bytes * mult, pe.flops * mult, per_exec, key,
        tuple(dict.fromkeys(unmodeled)), tuple(dict.fromkeys(notes)),
        launch_gap_s=overhead * mult, in_command_buffer=in_command_buffer)


# ---- one entry for the traffic pass ------------------------------------------------------------

MOSAIC_GPU_TARGET = "mosaic_gpu_v2"
#: The custom-call targets of Pallas kernels this module costs (passes/traffic.py dispatches them).
KERNEL_TARGETS = frozenset({TPU_CUSTOM_CALL_TARGET, "__gpu$xla.gpu.triton", MOSAIC_GPU_TARGET})


def kernel_traffic(instr: Instruction, comp, module: Module):
    """The traffic rule of a Pallas kernel's custom call, by target: Mosaic TPU (grid and
    BlockSpecs), Triton (loads and stores per program), Mosaic GPU (not decoded: operand +
    result bytes once, a lower bound, unmodeled)."""
    from .traffic import Access, InstrTraffic

    target = instr.custom_call_target
    if target == TPU_CUSTOM_CALL_TARGET:
        return pallas_traffic(instr, comp, module)
    if target == "__gpu$xla.gpu.triton":
        return triton_traffic(instr, comp, module)
    ops = [comp.by_name[o].shape for o in instr.operands]
    lb = _lower_bound(instr, ops, "Mosaic GPU kernels are not decoded", None)
    reads = tuple(Access(w.nbytes, w.operand, (), w.memory_space, w.logical_nbytes)
                  for w in lb.windows if w.operand is not None)
    writes = tuple(Access(w.nbytes, None, w.result_index, w.memory_space, w.logical_nbytes)
                   for w in lb.windows if w.operand is None)
    return InstrTraffic(reads, writes, (), lb.unmodeled)


def mosaic_gpu_flops(instr: Instruction, module: Module):
    """The flop rule of a Mosaic GPU kernel: unmodeled (its module is not decoded)."""
    from .flops import FlopCount
    return FlopCount(flops=0, transcendentals=0,
                     unmodeled=(f"custom-call '{instr.name}' ({MOSAIC_GPU_TARGET}): a Pallas Mosaic GPU "
                                "kernel, not decoded: its flops are unknown",))
