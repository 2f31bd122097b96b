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
``[B, 1, L, L]``). Keys that no real query attends are dropped (their values have
no effect). A query row that is fully masked attends the real keys here; flax's
softmax averages all values there (both are padding, normally discarded). Any
other mask (causal, per-head, ...) cannot be honoured by bidirectional linear
attention: an eager call raises ValueError; under ``jit`` the mask's values are
unknown, so the output is set to NaN instead of silently ignoring the mask.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import _checks
from coulomb_jax import attention_core
from coulomb_jax import features
from coulomb_jax import mimicry


def _pair(q, k, omega, feature_map, key_mask):
  """Per-head stabilised features ``([B, L_q, F], [B, L_k, F])`` of one head."""
  return features.attention_pair(q, k, omega, feature_map, key_mask)


def _key_mask(mask, b, h, lq, lk):
  """(key_mask ``[B, L_k]``, is_padding scalar bool) from a flax mask (``None``: all real)."""
  if mask is None:
    return jnp.ones((b, lk), bool), jnp.array(True)
  if np.ndim(mask) != 4:
    raise ValueError(f'mask must be [B, H, L_q, L_k] (rank 4, broadcastable), got shape '
                     f'{np.shape(mask)}.')
  try:
    m = jnp.broadcast_to(jnp.asarray(mask, bool), (b, h, lq, lk))
  except ValueError:
    raise ValueError(f'mask of shape {np.shape(mask)} does not broadcast to [B, H, L_q, L_k] '
                     f'= {(b, h, lq, lk)}.') from None
  if _checks.is_concrete(mask):        # numpy: also when a concrete mask is closed over by jit
    keys, ok = _padding(np.broadcast_to(np.asarray(mask, bool), (b, h, lq, lk)), np)
    if not ok:
      raise ValueError('mask: kernel attention honours only padding masks '
                       '(mask[b, h, i, j] = query_i & key_j), got another pattern.')
    return jnp.asarray(keys), jnp.array(True)
  return _padding(m, jnp)


def _padding(m, xp):
  """(keys ``[B, L_k]`` some query attends, whether m = rows ⊗ keys) of m ``[B, H, L_q, L_k]``."""
  keys = xp.any(m, axis=(1, 2))
  rows = xp.any(m, axis=3)
  return keys, xp.all(m == (rows[..., None] & keys[:, None, None, :]))


def kernel_attention_fn(omega: jax.Array, feature_map: str = 'favor', *,
                        eps: float = attention_core.DEFAULT_EPS):
  r"""A ``flax.linen.dot_product_attention``-compatible linear attention with particles ``omega``.

  Args:
    omega: ``[H, M, D]`` particles (one set per head) or ``[M, D]`` (shared by the heads).
    feature_map: a name in ``mimicry.MIMICRY_FEATURE_MAPS`` (the seven attention maps or
      ``hedgehog``; M rows give 2M features for ``hedgehog`` and ``softmaxfeat``).
    eps: guard of the denominator (never acts with these stabilised features unless a
      query has no real key).

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
  attention_core.check_eps(eps)
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
    key_mask, ok = _key_mask(mask, b, h, lq, key.shape[1])
    w = jnp.broadcast_to(omega, (h,) + omega.shape[-2:])
    scale = d ** -0.25
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
