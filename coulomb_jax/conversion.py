r"""Converting a trained Flax model's softmax attention to linear attention with fitted features.

For any Flax model whose attention layers are ``nn.MultiHeadDotProductAttention`` (flax's
softmax or any ``attention_fn``) or ``models.KernelAttention``:

1. ``record_attention(model, variables, batches)``: per batch and attention layer (by
   module path), the per-head queries, keys and values ``[H, B, L, D]`` and the key and
   query masks ``[B, L]`` (``nn.intercept_methods`` reads each
   ``MultiHeadDotProductAttention``'s projections and mask; ``KernelAttention`` sows its
   (q, k) as ``flax_attention.MIMICRY_INPUTS``).
2. ``fit_features(key, recorded, method=..., num_features=N, steps=T)``: per layer
   ``omega: [H, M, D]``, each head's features fitted so that its linear attention
   reproduces its softmax attention on the recorded rows, by lowering the mimicry
   Hamiltonian (``mimicry.mimicry_hamiltonian``) H(Ω) = CE(A_soft ‖ A_lin) + λ·W_s(Ω):

   ==================  ======================================================================
   ``particles``       projected Langevin ω ← P_R(ω − η·M·clip(∇H) + √(2η/β)·ξ)
                       (``langevin.langevin_step``), from N(0, I) rows projected onto the ball.
   ``gradient_flow``   the same with λ = 0 and β = ∞: ω ← P_R(ω − η·M·clip(∇CE)).
   ``hedgehog``        Zhang et al.'s φ = [e^{Wx}, e^{−Wx}] (map ``hedgehog``), M = N/2 rows
                       of W from N(0, I/D), by Adam on H (λ = 0: Hedgehog's loss exactly).
   ==================  ======================================================================

3. ``linear_attention_fns(omegas, feature_map)``: one ``flax_attention.kernel_attention_fn``
   per layer, the ``attention_fn`` the model runs with in place of softmax (its trained
   parameters unchanged); ``with_particles(params, omegas)`` for ``KernelAttention``.

N = ``num_features`` is the length of φ per head: ``features.num_features(feature_map, M)``
= N (M = N for ``favor``, N/2 for ``hedgehog``, ``softmaxfeat``). All heads of all layers
are fitted at once, vmapped over G = Σ_layers H groups (layer-major, record order); step t
uses recorded batch ``t % len(recorded)`` and noise key ``fold_in(key, t)`` split over the
groups. The rows of a sequence are compared over all its recorded keys, so for a causal
model the target is the kernel (causality changes which keys a row sums, not the kernel):
run it with ``causal=True``. A fit inside a model (each step records the converted model's
own attention; ``studies/mqar_convert/convert.py``) uses ``attention_records`` and
``head_grads`` with its own optimiser.

Example (``model`` takes its layers' attention functions from a field ``attention_fns``)::

  recorded = conversion.record_attention(model, variables, batches,
                                         inputs=lambda b: (b['x'], b['mask']))
  omegas, _ = conversion.fit_features(jax.random.key(0), recorded, method='particles',
                                      num_features=64, steps=300)
  linear = model.clone(attention_fns=conversion.linear_attention_fns(omegas, 'favor'))
  out = linear.apply(variables, x, mask)
"""

import functools
import inspect
import math
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

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
from coulomb_jax.layers import flax_attention
from coulomb_jax.layers import models

FIT_METHODS = ('particles', 'gradient_flow', 'hedgehog')
"""How ``fit_features`` moves the features (module docstring)."""

Path = Tuple[str, ...]

_PROJECTIONS = {'query': 'q', 'key': 'k', 'value': 'v', 'query_ln': 'q', 'key_ln': 'k'}


class AttentionRecord(NamedTuple):
  """One attention layer on one batch: per-head unscaled inputs of its attention.

  ``q: [H, B, L_q, D]``, ``k: [H, B, L_k, D]``, ``v: [H, B, L_k, D_v]`` (None for
  ``KernelAttention``, which sows no values), ``key_mask: [B, L_k]`` and
  ``query_mask: [B, L_q]`` bool, True = real (None: every token real).
  """
  q: Any
  k: Any
  v: Any
  key_mask: Any
  query_mask: Any


class FitSettings(NamedTuple):
  """The fit's constants (defaults: the mimicry study's, ``studies/softmax_mimicry/config.py``)."""
  step_size: float = 0.03          # η of the Langevin methods
  beta: float = 1e4                # β of ``particles`` (``gradient_flow``: ∞)
  lam: float = 1e-3                # λ of the repulsion (``gradient_flow``: 0)
  radius: float = 12.0             # R of the per-particle ball (initial draw and projection)
  clip_norm: Optional[float] = 10.0  # per-head clip of ∇H in the Langevin methods
  riesz_s: repulsion.Exponent = 'coulomb'
  softening: float = 0.5           # ε of the Riesz kernel
  learning_rate: float = 3e-3      # Adam's rate (``hedgehog``)
  target: str = 'cross_entropy'    # the data term (``mimicry.TARGETS``)


# ----------------------------------------------------------------------------- recording

def _bound(module, args, kwargs):
  """The arguments of ``module.__call__(*args, **kwargs)`` by name."""
  bound = inspect.signature(type(module).__call__).bind(module, *args, **kwargs)
  return bound.arguments


def _masks(mask, shape_q, shape_k, self_attention):
  """``(key_mask [B, L_k], query_mask [B, L_q])`` of a layer's mask (None: all real).

  A flax mask ``[B | 1, H | 1, L_q | 1, L_k]``: key j is real when some query attends it,
  row i when it attends some key. A ``[B, L]`` mask (``KernelAttention``): the real keys,
  and the real rows too in self-attention.
  """
  if mask is None:
    return None, None
  m = jnp.asarray(mask, bool)
  (b, lq, h, _), lk = shape_q, shape_k[1]
  if m.ndim == 2:
    return m, (m if self_attention else None)
  if m.ndim != 4:
    raise ValueError(f'mask must be [B, L] or [B, H, L_q, L_k] (broadcastable), got shape '
                     f'{m.shape}.')
  m = jnp.broadcast_to(m, (b, h, lq, lk))
  return jnp.any(m, axis=(1, 2)), jnp.any(m, axis=(1, 3))


def attention_records(model: nn.Module, variables, batch, *, inputs: Optional[Callable] = None,
                      apply_kwargs: Optional[Dict[str, Any]] = None
                      ) -> Dict[Path, AttentionRecord]:
  """``{path: AttentionRecord}`` of every attention layer of ``model`` on one batch (jittable).

  ``path``: the module path of each ``nn.MultiHeadDotProductAttention`` (its ``query``,
  ``key``, ``value`` projections, after ``query_ln``/``key_ln`` with ``normalize_qk``) and
  each ``models.KernelAttention`` (its sown ``MIMICRY_INPUTS``), in call order.
  ``inputs(batch)``: the positional arguments of ``model.apply`` after the variables
  (default ``(batch,)``); ``apply_kwargs``: its keyword arguments. No gradient flows
  back through the records (``stop_gradient``).
  """
  args = (batch,) if inputs is None else tuple(inputs(batch))
  parts: Dict[Path, Dict[str, Any]] = {}

  def interceptor(next_fun, call_args, call_kwargs, context):
    module = context.module
    if context.method_name != '__call__':
      return next_fun(*call_args, **call_kwargs)
    if isinstance(module, (nn.MultiHeadDotProductAttention, models.KernelAttention)):
      if module.path in parts:
        raise ValueError(f'model: the attention layer {"/".join(module.path)} ran twice in '
                         'one apply; record_attention keeps one record per layer.')
      named = _bound(module, call_args, call_kwargs)
      self_attention = all(named.get(n) is None for n in ('inputs_k', 'inputs_kv'))
      parts[module.path] = dict(mask=named.get('mask'), self_attention=self_attention,
                                kernel=isinstance(module, models.KernelAttention))
    out = next_fun(*call_args, **call_kwargs)
    parent = module.parent
    if (isinstance(parent, nn.MultiHeadDotProductAttention) and module.name in _PROJECTIONS
        and parent.path in parts):
      parts[parent.path][_PROJECTIONS[module.name]] = out
    return out

  with nn.intercept_methods(interceptor):
    _, state = model.apply(variables, *args, mutable=['intermediates'], **(apply_kwargs or {}))
  if not parts:
    raise ValueError('model: no nn.MultiHeadDotProductAttention or models.KernelAttention '
                     'ran in model.apply; nothing to record.')
  sown = traverse_util.flatten_dict(state.get('intermediates', {}))
  out = {}
  for path, p in parts.items():
    if p['kernel']:
      q, k = sown[path + (flax_attention.MIMICRY_INPUTS,)][0]
      p = dict(p, q=q, k=k, v=None)
    q, k, v = (None if p[n] is None else jax.lax.stop_gradient(jnp.moveaxis(p[n], 2, 0))
               for n in 'qkv')
    if q.ndim != 4:
      raise ValueError(f'model: attention layer {"/".join(path)} has queries of shape '
                       f'{p["q"].shape}; record_attention reads [B, L, H, D] (one batch axis).')
    key_mask, query_mask = _masks(p['mask'], p['q'].shape, p['k'].shape, p['self_attention'])
    out[path] = AttentionRecord(q, k, v, key_mask, query_mask)
  return out


def record_attention(model: nn.Module, variables, batches: Sequence[Any], *,
                     inputs: Optional[Callable] = None,
                     apply_kwargs: Optional[Dict[str, Any]] = None
                     ) -> List[Dict[Path, AttentionRecord]]:
  """Per batch, ``attention_records`` of ``model`` (jitted once; numpy arrays).

  ``recorded[b][path]`` is layer ``path`` on ``batches[b]``: ``q, k, v: [H, B, L, D]``
  and its masks (``AttentionRecord``). ``inputs``, ``apply_kwargs``: as
  ``attention_records``.
  """
  if len(batches) == 0:
    raise ValueError('batches must hold at least one batch, got none.')
  record = jax.jit(functools.partial(attention_records, model, inputs=inputs,
                                     apply_kwargs=apply_kwargs))
  return [jax.device_get(record(variables, b)) for b in batches]


def stack_heads(records: Dict[Path, AttentionRecord]) -> Tuple[Dict[str, Any],
                                                              Tuple[Tuple[Path, int], ...]]:
  """``(batch, layout)``: one batch's layers stacked on a group axis G = Σ_layers H.

  ``batch``: ``{q, k, v: [G, B, L, D], key_mask, query_mask: [B, L]}`` (group g = the
  g-th head in record order; ``v`` None if a layer has none); ``layout``: ``((path,
  H), ...)``, which ``split_heads`` undoes. Every layer must have the same (B, L_q,
  L_k, D) and the same masks (self-attention over one batch); else one ValueError.
  """
  if not records:
    raise ValueError('records must hold at least one attention layer, got none.')
  paths = list(records)
  first = records[paths[0]]
  for path in paths[1:]:
    r = records[path]
    if r.q.shape[1:] != first.q.shape[1:] or r.k.shape[1:] != first.k.shape[1:]:
      raise ValueError(f'records: layer {"/".join(path)} has q, k of shapes {r.q.shape}, '
                       f'{r.k.shape}, layer {"/".join(paths[0])} {first.q.shape}, '
                       f'{first.k.shape}; stack layers of one shape (fit the others apart).')
    for name in ('key_mask', 'query_mask'):
      a, b = getattr(first, name), getattr(r, name)
      same = (a is None) == (b is None) and (a is None or not _checks.is_concrete(a)
                                             or np.array_equal(a, b))
      if not same:
        raise ValueError(f'records: layer {"/".join(path)} has another {name} than layer '
                         f'{"/".join(paths[0])}; stack layers that see the same tokens.')
  cat = lambda xs: jnp.concatenate(xs, axis=0) if len(xs) > 1 else xs[0]
  values = [records[p].v for p in paths]
  batch = {'q': cat([records[p].q for p in paths]), 'k': cat([records[p].k for p in paths]),
           'v': None if any(v is None for v in values) else cat(values),
           'key_mask': first.key_mask, 'query_mask': first.query_mask}
  return batch, tuple((p, records[p].q.shape[0]) for p in paths)


def split_heads(x, layout: Tuple[Tuple[Path, int], ...], axis: int = 0) -> Dict[Path, Any]:
  """``{path: x[..., g0:g0 + H, ...]}`` along ``axis`` (the group axis of ``stack_heads``)."""
  total = sum(h for _, h in layout)
  if np.shape(x)[axis] != total:
    raise ValueError(f'x must have {total} groups on axis {axis} (layout), got shape '
                     f'{np.shape(x)}.')
  out, start = {}, 0
  for path, h in layout:
    index = [slice(None)] * np.ndim(x)
    index[axis] = slice(start, start + h)
    out[path], start = x[tuple(index)], start + h
  return out


# ----------------------------------------------------------------------------- fitting

def _check_method(method):
  if method not in FIT_METHODS:
    raise ValueError(f'method must be one of {FIT_METHODS}, got {method!r}.')


def default_feature_map(method: str, feature_map: Optional[str] = None) -> str:
  """The map of ``method``: ``hedgehog`` for ``'hedgehog'`` (the only one it takes), else
  ``feature_map`` (default ``favor``; a name in ``mimicry.MIMICRY_FEATURE_MAPS``)."""
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
  ``gradient_flow``) or scaled by 1/√D (``hedgehog``, so that Wx has the scale of x)."""
  _checks.check_key('key', key)
  fm = default_feature_map(method, feature_map)
  m = rows_for(fm, num_features)
  groups, dim = _checks.check_int('groups', groups, 1), _checks.check_int('dim', dim, 1)
  draw = jax.vmap(lambda k: features.sample_gaussian(k, m, dim))(jax.random.split(key, groups))
  if method == 'hedgehog':
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
  is the energy's); ``hedgehog``: Adam. H is the energy before the step.
  """
  _check_method(method)
  if method == 'hedgehog':
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
                 settings: FitSettings = FitSettings()
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
  omega0 = initial_features(init_key, first.shape[0], num_features, first.shape[-1],
                            method=method, feature_map=fm, radius=settings.radius)
  omega, losses = fit_groups(fit_key, omega0, [b for b, _ in stacked], method=method,
                             steps=steps, settings=settings, feature_map=fm)
  omegas, head_losses = split_heads(omega, layout), split_heads(losses, layout, axis=1)
  _check_finite_fit(omegas, head_losses, method, steps)
  return omegas, head_losses


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


# ----------------------------------------------------------------------------- running

def linear_attention_fns(omegas: Dict[Path, jax.Array], feature_map: str, *,
                         causal: bool = False) -> Tuple[Callable, ...]:
  """One ``flax_attention.kernel_attention_fn(omega [H, M, D], feature_map, causal=causal)``
  per layer, in ``omegas``' order (the order ``record_attention`` met the layers in): the
  ``attention_fn`` of each ``nn.MultiHeadDotProductAttention`` of the converted model.

  ``causal=True`` for a causal model (flax's causal masks are then honoured exactly).
  """
  if not omegas:
    raise ValueError('omegas must hold at least one layer, got none.')
  return tuple(flax_attention.kernel_attention_fn(jnp.asarray(w), feature_map, causal=causal)
               for w in omegas.values())


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
