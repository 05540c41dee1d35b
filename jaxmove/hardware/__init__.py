"""Hardware models for jaxmove: device specs as data, and calibration of the local device.

Built-in specs (``jaxmove/hardware/specs/*.toml``): ``h100-sxm``, ``h200``, ``a100-80gb``,
``a100-40gb``, ``b200``, ``tpu-v4``, ``tpu-v5e``, ``tpu-v5p``, ``tpu-v6e`` and the rough ``cpu-generic``.
Every number in them carries a citation in the spec's ``sources``; where public sources
disagree, the other values are kept in ``alternatives`` with a note on the choice.

    >>> from jaxmove.hardware import load_spec
    >>> h100 = load_spec("h100-sxm")
    >>> h100.peak_flops_per_s("bf16"), h100.hbm_bytes_per_s
    (989400000000000.0, 3350000000000.0)

``load_spec("local")`` reads the spec `calibrate` measured on this machine (written by
``write_spec(calibrate(), local_spec_path())``, which is what ``jaxmove calibrate`` does).
"""

# calibrate.py imports JAX only inside its functions, so this import stays cheap. Importing
# the function here (not lazily) keeps `jaxmove.hardware.calibrate` bound to the function:
# a later first import of the submodule would otherwise rebind the name to the module.
from jaxmove.hardware.calibrate import CalibrationError, calibrate
from jaxmove.hardware.loader import (
    builtin_spec_names,
    list_specs,
    load_spec,
    local_spec_path,
    parse_spec,
    spec_for_device_kind,
)
from jaxmove.hardware.spec import (
    FLOPS_DTYPES,
    Alternative,
    HardwareSpec,
    HardwareSpecError,
    canonical_flops_dtype,
)
from jaxmove.hardware.toml_write import spec_to_toml, write_spec


__all__ = [
    "FLOPS_DTYPES",
    "Alternative",
    "CalibrationError",
    "HardwareSpec",
    "HardwareSpecError",
    "builtin_spec_names",
    "calibrate",
    "canonical_flops_dtype",
    "list_specs",
    "load_spec",
    "local_spec_path",
    "parse_spec",
    "spec_for_device_kind",
    "spec_to_toml",
    "write_spec",
]
