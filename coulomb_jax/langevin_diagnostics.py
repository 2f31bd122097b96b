r"""Is the Langevin dynamics learning? Pure measurements of one projected Langevin run.

A step moves particle k by ω_k ← P_R(ω_k − η·N·clip(∇H)_k + √(2η/β)·ξ_k),
ξ_k ∼ N(0, I_d) (``langevin.langevin_step``). Whether the particles follow the
Hamiltonian or only diffuse on the ball is read off these quantities:

* **drift / noise** (``drift_to_noise``): d_k / σ with d_k = η·N·‖clip(∇H)_k‖
  and σ = √(2η/β)·√d, the root-mean-square norm of one step's noise
  (``noise_scale``). Below ~1e-2 a step is a random walk.
* **repulsion / alignment** (``force_ratio``): λ‖∇_k W‖ / ‖∇_k A‖, how much of
  the force on particle k is the Riesz repulsion (H = −A + λW).
* **Gibbs tilt** (``gibbs_tilt``): β·(max U − min U) over the ball, U the
  one-particle potential (``hamiltonian.particle_potentials``). The stationary
  density ∝ exp(−βU) is flat when this is ≪ 1 and concentrates when it is ≫ 1,
  whatever the per-step ratio (a long run at a small ratio can still learn).
* **displacement** against a **pure random walk** (``displacement``,
  ``random_walk``): how far the particles moved, next to how far the same
  number of noise-only projected steps moves them.
* **held-out alignment** (``heldout_alignment``): the objective A on held-out
  rows and the scale-free centered alignment ρ(ΦΦᵀ, yyᵀ); A grows with the
  features' magnitude (a larger ball raises it by itself), ρ does not.

Three rules set η, λ and β from the measured scale of the forces instead of
fixing them (``relative_step_size``, ``relative_lam``, ``tilt_beta``), so that
one setting means the same dynamics for feature maps whose alignments differ by
orders of magnitude. ``LogHistogram`` accumulates per-particle ratios over the
steps of a run (host side, resumable) for their median.

Shapes: particle sets are ``[..., N, d]`` (leading axes e.g. heads); several
sets that share one global clip are a pytree of such arrays.
"""

import math
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import _checks
from coulomb_jax import alignment
from coulomb_jax import langevin


def _row_norms(g: jax.Array) -> jax.Array:
  """‖g_k‖ over the last axis as m·‖g/m‖, m = max_i |g_ki|: no underflow of the squares
  (a Riesz force with s = 62 has components ~1e-20, whose squares are 0 in float32)."""
  g = jnp.asarray(g, jnp.promote_types(g.dtype, jnp.float32))
  m = jnp.max(jnp.abs(g), axis=-1, keepdims=True)
  safe = jnp.where(m > 0, m, 1.0)
  return (safe * jnp.linalg.norm(g / safe, axis=-1, keepdims=True))[..., 0]


def _particle_norms(tree) -> jax.Array:
  """``[P]``: ‖g_k‖ of every particle of every leaf ``[..., N, d]``, concatenated."""
  return jnp.concatenate([_row_norms(g).ravel() for g in jax.tree.leaves(tree)])


def _num_particles(tree) -> jax.Array:
  """``[P]``: N of each particle's own set (the factor of the drift)."""
  return jnp.concatenate([jnp.full(math.prod(g.shape[:-1]), g.shape[-2], jnp.float32)
                          for g in jax.tree.leaves(tree)])


def noise_scale(step_size: float, beta: float, dim: int) -> float:
  """σ = √(2η/β)·√d: the RMS norm of one step's noise √(2η/β)·ξ, ξ ∼ N(0, I_d); 0 at β = ∞."""
  _checks.check_positive('step_size', step_size)
  _checks.check_positive('beta', beta, allow_inf=True)
  return math.sqrt(2.0 * step_size / beta * dim)


def drift(grad, *, step_size: float, clip_norm: Optional[float] = None) -> jax.Array:
  """``[P]``: d_k = η·N·‖clip(∇H)_k‖ of every particle, as one Langevin step moves it.

  ``grad``: ∇H as ``jax.grad`` returns it, one array ``[..., N, d]`` or a pytree of
  them that share one global-norm clip (as ``langevin.langevin_transform``).
  """
  grad = langevin.clip_by_global_norm(grad, clip_norm)
  return step_size * _num_particles(grad) * _particle_norms(grad)


def drift_to_noise(grad, *, step_size: float, beta: float,
                   clip_norm: Optional[float] = None) -> jax.Array:
  """``[P]``: d_k / σ, the drift of one step over the RMS norm of its noise.

  d = η·N·‖clip(∇H)_k‖ (``drift``), σ = √(2η/β)·√d (``noise_scale``); +inf at β = ∞.
  """
  d = drift(grad, step_size=step_size, clip_norm=clip_norm)
  dim = jax.tree.leaves(grad)[0].shape[-1]
  sigma = noise_scale(step_size, beta, dim)
  return d / sigma if sigma > 0 else jnp.full_like(d, jnp.inf)


def force_ratio(grad_repulsion, grad_alignment, lam: float) -> jax.Array:
  """``[P]``: λ‖∇_k W‖ / ‖∇_k A‖ per particle (+inf where ∇_k A = 0 and λ∇_k W ≠ 0).

  ``grad_repulsion``, ``grad_alignment``: ∇W and ∇A, same structure as the particles.
  """
  _checks.check_nonnegative('lam', lam)
  rep = lam * _particle_norms(grad_repulsion)
  ali = _particle_norms(grad_alignment)
  return jnp.where(ali > 0, rep / jnp.where(ali > 0, ali, 1.0),
                   jnp.where(rep > 0, jnp.inf, 0.0))


def relative_step_size(grad, *, fraction: float, radius: float,
                       clip_norm: Optional[float] = None) -> float:
  """η at which the median particle's drift η·N·‖clip(∇H)_k‖ is ``fraction``·R.

  A step size in units of the ball: ``fraction = 0.01`` moves the median particle
  by 1% of the radius per step at the measured gradient (eager; returns a float).
  """
  _checks.check_positive('fraction', fraction)
  _checks.check_positive('radius', radius)
  per_unit = float(jnp.median(drift(grad, step_size=1.0, clip_norm=clip_norm)))
  if not per_unit > 0 or not math.isfinite(per_unit):
    raise ValueError(f'grad: the median particle gradient is {per_unit!r}; a relative step '
                     'needs a finite, non-zero force.')
  return fraction * radius / per_unit


def relative_lam(grad_repulsion, grad_alignment, ratio: float) -> float:
  """λ at which the median repulsion force is ``ratio`` times the median alignment force.

  λ = ratio · median_k ‖∇_k A‖ / median_k ‖∇_k W‖ (eager; returns a float; 0 when
  ratio = 0).
  """
  _checks.check_nonnegative('ratio', ratio)
  if ratio == 0:
    return 0.0
  rep = float(jnp.median(_particle_norms(grad_repulsion)))
  ali = float(jnp.median(_particle_norms(grad_alignment)))
  if not rep > 0 or not math.isfinite(rep) or not math.isfinite(ali):
    raise ValueError(f'grad_repulsion: median particle gradient {rep!r} (alignment {ali!r}); '
                     'a relative λ needs a finite, non-zero repulsion force.')
  return ratio * ali / rep


def potential_range(potentials: jax.Array) -> jax.Array:
  """``[...]``: max − min of U over its last axis (the probe points of ``ball_probes``)."""
  return jnp.max(potentials, axis=-1) - jnp.min(potentials, axis=-1)


def gibbs_tilt(potentials: jax.Array, beta: float) -> jax.Array:
  """``[...]``: β·(max U − min U): how far exp(−βU) is from flat over the probes."""
  _checks.check_positive('beta', beta, allow_inf=True)
  return beta * potential_range(potentials)


def tilt_beta(potential_range_value: float, tilt: float) -> float:
  """β at which the Gibbs tilt β·ΔU equals ``tilt`` (ΔU: ``potential_range``)."""
  _checks.check_positive('tilt', tilt)
  if not potential_range_value > 0 or not math.isfinite(potential_range_value):
    raise ValueError(f'potential_range_value: expected a finite number > 0, got '
                     f'{potential_range_value!r} (a flat potential has no temperature scale).')
  return tilt / potential_range_value


def ball_probes(key: jax.Array, omega: jax.Array, radius: float, num: int) -> jax.Array:
  """``[..., N + num, d]``: the particles projected onto the ball, then ``num`` points
  uniform in the ball ‖ω‖ ≤ R (one draw shared by the leading axes).

  Where ``gibbs_tilt`` looks for the range of the one-particle potential.
  """
  _checks.check_min_rank('omega', omega, 2)
  _checks.check_positive('radius', radius)
  num = _checks.check_int('num', num, 0)
  dim = omega.shape[-1]
  k_dir, k_rad = jax.random.split(key)
  direction = jax.random.normal(k_dir, (num, dim), jnp.float32)
  direction = direction / jnp.linalg.norm(direction, axis=-1, keepdims=True)
  rad = radius * jax.random.uniform(k_rad, (num, 1), jnp.float32) ** (1.0 / dim)
  uniform = jnp.broadcast_to(direction * rad, omega.shape[:-2] + (num, dim))
  on_ball = langevin.project_to_ball(jnp.asarray(omega, jnp.float32), radius)
  return jnp.concatenate([on_ball, uniform], axis=-2)


def random_walk(key: jax.Array, omega: jax.Array, *, num_steps: int, step_size: float,
                beta: float, radius: float) -> jax.Array:
  """The particles after ``num_steps`` noise-only projected steps (∇H = 0).

  ω ← P_R(ω + √(2η/β)·ξ), step t's noise from ``fold_in(key, t)``: the walk a
  Langevin run of the same length, η, β and R would make without any force.
  """
  num_steps = _checks.check_int('num_steps', num_steps, 0)
  _checks.check_min_rank('omega', omega, 2)
  if math.isinf(float(beta)) or num_steps == 0:
    return langevin.project_to_ball(omega, radius) if num_steps else omega
  zero = jnp.zeros_like(omega)

  def body(t, w):
    return langevin.langevin_step(jax.random.fold_in(key, t), w, zero, step_size=step_size,
                                  beta=beta, radius=radius)

  return jax.lax.fori_loop(0, num_steps, body, omega)


def displacement(start: jax.Array, end: jax.Array) -> jax.Array:
  """``[..., N]``: ‖ω_k(end) − ω_k(start)‖ per particle."""
  return jnp.linalg.norm(jnp.asarray(end, jnp.float32) - jnp.asarray(start, jnp.float32),
                         axis=-1)


def heldout_alignment(phi: jax.Array, y: jax.Array) -> Dict[str, jax.Array]:
  """``{'alignment': A, 'centered_alignment': ρ}`` of features ``phi: [n, F]`` with ``y: [n]``.

  A: the objective (``alignment.target_alignment``, uncentered, grows with the
  features' scale); ρ = ``alignment.centered_alignment(ΦΦᵀ, yyᵀ)`` ∈ [−1, 1],
  scale-free. Builds the n×n kernel: meant for a held-out set of a few thousand rows.
  """
  phi = jnp.asarray(phi, jnp.float32)
  y = jnp.asarray(y, jnp.float32)
  return {'alignment': alignment.target_alignment(phi, y),
          'centered_alignment': alignment.centered_alignment(phi @ phi.T, jnp.outer(y, y))}


class LogHistogram:
  """Counts of positive values in log-spaced bins, for the median of a long stream.

  ``bins_per_decade`` bins from 10^``low`` to 10^``high``, plus an underflow bin
  (values ≤ 10^low, zeros included) and an overflow bin (≥ 10^high, +inf
  included). ``median()`` is exact to one bin (a factor 10^(1/bins_per_decade)).
  ``counts`` is a plain int64 array: store it in a checkpoint, ``add`` to it.
  NaNs are counted apart (``nan``) and never in the median.
  """

  def __init__(self, low: float = -12.0, high: float = 12.0, bins_per_decade: int = 20,
               counts: Optional[np.ndarray] = None, nan: int = 0):
    self.edges = np.logspace(low, high, int(round((high - low) * bins_per_decade)) + 1)
    size = len(self.edges) + 1
    self.counts = np.zeros(size, np.int64) if counts is None else np.asarray(counts, np.int64)
    if self.counts.shape != (size,):
      raise ValueError(f'counts: expected shape ({size},), got {self.counts.shape}.')
    self.nan = int(nan)

  def add(self, values: Any) -> None:
    v = np.asarray(values, np.float64).ravel()
    finite = ~np.isnan(v)
    self.nan += int(np.sum(~finite))
    self.counts += np.bincount(np.searchsorted(self.edges, v[finite], side='left'),
                               minlength=len(self.counts)).astype(np.int64)

  @property
  def total(self) -> int:
    return int(self.counts.sum())

  def quantile(self, q: float) -> float:
    """The q-quantile, as the geometric middle of its bin (NaN if empty).

    The underflow bin reads as its upper edge, the overflow bin as its lower one.
    """
    if self.total == 0:
      return float('nan')
    i = int(np.searchsorted(np.cumsum(self.counts), q * self.total, side='left'))
    i = min(i, len(self.counts) - 1)
    if i == 0:
      return float(self.edges[0])
    if i == len(self.edges):
      return float(self.edges[-1])
    return float(np.sqrt(self.edges[i - 1] * self.edges[i]))

  def median(self) -> float:
    return self.quantile(0.5)
