"""Tests of coulomb_jax.mimicry and coulomb_jax.layers.flax_attention (softmax mimicry)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import test_util

import coulomb_jax as cj
from coulomb_jax import mimicry as mm
from coulomb_jax.layers import flax_attention as fa
from coulomb_jax.layers import models

L, D, M = 5, 4, 8


def _qkw(seed=0, lq=L, lk=L, scale=1.0):
  kq, kk, kw = jax.random.split(jax.random.key(seed), 3)
  return (scale * jax.random.normal(kq, (lq, D)), scale * jax.random.normal(kk, (lk, D)),
          jax.random.normal(kw, (M, D)))


# ------------------------------------------------------------------ numpy float64 reference

def _np_phi(x, w, name):
  x = np.asarray(x, np.float64) * D ** -0.25
  w = np.asarray(w, np.float64)
  s = x @ w.T
  if name == 'favor':
    return np.exp(s - 0.5 * np.sum(x * x, -1, keepdims=True)) / np.sqrt(len(w))
  z = np.concatenate([s, -s], -1)                                 # hedgehog
  return np.exp(z) / np.sqrt(z.shape[-1])


def _np_reference(q, k, w, name):
  q64, k64 = np.asarray(q, np.float64), np.asarray(k, np.float64)
  logits = q64 @ k64.T / np.sqrt(D)
  k_soft = np.exp(logits)
  a_soft = k_soft / k_soft.sum(-1, keepdims=True)
  k_phi = _np_phi(q, w, name) @ _np_phi(k, w, name).T
  a_lin = k_phi / k_phi.sum(-1, keepdims=True)
  ce = np.mean(-np.sum(a_soft * np.log(a_lin), -1))
  ent = np.mean(-np.sum(a_soft * np.log(a_soft), -1))
  align = np.sum(k_phi * k_soft) / (np.linalg.norm(k_phi) * np.linalg.norm(k_soft))
  return a_soft, a_lin, ce, ce - ent, align


@pytest.mark.parametrize('name', ['favor', 'hedgehog'])
def test_losses_match_numpy_float64(name):
  q, k, w = _qkw()
  a_soft, a_lin, ce, kl, align = _np_reference(q, k, w, name)
  phi = mm.hedgehog if name == 'hedgehog' else cj.features.favor

  @jax.jit
  def outputs(q, k, w):
    lin = mm.linear_attention_weights(phi(q * D ** -0.25, w), phi(k * D ** -0.25, w, False))
    return (mm.softmax_attention_weights(q, k), lin, mm.attention_cross_entropy(q, k, w, name),
            mm.attention_kl(q, k, w, name), mm.softmax_kernel_alignment(q, k, w, name))

  got = outputs(q, k, w)
  np.testing.assert_allclose(got[0], a_soft, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got[1], a_lin, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got[2], ce, rtol=1e-5)
  np.testing.assert_allclose(got[3], kl, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(got[4], align, rtol=1e-5)


@pytest.mark.slow
def test_losses_stable_at_large_scale():
  """Norms ~ 40: exp(q·k/√d) overflows float32, the log-space losses stay finite and exact."""
  q, k, w = _qkw(scale=20.0)
  with jax.enable_x64(True):
    ref = [float(f(jnp.asarray(q, jnp.float64), jnp.asarray(k, jnp.float64),
                   jnp.asarray(w, jnp.float64)))
           for f in (mm.attention_kl, mm.softmax_kernel_alignment)]
  got = [float(mm.attention_kl(q, k, w)), float(mm.softmax_kernel_alignment(q, k, w))]
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)   # alignment ~1e-230 here


def test_leading_axes_equal_vmap():
  q, k, w = _qkw()
  qb, kb = jnp.stack([q, 2 * q]), jnp.stack([k, -k])
  batched, per_row, weights = jax.jit(lambda a, b: (
      mm.attention_kl(a, b, w), jax.vmap(lambda x, y: mm.attention_kl(x, y, w))(a, b),
      jax.vmap(mm.softmax_attention_weights)(a, b)))(qb, kb)
  np.testing.assert_allclose(batched, jnp.mean(per_row), rtol=1e-6)
  np.testing.assert_allclose(mm.softmax_attention_weights(qb, kb), weights, rtol=1e-6)


def test_kl_nonnegative_and_zero_when_equal():
  q, k, _ = _qkw()
  for seed in range(4):
    w = jax.random.normal(jax.random.key(10 + seed), (M, D))
    assert float(mm.attention_kl(q, k, w)) >= 0.0
    assert float(mm.attention_kl(q, k, w, 'hedgehog')) >= 0.0
  # Features of an exact kernel (one feature per key): linear weights = softmax weights.
  phi_q = jnp.exp(q @ k.T / np.sqrt(D))
  np.testing.assert_allclose(mm.linear_attention_weights(phi_q, jnp.eye(L)),
                             mm.softmax_attention_weights(q, k), rtol=1e-5)
  # q = 0 (uniform softmax), particles at 0 and keys of equal norm (uniform A_lin): KL = 0.
  keys = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
  kl = mm.attention_kl(jnp.zeros((L, D)), keys, jnp.zeros((M, D)))
  assert abs(float(kl)) < 1e-6


@pytest.mark.parametrize('target', mm.TARGETS)
def test_hamiltonian_grad_matches_finite_differences(target):
  q, k, w = _qkw()
  with jax.enable_x64(True):
    q, k, w = (jnp.asarray(a, jnp.float64) for a in (q, k, 0.5 * w))
    f = jax.jit(lambda om: mm.mimicry_hamiltonian(om, q, k, feature_map='favor', lam=0.3,
                                                  s=1.0, target=target))
    test_util.check_grads(f, (w,), order=1, modes=['rev'], atol=1e-5, rtol=1e-5)
    if target == 'cross_entropy':
      g = jax.jit(lambda om: mm.mimicry_hamiltonian(om, q, k, feature_map='hedgehog', lam=0.0))
      test_util.check_grads(g, (0.3 * w,), order=1, modes=['rev'], atol=1e-5, rtol=1e-5)


def test_hamiltonian_terms_are_data_plus_lam_repulsion():
  q, k, w = _qkw()
  data, rep = mm.mimicry_hamiltonian_terms(w, q, k, feature_map='favor', lam=0.7, s=1.0,
                                           target='kl')
  np.testing.assert_allclose(data, mm.attention_kl(q, k, w), rtol=1e-6)
  np.testing.assert_allclose(rep, cj.riesz_energy(w, 1.0), rtol=1e-6)
  np.testing.assert_allclose(mm.mimicry_hamiltonian(w, q, k, feature_map='favor', lam=0.7,
                                                    s=1.0, target='kl'), data + 0.7 * rep,
                             rtol=1e-6)


@pytest.mark.slow
def test_padded_keys_change_nothing():
  q, k, w = _qkw()
  junk = jnp.array([[jnp.nan, 1e4, -3.0, 0.0], [50.0, 50.0, 50.0, 50.0]])
  kp = jnp.concatenate([k[:2], junk[:1], k[2:], junk[1:]])
  mask = jnp.array([True, True, False, True, True, True, False])

  @jax.jit
  def values_and_grads(om, a, b, m):
    out = []
    for target in mm.TARGETS:
      f = lambda om, a, b, target=target: mm.mimicry_hamiltonian(
          om, a, b, feature_map='favor', lam=0.2, target=target, key_mask=m)
      out.append(jax.value_and_grad(f, argnums=(0, 1, 2))(om, a, b))
    return out

  for (val, grads), (val_p, grads_p) in zip(values_and_grads(w, q, k, jnp.ones(L, bool)),
                                            values_and_grads(w, q, kp, mask)):
    np.testing.assert_allclose(val_p, val, rtol=1e-6)
    np.testing.assert_allclose(grads_p[0], grads[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads_p[1], grads[1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads_p[2][mask], grads[2], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(grads_p[2][~mask], 0.0)
  # Without a mask (the None path) the values agree too.
  np.testing.assert_allclose(mm.attention_kl(q, kp, w, key_mask=mask), mm.attention_kl(q, k, w),
                             rtol=1e-6)
  a = mm.softmax_attention_weights(q, kp, mask)
  np.testing.assert_allclose(a[:, mask], mm.softmax_attention_weights(q, k), rtol=1e-6)
  np.testing.assert_array_equal(a[:, ~mask], 0.0)


def test_langevin_lowers_heldout_kl():
  d_scale = 1.5 * jnp.array([2.0, 1.0, 0.5, 0.25])
  keys = jax.random.split(jax.random.key(0), 4)
  rows = lambda kk: tuple(d_scale * jax.random.normal(x, (12, D)) for x in jax.random.split(kk))
  (q_tr, k_tr), (q_te, k_te) = rows(keys[0]), rows(keys[1])
  w = cj.sample_gaussian(keys[2], M, D)
  energy = lambda om: mm.mimicry_hamiltonian(om, q_tr, k_tr, feature_map='favor', lam=0.01)
  step = jax.jit(lambda kk, om: cj.langevin_step(kk, om, jax.grad(energy)(om), step_size=0.02,
                                                 beta=1e5, radius=3.0))
  kl = jax.jit(lambda om: mm.attention_kl(q_te, k_te, om))
  before = float(kl(w))
  for t in range(20):
    w = step(jax.random.fold_in(keys[3], t), w)
  assert np.all(np.linalg.norm(w, axis=-1) <= 3.0 + 1e-5)
  assert float(kl(w)) < 0.8 * before, (before, float(kl(w)))


def test_train_hedgehog_and_gradient_flow_lower_the_loss():
  q, k, w = _qkw(scale=1.5)
  w_h, losses = mm.train_hedgehog(jax.random.key(1), q, k, 4, steps=40, learning_rate=0.05)
  assert w_h.shape == (4, D) and losses.shape == (40,)
  np.testing.assert_allclose(losses[0], mm.attention_cross_entropy(
      q, k, cj.sample_gaussian(jax.random.key(1), 4, D) / 2.0, 'hedgehog'), rtol=1e-6)
  assert float(mm.attention_cross_entropy(q, k, w_h, 'hedgehog')) < float(losses[0]) - 0.05
  w_f, curve = mm.gradient_flow(w, q, k, steps=40, step_size=0.5, radius=2.0)
  assert curve.shape == (40,) and float(curve[-1]) < float(curve[0]) - 0.05
  assert np.all(np.linalg.norm(w_f, axis=-1) <= 2.0 + 1e-5)


# ------------------------------------------------------------------ flax drop-in

B, T, E, H = 2, 6, 8, 2
_TOKENS = jnp.array([[True] * 4 + [False] * 2, [True] * 6])


def _mha(omega, **kw):
  return nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=fa.kernel_attention_fn(omega),
                                         **kw)


@pytest.fixture(scope='module')
def kernel_setup():
  x = jax.random.normal(jax.random.key(5), (B, T, E))
  ka = models.KernelAttention(num_heads=H, feature_map='favor', num_features=M,
                              qk_mode='projected')
  params = jax.jit(ka.init)(jax.random.key(6), x, _TOKENS)['params']
  mha_params = {n: params[n] for n in ('query', 'key', 'value', 'out')}
  return x, ka, params, mha_params


@pytest.mark.parametrize('name', ['favor', 'hedgehog'])
def test_kernel_attention_fn_matches_kernel_attention_and_numpy(kernel_setup, name):
  # hedgehog in models.KernelAttention (M rows, 2M features) is the drop-in's hedgehog.
  x, _, params, mha_params = kernel_setup
  ka = models.KernelAttention(num_heads=H, feature_map=name, num_features=M,
                              qk_mode='projected')
  mha = nn.MultiHeadDotProductAttention(
      num_heads=H, attention_fn=fa.kernel_attention_fn(params['particles'], name))
  mask = nn.make_attention_mask(_TOKENS, _TOKENS)
  out = mha.apply({'params': mha_params}, x, x, mask=mask)
  np.testing.assert_allclose(out, ka.apply({'params': params}, x, _TOKENS),
                             rtol=1e-5, atol=1e-6)
  # Direct float64 computation with the same projections.
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), mha_params)
  proj = lambda n: np.einsum('ble,ehd->blhd', np.asarray(x, np.float64),
                             p[n]['kernel']) + p[n]['bias']
  q, k, v = proj('query'), proj('key'), proj('value')
  ref = np.zeros_like(v)
  for b in range(B):
    real = np.asarray(_TOKENS[b])
    for h in range(H):
      w = np.asarray(params['particles'][h], np.float64)
      kern = _np_phi(q[b, :, h], w, name) @ _np_phi(k[b, real, h], w, name).T
      ref[b, :, h] = (kern @ v[b, real, h]) / kern.sum(-1, keepdims=True)
  ref = np.einsum('blhd,hde->ble', ref, p['out']['kernel']) + p['out']['bias']
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_kernel_attention_fn_masks_like_softmax(kernel_setup):
  x, _, params, mha_params = kernel_setup
  mask = nn.make_attention_mask(_TOKENS, _TOKENS)
  key_only = _TOKENS[:, None, None, :]
  x_kv = x.at[0, 4:].set(100.0)                  # change the padded keys and values only
  soft = nn.MultiHeadDotProductAttention(num_heads=H)
  for mod, variables in ((_mha(params['particles']), {'params': mha_params}),
                         (_mha(params['particles'][0]), {'params': mha_params}),
                         (soft, {'params': mha_params})):
    for m in (mask, key_only):
      a = mod.apply(variables, x, x, mask=m)
      b = mod.apply(variables, x, x_kv, mask=m)
      np.testing.assert_allclose(a[0, :4], b[0, :4], rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(a[1], b[1], rtol=1e-6)


def test_kernel_attention_fn_hedgehog_bf16_and_refusals(kernel_setup):
  x, _, params, mha_params = kernel_setup
  w = jax.random.normal(jax.random.key(7), (H, 3, E // H))
  out = jax.jit(_mha(w, dtype=jnp.bfloat16).apply)(
      {'params': mha_params}, x.astype(jnp.bfloat16),
      mask=nn.make_attention_mask(_TOKENS, _TOKENS))
  assert out.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(out, np.float32)))
  fn = fa.kernel_attention_fn(w, 'hedgehog')
  qkv = jax.random.normal(jax.random.key(8), (B, T, H, E // H)).astype(jnp.bfloat16)
  assert np.all(np.isfinite(np.asarray(fn(qkv, qkv, qkv), np.float32)))
  ce = mm.attention_cross_entropy(qkv[0, :, 0], qkv[0, :, 0], w[0], 'hedgehog')
  assert np.isfinite(float(ce))
  causal = nn.make_causal_mask(_TOKENS)
  with pytest.raises(ValueError, match='pass causal=True'):
    _mha(params['particles']).apply({'params': mha_params}, x, mask=causal)
  jitted = jax.jit(lambda m: _mha(params['particles']).apply({'params': mha_params}, x, mask=m))
  with pytest.raises(Exception, match='pass causal=True'):      # from the host callback
    jax.block_until_ready(jitted(causal))
  kernel = fa.kernel_attention_fn(params['particles'])
  with pytest.raises(ValueError, match='bias'):
    kernel(qkv, qkv, qkv, bias=jnp.zeros((B, H, T, T)))
  with pytest.raises(ValueError, match='dropout_rate'):
    kernel(qkv, qkv, qkv, dropout_rate=0.1, deterministic=False)
  with pytest.raises(ValueError, match='omega'):
    fa.kernel_attention_fn(jnp.zeros((3, M, E // H)))(qkv, qkv, qkv)


def test_bad_inputs_raise_naming_the_argument():
  q, k, w = _qkw()
  kw = dict(feature_map='favor', lam=0.1)
  with pytest.raises(ValueError, match='lam'):
    mm.mimicry_hamiltonian(w, q, k, feature_map='favor', lam=-1.0)
  with pytest.raises(ValueError, match='q and k'):
    mm.mimicry_hamiltonian(w, q, k[:, :3], **kw)
  with pytest.raises(ValueError, match='target'):
    mm.mimicry_hamiltonian(w, q, k, target='mse', **kw)
  with pytest.raises(ValueError, match='feature_map'):
    mm.attention_kl(q, k, w, 'rff')
  with pytest.raises(ValueError, match='key_mask'):
    mm.attention_cross_entropy(q, k, w, key_mask=jnp.ones(L + 1, bool))
  with pytest.raises(ValueError, match='omega'):
    mm.attention_kl(q, k, w[:, :3])
  with pytest.raises(ValueError, match='num_features'):
    mm.train_hedgehog(jax.random.key(0), q, k, 0, steps=2, learning_rate=0.1)
  with pytest.raises(ValueError, match='step_size'):
    mm.gradient_flow(w, q, k, steps=2, step_size=0.0)
  with pytest.raises(ValueError, match='eps'):
    mm.linear_attention_weights(q, k, eps=0.0)


def test_package_import_keeps_flax_out():
  import subprocess, sys                          # pylint: disable=g-import-not-at-top
  code = ('import sys, coulomb_jax as cj; assert cj.kernel_attention_fn and cj.attention_kl; '
          'assert "flax" not in sys.modules')
  subprocess.run([sys.executable, '-c', code], check=True, timeout=120)


def test_kernel_attention_fn_gradient_reaches_the_particles(kernel_setup):
  x, _, params, mha_params = kernel_setup
  mask = nn.make_attention_mask(_TOKENS, _TOKENS)
  loss = lambda om, p: jnp.sum(_mha(om).apply({'params': p}, x, mask=mask)[0, :4] ** 2)
  g_om, g_p = jax.jit(jax.grad(loss, argnums=(0, 1)))(params['particles'], mha_params)
  assert g_om.shape == params['particles'].shape
  assert np.all(np.isfinite(g_om)) and float(jnp.abs(g_om).max()) > 0
  assert all(np.all(np.isfinite(a)) for a in jax.tree.leaves(g_p))
