r"""The two training phases of a kernel-attention model, as pure jitted steps.

**Phase A** moves only the particles Ω (every ``particles`` leaf, ``[H, M, D_h]``
per layer) by projected Langevin dynamics (``langevin.langevin_transform``) on

.. math::
   H(Ω) = \sum_{l,h} \big[ −A(φ_{Ω_{l,h}}(r_{l,h}), y) + λ\,W_s(Ω_{l,h}) \big]

where r_{l,h} ``[B, D_h]`` is the mean over real tokens of the (scaled) keys
entering head h of layer l (``models.KernelAttention`` sows it as
``phase_a_inputs``), y = 2·label − 1, A the alignment U-statistic and W_s the
Riesz energy (``hamiltonian.hamiltonian_terms``). The representations are
treated as data (``stop_gradient``): each head's particles feel the alignment of
their own head, which is the core library's Hamiltonian with x = r. Every other
parameter gets ``optax.set_to_zero`` and stays bit-identical.

**The softmax target** (``phase_a.target = 'softmax'``): the same dynamics on
Σ_{l,h} [CE_{l,h}(Ω_{l,h}) + λ W_s(Ω_{l,h})], CE the cross-entropy between softmax
attention and the head's linear attention on its own queries and keys of the batch's
real tokens, in ``coulomb_jax.phase_a_mimicry`` (its objective, step, forces,
held-out attention KL and potentials).

**Phase B** freezes the particles (``set_to_zero``) and trains the rest with
AdamW under a linear warm-up + cosine schedule on the weighted cross-entropy.

Both optimisers are one ``optax.partition`` over the labels of
``partition_labels``. Steps take the key first-class: dropout uses
``fold_in(key, step)``.

**Any Flax model.** The step builders take the model's inputs as functions of the batch:
``inputs(batch)`` gives the positional arguments of ``model.apply`` after the variables
(default ``encoder_inputs``: ``models.EncoderClassifier``'s ``ids, segments, mask``),
``apply_kwargs`` its keyword arguments (default for the encoder: ``deterministic``),
``labels`` / ``weights`` / ``mask`` what each target reads. They work for any model whose
attention layers are ``models.KernelAttention`` or
``flax_attention.kernel_attention_fn(omega, sow_into=self)`` with ω from
``models.particles_param``: those layers sow each target's data beside their particles.

**Layer-wise Phase A** (``make_phase_a_layer_step``, ``attention_paths``): the
same Hamiltonian, minimised one layer at a time. Because r_{l,h} is treated as
data, layer l's term depends on the particles of layers < l only through its
inputs, and on no other particles. Layer by layer, with the layers below already
at their Phase A result, r_l is fixed for the whole stage: it can be computed once
per example (one forward pass) and every Langevin step works on the cached
``[B, H, D_h]`` inputs, with no encoder forward at all. Layer 0 follows the same
dynamics as in the joint schedule (up to the noise draws and the clipping norm,
which is per layer); layer l > 0 learns on the inputs it will see in Phase B.
"""

import re
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from coulomb_jax import features
from coulomb_jax import flax_attention
from coulomb_jax import hamiltonian
from coulomb_jax import langevin
from coulomb_jax import langevin_diagnostics
from coulomb_jax import models

PARTICLES = models.PARTICLES
PHASE_A_INPUTS = flax_attention.PHASE_A_INPUTS
PHASE_A_TARGETS = ('labels', 'softmax')
"""What Phase A moves the particles towards (``config.phase_a.target``): the labels
(``phase_a_objective``) or softmax attention (``phase_a_mimicry_objective``)."""


class TrainState(NamedTuple):
  """``step``: updates done in this phase; ``params``; ``opt_state``."""
  step: jax.Array
  params: Any
  opt_state: Any

  @classmethod
  def create(cls, params, optimizer: optax.GradientTransformation) -> 'TrainState':
    """Step 0, ``params`` and ``optimizer.init(params)``: the state a phase starts from."""
    return cls(jnp.zeros((), jnp.int32), params, optimizer.init(params))


def partition_labels(params, only: Optional[Sequence[str]] = None) -> Any:
  """``'particles'`` for every leaf named ``particles``, ``'rest'`` otherwise.

  ``only``: the path of one attention module (e.g. ``('attention_1',)`` in
  ``models.EncoderClassifier``); then only its particles are labelled ``'particles'``.
  """
  flat = traverse_util.flatten_dict(params)
  only = None if only is None else tuple(only)
  labels = {k: PARTICLES if k[-1] == PARTICLES and (only is None or k[:-1] == only)
            else 'rest' for k in flat}
  return traverse_util.unflatten_dict(labels)


def has_particles(params) -> bool:
  return any(k[-1] == PARTICLES for k in traverse_util.flatten_dict(params))


def _natural_key(path):
  return [(0, int(t), '') if t.isdigit() else (1, 0, t)
          for part in path for t in re.split(r'(\d+)', part) if t]


def attention_paths(params) -> list:
  """Paths of the modules holding ``particles``, in layer order.

  Numbers compare as numbers: ``attention_2`` comes before ``attention_10``.
  """
  paths = {k[:-1] for k in traverse_util.flatten_dict(params) if k[-1] == PARTICLES}
  return sorted(paths, key=_natural_key)


def phase_a_optimizer(key: jax.Array, *, step_size: float, beta: float, radius: float,
                      clip_norm: float, only: Optional[Sequence[str]] = None
                      ) -> optax.GradientTransformation:
  """Langevin on the particles, nothing else moves (see module docstring).

  ``only``: move only the particles of the attention module at this path (the
  layer-wise schedule); every other leaf, particles included, gets
  ``set_to_zero``. The state has the same structure either way.
  """
  return optax.partition(
      {PARTICLES: langevin.langevin_transform(key, step_size=step_size, beta=beta,
                                              radius=radius, clip_norm=clip_norm),
       'rest': optax.set_to_zero()}, lambda p: partition_labels(p, only))


def phase_b_schedule(*, learning_rate: float, warmup_steps: int, total_steps: int):
  """0 → ``learning_rate`` linearly over ``warmup_steps``, then cosine to 0."""
  return optax.warmup_cosine_decay_schedule(
      0.0, learning_rate, warmup_steps, max(total_steps, warmup_steps + 1), end_value=0.0)


def phase_b_optimizer(*, learning_rate: float, warmup_steps: int, total_steps: int,
                      weight_decay: float, clip_norm: float) -> optax.GradientTransformation:
  """AdamW (with global-norm clipping) on everything but the particles, which are frozen."""
  schedule = phase_b_schedule(learning_rate=learning_rate, warmup_steps=warmup_steps,
                              total_steps=total_steps)
  rest = optax.chain(optax.clip_by_global_norm(clip_norm),
                     optax.adamw(schedule, weight_decay=weight_decay))
  return optax.partition({PARTICLES: optax.set_to_zero(), 'rest': rest}, partition_labels)


def encoder_inputs(batch) -> tuple:
  """``models.EncoderClassifier``'s positional inputs: ``(ids, segments, mask)``."""
  return tuple(_field(batch, name, 'inputs') for name in ('ids', 'segments', 'mask'))


def _field(batch, name: str, argument: str):
  """``batch[name]``, or one line naming the builder argument that says where it is."""
  try:
    return batch[name]
  except (KeyError, TypeError):
    signature = '(outputs, batch)' if argument == 'loss' else 'batch'
    raise ValueError(f'{argument}: the batch has no {name!r}; pass {argument}=lambda '
                     f'{signature}: ... to the step builder (it reads what your model '
                     'needs).') from None


def _model_call(inputs, apply_kwargs, encoder_kwargs):
  """(inputs function, keyword arguments): the encoder's defaults unless ``inputs`` is given."""
  if inputs is None:
    return encoder_inputs, dict(encoder_kwargs if apply_kwargs is None else apply_kwargs)
  if not callable(inputs):
    raise ValueError(f'inputs must be a function batch -> tuple of model inputs, got '
                     f'{type(inputs).__name__}.')
  return inputs, dict(apply_kwargs or {})


def forward(model: nn.Module, params, batch, *, inputs: Optional[Callable] = None, **kwargs):
  """``model.apply({'params': params}, *inputs(batch), **kwargs)`` (default ``encoder_inputs``)."""
  args = (encoder_inputs if inputs is None else inputs)(batch)
  if not isinstance(args, (tuple, list)):
    args = (args,)
  return model.apply({'params': params}, *args, **kwargs)


def sown(model: nn.Module, params, batch, name: str, *, inputs: Optional[Callable] = None,
         apply_kwargs: Optional[Dict[str, Any]] = None) -> Dict[Tuple[str, ...], Any]:
  """``{path of the sowing module: value}`` of what the kernel layers sow under ``name``
  (``PHASE_A_INPUTS`` or ``flax_attention.MIMICRY_INPUTS``) on one batch, no gradient.

  Every path must hold particles (``KernelAttention``, or the module passed as
  ``sow_into`` to ``kernel_attention_fn``); none sown is one ValueError.
  """
  fn, kwargs = _model_call(inputs, apply_kwargs, {'deterministic': True})
  _, state = forward(model, params, batch, inputs=fn, mutable=['intermediates'], **kwargs)
  flat = traverse_util.flatten_dict(state.get('intermediates', {}))
  out = {k[:-1]: jax.tree.map(jax.lax.stop_gradient, v[0]) for k, v in flat.items()
         if k[-1] == name}
  if not out:
    raise ValueError(f'model: no attention layer sowed {name!r}; its attention layers must be '
                     'models.KernelAttention or flax_attention.kernel_attention_fn(omega, '
                     'sow_into=self) with omega = models.particles_param(self, ...).')
  holders = set(particle_leaves(params))
  missing = sorted('/'.join(p) for p in out if p not in holders)
  if missing:
    raise ValueError(f'model: {missing} sowed {name!r} but hold no particles; make omega with '
                     'models.particles_param(self, ...) in the module passed as sow_into.')
  return out


def phase_a_inputs(model: nn.Module, params, batch, *, inputs: Optional[Callable] = None,
                   apply_kwargs: Optional[Dict[str, Any]] = None
                   ) -> Dict[Tuple[str, ...], jax.Array]:
  """``{path of the attention module: r [B, H, D_h]}`` for one batch (no gradient)."""
  return sown(model, params, batch, PHASE_A_INPUTS, inputs=inputs, apply_kwargs=apply_kwargs)


def _has(batch, name: str) -> bool:
  try:
    batch[name]  # pylint: disable=pointless-statement
    return True
  except (KeyError, TypeError, IndexError):
    return False


def _labels_and_weights(batch, labels, weights):
  y = _field(batch, 'labels', 'labels') if labels is None else labels(batch)
  if weights is not None:
    return y, weights(batch)
  if labels is None or _has(batch, 'weights'):
    return y, _field(batch, 'weights', 'weights')
  return y, jnp.ones(jnp.shape(y), jnp.float32)


def phase_a_objective(params, inputs, labels, weights, *, feature_map, lam: float, s,
                      softening: float, precision=None):
  """(H, {"alignment": Σ A, "repulsion": Σ W}) summed over layers and heads.

  ``precision``: of every matrix product of the Hamiltonian (``hamiltonian.hamiltonian``;
  None: the backend's default, e.g. TF32 on recent NVIDIA GPUs, bf16 passes on TPU).

  ``weights``: ``[B]``, 1 for real rows and 0 for padding rows. Padding rows get
  y = 0, and A is rescaled by B(B − 1) / (n(n − 1)), n = Σ weights, so that it is
  the U-statistic over the n real rows only (0 if n < 2).
  """
  flat = traverse_util.flatten_dict(params)
  weights = weights.astype(jnp.float32)
  y = (2.0 * labels.astype(jnp.float32) - 1.0) * weights
  size, n = weights.shape[0], jnp.sum(weights)
  rescale = jnp.where(n >= 2, size * (size - 1) / jnp.maximum(n * (n - 1), 1.0), 0.0)
  total = align = repel = 0.0
  for path, r in inputs.items():
    omega = flat[path + (PARTICLES,)]                      # [H, M, D_h]
    terms = jax.vmap(lambda w, x: hamiltonian.hamiltonian_terms(
        w, x, y, feature_map=feature_map, lam=lam, s=s, softening=softening,
        precision=precision),
                     in_axes=(0, 1))(omega, r.astype(jnp.float32))
    a = jnp.sum(terms[1]['alignment'])
    total = total + jnp.sum(terms[0]) - (rescale - 1.0) * a        # −A → −rescale·A
    align = align + rescale * a
    repel = repel + jnp.sum(terms[1]['repulsion'])
  return total, {'alignment': align, 'repulsion': repel}


def make_phase_a_step(model: nn.Module, optimizer: optax.GradientTransformation, *,
                      feature_map, lam: float, s, softening: float, target: str = 'labels',
                      inputs: Optional[Callable] = None, labels: Optional[Callable] = None,
                      weights: Optional[Callable] = None, mask: Optional[Callable] = None,
                      apply_kwargs: Optional[Dict[str, Any]] = None,
                      only: Optional[Sequence[str]] = None,
                      langevin_settings: Optional[Dict[str, float]] = None,
                      precision=None) -> Callable:
  """``step(state, batch) -> (state, metrics)``: one Langevin move of every particle.

  Args:
    model, optimizer: any Flax model with kernel attention layers (module docstring) and
      ``phase_a_optimizer(...)`` (``only=`` the same path when ``only`` is set).
    feature_map, lam, s, softening: the Hamiltonian's map, λ, Riesz s and softening.
    target: ``'labels'`` (``phase_a_objective``) or ``'softmax'``
      (``phase_a_mimicry.phase_a_mimicry_objective``; labels unused).
    inputs: ``inputs(batch)`` → the positional arguments of ``model.apply`` after the
      variables (default ``encoder_inputs``); ``apply_kwargs`` its keyword arguments
      (default: ``{'deterministic': True}`` for the encoder, ``{}`` with ``inputs``).
    labels, weights: ``[B]`` int labels and row weights (1 real, 0 padding) of the label
      target (default ``batch['labels']``, ``batch['weights']``; with ``labels`` and no
      ``weights`` column, ones).
    mask: ``mask(batch)`` → ``[B, L]`` bool, the real tokens the softmax target averages
      over (default ``phase_a_mimicry.token_mask``: ``batch['mask']`` of rows with
      ``batch['weights'] > 0``).
    only: the path of one attention module: only its term is computed (layer-wise
      stages on the inputs of the layers below as they are).
    langevin_settings, precision: as below (``precision``: the label target only).

  Metrics of the label target: ``hamiltonian``, ``alignment``, ``repulsion`` (before the
  move), ``max_move`` = max_k ‖Δω_k‖ over all heads and layers (early stopping), and
  ``nonfinite_particles`` / ``nonfinite_grads``: ``{'attention_0/particles': int32 [H]}``,
  the NaN/±inf entries per head of each particle leaf before the move and of its
  gradient (``nonfinite_counts``; under jit a NaN otherwise spreads to the other heads
  and layers without an error: a driver stops on the first non-zero count). With
  ``langevin_settings`` (the optimiser's ``step_size``, ``beta``, ``clip_norm``)
  also the per-particle ``drift_to_noise`` and ``repulsion_to_alignment`` ``[P]``
  of this step (``langevin_diagnostics``). The softmax target's are
  ``phase_a_mimicry.make_phase_a_mimicry_step``'s.
  """
  if target not in PHASE_A_TARGETS:
    raise ValueError(f'target must be one of {PHASE_A_TARGETS}, got {target!r}.')
  if target == 'softmax':
    if precision is not None or labels is not None or weights is not None:
      raise ValueError("target='softmax' reads neither labels nor weights and keeps the "
                       'backend precision; pass mask (and inputs) only.')
    from coulomb_jax import phase_a_mimicry  # pylint: disable=g-import-not-at-top  (it imports this module)
    return phase_a_mimicry.make_phase_a_mimicry_step(
        model, optimizer, feature_map=feature_map, lam=lam, s=s, softening=softening,
        only=only, langevin_settings=langevin_settings, inputs=inputs, mask=mask,
        apply_kwargs=apply_kwargs)
  if mask is not None:
    raise ValueError("mask: the label target pools the keys its layers sow; mask is the "
                     "softmax target's (target='softmax').")
  objective = dict(feature_map=feature_map, lam=lam, s=s, softening=softening,
                   precision=precision)
  only = None if only is None else tuple(only)

  def step(state: TrainState, batch):
    data = phase_a_inputs(model, state.params, batch, inputs=inputs, apply_kwargs=apply_kwargs)
    if only is not None:
      data = {only: data[only]}
    y, w = _labels_and_weights(batch, labels, weights)
    (h, aux), grads = jax.value_and_grad(phase_a_objective, has_aux=True)(
        state.params, data, y, w, **objective)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    moves = [jnp.max(jnp.linalg.norm(u, axis=-1)) for u in particle_leaves(updates, only).values()]
    metrics = dict(aux, hamiltonian=h, max_move=jnp.max(jnp.stack(moves)),
                   nonfinite_particles=nonfinite_counts(state.params, only),
                   nonfinite_grads=nonfinite_counts(grads, only))
    if langevin_settings is not None:
      metrics.update(_force_metrics(state.params, data, y, w, objective, langevin_settings,
                                    only))
    return TrainState(state.step + 1, params, opt_state), metrics

  return step


def make_phase_a_layer_step(path: Sequence[str], optimizer: optax.GradientTransformation, *,
                            feature_map, lam: float, s, softening: float,
                            langevin_settings: Optional[Dict[str, float]] = None,
                            precision=None) -> Callable:
  """``step(state, r, labels, weights) -> (state, metrics)`` on cached inputs.

  One Langevin move of the particles of the attention module at ``path`` on
  given pooled keys ``r: [B, H, D_h]`` (the layer-wise schedule; see the module
  docstring), with ``optimizer = phase_a_optimizer(..., only=path)``. No encoder
  forward pass. Metrics and ``precision`` as ``make_phase_a_step``, for this layer only.
  """
  path = tuple(path)
  objective = dict(feature_map=feature_map, lam=lam, s=s, softening=softening,
                   precision=precision)

  def step(state: TrainState, r, labels, weights):
    inputs = {path: jax.lax.stop_gradient(r)}
    (h, aux), grads = jax.value_and_grad(phase_a_objective, has_aux=True)(
        state.params, inputs, labels, weights, **objective)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    move = traverse_util.flatten_dict(updates)[path + (PARTICLES,)]
    metrics = dict(aux, hamiltonian=h, max_move=jnp.max(jnp.linalg.norm(move, axis=-1)),
                   nonfinite_particles=nonfinite_counts(state.params, path),
                   nonfinite_grads=nonfinite_counts(grads, path))
    if langevin_settings is not None:
      metrics.update(_force_metrics(state.params, inputs, labels, weights, objective,
                                    langevin_settings, path))
    return TrainState(state.step + 1, params, opt_state), metrics

  return step


def particle_leaves(tree, only: Optional[Sequence[str]] = None) -> Dict[Tuple[str, ...], Any]:
  """``{path of the attention module: its particles leaf}`` (``only``: that module alone)."""
  only = None if only is None else tuple(only)
  return {k[:-1]: v for k, v in traverse_util.flatten_dict(tree).items()
          if k[-1] == PARTICLES and (only is None or k[:-1] == only)}


def nonfinite_counts(tree, only: Optional[Sequence[str]] = None) -> Dict[str, jax.Array]:
  """``{'attention_0/particles': int32 [H]}``: NaN/±inf entries of each ``particles`` leaf
  ``[H, M, D_h]`` of ``tree`` (the params, or their gradients), per head: summed over the
  last two axes. Keyed by the leaf's path joined with ``/``; ``only``: that module alone.
  Traceable: what a jitted step reports (``make_phase_a_step``)."""
  return {'/'.join(path + (PARTICLES,)): jnp.sum(~jnp.isfinite(leaf), axis=(-2, -1),
                                                 dtype=jnp.int32)
          for path, leaf in particle_leaves(tree, only).items()}


def first_nonfinite(metrics) -> Optional[Tuple[str, str, int, int]]:
  """``(what, leaf, head, count)`` of the first non-zero count of a step's metrics, else None.

  Particles before gradients (a NaN particle makes the gradients of its head, and through
  the encoder those of the layers above, NaN too), leaves in layer order
  (``attention_2`` before ``attention_10``); ``what`` is ``'particles'`` or ``'gradient'``,
  ``head`` the first head with a non-finite entry and ``count`` its entries. Reads
  ``nonfinite_particles`` / ``nonfinite_grads`` (host arrays: ``jax.device_get`` them first).
  """
  for what, name in (('particles', 'nonfinite_particles'), ('gradient', 'nonfinite_grads')):
    counts = metrics.get(name, {})
    for leaf in sorted(counts, key=lambda k: _natural_key(k.split('/'))):
      per_head = np.asarray(counts[leaf]).reshape(-1)
      heads = np.flatnonzero(per_head)
      if heads.size:
        return what, leaf, int(heads[0]), int(per_head[heads[0]])
  return None


def phase_a_forces(params, inputs, labels, weights, *, feature_map, lam: float, s,
                   softening: float, only: Optional[Sequence[str]] = None,
                   precision=None) -> Dict[str, Any]:
  """The particles' gradients ``{'hamiltonian': ∇H, 'alignment': ∇A, 'repulsion': ∇W}``.

  Each a ``{path: [H, M, D_h]}`` dict over the modules that move (``only``: one),
  with A and W the summed terms of ``phase_a_objective`` (so ∇H = −∇A + λ∇W).
  What ``langevin_diagnostics`` reads the force balance and the step scale from.
  """
  kw = dict(feature_map=feature_map, lam=lam, s=s, softening=softening, precision=precision)
  term = lambda name: lambda p: phase_a_objective(p, inputs, labels, weights, **kw)[1][name]
  total = lambda p: phase_a_objective(p, inputs, labels, weights, **kw)[0]
  return {name: particle_leaves(jax.grad(f)(params), only)
          for name, f in (('hamiltonian', total), ('alignment', term('alignment')),
                          ('repulsion', term('repulsion')))}


def _force_metrics(params, inputs, labels, weights, objective, langevin_settings, only):
  """Per-particle ``drift_to_noise`` and ``repulsion_to_alignment`` ``[P]`` of one step."""
  forces = phase_a_forces(params, inputs, labels, weights, only=only, **objective)
  ls = langevin_settings
  return {'drift_to_noise': langevin_diagnostics.drift_to_noise(
              forces['hamiltonian'], step_size=ls['step_size'], beta=ls['beta'],
              clip_norm=ls.get('clip_norm')),
          'repulsion_to_alignment': langevin_diagnostics.force_ratio(
              forces['repulsion'], forces['alignment'], objective['lam'])}


def phase_a_potential_range(key: jax.Array, params, inputs, labels, *, feature_map,
                            radius: float, num_probes: int,
                            only: Optional[Sequence[str]] = None) -> Dict[Tuple[str, ...], Any]:
  """``{path: [H]}``: range over the ball of each head's one-particle data potential.

  U(ω) = −A({ω}) on the pooled keys ``inputs[path]: [n, H, D_h]`` with labels ``[n]``
  (``hamiltonian.particle_potentials`` at λ = 0), at the head's particles projected
  onto the ball and ``num_probes`` points uniform in it
  (``langevin_diagnostics.ball_probes``). β times it is the Gibbs tilt.
  """
  y = 2.0 * jnp.asarray(labels, jnp.float32) - 1.0
  out = {}
  for i, (path, omega) in enumerate(sorted(particle_leaves(params, only).items())):
    probes = langevin_diagnostics.ball_probes(jax.random.fold_in(key, i), omega, radius,
                                              num_probes)
    u = jax.vmap(lambda w, x: hamiltonian.particle_potentials(
        w, x, y, feature_map=feature_map, lam=0.0), in_axes=(0, 1))(
            probes, jnp.asarray(inputs[path], jnp.float32))
    out[path] = langevin_diagnostics.potential_range(u)
  return out


def heldout_alignment(params, inputs, labels, *, feature_map,
                      only: Optional[Sequence[str]] = None) -> Dict[Tuple[str, ...], Any]:
  """``{path: {'alignment': [H], 'centered_alignment': [H]}}`` on held-out pooled keys.

  Per head: the objective A and the centered alignment ρ(ΦΦᵀ, yyᵀ) of the head's
  features of ``inputs[path]: [n, H, D_h]`` (``langevin_diagnostics.heldout_alignment``),
  y = 2·labels − 1. Builds n×n kernels: a held-out set of a few thousand rows.
  """
  fm = features.get_feature_map(feature_map)
  y = 2.0 * jnp.asarray(labels, jnp.float32) - 1.0
  return {path: jax.vmap(lambda w, x: langevin_diagnostics.heldout_alignment(fm(x, w), y),
                         in_axes=(0, 1))(omega, jnp.asarray(inputs[path], jnp.float32))
          for path, omega in particle_leaves(params, only).items()}


class Stage(NamedTuple):
  """One phase of a training schedule (``phase_schedule``).

  ``phase``: ``'a'`` (the particles move, everything else frozen) or ``'b'``
  (particles frozen). For ``'a'``: ``layer`` is the index of the attention module
  whose particles move (None: all of them at once, the joint objective), ``cycle``
  the how-manieth Phase A pass this is (noise key and data order), ``num_epochs``
  its epochs over the training rows. For ``'b'``: epochs ``first_epoch`` to
  ``first_epoch + num_epochs − 1`` of one Phase B run (one optimiser and one
  learning-rate schedule over all its stages).
  """
  phase: str
  num_epochs: int
  first_epoch: int = 0
  layer: Optional[int] = None
  cycle: int = 0


SCHEDULES = ('joint', 'layerwise', 'after_b', 'alternating')


def phase_schedule(schedule: str, *, num_layers: int, a_epochs: int, b_epochs: int,
                   after_b_epochs: int = 0) -> list:
  """The stages of a schedule, in order (a list of ``Stage``).

  * ``joint`` (the paper): Phase A on all layers at once, then Phase B.
  * ``layerwise``: Phase A one layer after the other (bottom up), then Phase B.
  * ``after_b``: ``after_b_epochs`` epochs of Phase B, Phase A layer by layer on
    the trained encoder, then the remaining Phase B epochs with the new particles.
  * ``alternating``: blocks of ``after_b_epochs`` Phase B epochs with a layer-wise
    Phase A pass between consecutive blocks.

  Phase A always sees the representations of the encoder as it is at that point.
  """
  if schedule not in SCHEDULES:
    raise ValueError(f'schedule: expected one of {SCHEDULES}, got {schedule!r}.')
  layer_pass = lambda cycle: [Stage('a', a_epochs, layer=l, cycle=cycle)
                              for l in range(num_layers)]
  if schedule == 'joint':
    return [Stage('a', a_epochs), Stage('b', b_epochs)]
  if schedule == 'layerwise':
    return layer_pass(0) + [Stage('b', b_epochs)]
  if not 1 <= after_b_epochs < b_epochs:
    raise ValueError(f'after_b_epochs: expected an integer in [1, {b_epochs - 1}] (Phase B '
                     f'epochs on both sides of Phase A), got {after_b_epochs!r}.')
  if schedule == 'after_b':
    return ([Stage('b', after_b_epochs)] + layer_pass(0)
            + [Stage('b', b_epochs - after_b_epochs, first_epoch=after_b_epochs)])
  stages, epoch, cycle = [], 0, 0
  while epoch < b_epochs:
    if epoch:
      stages += layer_pass(cycle)
      cycle += 1
    size = min(after_b_epochs, b_epochs - epoch)
    stages.append(Stage('b', size, first_epoch=epoch))
    epoch += size
  return stages


def first_selectable_epoch(stages) -> int:
  """The first Phase B epoch that ends after the schedule's first Phase A stage.

  Model selection keeps the best validation epoch from here on, so that a kept
  model has the particles Phase A gave it (0 when Phase A comes first or never).
  """
  for i, stage in enumerate(stages):
    if stage.phase == 'a':
      later = [s.first_epoch for s in stages[i:] if s.phase == 'b']
      return later[0] if later else 0
  return 0


def cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
  """Σ_i w_i CE(logits_i, y_i) / max(Σ_i w_i, 1)."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def make_phase_b_step(model: nn.Module, optimizer: optax.GradientTransformation, *,
                      loss: Optional[Callable] = None, inputs: Optional[Callable] = None,
                      apply_kwargs: Optional[Dict[str, Any]] = None) -> Callable:
  """``step(key, state, batch) -> (state, metrics)``; dropout key ``fold_in(key, step)``.

  ``loss(outputs, batch) -> scalar`` (default: the weighted cross-entropy
  ``cross_entropy(outputs, batch['labels'], batch['weights'])``, with ``accuracy`` in the
  metrics); ``inputs`` and ``apply_kwargs`` as ``make_phase_a_step`` (the encoder's
  default: ``deterministic=False``); the dropout key goes in as ``rngs={'dropout': ...}``.
  Metrics: ``loss``, ``grad_norm`` (and ``accuracy`` with the default loss). With
  ``phase_b_optimizer`` the particles stay bit-identical.
  """
  fn, kwargs = _model_call(inputs, apply_kwargs, {'deterministic': False})
  if loss is not None and not callable(loss):
    raise ValueError(f'loss must be a function (outputs, batch) -> scalar, got '
                     f'{type(loss).__name__}.')

  def step(key: jax.Array, state: TrainState, batch):
    dropout_key = jax.random.fold_in(key, state.step)

    def loss_fn(params):
      outputs = forward(model, params, batch, inputs=fn, rngs={'dropout': dropout_key},
                        **kwargs)
      if loss is not None:
        return loss(outputs, batch), outputs
      y, w = _field(batch, 'labels', 'loss'), _field(batch, 'weights', 'loss')
      return cross_entropy(outputs, y, w), outputs

    (value, outputs), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {'loss': value}
    if loss is None:
      correct = (jnp.argmax(outputs, -1) == batch['labels']) * batch['weights']
      metrics['accuracy'] = jnp.sum(correct) / jnp.maximum(jnp.sum(batch['weights']), 1.0)
    metrics['grad_norm'] = optax.tree.norm(grads)
    return TrainState(state.step + 1, params, opt_state), metrics

  return step


def make_predict(model: nn.Module) -> Callable:
  """``predict(params, batch) -> [B]`` probability of class 1 (no dropout)."""

  def predict(params, batch):
    logits = forward(model, params, batch, deterministic=True)
    return jax.nn.softmax(logits, axis=-1)[:, 1]

  return predict
