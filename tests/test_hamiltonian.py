"""Tests of coulomb_jax.hamiltonian."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import alignment
from coulomb_jax import features
from coulomb_jax import hamiltonian as hl
from coulomb_jax import repulsion


def _problem(num_particles=10, n=30, d=3):
  ko, kx = jax.random.split(jax.random.key(0))
  omega = features.sample_gaussian(ko, num_particles, d)
  x = jax.random.normal(kx, (n, d))
  y = jnp.sign(jnp.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2])
  return omega, x, y


def test_hamiltonian_is_minus_alignment_plus_lam_repulsion():
  omega, x, y = _problem()
  h, terms = hl.hamiltonian_terms(omega, x, y, feature_map='rff', lam=0.7, s=1.0)
  a = alignment.target_alignment(features.rff(x, omega), y)
  w = repulsion.riesz_energy(omega, 1.0)
  np.testing.assert_allclose(terms['alignment'], a, rtol=1e-6)
  np.testing.assert_allclose(terms['repulsion'], w, rtol=1e-6)
  np.testing.assert_allclose(h, -a + 0.7 * w, rtol=1e-6)
  by_fn = hl.hamiltonian(omega, x, y, feature_map=features.rff, lam=0.7, s=1.0)
  np.testing.assert_allclose(by_fn, h, rtol=1e-6)


@pytest.mark.parametrize('name', sorted(features.FEATURE_MAPS))
@pytest.mark.parametrize('lam', [0.0, 0.3])
def test_gradient_matches_finite_differences(name, lam):
  """Central differences of H along ∇H and two random directions, in float32.

  λ = 0 isolates the data term (it is small next to the repulsion otherwise).
  The tolerance is relative to |∇H|: float32 rounding of H ~ 1e-7·|H|/h with
  h = 1e-2·|ω|, plus the O(h²) truncation.
  """
  omega, x, y = _problem(num_particles=5, n=12, d=3)
  omega = 0.5 * omega
  energy = jax.jit(lambda w: hl.hamiltonian(w, x, y, feature_map=name, lam=lam, s=1.0))
  grad = np.asarray(jax.grad(energy)(omega), np.float64)
  gnorm = np.linalg.norm(grad)
  assert gnorm > 0
  rand = np.asarray(jax.random.normal(jax.random.key(1), (2,) + omega.shape), np.float64)
  for direction in (grad, rand[0], rand[1]):
    direction = direction / np.linalg.norm(direction)
    h = 1e-2
    fd = (float(energy(omega + h * direction)) - float(energy(omega - h * direction))) / (2 * h)
    np.testing.assert_allclose(np.sum(grad * direction), fd, atol=2e-2 * gnorm)


@pytest.mark.parametrize('name', ['rff', 'favor', 'elu', 'cos2'])
def test_particle_potentials_drive_the_step(name):
  """With the others fixed, ∇_{ω_k} U_k = N ∇_{ω_k} H; and mean U = −A + 2λW."""
  omega, x, y = _problem()
  kwargs = dict(feature_map=name, lam=0.4, s='coulomb')
  u = hl.particle_potentials(omega, x, y, **kwargs)
  assert u.shape == (10,)
  _, terms = hl.hamiltonian_terms(omega, x, y, **kwargs)
  np.testing.assert_allclose(jnp.mean(u), -terms['alignment'] + 0.8 * terms['repulsion'],
                             rtol=1e-5, atol=1e-6)
  full = 10 * jax.grad(lambda w: hl.hamiltonian(w, x, y, **kwargs))(omega)
  for k in (0, 7):
    own = jax.grad(lambda w: hl.particle_potentials(omega.at[k].set(w), x, y, **kwargs)[k])
    np.testing.assert_allclose(own(omega[k]), full[k], rtol=1e-4, atol=1e-6)


def test_jit_and_vmap():
  omega, x, y = _problem()
  energy = lambda w, lam: hl.hamiltonian(w, x, y, feature_map='favor', lam=lam)
  lams = jnp.array([0.0, 0.5, 1.0])
  np.testing.assert_allclose(jax.vmap(energy, (None, 0))(omega, lams),
                             [energy(omega, float(l)) for l in lams], rtol=1e-6)
  stack = jnp.stack([omega, 2 * omega])
  np.testing.assert_allclose(jax.jit(jax.vmap(energy, (0, None)))(stack, 0.5),
                             [energy(omega, 0.5), energy(2 * omega, 0.5)], rtol=1e-5)


def test_bad_input():
  omega, x, y = _problem()
  kw = dict(feature_map='rff', lam=0.5)
  with pytest.raises(ValueError, match='y has 29 labels but x has 30 samples'):
    hl.hamiltonian(omega, x, y[:-1], **kw)
  with pytest.raises(ValueError, match='last dimensions differ'):
    hl.hamiltonian(omega, x[:, :2], y, **kw)
  with pytest.raises(ValueError, match="unknown name 'gauss'"):
    hl.hamiltonian(omega, x, y, feature_map='gauss', lam=0.5)
  with pytest.raises(ValueError, match=r's must be >= 0, got -2'):
    hl.hamiltonian(omega, x, y, s=-2, **kw)
  with pytest.raises(ValueError, match='at least one particle'):
    hl.hamiltonian(omega[:0], x, y, **kw)
  with pytest.raises(ValueError, match='y has 29 labels'):
    jax.jit(lambda w, a, b: hl.hamiltonian(w, a, b, **kw))(omega, x, y[:-1])
