r"""The two training phases of a kernel-attention model, as pure jitted steps.

**Phase A** moves only the particles Ω (every ``particles`` leaf, ``[H, M, D_h]``
per layer) by projected Langevin dynamics (``langevin.langevin_transform``) on

.. math::
   H(Ω) = \sum_{l,h} \big[ −A(φ_{Ω_{l,h}}(r_{l,h}), y) + λ\,W_s(Ω_{l,h}) \big]

where r_{l,h} ``[B, D_h]`` is the mean over real tokens of the (scaled) keys
entering head h of layer l (``models.KernelAttention`` sows it as
``phase_a_inputs``), y = 2·label − 1, A the alignment U-statistic and W_s the
Riesz energy (``hamiltonian.hamiltonian_terms``). The representations are
treated as data (``stop_gradient``): each head's particles feel the alignment of
their own head, which is the core library's Hamiltonian with x = r. Every other
parameter gets ``optax.set_to_zero`` and stays bit-identical.

**Phase B** freezes the particles (``set_to_zero``) and trains the rest with
AdamW under a linear warm-up + cosine schedule on the weighted cross-entropy.

Both optimisers are one ``optax.partition`` over the labels of
``partition_labels``. Steps take the key first-class: dropout uses
``fold_in(key, step)``.

**Layer-wise Phase A** (``make_phase_a_layer_step``, ``attention_paths``): the
same Hamiltonian, minimised one layer at a time. Because r_{l,h} is treated as
data, layer l's term depends on the particles of layers < l only through its
inputs, and on no other particles. Layer by layer, with the layers below already
at their Phase A result, r_l is fixed for the whole stage: it can be computed once
per example (one forward pass) and every Langevin step works on the cached
``[B, H, D_h]`` inputs, with no encoder forward at all. Layer 0 follows the same
dynamics as in the joint schedule (up to the noise draws and the clipping norm,
which is per layer); layer l > 0 learns on the inputs it will see in Phase B.
"""

import re
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from coulomb_jax import hamiltonian
from coulomb_jax import langevin

PARTICLES = 'particles'
PHASE_A_INPUTS = 'phase_a_inputs'


class TrainState(NamedTuple):
  """``step``: updates done in this phase; ``params``; ``opt_state``."""
  step: jax.Array
  params: Any
  opt_state: Any


def partition_labels(params, only: Optional[Sequence[str]] = None) -> Any:
  """``'particles'`` for every leaf named ``particles``, ``'rest'`` otherwise.

  ``only``: the path of one attention module (e.g. ``('attention_1',)`` in
  ``models.EncoderClassifier``); then only its particles are labelled ``'particles'``.
  """
  flat = traverse_util.flatten_dict(params)
  only = None if only is None else tuple(only)
  labels = {k: PARTICLES if k[-1] == PARTICLES and (only is None or k[:-1] == only)
            else 'rest' for k in flat}
  return traverse_util.unflatten_dict(labels)


def has_particles(params) -> bool:
  return any(k[-1] == PARTICLES for k in traverse_util.flatten_dict(params))


def _natural_key(path):
  return [(0, int(t), '') if t.isdigit() else (1, 0, t)
          for part in path for t in re.split(r'(\d+)', part) if t]


def attention_paths(params) -> list:
  """Paths of the modules holding ``particles``, in layer order.

  Numbers compare as numbers: ``attention_2`` comes before ``attention_10``.
  """
  paths = {k[:-1] for k in traverse_util.flatten_dict(params) if k[-1] == PARTICLES}
  return sorted(paths, key=_natural_key)


def phase_a_optimizer(key: jax.Array, *, step_size: float, beta: float, radius: float,
                      clip_norm: float, only: Optional[Sequence[str]] = None
                      ) -> optax.GradientTransformation:
  """Langevin on the particles, nothing else moves (see module docstring).

  ``only``: move only the particles of the attention module at this path (the
  layer-wise schedule); every other leaf, particles included, gets
  ``set_to_zero``. The state has the same structure either way.
  """
  return optax.partition(
      {PARTICLES: langevin.langevin_transform(key, step_size=step_size, beta=beta,
                                              radius=radius, clip_norm=clip_norm),
       'rest': optax.set_to_zero()}, lambda p: partition_labels(p, only))


def phase_b_schedule(*, learning_rate: float, warmup_steps: int, total_steps: int):
  """0 → ``learning_rate`` linearly over ``warmup_steps``, then cosine to 0."""
  return optax.warmup_cosine_decay_schedule(
      0.0, learning_rate, warmup_steps, max(total_steps, warmup_steps + 1), end_value=0.0)


def phase_b_optimizer(*, learning_rate: float, warmup_steps: int, total_steps: int,
                      weight_decay: float, clip_norm: float) -> optax.GradientTransformation:
  """AdamW (with global-norm clipping) on everything but the particles, which are frozen."""
  schedule = phase_b_schedule(learning_rate=learning_rate, warmup_steps=warmup_steps,
                              total_steps=total_steps)
  rest = optax.chain(optax.clip_by_global_norm(clip_norm),
                     optax.adamw(schedule, weight_decay=weight_decay))
  return optax.partition({PARTICLES: optax.set_to_zero(), 'rest': rest}, partition_labels)


def _forward(model: nn.Module, params, batch, **kwargs):
  return model.apply({'params': params}, batch['ids'], batch['segments'], batch['mask'],
                     **kwargs)


def phase_a_inputs(model: nn.Module, params, batch) -> Dict[Tuple[str, ...], jax.Array]:
  """``{path of the attention module: r [B, H, D_h]}`` for one batch (no gradient)."""
  _, state = _forward(model, params, batch, deterministic=True, mutable=['intermediates'])
  flat = traverse_util.flatten_dict(state.get('intermediates', {}))
  return {k[:-1]: jax.lax.stop_gradient(v[0]) for k, v in flat.items()
          if k[-1] == PHASE_A_INPUTS}


def phase_a_objective(params, inputs, labels, weights, *, feature_map, lam: float, s,
                      softening: float):
  """(H, {"alignment": Σ A, "repulsion": Σ W}) summed over layers and heads.

  ``weights``: ``[B]``, 1 for real rows and 0 for padding rows. Padding rows get
  y = 0, and A is rescaled by B(B − 1) / (n(n − 1)), n = Σ weights, so that it is
  the U-statistic over the n real rows only (0 if n < 2).
  """
  flat = traverse_util.flatten_dict(params)
  weights = weights.astype(jnp.float32)
  y = (2.0 * labels.astype(jnp.float32) - 1.0) * weights
  size, n = weights.shape[0], jnp.sum(weights)
  rescale = jnp.where(n >= 2, size * (size - 1) / jnp.maximum(n * (n - 1), 1.0), 0.0)
  total = align = repel = 0.0
  for path, r in inputs.items():
    omega = flat[path + (PARTICLES,)]                      # [H, M, D_h]
    terms = jax.vmap(lambda w, x: hamiltonian.hamiltonian_terms(
        w, x, y, feature_map=feature_map, lam=lam, s=s, softening=softening),
                     in_axes=(0, 1))(omega, r.astype(jnp.float32))
    a = jnp.sum(terms[1]['alignment'])
    total = total + jnp.sum(terms[0]) - (rescale - 1.0) * a        # −A → −rescale·A
    align = align + rescale * a
    repel = repel + jnp.sum(terms[1]['repulsion'])
  return total, {'alignment': align, 'repulsion': repel}


def make_phase_a_step(model: nn.Module, optimizer: optax.GradientTransformation, *,
                      feature_map, lam: float, s, softening: float) -> Callable:
  """``step(state, batch) -> (state, metrics)``: one Langevin move of every particle.

  metrics: ``hamiltonian``, ``alignment``, ``repulsion`` (before the move) and
  ``max_move`` = max_k ‖Δω_k‖ over all heads and layers (early stopping).
  """

  def step(state: TrainState, batch):
    inputs = phase_a_inputs(model, state.params, batch)
    (h, aux), grads = jax.value_and_grad(phase_a_objective, has_aux=True)(
        state.params, inputs, batch['labels'], batch['weights'], feature_map=feature_map,
        lam=lam, s=s, softening=softening)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    moves = [jnp.max(jnp.linalg.norm(u, axis=-1))
             for k, u in traverse_util.flatten_dict(updates).items() if k[-1] == PARTICLES]
    metrics = dict(aux, hamiltonian=h, max_move=jnp.max(jnp.stack(moves)))
    return TrainState(state.step + 1, params, opt_state), metrics

  return step


def make_phase_a_layer_step(path: Sequence[str], optimizer: optax.GradientTransformation, *,
                            feature_map, lam: float, s, softening: float) -> Callable:
  """``step(state, r, labels, weights) -> (state, metrics)`` on cached inputs.

  One Langevin move of the particles of the attention module at ``path`` on
  given pooled keys ``r: [B, H, D_h]`` (the layer-wise schedule; see the module
  docstring), with ``optimizer = phase_a_optimizer(..., only=path)``. No encoder
  forward pass. Metrics as ``make_phase_a_step``, for this layer only.
  """
  path = tuple(path)

  def step(state: TrainState, r, labels, weights):
    (h, aux), grads = jax.value_and_grad(phase_a_objective, has_aux=True)(
        state.params, {path: jax.lax.stop_gradient(r)}, labels, weights,
        feature_map=feature_map, lam=lam, s=s, softening=softening)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    move = traverse_util.flatten_dict(updates)[path + (PARTICLES,)]
    metrics = dict(aux, hamiltonian=h, max_move=jnp.max(jnp.linalg.norm(move, axis=-1)))
    return TrainState(state.step + 1, params, opt_state), metrics

  return step


def cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
  """Σ_i w_i CE(logits_i, y_i) / max(Σ_i w_i, 1)."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def make_phase_b_step(model: nn.Module, optimizer: optax.GradientTransformation) -> Callable:
  """``step(key, state, batch) -> (state, metrics)``; dropout key ``fold_in(key, step)``."""

  def step(key: jax.Array, state: TrainState, batch):
    dropout_key = jax.random.fold_in(key, state.step)

    def loss_fn(params):
      logits = _forward(model, params, batch, deterministic=False,
                        rngs={'dropout': dropout_key})
      return cross_entropy(logits, batch['labels'], batch['weights']), logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    correct = (jnp.argmax(logits, -1) == batch['labels']) * batch['weights']
    metrics = {'loss': loss, 'accuracy': jnp.sum(correct) / jnp.maximum(
        jnp.sum(batch['weights']), 1.0), 'grad_norm': optax.tree.norm(grads)}
    return TrainState(state.step + 1, params, opt_state), metrics

  return step


def make_predict(model: nn.Module) -> Callable:
  """``predict(params, batch) -> [B]`` probability of class 1 (no dropout)."""

  def predict(params, batch):
    logits = _forward(model, params, batch, deterministic=True)
    return jax.nn.softmax(logits, axis=-1)[:, 1]

  return predict
