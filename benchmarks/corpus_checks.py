"""Closed-form checks of the device corpus: are a real program's numbers right, not only accepted?

For a zoo program (preset x size x target x plan) this module computes, from the workload's leaf
shapes, dtypes and shardings alone (never from jaxmove's passes), the per-device compulsory bytes
of one step, and checks jaxmove's analysis of the compiled HLO against them (issue 23, "the net"):

* ``weights``: every weight leaf's per-device shard read once (a training step also writes the new
  parameters once: x2). An embedding table used only through a gather (not tied to the LM head)
  is read for the rows gathered: the step's tokens per device x the row's per-device bytes.
* ``kv_cache`` (decode): every cache leaf's per-device shard read once (the attention reads the
  whole cache buffer, masked), plus the new entries written: shard bytes / the cache length (one
  position per sequence; each cache leaf has one ``seq_len`` dimension, found by its size).
  A cache sharded along its sequence dimension is not checked (the new entry lands on one
  shard: no per-device closed form). Prefill: the cache is written once (the shard bytes).
* ``optimizer_state`` (training): every optimizer-state leaf read once and written once (x2).

Checks per program (each ``Check``: name, expected, got, ok, reason):

* ``compulsory_<role>``: the excess pass's compulsory HBM bytes of the role equal the closed form
  within 1% (``TOLERANCE``);
* ``identity``: compiled = compulsory + causes + unattributed (exactly), and the unattributed
  excess is <= 1% of compiled;
* ``tpu_memory_vs_xla`` (TPU): no fusion's memory time exceeds 3x XLA:TPU's own
  ``estimated_cycles`` time for it (the spec's clock); every exception is listed.

Families whose step touches a data-dependent part of the weights (MoE experts: the router decides)
get no weights check; the reason is recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TOLERANCE = 0.01
XLA_TIME_FACTOR = 3.0


@dataclass
class Check:
    """One closed-form check of a program (``ok`` None: not checked, ``reason`` says why)."""

    name: str
    expected: float | None
    got: float | None
    ok: bool | None
    reason: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "expected": self.expected, "got": self.got, "ok": self.ok,
                "reason": self.reason}


@dataclass
class ClosedForms:
    """Per-device compulsory HBM bytes of one step by role (read + written), or None per role
    when there is no closed form (with the reason in ``why``)."""

    by_role: dict[str, int | None] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    detail: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"by_role": dict(self.by_role), "why": dict(self.why), "detail": dict(self.detail)}


def _shard_bytes(leaf, sharding) -> int:
    shape = sharding.shard_shape(tuple(leaf.shape)) if sharding is not None else tuple(leaf.shape)
    return math.prod(shape) * _itemsize(leaf.dtype)


def _itemsize(dtype) -> float:
    import numpy as np
    dt = np.dtype(dtype)
    name = dt.name
    if name in ("int4", "uint4", "float4_e2m1fn"):
        return 0.5
    return dt.itemsize


def _shard_shape(leaf, sharding) -> tuple[int, ...]:
    return tuple(sharding.shard_shape(tuple(leaf.shape))) if sharding is not None else tuple(leaf.shape)


def _leaf_roles(wl) -> list[list[tuple[str, object, str]]]:
    """Per argument: (path, leaf, role) of each array leaf (roles as capture assigns them)."""
    import jax

    from jaxmove.vocab import unlabeled_role

    out = []
    roles = wl.roles
    for i, a in enumerate(wl.args):
        leaves = jax.tree_util.tree_flatten_with_path(a)[0]
        if callable(roles):
            rs = [roles(jax.tree_util.keystr(p), leaf) for p, leaf in leaves]
        elif roles is None:
            rs = [unlabeled_role(jax.tree_util.keystr(p)) for p, _ in leaves]
        else:
            r_i = roles[i] if isinstance(roles, (tuple, list)) else roles
            rl = jax.tree_util.tree_leaves(r_i) if not isinstance(r_i, str) else [r_i] * len(leaves)
            rs = rl if len(rl) == len(leaves) else [rl[0] if rl else "activations"] * len(leaves)
        out.append([(jax.tree_util.keystr(p), leaf, r) for (p, leaf), r in zip(leaves, rs)])
    return out


def _gathered_only(path: str, cfg: dict) -> bool:
    """An embedding table the step reads only through a gather (not tied to the LM head)."""
    p = path.replace("'", "").replace('"', "")
    if "embedding" not in p:
        return False
    if "wpe" in p:  # GPT-2's position table: gathered; wte is tied to the LM head
        return True
    if "wte" in p:
        return False
    return not cfg.get("tie_embeddings", False)


def _tokens_per_device(wl, shardings) -> int | None:
    """Tokens the step embeds per device: the integer ``[batch, length]`` argument's shard."""
    import jax
    import numpy as np

    for i, a in enumerate(wl.args):
        leaves = jax.tree_util.tree_leaves(a)
        if len(leaves) == 1 and hasattr(leaves[0], "shape") and len(leaves[0].shape) == 2 \
                and np.issubdtype(np.dtype(leaves[0].dtype), np.integer):
            sh = jax.tree_util.tree_leaves(shardings[i])[0] if shardings is not None else None
            return math.prod(_shard_shape(leaves[0], sh))
    return None


def closed_forms(wl, shardings) -> ClosedForms:
    """Per-device compulsory bytes of ``wl``'s step under ``shardings`` (a list like ``wl.args``
    of pytrees of ``NamedSharding``, or None: one device). Module docstring for the rules."""
    import jax

    cfg = dict(getattr(wl, "config", None) or {})
    mode = cfg.get("mode") or ("train" if "train" in wl.name else "decode" if "decode" in wl.name
                               else "prefill" if "prefill" in wl.name else "")
    cf = ClosedForms()
    per_arg = _leaf_roles(wl)
    sh_leaves = [jax.tree_util.tree_leaves(shardings[i]) if shardings is not None else [None] * len(per_arg[i])
                 for i in range(len(per_arg))]
    tokens = _tokens_per_device(wl, shardings)
    weights = kv = opt = 0
    kv_written = 0
    kv_ok, w_ok = True, True
    seq = int(cfg.get("seq_len") or 0)
    for i, leaves in enumerate(per_arg):
        if i in wl.static_argnums:
            continue
        for j, (path, leaf, role) in enumerate(leaves):
            if not hasattr(leaf, "shape"):
                continue
            sh = sh_leaves[i][j] if j < len(sh_leaves[i]) else None
            nbytes = _shard_bytes(leaf, sh)
            if role == "weights":
                if mode != "train" and _gathered_only(path, cfg):
                    if tokens is None:
                        w_ok = False
                        cf.why["weights"] = f"{path}: gathered, but no token argument to count its rows"
                        continue
                    row = nbytes / _shard_shape(leaf, sh)[0]
                    rows = min(tokens, _shard_shape(leaf, sh)[0])
                    if "wpe" in path:
                        rows = min(int(cfg.get("seq_len", 1)) if mode == "prefill" else 1, _shard_shape(leaf, sh)[0])
                    cf.detail[f"gathered {path}"] = int(rows * row)
                    cf.detail[f"table {path}"] = nbytes
                    weights += int(rows * row)
                else:
                    weights += nbytes
            elif role == "kv_cache":
                kv += nbytes
                dims = list(leaf.shape)
                seq_dims = [d for d, s in enumerate(dims) if s == seq]
                hd = int(cfg.get("head_dim") or 0)
                if len(seq_dims) > 1 and hd == seq and dims[-1] == hd:
                    seq_dims = seq_dims[:-1]  # the last dimension is the head (gemma2: head_dim 256)
                if len(seq_dims) != 1:
                    kv_ok = False
                    cf.why["kv_cache"] = (f"{path} {tuple(dims)}: its cache-length dimension ({seq}) is not "
                                          "unique: no closed form")
                    continue
                local = _shard_shape(leaf, sh)[seq_dims[0]]
                if local != seq:
                    kv_ok = False
                    cf.why["kv_cache"] = f"{path}: sharded along its sequence dimension (the new entry lands on one shard)"
                    continue
                kv_written += nbytes // seq
            elif role == "optimizer_state":
                opt += nbytes
    if any("experts" in str(k) for k in cfg) and int(cfg.get("experts") or 0) > 0:
        w_ok = False
        cf.why["weights"] = "MoE: the experts a step reads depend on the router (data-dependent)"
    if mode == "train":
        cf.by_role["weights"] = 2 * weights if w_ok else None
        cf.by_role["optimizer_state"] = 2 * opt
        cf.detail.update(weights_read=weights, optimizer_state_bytes=opt)
    elif mode == "decode":
        cf.by_role["weights"] = weights if w_ok else None
        cf.by_role["kv_cache"] = kv + kv_written if kv_ok else None
        cf.detail.update(weights_read=weights, kv_read=kv, kv_written=kv_written)
    elif mode == "prefill":
        cf.by_role["weights"] = weights if w_ok else None
        cf.detail.update(weights_read=weights)
    else:
        cf.by_role["weights"] = weights if w_ok else None
        cf.detail.update(weights_read=weights)
    return cf


def check_report(report, cf: ClosedForms, platform: str) -> list[Check]:
    """The checks of one analysed program (module docstring)."""
    out: list[Check] = []
    ex = report.excess
    if ex is None:
        return [Check("excess", None, None, False, "the report has no excess analysis")]
    for role, want in cf.by_role.items():
        got_line = ex.by_role.get(role)
        got = got_line.compulsory_bytes if got_line is not None else 0
        if want is None:
            out.append(Check(f"compulsory_{role}", None, got, None, cf.why.get(role, "no closed form")))
            continue
        ok = abs(got - want) <= TOLERANCE * max(want, 1)
        out.append(Check(f"compulsory_{role}", want, got, ok,
                         "" if ok else f"{got / want if want else float('inf'):.4g}x the closed form"))
    compiled = ex.compiled_bytes
    causes = sum(c.bytes for c in ex.causes)
    total = ex.compulsory_bytes + causes + ex.unattributed.bytes
    out.append(Check("identity", compiled, total, total == compiled,
                     "" if total == compiled else f"compiled {compiled} != compulsory + causes + unattributed {total}"))
    un = ex.unattributed.bytes
    out.append(Check("unattributed_le_1pct", 0.01 * compiled, un, un <= 0.01 * compiled,
                     "" if un <= 0.01 * compiled else f"{100 * un / compiled:.2f}% of compiled unattributed"))
    if platform == "tpu" and report.times is not None and report.xla is not None:
        worst, bad = 0.0, []
        for key, t in report.times.rows.items():
            if t.opcode != "fusion" or not t.memory_time_s:
                continue
            fig = report.xla.row(*key)
            if fig is None or not fig.estimated_s:
                continue
            ratio = t.memory_time_s / fig.estimated_s
            worst = max(worst, ratio)
            if ratio > XLA_TIME_FACTOR:
                bad.append(f"{key[1]} {ratio:.1f}x")
        out.append(Check("tpu_memory_vs_xla", XLA_TIME_FACTOR, worst, not bad,
                         "" if not bad else f"{len(bad)} fusions over {XLA_TIME_FACTOR:g}x: " + ", ".join(bad[:8])))
    return out


def gathered_table_excess(closed_detail: dict) -> int:
    """Bytes of the gathered tables the step does not touch: per table, its per-device shard
    (``table <path>``) less the rows gathered (``gathered <path>``), summed."""
    return sum(v - closed_detail.get("gathered " + k[len("table "):], 0)
               for k, v in closed_detail.items() if k.startswith("table "))


def known_cause(check: dict, closed_detail: dict, prefetched: list[str] | None = None) -> str | None:
    """Why a failed ``compulsory_weights`` check is off, when the numbers say so: the excess pass
    counted each gathered table whole (got - expected = table shards - gathered rows, within
    ``TOLERANCE`` of the closed form); ``prefetched``: the entry parameters XLA cross-program
    prefetches (``copy-start`` with ``cross_program_prefetch_index``). Returns ``"<cause>;
    <this program's numbers>"``, or None: no known cause."""
    if check.get("name") != "compulsory_weights" or check.get("ok") is not False:
        return None
    want, got = check.get("expected"), check.get("got")
    extra = gathered_table_excess(closed_detail)
    if not want or got is None or extra <= 0 or abs((got - want) - extra) > TOLERANCE * want:
        return None
    tables = [k[len("table "):] for k in closed_detail if k.startswith("table ")]
    how = ""
    if prefetched and any(p.endswith(t) or t.endswith(p) for t in tables for p in prefetched):
        how = (" (XLA:TPU cross-program-prefetches the table into VMEM, copy-start with "
               "cross_program_prefetch_index, and gathers from the copy)")
    return (f"the gathered table {', '.join(tables)} counted whole as compulsory{how}; "
            f"got - closed form = {got - want:,.0f} B = table shard - rows gathered ({extra:,} B)")

