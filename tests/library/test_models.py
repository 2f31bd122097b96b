"""Tests of coulomb_jax.layers.models.KernelAttention."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from coulomb_jax.layers import models

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


@pytest.mark.parametrize('name', ['favor', 'elu', 'softmaxfeat', 'porf_softplus', 'hedgehog'])
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


@pytest.mark.slow
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
  with pytest.raises(ValueError, match=r"feature_map must be one of .*'hedgehog'.*\), got 'exp'"):
    models.KernelAttention(num_heads=H, feature_map='exp').init(jax.random.key(0), _x())


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


# ----------------------------------------------------------------------------- encoder

VOCAB = 50


def _tokens(lengths, length, key=3):
  ids = jax.random.randint(jax.random.key(key), (len(lengths), length), 1, VOCAB)
  mask = jnp.arange(length)[None] < jnp.asarray(lengths)[:, None]
  ids = jnp.where(mask, ids, 0)
  return ids, jnp.zeros_like(ids), mask


ENCODERS = {
    'kernel-favor': dict(attention='kernel', feature_map='favor'),
    'performer': dict(attention='kernel', feature_map='favor', qk_mode='projected',
                      orthogonal=True),
    'softmax': dict(attention='softmax'),
    'linformer': dict(attention='linformer', linformer_length=8),
}


def _encoder(**kw):
  return models.EncoderClassifier(vocab_size=VOCAB, max_length=32, width=16, num_heads=2,
                                  ffn_dim=32, num_features=8, **kw)


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(ENCODERS))
def test_encoder_padding_changes_neither_logits_nor_gradients(name):
  model = _encoder(**ENCODERS[name])
  ids, seg, mask = _tokens([12, 5, 1], 12)
  params = model.init(jax.random.key(0), ids, seg, mask)['params']
  pad = lambda a: jnp.pad(a, ((0, 0), (0, 20)))

  def loss(p, ids, seg, mask):
    return jnp.sum(model.apply({'params': p}, ids, seg, mask) ** 2)

  grad_fn = jax.jit(jax.value_and_grad(loss))
  short, g_short = grad_fn(params, ids, seg, mask)
  long_, g_long = grad_fn(params, pad(ids), pad(seg), pad(mask))
  np.testing.assert_allclose(long_, short, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g_short), jax.tree.leaves(g_long)):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_encoder_has_particles_only_for_kernel_attention():
  ids, seg, mask = _tokens([4, 2], 8)
  for name, kw in ENCODERS.items():
    params = jax.eval_shape(_encoder(**kw).init, jax.random.key(0), ids, seg, mask)['params']
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    has = any('particles' in jax.tree_util.keystr(p) for p, _ in leaves)
    assert has == (kw['attention'] == 'kernel'), name


@pytest.mark.slow
def test_encoder_bf16_inputs_stay_finite_and_fully_padded_rows_are_zero_safe():
  model = _encoder(attention='kernel', feature_map='favor')
  ids, seg, mask = _tokens([6, 0], 8)      # the second row is all padding
  params = model.init(jax.random.key(0), ids, seg, mask)['params']
  bf16 = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
  apply = jax.jit(model.apply)
  for p in (params, bf16):
    logits = apply({'params': p}, ids, seg, mask)
    assert logits.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(logits)))


def test_encoder_rejects_too_long_input_and_unknown_attention():
  ids, seg, mask = _tokens([40], 40)
  with pytest.raises(ValueError, match='max_length'):
    _encoder().init(jax.random.key(0), ids, seg, mask)
  ids, seg, mask = _tokens([4], 4)
  with pytest.raises(ValueError, match="attention must be one of"):
    _encoder(attention='bogus').init(jax.random.key(0), ids, seg, mask)


@pytest.mark.parametrize('name', ['favor', 'softmaxfeat', 'hedgehog'])
def test_chunked_module_equals_the_materialised_one(name):
  x = _x(length=13)
  mask = jnp.arange(13)[None] < jnp.array([13, 6])[:, None]
  plain = models.KernelAttention(num_heads=H, num_features=M, feature_map=name)
  fused = models.KernelAttention(num_heads=H, num_features=M, feature_map=name, chunk_size=4)
  params = plain.init(jax.random.key(0), x, mask)
  keep = mask[..., None]
  np.testing.assert_allclose(jnp.where(keep, fused.apply(params, x, mask), 0),
                             jnp.where(keep, plain.apply(params, x, mask), 0), atol=1e-5)


def test_init_radius_projects_the_initial_particles():
  x = _x()
  params = models.KernelAttention(num_heads=H, num_features=M, init_radius=1.5).init(
      jax.random.key(0), x)['params']
  norms = jnp.linalg.norm(params['particles'], axis=-1)
  assert float(jnp.max(norms)) <= 1.5 + 1e-5
  assert float(jnp.mean(norms > 1.499)) > 0.5       # most N(0, I) rows in 4-d lie outside


class ModelVariantsTest(chex.TestCase):
  """KernelAttention's apply with and without jit, float32 and under jax_enable_x64."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_kernel_attention_float32_and_x64(self):
    mask = jnp.arange(L)[None] < jnp.array([L, 4])[:, None]
    for x64 in (False, True):
      with jax.enable_x64(x64):
        x = _x().astype(jnp.float64 if x64 else jnp.float32)
        module = models.KernelAttention(num_heads=H, feature_map='softmaxfeat', num_features=M)
        params = jax.jit(module.init)(jax.random.key(0), x, mask)
        out = self.variant(module.apply)(params, x, mask)
        chex.assert_shape(out, x.shape)
        chex.assert_type(out, x.dtype)
        assert np.all(np.isfinite(out))


def test_encoder_under_x64():
  ids, seg, mask = _tokens([7, 3], 8)
  with jax.enable_x64(True):
    model = _encoder(attention='kernel', feature_map='porf_softplus', num_layers=1)
    params = jax.jit(model.init)(jax.random.key(0), ids, seg, mask)
    logits = jax.jit(model.apply)(params, ids, seg, mask)
    chex.assert_shape(logits, (2, 2))
    chex.assert_type(logits, jnp.float32)
    grads = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, ids, seg, mask))))(params)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
