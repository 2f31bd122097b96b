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
"""

from typing import Optional

import jax
import jax.numpy as jnp

from coulomb_jax import _checks

DEFAULT_EPS = 1e-6
"""Guard of the attention denominator: max(φ(q)ᵀΣφ(k), eps)."""

IMPLEMENTATIONS = ('auto', 'xla', 'pallas')
"""``fused_linear_attention``'s paths (see its docstring)."""


def _check(q_feat, k_feat, v, key_mask):
  for name, a in (('q_feat', q_feat), ('k_feat', k_feat), ('v', v)):
    _checks.check_rank(name, a, 4)
  if q_feat.shape[:3] != k_feat.shape[:3] or q_feat.shape[3] != k_feat.shape[3]:
    raise ValueError(f'q_feat and k_feat must have the same shape [B, L, H, F], got '
                     f'{q_feat.shape} and {k_feat.shape}.')
  if v.shape[:3] != k_feat.shape[:3]:
    raise ValueError(f'v must be [B, L, H, D] with [B, L, H] = {k_feat.shape[:3]}, got '
                     f'{v.shape}.')
  if key_mask is not None and key_mask.shape != k_feat.shape[:2]:
    raise ValueError(f'key_mask must have shape [B, L] = {k_feat.shape[:2]}, got '
                     f'{key_mask.shape}.')


def _prepare(q_feat, k_feat, v, key_mask):
  """Promotes to float32 (or wider) and zeroes padded keys and values.

  ``where`` rather than a product, so NaN in padding never leaks.
  """
  dtype = jnp.promote_types(jnp.result_type(q_feat, k_feat, v), jnp.float32)
  q_feat, k_feat, v = (a.astype(dtype) for a in (q_feat, k_feat, v))
  if key_mask is None:
    return q_feat, k_feat, v
  m = key_mask[:, :, None, None]
  return q_feat, jnp.where(m, k_feat, 0), jnp.where(m, v, 0)


def linear_attention(q_feat: jax.Array, k_feat: jax.Array, v: jax.Array,
                     key_mask: Optional[jax.Array] = None, *,
                     eps: float = DEFAULT_EPS) -> jax.Array:
  r"""Bidirectional linear attention, ``[B, L, H, D]``.

  Args:
    q_feat: ``[B, L, H, F]`` query features φ(q) (non-negative).
    k_feat: ``[B, L, H, F]`` key features φ(k).
    v: ``[B, L, H, D]`` values.
    key_mask: optional ``[B, L]`` bool, True for real tokens.
    eps: denominator guard.
  """
  _check(q_feat, k_feat, v, key_mask)
  out_dtype = v.dtype
  q_feat, k_feat, v = _prepare(q_feat, k_feat, v, key_mask)
  kv = jnp.einsum('blhf,blhd->bhfd', k_feat, v)                        # [B, H, F, D]
  z = jnp.sum(k_feat, axis=1)                                           # [B, H, F]
  num = jnp.einsum('blhf,bhfd->blhd', q_feat, kv)
  den = jnp.einsum('blhf,bhf->blh', q_feat, z)
  return (num / jnp.maximum(den, eps)[..., None]).astype(out_dtype)


def causal_linear_attention(q_feat: jax.Array, k_feat: jax.Array, v: jax.Array,
                            key_mask: Optional[jax.Array] = None, *,
                            chunk_size: int = 64, eps: float = DEFAULT_EPS) -> jax.Array:
  r"""Causal linear attention, ``[B, L, H, D]``: out_i uses keys j ≤ i only.

  Chunked prefix sums: the sequence is cut into chunks of C tokens; within a
  chunk the C×C causal part is computed explicitly, across chunks a running
  state S = Σ φ(k_j) v_jᵀ (``[B, H, F, D]``) and z = Σ φ(k_j) is carried by
  ``lax.scan``. Memory O(L·(F + D) + C² + F·D), time O(L·(C·(F + D) + F·D)).

  Args: as ``linear_attention``, plus ``chunk_size`` C ≥ 1 (L need not be a
  multiple of it: the tail is padded with masked keys).
  """
  _check(q_feat, k_feat, v, key_mask)
  chunk = _checks.check_int('chunk_size', chunk_size, 1)
  b, length, h, f = q_feat.shape
  d, out_dtype = v.shape[-1], v.dtype
  if key_mask is None:
    key_mask = jnp.ones((b, length), bool)
  pad = (-length) % chunk
  if pad:
    widths = ((0, 0), (0, pad), (0, 0), (0, 0))
    q_feat, k_feat, v = (jnp.pad(a, widths) for a in (q_feat, k_feat, v))
    key_mask = jnp.pad(key_mask, ((0, 0), (0, pad)))
  q_feat, k_feat, v = _prepare(q_feat, k_feat, v, key_mask)
  n = (length + pad) // chunk
  # [n, B, C, H, ·]: the chunk axis first, for the scan.
  to_chunks = lambda a: jnp.moveaxis(a.reshape(b, n, chunk, h, a.shape[-1]), 1, 0)
  qc, kc, vc = to_chunks(q_feat), to_chunks(k_feat), to_chunks(v)
  tril = jnp.tril(jnp.ones((chunk, chunk), bool))

  def step(carry, inputs):
    s, z = carry                                          # [B, H, F, D], [B, H, F]
    q, k, val = inputs                                    # [B, C, H, ·]
    scores = jnp.where(tril, jnp.einsum('bihf,bjhf->bhij', q, k), 0.0)   # [B, H, C, C]
    num = jnp.einsum('bhij,bjhd->bihd', scores, val) + jnp.einsum('bihf,bhfd->bihd', q, s)
    den = (jnp.sum(scores, axis=-1).transpose(0, 2, 1)
           + jnp.einsum('bihf,bhf->bih', q, z))
    out = num / jnp.maximum(den, eps)[..., None]
    s = s + jnp.einsum('bjhf,bjhd->bhfd', k, val)
    z = z + jnp.sum(k, axis=1)
    return (s, z), out.astype(out_dtype)

  init = (jnp.zeros((b, h, f, d), q_feat.dtype), jnp.zeros((b, h, f), q_feat.dtype))
  _, out = jax.lax.scan(step, init, (qc, kc, vc))
  out = jnp.moveaxis(out, 0, 1).reshape(b, n * chunk, h, d)
  return out[:, :length]


def check_fused_inputs(q, k, v, omega, key_mask, feature_map, maps) -> None:
  """One clear error for bad inputs of the fused paths (shapes as in their docstrings)."""
  for name, a in (('q', q), ('k', k), ('v', v)):
    _checks.check_rank(name, a, 4)
  _checks.check_rank('omega', omega, 3)
  if q.shape != k.shape or v.shape[:3] != q.shape[:3]:
    raise ValueError(f'q, k must be [B, L, H, d] and v [B, L, H, D] with the same [B, L, H], '
                     f'got {q.shape}, {k.shape} and {v.shape}.')
  b, length, h, dim = q.shape
  if omega.shape[0] != h or omega.shape[2] != dim:
    raise ValueError(f'omega must be [H, M, d] = [{h}, M, {dim}], got {omega.shape}.')
  if feature_map not in maps:
    raise ValueError(f'feature_map must be one of {tuple(maps)}, got {feature_map!r}.')
  if key_mask is not None and key_mask.shape != (b, length):
    raise ValueError(f'key_mask must have shape [B, L] = {(b, length)}, got {key_mask.shape}.')


def fused_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, omega: jax.Array, *,
                           feature_map: str = 'favor', key_mask: Optional[jax.Array] = None,
                           chunk_size: int = 1024, eps: float = DEFAULT_EPS,
                           implementation: str = 'auto') -> jax.Array:
  r"""Bidirectional linear attention that never stores the ``[B, L, H, M]`` features.

  Same result as ``linear_attention(φ(q), φ(k), v, key_mask)`` with φ the
  per-head map of ``omega`` (``favor`` stabilised as ``features.favor_pair``
  does: per key feature over real keys, and per query row), but L is cut into
  chunks of C tokens and φ is computed inside each chunk:

  * keys: a ``lax.scan`` over chunks accumulates S = Σ_j φ(k_j) v_jᵀ
    ``[B, H, F, D]`` and z = Σ_j φ(k_j) ``[B, H, F]`` (F = M, or 2M for
    ``softmaxfeat``). For ``favor`` the
    stabiliser is an online max per feature (as in flash attention): row f
    of S and z is rescaled by e^{m_f,old − m_f,new} when a chunk raises the
    running max m_f, so the final shift is the max over all real keys,
    exactly the unfused one; the queries add m_f to their logits;
  * queries: ``lax.map`` over chunks, out = φ(q) S / max(φ(q)ᵀ z, eps).

  Both bodies are ``jax.checkpoint``-ed, so the backward pass recomputes a
  chunk's features instead of keeping them: memory O(B·H·(C·M + M·D)) beyond
  the inputs and outputs, instead of O(B·L·H·M); time unchanged, O(L·M·D).

  Args:
    q, k: ``[B, L, H, d]`` queries and keys, already scaled (e.g. by d^{−1/4}).
    v: ``[B, L, H, D]`` values.
    omega: ``[H, M, d]`` particles, one set per head.
    feature_map: a name in ``features.ATTENTION_FEATURE_MAPS``.
    key_mask: optional ``[B, L]`` bool, True for real tokens.
    chunk_size: C ≥ 1; L need not be a multiple of it.
    eps: denominator guard.
    implementation: ``'xla'`` (the chunked path above), ``'pallas'``
      (``pallas_attention.pallas_linear_attention``: two GPU kernels for the
      forward pass, interpret mode elsewhere; ``chunk_size`` unused) or
      ``'auto'``: the kernels where ``pallas_attention.use_by_default`` says
      so (a single-device GPU, a supported map and shape, kernels that
      compile), else ``'xla'``.
  """
  from coulomb_jax import features  # pylint: disable=g-import-not-at-top
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f'implementation must be one of {IMPLEMENTATIONS}, got '
                     f'{implementation!r}.')
  check_fused_inputs(q, k, v, omega, key_mask, feature_map, features.ATTENTION_FEATURE_MAPS)
  chunk = _checks.check_int('chunk_size', chunk_size, 1)
  b, length, h, dim = q.shape
  d_v, out_dtype = v.shape[-1], v.dtype
  if implementation == 'pallas' or (implementation == 'auto'
                                    and jax.default_backend() == 'gpu'):
    from coulomb_jax import pallas_attention  # pylint: disable=g-import-not-at-top
    if implementation == 'pallas' or pallas_attention.use_by_default(q, k, v, omega,
                                                                    feature_map, key_mask):
      return pallas_attention.pallas_linear_attention(q, k, v, omega, feature_map=feature_map,
                                                      key_mask=key_mask, eps=eps)
  if key_mask is None:
    key_mask = jnp.ones((b, length), bool)
  chunk = min(chunk, length)
  pad = (-length) % chunk
  dtype = jnp.promote_types(jnp.result_type(q, k, v), jnp.float32)
  q, k, v, omega = (a.astype(dtype) for a in (q, k, v, omega))
  if pad:
    widths = ((0, 0), (0, pad), (0, 0), (0, 0))
    q, k, v = (jnp.pad(a, widths) for a in (q, k, v))
    key_mask = jnp.pad(key_mask, ((0, 0), (0, pad)))
  n = (length + pad) // chunk
  to_chunks = lambda a: jnp.moveaxis(a.reshape((b, n, chunk) + a.shape[2:]), 1, 0)
  num_features = omega.shape[1]
  is_favor = feature_map == 'favor'
  fmap = jax.vmap(features.get_feature_map(feature_map), in_axes=(2, 0), out_axes=2)

  def log_favor(x):                                       # [B, C, H, d] -> [B, C, H, M]
    return (jnp.einsum('bchd,hmd->bchm', x, omega)
            - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True))

  @jax.checkpoint
  def key_step(carry, inputs):
    s, z, m = carry                       # [B, H, M, D], [B, H, M], [B, H, M] (running max)
    kc, vc, mc = inputs                   # [B, C, H, d], [B, C, H, D], [B, C]
    keep = mc[:, :, None, None]
    vc = jnp.where(keep, vc, 0.0)
    if is_favor:
      logits = jnp.where(keep, log_favor(kc), -jnp.inf)
      chunk_max = jnp.max(logits, axis=1)                                  # [B, H, M]
      m_new = jax.lax.stop_gradient(jnp.maximum(m, chunk_max))
      m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
      rescale = jnp.where(jnp.isfinite(m), jnp.exp(m - m_safe), 0.0)
      phi = jnp.exp(logits - m_safe[:, None]) / jnp.sqrt(float(num_features))
      s = s * rescale[..., None]
      z = z * rescale
    else:
      phi = jnp.where(keep, fmap(kc, omega), 0.0)
      m_new = m
    s = s + jnp.einsum('bchm,bchd->bhmd', phi, vc)
    z = z + jnp.sum(phi, axis=1)
    return (s, z, m_new), None

  # F: the number of features per head (2M for softmaxfeat's [s, −s]).
  f_out = (num_features if is_favor else
           jax.eval_shape(fmap, jax.ShapeDtypeStruct((1, 1, h, dim), dtype), omega).shape[-1])
  init = (jnp.zeros((b, h, f_out, d_v), dtype), jnp.zeros((b, h, f_out), dtype),
          jnp.full((b, h, f_out), -jnp.inf, dtype))
  (s, z, m), _ = jax.lax.scan(key_step, init, (to_chunks(k), to_chunks(v), to_chunks(key_mask)))
  m = jnp.where(jnp.isfinite(m), m, 0.0)                  # favor's per-feature key shift

  @jax.checkpoint
  def query_step(qc):                                     # [B, C, H, d] -> [B, C, H, D]
    if is_favor:
      logits = log_favor(qc) + m[:, None]
      logits = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
      phi = jnp.exp(logits) / jnp.sqrt(float(num_features))
    else:
      phi = fmap(qc, omega)
    num = jnp.einsum('bchm,bhmd->bchd', phi, s)
    den = jnp.einsum('bchm,bhm->bch', phi, z)
    return num / jnp.maximum(den, eps)[..., None]

  out = jax.lax.map(query_step, to_chunks(q))            # [n, B, C, H, D]
  out = jnp.moveaxis(out, 0, 1).reshape(b, n * chunk, h, d_v)
  return out[:, :length].astype(out_dtype)
