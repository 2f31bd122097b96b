r"""Bidirectional linear attention as Pallas TPU (Mosaic) kernels: ``tpu_kernels``.

The TPU counterpart of ``bidirectional``'s two Triton kernels, for the six separable maps
(``TPU_FEATURE_MAPS``; ``softmaxfeat``'s per-row softmax couples the features and has no
TPU kernel). ``pallas_linear_attention(interpret=None)`` runs it when the program is
lowered for tpu (``core.by_platform``); it has never run on a TPU (lowered from a CPU
and run in interpret mode only).

Layout ``[B, H, L, ·]`` (transposed from ``[B, L, H, ·]`` outside the kernels); the row
blocks C are multiples of 128 (L is padded to whole blocks and the padding masked), and
all M features of a head are one block. Why this layout, and its VMEM size:
docs/performance.md#attentionpallastpu.

1. **keys**, grid ``[B, H, L/C]``, the last axis sequential (``'arbitrary'``): S ``[M, D]``,
   z and the per-feature shifts m ``[M, 1]`` stay resident in the output blocks while the
   program walks its (batch, head)'s key blocks; per block, from the transposed
   log-features ℓ = log ψ(ω kᵀ) ``[M, C]``, m rises online and rescales S and z
   as in flash attention, so the final shift of feature f is its max over all real keys:
   ``features.attention_pair``'s.
2. **queries**, grid ``[B, H, L/C]``: out = φ(q) S / max(φ(q)ᵀ z, eps) with
   φ(q) = e^{ℓ(q) + m − M_i}·scale, M_i the row max (it cancels).

Masking: padded keys get ℓ = −1e30 (``core.NEG``) and zero values (set outside the
kernel, so NaN padding is never read). ``precision`` reaches every product; None is the
backend's default, on TPU one bf16 pass for float32 products.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coulomb_jax import features
from coulomb_jax.attention.pallas import core

TPU_FEATURE_MAPS = ('favor', 'elu', 'softplus', 'sigmoid2', 'cos2', 'porf_softplus')
"""The maps the TPU kernels compute (``softmaxfeat`` has none: a one-line error)."""

TPU_BLOCK = 128
"""Rows C of the key and query blocks: the TPU rule's 128 lanes (the key rows of the
transposed log-features are lanes)."""


def _key_kernel(k_ref, v_ref, row_ref, omega_ref, s_ref, z_ref, m_ref, *, name, scale,
                precision):
  """One (b, h, key block j): S ``[M, D]``, z, m ``[M, 1]`` updated in place (j sequential)."""
  @pl.when(pl.program_id(2) == 0)
  def _():
    s_ref[...] = jnp.zeros(s_ref.shape, jnp.float32)
    z_ref[...] = jnp.zeros(z_ref.shape, jnp.float32)
    m_ref[...] = jnp.full(m_ref.shape, core.NEG, jnp.float32)

  k = k_ref[...].astype(jnp.float32)                       # [C, d]
  row = row_ref[...]                                       # [2, C]: real key, ‖k‖²/2
  keep = row[0:1, :] > 0.5                                 # [1, C]
  s_t = core.dot(omega_ref[...], k, trans_b=True, precision=precision)       # [M, C]
  logits = jnp.where(keep, features.log_psi(name, s_t, row[1:2, :]), core.NEG)
  m_old = m_ref[...]                                       # [M, 1]
  m_new = jnp.maximum(m_old, jnp.max(logits, axis=1, keepdims=True))
  decay = jnp.exp(m_old - m_new)
  phi = jnp.where(keep, jnp.exp(logits - m_new) * scale, 0.0)               # [M, C]
  v = v_ref[...]
  s_ref[...] = s_ref[...] * decay + core.dot(phi.astype(v.dtype), v, precision=precision)
  z_ref[...] = z_ref[...] * decay + jnp.sum(phi, axis=1, keepdims=True)
  m_ref[...] = m_new


def _query_kernel(q_ref, omega_ref, s_ref, z_ref, m_ref, o_ref, *, name, scale, eps,
                  precision):
  """One (b, h, query block): out = φ(q) S / max(φ(q)ᵀ z, eps), ``[C, D]``."""
  q = q_ref[...].astype(jnp.float32)                       # [C, d]
  half = 0.5 * jnp.sum(q * q, axis=1, keepdims=True)       # [C, 1]
  s = core.dot(q, omega_ref[...], trans_b=True, precision=precision)        # [C, M]
  logits = features.log_psi(name, s, half) + m_ref[...]    # + the keys' shifts [1, M]
  phi = jnp.exp(logits - jnp.max(logits, axis=1, keepdims=True)) * scale
  num = core.dot(phi, s_ref[...], precision=precision)     # [C, D]
  den = jnp.sum(phi * z_ref[...], axis=1, keepdims=True)   # [C, 1]
  o_ref[...] = (num / jnp.maximum(den, eps)).astype(o_ref.dtype)


def tpu_kernels(q, k, v, omega, key_mask, *, name, eps, interpret, precision):
  """``pallas_linear_attention``'s result from the two TPU kernels, ``[B, L, H, D]``.

  Inputs as ``pallas_linear_attention``'s (already checked; ``name`` in
  ``TPU_FEATURE_MAPS``); ``interpret``: Pallas interpret mode (tests on CPU).
  """
  b, length, h, _ = q.shape
  d_v, num = v.shape[-1], omega.shape[1]
  out_dtype = v.dtype
  q, k, v, mask = core.kernel_inputs(q, k, v, key_mask, interpret)
  padded = pl.cdiv(length, TPU_BLOCK) * TPU_BLOCK
  real = core.pad_rows(mask, padded) > 0                                   # [B, L]
  heads_first = lambda a: jnp.swapaxes(core.pad_rows(a, padded), 1, 2)     # [B, H, L, ·]
  keep = real[:, None, :, None]
  k_t = jnp.where(keep, heads_first(k), 0)     # padded keys and values are never read
  v_t = jnp.where(keep, heads_first(v), 0)
  kf = k_t.astype(jnp.float32)
  rows = jnp.stack([jnp.broadcast_to(real[:, None, :], (b, h, padded)).astype(jnp.float32),
                    0.5 * jnp.sum(kf * kf, axis=-1)], axis=2)              # [B, H, 2, L]
  omega = omega.astype(jnp.float32)
  scale = 1.0 / math.sqrt(num)
  grid = (b, h, padded // TPU_BLOCK)
  block = lambda width: pl.BlockSpec((None, None, TPU_BLOCK, width), lambda i, j, c: (i, j, c, 0))
  whole = lambda *shape: pl.BlockSpec((None, None) + shape, lambda i, j, c: (i, j, 0, 0))
  omega_spec = pl.BlockSpec((None, num, omega.shape[-1]), lambda i, j, c: (j, 0, 0))
  state = lambda *shape: jax.ShapeDtypeStruct((b, h) + shape, jnp.float32)
  s, z, m = pl.pallas_call(
      functools.partial(_key_kernel, name=name, scale=scale, precision=precision),
      grid=grid,
      in_specs=[block(k_t.shape[-1]), block(d_v),
                pl.BlockSpec((None, None, 2, TPU_BLOCK), lambda i, j, c: (i, j, 0, c)),
                omega_spec],
      out_specs=[whole(num, d_v), whole(num, 1), whole(num, 1)],
      out_shape=[state(num, d_v), state(num, 1), state(num, 1)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'parallel', 'arbitrary')),
      interpret=interpret)(k_t, v_t, rows, omega)
  m = jnp.where(m > 0.5 * core.NEG, m, 0.0)               # no real key at all: shift 0
  out = pl.pallas_call(
      functools.partial(_query_kernel, name=name, scale=scale, eps=eps, precision=precision),
      grid=grid,
      in_specs=[block(q.shape[-1]), omega_spec, whole(num, d_v), whole(1, num),
                whole(1, num)],
      out_specs=block(d_v),
      out_shape=jax.ShapeDtypeStruct((b, h, padded, d_v), out_dtype),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'parallel', 'parallel')),
      interpret=interpret)(heads_first(q), omega, s, jnp.swapaxes(z, 2, 3),
                           jnp.swapaxes(m, 2, 3))
  return jnp.swapaxes(out, 1, 2)[:, :length]
