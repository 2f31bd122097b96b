r"""The paper's synthetic classification problem, as a pure keyed generator.

.. math::
   x ∼ N(0, I_p),\qquad
   f(x) = \sin(2x_1) + x_2 x_3 + \sin(x_4)\, x_5,\qquad
   y = \operatorname{sign}(f(x) + σ ε),\ ε ∼ N(0, 1),

with p ≥ 5: coordinates 6..p carry no signal (a learned kernel can learn to
ignore them; a fixed isotropic one cannot). ``NOISE_LEVELS`` is the paper's grid
σ ∈ logspace(−5, 5, 10). Labels are in {−1, +1} (sign(0) is taken as +1).

``make_classification_2d`` is the two-dimensional version for pictures (the
Colab notebook): f₂(x) = sin(2x₁) + x₁x₂, so particles and inputs share the plane.
"""

from typing import Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import _checks

NOISE_LEVELS = tuple(float(s) for s in np.logspace(-5, 5, 10))
"""σ ∈ logspace(−5, 5, 10), the paper's noise grid."""

MIN_DIM = 5


def target_function(x: jax.Array) -> jax.Array:
  """f(x) = sin(2x₁) + x₂x₃ + sin(x₄)x₅ for ``x: [..., p]``, p ≥ 5 → ``[...]``."""
  return jnp.sin(2.0 * x[..., 0]) + x[..., 1] * x[..., 2] + jnp.sin(x[..., 3]) * x[..., 4]


def make_classification(key: jax.Array, num_samples: int, dim: int,
                        noise: float) -> Tuple[jax.Array, jax.Array]:
  """Draws ``num_samples`` points: ``x: [n, dim]`` float32, ``y: [n]`` in {−1, +1}."""
  dim = _checks.check_int('dim', dim, MIN_DIM)
  num_samples = _checks.check_int('num_samples', num_samples, 1)
  if not float(noise) >= 0:
    raise ValueError(f'noise must be >= 0, got {noise!r}.')
  kx, ke = jax.random.split(key)
  x = jax.random.normal(kx, (num_samples, dim), jnp.float32)
  z = target_function(x) + noise * jax.random.normal(ke, (num_samples,), jnp.float32)
  return x, jnp.where(z >= 0, 1.0, -1.0).astype(jnp.float32)


def target_function_2d(x: jax.Array) -> jax.Array:
  """f₂(x) = sin(2x₁) + x₁x₂ for ``x: [..., 2]`` → ``[...]``."""
  return jnp.sin(2.0 * x[..., 0]) + x[..., 0] * x[..., 1]


def make_classification_2d(key: jax.Array, num_samples: int,
                           noise: float) -> Tuple[jax.Array, jax.Array]:
  """The 2-D version: ``x: [n, 2]`` ~ N(0, I₂), ``y = sign(f₂(x) + σε)`` in {−1, +1}."""
  num_samples = _checks.check_int('num_samples', num_samples, 1)
  if not float(noise) >= 0:
    raise ValueError(f'noise must be >= 0, got {noise!r}.')
  kx, ke = jax.random.split(key)
  x = jax.random.normal(kx, (num_samples, 2), jnp.float32)
  z = target_function_2d(x) + noise * jax.random.normal(ke, (num_samples,), jnp.float32)
  return x, jnp.where(z >= 0, 1.0, -1.0).astype(jnp.float32)


def make_splits(key: jax.Array, *, num_train: int, num_val: int, num_test: int, dim: int,
                noise: float) -> Dict[str, Tuple[jax.Array, jax.Array]]:
  """Independent train / validation / test draws (``fold_in`` 0, 1, 2 of ``key``)."""
  sizes = {'train': num_train, 'val': num_val, 'test': num_test}
  return {name: make_classification(jax.random.fold_in(key, i), size, dim, noise)
          for i, (name, size) in enumerate(sizes.items())}
