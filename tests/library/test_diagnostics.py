"""Tests of coulomb_jax.diagnostics.

Statistical tolerances are |bias| + 4σ, with the bias and the standard deviation
σ of each estimate measured over 100–256 independent draws at exactly the sizes
used here, or derived analytically where noted. Data come from fixed numpy
seeds (no per-shape compilation of the JAX PRNG: keeps the file fast on CPU),
directions from fixed JAX keys, so the tests are deterministic.

The exact-value tests run as ``chex.variants`` with and without jit; with
``COULOMB_JAX_TEST_PMAP=1`` (and several CPU devices) they run under pmap instead
(tests/library/test_hamiltonian.py::test_core_variants_under_pmap_on_four_cpu_devices).
"""

import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from coulomb_jax import diagnostics
from coulomb_jax import features

_PMAP = os.environ.get('COULOMB_JAX_TEST_PMAP') == '1'
variants = chex.variants(with_jit=not _PMAP, without_jit=not _PMAP, with_pmap=_PMAP)

_entropy = jax.jit(diagnostics.knn_entropy, static_argnames='k')
_batched_entropy = jax.jit(jax.vmap(diagnostics.knn_entropy))
_sw = jax.jit(diagnostics.sliced_wasserstein, static_argnames='num_projections')


def _normal(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


# Mean of the k=1 estimate over 8 independent clouds of N = 2000 points. Measured
# over 256 clouds: Gaussian d=2 bias −0.004, σ(one cloud) 0.039, so σ(mean of 8) 0.014;
# d=5 bias −0.051 (the KL bias grows with d), σ 0.047 → 0.016; uniform square d=2
# bias +0.010 (boundary), σ 0.036 → 0.012. Tolerance |bias| + 4σ(mean of 8).
@pytest.mark.parametrize('dim, tol', [(2, 0.06), (5, 0.12)])
def test_entropy_of_gaussian(dim, tol):
  sigma = 1.5
  clouds = sigma * _normal(dim, (8, 2000, dim))
  expected = 0.5 * dim * math.log(2 * math.pi * math.e * sigma ** 2)
  assert abs(float(jnp.mean(_batched_entropy(clouds))) - expected) < tol


def test_entropy_of_uniform_square():
  a = 3.0
  clouds = a * np.random.default_rng(10).random((8, 2000, 2), np.float32)
  assert abs(float(jnp.mean(_batched_entropy(clouds))) - 2 * math.log(a)) < 0.06


class DiagnosticsVariantsTest(chex.TestCase):

  @variants
  def test_entropy_matches_formula_scaling_and_duplicates(self):
    x = _normal(11, (300, 3))
    # Brute force in float64, k = 2.
    x64 = np.asarray(x, np.float64)
    dist = np.sqrt(((x64[:, None] - x64[None]) ** 2).sum(-1)) + np.diag(np.full(300, np.inf))
    eps = np.sort(dist, axis=1)[:, 1]
    expected = (special.digamma(300) - special.digamma(2) + 1.5 * math.log(math.pi)
                - special.gammaln(2.5) + 3 * np.mean(np.log(eps)))
    entropy = self.variant(diagnostics.knn_entropy)
    chex.assert_trees_all_close(
        self.variant(lambda p: diagnostics.knn_entropy(p, k=2))(x), jnp.float32(expected),
        atol=1e-4)
    h = entropy(x)
    chex.assert_shape(h, ())
    chex.assert_type(h, jnp.float32)
    for c in (2.0, 0.1, 7.0):   # ĥ(c·x) = ĥ(x) + d log c, exactly up to rounding.
      chex.assert_trees_all_close(entropy(c * x) - h, jnp.float32(3 * math.log(c)), atol=2e-5)
    chex.assert_trees_all_close(entropy(x + 5.0), h, atol=1e-4)       # translation
    chex.assert_trees_all_close(entropy(x[::-1]), h, atol=1e-5)       # permutation
    # Coincident points: finite, and far below the entropy of the clean cloud.
    dup = entropy(jnp.concatenate([x, x[:10]]))
    chex.assert_tree_all_finite(dup)
    assert dup < h - 1.0
    chex.assert_tree_all_finite(entropy(jnp.zeros((5, 2))))

  @variants
  def test_free_energy(self):
    x = _normal(13, (300, 3))
    h = _entropy(x)
    f = self.variant(lambda e, p: diagnostics.free_energy(e, p, beta=4.0))(jnp.float32(1.25), x)
    chex.assert_shape(f, ())
    chex.assert_trees_all_close(f, 1.25 - h / 4.0, rtol=1e-6)
    f2 = self.variant(lambda e, p: diagnostics.free_energy(e, p, 0.5, k=2))(jnp.float32(-2.0), x)
    chex.assert_trees_all_close(f2, -2.0 - 2.0 * _entropy(x, k=2), rtol=1e-6)
    cold = self.variant(lambda e, p: diagnostics.free_energy(e, p, beta=math.inf))
    assert float(cold(jnp.float32(1.25), x)) == 1.25
    traced = jax.jit(diagnostics.free_energy)(1.25, x, 4.0)   # β traced: no check, same value
    np.testing.assert_allclose(traced, 1.25 - h / 4.0, rtol=1e-5)

  @variants
  def test_sliced_wasserstein_zero_symmetric_and_exact_in_1d(self):
    key = jax.random.key(14)
    a = _normal(14, (100, 4))
    b = 2.0 * _normal(15, (200, 4)) + 1.0
    sw = self.variant(lambda p, q: diagnostics.sliced_wasserstein(key, p, q))
    zero = sw(a, a)
    chex.assert_shape(zero, ())
    assert float(zero) == 0.0
    assert float(sw(a, jnp.concatenate([a, a[::-1]]))) < 1e-5   # N vs 2N, same measure
    chex.assert_trees_all_close(sw(a, b), sw(b, a), rtol=1e-6)
    # d = 1 (every direction is ±1): exact W₂ on the lcm(6, 4) = 12-step quantile grid.
    a1, b1 = np.sort(np.asarray(a[:6, 0], np.float64)), np.sort(np.asarray(b[:4, 0], np.float64))
    t = (np.arange(12) + 0.5) / 12
    w2 = np.sqrt(np.mean((a1[(t * 6).astype(int)] - b1[(t * 4).astype(int)]) ** 2))
    sw_1d = self.variant(lambda p, q: diagnostics.sliced_wasserstein(key, p, q,
                                                                     num_projections=3))
    chex.assert_trees_all_close(sw_1d(a[:6, :1], b[:4, :1]), jnp.float32(w2), rtol=1e-5)

  @variants
  def test_kernel_spread_known_values(self):
    spread, spread_k = self.variant(diagnostics.kernel_spread), self.variant(
        diagnostics.kernel_spread_from_kernels)
    phi = _normal(19, (10, 5))
    assert float(spread(jnp.stack([phi, phi, phi]))) < 1e-6   # 0 up to rounding of the mean
    # One input, kernels 1 and 3: mean 2, deviations ±1, so σ_K = 1/2.
    chex.assert_trees_all_close(spread(jnp.array([[[1.0]], [[math.sqrt(3.0)]]])),
                                jnp.float32(0.5), rtol=1e-6)
    # K and 3K: σ_K = 1/2 for any n; I and −I have mean 0: ∞; all zero: 0.
    eye = jnp.eye(4)
    chex.assert_trees_all_close(spread_k(jnp.stack([eye, 3 * eye])), jnp.float32(0.5),
                                rtol=1e-6)
    assert spread_k(jnp.stack([eye, -eye])) == jnp.inf
    assert spread_k(jnp.zeros((2, 4, 4))) == 0.0
    # The feature form equals the kernel form and is scale invariant.
    phis = _normal(20, (5, 12, 7))
    s = spread(phis)
    chex.assert_shape(s, ())
    chex.assert_trees_all_close(s, spread_k(jnp.einsum('snf,smf->snm', phis, phis)), rtol=1e-5)
    chex.assert_trees_all_close(spread(3.0 * phis), s, rtol=1e-5)


def test_sliced_wasserstein_of_a_mean_shift():
  """SW₂² between N(0, I) and N(μ, I) is E_θ(θ·μ)² = ‖μ‖²/d."""
  d, mu = 3, np.array([2.0, 0.0, 0.0], np.float32)
  expected = float(mu @ mu) / d
  var_cos2 = 2 * (d - 1) / (d ** 2 * (d + 2))   # Var((θ·e)²), θ uniform on the sphere
  # A translated copy (sizes N and 2N): the 1-D W₂² is exactly (θ·μ)² per direction,
  # so the only error is over P directions: σ = ‖μ‖²·√(Var(cos²)/P) (analytic).
  num_p = 4096
  z = _normal(16, (200, d))
  shifted = _sw(jax.random.key(16), z, jnp.concatenate([z, z]) + mu, num_projections=num_p)
  sigma = float(mu @ mu) * math.sqrt(var_cos2 / num_p)
  assert abs(float(shifted) ** 2 - expected) < 4 * sigma
  # Independent samples add the error of the sample means, σ_m = 2‖μ‖·√(1/Na + 1/Nb)/d
  # (the cross term 2(θ·μ)(θ·δ)), and a positive O(1/N) bias below 0.01 (measured).
  na, nb, num_p = 1000, 2000, 1024
  a, b = _normal(17, (na, d)), _normal(18, (nb, d)) + mu
  sw2 = float(_sw(jax.random.key(17), a, b, num_projections=num_p)) ** 2
  sigma = math.hypot(float(mu @ mu) * math.sqrt(var_cos2 / num_p),
                     2 * float(np.linalg.norm(mu)) * math.sqrt(1 / na + 1 / nb) / d)
  assert abs(sw2 - expected) < 4 * sigma + 0.01


def test_sliced_wasserstein_shrinks_with_n():
  """Clouds of N and 2N points from one law: SW₂ ~ 1/√N, so ~4x smaller at 16x N.

  Measured over 100 draws: SW₂ = 0.250 ± 0.051 at N = 64 and 0.068 ± 0.012 at
  N = 1024; the mean of 4 draws has σ 0.026 and 0.006, so the ratio of the means
  exceeds (0.250 − 4·0.026)/(0.068 + 4·0.006) ≈ 1.6 at 4σ.
  """
  batched = jax.jit(jax.vmap(diagnostics.sliced_wasserstein))
  def mean_sw(n):
    keys = jax.random.split(jax.random.key(n), 4)
    return float(jnp.mean(batched(keys, _normal(n, (4, n, 2)), _normal(n + 1, (4, 2 * n, 2)))))
  assert mean_sw(64) > 1.5 * mean_sw(1024)


def test_kernel_spread_of_random_features_shrinks_like_one_over_sqrt_n():
  """RFF with ω ~ N(0, I): σ_K ∝ 1/√N. Measured over 200 draws: σ_K(16)/σ_K(256) = 4.03 ± 0.32."""
  x = _normal(21, (16, 3))
  spread = jax.jit(lambda omega: diagnostics.kernel_spread(
      jax.vmap(features.rff, (None, 0))(x, omega)))
  ratio = float(spread(_normal(22, (16, 16, 3))) / spread(_normal(23, (16, 256, 3))))  # 16 seeds
  assert abs(ratio - 4.0) < 4 * 0.32


def test_bad_input():
  x = jnp.ones((5, 2))
  key = jax.random.key(0)
  with pytest.raises(ValueError, match='points must have rank 2'):
    diagnostics.knn_entropy(jnp.ones(5))
  with pytest.raises(ValueError, match=r'k must be an integer in \[1, 4\], got 0'):
    diagnostics.knn_entropy(x, k=0)
  with pytest.raises(ValueError, match=r'k must be an integer in \[1, 4\], got 5'):
    diagnostics.knn_entropy(x, k=5)
  with pytest.raises(ValueError, match=r'k must be an integer in \[1, 4\], got 1.5'):
    diagnostics.knn_entropy(x, k=1.5)
  with pytest.raises(ValueError, match=r'points must hold at least 2 points, got shape \(1, 2\)'):
    diagnostics.knn_entropy(jnp.ones((1, 2)))
  with pytest.raises(ValueError, match='beta must be > 0, got 0.0'):
    diagnostics.free_energy(1.0, x, 0.0)
  with pytest.raises(ValueError, match='energy must have rank 0'):
    diagnostics.free_energy(jnp.ones(2), x, 1.0)
  with pytest.raises(ValueError, match='k must be an integer'):
    diagnostics.free_energy(1.0, x, math.inf, k=7)
  with pytest.raises(ValueError, match='last dimensions differ: a has shape'):
    diagnostics.sliced_wasserstein(key, x, jnp.ones((5, 3)))
  with pytest.raises(ValueError, match='b must have rank 2'):
    diagnostics.sliced_wasserstein(key, x, jnp.ones(5))
  with pytest.raises(ValueError, match='num_projections must be an integer >= 1, got 0'):
    diagnostics.sliced_wasserstein(key, x, x, num_projections=0)
  with pytest.raises(ValueError, match='phis must have rank 3'):
    diagnostics.kernel_spread(jnp.ones((4, 3)))
  with pytest.raises(ValueError, match='phis must have shape'):
    diagnostics.kernel_spread(jnp.ones((0, 4, 3)))
  with pytest.raises(ValueError, match='kernels must have shape'):
    diagnostics.kernel_spread_from_kernels(jnp.ones((2, 3, 4)))


def test_diversity_of_a_line_an_isotropic_cross_and_one_point():
  d = 4
  line = jnp.outer(jnp.arange(6.0), jnp.array([1.0, 2.0, 0.0, -1.0]))        # on one line
  cross = jnp.concatenate([jnp.eye(d), -jnp.eye(d)]) * 3.0                      # ±3 e_i
  both = jnp.stack([cross, 2.0 * cross])                                        # [2, 8, 4]
  out = diagnostics.particle_diversity(line)
  np.testing.assert_allclose(out['top_direction_share'], 1.0, rtol=1e-5)
  np.testing.assert_allclose(out['effective_rank'], 1.0, rtol=1e-4)
  np.testing.assert_allclose(out['min_pairwise_distance'], math.sqrt(6.0), rtol=1e-5)
  out = diagnostics.particle_diversity(both)
  np.testing.assert_allclose(out['top_direction_share'], [1 / d, 1 / d], rtol=1e-5)
  np.testing.assert_allclose(out['effective_rank'], [d, d], rtol=1e-5)
  np.testing.assert_allclose(out['min_pairwise_distance'], [3 * math.sqrt(2), 6 * math.sqrt(2)],
                             rtol=1e-5)
  point = jnp.ones((3, d))
  assert float(diagnostics.top_direction_share(point)) == 0.0
  assert float(diagnostics.effective_rank(point)) == 1.0
  with pytest.raises(ValueError, match='at least 2 particles'):
    diagnostics.min_pairwise_distance(jnp.ones((1, d)))


def test_min_pairwise_distance_matches_brute_force():
  omega = np.asarray(jax.random.normal(jax.random.key(0), (9, 5)))
  want = min(np.linalg.norm(omega[i] - omega[j]) for i in range(9) for j in range(i + 1, 9))
  np.testing.assert_allclose(diagnostics.min_pairwise_distance(jnp.asarray(omega)), want,
                             rtol=1e-5)
