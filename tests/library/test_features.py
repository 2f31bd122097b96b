"""Tests of coulomb_jax.features: kernel estimates, positivity, samplers, bad input."""

from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import features

NUM_PAIRS = 60   # independent (x, y, Ω) draws per Monte-Carlo check


def _pairs(key, scale, dim=4):
  kx, ky = jax.random.split(key)
  x = scale * jax.random.normal(kx, (NUM_PAIRS, dim)) / np.sqrt(dim)
  y = scale * jax.random.normal(ky, (NUM_PAIRS, dim)) / np.sqrt(dim)
  return x, y


def _estimates(feature_map, num, key, scale):
  """⟨φ(x), φ(y)⟩ for NUM_PAIRS independent draws of (x, y, Ω ~ N(0, I))."""
  x, y = _pairs(jax.random.fold_in(key, 1), scale)

  def one(k, xi, yi):
    omega = features.sample_gaussian(k, num, xi.shape[-1])
    return jnp.dot(feature_map(xi, omega), feature_map(yi, omega))

  return jax.vmap(one)(jax.random.split(key, NUM_PAIRS), x, y), x, y


def _z_scores(feature_map, exact, variance, num, key, scale):
  """(estimate − exact) / (Monte-Carlo std) for each draw."""
  est, x, y = _estimates(feature_map, num, key, scale)
  return np.asarray((est - exact(x, y)) / jnp.sqrt(variance(x, y) / num))


def _check_z(z):
  # z ~ N(0, 1) i.i.d. over the NUM_PAIRS draws: no |z| beyond 5, and the mean
  # square is chi²_60/60, whose std is sqrt(2/60) = 0.18: [0.45, 1.65] is 3.5σ.
  assert np.max(np.abs(z)) < 5.0, z
  assert 0.45 < np.mean(z ** 2) < 1.65, np.mean(z ** 2)


@pytest.mark.parametrize('num', [256, 4096])
def test_rff_estimates_gaussian_kernel_within_mc_error(num):
  gauss = lambda x, y: jnp.exp(-0.5 * jnp.sum((x - y) ** 2, -1))
  # Var cos(ωᵀδ) = (1 + k(2δ))/2 − k(δ)², with k(2δ) = k(δ)⁴.
  var = lambda x, y: 0.5 * (1 + gauss(x, y) ** 4) - gauss(x, y) ** 2
  _check_z(_z_scores(features.rff, gauss, var, num, jax.random.key(0), scale=1.0))


@pytest.mark.parametrize('num', [256, 4096])
def test_favor_estimates_exp_dot_within_mc_error(num):
  exact = lambda x, y: jnp.exp(jnp.sum(x * y, -1))
  # ψ = exp(ωᵀz − (‖x‖² + ‖y‖²)/2), z = x + y:  E ψ² = exp(2‖z‖² − ‖x‖² − ‖y‖²).
  def var(x, y):
    z2 = jnp.sum((x + y) ** 2, -1)
    return jnp.exp(2 * z2 - jnp.sum(x * x, -1) - jnp.sum(y * y, -1)) - exact(x, y) ** 2
  _check_z(_z_scores(features.favor, exact, var, num, jax.random.key(1), scale=0.5))


def test_mc_error_shrinks_like_inverse_sqrt_n():
  """The RMS error falls by about √16 = 4 from N = 256 to N = 4096."""
  gauss = lambda x, y: jnp.exp(-0.5 * jnp.sum((x - y) ** 2, -1))
  rms = []
  for num in (256, 4096):
    est, x, y = _estimates(features.rff, num, jax.random.key(2), 1.0)
    rms.append(np.sqrt(np.mean(np.square(est - gauss(x, y)))))
  # Each RMS is over 60 draws (relative std ≈ 1/sqrt(120) = 9%): ratio 4 ± 30%.
  assert 2.8 < rms[0] / rms[1] < 5.6, rms


def test_favor_stabilize_is_finite_and_a_per_row_rescaling():
  key = jax.random.key(3)
  omega = features.sample_gaussian(key, 64, 8)
  x = jax.random.normal(jax.random.key(4), (5, 8))
  x = 100.0 * x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # norm 100
  phi = features.favor(x, omega, stabilize=True)
  assert np.all(np.isfinite(phi)) and np.all(phi >= 0)
  np.testing.assert_allclose(np.max(phi, axis=-1), 1 / np.sqrt(64), rtol=1e-6)
  grad = jax.grad(lambda z: jnp.sum(features.favor(z, omega, stabilize=True)))(x)
  assert np.all(np.isfinite(grad))
  # On moderate inputs, each row is the exact features times one constant.
  xs = 0.3 * x / 100
  ratio = features.favor(xs, omega, stabilize=True) / features.favor(xs, omega)
  np.testing.assert_allclose(ratio, ratio[:, :1] * np.ones_like(ratio), rtol=1e-5)


def test_favor_stabilize_over_given_axes():
  omega = features.sample_gaussian(jax.random.key(5), 16, 4)
  k = jax.random.normal(jax.random.key(6), (2, 7, 3, 4))   # [B, L, H, d]
  phi = features.favor(k, omega, stabilize=(-3, -1))
  ratio = phi / features.favor(k, omega)
  # One constant per (batch, head): the same over L and over features.
  np.testing.assert_allclose(ratio, np.broadcast_to(ratio[:, :1, :, :1], ratio.shape),
                             rtol=1e-5)


def test_favor_stabilize_mask_excludes_rows_from_the_max():
  omega = features.sample_gaussian(jax.random.key(15), 16, 4)
  real = 3.0 * jax.random.normal(jax.random.key(16), (2, 6, 4))
  padded = jnp.concatenate([real, jnp.zeros((2, 3, 4))], axis=1)       # exponent 0 rows
  mask = jnp.arange(9)[None, :] < 6
  got = features.favor(padded, omega, stabilize=(-2, -1),
                       stabilize_mask=jnp.broadcast_to(mask, (2, 9)))[:, :6]
  np.testing.assert_allclose(got, features.favor(real, omega, stabilize=(-2, -1)),
                             rtol=1e-6)
  none = features.favor(real, omega, stabilize=True, stabilize_mask=jnp.zeros((2, 6), bool))
  np.testing.assert_allclose(none, features.favor(real, omega), rtol=1e-6)  # shift 0


def _favor_pair_inputs(scale):
  kq, kk, kw = jax.random.split(jax.random.key(11), 3)
  q = scale * jax.random.normal(kq, (2, 24, 16))     # [B, L, d]
  k = scale * jax.random.normal(kk, (2, 24, 16))
  omega = jax.random.normal(kw, (32, 16))
  mask = jnp.arange(24)[None] < jnp.array([[24], [9]])
  return q, k, omega, mask


def test_favor_pair_is_favor_up_to_one_factor_per_query_row():
  q, k, omega, mask = _favor_pair_inputs(0.3)
  qf, kf = features.favor_pair(q, k, omega, mask)
  gram = jnp.einsum('bif,bjf->bij', qf, kf)
  exact = jnp.einsum('bif,bjf->bij', features.favor(q, omega), features.favor(k, omega))
  ratio = np.where(mask[:, None, :], gram / exact, np.nan)          # real keys only
  row = np.nanmean(ratio, axis=-1, keepdims=True)
  np.testing.assert_allclose(np.where(mask[:, None, :], ratio, row),
                             np.broadcast_to(row, ratio.shape), rtol=1e-5)
  assert np.all(np.asarray(kf)[~np.asarray(mask)] == 0)            # padded keys: φ = 0


def test_favor_pair_bounds_features_and_the_attention_denominator():
  # Inputs large enough that a per-(batch) key shift leaves most queries' features
  # facing keys e^{-100} below the maximum.
  q, k, omega, mask = _favor_pair_inputs(3.0)
  qf, kf = features.favor_pair(q, k, omega, mask)
  n = omega.shape[0]
  assert np.all(np.isfinite(qf)) and np.all(np.isfinite(kf))
  assert float(jnp.max(qf)) <= 1 / np.sqrt(n) * (1 + 1e-6)
  assert float(jnp.max(kf)) <= 1 / np.sqrt(n) * (1 + 1e-6)
  den = jnp.einsum('bif,bf->bi', qf, jnp.sum(kf, axis=1))
  assert float(jnp.min(den)) >= (1 / n) * (1 - 1e-5)
  # Padded keys do not enter the shifts: garbage there changes no real feature.
  k_garbage = jnp.where(mask[..., None], k, 1e3)
  qg, kg = features.favor_pair(q, k_garbage, omega, mask)
  np.testing.assert_array_equal(qg, qf)
  np.testing.assert_array_equal(kg, kf)


def _rows_of_norm(key, shape, norm):
  x = jax.random.normal(key, shape)
  return norm * x / jnp.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize('name', features.KERNEL_ATTENTION_MAPS)
def test_attention_pair_bounds_padding_and_log_features(name):
  # Rows of norm 40: porf_softplus's raw features are all 0 in float32 there (e^{s − 800}).
  kq, kk, kw = jax.random.split(jax.random.key(17), 3)
  q, k = _rows_of_norm(kq, (2, 10, 8), 40.0), _rows_of_norm(kk, (2, 10, 8), 40.0)
  omega = jax.random.normal(kw, (16, 8))
  mask = jnp.arange(10)[None] < jnp.array([[10], [6]])
  qf, kf = features.attention_pair(q, k, omega, name, mask)
  width = 32 if name in ('softmaxfeat', 'hedgehog') else 16
  chex.assert_shape((qf, kf), (2, 10, width))
  chex.assert_type((qf, kf), jnp.float32)
  assert float(jnp.max(qf)) <= 1 / 4 * (1 + 1e-6) and float(jnp.max(kf)) <= 1 / 4 * (1 + 1e-6)
  den = jnp.einsum('bif,bf->bi', qf, jnp.sum(kf, axis=1))
  assert float(jnp.min(den)) >= 1 / 16 * (1 - 1e-5)        # the guard eps = 1e-6 never acts
  assert np.all(np.asarray(kf)[~np.asarray(mask)] == 0)    # padded keys: φ = 0
  # Padded keys enter no shift: garbage (huge or NaN) there changes no feature.
  garbage = jnp.where(mask[..., None], k, jnp.nan)
  qg, kg = features.attention_pair(q, garbage, omega, name, mask)
  chex.assert_trees_all_equal((qg, kg), (qf, kf))
  # log_features is log φ: equal to the map where it does not underflow, finite where it does.
  fm = features.get_feature_map(name)
  small = q / 40.0
  np.testing.assert_allclose(jnp.exp(features.log_features(small, omega, name)),
                             fm(small, omega), rtol=2e-5, atol=1e-30)
  assert np.all(np.isfinite(features.log_features(q, omega, name)))
  if name == 'porf_softplus':
    assert np.all(np.asarray(fm(q, omega)) == 0)         # what the shifts repair


def test_num_features_counts_two_per_particle_for_paired_maps():
  omega = features.sample_gaussian(jax.random.key(3), 5, 4)
  x = jnp.ones((2, 4))
  for name in features.FEATURE_MAPS:
    assert features.get_feature_map(name)(x, omega).shape[-1] == features.num_features(name, 5)
  assert features.num_features('hedgehog', 5) == 10 and features.num_features('elu', 5) == 5
  with pytest.raises(ValueError, match="unknown name 'exp'"):
    features.num_features('exp', 5)


def test_hedgehog_is_the_mimicry_map_and_its_log_features():
  # features.hedgehog (the map KernelAttention takes) is mimicry's, and its log form
  # is mimicry.hedgehog_log_features, at a scale where the direct form overflows.
  from coulomb_jax import mimicry  # pylint: disable=g-import-not-at-top
  omega = features.sample_gaussian(jax.random.key(4), 6, 5)
  x = jax.random.normal(jax.random.key(5), (3, 5))
  np.testing.assert_allclose(features.hedgehog(x, omega),
                             mimicry.hedgehog(x, omega, stabilize=False), rtol=1e-6)
  big = 60.0 * x
  np.testing.assert_allclose(features.log_features(big, omega, 'hedgehog'),
                             mimicry.hedgehog_log_features(big, omega), rtol=1e-6)
  assert not np.all(np.isfinite(features.hedgehog(big, omega)))    # what log space avoids


def test_favor_pair_is_attention_pair_of_favor():
  q, k, omega, mask = _favor_pair_inputs(3.0)
  chex.assert_trees_all_equal(features.favor_pair(q, k, omega, mask),
                              features.attention_pair(q, k, omega, 'favor', mask))


def test_favor_pair_bad_input():
  q, k, omega, mask = _favor_pair_inputs(1.0)
  with pytest.raises(ValueError, match='same leading axes'):
    features.favor_pair(q[:1], k, omega)
  with pytest.raises(ValueError, match=r'key_mask must have shape \(2, 24\)'):
    features.favor_pair(q, k, omega, mask[:, :5])



@pytest.mark.parametrize('name', sorted(features.FEATURE_MAPS))
def test_every_map_shape_scale_dtype_and_transforms(name):
  fm = features.get_feature_map(name)
  omega = features.sample_gaussian(jax.random.key(7), 12, 6)
  x = jax.random.normal(jax.random.key(8), (3, 5, 6))
  phi = fm(x, omega)
  width = 24 if name in ('rff', 'softmaxfeat', 'hedgehog') else 12
  width = 1 + 12 + 144 if name == 'taylor' else width
  assert phi.shape == (3, 5, width) and phi.dtype == jnp.float32
  assert width == features.num_features(name, 12)
  if name not in ('rff', 'taylor'):     # signed features (taylor: a positive kernel)
    assert np.all(phi >= 0)
    if name != 'cos2':
      assert np.all(phi > 0)
  np.testing.assert_allclose(jax.jit(fm)(x, omega), phi, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(jax.vmap(fm, (0, None))(x, omega), phi, rtol=1e-6, atol=1e-7)
  # bf16 inputs: computed in float32, no NaN even for large inputs.
  big = (30.0 * x).astype(jnp.bfloat16)
  kwargs = {'stabilize': True} if name == 'favor' else {}
  phi16 = fm(big, omega.astype(jnp.bfloat16), **kwargs)
  assert phi16.dtype == jnp.float32 and not np.any(np.isnan(phi16))


def test_separable_maps_split_per_particle():
  omega = features.sample_gaussian(jax.random.key(9), 6, 3)
  x = jax.random.normal(jax.random.key(10), (4, 3))
  for name in features.FEATURE_MAPS:
    fm = features.get_feature_map(name)
    full = fm(x, omega)
    halves = [fm(x, omega[:3]), fm(x, omega[3:])]
    k_full = full @ full.T
    k_split = sum(h @ h.T for h in halves) / 2          # mean over the two halves
    assert features.is_separable(name) == np.allclose(k_full, k_split, rtol=1e-5), name


def test_get_feature_map_unknown_name_lists_known():
  with pytest.raises(ValueError, match=r"unknown name 'relu'.*favor"):
    features.get_feature_map('relu')
  fn = lambda x, omega: x @ omega.T
  assert features.get_feature_map(fn) is fn and not features.is_separable(fn)


def test_sample_gaussian_shape_and_reproducible():
  a = features.sample_gaussian(jax.random.key(11), 7, 3)
  assert a.shape == (7, 3) and a.dtype == jnp.float32
  np.testing.assert_array_equal(a, features.sample_gaussian(jax.random.key(11), 7, 3))
  assert not np.allclose(a, features.sample_gaussian(jax.random.key(12), 7, 3))


def test_sample_orthogonal_blocks_orthogonal_with_chi_norms():
  dim, num = 8, 20                                      # blocks of 8, 8, 4 rows
  w = np.asarray(features.sample_orthogonal(jax.random.key(13), num, dim))
  assert w.shape == (num, dim)
  unit = w / np.linalg.norm(w, axis=-1, keepdims=True)
  for start in (0, 8, 16):
    block = unit[start:start + dim]
    np.testing.assert_allclose(block @ block.T, np.eye(len(block)), atol=1e-5)
  # Squared norms are chi²_d: mean d, std of the mean over 4000 rows sqrt(2d/4000).
  many = np.asarray(features.sample_orthogonal(jax.random.key(14), 4000, dim))
  sq = np.sum(many ** 2, -1)
  assert abs(sq.mean() - dim) < 5 * np.sqrt(2 * dim / 4000)


@pytest.mark.parametrize('x_shape, omega_shape, match', [
    ((5, 3), (4, 2), 'last dimensions differ'),
    ((5, 3), (4, 3, 1), 'omega must have rank 2'),
    ((), (4, 3), 'x must have rank >= 1'),
    ((5, 3), (0, 3), 'at least one particle'),
])
def test_bad_shapes_raise(x_shape, omega_shape, match):
  for fm in features.FEATURE_MAPS.values():
    with pytest.raises(ValueError, match=match):
      fm(jnp.ones(x_shape), jnp.ones(omega_shape))
    with pytest.raises(ValueError, match=match):   # at trace time, too
      jax.jit(fm)(jnp.ones(x_shape), jnp.ones(omega_shape))


def test_bad_sampler_sizes_raise():
  with pytest.raises(ValueError, match='num_particles must be an integer >= 1, got 0'):
    features.sample_gaussian(jax.random.key(0), 0, 3)
  with pytest.raises(ValueError, match='dim must be an integer >= 1, got 0'):
    features.sample_orthogonal(jax.random.key(0), 4, 0)


class FeatureMapVariantsTest(chex.TestCase):
  """Every map with and without jit: shapes, dtypes, values against numpy float64."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*sorted(features.FEATURE_MAPS))
  def test_map_matches_its_formula(self, name):
    omega = features.sample_gaussian(jax.random.key(18), 6, 3)
    x = jax.random.normal(jax.random.key(19), (4, 3))
    phi = self.variant(features.get_feature_map(name))(x, omega)
    s = np.asarray(x, np.float64) @ np.asarray(omega, np.float64).T
    half = 0.5 * np.sum(np.asarray(x, np.float64) ** 2, -1, keepdims=True)
    sig = 1 / (1 + np.exp(-s))
    both = np.concatenate([s, -s], -1)
    psi = {'rff': np.concatenate([np.cos(s), np.sin(s)], -1), 'favor': np.exp(s - half),
           'elu': np.where(s > 0, s + 1, np.exp(s)), 'softplus': np.log1p(np.exp(s)),
           'sigmoid2': sig ** 2, 'cos2': np.cos(s) ** 2,
           'softmaxfeat': 12 * np.exp(both) / np.exp(both).sum(-1, keepdims=True),
           'porf_softplus': np.log1p(np.exp(s - half)), 'hedgehog': np.exp(both) / np.sqrt(2),
           # taylor is not scaled by 1/√N (its kernel is the polynomial itself): × √6 here.
           'taylor': np.sqrt(6) * np.concatenate(
               [np.ones((4, 1)), s / 6 ** 0.25,
                (s[:, :, None] * s[:, None, :]).reshape(4, 36) / np.sqrt(12)], -1)}[name]
    chex.assert_shape(phi, psi.shape)
    chex.assert_type(phi, jnp.float32)
    chex.assert_trees_all_close(phi, psi / np.sqrt(6), rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_attention_pair_under_x64(self):
    with jax.enable_x64(True):
      q = jax.random.normal(jax.random.key(20), (5, 3), jnp.float64)
      omega = features.sample_gaussian(jax.random.key(21), 4, 3, jnp.float64)
      for name in features.KERNEL_ATTENTION_MAPS:
        qf, kf = self.variant(lambda a, w, n=name: features.attention_pair(a, a, w, n))(q, omega)
        chex.assert_type((qf, kf), jnp.float64)
        gram = qf @ kf.T                   # one factor per row times the exact Gram matrix
        exact = features.get_feature_map(name)(q, omega)
        exact = exact @ exact.T
        ratio = np.asarray(gram / exact)
        np.testing.assert_allclose(ratio, ratio[:, :1] * np.ones_like(ratio), rtol=1e-12)
