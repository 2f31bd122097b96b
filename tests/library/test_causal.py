"""Causal means causal at any input scale: no output at t depends on a token after t.

Every causal path, every map: the tokens after t are redrawn at norm 1, 8 and 40 and the
outputs up to t must stay the same (relative 1e-5; in practice bit-identical), and the
gradient of the outputs up to t with respect to the later inputs must be exactly 0.
Paths: the fused XLA path (chunks that do and do not divide L), the materialised path with
per-token shifts, the Pallas kernel (interpreted; its maps), ``KernelAttention(causal=True)``
on both ``causal_path``s and ``lm.CausalLM`` (kernel attention on both paths, and softmax).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import attention
from coulomb_jax import features
from coulomb_jax.attention import pallas
from coulomb_jax.layers import lm
from coulomb_jax.layers import models

B, L, H, D, DV, M = 2, 12, 2, 8, 4, 16
CUTS = (3, 5)            # outputs at positions <= t are compared: 3 ends a chunk of 4,
                         # 5 is inside one (chunks of 4 and of 5)
LATER_NORMS = (1.0, 8.0, 40.0)


def _unit(key, shape):
  x = jax.random.normal(key, shape)
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _inputs():
  kq, kk, kv, kw = jax.random.split(jax.random.key(36), 4)
  mask = jnp.ones((B, L), bool).at[1, 10:].set(False)
  return (_unit(kq, (B, L, H, D)), _unit(kk, (B, L, H, D)),
          jax.random.normal(kv, (B, L, H, DV)), jax.random.normal(kw, (H, M, D)), mask)


def _later(x, t, norm, key):
  """``x`` with positions after ``t`` redrawn at ``norm`` (random directions)."""
  new = norm * _unit(key, x.shape)
  return jnp.where((jnp.arange(L) > t)[None, :, None, None], new, x)


def _paths(name):
  out = {
      'fused_c4': functools.partial(attention.fused_causal_linear_attention, chunk_size=4),
      'fused_c5': functools.partial(attention.fused_causal_linear_attention, chunk_size=5),
      'materialized': attention.materialized_causal_attention,
  }
  if name in pallas.PALLAS_FEATURE_MAPS:
    out['pallas'] = functools.partial(pallas.pallas_causal_linear_attention,
                                      chunk_size=4, block_f=16, interpret=True)
  return out


def _assert_prefix_equal(before, after, t, what):
  a, b = np.asarray(before)[:, :t + 1], np.asarray(after)[:, :t + 1]
  scale = max(float(np.max(np.abs(a))), 1e-30)
  err = float(np.max(np.abs(a - b))) / scale
  assert err <= 1e-5, (what, err)


@pytest.mark.parametrize('name', features.KERNEL_ATTENTION_MAPS)
def test_attention_paths_never_read_later_tokens(name):
  q, k, v, omega, mask = _inputs()
  for path, fn in _paths(name).items():
    run = jax.jit(lambda q, k, v, fn=fn: fn(q, k, v, omega, feature_map=name, key_mask=mask))
    base = run(q, k, v)
    assert np.all(np.isfinite(np.asarray(base))), path
    for t in CUTS:
      for i, norm in enumerate(LATER_NORMS):
        keys = jax.random.split(jax.random.fold_in(jax.random.key(7), 10 * t + i), 3)
        after = run(_later(q, t, norm, keys[0]), _later(k, t, norm, keys[1]),
                    _later(v, t, norm, keys[2]))
        _assert_prefix_equal(base, after, t, (path, t, norm))


@pytest.mark.parametrize('name', features.KERNEL_ATTENTION_MAPS)
def test_gradients_of_the_past_ignore_later_tokens(name):
  """d(outputs ≤ t)/d(inputs > t) = 0 exactly (the Pallas kernel's gradient is the fused
  XLA path's), at later norms 8 and 40."""
  q, k, v, omega, mask = _inputs()
  t = 5
  w = jax.random.normal(jax.random.key(3), (B, L, H, DV)) * (jnp.arange(L) <= t)[None, :, None, None]
  for path, fn in _paths(name).items():
    # One compilation per path serves both norms.
    loss = lambda q, k, v, fn=fn: jnp.sum(w * fn(q, k, v, omega, feature_map=name,
                                                 key_mask=mask))
    grad_fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    for norm in (8.0, 40.0):
      keys = jax.random.split(jax.random.key(int(norm)), 2)
      qs, ks = _later(q, t, norm, keys[0]), _later(k, t, norm, keys[1])
      grads = grad_fn(qs, ks, v)
      for g in grads:
        g = np.asarray(g)
        assert np.all(np.isfinite(g)), (path, norm)
        assert np.all(g[:, t + 1:] == 0.0), (path, norm, np.max(np.abs(g[:, t + 1:])))


@pytest.mark.parametrize('causal_path', models.CAUSAL_PATHS)
@pytest.mark.parametrize('name', ('favor', 'hedgehog', 'softmaxfeat', 'elu'))
def test_kernel_attention_module_is_causal(name, causal_path):
  x = jax.random.normal(jax.random.key(1), (B, L, H * D))
  mask = jnp.ones((B, L), bool)
  module = models.KernelAttention(num_heads=H, feature_map=name, num_features=M,
                                  qk_mode='projected', causal=True, causal_path=causal_path,
                                  chunk_size=4)
  params = module.init(jax.random.key(2), x, mask)
  run = jax.jit(lambda x: module.apply(params, x, mask))
  base = run(x)
  for t in CUTS:
    for norm in LATER_NORMS:
      later = norm * _unit(jax.random.key(t), x.shape) * np.sqrt(H * D)
      after = run(jnp.where((jnp.arange(L) > t)[None, :, None], later, x))
      _assert_prefix_equal(base, after, t, (causal_path, t, norm))


@pytest.mark.parametrize('config', [('kernel', 'favor', 'materialized'),
                                    ('kernel', 'hedgehog', 'materialized'),
                                    ('kernel', 'favor', 'fused'),
                                    ('kernel', 'hedgehog', 'fused'),
                                    ('softmax', 'favor', 'fused')])
def test_causal_lm_logits_never_read_later_tokens(config):
  """Later tokens are ids whose embedding rows are scaled by 1, 8 and 40."""
  attention_kind, name, causal_path = config
  vocab = 32
  model = lm.CausalLM(vocab_size=vocab, max_len=L, width=16, num_layers=2, num_heads=2,
                      attention=attention_kind, feature_map=name, num_features=8,
                      causal_path=causal_path, chunk_size=4)
  tokens = jax.random.randint(jax.random.key(4), (B, L), 1, vocab // 2)
  params = model.init(jax.random.key(5), tokens)['params']
  run = jax.jit(lambda p, x: model.apply({'params': p}, x))
  base = run(params, tokens)
  for t in CUTS:
    for norm in LATER_NORMS:
      scaled = dict(params)
      table = params['embed']['embedding']
      scaled['embed'] = {'embedding': table.at[vocab // 2:].multiply(norm)}
      later = jax.random.randint(jax.random.key(t), (B, L), vocab // 2, vocab)
      ids = jnp.where(jnp.arange(L)[None] > t, later, tokens)
      _assert_prefix_equal(run(scaled, tokens), run(scaled, ids), t, (config, t, norm))
  assert np.all(np.isfinite(np.asarray(base)))
