r"""The library's feature maps φ(x; Ω) and their log ψ (registered in ``registry``): ``rff``,
the paper's seven positive attention maps, ``hedgehog`` and ``taylor``. The conventions
every map follows (shapes, the 1/√N scaling, separability, log space, what eager calls
check) are in the package docstring (``coulomb_jax/features/__init__.py``); each map's
formula is in its own docstring."""

import math
from typing import Callable, Optional, Sequence, Union

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
