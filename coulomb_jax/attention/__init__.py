r"""Linear (kernel) attention with feature maps: bidirectional and causal.

With feature maps φ applied to queries and keys (any map of
``coulomb_jax.features``, learned or fixed particles),

.. math::
   \mathrm{out}_i = \frac{φ(q_i)ᵀ \sum_j φ(k_j) v_jᵀ}{φ(q_i)ᵀ \sum_j φ(k_j)}

costs O(L·F·D) time and O(L·(F + D) + F·D) memory instead of softmax
attention's O(L²). Shapes: ``q_feat, k_feat: [B, L, H, F]``, ``v: [B, L, H, D]``,
``key_mask: [B, L]`` (True for real tokens). Padded keys are removed from the
numerator *and* the denominator (and their values are never read, so NaN
padding is harmless); outputs at padded query positions are computed but
meaningless. Inputs are promoted to (at least) float32 before the contractions
(bf16 inputs included: XLA's CPU backend has no bf16×bf16→f32 dot), the
denominator is guarded by ``eps``, and the output has ``v``'s dtype.

Causal (no output depends on a later token, at any input scale, on every path):
``fused_causal_linear_attention(q, k, v, omega, feature_map=...)`` computes the features
from the particles chunk by chunk and is exact at any input scale for every map (what
``models.KernelAttention(causal=True)`` uses); ``materialized_causal_attention`` (same
arguments) materialises the L×L weights with per-token shifts; ``causal_linear_attention``
and ``materialized_causal_linear_attention`` take stored features and are causal when those
are per-token (not ``features.attention_pair``'s, whose key shift is a max over all keys).

Exact at any input scale: give ``linear_attention`` the features of
``features.attention_pair`` (every map shifted in log space, one shift per key
feature over the real keys and one per query row: common factors that cancel in
the ratio, and a denominator ≥ 1/M that the guard never reaches), or call
``fused_linear_attention`` (the same shifts, chunk by chunk or in the Pallas
kernels), which computes the features from the particles itself.

Precision: every path takes ``precision`` (``jax.lax.Precision``, ``'default'``,
``'high'``, ``'highest'`` or None) for all its matrix products. None, the default, is
the backend's: exact float32 on CPU, TF32 for float32 products on recent NVIDIA GPUs (XLA
and Triton), one bf16 pass on TPU; ``'highest'`` keeps float32 on every platform.
Path choice and where the accuracies hold: docs/performance.md#attention-package.

Three modules: ``xla`` holds the XLA implementations and checks,
``pallas`` the kernels (it imports ``xla``), and this module
the public entry points (re-exported from both) and the choice between them.
"""

from typing import Optional

import jax

from coulomb_jax import _checks
from coulomb_jax import features
from coulomb_jax.attention import pallas
from coulomb_jax.attention import xla
from coulomb_jax.attention.xla import (DEFAULT_EPS, PRECISIONS, causal_linear_attention,
                                       materialized_causal_linear_attention,
                                       check_fused_inputs, linear_attention)
from coulomb_jax.attention.xla import (
    xla_materialized_causal_attention as materialized_causal_attention)

__all__ = ['CAUSAL_PATHS', 'DEFAULT_EPS', 'IMPLEMENTATIONS', 'PRECISIONS', 'causal_linear_attention',
           'check_fused_inputs', 'fused_causal_linear_attention', 'fused_linear_attention',
           'linear_attention', 'materialized_causal_attention',
           'materialized_causal_linear_attention']

CAUSAL_PATHS = ('fused', 'materialized')
"""The causal paths a layer picks by name (``KernelAttention.causal_path``,
``flax_attention.kernel_attention_fn``): ``fused_causal_linear_attention`` (chunked, exact at
any input scale) or ``materialized_causal_attention`` (the L×L weights in matmuls)."""

IMPLEMENTATIONS = ('auto', 'xla', 'pallas')
"""``fused_linear_attention``'s and ``fused_causal_linear_attention``'s paths."""


def fused_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, omega: jax.Array, *,
                           feature_map: str = 'favor', key_mask: Optional[jax.Array] = None,
                           chunk_size: int = 1024, eps: float = DEFAULT_EPS,
                           implementation: str = 'auto', precision=None) -> jax.Array:
  r"""Bidirectional linear attention that never stores the ``[B, L, H, M]`` features.

  Same result as ``linear_attention(φ(q), φ(k), v, key_mask)`` with
  ``φ(q), φ(k) = features.attention_pair(q, k, ω_h, feature_map, key_mask)`` per
  head (every map stabilised in log space: per key feature over real keys, and
  per query row), but L is cut into chunks of C tokens and φ is computed inside
  each chunk:

  * keys: a ``lax.scan`` over chunks accumulates S = Σ_j φ(k_j) v_jᵀ
    ``[B, H, F, D]`` and z = Σ_j φ(k_j) ``[B, H, F]`` (F = M, or 2M for
    ``softmaxfeat``). The shift of feature f is an online max (as in flash
    attention): row f of S and z is rescaled by e^{m_f,old − m_f,new} when a
    chunk raises the running max m_f, so the final shift is the max over all
    real keys, exactly the unfused one; the queries add m_f to their log-features;
  * queries: ``lax.map`` over chunks, out = φ(q) S / max(φ(q)ᵀ z, eps).

  Both bodies are ``jax.checkpoint``-ed, so the backward pass recomputes a
  chunk's features instead of keeping them: memory O(B·H·(C·M + M·D)) beyond
  the inputs and outputs, instead of O(B·L·H·M); time unchanged, O(L·M·D).

  Args:
    q, k: ``[B, L, H, d]`` queries and keys, already scaled (e.g. by d^{−1/4}).
    v: ``[B, L, H, D]`` values.
    omega: ``[H, M, d]`` particles, one set per head.
    feature_map: a name in ``features.KERNEL_ATTENTION_MAPS``.
    key_mask: optional ``[B, L]`` bool, True for real tokens.
    chunk_size: C ≥ 1; L need not be a multiple of it.
    eps: denominator guard, > 0.
    implementation: ``'xla'`` (the chunked path above,
      ``xla.xla_fused_linear_attention``), ``'pallas'``
      (``pallas.pallas_linear_attention``: two kernels for the forward pass,
      Triton for cuda, Mosaic for tpu, interpret mode elsewhere; ``chunk_size`` unused) or
      ``'auto'``: decided by the platform the program is lowered for
      (``jax.lax.platform_dependent``), not by the host: the kernels for cuda when the
      map and shape suit them (``pallas.shape_supported``: M a multiple of
      64, d and D powers of two ≥ 16; and, on a GPU host,
      ``pallas.use_by_default``: one device, kernels that compile), ``'xla'``
      for CPU, TPU and everything else. (``'pallas'`` lowered for tpu takes the Mosaic
      kernels of ``pallas.tpu`` for six maps, never run on a TPU; for softmaxfeat it is a
      ValueError.) Why: docs/performance.md#what-has-and-has-not-run-on-a-device.
    precision: of every matrix product (``linear_attention``'s argument; None: the
      backend's default, TF32 for float32 on recent NVIDIA GPUs, bf16 passes on TPU).
  """
  _check_implementation(implementation)
  check_fused_inputs(q, k, v, omega, key_mask, feature_map, features.KERNEL_ATTENTION_MAPS)
  _checks.check_int('chunk_size', chunk_size, 1)
  xla.check_eps(eps)
  precision = xla.check_precision(precision)
  if implementation == 'pallas':
    return pallas.pallas_linear_attention(q, k, v, omega, feature_map=feature_map,
                                          key_mask=key_mask, eps=eps, precision=precision)
  masks = () if key_mask is None else (key_mask,)
  on_xla = lambda q, k, v, omega, *m: xla.xla_fused_linear_attention(
      q, k, v, omega, feature_map=feature_map, key_mask=m[0] if m else None,
      chunk_size=chunk_size, eps=eps, precision=precision)
  if implementation == 'xla' or not _auto_may_take_kernels(q, k, v, omega, feature_map,
                                                           key_mask):
    return on_xla(q, k, v, omega, *masks)
  kernels = lambda q, k, v, omega, *m: pallas.pallas_linear_attention(
      q, k, v, omega, feature_map=feature_map, key_mask=m[0] if m else None, eps=eps,
      interpret=False, precision=precision)
  # The platform the program is lowered for decides, not the host: a CPU host lowering
  # (or exporting) for cuda gets the kernels, CPU and TPU get the XLA path.
  return jax.lax.platform_dependent(q, k, v, omega, *masks, cuda=kernels, default=on_xla)


def _auto_may_take_kernels(q, k, v, omega, feature_map, key_mask) -> bool:
  """Whether ``'auto'`` offers the GPU kernels (static, at trace time).

  The map and the shape must suit the default blocks; on a GPU host also
  ``pallas.use_by_default`` (one device, kernels that compile). On any other
  host the kernels are offered to a cuda lowering only (``lax.platform_dependent``).
  """
  if jax.default_backend() == 'gpu':
    return pallas.use_by_default(q, k, v, omega, feature_map, key_mask)
  return pallas.shape_supported(q.shape, v.shape, omega.shape, feature_map)


def fused_causal_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, omega: jax.Array,
                                  *, feature_map: str = 'favor',
                                  key_mask: Optional[jax.Array] = None, chunk_size: int = 16,
                                  eps: float = DEFAULT_EPS, implementation: str = 'xla',
                                  precision=None) -> jax.Array:
  r"""Causal linear attention from the particles, ``[B, L, H, D]``: out_i sees j ≤ i.

  Args: as ``xla.xla_fused_causal_linear_attention`` (q, k ``[B, L, H, d]``,
  v ``[B, L, H, D]``, omega ``[H, M, d]``, key_mask ``[B, L]``, ``chunk_size`` C ≥ 1 of
  the XLA path, eps), plus:

    implementation: ``'xla'`` (default: the chunked path, exact at any input scale for
      every map; its docstring), ``'pallas'``
      (``pallas.pallas_causal_linear_attention`` with its default chunk of 64:
      one GPU kernel, interpreted on CPU, a ValueError when lowered for tpu; not exact at
      large inputs for favor, porf_softplus and softmaxfeat, and its gradient is the
      fused XLA path's) or ``'auto'``: decided by the platform the program is
      lowered for (``jax.lax.platform_dependent``), not the host, as
      ``fused_linear_attention``'s: the kernel for cuda when the map and shape suit it
      (``pallas.shape_supported``; on a GPU host also one device), the XLA
      path for CPU, TPU and the rest. The default stays ``'xla'`` because of the
      kernel's large-input caveat, and because it has never run on a GPU.
    precision: of every matrix product (``linear_attention``'s argument).
  """
  _check_implementation(implementation)
  precision = xla.check_precision(precision)
  on_xla = lambda q, k, v, omega, *m: xla.xla_fused_causal_linear_attention(
      q, k, v, omega, feature_map=feature_map, key_mask=m[0] if m else None,
      chunk_size=chunk_size, eps=eps, precision=precision)
  masks = () if key_mask is None else (key_mask,)
  if implementation == 'xla':
    return on_xla(q, k, v, omega, *masks)
  check_fused_inputs(q, k, v, omega, key_mask, feature_map, features.KERNEL_ATTENTION_MAPS)
  _checks.check_int('chunk_size', chunk_size, 1)
  xla.check_eps(eps)
  kernel = lambda interpret: lambda q, k, v, omega, *m: (
      pallas.pallas_causal_linear_attention(
          q, k, v, omega, feature_map=feature_map, key_mask=m[0] if m else None, eps=eps,
          interpret=interpret, precision=precision))
  if implementation == 'pallas':
    return kernel(None)(q, k, v, omega, *masks)
  one_device = jax.default_backend() != 'gpu' or jax.device_count() == 1
  if not (one_device and pallas.shape_supported(q.shape, v.shape, omega.shape, feature_map)):
    return on_xla(q, k, v, omega, *masks)
  return jax.lax.platform_dependent(q, k, v, omega, *masks, cuda=kernel(False), default=on_xla)


def _check_implementation(implementation) -> None:
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f'implementation must be one of {IMPLEMENTATIONS}, got '
                     f'{implementation!r}.')
