"""The recall methods of issue 36: the Taylor map, Hedgehog's identity init and trained W,
the distillation force (with the task gradient, and alone for the two AdamW mimicry
methods), and particles_flow as the Langevin step with λ = 0 and no noise."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import mqar as mqar_config
from coulomb_jax import features
from coulomb_jax import langevin
from coulomb_jax import mimicry
from coulomb_jax import training
from coulomb_jax.layers import models
from coulomb_jax.tasks import mqar
from experiments.recall import methods
from experiments.recall import run


def test_taylor_features_give_the_second_order_expansion_of_exp():
  kx, ky, kw = jax.random.split(jax.random.key(0), 3)
  x, y = jax.random.normal(kx, (5, 6)), jax.random.normal(ky, (7, 6))
  omega = 0.5 * jax.random.normal(kw, (4, 6))
  phi_x, phi_y = features.taylor(x, omega), features.taylor(y, omega)
  assert phi_x.shape == (5, features.num_features('taylor', 4)) == (5, 1 + 4 + 16)
  u = (x @ omega.T) @ (y @ omega.T).T / np.sqrt(4)
  np.testing.assert_allclose(phi_x @ phi_y.T, 1 + u + u ** 2 / 2, rtol=1e-5, atol=1e-6)
  assert not features.is_separable('taylor')


@pytest.mark.parametrize('causal', [False, True])
def test_taylor_in_kernel_attention_is_the_normalised_polynomial_kernel(causal):
  x = jax.random.normal(jax.random.key(1), (2, 6, 8))
  module = models.KernelAttention(num_heads=2, feature_map='taylor', num_features=3,
                                  qk_mode='projected', causal=causal,
                                  causal_path='materialized')
  params = module.init(jax.random.key(2), x)
  out, inter = module.apply(params, x, mutable=['intermediates'])
  q, k = inter['intermediates']['mimicry_inputs'][0]
  p = params['params']
  v = jnp.einsum('ble,ehd->blhd', x, p['value']['kernel']) + p['value']['bias']
  omega = p['particles']
  scale = 4 ** -0.25
  ref = []
  for h in range(2):
    s_q, s_k = (scale * q[:, :, h]) @ omega[h].T, (scale * k[:, :, h]) @ omega[h].T
    u = jnp.einsum('bif,bjf->bij', s_q, s_k) / np.sqrt(3)
    w = 1 + u + u ** 2 / 2
    if causal:
      w = jnp.where(jnp.tril(jnp.ones((6, 6), bool)), w, 0.0)
    ref.append(jnp.einsum('bij,bjd->bid', w / w.sum(-1, keepdims=True), v[:, :, h]))
  ref = jnp.stack(ref, axis=2)
  expected = jnp.einsum('blhd,hde->ble', ref, p['out']['kernel']) + p['out']['bias']
  np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


def _quick(method, **fields):
  config = mqar_config.get_config(f'quick,{method}')
  for name, value in fields.items():
    group, leaf = name.split('.')
    config[group][leaf] = value
  return config


def _state_and_batch(config, method):
  keys = run._keys(0)   # pylint: disable=protected-access
  state = training.lm.make_state(keys['init'], method.model, config.data.seq_len,
                                 particle_tx=method.particle_tx)
  batch = mqar.mqar_batch(jax.random.key(3), 4, **run.data_args(config))
  return state, batch


def _particles(params):
  return {k: v['attn']['particles'] for k, v in params.items()
          if isinstance(v, dict) and 'attn' in v}


@pytest.mark.parametrize('name', ['hedgehog', 'hedgehog_distilled', 'hedgehog_mimicry'])
def test_hedgehog_starts_at_the_identity_and_its_w_trains(name):
  config = _quick(name)
  method = methods.build(config, jax.random.key_data(jax.random.key(0)))
  assert method.feature_map == 'hedgehog' and method.particle_tx is None
  state, batch = _state_and_batch(config, method)
  head_dim = config.model.width // config.model.num_heads
  for omega in _particles(state.params).values():      # M = N/2 = 4 rows of I_8
    assert omega.shape == (2, 4, head_dim)
    np.testing.assert_array_equal(omega, np.broadcast_to(np.eye(head_dim)[:4], omega.shape))
  new, _ = training.lm.train_step(state, batch, method.mimicry, method.feature_map,
                                  config.data.num_pairs)
  for before, after in zip(_particles(state.params).values(), _particles(new.params).values()):
    assert float(jnp.max(jnp.abs(after - before))) > 1e-5      # W moved by AdamW


@pytest.mark.slow
@pytest.mark.parametrize('name,feature_map,with_task', [
    ('hedgehog_distilled', 'hedgehog', True), ('hedgehog_mimicry', 'hedgehog', False),
    ('favor_mimicry', 'favor', False)])
def test_the_adamw_mimicry_gradients_are_the_distillation_gradient_with_or_without_the_task(
    name, feature_map, with_task):
  # hedgehog_distilled: task + distillation (Hedgehog's recipe); the mimicry-only methods:
  # distillation alone, every other parameter the task gradient. λ = 0, AdamW (no particle_tx).
  config = _quick(name)
  method = methods.build(config, jax.random.key_data(jax.random.key(0)))
  assert method.feature_map == feature_map and method.particle_tx is None
  assert method.mimicry.with_task_gradient == with_task and method.mimicry.lam == 0.0
  model = method.model
  probe = optax.sgd(1.0)      # the update is −gradient: read the gradient off it
  state = training.lm.make_state(jax.random.key(0), model, config.data.seq_len)
  state = state.replace(tx=probe, opt_state=probe.init(state.params))
  batch = mqar.mqar_batch(jax.random.key(3), 4, **run.data_args(config))
  p = config.data.num_pairs
  new, _ = training.lm.train_step(state, batch, method.mimicry, feature_map, p)
  metrics = training.lm._metrics  # pylint: disable=protected-access
  task, _ = jax.jit(lambda params: jax.grad(metrics, has_aux=True)(
      params, model.apply, batch, p))(state.params)
  _, inter = jax.jit(lambda params: model.apply({'params': params}, batch.inputs,
                                                mutable=['intermediates']))(state.params)
  distill_fn = jax.jit(jax.vmap(jax.grad(lambda w, q, k: mimicry.mimicry_hamiltonian(
      w, q, k, feature_map=feature_map, lam=0.0, target='cross_entropy'))))
  for block in ('block_0',):
    q, k = inter['intermediates'][block]['attn']['mimicry_inputs'][0]
    q, k = (jnp.moveaxis(a[:config.particles.rows], 2, 0) for a in (q, k))
    omega = state.params[block]['attn']['particles']
    distill = distill_fn(omega, q, k)
    got = omega - new.params[block]['attn']['particles']
    expected = task[block]['attn']['particles'] + distill if with_task else distill
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    # every other parameter: the task gradient
    got_value = state.params[block]['attn']['value']['kernel'] - new.params[block]['attn'][
        'value']['kernel']
    np.testing.assert_allclose(got_value, task[block]['attn']['value']['kernel'],
                               rtol=1e-4, atol=1e-7)


def test_favor_mimicry_starts_where_particles_flow_starts():
  # The step particles_flow -> favor_mimicry changes the optimiser only: same map, same
  # particles at step 0 (block-orthogonal FAVOR+ rows), same force.
  states = {}
  for name in ('particles_flow', 'favor_mimicry'):
    config = _quick(name)
    method = methods.build(config, jax.random.key_data(jax.random.key(0)))
    states[name] = (_state_and_batch(config, method)[0], method)
  (flow, flow_method), (adamw, adamw_method) = states['particles_flow'], states['favor_mimicry']
  for a, b in zip(_particles(flow.params).values(), _particles(adamw.params).values()):
    np.testing.assert_array_equal(a, b)
  assert adamw_method.mimicry == flow_method.mimicry
  assert not adamw_method.model.identity_init and adamw_method.model.orthogonal


def test_particles_flow_is_the_langevin_step_with_no_repulsion_and_no_noise():
  config = _quick('particles_flow')
  assert run.calibrate(config, None, None, None) == {'lam': 0.0, 'beta': float('inf')}
  method = methods.build(config, jax.random.key_data(jax.random.key(0)))
  assert method.mimicry.lam == 0.0 and not method.mimicry.with_task_gradient
  state, batch = _state_and_batch(config, method)
  new, _ = training.lm.train_step(state, batch, method.mimicry, 'favor', config.data.num_pairs)
  p = config.particles

  @jax.jit
  def expected_step(params):
    _, inter = method.model.apply({'params': params}, batch.inputs,
                                  mutable=['intermediates'])
    flat_inputs = {('block_0', 'attn'): inter['intermediates']['block_0']['attn'][
        'mimicry_inputs'][0]}
    force = training.lm.mimicry_forces(params, flat_inputs, method.mimicry, 'favor')
    # One projected gradient step: no noise (β = ∞), the force of D alone (λ = 0).
    return langevin.langevin_step(jax.random.key(9), params['block_0']['attn']['particles'],
                                  force[('block_0', 'attn')], step_size=p.step_size,
                                  beta=float('inf'), radius=p.radius, clip_norm=p.clip_norm)

  expected = expected_step(state.params)
  np.testing.assert_allclose(new.params['block_0']['attn']['particles'], expected,
                             rtol=1e-5, atol=1e-6)
  # particles_softmax differs only in λ and β (here set, not calibrated).
  soft = methods.build(_quick('particles_softmax'), jax.random.key_data(jax.random.key(0)),
                       lam=0.5, beta=1e3)
  assert soft.mimicry._replace(lam=0.0) == method.mimicry and soft.mimicry.lam == 0.5


def test_calibration_sets_the_force_ratio_and_the_drift_to_noise():
  config = _quick('particles_softmax', **{'particles.relative_lam': 0.1,
                                          'particles.drift_to_noise': 2.0})
  method = methods.build(config, jax.random.key_data(jax.random.key(0)))
  state, batch = _state_and_batch(config, method)
  cal = run.calibrate(config, state, method.model, batch)
  data, rep = training.lm.force_terms(state.params, batch, method.model,
                                      methods.mimicry_settings(config, 1.0), 'favor',
                                      config.data.num_pairs)
  norms = lambda tree: np.concatenate([np.linalg.norm(np.asarray(a), axis=-1).ravel()
                                       for a in jax.tree.leaves(tree)])
  # λ·median‖∇W_k‖ = 0.1·median‖∇D_k‖, and the median drift is twice the noise RMS.
  assert cal['lam'] * np.median(norms(rep)) == pytest.approx(0.1 * np.median(norms(data)),
                                                             rel=1e-4)
  assert cal['drift_to_noise'] == pytest.approx(2.0, rel=1e-3)
  assert 0.01 < cal['force_ratio'] < 1.0 and np.isfinite(cal['beta'])


def test_a_run_stops_before_saving_when_a_particle_turns_non_finite(tmp_path, monkeypatch):
  # Issue 39 item 3: the LM loop stops at the step that made a particle non-finite, naming
  # its block and head, before the save that would keep it.
  config = _quick('particles_flow')
  real_step = training.lm.train_step

  def poisoned(state, *args):
    state, metrics = real_step(state, *args)
    w = state.params['block_0']['attn']['particles']
    block = dict(state.params['block_0'], attn=dict(state.params['block_0']['attn'],
                                                    particles=w.at[1, 0, 0].set(jnp.nan)))
    params = dict(state.params, block_0=block)
    return state.replace(params=params), metrics

  monkeypatch.setattr(run.training.lm, 'train_step', poisoned)
  workdir = str(tmp_path / 'run')
  with pytest.raises(FloatingPointError, match=r'step 1: block_0/attn/particles head 1 holds 1 '
                                               r'non-finite value\(s\); stopped before saving '
                                               r'\(the last checkpoint, step 0, is kept\)'):
    run.train_and_evaluate(config, workdir, log=lambda *_: None)
  assert not os.path.exists(os.path.join(workdir, run.CHECKPOINT_FILE))
