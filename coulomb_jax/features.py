r"""Random-feature maps built from particles, and the samplers that draw them.

Every map has the signature ``phi = feature_map(x, omega)`` with

* ``x: [..., d]`` inputs (any number of leading axes),
* ``omega: [N, d]`` particles ω_1..ω_N,
* ``phi: [..., F]`` features, F = N or 2N,

and is scaled by 1/√N so that

.. math:: \langle φ(x), φ(x')\rangle = \frac1N \sum_k ψ(x; ω_k)ᵀ ψ(x'; ω_k)

is a Monte-Carlo estimate of a kernel k(x, x') = E_ω[ψ(x; ω)ᵀψ(x'; ω)].
Inputs of any float dtype are accepted; features are computed and returned in
at least float32 (bf16 inputs give float32 features).

The paper names seven positive maps for attention without giving every formula.
The formulas chosen here are in each docstring; write ``s = x ωᵀ`` (``[..., N]``).

All maps except ``softmaxfeat`` are *separable*: feature k (for ``rff`` and
``hedgehog``, the pair of features k) depends on ω_k only,
so the alignment splits into a sum of one-particle potentials (see
``is_separable``).

For attention the seven positive maps and ``hedgehog`` (``KERNEL_ATTENTION_MAPS``)
are also available in log space:
``log_psi`` / ``attention_log_psi`` give log ψ without underflow (softplus-type
features are ≈ e^z for very negative z, which float32 flushes to 0 below
z ≈ −104, and ``porf_softplus``'s z = s − ‖x‖²/2 is ≈ −800 for inputs of norm 40),
and ``attention_pair`` stabilises queries and keys together in that space
(one shift per key feature over the real keys, one per query row). Every shift
is a common factor of a query's row of φ(q)ᵀφ(k), so linear attention with
these features is the exact ratio of the kernel at any input scale.

Eager calls check that ``x`` and ``omega`` are finite (``_checks.check_finite``);
under ``jit`` nothing is checked.
"""

import collections.abc
import math
from typing import Callable, NamedTuple, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import _checks

FeatureMap = Callable[[jax.Array, jax.Array], jax.Array]


def _projection(x: jax.Array, omega: jax.Array, check_finite: bool = True):
  """Checks shapes (and, eagerly, values) and returns ``(x, s = x ωᵀ: [..., N])``.

  Both in the compute dtype: at least float32 (bf16 and integer inputs are promoted).
  """
  _checks.check_min_rank('x', x, 1)
  _checks.check_particles('omega', omega)
  _checks.check_same_last_dim('x', x, 'omega', omega)
  if check_finite:
    _checks.check_finite('x', x)
    _checks.check_finite('omega', omega)
  dtype = jnp.promote_types(jnp.result_type(x, omega), jnp.float32)
  x, omega = jnp.asarray(x, dtype), jnp.asarray(omega, dtype)
  return x, jnp.einsum('...d,nd->...n', x, omega)


def _half_sq_norm(x: jax.Array) -> jax.Array:
  return 0.5 * jnp.sum(jnp.square(x), axis=-1, keepdims=True)


def _favor_logits(x: jax.Array, omega: jax.Array) -> jax.Array:
  """z = x Ωᵀ − ‖x‖²/2, ``[..., N]``: the FAVOR+ exponent."""
  x, s = _projection(x, omega)
  return s - _half_sq_norm(x)


def _check_stabilize(stabilize) -> None:
  ok = isinstance(stabilize, (bool, int, np.integer)) or (
      isinstance(stabilize, (tuple, list)) and stabilize
      and all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in stabilize))
  if not ok:
    raise ValueError(f'stabilize must be True, False, an axis or a tuple of axes, got '
                     f'{stabilize!r}.')


def _max_shift(z, axis, where=None):
  """stop_gradient(max z) over ``axis`` (kept), over the rows ``where`` allows; 0 if none."""
  m = jnp.max(z, axis=axis, keepdims=True, where=where, initial=-jnp.inf)
  return jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))


def rff(x: jax.Array, omega: jax.Array) -> jax.Array:
  r"""Random Fourier features, ``[..., 2N]``.

  φ(x) = [cos(x Ωᵀ), sin(x Ωᵀ)] / √N.  For ω ~ N(0, I),
  ⟨φ(x), φ(y)⟩ = (1/N) Σ_k cos(ω_kᵀ(x − y)) estimates exp(−‖x − y‖²/2).
  Not positive: a kernel map for the synthetic study, not for attention.
  """
  _, s = _projection(x, omega)
  return jnp.concatenate([jnp.cos(s), jnp.sin(s)], axis=-1) / math.sqrt(omega.shape[0])


def favor(x: jax.Array, omega: jax.Array,
          stabilize: Union[bool, int, Sequence[int]] = False,
          stabilize_mask: Optional[jax.Array] = None) -> jax.Array:
  r"""FAVOR+ positive random features, ``[..., N]``.

  φ(x) = exp(x Ωᵀ − ‖x‖²/2) / √N.  For ω ~ N(0, I), ⟨φ(x), φ(y)⟩ estimates
  exp(xᵀy) (Choromanski et al. 2020).

  Args:
    x: ``[..., d]`` inputs.
    omega: ``[N, d]`` particles.
    stabilize: subtract m = stop_gradient(max z) from the exponent
      z = x Ωᵀ − ‖x‖²/2 before ``exp``, so the largest entry is exp(0) = 1 and
      nothing overflows. ``True`` takes the max over the feature axis only
      (one m per input row: right for queries, whose factor e^{−m} cancels
      between numerator and denominator of linear attention). An int or a
      tuple of axes of the ``[..., N]`` output takes the max over those axes,
      e.g. ``(-3, -1)`` for keys ``[B, L, H, N]``: one m per (batch, head),
      which also cancels in attention (but can underflow the attention
      denominator for large inputs: ``favor_pair`` stabilises queries and keys
      together and cannot). ``False``: the exact formula above.
    stabilize_mask: optional bool array broadcastable to ``x.shape[:-1]``; rows
      where it is False (padded keys) do not enter the max, so padding can
      neither shift the stabiliser nor make real features underflow. If every
      row of a group is masked, that group's shift is 0. Broadcasting aligns
      trailing axes: for keys ``[B, L, H, d]`` and a ``[B, L]`` mask pass
      ``key_mask[..., None]``.
  """
  _check_stabilize(stabilize)
  z = _favor_logits(x, omega)
  if stabilize is not False:
    axes = -1 if stabilize is True else stabilize
    where = None if stabilize_mask is None else jnp.asarray(stabilize_mask)[..., None]
    z = z - _max_shift(z, axes, where)
  return jnp.exp(z) / math.sqrt(omega.shape[0])


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
  entry is ≤ 1/√N (nothing overflows). Unlike one shift per query row and one
  per (batch, head) for the keys (``favor(..., stabilize=...)``), the
  denominator cannot underflow: for the feature f attaining M_i, φ(q_i)_f = 1/√N
  and the key attaining m_f has φ(k_j)_f = 1/√N, so φ(q_i)ᵀΣ_j φ(k_j) ≥ 1/N. (Each
  query's own best feature may otherwise meet only keys many orders of
  magnitude below the keys' overall maximum, and a fixed guard ε on the
  denominator then distorts the output.) Shifts are ``stop_gradient``-ed; the
  ratio does not depend on them, so gradients are exact.

  For causal attention m_f may come from a later key, so the bound holds only
  for the rows after it (see ``attention_pair``; ``attention.fused_causal_linear_attention``
  is exact at any scale).

  Returns:
    ``(q_feat [..., L_q, N], k_feat [..., L_k, N])``, at least float32.
  """
  return attention_pair(q, k, omega, 'favor', key_mask)


_LOG_SOFTPLUS_CUT = -40.0
"""Below it log(softplus(z)) = z + log(1 − e^z/2 + …) is z to float64 precision."""


def _softplus(z):
  """log(1 + eᶻ) from primitives (also inside Pallas kernels)."""
  return jnp.maximum(z, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(z)))


def _log_softplus(z):
  """log(softplus(z)) for every z: z itself below −40, where softplus(z) ≈ eᶻ underflows."""
  safe = jnp.maximum(z, _LOG_SOFTPLUS_CUT)
  return jnp.where(z < _LOG_SOFTPLUS_CUT, z, jnp.log(_softplus(safe)))


def _log_psi_favor(s, half_sq_norm):
  return s - half_sq_norm


def _log_psi_elu(s, half_sq_norm):
  del half_sq_norm
  return jnp.where(s > 0, jnp.log1p(jnp.maximum(s, 0.0)), s)


def _log_psi_softplus(s, half_sq_norm):
  del half_sq_norm
  return _log_softplus(s)


def _log_psi_sigmoid2(s, half_sq_norm):
  del half_sq_norm
  return -2.0 * _softplus(-s)


def _log_psi_cos2(s, half_sq_norm):
  del half_sq_norm
  c = jnp.cos(s)
  return jnp.log(jnp.maximum(c * c, jnp.finfo(s.dtype).tiny))


def _log_psi_porf_softplus(s, half_sq_norm):
  return _log_softplus(s - half_sq_norm)


def _log_psi_softmaxfeat(s, half_sq_norm):
  del half_sq_norm
  both = jnp.concatenate([s, -s], axis=-1)
  return math.log(both.shape[-1]) + jax.nn.log_softmax(both, axis=-1)


def _log_psi_hedgehog(s, half_sq_norm):
  del half_sq_norm
  return jnp.concatenate([s, -s], axis=-1) - 0.5 * math.log(2.0)


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
  the rows after it, and at large input scales (norm ≳ 8) a query whose prefix
  holds only keys far below the later maxima can underflow to the guard: the
  bidirectional paths are exact at any scale, the causal ones on these features only
  where no row underflows (``pallas_attention.pallas_causal_linear_attention``'s running
  maxima per chunk narrow that, but keys later in a query's own chunk still count).
  ``attention.fused_causal_linear_attention`` computes its own shifts per prefix and
  is exact at any scale for every map.

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


def elu(x: jax.Array, omega: jax.Array) -> jax.Array:
  r"""ELU+1 features (Katharopoulos et al. 2020) on projections, ``[..., N]``.

  ψ_k(x) = elu(s_k) + 1 = s_k + 1 if s_k > 0 else exp(s_k); φ = ψ / √N.
  Computed in the second form so that small values keep full precision.
  """
  _, s = _projection(x, omega)
  psi = jnp.where(s > 0, s + 1.0, jnp.exp(jnp.minimum(s, 0.0)))
  return psi / math.sqrt(omega.shape[0])


def softplus(x: jax.Array, omega: jax.Array) -> jax.Array:
  r"""Softplus features, ``[..., N]``: ψ_k(x) = log(1 + exp(s_k)); φ = ψ / √N."""
  _, s = _projection(x, omega)
  return jax.nn.softplus(s) / math.sqrt(omega.shape[0])


def sigmoid2(x: jax.Array, omega: jax.Array) -> jax.Array:
  r"""Squared-sigmoid features, ``[..., N]``: ψ_k(x) = σ(s_k)²; φ = ψ / √N."""
  _, s = _projection(x, omega)
  return jnp.square(jax.nn.sigmoid(s)) / math.sqrt(omega.shape[0])


def cos2(x: jax.Array, omega: jax.Array) -> jax.Array:
  r"""Squared-cosine features, ``[..., N]``: ψ_k(x) = cos²(s_k); φ = ψ / √N.

  Non-negative rather than strictly positive (zero where s_k = π/2 + jπ); the
  attention denominator is guarded for that case.
  """
  _, s = _projection(x, omega)
  return jnp.square(jnp.cos(s)) / math.sqrt(omega.shape[0])


def softmaxfeat(x: jax.Array, omega: jax.Array) -> jax.Array:
  r"""Hedgehog-style softmax features (Zhang et al. 2024), ``[..., 2N]``.

  φ(x) = 2√N · softmax([s, −s]) over the 2N entries, i.e. ψ = 2N · softmax has
  mean one over its entries and φ = ψ / √N as for the other maps. The softmax
  normaliser couples the particles: this map is *not* separable.
  """
  _, s = _projection(x, omega)
  n = omega.shape[0]
  return 2.0 * math.sqrt(n) * jax.nn.softmax(jnp.concatenate([s, -s], axis=-1), axis=-1)


def hedgehog(x: jax.Array, omega: jax.Array) -> jax.Array:
  r"""Hedgehog's exponential features (Zhang et al. 2024), ``[..., 2N]``.

  φ(x) = [exp(s), exp(−s)] / √(2N), s = x Ωᵀ: N rows give 2N features (at F
  features use N = F/2), and ⟨φ(x), φ(y)⟩ = (1/N) Σ_k cosh(ω_kᵀ(x + y)). Feature
  pair k depends on ω_k only (separable). This direct form overflows for
  |s| ≳ 88 in float32; attention uses its log-space form (``attention_log_psi``,
  ``attention_pair``), exact at any scale. In Hedgehog the rows W are trained by
  gradient descent on an attention loss (``mimicry.train_hedgehog``); here they are
  particles like any other map's. ``mimicry.hedgehog`` is the same map with an
  optional per-row shift.
  """
  _, s = _projection(x, omega)
  return jnp.exp(jnp.concatenate([s, -s], axis=-1)) / math.sqrt(2 * omega.shape[0])


def porf_softplus(x: jax.Array, omega: jax.Array) -> jax.Array:
  r"""Positive (orthogonal) random features with softplus, ``[..., N]``.

  ψ_k(x) = softplus(s_k − ‖x‖²/2); φ = ψ / √N: the FAVOR+ exponent passed
  through softplus instead of exp. It behaves like FAVOR+ where the exponent is
  very negative (softplus(z) ≈ eᶻ) and grows only linearly where it is large,
  so it cannot overflow; where the exponent is very negative its features
  underflow as FAVOR+'s do, so attention uses its log-space form
  (``attention_log_psi``, ``attention_pair``) with the same shifts as favor, and
  this direct form is for moderate inputs. "Orthogonal" refers to the draw: initialise its
  particles with ``sample_orthogonal``.
  """
  x, s = _projection(x, omega)
  return jax.nn.softplus(s - _half_sq_norm(x)) / math.sqrt(omega.shape[0])


def taylor(x: jax.Array, omega: jax.Array) -> jax.Array:
  r"""Based's second-order Taylor features (Arora et al. 2024), ``[..., 1 + N + N²]``.

  With s = x Ωᵀ ``[..., N]`` (Ω: N projection rows, N = Based's feature dimension d'),
  φ(x) = [1, s / N^{1/4}, vec(s sᵀ) / (√2·√N)], so

  .. math:: ⟨φ(x), φ(y)⟩ = 1 + u + u²/2,\quad u = s(x)ᵀs(y)/√N,

  the second-order expansion of exp(u), which is ≥ 1/2 for every u: a positive kernel
  from signed features (the attention denominator never vanishes). Not separable in the
  particles (s sᵀ couples them), not positive entrywise, so it has no log-space form:
  attention takes its features as they are (``models.KernelAttention`` stores them; at
  moderate inputs, as in Based, nothing under- or overflows). Unlike the other maps φ is
  not scaled by 1/√N: the kernel is the Taylor polynomial itself.
  """
  _, s = _projection(x, omega)
  n = omega.shape[0]
  second = (s[..., :, None] * s[..., None, :]).reshape(s.shape[:-1] + (n * n,))
  return jnp.concatenate([jnp.ones(s.shape[:-1] + (1,), s.dtype), s / n ** 0.25,
                          second / (math.sqrt(2.0) * math.sqrt(n))], axis=-1)


# ----------------------------------------------------------------------------- registry

class MapSpec(NamedTuple):
  """A registered feature map (``register``; read with ``get``).

  Attributes:
    name: its name, the ``feature_map=`` string everywhere in the library.
    phi: ``phi(x [..., d], omega [N, d]) -> [..., F]``, the map itself (scaled 1/√N).
    log_psi: ``log_psi(s = x Ωᵀ [..., N], ‖x‖²/2 [..., 1]) -> [..., F]`` for a positive
      map (φ = exp(log ψ)/√N: the attention paths stabilise in this space); None for a
      signed map.
    per_particle: F / N (1 or 2), when ``num_features`` is not given.
    separable: whether feature k (or pair k) depends on ω_k only.
    attention: whether linear attention takes it: every positive map; a signed map whose
      kernel is positive (``taylor``) as stored features.
    num_features: ``N -> F``.
  """
  name: str
  phi: FeatureMap
  log_psi: Optional[Callable[[jax.Array, jax.Array], jax.Array]]
  per_particle: int
  separable: bool
  attention: bool
  num_features: Callable[[int], int]


_REGISTRY = {}
_BUILTIN = frozenset()      # the library's own maps, set once they are registered below


def register(name: str, *, log_psi: Optional[Callable] = None, phi: Optional[FeatureMap] = None,
             per_particle: int = 1, separable: bool = True, attention: Optional[bool] = None,
             num_features: Optional[Callable[[int], int]] = None,
             replace: bool = False) -> MapSpec:
  r"""Adds a feature map under ``name``; every ``feature_map=`` of the library then takes it.

  A positive map is given by its log ψ: ``log_psi(s, half_sq_norm)`` with s = x Ωᵀ
  ``[..., N]`` and ‖x‖²/2 ``[..., 1]`` → ``[..., per_particle·N]``; then φ = exp(log ψ)/√N
  (``phi``, if also given, is the direct form used outside attention, e.g. by the label
  Hamiltonian), and the attention paths stabilise it in log space, exact at any input
  scale. A signed map is given by ``phi(x, omega)`` alone (``rff``); ``attention=True``
  lets linear attention take it as stored features when its kernel is positive
  (``taylor``). The Pallas kernels compute the maps they were written for
  (``pallas_attention.PALLAS_FEATURE_MAPS``); for any other, ``implementation='auto'``
  takes the XLA path and ``'pallas'`` refuses in one line.

  Example (the same log ψ as ``elu`` under a new name)::

    features.register('my_elu', log_psi=features.get('elu').log_psi)
    models.KernelAttention(num_heads=2, feature_map='my_elu')

  Args:
    name: a new name (``replace=True`` to redefine one of yours; the library's own maps
      cannot be redefined).
    log_psi, phi: as above; at least one.
    per_particle: F / N of ``log_psi`` or ``phi``.
    separable: feature k (or pair k) depends on ω_k only (the data term splits per
      particle: ``parallel``, ``langevin`` use it).
    attention: None: True for a positive map, False for a signed one.
    num_features: ``N -> F`` when F is not ``per_particle·N``.
  """
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f'name must be an identifier string, got {name!r}.')
  if name in _BUILTIN:
    raise ValueError(f'name: {name!r} is one of the library\'s maps {tuple(sorted(_BUILTIN))}, '
                     'which the Pallas kernels and the committed results compute; register '
                     'another name.')
  if name in _REGISTRY and not replace:
    raise ValueError(f'name: {name!r} is registered already; pass replace=True to redefine '
                     'it.')
  if log_psi is None and phi is None:
    raise ValueError(f'register({name!r}): give log_psi (a positive map) or phi (a signed '
                     'map), got neither.')
  for arg, fn in (('log_psi', log_psi), ('phi', phi), ('num_features', num_features)):
    if fn is not None and not callable(fn):
      raise ValueError(f'{arg} must be a function, got {type(fn).__name__}.')
  _checks.check_int('per_particle', per_particle, 1)
  if attention is None:
    attention = log_psi is not None
  if phi is None:
    phi = _phi_from_log_psi(log_psi)
  count = num_features or (lambda n, k=per_particle: k * n)
  spec = MapSpec(name, phi, log_psi, per_particle, bool(separable), bool(attention), count)
  if name in _REGISTRY:
    # Jitted functions take the name as a static argument: their compiled programs hold
    # the old map. Drop them so the next call traces the new one.
    jax.clear_caches()
  _REGISTRY[name] = spec
  return spec


def _phi_from_log_psi(log_psi):
  def phi(x: jax.Array, omega: jax.Array) -> jax.Array:
    x, s = _projection(x, omega)
    return jnp.exp(log_psi(s, _half_sq_norm(x))) / math.sqrt(omega.shape[0])
  return phi


def get(name, *, positive: Optional[bool] = None, attention: Optional[bool] = None) -> MapSpec:
  """The ``MapSpec`` registered as ``name``; one ValueError naming it and the names that fit.

  ``positive=True`` (a log ψ) / ``attention=True`` (linear attention takes it): refuse a
  map without that property, naming the maps that have it.
  """
  spec = _REGISTRY.get(name) if isinstance(name, str) else None
  if spec is None and positive is None and attention is None:
    raise ValueError(f'feature_map: unknown name {name!r}; known names: {sorted(_REGISTRY)}.')
  fits = names(positive=positive, attention=attention)
  if spec is None:
    raise ValueError(f'feature_map must be one of {fits}, got {name!r}.')
  if positive is not None and (spec.log_psi is not None) != positive:
    what = 'attention maps' if positive else 'signed maps'
    why = 'a signed map: no log ψ' if positive else 'a positive map'
    raise ValueError(f'feature_map must be one of the {what} {fits}, got {name!r} ({why}).')
  if attention and not spec.attention:
    raise ValueError(f'feature_map: {name!r} is not non-negative and its kernel is not '
                     f'positive; use an attention map {fits}.')
  if attention is False and spec.attention:
    raise ValueError(f'feature_map must be one of {fits}, got {name!r}.')
  return spec


def names(*, positive: Optional[bool] = None, attention: Optional[bool] = None) -> tuple:
  """The registered names, in registration order; ``positive``: only the maps with (True)
  or without (False) a log ψ; ``attention``: only those linear attention takes (or not)."""
  return tuple(n for n, m in _REGISTRY.items()
               if (positive is None or (m.log_psi is not None) == positive)
               and (attention is None or m.attention == attention))


register('rff', phi=rff, per_particle=2)
register('favor', log_psi=_log_psi_favor, phi=favor)
register('elu', log_psi=_log_psi_elu, phi=elu)
register('softplus', log_psi=_log_psi_softplus, phi=softplus)
register('sigmoid2', log_psi=_log_psi_sigmoid2, phi=sigmoid2)
register('cos2', log_psi=_log_psi_cos2, phi=cos2)
register('softmaxfeat', log_psi=_log_psi_softmaxfeat, phi=softmaxfeat, per_particle=2,
         separable=False)
register('porf_softplus', log_psi=_log_psi_porf_softplus, phi=porf_softplus)
register('hedgehog', log_psi=_log_psi_hedgehog, phi=hedgehog, per_particle=2)
register('taylor', phi=taylor, separable=False, attention=True,
         num_features=lambda n: 1 + n + n * n)
_BUILTIN = frozenset(_REGISTRY)


class _Maps(collections.abc.Mapping):
  """``FEATURE_MAPS``: name → φ of every registered map (a live view of the registry)."""

  def __getitem__(self, name):
    if name not in _REGISTRY:
      raise KeyError(name)
    return _REGISTRY[name].phi

  def __iter__(self):
    return iter(_REGISTRY)

  def __len__(self):
    return len(_REGISTRY)

  def __repr__(self):
    return f'FEATURE_MAPS({list(_REGISTRY)})'


FEATURE_MAPS = _Maps()
"""Name → φ of every registered map (``register``): ``rff`` (the synthetic study's),
the paper's seven attention maps, ``hedgehog`` and ``taylor``, and any added at run time."""


def __getattr__(attr):
  """Names that follow the registry (module attributes computed when read, PEP 562)."""
  if attr == 'KERNEL_ATTENTION_MAPS':      # every attention map with a log ψ: the log-space paths
    return names(positive=True, attention=True)
  if attr == 'SIGNED_ATTENTION_MAPS':      # signed maps attention takes as stored features
    return names(positive=False, attention=True)
  raise AttributeError(f'module {__name__!r} has no attribute {attr!r}')


ATTENTION_FEATURE_MAPS = ('favor', 'elu', 'softplus', 'sigmoid2', 'cos2',
                          'softmaxfeat', 'porf_softplus')
"""The paper's seven attention maps, in its order (kept for one release; the text study's own
list is ``configs/text.py`` ``MAPS``; new code should use ``names``)."""


def num_features(name: str, num_particles: int) -> int:
  """F, the length of φ(x), for ``num_particles`` particles of the map ``name``: 2N for
  ``rff``, ``softmaxfeat`` and ``hedgehog`` ([·(s), ·(−s)] or [cos s, sin s]), 1 + N + N²
  for ``taylor``, N otherwise (a registered map: its ``num_features``)."""
  return get(name).num_features(num_particles)


def get_feature_map(name: Union[str, FeatureMap]) -> FeatureMap:
  """The feature map called ``name`` (its φ); a callable is returned unchanged."""
  if callable(name):
    return name
  if not isinstance(name, str) or name not in _REGISTRY:
    raise ValueError(
        f'feature_map: unknown name {name!r}; known names: {sorted(_REGISTRY)}.')
  return _REGISTRY[name].phi


def is_separable(feature_map: Union[str, FeatureMap]) -> bool:
  """Whether feature k depends on ω_k only (so the data term splits per particle).

  A registered map: its ``separable`` (False for ``softmaxfeat`` and ``taylor``); a user
  callable counts as separable only if it carries the attribute ``separable = True``.
  """
  if isinstance(feature_map, str):
    get_feature_map(feature_map)
    return _REGISTRY[feature_map].separable
  for spec in _REGISTRY.values():
    if feature_map is spec.phi:
      return spec.separable
  return bool(getattr(feature_map, 'separable', False))


def _check_sizes(num_particles: int, dim: int, key) -> None:
  _checks.check_key('key', key)
  _checks.check_int('num_particles', num_particles, 1)
  _checks.check_int('dim', dim, 1)


def sample_gaussian(key: jax.Array, num_particles: int, dim: int,
                    dtype=jnp.float32) -> jax.Array:
  """I.i.d. particles ω_k ~ N(0, I_d): ``[num_particles, dim]``."""
  _check_sizes(num_particles, dim, key)
  return jax.random.normal(key, (num_particles, dim), dtype)


def sample_orthogonal(key: jax.Array, num_particles: int, dim: int,
                      dtype=jnp.float32) -> jax.Array:
  r"""Block-orthogonal particles with Gaussian row norms, ``[num_particles, dim]``.

  As in FAVOR+: ⌈N/d⌉ independent Haar-random orthogonal d×d blocks (QR of a
  Gaussian matrix, signs fixed by diag(R)) are stacked and cut to N rows; row k
  is then rescaled to norm ‖g_k‖ with g_k ~ N(0, I_d) (chi-distributed with d
  degrees of freedom), so each row is marginally N(0, I_d) while rows within a
  block are exactly orthogonal.
  """
  _check_sizes(num_particles, dim, key)
  num_blocks = -(-num_particles // dim)
  block_key, norm_key = jax.random.split(key)

  def block(k):
    q, r = jnp.linalg.qr(jax.random.normal(k, (dim, dim), jnp.float32))
    return (q * jnp.sign(jnp.diag(r))[None, :]).T  # rows orthonormal

  rows = jax.vmap(block)(jax.random.split(block_key, num_blocks))
  rows = rows.reshape(num_blocks * dim, dim)[:num_particles]
  norms = jnp.linalg.norm(
      jax.random.normal(norm_key, (num_particles, dim), jnp.float32), axis=-1)
  return (rows * norms[:, None]).astype(dtype)
