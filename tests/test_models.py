"""Tests of coulomb_jax.models.KernelAttention."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from coulomb_jax import models

B, L, E, H, M = 2, 9, 8, 2, 16


def _x(key=0, length=L):
  return jax.random.normal(jax.random.key(key), (B, length, E))


def test_shared_mode_has_no_query_key_projections():
  module = models.KernelAttention(num_heads=H, num_features=M, qk_mode='shared')
  params = module.init(jax.random.key(0), _x())['params']
  assert set(params) == {'particles', 'value', 'out'}
  assert params['particles'].shape == (H, M, E // H)
  projected = models.KernelAttention(num_heads=H, num_features=M, qk_mode='projected')
  assert set(projected.init(jax.random.key(0), _x())['params']) == {
      'particles', 'query', 'key', 'value', 'out'}


@pytest.mark.parametrize('name', ['favor', 'elu', 'softmaxfeat', 'porf_softplus'])
@pytest.mark.parametrize('causal', [False, True])
def test_padding_changes_nothing_and_output_is_finite(name, causal):
  module = models.KernelAttention(num_heads=H, feature_map=name, num_features=M,
                                  causal=causal)
  x = _x()
  params = module.init(jax.random.key(0), x)
  pad = jnp.concatenate([x, 50.0 * _x(1, length=4)], axis=1)   # large padding values
  mask = jnp.arange(L + 4)[None, :] < L
  mask = jnp.broadcast_to(mask, (B, L + 4))
  out = module.apply(params, x)
  out_pad = module.apply(params, pad, mask)[:, :L]
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out_pad, out, rtol=1e-4, atol=1e-5)
  out16 = module.apply(params, (10.0 * x).astype(jnp.bfloat16))
  assert not np.any(np.isnan(np.asarray(out16, np.float32)))


def test_particles_are_selectable_by_optax_labels():
  module = models.KernelAttention(num_heads=H, num_features=M, qk_mode='projected')
  params = module.init(jax.random.key(0), _x())['params']
  labels = jax.tree_util.tree_map_with_path(
      lambda path, _: 'particles' if path[-1].key == 'particles' else 'rest', params)
  tx = optax.partition({'particles': optax.set_to_zero(), 'rest': optax.sgd(0.1)}, labels)
  grads = jax.grad(lambda p: jnp.sum(module.apply({'params': p}, _x()) ** 2))(params)
  updates, _ = tx.update(grads, tx.init(params), params)
  new = optax.apply_updates(params, updates)
  np.testing.assert_array_equal(new['particles'], params['particles'])   # frozen
  assert not np.allclose(new['value']['kernel'], params['value']['kernel'])


def test_bad_configuration():
  with pytest.raises(ValueError, match="qk_mode must be one of"):
    models.KernelAttention(num_heads=H, qk_mode='tied').init(jax.random.key(0), _x())
  with pytest.raises(ValueError, match='not divisible by num_heads=3'):
    models.KernelAttention(num_heads=3).init(jax.random.key(0), _x())
  with pytest.raises(ValueError, match="'rff' is not non-negative"):
    models.KernelAttention(num_heads=H, feature_map='rff').init(jax.random.key(0), _x())


def test_padded_keys_do_not_set_the_favor_stabiliser():
  """Real tokens of large norm (favor exponents ≈ −100) next to zero padding (exponent 0):
  a stabiliser that saw the padding would underflow every real key feature."""
  module = models.KernelAttention(num_heads=H, num_features=M)
  x = 10.0 * _x()
  params = module.init(jax.random.key(0), x)
  pad = jnp.concatenate([x, jnp.zeros((B, 4, E))], axis=1)
  mask = jnp.broadcast_to(jnp.arange(L + 4)[None, :] < L, (B, L + 4))
  out = module.apply(params, x)
  assert np.all(np.isfinite(out)) and float(jnp.max(jnp.abs(out))) > 0
  np.testing.assert_allclose(module.apply(params, pad, mask)[:, :L], out, rtol=1e-4,
                             atol=1e-5)
