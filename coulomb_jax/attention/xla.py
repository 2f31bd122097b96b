r"""Linear attention in XLA: the materialised, causal and chunked (fused) paths.

What ``attention`` and ``pallas`` share (so neither imports the other's
module: ``attention`` → ``pallas`` → ``xla``): the input
checks, the denominator guard ``DEFAULT_EPS``, ``linear_attention``,
``causal_linear_attention`` and ``xla_fused_linear_attention``, the chunked path
that ``attention.fused_linear_attention`` takes without Pallas and whose
gradients the Pallas kernels use. Public names are re-exported by ``attention``;
see its docstring for the formulas and shapes.
"""

import math
from typing import Optional

import jax
import jax.numpy as jnp

from coulomb_jax import _checks
from coulomb_jax import features

DEFAULT_EPS = 1e-6
"""Guard of the attention denominator: max(φ(q)ᵀΣφ(k), eps). With the stabilised
features (``features.attention_pair``, the fused and Pallas paths) the denominator
is ≥ 1/M, so the guard only acts on rows without any real key."""


PRECISIONS = _checks.PRECISIONS


check_precision = _checks.check_precision   # one definition (coulomb_jax._checks)


def check_eps(eps) -> float:
  """eps > 0, a number (a traced eps passes)."""
  _checks.check_positive('eps', eps)
  return eps


def _check(q_feat, k_feat, v, key_mask, same_length=True):
  for name, a in (('q_feat', q_feat), ('k_feat', k_feat), ('v', v)):
    _checks.check_rank(name, a, 4)
  if not same_length and (q_feat.shape[0], q_feat.shape[2:]) != (k_feat.shape[0],
                                                                 k_feat.shape[2:]):
    raise ValueError(f'q_feat and k_feat must be [B, L_q, H, F] and [B, L_k, H, F], got '
                     f'{q_feat.shape} and {k_feat.shape}.')
  if same_length and q_feat.shape != k_feat.shape:
    raise ValueError(f'q_feat and k_feat must have the same shape [B, L, H, F], got '
                     f'{q_feat.shape} and {k_feat.shape}.')
  if v.shape[:3] != k_feat.shape[:3]:
    raise ValueError(f'v must be [B, L, H, D] with [B, L, H] = {k_feat.shape[:3]}, got '
                     f'{v.shape}.')
  if key_mask is not None and key_mask.shape != k_feat.shape[:2]:
    raise ValueError(f'key_mask must have shape [B, L] = {k_feat.shape[:2]}, got '
                     f'{key_mask.shape}.')


def _einsum(precision):
  """``jnp.einsum`` at ``precision`` (checked: ``check_precision``)."""
  precision = check_precision(precision)
  return lambda spec, *operands: jnp.einsum(spec, *operands, precision=precision)


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
                     eps: float = DEFAULT_EPS, precision=None) -> jax.Array:
  r"""Bidirectional linear attention, ``[B, L_q, H, D]`` (L_q = L_k for self-attention).

  Args:
    q_feat: ``[B, L_q, H, F]`` query features φ(q) (non-negative).
    k_feat: ``[B, L_k, H, F]`` key features φ(k).
    v: ``[B, L_k, H, D]`` values.
    key_mask: optional ``[B, L_k]`` bool, True for real keys.
    eps: denominator guard.
    precision: of every matrix product (``jax.lax.Precision``, one of ``PRECISIONS``,
      or None). None (default) is the backend's default: exact float32 on CPU, but
      TF32 (10-bit mantissa) for float32 products on recent NVIDIA GPUs (XLA and
      Triton alike) and a single bf16 pass on TPU, where the documented accuracy
      (measured on CPU) does not hold; ``'highest'`` keeps float32 there.
  """
  _check(q_feat, k_feat, v, key_mask, same_length=False)
  check_eps(eps)
  ein = _einsum(precision)
  out_dtype = v.dtype
  q_feat, k_feat, v = _prepare(q_feat, k_feat, v, key_mask)
  kv = ein('blhf,blhd->bhfd', k_feat, v)                               # [B, H, F, D]
  z = jnp.sum(k_feat, axis=1)                                           # [B, H, F]
  num = ein('blhf,bhfd->blhd', q_feat, kv)
  den = ein('blhf,bhf->blh', q_feat, z)
  return (num / jnp.maximum(den, eps)[..., None]).astype(out_dtype)


def causal_linear_attention(q_feat: jax.Array, k_feat: jax.Array, v: jax.Array,
                            key_mask: Optional[jax.Array] = None, *,
                            chunk_size: int = 64, eps: float = DEFAULT_EPS,
                            precision=None) -> jax.Array:
  r"""Causal linear attention, ``[B, L, H, D]``: out_i uses keys j ≤ i only.

  Chunked prefix sums: the sequence is cut into chunks of C tokens; within a
  chunk the C×C causal part is computed explicitly, across chunks a running
  state S = Σ φ(k_j) v_jᵀ (``[B, H, F, D]``) and z = Σ φ(k_j) is carried by
  ``lax.scan``. Memory O(L·(F + D) + C² + F·D), time O(L·(C·(F + D) + F·D)).

  Args: as ``linear_attention`` (``precision`` included), plus ``chunk_size`` C ≥ 1
  (L need not be a multiple of it: the tail is padded with masked keys).

  **Not exact at large inputs for favor, porf_softplus and softmaxfeat**: the features'
  log-space shifts (over all keys) need not suit an early query's prefix, whose terms can
  underflow; a query row whose causal denominator falls below ``eps`` is clamped there and
  comes out wrong. Measured errors and the exact path:
  docs/performance.md#attentionxlacausal_linear_attention.
  """
  _check(q_feat, k_feat, v, key_mask)
  chunk = _checks.check_int('chunk_size', chunk_size, 1)
  check_eps(eps)
  ein = _einsum(precision)
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
    scores = jnp.where(tril, ein('bihf,bjhf->bhij', q, k), 0.0)          # [B, H, C, C]
    num = ein('bhij,bjhd->bihd', scores, val) + ein('bihf,bhfd->bihd', q, s)
    den = jnp.sum(scores, axis=-1).transpose(0, 2, 1) + ein('bihf,bhf->bih', q, z)
    out = num / jnp.maximum(den, eps)[..., None]
    s = s + ein('bjhf,bjhd->bhfd', k, val)
    z = z + jnp.sum(k, axis=1)
    return (s, z), out.astype(out_dtype)

  init = (jnp.zeros((b, h, f, d), q_feat.dtype), jnp.zeros((b, h, f), q_feat.dtype))
  _, out = jax.lax.scan(step, init, (qc, kc, vc))
  out = jnp.moveaxis(out, 0, 1).reshape(b, n * chunk, h, d)
  return out[:, :length]


def materialized_causal_linear_attention(q_feat: jax.Array, k_feat: jax.Array, v: jax.Array,
                                         key_mask: Optional[jax.Array] = None, *,
                                         eps: float = DEFAULT_EPS,
                                         precision=None) -> jax.Array:
  r"""Causal linear attention with the L×L weights materialised, ``[B, L, H, D]``.

  A_ij = φ(q_i)ᵀφ(k_j) for real keys j ≤ i (else 0), out_i = Σ_j A_ij v_j / max(Σ_j A_ij, eps).
  The same function as ``causal_linear_attention``; time O(L²·(F + D)) and memory O(L²)
  per head, all in matmuls: on CPU the fastest causal path for short sequences (L ≲ 512).
  Causal in the features it is given: with ``features.attention_pair``'s joint shifts
  (a max over *all* keys, later ones included) a later token can move an earlier output,
  so causal layers use ``xla_materialized_causal_attention`` (per-token shifts) or
  ``xla_fused_causal_linear_attention`` instead; this function is for features that are
  already per-token (e.g. ``features.get_feature_map(name)(x, ω)`` at moderate scales).

  Args: as ``linear_attention`` (``precision`` included).
  """
  _check(q_feat, k_feat, v, key_mask)
  check_eps(eps)
  ein = _einsum(precision)
  out_dtype = v.dtype
  q_feat, k_feat, v = _prepare(q_feat, k_feat, v, key_mask)
  length = q_feat.shape[1]
  causal = jnp.tril(jnp.ones((length, length), bool))
  a = jnp.where(causal, ein('bihf,bjhf->bhij', q_feat, k_feat), 0.0)        # [B, H, L, L]
  num = ein('bhij,bjhd->bihd', a, v)
  den = jnp.sum(a, axis=-1).transpose(0, 2, 1)                                # [B, L, H]
  return (num / jnp.maximum(den, eps)[..., None]).astype(out_dtype)


def xla_materialized_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                                      omega: jax.Array, *, feature_map: str = 'favor',
                                      key_mask: Optional[jax.Array] = None,
                                      eps: float = DEFAULT_EPS, precision=None) -> jax.Array:
  r"""Causal linear attention with the L×L weights materialised, per-token shifts: ``[B, L, H, D]``.

  w_ij = ψ(q_i)ᵀψ(k_j) for real keys j ≤ i (else 0), out_i = Σ_j w_ij v_j / Σ_j w_ij, from
  ℓ = log ψ (``features.attention_log_psi``) with shifts that each depend on one token:

  * M_i = max_f ℓ(q_i)_f, c_j = max_f ℓ(k_j)_f, q̃_i = e^{ℓ(q_i) − M_i}, k̃_j = e^{ℓ(k_j) − c_j}
    (every entry ≤ 1, at least one = 1);
  * p_ij = q̃_iᵀk̃_j (one ``[L, L]`` matmul per head), log w_ij = M_i + c_j + log p_ij;
  * out_i = Σ_{j≤i} e^{log w_ij − T_i} v_j / Σ_{j≤i} e^{log w_ij − T_i}, T_i = max_{j≤i} log w_ij.

  Causal at any input scale: nothing that row i computes reads a token after i (no shift
  is shared across positions), so its outputs are bit-identical whatever the later tokens
  are. Exact wherever no p_ij of a query's prefix underflows (q_i's and k_j's largest
  features more than ~87 nats apart in float32: very large inputs of favor-type maps).
  Time O(L²·(F + D)), memory O(L²) per head, all in matmuls. A query with no real key at
  or before it gets 0.
  Path choice: docs/performance.md#attentionxlaxla_materialized_causal_attention.

  Args: as ``xla_fused_causal_linear_attention`` (q, k ``[B, L, H, d]``, v ``[B, L, H, D]``,
  omega ``[H, M, d]``, key_mask ``[B, L]``, eps, ``precision``), without the chunk.
  """
  check_fused_inputs(q, k, v, omega, key_mask, feature_map, features.KERNEL_ATTENTION_MAPS)
  check_eps(eps)
  ein = _einsum(precision)
  b, length = q.shape[:2]
  out_dtype = v.dtype
  dtype = jnp.promote_types(jnp.result_type(q, k, v), jnp.float32)
  q, k, v, omega = (a.astype(dtype) for a in (q, k, v, omega))
  if key_mask is None:
    key_mask = jnp.ones((b, length), bool)
  keep = key_mask[:, :, None, None]
  v = jnp.where(keep, v, 0.0)                              # padded values are never read
  k = jnp.where(keep, k, 0.0)

  def log_psi(x):                                         # [B, L, H, d] -> [B, L, H, F]
    s = ein('blhd,hmd->blhm', x, omega)
    return features.attention_log_psi(feature_map, s,
                                      0.5 * jnp.sum(x * x, axis=-1, keepdims=True))

  sg = jax.lax.stop_gradient
  lq, lk = log_psi(q), log_psi(k)
  mq = sg(jnp.max(lq, axis=-1))                            # [B, L, H]
  ck = sg(jnp.max(lk, axis=-1))                            # [B, L, H]
  p = ein('bihf,bjhf->bhij', jnp.exp(lq - mq[..., None]), jnp.exp(lk - ck[..., None]))
  causal = jnp.tril(jnp.ones((length, length), bool))
  seen = causal[None, None] & key_mask[:, None, None, :] & (p > 0)   # [B, H, L, L]
  log_w = jnp.where(seen, jnp.log(jnp.where(seen, p, 1.0)) + jnp.moveaxis(ck, 1, 2)[:, :, None],
                    -jnp.inf)                             # M_i dropped: it cancels
  top = jnp.max(log_w, axis=-1, keepdims=True)
  top = sg(jnp.where(jnp.isfinite(top), top, 0.0))
  w = jnp.exp(log_w - top)                                # [B, H, L, L], 0 where unseen
  num = ein('bhij,bjhd->bihd', w, v)
  den = jnp.sum(w, axis=-1).transpose(0, 2, 1)            # [B, L, H]
  return (num / jnp.maximum(den, eps)[..., None]).astype(out_dtype)


def check_fused_inputs(q, k, v, omega, key_mask, feature_map, maps) -> None:
  """One clear error for bad inputs of the fused paths (shapes as in their docstrings)."""
  for name, a in (('q', q), ('k', k), ('v', v)):
    _checks.check_rank(name, a, 4)
  _checks.check_rank('omega', omega, 3)
  if q.shape != k.shape or v.shape[:3] != q.shape[:3]:
    raise ValueError(f'q, k must be [B, L, H, d] and v [B, L, H, D] with the same [B, L, H], '
                     f'got {q.shape}, {k.shape} and {v.shape}.')
  b, length, h, dim = q.shape
  if length == 0 or omega.shape[1] == 0:
    raise ValueError(f'q and omega must hold at least one position and one particle (L >= 1, '
                     f'M >= 1), got q {q.shape} and omega {omega.shape}.')
  if omega.shape[0] != h or omega.shape[2] != dim:
    raise ValueError(f'omega must be [H, M, d] = [{h}, M, {dim}], got {omega.shape}.')
  if feature_map not in maps:
    raise ValueError(f'feature_map must be one of {tuple(maps)}, got {feature_map!r}.')
  if key_mask is not None and key_mask.shape != (b, length):
    raise ValueError(f'key_mask must have shape [B, L] = {(b, length)}, got {key_mask.shape}.')


def _fused_setup(q, k, v, omega, key_mask, feature_map, chunk_size, eps, ein):
  """The fused paths' common start: checks, promotion to ≥ float32, padding to whole
  chunks, and the per-chunk log ψ. Returns ``(q, k, v, key_mask, to_chunks, log_psi,
  width F, chunk C, padded length)``; ``to_chunks``: ``[B, L, ...] -> [n, B, C, ...]``."""
  check_fused_inputs(q, k, v, omega, key_mask, feature_map, features.KERNEL_ATTENTION_MAPS)
  chunk = _checks.check_int('chunk_size', chunk_size, 1)
  check_eps(eps)
  b, length = q.shape[:2]
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
  # F: features per head (2M for softmaxfeat's and hedgehog's [s, −s]).
  width = features.num_features(feature_map, omega.shape[1])

  def log_psi(x):                                         # [B, C, H, d] -> [B, C, H, F]
    s = ein('bchd,hmd->bchm', x, omega)
    return features.attention_log_psi(feature_map, s,
                                      0.5 * jnp.sum(x * x, axis=-1, keepdims=True))

  return q, k, v, key_mask, to_chunks, log_psi, width, chunk, n * chunk


def xla_fused_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                               omega: jax.Array, *, feature_map: str = 'favor',
                               key_mask: Optional[jax.Array] = None, chunk_size: int = 1024,
                               eps: float = DEFAULT_EPS, precision=None) -> jax.Array:
  r"""``attention.fused_linear_attention``'s XLA path (its docstring has the details).

  Every map is stabilised in log space as ``features.attention_pair`` does: with
  ℓ = log ψ (``features.attention_log_psi``), keys are e^{ℓ − m_f} with m_f an
  online max per feature over the real keys (as in flash attention: row f of
  S and z is rescaled by e^{m_f,old − m_f,new} when a chunk raises it, so the
  final shift is the max over all real keys), and queries e^{ℓ + m_f − M_i}
  with M_i their row max. ``precision``: as ``linear_attention``'s.
  """
  b, length, h, _ = q.shape
  d_v, out_dtype = v.shape[-1], v.dtype
  ein = _einsum(precision)
  q, k, v, key_mask, to_chunks, log_psi, width, _, padded = _fused_setup(
      q, k, v, omega, key_mask, feature_map, chunk_size, eps, ein)
  scale = math.sqrt(omega.shape[1])

  @jax.checkpoint
  def key_step(carry, inputs):
    s, z, m = carry                       # [B, H, F, D], [B, H, F], [B, H, F] (running max)
    kc, vc, mc = inputs                   # [B, C, H, d], [B, C, H, D], [B, C]
    keep = mc[:, :, None, None]
    vc = jnp.where(keep, vc, 0.0)         # padded keys and values are never read
    logits = jnp.where(keep, log_psi(jnp.where(keep, kc, 0.0)), -jnp.inf)
    m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(logits, axis=1)))   # [B, H, F]
    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    rescale = jnp.where(jnp.isfinite(m), jnp.exp(m - m_safe), 0.0)
    phi = jnp.exp(logits - m_safe[:, None]) / scale
    s = s * rescale[..., None] + ein('bchm,bchd->bhmd', phi, vc)
    z = z * rescale + jnp.sum(phi, axis=1)
    return (s, z, m_new), None

  init = (jnp.zeros((b, h, width, d_v), q.dtype), jnp.zeros((b, h, width), q.dtype),
          jnp.full((b, h, width), -jnp.inf, q.dtype))
  (s, z, m), _ = jax.lax.scan(key_step, init, (to_chunks(k), to_chunks(v), to_chunks(key_mask)))
  m = jnp.where(jnp.isfinite(m), m, 0.0)                  # per-feature key shifts

  @jax.checkpoint
  def query_step(qc):                                     # [B, C, H, d] -> [B, C, H, D]
    logits = log_psi(qc) + m[:, None]
    logits = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    phi = jnp.exp(logits) / scale
    num = ein('bchm,bhmd->bchd', phi, s)
    den = ein('bchm,bhm->bch', phi, z)
    return num / jnp.maximum(den, eps)[..., None]

  out = jax.lax.map(query_step, to_chunks(q))            # [n, B, C, H, D]
  out = jnp.moveaxis(out, 0, 1).reshape(b, padded, h, d_v)
  return out[:, :length].astype(out_dtype)


def xla_fused_causal_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                                      omega: jax.Array, *, feature_map: str = 'favor',
                                      key_mask: Optional[jax.Array] = None,
                                      chunk_size: int = 16, eps: float = DEFAULT_EPS,
                                      precision=None) -> jax.Array:
  r"""Causal linear attention from the particles, exact at any input scale: ``[B, L, H, D]``.

  out_i = Σ_{j≤i} w_ij v_j / Σ_{j≤i} w_ij with w_ij = φ(q_i)ᵀφ(k_j), real keys only,
  computed chunk by chunk (C = ``chunk_size`` tokens) from ℓ = log ψ
  (``features.attention_log_psi``) without a shift that a later key chooses:

  * state of the earlier chunks (``lax.scan``): S_f = Σ_j e^{ℓ(k_j)_f − m_f} v_j and
    z_f = Σ_j e^{ℓ(k_j)_f − m_f}, m_f the running max over the earlier real keys
    (rescaled by e^{m_old − m_new} when a chunk raises it, as in flash attention);
    query i reads it through a_if = ℓ(q_i)_f + m_f;
  * inside the chunk, log w_ij = logsumexp_f(ℓ(q_i)_f + ℓ(k_j)_f) for j ≤ i
    (``[B, H, C, C, F]`` per chunk: keep C small);
  * one shift per query, M_i = max(max_f a_if, max_{j≤i} log w_ij), cancels in the
    ratio; the term that attains it contributes ≥ 1 to the denominator, so nothing an
    earlier or a later key does can make a query's terms underflow.

  Time O(L·F·(C + D)), memory O(C²·F + F·D) per batch row and head beyond the inputs.
  Exact for every map at every input scale (against the other causal paths:
  docs/performance.md#attentionxlaxla_fused_causal_linear_attention). A query with no real
  key at or before it gets 0.

  Args: as ``xla_fused_linear_attention`` (q, k ``[B, L, H, d]``, v ``[B, L, H, D]``,
  omega ``[H, M, d]``, key_mask ``[B, L]``, ``precision``), with ``chunk_size`` C ≥ 1.
  """
  b, length, h, _ = q.shape
  d_v, out_dtype = v.shape[-1], v.dtype
  ein = _einsum(precision)
  q, k, v, key_mask, to_chunks, log_psi, width, chunk, padded = _fused_setup(
      q, k, v, omega, key_mask, feature_map, chunk_size, eps, ein)
  tril = jnp.tril(jnp.ones((chunk, chunk), bool))
  finite_or_zero = lambda a: jnp.where(jnp.isfinite(a), a, 0.0)
  sg = jax.lax.stop_gradient

  @jax.checkpoint
  def step(carry, inputs):
    s, z, m = carry                       # [B, H, F, D], [B, H, F], [B, H, F] (running max)
    qc, kc, vc, mc = inputs               # [B, C, H, d], [B, C, H, d], [B, C, H, D], [B, C]
    keep = mc[:, :, None, None]
    vc = jnp.where(keep, vc, 0.0)         # padded keys and values are never read
    lq = log_psi(qc)                                                   # [B, C, H, F]
    lk = log_psi(jnp.where(keep, kc, 0.0))                             # [B, C, H, F]
    # Inside the chunk: log w_ij, j ≤ i and j real, else −inf.
    pair = jax.nn.logsumexp(lq[:, :, None] + lk[:, None], axis=-1)     # [B, C_i, C_j, H]
    seen = tril[None, :, :, None] & mc[:, None, :, None]
    log_w = jnp.where(seen, pair, -jnp.inf)
    # The earlier chunks, through the state: a_if = ℓ(q_i)_f + m_f (−inf: no key yet).
    a = lq + m[:, None]                                                # [B, C, H, F]
    top = jnp.maximum(jnp.max(log_w, axis=2), jnp.max(a, axis=-1))     # [B, C, H]
    top = sg(finite_or_zero(top))
    w = jnp.exp(log_w - top[:, :, None])                               # [B, C_i, C_j, H]
    wa = jnp.exp(a - top[..., None])                                   # [B, C, H, F]
    num = ein('bijh,bjhd->bihd', w, vc) + ein('bihf,bhfd->bihd', wa, s)
    den = jnp.sum(w, axis=2) + ein('bihf,bhf->bih', wa, z)
    out = num / jnp.maximum(den, eps)[..., None]
    # Add the chunk's real keys to the state, rescaled to the new running max.
    logits = jnp.where(keep, lk, -jnp.inf)
    m_new = sg(jnp.maximum(m, jnp.max(logits, axis=1)))                # [B, H, F]
    m_safe = finite_or_zero(m_new)
    rescale = jnp.where(jnp.isfinite(m), jnp.exp(m - m_safe), 0.0)
    phi = jnp.exp(logits - m_safe[:, None])
    s = s * rescale[..., None] + ein('bchf,bchd->bhfd', phi, vc)
    z = z * rescale + jnp.sum(phi, axis=1)
    return (s, z, m_new), out

  init = (jnp.zeros((b, h, width, d_v), q.dtype), jnp.zeros((b, h, width), q.dtype),
          jnp.full((b, h, width), -jnp.inf, q.dtype))
  _, out = jax.lax.scan(step, init, (to_chunks(q), to_chunks(k), to_chunks(v),
                                     to_chunks(key_mask)))
  out = jnp.moveaxis(out, 0, 1).reshape(b, padded, h, d_v)
  return out[:, :length].astype(out_dtype)
