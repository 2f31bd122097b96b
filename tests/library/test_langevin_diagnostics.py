"""coulomb_jax.langevin_diagnostics: each measurement on a case with a known answer."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import langevin
from coulomb_jax import langevin_diagnostics as ld


def _grad_with_norms(norms, dim=4):
  """``[N, dim]`` rows along e_0 with the given norms."""
  g = np.zeros((len(norms), dim), np.float32)
  g[:, 0] = norms
  return jnp.asarray(g)


def test_drift_to_noise_is_eta_n_grad_over_sqrt_2_eta_d_over_beta():
  norms = [0.5, 1.0, 2.0]
  ratio = ld.drift_to_noise(_grad_with_norms(norms), step_size=0.1, beta=50.0)
  sigma = math.sqrt(2 * 0.1 / 50.0 * 4)
  want = [0.1 * 3 * n / sigma for n in norms]
  chex.assert_shape(ratio, (3,))
  np.testing.assert_allclose(ratio, want, rtol=1e-6)
  # Clipping rescales the whole set to global norm clip_norm before η·N.
  clipped = ld.drift_to_noise(_grad_with_norms(norms), step_size=0.1, beta=50.0,
                              clip_norm=1.0)
  np.testing.assert_allclose(clipped, np.asarray(want) / np.linalg.norm(norms), rtol=1e-6)
  # A pytree of sets: each particle uses its own set's N, one global clip.
  tree = {'a': _grad_with_norms([1.0]), 'b': _grad_with_norms([1.0, 1.0])}
  np.testing.assert_allclose(ld.drift(tree, step_size=1.0), [1.0, 2.0, 2.0], rtol=1e-6)


def test_drift_matches_one_noise_free_langevin_step_inside_the_ball():
  key = jax.random.key(0)
  omega = 0.1 * jax.random.normal(key, (8, 3))
  grad = 0.01 * jax.random.normal(jax.random.key(1), (8, 3))
  new = langevin.langevin_step(key, omega, grad, step_size=0.2, beta=math.inf, radius=10.0)
  np.testing.assert_allclose(ld.drift(grad, step_size=0.2),
                             np.linalg.norm(new - omega, axis=-1), rtol=1e-5)


def test_force_ratio_and_relative_rules():
  rep = _grad_with_norms([1.0, 2.0, 4.0])
  ali = _grad_with_norms([2.0, 2.0, 2.0])
  np.testing.assert_allclose(ld.force_ratio(rep, ali, 0.5), [0.25, 0.5, 1.0], rtol=1e-6)
  # Zero alignment force: infinite ratio, or 0 when there is no repulsion either.
  np.testing.assert_array_equal(
      ld.force_ratio(_grad_with_norms([1.0, 0.0]), _grad_with_norms([0.0, 0.0]), 1.0),
      [np.inf, 0.0])
  lam = ld.relative_lam(rep, ali, 3.0)
  assert lam == pytest.approx(3.0 * 2.0 / 2.0)
  assert float(np.median(ld.force_ratio(rep, ali, lam))) == pytest.approx(3.0)
  assert ld.relative_lam(rep, ali, 0.0) == 0.0
  eta = ld.relative_step_size(ali, fraction=0.01, radius=1.5)
  assert float(np.median(ld.drift(ali, step_size=eta))) == pytest.approx(0.015)
  with pytest.raises(ValueError, match='grad'):
    ld.relative_step_size(jnp.zeros((3, 2)), fraction=0.01, radius=1.5)
  with pytest.raises(ValueError, match='grad_repulsion'):
    ld.relative_lam(jnp.zeros((3, 2)), ali, 1.0)


def test_gibbs_tilt_and_tilt_beta():
  u = jnp.array([[0.0, 0.5, 2.0], [1.0, 1.0, 1.5]])
  np.testing.assert_allclose(ld.potential_range(u), [2.0, 0.5])
  np.testing.assert_allclose(ld.gibbs_tilt(u, 10.0), [20.0, 5.0])
  assert ld.tilt_beta(0.5, 100.0) == pytest.approx(200.0)
  with pytest.raises(ValueError, match='potential_range_value'):
    ld.tilt_beta(0.0, 100.0)
  with pytest.raises(ValueError, match='beta'):
    ld.gibbs_tilt(u, -1.0)


def test_ball_probes_are_the_projected_particles_then_uniform_points_in_the_ball():
  omega = 3.0 * jax.random.normal(jax.random.key(0), (2, 5, 4))
  probes = ld.ball_probes(jax.random.key(1), omega, 1.5, 4000)
  chex.assert_shape(probes, (2, 5 + 4000, 4))
  np.testing.assert_allclose(probes[:, :5], langevin.project_to_ball(omega, 1.5), rtol=1e-6)
  radii = np.linalg.norm(probes[0, 5:], axis=-1)
  assert radii.max() <= 1.5 + 1e-5
  # Uniform in the ball: (r / R)^d ~ U(0, 1), mean 1/2, std 1/sqrt(12 n).
  u = (radii / 1.5) ** 4
  assert abs(u.mean() - 0.5) < 4 / math.sqrt(12 * 4000)


def test_random_walk_has_the_langevin_noise_variance_and_beta_inf_only_projects():
  omega = jnp.zeros((4000, 3))
  walk = ld.random_walk(jax.random.key(0), omega, num_steps=25, step_size=0.01, beta=2.0,
                        radius=1e6)
  # E‖Δ‖² = T·(2η/β)·d = 25·0.01·3 = 0.75; the sample mean of 4000 χ²-like values has
  # relative std sqrt(2/(3·4000)) ≈ 1.3%.
  msd = float(np.mean(np.sum(np.square(walk), axis=-1)))
  assert msd == pytest.approx(0.75, rel=0.06)
  far = 5.0 * jnp.ones((3, 2))
  np.testing.assert_allclose(
      ld.random_walk(jax.random.key(0), far, num_steps=3, step_size=0.1, beta=math.inf,
                     radius=1.0), langevin.project_to_ball(far, 1.0))
  np.testing.assert_allclose(ld.displacement(omega[:3], 5.0 * jnp.ones((3, 3))),
                             [5 * math.sqrt(3)] * 3, rtol=1e-6)


class HeldoutAlignmentTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_one_for_the_label_feature_and_scale_free(self):
    y = jnp.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    fn = self.variant(ld.heldout_alignment)
    out, scaled = fn(y[:, None], y), fn(10.0 * y[:, None], y)
    assert float(out['centered_alignment']) == pytest.approx(1.0, abs=1e-6)
    assert float(scaled['centered_alignment']) == pytest.approx(1.0, abs=1e-6)
    # The objective A grows with the square of the features' scale; ρ does not.
    assert float(scaled['alignment']) == pytest.approx(100.0 * float(out['alignment']),
                                                       rel=1e-5)
    chex.assert_type(out['centered_alignment'], jnp.float32)

  @chex.variants(with_jit=True, without_jit=True)
  def test_drift_to_noise_under_jit(self):
    fn = self.variant(lambda g: ld.drift_to_noise(g, step_size=0.1, beta=50.0, clip_norm=1.0))
    g = _grad_with_norms([0.5, 1.0, 2.0])
    chex.assert_trees_all_close(fn(g), ld.drift_to_noise(g, step_size=0.1, beta=50.0,
                                                         clip_norm=1.0), rtol=1e-6)


def test_log_histogram_median_to_one_bin_and_resumable():
  values = np.array([1e-3, 2e-3, 5e-3, 1e-2, 3e-2, 0.0, np.inf, np.nan])
  h = ld.LogHistogram()
  h.add(values[:4])
  resumed = ld.LogHistogram(counts=h.counts.copy(), nan=h.nan)
  resumed.add(values[4:])
  whole = ld.LogHistogram()
  whole.add(values)
  np.testing.assert_array_equal(resumed.counts, whole.counts)
  assert whole.total == 7 and whole.nan == 1
  # Sorted finite values: 0, 1e-3, 2e-3, 5e-3, 1e-2, 3e-2, inf: the median is 5e-3.
  assert whole.median() == pytest.approx(5e-3, rel=10 ** (1 / 20) - 1)
  assert whole.quantile(0.0) == pytest.approx(1e-12)
  assert whole.quantile(1.0) == pytest.approx(1e12)
  assert math.isnan(ld.LogHistogram().median())
  with pytest.raises(ValueError, match='counts'):
    ld.LogHistogram(counts=np.zeros(3))


def test_tiny_forces_do_not_underflow_to_zero():
  # A Coulomb force in d = 64 (s = 62) has components ~1e-20: squared they underflow.
  g = jnp.full((3, 64), 1e-20, jnp.float32)
  np.testing.assert_allclose(ld.force_ratio(g, jnp.full((3, 64), 1e-6), 1.0), [1e-14] * 3,
                             rtol=1e-5)
  assert ld.relative_lam(g, jnp.full((3, 64), 1e-6), 1.0) == pytest.approx(1e14, rel=1e-5)
