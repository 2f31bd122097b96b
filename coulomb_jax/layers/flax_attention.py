r"""Kernel attention as a drop-in ``attention_fn`` for ``flax.linen.MultiHeadDotProductAttention``.

``kernel_attention_fn(omega)`` returns a function with the signature of
``flax.linen.dot_product_attention`` that computes linear attention with the
particles' feature map instead of softmax:

.. math:: \text{out}_i = \frac{\sum_j φ(\tilde q_i)ᵀφ(\tilde k_j)\, v_j}{\max(\sum_j φ(\tilde q_i)ᵀφ(\tilde k_j), ε)},
   \qquad \tilde q = D^{−1/4} q,\ \tilde k = D^{−1/4} k,

summed over real keys, per head, so that φ(q̃)ᵀφ(k̃) estimates exp(qᵀk/√D) as the
softmax path's logits qᵀk/√D (flax scales the query by 1/√D). This matches
``models.KernelAttention`` (inputs scaled by D_h^{−1/4}, features of
``features.attention_pair``: exact at any input scale, ``hedgehog`` included). Nothing
here imports flax.

Masks: flax's boolean ``mask`` ``[B | 1, H | 1, L_q | 1, L_k]`` (True = attend), as
``nn.make_attention_mask(query_mask, key_mask)`` builds, is honoured when it is a
*padding* mask: mask[b, h, i, j] = row_i & key_j (e.g. ``[B, 1, 1, L]`` or
``[B, 1, L, L]``). With ``causal=True`` (self-attention, L_q = L_k) it is also honoured
when it is a *causal padding* mask, mask[b, h, i, j] = row_i & key_j & (j ≤ i), as
``nn.combine_masks(nn.make_causal_mask(x), nn.make_attention_mask(m, m))`` builds (a
padding mask alone is then made causal by the flag, as Performer's ``unidirectional``).
Keys that no real query attends are dropped (their values have no effect). A query row
that is fully masked attends the real keys here; flax's softmax averages all values
there (both are padding, normally discarded). Any other mask (a causal mask without
``causal=True``, per-head, ...) raises ValueError naming the mask and pointing to
``causal=True``: at once for a concrete mask, and under ``jit`` from a host callback
(``jax.debug.callback``) when the program runs, so the error reaches the caller inside
a ``JaxRuntimeError`` (the same message); the output is never silently wrong. A host
callback cannot be lowered for another platform than the host's (``lower(
lowering_platforms=('tpu',))`` on a CPU); ``mask_check='nan'`` drops the callback and
sets the outputs of a traced mask it cannot honour to NaN instead.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import _checks
from coulomb_jax import attention
from coulomb_jax import features
from coulomb_jax import mimicry
from coulomb_jax.attention import xla

CAUSAL_PATHS = attention.CAUSAL_PATHS

PHASE_A_INPUTS = 'phase_a_inputs'
"""Sown (collection ``intermediates``) by the kernel layers: the per-head mean over real
keys of the scaled keys, ``[B, H, D_h]``, the label target's data (``training``)."""
MIMICRY_INPUTS = 'mimicry_inputs'
"""Sown by the kernel layers: the unscaled per-head ``(q, k)``, each ``[B, L, H, D_h]``,
the softmax target's data (``phase_a_mimicry``)."""


MASK_ERROR = (
    'mask: kernel attention honours padding masks (mask[b, h, i, j] = query_i & key_j) '
    'and, with causal=True, causal padding masks (also j <= i: nn.combine_masks('
    'nn.make_causal_mask(x), padding)); got another pattern. For a causal mask pass '
    'causal=True (kernel_attention_fn(omega, causal=True) or KernelAttention(causal=True)).')
"""The one line every mask that cannot be honoured ends in (eagerly or under jit)."""


def _pair(q, k, omega, feature_map, key_mask):
  """Per-head stabilised features ``([B, L_q, F], [B, L_k, F])`` of one head."""
  return features.attention_pair(q, k, omega, feature_map, key_mask)


def _raise_unless(ok, message):
  if not bool(ok):
    raise ValueError(message)


MASK_CHECKS = ('callback', 'nan')
"""How a traced mask is checked: a host callback that raises, or NaN outputs."""


def key_mask_of(mask, batch: int, heads: int, len_q: int, len_k: int, *,
                causal: bool = False, mask_check: str = 'callback'):
  """The key mask ``[B, L_k]`` (True = a real key) of a flax attention mask, checked.

  ``mask``: None (every key real) or boolean, broadcastable to ``[B, H, L_q, L_k]``. It
  must be a padding mask (query_i & key_j) or, with ``causal`` and L_q = L_k, a causal
  padding mask (query_i & key_j & j ≤ i); anything else raises ValueError(``MASK_ERROR``)
  — eagerly for a concrete mask, and for a traced one from a host callback when it runs
  (``mask_check='callback'``) or not at all (``'nan'``: the caller sets its outputs to NaN
  where ``ok`` is False). Returns ``(key_mask, ok)`` with ``ok`` a scalar bool.
  """
  if mask_check not in MASK_CHECKS:
    raise ValueError(f'mask_check must be one of {MASK_CHECKS}, got {mask_check!r}.')
  if mask is None:
    return jnp.ones((batch, len_k), bool), jnp.array(True)
  if np.ndim(mask) != 4:
    raise ValueError(f'mask must be [B, H, L_q, L_k] (rank 4, broadcastable), got shape '
                     f'{np.shape(mask)}.')
  shape = (batch, heads, len_q, len_k)
  try:
    m = jnp.broadcast_to(jnp.asarray(mask, bool), shape)
  except ValueError:
    raise ValueError(f'mask of shape {np.shape(mask)} does not broadcast to [B, H, L_q, L_k] '
                     f'= {shape}.') from None
  if causal and len_q != len_k:
    raise ValueError(f'causal=True is self-attention: L_q = L_k, got L_q={len_q}, '
                     f'L_k={len_k}.')
  if _checks.is_concrete(mask):        # numpy: also when a concrete mask is closed over by jit
    keys, ok = _patterns(np.broadcast_to(np.asarray(mask, bool), shape), np, causal)
    _raise_unless(ok, MASK_ERROR)
    return jnp.asarray(keys), jnp.array(True)
  keys, ok = _patterns(m, jnp, causal)
  if mask_check == 'callback':
    jax.debug.callback(functools.partial(_raise_unless, message=MASK_ERROR), ok)
  return keys, ok


def _patterns(m, xp, causal):
  """(keys ``[B, L_k]`` some query attends, whether m ``[B, H, L_q, L_k]`` is a pattern
  this attention honours: rows ⊗ keys, or with ``causal`` also rows ⊗ keys ∧ j ≤ i)."""
  keys = xp.any(m, axis=(1, 2))
  rows = xp.any(m, axis=3)
  padding = rows[..., None] & keys[:, None, None, :]
  ok = xp.all(m == padding)
  if causal:
    tril = xp.arange(m.shape[3])[None, :] <= xp.arange(m.shape[2])[:, None]
    ok = ok | xp.all(m == (padding & tril))
  return keys, ok


def kernel_attention_fn(omega: jax.Array, feature_map: str = 'favor', *,
                        causal: bool = False, causal_path: str = 'fused',
                        chunk_size: int = 16, eps: float = xla.DEFAULT_EPS,
                        mask_check: str = 'callback', sow_into=None):
  r"""A ``flax.linen.dot_product_attention``-compatible linear attention with particles ``omega``.

  Args:
    omega: ``[H, M, D]`` particles (one set per head) or ``[M, D]`` (shared by the heads).
    feature_map: a name in ``mimicry.MIMICRY_FEATURE_MAPS`` (the seven attention maps or
      ``hedgehog``; M rows give 2M features for ``hedgehog`` and ``softmaxfeat``).
    causal: query i attends keys j ≤ i only (self-attention), exactly at any input
      scale, through the path of ``models.KernelAttention(causal=True)``: given the same
      projections the two are equal. Flax's causal masks (``nn.make_causal_mask``,
      combined with padding by ``nn.combine_masks``) and padding masks are honoured.
    causal_path: with ``causal``, ``'fused'`` (``attention.fused_causal_linear_attention``,
      chunks of ``chunk_size`` tokens) or ``'materialized'``
      (``attention.materialized_causal_attention``), as ``KernelAttention.causal_path``.
    chunk_size: the causal chunk of the fused path (≥ 1).
    eps: guard of the denominator (never acts with these stabilised features unless a
      query has no real key).
    mask_check: for a traced mask, ``'callback'`` (a host callback raises ``MASK_ERROR``
      when the program runs) or ``'nan'`` (NaN outputs instead: for programs lowered for
      another platform than the host's, which cannot hold a host callback).
    sow_into: the flax module that holds ``omega`` (made by ``models.particles_param``
      inside its ``@nn.compact`` method; pass ``self``). The function then sows the two
      targets' data there, ``PHASE_A_INPUTS`` and ``MIMICRY_INPUTS``, as
      ``KernelAttention`` does, so that ``training.make_phase_a_step`` finds each layer's
      data beside its particles. None: nothing is sown (Phase A cannot run on it).

  Returns:
    ``attention_fn(query [B, L_q, H, D], key [B, L_k, H, D], value [B, L_k, H, D_v],
    bias=None, mask=None, broadcast_dropout=True, dropout_rng=None, dropout_rate=0.,
    deterministic=False, dtype=None, precision=None, **kwargs) -> [B, L_q, H, D_v]`` in
    ``dtype`` (default: the query's). ``bias`` and attention dropout are refused with a
    ValueError (linear attention never forms the weights they act on); other keyword
    arguments flax may pass (``module``) are ignored. Use it as
    ``nn.MultiHeadDotProductAttention(..., attention_fn=kernel_attention_fn(omega))``.
  """
  mimicry._check_map(feature_map)              # pylint: disable=protected-access
  xla.check_eps(eps)
  if causal_path not in CAUSAL_PATHS:
    raise ValueError(f'causal_path must be one of {CAUSAL_PATHS}, got {causal_path!r}.')
  _checks.check_int('chunk_size', chunk_size, 1)
  if mask_check not in MASK_CHECKS:
    raise ValueError(f'mask_check must be one of {MASK_CHECKS}, got {mask_check!r}.')
  if np.ndim(omega) not in (2, 3) or 0 in np.shape(omega):
    raise ValueError(f'omega must be [H, M, D] or [M, D] with M, D >= 1, got shape '
                     f'{np.shape(omega)}.')
  omega = jnp.asarray(omega)

  def attention_fn(query, key, value, bias=None, mask=None, broadcast_dropout=True,
                   dropout_rng=None, dropout_rate=0., deterministic=False, dtype=None,
                   precision=None, **kwargs):
    del broadcast_dropout, dropout_rng, kwargs
    for name, a in (('query', query), ('key', key), ('value', value)):
      _checks.check_rank(name, a, 4)
    b, lq, h, d = query.shape
    if key.shape[0] != b or key.shape[2:] != (h, d) or value.shape[:3] != key.shape[:3]:
      raise ValueError(f'key and value must be [B, L_k, H, D] and [B, L_k, H, D_v] with '
                       f'[B, H, D] of query {query.shape}, got {key.shape} and {value.shape}.')
    if omega.shape[-1] != d or (omega.ndim == 3 and omega.shape[0] != h):
      raise ValueError(f'omega must be [H, M, D] = [{h}, M, {d}] or [M, {d}] for query '
                       f'{query.shape}, got {omega.shape}.')
    if bias is not None:
      raise ValueError('bias: kernel attention cannot add a bias to attention logits it '
                       'never forms; pass bias=None.')
    if dropout_rate > 0 and not deterministic:
      raise ValueError(f'dropout_rate: kernel attention has no attention weights to drop, '
                       f'got dropout_rate={dropout_rate} with deterministic=False.')
    key_mask, ok = key_mask_of(mask, b, h, lq, key.shape[1], causal=causal,
                               mask_check=mask_check)
    w = jnp.broadcast_to(omega, (h,) + omega.shape[-2:])
    scale = d ** -0.25
    if sow_into is not None:
      sow_into.sow('intermediates', MIMICRY_INPUTS, (query, key))
      real = key_mask[:, :, None, None].astype(jnp.promote_types(key.dtype, jnp.float32))
      pooled = jnp.sum(key * scale * real, axis=1) / jnp.maximum(jnp.sum(real, axis=1), 1.0)
      sow_into.sow('intermediates', PHASE_A_INPUTS, pooled.astype(key.dtype))
    if causal:
      path = (attention.materialized_causal_attention if causal_path == 'materialized' else
              functools.partial(attention.fused_causal_linear_attention, chunk_size=chunk_size))
      out = path(query * scale, key * scale, value, w, feature_map=feature_map,
                 key_mask=key_mask, eps=eps, precision=precision)
      out = jnp.where(ok, out, jnp.nan)
      return out.astype(query.dtype if dtype is None else dtype)
    pair = lambda qh, kh, wh: _pair(qh * scale, kh * scale, wh, feature_map, key_mask)
    q_feat, k_feat = jax.vmap(pair, in_axes=(2, 2, 0), out_axes=2)(query, key, w)
    v = value.astype(jnp.promote_types(value.dtype, jnp.float32))
    v = jnp.where(key_mask[:, :, None, None], v, 0.0)              # NaN never leaks
    kv = jnp.einsum('blhf,blhd->bhfd', k_feat, v, precision=precision)
    num = jnp.einsum('blhf,bhfd->blhd', q_feat, kv, precision=precision)
    den = jnp.einsum('blhf,bhf->blh', q_feat, jnp.sum(k_feat, axis=1), precision=precision)
    out = jnp.where(ok, num / jnp.maximum(den, eps)[..., None], jnp.nan)
    return out.astype(query.dtype if dtype is None else dtype)

  return attention_fn
