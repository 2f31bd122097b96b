r"""The methods of the mimicry study at an equal number N of features per head, and their fits.

=====================  ==========================================================================
``favor_iid``          FAVOR+ exp(ωᵀx − ‖x‖²/2) on N i.i.d. N(0, I) rows (Performer, iid).
``favor_orthogonal``   the same on N block-orthogonal rows (Performer's default).
``ball``               the iid draw projected onto the ball ‖ω‖ ≤ R the particles live in (the
                       control that separates the ball from the dynamics).
``particles_labels``   N particles from the ball draw moved by projected Langevin on the paper's
                       label Hamiltonian −A(pooled keys, ±1 labels) + λ·W_s (its target is the
                       labels; it sees no attention row).
``particles_softmax``  N particles from the ball draw moved by projected Langevin on the mimicry
                       Hamiltonian CE(A_soft ‖ A_lin) + λ·W_s (``conversion`` method
                       ``particles``).
``gradient_flow``      the same drift with λ = 0 and no noise (β = ∞): plain projected gradient
                       descent ω ← P_R(ω − η·N·clip(∇CE)) (``conversion`` method
                       ``gradient_flow``).
``hedgehog``           φ(x) = [exp(Wx), exp(−Wx)] (map ``hedgehog``), N/2 rows of W from
                       N(0, I/d), trained by Adam on CE + λ·W_s (``conversion`` method
                       ``hedgehog``; Zhang et al. 2024).
=====================  ==========================================================================

Counting: N is the length of φ(x) per head. FAVOR+ and the particles: N rows → N features;
hedgehog: N/2 rows → N features (so hedgehog has half the rows; N ≥ 2).

Every fitted method is ``coulomb_jax.conversion.fit_groups``: ``fit.steps`` steps on the
same length-bucketed batches of ``fit_rows`` training sentences, one batch per step in a
fixed cycle, every layer and head at once (vmapped over the group axis G); step t's noise
key is ``fold_in(key, t)``. ``particles_labels`` is the same Langevin step on this
study's label energy (``_labels_energy``).
"""

from typing import List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import conversion
from coulomb_jax import features
from coulomb_jax import hamiltonian

METHODS = ('favor_iid', 'favor_orthogonal', 'ball', 'particles_labels', 'particles_softmax',
           'gradient_flow', 'hedgehog')
FITTED = ('particles_labels', 'particles_softmax', 'gradient_flow', 'hedgehog')
LIBRARY_METHOD = {'particles_labels': 'particles', 'particles_softmax': 'particles',
                  'gradient_flow': 'gradient_flow', 'hedgehog': 'hedgehog'}
"""The ``conversion.FIT_METHODS`` update of each fitted method."""


def rows(method: str, num_features: int) -> int:
  """Rows M of the parameter array for N = ``num_features`` features (hedgehog: N/2)."""
  return num_features // 2 if method == 'hedgehog' else num_features


def feature_map(method: str) -> str:
  """The map name of ``mimicry``/``flax_attention`` for ``method``."""
  return 'hedgehog' if method == 'hedgehog' else 'favor'


def initial(method: str, key: jax.Array, groups: int, num_features: int, dim: int,
            radius: float) -> jax.Array:
  """The starting rows ``[G, M, d]`` (the result itself for the three unfitted methods).

  One key per group (``split(key, G)``); iid, ball and every particle method share the
  same N(0, I) draw for a given key, so their differences are the fit's alone.
  """
  if method == 'favor_orthogonal':
    m = rows(method, num_features)
    return jax.vmap(lambda k: features.sample_orthogonal(k, m, dim))(
        jax.random.split(key, groups))
  if method == 'favor_iid':
    return jax.vmap(lambda k: features.sample_gaussian(k, num_features, dim))(
        jax.random.split(key, groups))
  return conversion.initial_features(key, groups, num_features, dim,
                                     method=LIBRARY_METHOD.get(method, 'particles'),
                                     radius=radius)


def settings_of(method: str, s) -> conversion.FitSettings:
  """The library's settings of ``method`` from the study's ``config.fit`` ``s``."""
  eta = {'particles_softmax': s.step_size, 'gradient_flow': s.flow_step_size,
         'particles_labels': s.labels_step_size, 'hedgehog': s.step_size}[method]
  return conversion.FitSettings(
      step_size=eta, beta=s.beta, lam=s.lam, radius=s.radius, clip_norm=s.clip_norm,
      riesz_s=s.riesz_s if s.riesz_s == 'coulomb' else float(s.riesz_s),
      softening=s.softening, learning_rate=s.hedgehog_learning_rate)


def _pooled(k, mask):
  """Phase A's data of one group: the mean over real tokens of the scaled keys, ``[B, d]``."""
  m = mask[:, :, None].astype(k.dtype)
  total = jnp.sum(k * k.shape[-1] ** -0.25 * m, axis=1)
  return total / jnp.maximum(jnp.sum(m, axis=1), 1.0)


def _labels_energy(settings: conversion.FitSettings):
  """``energy(omega [M, d], q, k [B, L, d], shared)``: −A(pooled keys, labels) + λ·W_s.

  Padding rows have y = 0; A (a U-statistic) is rescaled to the n real rows, as
  ``training.phase_a_objective`` does.
  """
  def energy(omega, q, k, shared):
    del q
    labels = shared['labels']
    size, n = labels.shape[0], jnp.sum(jnp.abs(labels) > 0)
    rescale = jnp.where(n >= 2, size * (size - 1) / jnp.maximum(n * (n - 1), 1.0), 0.0)
    _, terms = hamiltonian.hamiltonian_terms(
        omega, _pooled(k, shared['key_mask']), labels, feature_map='favor', lam=settings.lam,
        s=settings.riesz_s, softening=settings.softening)
    return -rescale * terms['alignment'] + settings.lam * terms['repulsion']
  return energy


def fit(method: str, key: jax.Array, omega0: jax.Array, batches: List[dict], settings,
        steps: int) -> Tuple[jax.Array, np.ndarray]:
  """``(omega [G, M, d], losses [steps, G])`` after ``steps`` steps from ``omega0``.

  ``batches``: ``encoders.head_batches``. Unfitted methods (``favor_iid``,
  ``favor_orthogonal``, ``ball``) return ``omega0`` and no losses. Step t uses
  ``batches[t % len(batches)]`` and key ``fold_in(key, t)``.
  """
  if method not in FITTED:
    return omega0, np.zeros((0, omega0.shape[0]), np.float32)
  lib = settings_of(method, settings)
  group_batches = [{'q': b['q'], 'k': b['k'], 'key_mask': b['mask'], 'query_mask': b['mask'],
                    'labels': b['labels']} for b in batches]
  omega, losses = conversion.fit_groups(
      key, omega0, group_batches, method=LIBRARY_METHOD[method], steps=steps, settings=lib,
      feature_map=feature_map(method),
      energy=_labels_energy(lib) if method == 'particles_labels' else None)
  check_finite(method, omega, losses)
  return omega, losses


STEP_FIELD = {'particles_softmax': 'step_size', 'gradient_flow': 'flow_step_size',
              'particles_labels': 'labels_step_size', 'hedgehog': 'hedgehog_learning_rate'}
"""The ``config.fit`` field that sets each fitted method's step (the pilot's choice)."""


def check_finite(method: str, omega, losses) -> None:
  """One ``FloatingPointError`` naming the method, the first group (layer-major: layer ×
  head) whose fitted features are not finite, the first step whose loss was not, and the
  config field to lower (issue 39 item 3: the study's own fits stop like the library's)."""
  omega = np.asarray(omega)
  bad = ~np.isfinite(omega.reshape(omega.shape[0], -1)).all(-1)
  if not bad.any():
    return
  group = int(np.flatnonzero(bad)[0])
  first = np.flatnonzero(~np.isfinite(np.asarray(losses)[:, group]))
  when = f'; its loss was first non-finite at step {int(first[0])}' if first.size else ''
  raise FloatingPointError(
      f'{method}: group {group} (layer-major, layer × head) holds non-finite features after '
      f'{np.asarray(losses).shape[0]} steps{when}. Lower config.fit.{STEP_FIELD[method]}.')
