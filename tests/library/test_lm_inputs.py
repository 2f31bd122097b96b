"""Bad ids and targets to the LM and the MQAR loss, and a feature map not the model's
(issue 39, item 2), one test each; every eager message is asserted in full.

Eager calls refuse a token outside [0, V), a negative token, float tokens, a position
outside [0, L) and a target outside [0, V) at an answer position. Under ``jit`` a bad token
at t makes its row's logits at t and after NaN and leaves the positions before t bit for
bit as with a valid token there. ``train_step`` / ``train_step_fn`` / ``force_terms`` refuse
a feature map other than the model's.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax.layers import lm
from coulomb_jax import training
from coulomb_jax.tasks import mqar

V, L, T = 32, 12, 7                        # vocabulary, length, the bad position
TOKENS = jax.random.randint(jax.random.key(1), (2, L), 1, V)       # [B, L]
MQAR = dict(vocab_size=V, seq_len=L, num_pairs=2)


def _raises(error, message, call, *args, **kwargs):
  """``call`` raises exactly ``error`` with exactly ``message`` (one line)."""
  with pytest.raises(error) as info:
    call(*args, **kwargs)
  assert info.type is error
  assert str(info.value) == message
  assert '\n' not in str(info.value)


@functools.lru_cache(maxsize=None)
def _model(attention='softmax', causal_path='fused', feature_map='favor'):
  model = lm.CausalLM(vocab_size=V, max_len=L, width=16, num_layers=2, num_heads=2,
                      attention=attention, feature_map=feature_map, num_features=8,
                      causal_path=causal_path, chunk_size=4, mlp_ratio=1)
  return model, model.init(jax.random.key(0), TOKENS)


# ------------------------------------------------------------------- eager: one line each

@pytest.mark.parametrize('bad,message', [
    (V, f'tokens must lie in [0, {V}), got {V} at index (1, 3) (1 such entries).'),
    (V + 100, f'tokens must lie in [0, {V}), got {V + 100} at index (1, 3) (1 such entries).'),
    (-3, f'tokens must lie in [0, {V}), got -3 at index (1, 3) (1 such entries).'),
])
@pytest.mark.parametrize('attention', ['softmax', 'kernel'])
def test_eager_lm_refuses_a_token_outside_the_vocabulary(attention, bad, message):
  model, params = _model(attention)
  _raises(ValueError, message, model.apply, params, TOKENS.at[1, 3].set(bad))


def test_eager_lm_refuses_bad_tokens_at_padded_positions_too():
  model, params = _model()
  mask = jnp.arange(L)[None] < jnp.array([[L], [5]])
  _raises(ValueError, f'tokens must lie in [0, {V}), got -1 at index (1, 9) (2 such entries).',
          model.apply, params, TOKENS.at[1, 9:11].set(-1), mask)


def test_lm_refuses_float_tokens_eagerly_and_under_jit():
  model, params = _model()
  message = 'tokens must be integers, got dtype float32.'
  _raises(ValueError, message, model.apply, params, TOKENS.astype(jnp.float32))
  _raises(ValueError, message, jax.jit(model.apply), params, TOKENS.astype(jnp.float32))
  _raises(ValueError, 'tokens must be integers, got dtype bool.', model.apply, params,
          TOKENS > 3)


def test_eager_lm_refuses_a_position_outside_the_sequence():
  model, params = _model()
  positions = jnp.array([[0, 3], [L, 1]])
  _raises(ValueError, f'positions must lie in [0, {L}), got {L} at index (1, 0) '
          '(1 such entries).', model.apply, params, TOKENS, None, positions)


def test_eager_mqar_loss_refuses_a_target_outside_the_vocabulary_at_an_answer():
  batch = mqar.mqar_batch(jax.random.key(3), 2, **MQAR)
  logits = jax.random.normal(jax.random.key(4), (2, L, V))
  row, col = (int(a[0]) for a in np.nonzero(np.asarray(batch.answer_mask)))
  for bad in (V, -1):
    targets = batch.targets.at[row, col].set(bad)
    _raises(ValueError, f'targets must lie in [0, {V}), got {bad} at index ({row}, {col}) '
            '(1 such entries).', training.lm.mqar_loss_and_accuracy, logits, targets,
            batch.answer_mask)
  _raises(ValueError, 'targets must be integers, got dtype float32.',
          training.lm.mqar_loss_and_accuracy, logits, batch.targets.astype(jnp.float32),
          batch.answer_mask)


@pytest.mark.parametrize('bad', [V, V + 100, -1, -5])
def test_jitted_mqar_loss_is_nan_for_a_target_outside_the_vocabulary(bad):
  batch = mqar.mqar_batch(jax.random.key(3), 2, **MQAR)
  logits = jax.random.normal(jax.random.key(4), (2, L, V))
  row, col = (int(a[0]) for a in np.nonzero(np.asarray(batch.answer_mask)))
  loss, acc = jax.jit(training.lm.mqar_loss_and_accuracy)(
      logits, batch.targets.at[row, col].set(bad), batch.answer_mask)
  assert np.isnan(float(loss))
  hits = np.argmax(np.asarray(logits), -1) == np.asarray(batch.targets)
  mask = np.asarray(batch.answer_mask)
  hits[row, col] = False
  assert float(acc) == pytest.approx(hits[mask].sum() / mask.sum())


def test_mqar_loss_ignores_targets_off_the_answer_mask():
  batch = mqar.mqar_batch(jax.random.key(3), 2, **MQAR)
  logits = jax.random.normal(jax.random.key(4), (2, L, V))
  free = np.argwhere(~np.asarray(batch.answer_mask))[0]
  targets = batch.targets.at[tuple(free)].set(V + 5)
  got = training.lm.mqar_loss_and_accuracy(logits, targets, batch.answer_mask)
  want = training.lm.mqar_loss_and_accuracy(logits, batch.targets, batch.answer_mask)
  assert np.isfinite(float(got[0]))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# -------------------------------------------------- under jit: the causal promise holds

@pytest.mark.parametrize('attention,causal_path', [
    ('softmax', 'fused'), ('kernel', 'fused'), ('kernel', 'materialized')])
@pytest.mark.parametrize('bad', [V, V + 100, -3, -1])
def test_jitted_lm_bad_token_never_reaches_earlier_positions(attention, causal_path, bad):
  model, params = _model(attention, causal_path)
  apply = jax.jit(model.apply)
  good = np.asarray(apply(params, TOKENS))
  for valid in (0, 5):                         # any valid id at T gives the same prefix
    np.testing.assert_array_equal(
        np.asarray(apply(params, TOKENS.at[0, T].set(valid)))[0, :T], good[0, :T])
  got = np.asarray(apply(params, TOKENS.at[0, T].set(bad)))
  np.testing.assert_array_equal(got[0, :T], good[0, :T])   # bit for bit
  assert np.isnan(got[0, T:]).all()                         # the bad token and after: NaN
  np.testing.assert_array_equal(got[1], good[1])            # the other row untouched


def test_jitted_lm_bad_token_at_answer_positions_only():
  model, params = _model('kernel')
  positions = jnp.array([[2, 6, 8], [1, 4, 11]])
  apply = jax.jit(model.apply)
  good = np.asarray(apply(params, TOKENS, None, positions))
  got = np.asarray(apply(params, TOKENS.at[0, T].set(-5), None, positions))
  np.testing.assert_array_equal(got[0, :2], good[0, :2])
  assert np.isnan(got[0, 2]).all()
  np.testing.assert_array_equal(got[1], good[1])


@pytest.mark.slow
def test_jitted_train_step_with_a_bad_token_after_the_answers_keeps_a_finite_loss():
  model, _ = _model('kernel')
  state = training.lm.make_state(jax.random.key(0), model, L)
  batch = mqar.mqar_batch(jax.random.key(3), 2, **MQAR)
  last = int(np.max(np.nonzero(np.asarray(batch.answer_mask))[1]))
  assert last < L - 1
  bad = batch._replace(inputs=batch.inputs.at[:, last + 1:].set(V + 7))
  _, want = training.lm.train_step(state, batch)
  _, got = training.lm.train_step(state, bad)
  assert float(got['loss']) == float(want['loss'])
  _, hit = training.lm.train_step(state, batch._replace(inputs=batch.inputs.at[:, 0].set(-1)))
  assert np.isnan(float(hit['loss']))           # every answer after it: the loss says so


# ------------------------------------------------------- train_step's feature map is the model's

FEATURE_MAP_ERROR = ("feature_map must be the model's feature map 'favor' "
                     "(CausalLM.feature_map), got 'elu'.")


def _mimicry_state():
  model, _ = _model('kernel')
  state = training.lm.make_state(jax.random.key(0), model, L)
  return (model, state, mqar.mqar_batch(jax.random.key(3), 4, **MQAR),
          training.lm.MimicrySettings(rows=2))


def test_flax_bound_apply_knows_its_model():
  model, state, _, _ = _mimicry_state()
  assert state.apply_fn.__self__ is model


@pytest.mark.slow
def test_train_step_refuses_another_feature_map_than_the_models():
  _, state, batch, settings = _mimicry_state()
  _raises(ValueError, FEATURE_MAP_ERROR, training.lm.train_step, state, batch, settings, 'elu')
  _raises(ValueError, FEATURE_MAP_ERROR, training.lm.train_step_fn, state, batch, settings, 'elu')
  vmapped = jax.vmap(lambda s: training.lm.train_step_fn(s, batch, settings, 'elu'))
  two = jax.tree.map(lambda a: jnp.stack([a, a]), state)
  _raises(ValueError, FEATURE_MAP_ERROR, vmapped, two)
  new, metrics = training.lm.train_step(state, batch, settings, 'favor')            # its own: runs
  assert np.isfinite(float(metrics['loss']))
  assert int(new.step) == 1


def test_force_terms_refuses_another_feature_map_than_the_models():
  model, state, batch, settings = _mimicry_state()
  _raises(ValueError, FEATURE_MAP_ERROR, training.lm.force_terms, state.params, batch, model,
          settings, 'elu')


@pytest.mark.slow
def test_train_step_without_mimicry_or_a_known_model_does_not_refuse():
  model, state, batch, settings = _mimicry_state()
  _, metrics = training.lm.train_step(state, batch, None, 'elu')       # feature_map unused
  assert np.isfinite(float(metrics['loss']))
  unknown = state.replace(apply_fn=lambda *a, **k: model.apply(*a, **k))
  assert getattr(unknown.apply_fn, '__self__', None) is None
  _, metrics = training.lm.train_step(unknown, batch, settings, 'elu')      # cannot tell: runs
  assert np.isfinite(float(metrics['loss']))
  softmax, _ = _model('softmax')
  plain = training.lm.make_state(jax.random.key(0), softmax, L)
  training.lm.check_feature_map(softmax, 'elu')                   # softmax attention has no map
  training.lm.check_feature_map(None, 'elu')
  assert plain.apply_fn.__self__ is softmax
