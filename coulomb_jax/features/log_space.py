r"""Log-space features of the positive maps: log ψ without underflow, and queries and keys
stabilised together for linear attention (exact at any input scale)."""

import math
from typing import Optional

import jax
import jax.numpy as jnp

from coulomb_jax import _checks
from coulomb_jax.features.maps import _half_sq_norm, _max_shift, _projection
from coulomb_jax.features.registry import _REGISTRY, get


def log_psi(name: str, s: jax.Array, half_sq_norm: jax.Array) -> jax.Array:
  r"""log ψ_k(x) of a separable positive map, elementwise, without underflow.

  ``s = x Ωᵀ: [..., N]``, ``half_sq_norm = ‖x‖²/2: [..., 1]``; ``name`` a registered
  separable map with a log ψ of one feature per particle (the library's six below;
  ``softmaxfeat`` and ``hedgehog``: ``attention_log_psi``):

  * favor: s − ‖x‖²/2;
  * elu: log1p(s) for s > 0, else s (ψ = eˢ there);
  * softplus: log softplus(s) (= s below −40, where softplus(s) ≈ eˢ);
  * sigmoid2: 2·log σ(s) = −2·softplus(−s);
  * cos2: log cos²(s), floored at the dtype's smallest normal number (cos² has
    zeros; the floor keeps the logarithm and its gradient finite and changes
    nothing a float can resolve);
  * porf_softplus: log softplus(s − ‖x‖²/2).

  Primitives only (``where``, ``maximum``, ``exp``, ``log``, ``log1p``, ``cos``), so
  the Pallas kernels call it too.
  """
  spec = _REGISTRY.get(name) if isinstance(name, str) else None
  if spec is None or spec.log_psi is None or spec.per_particle != 1 or not spec.separable:
    elementwise = tuple(n for n, m in _REGISTRY.items()
                        if m.log_psi is not None and m.per_particle == 1 and m.separable)
    raise ValueError(f'feature_map: no elementwise log ψ for {name!r}; the separable '
                     f'positive maps of one feature per particle are {elementwise}.')
  return spec.log_psi(s, half_sq_norm)


def attention_log_psi(name: str, s: jax.Array, half_sq_norm: jax.Array) -> jax.Array:
  r"""log ψ(x) ``[..., F]`` of any positive map (``names(positive=True)``), from s and ‖x‖²/2.

  The registered log ψ (``register``): ``log_psi`` for the six elementwise maps; for
  ``softmaxfeat`` (F = 2N) log ψ = log 2N + log_softmax([s, −s]); for ``hedgehog``
  (F = 2N) log ψ = [s, −s] − ½·log 2. So φ(x) = exp(log ψ) / √N exactly (where it does
  not under- or overflow).
  """
  return get(name, positive=True).log_psi(s, half_sq_norm)   # (attention or not: math)


def log_features(x: jax.Array, omega: jax.Array, feature_map: str) -> jax.Array:
  r"""log φ(x) ``[..., F]`` of an attention map: log ψ − ½·log N, never −inf by underflow.

  ``exp(log_features(x, omega, name))`` equals ``get_feature_map(name)(x, omega)``
  wherever that does not underflow; for inputs of norm 40 it stays exact where the
  features themselves are 0 in float32 (and in float64).
  """
  _check_attention_map(feature_map)
  x, s = _projection(x, omega)
  return (attention_log_psi(feature_map, s, _half_sq_norm(x))
          - 0.5 * math.log(omega.shape[0]))


def _check_attention_map(name) -> None:
  get(name, positive=True, attention=True)


def attention_pair(q: jax.Array, k: jax.Array, omega: jax.Array, feature_map: str = 'favor',
                   key_mask: Optional[jax.Array] = None):
  r"""Features of queries and keys for linear attention, stabilised together in log space.

  For any map of ``KERNEL_ATTENTION_MAPS``, with ℓ(x) = log ψ(x) ``[..., F]``
  (``attention_log_psi``), ``q: [..., L_q, d]``, ``k: [..., L_k, d]`` (the same
  leading axes) and ``key_mask: [..., L_k]`` (True for real keys):

  * keys: φ(k_j)_f = e^{ℓ(k_j)_f − m_f} / √N, m_f = max over real keys of ℓ(k_j)_f;
  * queries: φ(q_i)_f = e^{ℓ(q_i)_f + m_f − M_i} / √N, M_i = max_f (ℓ(q_i)_f + m_f).

  So φ(q_i)ᵀφ(k_j) = e^{−M_i}·ψ(q_i)ᵀψ(k_j)/N: one factor per query row, which
  cancels between the numerator and the denominator of linear attention; the
  ratio is the kernel's exact one however far the features under- or overflow
  without the shifts. Every entry is ≤ 1/√N and the denominator
  φ(q_i)ᵀΣ_j φ(k_j) ≥ 1/N (the feature attaining M_i meets the key attaining its
  m_f with both factors 1), so a guard ε ≪ 1/N on it never acts. Padded keys
  enter no shift and get φ = 0. Shifts are ``stop_gradient``-ed (the ratio does
  not depend on them): gradients are exact. ``favor`` gives ``favor_pair``.

  Causal attention: m_f may come from a later key, so the bound holds only for
  the rows after it, and at large input scales a query whose prefix holds only keys far
  below the later maxima can underflow to the guard. Which causal paths are exact:
  docs/performance.md#featureslog_spaceattention_pair.

  Returns:
    ``(q_feat [..., L_q, F], k_feat [..., L_k, F])``, at least float32.
  """
  _check_attention_map(feature_map)
  _checks.check_min_rank('q', q, 2)
  _checks.check_min_rank('k', k, 2)
  if q.shape[:-2] != k.shape[:-2]:
    raise ValueError(f'q and k must have the same leading axes [..., L, d], got {q.shape} '
                     f'and {k.shape}.')
  if key_mask is not None and jnp.shape(key_mask) != k.shape[:-1]:
    raise ValueError(f'key_mask must have shape {k.shape[:-1]} (k without its last axis), '
                     f'got {jnp.shape(key_mask)}.')
  # Values are not checked: padded keys may hold anything (they enter no shift).
  q, sq = _projection(q, omega, check_finite=False)
  k, sk = _projection(k, omega, check_finite=False)
  lq = attention_log_psi(feature_map, sq, _half_sq_norm(q))       # [..., L_q, F]
  lk = attention_log_psi(feature_map, sk, _half_sq_norm(k))       # [..., L_k, F]
  where = None if key_mask is None else jnp.asarray(key_mask)[..., None]
  m = _max_shift(lk, -2, where)                                   # [..., 1, F]
  lq = lq + m
  lq = lq - _max_shift(lq, -1)
  lk = lk - m
  if where is not None:                   # padded keys: φ = 0, whatever their logits
    lk = jnp.where(where, lk, -jnp.inf)
  scale = math.sqrt(omega.shape[0])
  return jnp.exp(lq) / scale, jnp.exp(lk) / scale


def favor_pair(q: jax.Array, k: jax.Array, omega: jax.Array,
               key_mask: Optional[jax.Array] = None):
  r"""FAVOR+ features of queries and keys for attention, stabilised together.

  ``attention_pair(q, k, omega, 'favor', key_mask)``. With
  z(x)_f = ω_fᵀx − ‖x‖²/2, ``q: [..., L_q, d]``, ``k: [..., L_k, d]`` (the same
  leading axes) and ``key_mask: [..., L_k]``:

  * keys: φ(k_j)_f = e^{z(k_j)_f − m_f} / √N, with m_f = max over real keys of
    z(k_j)_f, one shift per feature (and leading index);
  * queries: φ(q_i)_f = e^{z(q_i)_f + m_f − M_i} / √N, with
    M_i = max_f (z(q_i)_f + m_f), one shift per query row.

  Then φ(q_i)ᵀφ(k_j) = e^{−M_i}·⟨favor(q_i), favor(k_j)⟩: the factor is the same
  for every key of a query, so it cancels in the attention ratio, and every
  entry is ≤ 1/√N (nothing overflows). The denominator cannot underflow: for the
  feature f attaining M_i, φ(q_i)_f = 1/√N and the key attaining m_f has
  φ(k_j)_f = 1/√N, so φ(q_i)ᵀΣ_j φ(k_j) ≥ 1/N (against ``favor(..., stabilize=...)``:
  docs/math.md#featureslog_spacefavor_pair). Shifts are ``stop_gradient``-ed; the
  ratio does not depend on them, so gradients are exact.

  For causal attention m_f may come from a later key, so the bound holds only
  for the rows after it (see ``attention_pair``).

  Returns:
    ``(q_feat [..., L_q, N], k_feat [..., L_k, N])``, at least float32.
  """
  return attention_pair(q, k, omega, 'favor', key_mask)
