"""Both phases on a Flax model written here, not the repository's (issue 38, item 1).

The model mixes the two plug-ins: layer 0 is flax's ``MultiHeadDotProductAttention`` with
``kernel_attention_fn(omega, sow_into=self)`` and ``particles_param``, layer 1 is
``KernelAttention``. ``training.make_phase_a_step`` (label and softmax targets) and
``make_phase_b_step`` run on it through ``inputs`` / ``labels`` / ``mask`` / ``loss``.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from coulomb_jax import training
from coulomb_jax.layers import flax_attention
from coulomb_jax.layers import models

B, L, E, H, M, V = 8, 6, 16, 2, 8, 20


class FlaxBlock(nn.Module):
  """Flax's attention with the particles' map (the user's own block)."""

  @nn.compact
  def __call__(self, x, mask):
    omega = models.particles_param(self, H, M, E // H)
    fn = flax_attention.kernel_attention_fn(omega, 'favor', sow_into=self)
    mha = nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=fn)
    return x + mha(nn.LayerNorm()(x), mask=nn.make_attention_mask(mask, mask))


class Classifier(nn.Module):
  sow: bool = True

  @nn.compact
  def __call__(self, tokens, mask):
    x = nn.Embed(V, E)(tokens)
    if self.sow:
      x = FlaxBlock(name='block_0')(x, mask)
    x = x + models.KernelAttention(num_heads=H, num_features=M, name='block_1')(
        nn.LayerNorm()(x), mask)
    pooled = jnp.sum(x * mask[..., None], 1) / jnp.maximum(jnp.sum(mask, 1, keepdims=True), 1)
    return nn.Dense(2)(pooled)


def _batch(key=0):
  kt, ky = jax.random.split(jax.random.key(key))
  tokens = jax.random.randint(kt, (B, L), 0, V)
  mask = jnp.ones((B, L), bool).at[::2, 4:].set(False)
  return {'x': tokens, 'm': mask, 'y': (tokens[:, 0] < V // 2).astype(jnp.int32)}


INPUTS = lambda b: (b['x'], b['m'])


def _setup(model=Classifier()):
  batch = _batch()
  params = model.init(jax.random.key(1), *INPUTS(batch))['params']
  return model, params, batch


def _phase_a(target, steps=8, **kw):
  model, params, batch = _setup()
  opt = training.phase_a_optimizer(jax.random.key(2), step_size=1e-2, beta=float('inf'),
                                   radius=10.0, clip_norm=10.0)
  step = jax.jit(training.make_phase_a_step(model, opt, target=target, inputs=INPUTS,
                                            feature_map='favor', lam=0.0, s=1.0,
                                            softening=1e-3, **kw))
  state = training.TrainState(jnp.zeros((), jnp.int32), params, opt.init(params))
  history = []
  for _ in range(steps):
    state, metrics = step(state, batch)
    history.append(float(metrics['hamiltonian']))
  return params, state.params, history


def _changed(before, after):
  a, b = traverse_util.flatten_dict(before), traverse_util.flatten_dict(after)
  return {'/'.join(k) for k in a if not np.array_equal(np.asarray(a[k]), np.asarray(b[k]))}


@pytest.mark.slow
def test_phase_a_on_labels_moves_both_plug_ins_particles_and_lowers_h():
  before, after, history = _phase_a('labels', labels=lambda b: b['y'])
  assert _changed(before, after) == {'block_0/particles', 'block_1/particles'}
  assert history[-1] < history[0]


@pytest.mark.slow
def test_phase_a_on_softmax_lowers_the_cross_entropy_of_both_layers():
  before, after, history = _phase_a('softmax', mask=lambda b: b['m'])
  assert _changed(before, after) == {'block_0/particles', 'block_1/particles'}
  assert history[-1] < history[0]


@pytest.mark.slow
def test_phase_b_with_a_users_loss_trains_everything_but_the_particles():
  model, params, batch = _setup()
  opt = training.phase_b_optimizer(learning_rate=3e-2, warmup_steps=0, total_steps=20,
                                   weight_decay=0.0, clip_norm=1.0)
  loss = lambda logits, b: jnp.mean(
      optax.softmax_cross_entropy_with_integer_labels(logits, b['y']))
  step = jax.jit(training.make_phase_b_step(model, opt, loss=loss, inputs=INPUTS))
  state = training.TrainState(jnp.zeros((), jnp.int32), params, opt.init(params))
  losses = []
  for _ in range(15):
    state, metrics = step(jax.random.key(3), state, batch)
    losses.append(float(metrics['loss']))
  assert set(metrics) == {'loss', 'grad_norm'}
  assert losses[-1] < 0.7 * losses[0]
  changed = _changed(params, state.params)
  assert not any(k.endswith('particles') for k in changed)
  assert 'block_0/MultiHeadDotProductAttention_0/query/kernel' in changed


@pytest.mark.slow
def test_mistakes_are_one_line_naming_the_argument():
  model, params, batch = _setup()
  opt = training.phase_a_optimizer(jax.random.key(2), step_size=1e-2, beta=float('inf'),
                                   radius=10.0, clip_norm=10.0)
  state = training.TrainState(jnp.zeros((), jnp.int32), params, opt.init(params))
  common = dict(feature_map='favor', lam=0.0, s=1.0, softening=1e-3)
  with pytest.raises(ValueError, match="labels: the batch has no 'labels'"):
    training.make_phase_a_step(model, opt, inputs=INPUTS, **common)(state, batch)
  with pytest.raises(ValueError, match="mask: the batch has no 'mask'"):
    training.make_phase_a_step(model, opt, target='softmax', inputs=INPUTS, **common)(
        state, batch)
  with pytest.raises(ValueError, match="inputs: the batch has no 'ids'"):
    training.make_phase_a_step(model, opt, labels=lambda b: b['y'], **common)(state, batch)
  with pytest.raises(ValueError, match="target must be one of"):
    training.make_phase_a_step(model, opt, target='label', **common)
  with pytest.raises(ValueError, match="mask: the label target"):
    training.make_phase_a_step(model, opt, mask=lambda b: b['m'], **common)
  # An attention_fn without sow_into: the block's particles get no data.
  class Unsown(nn.Module):
    @nn.compact
    def __call__(self, tokens, mask):
      omega = models.particles_param(self, H, M, E // H)
      x = nn.Embed(V, E)(tokens)
      fn = flax_attention.kernel_attention_fn(omega)
      return nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=fn)(x)
  unsown = Unsown()
  p = unsown.init(jax.random.key(1), *INPUTS(batch))['params']
  with pytest.raises(ValueError, match='no attention layer sowed'):
    training.phase_a_inputs(unsown, p, batch, inputs=INPUTS)
  with pytest.raises(ValueError, match="loss: the batch has no 'labels'"):
    opt_b = training.phase_b_optimizer(learning_rate=1e-2, warmup_steps=0, total_steps=2,
                                       weight_decay=0.0, clip_norm=1.0)
    training.make_phase_b_step(model, opt_b, inputs=INPUTS)(
        jax.random.key(0), training.TrainState(0, params, opt_b.init(params)), batch)


def test_train_state_create_and_both_targets_report_nonfinite_particles():
  model, params, batch = _setup()
  opt = training.phase_a_optimizer(jax.random.key(2), step_size=1e-2, beta=float('inf'),
                                   radius=10.0, clip_norm=10.0)
  state = training.TrainState.create(params, opt)
  assert int(state.step) == 0
  assert jax.tree.structure(state.opt_state) == jax.tree.structure(opt.init(params))
  flat = traverse_util.flatten_dict(params)
  flat[('block_1', 'particles')] = flat[('block_1', 'particles')].at[1, 0, 0].set(jnp.nan)
  bad = training.TrainState.create(traverse_util.unflatten_dict(flat), opt)
  common = dict(inputs=INPUTS, feature_map='favor', lam=0.0, s=1.0, softening=1e-3)
  for target, extra in (('labels', dict(labels=lambda b: b['y'])),
                        ('softmax', dict(mask=lambda b: b['m']))):
    step = jax.jit(training.make_phase_a_step(model, opt, target=target, **common, **extra))
    _, metrics = step(bad, batch)
    first = training.first_nonfinite(jax.device_get(metrics))
    assert first == ('particles', 'block_1/particles', 1, 1), (target, first)
