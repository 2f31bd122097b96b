"""Tests of coulomb_jax.alignment.

The value tests run as ``chex.variants`` with and without jit; with
``COULOMB_JAX_TEST_PMAP=1`` (and several CPU devices) they run under pmap instead
(tests/library/test_hamiltonian.py::test_core_variants_under_pmap_on_four_cpu_devices).
"""

import os

from absl.testing import parameterized
import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import alignment

_PMAP = os.environ.get('COULOMB_JAX_TEST_PMAP') == '1'
variants = chex.variants(with_jit=not _PMAP, without_jit=not _PMAP, with_pmap=_PMAP)


def _brute_force(phi, y):
  phi, y = np.asarray(phi, np.float64), np.asarray(y, np.float64)
  n = len(y)
  total = sum(y[i] * y[j] * phi[i] @ phi[j] for i in range(n) for j in range(n) if i != j)
  return total / (n * (n - 1))


class AlignmentVariantsTest(chex.TestCase):

  @variants
  @parameterized.parameters('pm1', 'real')
  def test_target_alignment_equals_double_sum(self, labels):
    rng = np.random.default_rng(0)
    phi = jnp.asarray(rng.standard_normal((23, 9)), jnp.float32)
    y = jnp.asarray(rng.standard_normal(23), jnp.float32)
    if labels == 'pm1':
      y = jnp.sign(y)
    a = self.variant(alignment.target_alignment)(phi, y)
    chex.assert_shape(a, ())
    chex.assert_type(a, jnp.float32)
    chex.assert_trees_all_close(a, jnp.float32(_brute_force(phi, y)), rtol=1e-5, atol=1e-6)

  @variants
  def test_target_alignment_of_bfloat16_features_is_float32(self):
    rng = np.random.default_rng(1)
    phi = jnp.asarray(rng.standard_normal((10, 6)), jnp.float32)
    y = jnp.sign(jnp.asarray(rng.standard_normal(10), jnp.float32))
    a16 = self.variant(alignment.target_alignment)(phi.astype(jnp.bfloat16), y)
    chex.assert_type(a16, jnp.float32)
    chex.assert_tree_all_finite(a16)
    # bfloat16 keeps 8 bits of mantissa: the features are rounded by up to 2^-8.
    chex.assert_trees_all_close(a16, jnp.float32(_brute_force(phi, y)), rtol=0.05, atol=0.05)

  @variants
  def test_centered_alignment_matches_definition_and_bounds(self):
    x = jnp.asarray(np.random.default_rng(3).standard_normal((15, 4)), jnp.float32)
    y = jnp.sign(x[:, 0])
    k1 = jnp.exp(-0.5 * jnp.sum((x[:, None] - x[None]) ** 2, -1))
    k2 = jnp.outer(y, y)
    h = np.eye(15) - np.ones((15, 15)) / 15
    c1, c2 = h @ np.asarray(k1) @ h, h @ np.asarray(k2) @ h
    expected = np.sum(c1 * c2) / np.sqrt(np.sum(c1 ** 2) * np.sum(c2 ** 2))
    centered = self.variant(alignment.centered_alignment)
    rho = centered(k1, k2)
    chex.assert_shape(rho, ())
    chex.assert_trees_all_close(rho, jnp.float32(expected), rtol=1e-5)
    assert -1 <= rho <= 1
    chex.assert_trees_all_close(centered(k1, k1), jnp.float32(1.0), rtol=1e-5)
    chex.assert_trees_all_close(centered(k1, -k1), jnp.float32(-1.0), rtol=1e-5)
    assert centered(k1, jnp.ones_like(k1)) == 0.0   # constant kernel
    # Scale-invariant even where the product of the two squared norms leaves float32.
    for c in (1e25, 1e-25):
      chex.assert_trees_all_close(centered(c * k1, k2), rho, rtol=1e-4)


def test_target_alignment_vmap():
  phi = jax.random.normal(jax.random.key(1), (4, 10, 6))
  y = jnp.sign(jax.random.normal(jax.random.key(2), (4, 10)))
  batched = jax.vmap(alignment.target_alignment)(phi, y)
  chex.assert_shape(batched, (4,))
  expected = [_brute_force(p, t) for p, t in zip(phi, y)]
  np.testing.assert_allclose(batched, expected, rtol=1e-5, atol=1e-6)


def test_bad_input():
  phi = jnp.ones((5, 3))
  with pytest.raises(ValueError, match='y has 4 labels but phi has 5 samples'):
    alignment.target_alignment(phi, jnp.ones(4))
  with pytest.raises(ValueError, match='phi must have rank 2'):
    alignment.target_alignment(jnp.ones(5), jnp.ones(5))
  with pytest.raises(ValueError, match='y must have rank 1'):
    alignment.target_alignment(phi, jnp.ones((5, 1)))
  with pytest.raises(ValueError, match='at least 2 samples'):
    alignment.target_alignment(jnp.ones((1, 3)), jnp.ones(1))
  with pytest.raises(ValueError, match='square and of the same shape'):
    alignment.centered_alignment(jnp.ones((3, 3)), jnp.ones((4, 4)))
  with pytest.raises(ValueError, match='y has 4 labels'):
    jax.jit(alignment.target_alignment)(phi, jnp.ones(4))


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(n=st.integers(2, 9), f=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_target_alignment_property_any_shape(n, f, seed):
  """For any n ≥ 2 and width F, the O(n·F) form equals the double sum."""
  rng = np.random.default_rng(seed)
  phi = rng.normal(size=(n, f)).astype(np.float32)
  y = rng.normal(size=n).astype(np.float32)
  np.testing.assert_allclose(alignment.target_alignment(phi, y), _brute_force(phi, y),
                             rtol=1e-4, atol=1e-5)
