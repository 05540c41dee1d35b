"""Training steps of the zoo's decoders: loss, ``jax.grad`` and an AdamW update (optax).

``fn(params, opt_state, tokens, targets) -> (params, opt_state, loss)``:

  logits = model.forward(tokens)                       # [B, T, V] float32
  loss   = mean over B, T of logsumexp(logits) - logits[target]   (next-token cross entropy)
  grads  = jax.grad(loss)(params)
  params, opt_state = AdamW(grads, opt_state, params)  # optax.adamw (Loshchilov & Hutter 2019)

``batch`` is the micro-batch size and ``seq_len`` the sequence length (``--set``); there
is no gradient accumulation. ``remat`` picks a ``jax.checkpoint`` policy for each layer
(``none``, ``full``: recompute everything, ``dots``: save matmul outputs, ``dots_no_batch``:
save matmuls without batch dims) -- see ``jax.checkpoint_policies``.

The optimizer state (optax ``ScaleByAdamState``: ``count`` int32 scalar, ``mu`` and ``nu``
shaped like the parameters, in the parameter dtype -- optax's default) is an argument with
the role ``optimizer_state`` and the parameters' logical axes; parameters and optimizer
state are donated, so the update is in place (``out_roles`` marks the step's new parameters and
optimizer state, so sharding plans lay them out like the donated arguments and XLA reuses the
buffers; under ``fsdp`` the optimizer state is sharded like the weights). Hyper-parameters (not costed by jaxmove):
learning rate 3e-4, b1 0.9, b2 0.95, eps 1e-8, weight decay 0.1 (the Llama 2/3 recipe).
MoE models are trained without an auxiliary load-balancing loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxmove.workload import Workload
from . import transformer as tf

#: The optimizer of every training preset.
OPTIMIZER = optax.adamw(learning_rate=3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1)


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross entropy: logits float32 [B, T, V], targets int32 [B, T] -> scalar."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(logz - picked)


def optimizer_state_axes(opt_state, params, param_axes):
    """Logical axes of ``opt_state``: a leaf shaped like a parameter (``mu``/``nu``) takes
    that parameter's axes; anything else (``count``) has none."""
    return optax.tree_map_params(
        OPTIMIZER, lambda _, box: box.value, opt_state, _Boxed.wrap(param_axes),
        transform_non_params=lambda leaf: (None,) * len(leaf.shape),
        is_leaf=lambda x: isinstance(x, _Boxed))


class _Boxed:
    """A tuple of axis names held as one pytree leaf."""

    def __init__(self, value):
        self.value = value

    @staticmethod
    def wrap(tree):
        return jax.tree.map(_Boxed, tree, is_leaf=lambda x: isinstance(x, tuple))


def train_workload(cfg: tf.TransformerConfig, name: str) -> Workload:
    """The training step of ``cfg`` (module docstring); every argument abstract.

    Raises:
      ValueError: ``cfg.weights_dtype`` is set (training presets train unquantized weights).
      AttentionError: ``cfg.attention`` has no training kernel or cannot compute ``cfg``.
    """
    if cfg.weights_dtype is not None:
        raise ValueError(f"--set weights_dtype={cfg.weights_dtype}: training presets train "
                         "unquantized weights (weights_dtype applies to prefill and decode)")
    from .attention import check_mode
    check_mode(cfg, "forward")
    graphdef, params, param_axes = tf.abstract_params(cfg)
    opt_state = jax.eval_shape(OPTIMIZER.init, params)
    opt_axes = optimizer_state_axes(opt_state, params, param_axes)

    def train_step(params, opt_state, tokens, targets):
        def loss_fn(p):
            return cross_entropy(nnx.merge(graphdef, p).forward(tokens), targets)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        with jax.named_scope("optimizer"):
            updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    tok = jax.ShapeDtypeStruct((cfg.batch, cfg.seq_len), jnp.int32)
    return Workload(
        name=name, fn=train_step, args=(params, opt_state, tok, tok),
        roles=(jax.tree.map(lambda _: "weights", params),
               jax.tree.map(lambda _: "optimizer_state", opt_state),
               "activations", "activations"),
        donate_argnums=(0, 1),
        config={**tf._config(cfg, "train"), "optimizer": "adamw"},
        logical_axes=(param_axes, opt_axes, ("batch", "length"), ("batch", "length")),
        out_logical_axes=(param_axes, opt_axes, ()),
        # the new parameters and optimizer state take the layout of the donated ones
        out_roles=(jax.tree.map(lambda _: "weights", params),
                   jax.tree.map(lambda _: "optimizer_state", opt_state), "activations"),
    )
