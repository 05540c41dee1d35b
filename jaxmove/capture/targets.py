"""Compile targets: ``--target NAME`` -> compile-only devices of the accelerator a user plans for.

XLA's TPU and GPU compilers run on a machine without the device (deviceless ahead-of-time
compilation): ``jax.experimental.topologies.get_topology_desc`` returns *compile-only* devices
of a topology, and ``jax.jit(f).lower(<abstract args placed on them>).compile()`` runs the
accelerator's own compiler, so the HLO jaxmove analyses is the one the device runs (its
fusions, layouts, tiles, async collectives), not XLA:CPU's.

Target names (``Target.parse``):

==========================  ======================================================================
``cpu``                     XLA:CPU with simulated devices (the default; no extra needed)
``<gpu>[:SxHxD]``           a GPU spec with a ``[target]`` table (``h100-sxm``, ``h200``, ``b200``,
                            ``a100-80gb``); ``SxHxD`` = slices x hosts x GPUs per host, e.g.
                            ``h100-sxm:1x2x8`` (16 GPUs on 2 nodes); default ``1x1x<devices_per_node>``
``<tpu>[:AxB[xC]]``         a TPU spec (``tpu-v5e``, ``tpu-v6e``: ``AxB``; ``tpu-v4``, ``tpu-v5p``:
                            ``AxBxC``), the chip grid of libtpu's topology ``<family>:AxB[xC]``
                            (``tpu-v5e:4x4`` = 16 chips); default the smallest libtpu accepts
                            (``2x2`` / ``2x2x1``); ``1x1`` (``1x1x1``) is one chip of that
==========================  ======================================================================

GPU: the device description is a ``GpuTargetConfigProto`` (XLA
xla/stream_executor/device_description.proto) written by :func:`gpu_target_config` from the
spec's own numbers, each with its source in the spec TOML (compare XLA's
xla/backends/gpu/target_config/specs/<gpu>.txtpb). The GPU compiler does no autotuning here:
Triton GEMM tiles are its defaults and some dots become split-K (see :func:`target_notes`).
TPU ``tpu-v4``: libtpu's v4 topologies have one device per TensorCore (2 per chip).

Extras: TPU targets need libtpu (``pip install "jaxmove[tpu]"``), GPU targets the CUDA
plugin (``pip install "jaxmove[gpu]"``); without them :class:`MissingExtraError` (exit 2).
The plugins' start-up noise is filtered (``jaxmove._platform.quiet_stderr``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from dataclasses import dataclass

from ..errors import JaxmoveInputError

__all__ = [
    "DoesNotFitError", "MissingExtraError", "Target", "TargetNameError", "compile_lowered",
    "compile_target_names", "gpu_target_config", "target_notes", "target_syntax",
]

#: pip commands of the extras, by platform
EXTRAS = {"tpu": 'pip install "jaxmove[tpu]"', "gpu": 'pip install "jaxmove[gpu]"'}

#: the smallest topology libtpu accepts, by number of topology dimensions
_TPU_BASE = {2: (2, 2), 3: (2, 2, 1)}
#: TPU families whose topologies have three dimensions (3-D torus)
_TPU_3D = {"v4", "v5p"}


class TargetNameError(JaxmoveInputError):
    """A ``--target`` name that names no compile target, or a malformed topology."""


class XlaOptionError(JaxmoveInputError):
    """An XLA compile option (``--xla-option``) the compiler does not know, or a value it
    refuses."""


#: The environment variable holding the XLA compile options every compile uses (a JSON object
#: of option name -> value text), set by the CLI's ``--xla-option`` so the processes a command
#: starts (plans on simulated devices, sweep workers) compile the same way.
XLA_OPTIONS_ENV = "JAXMOVE_XLA_OPTIONS"


def xla_options() -> dict[str, str]:
    """The compile options of ``$JAXMOVE_XLA_OPTIONS`` (``--xla-option KEY=VALUE``), {} when unset.

    Raises:
      XlaOptionError: the variable is not a JSON object of names to values.
    """
    text = os.environ.get(XLA_OPTIONS_ENV, "").strip()
    if not text:
        return {}
    try:
        got = json.loads(text)
    except ValueError:
        got = None
    if not isinstance(got, dict) or not all(isinstance(k, str) for k in got):
        raise XlaOptionError(f"${XLA_OPTIONS_ENV}={text!r}: expected a JSON object of XLA option names "
                             "to values, e.g. {\"xla_gpu_experimental_force_split_k\": \"1\"}")
    return {k: str(v) for k, v in got.items()}


class MissingExtraError(JaxmoveInputError):
    """The target's compiler plugin (libtpu, the CUDA plugin) is not installed."""


class DoesNotFitError(JaxmoveInputError):
    """The target compiler refused the program: it does not fit the device memory.

    Attributes:
      target: the target name.
      needs_bytes, has_bytes: the compiler's figures (None when it gave none).
      compiler_message: the first line of the compiler's error.
    """

    def __init__(self, message: str, target: str, needs_bytes: int | None, has_bytes: int | None,
                 compiler_message: str):
        super().__init__(message)
        self.target = target
        self.needs_bytes = needs_bytes
        self.has_bytes = has_bytes
        self.compiler_message = compiler_message


@dataclass(frozen=True)
class Target:
    """A compile target: a hardware spec plus a topology of compile-only devices.

    Attributes:
      name: canonical name, ``cpu``, ``h100-sxm:1x1x8``, ``tpu-v5e:2x2``.
      spec_name: the hardware spec (``cpu`` -> ``cpu-generic``).
      platform: ``cpu`` | ``gpu`` | ``tpu``.
      topology: the topology dims (GPU: slices, hosts, devices per host; TPU: chip grid);
        () for cpu.
    """

    name: str
    spec_name: str
    platform: str
    topology: tuple[int, ...] = ()

    @property
    def num_devices(self) -> int:
        """Devices of the topology (TPU v4: 2 per chip, one per TensorCore; cpu: 1)."""
        if self.platform == "cpu":
            return 1
        n = math.prod(self.topology)
        return 2 * n if self.platform == "tpu" and self._family() == "v4" else n

    @property
    def topology_text(self) -> str:
        return "x".join(map(str, self.topology))

    def spec(self):
        """The HardwareSpec the target compiles for (``jaxmove.hardware.load_spec``)."""
        from ..hardware import load_spec
        return load_spec(self.spec_name)

    def _family(self) -> str:
        return str(self.spec().target.get("tpu_family", "")) if self.platform == "tpu" else ""

    @classmethod
    def parse(cls, name: str | "Target" | None) -> "Target":
        """``h100-sxm:1x2x8`` -> Target (None or ``cpu`` -> the cpu target).

        Raises:
          TargetNameError: not ``cpu`` nor a spec with a ``[target]`` table, or a malformed
            or impossible topology (the message lists the targets).
        """
        if isinstance(name, Target):
            return name
        text = "cpu" if name is None else str(name).strip().lower()
        if text in ("cpu", "cpu-generic", ""):
            return cls("cpu", "cpu-generic", "cpu")
        spec_name, _, topo = text.partition(":")
        from ..hardware import HardwareSpecError, load_spec
        try:
            spec = load_spec(spec_name)
        except HardwareSpecError:
            from .errors import did_you_mean
            raise TargetNameError(f"--target {name!r}: unknown target{did_you_mean(spec_name, [n.split('[')[0] for n in compile_target_names()])}"
                                  f"; expected one of {', '.join(compile_target_names())}") from None
        if not spec.target:
            raise TargetNameError(f"--target {name!r}: the spec {spec.name} has no [target] table (it "
                                  f"is not a compile target); targets: {', '.join(compile_target_names())}")
        if topo and not re.fullmatch(r"\d+(x\d+)*", topo):
            raise TargetNameError(f"--target {name!r}: expected {target_syntax(spec)}, "
                                  f"got topology {topo!r}")
        dims = tuple(int(d) for d in topo.split("x")) if topo else ()
        if any(d < 1 for d in dims):
            raise TargetNameError(f"--target {name!r}: topology sizes must be >= 1")
        if spec.kind == "gpu":
            if not dims:
                dims = (1, 1, spec.devices_per_node)
            if len(dims) != 3:
                raise TargetNameError(f"--target {name!r}: a GPU topology is slices x hosts x GPUs "
                                      f"per host, e.g. {spec.name}:1x2x8")
            per_node = int(spec.devices_per_node or 0)
            if per_node and dims[2] > per_node:
                # (the spec's node holds fewer: its collectives would be timed as one node's,
                # over NVLink, for GPUs that must sit on several hosts)
                hosts = -(-dims[2] // per_node)
                raise TargetNameError(
                    f"--target {name!r}: a {spec.name} host holds {per_node} GPUs (the spec's "
                    f"devices_per_node), not {dims[2]}; put them on several hosts, e.g. "
                    f"{spec.name}:{dims[0]}x{dims[1] * hosts}x{per_node}" if dims[2] % per_node == 0 else
                    f"--target {name!r}: a {spec.name} host holds {per_node} GPUs (the spec's "
                    f"devices_per_node), not {dims[2]}")
            return cls(f"{spec.name}:{'x'.join(map(str, dims))}", spec.name, "gpu", dims)
        family = str(spec.target["tpu_family"])
        rank = 3 if family in _TPU_3D else 2
        if not dims:
            dims = _TPU_BASE[rank]
        if len(dims) != rank:
            raise TargetNameError(f"--target {name!r}: a TPU {family} topology has {rank} dimensions, "
                                  f"e.g. {spec.name}:{'x'.join(map(str, _TPU_BASE[rank]))}")
        limit = spec.target.get("max_topology_dim")
        if limit and max(dims) > int(limit):
            # (libtpu makes such a topology's devices, then its compiler aborts the process)
            raise TargetNameError(f"--target {name!r}: the TPU compiler compiles {family} slices of at "
                                  f"most {int(limit)} chips along each dimension (the spec's [target] "
                                  f"max_topology_dim), e.g. {spec.name}:{int(limit)}x{int(limit)}")
        return cls(f"{spec.name}:{'x'.join(map(str, dims))}", spec.name, "tpu", dims)

    def devices(self) -> list:
        """The compile-only devices of the topology (cached per target; cpu: jax's CPU devices).

        Raises:
          MissingExtraError: the plugin is not installed.
          TargetNameError: the plugin refuses the topology (its message).
        """
        if self.platform == "cpu":
            import jax
            return list(jax.devices("cpu"))
        key = self.name
        if key not in _DEVICES:
            _DEVICES[key] = _load_devices(self)
        return _DEVICES[key]

    def mesh(self, mesh_shape: dict[str, int]):
        """A ``jax.sharding.Mesh`` of the first prod(sizes) devices of the topology, row-major.

        Raises:
          TargetNameError: the mesh has more devices than the topology (names both).
        """
        import jax
        import numpy as np

        n = math.prod(mesh_shape.values())
        if n > self.num_devices:
            mesh = ",".join(f"{k}={v}" for k, v in mesh_shape.items())
            raise TargetNameError(f"--mesh {mesh} needs {n} devices but --target {self.name} has "
                                  f"{self.num_devices}; use a larger topology (e.g. "
                                  f"{_larger_example(self, n)}) or a smaller mesh")
        devs = self.devices()
        return jax.sharding.Mesh(np.array(devs[:n]).reshape(tuple(mesh_shape.values())),
                                 tuple(mesh_shape))

    def default_mesh(self) -> dict[str, int]:
        """The mesh ``plans`` uses when ``--mesh`` is not given: every device of the topology,
        ``model`` of the size of its last dimension (the GPUs of one host; on a TPU slice the
        last grid dimension's chip count, two devices per chip on v4) and ``data`` over the
        rest, laid over the devices in id order (``mesh``). libtpu numbers chips along the
        first dimension fastest, so on a TPU grid a ``model`` group is a block of chips, not
        one torus axis: ``tpu-v5e:2x4``'s ``model=4`` is the 2x2 block of devices 0-3; the
        collectives' links and times follow the groups as built (``collectives.ici_links``)."""
        if self.platform == "cpu":
            return {"data": 1}
        inner = self.topology[-1] * (2 if self._family() == "v4" else 1)
        return {"data": self.num_devices // inner, "model": inner}

    def replicated(self):
        """A ``NamedSharding`` placing a whole array on the first device (a 1-device mesh)."""
        import jax
        import numpy as np
        from jax.sharding import NamedSharding, PartitionSpec

        mesh = jax.sharding.Mesh(np.array(self.devices()[:1]), ("_device",))
        return NamedSharding(mesh, PartitionSpec())


_DEVICES: dict[str, list] = {}


def _larger_example(t: Target, n: int) -> str:
    if t.platform == "gpu":
        per = t.topology[2]
        return f"{t.spec_name}:1x{max(1, math.ceil(n / per))}x{per}"
    side = 2
    while side ** (len(t.topology)) < n:
        side *= 2
    return f"{t.spec_name}:{'x'.join([str(side)] * len(t.topology))}"


def target_syntax(spec) -> str:
    """How a spec is named as a target: ``h100-sxm[:SxHxD]``, ``tpu-v5e[:AxB]``, or '' (none)."""
    if not spec.target:
        return "cpu" if spec.kind == "cpu" and spec.name == "cpu-generic" else ""
    if spec.kind == "gpu":
        return f"{spec.name}[:SxHxD]"
    rank = 3 if spec.target.get("tpu_family") in _TPU_3D else 2
    return f"{spec.name}[:{'x'.join('ABC'[:rank])}]"


def compile_target_names() -> list[str]:
    """``cpu`` and every built-in spec with a ``[target]`` table, as a target is written."""
    from ..hardware import list_specs
    return ["cpu"] + [target_syntax(s) for s in list_specs() if s.target]


def _check_extra(platform: str) -> None:
    module = "libtpu" if platform == "tpu" else "jax_plugins.xla_cuda12"
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        what = "libtpu" if platform == "tpu" else "the CUDA plugin (jax-cuda12-plugin, jax-cuda12-pjrt)"
        raise MissingExtraError(f"{platform.upper()} targets need {what}: {EXTRAS[platform]}")


def _load_devices(t: Target) -> list:
    from .._platform import default_platforms, quiet_stderr

    _check_extra(t.platform)
    default_platforms()
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # several jaxmove runs on one machine
    with quiet_stderr(survive_exit="XLA_FLAGS" in os.environ):  # (a plugin parses XLA_FLAGS too)
        from jax.experimental import topologies
        try:
            if t.platform == "tpu":
                family = t._family()
                dims = t.topology
                single = all(d == 1 for d in dims)
                load = _TPU_BASE[len(dims)] if single else dims
                desc = topologies.get_topology_desc(
                    topology_name=f"{family}:{'x'.join(map(str, load))}", platform="tpu")
                devs = list(desc.devices)
                return devs[:t.num_devices] if single else devs
            spec = t.spec()
            _register_cuda_plugin()
            desc = topologies.get_topology_desc(spec.name, "cuda", target_config=gpu_target_config(spec),
                                                topology=t.topology_text)
            return list(desc.devices)
        except MissingExtraError:
            raise
        except Exception as e:  # noqa: BLE001 - the plugin's own message is the best one-liner
            msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TargetNameError(f"--target {t.name}: the {t.platform.upper()} compiler refused the "
                                  f"topology: {msg}") from None


def _register_cuda_plugin() -> None:
    """Register the CUDA plugin for deviceless compiles where jax's own start-up did not.

    jax registers it when it first starts its backends; with ``JAX_PLATFORMS`` unset or naming
    cuda the plugin first checks the CUDA runtime, which a machine without a driver fails, and
    the plugin is then never registered (``get_topology_desc`` says "topology not implemented
    for cuda"): a notebook that ran any jax code before a GPU target hit this. The check is
    about running on a GPU, not compiling for one, so it is skipped here
    (``JAX_SKIP_CUDA_CONSTRAINTS_CHECK``, jax_plugins/xla_cuda12/__init__.py) and the
    plugin's own ``initialize`` registers it."""
    from jax._src import xla_bridge as xb
    xb._discover_and_register_pjrt_plugins()
    if "cuda" in getattr(xb, "_topology_factories", {"cuda": None}):
        return
    import jax_plugins.xla_cuda12 as cuda_plugin
    old = os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK")
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
    try:
        cuda_plugin.initialize()
    finally:
        if old is None:
            os.environ.pop("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", None)
        else:
            os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = old


def gpu_target_config(spec) -> str:
    """A ``GpuTargetConfigProto`` in protobuf text format from a GPU spec's own numbers.

    ``core_count`` = ``num_sms``, ``shared_memory_per_core`` = ``smem_per_sm_bytes``,
    ``memory_bandwidth`` = ``hbm_bytes_per_s``, ``l2_cache_size`` = ``l2_bytes``,
    ``clock_rate_ghz`` = ``sm_clock_hz`` / 1e9, ``device_memory_size`` = ``hbm_capacity_bytes``;
    the rest from the spec's ``[target]`` table (``GPU_TARGET_KEYS``). The fields are those
    of XLA's xla/backends/gpu/target_config/specs/<gpu>.txtpb that jaxlib 0.10.2 accepts.

    Raises:
      TargetNameError: the spec is not a GPU spec with a ``[target]`` table, or lacks one of
        the numbers above.
    """
    t = dict(spec.target)
    if spec.kind != "gpu" or not t:
        raise TargetNameError(f"{spec.name}: not a GPU spec with a [target] table")
    need = {"num_sms": spec.num_sms, "smem_per_sm_bytes": spec.smem_per_sm_bytes,
            "l2_bytes": spec.l2_bytes, "sm_clock_hz": spec.sm_clock_hz}
    missing = [k for k, v in need.items() if v is None]
    if missing:
        raise TargetNameError(f"{spec.name}: a GPU target needs {', '.join(missing)} in the spec")
    major, minor = str(t["compute_capability"]).split(".")
    dnn = [int(x) for x in str(t["dnn_version"]).split(".")] + [0, 0]
    info = {
        "threads_per_block_limit": t["threads_per_block_limit"],
        "threads_per_warp": t["threads_per_warp"],
        "shared_memory_per_block": t["shared_memory_per_block_bytes"],
        "shared_memory_per_core": spec.smem_per_sm_bytes,
        "threads_per_core_limit": t["threads_per_core_limit"],
        "core_count": spec.num_sms,
        "fpus_per_core": t["fpus_per_core"],
        "block_dim_limit_x": t["block_dim_limit_x"],
        "block_dim_limit_y": t["block_dim_limit_y"],
        "block_dim_limit_z": t["block_dim_limit_z"],
        "memory_bandwidth": int(spec.hbm_bytes_per_s),
        "l2_cache_size": spec.l2_bytes,
        "clock_rate_ghz": spec.sm_clock_hz / 1e9,
        "device_memory_size": int(spec.hbm_capacity_bytes),
        "shared_memory_per_block_optin": t["shared_memory_per_block_optin_bytes"],
    }
    lines = ["gpu_device_info {"] + [f"  {k}: {v}" for k, v in info.items()]
    lines += [f"  cuda_compute_capability {{ major: {int(major)} minor: {int(minor)} }}",
              f"  registers_per_core_limit: {t['registers_per_core_limit']}",
              f"  registers_per_block_limit: {t['registers_per_block_limit']}", "}",
              'platform_name: "CUDA"',
              f"dnn_version_info {{ major: {dnn[0]} minor: {dnn[1]} patch: {dnn[2]} }}",
              f"device_description_str: {_proto_string(str(t['device_description']))}"]
    return "\n".join(lines) + "\n"


def _proto_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---- compiling ----------------------------------------------------------------------------

_OOM = re.compile(r"RESOURCE_EXHAUSTED|Ran out of memory|out of memory", re.I)
_OOM_FIGURES = re.compile(r"required for .*?\(([\d.]+)([KMGT]?)\).*?exceeds available \w+ \(([\d.]+)([KMGT]?)\)",
                          re.S)
_SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _bytes_text(n: int | None) -> str:
    if n is None:
        return "?"
    for scale, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _refused_options(text: str, options: dict[str, str]) -> dict[str, str]:
    """The ``--xla-option`` s a compile error is about: {} when it is about none of them.

    XLA:CPU says "No such compile option: 'k'" / "While setting option k, 'v' is not a valid
    bool value"; XLA:TPU (libtpu) "INVALID_ARGUMENT: Failed to parse 'v' into flag k: " (an
    internal error before). An INVALID_ARGUMENT that names an option given is about the
    options it names; "compile option" / "While setting option" naming none, about all."""
    if not options:
        return {}
    named = {k: v for k, v in options.items() if re.search(rf"(?<![\w]){re.escape(k)}(?![\w])", text)}
    if "compile option" in text or "While setting option" in text:
        return named or dict(options)
    if "INVALID_ARGUMENT" in text and named:
        return named
    return {}


def compile_lowered(lowered, target: Target | str | None, what: str = "the program"):
    """``lowered.compile()`` with the plugins' noise filtered and the XLA compile options of
    ``xla_options()`` (``--xla-option``); ``target`` names the device in messages (None: a
    stage built elsewhere, compiled for the devices it was lowered for).

    Raises:
      DoesNotFitError: the compiler ran out of device memory (``RESOURCE_EXHAUSTED``); the
        message is one line ``<what> does not fit on <target>: needs X, has Y (...)``.
      XlaOptionError: the compiler refused an option (XLA's message: "No such compile option",
        "... is not a valid bool value", libtpu's "Failed to parse 'maybe' into flag ..."): the
        message names the option(s) refused.
    """
    from .._platform import quiet_stderr

    where = Target.parse(target).name if target is not None else "its devices"
    options = xla_options()
    try:
        with quiet_stderr():
            return lowered.compile(options) if options else lowered.compile()
    except Exception as e:  # noqa: BLE001 - jax's JaxRuntimeError; anything else re-raised
        text = str(e)
        refused = _refused_options(text, options)
        if refused:
            first = (text.strip().splitlines() or [""])[0].replace("INVALID_ARGUMENT: ", "")
            given = ", ".join(f"{k}={v}" for k, v in refused.items())
            who = f"XLA compiling for {where}" if target is not None else "XLA"
            raise XlaOptionError(f"--xla-option {given}: {who} refused it: "
                                 f"{first.rstrip(' :')}") from None
        if not _OOM.search(text):
            raise
        first = (text.strip().splitlines() or [""])[0]
        m = _OOM_FIGURES.search(text)
        needs = has = None
        if m:
            needs = int(float(m.group(1)) * _SCALE[m.group(2)])
            has = int(float(m.group(3)) * _SCALE[m.group(4)])
        raise DoesNotFitError(f"{what} does not fit on {where}: needs {_bytes_text(needs)}, has "
                              f"{_bytes_text(has)} (the compiler's figures, its usable device memory; "
                              f"compiler: {first})",
                              where, needs, has, first) from None


def spec_target_mismatch(spec, target, what: str = "the program", hardware_key: str = "--hardware",
                         target_key: str = "--target") -> str | None:
    """Why ``spec`` (a HardwareSpec) cannot cost what ``target`` (a name or ``Target``)
    compiles, or None when it can: a TPU spec for a GPU target or the reverse (the cpu target
    takes any spec; its reports note the mismatch). The one check of ``analyze``, ``plans``
    and ``sweep``
    (``hardware_key`` / ``target_key``: how the message names the two, ``--hardware`` or
    SWEEP.toml's ``hardware``; ``what``: what the target compiles)."""
    tgt = Target.parse(target)
    if tgt.platform == "cpu" or spec.kind == tgt.platform:
        return None
    return (f"{hardware_key} {spec.name} is a {spec.kind.upper()} spec, but {target_key} {tgt.name} "
            f"compiles {what} for {tgt.platform.upper()}: drop {hardware_key} (the target's own spec, "
            f"{tgt.spec_name}, is the default) or compile for a {spec.kind.upper()} target")


def target_notes(target: Target | str | None) -> list[str]:
    """What a report compiled for ``target`` must say about how it was compiled (and with which
    ``--xla-option`` s)."""
    t = Target.parse(target)
    options = xla_options()
    out = ([f"compiled with XLA options {', '.join(f'{k}={v}' for k, v in options.items())} "
            "(--xla-option)"] if options else [])
    if t.platform == "gpu":
        return [f"compiled for {t.name} without the device: XLA:GPU did no autotuning (Triton GEMM "
                "tiles are its defaults; the split-K of skinny dots is its SplitkRewriter's heuristic, "
                "the same on the device), and it does not check device memory (fit is judged from "
                "memory_analysis)"] + out
    if t.platform == "tpu":
        return [f"compiled for {t.name} by XLA:TPU (libtpu) without the device"] + out
    return out
