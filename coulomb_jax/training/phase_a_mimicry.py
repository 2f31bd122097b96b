r"""Phase A with the softmax target (``phase_a.target = 'softmax'``), as pure jitted steps.

The particles Ω (every ``particles`` leaf ``[H, M, D_h]``) move by the same projected
Langevin dynamics as the label target (``training``), on

.. math::
   H(Ω) = \sum_{l,h} \big[ CE_{l,h}(Ω_{l,h}) + λ\,W_s(Ω_{l,h}) \big]

with CE_{l,h} the cross-entropy between softmax attention and head h's linear attention
on layer l's own queries and keys of the batch's real tokens
(``mimicry.attention_cross_entropy``; ``models.KernelAttention`` sows them as
``mimicry_inputs``), treated as data (``stop_gradient``). Labels are not used. Its
held-out statistic is the attention KL (``heldout_attention_kl``) and its potential the
first variation of CE (``phase_a_mimicry_potentials``), for the Gibbs-tilt rule.

``sown_forces`` is the one path from sown (q, k) to per-head forces for this target: the
Phase A step and forces here, and the causal LM's mimicry force (``training.lm.train_step``,
``training.lm.mimicry_forces``, ``training.lm.force_terms``) call it.
"""

import functools
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from coulomb_jax import _checks
from coulomb_jax import features
from coulomb_jax import langevin_diagnostics
from coulomb_jax import mimicry
from coulomb_jax import repulsion
from coulomb_jax.layers import flax_attention
from coulomb_jax.training.inputs import sown
from coulomb_jax.training.state import (PARTICLES, TrainState, apply_particle_step,
                                        particle_leaves)

MIMICRY_INPUTS = flax_attention.MIMICRY_INPUTS
"""The name the kernel layers sow the unscaled per-head (q, k) under."""


def mimicry_inputs(model: nn.Module, params, batch, *, inputs: Optional[Callable] = None,
                   apply_kwargs: Optional[Dict[str, Any]] = None
                   ) -> Dict[Tuple[str, ...], Tuple[Any, Any]]:
  """``{path of the attention module: (q, k)}``, each ``[B, L, H, D_h]`` (unscaled; no
  gradient); ``inputs`` / ``apply_kwargs`` as ``training.make_phase_a_step``."""
  out = sown(model, params, batch, MIMICRY_INPUTS, inputs=inputs, apply_kwargs=apply_kwargs)
  return {k: tuple(v) for k, v in out.items()}


def token_mask(batch) -> jax.Array:
  """``[B, L]`` bool: the real tokens of the real rows (``mask`` and ``weights > 0``)."""
  try:
    mask, weights = batch['mask'], batch['weights']
  except (KeyError, TypeError):
    raise ValueError("mask: the batch has no 'mask' and 'weights'; pass mask=lambda batch: "
                     '[B, L] real tokens to the step builder.') from None
  return jnp.logical_and(jnp.asarray(mask, bool), (jnp.asarray(weights) > 0)[:, None])


def _query_mean(fn, omega, q, k, mask, feature_map):
  """(1/n) Σ_{b, i real} fn_i(q_b; k_b) for one head: ``q, k: [B, L, D]``, ``mask: [B, L]``.

  ``fn``: ``mimicry.attention_cross_entropy`` or ``attention_kl``, with ``mask`` as
  both key and query mask (the mean over the n real query rows of all rows); padded
  queries are zeroed first, so that no value of theirs reaches the gradient.
  """
  q = jnp.where(mask[..., None], q, 0.0)
  return fn(q, k, omega, feature_map, mask, mask)


def _per_head(fn, omega, qk, mask, feature_map):
  """``[H]``: ``_query_mean`` of every head; ``omega: [H, M, D_h]``, ``qk``: ``[B, L, H, D_h]`` each."""
  q, k = (jnp.asarray(x, jnp.float32) for x in qk)
  return jax.vmap(lambda w, qh, kh: _query_mean(fn, w, qh, kh, mask, feature_map),
                  in_axes=(0, 2, 2))(omega, q, k)


class SownForces(NamedTuple):
  """``sown_forces``' result: per attention path, per head.

  ``data``: ∇_Ω D, ``repulsion``: ∇_Ω W_s, ``hamiltonian``: ∇_Ω (D + λ·W_s) taken as one
  gradient, each ``{path: [H, M, D_h]}``; ``data_value``: D, ``repulsion_value``: W_s,
  each ``{path: [H]}``. Under ``jit`` the parts a caller does not read are not computed.
  """
  data: Dict[Tuple[str, ...], Any]
  repulsion: Dict[Tuple[str, ...], Any]
  hamiltonian: Dict[Tuple[str, ...], Any]
  data_value: Dict[Tuple[str, ...], Any]
  repulsion_value: Dict[Tuple[str, ...], Any]


def sown_forces(params, inputs, *, feature_map: str, lam: float, s: repulsion.Exponent,
                softening: float, target: str = 'cross_entropy', rows: Optional[int] = None,
                mask: Optional[jax.Array] = None) -> SownForces:
  r"""The mimicry forces on every head's particles from its layer's sown (q, k).

  Per path l (``inputs[l] = (q, k)``, each ``[B, L, H, D_h]``, unscaled, as
  ``KernelAttention`` sows them under ``MIMICRY_INPUTS``) and head h, with
  Ω = ``params``' ``l/particles[h]`` ``[M, D_h]``:

  .. math::
     H_{l,h}(Ω) = D(Ω; q_{·,·,h}, k_{·,·,h}) + λ\,W_s(Ω)

  D the data term ``target`` of ``mimicry.mimicry_hamiltonian_terms`` (``cross_entropy``:
  CE(A^soft ‖ A^lin), the mean over the query rows) and W_s ``repulsion.riesz_energy``.
  The rows are the first ``rows`` sequences (None: all B). ``mask: [B, L]`` bool (None:
  every token is real): padded queries are zeroed and both the key and the query mask of
  D (its mean runs over the real query tokens of all rows). q and k are data
  (``stop_gradient``), promoted to float32 at least. The heads are one ``jax.vmap`` of
  ``jax.value_and_grad`` per part. Returns ``SownForces``; the caller's λ-weighted sum
  ∇D + λ∇W equals ``hamiltonian`` up to rounding.
  """
  if rows is not None:
    _checks.check_int('rows', rows, 1)
  flat = traverse_util.flatten_dict(params)
  missing = sorted('/'.join(p) for p in inputs if p + (PARTICLES,) not in flat)
  if missing:
    raise ValueError(f'inputs: {missing} have no particles in params; pass the params of '
                     'the model that sowed them.')
  if mask is not None and any(np.shape(mask) != np.shape(qk[0])[:2] for qk in inputs.values()):
    raise ValueError(f'mask must have shape [B, L] of the sown q, got {np.shape(mask)} for '
                     f'{sorted({np.shape(qk[0])[:2] for qk in inputs.values()})}.')
  terms = functools.partial(mimicry.mimicry_hamiltonian_terms, feature_map=feature_map,
                            lam=lam, s=s, softening=softening, target=target)

  def head(omega, q, k):
    key_mask = query_mask = None
    if mask is not None:
      key_mask = query_mask = jnp.asarray(mask if rows is None else mask[:rows], bool)
      q = jnp.where(key_mask[..., None], q, 0.0)
    masks = dict(key_mask=key_mask, query_mask=query_mask)
    data = jax.value_and_grad(lambda w: terms(w, q, k, **masks)[0])(omega)
    rep = jax.value_and_grad(lambda w: repulsion.riesz_energy(w, s=s, softening=softening))(
        omega)
    total = jax.grad(lambda w: mimicry.mimicry_hamiltonian(
        w, q, k, feature_map=feature_map, lam=lam, s=s, softening=softening, target=target,
        **masks))(omega)
    return data, rep, total

  out = SownForces({}, {}, {}, {}, {})
  for path, qk in inputs.items():
    q, k = (jax.lax.stop_gradient(jnp.moveaxis(
        (x if rows is None else x[:rows]).astype(jnp.promote_types(x.dtype, jnp.float32)),
        2, 0)) for x in qk)                                 # [H, B', L, D_h]
    (d, g_d), (w, g_w), g_h = jax.vmap(head)(flat[path + (PARTICLES,)], q, k)
    out.data[path], out.repulsion[path], out.hamiltonian[path] = g_d, g_w, g_h
    out.data_value[path], out.repulsion_value[path] = d, w
  return out


def phase_a_mimicry_objective(params, inputs, mask, *, feature_map, lam: float, s,
                              softening: float):
  r"""(H, {"cross_entropy": Σ CE, "repulsion": Σ W}) summed over layers and heads.

  The softmax target of Phase A (``phase_a.target = 'softmax'``; Hedgehog's loss):

  .. math::
     H(Ω) = \sum_{l,h} \big[ CE_{l,h}(Ω_{l,h}) + λ\,W_s(Ω_{l,h}) \big],\quad
     CE_{l,h} = \frac{1}{n} \sum_{b,\,i\ real} −\sum_{j\ real}
       A^{soft}_{b,ij} \log A^{lin}_{b,ij}

  with A^soft = softmax_j(q_iᵀk_j/√D_h) and A^lin the linear attention of the head's
  particles on q̃ = D_h^{−1/4} q, k̃ = D_h^{−1/4} k (``mimicry.attention_cross_entropy``),
  q, k the head's own queries and keys of row b (``inputs[path]``: ``([B, L, H, D_h],
  [B, L, H, D_h])``, ``mimicry_inputs``), n = Σ mask the real query tokens, and keys
  j over the row's real tokens. ``mask: [B, L]`` bool (``token_mask``): padded tokens
  and rows change neither H nor its gradient. Labels are not used.
  """
  flat = traverse_util.flatten_dict(params)
  mask = jnp.asarray(mask, bool)
  total = ce = repel = 0.0
  for path, qk in inputs.items():
    omega = flat[path + (PARTICLES,)]                      # [H, M, D_h]
    c = jnp.sum(_per_head(mimicry.attention_cross_entropy, omega, qk, mask, feature_map))
    w = jnp.sum(jax.vmap(lambda o: repulsion.riesz_energy(o, s, softening))(omega))
    total, ce, repel = total + c + lam * w, ce + c, repel + w
  return total, {'cross_entropy': ce, 'repulsion': repel}


def _as_tree(params, leaves):
  """``params``' structure: ``leaves[path]`` at ``path/particles``, zeros elsewhere."""
  def leaf(key_path, x):
    path = tuple(getattr(k, 'key', k) for k in key_path)
    if path[-1] == PARTICLES and path[:-1] in leaves:
      return leaves[path[:-1]]
    return jnp.zeros_like(x)
  return jax.tree_util.tree_map_with_path(leaf, params)


def _mimicry_grads(params, inputs, mask, kw):
  """(H, aux, ∇CE, ∇W): the two gradients as full parameter trees, ∇H = ∇CE + λ∇W.

  ``sown_forces`` of the cross-entropy on ``inputs`` under ``mask``; H and aux as
  ``phase_a_mimicry_objective`` (sums over heads, then over paths in ``inputs``' order).
  """
  f = sown_forces(params, inputs, mask=mask, **kw)
  total = ce = repel = 0.0
  for path in inputs:
    c, w = jnp.sum(f.data_value[path]), jnp.sum(f.repulsion_value[path])
    total, ce, repel = total + c + kw['lam'] * w, ce + c, repel + w
  aux = {'cross_entropy': ce, 'repulsion': repel}
  return total, aux, _as_tree(params, f.data), _as_tree(params, f.repulsion)


def phase_a_mimicry_forces(params, inputs, mask, *, feature_map, lam: float, s,
                           softening: float, only: Optional[Sequence[str]] = None
                           ) -> Dict[str, Any]:
  """``{'hamiltonian': ∇H, 'cross_entropy': ∇CE, 'repulsion': ∇W}`` of the particles.

  As ``phase_a_forces`` for ``phase_a_mimicry_objective`` (∇H = ∇CE + λ∇W, ``sown_forces``),
  each a ``{path: [H, M, D_h]}`` dict over the modules that move (``only``: one).
  """
  kw = dict(feature_map=feature_map, lam=lam, s=s, softening=softening)
  _, _, g_ce, g_w = _mimicry_grads(params, inputs, mask, kw)
  ce, w = particle_leaves(g_ce, only), particle_leaves(g_w, only)
  return {'hamiltonian': {p: ce[p] + lam * w[p] for p in ce}, 'cross_entropy': ce,
          'repulsion': w}


def make_phase_a_mimicry_step(model: nn.Module, optimizer: optax.GradientTransformation, *,
                              feature_map, lam: float, s, softening: float,
                              only: Optional[Sequence[str]] = None,
                              langevin_settings: Optional[Dict[str, float]] = None,
                              inputs: Optional[Callable] = None,
                              mask: Optional[Callable] = None,
                              apply_kwargs: Optional[Dict[str, Any]] = None) -> Callable:
  """``step(state, batch) -> (state, metrics)``: one Langevin move on the softmax target.

  ``make_phase_a_step`` with ``phase_a_mimicry_objective`` on the batch's own
  queries and keys (one encoder forward per step). ``only``: the path of one
  attention module; only its term is computed (pass ``phase_a_optimizer(...,
  only=path)``): the layer-wise stages, on the inputs of the layers below as they
  are. Metrics: ``hamiltonian``, ``cross_entropy``, ``repulsion``, ``max_move``,
  ``nonfinite_particles`` / ``nonfinite_grads`` (as the label target's) and with
  ``langevin_settings`` ``drift_to_noise`` and ``repulsion_to_alignment``
  (λ‖∇W‖/‖∇CE‖) ``[P]``. The target compares each layer's linear attention rows with
  softmax rows over *all* real keys of the sequence, also in a causal model: a kernel
  fidelity target (causality changes which keys a row sums over, not the kernel). ``inputs``, ``mask`` and ``apply_kwargs``: as
  ``training.make_phase_a_step`` (the public builder; ``target='softmax'`` calls this).
  """
  kw = dict(feature_map=feature_map, lam=lam, s=s, softening=softening)
  only = None if only is None else tuple(only)
  token_mask_of = token_mask if mask is None else mask

  def step(state: TrainState, batch):
    data = mimicry_inputs(model, state.params, batch, inputs=inputs, apply_kwargs=apply_kwargs)
    if only is not None:
      data = {only: data[only]}
    h, aux, g_ce, g_w = _mimicry_grads(state.params, data, token_mask_of(batch), kw)
    grads = jax.tree.map(lambda a, b: a + lam * b, g_ce, g_w)
    new_state, moved = apply_particle_step(optimizer, state, grads, only)
    metrics = dict(aux, hamiltonian=h, **moved)
    if langevin_settings is not None:
      ls = langevin_settings
      metrics.update(drift_to_noise=langevin_diagnostics.drift_to_noise(
          particle_leaves(grads, only), step_size=ls['step_size'], beta=ls['beta'],
          clip_norm=ls.get('clip_norm')), repulsion_to_alignment=langevin_diagnostics.force_ratio(
              particle_leaves(g_w, only), particle_leaves(g_ce, only), lam))
    return new_state, metrics

  return step


def heldout_attention_kl(params, inputs, mask, *, feature_map,
                         only: Optional[Sequence[str]] = None) -> Dict[Tuple[str, ...], Any]:
  """``{path: [H]}``: each head's attention KL(softmax ‖ linear) on held-out rows.

  Per head, the mean over the real query tokens (``mask: [B, L]``) of
  Σ_j A^soft_ij (log A^soft_ij − log A^lin_ij) (``mimicry.attention_kl``) on the
  rows' queries and keys ``inputs[path]`` (``mimicry_inputs``). Average batches
  with weights Σ mask.
  """
  mask = jnp.asarray(mask, bool)
  return {path: _per_head(mimicry.attention_kl, omega, inputs[path], mask, feature_map)
          for path, omega in particle_leaves(params, only).items()}


def _log_kernel(qh, kh, omega, feature_map):
  """log κ_ω(q̃_i, k̃_j) ``[M, ..., L, L]`` of each particle alone (its one-particle map)."""
  scale = qh.shape[-1] ** -0.25
  one = lambda w: features.log_features(qh * scale, w[None], feature_map)   # [..., L, F1]
  lq, lk = jax.vmap(one)(omega), jax.vmap(
      lambda w: features.log_features(kh * scale, w[None], feature_map))(omega)
  return jax.nn.logsumexp(lq[..., :, None, :] + lk[..., None, :, :], axis=-1)


def _head_potentials(probes, omega, qh, kh, mask, feature_map):
  """``[P]``: the first variation U(ω) at the probes, for one head (``phase_a_mimicry_potentials``)."""
  qh = jnp.where(mask[..., None], qh, 0.0)
  kh = jnp.where(mask[..., None], kh, 0.0)
  pair = jnp.logical_and(mask[:, :, None], mask[:, None, :])               # [B, L, L]
  log_k = jax.nn.logsumexp(_log_kernel(qh, kh, omega, feature_map), axis=0) - jnp.log(
      omega.shape[0])
  log_row = lambda x: jax.nn.log_softmax(jnp.where(pair, x, -jnp.inf), axis=-1)
  logits = jnp.einsum('bid,bjd->bij', qh, kh) / jnp.sqrt(qh.shape[-1])
  diff = jnp.where(pair, jnp.exp(log_row(logits)) - jnp.exp(log_row(log_k)), 0.0)
  n = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)

  def one(w):
    ratio = jnp.exp(jnp.where(pair, _log_kernel(qh, kh, w[None], feature_map)[0] - log_k, 0.0))
    return -jnp.sum(jnp.where(pair, diff * ratio, 0.0)) / n

  return jax.lax.map(one, probes, batch_size=64)


def phase_a_mimicry_potentials(key: jax.Array, params, inputs, mask, *, feature_map,
                               radius: float, num_probes: int,
                               only: Optional[Sequence[str]] = None
                               ) -> Dict[Tuple[str, ...], Any]:
  r"""``{path: [H, M + num_probes]}``: each head's data potential U at ball probes.

  U(ω) = δCE/δρ(ω), the first variation of the head's CE at its particles Ω
  (ρ = the particles' empirical measure, K̄ = mean_k κ_{ω_k}):

  .. math::
     U(ω) = −\frac{1}{n}\sum_{b,\,i\ real}\sum_{j\ real}
        (A^{soft}_{b,ij} − A^{lin}_{b,ij})\,\frac{κ_ω(q̃_{bi}, k̃_{bj})}{K̄(q̃_{bi}, k̃_{bj})}

  so that ∇U(ω_k) = M·∇_{ω_k} CE, as V_D of ``hamiltonian.particle_potentials`` is
  for the labels (exact for separable maps; for ``softmaxfeat`` κ_ω is the
  one-particle map's kernel, a proxy). Probes: ``langevin_diagnostics.ball_probes``
  with ``fold_in(key, i)``, i the module's place in path order (as
  ``phase_a_potential_range``). U is a mean over the real queries: average batches
  with weights Σ mask, then take ``langevin_diagnostics.potential_range``. Costs
  ``[64, B, L, L]`` memory and (M + num_probes)·B·L² kernel evaluations per head.
  """
  mask = jnp.asarray(mask, bool)
  out = {}
  for i, (path, omega) in enumerate(sorted(particle_leaves(params, only).items())):
    probes = langevin_diagnostics.ball_probes(jax.random.fold_in(key, i), omega, radius,
                                              num_probes)
    q, k = (jnp.asarray(x, jnp.float32) for x in inputs[path])
    out[path] = jax.vmap(lambda p, w, qh, kh: _head_potentials(p, w, qh, kh, mask, feature_map),
                         in_axes=(0, 0, 2, 2))(probes, jnp.asarray(omega, jnp.float32), q, k)
  return out


