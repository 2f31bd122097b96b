"""``conversion.fit_in_model``: the fit inside a model whose attention layers already hold
particles (each step re-records the model's own attention). It is the causal LM's mimicry
step of ``training.lm.train_step`` with every other weight frozen; nothing else moves; bad
inputs are one line. And ``'hedgehog'`` is ``'adam'`` with the map ``hedgehog``."""

import math

import jax
import numpy as np
import optax
import pytest
from flax import traverse_util
from flax.training import train_state

from coulomb_jax import conversion
from coulomb_jax import langevin
from coulomb_jax import training
from coulomb_jax.layers import lm
from coulomb_jax.tasks import mqar

VOCAB, LENGTH, ROWS = 32, 16, 4
LAYERS = (('block_0', 'attn'), ('block_1', 'attn'))


def _model(feature_map='favor', **kwargs):
  return lm.CausalLM(vocab_size=VOCAB, max_len=LENGTH, width=16, num_layers=2, num_heads=2,
                     attention='kernel', feature_map=feature_map, num_features=8, **kwargs)


def _batches(n):
  return [mqar.mqar_batch(jax.random.fold_in(jax.random.key(1), t), ROWS, vocab_size=VOCAB,
                          seq_len=LENGTH, num_pairs=2, power_a=0.01) for t in range(n)]


def _inputs(batch):
  return (batch.inputs,)


_SETUPS = {
    # method: (the model, its map, the LM's particle transformation, the fit's settings)
    'gradient_flow': (dict(orthogonal=True), 'favor',
                      langevin.langevin_transform(jax.random.key(5), step_size=3e-3,
                                                  beta=math.inf, radius=1.5, clip_norm=None),
                      conversion.FitSettings(step_size=3e-3, radius=1.5, clip_norm=None,
                                             lam=0.0)),
    'hedgehog': (dict(identity_init=True), 'hedgehog', optax.adam(3e-3),
                 conversion.FitSettings(learning_rate=3e-3, lam=0.0)),
}


@pytest.mark.slow
@pytest.mark.parametrize('method', sorted(_SETUPS))
def test_the_fit_is_the_lms_mimicry_step_with_every_other_weight_frozen(method):
  kwargs, feature_map, particle_tx, settings = _SETUPS[method]
  model = _model(feature_map, **kwargs)
  params = training.lm.make_state(jax.random.key(0), model, LENGTH).params
  batches = _batches(3)
  tx = optax.partition({training.PARTICLES: particle_tx, 'rest': optax.set_to_zero()},
                       training.partition_labels)
  reference = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
  for batch in batches:     # the LM's Phase A force alone (λ = 0), every row of the batch
    reference, _ = training.lm.train_step(reference, batch,
                                          training.lm.MimicrySettings(lam=0.0, rows=ROWS),
                                          feature_map)
  fitted, losses = conversion.fit_in_model(jax.random.key(2), model, {'params': params},
                                           batches, method=method, steps=3,
                                           feature_map=feature_map, settings=settings,
                                           inputs=_inputs)
  assert sorted(losses) == sorted(LAYERS)
  before = traverse_util.flatten_dict(params)
  after = traverse_util.flatten_dict(fitted['params'])
  expected = traverse_util.flatten_dict(reference.params)
  for leaf, value in after.items():
    if leaf[-1] == training.PARTICLES:
      assert losses[leaf[:-1]].shape == (3, 2) and np.isfinite(losses[leaf[:-1]]).all()
      assert float(np.max(np.abs(value - before[leaf]))) > 1e-5
      # Adam: the same update; gradient flow: langevin_transform adds its step back to the
      # particles (one more rounding than langevin_step), so a few float32 ulps apart.
      np.testing.assert_allclose(value, expected[leaf], rtol=1e-5, atol=1e-6)
    else:
      np.testing.assert_array_equal(value, before[leaf])


def test_hedgehog_is_adam_with_the_map_hedgehog_bit_for_bit():
  model = _model('hedgehog', identity_init=True)
  params = training.lm.make_state(jax.random.key(0), model, LENGTH).params
  recorded = conversion.record_attention(model, {'params': params}, _batches(2), inputs=_inputs)
  fits = [conversion.fit_features(jax.random.key(3), recorded, method=m, num_features=8,
                                  steps=3, feature_map='hedgehog') for m in ('hedgehog', 'adam')]
  for path in fits[0][0]:
    np.testing.assert_array_equal(fits[0][0][path], fits[1][0][path])
    np.testing.assert_array_equal(fits[0][1][path], fits[1][1][path])
  draw = conversion.initial_features(jax.random.key(4), 2, 8, 8, method='adam',
                                     feature_map='softmaxfeat')
  np.testing.assert_array_equal(draw, conversion.initial_features(
      jax.random.key(4), 2, 8, 8, method='hedgehog'))


@pytest.mark.slow
def test_the_fit_of_a_later_layer_sees_the_features_fitted_below_it():
  model = _model(orthogonal=True)
  params = training.lm.make_state(jax.random.key(0), model, LENGTH).params
  batch = _batches(1)
  fitted, _ = conversion.fit_in_model(jax.random.key(2), model, {'params': params}, batch,
                                      method='gradient_flow', steps=1, inputs=_inputs)
  before = conversion.attention_records(model, {'params': params}, batch[0], inputs=_inputs)
  after = conversion.attention_records(model, fitted, batch[0], inputs=_inputs)
  np.testing.assert_array_equal(after[LAYERS[0]].q, before[LAYERS[0]].q)
  assert float(np.max(np.abs(after[LAYERS[1]].q - before[LAYERS[1]].q))) > 0


@pytest.mark.parametrize('change, message', [
    (dict(model=lm.CausalLM(vocab_size=VOCAB, max_len=LENGTH, width=16, num_layers=2,
                            num_heads=2, attention='softmax')),
     r"^model: attention layers \['block_0/attn/mha', 'block_1/attn/mha'\] hold no "
     r"'particles'"),
    (dict(variables='params'), r"^variables must be a dict with the model's 'params', got str"),
    (dict(steps=0), r'^steps'),
    (dict(batches=[]), r'^batches must hold at least one batch, got none\.$'),
    (dict(method='newton'), r'^method must be one of'),
    (dict(method='adam', feature_map='rff'), r'^feature_map must be one of'),
])
def test_bad_arguments_are_one_line_each(change, message):
  kwargs = dict(model=_model(orthogonal=True), batches=_batches(1), method='gradient_flow',
                steps=1)
  kwargs.update(change)
  if 'variables' not in kwargs:
    kwargs['variables'] = {'params': training.lm.make_state(jax.random.key(0), kwargs['model'],
                                                            LENGTH).params}
  with pytest.raises(ValueError, match=message):
    conversion.fit_in_model(jax.random.key(2), kwargs.pop('model'), kwargs.pop('variables'),
                            kwargs.pop('batches'), inputs=_inputs, **kwargs)
