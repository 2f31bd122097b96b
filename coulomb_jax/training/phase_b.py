"""Phase B: the particles frozen, the rest trained on the weighted cross-entropy; prediction."""

from typing import Any, Callable, Dict, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from coulomb_jax.training.inputs import _field, _model_call, forward
from coulomb_jax.training.state import TrainState


def cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
  """Σ_i w_i CE(logits_i, y_i) / max(Σ_i w_i, 1)."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def make_phase_b_step(model: nn.Module, optimizer: optax.GradientTransformation, *,
                      loss: Optional[Callable] = None, inputs: Optional[Callable] = None,
                      apply_kwargs: Optional[Dict[str, Any]] = None) -> Callable:
  """``step(key, state, batch) -> (state, metrics)``; dropout key ``fold_in(key, step)``.

  ``loss(outputs, batch) -> scalar`` (default: the weighted cross-entropy
  ``cross_entropy(outputs, batch['labels'], batch['weights'])``, with ``accuracy`` in the
  metrics); ``inputs`` and ``apply_kwargs`` as ``make_phase_a_step`` (the encoder's
  default: ``deterministic=False``); the dropout key goes in as ``rngs={'dropout': ...}``.
  Metrics: ``loss``, ``grad_norm`` (and ``accuracy`` with the default loss). With
  ``phase_b_optimizer`` the particles stay bit-identical.
  """
  fn, kwargs = _model_call(inputs, apply_kwargs, {'deterministic': False})
  if loss is not None and not callable(loss):
    raise ValueError(f'loss must be a function (outputs, batch) -> scalar, got '
                     f'{type(loss).__name__}.')

  def step(key: jax.Array, state: TrainState, batch):
    dropout_key = jax.random.fold_in(key, state.step)

    def loss_fn(params):
      outputs = forward(model, params, batch, inputs=fn, rngs={'dropout': dropout_key},
                        **kwargs)
      if loss is not None:
        return loss(outputs, batch), outputs
      y, w = _field(batch, 'labels', 'loss'), _field(batch, 'weights', 'loss')
      return cross_entropy(outputs, y, w), outputs

    (value, outputs), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {'loss': value}
    if loss is None:
      correct = (jnp.argmax(outputs, -1) == batch['labels']) * batch['weights']
      metrics['accuracy'] = jnp.sum(correct) / jnp.maximum(jnp.sum(batch['weights']), 1.0)
    metrics['grad_norm'] = optax.tree.norm(grads)
    return TrainState(state.step + 1, params, opt_state), metrics

  return step


def make_predict(model: nn.Module) -> Callable:
  """``predict(params, batch) -> [B]`` probability of class 1 (no dropout)."""

  def predict(params, batch):
    logits = forward(model, params, batch, deterministic=True)
    return jax.nn.softmax(logits, axis=-1)[:, 1]

  return predict
