"""Tests of coulomb_jax.baselines.importance_sampling: the χ²-ball LP, features, resampling, bad input.

The value tests of ``ImportanceSamplingVariantsTest`` run as ``chex.variants`` with and
without jit; with ``COULOMB_JAX_TEST_PMAP=1`` (and several CPU devices) they run under
pmap instead (tests/library/test_hamiltonian.py::test_core_variants_under_pmap_on_four_cpu_devices).
"""

import os

from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import optimize

from coulomb_jax.baselines import importance_sampling as isl

_PMAP = os.environ.get('COULOMB_JAX_TEST_PMAP') == '1'
variants = chex.variants(with_jit=not _PMAP, without_jit=not _PMAP, with_pmap=_PMAP)


def _normal(seed, shape):
  """Fixed float32 test scores (numpy, so that no PRNG kernel is compiled)."""
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _check_feasible(q, rho):
  q = np.asarray(q, np.float64)
  assert np.all(q >= -1e-7), q.min()
  assert abs(q.sum() - 1.0) < 1e-5, q.sum()
  dist2 = np.sum((q - 1.0 / q.size) ** 2)
  assert dist2 <= rho / q.size * (1 + 1e-4) + 1e-12, (dist2, rho / q.size)


def _brute_force(v, rho, num_starts=20, seed=0):
  """max qᵀv over simplex ∩ χ² ball by SLSQP (float64) from several starts."""
  v = np.asarray(v, np.float64)
  n = v.size
  cons = [{'type': 'eq', 'fun': lambda q: np.sum(q) - 1.0, 'jac': lambda q: np.ones(n)},
          {'type': 'ineq', 'fun': lambda q: rho / n - np.sum((q - 1.0 / n) ** 2),
           'jac': lambda q: -2.0 * (q - 1.0 / n)}]
  rng = np.random.default_rng(seed)
  starts = [np.full(n, 1.0 / n)] + list(rng.dirichlet(np.ones(n), num_starts - 1))
  best = None
  for q0 in starts:
    res = optimize.minimize(lambda q: -q @ v, q0, jac=lambda q: -v, method='SLSQP',
                            bounds=[(0, 1)] * n, constraints=cons,
                            options={'ftol': 1e-14, 'maxiter': 500})
    q = res.x
    feasible = (abs(q.sum() - 1) < 1e-8 and q.min() > -1e-8
                and np.sum((q - 1 / n) ** 2) <= rho / n + 1e-10)
    if feasible and (best is None or q @ v > best @ v):
      best = q
  assert best is not None
  return best


class ImportanceSamplingVariantsTest(chex.TestCase):

  @variants
  @parameterized.product(rho_per_nw=(1e-9, 1e-4, 0.005, 0.2, 1e3), kind=('normal', 'squares'))
  def test_solve_weights_in_simplex_and_ball(self, rho_per_nw, kind):
    nw = 500
    solve = self.variant(isl.solve_weights)     # ρ traced: one compilation for every case
    for seed in range(3):
      v = _normal(seed, nw)
      if kind == 'squares':   # the scores of importance_sample: non-negative, heavy tailed
        v = v ** 2
      q = solve(jnp.asarray(v), jnp.float32(rho_per_nw * nw))
      chex.assert_shape(q, (nw,))
      chex.assert_type(q, jnp.float32)
      _check_feasible(q, rho_per_nw * nw)

  @variants
  def test_cosine_features_shapes_and_values(self):
    x, w = jnp.asarray(_normal(30, (6, 3))), jnp.asarray(_normal(31, (5, 3)))
    b = jnp.linspace(0.0, 2 * np.pi, 5, endpoint=False)
    phi = self.variant(isl.cosine_features)(x, w, b)
    chex.assert_shape(phi, (6, 5))
    chex.assert_type(phi, jnp.float32)
    # √(2/D)·cos(wᵀx + b), D = 5 features.
    want = np.sqrt(2 / 5) * np.cos(np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
                                   + np.asarray(b, np.float64))
    chex.assert_trees_all_close(phi, jnp.asarray(want, jnp.float32), atol=1e-6)


@pytest.mark.parametrize('nw', [3, 4])
@pytest.mark.parametrize('rho_per_nw', [1e-3, 0.05, 0.2, 0.4, 0.6, 0.8])
def test_solve_weights_matches_brute_force(nw, rho_per_nw):
  rho = rho_per_nw * nw
  for seed in range(4):
    v = _normal(100 + seed, nw).astype(np.float64)
    q = np.asarray(isl.solve_weights(jnp.asarray(v, jnp.float32), rho), np.float64)
    _check_feasible(q, rho)
    ref = _brute_force(v, rho, seed=seed)
    spread = v.max() - v.min()
    assert abs(q @ v - ref @ v) <= 1e-6 * spread, (q @ v, ref @ v)
    # The objective is linear and the ball strictly convex: the maximiser is unique
    # unless the LP face is attained inside the ball (ties have probability 0 here).
    np.testing.assert_allclose(q, ref, atol=1e-5)


def test_solve_weights_grid_on_three_candidates():
  """An independent check: a fine grid of the 2-simplex, filtered by the ball."""
  v = np.array([0.3, 1.0, 0.7])
  rho = 3 * 0.1
  t = np.linspace(0, 1, 1201)
  a, b = np.meshgrid(t, t)
  grid = np.stack([a.ravel(), b.ravel(), 1 - a.ravel() - b.ravel()], -1)
  grid = grid[(grid[:, 2] >= 0) & (np.sum((grid - 1 / 3) ** 2, -1) <= rho / 3)]
  best = np.max(grid @ v)
  q = np.asarray(isl.solve_weights(jnp.asarray(v, jnp.float32), rho), np.float64)
  # Grid spacing 1/1200: the grid optimum is within ~|v|·spacing of the true one.
  assert best - 1e-6 <= q @ v <= best + 2e-3, (q @ v, best)


def test_limits_of_rho():
  v = _normal(7, 200)
  # Huge ball: the LP solution, all mass on argmax v.
  q = isl.solve_weights(v, 1e6)
  np.testing.assert_array_equal(q, jax.nn.one_hot(jnp.argmax(v), 200))
  # The LP solution is returned as soon as it lies in the ball: ‖e_k − u‖² = 1 − 1/N_w.
  q = isl.solve_weights(v, 200 * (1 - 1 / 200) * (1 + 1e-5))
  np.testing.assert_array_equal(q, jax.nn.one_hot(jnp.argmax(v), 200))
  # Tiny and zero ball: uniform.
  np.testing.assert_allclose(isl.solve_weights(v, 1e-14), np.full(200, 1 / 200), atol=1e-8)
  np.testing.assert_array_equal(isl.solve_weights(v, 0.0), np.full(200, 1 / 200, np.float32))
  # Constant scores: uniform whatever ρ.
  np.testing.assert_array_equal(isl.solve_weights(jnp.full(4, 3.0), 5.0), np.full(4, 0.25))
  # Tied maxima and a large ball: uniform on the tied set.
  q = isl.solve_weights(jnp.array([1.0, 3.0, 3.0, 0.0]), 100.0)
  np.testing.assert_allclose(q, [0, 0.5, 0.5, 0], atol=1e-7)


def test_solution_grows_with_rho_and_is_affine_invariant():
  v = _normal(8, 200)
  values = [float(isl.solve_weights(v, r) @ v) for r in (1e-3, 1e-1, 1.0, 10.0, 100.0)]
  assert np.all(np.diff(values) > 0), values
  q = isl.solve_weights(v, 1.5)
  np.testing.assert_allclose(isl.solve_weights(7.0 * v - 3.0, 1.5), q, atol=1e-6)


def test_bisection_solution_is_the_dual_projection():
  """KKT: an active-ball solution is q = Π_simplex(u + v/λ) for some λ > 0."""
  nw = 200
  v = _normal(9, nw)
  rho = 0.05 * nw
  q = np.asarray(isl.solve_weights(v, rho), np.float64)
  v = np.asarray(v, np.float64)
  support = q > 1e-6
  assert 2 <= support.sum() < nw      # a boundary (bisection) case, not interior/vertex
  assert np.sum((q - 1 / nw) ** 2) == pytest.approx(rho / nw, rel=1e-3)
  # On the support q_i = (v_i − θ)/λ: λ is the slope of v against q.
  lam = np.polyfit(q[support], v[support], 1)[0]
  proj = optax.projections.projection_simplex(jnp.asarray(1 / nw + v / lam, jnp.float32))
  np.testing.assert_allclose(proj, q, atol=1e-5)


def test_solve_weights_jit_and_vmap():
  v = _normal(10, (4, 200))
  rhos = jnp.array([0.01, 0.5, 5.0, 500.0])
  batched = jax.jit(jax.vmap(isl.solve_weights))(v, rhos)
  for i in range(4):
    np.testing.assert_allclose(batched[i], isl.solve_weights(v[i], float(rhos[i])), atol=1e-6)


def test_candidate_features_distribution():
  w, b = isl.candidate_features(jax.random.key(11), 4000, 3, scale=0.5)
  assert w.shape == (4000, 3) and b.shape == (4000,)
  assert np.all((b >= 0) & (b < 2 * np.pi))
  # Sample variance of 12000 N(0, 0.25) draws: std 0.25·√(2/12000) ≈ 0.0032.
  assert abs(np.var(np.asarray(w)) - 0.25) < 5 * 0.25 * np.sqrt(2 / 12000)
  # U[0, 2π]: mean π, std of the mean 2π/√12/√4000 ≈ 0.029.
  assert abs(np.mean(np.asarray(b)) - np.pi) < 5 * 2 * np.pi / np.sqrt(12 * 4000)
  w2, _ = isl.candidate_features(jax.random.key(11), 4000, 3, scale=0.5)
  np.testing.assert_array_equal(w, w2)


def test_cosine_features_estimate_gaussian_kernel_within_mc_error():
  pairs, num, dim = 50, 80, 3
  x = _normal(12, (pairs, dim)) / np.sqrt(dim)
  y = _normal(13, (pairs, dim)) / np.sqrt(dim)
  # One independent set of num features per pair (the candidates' shape is reused).
  w, b = isl.candidate_features(jax.random.key(12), pairs * num, dim)
  w, b = w.reshape(pairs, num, dim), b.reshape(pairs, num)
  one = lambda xi, yi, wi, bi: jnp.dot(isl.cosine_features(xi, wi, bi),
                                       isl.cosine_features(yi, wi, bi))
  est = np.asarray(jax.jit(jax.vmap(one))(x, y, w, b), np.float64)
  d2 = np.sum((x - y).astype(np.float64) ** 2, -1)
  exact = np.exp(-0.5 * d2)
  # 2cos(a)cos(c) = cos(wᵀδ) + cos(wᵀ(x+y) + 2b): variance 1/2 + (1 + k(2δ))/2 − k(δ)².
  var = 1.0 + 0.5 * np.exp(-2 * d2) - exact ** 2
  z = (est - exact) / np.sqrt(var / num)
  assert np.max(np.abs(z)) < 5.0, z
  # mean z² ~ χ²_50/50 (std 0.2): [0.3, 1.7] is a 3.5σ band.
  assert 0.3 < np.mean(z ** 2) < 1.7, np.mean(z ** 2)


# One problem size for every importance_sample call, so that it compiles once.
NUM_CANDIDATES, NUM_FEATURES = 4000, 2000


def _toy(n=400, dim=3):
  """x ~ N(0, I_3), y = sign(x_1)."""
  x = jnp.asarray(_normal(13, (n, dim)))
  return x, jnp.sign(x[:, 0])


def test_importance_sample_shapes_and_reproducibility():
  x, y = _toy()
  sample = lambda k: isl.importance_sample(jax.random.key(k), x, y, NUM_FEATURES,
                                           num_candidates=NUM_CANDIDATES)
  w, b, q = sample(14)
  assert w.shape == (NUM_FEATURES, 3) and b.shape == (NUM_FEATURES,)
  assert q.shape == (NUM_CANDIDATES,)
  _check_feasible(q, 0.005 * NUM_CANDIDATES)   # the paper's default ρ
  w2, b2, q2 = sample(14)
  np.testing.assert_array_equal(w, w2)
  np.testing.assert_array_equal(b, b2)
  np.testing.assert_array_equal(q, q2)
  w3, _, q3 = sample(15)
  assert not np.allclose(w, w3) and not np.allclose(q, q3)
  assert isl.cosine_features(x, w, b).shape == (400, NUM_FEATURES)


def test_importance_sample_prefers_informative_frequencies():
  """y = sign(x_1): E[y cos(wᵀx + b)] ∝ sin(b)·g(w_1)·exp(−‖w_rest‖²/2), g(0) = 0."""
  x, y = _toy()
  nw, num = NUM_CANDIDATES, NUM_FEATURES
  key = jax.random.key(16)
  w, b, q = isl.importance_sample(key, x, y, num, num_candidates=nw)
  # The candidates, as drawn inside importance_sample (first half of the key split).
  cand, _ = isl.candidate_features(jax.random.split(key)[0], nw, 3)
  q = np.asarray(q, np.float64)
  for stat, sign in ((np.abs(cand[:, 0]), 1.0), (np.sum(cand[:, 1:] ** 2, -1), -1.0)):
    stat = np.asarray(stat, np.float64)
    # If q did not depend on the candidates, Σ(q − u)·a would have mean 0 and std
    # std(a)·‖q − u‖ (a i.i.d., Σ(q − u) = 0): demand a 5σ effect in the right direction.
    effect = sign * np.sum((q - 1 / nw) * stat)
    assert effect > 5 * np.std(stat) * np.linalg.norm(q - 1 / nw), effect
  # The D draws follow q: their mean |w_1| is within 5 standard errors of E_q|w_1|.
  a = np.abs(np.asarray(cand[:, 0], np.float64))
  mean_q = q @ a
  se = np.sqrt((q @ a ** 2 - mean_q ** 2) / num)
  assert abs(np.mean(np.abs(np.asarray(w[:, 0]))) - mean_q) < 5 * se
  assert np.mean(np.abs(np.asarray(w[:, 0]))) > np.mean(a)


def test_bad_inputs_raise_value_error_naming_the_argument():
  v = jnp.ones(5)
  for args, kwargs, match in [
      ((jnp.ones((2, 3)), 1.0), {}, 'scores'),
      ((jnp.ones(0), 1.0), {}, 'scores'),
      ((v, -1.0), {}, 'rho'),
      ((v, float('nan')), {}, 'rho'),
      ((v, 1.0), {'tol': 0.0}, 'tol'),
      ((v, 1.0), {'max_iter': 0}, 'max_iter'),
      ((v, 1.0), {'max_iter': 2.5}, 'max_iter'),
  ]:
    with pytest.raises(ValueError, match=match):
      isl.solve_weights(*args, **kwargs)
  key = jax.random.key(0)
  with pytest.raises(ValueError, match='num_candidates'):
    isl.candidate_features(key, 0, 3)
  with pytest.raises(ValueError, match='dim'):
    isl.candidate_features(key, 4, 0)
  with pytest.raises(ValueError, match='scale'):
    isl.candidate_features(key, 4, 3, scale=-1.0)
  w, b = _normal(1, (4, 3)), np.zeros(4, np.float32)
  with pytest.raises(ValueError, match='last dimensions differ'):
    isl.cosine_features(jnp.ones((2, 5)), w, b)
  with pytest.raises(ValueError, match='b must have shape'):
    isl.cosine_features(jnp.ones((2, 3)), w, b[:3])
  with pytest.raises(ValueError, match='w must have rank 2'):
    isl.cosine_features(jnp.ones((2, 3)), w[0], b)
  x, y = _toy()
  x, y = x[:20], y[:20]
  with pytest.raises(ValueError, match='y has 19 labels but x has 20 samples'):
    isl.importance_sample(key, x, y[:19], 8, num_candidates=16)
  with pytest.raises(ValueError, match='x must hold at least one sample'):
    isl.importance_sample(key, x[:0], y[:0], 8, num_candidates=16)
  with pytest.raises(ValueError, match='x must have rank 2'):
    isl.importance_sample(key, x[0], y, 8, num_candidates=16)
  with pytest.raises(ValueError, match='num_features'):
    isl.importance_sample(key, x, y, 0, num_candidates=16)
  with pytest.raises(ValueError, match='num_candidates'):
    isl.importance_sample(key, x, y, 8, num_candidates=0)
  with pytest.raises(ValueError, match='rho'):
    isl.importance_sample(key, x, y, 8, num_candidates=16, rho=-0.1)
  with pytest.raises(ValueError, match='scale'):
    isl.importance_sample(key, x, y, 8, num_candidates=16, scale=0.0)
