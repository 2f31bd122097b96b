"""Tests of coulomb_jax.tasks.synthetic."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax.tasks import synthetic


def test_reproducible_per_key_and_labels():
  x1, y1 = synthetic.make_classification(jax.random.key(0), 100, 7, 0.1)
  x2, y2 = synthetic.make_classification(jax.random.key(0), 100, 7, 0.1)
  x3, _ = synthetic.make_classification(jax.random.key(1), 100, 7, 0.1)
  np.testing.assert_array_equal(x1, x2)
  np.testing.assert_array_equal(y1, y2)
  assert not np.allclose(x1, x3)
  assert x1.shape == (100, 7) and x1.dtype == jnp.float32
  assert set(np.unique(y1)) == {-1.0, 1.0}


def test_noise_controls_label_agreement():
  """At σ = 1e-5 labels are sign(f); at σ = 1e5 they agree with sign(f) half the time."""
  for noise, low, high in ((1e-5, 0.999, 1.0), (1e5, 0.45, 0.55)):
    x, y = synthetic.make_classification(jax.random.key(2), 4000, 5, noise)
    agree = float(jnp.mean(y == jnp.where(synthetic.target_function(x) >= 0, 1.0, -1.0)))
    # 4000 draws: the std of the agreement at 0.5 is 0.008, so ±0.05 is > 6σ.
    assert low <= agree <= high, (noise, agree)


def test_splits_are_independent_draws():
  splits = synthetic.make_splits(jax.random.key(3), num_train=40, num_val=20, num_test=30,
                                 dim=5, noise=0.1)
  assert {k: v[0].shape[0] for k, v in splits.items()} == {'train': 40, 'val': 20, 'test': 30}
  assert not np.allclose(splits['train'][0][:20], splits['val'][0])


def test_noise_grid():
  np.testing.assert_allclose(synthetic.NOISE_LEVELS, np.logspace(-5, 5, 10))


def test_bad_input():
  with pytest.raises(ValueError, match='dim must be an integer >= 5'):
    synthetic.make_classification(jax.random.key(0), 10, 4, 0.1)
  with pytest.raises(ValueError, match='noise must be >= 0'):
    synthetic.make_classification(jax.random.key(0), 10, 5, -1.0)


def test_2d_version():
  x, y = synthetic.make_classification_2d(jax.random.key(4), 500, 0.0)
  assert x.shape == (500, 2) and set(np.unique(y)) == {-1.0, 1.0}
  np.testing.assert_array_equal(y, jnp.where(synthetic.target_function_2d(x) >= 0, 1.0, -1.0))
  with pytest.raises(ValueError, match='noise must be >= 0'):
    synthetic.make_classification_2d(jax.random.key(0), 10, -1.0)
