"""``--spec KEY=VALUE``: hardware-spec overrides on the command line (jaxmove/hardware/overrides.py)."""

from __future__ import annotations

import argparse

from ..errors import UsageError


def add_spec_override_option(p: argparse.ArgumentParser) -> None:
    """``--spec KEY=VALUE`` (repeatable): override a number of the hardware spec
    (jaxmove/hardware/overrides.py), e.g. a power-capped GPU's measured HBM bandwidth."""
    p.add_argument("--spec", dest="spec_overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a number of the --hardware (or --target) spec without writing a "
                        "TOML, e.g. --spec hbm_bytes_per_s=1.7e12 or --spec flops_per_s.bf16=280e12; "
                        "repeatable; the report names the spec as overridden")


def hardware_from_args(args: argparse.Namespace):
    """``--hardware`` with the ``--spec`` overrides applied: None, the spec name / path as
    given (no overrides, no device target), or a HardwareSpec. With a device ``--target`` and
    no ``--hardware`` the target's spec is used; on a TPU target the spec gets the slice's
    chip grid (``with_slice_topology``: ICI wraparound per axis).

    Raises:
      jaxmove.errors.UsageError: ``--spec`` with neither ``--hardware`` nor a device ``--target``.
      jaxmove.hardware.HardwareSpecError: a bad spec name or override.
    """
    hardware = getattr(args, "hardware", None)
    items = getattr(args, "spec_overrides", None) or []
    target = getattr(args, "compile_target", None)
    tgt = None
    if target:
        from ..capture.targets import Target
        tgt = Target.parse(target)
        if tgt.platform == "cpu":
            tgt = None
    if not items and tgt is None:
        return hardware
    if hardware is None and tgt is not None:
        hardware = tgt.spec_name
    if hardware is None:
        raise UsageError("--spec overrides numbers of a hardware spec: give --hardware NAME "
                         "(or a device --target)")
    from ..hardware import HardwareSpec, load_spec
    from ..hardware.overrides import override_spec, with_slice_topology
    spec = hardware if isinstance(hardware, HardwareSpec) else load_spec(hardware)
    if tgt is not None and tgt.platform == "tpu":  # which ICI axes have wraparound links
        spec = with_slice_topology(spec, tgt.topology)
    return override_spec(spec, list(items))
