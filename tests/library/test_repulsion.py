"""Tests of coulomb_jax.repulsion.

The value tests run as ``chex.variants`` with and without jit; with
``COULOMB_JAX_TEST_PMAP=1`` (and several CPU devices) they run under pmap instead
(tests/library/test_hamiltonian.py::test_core_variants_under_pmap_on_four_cpu_devices).
"""

import os

from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
from jax import test_util
import numpy as np
import pytest

from coulomb_jax import repulsion

_PMAP = os.environ.get('COULOMB_JAX_TEST_PMAP') == '1'
variants = chex.variants(with_jit=not _PMAP, without_jit=not _PMAP, with_pmap=_PMAP)


def _brute_force(omega, s, eps):
  omega = np.asarray(omega, np.float64)
  n, d = omega.shape
  s = d - 2 if s == 'coulomb' else s
  total = 0.0
  for k in range(n):
    for l in range(n):
      if k != l:
        r2 = np.sum((omega[k] - omega[l]) ** 2) + eps ** 2
        total += -0.5 * np.log(r2) if s == 0 else r2 ** (-s / 2)
  return total / n ** 2


def _normal(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


class RepulsionVariantsTest(chex.TestCase):

  @variants
  @parameterized.parameters((0.0, 3), (1.0, 3), (2.5, 4), ('coulomb', 5), ('coulomb', 2))
  def test_energy_equals_pair_sum(self, s, dim):
    omega = _normal(0, (17, dim))
    for eps in (0.1, repulsion.DEFAULT_SOFTENING):
      e = self.variant(lambda w, eps=eps: repulsion.riesz_energy(w, s, eps))(omega)
      chex.assert_shape(e, ())
      chex.assert_type(e, jnp.float32)
      chex.assert_trees_all_close(e, jnp.float32(_brute_force(omega, s, eps)), rtol=2e-5,
                                  atol=1e-6)

  @variants
  def test_symmetric_and_permutation_invariant(self):
    omega = _normal(1, (12, 4))
    energy = self.variant(lambda w: repulsion.riesz_energy(w, 1.5))
    e = energy(omega)
    perm = np.random.default_rng(2).permutation(12)
    chex.assert_trees_all_close(energy(omega[perm]), e, rtol=1e-6)
    chex.assert_trees_all_close(energy(-omega), e, rtol=1e-6)
    two = omega[:2]
    potential = self.variant(lambda a, b: repulsion.riesz_potential(a, b, 1.5))
    u = potential(two[:1], two[1:])
    chex.assert_shape(u, (1,))
    chex.assert_trees_all_close(u, potential(two[1:], two[:1]), rtol=1e-6)

  @variants
  def test_potential_mean_is_energy_and_blocks_compose(self):
    omega = _normal(5, (12, 3))
    potential = lambda offset: self.variant(
        lambda a, w: repulsion.riesz_potential(a, w, 1.0, self_index_offset=offset))
    u = potential(0)(omega, omega)
    chex.assert_shape(u, (12,))
    chex.assert_trees_all_close(jnp.mean(u), repulsion.riesz_energy(omega, 1.0), rtol=1e-6)
    blocks = [potential(i)(omega[i:i + 4], omega) for i in (0, 4, 8)]
    chex.assert_trees_all_close(jnp.concatenate(blocks), u, rtol=1e-6)


@pytest.mark.parametrize('s', [0.0, 1.0, 'coulomb'])
def test_gradients(s):
  omega = jax.random.normal(jax.random.key(3), (6, 3))
  energy = jax.jit(lambda w: repulsion.riesz_energy(w, s, 0.3))
  test_util.check_grads(energy, (omega,), order=2,
                        modes=('fwd', 'rev'), eps=1e-3, atol=2e-2, rtol=2e-2)


@pytest.mark.slow
def test_finite_for_all_s_coincident_particles_and_high_dim():
  d = 64
  rand = jax.random.normal(jax.random.key(4), (32, d))
  coincident = jnp.concatenate([rand[:16], rand[:16]])   # pairs at distance 0
  tiny = 1e-3 * rand                                     # all within 0.01
  energy_and_grad = jax.jit(jax.value_and_grad(repulsion.riesz_energy))
  for omega in (rand, coincident, tiny):
    for s in list(np.linspace(0.0, d, 9)) + [62.0]:
      e, g = energy_and_grad(omega, s)
      assert np.isfinite(e) and np.all(np.isfinite(g)), (s, e)
    e, g = jax.value_and_grad(repulsion.riesz_energy)(omega, 'coulomb')
    assert np.isfinite(e) and np.all(np.isfinite(g))
  # The largest possible value, eps^-s for coincident pairs, is representable.
  e = repulsion.riesz_energy(jnp.zeros((4, d)), 62.0)
  np.testing.assert_allclose(e, (3 / 4) * repulsion.DEFAULT_SOFTENING ** -62.0, rtol=1e-5)


def test_jit_and_vmap_over_exponent():
  omega = jax.random.normal(jax.random.key(6), (8, 3))
  ss = jnp.array([0.0, 0.5, 1.0, 3.0])
  batched = jax.vmap(lambda s: repulsion.riesz_energy(omega, s))(ss)
  np.testing.assert_allclose(batched, [repulsion.riesz_energy(omega, float(s)) for s in ss],
                             rtol=1e-6)


def test_bad_input():
  omega = jnp.ones((4, 3))
  with pytest.raises(ValueError, match=r's must be >= 0, got -1\.0'):
    repulsion.riesz_energy(omega, -1.0)
  with pytest.raises(ValueError, match="s must be a float >= 0 or 'coulomb', got 'newton'"):
    repulsion.riesz_energy(omega, 'newton')
  with pytest.raises(ValueError, match=r'softening must be >= 0, got -0\.1'):
    repulsion.riesz_energy(omega, 1.0, -0.1)
  with pytest.raises(ValueError, match='d >= 2'):
    repulsion.riesz_energy(jnp.ones((4, 1)), 'coulomb')
  with pytest.raises(ValueError, match='omega must have rank 2'):
    repulsion.riesz_energy(jnp.ones(4), 1.0)
  with pytest.raises(ValueError, match='at least one particle'):
    repulsion.riesz_energy(jnp.ones((0, 3)), 1.0)
