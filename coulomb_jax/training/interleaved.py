r"""Phase A interleaved with training: one optimiser update in which the particles feel the
softmax target's force and every other parameter its task gradient (Hedgehog-style
distillation beside the task loss).

For a model whose attention layers sow their per-head (q, k) (``KernelAttention``, or
``flax_attention.kernel_attention_fn(omega, sow_into=self)``), one step is

.. math::
   g_θ = ∇_θ L(θ) \quad (θ \notin Ω), \qquad
   g_{Ω_{l,h}} = ∇_{Ω_{l,h}} \big[ D(Ω_{l,h}; q_{l,h}, k_{l,h}) + λ W_s(Ω_{l,h}) \big]
               \; (+\, ∇_{Ω_{l,h}} L \text{ with } ``with_task_gradient``)

with L the task loss of the batch, D the mimicry data term (``target``; cross-entropy
CE(A^soft ‖ A^lin) by default) on the layer's own queries and keys of the batch's first
``rows`` sequences (``phase_a_mimicry.sown_forces``: q and k are data, so the force does
not reach W_q, W_k), and W_s the Riesz energy. The update is the optimiser's on the whole
tree: a ``phase_a_optimizer``-style transformation on the ``particles`` leaves (Langevin
with its noise and ball) and e.g. AdamW on the rest, as one ``optax.partition``.

``interleaved_grads`` is the gradient itself (the causal LM's ``training.lm.train_step`` runs
on it); ``make_interleaved_step`` builds a step for any Flax model from its inputs and loss.
"""

from typing import Any, Callable, Dict, Optional

import flax.linen as nn
import jax
import optax
from flax import traverse_util

from coulomb_jax import repulsion
from coulomb_jax.layers import flax_attention
from coulomb_jax.training.phase_a_mimicry import sown_forces
from coulomb_jax.training.state import PARTICLES, TrainState, apply_particle_step


def interleaved_grads(loss_and_inputs: Callable, params, *, feature_map: str, lam: float,
                      s: repulsion.Exponent = 'coulomb',
                      softening: float = repulsion.DEFAULT_SOFTENING,
                      target: str = 'cross_entropy', rows: Optional[int] = None,
                      with_task_gradient: bool = False):
  """``((loss, aux), grads)``: the task gradient of every leaf, the particles' replaced by
  (or, ``with_task_gradient``, added to) the mimicry force of their layer's sown (q, k).

  ``loss_and_inputs(params) -> (loss, (aux, inputs))``, ``inputs`` ``{path: (q, k)}`` as the
  layers sow them under ``flax_attention.MIMICRY_INPUTS`` in the same forward pass.
  """
  (loss, (aux, inputs)), grads = jax.value_and_grad(loss_and_inputs, has_aux=True)(params)
  flat = traverse_util.flatten_dict(grads)
  forces = sown_forces(params, inputs, feature_map=feature_map, lam=lam, s=s,
                       softening=softening, target=target, rows=rows).hamiltonian
  for path, force in forces.items():
    leaf = path + (PARTICLES,)
    flat[leaf] = flat[leaf] + force if with_task_gradient else force
  return (loss, aux), traverse_util.unflatten_dict(flat)


def sown_qk(intermediates) -> Dict[tuple, Any]:
  """``{path: (q, k)}`` of every layer that sowed ``MIMICRY_INPUTS`` in ``intermediates``."""
  flat = traverse_util.flatten_dict(intermediates or {})
  return {k[:-1]: v[0] for k, v in flat.items() if k[-1] == flax_attention.MIMICRY_INPUTS}


def make_interleaved_step(model: nn.Module, optimizer: optax.GradientTransformation, *,
                          loss: Callable, inputs: Callable, feature_map: str, lam: float,
                          s: repulsion.Exponent = 'coulomb',
                          softening: float = repulsion.DEFAULT_SOFTENING,
                          target: str = 'cross_entropy', rows: Optional[int] = None,
                          with_task_gradient: bool = False,
                          apply_kwargs: Optional[Dict[str, Any]] = None) -> Callable:
  """``step(state, batch) -> (state, metrics)`` (module docstring), for any Flax model.

  Args:
    model, optimizer: the model (its attention layers sow their (q, k)) and one optimiser
      over all its params (e.g. ``optax.partition`` of ``phase_a_optimizer`` on the
      particles and AdamW on the rest, over ``training.partition_labels``).
    loss: ``loss(outputs, batch) -> scalar``, the task loss.
    inputs: ``inputs(batch)`` → the positional arguments of ``model.apply`` after the
      variables; ``apply_kwargs`` its keyword arguments.
    feature_map, lam, s, softening, target, rows: the mimicry force's (``sown_forces``).
    with_task_gradient: the particles get their task gradient plus the force (Hedgehog's
      distillation beside the task loss); False: the force alone.

  Metrics: ``loss`` (before the step), the particles' ``max_move`` and
  ``nonfinite_particles`` / ``nonfinite_grads`` (``training.apply_particle_step``: a driver
  stops on the first non-zero count).
  """
  kwargs = dict(apply_kwargs or {})

  def loss_and_inputs(params, batch):
    outputs, state = model.apply({'params': params}, *inputs(batch), mutable=['intermediates'],
                                 **kwargs)
    return loss(outputs, batch), (None, sown_qk(state.get('intermediates')))

  def step(state: TrainState, batch):
    (value, _), grads = interleaved_grads(
        lambda p: loss_and_inputs(p, batch), state.params, feature_map=feature_map, lam=lam,
        s=s, softening=softening, target=target, rows=rows,
        with_task_gradient=with_task_gradient)
    new_state, moved = apply_particle_step(optimizer, state, grads)
    return new_state, dict(loss=value, **moved)

  return step
