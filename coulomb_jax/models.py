r"""Flax modules around the pure functions: kernel attention with particles.

``KernelAttention`` is multi-head linear attention whose feature map is built
from particles ω (``[H, M, D_h]``: M per head). The particles are their own
parameter, named ``particles``, so an optax label function can pick them out
(Phase A moves only them with ``langevin.langevin_transform``; Phase B freezes
them with ``optax.set_to_zero``). Two modes for queries and keys:

* ``qk_mode="shared"`` (the paper's "Q = K"): q = k = the per-head reshape of the
  input x, so the module has no W_q / W_k;
* ``qk_mode="projected"``: q = x W_q, k = x W_k.

Values and the output always have their projections. Inputs are scaled by
D_h^{−1/4} before the feature map (so ⟨φ(q), φ(k)⟩ estimates exp(qᵀk/√D_h) for
``favor``), and ``favor`` is stabilised per query row and per (batch, head) for
keys (over real keys only), which cancels in the attention ratio.
"""

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from coulomb_jax import attention
from coulomb_jax import features

QK_MODES = ('shared', 'projected')


def init_particles(key, shape, dtype=jnp.float32, *, orthogonal=False):
  """``[H, M, D_h]`` particles: N(0, I) rows, or block-orthogonal ones per head."""
  heads, num, dim = shape
  sample = features.sample_orthogonal if orthogonal else features.sample_gaussian
  keys = jax.random.split(key, heads)
  return jax.vmap(lambda k: sample(k, num, dim, dtype))(keys)


class KernelAttention(nn.Module):
  """Multi-head linear attention with a particle feature map.

  Attributes:
    num_heads: H; the input width must be divisible by it (D_h = width / H).
    feature_map: a name in ``features.FEATURE_MAPS`` (not ``rff``: attention
      needs non-negative features).
    num_features: M particles per head.
    qk_mode: ``"shared"`` (Q = K = x, no W_q/W_k) or ``"projected"``.
    orthogonal: draw the initial particles with ``features.sample_orthogonal``.
    causal: use ``attention.causal_linear_attention``.
  """
  num_heads: int
  feature_map: str = 'favor'
  num_features: int = 256
  qk_mode: str = 'shared'
  orthogonal: bool = False
  causal: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """``x: [B, L, E]``, ``mask: [B, L]`` (True for real tokens) → ``[B, L, E]``."""
    if self.qk_mode not in QK_MODES:
      raise ValueError(f'qk_mode must be one of {QK_MODES}, got {self.qk_mode!r}.')
    if self.feature_map == 'rff':
      raise ValueError("feature_map: 'rff' is not non-negative; use an attention map "
                       f'{features.ATTENTION_FEATURE_MAPS}.')
    fm = features.get_feature_map(self.feature_map)
    b, length, width = x.shape
    if width % self.num_heads:
      raise ValueError(f'input width {width} is not divisible by num_heads={self.num_heads}.')
    head_dim = width // self.num_heads
    particles = self.param(
        'particles', functools.partial(init_particles, orthogonal=self.orthogonal),
        (self.num_heads, self.num_features, head_dim))
    dense = functools.partial(nn.DenseGeneral, features=(self.num_heads, head_dim))
    if self.qk_mode == 'shared':
      q = k = x.reshape(b, length, self.num_heads, head_dim)
    else:
      q, k = dense(name='query')(x), dense(name='key')(x)
    v = dense(name='value')(x)
    scale = head_dim ** -0.25
    if self.feature_map == 'favor':
      q_map = functools.partial(features.favor, stabilize=True)
      # One shift per (batch, head), over real keys only.
      k_map = functools.partial(features.favor, stabilize=(-2, -1), stabilize_mask=mask)
    else:
      q_map = k_map = fm
    # One feature map per head: vmap over the head axis of inputs and particles.
    per_head = lambda f, a: jax.vmap(f, in_axes=(2, 0), out_axes=2)(a * scale, particles)
    out_fn = attention.causal_linear_attention if self.causal else attention.linear_attention
    out = out_fn(per_head(q_map, q), per_head(k_map, k), v, mask)
    return nn.DenseGeneral(width, axis=(-2, -1), name='out')(out)
