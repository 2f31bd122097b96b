"""One path from sown queries and keys to per-head mimicry forces (issue 37 item 3, issue 38
item 1): ``phase_a_mimicry.sown_forces``, called by the softmax target's Phase A step and by
the causal LM's step. The callers give, bit for bit, what their own code gave before: the
frozen copies below are that code (lm.py and phase_a_mimicry.py as of f26a6d4, unchanged
through c7beeea), compared with ``assert_array_equal``. One LM step (favor, Langevin, repulsion) and one
Phase A step (the softmax target on a user's model) stay here; the other callers
(hedgehog with the task gradient, the vmapped traced λ, ``training.lm.force_terms``, the Phase A
forces and objective, eager and jitted) were compared the same way at 4e68246 and dropped
from the suite for its time.
"""


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from coulomb_jax import langevin
from coulomb_jax import langevin_diagnostics
from coulomb_jax import mimicry
from coulomb_jax import repulsion
from coulomb_jax import training
from coulomb_jax.layers import flax_attention
from coulomb_jax.layers import lm
from coulomb_jax.layers import models
from coulomb_jax.tasks import mqar
from coulomb_jax.training import phase_a_mimicry

# ----------------------------------------------------------------------------- frozen: lm


def _old_metrics(params, apply_fn, batch, num_answers=None):
  pos, targets, mask = training.lm._answers(batch, num_answers)  # pylint: disable=protected-access
  logits = apply_fn({'params': params}, batch.inputs, None, pos)
  return training.lm.mqar_loss_and_accuracy(logits, targets, mask)


def _old_metrics_and_inputs(params, apply_fn, batch, num_answers=None):
  pos, targets, mask = training.lm._answers(batch, num_answers)  # pylint: disable=protected-access
  logits, state = apply_fn({'params': params}, batch.inputs, None, pos,
                           mutable=['intermediates'])
  loss, acc = training.lm.mqar_loss_and_accuracy(logits, targets, mask)
  flat = traverse_util.flatten_dict(state.get('intermediates', {}))
  inputs = {k[:-1]: v[0] for k, v in flat.items() if k[-1] == flax_attention.MIMICRY_INPUTS}
  return loss, (acc, inputs)


def _old_lm_forces(params, inputs, settings, feature_map):
  flat = traverse_util.flatten_dict(params)

  def energy(omega, q, k):
    return mimicry.mimicry_hamiltonian(
        omega, q, k, feature_map=feature_map, lam=settings.lam, s=settings.riesz_s,
        softening=settings.softening, target=settings.target)

  forces = {}
  for path, (q, k) in inputs.items():
    q, k = (jax.lax.stop_gradient(jnp.moveaxis(x[:settings.rows], 2, 0)) for x in (q, k))
    omega = flat[path + (training.PARTICLES,)]
    forces[path] = jax.vmap(jax.grad(energy))(omega, q, k)
  return forces


def _old_train_step_fn(state, batch, mimicry_settings=None, feature_map='favor',
                       num_answers=None):
  if mimicry_settings is None:
    grad_fn = jax.value_and_grad(_old_metrics, has_aux=True)
    (loss, acc), grads = grad_fn(state.params, state.apply_fn, batch, num_answers)
  else:
    grad_fn = jax.value_and_grad(_old_metrics_and_inputs, has_aux=True)
    (loss, (acc, inputs)), grads = grad_fn(state.params, state.apply_fn, batch, num_answers)
    flat = traverse_util.flatten_dict(grads)
    for path, force in _old_lm_forces(state.params, inputs, mimicry_settings,
                                      feature_map).items():
      leaf = path + (training.PARTICLES,)
      flat[leaf] = flat[leaf] + force if mimicry_settings.with_task_gradient else force
    grads = traverse_util.unflatten_dict(flat)
  return state.apply_gradients(grads=grads), {'loss': loss, 'accuracy': acc}


_old_train_step = jax.jit(_old_train_step_fn,
                          static_argnames=('mimicry_settings', 'feature_map', 'num_answers'))


# ----------------------------------------------------------------------------- frozen: Phase A


def _old_query_mean(fn, omega, q, k, mask, feature_map):
  q = jnp.where(mask[..., None], q, 0.0)
  return fn(q, k, omega, feature_map, mask, mask)


def _old_per_head(fn, omega, qk, mask, feature_map):
  q, k = (jnp.asarray(x, jnp.float32) for x in qk)
  return jax.vmap(lambda w, qh, kh: _old_query_mean(fn, w, qh, kh, mask, feature_map),
                  in_axes=(0, 2, 2))(omega, q, k)


def _old_objective(params, inputs, mask, *, feature_map, lam, s, softening):
  flat = traverse_util.flatten_dict(params)
  mask = jnp.asarray(mask, bool)
  total = ce = repel = 0.0
  for path, qk in inputs.items():
    omega = flat[path + (training.PARTICLES,)]
    c = jnp.sum(_old_per_head(mimicry.attention_cross_entropy, omega, qk, mask, feature_map))
    w = jnp.sum(jax.vmap(lambda o: repulsion.riesz_energy(o, s, softening))(omega))
    total, ce, repel = total + c + lam * w, ce + c, repel + w
  return total, {'cross_entropy': ce, 'repulsion': repel}


def _old_grads(params, inputs, mask, kw):
  def data_term(p):
    h, aux = _old_objective(p, inputs, mask, **kw)
    return aux['cross_entropy'], (h, aux)

  (_, (h, aux)), g_ce = jax.value_and_grad(data_term, has_aux=True)(params)
  g_w = jax.grad(lambda p: _old_objective(p, inputs, mask, **kw)[1]['repulsion'])(params)
  return h, aux, g_ce, g_w


def _old_phase_a_step(model, optimizer, *, feature_map, lam, s, softening, only=None,
                      langevin_settings=None, inputs=None, mask=None, apply_kwargs=None):
  kw = dict(feature_map=feature_map, lam=lam, s=s, softening=softening)
  only = None if only is None else tuple(only)
  token_mask_of = phase_a_mimicry.token_mask if mask is None else mask
  leaves, counts = training.particle_leaves, training.nonfinite_counts

  def step(state, batch):
    data = phase_a_mimicry.mimicry_inputs(model, state.params, batch, inputs=inputs,
                                          apply_kwargs=apply_kwargs)
    if only is not None:
      data = {only: data[only]}
    h, aux, g_ce, g_w = _old_grads(state.params, data, token_mask_of(batch), kw)
    grads = jax.tree.map(lambda a, b: a + lam * b, g_ce, g_w)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    moves = [jnp.max(jnp.linalg.norm(u, axis=-1)) for u in leaves(updates, only).values()]
    metrics = dict(aux, hamiltonian=h, max_move=jnp.max(jnp.stack(moves)),
                   nonfinite_particles=counts(state.params, only),
                   nonfinite_grads=counts(grads, only))
    if langevin_settings is not None:
      ls = langevin_settings
      metrics.update(drift_to_noise=langevin_diagnostics.drift_to_noise(
          leaves(grads, only), step_size=ls['step_size'], beta=ls['beta'],
          clip_norm=ls.get('clip_norm')), repulsion_to_alignment=langevin_diagnostics.force_ratio(
              leaves(g_w, only), leaves(g_ce, only), lam))
    return training.TrainState(state.step + 1, params, opt_state), metrics

  return step


# ----------------------------------------------------------------------------- helpers

def _host(x):
  x = jnp.asarray(x)
  return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
                    else x)


def _equal(new, old):
  """Same tree structure and every leaf bit for bit (NaN patterns included)."""
  assert jax.tree.structure(new) == jax.tree.structure(old)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(_host(a), _host(b)), new, old)


V, LENGTH, PAIRS = 32, 16, 2


def _lm(feature_map, **kw):
  return lm.CausalLM(vocab_size=V, max_len=LENGTH, width=16, num_layers=2, num_heads=2,
                     attention='kernel', feature_map=feature_map, mlp_ratio=1, **kw)


def _mqar(t):
  return mqar.mqar_batch(jax.random.fold_in(jax.random.key(1), t), 6, vocab_size=V,
                         seq_len=LENGTH, num_pairs=PAIRS, power_a=0.01)


def _langevin_state(model):
  tx = langevin.langevin_transform(jax.random.key(5), step_size=3e-3, beta=200.0, radius=2.0,
                                   clip_norm=10.0)
  return training.lm.make_state(jax.random.key(0), model, LENGTH, learning_rate=1e-2,
                                particle_tx=tx)


# ----------------------------------------------------------------------------- the LM

@pytest.mark.slow
@pytest.mark.parametrize('num_answers', [PAIRS])
def test_lm_train_step_favor_langevin_with_repulsion_as_before_bit_for_bit(num_answers):
  model = _lm('favor', num_features=8, orthogonal=True)
  settings = training.lm.MimicrySettings(lam=0.05, rows=4)
  old = new = _langevin_state(model)
  for t in range(3):
    old, old_m = _old_train_step(old, _mqar(t), settings, 'favor', num_answers)
    new, new_m = training.lm.train_step(new, _mqar(t), settings, 'favor', num_answers)
    _equal(new_m, old_m)
  assert not np.array_equal(new.params['block_1']['attn']['particles'],
                            _langevin_state(model).params['block_1']['attn']['particles'])
  _equal(new.params, old.params)
  _equal(new.opt_state, old.opt_state)


# ----------------------------------------------------------------------------- Phase A

B, L, E, H, M, VOCAB = 6, 6, 16, 2, 8, 20


class _FlaxBlock(nn.Module):
  """flax's attention with the particles' map (a user's own block, as tests/library/test_own_model.py)."""

  @nn.compact
  def __call__(self, x, mask):
    omega = models.particles_param(self, H, M, E // H)
    fn = flax_attention.kernel_attention_fn(omega, 'favor', sow_into=self)
    mha = nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=fn)
    return x + mha(nn.LayerNorm()(x), mask=nn.make_attention_mask(mask, mask))


class _Classifier(nn.Module):

  @nn.compact
  def __call__(self, tokens, mask):
    x = nn.Embed(VOCAB, E)(tokens)
    x = _FlaxBlock(name='block_0')(x, mask)
    x = x + models.KernelAttention(num_heads=H, num_features=M, name='block_1')(
        nn.LayerNorm()(x), mask)
    pooled = jnp.sum(x * mask[..., None], 1) / jnp.maximum(jnp.sum(mask, 1, keepdims=True), 1)
    return nn.Dense(2)(pooled)


def _own_batch(t):
  kt = jax.random.fold_in(jax.random.key(7), t)
  tokens = jax.random.randint(kt, (B, L), 0, VOCAB)
  mask = jnp.ones((B, L), bool).at[::2, 4:].set(False).at[1, 2:].set(False)
  return {'x': tokens, 'm': mask}


OWN_INPUTS = lambda b: (b['x'], b['m'])
OWN_MASK = lambda b: b['m']
PHASE_A = dict(feature_map='favor', lam=0.2, s=1.0, softening=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize('only', [None])
def test_phase_a_softmax_step_as_before_bit_for_bit(only):
  model = _Classifier()
  params = model.init(jax.random.key(1), *OWN_INPUTS(_own_batch(0)))['params']
  settings = dict(step_size=1e-2, beta=500.0, clip_norm=10.0)
  opt = training.phase_a_optimizer(jax.random.key(2), radius=10.0, only=only, **settings)
  kw = dict(PHASE_A, only=only, langevin_settings=settings, inputs=OWN_INPUTS, mask=OWN_MASK)
  new_step = jax.jit(training.make_phase_a_step(model, opt, target='softmax', **kw))
  old_step = jax.jit(_old_phase_a_step(model, opt, **kw))
  old = new = training.TrainState(jnp.zeros((), jnp.int32), params, opt.init(params))
  for t in range(3):
    old, old_m = old_step(old, _own_batch(t))
    new, new_m = new_step(new, _own_batch(t))
    _equal(new_m, old_m)
  assert not np.array_equal(new.params['block_1']['particles'], params['block_1']['particles'])
  _equal(new.params, old.params)


# ----------------------------------------------------------------------------- the path itself

def _case():
  kw, kq, kk = jax.random.split(jax.random.key(0), 3)
  omega = 0.7 * jax.random.normal(kw, (2, 3, 4))                        # [H, M, D]
  q, k = jax.random.normal(kq, (3, 5, 2, 4)), jax.random.normal(kk, (3, 5, 2, 4))
  mask = jnp.arange(5)[None, :] < jnp.asarray([5, 3, 4])[:, None]
  return {'attn': {'particles': omega}}, {('attn',): (q, k)}, mask


@pytest.mark.slow
def test_sown_forces_are_the_per_head_gradients_of_each_part():
  params, inputs, mask = _case()
  (q, k), omega = inputs[('attn',)], params['attn']['particles']
  kw = dict(feature_map='favor', lam=0.3, s=1.0, softening=0.1)
  f = jax.jit(lambda p: phase_a_mimicry.sown_forces(p, inputs, mask=mask, rows=2, **kw))(params)

  @jax.jit
  def reference(h):       # one head's energy, its gradients at λ = 0 and 0.3, its W
    qh = jnp.where(mask[:2, :, None], q[:2, :, h], 0.0)
    energy = lambda w, lam: mimicry.mimicry_hamiltonian(
        w, qh, k[:2, :, h], feature_map='favor', lam=lam, s=1.0, softening=0.1,
        key_mask=mask[:2], query_mask=mask[:2])
    return (jax.grad(energy)(omega[h], 0.0), jax.grad(energy)(omega[h], 0.3),
            energy(omega[h], 0.0), repulsion.riesz_energy(omega[h], 1.0, 0.1))

  for h in range(2):
    g0, g3, e0, w = reference(h)
    np.testing.assert_allclose(f.data[('attn',)][h], g0, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(f.hamiltonian[('attn',)][h], g3, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(f.data_value[('attn',)][h], e0, rtol=1e-6)
    np.testing.assert_allclose(f.repulsion_value[('attn',)][h], w, rtol=1e-6)
  total = f.data[('attn',)] + 0.3 * f.repulsion[('attn',)]
  np.testing.assert_allclose(f.hamiltonian[('attn',)], total, rtol=1e-5, atol=1e-7)
  # No mask and all rows: the LM's force (training.lm.mimicry_forces) on the same inputs.
  settings = training.lm.MimicrySettings(lam=0.3, riesz_s=1.0, softening=0.1, rows=3)
  _equal(jax.jit(lambda p: phase_a_mimicry.sown_forces(p, inputs, rows=3, **kw).hamiltonian)(
      params), jax.jit(lambda p: training.lm.mimicry_forces(p, inputs, settings, 'favor'))(params))


@pytest.mark.parametrize('bad, message', [
    (dict(rows=0), 'rows must be an integer >= 1, got 0'),
    (dict(mask=jnp.ones((3, 4), bool)), r'mask must have shape \[B, L\] of the sown q, got '
                                        r'\(3, 4\)'),
    (dict(params={'other': {'particles': jnp.ones((2, 3, 4))}}),
     r"inputs: \['attn'\] have no particles in params"),
])
def test_sown_forces_mistakes_are_one_line_naming_the_argument(bad, message):
  params, inputs, _ = _case()
  kw = dict(params=params, inputs=inputs, feature_map='favor', lam=0.3, s=1.0, softening=0.1)
  kw.update(bad)
  with pytest.raises(ValueError, match=message) as info:
    phase_a_mimicry.sown_forces(**kw)
  assert '\n' not in str(info.value)
