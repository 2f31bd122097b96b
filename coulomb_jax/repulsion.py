r"""Riesz (Coulomb) repulsion between particles.

.. math::
   W_s(Ω) = \frac{1}{N^2} \sum_{k \ne l} g_s(ω_k − ω_l),\qquad
   g_s(r) = (‖r‖² + ε²)^{−s/2}\ (s > 0),\qquad g_0(r) = −\tfrac12 \log(‖r‖² + ε²).

``s = "coulomb"`` means the Newtonian exponent s = d − 2 of ℝ^d (the log kernel
when d = 2). The softening ε keeps g_s and its gradient finite for coincident
particles.

Numerics. The power is evaluated in log space, g_s = exp(−(s/2)·log(‖r‖² + ε²)), so
g_s ≤ ε^{−s}: with the default ε = 0.5 the energy and its gradient are finite in float32
for every s ≤ 100, coincident particles included. With ``softening = 0`` two coincident
particles give an infinite energy (the self pair is always excluded safely). Far pairs at
large s underflow to 0. Squared distances use the Gram form ‖a‖² + ‖b‖² − 2aᵀb (O(N²)
memory instead of O(N²·d)), clamped at 0. Why these are safe: docs/math.md#repulsion-module.
"""

from typing import Optional, Union

import jax
import jax.numpy as jnp

from coulomb_jax import _checks

DEFAULT_SOFTENING = 0.5
"""Default ε: finite energies and gradients for all s ∈ [0, 100] in float32."""

Exponent = Union[float, str, jax.Array]


def resolve_exponent(s: Exponent, dim: int) -> Union[float, jax.Array]:
  """The Riesz exponent: ``"coulomb"`` → d − 2; a number is checked (s ≥ 0)."""
  if isinstance(s, str):
    if s != 'coulomb':
      raise ValueError(f"s must be a float >= 0 or 'coulomb', got {s!r}.")
    if dim < 2:
      raise ValueError(f"s='coulomb' needs particle dimension d >= 2 (s = d - 2), got d={dim}.")
    return float(dim - 2)
  _checks.check_nonnegative('s', s)
  return s


def riesz_kernel(sq_dist: jax.Array, s: Union[float, jax.Array],
                 softening: float = DEFAULT_SOFTENING) -> jax.Array:
  """g_s as a function of the squared distance ‖r‖² (elementwise)."""
  log_r2 = jnp.log(sq_dist + jnp.square(softening))
  return jnp.where(s == 0, -0.5 * log_r2, jnp.exp(-0.5 * s * log_r2))


def riesz_potential(points: jax.Array, omega: jax.Array, s: Exponent,
                    softening: float = DEFAULT_SOFTENING,
                    self_index_offset: Optional[Union[int, jax.Array]] = None) -> jax.Array:
  r"""Mean-field repulsive potential of the particles at each point, ``[M]``.

  .. math:: u(p_m) = \frac1N \sum_{l} g_s(p_m − ω_l)

  with the self pair left out when ``points`` are particles themselves: if
  ``self_index_offset = o``, point m is particle o + m and the term l = o + m is
  skipped. ``riesz_energy(Ω) = mean(riesz_potential(Ω, Ω, self_index_offset=0))``.
  The offset may be traced (e.g. ``axis_index · M`` for a device's shard).

  Args:
    points: ``[M, d]`` query points.
    omega: ``[N, d]`` particles.
    s: Riesz exponent ≥ 0, or ``"coulomb"`` (s = d − 2).
    softening: ε ≥ 0.
    self_index_offset: see above; ``None`` keeps all pairs.
  """
  _checks.check_particles('points', points)
  _checks.check_particles('omega', omega)
  _checks.check_same_last_dim('points', points, 'omega', omega)
  _checks.check_nonnegative('softening', softening)
  s = resolve_exponent(s, omega.shape[-1])
  dtype = jnp.promote_types(jnp.result_type(points, omega), jnp.float32)
  points, omega = jnp.asarray(points, dtype), jnp.asarray(omega, dtype)
  sq = (jnp.sum(jnp.square(points), -1)[:, None] + jnp.sum(jnp.square(omega), -1)[None, :]
        - 2.0 * points @ omega.T)
  sq = jnp.maximum(sq, 0.0)                                        # [M, N]
  if self_index_offset is None:
    return jnp.mean(riesz_kernel(sq, s, softening), axis=-1)
  rows = jnp.arange(points.shape[0])[:, None] + self_index_offset
  is_self = rows == jnp.arange(omega.shape[0])[None, :]
  # Safe mask: the self term is replaced before the kernel, so that neither the
  # value nor the gradient sees log(ε²) with ε = 0.
  g = riesz_kernel(jnp.where(is_self, 1.0, sq), s, softening)
  return jnp.sum(jnp.where(is_self, 0.0, g), axis=-1) / omega.shape[0]


def riesz_energy(omega: jax.Array, s: Exponent,
                 softening: float = DEFAULT_SOFTENING) -> jax.Array:
  r"""Riesz energy W_s(Ω) = 1/N² Σ_{k≠l} g_s(ω_k − ω_l) (scalar).

  Args:
    omega: ``[N, d]`` particles.
    s: exponent ≥ 0 (0: log kernel), or ``"coulomb"`` for s = d − 2.
    softening: ε ≥ 0 (default 0.5, see the module docstring).
  """
  _checks.check_particles('omega', omega)
  return jnp.mean(riesz_potential(omega, omega, s, softening, self_index_offset=0))
