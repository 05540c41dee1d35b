"""Mosaic (Pallas TPU) kernels: decode a ``tpu_custom_call``'s kernel and evaluate its index maps.

A Pallas TPU kernel reaches the HLO as ``custom-call(...), custom_call_target="tpu_custom_call"``
whose ``backend_config.custom_call_config.body`` is the base64 MLIR bytecode of the Mosaic module
(jax/_src/tpu_custom_call.py, ``_lower_mosaic_module_to_asm``: serialized by the ``mosaic-serde``
pass, so ops print as ``stable_mosaic.arith.addi`` ...). Its kernel function carries
(jax/_src/pallas/mosaic/lowering.py, ``lower_jaxpr_to_module``):

* ``iteration_bounds``: the grid (row-major: the last grid dimension varies fastest; Pallas TPU
  runs the grid sequentially in lexicographic order, docs/pallas/tpu/details.rst "BlockSpecs and
  grid iteration");
* ``dimension_semantics``: ``parallel`` / ``arbitrary`` / ``core_parallel`` per grid dimension;
* ``scalar_prefetch``: how many leading operands are scalar-prefetch (SMEM) operands, which the
  index maps may read;
* ``window_params``: one entry per input then output: ``window_bounds`` (the block shape; a
  squeezed ``None`` dimension is 1), ``transform_indices`` (the index map, a function of the
  grid indices and the scalar-prefetch refs returning block indices; element offsets with
  ``window_kind = #tpu.element_window``), optional ``pipeline_mode``; an empty entry is an
  ``ANY`` / HBM / semaphore operand the kernel moves itself (manual DMA);
* ``scratch_operands``: trailing VMEM / SMEM / semaphore scratch buffers (no HBM traffic).

``decode_kernel`` reads all this with jaxlib's MLIR bindings (the TPU dialect registered through
``jax._src.lib.tpu.register_dialect``, unregistered ``stable_mosaic.*`` ops allowed) into plain
frozen records; :func:`evaluate_index_map` evaluates an index map over many grid points at once
with numpy (the arith ops an index map lowers to). Everything that cannot be read raises
:class:`MosaicDecodeError`, which the Pallas pass turns into a note and a lower bound.
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, field

import numpy as np

TPU_CUSTOM_CALL_TARGET = "tpu_custom_call"

# Offset of the stand-in values of scalar-prefetch entries when their contents are not given:
# entry e of prefetch ref k reads as SYMBOL_BASE * (k + 1) + e, so distinct entries read as
# distinct values (an assumption the Pallas pass states in its notes).
SYMBOL_BASE = 1 << 40


class MosaicDecodeError(ValueError):
    """The Mosaic body cannot be decoded or an index map cannot be evaluated (why in the text)."""


@dataclass(frozen=True, slots=True)
class CostEstimate:
    """The kernel author's ``pl.CostEstimate`` (``custom_call_config.cost_estimate``), per call."""

    flops: int
    transcendentals: int
    bytes_accessed: int
    remote_bytes_transferred: int = 0


@dataclass(frozen=True, slots=True)
class IndexMapOp:
    """One op of an index map: ``results = name(operands)``; ids index the evaluation env."""

    name: str                  # short op name: "arith.addi", "memref.load", "func.return" ...
    results: tuple[int, ...]
    operands: tuple[int, ...]
    attr: int | None = None    # the integer value of arith.constant, the predicate of arith.cmpi
    in_bits: int | None = None  # operand 0's integer width (extsi / extui / trunci)


@dataclass(frozen=True, slots=True)
class IndexMap:
    """An index map: arguments 0..n_grid-1 are the grid indices, then the scalar-prefetch refs."""

    name: str
    n_args: int
    ops: tuple[IndexMapOp, ...]
    returns: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Window:
    """One input or output of the kernel as its BlockSpec describes it.

    Attributes:
      block_shape: the block (``window_bounds``); None for a manual-DMA (ANY/HBM) operand.
      index_map: the index map, or None (manual DMA, or a grid-free kernel).
      element_window: the index map returns element offsets, not block indices.
      pipeline_mode: ``"synchronous"`` / ``"double_buffered"`` when given, else None.
      memory_space: the kernel argument's memory space (``vmem``, ``any``, ``hbm``, ``smem``,
        ``semaphore_mem`` ...), from its memref type.
    """

    block_shape: tuple[int, ...] | None
    index_map: IndexMap | None
    element_window: bool
    pipeline_mode: str | None
    memory_space: str


@dataclass(frozen=True, slots=True)
class MosaicKernel:
    """The decoded kernel of one ``tpu_custom_call``.

    Attributes:
      name: the kernel function's symbol.
      grid: ``iteration_bounds`` (empty for a grid-free kernel: one invocation); -1 marks a
        dynamic dimension, whose value is a leading operand known only at run time.
      dimension_semantics: per grid dimension.
      num_scalar_prefetch: leading HLO operands that are scalar-prefetch operands.
      num_scratch: trailing scratch operands of the kernel function.
      windows: inputs then outputs.
      prefetch_shapes: the shape of each scalar-prefetch ref (from its memref type).
      cost_estimate: the author's estimate, or None.
      manual_dma_ops: how many ``tpu.enqueue_dma`` ops the kernel body issues (manual DMA).
    """

    name: str
    grid: tuple[int, ...]
    dimension_semantics: tuple[str, ...]
    num_scalar_prefetch: int
    num_scratch: int
    windows: tuple[Window, ...]
    prefetch_shapes: tuple[tuple[int, ...], ...] = ()
    cost_estimate: CostEstimate | None = None
    manual_dma_ops: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def num_steps(self) -> int:
        """Grid steps (-1 when a grid dimension is dynamic)."""
        if any(g < 0 for g in self.grid):
            return -1
        return math.prod(self.grid) if self.grid else 1

    @property
    def num_dynamic_grid_dims(self) -> int:
        """Dynamic grid dimensions: each is a leading s32[] operand of the custom call (before
        the scalar-prefetch operands)."""
        return sum(1 for g in self.grid if g < 0)


def cost_estimate_of(backend_config: dict | None) -> CostEstimate | None:
    """The author's cost estimate from a tpu_custom_call's backend_config, or None."""
    cc = (backend_config or {}).get("custom_call_config")
    ce = cc.get("cost_estimate") if isinstance(cc, dict) else None
    if not isinstance(ce, dict):
        return None
    try:
        return CostEstimate(int(ce.get("flops", 0)), int(ce.get("transcendentals", 0)),
                            int(ce.get("bytes_accessed", 0)), int(ce.get("remote_bytes_transferred", 0)))
    except (TypeError, ValueError):
        return None


def _short(name: str) -> str:
    return name[len("stable_mosaic."):] if name.startswith("stable_mosaic.") else name


_MEMSPACE = re.compile(r"#tpu\.memory_space<(\w+)>")
_INT_TYPE = re.compile(r"^i(\d+)$")


def _memref_space(type_text: str) -> str:
    m = _MEMSPACE.search(type_text)
    return m.group(1) if m else ("vmem" if type_text.startswith("memref") else "none")


def _memref_dims(type_text: str) -> tuple[int, ...]:
    m = re.match(r"memref<([^,>]*)", type_text)
    if not m:
        return ()
    parts = m.group(1).split("x")[:-1]  # the last part is the element type
    return tuple(int(p) if p.isdigit() else -1 for p in parts)


def _int_bits(type_text: str) -> int | None:
    if type_text == "index":
        return 64
    m = _INT_TYPE.match(type_text)
    return int(m.group(1)) if m else None


def _int_attr(attr) -> int:
    from jaxlib.mlir import ir
    try:
        return int(ir.IntegerAttr(attr).value)
    except (ValueError, TypeError):
        pass
    try:
        return int(ir.BoolAttr(attr).value)
    except (ValueError, TypeError):
        pass
    text = str(attr)
    m = re.match(r"^(true|false|-?\d+)", text)
    if not m:
        raise MosaicDecodeError(f"cannot read integer attribute {text!r}")
    return {"true": 1, "false": 0}[m.group(1)] if m.group(1) in ("true", "false") else int(m.group(1))


def _read_index_map(func_op) -> IndexMap:
    name = str(func_op.attributes["sym_name"]).strip('"')
    block = func_op.regions[0].blocks[0]
    ids: dict = {}
    for a in block.arguments:
        ids[a] = len(ids)
    n_args = len(ids)
    ops: list[IndexMapOp] = []
    returns: tuple[int, ...] | None = None
    for op in block.operations:
        op = op.operation
        short = _short(op.name)
        try:
            operands = tuple(ids[v] for v in op.operands)
        except KeyError as e:
            raise MosaicDecodeError(f"index map {name}: {short} uses a value defined elsewhere") from e
        if short == "func.return":
            returns = operands
            continue
        results = []
        for r in op.results:
            ids[r] = len(ids)
            results.append(ids[r])
        attr = None
        in_bits = None
        if short == "arith.constant":
            attr = _int_attr(op.attributes["value"])
        elif short == "arith.cmpi":
            attr = _int_attr(op.attributes["predicate"])
        if short in ("arith.extsi", "arith.extui", "arith.trunci") and len(op.operands):
            in_bits = _int_bits(str(op.operands[0].type))
        if short == "arith.trunci" and len(op.results):
            attr = _int_bits(str(op.results[0].type))
        ops.append(IndexMapOp(short, tuple(results), operands, attr, in_bits))
    if returns is None:
        raise MosaicDecodeError(f"index map {name}: no func.return")
    return IndexMap(name, n_args, tuple(ops), returns)


def _count_ops(region_owner, names: frozenset[str]) -> int:
    n = 0
    stack = [region_owner]
    while stack:
        op = stack.pop()
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    inner = inner.operation
                    if _short(inner.name) in names:
                        n += 1
                    stack.append(inner)
    return n


def decode_body(body_b64: str) -> MosaicKernel:
    """Decode a base64 Mosaic module (``custom_call_config.body``) into a :class:`MosaicKernel`.

    Raises:
      MosaicDecodeError: jaxlib's MLIR bindings are missing, the body is not valid base64 / MLIR
        bytecode, or the module has no kernel function or malformed attributes.
    """
    try:
        raw = base64.b64decode(body_b64, validate=False)
    except (ValueError, TypeError) as e:
        raise MosaicDecodeError(f"body is not base64: {e}") from e
    try:
        from jaxlib.mlir import ir
        from jax._src.lib import tpu as _tpu
    except ImportError as e:  # pragma: no cover - jax is a dependency
        raise MosaicDecodeError(f"jaxlib MLIR bindings unavailable: {e}") from e
    ctx = ir.Context()
    try:
        _tpu.register_dialect(ctx)
    except Exception as e:  # noqa: BLE001 - an older/newer jaxlib without the hook
        raise MosaicDecodeError(f"cannot register the TPU dialect: {type(e).__name__}: {e}") from e
    ctx.allow_unregistered_dialects = True
    with ctx:
        try:
            module = ir.Module.parse(raw)
        except Exception as e:  # noqa: BLE001 - MLIRError, ValueError: unreadable body
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise MosaicDecodeError(f"MLIR bytecode does not parse: {msg}") from e
        funcs = {}
        main = None
        for op in module.body.operations:
            op = op.operation
            if _short(op.name) != "func.func":
                continue
            sym = str(op.attributes["sym_name"]).strip('"') if "sym_name" in op.attributes else ""
            funcs[sym] = op
            if main is None and ("window_params" in op.attributes or "iteration_bounds" in op.attributes):
                main = op
        if main is None:
            # a grid-free kernel: the function that is not an index map
            cands = [op for s, op in funcs.items() if not s.startswith("transform_")]
            if len(cands) != 1:
                raise MosaicDecodeError(f"no kernel function among {sorted(funcs)}")
            main = cands[0]
        attrs = main.attributes
        name = str(attrs["sym_name"]).strip('"')
        grid: tuple[int, ...] = ()
        if "iteration_bounds" in attrs:
            grid = tuple(int(x) for x in ir.DenseI64ArrayAttr(attrs["iteration_bounds"]))
            grid = tuple(-1 if g < 0 else g for g in grid)  # -1: a dynamic grid dimension
        sems: tuple[str, ...] = ()
        if "dimension_semantics" in attrs:
            sems = tuple(re.sub(r"^#tpu\.dimension_semantics<(\w+)>$", r"\1", str(a))
                         for a in ir.ArrayAttr(attrs["dimension_semantics"]))
        n_pref = _int_attr(attrs["scalar_prefetch"]) if "scalar_prefetch" in attrs else 0
        n_scratch = _int_attr(attrs["scratch_operands"]) if "scratch_operands" in attrs else 0
        arg_types = [str(a.type) for a in main.regions[0].blocks[0].arguments]
        n_grid = len(grid)
        window_args = arg_types[n_grid + n_pref: len(arg_types) - n_scratch]
        pref_types = arg_types[n_grid: n_grid + n_pref]
        windows: list[Window] = []
        if "window_params" in attrs:
            params = list(ir.ArrayAttr(attrs["window_params"]))
        else:
            params = [None] * len(window_args)
        if len(params) != len(window_args):
            raise MosaicDecodeError(f"kernel {name}: {len(params)} window_params for "
                                    f"{len(window_args)} window operands")
        for p, t in zip(params, window_args):
            space = _memref_space(t)
            if p is None:
                windows.append(Window(_memref_dims(t) if space not in ("any", "hbm", "semaphore_mem") else None,
                                      None, False, None, space))
                continue
            d = ir.DictAttr(p)
            if "window_bounds" not in d:
                windows.append(Window(None, None, False, None, space))
                continue
            bounds = tuple(int(x) for x in ir.DenseI64ArrayAttr(d["window_bounds"]))
            imap = None
            if "transform_indices" in d:
                sym = str(d["transform_indices"]).lstrip("@").strip('"')
                if sym not in funcs:
                    raise MosaicDecodeError(f"kernel {name}: index map @{sym} not in the module")
                imap = _read_index_map(funcs[sym])
            elem = "window_kind" in d and "element_window" in str(d["window_kind"])
            mode = None
            if "pipeline_mode" in d:
                mode = re.sub(r"^#tpu\.pipeline_mode<(\w+)>$", r"\1", str(d["pipeline_mode"]))
            windows.append(Window(bounds, imap, elem, mode, space))
        n_dma = _count_ops(main, frozenset({"tpu.enqueue_dma", "tpu.enqueue_indirect_dma"}))
        return MosaicKernel(name, grid, sems, n_pref, n_scratch, tuple(windows),
                            tuple(_memref_dims(t) for t in pref_types), None, n_dma)


def decode_kernel(backend_config: dict | None) -> MosaicKernel:
    """The :class:`MosaicKernel` of a tpu_custom_call from its parsed backend_config.

    Raises:
      MosaicDecodeError: no ``custom_call_config.body``, or the body cannot be decoded.
    """
    cc = (backend_config or {}).get("custom_call_config")
    body = cc.get("body") if isinstance(cc, dict) else None
    if not isinstance(body, str) or not body:
        raise MosaicDecodeError("no custom_call_config.body in backend_config")
    k = decode_body(body)
    return MosaicKernel(k.name, k.grid, k.dimension_semantics, k.num_scalar_prefetch, k.num_scratch,
                        k.windows, k.prefetch_shapes, cost_estimate_of(backend_config),
                        k.manual_dma_ops, k.notes)


# ---- index-map evaluation ----------------------------------------------------------------

def _trunc_div(a, b):
    b = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) ^ (b < 0), -q, q)


_CMP = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater,
        5: np.greater_equal, 6: np.less, 7: np.less_equal, 8: np.greater, 9: np.greater_equal}

_BINARY = {
    "arith.addi": np.add, "arith.subi": np.subtract, "arith.muli": np.multiply,
    "arith.divsi": _trunc_div, "arith.divui": lambda a, b: a // np.where(b == 0, 1, b),
    "arith.remsi": lambda a, b: a - b * _trunc_div(a, b),
    "arith.remui": lambda a, b: a % np.where(b == 0, 1, b),
    "arith.floordivsi": lambda a, b: a // np.where(b == 0, 1, b),
    "arith.ceildivsi": lambda a, b: -((-a) // np.where(b == 0, 1, b)),
    "arith.ceildivui": lambda a, b: -((-a) // np.where(b == 0, 1, b)),
    "arith.minsi": np.minimum, "arith.maxsi": np.maximum,
    "arith.minui": np.minimum, "arith.maxui": np.maximum,
    "arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor,
    "arith.shli": np.left_shift, "arith.shrsi": np.right_shift, "arith.shrui": np.right_shift,
}
_PASS = frozenset({"arith.index_cast", "arith.index_castui", "arith.bitcast", "tpu.assume_multiple"})


def evaluate_index_map(imap: IndexMap, grid_idx: list[np.ndarray],
                       prefetch: list[np.ndarray | None] | None = None) -> tuple[np.ndarray, ...]:
    """Evaluate ``imap`` at many grid points at once.

    Args:
      grid_idx: one int64 array per grid dimension, all of one length N (the grid points).
      prefetch: per scalar-prefetch ref, its contents, or None: entry e of ref k then reads as
        ``SYMBOL_BASE * (k + 1) + e`` (distinct entries read as distinct values).

    Returns:
      one int64 array of length N per returned index.

    Raises:
      MosaicDecodeError: an op this evaluator does not know, or a read of a ref that is not a
        scalar-prefetch argument.
    """
    n = len(grid_idx[0]) if grid_idx else 1
    env: dict[int, object] = {}
    for i, g in enumerate(grid_idx):
        env[i] = g
    n_grid = len(grid_idx)
    for op in imap.ops:
        name = op.name
        args = [env.get(o) for o in op.operands]
        if name == "arith.constant":
            val = np.full(n, op.attr, dtype=np.int64)
        elif name in _BINARY:
            val = _BINARY[name](np.asarray(args[0], dtype=np.int64), np.asarray(args[1], dtype=np.int64))
        elif name == "arith.cmpi":
            val = _CMP[op.attr](args[0], args[1]).astype(np.int64)
        elif name == "arith.select":
            val = np.where(np.asarray(args[0]) != 0, args[1], args[2])
        elif name == "arith.extui":
            val = np.asarray(args[0], dtype=np.int64)
        elif name == "arith.extsi":
            val = -np.asarray(args[0], dtype=np.int64) if op.in_bits == 1 else np.asarray(args[0], dtype=np.int64)
        elif name == "arith.trunci":
            bits = op.attr or 64
            val = np.asarray(args[0], dtype=np.int64)
            if bits == 1:
                val = val & 1
        elif name in _PASS:
            val = args[0]
        elif name == "memref.load":
            ref = op.operands[0]
            k = ref - n_grid
            if not (0 <= k < imap.n_args - n_grid):
                raise MosaicDecodeError(f"index map {imap.name}: memref.load of a non-prefetch value")
            idx = [np.asarray(a, dtype=np.int64) for a in args[1:]]
            table = prefetch[k] if prefetch and k < len(prefetch) else None
            if table is not None:
                t = np.asarray(table)
                if t.ndim != len(idx):
                    raise MosaicDecodeError(f"index map {imap.name}: prefetch ref {k} given with rank "
                                            f"{t.ndim}, read with {len(idx)} indices")
                clipped = tuple(np.clip(ix, 0, t.shape[d] - 1) for d, ix in enumerate(idx))
                val = t[clipped].astype(np.int64) if idx else np.full(n, int(t), dtype=np.int64)
            else:
                flat = np.zeros(n, dtype=np.int64)
                for ix in idx:
                    flat = flat * (1 << 20) + ix
                val = SYMBOL_BASE * (k + 1) + flat
        else:
            raise MosaicDecodeError(f"index map {imap.name}: op {name} not modeled")
        if len(op.results) != 1:
            raise MosaicDecodeError(f"index map {imap.name}: op {name} has {len(op.results)} results")
        env[op.results[0]] = np.broadcast_to(np.asarray(val, dtype=np.int64), (n,))
    out = []
    for r in imap.returns:
        v = env.get(r)
        if v is None:
            raise MosaicDecodeError(f"index map {imap.name}: returns an argument that is not an index")
        out.append(np.broadcast_to(np.asarray(v, dtype=np.int64), (n,)))
    return tuple(out)


def reads_prefetch(imap: IndexMap) -> bool:
    """Whether the index map reads a scalar-prefetch ref (its blocks are data-dependent)."""
    return any(op.name == "memref.load" for op in imap.ops)
