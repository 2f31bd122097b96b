r"""Kernel-target alignment.

``target_alignment`` is the objective of the particle model: the paper's
uncentered, unnormalised U-statistic of the feature kernel against the labels.
``centered_alignment`` is the normalised, centered alignment of two kernel
matrices (Cortes, Mohri & Rostamizadeh 2012), for diagnostics.
"""

import jax
import jax.numpy as jnp

from coulomb_jax import _checks


def target_alignment(phi: jax.Array, y: jax.Array) -> jax.Array:
  r"""U-statistic alignment of the feature kernel with the labels (scalar).

  .. math::
     A = \frac{1}{n(n-1)} \sum_{i \ne j} y_i y_j ⟨φ(x_i), φ(x_j)⟩
       = \frac{‖Φᵀy‖² − \sum_i y_i² ‖φ(x_i)‖²}{n(n-1)}

  computed in the second form: O(n·F) time and memory, the n×n kernel matrix is
  never built. Sums run in float32 (or wider) whatever the input dtype.

  Args:
    phi: ``[n, F]`` features of n ≥ 2 samples.
    y: ``[n]`` labels: ±1 for two classes (other two-valued labellings such as {0, 1}
      are refused, not mapped), or real-valued targets; finite.
  """
  _checks.check_rank('phi', phi, 2)
  _checks.check_labels('phi', phi, 'y', y)
  n = phi.shape[0]
  if n < 2:
    raise ValueError(f'phi must hold at least 2 samples, got shape {phi.shape}.')
  dtype = jnp.promote_types(jnp.result_type(phi, y), jnp.float32)
  phi, y = jnp.asarray(phi, dtype), jnp.asarray(y, dtype)
  phi_y = y @ phi                                     # [F]
  diag = jnp.sum(jnp.square(y) * jnp.sum(jnp.square(phi), axis=-1))
  return (jnp.sum(jnp.square(phi_y)) - diag) / (n * (n - 1))


def _center(k: jax.Array) -> jax.Array:
  """H K H with H = I − 11ᵀ/n, without forming H."""
  return (k - jnp.mean(k, axis=0, keepdims=True) - jnp.mean(k, axis=1, keepdims=True)
          + jnp.mean(k))


def centered_alignment(k1: jax.Array, k2: jax.Array) -> jax.Array:
  r"""Centered kernel alignment ρ(K1, K2) ∈ [−1, 1] (scalar).

  .. math:: ρ = \frac{⟨K1_c, K2_c⟩_F}{‖K1_c‖_F ‖K2_c‖_F},\quad K_c = HKH,\;
            H = I − \tfrac1n 11ᵀ

  Returns 0 when either centered matrix is zero (a constant kernel carries no
  alignment).

  Args:
    k1: ``[n, n]`` kernel matrix.
    k2: ``[n, n]`` kernel matrix, e.g. ``y yᵀ`` for target alignment.
  """
  _checks.check_rank('k1', k1, 2)
  _checks.check_rank('k2', k2, 2)
  if k1.shape[0] != k1.shape[1] or k1.shape != k2.shape:
    raise ValueError(
        f'k1 and k2 must be square and of the same shape, got {k1.shape} and '
        f'{k2.shape}.')
  dtype = jnp.promote_types(jnp.result_type(k1, k2), jnp.float32)
  # Each centered kernel divided by its largest |entry| (ρ does not depend on the
  # scales), so that the sums of squares stay in range for kernels of any scale.
  unit = lambda c: c / jax.lax.stop_gradient(jnp.where(jnp.max(jnp.abs(c)) > 0,
                                                       jnp.max(jnp.abs(c)), 1.0))
  c1, c2 = (unit(_center(jnp.asarray(k, dtype))) for k in (k1, k2))
  num = jnp.sum(c1 * c2)
  den = jnp.sqrt(jnp.sum(jnp.square(c1)) * jnp.sum(jnp.square(c2)))
  safe = den > 0
  # Clipped: rounding can put |ρ| a few ulps above 1 for proportional kernels.
  return jnp.clip(jnp.where(safe, num / jnp.where(safe, den, 1.0), 0.0), -1.0, 1.0)
