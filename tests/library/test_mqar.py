"""MQAR generator (coulomb_jax.tasks.mqar) and the small causal LM (coulomb_jax.layers.lm)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax.layers import lm
from coulomb_jax import training
from coulomb_jax.tasks import mqar

V, L, P = 64, 32, 4


@functools.lru_cache(maxsize=None)
def batch(seed=0, num=8, power_a=0.01):
  return mqar.mqar_batch(jax.random.key(seed), num, vocab_size=V, seq_len=L, num_pairs=P,
                         power_a=power_a)


def test_shapes_dtypes_and_one_answer_per_key():
  b = batch()
  assert b.inputs.shape == b.targets.shape == b.answer_mask.shape == (8, L)
  assert b.inputs.dtype == b.targets.dtype == jnp.int32 and b.answer_mask.dtype == bool
  np.testing.assert_array_equal(np.sum(np.asarray(b.answer_mask), axis=1), P)
  assert np.all(np.asarray(b.inputs) >= 1) and np.all(np.asarray(b.inputs) < V)


def test_answers_are_the_paired_values_and_halves_are_disjoint():
  b = jax.tree_util.tree_map(np.asarray, batch())
  for x, y, m in zip(b.inputs, b.targets, b.answer_mask):
    keys, values = x[0:2 * P:2], x[1:2 * P:2]
    assert len(set(keys)) == P and len(set(values)) == P
    assert np.all((keys >= 1) & (keys < V // 2)) and np.all(values >= V // 2)
    pairs = dict(zip(keys, values))
    pos = np.flatnonzero(m)
    assert np.all(pos >= 2 * P) and np.all((pos - 2 * P) % 2 == 0)
    assert sorted(x[pos]) == sorted(keys)              # every key queried exactly once
    for t in pos:
      assert y[t] == pairs[x[t]]
    assert np.all(y[~m] == 0)


def test_deterministic_for_a_key_and_keys_differ():
  a, b, c = batch(0), mqar.mqar_batch(jax.random.key(0), 8, vocab_size=V, seq_len=L,
                                      num_pairs=P), batch(1)
  for u, v in zip(a, b):
    np.testing.assert_array_equal(u, v)
  assert not np.array_equal(a.inputs, c.inputs)


def test_power_law_puts_queries_near_the_context():
  # p(g) ∝ (g+1)^(a-1) with a = 0.01 over S = 12 slots: P(first slot) ≈ 0.3, so among
  # the 4·64 queries the first slot is by far the most frequent; a = 1 is uniform.
  near = mqar.mqar_batch(jax.random.key(3), 64, vocab_size=V, seq_len=L, num_pairs=P)
  flat = mqar.mqar_batch(jax.random.key(3), 64, vocab_size=V, seq_len=L, num_pairs=P,
                         power_a=1.0)
  first = lambda b: np.mean(np.asarray(b.answer_mask)[:, 2 * P])
  assert first(near) > 0.7 and first(flat) < 0.6    # 4 of 12 slots → 1/3 expected


@pytest.mark.parametrize('kwargs, name', [
    (dict(vocab_size=32, seq_len=32, num_pairs=4), 'vocab_size'),
    (dict(vocab_size=64, seq_len=32, num_pairs=9), 'num_pairs'),
    (dict(vocab_size=64, seq_len=32, num_pairs=0), 'num_pairs'),
    (dict(vocab_size=64, seq_len=0, num_pairs=4), 'seq_len'),
    (dict(vocab_size=64, seq_len=32, num_pairs=4.0), 'num_pairs'),
    (dict(vocab_size=64, seq_len=32, num_pairs=4, power_a=0.0), 'power_a'),
])
def test_bad_arguments_raise_naming_them(kwargs, name):
  with pytest.raises(ValueError, match=name):
    mqar.mqar_batch(jax.random.key(0), 2, **kwargs)
  with pytest.raises(ValueError, match='num_examples'):
    mqar.mqar_batch(jax.random.key(0), 0, vocab_size=64, seq_len=32, num_pairs=4)


def tiny(attention, feature_map='favor'):
  return lm.CausalLM(vocab_size=V, max_len=16, width=16, num_layers=1, num_heads=2,
                     attention=attention, feature_map=feature_map, num_features=8,
                     mlp_ratio=2)


@pytest.mark.parametrize('attention, feature_map', [
    ('softmax', 'favor'), ('kernel', 'favor'), ('kernel', 'elu')])
def test_causal_and_padding_changes_nothing_at_real_positions(attention, feature_map):
  model = tiny(attention, feature_map)
  k1, k2, k3 = jax.random.split(jax.random.key(7), 3)
  tokens = jax.random.randint(k1, (2, 16), 1, V)
  params = jax.jit(model.init)(k2, tokens)['params']
  apply = jax.jit(lambda t, m: model.apply({'params': params}, t, m))
  full = jnp.ones((2, 16), bool)
  base = apply(tokens, full)
  assert base.shape == (2, 16, V) and bool(jnp.all(jnp.isfinite(base)))
  t = 6                                                    # change tokens after t
  later = tokens.at[:, t + 1:].set(jax.random.randint(k3, (2, 16 - t - 1), 1, V))
  np.testing.assert_allclose(apply(later, full)[:, :t + 1], base[:, :t + 1],
                             rtol=1e-5, atol=1e-5)
  assert not np.allclose(apply(later, full)[:, t + 1:], base[:, t + 1:], atol=1e-3)
  # Padding: positions 2, 9 and the tail are padded; their tokens must not matter.
  pad = full.at[:, 2].set(False).at[:, 9].set(False).at[:, 13:].set(False)
  other = jnp.where(pad, tokens, (tokens + 5) % (V - 1) + 1)
  np.testing.assert_allclose(apply(other, pad)[pad], apply(tokens, pad)[pad],
                             rtol=1e-5, atol=1e-5)


def test_kernel_model_has_particles_per_layer():
  tokens = jnp.zeros((1, 16), jnp.int32)
  params = jax.eval_shape(tiny('kernel').init, jax.random.key(0), tokens)['params']
  assert params['block_0']['attn']['particles'].shape == (2, 8, 8)   # [H, M, D_h]


def test_loss_and_accuracy_count_answer_positions_only():
  k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
  logits = jax.random.normal(k1, (3, 5, 7))
  targets = jax.random.randint(k2, (3, 5), 0, 7)
  mask = jax.random.bernoulli(k3, 0.4, (3, 5))
  loss, acc = training.lm.mqar_loss_and_accuracy(logits, targets, mask)
  lg, tg, mk = map(np.asarray, (logits, targets, mask))
  ces, hits = [], []
  for b in range(3):
    for t in range(5):
      if mk[b, t]:
        row = lg[b, t].astype(np.float64)
        ces.append(np.log(np.sum(np.exp(row - row.max()))) + row.max() - row[tg[b, t]])
        hits.append(float(np.argmax(row) == tg[b, t]))
  np.testing.assert_allclose(loss, np.mean(ces), rtol=1e-5)
  np.testing.assert_allclose(acc, np.mean(hits), rtol=1e-6)
  # Changing logits off the mask changes nothing; an empty mask gives 0, not NaN.
  moved = jnp.where(mask[..., None], logits, 100.0 * logits)
  np.testing.assert_allclose(training.lm.mqar_loss_and_accuracy(moved, targets, mask), (loss, acc),
                             rtol=1e-6)
  empty = training.lm.mqar_loss_and_accuracy(logits, targets, jnp.zeros((3, 5), bool))
  assert float(empty[0]) == 0.0 and float(empty[1]) == 0.0


def test_model_rejects_bad_fields():
  tokens = jnp.zeros((1, 16), jnp.int32)
  for model, name in [(tiny('linear'), 'attention'), (tiny('kernel', 'rff'), 'feature_map'),
                      (tiny('softmax').clone(width=15), 'width'),
                      (tiny('softmax').clone(max_len=8), 'max_len')]:
    with pytest.raises(ValueError, match=name):
      model.init(jax.random.key(0), tokens)


@pytest.mark.slow
def test_a_few_train_steps_lower_the_loss_softmax():
  model = lm.CausalLM(vocab_size=V, max_len=L, width=32, num_layers=2, num_heads=2,
                      mlp_ratio=2)
  state = training.lm.make_state(jax.random.key(0), model, L, learning_rate=3e-3)
  held_out = batch(99, 64)
  before = training.lm.evaluate(state.params, held_out, model)
  for step in range(40):
    state, metrics = training.lm.train_step(state, batch(100 + step % 8, 32))
  after = training.lm.evaluate(state.params, held_out, model)
  # Chance over V = 64 tokens is log 64 ≈ 4.2; predicting any value of the upper half
  # alone gives log 32 ≈ 3.5. Forty steps must reach well below the start.
  assert float(before['loss']) > 3.8
  assert float(after['loss']) < float(before['loss']) - 0.5
  assert np.isfinite(float(metrics['loss']))


def test_kernel_train_step_is_finite_and_moves_the_particles():
  model = tiny('kernel', 'favor')
  state = training.lm.make_state(jax.random.key(2), model, 16, learning_rate=1e-2)
  data = mqar.mqar_batch(jax.random.key(5), 4, vocab_size=V, seq_len=16, num_pairs=2)
  new, metrics = training.lm.train_step(state, data)
  assert np.isfinite(float(metrics['loss'])) and 0.0 <= float(metrics['accuracy']) <= 1.0
  old_w = state.params['block_0']['attn']['particles']
  new_w = new.params['block_0']['attn']['particles']
  assert bool(jnp.all(jnp.isfinite(new_w))) and not np.allclose(old_w, new_w)


def test_frozen_particles_stay_and_the_rest_trains():
  import optax  # pylint: disable=g-import-not-at-top
  model = tiny('kernel', 'favor')
  state = training.lm.make_state(jax.random.key(2), model, 16, learning_rate=1e-2,
                                 particle_tx=optax.set_to_zero())
  data = mqar.mqar_batch(jax.random.key(5), 4, vocab_size=V, seq_len=16, num_pairs=2)
  new, _ = training.lm.train_step(state, data)
  np.testing.assert_array_equal(new.params['block_0']['attn']['particles'],
                                state.params['block_0']['attn']['particles'])
  assert not np.allclose(new.params['head']['kernel'], state.params['head']['kernel'])


@pytest.mark.slow
def test_mimicry_forces_are_the_per_head_hamiltonian_gradient():
  from coulomb_jax import mimicry  # pylint: disable=g-import-not-at-top
  model = tiny('kernel', 'favor')
  params = training.lm.make_state(jax.random.key(2), model, 16).params
  data = mqar.mqar_batch(jax.random.key(5), 4, vocab_size=V, seq_len=16, num_pairs=2)
  _, inter = model.apply({'params': params}, data.inputs, mutable=['intermediates'])
  (q, k), = inter['intermediates']['block_0']['attn']['mimicry_inputs']
  assert q.shape == k.shape == (4, 16, model.num_heads, model.width // model.num_heads)
  settings = training.lm.MimicrySettings(lam=0.1, rows=3)
  forces = training.lm.mimicry_forces(params, {('block_0', 'attn'): (q, k)}, settings, 'favor')
  omega = params['block_0']['attn']['particles']
  for h in range(model.num_heads):
    want = jax.grad(lambda w: mimicry.mimicry_hamiltonian(
        w, q[:3, :, h], k[:3, :, h], feature_map='favor', lam=0.1))(omega[h])
    np.testing.assert_allclose(forces[('block_0', 'attn')][h], want, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_langevin_on_the_mimicry_force_lowers_the_attention_cross_entropy():
  from coulomb_jax import langevin  # pylint: disable=g-import-not-at-top
  from coulomb_jax import mimicry  # pylint: disable=g-import-not-at-top
  model = tiny('kernel', 'favor')
  tx = langevin.langevin_transform(jax.random.key_data(jax.random.key(3)), step_size=1e-3,
                                   beta=jnp.inf, radius=100.0)
  state = training.lm.make_state(jax.random.key(2), model, 16, learning_rate=1e-9,
                                 particle_tx=tx)
  data = mqar.mqar_batch(jax.random.key(5), 4, vocab_size=V, seq_len=16, num_pairs=2)
  settings = training.lm.MimicrySettings(lam=0.0, rows=4)

  def ce(params):
    _, inter = model.apply({'params': params}, data.inputs, mutable=['intermediates'])
    (q, k), = inter['intermediates']['block_0']['attn']['mimicry_inputs']
    w = params['block_0']['attn']['particles']
    return sum(float(mimicry.attention_cross_entropy(q[:, :, h], k[:, :, h], w[h], 'favor'))
               for h in range(model.num_heads))

  before = ce(state.params)
  for _ in range(3):
    state, _ = training.lm.train_step(state, data, settings, 'favor')
  assert ce(state.params) < before


@pytest.mark.slow
@pytest.mark.parametrize('feature_map', ['favor', 'elu', 'softmaxfeat'])
def test_materialized_causal_path_equals_the_fused_one(feature_map):
  from coulomb_jax.layers import models  # pylint: disable=g-import-not-at-top
  x = jax.random.normal(jax.random.key(0), (2, 12, 8))
  mask = jnp.arange(12)[None, :] < jnp.array([[12], [7]])
  fused = models.KernelAttention(2, feature_map, 6, qk_mode='projected', causal=True,
                                 chunk_size=4)
  mat = fused.clone(causal_path='materialized')
  params = fused.init(jax.random.key(1), x, mask)
  out_f, out_m = fused.apply(params, x, mask), mat.apply(params, x, mask)
  np.testing.assert_allclose(out_m, out_f, rtol=2e-5, atol=2e-6)
  grad = lambda m: jax.grad(lambda p: jnp.sum(m.apply(p, x, mask)[mask] ** 2))(params)
  np.testing.assert_allclose(grad(mat)['params']['particles'],
                             grad(fused)['params']['particles'], rtol=1e-4, atol=1e-6)
  with pytest.raises(ValueError, match='causal_path'):
    fused.clone(causal_path='dense').init(jax.random.key(1), x, mask)
