"""Fitting features to recorded attention, every head of every layer at once: particles by
Langevin, gradient flow, Hedgehog (or any map) by Adam, on records made once
(``fit_features``, ``fit_groups``) or remade from the model at every step (``fit_in_model``)."""

import functools
import math
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from flax import traverse_util

from coulomb_jax import _checks
from coulomb_jax import features
from coulomb_jax import langevin
from coulomb_jax import mimicry
from coulomb_jax import repulsion
from coulomb_jax.conversion.record import (AttentionRecord, Path, attention_records,
                                           split_heads, stack_heads, stack_initial)
from coulomb_jax.layers import models

FIT_METHODS = ('particles', 'gradient_flow', 'hedgehog', 'adam')
"""How ``fit_features`` moves the features (the table in the package docstring)."""

ADAM_METHODS = ('hedgehog', 'adam')
"""The methods that move the rows by Adam (``hedgehog``: ``adam`` with the map ``hedgehog``)."""


class FitSettings(NamedTuple):
  """The fit's constants (defaults: the mimicry study's, ``studies/softmax_mimicry/config.py``)."""
  step_size: float = 0.03          # η of the Langevin methods
  beta: float = 1e4                # β of ``particles`` (``gradient_flow``: ∞)
  lam: float = 1e-3                # λ of the repulsion (``gradient_flow``: 0)
  radius: float = 12.0             # R of the per-particle ball (initial draw and projection)
  clip_norm: Optional[float] = 10.0  # per-head clip of ∇H in the Langevin methods
  riesz_s: repulsion.Exponent = 'coulomb'
  softening: float = 0.5           # ε of the Riesz kernel
  learning_rate: float = 3e-3      # Adam's rate (``hedgehog``, ``adam``)
  target: str = 'cross_entropy'    # the data term (``mimicry.TARGETS``)


def _check_method(method):
  if method not in FIT_METHODS:
    raise ValueError(f'method must be one of {FIT_METHODS}, got {method!r}.')


def default_feature_map(method: str, feature_map: Optional[str] = None) -> str:
  """The map of ``method``: ``hedgehog`` for ``'hedgehog'`` (the only one it takes), else
  ``feature_map`` (default ``favor``; a name in ``mimicry.MIMICRY_FEATURE_MAPS``; ``'adam'``
  fits any of them the way ``'hedgehog'`` fits its own)."""
  _check_method(method)
  if method == 'hedgehog':
    if feature_map not in (None, 'hedgehog'):
      raise ValueError(f"feature_map: method='hedgehog' fits Zhang et al.'s map 'hedgehog', "
                       f'got {feature_map!r}.')
    return 'hedgehog'
  feature_map = 'favor' if feature_map is None else feature_map
  mimicry._check_map(feature_map)            # pylint: disable=protected-access
  return feature_map


def rows_for(feature_map: str, num_features: int) -> int:
  """M, the rows of ``omega`` whose map has ``num_features`` = N features (N/2 for two per row)."""
  n = _checks.check_int('num_features', num_features, 1)
  per_row = features.num_features(feature_map, 1)
  if n % per_row or features.num_features(feature_map, 2) != 2 * per_row:
    raise ValueError(f'num_features: {feature_map!r} gives {per_row} features per row; pass '
                     f'a multiple of {per_row}, got {num_features}.')
  return n // per_row


def initial_features(key: jax.Array, groups: int, num_features: int, dim: int, *,
                     method: str, feature_map: Optional[str] = None,
                     radius: float = FitSettings().radius) -> jax.Array:
  """The starting rows ``[G, M, D]``: one N(0, I) draw ``[M, D]`` per group (key
  ``split(key, G)[g]``), projected onto the ball ‖ω‖ ≤ ``radius`` (``particles``,
  ``gradient_flow``) or scaled by 1/√D (``hedgehog``, ``adam``: Wx at the scale of x)."""
  _checks.check_key('key', key)
  fm = default_feature_map(method, feature_map)
  m = rows_for(fm, num_features)
  groups, dim = _checks.check_int('groups', groups, 1), _checks.check_int('dim', dim, 1)
  draw = jax.vmap(lambda k: features.sample_gaussian(k, m, dim))(jax.random.split(key, groups))
  if method in ADAM_METHODS:
    return draw / math.sqrt(dim)
  _checks.check_positive('radius', radius, allow_inf=True)
  return langevin.project_to_ball(draw, radius)


def mimicry_energy(feature_map: str, *, lam: float, riesz_s: repulsion.Exponent = 'coulomb',
                   softening: float = repulsion.DEFAULT_SOFTENING,
                   target: str = 'cross_entropy') -> Callable:
  """``energy(omega [M, D], q [B, L_q, D], k [B, L_k, D], shared) -> H`` of one head.

  H = ``mimicry.mimicry_hamiltonian`` (data term ``target`` + λ·W_s) with
  ``shared['key_mask']`` / ``shared['query_mask']`` (``[B, L]`` or None); other entries
  of ``shared`` are ignored.
  """
  mimicry._check_map(feature_map)            # pylint: disable=protected-access

  def energy(omega, q, k, shared):
    return mimicry.mimicry_hamiltonian(omega, q, k, feature_map=feature_map, lam=lam,
                                       s=riesz_s, softening=softening, target=target,
                                       key_mask=shared.get('key_mask'),
                                       query_mask=shared.get('query_mask'))
  return energy


def head_grads(energy: Callable, omega: jax.Array, q: jax.Array, k: jax.Array,
               shared: Dict[str, Any]) -> Tuple[jax.Array, jax.Array]:
  """``(H [G], ∇_Ω H [G, M, D])`` of every group: ``energy(omega[g], q[g], k[g], shared)``.

  ``omega: [G, M, D]``, ``q: [G, B, L_q, D]``, ``k: [G, B, L_k, D]``; ``shared`` (masks,
  labels) is the same for every group.
  """
  return jax.vmap(jax.value_and_grad(energy), in_axes=(0, 0, 0, None))(omega, q, k, shared)


def _qk_shared(batch):
  return batch['q'], batch['k'], {n: x for n, x in batch.items() if n not in ('q', 'k', 'v')}


def make_fit_step(method: str, energy: Callable, settings: FitSettings = FitSettings()
                  ) -> Tuple[Callable, Callable]:
  """``(init(omega) -> state, step(key, state, batch) -> (state, H [G]))``, ``step`` jitted.

  ``state = (omega [G, M, D], Adam's state or None)``; ``batch``: ``{q, k: [G, B, L, D]}``
  plus shared entries that ``energy`` (``mimicry_energy`` or the caller's, same
  signature) reads. ``particles``: every group moves by ``langevin.langevin_step`` with
  its own key (``split(key, G)``) and clip; ``gradient_flow``: the same at β = ∞ (λ = 0
  is the energy's); ``hedgehog``, ``adam``: Adam. H is the energy before the step.
  """
  _check_method(method)
  if method in ADAM_METHODS:
    _checks.check_positive('learning_rate', settings.learning_rate)
    opt = optax.adam(settings.learning_rate)

    def init_adam(omega):
      return omega, jax.vmap(opt.init)(omega)

    @jax.jit
    def adam_step(key, state, batch):
      del key
      omega, opt_state = state
      loss, grads = head_grads(energy, omega, *_qk_shared(batch))
      updates, opt_state = jax.vmap(opt.update)(grads, opt_state, omega)
      return (jax.vmap(optax.apply_updates)(omega, updates), opt_state), loss
    return init_adam, adam_step

  move = functools.partial(langevin.langevin_step, step_size=settings.step_size,
                           beta=math.inf if method == 'gradient_flow' else settings.beta,
                           radius=settings.radius, clip_norm=settings.clip_norm)

  @jax.jit
  def langevin_step(key, state, batch):
    omega = state[0]
    loss, grads = head_grads(energy, omega, *_qk_shared(batch))
    keys = jax.random.split(key, omega.shape[0])
    return (jax.vmap(move)(keys, omega, grads), None), loss

  return (lambda omega: (omega, None)), langevin_step


def fit_groups(key: jax.Array, omega0: jax.Array, batches: Sequence[Dict[str, Any]], *,
               method: str, steps: int, settings: FitSettings = FitSettings(),
               feature_map: Optional[str] = None,
               energy: Optional[Callable] = None) -> Tuple[jax.Array, np.ndarray]:
  """``(omega [G, M, D], losses [steps, G])`` after ``steps`` steps of ``make_fit_step``.

  ``batches``: stacked batches (``stack_heads``); step t uses ``batches[t % len]`` and key
  ``fold_in(key, t)``. ``energy`` (default ``mimicry_energy`` of the method's map with
  ``settings``' λ, 0 for ``gradient_flow``): the caller's per-group energy, same
  signature. ``losses[t]``: H before step t.
  """
  _checks.check_key('key', key)
  steps = _checks.check_int('steps', steps, 1)
  if len(batches) == 0:
    raise ValueError('batches must hold at least one batch, got none.')
  if energy is None:
    energy = mimicry_energy(default_feature_map(method, feature_map),
                            lam=0.0 if method == 'gradient_flow' else settings.lam,
                            riesz_s=settings.riesz_s, softening=settings.softening,
                            target=settings.target)
  init, step = make_fit_step(method, energy, settings)
  state = init(jnp.asarray(omega0, jnp.float32))
  device = [{n: None if x is None else jnp.asarray(x) for n, x in b.items() if n != 'v'}
            for b in batches]
  losses = []
  for t in range(steps):
    state, loss = step(jax.random.fold_in(key, t), state, device[t % len(device)])
    losses.append(loss)
  return state[0], np.asarray(jnp.stack(losses))


def fit_features(key: jax.Array, recorded: Sequence[Dict[Path, AttentionRecord]], *,
                 method: str, num_features: int, steps: int,
                 feature_map: Optional[str] = None,
                 settings: FitSettings = FitSettings(),
                 initial: Optional[Dict[Path, jax.Array]] = None,
                 ) -> Tuple[Dict[Path, jax.Array], Dict[Path, np.ndarray]]:
  """``({path: omega [H, M, D]}, {path: losses [steps, H]})``: every head's fitted features.

  Args:
    key: one PRNG key; ``split(key)`` gives the initial draw's and the fit's keys.
    recorded: ``record_attention``'s list (every batch with the same layers).
    method: a name in ``FIT_METHODS`` (module docstring).
    num_features: N, the length of φ per head (M = ``rows_for(feature_map, N)`` rows).
    steps: T ≥ 1 steps, one recorded batch each, in a fixed cycle.
    feature_map: the map of ``particles`` / ``gradient_flow`` (default ``favor``);
      ``hedgehog`` always fits the map ``hedgehog``.
    settings: η, β, λ, R, clip, Riesz s and ε, Adam's rate, the data term.
    initial: ``{path: omega [H, M, D]}`` for every recorded layer, the rows to start from
      (a warm start: a model's current particles, an earlier fit); None: the draw of
      ``initial_features`` from ``split(key)[0]``. The fit's key is ``split(key)[1]`` either
      way, so ``initial`` = that draw gives the default fit exactly. Rows outside the
      ball of ``particles`` / ``gradient_flow`` are projected by their first step.

  ``losses[path][t]``: each head's H before step t. Run the model with
  ``linear_attention_fns(omegas, default_feature_map(method, feature_map))``.
  """
  _checks.check_key('key', key)
  fm = default_feature_map(method, feature_map)
  if len(recorded) == 0:
    raise ValueError('recorded must hold at least one batch, got none.')
  stacked = [stack_heads(r) for r in recorded]
  layout = stacked[0][1]
  for i, (_, other) in enumerate(stacked):
    if other != layout:
      raise ValueError(f'recorded[{i}] has layers {[(("/".join(p)), h) for p, h in other]}, '
                       f'recorded[0] {[("/".join(p), h) for p, h in layout]}.')
  first = stacked[0][0]['q']
  init_key, fit_key = jax.random.split(key)
  if initial is None:
    omega0 = initial_features(init_key, first.shape[0], num_features, first.shape[-1],
                              method=method, feature_map=fm, radius=settings.radius)
  else:
    omega0 = stack_initial(initial, layout, (rows_for(fm, num_features), first.shape[-1]))
  omega, losses = fit_groups(fit_key, omega0, [b for b, _ in stacked], method=method,
                             steps=steps, settings=settings, feature_map=fm)
  omegas, head_losses = split_heads(omega, layout), split_heads(losses, layout, axis=1)
  _check_finite_fit(omegas, head_losses, method, steps)
  return omegas, head_losses


def with_particles(params, omegas: Dict[Path, jax.Array]):
  """``params`` with ``path/particles`` set to ``omegas[path]`` (``KernelAttention`` layers,
  or modules holding ``models.particles_param``); the shapes must match."""
  flat = dict(traverse_util.flatten_dict(params))
  for path, omega in omegas.items():
    leaf = tuple(path) + (models.PARTICLES,)
    if leaf not in flat:
      raise ValueError(f'omegas: params hold no {"/".join(leaf)}.')
    if np.shape(flat[leaf]) != np.shape(omega):
      raise ValueError(f'omegas[{"/".join(path)}] has shape {np.shape(omega)}, the params\' '
                       f'particles {np.shape(flat[leaf])}.')
    flat[leaf] = jnp.asarray(omega, flat[leaf].dtype)
  return traverse_util.unflatten_dict(flat)


def fit_in_model(key: jax.Array, model: nn.Module, variables, batches: Sequence[Any], *,
                 method: str, steps: int, feature_map: Optional[str] = None,
                 settings: FitSettings = FitSettings(), inputs: Optional[Callable] = None,
                 apply_kwargs: Optional[Dict[str, Any]] = None
                 ) -> Tuple[Any, Dict[Path, np.ndarray]]:
  """``(variables, {path: losses [steps, H]})``: the ``particles`` of every attention layer of
  ``model`` fitted to the softmax attention of its own queries and keys, in place.

  Step t records the model with its current features (``attention_records`` on
  ``batches[t % len]``: layer 1's (q, k) stay the trained model's, a later layer's follow
  the features fitted below it) and moves every head of every layer once by
  ``make_fit_step`` (key ``fold_in(key, t)``), from the rows the params hold. Every
  recorded layer must hold ``particles`` (a ``models.KernelAttention``, e.g. a trained model
  rebuilt with kernel attention and its weights copied in; ``fit_features`` fits recorded
  softmax layers). ``method``, ``feature_map`` (the model's map), ``settings``: as
  ``fit_features`` (λ of ``mimicry_energy``: ``settings.lam``, 0 for ``gradient_flow``);
  ``inputs``, ``apply_kwargs``: as ``attention_records``. Every other variable is unchanged.
  ``losses[path][t]``: each head's H before step t.
  """
  _checks.check_key('key', key)
  steps = _checks.check_int('steps', steps, 1)
  fm = default_feature_map(method, feature_map)
  if len(batches) == 0:
    raise ValueError('batches must hold at least one batch, got none.')
  if not isinstance(variables, dict) or 'params' not in variables:
    raise ValueError(f'variables must be a dict with the model\'s \'params\', got '
                     f'{type(variables).__name__}'
                     f'{" with " + str(sorted(variables)) if isinstance(variables, dict) else ""}.')
  record = functools.partial(attention_records, model, inputs=inputs, apply_kwargs=apply_kwargs)
  paths = sorted(jax.eval_shape(record, variables, batches[0]))
  flat = traverse_util.flatten_dict(variables['params'])
  missing = ['/'.join(p) for p in paths if p + (models.PARTICLES,) not in flat]
  if missing:
    raise ValueError(f'model: attention layers {missing} hold no {models.PARTICLES!r}; '
                     'fit_in_model fits kernel layers (fit_features fits recorded softmax ones).')
  layout = tuple((p, np.shape(flat[p + (models.PARTICLES,)])[0]) for p in paths)
  energy = mimicry_energy(fm, lam=0.0 if method == 'gradient_flow' else settings.lam,
                          riesz_s=settings.riesz_s, softening=settings.softening,
                          target=settings.target)
  init, fit_step = make_fit_step(method, energy, settings)

  def stacked_rows(params):
    p = traverse_util.flatten_dict(params)
    return jnp.concatenate([jnp.asarray(p[path + (models.PARTICLES,)], jnp.float32)
                            for path, _ in layout], axis=0)

  @jax.jit
  def step(key, variables, opt_state, batch):
    records = record(variables, batch)
    stacked, _ = stack_heads({p: records[p] for p, _ in layout})
    state = (stacked_rows(variables['params']), opt_state)
    (omega, opt_state), loss = fit_step(key, state, stacked)
    params = with_particles(variables['params'], split_heads(omega, layout))
    return dict(variables, params=params), opt_state, loss

  opt_state = init(stacked_rows(variables['params']))[1]
  losses = []
  for t in range(steps):
    variables, opt_state, loss = step(jax.random.fold_in(key, t), variables, opt_state,
                                      batches[t % len(batches)])
    losses.append(loss)
  omegas = {p: traverse_util.flatten_dict(variables['params'])[p + (models.PARTICLES,)]
            for p, _ in layout}
  head_losses = split_heads(np.asarray(jnp.stack(losses)), layout, axis=1)
  _check_finite_fit(omegas, head_losses, method, steps)
  return variables, head_losses


def _check_finite_fit(omegas, losses, method: str, steps: int) -> None:
  """One ``FloatingPointError`` naming the first layer and head whose fitted features are
  not finite, and the first step whose loss was not (a NaN stays in its head: the fit is
  per head)."""
  for path in sorted(omegas):
    bad = ~np.isfinite(np.asarray(omegas[path])).reshape(omegas[path].shape[0], -1).all(-1)
    if bad.any():
      head = int(np.flatnonzero(bad)[0])
      first = np.flatnonzero(~np.isfinite(np.asarray(losses[path])[:, head]))
      when = f'; its loss was first non-finite before step {int(first[0])}' if first.size else ''
      raise FloatingPointError(
          f'fit_features: {"/".join(path)} head {head} holds non-finite features after '
          f'{steps} {method} steps{when}. Lower the step size or learning rate (settings), or '
          'check the recorded attention.')
