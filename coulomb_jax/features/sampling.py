"""Samplers of the particles: i.i.d. Gaussian and block-orthogonal (FAVOR+)."""

import jax
import jax.numpy as jnp

from coulomb_jax import _checks


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
