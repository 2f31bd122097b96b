"""The kernel layers as drop-ins for flax attention (issue 38, items 2-3).

``flax_attention.kernel_attention_fn(omega, causal=True)`` inside
``nn.MultiHeadDotProductAttention`` honours flax's causal masks exactly and equals
``KernelAttention(causal=True, qk_mode='projected')`` with the same projections; a mask it
cannot honour raises the one line ``MASK_ERROR``, eagerly and under jit, never NaN.
``KernelAttention`` takes flax masks ``[B, 1, L, L]`` and ``inputs_kv``; ``particles_param``
makes the particles the optimisers find inside a user's module.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import training
from coulomb_jax.layers import flax_attention
from coulomb_jax.layers import models

B, L, H, DH, M = 2, 10, 2, 4, 8
E = H * DH


def _x(key=0, length=L):
  return jax.random.normal(jax.random.key(key), (B, length, E))


def _padding():
  return jnp.ones((B, L), bool).at[1, 7:].set(False)


def _causal_mask(pad):
  return nn.combine_masks(nn.make_causal_mask(jnp.ones((B, L))), nn.make_attention_mask(pad, pad))


def _omega():
  return jax.random.normal(jax.random.key(5), (H, M, DH))


def _mha(fn):
  return nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=fn)


def _kernel_params(mha_params, omega):
  """KernelAttention(qk_mode='projected')'s parameters from an MHA's and the particles."""
  p = dict(mha_params['params'])
  return {'params': {'particles': omega, 'query': p['query'], 'key': p['key'],
                     'value': p['value'], 'out': p['out']}}


@pytest.mark.parametrize('causal_path', flax_attention.CAUSAL_PATHS)
@pytest.mark.parametrize('name', ('favor', 'hedgehog'))
def test_causal_attention_fn_equals_kernel_attention_causal(name, causal_path):
  omega, x, pad = _omega(), _x(), _padding()
  mha = _mha(flax_attention.kernel_attention_fn(omega, name, causal=True,
                                                causal_path=causal_path, chunk_size=4))
  params = mha.init(jax.random.key(1), x, mask=_causal_mask(pad))
  module = models.KernelAttention(num_heads=H, feature_map=name, num_features=M,
                                  qk_mode='projected', causal=True, causal_path=causal_path,
                                  chunk_size=4)
  ours = jax.jit(lambda x: mha.apply(params, x, mask=_causal_mask(pad)))(x)
  theirs = module.apply(_kernel_params(params, omega), x, pad)
  real = np.asarray(pad)
  np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(theirs)[real],
                             rtol=1e-5, atol=1e-6)
  # The eager call, and the same layer under a causal mask with no padding.
  full = jnp.ones((B, L), bool)
  np.testing.assert_allclose(mha.apply(params, x, mask=_causal_mask(full)),
                             module.apply(_kernel_params(params, omega), x, full),
                             rtol=1e-5, atol=1e-6)
  # A padding mask alone is made causal by the flag.
  np.testing.assert_allclose(
      np.asarray(mha.apply(params, x, mask=nn.make_attention_mask(pad, pad)))[real],
      np.asarray(ours)[real], rtol=1e-5, atol=1e-6)


def test_causal_attention_fn_never_reads_later_tokens_at_any_scale():
  omega, x = _omega(), _x()
  mha = _mha(flax_attention.kernel_attention_fn(omega, 'favor', causal=True, chunk_size=3))
  mask = _causal_mask(jnp.ones((B, L), bool))
  params = mha.init(jax.random.key(1), x, mask=mask)
  run = jax.jit(lambda x: mha.apply(params, x, mask=mask))
  base = np.asarray(run(x))
  t = 4
  for norm in (1.0, 8.0, 40.0):
    later = norm * _x(key=int(norm) + 10)
    after = np.asarray(run(jnp.where((jnp.arange(L) > t)[None, :, None], later, x)))
    np.testing.assert_allclose(after[:, :t + 1], base[:, :t + 1], rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(after))


def test_a_causal_mask_without_causal_true_is_one_line_eagerly_and_under_jit():
  omega, x = _omega(), _x()
  mha = _mha(flax_attention.kernel_attention_fn(omega, 'favor'))
  mask = _causal_mask(jnp.ones((B, L), bool))
  params = mha.init(jax.random.key(1), x)           # no mask at init: init succeeds
  with pytest.raises(ValueError, match='pass causal=True') as info:
    mha.apply(params, x, mask=mask)
  assert str(info.value) == flax_attention.MASK_ERROR
  run = jax.jit(lambda x, m: mha.apply(params, x, mask=m))
  with pytest.raises(Exception, match='pass causal=True'):   # raised by the host callback
    jax.block_until_ready(run(x, mask))
  # The same program with a padding mask runs, finite.
  pad = _padding()
  assert np.all(np.isfinite(np.asarray(run(x, nn.make_attention_mask(pad, pad)))))
  # A per-head pattern is refused with causal=True too.
  per_head = jnp.ones((B, H, L, L), bool).at[:, 0, 2, 3].set(False)
  causal = _mha(flax_attention.kernel_attention_fn(omega, 'favor', causal=True))
  with pytest.raises(ValueError, match='got another pattern'):
    causal.apply(params, x, mask=per_head)


def test_kernel_attention_takes_flax_masks_and_refuses_a_causal_one_when_not_causal():
  x, pad = _x(), _padding()
  real = np.asarray(pad)
  for causal in (False, True):
    module = models.KernelAttention(num_heads=H, num_features=M, qk_mode='projected',
                                    causal=causal, chunk_size=4)
    params = module.init(jax.random.key(2), x, pad)
    flax_mask = _causal_mask(pad) if causal else nn.make_attention_mask(pad, pad)
    np.testing.assert_allclose(np.asarray(module.apply(params, x, flax_mask))[real],
                               np.asarray(module.apply(params, x, pad))[real],
                               rtol=1e-6, atol=1e-6)
  module = models.KernelAttention(num_heads=H, num_features=M, qk_mode='projected')
  params = module.init(jax.random.key(2), x)
  with pytest.raises(ValueError, match='pass causal=True'):
    module.apply(params, x, _causal_mask(pad))


@pytest.mark.parametrize('qk_mode', models.QK_MODES)
def test_cross_attention_with_inputs_kv(qk_mode):
  x, y = _x(), _x(key=3, length=7)
  kv_pad = jnp.ones((B, 7), bool).at[0, 5:].set(False)
  module = models.KernelAttention(num_heads=H, num_features=M, qk_mode=qk_mode)
  params = module.init(jax.random.key(2), x, kv_pad, inputs_kv=y)
  out = jax.jit(lambda x, y: module.apply(params, x, kv_pad, inputs_kv=y))(x, y)
  assert out.shape == x.shape and np.all(np.isfinite(np.asarray(out)))
  # Padded keys and values change nothing; the flax-style mask gives the same outputs.
  y2 = y.at[0, 5:].set(1e3)
  np.testing.assert_allclose(module.apply(params, x, kv_pad, inputs_kv=y2), out,
                             rtol=1e-5, atol=1e-6)
  flax_mask = nn.make_attention_mask(jnp.ones((B, L), bool), kv_pad)
  np.testing.assert_allclose(module.apply(params, x, flax_mask, inputs_kv=y), out,
                             rtol=1e-5, atol=1e-6)
  if qk_mode == 'projected':    # the same as kernel_attention_fn in flax's cross-attention
    omega = params['params']['particles']
    mha = _mha(flax_attention.kernel_attention_fn(omega))
    mha_params = {'params': {n: params['params'][n] for n in ('query', 'key', 'value', 'out')}}
    np.testing.assert_allclose(mha.apply(mha_params, x, y, mask=flax_mask), out,
                               rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match='cross-attention is not causal'):
    models.KernelAttention(num_heads=H, num_features=M, causal=True).init(
        jax.random.key(2), x, inputs_kv=y)


class _OwnBlock(nn.Module):
  """A user's block: its own projections, the library's particles and attention_fn."""

  @nn.compact
  def __call__(self, x):
    omega = models.particles_param(self, H, M, DH, orthogonal=True)
    fn = flax_attention.kernel_attention_fn(omega, 'favor', causal=True)
    mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
    return nn.Dense(2)(jnp.mean(
        nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=fn)(x, mask=mask), axis=1))


@pytest.mark.slow
def test_particles_param_in_a_users_module_is_what_the_optimisers_move():
  model, x = _OwnBlock(), _x()
  params = model.init(jax.random.key(0), x)['params']
  assert params['particles'].shape == (H, M, DH)
  labels = training.partition_labels(params)
  assert labels['particles'] == 'particles'
  assert all(v == 'rest' for v in jax.tree_util.tree_leaves(
      {k: v for k, v in labels.items() if k != 'particles'}))
  grads = jax.grad(lambda p: jnp.sum(model.apply({'params': p}, x) ** 2))(params)
  assert float(jnp.sum(jnp.abs(grads['particles']))) > 0
  phase_a = training.phase_a_optimizer(jax.random.key(1), step_size=0.1, beta=float('inf'),
                                       radius=10.0, clip_norm=1.0)
  phase_b = training.phase_b_optimizer(learning_rate=0.1, warmup_steps=0, total_steps=10,
                                       weight_decay=0.0, clip_norm=1.0)
  for opt, moved in ((phase_a, True), (phase_b, False)):
    updates, _ = opt.update(grads, opt.init(params), params)
    flat = {k: float(jnp.max(jnp.abs(v))) for k, v in
            jax.tree_util.tree_flatten_with_path(updates)[0]}
    for path, size in flat.items():
      is_particles = jax.tree_util.keystr(path).endswith("['particles']")
      assert (size > 0) == (is_particles == moved), (path, size)
  with pytest.raises(ValueError, match='num_features must be'):
    class _Bad(nn.Module):
      @nn.compact
      def __call__(self, x):
        return models.particles_param(self, H, 0, DH)
    _Bad().init(jax.random.key(0), x)


@pytest.mark.parametrize('platform', ('cuda', 'tpu'))
def test_the_drop_in_with_a_traced_mask_lowers_for_accelerators(platform):
  """Lowered from this CPU for cuda and tpu (nothing compiled) with ``mask_check='nan'``:
  a host callback lowers only for the host's platform. A mask it cannot honour then
  gives NaN, not a wrong number."""
  omega, x = _omega(), _x()
  mha = _mha(flax_attention.kernel_attention_fn(omega, 'favor', causal=True,
                                                mask_check='nan'))
  mask = _causal_mask(_padding())
  params = mha.init(jax.random.key(1), x, mask=mask)
  f = lambda p, x, m: mha.apply(p, x, mask=m)
  text = jax.jit(f).trace(params, x, mask).lower(lowering_platforms=(platform,)).as_text()
  assert 'func.func public @main' in text
  bad = jnp.ones((B, H, L, L), bool).at[:, 0, 2, 3].set(False)
  assert np.all(np.isnan(np.asarray(jax.jit(f)(params, x, bad))))
  assert np.all(np.isfinite(np.asarray(jax.jit(f)(params, x, mask))))
  with pytest.raises(ValueError, match="mask_check must be one of"):
    flax_attention.kernel_attention_fn(omega, mask_check='warn')
