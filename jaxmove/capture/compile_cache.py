"""jaxmove's compile cache: what a capture takes from a deviceless TPU/GPU compile, kept on disk.

Why not jax's own persistent compilation cache (``jax_compilation_cache_dir``): with jax/jaxlib
0.10.2 it *writes* an entry for an executable compiled for compile-only devices
(``jax.experimental.topologies``; checked for ``tpu-v5e:2x2`` and ``h100-sxm:1x1x8``) but cannot
read it back: every later compile warns ``Error reading persistent compilation cache entry ...:
INVALID_ARGUMENT: PjRtCompiler must be constructed with a Client to call
DeserializeLoadedExecutable`` and compiles again (a compile-only client cannot load an
executable). So jaxmove does not turn jax's cache on; it keeps instead the few facts a capture
reads from the compiled executable (:class:`CompiledFacts`: the optimized HLO text, the
platform, the number of devices, ``memory_analysis``, ``cost_analysis`` and the per-device
shapes of the arguments), one gzip'd JSON file per compile.

The key (:func:`cache_key`) is a SHA-256 of everything the compiler's output depends on: the
lowered StableHLO *with* its locations (the optimized HLO's metadata carries source files and
lines), the target's name, the GPU target description (``gpu_target_config``: it follows the
spec's numbers), the device ids of the device assignment, ``XLA_FLAGS`` / ``LIBTPU_INIT_ARGS``,
the ``--xla-option`` s (``$JAXMOVE_XLA_OPTIONS``), and the versions of jax, jaxlib, libtpu and the CUDA plugin. Only accelerator targets are cached
(XLA:CPU compiles for the host it runs on, and is quick).

Where: ``$JAXMOVE_COMPILE_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxmove/xla``, else
``~/.cache/jaxmove/xla``. Off: ``JAXMOVE_NO_COMPILE_CACHE=1`` or the CLI's
``--no-compile-cache``. An entry that cannot be read (truncated, another format) is a miss and
is rewritten; a directory that cannot be written is no error (the compile's result is used, not
kept). Entries are never evicted: delete the directory to reclaim the space (a GPT-2-small
compile is about 0.1-0.3 MB).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["CompiledFacts", "cache_dir", "cache_key", "cache_stats", "cached_compile",
           "DISABLE_ENV", "DIR_ENV"]

#: set to 1 to turn the cache off (``--no-compile-cache`` sets it, so child processes see it)
DISABLE_ENV = "JAXMOVE_NO_COMPILE_CACHE"
#: the cache directory (default ``$XDG_CACHE_HOME/jaxmove/xla`` or ``~/.cache/jaxmove/xla``)
DIR_ENV = "JAXMOVE_COMPILE_CACHE_DIR"
#: bumped when CompiledFacts changes: older entries are then misses
FORMAT = 1
#: distributions whose version changes what the compilers produce
_DISTRIBUTIONS = ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "jax-cuda12-pjrt")

_STATS = {"hits": 0, "misses": 0, "writes": 0, "compiles": 0}


@dataclass(frozen=True)
class CompiledFacts:
    """What a capture reads from ``lowered.compile()`` (capture/program.py).

    Attributes:
      hlo_text: ``compiled.as_text()``, the optimized HLO module.
      backend: the devices' platform (``tpu``, ``gpu``, ``cpu``).
      num_devices: devices the executable's shardings span (>= 1).
      memory_stats: ``memory_analysis()`` fields in bytes (``argument_size_in_bytes``, ...).
      cost_analysis: XLA's ``cost_analysis()`` dict, or None where the backend gives none.
      input_shard_shapes: the per-device shape of each argument leaf (from the executable's
        input shardings), or None when jax gives no sharding per leaf.
    """

    hlo_text: str
    backend: str
    num_devices: int
    memory_stats: dict
    cost_analysis: dict | None
    input_shard_shapes: tuple | None

    def to_json(self) -> dict:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict) -> "CompiledFacts":
        """Raises: ValueError / KeyError / TypeError on an entry of another format."""
        if d.get("format") != FORMAT:
            raise ValueError(f"compile cache entry format {d.get('format')!r}, expected {FORMAT}")
        shapes = d["input_shard_shapes"]
        return cls(hlo_text=str(d["hlo_text"]), backend=str(d["backend"]),
                   num_devices=int(d["num_devices"]),
                   memory_stats={str(k): int(v) for k, v in d["memory_stats"].items()},
                   cost_analysis=dict(d["cost_analysis"]) if d["cost_analysis"] is not None else None,
                   input_shard_shapes=None if shapes is None else tuple(
                       None if s is None else tuple(int(x) for x in s) for s in shapes))


def cache_dir() -> Path | None:
    """The cache directory, or None when the cache is off (``JAXMOVE_NO_COMPILE_CACHE`` set to
    anything but '', 0, false, no)."""
    if os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        return None
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jaxmove" / "xla"


def cache_stats() -> dict[str, int]:
    """This process's ``hits``, ``misses``, ``writes`` and ``compiles`` (TPU/GPU compiles run,
    cache on or off) so far (a copy)."""
    return dict(_STATS)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for name in _DISTRIBUTIONS:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def cache_key(lowered, target) -> str:
    """SHA-256 hex of what the compile of ``lowered`` for ``target`` (a ``Target``) depends on
    (the module docstring lists it)."""
    from .targets import gpu_target_config

    h = hashlib.sha256()

    def part(name: str, text: str) -> None:
        data = text.encode()
        h.update(f"{name}:{len(data)}:".encode())
        h.update(data)

    part("format", str(FORMAT))
    part("versions", json.dumps(_versions(), sort_keys=True))
    part("target", target.name)
    if target.platform == "gpu":
        part("gpu_target_config", gpu_target_config(target.spec()))
    for env in ("XLA_FLAGS", "LIBTPU_INIT_ARGS"):
        part(env, os.environ.get(env, ""))
    from .targets import xla_options
    part("xla_options", json.dumps(xla_options(), sort_keys=True))   # (--xla-option)
    args = getattr(getattr(lowered, "_lowering", None), "compile_args", {}) or {}
    assignments = []
    for s in tuple(args.get("in_shardings", ())) + tuple(args.get("out_shardings", ())):
        da = getattr(s, "_device_assignment", None)
        if da:
            ids = [int(d.id) for d in da]
            if ids not in assignments:
                assignments.append(ids)
    part("device_assignment", json.dumps(assignments))
    part("stablehlo", lowered.as_text(debug_info=True))
    return h.hexdigest()


def _read(path: Path) -> CompiledFacts | None:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return CompiledFacts.from_json(json.load(f))
    except FileNotFoundError:
        return None
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError):
        return None  # truncated or another format: a miss, rewritten below


def _write(path: Path, facts: CompiledFacts) -> bool:
    """Atomically (temporary file + rename); False when the directory cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
                f.write(json.dumps(facts.to_json()).encode("utf-8"))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return False
    return True


def cached_compile(lowered, target, compile_facts) -> CompiledFacts:
    """The CompiledFacts of ``lowered`` compiled for ``target``: from the cache when an entry
    has its key, else ``compile_facts()`` (which compiles), kept for next time.

    Args:
      lowered: a ``jax.stages.Lowered``.
      target: a ``Target`` (or name); cpu targets are never cached.
      compile_facts: a function of no arguments returning the CompiledFacts (it compiles).
    Raises:
      whatever ``compile_facts`` raises (e.g. DoesNotFitError; nothing is written then).
    """
    from .targets import Target

    t = Target.parse(target)
    if t.platform == "cpu":
        return compile_facts()
    root = cache_dir()
    if root is None:
        _STATS["compiles"] += 1
        return compile_facts()
    path = root / f"{cache_key(lowered, t)}.json.gz"
    facts = _read(path)
    if facts is not None:
        _STATS["hits"] += 1
        return facts
    _STATS["misses"] += 1
    _STATS["compiles"] += 1
    facts = compile_facts()
    if _write(path, facts):
        _STATS["writes"] += 1
    return facts
