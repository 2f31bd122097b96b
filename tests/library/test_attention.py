"""Tests of coulomb_jax.attention: exactness, padding, causality, dtypes, bad input.

``test_every_path_is_the_exact_kernel_ratio_at_norms_1_8_40`` holds the three
bidirectional paths (materialised, fused XLA, Pallas in interpret mode) of every
attention map against a float64 log-space reference of the kernel's ratio.
"""

from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import attention
from coulomb_jax import features
from coulomb_jax.attention import pallas

B, L, H, D, DIM, N = 2, 11, 3, 4, 5, 16


def _inputs(key, length=L):
  kq, kk, kv, ko = jax.random.split(key, 4)
  omega = features.sample_gaussian(ko, N, DIM)
  q = features.favor(0.5 * jax.random.normal(kq, (B, length, H, DIM)), omega)
  k = features.favor(0.5 * jax.random.normal(kk, (B, length, H, DIM)), omega)
  v = jax.random.normal(kv, (B, length, H, D))
  return q, k, v


def _explicit(q, k, v, mask=None, causal=False):
  """The O(L²) form: A_ij = φ(q_i)·φ(k_j), out = A v / A 1 (float64 numpy)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  a = np.einsum('bihf,bjhf->bhij', q, k)
  if mask is not None:
    a = a * np.asarray(mask, np.float64)[:, None, None, :]
  if causal:
    a = np.tril(a)
  return np.einsum('bhij,bjhd->bihd', a, v) / a.sum(-1).transpose(0, 2, 1)[..., None]


def test_linear_attention_equals_explicit():
  q, k, v = _inputs(jax.random.key(0))
  np.testing.assert_allclose(attention.linear_attention(q, k, v), _explicit(q, k, v),
                             rtol=1e-5, atol=1e-6)
  mask = jnp.arange(L)[None, :] < jnp.array([[L], [7]])
  np.testing.assert_allclose(attention.linear_attention(q, k, v, mask),
                             _explicit(q, k, v, mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('chunk', [1, 4, 64])
def test_causal_equals_explicit_for_any_chunk(chunk):
  q, k, v = _inputs(jax.random.key(1))
  np.testing.assert_allclose(
      attention.causal_linear_attention(q, k, v, chunk_size=chunk),
      _explicit(q, k, v, causal=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('fn', [attention.linear_attention, attention.causal_linear_attention])
def test_padding_changes_neither_outputs_nor_gradients(fn):
  q, k, v = _inputs(jax.random.key(2))
  pq, pk, pv = _inputs(jax.random.key(3), length=5)
  pv = pv.at[0, 0].set(jnp.nan)                              # NaN padding must not leak
  mask = jnp.concatenate([jnp.ones((B, L), bool), jnp.zeros((B, 5), bool)], axis=1)
  cat = lambda a, p: jnp.concatenate([a, p], axis=1)

  def loss(q, k, v, padded):
    if padded:
      out = fn(cat(q, pq), cat(k, pk), cat(v, pv), mask)[:, :L]
    else:
      out = fn(q, k, v)
    return jnp.sum(jnp.sin(out)), out

  (l0, o0), g0 = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v, False)
  (l1, o1), g1 = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v, True)
  np.testing.assert_allclose(o1, o0, rtol=1e-5, atol=1e-6)
  for a, b in zip(g1, g0):
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_bf16_inputs_accumulate_in_float32():
  q, k, v = _inputs(jax.random.key(4))
  ref = _explicit(q, k, v)
  for fn in (attention.linear_attention, attention.causal_linear_attention):
    out = fn(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16))
    assert out.dtype == jnp.bfloat16 and not np.any(np.isnan(out.astype(jnp.float32)))
  out = attention.linear_attention(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16),
                                   v.astype(jnp.bfloat16))
  # bf16 has 8 bits of mantissa: inputs and output rounding, |out| ≲ 3.
  np.testing.assert_allclose(out.astype(jnp.float32), ref, atol=0.1)


def test_all_keys_masked_gives_zero_not_nan():
  q, k, v = _inputs(jax.random.key(5))
  out = attention.linear_attention(q, k, v, jnp.zeros((B, L), bool))
  np.testing.assert_array_equal(out, np.zeros_like(out))


def test_jit_and_vmap():
  q, k, v = _inputs(jax.random.key(6))
  ref = attention.linear_attention(q, k, v)
  np.testing.assert_allclose(jax.jit(attention.linear_attention)(q, k, v), ref, rtol=1e-5,
                             atol=1e-6)
  per_example = jax.vmap(lambda a, b, c: attention.linear_attention(a[None], b[None],
                                                                    c[None])[0])
  np.testing.assert_allclose(per_example(q, k, v), ref, rtol=1e-5, atol=1e-6)


def test_bad_input():
  q, k, v = _inputs(jax.random.key(7))
  with pytest.raises(ValueError, match='q_feat must have rank 4'):
    attention.linear_attention(q[0], k, v)
  with pytest.raises(ValueError, match=r'\[B, L_q, H, F\] and \[B, L_k, H, F\]'):
    attention.linear_attention(q[:, :, :1], k, v)
  with pytest.raises(ValueError, match='same shape'):
    attention.causal_linear_attention(q[:, :5], k, v)
  with pytest.raises(ValueError, match='v must be'):
    attention.linear_attention(q, k, v[:, :5])
  with pytest.raises(ValueError, match=r'key_mask must have shape \[B, L\]'):
    attention.linear_attention(q, k, v, jnp.ones((B, L + 1), bool))
  with pytest.raises(ValueError, match='chunk_size must be an integer >= 1, got 0'):
    attention.causal_linear_attention(q, k, v, chunk_size=0)


# ----------------------------------------------------------------------------- fused path

def _unfused(q, k, v, omega, name, mask):
  """The materialised path: features as models.KernelAttention computes them."""
  pair = lambda qh, kh, w: features.attention_pair(qh, kh, w, name, mask)
  qf, kf = jax.vmap(pair, in_axes=(2, 2, 0), out_axes=2)(q, k, omega)
  return attention.linear_attention(qf, kf, v, mask)


def _fused_inputs(length=37):
  ks = jax.random.split(jax.random.key(5), 4)
  q = 0.5 * jax.random.normal(ks[0], (2, length, 2, 8))
  k = 0.5 * jax.random.normal(ks[1], (2, length, 2, 8))
  v = jax.random.normal(ks[2], (2, length, 2, 8))
  omega = jax.random.normal(ks[3], (2, 16, 8))
  mask = jnp.arange(length)[None] < jnp.array([length, 20])[:, None]
  return q, k, v, omega, mask


@pytest.mark.slow
@pytest.mark.parametrize('name, chunk', [('favor', 5), ('favor', 64), ('elu', 64),
                                         ('softmaxfeat', 5), ('cos2', 16)])
def test_fused_equals_materialised_outputs_and_gradients(name, chunk):
  q, k, v, omega, mask = _fused_inputs()
  keep = mask[..., None, None]

  def loss(fn, *args):
    return jnp.sum(jnp.where(keep, fn(*args), 0.0) ** 2)

  fused = lambda *a: attention.fused_linear_attention(*a, feature_map=name, key_mask=mask,
                                                      chunk_size=chunk)
  ref = lambda *a: _unfused(*a, name, mask)
  np.testing.assert_allclose(jnp.where(keep, fused(q, k, v, omega), 0),
                             jnp.where(keep, ref(q, k, v, omega), 0), atol=2e-6)
  g_fused = jax.grad(lambda *a: loss(fused, *a), argnums=(0, 1, 2, 3))(q, k, v, omega)
  g_ref = jax.grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2, 3))(q, k, v, omega)
  for a, b in zip(g_fused, g_ref):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_fused_favor_survives_large_logits_and_bf16():
  q, k, v, omega, mask = _fused_inputs()
  # Keys whose favor exponents reach ~1e3: an unstabilised exp overflows.
  out = attention.fused_linear_attention(q, 30.0 * k, v, omega, key_mask=mask, chunk_size=8)
  assert np.all(np.isfinite(np.asarray(out)))
  bf = attention.fused_linear_attention(*(a.astype(jnp.bfloat16) for a in (q, k, v)), omega,
                                        key_mask=mask, chunk_size=8)
  assert bf.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(bf, np.float32)))


def _exact_favor_attention(q, k, v, omega, mask):
  """Float64 numpy: out_i = Σ_j w_ij v_j / Σ_j w_ij, w_ij = Σ_f e^{z(q_i)_f + z(k_j)_f}."""
  q, k, v, omega = (np.asarray(a, np.float64) for a in (q, k, v, omega))
  z = lambda x: np.einsum('blhd,hmd->blhm', x, omega) - 0.5 * np.sum(x * x, -1, keepdims=True)
  a = z(q)[:, :, None] + z(k)[:, None]                                # [B, Lq, Lk, H, M]
  top = a.max(-1, keepdims=True)
  logw = top[..., 0] + np.log(np.exp(a - top).sum(-1))               # [B, Lq, Lk, H]
  logw = np.where(np.asarray(mask)[:, None, :, None], logw, -np.inf)
  w = np.exp(logw - logw.max(2, keepdims=True))
  return np.einsum('bijh,bjhd->bihd', w / w.sum(2, keepdims=True), v)


def test_favor_exact_where_one_key_shift_per_head_underflows():
  # Inputs of norm ~11 against N(0, I) particles: with one key shift per (batch, head),
  # many queries' features meet only keys e^{-50} or more below the keys' maximum and the
  # eps guard distorted the output by O(1). Per-feature key shifts keep it exact.
  ks = jax.random.split(jax.random.key(9), 4)
  q, k = (1.4 * jax.random.normal(kk, (2, 40, 1, 64)) for kk in ks[:2])
  v = jax.random.normal(ks[2], (2, 40, 1, 8))
  omega = jax.random.normal(ks[3], (1, 64, 64))
  mask = jnp.arange(40)[None] < jnp.array([[40], [23]])
  ref = _exact_favor_attention(q, k, v, omega, mask)
  real = np.asarray(mask)[:, :, None, None]
  for out in (_unfused(q, k, v, omega, 'favor', mask),
              attention.fused_linear_attention(q, k, v, omega, key_mask=mask, chunk_size=16)):
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, ref, 0), atol=2e-5)


def test_fused_bad_input():
  q, k, v, omega, mask = _fused_inputs()
  with pytest.raises(ValueError, match='omega'):
    attention.fused_linear_attention(q, k, v, omega[:, :, :4])
  with pytest.raises(ValueError, match='feature_map'):
    attention.fused_linear_attention(q, k, v, omega, feature_map='rff')
  with pytest.raises(ValueError, match='chunk_size'):
    attention.fused_linear_attention(q, k, v, omega, chunk_size=0)
  with pytest.raises(ValueError, match='key_mask'):
    attention.fused_linear_attention(q, k, v, omega, key_mask=mask[:, :3])


# ------------------------------------------------------------- exact at any input scale

def _log_softplus64(z):
  """log log(1 + eᶻ) in float64; below −30, z − eᶻ/2 (the next term is e^{2z} ≈ 1e-26)."""
  safe = np.maximum(z, -30.0)
  return np.where(z < -30.0, z - np.exp(np.minimum(z, 0.0)) / 2,
                  np.log(np.log1p(np.exp(safe))))


def _log_psi64(name, x, omega):
  """log ψ(x) ``[L, F]`` of an attention map, float64, written from the maps' formulas."""
  s = x @ omega.T
  half = 0.5 * np.sum(x * x, axis=-1, keepdims=True)
  if name == 'softmaxfeat':
    both = np.concatenate([s, -s], axis=-1)
    top = both.max(-1, keepdims=True)
    return np.log(both.shape[-1]) + both - top - np.log(np.exp(both - top).sum(-1, keepdims=True))
  if name == 'hedgehog':
    return np.concatenate([s, -s], axis=-1) - 0.5 * np.log(2.0)
  return {'favor': lambda: s - half,
          'elu': lambda: np.where(s > 0, np.log1p(np.maximum(s, 0.0)), s),
          'softplus': lambda: _log_softplus64(s),
          'sigmoid2': lambda: -2.0 * np.logaddexp(0.0, -s),
          'cos2': lambda: 2.0 * np.log(np.abs(np.cos(s))),
          'porf_softplus': lambda: _log_softplus64(s - half)}[name]()


def _exact_attention(name, q, k, v, omega, mask, causal=False):
  """out_i = Σ_j w_ij v_j / Σ_j w_ij, log w_ij = logsumexp_f(ℓ(q_i)_f + ℓ(k_j)_f), in float64.

  Real keys only (and j ≤ i if ``causal``); the weights never leave log space, so
  nothing under- or overflows.
  """
  q, k, v, omega = (np.asarray(a, np.float64) for a in (q, k, v, omega))
  out = np.zeros(v.shape)
  for b in range(q.shape[0]):
    for h in range(q.shape[2]):
      a = (_log_psi64(name, q[b, :, h], omega[h])[:, None]
           + _log_psi64(name, k[b, :, h], omega[h])[None])              # [L_q, L_k, F]
      top = a.max(-1)
      logw = top + np.log(np.exp(a - top[..., None]).sum(-1))
      seen = np.asarray(mask[b])[None, :]
      if causal:
        seen = seen & np.tri(q.shape[1], dtype=bool)
      logw = np.where(seen, logw, -np.inf)
      w = np.exp(logw - logw.max(-1, keepdims=True))
      out[b, :, h] = (w / w.sum(-1, keepdims=True)) @ v[b, :, h]
  return out


NORMS = (1.0, 8.0, 40.0)


def _inputs_at_norms(length=12, heads=2, dim=8, d_v=4, num=16):
  """Batch row r: queries and keys of norm NORMS[r] (random directions); row lengths 12, 7, 9."""
  ks = jax.random.split(jax.random.key(21), 4)
  unit = lambda kk: (lambda a: a / jnp.linalg.norm(a, axis=-1, keepdims=True))(
      jax.random.normal(kk, (len(NORMS), length, heads, dim)))
  norms = jnp.array(NORMS)[:, None, None, None]
  q, k = norms * unit(ks[0]), norms * unit(ks[1])
  v = jax.random.normal(ks[2], (len(NORMS), length, heads, d_v))
  omega = jax.random.normal(ks[3], (heads, num, dim))
  mask = jnp.arange(length)[None] < jnp.array([length, 7, 9])[:, None]
  return q, k, v, omega, mask


@pytest.mark.parametrize('name', features.KERNEL_ATTENTION_MAPS)
def test_every_path_is_the_exact_kernel_ratio_at_norms_1_8_40(name):
  # Before the log-space shifts, porf_softplus was ≈ 0 from norm 6 on (its features
  # e^{s − ‖x‖²/2} underflow) and softmaxfeat wrong at norm ~30: the eps guard dominated.
  q, k, v, omega, mask = _inputs_at_norms()
  ref = _exact_attention(name, q, k, v, omega, mask)
  paths = {
      'materialised': lambda *a: _unfused(*a, name, mask),
      'fused': lambda *a: attention.fused_linear_attention(
          *a, feature_map=name, key_mask=mask, chunk_size=5, implementation='xla'),
  }
  if name in pallas.PALLAS_FEATURE_MAPS:  # not hedgehog ('auto' takes XLA for it)
    # Interpret mode on every host: these sizes (d = 8) are below Triton's 16.
    paths['pallas'] = lambda *a: pallas.pallas_linear_attention(
        *a, feature_map=name, key_mask=mask, interpret=True)
  if name in pallas.TPU_FEATURE_MAPS:   # the Mosaic kernels, interpreted
    paths['pallas_tpu'] = lambda *a: pallas.tpu.tpu_kernels(
        *a, mask, name=name, eps=attention.DEFAULT_EPS, interpret=True, precision=None)
  real = np.asarray(mask)[:, :, None, None]
  # Float32 rounding of log-features of size ~‖x‖²/2 (favor, porf_softplus) moves the
  # weights by ~1e-7·‖x‖²; |v| ≲ 3.
  tol = 1e-6 * (2.0 + 0.4 * np.square(NORMS))
  for path, fn in paths.items():
    out = np.asarray(jax.jit(fn)(q, k, v, omega))
    err = np.max(np.abs(np.where(real, out - ref, 0.0)), axis=(1, 2, 3))
    assert np.all(err <= tol), (path, err, tol)
  # Gradients (the XLA path's, also under Pallas) stay finite at norm 40.
  w = jax.random.normal(jax.random.key(22), v.shape)
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(w * paths['fused'](*a)), argnums=(0, 1, 3)))(
      q, k, v, omega)
  assert all(np.all(np.isfinite(g)) for g in grads)
  # bf16 inputs: no NaN.
  bf = jax.jit(paths['materialised'])(*(a.astype(jnp.bfloat16) for a in (q, k, v)), omega)
  chex.assert_type(bf, jnp.bfloat16)
  assert np.all(np.isfinite(np.asarray(bf, np.float32)))


# The causal paths from the particles: the Pallas kernel (interpreted) and the materialised
# path with per-token shifts, every map at norms 1, 8 and 40 (before issue 36 they shared a
# shift with later keys and were off by up to 2.4 at norm 40 for favor-type maps).
@pytest.mark.parametrize('name', features.KERNEL_ATTENTION_MAPS)
def test_causal_paths_against_the_exact_causal_ratio(name):
  q, k, v, omega, mask = _inputs_at_norms()
  ref = _exact_attention(name, q, k, v, omega, mask, causal=True)
  real = np.asarray(mask)[:, :, None, None]
  outs = {'materialized': attention.materialized_causal_attention(
      q, k, v, omega, feature_map=name, key_mask=mask)}
  if name in pallas.PALLAS_FEATURE_MAPS:
    outs['pallas'] = pallas.pallas_causal_linear_attention(
        q, k, v, omega, feature_map=name, key_mask=mask, chunk_size=4, block_f=16,
        interpret=True)
  tol = 1e-6 * (2.0 + 0.4 * np.square(NORMS))
  for path, out in outs.items():
    err = np.max(np.abs(np.where(real, np.asarray(out) - ref, 0.0)), axis=(1, 2, 3))
    assert np.all(err <= tol), (path, err, tol)
  # The fused causal path: every map, norms 1, 8 and 40, chunks that do and do not divide L
  # (before it, favor and porf_softplus were off by 0.6-1.4 at norm 8).
  tol = 1e-6 * (2.0 + 0.4 * np.square(NORMS))
  fused = lambda c: lambda *a: attention.fused_causal_linear_attention(
      *a, feature_map=name, key_mask=mask, chunk_size=c)
  for chunk in (5, 16):                    # 5 does not divide L = 12; 16 > L: one chunk
    out = np.asarray(jax.jit(fused(chunk))(q, k, v, omega))
    err = np.max(np.abs(np.where(real, out - ref, 0.0)), axis=(1, 2, 3))
    assert np.all(err <= tol), (chunk, err, tol)
  w = jax.random.normal(jax.random.key(22), v.shape)
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(w * fused(5)(*a)), argnums=(0, 1, 3)))(
      q, k, v, omega)
  assert all(np.all(np.isfinite(g)) for g in grads)
  bf = jax.jit(fused(5))(*(a.astype(jnp.bfloat16) for a in (q, k, v)), omega)
  chex.assert_type(bf, jnp.bfloat16)
  assert np.all(np.isfinite(np.asarray(bf, np.float32)))


class AttentionVariantsTest(chex.TestCase):
  """The paths with and without jit, in float32 and under jax_enable_x64."""

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(False, True)
  def test_paths_agree_float32_and_x64(self, x64):
    with jax.enable_x64(x64):
      dtype = jnp.float64 if x64 else jnp.float32
      q, k, v, omega, mask = (a if a.dtype == bool else a.astype(dtype)
                              for a in _fused_inputs(length=9))
      materialised = self.variant(lambda *a: _unfused(*a, 'softplus', mask))(q, k, v, omega)
      fused = self.variant(lambda *a: attention.fused_linear_attention(
          *a, feature_map='softplus', key_mask=mask, chunk_size=4))(q, k, v, omega)
      causal = self.variant(lambda *a: attention.causal_linear_attention(
          *a, mask, chunk_size=4))(features.favor(q, omega[0]), features.favor(k, omega[0]), v)
      chex.assert_type((materialised, fused, causal), dtype)
      chex.assert_shape((materialised, fused, causal), v.shape)
      keep = mask[..., None, None]
      chex.assert_trees_all_close(jnp.where(keep, fused, 0), jnp.where(keep, materialised, 0),
                                  atol=1e-12 if x64 else 2e-6)
      explicit = _explicit(features.favor(q, omega[0]), features.favor(k, omega[0]), v, mask,
                           causal=True)
      chex.assert_trees_all_close(jnp.where(keep, causal, 0), np.where(keep, explicit, 0),
                                  atol=1e-12 if x64 else 2e-6)
