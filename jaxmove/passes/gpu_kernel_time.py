"""GPU kernel time of GEMMs and collectives from the structural models in jaxmove/hardware.

`gemm_kernel_time` reads a GEMM kernel's sizes (and its tiles when the program has them) from
the HLO and asks ``jaxmove/hardware/gpu_gemm.py``; `nccl_time` gives a collective's time from
``jaxmove/hardware/nccl.py``. ``passes/timing.py`` calls both for GPU specs that have the
figures the models need; for other specs they return None and the roofline applies.

GEMM kernels recognised:

* ``dot`` (a dot left unfused; XLA:GPU would run it through cuBLAS);
* a ``fusion`` of kind ``kCustom`` whose ``backend_config.fusion_backend_config.kind`` is
  ``__triton_nested_gemm_fusion`` or ``__triton_gemm``, with the dot inside it. Tiles come
  from ``block_level_fusion_config.output_tiles`` (the last two sizes are BM x BN, the dot's
  own ``backend_config.sizes`` is BK) or from ``triton_gemm_config`` (block_m, block_n,
  block_k, split_k). A config with ``num_stages`` = 1 is XLA's un-autotuned default (what a
  deviceless compile prints), and any config of a module jaxmove compiled for a GPU target
  without the device (``Module.compiled_without_device``) was never autotuned: then the model
  picks the tiles, as XLA's autotuner would on the device, and says so in a note;
* ``custom-call`` to ``__cublas$gemm``, ``__cublas$lt$matmul``, ``__cublas$lt$matmul$f8``
  (sizes from ``gemm_backend_config.dot_dimension_numbers``).
"""

from __future__ import annotations

import math

from ..hardware import gpu_gemm, nccl
from ..hlo import Computation, Instruction, Module

__all__ = ["CUBLAS_GEMM_TARGETS", "TRITON_GEMM_KINDS", "gemm_kernel_time", "nccl_time"]

CUBLAS_GEMM_TARGETS = frozenset({"__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8"})
TRITON_GEMM_KINDS = frozenset({"__triton_nested_gemm_fusion", "__triton_gemm"})


def _ints(v) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v)
    return tuple(int(x) for x in str(v).strip("{} ").split(",") if x.strip())


def _elem_bytes(shape) -> float:
    n = math.prod(shape.dims) if shape.dims else 1
    return shape.byte_size / n if n else 0.0


def _first_array(shape):
    return shape.tuple_shapes[0] if shape.is_tuple and shape.tuple_shapes else shape


def _k_major(shape, contract) -> bool:
    """The operand's (single) contracting dimension is its most minor one in its layout (the
    printed ``minor_to_major``, else row-major): a K-major operand (gpu_gemm.mn_major_penalized)."""
    if len(contract) != 1 or not shape.dims:
        return False
    lay = shape.layout
    m2m = tuple(lay.minor_to_major) if lay is not None and lay.minor_to_major else ()
    minor = m2m[0] if m2m else len(shape.dims) - 1
    return contract[0] == minor


def _stored_k_major(op: Instruction, contract_dim: int, comp: Computation) -> tuple[bool, str]:
    """Whether a Triton fusion's dot operand is K-major as it lies in memory: followed through
    the transposes inside the fusion (the emitter transposes the tile in the kernel, e.g. the
    one XLA:GPU adds in front of an fp8 dot's ``[k, n]`` B) to the instruction they read, whose
    layout is the stored one. Returns (K-major, that instruction's name)."""
    d, cur = contract_dim, op
    while cur.opcode == "transpose":
        perm = _ints(cur.attrs.get("dimensions"))
        src = comp.by_name.get(cur.operands[0]) if cur.operands else None
        if src is None or len(perm) != len(cur.shape.dims) or not 0 <= d < len(perm):
            break
        d, cur = perm[d], src
    return _k_major(cur.shape, (d,)), cur.name


# ops through which a dot operand inside a Triton fusion is its producers' elements, one for one
# (the dequant prologue XLA:GPU fuses in front of the dot: convert, scale multiply, layout ops)
_ELEMENTWISE_CHAIN = frozenset({"convert", "bitcast", "copy", "transpose", "reshape", "negate", "abs",
                                "multiply", "add", "subtract", "divide", "maximum", "minimum", "select",
                                "clamp", "and", "or", "xor", "shift-left", "shift-right-logical",
                                "shift-right-arithmetic"})


def _stored_elem_bytes(name: str, fc: Computation, fusion: Instruction, comp: Computation,
                       _seen: dict | None = None) -> float | None:
    """Bytes per element that the fusion operand(s) feeding ``name`` (an instruction of the
    fusion computation ``fc``) occupy in memory: followed back through the dequant prologue
    (convert, a scale multiply, transposes, bitcasts) to the fusion's parameters, whose widths
    are the stored ones (s8 / f8 / s4 weights, not the bf16 the dot sees). A broadcast operand
    (a per-channel scale) counts its share (its elements / the result's); constants and iota
    move nothing. None when the chain leaves what this follows (e.g. a nested fusion), and the
    caller keeps the dot operand's own width."""
    seen = {} if _seen is None else _seen
    if name in seen:
        return seen[name]
    ins = fc.by_name.get(name)
    got: float | None = None
    if ins is None:
        pass
    elif ins.opcode == "parameter":
        pn = ins.parameter_number
        outer = comp.by_name.get(fusion.operands[pn]) if pn is not None and 0 <= pn < len(fusion.operands) else None
        got = _elem_bytes(outer.shape) if outer is not None and outer.shape.is_array else None
    elif ins.opcode in ("constant", "iota"):
        got = 0.0
    elif ins.opcode == "broadcast" and ins.operands:
        src = fc.by_name.get(ins.operands[0])
        w = _stored_elem_bytes(ins.operands[0], fc, fusion, comp, seen)
        n, ns = math.prod(ins.shape.dims), math.prod(src.shape.dims) if src is not None else 0
        got = None if w is None or not n else w * ns / n
    elif ins.opcode in _ELEMENTWISE_CHAIN and ins.operands:
        parts = [_stored_elem_bytes(o, fc, fusion, comp, seen) for o in dict.fromkeys(ins.operands)]
        got = None if any(p is None for p in parts) else float(sum(parts))
    seen[name] = got
    return got


def _sizes(lhs, rhs, lhs_batch, lhs_contract, rhs_batch, rhs_contract):
    """(b, m, n, k) of a dot from its operand shapes and dimension numbers."""
    b = math.prod(lhs.dims[d] for d in lhs_batch) if lhs_batch else 1
    k = math.prod(lhs.dims[d] for d in lhs_contract) if lhs_contract else 1
    m = math.prod(s for i, s in enumerate(lhs.dims) if i not in lhs_batch and i not in lhs_contract)
    n = math.prod(s for i, s in enumerate(rhs.dims) if i not in rhs_batch and i not in rhs_contract)
    return b, m, n, k


def _dot_sizes(dot: Instruction, comp: Computation):
    ops = [comp.by_name.get(o) for o in dot.operands[:2]]
    if len(ops) < 2 or None in ops:
        return None
    a = dot.attrs
    return (ops[0].shape, ops[1].shape,
            _sizes(ops[0].shape, ops[1].shape, _ints(a.get("lhs_batch_dims")),
                   _ints(a.get("lhs_contracting_dims")), _ints(a.get("rhs_batch_dims")),
                   _ints(a.get("rhs_contracting_dims"))),
            _k_major(ops[1].shape, _ints(a.get("rhs_contracting_dims"))))


def _triton_tile(instr: Instruction, dot: Instruction, deviceless: bool = False
                 ) -> tuple[gpu_gemm.GemmConfig | None, str | None]:
    """(program tile, note) of a Triton gemm fusion; (None, note) when it gives none usable:
    none printed, XLA's un-autotuned default (``num_stages`` = 1), or any tile of a program
    compiled without the device (``deviceless``: XLA's autotuner did not run; its heuristic
    tiles can be far from what it picks on the device, e.g. 64x32x64 with 2 warps for a batched
    f32 [4, 4096, 4096] GEMM, 2.9x the measured time when timed as they are)."""
    bc = instr.backend_config or {}
    fbc = bc.get("fusion_backend_config", {}) if isinstance(bc, dict) else {}
    tg = fbc.get("triton_gemm_config") if isinstance(fbc, dict) else None
    if isinstance(tg, dict) and tg.get("block_m"):
        cfg = gpu_gemm.GemmConfig(int(tg["block_m"]), int(tg["block_n"]), int(tg["block_k"]),
                                  int(tg.get("split_k", 1) or 1))
        stages = int(tg.get("num_stages", 2) or 2)
    else:
        blc = fbc.get("block_level_fusion_config") if isinstance(fbc, dict) else None
        tiles = (blc or {}).get("output_tiles") if isinstance(blc, dict) else None
        sizes = _ints(tiles[0].get("sizes")) if tiles and isinstance(tiles[0], dict) else ()
        dbc = dot.backend_config or {}
        bk = _ints(dbc.get("sizes")) if isinstance(dbc, dict) else ()
        if len(sizes) < 2 or not bk:
            return None, None
        cfg = gpu_gemm.GemmConfig(sizes[-2], sizes[-1], bk[0], 1)
        stages = int(blc.get("num_stages", 2) or 2)
    shown = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}" + (f" split-K {cfg.split_k}" if cfg.split_k > 1 else "")
    if stages <= 1:
        return None, (f"the program's tiles {shown} with num_stages=1 are XLA's un-autotuned default "
                      "(a deviceless compile): timed with the tiles the model's autotuner picks")
    if deviceless:
        return None, (f"the program's tiles {shown} come from a compile without the device (XLA's "
                      "autotuner did not run): timed with the tiles the model's autotuner picks")
    return cfg, f"tiles {shown} from the program's backend_config"


def _gemm_operands(instr: Instruction, comp: Computation, module: Module):
    """(A, B and C bytes per element as they are stored in memory, (b, m, n, k), program tile,
    notes, B K-major) or None."""
    notes: list[str] = []
    if instr.opcode == "dot":
        got = _dot_sizes(instr, comp)
        return None if got is None else (_elem_bytes(got[0]), _elem_bytes(got[1]), _elem_bytes(instr.shape),
                                         got[2], None, notes, got[3])
    if instr.opcode == "custom-call" and (instr.custom_call_target or "") in CUBLAS_GEMM_TARGETS:
        bc = instr.backend_config or {}
        g = bc.get("gemm_backend_config", bc) if isinstance(bc, dict) else {}
        dn = g.get("dot_dimension_numbers") if isinstance(g, dict) else None
        ops = [comp.by_name.get(o) for o in instr.operands[:2]]
        if not isinstance(dn, dict) or len(ops) < 2 or None in ops:
            return None
        lhs, rhs = ops[0].shape, ops[1].shape
        sizes = _sizes(lhs, rhs, _ints(dn.get("lhs_batch_dimensions")),
                       _ints(dn.get("lhs_contracting_dimensions")), _ints(dn.get("rhs_batch_dimensions")),
                       _ints(dn.get("rhs_contracting_dimensions")))
        notes.append(f"cuBLAS gemm ({instr.custom_call_target}): tiles picked by the model")
        return (_elem_bytes(lhs), _elem_bytes(rhs), _elem_bytes(_first_array(instr.shape)), sizes, None, notes,
                _k_major(rhs, _ints(dn.get("rhs_contracting_dimensions"))))
    if instr.opcode == "fusion" and instr.attrs.get("kind", "").strip() == "kCustom":
        bc = instr.backend_config or {}
        fbc = bc.get("fusion_backend_config", {}) if isinstance(bc, dict) else {}
        if not isinstance(fbc, dict) or fbc.get("kind") not in TRITON_GEMM_KINDS:
            return None
        fc = module.computations.get(instr.called_computations[0]) if instr.called_computations else None
        dots = [i for i in fc.instructions if i.opcode == "dot"] if fc is not None else []
        if len(dots) != 1:
            return None
        got = _dot_sizes(dots[0], fc)
        if got is None:
            return None
        tile, note = _triton_tile(instr, dots[0], module.compiled_without_device)
        if note:
            notes.append(note)
        widths = []
        for i, o in enumerate(dots[0].operands[:2]):
            w, shown = _stored_elem_bytes(o, fc, instr, comp), _elem_bytes(got[i])
            if w is not None and w != shown:
                notes.append(f"{'AB'[i]} operand read from memory at {w:g} bytes per element (the fusion's "
                             f"operands as stored), not the {shown:g} of the dot's {got[i].element_type}")
            widths.append(shown if w is None else w)
        k_major = got[3]
        rhs = fc.by_name.get(dots[0].operands[1])
        contract = _ints(dots[0].attrs.get("rhs_contracting_dims"))
        if rhs is not None and rhs.opcode == "transpose" and len(contract) == 1:
            stored, src = _stored_k_major(rhs, contract[0], fc)
            if stored != k_major:
                k_major = stored
                notes.append(f"B operand {'K' if stored else 'MN'}-major in memory ({src}), transposed "
                             f"inside the kernel ({rhs.name})")
        return (*widths, _elem_bytes(_first_array(instr.shape)), got[2], tile, notes, k_major)
    return None


def _mn_major_text(t: gpu_gemm.GemmTime, peak_key: str | None, spec) -> str:
    """The GEMM note's clause on a B operand transposed into shared memory, if it is charged."""
    costs = ([f"its loads cost x{t.rhs_feed_factor:g}"] if t.rhs_feed_factor != 1.0 else []) + (
        [f"each k step waits {t.rhs_step_s * spec.sm_clock_hz:.0f} cycles more"] if t.rhs_step_s else [])
    if not costs:
        return ""
    return (f"; MN-major {peak_key} B operand transposed into shared memory (wgmma takes it K-major "
            f"only): {' and '.join(costs)}")


def gemm_kernel_time(instr: Instruction, comp: Computation, module: Module, spec, peak: float | None,
                     peak_key: str | None) -> tuple[gpu_gemm.GemmTime, list[str], list[str]] | None:
    """The GPU GEMM model's time of one GEMM kernel (module docstring), with notes and the
    reasons the time is incomplete (a lower bound: an MN-major fp8/int8 B whose in-kernel
    transpose is not modelled, `gpu_gemm.mn_major_uncharged`); None when ``instr`` is no GEMM
    kernel this model reads, the spec lacks the GPU figures (`gpu_gemm.gemm_model_applies`) or
    ``peak`` (FLOP/s of its operands) is unknown."""
    if not peak or not gpu_gemm.gemm_model_applies(spec):
        return None
    got = _gemm_operands(instr, comp, module)
    if got is None:
        return None
    lhs_b, rhs_b, out_b, (b, m, n, k), tile, notes, rhs_k_major = got
    if min(b, m, n, k) < 1:
        return None
    t = gpu_gemm.gemm_time(spec, b=b, m=m, n=n, k=k, peak_flops_per_s=peak, peak_key=peak_key,
                           lhs_bytes=lhs_b, rhs_bytes=rhs_b, out_bytes=out_b, tile=tile,
                           allow_split_k=instr.opcode != "fusion", rhs_k_major=rhs_k_major)
    c = t.config
    notes.append(f"GPU GEMM model (hardware/gpu_gemm.py): b={b} m={m} n={n} k={k}, CTA tile "
                 f"{c.block_m}x{c.block_n}x{c.block_k}" + (f", split-K {c.split_k}" if c.split_k > 1 else "")
                 + f", {t.ctas} CTAs in {t.waves} wave(s) on {spec.num_sms} SMs, {t.bound}-bound "
                 f"(tiles {t.compute_s:.4g} s, {'waiting on their L2 -> shared-memory loads' if t.feed_limited else 'MMA-limited'}; "
                 f"HBM {t.hbm_bytes} bytes {t.memory_s:.4g} s; tensor cores {t.mma_s:.4g} s on the padded "
                 f"tiles, {t.useful_mma_s:.4g} s of useful work)"
                 + _mn_major_text(t, peak_key, spec))
    incomplete = []
    if gpu_gemm.mn_major_uncharged(spec, peak_key, rhs_k_major):
        incomplete.append(f"MN-major {peak_key} B operand: sm_90 wgmma takes {peak_key} operands K-major only, "
                          "so the kernel transposes it; that cost is not in this time (a lower bound: no "
                          f"measured {peak_key} program with an MN-major B to fit it on)")
    return t, notes, incomplete


def nccl_time(info, spec, spans_nodes: bool) -> float | None:
    """NCCL model time of a collective (``CollectiveInfo``) on a GPU spec; None when the model
    does not apply (not a GPU spec, or no link bandwidth)."""
    if not nccl.nccl_model_applies(spec):
        return None
    if info.kind != "recv" and info.kind not in nccl.KINDS:
        from ..errors import Unmodeled
        raise Unmodeled(f"the NCCL model has no '{info.kind}' collective")
    pairs = None
    if info.kind == "collective-permute" and all(len(g) == 2 for g in info.device_groups):
        pairs = tuple((int(g[0]), int(g[1])) for g in info.device_groups)  # source, target
    return nccl.collective_time_s(info.kind, info.wire_bytes, info.group_size, spec,
                                  spans_nodes=spans_nodes, pairs=pairs or None)
