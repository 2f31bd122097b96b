r"""The particle Hamiltonian and its per-particle potentials.

.. math::
   H(Ω) = −A(Ω) + λ W_s(Ω),\qquad
   A(Ω) = \frac{1}{n(n−1)} \sum_{i≠j} y_i y_j ⟨φ(x_i; Ω), φ(x_j; Ω)⟩

with A the alignment U-statistic (``alignment.target_alignment``) and W_s the
Riesz energy (``repulsion.riesz_energy``). For a separable feature map the
alignment splits over particles, A(Ω) = (1/N) Σ_k A({ω_k}), so H is a one-body
data potential plus a pair repulsion and costs O(n·N·d + N²·d).

Use ``jax.grad(hamiltonian)`` for ∇H; ``hamiltonian_terms`` also returns the
two terms for logging.

Precision: every function takes ``precision`` (``jax.lax.Precision``, ``'default'``,
``'high'``, ``'highest'`` or None) for all its matrix products (the features xΩᵀ, the
label sums, the pair distances), applied as ``jax.default_matmul_precision`` while the
function is traced. None, the default, is the backend's: exact float32 on CPU, TF32 on
recent NVIDIA GPUs and one bf16 pass on TPU; ``'highest'`` keeps float32 products
everywhere. Where the tests' tolerances hold: docs/performance.md#hamiltonian-module.
"""

import contextlib
from typing import Dict, Tuple, Union

import jax

from coulomb_jax import _checks
from coulomb_jax import alignment
from coulomb_jax import features
from coulomb_jax import repulsion


def matmul_precision(precision):
  """A context applying ``precision`` (checked: ``_checks.check_precision``) to the
  matrix products traced inside it; None: the backend's default (no context)."""
  precision = _checks.check_precision(precision)
  if precision is None:
    return contextlib.nullcontext()
  return jax.default_matmul_precision(precision.name.lower())


def _check_data(omega, x, y):
  _checks.check_particles('omega', omega)
  _checks.check_rank('x', x, 2)
  _checks.check_same_last_dim('x', x, 'omega', omega)
  _checks.check_labels('x', x, 'y', y)


def hamiltonian_terms(
    omega: jax.Array, x: jax.Array, y: jax.Array, *,
    feature_map: Union[str, features.FeatureMap], lam: float,
    s: repulsion.Exponent = 'coulomb',
    softening: float = repulsion.DEFAULT_SOFTENING, precision=None,
) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """``(H, {"alignment": A, "repulsion": W})``; arguments as ``hamiltonian``.

  Written for ``jax.value_and_grad(..., has_aux=True)``.
  """
  _check_data(omega, x, y)
  _checks.check_nonnegative('lam', lam)   # λ < 0 would attract the particles together
  fm = features.get_feature_map(feature_map)
  with matmul_precision(precision):
    a = alignment.target_alignment(fm(x, omega), y)
    w = repulsion.riesz_energy(omega, s, softening)
  return -a + lam * w, {'alignment': a, 'repulsion': w}


def hamiltonian(
    omega: jax.Array, x: jax.Array, y: jax.Array, *,
    feature_map: Union[str, features.FeatureMap], lam: float,
    s: repulsion.Exponent = 'coulomb',
    softening: float = repulsion.DEFAULT_SOFTENING, precision=None,
) -> jax.Array:
  r"""H(Ω) = −A(Ω) + λ·W_s(Ω) (scalar).

  Args:
    omega: ``[N, d]`` particles.
    x: ``[n, d]`` inputs.
    y: ``[n]`` labels (±1, or real values).
    feature_map: a name in ``features.FEATURE_MAPS`` or a function
      ``(x, omega) -> [n, F]``.
    lam: repulsion weight λ (0 switches repulsion off).
    s: Riesz exponent ≥ 0 or ``"coulomb"`` (s = d − 2).
    softening: ε ≥ 0 of the Riesz kernel.
    precision: of every matrix product (module docstring; None: the backend's default).
  """
  return hamiltonian_terms(omega, x, y, feature_map=feature_map, lam=lam, s=s,
                           softening=softening, precision=precision)[0]


def particle_potentials(
    omega: jax.Array, x: jax.Array, y: jax.Array, *,
    feature_map: Union[str, features.FeatureMap], lam: float,
    s: repulsion.Exponent = 'coulomb',
    softening: float = repulsion.DEFAULT_SOFTENING, precision=None,
) -> jax.Array:
  r"""The potential each particle feels, ``[N]``: U_k = V_D(ω_k) + 2λ·u(ω_k).

  * V_D(ω) = −A({ω}): minus the alignment of the one-particle feature map;
  * u(ω_k) = (1/N) Σ_{l≠k} g_s(ω_k − ω_l): the mean-field repulsive potential.

  U_k is the first variation δH/δρ at ω_k: with the other particles held fixed,
  ∇_{ω_k} U_k = N·∇_{ω_k} H for every separable map, so the Langevin step moves
  particle k by −η∇U_k + √(2η/β)ξ and its conditional stationary density is
  ∝ exp(−β U_k). (The factor 2 is the pair counted as (k, l) and (l, k) in W;
  mean_k U_k = −A + 2λW, not H.) For ``softmaxfeat``, whose softmax couples the
  particles, V_D is the one-particle proxy. ``langevin.gibbs_resample`` draws
  particles with weights ∝ exp(−β U_k).
  """
  _check_data(omega, x, y)
  fm = features.get_feature_map(feature_map)
  with matmul_precision(precision):
    one_body = jax.vmap(lambda w: -alignment.target_alignment(fm(x, w[None, :]), y))(omega)
    pair = repulsion.riesz_potential(omega, omega, s, softening, self_index_offset=0)
  return one_body + 2.0 * lam * pair
