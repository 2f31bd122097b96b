r"""The causal LM's loss, optimiser and train step (``layers.lm.CausalLM`` on MQAR).

``mqar_loss_and_accuracy`` counts answer positions only. ``make_state`` trains every
parameter with adamw, or gives the particles their own optax transformation
(``optax.set_to_zero()``: frozen random features; ``langevin.langevin_transform``:
projected Langevin). ``train_step`` feeds that transformation the task gradient, or, with
``mimicry`` settings, the gradient of the softmax-mimicry Hamiltonian
(``mimicry.mimicry_hamiltonian``) of each layer's own queries and keys on the batch
(``phase_a_mimicry.sown_forces``, the softmax target's one path from sown (q, k) to forces):
the particles then move toward the kernel that reproduces this model's softmax attention
while the rest of the model learns the task (Phase A interleaved with training,
``interleaved.interleaved_grads``).
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from coulomb_jax import _checks
from coulomb_jax import repulsion
from coulomb_jax.layers.lm import CausalLM
from coulomb_jax.training import interleaved
from coulomb_jax.training import phase_a_mimicry
from coulomb_jax.training.state import PARTICLES, has_particles, partition_labels


def answer_positions(answer_mask: jax.Array, num_answers: int) -> jax.Array:
  """``[B, num_answers]`` int32: the first ``num_answers`` True positions of each row.

  For MQAR every row has exactly P answers, so ``num_answers = P`` keeps them all (in
  order); a row with fewer gets False positions after its answers (their mask entries
  are False, so they count nowhere).
  """
  order = jnp.argsort(jnp.logical_not(answer_mask), axis=1, stable=True)
  return order[:, :num_answers].astype(jnp.int32)


def mqar_loss_and_accuracy(logits: jax.Array, targets: jax.Array, answer_mask: jax.Array):
  r"""Mean cross-entropy and accuracy over answer positions only.

  ``logits: [B, L, V]``, ``targets: [B, L]`` int, ``answer_mask: [B, L]`` bool. With
  n = Σ mask: loss = Σ_mask (logsumexp(logits) − logits[target]) / max(n, 1),
  accuracy = Σ_mask [argmax logits = target] / max(n, 1); both 0 for an empty mask.

  Targets must be integers (float targets: one ``ValueError``); an eager call with a
  target outside ``[0, V)`` where ``answer_mask`` is True is one ``ValueError`` naming the
  value and its index (targets elsewhere are ignored). Under ``jit`` such a target
  (negative ones included) makes the loss NaN and counts as a miss.
  """
  if logits.shape[:2] != targets.shape or targets.shape != answer_mask.shape:
    raise ValueError(f'logits [B, L, V], targets and answer_mask [B, L] must agree, got '
                     f'{tuple(logits.shape)}, {tuple(targets.shape)}, '
                     f'{tuple(answer_mask.shape)}.')
  _checks.check_ids('targets', targets, logits.shape[-1], answer_mask)
  m = answer_mask.astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  hit = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  loss = jnp.sum(jnp.where(answer_mask, ce, 0.0)) / n
  bad = answer_mask & ((targets < 0) | (targets >= logits.shape[-1]))   # jit only
  return jnp.where(jnp.any(bad), jnp.nan, loss), jnp.sum(hit * m) / n


class MimicrySettings(NamedTuple):
  """The softmax-mimicry force on the particles in ``train_step`` (hashable: a static arg).

  Per layer and head, the gradient of H(Ω) = D(Ω) + λ·W_s(Ω) (``mimicry.mimicry_hamiltonian``
  with ``target``) on the layer's unscaled queries and keys of the batch's first ``rows``
  sequences (``stop_gradient``: the force does not reach W_q, W_k). D compares the linear
  attention rows with the softmax rows over *all* keys of a sequence: a kernel-fidelity
  target (causality changes which keys a row sums over, not the kernel).
  ``with_task_gradient``: the particle leaves get the task gradient *plus* this force
  (Hedgehog's distillation beside the task loss, trained by the particles' optimizer);
  False: the force alone (Phase A interleaved with training).
  """
  lam: float = 0.0
  riesz_s: repulsion.Exponent = 'coulomb'
  softening: float = repulsion.DEFAULT_SOFTENING
  target: str = 'cross_entropy'
  rows: int = 8
  with_task_gradient: bool = False


def make_optimizer(learning_rate, *, weight_decay: float = 0.1,
                   particle_tx: Optional[optax.GradientTransformation] = None,
                   decay_steps: Optional[int] = None,
                   with_particles: bool = True) -> optax.GradientTransformation:
  """``make_state``'s optimizer: adamw (cosine over ``decay_steps`` if given) on every leaf,
  or on every leaf but the ``particles``, which get ``particle_tx``.

  ``learning_rate`` may be traced (checked when concrete): built inside ``jax.vmap`` with
  per-run rates it trains many runs as one program (``experiments/recall/batched.py``).
  ``with_particles``: whether the params hold particle leaves (else ``particle_tx`` is
  unused, as for softmax attention).
  """
  _checks.check_positive('learning_rate', learning_rate)
  _checks.check_nonnegative('weight_decay', weight_decay)
  rate = learning_rate
  if decay_steps is not None:
    rate = optax.cosine_decay_schedule(learning_rate, _checks.check_int('decay_steps',
                                                                       decay_steps, 1))
  tx = optax.adamw(rate, weight_decay=weight_decay)
  if particle_tx is not None and with_particles:
    tx = optax.partition({PARTICLES: particle_tx, 'rest': tx}, partition_labels)
  return tx


def make_state(key: jax.Array, model: CausalLM, seq_len: int, *, learning_rate: float = 1e-3,
               weight_decay: float = 0.1,
               particle_tx: Optional[optax.GradientTransformation] = None,
               decay_steps: Optional[int] = None) -> train_state.TrainState:
  """Initialised params and an adamw ``TrainState``.

  ``particle_tx``: None trains every parameter, particles included, with adamw; else the
  ``particles`` leaves get ``particle_tx`` (``optax.set_to_zero()`` freezes them,
  ``langevin.langevin_transform(...)`` moves them by projected Langevin) and the rest adamw.
  ``decay_steps``: None keeps ``learning_rate`` constant; else it follows a cosine from
  ``learning_rate`` to 0 over that many steps (Zoology's schedule; constant 0 after).
  """
  _checks.check_positive('learning_rate', learning_rate)
  _checks.check_nonnegative('weight_decay', weight_decay)
  params = jax.jit(model.init)(key, jnp.zeros((1, seq_len), jnp.int32))['params']
  tx = make_optimizer(learning_rate, weight_decay=weight_decay, particle_tx=particle_tx,
                      decay_steps=decay_steps, with_particles=has_particles(params))
  return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def _answers(batch, num_answers: Optional[int]):
  """``(positions or None, targets, answer_mask)`` at the answer positions (all if None)."""
  if num_answers is None:
    return None, batch.targets, batch.answer_mask
  pos = answer_positions(batch.answer_mask, num_answers)
  take = lambda a: jnp.take_along_axis(a, pos, axis=1)
  return pos, take(batch.targets), take(batch.answer_mask)


def _metrics(params, apply_fn, batch, num_answers=None):
  pos, targets, mask = _answers(batch, num_answers)
  logits = apply_fn({'params': params}, batch.inputs, None, pos)
  return mqar_loss_and_accuracy(logits, targets, mask)


def _metrics_and_inputs(params, apply_fn, batch, num_answers=None):
  pos, targets, mask = _answers(batch, num_answers)
  logits, state = apply_fn({'params': params}, batch.inputs, None, pos,
                           mutable=['intermediates'])
  loss, acc = mqar_loss_and_accuracy(logits, targets, mask)
  return loss, (acc, interleaved.sown_qk(state.get('intermediates')))


def _sown_forces(params, inputs, settings: MimicrySettings, feature_map: str):
  return phase_a_mimicry.sown_forces(
      params, inputs, feature_map=feature_map, lam=settings.lam, s=settings.riesz_s,
      softening=settings.softening, target=settings.target, rows=settings.rows)


def mimicry_force_terms(params, inputs, settings: MimicrySettings, feature_map: str):
  """``({path: ∇_Ω D}, {path: ∇_Ω W_s})``, each ``[H, M, D_h]``: the target's and the
  (unweighted) repulsion's force on every attention module's particles.

  ``inputs``: ``{path: (q, k)}``, each ``[B, L, H, D_h]``, as sown by ``KernelAttention``;
  the force of ``mimicry_forces`` is ∇(D + λ·W_s) (one gradient: ∇D + λ·∇W_s up to
  rounding). For the calibration of λ and β
  (``langevin_diagnostics.relative_lam``, ``drift_to_noise``) and the force ratio.
  ``phase_a_mimicry.sown_forces`` on the first ``settings.rows`` sequences, no mask.
  """
  forces = _sown_forces(params, inputs, settings, feature_map)
  return forces.data, forces.repulsion


def mimicry_forces(params, inputs, settings: MimicrySettings, feature_map: str):
  """``{path: ∇_Ω H [H, M, D_h]}`` of every attention module's particles (see ``MimicrySettings``).

  ``inputs``: ``{path: (q, k)}``, each ``[B, L, H, D_h]``, as sown by ``KernelAttention``;
  ``phase_a_mimicry.sown_forces(...).hamiltonian`` on the first ``settings.rows`` sequences.
  """
  return _sown_forces(params, inputs, settings, feature_map).hamiltonian


def check_feature_map(model, feature_map: str) -> None:
  """``feature_map`` is ``model``'s own: one ``ValueError`` naming both otherwise.

  ``model``: a ``CausalLM`` with ``attention='kernel'``, or anything else (not checked:
  a model this module cannot read, or softmax attention, which has no feature map).
  """
  if (isinstance(model, CausalLM) and model.attention == 'kernel'
      and feature_map != model.feature_map):
    raise ValueError(f'feature_map must be the model\'s feature map '
                     f'{model.feature_map!r} (CausalLM.feature_map), got {feature_map!r}.')


def train_step_fn(state: train_state.TrainState, batch,
                  mimicry: Optional[MimicrySettings] = None, feature_map: str = 'favor',
                  num_answers: Optional[int] = None):
  """One optimizer step on an ``mqar.MQARBatch`` → ``(state, {'loss', 'accuracy'})``.

  ``mimicry`` None: every leaf gets its task gradient. Else the particle leaves get
  ``mimicry_forces`` (of ``feature_map``) instead (or, with ``mimicry.with_task_gradient``,
  added to their task gradient), and ``state``'s particle transformation (e.g. Langevin)
  moves them with it. ``num_answers`` (P for MQAR): the head runs only at the first P
  answer positions of each row (``answer_positions``), the same loss and accuracy at a
  fraction of the cost of ``[B, L, V]`` logits; None: at every position.

  Unjitted: ``train_step`` is its jit, with the three static. Called inside ``jax.vmap``
  it steps many runs at once; there ``mimicry.lam`` and the state's hyper-parameters
  (learning rate, Langevin β and η) may be traced per run.

  With ``mimicry``, a ``feature_map`` other than the model's is one ``ValueError``
  (``check_feature_map``; the model is ``state.apply_fn.__self__`` when ``apply_fn`` is a
  ``CausalLM``'s bound ``apply``, as ``make_state`` sets it; any other ``apply_fn`` is not
  checked).
  """
  if mimicry is None:
    grad_fn = jax.value_and_grad(_metrics, has_aux=True)
    (loss, acc), grads = grad_fn(state.params, state.apply_fn, batch, num_answers)
  else:
    check_feature_map(getattr(state.apply_fn, '__self__', None), feature_map)
    (loss, acc), grads = interleaved.interleaved_grads(
        lambda p: _metrics_and_inputs(p, state.apply_fn, batch, num_answers), state.params,
        feature_map=feature_map, lam=mimicry.lam, s=mimicry.riesz_s,
        softening=mimicry.softening, target=mimicry.target, rows=mimicry.rows,
        with_task_gradient=mimicry.with_task_gradient)
  return state.apply_gradients(grads=grads), {'loss': loss, 'accuracy': acc}


train_step = jax.jit(train_step_fn, static_argnames=('mimicry', 'feature_map', 'num_answers'))
"""``train_step_fn`` under ``jax.jit`` (``mimicry``, ``feature_map``, ``num_answers`` static)."""


@functools.partial(jax.jit, static_argnames=('model', 'settings', 'feature_map', 'num_answers'))
def force_terms(params, batch, model: CausalLM, settings: MimicrySettings, feature_map: str,
                num_answers: Optional[int] = None):
  """``mimicry_force_terms`` on one batch: ``model``'s own queries and keys, sown
  (``feature_map`` other than the model's: one ``ValueError``, ``check_feature_map``)."""
  check_feature_map(model, feature_map)
  _, (_, inputs) = _metrics_and_inputs(params, model.apply, batch, num_answers)
  return mimicry_force_terms(params, inputs, settings, feature_map)


@functools.partial(jax.jit, static_argnames=('model', 'num_answers'))
def evaluate(params, batch, model: CausalLM, num_answers: Optional[int] = None):
  """``{'loss', 'accuracy'}`` of ``model`` with ``params`` on an ``MQARBatch`` (answers only;
  ``num_answers`` as in ``train_step``)."""
  loss, acc = _metrics(params, model.apply, batch, num_answers)
  return {'loss': loss, 'accuracy': acc}
