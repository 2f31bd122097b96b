"""``training.make_interleaved_step`` (issue 38 item 1: one step per target): Phase A on the
softmax target interleaved with training, for any Flax model. On the causal LM it is the LM's
own step (``training.lm.train_step``, which runs on the same ``interleaved_grads``) bit for bit;
on a user's model the particles move by the force alone and the rest by the task gradient."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from coulomb_jax import langevin
from coulomb_jax import training
from coulomb_jax.layers import lm
from coulomb_jax.layers import models
from coulomb_jax.tasks import mqar

SEQ, VOCAB, PAIRS = 32, 64, 4


def _batches(n):
  return [mqar.mqar_batch(jax.random.PRNGKey(100 + t), 4, seq_len=SEQ, vocab_size=VOCAB,
                          num_pairs=PAIRS) for t in range(n)]


@pytest.mark.slow
@pytest.mark.parametrize('with_task_gradient', [False, True])
def test_on_the_causal_lm_it_is_the_lms_own_step_bit_for_bit(with_task_gradient):
  model = lm.CausalLM(vocab_size=VOCAB, width=16, num_heads=2, num_layers=2, max_len=SEQ,
                      attention='kernel', feature_map='favor', num_features=8)
  tx = langevin.langevin_transform(jax.random.PRNGKey(9), step_size=1e-2, beta=1e4,
                                   radius=4.0)
  lm_state = training.lm.make_state(jax.random.PRNGKey(0), model, SEQ, learning_rate=3e-3,
                                    particle_tx=tx)
  settings = training.lm.MimicrySettings(lam=0.1, rows=2, with_task_gradient=with_task_gradient)
  step = jax.jit(training.make_interleaved_step(
      model, lm_state.tx, inputs=lambda b: (b.inputs, None, None),
      loss=lambda logits, b: training.lm.mqar_loss_and_accuracy(logits, b.targets,
                                                                b.answer_mask)[0],
      feature_map='favor', lam=settings.lam, s=settings.riesz_s, softening=settings.softening,
      rows=settings.rows, with_task_gradient=with_task_gradient))
  state = training.TrainState(0, lm_state.params, lm_state.opt_state)
  for batch in _batches(3):
    lm_state, lm_metrics = training.lm.train_step(lm_state, batch, settings, 'favor')
    state, metrics = step(state, batch)
    assert float(metrics['loss']) == float(lm_metrics['loss'])
    assert all(int(jnp.sum(c)) == 0 for c in metrics['nonfinite_grads'].values())
  jax.tree.map(np.testing.assert_array_equal, state.params, lm_state.params)


class _Classifier(nn.Module):
  """A user's model: embedding, one causal KernelAttention block, a linear head."""

  @nn.compact
  def __call__(self, ids):
    x = nn.Embed(VOCAB, 16)(ids)
    x = x + models.KernelAttention(num_heads=2, num_features=8, qk_mode='projected',
                                   causal=True, name='attention')(x)
    return nn.Dense(VOCAB)(nn.LayerNorm()(x))


@pytest.mark.slow
def test_on_a_users_model_the_particles_feel_the_force_and_the_rest_the_task():
  model = _Classifier()
  batch = _batches(1)[0]
  params = model.init(jax.random.PRNGKey(0), batch.inputs)['params']
  labels = training.partition_labels(params)
  optimizer = optax.multi_transform(
      {training.PARTICLES: optax.sgd(1.0), 'rest': optax.sgd(0.5)}, labels)
  loss = lambda logits, b: training.lm.mqar_loss_and_accuracy(logits, b.targets, b.answer_mask)[0]
  kw = dict(loss=loss, inputs=lambda b: (b.inputs,), feature_map='favor', lam=0.0, rows=4)
  step = jax.jit(training.make_interleaved_step(model, optimizer, **kw))
  state, metrics = step(training.TrainState.create(params, optimizer), batch)
  # The rest: plain SGD on the task gradient.
  task = jax.jit(jax.grad(lambda p: loss(model.apply({'params': p}, batch.inputs), batch)))(
      params)
  np.testing.assert_allclose(state.params['Dense_0']['kernel'],
                             params['Dense_0']['kernel'] - 0.5 * task['Dense_0']['kernel'],
                             rtol=1e-6, atol=1e-7)
  # The particles: the mimicry force of the layer's own (q, k), not the task gradient.
  @jax.jit
  def reference_force(params):
    _, sown = model.apply({'params': params}, batch.inputs, mutable=['intermediates'])
    return training.phase_a_mimicry.sown_forces(
        params, training.interleaved.sown_qk(sown['intermediates']), feature_map='favor',
        lam=0.0, s='coulomb', softening=0.5, rows=4).hamiltonian[('attention',)]
  force = reference_force(params)
  moved = params['attention']['particles'] - state.params['attention']['particles']
  # Two programs (the step's and the reference's): float32 rounding apart (entries ~1e-3).
  np.testing.assert_allclose(moved, force, rtol=1e-3, atol=2e-7)
  assert not np.allclose(force, task['attention']['particles'], atol=1e-6)
  assert np.isfinite(float(metrics['loss']))
