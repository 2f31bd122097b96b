"""Tests of coulomb_jax.alignment."""

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import alignment


def _brute_force(phi, y):
  phi, y = np.asarray(phi, np.float64), np.asarray(y, np.float64)
  n = len(y)
  total = sum(y[i] * y[j] * phi[i] @ phi[j] for i in range(n) for j in range(n) if i != j)
  return total / (n * (n - 1))


@pytest.mark.parametrize('labels', ['pm1', 'real'])
def test_target_alignment_equals_double_sum(labels):
  kp, ky = jax.random.split(jax.random.key(0))
  phi = jax.random.normal(kp, (23, 9))
  y = jax.random.normal(ky, (23,))
  if labels == 'pm1':
    y = jnp.sign(y)
  np.testing.assert_allclose(alignment.target_alignment(phi, y), _brute_force(phi, y),
                             rtol=1e-5, atol=1e-6)


def test_target_alignment_jit_vmap_bf16():
  phi = jax.random.normal(jax.random.key(1), (4, 10, 6))
  y = jnp.sign(jax.random.normal(jax.random.key(2), (4, 10)))
  batched = jax.vmap(alignment.target_alignment)(phi, y)
  expected = [_brute_force(p, t) for p, t in zip(phi, y)]
  np.testing.assert_allclose(batched, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jax.jit(alignment.target_alignment)(phi[0], y[0]), expected[0],
                             rtol=1e-5, atol=1e-6)
  a16 = alignment.target_alignment(phi[0].astype(jnp.bfloat16), y[0])
  assert a16.dtype == jnp.float32 and np.isfinite(a16)


def test_centered_alignment_matches_definition_and_bounds():
  x = jax.random.normal(jax.random.key(3), (15, 4))
  y = jnp.sign(x[:, 0])
  k1 = jnp.exp(-0.5 * jnp.sum((x[:, None] - x[None]) ** 2, -1))
  k2 = jnp.outer(y, y)
  h = np.eye(15) - np.ones((15, 15)) / 15
  c1, c2 = h @ np.asarray(k1) @ h, h @ np.asarray(k2) @ h
  expected = np.sum(c1 * c2) / np.sqrt(np.sum(c1 ** 2) * np.sum(c2 ** 2))
  rho = alignment.centered_alignment(k1, k2)
  np.testing.assert_allclose(rho, expected, rtol=1e-5)
  assert -1 <= rho <= 1
  np.testing.assert_allclose(alignment.centered_alignment(k1, k1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(alignment.centered_alignment(k1, -k1), -1.0, rtol=1e-5)
  assert alignment.centered_alignment(k1, jnp.ones_like(k1)) == 0.0   # constant kernel
  # Scale-invariant even where the product of the two squared norms leaves float32.
  for c in (1e25, 1e-25):
    np.testing.assert_allclose(alignment.centered_alignment(c * k1, k2), rho, rtol=1e-4)


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
