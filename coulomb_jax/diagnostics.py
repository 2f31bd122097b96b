r"""Diagnostics of a particle run: free energy, cloud distances, kernel spread.

The Langevin dynamics is a Wasserstein gradient flow of the free energy
(McKean–Vlasov limit N → ∞)

.. math:: F_β(ρ) = E(ρ) + β^{-1}\,\mathrm{Ent}(ρ),\qquad
          \mathrm{Ent}(ρ) = \int ρ \log ρ = −h(ρ),

with h the differential entropy. ``knn_entropy`` estimates h from the particle
cloud (Kozachenko–Leonenko), ``free_energy`` combines it with the energy,
``sliced_wasserstein`` measures how far two clouds (e.g. runs with N and 2N
particles) are apart, and ``kernel_spread`` measures how much the learned
kernel matrix changes from seed to seed (it should shrink as N or β grows).
``particle_diversity`` (``top_direction_share``, ``effective_rank``,
``min_pairwise_distance``) says whether a cloud stays spread or collapses onto a few
directions, per particle set ``[..., N, d]`` (e.g. one per attention head).

All functions return float32 (or wider) scalars and are jit-able; the integer
arguments (``k``, ``num_projections``) are static.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import _checks


def _compute_dtype(*xs):
  return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


def _kth_neighbour_sq_dist(points: jax.Array, k: int) -> jax.Array:
  """``[N]`` squared distance from each point to its k-th nearest *other* point.

  Distances are taken from coordinate differences (not the Gram form, whose
  cancellation error would bias log ε for close pairs), in row blocks so that
  memory is O(block·N·d) rather than O(N²·d).
  """
  num = points.shape[0]

  def row(args):
    p, i = args
    sq = jnp.sum(jnp.square(points - p), axis=-1)                 # [N]
    sq = jnp.where(jnp.arange(num) == i, jnp.inf, sq)             # drop the point itself
    return -jax.lax.top_k(-sq, k)[0][k - 1]

  return jax.lax.map(row, (points, jnp.arange(num)), batch_size=min(num, 128))


def knn_entropy(points: jax.Array, k: int = 1) -> jax.Array:
  r"""Kozachenko–Leonenko estimate of the differential entropy h (nats, scalar).

  .. math:: \hat h = ψ(N) − ψ(k) + \log V_d + \frac dN \sum_i \log ε_i,\qquad
            V_d = \frac{π^{d/2}}{Γ(d/2 + 1)},

  ε_i the distance from point i to its k-th nearest other point, ψ the
  digamma function. Consistent for N → ∞; its bias at finite N grows with d
  (a bounded support adds a boundary bias). Exact under scaling:
  ĥ(c·points) = ĥ(points) + d·log|c|. Cost O(N²·d) time.

  Duplicate points give ε_i = 0; ε_i² is clamped at the smallest normal float
  (``finfo.tiny``) so the estimate stays finite, but very negative (about
  −43.7·d/N nats per coincident point in float32), as befits a singular cloud.

  Args:
    points: ``[N, d]`` samples (particles), N ≥ 2.
    k: neighbour order, 1 ≤ k ≤ N − 1 (static).
  """
  _checks.check_particles('points', points)
  num, dim = points.shape
  if num < 2:
    raise ValueError(f'points must hold at least 2 points, got shape {points.shape}.')
  _checks.check_int('k', k, 1, num - 1)
  dtype = _compute_dtype(points)
  points = jnp.asarray(points, dtype)
  sq = jnp.maximum(_kth_neighbour_sq_dist(points, k), jnp.finfo(dtype).tiny)
  log_unit_ball = 0.5 * dim * math.log(math.pi) - jax.scipy.special.gammaln(0.5 * dim + 1.0)
  digammas = (jax.scipy.special.digamma(jnp.asarray(num, dtype))
              - jax.scipy.special.digamma(jnp.asarray(k, dtype)))
  return digammas + log_unit_ball + 0.5 * dim * jnp.mean(jnp.log(sq))


def free_energy(energy: jax.Array, points: jax.Array, beta: float, k: int = 1) -> jax.Array:
  r"""Free energy F_β = E − β⁻¹·ĥ of a particle cloud (scalar).

  Sign convention: F_β(ρ) = E(ρ) + β⁻¹·Ent(ρ) with Ent(ρ) = ∫ρ log ρ the
  entropy relative to Lebesgue measure, i.e. *minus* the differential entropy
  h; so spreading the cloud out (larger h) lowers F. h is estimated by
  ``knn_entropy(points, k)``. This is the functional that the Langevin step
  ω ← ω − η∇(δE/δρ) + √(2η/β)·ξ decreases; β = ∞ gives F = E (and skips ĥ).

  Args:
    energy: scalar E, e.g. ``hamiltonian.hamiltonian(omega, ...)`` at ``points``.
    points: ``[N, d]`` particles.
    beta: inverse temperature β > 0, ``math.inf`` allowed.
    k: neighbour order of the entropy estimate.
  """
  _checks.check_rank('energy', energy, 0)
  _checks.check_particles('points', points)
  _checks.check_positive('beta', beta, allow_inf=True)
  energy = jnp.asarray(energy, _compute_dtype(energy))
  if _checks.concrete_float(beta) == math.inf:
    _checks.check_int('k', k, 1, points.shape[0] - 1)
    return energy
  return energy - knn_entropy(points, k) / beta


def sliced_wasserstein(key: jax.Array, a: jax.Array, b: jax.Array,
                       num_projections: int = 128) -> jax.Array:
  r"""Sliced 2-Wasserstein distance SW₂ between two point clouds (scalar).

  .. math:: SW_2(a, b) = \Big(\frac1P \sum_{p=1}^P W_2^2(θ_p{}_\# a, θ_p{}_\# b)\Big)^{1/2},
            \quad W_2^2(μ, ν) = \int_0^1 |F_μ^{-1}(t) − F_ν^{-1}(t)|^2 dt,

  a Monte-Carlo estimate over P directions θ_p uniform on the unit sphere
  (drawn from ``key``) of the sliced distance between the empirical measures
  (1/Na)Σδ_{a_i} and (1/Nb)Σδ_{b_j}. Returned is SW₂ itself (the square root).
  The 1-D W₂² is exact for any sizes: both quantile functions are step
  functions with jumps at i/Na and j/Nb; on each interval of the merged grid
  (at most Na + Nb − 1 of them, computed statically with integer arithmetic)
  they are constant. Identical clouds, or a cloud and its copy repeated, give 0.

  Args:
    key: PRNG key for the directions.
    a: ``[Na, d]`` points.
    b: ``[Nb, d]`` points, same d (Nb may differ from Na, e.g. N and 2N).
    num_projections: P ≥ 1 (static).
  """
  _checks.check_particles('a', a)
  _checks.check_particles('b', b)
  _checks.check_same_last_dim('a', a, 'b', b)
  _checks.check_int('num_projections', num_projections, 1)
  dtype = _compute_dtype(a, b)
  (na, dim), nb = a.shape, b.shape[0]
  theta = jax.random.normal(key, (num_projections, dim), dtype)
  theta = theta / jnp.linalg.norm(theta, axis=-1, keepdims=True)  # [P, d]
  pa = jnp.sort(jnp.asarray(a, dtype) @ theta.T, axis=0)          # [Na, P]
  pb = jnp.sort(jnp.asarray(b, dtype) @ theta.T, axis=0)          # [Nb, P]
  # Breakpoints i/Na and j/Nb in units of 1/(Na·Nb): exact integers.
  cuts = np.union1d(np.arange(na + 1) * nb, np.arange(nb + 1) * na)
  lo, widths = cuts[:-1], np.diff(cuts) / (na * nb)
  diff = pa[lo // nb] - pb[lo // na]                               # [M, P]
  sq = jnp.sum(jnp.asarray(widths, dtype)[:, None] * jnp.square(diff), axis=0)
  return jnp.sqrt(jnp.mean(sq))


def kernel_spread_from_kernels(kernels: jax.Array) -> jax.Array:
  r"""Relative spread of S kernel matrices around their mean (scalar ≥ 0).

  .. math:: σ_K = \frac{\sqrt{\frac1S \sum_s ‖K_s − \bar K‖_F^2}}{‖\bar K‖_F},
            \qquad \bar K = \frac1S \sum_s K_s.

  0 when all kernels agree; invariant to a common scale. Returns 0 if all
  K_s = 0 and ∞ if only the mean is 0.

  Args:
    kernels: ``[S, n, n]`` kernel matrices of the same n inputs from S runs.
  """
  _checks.check_rank('kernels', kernels, 3)
  s, n, m = kernels.shape
  if s == 0 or n == 0 or n != m:
    raise ValueError(f'kernels must have shape [S, n, n] with S, n >= 1, got {kernels.shape}.')
  kernels = jnp.asarray(kernels, _compute_dtype(kernels))
  mean = jnp.mean(kernels, axis=0)
  num = jnp.sqrt(jnp.mean(jnp.sum(jnp.square(kernels - mean), axis=(-2, -1))))
  den = jnp.linalg.norm(mean)
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0),
                   jnp.where(num > 0, jnp.inf, 0.0))


def kernel_spread(phis: jax.Array) -> jax.Array:
  r"""Spread σ_K of the learned kernels K_s = Φ_s Φ_sᵀ across S runs (scalar).

  σ_K as in ``kernel_spread_from_kernels``; builds the S n×n kernels (n ≲ 500).
  For runs with different feature widths, build the kernels and call that
  function instead.

  Args:
    phis: ``[S, n, F]`` features of the same n inputs from S runs (seeds).
  """
  _checks.check_rank('phis', phis, 3)
  if 0 in phis.shape:
    raise ValueError(f'phis must have shape [S, n, F] with S, n, F >= 1, got {phis.shape}.')
  phis = jnp.asarray(phis, _compute_dtype(phis))
  return kernel_spread_from_kernels(jnp.einsum('snf,smf->snm', phis, phis))


# ----------------------------------------------------------------------------- diversity

def _centred_singular_values(omega: jax.Array) -> jax.Array:
  """σ ``[..., min(N, d)]`` of the centred cloud ω_i − ω̄ (``omega: [..., N, d]``)."""
  _checks.check_min_rank('omega', omega, 2)
  x = jnp.asarray(omega, _compute_dtype(omega))
  x = x - jnp.mean(x, axis=-2, keepdims=True)
  return jnp.linalg.svd(x, compute_uv=False)


def top_direction_share(omega: jax.Array) -> jax.Array:
  r"""σ₁² / Σ_k σ_k² ``[...]``: the share of the cloud's variance along its top direction.

  σ the singular values of the centred particles (the eigenvalues of the cloud's
  covariance are σ²/N). 1/d for an isotropic cloud, 1 for particles on one line; 0 for a
  cloud of one point (no variance).
  """
  sq = jnp.square(_centred_singular_values(omega))
  total = jnp.sum(sq, axis=-1)
  return jnp.where(total > 0, sq[..., 0] / jnp.where(total > 0, total, 1.0), 0.0)


def effective_rank(omega: jax.Array) -> jax.Array:
  r"""exp(−Σ_k p_k log p_k), p_k = σ_k / Σ_j σ_j ``[...]`` (Roy & Vetterli 2007).

  σ the singular values of the centred particles: between 1 (one line) and min(N, d)
  (equal spread in every direction); 1 for a cloud of one point.
  """
  sv = _centred_singular_values(omega)
  total = jnp.sum(sv, axis=-1, keepdims=True)
  p = sv / jnp.where(total > 0, total, 1.0)
  ent = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)
  return jnp.exp(ent)


def min_pairwise_distance(omega: jax.Array) -> jax.Array:
  """min_{i<j} ‖ω_i − ω_j‖ ``[...]`` (N ≥ 2 particles), from the Gram matrix."""
  _checks.check_min_rank('omega', omega, 2)
  if omega.shape[-2] < 2:
    raise ValueError(f'omega must hold at least 2 particles, got shape {omega.shape}.')
  x = jnp.asarray(omega, _compute_dtype(omega))
  diff = x[..., :, None, :] - x[..., None, :, :]
  sq = jnp.sum(diff * diff, axis=-1)
  n = omega.shape[-2]
  sq = jnp.where(jnp.eye(n, dtype=bool), jnp.inf, sq)
  return jnp.sqrt(jnp.min(sq, axis=(-2, -1)))


DIVERSITY_STATISTICS = ('top_direction_share', 'effective_rank', 'min_pairwise_distance')
"""The keys of ``particle_diversity``."""


def particle_diversity(omega: jax.Array) -> dict:
  """``{'top_direction_share', 'effective_rank', 'min_pairwise_distance'}``, each ``[...]``."""
  return {'top_direction_share': top_direction_share(omega),
          'effective_rank': effective_rank(omega),
          'min_pairwise_distance': min_pairwise_distance(omega)}
