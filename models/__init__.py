"""The jaxmove model zoo: named presets that build abstract ``Workload`` s.

>>> from jaxmove import zoo as models
>>> wl = models.build("gpt-tiny-decode", {"kv_heads": "1"})   # MQA variant
>>> wl.args[1]["layers"][0]["k_cache"].shape                    # [B, H_kv, S, D]
(2, 1, 16, 16)

``build`` never allocates parameters: every argument leaf is a
``jax.ShapeDtypeStruct`` (``nnx.eval_shape``), so a multi-billion-parameter
configuration costs nothing until ``materialize`` is called.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.extend
import jax.numpy as jnp

from jaxmove.capture.workload import Workload
from jaxmove.errors import JaxmoveInputError
from . import gpt, mlp, moe

__all__ = ["PRESETS", "OVERRIDE_KEYS", "Preset", "build", "check_overrides", "list_presets", "materialize"]


@dataclass(frozen=True)
class Preset:
    """A named configuration: which model, which entry point, and its config."""

    description: str
    config_cls: type
    builder: Callable[[Any, str], Workload]
    config: dict


_GPT2_SMALL = dict(vocab=50257, d_model=768, heads=12, layers=12, dtype="bfloat16", batch=1, seq_len=1024)
_GPT_TINY = dict(vocab=256, d_model=64, heads=4, layers=2, dtype="float32", batch=2, seq_len=16)

PRESETS: dict[str, Preset] = {
    "mlp": Preset("MLP, 4 layers 2048->8192->2048, batch 128, bf16",
                  mlp.MLPConfig, mlp.forward_workload,
                  dict(batch=128, d_model=2048, d_ff=8192, layers=4, dtype="bfloat16")),
    "mlp-tiny": Preset("MLP, 2 layers 32->128->32, batch 4, f32",
                       mlp.MLPConfig, mlp.forward_workload,
                       dict(batch=4, d_model=32, d_ff=128, layers=2, dtype="float32")),
    "gpt2-small-prefill": Preset("GPT-2 small (124M) prefill of 1024 tokens, batch 1, bf16",
                                 gpt.GPTConfig, gpt.prefill_workload, _GPT2_SMALL),
    "gpt2-small-decode": Preset("GPT-2 small (124M) one decode step, KV cache 1024, batch 1, bf16",
                                gpt.GPTConfig, gpt.decode_workload, _GPT2_SMALL),
    "gpt-tiny-prefill": Preset("tiny GPT (V256 d64 H4 L2) prefill of 16 tokens, batch 2, f32",
                               gpt.GPTConfig, gpt.prefill_workload, _GPT_TINY),
    "moe": Preset("MoE FFN stack, 4 layers, 8 experts top-2, d 1024 -> 4096, batch 8 x 512 tokens, bf16",
                  moe.MoEConfig, moe.forward_workload,
                  dict(batch=8, seq_len=512, d_model=1024, d_ff=4096, experts=8, top_k=2, layers=4,
                       dtype="bfloat16")),
    "moe-tiny": Preset("MoE FFN stack, 2 layers, 4 experts top-2, d 32 -> 64, batch 4 x 16 tokens, f32",
                       moe.MoEConfig, moe.forward_workload,
                       dict(batch=4, seq_len=16, d_model=32, d_ff=64, experts=4, top_k=2, layers=2,
                            dtype="float32")),
    "gpt-tiny-decode": Preset("tiny GPT (V256 d64 H4 L2) one decode step, KV cache 16, batch 2, f32",
                              gpt.GPTConfig, gpt.decode_workload, _GPT_TINY),
}

from . import attention, families, train, transformer  # noqa: E402  (Llama-class families, issue 14)

PRESETS.update(families.presets(Preset))

#: Every key ``--set key=value`` may name (a preset accepts those its config has).
OVERRIDE_KEYS = ("batch", "seq_len", "layers", "d_model", "heads", "kv_heads",
                 "dtype", "scan_layers", "vocab", "d_ff", "experts", "top_k",
                 "head_dim", "expert_d_ff", "shared_experts", "dense_layers", "sliding_window",
                 "weights_dtype", "kv_dtype", "remat", "stacked_cache", "attention", "act_dtype",
                 "window_cache")


#: Largest value of an integer override: int32, the type jax gives token ids (``vocab``)
#: and cache positions (``seq_len``); larger shapes fail inside XLA, not here.
MAX_INT_OVERRIDE = 2**31 - 1
#: Largest ``layers`` when the layers are unrolled (``scan_layers`` false or absent):
#: each layer is traced separately (flax's eval_shape grows superlinearly: 50 layers of
#: gpt-tiny take ~9 s on the CI machine, 200 take ~4 min).
MAX_UNROLLED_LAYERS = 256
#: Largest array, in bytes, any tensor of a zoo program may have: XLA computes byte
#: sizes in int64 and aborts the process (no Python exception) beyond it; 2**62 leaves
#: room for padding.
MAX_ARRAY_BYTES = 2**62


def _int_value(s) -> int | None:
    """An integer given as an int (not a bool) or as ASCII decimal digits (Python's ``int``
    also takes ``4_0`` as 40 and other scripts' digits: a typo must not become a size);
    None otherwise."""
    if isinstance(s, int) and not isinstance(s, bool):
        return s
    t = str(s).strip()
    return int(t) if t.isascii() and t.isdigit() else None


def _parse_int(key: str, s: str) -> int:
    v = _int_value(s)
    if v is None or not 1 <= v <= MAX_INT_OVERRIDE:
        raise ValueError(f"--set {key}={s!r}: expected a positive integer in [1, {MAX_INT_OVERRIDE}]")
    return v


def _parse_bool(key: str, s: str) -> bool:
    t = str(s).strip().lower()
    if t in ("true", "1", "yes", "on"):
        return True
    if t in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"--set {key}={s!r}: expected true/false (or 1/0, yes/no, on/off)")


def _parse_dtype(key: str, s: str) -> str:
    try:
        return gpt.canonical_dtype(str(s).strip().lower())
    except ValueError as e:
        raise ValueError(f"--set {key}={s!r}: {e}") from None


def _parse_count(key: str, s: str) -> int:
    """A count that may be zero (``shared_experts``, ``dense_layers``)."""
    v = _int_value(s)
    if v is None or not 0 <= v <= MAX_INT_OVERRIDE:
        raise ValueError(f"--set {key}={s!r}: expected an integer in [0, {MAX_INT_OVERRIDE}]")
    return v


def _parse_with(canonical: Callable[[str], Any]) -> Callable[[str, str], Any]:
    """A parser from a canonicalising function that raises ValueError on a bad name."""
    def parse(key: str, s: str):
        if not str(s).strip():   # (`--set weights_dtype=` is a slip, not a request for none)
            raise ValueError(f"--set {key}={s!r}: an empty value; write {key}=none for none")
        try:
            return canonical(str(s).strip())
        except ValueError as e:
            raise ValueError(f"--set {key}={s!r}: {e}") from None
    return parse


_PARSERS = {k: _parse_int for k in OVERRIDE_KEYS}
_PARSERS["dtype"] = _parse_dtype
_PARSERS["scan_layers"] = _PARSERS["stacked_cache"] = _PARSERS["window_cache"] = _parse_bool
_PARSERS["weights_dtype"] = _parse_with(transformer.weights_dtype_name)
_PARSERS["kv_dtype"] = _parse_with(transformer.kv_dtype_name)
_PARSERS["remat"] = _parse_with(transformer.remat_name)
_PARSERS["attention"] = _parse_with(attention.attention_name)
_PARSERS["act_dtype"] = _parse_with(transformer.act_dtype_name)
_PARSERS["shared_experts"] = _PARSERS["dense_layers"] = _parse_count


def list_presets() -> list[tuple[str, str]]:
    """[(name, one-line description)] in registry order."""
    return [(name, p.description) for name, p in PRESETS.items()]


class PresetError(JaxmoveInputError):
    """An unknown preset, an unknown ``--set`` key, a bad value or an inconsistent config."""


def build(name: str, overrides: dict[str, str] | None = None) -> Workload:
    """Build the abstract workload of preset ``name`` (see ``_build``).

    Raises:
      PresetError: unknown preset, unknown or inapplicable override key, a bad value, or an
        inconsistent config (e.g. kv_heads not dividing heads); the message names the key.
    """
    try:
        return _build(name, overrides)
    except PresetError:
        raise
    except (KeyError, ValueError) as e:  # the configs' own checks (their __post_init__)
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise PresetError(msg) from None


def check_overrides(name: str, overrides: dict[str, str] | None = None) -> None:
    """Check ``overrides`` of preset ``name`` as ``build`` would, without building the
    workload (no tracing: the values are parsed and the config constructed, so its own
    checks run; a sweep checks every point this way when its file is read).

    Raises:
      PresetError: as ``build`` (except the array-size bound, which needs the workload).
    """
    try:
        _config(name, overrides)
    except PresetError:
        raise
    except (KeyError, ValueError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise PresetError(msg) from None


def _config(name: str, overrides: dict[str, str] | None = None):
    """(preset, its config object, the config dict) of preset ``name`` with ``overrides``
    applied (``_build``'s checks before the workload is made; raises as ``_build``)."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; available presets: {', '.join(PRESETS)}")
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(f"overrides must be a dict of --set keys to values, e.g. {{'batch': '8'}}; "
                         f"got {type(overrides).__name__} {overrides!r:.80}")
    preset = PRESETS[name]
    fields = {f.name for f in dataclasses.fields(preset.config_cls)}
    valid = [k for k in OVERRIDE_KEYS if k in fields]
    config = dict(preset.config)
    for key, value in (overrides or {}).items():
        if key not in valid:
            raise ValueError(
                f"unknown override key {key!r} for preset {name!r}; valid keys: {', '.join(valid)}")
        if isinstance(value, str) or (isinstance(value, int) and _PARSERS[key] is _parse_int):
            value = _PARSERS[key](key, str(value))  # Python ints get the same bounds
        config[key] = value
    if not config.get("scan_layers", False) and config.get("layers", 1) > MAX_UNROLLED_LAYERS:
        hint = "; use --set scan_layers=true" if "scan_layers" in fields else ""
        raise ValueError(f"--set layers={config['layers']}: at most {MAX_UNROLLED_LAYERS} unrolled "
                         f"layers (each is traced separately){hint}")
    cfg = preset.config_cls(**config)
    _check_applicable(name, preset, cfg, overrides or {})
    return preset, cfg, config


#: ``--set`` keys of a transformer config that only a mixture-of-experts model reads
#: (``experts`` > 0: models/transformer.py ``TransformerConfig``)
MOE_ONLY_KEYS = ("top_k", "expert_d_ff", "shared_experts", "dense_layers")


def _check_applicable(name: str, preset: Preset, cfg, overrides: dict) -> None:
    """Raise ValueError for a given key the preset's program never reads (it would compile the
    same program, silently): ``remat`` outside a training step (nothing is rematerialised
    without a backward pass), the KV-cache keys (``kv_dtype``, ``stacked_cache``) of a
    training step, which has no cache, and its ``weights_dtype`` (``train_workload`` refuses
    it: said here too, so a sweep file is checked when read), the MoE keys of a dense model,
    ``window_cache`` without a sliding window, ``kv_heads`` of a latent-attention (MLA) model. A key given its default value
    (``remat=none``, ``shared_experts=0``: what the program does anyway) passes, so one sweep
    grid can span both kinds of preset."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}

    def changes(key: str) -> bool:
        return key in overrides and getattr(cfg, key) != defaults.get(key)

    training = preset.builder is train.train_workload
    if changes("remat") and not training:
        raise ValueError(f"--set remat={overrides['remat']}: remat applies to the training presets "
                         f"(it rematerialises activations for the backward pass); {name!r} has none")
    if training:
        if getattr(cfg, "weights_dtype", None) is not None and "weights_dtype" in overrides:
            # (train_workload refuses it too: said here so a sweep file is checked when read)
            raise ValueError(f"--set weights_dtype={overrides['weights_dtype']}: training presets "
                             "train unquantized weights (weights_dtype applies to prefill and decode)")
        given = [k for k in ("kv_dtype", "stacked_cache") if changes(k)]
        if given:
            raise ValueError(f"--set {given[0]}={overrides[given[0]]}: {given[0]} applies to a KV "
                             f"cache (prefill and decode); the training step {name!r} has none")
    no_window = getattr(cfg, "sliding_window", None) is None
    if changes("window_cache") and no_window:
        raise ValueError(f"--set window_cache={overrides['window_cache']}: window_cache applies to "
                         f"models with a sliding window (Gemma 2's local layers); {name!r} has none")
    if "window_cache" in overrides and not no_window and getattr(cfg, "window_cache", False) \
            and (cfg.scan_layers or cfg.stacked_cache):
        form = "scan_layers=true" if cfg.scan_layers else "stacked_cache=true"
        raise ValueError(f"--set window_cache={overrides['window_cache']}: with {form} every layer's "
                         "cache is one stacked array of seq_len positions, so no local layer keeps a "
                         "ring of its window; drop window_cache or use unrolled layers with one cache "
                         "array each (the decode presets' default)")
    if getattr(cfg, "mla", False) and "kv_heads" in overrides and cfg.kv_heads != cfg.heads:
        # (MLA's cache is one latent head every query head attends with: cache_entry_shapes)
        raise ValueError(f"--set kv_heads={overrides['kv_heads']}: {name!r} uses multi-head latent "
                         "attention (kv_lora_rank is set): its cache is one latent head "
                         "[batch, seq_len, kv_lora_rank + qk_rope_dim] for every query head, so "
                         "kv_heads changes nothing (the preset's kv_lora_rank sizes the cache)")
    if getattr(cfg, "experts", None) == 0:
        given = [k for k in MOE_ONLY_KEYS if k in overrides and (k == "expert_d_ff" or changes(k))]
        if given:
            raise ValueError(f"--set {given[0]}={overrides[given[0]]}: {', '.join(given)} "
                             f"{'applies' if len(given) == 1 else 'apply'} to "
                             f"mixture-of-experts models; {name!r} has experts=0 (set experts too)")


def _build(name: str, overrides: dict[str, str] | None = None) -> Workload:
    """Build the abstract workload of preset ``name``.

    Args:
      name: a key of ``PRESETS``.
      overrides: ``{key: value}`` strings as given on the CLI (``--set key=value``);
        values are parsed to the config's types (ints, dtype names, booleans
        true/false, 1/0, yes/no, on/off; integers as ASCII digits only).  Non-string values
        are accepted too.

    Returns:
      A ``Workload`` whose argument leaves are ``jax.ShapeDtypeStruct``;
      ``config["preset"]`` is ``name``.

    Raises:
      KeyError: unknown preset (the message lists the presets).
      ValueError: unknown or inapplicable override key, or a bad value (the
        message lists the valid keys), or an inconsistent config (e.g. kv_heads
        not dividing heads).
    """
    preset, cfg, config = _config(name, overrides)
    wl = preset.builder(cfg, name)
    _check_array_sizes(wl, config)
    return dataclasses.replace(wl, config={**wl.config, "preset": name})


def _check_array_sizes(wl: Workload, config: dict) -> None:
    """Raise ValueError when some array of ``wl`` (argument, output or intermediate)
    would exceed ``MAX_ARRAY_BYTES``.

    Cheap path: 8 bytes x the product of every integer config value (``seq_len``
    twice, for attention scores) bounds every tensor of the zoo models; only when that
    bound exceeds the limit is the program traced abstractly (``jax.make_jaxpr``,
    ~0.1 s for gpt2-small) and every array's size checked.
    """
    bound = 8
    for k, v in config.items():
        if isinstance(v, int) and not isinstance(v, bool):
            bound *= v * v if k == "seq_len" else v
    if bound < MAX_ARRAY_BYTES:
        return
    try:
        closed = jax.make_jaxpr(wl.fn, static_argnums=wl.static_argnums)(*wl.args)
    except Exception:  # an invalid config: capture reports it
        return
    worst = [0, ""]

    def visit(jaxpr) -> None:
        for v in list(jaxpr.invars) + list(jaxpr.outvars) + [o for e in jaxpr.eqns for o in e.outvars]:
            aval = getattr(v, "aval", None)
            shape = getattr(aval, "shape", None)
            if shape is None or not hasattr(aval, "dtype"):
                continue
            try:  # a Pallas kernel's semaphores and refs have dtypes numpy does not know
                itemsize = jnp.dtype(aval.dtype).itemsize
            except TypeError:
                continue
            n = 1
            for d in shape:
                n *= int(d)
            nbytes = n * itemsize
            if nbytes > worst[0]:
                worst[:] = [nbytes, f"{jnp.dtype(aval.dtype).name}{list(shape)}"]
        for e in jaxpr.eqns:
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                visit(sub)

    visit(closed.jaxpr)
    if worst[0] > MAX_ARRAY_BYTES:
        shown = ", ".join(f"{k}={v}" for k, v in config.items()
                          if isinstance(v, int) and not isinstance(v, bool))
        raise ValueError(f"config {shown} makes an array {worst[1]} of {worst[0]:.3g} bytes; "
                         f"XLA needs every array below 2**62 bytes")


def materialize(workload: Workload, seed: int = 0) -> tuple:
    """Concrete random arguments for ``workload.args`` (same structure and dtypes).

    Floating leaves are N(0, 0.02^2) in their dtype.  Integer leaves are token ids
    uniform in [0, config["vocab"]), except the argument whose parameter name in
    ``workload.fn`` is ``pos``: uniform in [0, config["seq_len"]), a valid cache
    position.  Boolean leaves are uniform.  Allocates every parameter: use small
    configs.
    """
    vocab = int(workload.config.get("vocab", 2))
    seq_len = int(workload.config.get("seq_len", 1))
    key = jax.random.key(seed)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(workload.args)
    out = []
    for i, (path, leaf) in enumerate(leaves):
        k = jax.random.fold_in(key, i)
        shape, dtype = tuple(leaf.shape), jnp.dtype(leaf.dtype)
        if jnp.issubdtype(dtype, jnp.floating):
            out.append((0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dtype))
        elif dtype == jnp.bool_:
            out.append(jax.random.bernoulli(k, 0.5, shape))
        elif jnp.issubdtype(dtype, jnp.integer):
            hi = seq_len if _arg_name(workload, path) == "pos" else vocab
            out.append(jax.random.randint(k, shape, 0, hi, dtype))
        else:
            raise ValueError(f"materialize: unsupported dtype {dtype} at {jax.tree_util.keystr(path)}")
    return jax.tree_util.tree_unflatten(treedef, out)


def _arg_name(workload: Workload, path) -> str:
    """The Python parameter name of the positional argument a leaf path starts in."""
    try:
        params = [p.name for p in inspect.signature(workload.fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return params[path[0].idx] if path and path[0].idx < len(params) else ""
    except (TypeError, ValueError, AttributeError):
        return ""
