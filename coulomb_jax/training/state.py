r"""The training state, the partition of a model's leaves into particles and the rest, the
two phases' optimisers, and per-leaf views of the particles (moves, non-finite counts)."""

import re
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from coulomb_jax import langevin
from coulomb_jax.layers import models

PARTICLES = models.PARTICLES


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


def apply_particle_step(optimizer: optax.GradientTransformation, state: 'TrainState', grads,
                        only: Optional[Sequence[str]] = None):
  """``(state after the update, metrics)``: ``optimizer``'s update of ``grads`` applied, and
  what every Phase A step reports of it: ``max_move`` = max_k ‖Δω_k‖ over the particle
  leaves (of ``only``'s path when set), ``nonfinite_particles`` (before the move) and
  ``nonfinite_grads`` (``nonfinite_counts``)."""
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  moves = [jnp.max(jnp.linalg.norm(u, axis=-1)) for u in particle_leaves(updates, only).values()]
  metrics = dict(max_move=jnp.max(jnp.stack(moves)),
                 nonfinite_particles=nonfinite_counts(state.params, only),
                 nonfinite_grads=nonfinite_counts(grads, only))
  return TrainState(state.step + 1, params, opt_state), metrics
