"""The hardware model: one frozen record per device, with a source for every number.

A `HardwareSpec` is pure data. It is read from TOML by `jaxmove.hardware.loader`
(built-in specs live in ``jaxmove/hardware/specs/*.toml``), written by
`jaxmove.hardware.toml_write`, and produced for the local device by
`jaxmove.hardware.calibrate`.

Units are in the field names and never change: bytes, seconds, bytes/s, FLOP/s.
Bandwidths of links are *per device, per direction* (a datasheet's
"900 GB/s bidirectional NVLink" is ``intra_node_bytes_per_s = 450e9``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from ..errors import JaxmoveInputError

__all__ = [
    "Alternative",
    "FLOPS_DTYPES",
    "HardwareSpec",
    "HardwareSpecError",
    "GPU_TARGET_KEYS",
    "KINDS",
    "TPU_TARGET_KEYS",
    "ZERO_ALLOWED_KEYS",
    "canonical_flops_dtype",
]

#: The dtype keys allowed in ``flops_per_s``. ``fp8`` covers every 8-bit float
#: format (e4m3, e5m2, ...), ``int8`` both s8 and u8, ``tf32`` the tensor-core
#: 19-bit format NVIDIA GPUs use for f32 dots at default precision.
FLOPS_DTYPES: tuple[str, ...] = ("fp4", "fp8", "int4", "int8", "bf16", "f16", "tf32", "f32", "f64")

#: Numeric keys that may be 0 (an ideal link or launch: a latency or fixed cost adds to a
#: time and divides nothing); every other number (bandwidths, peaks, capacities, counts) must
#: be > 0. Spec files (loader.py ``_number``) and ``--spec`` (overrides.py) take the same.
ZERO_ALLOWED_KEYS: frozenset[str] = frozenset({"link_latency_s", "kernel_launch_overhead_s"})

#: Allowed values of ``HardwareSpec.kind``.
KINDS: tuple[str, ...] = ("gpu", "tpu", "cpu")

#: Keys of a TPU spec's ``[target]`` table (strings): the libtpu topology family
#: (``jax.experimental.topologies.get_topology_desc(topology_name="v5e:2x2")``).
#: ``clock_hz`` is the TensorCore clock, Hz: it turns the TPU compiler's per-fusion
#: ``estimated_cycles`` into seconds (optional). ``max_topology_dim`` is the largest size of
#: one topology dimension the TPU compiler compiles for (optional): libtpu builds a larger
#: topology's devices but its compiler then aborts the process (a CHECK, no error to catch),
#: so ``--target`` refuses it first (capture/targets.py ``Target.parse``).
TPU_TARGET_KEYS: dict[str, type] = {"tpu_family": str, "clock_hz": float, "max_topology_dim": int}

#: Keys of a GPU spec's ``[target]`` table: the ``GpuTargetConfigProto`` fields (XLA
#: xla/stream_executor/device_description.proto; XLA's own files for each GPU are
#: xla/backends/gpu/target_config/specs/<gpu>.txtpb) that the spec's other numbers do not
#: give. ``compute_capability`` (``"9.0"``) is ``cuda_compute_capability {major minor}``,
#: ``shared_memory_per_block_bytes`` is ``shared_memory_per_block``, ``dnn_version`` is
#: ``dnn_version_info`` as ``"major.minor.patch"``, ``device_description`` is
#: ``device_description_str`` (jax's ``Device.device_kind``).
GPU_TARGET_KEYS: dict[str, type] = {
    "compute_capability": str,
    "threads_per_warp": int, "threads_per_block_limit": int, "threads_per_core_limit": int,
    "fpus_per_core": int, "shared_memory_per_block_bytes": int,
    "shared_memory_per_block_optin_bytes": int, "registers_per_core_limit": int,
    "registers_per_block_limit": int, "block_dim_limit_x": int, "block_dim_limit_y": int,
    "block_dim_limit_z": int, "dnn_version": str, "device_description": str,
}


class HardwareSpecError(JaxmoveInputError):
    """A hardware spec file is unreadable, malformed, or misses a required key.

    The message always names the file, and the key (with its line when known).
    """


# HLO primitive type names (xla/xla_data.proto PrimitiveType, as printed in HLO text)
# and the numpy/JAX dtype names, mapped to the ``flops_per_s`` key whose peak applies.
# None: a known type with no matrix-unit peak in any datasheet (pred, s32, tokens ...).
_DTYPE_TO_FLOPS_KEY: dict[str, str | None] = {
    # canonical keys themselves
    **{k: k for k in FLOPS_DTYPES},
    # HLO names
    "f16": "f16",
    "bf16": "bf16",
    "f32": "f32",
    "f64": "f64",
    # a complex multiply-add is counted in real FLOPs by the passes, so the real peak applies
    "c64": "f32",
    "c128": "f64",
    "f8e5m2": "fp8",
    "f8e4m3": "fp8",
    "f8e4m3fn": "fp8",
    "f8e4m3b11fnuz": "fp8",
    "f8e5m2fnuz": "fp8",
    "f8e4m3fnuz": "fp8",
    "f8e3m4": "fp8",
    "f4e2m1fn": "fp4",
    "s8": "int8",
    "u8": "int8",
    "s4": "int4",
    "u4": "int4",
    "f8e8m0fnu": None,  # a block-scale format, never the operand type of a dot
    "pred": None,
    "s1": None,
    "s2": None,
    "s16": None,
    "s32": None,
    "s64": None,
    "u1": None,
    "u2": None,
    "u16": None,
    "u32": None,
    "u64": None,
    "token": None,
    "tuple": None,
    "opaque": None,
    # numpy / JAX names
    "bfloat16": "bf16",
    "float16": "f16",
    "half": "f16",
    "float32": "f32",
    "float": "f32",
    "single": "f32",
    "float64": "f64",
    "double": "f64",
    "complex64": "f32",
    "complex128": "f64",
    "float8_e5m2": "fp8",
    "float8_e4m3": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e4m3b11fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e3m4": "fp8",
    "float4_e2m1fn": "fp4",
    "float8_e8m0fnu": None,
    "int8": "int8",
    "uint8": "int8",
    "uint4": "int4",
    "bool": None,
    "int16": None,
    "int32": None,
    "int64": None,
    "uint16": None,
    "uint32": None,
    "uint64": None,
}


def canonical_flops_dtype(dtype: str) -> str | None:
    """Map an HLO type name (``bf16``, ``f8e4m3fn``, ``s8`` ...) or a numpy/JAX dtype
    name (``bfloat16``, ``float8_e4m3fn`` ...) to its ``flops_per_s`` key.

    Returns None for a known type that has no matrix-unit peak (``pred``, ``s32`` ...).
    Raises ValueError for a name that is not a known type.
    """
    key = str(dtype).strip().lower()
    if key not in _DTYPE_TO_FLOPS_KEY:
        raise ValueError(
            f"unknown dtype {dtype!r}: expected an HLO type name (bf16, f16, f32, f64, "
            f"f8e4m3fn, f8e5m2, s8, u8, s4, ...) or one of {', '.join(FLOPS_DTYPES)}"
        )
    return _DTYPE_TO_FLOPS_KEY[key]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Alternative:
    """A published value that disagrees with the one the spec uses.

    key: the dotted field name (``hbm_bytes_per_s``, ``flops_per_s.bf16``).
    value: the other value, in the field's unit.
    source: where it was published.
    note: why the spec does not use it.
    """

    key: str
    value: float
    source: str
    note: str


def _meta(unit: str, *, required: bool = False, numeric: bool = True) -> dict[str, Any]:
    return {"unit": unit, "required": required, "numeric": numeric}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HardwareSpec:
    """Peak rates and sizes of one device (one GPU, one TPU chip, or one CPU host).

    Every numeric field that is not None has an entry in ``sources`` keyed by its
    name (``flops_per_s.<dtype>`` for peak rates) citing a datasheet, a
    documentation page, a paper, or the measurement that produced it.

    Fields (units in names):
      flops_per_s: dense peak (no structured sparsity) per dtype key in
        `FLOPS_DTYPES`, in FLOP/s (int ops/s for int8/int4).
      hbm_bytes_per_s: peak HBM (device DRAM; host DRAM for CPUs) bandwidth, bytes/s.
      hbm_capacity_bytes: HBM capacity, bytes.
      kernel_launch_overhead_s: fixed cost per kernel (HLO fusion / custom call), s.
      command_buffer_launch_overhead_s: GPU only: the gap before each kernel that runs inside a
        command buffer (a CUDA graph XLA:GPU records for a run of at least 5 fusions / library
        calls), replacing ``kernel_launch_overhead_s`` for it; the command buffer's own launch
        costs one ``kernel_launch_overhead_s`` (passes/timing.py ``command_buffer_runs``), s.
        Optional: without it every kernel pays ``kernel_launch_overhead_s``.
      kernel_min_duration_s: GPU only: the shortest a kernel runs, however little its work (a
        launched grid's fill and drain): a kernel's duration is at least this, s. Optional and
        measured (fitted on a device capture, judged on held-out kernels); without it a
        kernel's duration is its roofline work alone.
      devices_per_node: devices sharing one host / NVLink domain.
      intra_node_bytes_per_s: device-to-device bandwidth inside a node (NVLink, or
        the sum over a TPU chip's ICI links), per device per direction, bytes/s.
      inter_node_bytes_per_s: bandwidth to other nodes (InfiniBand / DCN),
        per device per direction, bytes/s.
      link_latency_s: latency of one intra-node hop, s.
      l2_bytes, smem_per_sm_bytes, num_sms: GPU on-chip sizes (CPU: last-level cache).
      sm_clock_hz: GPU SM clock, Hz (XLA's GPU target config ``clock_rate_ghz``).
        With ``num_sms`` and ``l2_bytes`` it feeds the GEMM kernel model
        (``jaxmove/hardware/gpu_gemm.py``); optional, and without it a GPU dot is a roofline.
      vmem_bytes: TPU vector memory per TensorCore, bytes.
      tensor_cores_per_chip: TPU TensorCores per chip.
      torus_dims, ici_links: TPU ICI torus dimensionality and links per chip.
      ici_bytes_per_s_per_link: TPU ICI bandwidth of one link, per direction, bytes/s.
      ici_topology: TPU only: the slice's chip grid, chips per torus dimension (``(8, 4)`` for
        ``tpu-v5e:8x4``), set from the compile target (``with_slice_topology``,
        hardware/overrides.py); it decides which axes of a collective's groups have wraparound
        links (passes/collectives.py ``ici_links``). Empty when unknown.

    Host-runtime terms (optional; measured by ``jaxmove calibrate`` on CPUs, absent from
    every built-in spec, and when absent the time model does not apply them):
      first_touch_bytes_per_s: rate at which a run writes into freshly mapped pages (each
        4 KiB page costs a fault that maps and zeroes it), bytes/s; passes/first_touch.py.
      mmap_threshold_bytes: allocations of at least this size are mapped fresh on every
        run (the host allocator's mmap threshold), bytes.
      dispatch_overhead_s: host time to launch one program call and wait for it, charged
        once per program run, s.

    Compile target (``target``, the ``[target]`` table; optional): what ``--target NAME``
    needs to compile for the device on a machine without it (jaxmove/capture/targets.py).
    TPU: ``tpu_family``, the libtpu topology family (``v5e`` -> ``v5e:2x2``). GPU: the
    fields of XLA's ``GpuTargetConfigProto`` (stream_executor/device_description.proto) that
    the fields above do not already give (see ``GPU_TARGET_KEYS``); the numbers need sources
    like every other (``target.<key>``).
    """

    name: str = dataclasses.field(metadata=_meta("", required=True, numeric=False))
    vendor: str = dataclasses.field(metadata=_meta("", required=True, numeric=False))
    kind: str = dataclasses.field(metadata=_meta("gpu | tpu | cpu", required=True, numeric=False))
    flops_per_s: Mapping[str, float] = dataclasses.field(
        metadata=_meta("FLOP/s per dtype", required=True, numeric=False)
    )
    hbm_bytes_per_s: float = dataclasses.field(metadata=_meta("bytes/s", required=True))
    hbm_capacity_bytes: int = dataclasses.field(metadata=_meta("bytes", required=True))
    kernel_launch_overhead_s: float = dataclasses.field(metadata=_meta("s", required=True))
    devices_per_node: int = dataclasses.field(metadata=_meta("devices", required=True))
    display_name: str = dataclasses.field(default="", metadata=_meta("", numeric=False))
    device_kinds: tuple[str, ...] = dataclasses.field(
        default=(), metadata=_meta("jax Device.device_kind strings", numeric=False)
    )
    intra_node_bytes_per_s: float | None = dataclasses.field(default=None, metadata=_meta("bytes/s"))
    inter_node_bytes_per_s: float | None = dataclasses.field(default=None, metadata=_meta("bytes/s"))
    link_latency_s: float | None = dataclasses.field(default=None, metadata=_meta("s"))
    l2_bytes: int | None = dataclasses.field(default=None, metadata=_meta("bytes"))
    smem_per_sm_bytes: int | None = dataclasses.field(default=None, metadata=_meta("bytes"))
    num_sms: int | None = dataclasses.field(default=None, metadata=_meta("SMs"))
    sm_clock_hz: float | None = dataclasses.field(default=None, metadata=_meta("Hz"))
    vmem_bytes: int | None = dataclasses.field(default=None, metadata=_meta("bytes"))
    tensor_cores_per_chip: int | None = dataclasses.field(default=None, metadata=_meta("cores"))
    torus_dims: int | None = dataclasses.field(default=None, metadata=_meta("dimensions"))
    ici_links: int | None = dataclasses.field(default=None, metadata=_meta("links"))
    ici_bytes_per_s_per_link: float | None = dataclasses.field(default=None, metadata=_meta("bytes/s"))
    first_touch_bytes_per_s: float | None = dataclasses.field(default=None, metadata=_meta("bytes/s"))
    mmap_threshold_bytes: int | None = dataclasses.field(default=None, metadata=_meta("bytes"))
    dispatch_overhead_s: float | None = dataclasses.field(default=None, metadata=_meta("s"))
    command_buffer_launch_overhead_s: float | None = dataclasses.field(default=None, metadata=_meta("s"))
    kernel_min_duration_s: float | None = dataclasses.field(default=None, metadata=_meta("s"))
    ici_topology: tuple[int, ...] = dataclasses.field(
        default=(), metadata=_meta("chips per torus dimension", numeric=False)
    )
    target: Mapping[str, str | int] = dataclasses.field(
        default_factory=dict, metadata=_meta("", numeric=False)
    )
    notes: str = dataclasses.field(default="", metadata=_meta("", numeric=False))
    sources: Mapping[str, str] = dataclasses.field(
        default_factory=dict, metadata=_meta("", numeric=False)
    )
    alternatives: tuple[Alternative, ...] = dataclasses.field(
        default=(), metadata=_meta("", numeric=False)
    )
    calibration: Mapping[str, str | int | float | bool] | None = dataclasses.field(
        default=None, metadata=_meta("", numeric=False)
    )
    path: str | None = dataclasses.field(
        default=None, compare=False, metadata=_meta("", numeric=False)
    )

    def peak_flops_per_s(self, dtype: str) -> float | None:
        """Dense peak FLOP/s for operands of `dtype`, or None when the spec has no figure.

        `dtype` is an HLO type name (``bf16``, ``f16``, ``f32``, ``f64``, ``f8e4m3fn`` ->
        ``fp8``, ``s8``/``u8`` -> ``int8``, ``s4`` -> ``int4``, ``c64`` -> ``f32``), a numpy
        dtype name, or a ``flops_per_s`` key. No fallback between dtypes is made: an f32
        dot on a TPU runs as 1, 3 or 6 bf16 passes depending on its precision config
        (jax.lax.Precision), which is the cost pass's decision, not the spec's.
        Raises ValueError for an unknown dtype name.
        """
        key = canonical_flops_dtype(dtype)
        if key is None:
            return None
        return self.flops_per_s.get(key)

    def numeric_fields(self) -> dict[str, float | int]:
        """Every numeric value present, keyed by its dotted name (``flops_per_s.bf16``)."""
        out: dict[str, float | int] = {}
        for f in dataclasses.fields(self):
            if f.name == "flops_per_s":
                for k in FLOPS_DTYPES:
                    if k in self.flops_per_s:
                        out[f"flops_per_s.{k}"] = self.flops_per_s[k]
            elif f.metadata.get("numeric"):
                v = getattr(self, f.name)
                if v is not None:
                    out[f.name] = v
            elif f.name == "target":
                for k, v in self.target.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        out[f"target.{k}"] = v
        return out

    def source(self, key: str) -> str:
        """The citation for a dotted numeric key. Raises KeyError if there is none."""
        return self.sources[key]

    @property
    def label(self) -> str:
        """A human name: ``display_name`` when set, else ``name``."""
        return self.display_name or self.name

    @property
    def ridge_point_flops_per_byte(self) -> float | None:
        """Roofline ridge point for bf16: peak bf16 FLOP/s / HBM bytes/s (None without bf16)."""
        peak = self.flops_per_s.get("bf16")
        if peak is None:
            return None
        return peak / self.hbm_bytes_per_s

    def __post_init__(self) -> None:
        # Cheap invariants; the loader gives the file-and-line errors before we get here.
        if self.kind not in KINDS:
            raise HardwareSpecError(f"spec {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        for key, value in self.numeric_fields().items():
            if key in ZERO_ALLOWED_KEYS and isinstance(value, (int, float)) and value == 0:
                continue  # an ideal link / launch
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise HardwareSpecError(f"spec {self.name!r}: {key} must be a positive finite number, got {value!r}")
