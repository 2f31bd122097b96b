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
                       Hamiltonian CE(A_soft ‖ A_lin) + λ·W_s (``mimicry.mimicry_hamiltonian``).
``gradient_flow``      the same drift with λ = 0 and no noise (β = ∞): plain projected gradient
                       descent ω ← P_R(ω − η·N·clip(∇CE)).
``hedgehog``           φ(x) = [exp(Wx), exp(−Wx)] (``mimicry.hedgehog``), N/2 rows of W from
                       N(0, I/d), trained by Adam on the same CE (Zhang et al. 2024).
=====================  ==========================================================================

Counting: N is the length of φ(x) per head. FAVOR+ and the particles: N rows → N features;
hedgehog: N/2 rows → N features (so hedgehog has half the rows; N ≥ 2).

Every fitted method takes ``fit.steps`` steps on the same length-bucketed batches of
``fit_rows`` training sentences, one batch per step in a fixed cycle, every layer and
head at once (vmapped over the group axis G); step t's noise key is ``fold_in(key, t)``.
"""

import math
from typing import Callable, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from coulomb_jax import features
from coulomb_jax import hamiltonian
from coulomb_jax import langevin
from coulomb_jax import mimicry

METHODS = ('favor_iid', 'favor_orthogonal', 'ball', 'particles_labels', 'particles_softmax',
           'gradient_flow', 'hedgehog')
FITTED = ('particles_labels', 'particles_softmax', 'gradient_flow', 'hedgehog')


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
  keys = jax.random.split(key, groups)
  m = rows(method, num_features)
  if method == 'favor_orthogonal':
    return jax.vmap(lambda k: features.sample_orthogonal(k, m, dim))(keys)
  draw = jax.vmap(lambda k: features.sample_gaussian(k, m, dim))(keys)
  if method == 'favor_iid':
    return draw
  if method == 'hedgehog':
    return draw / math.sqrt(dim)
  return langevin.project_to_ball(draw, radius)


def _pooled(k, mask):
  """Phase A's data: the mean over real tokens of the scaled keys, ``[G, B, d]``."""
  m = mask[None, :, :, None].astype(k.dtype)
  total = jnp.sum(k * k.shape[-1] ** -0.25 * m, axis=2)
  return total / jnp.maximum(jnp.sum(m, axis=2), 1.0)


def _energy(method, settings):
  """``energy(omega [M, d], q, k [B, L, d], mask, pooled [B, d], labels [B])`` of one group."""
  s = settings
  riesz_s = s.riesz_s if s.riesz_s == 'coulomb' else float(s.riesz_s)
  lam = 0.0 if method == 'gradient_flow' else s.lam

  def energy(omega, q, k, mask, pooled, labels):
    if method == 'particles_labels':
      # Padding rows have y = 0; A (a U-statistic) is rescaled to the n real rows, as
      # training.phase_a_objective does.
      size, n = labels.shape[0], jnp.sum(jnp.abs(labels) > 0)
      rescale = jnp.where(n >= 2, size * (size - 1) / jnp.maximum(n * (n - 1), 1.0), 0.0)
      _, terms = hamiltonian.hamiltonian_terms(omega, pooled, labels, feature_map='favor',
                                               lam=lam, s=riesz_s, softening=s.softening)
      return -rescale * terms['alignment'] + lam * terms['repulsion']
    return mimicry.mimicry_hamiltonian(omega, q, k, feature_map=feature_map(method),
                                       lam=lam, s=riesz_s, softening=s.softening,
                                       key_mask=mask, query_mask=mask)
  return energy


def _langevin_settings(method, s):
  eta = {'particles_softmax': s.step_size, 'gradient_flow': s.flow_step_size,
         'particles_labels': s.labels_step_size}[method]
  beta = math.inf if method == 'gradient_flow' else s.beta
  return dict(step_size=eta, beta=beta, radius=s.radius, clip_norm=s.clip_norm)


def make_step(method: str, settings) -> Tuple[Callable, Callable]:
  """``(init(omega) -> state, step(key, state, batch) -> (state, loss [G]))``, jitted.

  ``state`` is ``(omega [G, M, d], optimizer state)``; the Langevin methods keep no
  optimizer state (``None``), hedgehog keeps Adam's.
  """
  energy = _energy(method, settings)
  grad = jax.value_and_grad(energy)
  if method == 'hedgehog':
    opt = optax.adam(settings.hedgehog_learning_rate)

    def init(omega):
      return omega, jax.vmap(opt.init)(omega)

    def one(w, opt_state, q, k, mask, pooled, labels):
      loss, g = grad(w, q, k, mask, pooled, labels)
      updates, opt_state = opt.update(g, opt_state, w)
      return optax.apply_updates(w, updates), opt_state, loss

    @jax.jit
    def step(key, state, batch):
      del key
      w, opt_state, loss = jax.vmap(one, in_axes=(0, 0, 0, 0, None, 0, None))(
          state[0], state[1], batch['q'], batch['k'], batch['mask'],
          _pooled(batch['k'], batch['mask']), batch['labels'])
      return (w, opt_state), loss
    return init, step

  lsettings = _langevin_settings(method, settings)

  def one(key, w, q, k, mask, pooled, labels):
    loss, g = grad(w, q, k, mask, pooled, labels)
    return langevin.langevin_step(key, w, g, **lsettings), loss

  @jax.jit
  def step(key, state, batch):
    keys = jax.random.split(key, state[0].shape[0])
    w, loss = jax.vmap(one, in_axes=(0, 0, 0, 0, None, 0, None))(
        keys, state[0], batch['q'], batch['k'], batch['mask'],
        _pooled(batch['k'], batch['mask']), batch['labels'])
    return (w, None), loss

  return (lambda omega: (omega, None)), step


def fit(method: str, key: jax.Array, omega0: jax.Array, batches: List[dict], settings,
        steps: int) -> Tuple[jax.Array, np.ndarray]:
  """``(omega [G, M, d], losses [steps, G])`` after ``steps`` steps from ``omega0``.

  Unfitted methods (``favor_iid``, ``favor_orthogonal``, ``ball``) return ``omega0`` and
  no losses. Step t uses ``batches[t % len(batches)]`` and key ``fold_in(key, t)``.
  """
  if method not in FITTED:
    return omega0, np.zeros((0, omega0.shape[0]), np.float32)
  init, step = make_step(method, settings)
  state = init(jnp.asarray(omega0, jnp.float32))
  keep = ('q', 'k', 'mask', 'labels')
  device_batches = [{n: jnp.asarray(b[n]) for n in keep} for b in batches]
  losses = []
  for t in range(steps):
    state, loss = step(jax.random.fold_in(key, t), state, device_batches[t % len(batches)])
    losses.append(loss)
  return state[0], np.asarray(jnp.stack(losses))
