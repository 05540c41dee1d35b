"""Walk a Mosaic (Pallas TPU) kernel body over its grid: MXU / vector work and manual DMAs.

The kernel function of a ``tpu_custom_call`` (passes/mosaic.py) is read once into plain records,
then interpreted at every grid step with the grid indices known: scalar integer arithmetic, the
scalar-prefetch refs' contents when known (``memref.load``; SMEM scratch written by
``memref.store`` keeps its values across steps), ``scf.for`` run iteration by iteration (its
carried scalars updated by ``scf.yield``), ``scf.if`` taking its branch (the larger one, said in
the notes, when its condition is not known). Counted per step:

* ``tpu.matmul`` of ``lhs x rhs -> [.., M, N]``: ``2 * elements(result) * K`` flops, K the lhs
  contracting dimension (``dimension_numbers``); ``vector.contract`` likewise;
* elementwise float ops on vectors (``arith.addf`` ...): one flop per result element;
  ``math.exp`` / ``log`` / ``tanh`` / ``rsqrt`` ...: one transcendental per element;
* ``tpu.enqueue_dma``: the bytes of its source memref (shape x element width), HBM -> VMEM when
  the source is in ``any`` / ``hbm`` memory space, VMEM -> HBM when the target is, attributed to
  the kernel argument the memref is sliced from.

What cannot be walked (a loop whose bounds depend on unknown values, an op it does not know
that yields a scalar used by control flow) raises :class:`BodyWalkError`; the caller keeps its
window-level figures and its assumptions.
"""

from __future__ import annotations

from .mlir_arith import INT_BINARY_OPS

import math
import re
from dataclasses import dataclass

from .mosaic import _int_attr, _short

#: Interpreted ops per kernel call above which the walk gives up (the grid is too long).
MAX_INTERPRETED_OPS = 3_000_000

_ELEM_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "f64": 8, "i32": 4, "i16": 2, "i8": 1, "i1": 1,
               "i64": 8, "si32": 4, "ui32": 4, "f8E4M3FN": 1, "f8E5M2": 1, "i4": 0.5}
_TRANSCENDENTAL = frozenset({"math.exp", "math.exp2", "math.log", "math.log1p", "math.tanh",
                             "math.rsqrt", "math.sqrt", "math.sin", "math.cos", "math.erf",
                             "math.powf", "math.logistic", "tpu.reciprocal"})
_VECTOR_FLOPS = frozenset({"arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.maximumf",
                           "arith.minimumf", "arith.negf", "arith.maxnumf", "arith.minnumf",
                           "math.absf"})
_SLICES = frozenset({"tpu.memref_slice", "tpu.memref_squeeze", "tpu.memref_reshape",
                     "tpu.memref_bitcast", "memref.subview", "memref.reinterpret_cast",
                     "tpu.reinterpret_cast", "memref.cast"})
_BIN = INT_BINARY_OPS
_CMP = [lambda a, b: a == b, lambda a, b: a != b, lambda a, b: a < b, lambda a, b: a <= b,
        lambda a, b: a > b, lambda a, b: a >= b, lambda a, b: a < b, lambda a, b: a <= b,
        lambda a, b: a > b, lambda a, b: a >= b]
_PASS = frozenset({"arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui",
                   "arith.trunci", "arith.bitcast", "tpu.assume_multiple"})


class BodyWalkError(ValueError):
    """The kernel body cannot be walked (why in the text)."""


@dataclass(slots=True)
class _Op:
    name: str
    operands: tuple[int, ...]
    results: tuple[int, ...]
    value: int | None = None
    flops: int = 0
    mxu: bool = False
    transcendentals: int = 0
    dma_bytes: int = 0
    dma_src_space: str = ""
    dma_dst_space: str = ""
    dma_dst: int = -1
    blocks: tuple = ()


def _memref_info(t: str) -> tuple[int, str]:
    """(bytes, memory space) of a memref type text."""
    m = re.match(r"memref<([^,>]*)", t)
    if not m:
        return 0, ""
    parts = m.group(1).split("x")
    elem = parts[-1].strip()
    dims = [int(p) for p in parts[:-1] if p.strip().isdigit()]
    size = _ELEM_BYTES.get(elem)
    if size is None:
        raise BodyWalkError(f"memref element type {elem!r} not modeled")
    sp = re.search(r"#tpu\.memory_space<(\w+)>", t)
    return int(math.prod(dims) * size) if dims or not parts[:-1] else 0, (sp.group(1) if sp else "vmem")


def _vec_elems(t: str) -> int:
    m = re.match(r"vector<([0-9x]+)x\w+>", t)
    if not m:
        return 0
    return math.prod(int(x) for x in m.group(1).split("x"))


def _vec_dims(t: str) -> list[int]:
    m = re.match(r"vector<([0-9x]+)x\w+>", t)
    return [int(x) for x in m.group(1).split("x")] if m else []


def _read_block(block, ids: dict) -> tuple[tuple[int, ...], list[_Op]]:
    def vid(v):
        k = ids.get(v)
        if k is None:
            k = ids[v] = len(ids)
        return k

    args = tuple(vid(a) for a in block.arguments)
    ops: list[_Op] = []
    for op in block.operations:
        op = op.operation
        name = _short(op.name)
        o = _Op(name, tuple(vid(v) for v in op.operands), tuple(vid(r) for r in op.results))
        if name == "arith.constant":
            t = str(op.results[0].type)
            if t.startswith("i") or t == "index":
                try:
                    o.value = _int_attr(op.attributes["value"])
                except ValueError:
                    o.value = None
        elif name == "arith.cmpi":
            o.value = _int_attr(op.attributes["predicate"])
        elif name == "tpu.matmul" or name == "vector.contract":
            res = str(op.results[0].type)
            lhs = _vec_dims(str(op.operands[0].type))
            k = None
            if "dimension_numbers" in op.attributes:
                m = re.search(r"<\[(\d+)", str(op.attributes["dimension_numbers"]))
                if m and lhs:
                    k = lhs[int(m.group(1))]
            if k is None and lhs:
                k = lhs[-2] if op.attributes and "transpose_lhs" in op.attributes and \
                    str(op.attributes["transpose_lhs"]) == "true" else lhs[-1]
            o.flops = 2 * _vec_elems(res) * (k or 0)
            o.mxu = True
        elif name in _VECTOR_FLOPS and op.results and str(op.results[0].type).startswith("vector"):
            o.flops = _vec_elems(str(op.results[0].type))
        elif name in _TRANSCENDENTAL and op.results and str(op.results[0].type).startswith("vector"):
            o.transcendentals = _vec_elems(str(op.results[0].type))
        elif name == "tpu.enqueue_dma":
            seg_txt = str(op.attributes["operandSegmentSizes"]) if "operandSegmentSizes" in op.attributes \
                else "array<i32: 1, 0, 1, 1>"
            seg = [int(x) for x in re.findall(r"-?\d+", seg_txt.split(":", 1)[-1])]
            src_i = 0
            dst_i = seg[0] + (seg[1] if len(seg) > 1 else 0)
            nb, ssp = _memref_info(str(op.operands[src_i].type))
            _, dsp = _memref_info(str(op.operands[dst_i].type))
            o.dma_bytes, o.dma_src_space, o.dma_dst_space = nb, ssp, dsp
            o.dma_dst = dst_i
        if op.regions and name in ("scf.for", "scf.if", "scf.while"):
            o.blocks = tuple(_read_block(r.blocks[0], ids) if len(r.blocks) else ((), [])
                             for r in op.regions)
        ops.append(o)
    return args, ops


@dataclass(frozen=True, slots=True)
class BodyCount:
    """What the kernel body does over the whole grid, per call."""

    flops: int                    # matrix (MXU) + vector flops
    mxu_flops: int                # of them, tpu.matmul / vector.contract
    transcendentals: int
    dma_read_bytes: dict          # kernel argument number -> bytes copied HBM -> VMEM
    dma_write_bytes: dict         # kernel argument number -> bytes copied VMEM -> HBM
    dma_ops: int
    notes: tuple[str, ...]
    per_step: tuple | None = None  # (mxu flops, vector flops, transcendentals) int64 arrays per step


class _Walker:
    def __init__(self, body, arg_ids: tuple[int, ...], n_grid: int, prefetch: dict[int, object]):
        self.body = body
        self.arg_ids = arg_ids
        self.n_grid = n_grid
        self.prefetch = prefetch      # value id of a prefetch ref -> its contents (numpy) or None
        self.smem: dict = {}          # (ref id, indices) -> value, stored by memref.store
        self.origin = {a: i for i, a in enumerate(arg_ids)}
        self.flops = 0
        self.mxu = 0
        self.trans = 0
        self.reads: dict[int, int] = {}
        self.writes: dict[int, int] = {}
        self.dmas = 0
        self.count = 0
        self.notes: set[str] = set()

    def step(self, idx: tuple[int, ...]) -> None:
        env = {self.arg_ids[i]: int(v) for i, v in enumerate(idx)}
        self._block(self.body[1], env)

    def _block(self, ops, env) -> list | None:
        self.count += len(ops)
        if self.count > MAX_INTERPRETED_OPS:
            raise BodyWalkError(f"over {MAX_INTERPRETED_OPS} interpreted ops")
        origin = self.origin
        for op in ops:
            name = op.name
            if name == "arith.constant":
                if op.value is not None:
                    env[op.results[0]] = op.value
            elif name in _BIN:
                a, b = env.get(op.operands[0]), env.get(op.operands[1])
                if a is not None and b is not None:
                    env[op.results[0]] = _BIN[name](a, b)
            elif name in _PASS:
                v = env.get(op.operands[0])
                if v is not None:
                    env[op.results[0]] = v
            elif name == "arith.cmpi":
                a, b = env.get(op.operands[0]), env.get(op.operands[1])
                if a is not None and b is not None and op.value is not None and 0 <= op.value < 10:
                    env[op.results[0]] = int(_CMP[op.value](a, b))
            elif name == "arith.select":
                c = env.get(op.operands[0])
                if c is not None:
                    v = env.get(op.operands[1] if c else op.operands[2])
                    if v is not None:
                        env[op.results[0]] = v
            elif name in _SLICES:
                src = origin.get(op.operands[0])
                if src is not None:
                    origin[op.results[0]] = src
            elif name == "memref.load":
                ref = op.operands[0]
                idx = tuple(env.get(i) for i in op.operands[1:])
                if None not in idx:
                    if (ref, idx) in self.smem:
                        env[op.results[0]] = self.smem[(ref, idx)]
                    else:
                        table = self.prefetch.get(ref)
                        if table is not None:
                            try:
                                env[op.results[0]] = int(table[idx] if idx else table)
                            except (IndexError, TypeError):
                                pass
            elif name == "memref.store":
                ref = op.operands[1]
                idx = tuple(env.get(i) for i in op.operands[2:])
                v = env.get(op.operands[0])
                if None not in idx:
                    if v is None:
                        self.smem.pop((ref, idx), None)
                    else:
                        self.smem[(ref, idx)] = v
            elif op.flops:
                self.flops += op.flops
                if op.mxu:
                    self.mxu += op.flops
            elif op.transcendentals:
                self.trans += op.transcendentals
            elif name == "tpu.enqueue_dma":
                self.dmas += 1
                src = origin.get(op.operands[0])
                dst = origin.get(op.operands[op.dma_dst]) if op.dma_dst >= 0 else None
                if op.dma_src_space in ("any", "hbm") and op.dma_dst_space not in ("any", "hbm"):
                    if src is None:
                        raise BodyWalkError("a DMA from HBM whose source is not a kernel argument")
                    self.reads[src] = self.reads.get(src, 0) + op.dma_bytes
                elif op.dma_dst_space in ("any", "hbm") and op.dma_src_space not in ("any", "hbm"):
                    if dst is None:
                        raise BodyWalkError("a DMA to HBM whose target is not a kernel argument")
                    self.writes[dst] = self.writes.get(dst, 0) + op.dma_bytes
                elif op.dma_src_space in ("any", "hbm"):
                    self.notes.add("HBM -> HBM DMAs counted as a read and a write")
                    if src is not None:
                        self.reads[src] = self.reads.get(src, 0) + op.dma_bytes
                    if dst is not None:
                        self.writes[dst] = self.writes.get(dst, 0) + op.dma_bytes
            elif name == "scf.for":
                lb, ub, st = (env.get(op.operands[i]) for i in range(3))
                if lb is None or ub is None or not st:
                    raise BodyWalkError("scf.for with bounds that are not known")
                bargs, body = op.blocks[0]
                carried = [env.get(o) for o in op.operands[3:]]
                for k, barg in enumerate(bargs[1:]):
                    if 3 + k < len(op.operands) and op.operands[3 + k] in origin:
                        origin[barg] = origin[op.operands[3 + k]]
                iv = lb
                while iv < ub:
                    inner = dict(env)
                    inner[bargs[0]] = iv
                    for k, barg in enumerate(bargs[1:]):
                        if k < len(carried) and carried[k] is not None:
                            inner[barg] = carried[k]
                        else:
                            inner.pop(barg, None)
                    y = self._block(body, inner)
                    carried = list(y) if y is not None else [None] * len(carried)
                    iv += st
                for k, r in enumerate(op.results):
                    if k < len(carried) and carried[k] is not None:
                        env[r] = carried[k]
            elif name == "scf.if":
                c = env.get(op.operands[0])
                branches = [b[1] for b in op.blocks]
                if c is not None:
                    chosen = branches[0] if c else (branches[1] if len(branches) > 1 else None)
                    y = self._block(chosen, env) if chosen is not None else None
                    if y is not None:
                        for k, r in enumerate(op.results):
                            if k < len(y) and y[k] is not None:
                                env[r] = y[k]
                else:
                    before = (self.flops, self.mxu, self.trans, dict(self.reads), dict(self.writes),
                              self.dmas)
                    best = None
                    for br in branches:
                        self.flops, self.mxu, self.trans = before[0], before[1], before[2]
                        self.reads, self.writes, self.dmas = dict(before[3]), dict(before[4]), before[5]
                        self._block(br, dict(env))
                        tot = self.flops + sum(self.reads.values()) + sum(self.writes.values())
                        if best is None or tot > best[0]:
                            best = (tot, self.flops, self.mxu, self.trans, dict(self.reads),
                                    dict(self.writes), self.dmas)
                    if best is not None:
                        _, self.flops, self.mxu, self.trans, self.reads, self.writes, self.dmas = best
                        self.notes.add("a branch on a value not known statically: its larger side counted")
                    else:
                        self.flops, self.mxu, self.trans, self.reads, self.writes, self.dmas = before
            elif name == "scf.yield":
                return [env.get(o) for o in op.operands]
            elif name == "scf.while":
                raise BodyWalkError("scf.while: trip count unknown")
        return None


def walk_body(body_b64: str, grid: tuple[int, ...], n_prefetch: int,
              prefetch_values: list | tuple) -> BodyCount:
    """Walk the kernel body of a Mosaic module over ``grid`` (passes/mosaic.py's decoded grid,
    dynamic dimensions resolved). ``prefetch_values``: per scalar-prefetch ref its contents
    (array-like) or None.

    Raises:
      BodyWalkError: the body cannot be walked (see the module docstring).
    """
    import base64

    import numpy as np
    from jaxlib.mlir import ir
    from jax._src.lib import tpu as _tpu

    from .mosaic import MosaicDecodeError

    ctx = ir.Context()
    _tpu.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    with ctx:
        try:
            module = ir.Module.parse(base64.b64decode(body_b64))
        except Exception as e:  # noqa: BLE001
            raise BodyWalkError(f"body does not parse: {type(e).__name__}") from e
        main = None
        for op in module.body.operations:
            op = op.operation
            if _short(op.name) == "func.func" and ("window_params" in op.attributes
                                                     or "iteration_bounds" in op.attributes):
                main = op
                break
        if main is None:
            raise BodyWalkError("no kernel function with a grid")
        ids: dict = {}
        try:
            body = _read_block(main.regions[0].blocks[0], ids)
        except MosaicDecodeError as e:
            raise BodyWalkError(str(e)) from e
    n_grid = len(grid)
    arg_ids = body[0]
    prefetch = {}
    for j in range(n_prefetch):
        v = prefetch_values[j] if j < len(prefetch_values) else None
        prefetch[arg_ids[n_grid + j]] = None if v is None else np.asarray(v)
    w = _Walker(body, arg_ids, n_grid, prefetch)
    steps = math.prod(grid) if grid else 1
    if steps * max(1, len(body[1])) > MAX_INTERPRETED_OPS:
        raise BodyWalkError(f"{steps} grid steps x {len(body[1])} ops: too long to walk")
    mxu = np.zeros(steps, dtype=np.int64)
    vec = np.zeros(steps, dtype=np.int64)
    trans = np.zeros(steps, dtype=np.int64)
    for flat in range(steps):
        idx = np.unravel_index(flat, grid) if grid else ()
        m0, f0, t0 = w.mxu, w.flops, w.trans
        w.step(tuple(int(i) for i in idx))
        mxu[flat] = w.mxu - m0
        vec[flat] = (w.flops - f0) - (w.mxu - m0)
        trans[flat] = w.trans - t0
    # kernel argument number -> window position (after the grid indices and prefetch refs)
    first = n_grid + n_prefetch
    reads = {a - first: b for a, b in w.reads.items() if a >= first}
    writes = {a - first: b for a, b in w.writes.items() if a >= first}
    return BodyCount(w.flops, w.mxu, w.trans, reads, writes, w.dmas, tuple(sorted(w.notes)),
                     (mxu, vec, trans))
