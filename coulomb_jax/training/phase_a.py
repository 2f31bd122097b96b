r"""Phase A on the label target, as pure jitted steps: ``make_phase_a_step`` (the softmax
target: ``phase_a_mimicry``), the layer-wise ``make_phase_a_layer_step``, the objective,
forces, potential ranges and held-out alignment. The Hamiltonian, what the steps read from
any Flax model and why the layer-wise stages may cache their inputs are in the package
docstring (``coulomb_jax/training/__init__.py``)."""

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from coulomb_jax import features
from coulomb_jax import hamiltonian
from coulomb_jax import langevin_diagnostics
from coulomb_jax.training.inputs import _labels_and_weights, phase_a_inputs
from coulomb_jax.training.state import (PARTICLES, TrainState, apply_particle_step,
                                        particle_leaves)

PHASE_A_TARGETS = ('labels', 'softmax')
"""What Phase A moves the particles towards (``config.phase_a.target``): the labels
(``phase_a_objective``) or softmax attention (``phase_a_mimicry_objective``)."""


def phase_a_objective(params, inputs, labels, weights, *, feature_map, lam: float, s,
                      softening: float, precision=None):
  """(H, {"alignment": Σ A, "repulsion": Σ W}) summed over layers and heads.

  ``precision``: of every matrix product of the Hamiltonian (``hamiltonian.hamiltonian``;
  None: the backend's default, e.g. TF32 on recent NVIDIA GPUs, bf16 passes on TPU).

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
        w, x, y, feature_map=feature_map, lam=lam, s=s, softening=softening,
        precision=precision),
                     in_axes=(0, 1))(omega, r.astype(jnp.float32))
    a = jnp.sum(terms[1]['alignment'])
    total = total + jnp.sum(terms[0]) - (rescale - 1.0) * a        # −A → −rescale·A
    align = align + rescale * a
    repel = repel + jnp.sum(terms[1]['repulsion'])
  return total, {'alignment': align, 'repulsion': repel}


def make_phase_a_step(model: nn.Module, optimizer: optax.GradientTransformation, *,
                      feature_map, lam: float, s, softening: float, target: str = 'labels',
                      inputs: Optional[Callable] = None, labels: Optional[Callable] = None,
                      weights: Optional[Callable] = None, mask: Optional[Callable] = None,
                      apply_kwargs: Optional[Dict[str, Any]] = None,
                      only: Optional[Sequence[str]] = None,
                      langevin_settings: Optional[Dict[str, float]] = None,
                      precision=None) -> Callable:
  """``step(state, batch) -> (state, metrics)``: one Langevin move of every particle.

  Args:
    model, optimizer: any Flax model with kernel attention layers (module docstring) and
      ``phase_a_optimizer(...)`` (``only=`` the same path when ``only`` is set).
    feature_map, lam, s, softening: the Hamiltonian's map, λ, Riesz s and softening.
    target: ``'labels'`` (``phase_a_objective``) or ``'softmax'``
      (``phase_a_mimicry.phase_a_mimicry_objective``; labels unused).
    inputs: ``inputs(batch)`` → the positional arguments of ``model.apply`` after the
      variables (default ``encoder_inputs``); ``apply_kwargs`` its keyword arguments
      (default: ``{'deterministic': True}`` for the encoder, ``{}`` with ``inputs``).
    labels, weights: ``[B]`` int labels and row weights (1 real, 0 padding) of the label
      target (default ``batch['labels']``, ``batch['weights']``; with ``labels`` and no
      ``weights`` column, ones).
    mask: ``mask(batch)`` → ``[B, L]`` bool, the real tokens the softmax target averages
      over (default ``phase_a_mimicry.token_mask``: ``batch['mask']`` of rows with
      ``batch['weights'] > 0``).
    only: the path of one attention module: only its term is computed (layer-wise
      stages on the inputs of the layers below as they are).
    langevin_settings, precision: as below (``precision``: the label target only).

  Metrics of the label target: ``hamiltonian``, ``alignment``, ``repulsion`` (before the
  move), ``max_move`` = max_k ‖Δω_k‖ over all heads and layers (early stopping), and
  ``nonfinite_particles`` / ``nonfinite_grads``: ``{'attention_0/particles': int32 [H]}``,
  the NaN/±inf entries per head of each particle leaf before the move and of its
  gradient (``nonfinite_counts``; under jit a NaN otherwise spreads to the other heads
  and layers without an error: a driver stops on the first non-zero count). With
  ``langevin_settings`` (the optimiser's ``step_size``, ``beta``, ``clip_norm``)
  also the per-particle ``drift_to_noise`` and ``repulsion_to_alignment`` ``[P]``
  of this step (``langevin_diagnostics``). The softmax target's are
  ``phase_a_mimicry.make_phase_a_mimicry_step``'s.
  """
  if target not in PHASE_A_TARGETS:
    raise ValueError(f'target must be one of {PHASE_A_TARGETS}, got {target!r}.')
  if target == 'softmax':
    if precision is not None or labels is not None or weights is not None:
      raise ValueError("target='softmax' reads neither labels nor weights and keeps the "
                       'backend precision; pass mask (and inputs) only.')
    from coulomb_jax.training import phase_a_mimicry  # pylint: disable=g-import-not-at-top  (it imports this module)
    return phase_a_mimicry.make_phase_a_mimicry_step(
        model, optimizer, feature_map=feature_map, lam=lam, s=s, softening=softening,
        only=only, langevin_settings=langevin_settings, inputs=inputs, mask=mask,
        apply_kwargs=apply_kwargs)
  if mask is not None:
    raise ValueError("mask: the label target pools the keys its layers sow; mask is the "
                     "softmax target's (target='softmax').")
  objective = dict(feature_map=feature_map, lam=lam, s=s, softening=softening,
                   precision=precision)
  only = None if only is None else tuple(only)

  def step(state: TrainState, batch):
    data = phase_a_inputs(model, state.params, batch, inputs=inputs, apply_kwargs=apply_kwargs)
    if only is not None:
      data = {only: data[only]}
    y, w = _labels_and_weights(batch, labels, weights)
    (h, aux), grads = jax.value_and_grad(phase_a_objective, has_aux=True)(
        state.params, data, y, w, **objective)
    new_state, moved = apply_particle_step(optimizer, state, grads, only)
    metrics = dict(aux, hamiltonian=h, **moved)
    if langevin_settings is not None:
      metrics.update(_force_metrics(state.params, data, y, w, objective, langevin_settings,
                                    only))
    return new_state, metrics

  return step


def make_phase_a_layer_step(path: Sequence[str], optimizer: optax.GradientTransformation, *,
                            feature_map, lam: float, s, softening: float,
                            langevin_settings: Optional[Dict[str, float]] = None,
                            precision=None) -> Callable:
  """``step(state, r, labels, weights) -> (state, metrics)`` on cached inputs.

  One Langevin move of the particles of the attention module at ``path`` on
  given pooled keys ``r: [B, H, D_h]`` (the layer-wise schedule; see the module
  docstring), with ``optimizer = phase_a_optimizer(..., only=path)``. No encoder
  forward pass. Metrics and ``precision`` as ``make_phase_a_step``, for this layer only.
  """
  path = tuple(path)
  objective = dict(feature_map=feature_map, lam=lam, s=s, softening=softening,
                   precision=precision)

  def step(state: TrainState, r, labels, weights):
    inputs = {path: jax.lax.stop_gradient(r)}
    (h, aux), grads = jax.value_and_grad(phase_a_objective, has_aux=True)(
        state.params, inputs, labels, weights, **objective)
    new_state, moved = apply_particle_step(optimizer, state, grads, path)
    metrics = dict(aux, hamiltonian=h, **moved)
    if langevin_settings is not None:
      metrics.update(_force_metrics(state.params, inputs, labels, weights, objective,
                                    langevin_settings, path))
    return new_state, metrics

  return step


def phase_a_forces(params, inputs, labels, weights, *, feature_map, lam: float, s,
                   softening: float, only: Optional[Sequence[str]] = None,
                   precision=None) -> Dict[str, Any]:
  """The particles' gradients ``{'hamiltonian': ∇H, 'alignment': ∇A, 'repulsion': ∇W}``.

  Each a ``{path: [H, M, D_h]}`` dict over the modules that move (``only``: one),
  with A and W the summed terms of ``phase_a_objective`` (so ∇H = −∇A + λ∇W).
  What ``langevin_diagnostics`` reads the force balance and the step scale from.
  """
  kw = dict(feature_map=feature_map, lam=lam, s=s, softening=softening, precision=precision)
  term = lambda name: lambda p: phase_a_objective(p, inputs, labels, weights, **kw)[1][name]
  total = lambda p: phase_a_objective(p, inputs, labels, weights, **kw)[0]
  return {name: particle_leaves(jax.grad(f)(params), only)
          for name, f in (('hamiltonian', total), ('alignment', term('alignment')),
                          ('repulsion', term('repulsion')))}


def _force_metrics(params, inputs, labels, weights, objective, langevin_settings, only):
  """Per-particle ``drift_to_noise`` and ``repulsion_to_alignment`` ``[P]`` of one step."""
  forces = phase_a_forces(params, inputs, labels, weights, only=only, **objective)
  ls = langevin_settings
  return {'drift_to_noise': langevin_diagnostics.drift_to_noise(
              forces['hamiltonian'], step_size=ls['step_size'], beta=ls['beta'],
              clip_norm=ls.get('clip_norm')),
          'repulsion_to_alignment': langevin_diagnostics.force_ratio(
              forces['repulsion'], forces['alignment'], objective['lam'])}


def phase_a_potential_range(key: jax.Array, params, inputs, labels, *, feature_map,
                            radius: float, num_probes: int,
                            only: Optional[Sequence[str]] = None) -> Dict[Tuple[str, ...], Any]:
  """``{path: [H]}``: range over the ball of each head's one-particle data potential.

  U(ω) = −A({ω}) on the pooled keys ``inputs[path]: [n, H, D_h]`` with labels ``[n]``
  (``hamiltonian.particle_potentials`` at λ = 0), at the head's particles projected
  onto the ball and ``num_probes`` points uniform in it
  (``langevin_diagnostics.ball_probes``). β times it is the Gibbs tilt.
  """
  y = 2.0 * jnp.asarray(labels, jnp.float32) - 1.0
  out = {}
  for i, (path, omega) in enumerate(sorted(particle_leaves(params, only).items())):
    probes = langevin_diagnostics.ball_probes(jax.random.fold_in(key, i), omega, radius,
                                              num_probes)
    u = jax.vmap(lambda w, x: hamiltonian.particle_potentials(
        w, x, y, feature_map=feature_map, lam=0.0), in_axes=(0, 1))(
            probes, jnp.asarray(inputs[path], jnp.float32))
    out[path] = langevin_diagnostics.potential_range(u)
  return out


def heldout_alignment(params, inputs, labels, *, feature_map,
                      only: Optional[Sequence[str]] = None) -> Dict[Tuple[str, ...], Any]:
  """``{path: {'alignment': [H], 'centered_alignment': [H]}}`` on held-out pooled keys.

  Per head: the objective A and the centered alignment ρ(ΦΦᵀ, yyᵀ) of the head's
  features of ``inputs[path]: [n, H, D_h]`` (``langevin_diagnostics.heldout_alignment``),
  y = 2·labels − 1. Builds n×n kernels: a held-out set of a few thousand rows.
  """
  fm = features.get_feature_map(feature_map)
  y = 2.0 * jnp.asarray(labels, jnp.float32) - 1.0
  return {path: jax.vmap(lambda w, x: langevin_diagnostics.heldout_alignment(fm(x, w), y),
                         in_axes=(0, 1))(omega, jnp.asarray(inputs[path], jnp.float32))
          for path, omega in particle_leaves(params, only).items()}
