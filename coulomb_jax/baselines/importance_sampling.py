r"""Importance-sampling kernel learning (Sinha & Duchi 2016), the baseline.

Sinha & Duchi, "Learning Kernels with Random Features", NeurIPS 2016. Draw
N_w candidate features φ_m(x) = cos(w_mᵀx + b_m), w_m ~ N(0, σ⁻² I),
b_m ~ U[0, 2π]; score each by its alignment with the labels,

.. math:: v_m = \Big(\frac1n \sum_i y_i φ_m(x_i)\Big)^2 ,

reweight the candidates by the solution of

.. math::
   \max_q\ qᵀv \quad\text{s.t.}\quad q ≥ 0,\ \textstyle\sum_m q_m = 1,\
   ‖q − u‖² ≤ ρ/N_w,\qquad u = 1/N_w,

(the χ² ball; the paper's default ρ = 0.005·N_w), then draw D features i.i.d.
from q and use φ_D(x) = √(2/D)·cos(Wᵀx + b) on the drawn (w, b).

The paper's scores are unnormalised, (Σ_i y_i φ_m(x_i))²; the 1/n² here does not change
the maximiser (``solve_weights`` is invariant to v ↦ αv + c, α > 0). ``solve_weights``
solves the program in one of three cases (the ball inactive: the LP solution; interior:
closed form; else bisection on the threshold θ of the dual). Derivation:
docs/math.md#baselinesimportance_sampling.
"""

import functools
import math
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import _checks

DEFAULT_RHO_PER_CANDIDATE = 0.005
"""The paper's default ρ = 0.005·N_w, i.e. ‖q − u‖² ≤ 0.005."""


def _threshold_weights(v: jax.Array, theta: jax.Array) -> jax.Array:
  """q(θ) = (v − θ)_+ / Σ(v − θ)_+ for θ < max v."""
  p = jnp.maximum(v - theta, 0.0)
  return p / jnp.maximum(jnp.sum(p), jnp.finfo(p.dtype).tiny)


def solve_weights(scores: jax.Array, rho, tol: float = 1e-6,
                  max_iter: int = 100) -> jax.Array:
  r"""Weights of the χ²-constrained linear program, ``[N_w]``.

  Solves max_q qᵀv s.t. q ≥ 0, Σ_m q_m = 1, ‖q − u‖² ≤ ρ/N_w, u = 1/N_w, by
  the three cases of the module docstring (LP vertex face, closed-form
  interior solution, or bisection on the threshold θ of the dual).

  Tolerance: bisection stops once the ball is tight to relative ``tol``,
  ‖q − u‖² ≥ (1 − tol)·ρ/N_w, or after ``max_iter`` halvings, or when the
  float bracket cannot shrink. Guarantee: the gain qᵀv − v̄ over uniform weights is within
  a factor (1 − tol) of the optimal gain; always q ≥ 0 exactly, Σq = 1 and
  ‖q − u‖² ≤ ρ/N_w up to float rounding. Proof: docs/math.md#baselinesimportance_sampling.

  Args:
    scores: ``v: [N_w]`` scores (any real values; NaN is not checked).
    rho: ρ ≥ 0, the radius² of the χ² ball times N_w (ρ = 0 gives q = u).
    tol: relative tolerance on the tightness of the ball, > 0.
    max_iter: at most this many bisection steps, ≥ 1.

  Returns:
    ``q: [N_w]``, a point of the simplex inside the ball maximising qᵀv.
  """
  _checks.check_rank('scores', scores, 1)
  if np.shape(scores)[0] == 0:
    raise ValueError(f'scores must hold at least one score, got shape {np.shape(scores)}.')
  _checks.check_nonnegative('rho', rho)
  _checks.check_positive('tol', tol)
  if _checks.concrete_float(max_iter) is not None:
    _checks.check_int('max_iter', max_iter, 1)
  return _solve_weights(jnp.asarray(scores), rho, tol, max_iter)


@jax.jit
def _solve_weights(scores, rho, tol, max_iter):
  dtype = jnp.promote_types(scores.dtype, jnp.float32)
  v = jnp.asarray(scores, dtype)
  num = v.shape[0]
  u = jnp.asarray(1.0 / num, dtype)
  r2 = jnp.asarray(rho, dtype) / num
  v_max, v_min = jnp.max(v), jnp.min(v)
  spread = v_max - v_min
  v = jnp.where(spread > 0, (v - v_max) / jnp.where(spread > 0, spread, 1.0), 0.0)

  # 1. The LP solution closest to u (uniform on argmax v) lies in the ball.
  top = (v == 0.0).astype(dtype)
  q_top = top / jnp.sum(top)
  top_inside = 1.0 / jnp.sum(top) - u <= r2

  # 2. Interior closed form: the ball boundary along v − v̄.
  centred = v - jnp.mean(v)
  norm = jnp.linalg.norm(centred)
  q_int = u + jnp.sqrt(r2) * centred / jnp.where(norm > 0, norm, 1.0)
  int_ok = jnp.min(q_int) >= 0

  # 3. Bisection on θ ∈ [−1, 0]: invariant ‖q(lo) − u‖² ≤ r² < ‖q(hi) − u‖²;
  # stop once the ball is tight, ‖q(lo) − u‖² ≥ (1 − tol)·r².
  def dist2(theta):
    return jnp.sum(jnp.square(_threshold_weights(v, theta) - u))

  def cond(state):
    lo, hi, d_lo, it = state
    mid = 0.5 * (lo + hi)
    return (d_lo < (1 - tol) * r2) & (it < max_iter) & (lo < mid) & (mid < hi)

  def body(state):
    lo, hi, d_lo, it = state
    mid = 0.5 * (lo + hi)
    d_mid = dist2(mid)
    ok = d_mid <= r2
    return (jnp.where(ok, mid, lo), jnp.where(ok, hi, mid), jnp.where(ok, d_mid, d_lo),
            it + 1)

  lo0 = jnp.asarray(-1.0, dtype)
  lo, _, _, _ = jax.lax.while_loop(
      cond, body, (lo0, jnp.asarray(0.0, dtype), dist2(lo0), jnp.asarray(0)))
  q_bis = _threshold_weights(v, lo)
  return jnp.where(top_inside, q_top, jnp.where(int_ok, q_int, q_bis))


def candidate_features(key: jax.Array, num_candidates: int, dim: int,
                       scale: float = 1.0, dtype=jnp.float32) -> Tuple[jax.Array, jax.Array]:
  r"""Random Fourier candidates ``(w [N_w, d], b [N_w])``.

  w_m ~ N(0, scale²·I_d) and b_m ~ U[0, 2π], independent. ``scale`` is the
  inverse bandwidth 1/σ: the features then estimate the Gaussian kernel
  exp(−scale²‖x − x'‖²/2) = exp(−‖x − x'‖²/(2σ²)).
  """
  _checks.check_int('num_candidates', num_candidates, 1)
  _checks.check_int('dim', dim, 1)
  _checks.check_positive('scale', scale)
  kw, kb = jax.random.split(key)
  w = scale * jax.random.normal(kw, (int(num_candidates), int(dim)), dtype)
  b = jax.random.uniform(kb, (int(num_candidates),), dtype, 0.0, 2.0 * math.pi)
  return w, b


def cosine_features(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
  r"""Random cosine features φ(x) = √(2/D)·cos(x Wᵀ + b), ``[..., D]``.

  For w ~ N(0, I), b ~ U[0, 2π]: E[2 cos(wᵀx + b) cos(wᵀx' + b)] =
  exp(−‖x − x'‖²/2), so ⟨φ(x), φ(x')⟩ estimates the Gaussian kernel.

  Args:
    x: ``[..., d]`` inputs.
    w: ``[D, d]`` frequencies.
    b: ``[D]`` phases.
  """
  _checks.check_min_rank('x', x, 1)
  _checks.check_particles('w', w)
  _checks.check_same_last_dim('x', x, 'w', w)
  _checks.check_rank('b', b, 1)
  if np.shape(b)[0] != np.shape(w)[0]:
    raise ValueError(
        f'b must have shape ({np.shape(w)[0]},) to match w {np.shape(w)}, got {np.shape(b)}.')
  dtype = jnp.promote_types(jnp.result_type(x, w, b), jnp.float32)
  s = jnp.einsum('...d,nd->...n', jnp.asarray(x, dtype), jnp.asarray(w, dtype))
  return math.sqrt(2.0 / np.shape(w)[0]) * jnp.cos(s + jnp.asarray(b, dtype))


def importance_sample(key: jax.Array, x: jax.Array, y: jax.Array, num_features: int, *,
                      num_candidates: int, scale: float = 1.0,
                      rho: Optional[float] = None) -> Tuple[jax.Array, jax.Array, jax.Array]:
  r"""Sinha & Duchi's learned random features: ``(w [D, d], b [D], q [N_w])``.

  Draws N_w candidates (``candidate_features``), scores them by
  v_m = ((1/n) Σ_i y_i cos(w_mᵀx_i + b_m))², solves q = ``solve_weights(v, ρ)``
  and draws D indices i.i.d. (with replacement) from q. Use the result as
  ``cosine_features(x, w, b)``.

  Args:
    key: PRNG key (split into a candidate key and a resampling key).
    x: ``[n, d]`` inputs; y: ``[n]`` labels (±1 for classification).
    num_features: D ≥ 1 features to draw.
    num_candidates: N_w ≥ 1 candidates.
    scale: inverse bandwidth of the candidates, > 0.
    rho: ρ ≥ 0 of the χ² ball; ``None`` is the paper's 0.005·N_w.

  Returns:
    the drawn frequencies ``w: [D, d]``, phases ``b: [D]`` and the candidate
    weights ``q: [N_w]``.
  """
  _checks.check_rank('x', x, 2)
  if 0 in np.shape(x):
    raise ValueError(f'x must hold at least one sample of dimension >= 1, got {np.shape(x)}.')
  _checks.check_labels('x', x, 'y', y)
  _checks.check_int('num_features', num_features, 1)
  _checks.check_int('num_candidates', num_candidates, 1)
  if rho is None:
    rho = DEFAULT_RHO_PER_CANDIDATE * int(num_candidates)
  _checks.check_nonnegative('rho', rho)
  _checks.check_positive('scale', scale)
  return _importance_sample(key, x, y, scale, rho, num_features=int(num_features),
                            num_candidates=int(num_candidates))


@functools.partial(jax.jit, static_argnames=('num_features', 'num_candidates'))
def _importance_sample(key, x, y, scale, rho, *, num_features, num_candidates):
  cand_key, draw_key = jax.random.split(key)
  dtype = jnp.promote_types(jnp.result_type(x, y), jnp.float32)
  w, b = candidate_features(cand_key, num_candidates, x.shape[-1], scale, dtype)
  phi = cosine_features(x, w, b)                             # [n, N_w]
  # √(2/N_w)·cos instead of cos: a positive rescaling of v, which leaves q unchanged.
  scores = jnp.square(jnp.asarray(y, dtype) @ phi / x.shape[0])
  q = _solve_weights(scores, rho, 1e-6, 100)
  idx = jax.random.categorical(draw_key, jnp.log(q), shape=(num_features,))
  return w[idx], b[idx], q
