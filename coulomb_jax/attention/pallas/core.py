"""What the bidirectional and the causal Pallas kernels share: block sizes, dots, plumbing.

* ``PALLAS_FEATURE_MAPS``: the maps the kernels compute (``features.log_psi``'s
  log-space maps), and ``NEG``, the finite −∞ of masked logits and empty maxima;
* ``dot`` / ``project``: 2-D products accumulated in float32 (``project`` is the
  exponent s = x ωᵀ of most maps, never with bf16 operands);
* ``kernel_inputs``, ``pad_rows``: q, k, v as the kernels read them (float32 or
  wider in interpret mode), the key mask as int32, rows padded to whole blocks;
* ``power_of_two``, ``feature_block``, ``triton_problem``: the checked block sizes
  (``block_f`` defaults to gcd(M, 64)) and Triton's shape rules (every matrix side a
  power of two ≥ 16), checked before anything is lowered;
* ``by_platform``: interpret mode or the compiled kernels, decided by the platform the
  program is lowered for (``interpret=None``: Triton for cuda, the Mosaic kernels of
  ``tpu`` for tpu or a one-line error where there are none, interpreted for cpu and the
  rest), not by the host;
* ``with_xla_gradients``: the kernels when evaluated, the XLA path under ``grad``
  (the kernels have no backward).
"""

import functools
import math
from typing import Optional

import jax
from jax.extend import core as jax_core
from jax.interpreters import batching
from jax.interpreters import mlir
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


def project(x, omega, precision=None):
  """s = x ωᵀ in float32: the exponent of most maps, so never with bf16 operands.

  ``precision`` (a ``jax.lax.Precision``) when given; else for float32 inputs the
  backend's default float32 dot (on recent NVIDIA GPUs Triton lowers it to TF32, as
  XLA's default precision does for the reference path), and for 16-bit inputs TF32
  explicitly; the particles stay float32, so they are not rounded to bf16.
  """
  if precision is None and x.dtype.itemsize < 4:
    precision = jax.lax.Precision.HIGH
  return dot(x.astype(jnp.float32), omega, trans_b=True, precision=precision)


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


TRITON_MIN_SIDE = 16
"""Triton's smallest dot: every side of a matrix product at least 16 (and a power of two)."""


def triton_problem(sides) -> Optional[str]:
  """The first of Triton's shape rules that ``sides`` break, as a sentence, or None.

  ``sides``: ``(name, value)`` pairs, every value a side of a matrix product in the
  kernels (block rows, head dims, feature blocks), so each must be a power of two
  ≥ ``TRITON_MIN_SIDE``. Sizes that break it lower fine and would fail only when the
  GPU compiles the kernel, with an error from deep inside Triton; this names them first.
  """
  for name, value in sides:
    if value < TRITON_MIN_SIDE or value & (value - 1):
      return (f'{name} = {value} must be a power of two >= {TRITON_MIN_SIDE} for the '
              f'compiled (Triton) kernels: every side of a matrix product in them is '
              f'(Triton\'s smallest dot is 16 × 16)')
  return None


_refuse_p = jax_core.Primitive('coulomb_jax_no_kernel')
_refuse_p.def_abstract_eval(lambda x, *, message: x)


def _refuse_lowering(ctx, x, *, message):
  del x
  platforms = getattr(getattr(ctx, 'module_context', None), 'platforms', None) or ('?',)
  raise ValueError(f'{message} (lowering for {", ".join(platforms)}).')


mlir.register_lowering(_refuse_p, _refuse_lowering)
# Under vmap every branch of the platform switch is batched, the refusal too.
batching.primitive_batchers[_refuse_p] = (
    lambda args, dims, *, message: (_refuse_p.bind(*args, message=message), dims[0]))


def _refusal(out, message):
  """A branch that traces to ``out``'s shape and raises ``ValueError(message)`` if lowered."""
  return lambda *args: _refuse_p.bind(jnp.zeros(out.shape, out.dtype), message=message)


def check_compilable(interpret, what, problem) -> None:
  """``interpret=False`` with a broken shape rule (``triton_problem``): one ValueError now."""
  if interpret is False and problem is not None:
    raise ValueError(f'{what}: {problem}; interpret=True runs any size.')


def by_platform(run, args, out, interpret, what, problem, tpu_run=None, no_tpu_kernel=None):
  """``run(interpret, *args)`` with the interpret decision made by the lowering platform.

  * ``interpret=True``: interpret mode everywhere (plain XLA ops; slow, any platform).
  * ``interpret=False``: the compiled Triton kernels (``check_compilable`` first);
    lowering for anything but cuda raises a ValueError naming ``what``.
  * ``interpret=None``: decided by ``jax.lax.platform_dependent``, so by the platform
    the program is lowered for, not the host: compiled for cuda (``problem``, a broken
    shape rule, raised when lowered for cuda), the TPU (Mosaic) kernels
    ``tpu_run(False, *args)`` for tpu, or where there are none (``tpu_run`` None) a
    one-line error naming ``what`` and why (``no_tpu_kernel``), and interpret mode for
    cpu and every other platform.

  ``out``: the result's ``ShapeDtypeStruct``; ``what``: the call, for the messages.
  """
  if interpret:
    return run(True, *args)
  compiled = lambda *a: run(False, *a)
  if problem is not None:
    check_compilable(interpret, what, problem)
    compiled = _refusal(out, f'{what}: {problem}; interpret=True runs any size')
  if interpret is None:
    if tpu_run is None:
      tpu = _refusal(out, f'{what}: no TPU kernel ({no_tpu_kernel}); use '
                          f'implementation=\'xla\' or \'auto\' (XLA on TPU), or interpret=True')
    else:
      tpu = lambda *a: tpu_run(False, *a)
    return jax.lax.platform_dependent(*args, cuda=compiled, tpu=tpu,
                                      default=lambda *a: run(True, *a))
  only_cuda = (f'{what}: interpret=False compiles the Triton kernels, which lower only for '
               f'cuda; use interpret=None (decided by the platform) or True')
  return jax.lax.platform_dependent(*args, cuda=compiled, default=_refusal(out, only_cuda))


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
