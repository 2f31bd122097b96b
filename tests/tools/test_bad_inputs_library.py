"""Bad inputs to the library's own steps and checks (issue 39, items 3 and 4), one test each.

Item 3: a non-finite value stops early. The jitted Phase A steps report per-head counts of
non-finite particles and gradients in their metrics, ``langevin_transform`` counts them in
its state, the Phase A driver stops at the first one with one line, and the scalar checks
refuse ±inf (but where ∞ means something: β = ∞, R = ∞). Item 4: the mimicry functions
refuse inputs without query rows or keys, and every function of ``mimicry`` and ``mqar``
that draws takes exactly one PRNG key. Every message is asserted in full.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from coulomb_jax import _checks
from coulomb_jax import langevin
from coulomb_jax import mimicry
from coulomb_jax import training
from coulomb_jax.layers import models
from coulomb_jax.tasks import mqar
from experiments.run import phase_a

VOCAB = 40
Q = jax.random.normal(jax.random.key(0), (5, 4))          # [L_q, d]
K = jax.random.normal(jax.random.key(1), (6, 4))          # [L_k, d]
OMEGA = jax.random.normal(jax.random.key(2), (3, 4))      # [M, d]
MQAR = dict(vocab_size=32, seq_len=16, num_pairs=2)
KEY_ERROR = 'key must be a JAX PRNG key (jax.random.key(seed)), got '


def _raises(error, message, call, *args, **kwargs):
  """``call`` raises exactly ``error`` with exactly ``message`` (one line)."""
  with pytest.raises(error) as info:
    call(*args, **kwargs)
  assert info.type is error
  got = str(info.value).split('\n--------------------\nFor simplicity')[0]
  assert got == message
  assert '\n' not in got


# ----------------------------------------------------------------------------- Phase A steps

def _batch(b=8, length=12):
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  lengths = jax.random.randint(k1, (b,), 2, length + 1)
  mask = jnp.arange(length)[None] < lengths[:, None]
  ids = jnp.where(mask, jax.random.randint(k2, (b, length), 1, VOCAB), 0)
  return {'ids': ids, 'segments': jnp.zeros_like(ids), 'mask': mask,
          'labels': jax.random.bernoulli(k3, 0.5, (b,)).astype(jnp.int32),
          'weights': jnp.ones((b,), jnp.float32)}


@functools.lru_cache(maxsize=None)
def _phase_a():
  """(model, batch, params, optimizer, jitted joint step): two layers, two heads, [2, 8, 8]."""
  model = models.EncoderClassifier(vocab_size=VOCAB, max_length=16, width=16, num_heads=2,
                                   ffn_dim=16, num_features=8, feature_map='favor')
  batch = _batch()
  params = model.init(jax.random.key(1), batch['ids'], batch['segments'],
                      batch['mask'])['params']
  opt = training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=1e-2, beta=50.0,
                                   radius=1.5, clip_norm=10.0)
  step = jax.jit(training.make_phase_a_step(model, opt, feature_map='favor', lam=1e-3,
                                            s='coulomb', softening=0.5))
  return model, batch, params, opt, step


def _with_leaf(params, path, fn):
  flat = traverse_util.flatten_dict(params)
  flat[path] = fn(flat[path])
  return traverse_util.unflatten_dict(flat)


def _joint_step(params):
  _, batch, _, opt, step = _phase_a()
  state = training.TrainState(jnp.zeros([], jnp.int32), params, opt.init(params))
  new, m = step(state, batch)
  return new, jax.device_get(m)


def _counts(m, name):
  return {k: np.asarray(v).tolist() for k, v in m[name].items()}


@pytest.mark.slow
def test_jitted_phase_a_step_counts_a_nan_particle_and_the_gradients_it_reaches():
  _, _, params, _, _ = _phase_a()
  _, m = _joint_step(params)                      # finite: every count 0, nothing reported
  assert _counts(m, 'nonfinite_particles') == {'attention_0/particles': [0, 0],
                                               'attention_1/particles': [0, 0]}
  assert _counts(m, 'nonfinite_grads') == _counts(m, 'nonfinite_particles')
  assert training.first_nonfinite(m) is None
  bad = _with_leaf(params, ('attention_0', 'particles'), lambda w: w.at[1, 0, 0].set(jnp.nan))
  new, m = _joint_step(bad)
  # One NaN entry (layer 0, head 1) reaches the whole gradient of its head and, through the
  # encoder's pooled keys, both heads of layer 1: 3 of 4 heads × 64 entries, which the move
  # makes NaN particles. The metrics name where it started.
  assert _counts(m, 'nonfinite_particles') == {'attention_0/particles': [0, 1],
                                               'attention_1/particles': [0, 0]}
  assert _counts(m, 'nonfinite_grads') == {'attention_0/particles': [0, 64],
                                           'attention_1/particles': [64, 64]}
  assert training.first_nonfinite(m) == ('particles', 'attention_0/particles', 1, 1)
  assert {'/'.join(p): int(np.isnan(np.asarray(w)).sum())
          for p, w in training.particle_leaves(new.params).items()} == {
              'attention_0': 64, 'attention_1': 128}
  assert np.isnan(m['hamiltonian']) and np.isnan(m['max_move'])


@pytest.mark.slow
def test_jitted_layer_step_counts_only_its_layer():
  model, batch, params, _, _ = _phase_a()
  path = ('attention_1',)
  opt = training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=1e-2, beta=50.0,
                                   radius=1.5, clip_norm=10.0, only=path)
  step = jax.jit(training.make_phase_a_layer_step(path, opt, feature_map='favor', lam=1e-3,
                                                  s='coulomb', softening=0.5))
  r = training.phase_a_inputs(model, params, batch)[path]
  r = r.at[3, 0, 2].set(jnp.nan)                   # one pooled key of head 0: NaN
  state = training.TrainState(jnp.zeros([], jnp.int32), params, opt.init(params))
  _, m = jax.device_get(step(state, r, batch['labels'], batch['weights']))
  assert _counts(m, 'nonfinite_particles') == {'attention_1/particles': [0, 0]}
  assert _counts(m, 'nonfinite_grads') == {'attention_1/particles': [64, 0]}
  assert training.first_nonfinite(m) == ('gradient', 'attention_1/particles', 0, 64)


def test_jitted_langevin_transform_counts_non_finite_grads_and_particles_in_its_state():
  tx = langevin.langevin_transform(jax.random.key(3), step_size=0.1, beta=10.0, radius=2.0,
                                   clip_norm=1.0)
  params = {'a': jnp.ones((2, 5, 3)), 'b': jnp.ones((4, 3))}
  grads = jax.tree.map(lambda p: 0.1 * p, params)
  update = jax.jit(tx.update)
  state = tx.init(params)
  assert (int(state.nonfinite_grads), int(state.nonfinite_params)) == (0, 0)
  _, state = update(grads, state, params)
  assert (int(state.count), int(state.nonfinite_grads), int(state.nonfinite_params)) == (1, 0, 0)
  nan_grads = dict(grads, b=grads['b'].at[2].set(jnp.nan))            # 3 entries
  updates, state = update(nan_grads, state, params)
  assert (int(state.count), int(state.nonfinite_grads), int(state.nonfinite_params)) == (2, 3, 0)
  # What the count warns of: NaN particles (the clip's NaN global norm scales nothing).
  assert bool(jnp.isnan(updates['b'][2]).all()) and int(jnp.isnan(updates['b']).sum()) == 3
  assert bool(jnp.isfinite(updates['a']).all())
  inf_params = dict(params, a=params['a'].at[1, 4, 0].set(-jnp.inf))
  _, state = update(grads, state, inf_params)
  assert (int(state.nonfinite_grads), int(state.nonfinite_params)) == (0, 1)
  # Inside Phase A's optax.partition, a driver reads it by name.
  opt = training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=0.1, beta=10.0,
                                   radius=2.0, clip_norm=1.0)
  tree = {'attention_0': {'particles': params['a'], 'value': jnp.ones(3)}}
  grads = {'attention_0': {'particles': params['a'].at[0, 0, 0].set(jnp.nan),
                           'value': jnp.ones(3)}}
  _, opt_state = jax.jit(opt.update)(grads, opt.init(tree), tree)
  assert int(optax.tree_utils.tree_get(opt_state, 'nonfinite_grads')) == 1
  assert int(optax.tree_utils.tree_get(opt_state, 'nonfinite_params')) == 0
  # Default-compatible: the two-field construction still works.
  assert langevin.LangevinState(jnp.zeros([], jnp.int32), jax.random.key(0)).nonfinite_grads == 0


def _driver_message(m, new):
  with pytest.raises(FloatingPointError) as info:
    phase_a._check_finite('phase A (stage 1/2, all layers)', '3/10', new, m, 2)
  return str(info.value)


def test_phase_a_driver_stops_at_a_nan_particle_naming_layer_and_head():
  _, _, params, _, _ = _phase_a()
  new, m = _joint_step(params)
  phase_a._check_finite('phase A (stage 1/2, all layers)', '3/10', new, m, 2)   # finite
  bad = _with_leaf(params, ('attention_0', 'particles'), lambda w: w.at[1, 0, 0].set(jnp.nan))
  new, m = _joint_step(bad)
  message = _driver_message(m, new)
  assert message == (
      'phase A (stage 1/2, all layers) step 3/10: attention_0/particles head 1 holds 1 '
      'non-finite value(s) at the step start; stopped before saving (the last checkpoint, '
      'Phase A step 2, is kept). Lower phase_a.relative_step, or check the inputs.')
  assert '\n' not in message


def test_phase_a_driver_stops_at_a_nan_gradient_naming_layer_and_head():
  _, _, params, _, _ = _phase_a()
  # A NaN in the embeddings reaches layer 0's pooled keys: its particles are finite, their
  # gradient is not (the first count is the gradient of layer 0, head 0).
  bad = _with_leaf(params, ('tokens', 'embedding'),
                   lambda e: e.at[:, 0].set(jnp.nan))
  new, m = _joint_step(bad)
  assert training.first_nonfinite(m)[0] == 'gradient'
  message = _driver_message(m, new)
  assert message == (
      'phase A (stage 1/2, all layers) step 3/10: the gradient of attention_0/particles head '
      '0 holds 64 non-finite value(s); stopped before saving (the last checkpoint, Phase A '
      'step 2, is kept). Lower phase_a.relative_step, or check the inputs.')


# ----------------------------------------------------------------------------- scalar checks

def test_check_positive_and_nonnegative_refuse_inf_and_nan_unless_inf_is_allowed():
  for check, bound in ((_checks.check_positive, '> 0'), (_checks.check_nonnegative, '>= 0')):
    _raises(ValueError, f'x must be a finite number {bound}, got inf.', check, 'x', math.inf)
    _raises(ValueError, f'x must be a finite number {bound}, got inf.', check, 'x', jnp.inf)
    _raises(ValueError, f'x must be {bound}, got -inf.', check, 'x', -math.inf)
    _raises(ValueError, f'x must be {bound}, got nan.', check, 'x', math.nan)
    _raises(ValueError, f'x must be {bound}, got nan.', check, 'x', math.nan, allow_inf=True)
    _raises(ValueError, f'x must be {bound}, got -inf.', check, 'x', -math.inf,
            allow_inf=True)
    check('x', math.inf, allow_inf=True)
    check('x', 2.5)
  _raises(ValueError, 'x must be > 0, got 0.0.', _checks.check_positive, 'x', 0.0)


def test_train_hedgehog_refuses_an_infinite_learning_rate():
  _raises(ValueError, 'learning_rate must be a finite number > 0, got inf.',
          mimicry.train_hedgehog, jax.random.key(0), Q, K, 2, steps=2, learning_rate=math.inf)


def test_gradient_flow_refuses_an_infinite_step_size():
  _raises(ValueError, 'step_size must be a finite number > 0, got inf.',
          mimicry.gradient_flow, OMEGA, Q, K, steps=2, step_size=math.inf)


@pytest.mark.slow
def test_langevin_refuses_inf_step_size_and_clip_norm_but_keeps_beta_and_radius_inf():
  w = jnp.ones((4, 3))
  step = functools.partial(langevin.langevin_step, jax.random.key(0), w, w)
  _raises(ValueError, 'step_size must be a finite number > 0, got inf.', step,
          step_size=math.inf, beta=1.0, radius=1.0)
  _raises(ValueError, 'clip_norm must be a finite number > 0, got inf.', step,
          step_size=0.1, beta=1.0, radius=1.0, clip_norm=math.inf)
  _raises(ValueError, 'lam must be a finite number >= 0, got inf.', langevin.gibbs_resample,
          jax.random.key(0), w, w[:2] * jnp.array([[1.0], [-1.0]]), jnp.array([1.0, -1.0]), 2,
          beta=1.0, feature_map='rff', lam=math.inf)
  # β = ∞ (no noise) and R = ∞ (no projection): plain gradient descent.
  np.testing.assert_array_equal(step(step_size=0.1, beta=math.inf, radius=math.inf),
                                w - 0.1 * 4 * w)
  x = jnp.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
  _, idx = langevin.gibbs_resample(jax.random.key(0), w, x, jnp.array([1.0, -1.0]), 3,
                                   beta=math.inf, feature_map='rff', lam=0.0)
  assert idx.shape == (3,)
  tx = langevin.langevin_transform(jax.random.key(0), step_size=0.1, beta=math.inf,
                                   radius=math.inf)
  updates, _ = tx.update(w, tx.init(w), w)
  np.testing.assert_allclose(updates, -0.1 * 4 * w, rtol=1e-6)
  # gradient_flow's R = ∞ is R = None.
  with_inf = mimicry.gradient_flow(OMEGA, Q, K, steps=2, step_size=0.1, radius=math.inf)
  without = mimicry.gradient_flow(OMEGA, Q, K, steps=2, step_size=0.1)
  np.testing.assert_array_equal(with_inf[0], without[0])


def test_mqar_refuses_an_infinite_power():
  _raises(ValueError, 'power_a must be a finite number > 0, got inf.', mqar.mqar_batch,
          jax.random.key(0), 2, power_a=math.inf, **MQAR)


# ----------------------------------------------------------------------------- mimicry shapes

def test_mimicry_hamiltonian_refuses_zero_query_rows():
  _raises(ValueError, 'q must hold at least one query row (every axis but the last >= 1), '
          'got shape (0, 4).', mimicry.mimicry_hamiltonian, OMEGA, Q[:0], K,
          feature_map='favor', lam=0.1)


def test_mimicry_hamiltonian_refuses_zero_keys():
  _raises(ValueError, 'k must hold at least one key (every axis but the last >= 1), got shape '
          '(0, 4).', mimicry.mimicry_hamiltonian, OMEGA, Q, K[:0], feature_map='favor', lam=0.1)


def test_mimicry_refuses_an_empty_leading_axis():
  _raises(ValueError, 'q must hold at least one query row (every axis but the last >= 1), '
          'got shape (0, 5, 4).', mimicry.attention_kl, Q[None][:0], K[None][:0], OMEGA)


# ----------------------------------------------------------------------------- keys

def test_mqar_batch_refuses_an_int_key():
  _raises(TypeError, KEY_ERROR + '0 (int).', mqar.mqar_batch, 0, 2, **MQAR)


def test_mqar_batch_refuses_a_batch_of_keys():
  _raises(TypeError, KEY_ERROR + 'a batch of 3 keys of shape (3,) (key<fry>); pass one key, '
          'or jax.vmap over the batch.', mqar.mqar_batch, jax.random.split(jax.random.key(0), 3),
          2, **MQAR)
  _raises(TypeError, KEY_ERROR + 'a batch of 3 raw keys of shape (3, 2) (uint32); pass one '
          'key, or jax.vmap over the batch.', mqar.mqar_batch,
          jax.random.split(jax.random.PRNGKey(0), 3), 2, **MQAR)


def test_mqar_batch_takes_one_typed_or_raw_key_and_vmaps_over_a_batch():
  typed = mqar.mqar_batch(jax.random.key(0), 2, **MQAR)
  raw = mqar.mqar_batch(jax.random.key_data(jax.random.key(0)), 2, **MQAR)
  np.testing.assert_array_equal(typed.inputs, raw.inputs)
  keys = jax.random.split(jax.random.key(0), 3)
  batched = jax.vmap(lambda k: mqar.mqar_batch(k, 2, **MQAR))(keys)
  assert batched.inputs.shape == (3, 2, 16)
  np.testing.assert_array_equal(batched.inputs[1], mqar.mqar_batch(keys[1], 2, **MQAR).inputs)


def test_train_hedgehog_refuses_an_int_key():
  _raises(TypeError, KEY_ERROR + '0 (int).', mimicry.train_hedgehog, 0, Q, K, 2, steps=2,
          learning_rate=0.1)


def test_train_hedgehog_refuses_a_batch_of_keys():
  _raises(TypeError, KEY_ERROR + 'a batch of 2 keys of shape (2,) (key<fry>); pass one key, '
          'or jax.vmap over the batch.', mimicry.train_hedgehog,
          jax.random.split(jax.random.key(0), 2), Q, K, 2, steps=2, learning_rate=0.1)


def test_check_key_describes_arrays_on_one_line():
  _raises(TypeError, KEY_ERROR + 'an array of dtype float32 and shape (64, 2) (ArrayImpl).',
          _checks.check_key, 'key', jnp.zeros((64, 2)))
  _raises(TypeError, KEY_ERROR + "'a' (str).", _checks.check_key, 'key', 'a')
  _raises(TypeError, KEY_ERROR + '0 (int).', langevin.langevin_transform, 0, step_size=0.1,
          beta=1.0, radius=1.0)
