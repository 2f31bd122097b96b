"""What the bidirectional and the causal Pallas kernels share: block sizes, dots, plumbing.

* ``PALLAS_FEATURE_MAPS``: the maps the kernels compute (``features.log_psi``'s
  log-space maps), and ``NEG``, the finite −∞ of masked logits and empty maxima;
* ``dot`` / ``project``: 2-D products accumulated in float32 (``project`` is the
  exponent s = x ωᵀ of most maps, never with bf16 operands);
* ``kernel_inputs``, ``pad_rows``: q, k, v as the kernels read them (float32 or
  wider in interpret mode), the key mask as int32, rows padded to whole blocks;
* ``power_of_two``, ``feature_block``, ``default_interpret``: the checked block
  sizes (``block_f`` defaults to gcd(M, 64)) and the interpret-mode default (on
  unless the default backend is a GPU);
* ``with_xla_gradients``: the kernels when evaluated, the XLA path under ``grad``
  (the kernels have no backward).
"""

import functools
import math

import jax
import jax.numpy as jnp

from coulomb_jax import _checks

PALLAS_FEATURE_MAPS = ('favor', 'elu', 'softplus', 'sigmoid2', 'cos2', 'softmaxfeat',
                       'porf_softplus')
"""The maps ``pallas_linear_attention`` and ``pallas_causal_linear_attention`` compute
inside their kernels."""

NEG = -1e30  # Finite "minus infinity" for masked logits and empty running maxima.


def dot(a, b, trans_a=False, trans_b=False, precision=None):
  """2-D a @ b (either side transposed) accumulated in float32."""
  dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
  return jax.lax.dot_general(a, b, dims, precision=precision,
                             preferred_element_type=jnp.float32)


def project(x, omega):
  """s = x ωᵀ in float32: the exponent of most maps, so never with bf16 operands.

  Float32 inputs: the backend's default float32 dot (on recent NVIDIA GPUs Triton
  lowers it to TF32, as XLA's default precision does for the reference path).
  16-bit inputs: TF32 explicitly; the particles stay float32, so they are not
  rounded to bf16.
  """
  fast = x.dtype.itemsize < 4
  return dot(x.astype(jnp.float32), omega, trans_b=True,
             precision=jax.lax.Precision.HIGH if fast else None)


def kernel_inputs(q, k, v, key_mask, interpret):
  """``(q, k, v, mask)`` as the kernels read them: ``mask`` ``[B, L]`` int32 (1 = real key).

  In interpret mode q, k, v are promoted to at least float32: XLA's CPU backend
  has no bf16 × bf16 → f32 dot.
  """
  b, length = q.shape[:2]
  if interpret:
    q, k, v = (a.astype(jnp.promote_types(a.dtype, jnp.float32)) for a in (q, k, v))
  mask = jnp.ones((b, length), jnp.int32) if key_mask is None else key_mask.astype(jnp.int32)
  return q, k, v, mask


def pad_rows(a, length):
  """``a`` ``[B, L, ...]`` zero-padded along axis 1 to ``length`` rows."""
  pad = length - a.shape[1]
  if not pad:
    return a
  return jnp.pad(a, ((0, 0), (0, pad)) + ((0, 0),) * (a.ndim - 2))


def power_of_two(name, value):
  """``value`` checked as a positive int and a power of two (Triton block shapes)."""
  value = _checks.check_int(name, value, 1)
  if value & (value - 1):
    raise ValueError(f'{name} must be a power of two (Triton block shapes), got {value}.')
  return value


def feature_block(block_f, num_particles):
  """``block_f`` checked: a power of two dividing M (None: gcd(M, 64), the largest up to 64)."""
  if block_f is None:
    block_f = math.gcd(num_particles, 64)
  block_f = power_of_two('block_f', block_f)
  if num_particles % block_f:
    raise ValueError(f'block_f must divide the number of particles M = {num_particles}, '
                     f'got {block_f}.')
  return block_f


def default_interpret(interpret):
  """``interpret``, or (None) whether the default backend is not a GPU."""
  if interpret is None:
    interpret = jax.default_backend() != 'gpu'
  return interpret


def with_xla_gradients(forward, reference):
  """``f(q, k, v, omega, key_mask, options)``: the kernels when evaluated, the XLA path
  under differentiation.

  ``forward(q, k, v, omega, key_mask, **options)`` runs the kernels;
  ``reference(q, k, v, omega, key_mask, options)`` is the XLA path. Under ``grad``
  the reference runs forward and backward: the kernels have no backward, and
  recomputing the output with them would cost more than it saves.
  """
  @functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
  def f(q, k, v, omega, key_mask, options):
    return forward(q, k, v, omega, key_mask, **dict(options))

  def f_fwd(q, k, v, omega, key_mask, options):
    return jax.vjp(lambda *a: reference(*a, key_mask, dict(options)), q, k, v, omega)

  def f_bwd(options, pullback, g):
    del options
    return tuple(pullback(g)) + (None,)

  f.defvjp(f_fwd, f_bwd)
  return f
