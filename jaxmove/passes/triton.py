"""Pallas Triton kernels on GPU (``__gpu$xla.gpu.triton``): bytes and flops per program instance
from the kernel's loads, stores and dots, times its grid.

Pallas's Triton lowering (jax/_src/pallas/triton/pallas_call_registration.py) emits
``custom-call(...), custom_call_target="__gpu$xla.gpu.triton"`` whose ``backend_config`` is an
MLIR attribute dictionary: ``grid_x``, ``grid_y``, ``grid_z``, ``num_warps``, ``num_stages``,
``name`` and ``ir``, the Triton module as MLIR bytecode (string-escaped). The kernel function's
pointer arguments are the call's operands, then its results.

Per program instance (one point of the grid), with its program ids known, the kernel body is
walked: scalar integer arithmetic is evaluated (so a loop bound such as a causal attention's
``(pid + 1) * block_q / block_k`` is known), ``scf.for`` bodies count their trip count times,
``scf.if`` counts its larger branch (said in the notes), and an ``scf.for`` whose bound is
data-dependent (a length read from memory) but capped by a known value (``minsi(x, 4)``; upper
bounds are carried through monotone integer ops) counts its cap, said in the notes; every ``tt.load`` reads and every
``tt.store`` writes its tensor's elements: a mask that compares a ``make_range`` with a known
scalar (the rows of a padded head block) moves only its true lanes; any other mask counts every
element (an upper bound at a partial edge block), attributed to the pointer argument it is derived from; ``tt.dot`` of
``[M, K] x [K, N]`` counts ``2*M*N*K`` flops. What cannot be walked raises
:class:`TritonDecodeError`; the caller then costs the call as operand + result bytes once, a
lower bound, unmodeled.

The bytes are what the kernel asks of global memory; L2 hits among the program instances (k/v
blocks shared by the q blocks of one head) are not modeled: HBM traffic may be lower.
"""

from __future__ import annotations

from .mlir_arith import INT_BINARY_OPS

import math
import re
from dataclasses import dataclass

TRITON_CUSTOM_CALL_TARGET = "__gpu$xla.gpu.triton"

#: Grids with more program instances than this are not walked one by one.
MAX_PROGRAMS = 1 << 14

_ELEM_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64, "i1": 8, "i8": 8, "i16": 16, "i32": 32,
              "i64": 64, "f8E4M3FN": 8, "f8E5M2": 8, "f8E4M3FNUZ": 8, "f8E5M2FNUZ": 8}


class TritonDecodeError(ValueError):
    """The Triton kernel cannot be decoded or walked (why in the text)."""


@dataclass(frozen=True, slots=True)
class TritonCost:
    """Per call: bytes read / written per pointer argument, flops, and the grid."""

    name: str
    grid: tuple[int, int, int]
    read_bytes: tuple[int, ...]    # per pointer argument (operands, then results)
    write_bytes: tuple[int, ...]
    flops: int
    notes: tuple[str, ...]


def _unescape(s: str) -> bytes:
    out = bytearray()
    j = 0
    n = len(s)
    while j < n:
        c = s[j]
        if c == "\\":
            nx = s[j + 1: j + 2]
            if nx in ('\\', '"'):
                out.append(ord(nx))
                j += 2
                continue
            try:
                out.append(int(s[j + 1: j + 3], 16))
            except ValueError as e:
                raise TritonDecodeError(f"bad escape in ir at {j}") from e
            j += 3
            continue
        out.extend(c.encode("utf-8"))
        j += 1
    return bytes(out)


_IR = re.compile(r'\bir\s*=\s*"((?:[^"\\]|\\.)*)"', re.S)


def _int_field(text: str, key: str) -> int | None:
    m = re.search(rf"\b{key}\s*=\s*(-?\d+)", text)
    return int(m.group(1)) if m else None


def _tensor_numel_bits(type_text: str) -> tuple[int, int]:
    """(elements, bits per element) of ``tensor<128x64xf16>`` / ``tensor<128x64x!tt.ptr<f16>>``."""
    t = type_text.strip()
    if t.startswith("!tt.ptr<") and t.endswith(">"):  # a scalar pointer: one element
        elem, dims = t[len("!tt.ptr<"):-1].split(",")[0].strip(), []
    elif t.startswith("tensor<") and t.endswith(">"):
        inner = t[len("tensor<"):-1]
        if "!tt.ptr<" in inner:
            head, ptr = inner.split("!tt.ptr<", 1)
            elem = ptr.rstrip(">").split(",")[0].strip()
            dims = [d for d in head.split("x") if d]
        else:
            inner = inner.split(",")[0]  # drop an encoding attribute
            parts = inner.split("x")
            elem, dims = parts[-1].strip(), parts[:-1]
    elif t in _ELEM_BITS:
        elem, dims = t, []
    else:
        raise TritonDecodeError(f"cannot read the tensor type {type_text!r}")
    bits = _ELEM_BITS.get(elem)
    if bits is None or not all(d.strip().isdigit() for d in dims):
        raise TritonDecodeError(f"tensor type {type_text!r} not modeled")
    return math.prod(int(d) for d in dims) if dims else 1, bits


_BIN = INT_BINARY_OPS
_CMP = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "slt": lambda a, b: a < b,
        "sle": lambda a, b: a <= b, "sgt": lambda a, b: a > b, "sge": lambda a, b: a >= b,
        "ult": lambda a, b: a < b, "ule": lambda a, b: a <= b, "ugt": lambda a, b: a > b,
        "uge": lambda a, b: a >= b}
_CMP_BY_INT = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]
_PASS = frozenset({"arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui",
                   "arith.trunci", "arith.bitcast"})


def _div_up_bound(f):
    """An upper bound of ``f(a, c)`` (a division nondecreasing in ``a`` for a known ``c > 0``)."""
    return lambda ha, hb, a, b: f(ha, b) if ha is not None and b is not None and b > 0 else None


#: Upper bounds through integer ops where an operand is data-dependent (known only by an upper
#: bound ``ha`` / ``hb``; ``a`` / ``b`` the exact values when known): ops nondecreasing in the
#: bounded operand. ``minsi(x, 4)`` is at most 4 whatever x is.
_MONOTONE = {
    "arith.addi": lambda ha, hb, a, b: ha + hb if ha is not None and hb is not None else None,
    "arith.subi": lambda ha, hb, a, b: ha - b if ha is not None and b is not None else None,
    "arith.muli": lambda ha, hb, a, b: (ha * b if ha is not None and b is not None and b >= 0 else
                                        a * hb if a is not None and hb is not None and a >= 0 else None),
    "arith.divsi": _div_up_bound(_BIN["arith.divsi"]),
    "arith.divui": _div_up_bound(_BIN["arith.divui"]),
    "arith.floordivsi": _div_up_bound(_BIN["arith.floordivsi"]),
    "arith.ceildivsi": _div_up_bound(_BIN["arith.ceildivsi"]),
    "arith.minsi": lambda ha, hb, a, b: (min(ha, hb) if ha is not None and hb is not None else
                                         ha if ha is not None else hb),
    "arith.maxsi": lambda ha, hb, a, b: max(ha, hb) if ha is not None and hb is not None else None,
}
_MONOTONE["arith.minui"] = _MONOTONE["arith.minsi"]
#: ops that keep an i1 mask's fraction of true lanes (one masked dimension, repeated or reshaped)
_MASK_SHAPE_OPS = frozenset({"tt.expand_dims", "tt.broadcast", "tt.reshape"})


def _range_mask(cmp, ranges: dict, splats: dict, a: int, b: int) -> tuple[int, int] | None:
    """(true lanes, lanes) of ``cmpi(make_range(start, end), splat(s))`` (either order), or None
    when the comparison is not of a range with a known scalar."""
    if a in ranges and b in splats:
        (lo, hi), s = ranges[a], splats[b]
        return sum(1 for i in range(lo, hi) if cmp(i, s)), max(1, hi - lo)
    if b in ranges and a in splats:
        (lo, hi), s = ranges[b], splats[a]
        return sum(1 for i in range(lo, hi) if cmp(s, i)), max(1, hi - lo)
    return None


_PTR_CHAIN = frozenset({"tt.addptr", "tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape",
                        "tt.advance", "tt.make_tensor_ptr", "tt.bitcast", "tt.trans"})


def _int_attr_value(attr) -> int | None:
    from jaxlib.mlir import ir
    try:
        return int(ir.IntegerAttr(attr).value)
    except (ValueError, TypeError):
        pass
    m = re.match(r"^(-?\d+)", str(attr))
    return int(m.group(1)) if m else None


@dataclass(slots=True)
class _Op:
    """One op of the kernel body, read once from MLIR (the walk per program is plain Python)."""

    name: str
    operands: tuple[int, ...]
    results: tuple[int, ...]
    value: int | None = None        # arith.constant's integer, get_program_id's axis, cmpi's predicate
    nbytes: int = 0                 # tt.load / tt.store / atomics: bytes of the tensor accessed
    flops: int = 0                  # tt.dot: 2*M*N*K
    used: bool = True               # tt.load: its result is used
    blocks: tuple = ()              # nested blocks: (block args, ops) per region (first block)


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
        name = op.name
        o = _Op(name, tuple(vid(v) for v in op.operands), tuple(vid(r) for r in op.results))
        if name == "tt.get_program_id" or name == "tt.get_num_programs":
            a = op.attributes["axis"] if "axis" in op.attributes else None
            v = _int_attr_value(a) if a is not None else 0
            if v is None:
                txt = str(a)
                v = 0 if "x" in txt else 1 if "y" in txt else 2 if "z" in txt else 0
            o.value = v
        elif name == "arith.constant":
            t = str(op.results[0].type)
            if t.startswith("i") or t == "index":
                o.value = _int_attr_value(op.attributes["value"])
        elif name == "arith.cmpi":
            o.value = _int_attr_value(op.attributes["predicate"])
        elif name == "tt.make_range":
            o.value = (_int_attr_value(op.attributes["start"]), _int_attr_value(op.attributes["end"]))
        elif name == "tt.load":
            o.used = any(True for _ in op.results[0].uses)
            n, bits = _tensor_numel_bits(str(op.results[0].type))
            o.nbytes = n * bits // 8
        elif name == "tt.store":
            n, bits = _tensor_numel_bits(str(op.operands[1].type))
            o.nbytes = n * bits // 8
        elif name in ("tt.atomic_rmw", "tt.atomic_cas"):
            n, bits = _tensor_numel_bits(str(op.results[0].type))
            o.nbytes = n * bits // 8
        elif name in ("tt.dot", "tt.dot_scaled"):
            a, c = str(op.operands[0].type), str(op.results[0].type)
            ma = re.match(r"tensor<(\d+)x(\d+)", a)
            mc = re.match(r"tensor<(\d+)x(\d+)", c)
            if not (ma and mc):
                raise TritonDecodeError(f"tt.dot of {a} -> {c}: not a 2-D dot")
            o.flops = 2 * int(ma.group(1)) * int(ma.group(2)) * int(mc.group(2))
        if name in ("scf.for", "scf.if", "scf.while"):
            o.blocks = tuple(_read_block(r.blocks[0], ids) if len(r.blocks) else ((), [])
                             for r in op.regions)
        elif op.regions:
            for region in op.regions:  # reductions etc.: their bodies must not touch memory
                for blk in region.blocks:
                    for inner in blk.operations:
                        if inner.operation.name in ("tt.load", "tt.store"):
                            raise TritonDecodeError(f"memory access inside {name}")
        ops.append(o)
    return args, ops


class _Walker:
    """Walks one program instance of the kernel body (read once into :class:`_Op` records)."""

    def __init__(self, body: tuple, grid, arg_index: dict[int, int]):
        self.body = body
        self.grid = grid
        self.arg_index = arg_index  # value id of a pointer argument -> pointer argument number
        self.n_args = len(arg_index)
        self.branch_notes: set[str] = set()

    def run(self, pid):
        self.env: dict[int, int] = {}
        self.hi: dict[int, int] = {}   # upper bounds of values not known exactly (data-dependent)
        self.ranges: dict[int, tuple[int, int]] = {}   # tt.make_range results: (start, end)
        self.splats: dict[int, int] = {}               # tensors splat from a known scalar
        self.masks: dict[int, tuple[int, int]] = {}    # i1 tensors: (true lanes, lanes) of one dim
        self.origin: dict[int, int] = dict(self.arg_index)
        self.pid = pid
        reads = [0] * self.n_args
        writes = [0] * self.n_args
        flops = self._block(self.body[1], reads, writes, 1)
        return reads, writes, flops

    def _hi(self, v: int) -> int | None:
        """The value ``v`` if known, else its upper bound if one is known, else None."""
        x = self.env.get(v)
        return x if x is not None else self.hi.get(v)

    def _block(self, ops: list[_Op], reads, writes, mult) -> int:
        env, origin, hi = self.env, self.origin, self.hi
        flops = 0
        for op in ops:
            name = op.name
            if name == "arith.constant":
                if op.value is not None:
                    env[op.results[0]] = op.value
            elif name in _BIN:
                a, b = env.get(op.operands[0]), env.get(op.operands[1])
                if a is not None and b is not None:
                    env[op.results[0]] = _BIN[name](a, b)
                elif name in _MONOTONE:
                    h = _MONOTONE[name](self._hi(op.operands[0]), self._hi(op.operands[1]), a, b)
                    if h is not None:
                        hi[op.results[0]] = h
            elif name in _PTR_CHAIN:
                src = origin.get(op.operands[0]) if op.operands else None
                if src is not None:
                    for r in op.results:
                        origin[r] = src
                elif op.operands and op.results:
                    if name == "tt.splat" and op.operands[0] in env:
                        self.splats[op.results[0]] = env[op.operands[0]]
                    elif name in _MASK_SHAPE_OPS and op.operands[0] in self.masks:
                        self.masks[op.results[0]] = self.masks[op.operands[0]]
            elif name == "tt.make_range":
                if op.value and None not in op.value:
                    self.ranges[op.results[0]] = op.value
            elif name in _PASS:
                v = env.get(op.operands[0])
                if v is not None:
                    env[op.results[0]] = v
                elif op.operands[0] in hi and name not in ("arith.trunci", "arith.bitcast"):
                    hi[op.results[0]] = hi[op.operands[0]]
            elif name == "tt.get_program_id":
                env[op.results[0]] = self.pid[op.value or 0]
            elif name == "tt.get_num_programs":
                env[op.results[0]] = self.grid[op.value or 0]
            elif name == "arith.cmpi":
                a, b = env.get(op.operands[0]), env.get(op.operands[1])
                ok = op.value is not None and 0 <= op.value < 10
                if a is not None and b is not None and ok:
                    env[op.results[0]] = int(_CMP[_CMP_BY_INT[op.value]](a, b))
                elif ok:
                    m = _range_mask(_CMP[_CMP_BY_INT[op.value]], self.ranges, self.splats, *op.operands[:2])
                    if m is not None:
                        self.masks[op.results[0]] = m
            elif name == "arith.select":
                c = env.get(op.operands[0])
                if c is not None:
                    v = env.get(op.operands[1] if c else op.operands[2])
                    if v is not None:
                        env[op.results[0]] = v
                    elif (op.operands[1] if c else op.operands[2]) in hi:
                        hi[op.results[0]] = hi[op.operands[1] if c else op.operands[2]]
                else:
                    h1, h2 = self._hi(op.operands[1]), self._hi(op.operands[2])
                    if h1 is not None and h2 is not None:
                        hi[op.results[0]] = max(h1, h2)
            elif name in ("tt.load", "tt.store", "tt.atomic_rmw", "tt.atomic_cas"):
                src = origin.get(op.operands[0])
                if src is None:
                    raise TritonDecodeError(f"{name}: cannot trace its pointer to a kernel argument")
                # a mask known lane by lane (rows past the last head of a padded block): only its
                # true lanes move; any other mask counts every element (an upper bound)
                mask = op.operands[1 if name == "tt.load" else 2] if (
                    name in ("tt.load", "tt.store") and len(op.operands) > (1 if name == "tt.load" else 2)) else None
                true_n = self.masks.get(mask) if mask is not None else None
                nbytes = op.nbytes if true_n is None else op.nbytes * true_n[0] // true_n[1]
                if name == "tt.load":
                    if op.used:  # an unused load (Pallas's swap on a store): Triton drops it
                        reads[src] += mult * nbytes
                elif name == "tt.store":
                    writes[src] += mult * nbytes
                else:
                    reads[src] += mult * op.nbytes
                    writes[src] += mult * op.nbytes
            elif op.flops:
                flops += mult * op.flops
            elif name == "scf.for":
                lb, ub, st = (env.get(op.operands[i]) for i in range(3))
                if ub is None and lb is not None and st and st > 0 and op.operands[1] in hi:
                    # a data-dependent bound capped by a known one (the Triton decode kernel's
                    # min(cdiv(kv_seq_len - start, block_k), split // block_k)): its cap counted
                    ub = hi[op.operands[1]]
                    self.branch_notes.add(
                        "scf.for with a data-dependent trip count (e.g. a valid sequence length "
                        "read from memory): its upper bound counted (a full cache for a decode "
                        "kernel; fewer bytes at shorter lengths)")
                if lb is None or ub is None or not st:
                    raise TritonDecodeError("scf.for with bounds not known from the program ids")
                trips = max(0, -(-(ub - lb) // st))
                bargs, body = op.blocks[0]
                for k, barg in enumerate(bargs[1:]):  # loop-carried pointers keep their origin
                    if 3 + k < len(op.operands):
                        src = origin.get(op.operands[3 + k])
                        if src is not None:
                            origin[barg] = src
                if trips:
                    flops += self._block(body, reads, writes, mult * trips)
                for k, r in enumerate(op.results):
                    src = origin.get(op.operands[3 + k]) if 3 + k < len(op.operands) else None
                    if src is not None:
                        origin[r] = src
            elif name == "scf.if":
                c = env.get(op.operands[0])
                branches = [b[1] for b in op.blocks]
                if c is not None:
                    chosen = branches[0] if c else (branches[1] if len(branches) > 1 else None)
                    if chosen is not None:
                        flops += self._block(chosen, reads, writes, mult)
                else:
                    best = None
                    for br in branches:
                        r2, w2 = [0] * self.n_args, [0] * self.n_args
                        f2 = self._block(br, r2, w2, mult)
                        tot = sum(r2) + sum(w2)
                        if best is None or tot > best[0]:
                            best = (tot, r2, w2, f2)
                    if best is not None:
                        self.branch_notes.add("scf.if with a data-dependent condition: its larger "
                                              "branch counted")
                        for i in range(self.n_args):
                            reads[i] += best[1][i]
                            writes[i] += best[2][i]
                        flops += best[3]
            elif name == "scf.while":
                raise TritonDecodeError("scf.while: trip count unknown")
        return flops


def decode_and_cost(backend_config_text: str, n_operands: int, n_results: int) -> TritonCost:
    """The :class:`TritonCost` of one ``__gpu$xla.gpu.triton`` call from its backend_config text.

    Raises:
      TritonDecodeError: no ``ir`` / grid, the bytecode does not parse, the kernel's pointer
        arguments do not match the call's operands + results, or its body cannot be walked.
    """
    m = _IR.search(backend_config_text or "")
    if not m:
        raise TritonDecodeError("no ir in backend_config")
    grid = tuple(_int_field(backend_config_text, f"grid_{a}") or 1 for a in "xyz")
    raw = _unescape(m.group(1))
    try:
        from jaxlib.mlir import ir
        from jax._src.lib import triton as _tr
    except ImportError as e:  # pragma: no cover
        raise TritonDecodeError(f"jaxlib MLIR / Triton bindings unavailable: {e}") from e
    ctx = ir.Context()
    try:
        _tr.dialect.register_dialect(ctx)
    except Exception as e:  # noqa: BLE001
        raise TritonDecodeError(f"cannot register the Triton dialect: {type(e).__name__}: {e}") from e
    ctx.allow_unregistered_dialects = True
    with ctx:
        try:
            module = ir.Module.parse(raw)
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TritonDecodeError(f"Triton bytecode does not parse: {msg}") from e
        funcs = [op.operation for op in module.body.operations if op.operation.name == "tt.func"]
        if len(funcs) != 1:
            raise TritonDecodeError(f"{len(funcs)} tt.func in the module")
        func = funcs[0]
        name = str(func.attributes["sym_name"]).strip('"')
        args = list(func.regions[0].blocks[0].arguments)
        ptrs = [a for a in args if "!tt.ptr" in str(a.type)]
        if len(ptrs) != n_operands + n_results:
            raise TritonDecodeError(f"{len(ptrs)} pointer arguments for {n_operands} operands + "
                                    f"{n_results} results")
        n_prog = grid[0] * grid[1] * grid[2]
        if n_prog > MAX_PROGRAMS:
            raise TritonDecodeError(f"grid {grid}: {n_prog} program instances, over {MAX_PROGRAMS}")
        ids: dict = {}
        body = _read_block(func.regions[0].blocks[0], ids)
        walker = _Walker(body, grid, {ids[a]: i for i, a in enumerate(ptrs)})
        reads = [0] * len(ptrs)
        writes = [0] * len(ptrs)
        flops = 0
        for z in range(grid[2]):
            for y in range(grid[1]):
                for x in range(grid[0]):
                    r, w, f = walker.run((x, y, z))
                    for i in range(len(ptrs)):
                        reads[i] += r[i]
                        writes[i] += w[i]
                    flops += f
    notes = [f"Pallas Triton kernel {name}: grid {grid[0]}x{grid[1]}x{grid[2]}; bytes are its loads "
             "and stores per program instance, summed over the grid (masked-off elements counted unless "
             "the mask compares a range with a known bound; "
             "L2 hits between program instances not modeled)",
             f"FLOPs are its tt.dot ops (2*M*N*K each), {flops:,} in all; elementwise work not counted"]
    notes += sorted(walker.branch_notes)
    return TritonCost(name, grid, tuple(reads), tuple(writes), flops, tuple(notes))
