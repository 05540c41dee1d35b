"""Spec overrides without a TOML file: ``--spec hbm_bytes_per_s=1.7e12``.

A power-capped GPU, a measured bandwidth or a different clock is one number away from a
built-in spec; ``override_spec`` returns a copy of the spec with those numbers replaced, each
one's source saying it was given by the user (and what it replaced), and the display name
saying the spec was overridden, so no report passes the changed device off as the datasheet's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from jaxmove.hardware.spec import FLOPS_DTYPES, ZERO_ALLOWED_KEYS, HardwareSpec, HardwareSpecError

__all__ = ["ZERO_ALLOWED_KEYS", "overridable_keys", "override_spec", "parse_spec_overrides",
           "spec_notes", "unused_override_reason", "with_slice_topology"]



def _units() -> dict[str, str]:
    """Dotted key -> unit (spec.py metadata; ``flops_per_s.*`` are FLOP/s)."""
    out = {f.name: f.metadata.get("unit", "") for f in dataclasses.fields(HardwareSpec)
           if f.metadata.get("numeric")}
    out.update({f"flops_per_s.{k}": "FLOP/s" for k in FLOPS_DTYPES})
    return out


def _numeric_fields() -> dict[str, bool]:
    """Top-level numeric fields of HardwareSpec -> True when the field is an integer."""
    out = {}
    for f in dataclasses.fields(HardwareSpec):
        if f.metadata.get("numeric"):
            out[f.name] = str(f.type).startswith("int")
    return out


def overridable_keys() -> list[str]:
    """Every key ``override_spec`` accepts: the numeric fields of HardwareSpec and
    ``flops_per_s.<dtype>`` for each dtype of ``FLOPS_DTYPES``."""
    return [*_numeric_fields(), *(f"flops_per_s.{k}" for k in FLOPS_DTYPES)]


def parse_spec_overrides(items: list[str]) -> dict[str, float]:
    """``["hbm_bytes_per_s=1.7e12", ...]`` (the ``--spec`` arguments) -> {key: value}.

    Raises HardwareSpecError naming the argument: no ``=``, an unknown key (the known ones
    are listed), a key given twice (both values named), a value that is not a positive finite
    number (``ZERO_ALLOWED_KEYS`` may also be 0) or lies outside the physical range of its unit
    (the spec files' ranges, loader.py ``_PHYSICAL_RANGE``: ``hbm_capacity_bytes`` within
    [1, 1e17] bytes), or a fractional value for an integer field (``num_sms``,
    ``hbm_capacity_bytes`` ...).
    """
    ints = _numeric_fields()
    known = overridable_keys()
    out: dict[str, float] = {}
    given: dict[str, str] = {}
    for item in items:
        key, eq, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not eq or not key:
            raise HardwareSpecError(f"--spec expects KEY=VALUE (e.g. hbm_bytes_per_s=1.7e12), got {item!r}")
        if key not in known:
            raise HardwareSpecError(f"--spec {item}: unknown key {key!r}; expected one of: {', '.join(known)}")
        if key in given:
            raise HardwareSpecError(f"--spec {key} given twice ({key}={given[key]} and {key}={text}): "
                                    f"expected each key once; keep the value you mean")
        given[key] = text
        try:
            value = float(text)
        except ValueError:
            raise HardwareSpecError(f"--spec {item}: expected a number (bytes, seconds, bytes/s, FLOP/s "
                                    f"as the key's unit says), got {text!r}") from None
        zero_ok = key in ZERO_ALLOWED_KEYS
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            want = "a finite number >= 0" if zero_ok else "a positive finite number"
            raise HardwareSpecError(f"--spec {item}: {key} must be {want}, got {text!r}")
        from jaxmove.hardware.loader import _PHYSICAL_RANGE  # the spec files' ranges
        unit = _units().get(key, "")
        lo_hi = _PHYSICAL_RANGE.get(unit)
        if lo_hi is not None and not (value == 0 and zero_ok) and not lo_hi[0] <= value <= lo_hi[1]:
            raise HardwareSpecError(f"--spec {item}: {value:g} {unit} is outside the physical range "
                                    f"[{lo_hi[0]:g}, {lo_hi[1]:g}] {unit} of any real device (a typo?)"
                                    + (" or exactly 0" if zero_ok else ""))
        if ints.get(key):
            if not value.is_integer():
                raise HardwareSpecError(f"--spec {item}: {key} must be a whole number, got {text!r}")
            value = int(value)
        out[key] = value
    return out


#: keys only GPU specs' models read, and where
_GPU_ONLY_KEYS = {
    "num_sms": "hardware/gpu_gemm.py's GEMM model and the GPU target description XLA:GPU compiles for",
    "sm_clock_hz": "hardware/gpu_gemm.py's GEMM model and the GPU target description XLA:GPU compiles for",
    "smem_per_sm_bytes": "the GPU target description XLA:GPU compiles for, capture/targets.py",
    "command_buffer_launch_overhead_s": "passes/timing.py: the gap before each kernel of an XLA:GPU "
                                        "command buffer",
}


def unused_override_reason(spec: HardwareSpec, key: str) -> str | None:
    """Why the cost model never reads ``key`` for ``spec`` (so overriding it changes nothing),
    or None when it may read it. Only what the code shows for every program of the spec:

    * ``link_latency_s`` on a GPU spec with ``intra_node_bytes_per_s`` (hardware/nccl.py
      ``nccl_model_applies``): every collective is timed by the NCCL model, whose latencies
      are NCCL's own tables per algorithm and protocol (passes/timing.py ``network_time``); the
      fallback ``passes/collectives.collective_time_s`` (the only reader of the key) then
      only runs where the NCCL model has no link bandwidth, and so has none either.
    * ``intra_node_bytes_per_s`` / ``inter_node_bytes_per_s`` on a TPU spec with
      ``ici_bytes_per_s_per_link``: ``link_bandwidth_bytes_per_s`` takes the ICI links'
      bandwidth for every group and returns before reading either.
    * ``ici_bytes_per_s_per_link`` on a GPU or CPU spec: only TPU specs read it.
    * ``num_sms``, ``sm_clock_hz``, ``smem_per_sm_bytes``, ``command_buffer_launch_overhead_s``
      on a TPU or CPU spec: only GPU code reads them (``_GPU_ONLY_KEYS``).
    * ``l2_bytes`` on a TPU spec with ``vmem_bytes``: the on-chip capacity is VMEM's.
    * ``vmem_bytes`` on a GPU or CPU spec: only a TPU's on-chip capacity is VMEM's.
    * ``tensor_cores_per_chip`` and ``torus_dims`` on any spec: the datasheet's description of
      the chip, which no pass reads (the TPU compute peak is ``flops_per_s``, per chip; which
      ICI axes wrap around comes from the ``--target`` topology, hardware/overrides.py
      ``with_slice_topology``).
    """
    from jaxmove.hardware.nccl import nccl_model_applies
    if key == "link_latency_s" and nccl_model_applies(spec):
        return (f"{key} is not used for GPU spec {spec.name}: its collectives are timed by the NCCL "
                "model (hardware/nccl.py), whose latencies are NCCL's own per-algorithm and per-protocol "
                "tables; to change collective times override intra_node_bytes_per_s (NVLink) or "
                "inter_node_bytes_per_s (network)")
    if key in ("intra_node_bytes_per_s", "inter_node_bytes_per_s") and spec.kind == "tpu" \
            and spec.ici_bytes_per_s_per_link:
        return (f"{key} is not used for TPU spec {spec.name}: its collectives are timed on the ICI "
                "links (passes/collectives.py link_bandwidth_bytes_per_s: links used x "
                "ici_bytes_per_s_per_link); to change collective times override "
                "ici_bytes_per_s_per_link (or link_latency_s)")
    if key == "ici_bytes_per_s_per_link" and spec.kind != "tpu":
        return (f"{key} is not used for {spec.kind.upper()} spec {spec.name}: only TPU specs' "
                "collectives run on ICI links; override intra_node_bytes_per_s or inter_node_bytes_per_s")
    if key in _GPU_ONLY_KEYS and spec.kind != "gpu":
        return (f"{key} is not used for {spec.kind.upper()} spec {spec.name}: only GPU specs read it "
                f"({_GPU_ONLY_KEYS[key]})")
    if key == "l2_bytes" and spec.kind == "tpu" and spec.vmem_bytes is not None:
        return (f"{key} is not used for TPU spec {spec.name}: a TPU's on-chip capacity is vmem_bytes "
                "(passes/reuse.py on_chip_capacity reads l2_bytes on a TPU only without it); "
                "override vmem_bytes")
    if key == "vmem_bytes" and spec.kind != "tpu":
        return (f"{key} is not used for {spec.kind.upper()} spec {spec.name}: only a TPU's on-chip "
                "capacity is vmem_bytes (passes/reuse.py onchip_capacity_bytes); override l2_bytes")
    if key in ("tensor_cores_per_chip", "torus_dims"):
        return (f"{key} is not used for spec {spec.name}: no cost model reads it (it describes the chip); the "
                "compute peak is flops_per_s.<dtype> per chip, and which ICI axes wrap around comes "
                "from the --target topology (e.g. tpu-v5e:4x4)")
    return None


def override_spec(spec: HardwareSpec, overrides: Mapping[str, float] | list[str]) -> HardwareSpec:
    """A copy of ``spec`` with ``overrides`` ({dotted key: value}, or ``--spec`` strings)
    replacing its numbers.

    Each replaced key's source becomes ``user override (--spec KEY=VALUE); the spec's value was
    OLD (SOURCE)``; ``display_name`` gets `` [--spec KEY=VALUE, ...]`` appended and ``notes`` a
    line naming the changes. ``name`` is kept (the compile target and the device kind stay
    those of the spec). An empty ``overrides`` returns ``spec`` itself.

    Raises HardwareSpecError as ``parse_spec_overrides`` does (keys, values), and for a key
    the cost model never reads for ``spec`` (``unused_override_reason``: the override would
    change nothing).
    """
    if isinstance(overrides, list):
        overrides = parse_spec_overrides(overrides)
    else:
        overrides = parse_spec_overrides([f"{k}={v!r}" for k, v in overrides.items()])
    if not overrides:
        return spec
    # (-0 is 0: shown and kept as 0)
    overrides = {k: (0.0 if isinstance(v, float) and v == 0 else v) for k, v in overrides.items()}
    for key, value in overrides.items():
        why = unused_override_reason(spec, key)
        if why:
            raise HardwareSpecError(f"--spec {key}={value:g}: {why}")
    changes: dict = {}
    flops = dict(spec.flops_per_s)
    sources = dict(spec.sources)
    shown = []
    old_values = spec.numeric_fields()
    for key, value in overrides.items():
        text = f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
        shown.append(text)
        old = old_values.get(key)
        was = (f"; the spec's value was {old:g} ({sources.get(key, 'no source')})" if old is not None
               else "; the spec had no value")
        sources[key] = f"user override (--spec {text}){was}"
        if key.startswith("flops_per_s."):
            flops[key.split(".", 1)[1]] = float(value)
        else:
            changes[key] = value
    label = f"{spec.display_name or spec.name} [--spec {', '.join(shown)}]"
    note = f"Overridden by the user: {', '.join(shown)}."
    return dataclasses.replace(spec, **changes, flops_per_s=flops, sources=sources, display_name=label,
                               notes=(spec.notes + "\n" + note) if spec.notes else note)


def user_overrides(spec) -> list[str]:
    """The ``KEY=VALUE`` texts of ``spec``'s numbers the user replaced (``override_spec``: their
    sources start ``user override (--spec``), in the spec's order; [] for an unchanged spec."""
    return [src.split("(--spec ", 1)[1].split(")", 1)[0]
            for src in (getattr(spec, "sources", None) or {}).values()
            if str(src).startswith("user override (--spec ")]


def capacity_overridden(spec) -> bool:
    """The user replaced ``hbm_capacity_bytes`` (a target compiler's own memory check then
    answers for its chip, not for the capacity the user asks about)."""
    return any(o.startswith("hbm_capacity_bytes=") for o in user_overrides(spec))


def overridden_note(spec) -> str | None:
    """``spec NAME overridden by the user: KEY=VALUE, ...`` (the note ``analyze`` and ``plans``
    give), or None for an unchanged spec."""
    shown = user_overrides(spec)
    return f"spec {spec.name} overridden by the user: {', '.join(shown)}" if shown else None


def spec_notes(spec) -> list[str]:
    """The notes ``analyze`` and ``plans`` give about where a spec's numbers come from when they
    are not the built-in spec's its name says: a user's file reusing a built-in name
    (loader.py ``builtin_name_note``), then the ``--spec`` overrides (``overridden_note``)."""
    from jaxmove.hardware.loader import builtin_name_note
    return [n for n in (builtin_name_note(spec), overridden_note(spec)) if n]


def with_slice_topology(spec: HardwareSpec, topology) -> HardwareSpec:
    """``spec`` with ``ici_topology`` set to the compile target's chip grid (a TPU slice such as
    ``(8, 4)``), so collectives know which torus axes have wraparound links; ``spec`` itself
    when it is not a TPU spec, when ``topology`` is empty, or when the spec already has one.

    Raises HardwareSpecError for a topology that is not positive integers.
    """
    if spec.kind != "tpu" or not topology or spec.ici_topology:
        return spec
    dims = tuple(topology)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise HardwareSpecError(f"spec {spec.name!r}: slice topology must be positive integers, got {topology!r}")
    return dataclasses.replace(spec, ici_topology=dims)
