"""Tests of coulomb_jax.langevin: the step, the driver, resampling, the optax form."""

import math

from absl.testing import parameterized
import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from coulomb_jax import features
from coulomb_jax import hamiltonian as hl
from coulomb_jax import langevin


def _problem(num_particles=16, n=40, d=3):
  ko, kx = jax.random.split(jax.random.key(0))
  omega = features.sample_gaussian(ko, num_particles, d)
  x = jax.random.normal(kx, (n, d))
  y = jnp.sign(jnp.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2])
  return omega, x, y


def test_beta_inf_is_projected_gradient_step():
  omega = 2.0 * jax.random.normal(jax.random.key(1), (8, 3))
  grad = jax.random.normal(jax.random.key(2), (8, 3)) / 8
  new = langevin.langevin_step(jax.random.key(3), omega, grad, step_size=0.1,
                               beta=jnp.inf, radius=2.5)
  moved = np.asarray(omega) - 0.1 * 8 * np.asarray(grad)
  norms = np.linalg.norm(moved, axis=-1, keepdims=True)
  expected = moved * np.minimum(1.0, 2.5 / norms)
  np.testing.assert_allclose(new, expected, rtol=1e-6)
  assert np.any(norms > 2.5) and np.any(norms < 2.5)   # both cases exercised
  # Traced β = ∞ (inside jit) gives the same.
  jitted = jax.jit(lambda b: langevin.langevin_step(jax.random.key(3), omega, grad,
                                                    step_size=0.1, beta=b, radius=2.5))
  np.testing.assert_allclose(jitted(jnp.inf), expected, rtol=1e-6)


def test_clipping_rescales_the_gradient_to_clip_norm():
  omega = jnp.zeros((4, 2))
  grad = jnp.full((4, 2), 10.0)                        # global norm 10·√8
  new = langevin.langevin_step(jax.random.key(0), omega, grad, step_size=0.01,
                               beta=math.inf, radius=math.inf, clip_norm=1.0)
  np.testing.assert_allclose(jnp.linalg.norm(new), 0.01 * 4 * 1.0, rtol=1e-6)
  unclipped = langevin.langevin_step(jax.random.key(0), omega, grad / 100, step_size=0.01,
                                     beta=math.inf, radius=math.inf, clip_norm=1.0)
  np.testing.assert_allclose(unclipped, -0.01 * 4 * grad / 100, rtol=1e-6)


def test_stationary_variance_on_quadratic_potential():
  """H = (1/N) Σ_k (c/2)‖ω_k‖²: the chain is ω ← (1 − ηc)ω + √(2η/β)ξ.

  Its stationary variance per coordinate is 1/(βc(1 − ηc/2)) → 1/(βc).
  """
  c, beta, eta, num, dim, steps = 2.0, 4.0, 0.005, 4000, 2, 1500
  energy = lambda w: jnp.sum(0.5 * c * jnp.square(w)) / w.shape[0]

  def body(omega, t):
    step = langevin.langevin_step(jax.random.fold_in(jax.random.key(5), t), omega,
                                  jax.grad(energy)(omega), step_size=eta, beta=beta,
                                  radius=100.0)
    return step, None

  omega, _ = jax.lax.scan(body, jnp.zeros((num, dim)), jnp.arange(steps))
  # 1500 steps of contraction 0.99 per step: the start is forgotten (e^-15).
  var = float(jnp.var(omega))
  target = 1.0 / (beta * c)
  exact_discrete = target / (1 - eta * c / 2)          # 0.5% above the target
  # 8000 i.i.d. coordinates: the sample variance has relative std √(2/8000) = 1.6%.
  assert abs(var - exact_discrete) < 4 * math.sqrt(2 / (num * dim)) * exact_discrete
  assert abs(var / target - 1) < 0.08
  assert float(jnp.max(jnp.linalg.norm(omega, axis=-1))) < 100.0   # ball never active


def test_particles_stay_in_ball_every_step():
  omega, x, y = _problem()
  grad_fn = jax.grad(lambda w: hl.hamiltonian(w, x, y, feature_map='rff', lam=1.0))
  step = jax.jit(lambda k, w: langevin.langevin_step(k, w, grad_fn(w), step_size=0.5,
                                                     beta=1.0, radius=1.5))
  for t in range(20):
    omega = step(jax.random.key(t), omega)
    assert float(jnp.max(jnp.linalg.norm(omega, axis=-1))) <= 1.5 * (1 + 1e-6)


def test_keys_determine_the_noise():
  omega = jnp.zeros((5, 3))
  grad = jnp.zeros((5, 3))
  kw = dict(step_size=0.1, beta=1.0, radius=10.0)
  a = langevin.langevin_step(jax.random.key(7), omega, grad, **kw)
  b = langevin.langevin_step(jax.random.key(7), omega, grad, **kw)
  c = langevin.langevin_step(jax.random.key(8), omega, grad, **kw)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  # Noise std √(2η/β) per coordinate.
  big = langevin.langevin_step(jax.random.key(9), jnp.zeros((5000, 2)), jnp.zeros((5000, 2)),
                               **kw)
  np.testing.assert_allclose(jnp.std(big), math.sqrt(0.2), rtol=4 * math.sqrt(1 / 20000))


def test_leading_axes_are_particle_sets_sharing_the_clip():
  omega = jax.random.normal(jax.random.key(10), (2, 6, 3))
  grad = jax.random.normal(jax.random.key(11), (2, 6, 3))
  new = langevin.langevin_step(jax.random.key(0), omega, grad, step_size=0.1, beta=math.inf,
                               radius=math.inf)
  np.testing.assert_allclose(new, omega - 0.1 * 6 * grad, rtol=1e-6)
  # One clip over all sets: the same scale factor for both.
  clipped = langevin.langevin_step(jax.random.key(0), omega, grad, step_size=0.1,
                                   beta=math.inf, radius=math.inf, clip_norm=1.0)
  scale = 1.0 / float(jnp.linalg.norm(grad))
  np.testing.assert_allclose(clipped, omega - 0.1 * 6 * scale * grad, rtol=1e-5)


def test_bf16_particles_step_in_float32():
  omega, x, y = _problem()
  kw = dict(feature_map='rff', lam=0.5, step_size=0.01, beta=jnp.inf, radius=5.0,
            batch_size=20, num_epochs=1)
  o32, _ = langevin.run_langevin(jax.random.key(0), omega, x, y, **kw)
  o16, hist = langevin.run_langevin(jax.random.key(0), omega.astype(jnp.bfloat16), x, y, **kw)
  assert o16.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(hist.hamiltonian)))
  # bf16 keeps 8 bits: |ω| < 4 rounds to within 2^-6 · 4.
  np.testing.assert_allclose(o16.astype(jnp.float32), o32, atol=0.07)


def test_integer_particles_are_moved_in_float32_not_truncated():
  ints = jnp.array([[1, 2], [3, -1]], jnp.int32)
  grad = jnp.array([[0.25, 0.0], [0.0, 0.5]])
  new = langevin.langevin_step(jax.random.key(0), ints, grad, step_size=0.1, beta=jnp.inf,
                               radius=10.0)
  chex.assert_type(new, jnp.float32)
  chex.assert_trees_all_close(new, jnp.array([[0.95, 2.0], [3.0, -1.1]]), rtol=1e-6)
  omega, x, y = _problem()
  kw = dict(feature_map='rff', lam=0.5, step_size=0.01, beta=jnp.inf, radius=5.0)
  rounded = jnp.round(2 * omega)
  o_int, _ = langevin.run_langevin(jax.random.key(0), rounded.astype(jnp.int32), x, y, **kw)
  o_f32, _ = langevin.run_langevin(jax.random.key(0), rounded, x, y, **kw)
  chex.assert_type(o_int, jnp.float32)
  chex.assert_trees_all_close(o_int, o_f32)
  assert not np.allclose(o_int, np.round(o_int))                 # really moved, not truncated
  tx = langevin.langevin_transform(jax.random.key(0), step_size=0.1, beta=1.0, radius=1.0)
  with pytest.raises(ValueError, match='dtype int32: particles must be floating'):
    tx.update(grad, tx.init(ints), ints)


def test_bf16_particles_end_inside_the_ball():
  # Rows pushed far outside: all are projected onto the sphere, where rounding to nearest in
  # bf16 lands up to 2^-9 (0.2%) outside; rounding those rows toward zero keeps them in.
  omega = jax.random.normal(jax.random.key(12), (256, 8)).astype(jnp.bfloat16)
  grad = -jax.random.normal(jax.random.key(13), (256, 8))
  radius = 1.0
  norms = lambda a: np.linalg.norm(np.asarray(a, np.float64), axis=-1)
  nearest = langevin.project_to_ball(
      np.asarray(omega, np.float32) - 0.1 * 256 * np.asarray(grad), radius).astype(jnp.bfloat16)
  assert norms(nearest).max() > radius * (1 + 1e-4)              # the failure this prevents
  new = langevin.langevin_step(jax.random.key(0), omega, grad, step_size=0.1, beta=jnp.inf,
                               radius=radius)
  chex.assert_type(new, jnp.bfloat16)
  assert norms(new).max() <= radius and norms(new).min() > radius * (1 - 2 ** -7)
  # Inside the ball: round to nearest, as before.
  inner = langevin.round_into_ball(jnp.full((2, 3), 0.1), radius, jnp.bfloat16)
  chex.assert_trees_all_equal(inner, jnp.full((2, 3), 0.1, jnp.bfloat16))
  # The optax form lands on the same particles.
  tx = langevin.langevin_transform(jax.random.key(0), step_size=0.1, beta=jnp.inf,
                                   radius=radius)
  updates, _ = tx.update(grad, tx.init(omega), omega)
  chex.assert_trees_all_equal(optax.apply_updates(omega, updates), new)


def test_run_langevin_history_and_descent():
  omega, x, y = _problem()
  kw = dict(feature_map='rff', lam=0.5, s=1.0, step_size=0.02, beta=jnp.inf, radius=5.0)
  final, hist = langevin.run_langevin(jax.random.key(0), omega, x, y, num_epochs=30, **kw)
  assert final.shape == omega.shape
  assert hist.hamiltonian.shape == (30,) and bool(jnp.all(hist.active))
  h0 = hl.hamiltonian(omega, x, y, feature_map='rff', lam=0.5, s=1.0)
  np.testing.assert_allclose(hist.hamiltonian[0], h0, rtol=1e-5)   # full batch, before step
  np.testing.assert_allclose(hist.hamiltonian, -hist.alignment + 0.5 * hist.repulsion,
                             rtol=1e-5, atol=1e-7)
  h_end = hl.hamiltonian(final, x, y, feature_map='rff', lam=0.5, s=1.0)
  assert h_end < h0 and hist.hamiltonian[-1] < hist.hamiltonian[0]
  # Minibatches: ⌊40 / 16⌋ = 2 steps per epoch; same key → same run.
  a, ha = langevin.run_langevin(jax.random.key(1), omega, x, y, batch_size=16, num_epochs=3,
                                **kw)
  b, _ = langevin.run_langevin(jax.random.key(1), omega, x, y, batch_size=16, num_epochs=3,
                               **kw)
  assert ha.hamiltonian.shape == (6,)
  np.testing.assert_array_equal(a, b)


def test_run_langevin_early_stop():
  omega, x, y = _problem()
  kw = dict(feature_map='rff', lam=0.5, step_size=1e-3, beta=jnp.inf, radius=5.0)
  first, _ = langevin.run_langevin(jax.random.key(0), omega, x, y, num_epochs=1, **kw)
  final, hist = langevin.run_langevin(jax.random.key(0), omega, x, y, num_epochs=10,
                                      tol=1.0, **kw)
  np.testing.assert_array_equal(np.asarray(hist.active), [True] + [False] * 9)
  np.testing.assert_array_equal(final, first)          # frozen after the stop
  assert float(hist.max_move[0]) < 1.0 and float(jnp.sum(hist.max_move[1:])) == 0.0


def test_run_langevin_vmaps_over_keys():
  omega, x, y = _problem()
  run = lambda k: langevin.run_langevin(k, omega, x, y, feature_map='rff', lam=0.5,
                                        step_size=0.01, beta=10.0, radius=3.0,
                                        batch_size=20, num_epochs=2)[0]
  keys = jax.random.split(jax.random.key(3), 3)
  batched = jax.vmap(run)(keys)
  np.testing.assert_allclose(batched[1], run(keys[1]), rtol=1e-5, atol=1e-6)


def test_gibbs_resample_frequencies_and_beta_inf():
  omega, x, y = _problem(num_particles=5)
  kw = dict(feature_map='rff', lam=0.5)
  u = hl.particle_potentials(omega, x, y, **kw)
  beta = 5.0 / float(jnp.std(u))                        # weights neither flat nor degenerate
  samples, idx = langevin.gibbs_resample(jax.random.key(0), omega, x, y, 20000, beta=beta,
                                         **kw)
  np.testing.assert_array_equal(samples, omega[idx])
  p = np.asarray(jax.nn.softmax(-beta * u))
  freq = np.bincount(np.asarray(idx), minlength=5) / 20000
  np.testing.assert_array_less(np.abs(freq - p), 5 * np.sqrt(p * (1 - p) / 20000) + 1e-12)
  _, idx_inf = langevin.gibbs_resample(jax.random.key(1), omega, x, y, 7, beta=jnp.inf, **kw)
  np.testing.assert_array_equal(idx_inf, np.full(7, int(jnp.argmin(u))))


def test_transform_matches_step_and_composes_with_partition():
  omega, x, y = _problem()
  params = {'particles': omega, 'dense': jnp.ones((3,))}
  tx = optax.partition(
      {'particles': langevin.langevin_transform(jax.random.key(0), step_size=0.05,
                                                beta=jnp.inf, radius=2.0, clip_norm=1.0),
       'rest': optax.set_to_zero()},
      {'particles': 'particles', 'dense': 'rest'})
  state = tx.init(params)
  grads = {'particles': jax.grad(lambda w: hl.hamiltonian(w, x, y, feature_map='rff',
                                                          lam=0.5))(omega),
           'dense': jnp.ones((3,))}
  updates, state = jax.jit(tx.update)(grads, state, params)
  new = optax.apply_updates(params, updates)
  expected = langevin.langevin_step(jax.random.key(0), omega, grads['particles'],
                                    step_size=0.05, beta=jnp.inf, radius=2.0, clip_norm=1.0)
  np.testing.assert_allclose(new['particles'], expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(new['dense'], params['dense'])


def test_a_scheduled_step_size_moves_step_t_by_its_own_eta():
  # step_size = a schedule: step t is langevin_step with η_t = schedule(t) and the noise of
  # step t's key (fold_in(key, t) split over the leaves: one leaf here); at η_t = 0
  # nothing moves (inside the ball).
  omega, x, y = _problem()
  key = jax.random.key(3)
  grad_fn = jax.grad(lambda w: hl.hamiltonian(w, x, y, feature_map='rff', lam=0.5))
  schedule = optax.cosine_decay_schedule(0.05, 2)          # 0.05, 0.025, 0.0
  tx = langevin.langevin_transform(key, step_size=schedule, beta=50.0, radius=10.0,
                                   clip_norm=1.0)
  state = tx.init(omega)
  params = omega
  for t, eta in enumerate((0.05, 0.025)):
    step_key = jax.random.split(jax.random.fold_in(key, t), 1)[0]
    expected = langevin.langevin_step(step_key, params, grad_fn(params),
                                      step_size=eta, beta=50.0, radius=10.0, clip_norm=1.0)
    updates, state = jax.jit(tx.update)(grad_fn(params), state, params)
    params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(params, expected, rtol=1e-5, atol=1e-6)
  updates, _ = tx.update(grad_fn(params), state, params)
  np.testing.assert_array_equal(updates, jnp.zeros_like(params))


def test_transform_noise_is_keyed_and_advances():
  params = {'a': jnp.zeros((4, 2)), 'b': jnp.zeros((2, 5, 3))}
  zeros = jax.tree.map(jnp.zeros_like, params)
  tx = langevin.langevin_transform(jax.random.key(0), step_size=0.1, beta=1.0, radius=10.0)
  state = tx.init(params)
  u1, state1 = tx.update(zeros, state, params)
  u1_again, _ = tx.update(zeros, state, params)
  u2, _ = tx.update(zeros, state1, params)
  np.testing.assert_array_equal(u1['a'], u1_again['a'])
  assert not np.allclose(u1['a'], u2['a']) and not np.allclose(u1['a'], u1['b'][0, :4, :2])
  assert int(state1.count) == 1
  with pytest.raises(ValueError, match='params'):
    tx.update(zeros, state, None)


@pytest.mark.parametrize('kwargs, match', [
    (dict(step_size=0.0), r'step_size must be > 0, got 0\.0'),
    (dict(beta=-1.0), r'beta must be > 0, got -1\.0'),
    (dict(beta=0.0), r'beta must be > 0, got 0\.0'),
    (dict(radius=0.0), r'radius must be > 0, got 0\.0'),
    (dict(clip_norm=-1.0), r'clip_norm must be > 0, got -1\.0'),
])
def test_bad_step_arguments(kwargs, match):
  args = dict(step_size=0.1, beta=1.0, radius=1.0) | kwargs
  omega = jnp.zeros((3, 2))
  with pytest.raises(ValueError, match=match):
    langevin.langevin_step(jax.random.key(0), omega, omega, **args)
  with pytest.raises(ValueError, match=match):
    langevin.langevin_transform(jax.random.key(0), **args)
  x, y = jnp.ones((4, 2)), jnp.ones(4)
  with pytest.raises(ValueError, match=match):
    langevin.run_langevin(jax.random.key(0), omega, x, y, feature_map='rff', lam=0.1, **args)


def test_bad_shapes_and_sizes():
  omega, x, y = _problem()
  kw = dict(feature_map='rff', lam=0.1, step_size=0.1, beta=1.0, radius=1.0)
  with pytest.raises(ValueError, match='grad must have the shape of omega'):
    langevin.langevin_step(jax.random.key(0), omega, omega[:3], step_size=0.1, beta=1.0,
                           radius=1.0)
  with pytest.raises(ValueError, match='y has 39 labels but x has 40 samples'):
    langevin.run_langevin(jax.random.key(0), omega, x, y[1:], **kw)
  with pytest.raises(ValueError, match='batch_size must be an integer in'):
    langevin.run_langevin(jax.random.key(0), omega, x, y, batch_size=100, **kw)
  with pytest.raises(ValueError, match='num_samples must be an integer >= 1'):
    langevin.gibbs_resample(jax.random.key(0), omega, x, y, 0, beta=1.0, feature_map='rff',
                            lam=0.1)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(radius=st.floats(0.1, 10.0), scale=st.floats(0.01, 100.0),
                  seed=st.integers(0, 2**31 - 1))
def test_projection_property(radius, scale, seed):
  """P_R lands in the ball, is idempotent, and leaves points inside unchanged."""
  omega = scale * np.random.default_rng(seed).normal(size=(7, 3)).astype(np.float32)
  proj = langevin.project_to_ball(jnp.asarray(omega), radius)
  assert float(jnp.max(jnp.linalg.norm(proj, axis=-1))) <= radius * (1 + 1e-6)
  np.testing.assert_allclose(langevin.project_to_ball(proj, radius), proj, rtol=1e-6)
  inside = np.linalg.norm(omega, axis=-1) <= radius
  np.testing.assert_array_equal(np.asarray(proj)[inside], omega[inside])


def test_global_norm_does_not_overflow_and_clipping_keeps_the_direction():
  tree = {'a': jnp.array([[3.0, 4.0]]), 'b': jnp.array([12.0])}
  np.testing.assert_allclose(langevin.global_norm(tree), 13.0, rtol=1e-6)
  np.testing.assert_allclose(langevin.global_norm(tree), optax.tree.norm(tree), rtol=1e-6)
  # Σ g² overflows float32 here (≈ 1.7e62); the norm itself (1.3e31) does not.
  huge = jax.tree.map(lambda g: g * 1e30, tree)
  assert np.isinf(float(optax.tree.norm(huge, squared=True)))
  np.testing.assert_allclose(langevin.global_norm(huge), 1.3e31, rtol=1e-6)
  clipped = langevin.clip_by_global_norm(huge, 10.0)
  np.testing.assert_allclose(clipped['a'], [[30 / 13, 40 / 13]], rtol=1e-5)
  np.testing.assert_allclose(clipped['b'], [120 / 13], rtol=1e-5)
  assert float(langevin.global_norm({'z': jnp.zeros(3)})) == 0.0


class LangevinVariantsTest(chex.TestCase):
  """The step with and without jit, float32 and x64 (pmapped: tests/library/test_parallel.py)."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_step_is_the_projected_update(self):
    omega = 2.0 * jax.random.normal(jax.random.key(1), (8, 3))
    grad = jax.random.normal(jax.random.key(2), (8, 3)) / 8
    step = self.variant(lambda w, g: langevin.langevin_step(
        jax.random.key(3), w, g, step_size=0.1, beta=jnp.inf, radius=2.5))
    new = step(omega, grad)
    moved = np.asarray(omega) - 0.8 * np.asarray(grad)
    expected = moved * np.minimum(1.0, 2.5 / np.linalg.norm(moved, axis=-1, keepdims=True))
    chex.assert_shape(new, (8, 3))
    chex.assert_trees_all_close(new, expected, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(jnp.float32, jnp.float64)
  def test_run_and_transform_under_x64(self, dtype):
    with jax.enable_x64(True):
      omega, x, y = _problem()
      omega, x = omega.astype(dtype), x.astype(dtype)
      run = self.variant(lambda w: langevin.run_langevin(
          jax.random.key(0), w, x, y, feature_map='softmaxfeat', lam=0.5, step_size=0.02,
          beta=100.0, radius=1.5, batch_size=20))
      final, hist = run(omega)
      chex.assert_type(final, dtype)
      assert np.all(np.linalg.norm(final, axis=-1) <= 1.5)
      assert np.all(np.isfinite(hist.hamiltonian))
      tx = langevin.langevin_transform(jax.random.key(0), step_size=0.1, beta=1.0,
                                       radius=1.5)
      updates, _ = self.variant(tx.update)(omega, tx.init(omega), omega)
      chex.assert_type(updates, dtype)


def test_a_state_saved_before_the_counts_restores_with_zero_counts():
  from flax import serialization  # pylint: disable=g-import-not-at-top
  tx = optax.partition({'particles': langevin.langevin_transform(   # raw key: msgpack
      jax.random.PRNGKey(0), step_size=0.1, beta=1.0, radius=1.0), 'rest': optax.set_to_zero()},
                       {'w': 'particles', 'b': 'rest'})
  params = {'w': jnp.ones((4, 3)), 'b': jnp.ones(2)}
  state = tx.init(params)
  _, moved = jax.jit(tx.update)({'w': jnp.full((4, 3), jnp.nan), 'b': jnp.ones(2)}, state,
                                params)
  assert int(optax.tree_utils.tree_get(moved, 'nonfinite_grads')) == 12
  legacy = langevin.to_legacy_state(moved)              # what an older checkpoint holds
  assert isinstance(legacy.inner_states['particles'].inner_state, langevin.LegacyLangevinState)
  blob = serialization.msgpack_restore(
      serialization.msgpack_serialize(serialization.to_state_dict(legacy)))
  with pytest.raises(ValueError, match='nonfinite_grads'):
    serialization.from_state_dict(state, blob)
  restored = langevin.from_legacy_state(
      serialization.from_state_dict(langevin.to_legacy_state(state), blob))
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  assert int(optax.tree_utils.tree_get(restored, 'count')) == 1
  assert int(optax.tree_utils.tree_get(restored, 'nonfinite_grads')) == 0
  jax.jit(tx.update)(params, restored, params)          # the same compiled structure
