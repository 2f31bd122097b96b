"""One feature-map registry (issue 37 item 2): a map registered at run time works in every
``feature_map=`` of the library, bit for bit where it shares a log ψ with a library map."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import attention
from coulomb_jax import features
from coulomb_jax import hamiltonian
from coulomb_jax.attention import pallas
from coulomb_jax.layers import models

COPY = 'elu_copy_for_tests'


@pytest.fixture(scope='module', autouse=True)
def elu_copy():
  features.register(COPY, log_psi=features.get('elu').log_psi, replace=True)
  yield
  features.registry._REGISTRY.pop(COPY, None)   # pylint: disable=protected-access


def _qkv(key=0, b=2, length=12, h=2, d=8):
  kq, kk, kv = jax.random.split(jax.random.key(key), 3)
  shape = (b, length, h, d)
  return (jax.random.normal(kq, shape), 3.0 * jax.random.normal(kk, shape),
          jax.random.normal(kv, shape))


def test_the_registry_lists_and_describes_its_maps():
  assert features.names(positive=True) == features.KERNEL_ATTENTION_MAPS
  assert COPY in features.KERNEL_ATTENTION_MAPS and COPY in features.FEATURE_MAPS
  assert features.names(positive=False) == ('rff', 'taylor')
  assert features.SIGNED_ATTENTION_MAPS == ('taylor',)
  assert features.num_features(COPY, 5) == 5 and features.num_features('hedgehog', 5) == 10
  assert features.num_features('taylor', 7) == 57
  assert features.is_separable(COPY) and not features.is_separable('softmaxfeat')
  x, omega = jax.random.normal(jax.random.key(1), (4, 8)), jax.random.normal(
      jax.random.key(2), (6, 8))
  # φ of a map given by its log ψ alone is exp(log ψ)/√N: elu's value, up to rounding.
  np.testing.assert_allclose(features.get_feature_map(COPY)(x, omega),
                             features.elu(x, omega), rtol=1e-6)


def test_bad_registrations_are_one_line_each():
  with pytest.raises(ValueError, match="'favor' is one of the library's maps"):
    features.register('favor', log_psi=features.get('elu').log_psi)
  with pytest.raises(ValueError, match='registered already'):
    features.register(COPY, log_psi=features.get('elu').log_psi)
  with pytest.raises(ValueError, match='got neither'):
    features.register('nothing_given')
  with pytest.raises(ValueError, match='log_psi must be a function'):
    features.register('not_callable', log_psi=3.0)
  with pytest.raises(ValueError, match=r'must be one of the attention maps .*\(a signed map'):
    features.get('rff', positive=True)
  with pytest.raises(ValueError, match="got 'nope'"):
    models.KernelAttention(num_heads=2, feature_map='nope').init(
        jax.random.key(0), jnp.ones((1, 4, 8)))


@pytest.mark.parametrize('qk_mode', ['shared', 'projected'])
@pytest.mark.parametrize('causal, path, chunk', [(False, 'fused', None), (False, 'fused', 4),
                                                  (True, 'fused', 4),
                                                  (True, 'materialized', None)])
def test_kernel_attention_with_the_copy_is_elu_bit_for_bit(qk_mode, causal, path, chunk):
  x = jax.random.normal(jax.random.key(3), (2, 12, 16))
  mask = jnp.arange(12)[None] < jnp.array([[12], [9]])
  make = lambda name: models.KernelAttention(num_heads=2, num_features=8, feature_map=name,
                                             qk_mode=qk_mode, causal=causal,
                                             causal_path=path, chunk_size=chunk)
  params = make('elu').init(jax.random.key(4), x, mask)
  want = make('elu').apply(params, x, mask)
  got = make(COPY).apply(params, x, mask)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_fused_and_causal_paths_with_the_copy_are_elu_bit_for_bit():
  q, k, v = _qkv()
  omega = jax.random.normal(jax.random.key(5), (2, 8, 8))
  mask = jnp.arange(12)[None] < jnp.array([[12], [7]])
  for fn in (attention.fused_linear_attention, attention.fused_causal_linear_attention,
             attention.materialized_causal_attention):
    kw = dict(key_mask=mask)
    np.testing.assert_array_equal(np.asarray(fn(q, k, v, omega, feature_map=COPY, **kw)),
                                  np.asarray(fn(q, k, v, omega, feature_map='elu', **kw)))


@pytest.mark.slow
def test_the_label_hamiltonian_takes_a_registered_map():
  x = jax.random.normal(jax.random.key(6), (16, 4))
  y = jnp.where(x[:, 0] > 0, 1.0, -1.0)
  omega = jax.random.normal(jax.random.key(7), (8, 4))
  h = lambda name: hamiltonian.hamiltonian(omega, x, y, feature_map=name, lam=0.1, s=1.0)
  np.testing.assert_allclose(h(COPY), h('elu'), rtol=1e-5)
  assert np.all(np.isfinite(jax.grad(lambda w: hamiltonian.hamiltonian(
      w, x, y, feature_map=COPY, lam=0.1, s=1.0))(omega)))


def test_the_kernels_run_only_the_maps_they_know():
  q, k, v = _qkv(length=16, d=16)
  omega = jax.random.normal(jax.random.key(8), (2, 64, 16))
  assert COPY not in pallas.PALLAS_FEATURE_MAPS
  assert not pallas.shape_supported(q.shape, v.shape, omega.shape, COPY)
  assert pallas.shape_supported(q.shape, v.shape, omega.shape, 'elu')
  with pytest.raises(ValueError, match=f'feature_map must be one of .*got {COPY!r}'):
    attention.fused_linear_attention(q, k, v, omega, feature_map=COPY,
                                     implementation='pallas')
  # 'auto' lowered for a GPU takes the XLA path for the new map (no Triton call), where
  # elu itself takes the kernel (test_lowering's helper: an abstract H200 on jax 0.11).
  from test_lowering import _lower  # pylint: disable=g-import-not-at-top
  lowered = lambda name: _lower(lambda q, om: attention.fused_linear_attention(
      q, q, q, om, feature_map=name), q, omega, platform='cuda')
  assert 'triton' in lowered('elu')
  assert 'triton' not in lowered(COPY)


@pytest.mark.slow
def test_the_mimicry_hamiltonian_and_the_drop_in_take_the_copy_bit_for_bit():
  from coulomb_jax.layers import flax_attention  # pylint: disable=g-import-not-at-top
  from coulomb_jax import mimicry  # pylint: disable=g-import-not-at-top
  assert COPY in mimicry.MIMICRY_FEATURE_MAPS
  q, k, v = _qkv()
  q, k = jnp.moveaxis(q, 2, 0), jnp.moveaxis(k, 2, 0)       # [H, B, L, d]
  omega = jax.random.normal(jax.random.key(9), (8, 8))
  for target in mimicry.TARGETS:
    h = lambda name: mimicry.mimicry_hamiltonian(omega, q[0], k[0], feature_map=name, lam=0.1,
                                                 s=1.0, softening=0.5, target=target)
    np.testing.assert_array_equal(np.asarray(h(COPY)), np.asarray(h('elu')))
    g = lambda name: jax.grad(lambda w: mimicry.mimicry_hamiltonian(
        w, q[0], k[0], feature_map=name, lam=0.1, s=1.0, softening=0.5, target=target))(omega)
    np.testing.assert_array_equal(np.asarray(g(COPY)), np.asarray(g('elu')))
  omegas = jax.random.normal(jax.random.key(10), (2, 8, 8))
  q, k = jnp.moveaxis(q, 0, 2), jnp.moveaxis(k, 0, 2)
  out = lambda name: flax_attention.kernel_attention_fn(omegas, name)(q, k, v)
  np.testing.assert_array_equal(np.asarray(out(COPY)), np.asarray(out('elu')))
