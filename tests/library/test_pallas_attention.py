"""Tests of coulomb_jax.attention.pallas: interpret mode on CPU, the kernels on a GPU.

The kernels are checked against the XLA path (``fused_linear_attention(...,
implementation='xla')``, itself checked against the explicit O(L²) form in
test_attention.py) with a sequence length that is not a multiple of any
block, several key splits and feature blocks, and a padded batch row. Both sides run
at ``precision='highest'`` (``HIGHEST``), so the tolerances hold on a GPU too, where the
default float32 product is TF32.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import attention
from coulomb_jax.attention import pallas as pa
from coulomb_jax.attention.pallas import bidirectional
from coulomb_jax.attention.pallas import causal
from coulomb_jax.attention.pallas import tpu

B, L, H, DIM, D, M = 2, 45, 2, 16, 16, 32   # Sides ≥ 16: Triton's smallest dot.
HIGHEST = jax.lax.Precision.HIGHEST
BLOCKS = dict(block_q=16, block_k=16, block_f=16, num_splits=2, precision='highest')
ON_GPU = jax.default_backend() == 'gpu'


def _inputs(key, length=L, scale=0.5):
  kq, kk, kv, ko = jax.random.split(key, 4)
  q = scale * jax.random.normal(kq, (B, length, H, DIM))
  k = scale * jax.random.normal(kk, (B, length, H, DIM))
  v = jax.random.normal(kv, (B, length, H, D))
  omega = jax.random.normal(ko, (H, M, DIM))
  mask = jnp.arange(length)[None, :] < jnp.array([[length], [length - 17]])
  return q, k, v, omega, mask


def _xla(q, k, v, omega, mask, name):
  return attention.fused_linear_attention(q, k, v, omega, feature_map=name, key_mask=mask,
                                          chunk_size=16, implementation='xla',
                                          precision='highest')


@pytest.mark.slow
@pytest.mark.parametrize('name', pa.PALLAS_FEATURE_MAPS)
def test_kernels_equal_xla_path(name):
  q, k, v, omega, mask = _inputs(jax.random.key(0))
  out = pa.pallas_linear_attention(q, k, v, omega, feature_map=name, key_mask=mask, **BLOCKS)
  np.testing.assert_allclose(out, _xla(q, k, v, omega, mask, name), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize('name', ['favor', 'softmaxfeat'])
def test_large_logits_stay_finite_and_exact(name):
  # Exponents up to ~±60: exp overflows float32 without the shifts; the splits'
  # online maxima differ, so the combination across splits is exercised (favor),
  # and the keys' log-sum-exp runs over two particle blocks (softmaxfeat).
  q, k, v, omega, mask = _inputs(jax.random.key(1), scale=3.0)
  out = pa.pallas_linear_attention(q, k, v, omega, feature_map=name, key_mask=mask, **BLOCKS)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, _xla(q, k, v, omega, mask, name), rtol=1e-4, atol=1e-5)


def test_padding_changes_nothing_and_nan_padding_is_not_read():
  q, k, v, omega, _ = _inputs(jax.random.key(2))
  mask = jnp.ones((B, L), bool)
  ref = pa.pallas_linear_attention(q, k, v, omega, key_mask=mask, **BLOCKS)
  extra = 7
  pad = lambda a, value: jnp.concatenate(
      [a, jnp.full((B, extra) + a.shape[2:], value, a.dtype)], axis=1)
  out = pa.pallas_linear_attention(pad(q, 0.0), pad(k, 3.0), pad(v, jnp.nan), omega,
                                   key_mask=pad(mask, False), **BLOCKS)
  np.testing.assert_allclose(out[:, :L], ref, rtol=1e-5, atol=1e-6)


def test_a_row_without_real_keys_gives_zeros():
  q, k, v, omega, _ = _inputs(jax.random.key(3))
  mask = jnp.arange(L)[None, :] < jnp.array([[L], [0]])
  out = pa.pallas_linear_attention(q, k, v, omega, key_mask=mask, **BLOCKS)
  assert np.all(np.isfinite(out))
  np.testing.assert_array_equal(out[1], 0.0)


def test_gradients_are_the_xla_paths():
  q, k, v, omega, mask = _inputs(jax.random.key(4))
  w = jax.random.normal(jax.random.key(5), (B, L, H, D))
  loss = lambda fn: lambda *a: jnp.sum(w * fn(*a))
  pallas = functools.partial(pa.pallas_linear_attention, feature_map='favor', key_mask=mask,
                             **BLOCKS)
  xla = lambda *a: attention.fused_linear_attention(*a, key_mask=mask, implementation='xla',
                                                    precision=HIGHEST)
  got = jax.grad(loss(pallas), argnums=(0, 1, 2, 3))(q, k, v, omega)
  want = jax.grad(loss(xla), argnums=(0, 1, 2, 3))(q, k, v, omega)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-7)


def test_bf16_inputs_no_nan():
  q, k, v, omega, mask = _inputs(jax.random.key(6), scale=2.0)
  bf = lambda a: a.astype(jnp.bfloat16)
  out = pa.pallas_linear_attention(bf(q), bf(k), bf(v), omega, key_mask=mask, **BLOCKS)
  assert out.dtype == jnp.bfloat16
  assert not np.any(np.isnan(np.asarray(out, np.float32)))
  # Against float32 on the same (bf16-rounded) inputs: what is left is the kernels' bf16.
  f32 = lambda a: bf(a).astype(jnp.float32)
  ref = _xla(f32(q), f32(k), f32(v), omega, mask, 'favor')
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=0.05, atol=0.05)


def test_fused_linear_attention_dispatch():
  q, k, v, omega, mask = _inputs(jax.random.key(7))
  ref = _xla(q, k, v, omega, mask, 'elu')
  via = attention.fused_linear_attention(q, k, v, omega, feature_map='elu', key_mask=mask,
                                         implementation='pallas', precision='highest')
  np.testing.assert_allclose(via, ref, rtol=2e-5, atol=2e-6)
  auto = attention.fused_linear_attention(q, k, v, omega, feature_map='elu', key_mask=mask,
                                          chunk_size=16, precision='highest')
  if ON_GPU:
    np.testing.assert_allclose(auto, ref, rtol=2e-5, atol=2e-6)
  else:
    np.testing.assert_array_equal(auto, ref)  # 'auto' on a CPU is the XLA path itself.
  with pytest.raises(ValueError, match="implementation.*'triton'"):
    attention.fused_linear_attention(q, k, v, omega, implementation='triton')


def test_use_by_default():
  x, v = jnp.zeros((B, 32, H, 16)), jnp.zeros((B, 32, H, 16))
  omega = jnp.zeros((H, 64, 16))
  # Not interpreted: only on a one-device GPU, where the kernels must compile.
  assert pa.use_by_default(x, x, v, omega, 'favor') == (ON_GPU and jax.device_count() == 1)
  assert pa.use_by_default(x, x, v, omega, 'favor', interpret=True)
  assert not pa.use_by_default(x, x, v, omega, 'rff', interpret=True)
  assert not pa.use_by_default(x, x, v, omega[:, :32], 'favor', interpret=True)   # M = 32
  assert not pa.use_by_default(x[..., :8], x[..., :8], v, omega[..., :8], 'favor',
                               interpret=True)                                  # d = 8
  seen = []   # Under a trace (the way fused_linear_attention calls it): tracers in.
  jax.eval_shape(lambda a: seen.append(pa.use_by_default(a, a, v, omega, 'elu',
                                                         interpret=True)) or a, x)
  assert seen == [True]


def test_use_by_default_falls_back_when_compiling_fails(monkeypatch):
  def broken(*args, **kwargs):
    raise NotImplementedError('no lowering for this op')
  monkeypatch.setattr(bidirectional, 'pallas_linear_attention', broken)
  bidirectional._compiles.cache_clear()
  x, v, omega = jnp.zeros((1, 16, 1, 16)), jnp.zeros((1, 16, 1, 32)), jnp.zeros((1, 64, 16))
  assert not pa.use_by_default(x, x, v, omega, 'cos2', interpret=True)
  bidirectional._compiles.cache_clear()


@pytest.mark.parametrize('kwargs, match', [
    (dict(feature_map='rff'), 'feature_map'),
    (dict(block_q=24), 'block_q must be a power of two'),
    (dict(block_f=64), 'block_f must divide'),
    (dict(num_splits=0), 'num_splits'),
    (dict(key_mask=jnp.ones((B, L + 1), bool)), 'key_mask'),
])
def test_bad_input(kwargs, match):
  q, k, v, omega, _ = _inputs(jax.random.key(9))
  with pytest.raises(ValueError, match=match):
    pa.pallas_linear_attention(q, k, v, omega, **kwargs)


# ---- causal

CAUSAL = dict(chunk_size=16, block_f=16, precision=HIGHEST)


def _real(out, mask):
  """Outputs at real query positions (padded ones are computed but meaningless)."""
  return np.asarray(out)[np.broadcast_to(np.asarray(mask)[:, :, None, None], out.shape)]


@pytest.mark.slow
@pytest.mark.parametrize('name', pa.PALLAS_FEATURE_MAPS)
def test_causal_kernel_equals_xla_path(name):
  q, k, v, omega, mask = _inputs(jax.random.key(10))
  out = pa.pallas_causal_linear_attention(q, k, v, omega, feature_map=name, key_mask=mask,
                                          **CAUSAL)
  ref = causal._causal_reference(q, k, v, omega, mask, name=name, eps=attention.DEFAULT_EPS,
                                 precision=HIGHEST)
  np.testing.assert_allclose(_real(out, mask), _real(ref, mask), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize('name', ['favor', 'softmaxfeat'])
def test_causal_is_causal_and_stable(name):
  # Exponents up to ~±60. The kernel shifts favor's keys by the running max of the prefix,
  # the XLA path by the max over all keys: the two cancel alike, but the eps guard would
  # then act on differently scaled denominators, so it is made negligible here.
  q, k, v, omega, mask = _inputs(jax.random.key(11), scale=3.0)
  out = pa.pallas_causal_linear_attention(q, k, v, omega, feature_map=name, key_mask=mask,
                                          eps=1e-30, **CAUSAL)
  assert np.all(np.isfinite(out))
  ref = causal._causal_reference(q, k, v, omega, mask, name=name, eps=1e-30, precision=HIGHEST)
  np.testing.assert_allclose(_real(out, mask), _real(ref, mask), rtol=1e-4, atol=1e-5)
  # The future does not leak: new keys and values after position 20 change nothing before.
  k2 = k.at[:, 21:].set(-k[:, 21:])
  v2 = v.at[:, 21:].set(7.0)
  out2 = pa.pallas_causal_linear_attention(q, k2, v2, omega, feature_map=name, key_mask=mask,
                                           eps=1e-30, **CAUSAL)
  # Bit-identical before the chunk [16, 32) that holds position 21; inside it, favor's
  # shift (the running max, taken per chunk) sees the later keys: equal up to rounding.
  np.testing.assert_array_equal(out2[:, :16], out[:, :16])
  np.testing.assert_allclose(out2[:, 16:21], out[:, 16:21], rtol=1e-5, atol=1e-6)
  assert not np.allclose(out2[0, 21:], out[0, 21:])


def test_causal_gradients_are_the_xla_paths():
  q, k, v, omega, mask = _inputs(jax.random.key(12))
  w = jax.random.normal(jax.random.key(13), (B, L, H, D)) * mask[:, :, None, None]
  fn = functools.partial(pa.pallas_causal_linear_attention, feature_map='elu', key_mask=mask,
                         **CAUSAL)
  ref = lambda *a: causal._causal_reference(*a, mask, name='elu', eps=attention.DEFAULT_EPS,
                                            precision=HIGHEST)
  got = jax.grad(lambda *a: jnp.sum(w * fn(*a)), argnums=(0, 1, 2, 3))(q, k, v, omega)
  want = jax.grad(lambda *a: jnp.sum(w * ref(*a)), argnums=(0, 1, 2, 3))(q, k, v, omega)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-7)


def test_causal_bad_input():
  q, k, v, omega, _ = _inputs(jax.random.key(14))
  with pytest.raises(ValueError, match='chunk_size must be a power of two'):
    pa.pallas_causal_linear_attention(q, k, v, omega, chunk_size=24)
  with pytest.raises(ValueError, match='feature_map'):
    pa.pallas_causal_linear_attention(q, k, v, omega, feature_map='rff')


class PallasVariantsTest(chex.TestCase):
  """The kernels with and without jit; under jax_enable_x64 float64 in, float64 out."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_kernels_with_and_without_jit_and_x64(self):
    q, k, v, omega, mask = _inputs(jax.random.key(15), length=20)
    fn = self.variant(functools.partial(pa.pallas_linear_attention, feature_map='sigmoid2',
                                        key_mask=mask, **BLOCKS))
    out = fn(q, k, v, omega)
    chex.assert_shape(out, v.shape)
    chex.assert_trees_all_close(out, _xla(q, k, v, omega, mask, 'sigmoid2'), rtol=2e-5,
                                atol=2e-6)
    with jax.enable_x64(True):
      q64, k64, v64, omega64 = (a.astype(jnp.float64) for a in (q, k, v, omega))
      out64 = self.variant(functools.partial(
          pa.pallas_causal_linear_attention, feature_map='porf_softplus', key_mask=mask,
          **CAUSAL))(q64, k64, v64, omega64)
      chex.assert_type(out64, jnp.float64)        # the kernels compute in float32
      ref = causal._causal_reference(q64, k64, v64, omega64, mask, name='porf_softplus',
                                 eps=attention.DEFAULT_EPS)
      chex.assert_trees_all_close(_real(out64, mask), _real(ref, mask), rtol=2e-5, atol=2e-6)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['favor', 'elu', 'softmaxfeat'])
def test_every_path_agrees_at_precision_highest(name):
  # Materialised on stored features, chunked XLA and the kernels, bidirectional and causal,
  # all at HIGHEST (on a GPU the default would be TF32 and these tolerances would not hold).
  from coulomb_jax import features  # pylint: disable=g-import-not-at-top
  q, k, v, omega, mask = _inputs(jax.random.key(16))
  pair = lambda qh, kh, w: features.attention_pair(qh, kh, w, name, mask)
  with jax.default_matmul_precision('highest'):
    qf, kf = jax.vmap(pair, in_axes=(2, 2, 0), out_axes=2)(q, k, omega)
  hi = dict(feature_map=name, key_mask=mask, precision='highest')
  bidirectional_paths = {
      'materialised': attention.linear_attention(qf, kf, v, mask, precision='highest'),
      'xla': attention.fused_linear_attention(q, k, v, omega, implementation='xla', **hi),
      'pallas': attention.fused_linear_attention(q, k, v, omega, implementation='pallas', **hi),
  }
  for path, out in bidirectional_paths.items():
    np.testing.assert_allclose(out, bidirectional_paths['xla'], rtol=2e-5, atol=2e-6,
                               err_msg=path)
  causal_paths = {
      'chunked features': attention.causal_linear_attention(qf, kf, v, mask, chunk_size=8,
                                                            precision='highest'),
      'materialised': attention.materialized_causal_linear_attention(qf, kf, v, mask,
                                                                     precision='highest'),
      'xla': attention.fused_causal_linear_attention(q, k, v, omega, implementation='xla', **hi),
      'pallas': attention.fused_causal_linear_attention(q, k, v, omega, implementation='pallas',
                                                        **hi),
  }
  for path, out in causal_paths.items():
    np.testing.assert_allclose(_real(out, mask), _real(causal_paths['xla'], mask), rtol=2e-5,
                               atol=2e-6, err_msg=path)


# ---- the TPU (Mosaic) kernels, in interpret mode (what pallas_linear_attention runs when
# lowered for tpu; never run on a TPU). tests/library/test_lowering.py lowers them for tpu.

def _tpu(q, k, v, omega, mask, name, eps=attention.DEFAULT_EPS):
  return tpu.tpu_kernels(q, k, v, omega, mask, name=name, eps=eps, interpret=True,
                         precision=HIGHEST)


@pytest.mark.slow
@pytest.mark.parametrize('name', pa.TPU_FEATURE_MAPS)
def test_tpu_kernels_equal_xla_path(name):
  q, k, v, omega, mask = _inputs(jax.random.key(17))
  np.testing.assert_allclose(_tpu(q, k, v, omega, mask, name), _xla(q, k, v, omega, mask, name),
                             rtol=2e-5, atol=2e-6)


def test_tpu_kernels_large_logits_padding_and_empty_rows():
  q, k, v, omega, mask = _inputs(jax.random.key(18), scale=3.0)    # exponents up to ~±60
  out = _tpu(q, k, v, omega, mask, 'favor')
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, _xla(q, k, v, omega, mask, 'favor'), rtol=1e-4, atol=1e-5)
  # NaN in padded values is never read; a row without real keys gives zeros.
  v_nan = jnp.where(mask[:, :, None, None], v, jnp.nan)
  empty = mask.at[1].set(False)
  out = _tpu(q, k, v_nan, omega, empty, 'elu')
  np.testing.assert_array_equal(out[1], 0.0)
  np.testing.assert_allclose(out[0], _xla(q, k, v, omega, empty, 'elu')[0], rtol=2e-5,
                             atol=2e-6)
  # bf16 inputs: bf16 out, no NaN, close to float32 on the same rounded inputs.
  bf = lambda a: a.astype(jnp.bfloat16)
  out = _tpu(bf(q / 3), bf(k / 3), bf(v), omega, mask, 'softplus')
  assert out.dtype == jnp.bfloat16
  f32 = lambda a: bf(a).astype(jnp.float32)
  np.testing.assert_allclose(np.asarray(out, np.float32),
                             _xla(f32(q / 3), f32(k / 3), f32(v), omega, mask, 'softplus'),
                             rtol=0.05, atol=0.05)
