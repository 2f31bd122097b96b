r"""A small causal language model for associative recall (MQAR).

``CausalLM``: token + learned position embeddings, ``num_layers`` pre-LayerNorm blocks
x ← x + Attn(LN x), x ← x + MLP(LN x) (no MLP when ``mlp_ratio = 0``), a final LayerNorm
and a per-token linear head → logits ``[B, L, V]``. Attention is causal:

* ``'softmax'``: flax's multi-head dot-product attention (W_q, W_k, W_v, W_o) under the
  mask ``j ≤ i`` and, if given, the padding mask on keys;
* ``'kernel'``: ``models.KernelAttention(qk_mode='projected', causal=True)``: linear
  attention with a particle feature map (params ``block_i/attn/particles: [H, M, D_h]``),
  padded keys excluded through its ``mask``.

No dropout. Its loss, optimiser and train step (plain, or with the particles fed the
softmax-mimicry force) are ``coulomb_jax.training.lm``'s; the names that lived here until
issue 37 (``lm.train_step``, ``lm.make_state``, ...) still resolve, with a
``DeprecationWarning``.
"""

import functools
import importlib
import warnings
from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from coulomb_jax import _checks
from coulomb_jax import features
from coulomb_jax.layers import models

LM_ATTENTIONS = ('softmax', 'kernel')


class Block(nn.Module):
  """Pre-LayerNorm block: x + Attn(LN x), then x + MLP(LN x) if ``mlp_dim > 0``.

  ``make_attention(name=...)`` builds the attention module (params under ``attn``).
  """
  make_attention: Callable[..., nn.Module]
  mlp_dim: int

  @nn.compact
  def __call__(self, x: jax.Array, mask: Optional[jax.Array]) -> jax.Array:
    x = x + self.make_attention(name='attn')(nn.LayerNorm(name='ln_attn')(x), mask)
    if self.mlp_dim > 0:
      h = nn.Dense(self.mlp_dim, name='mlp_in')(nn.LayerNorm(name='ln_mlp')(x))
      x = x + nn.Dense(x.shape[-1], name='mlp_out')(nn.gelu(h))
    return x


class CausalLM(nn.Module):
  """Causal LM: ``tokens: [B, L]`` int, ``mask: [B, L]`` bool or None → logits ``[B, L, V]``.

  Attributes:
    vocab_size: V.
    max_len: the longest L (size of the learned position table).
    width: E, the model width (divisible by ``num_heads``).
    num_layers: number of blocks.
    num_heads: H.
    attention: ``'softmax'`` or ``'kernel'``.
    feature_map: for ``'kernel'``, a name in ``features.KERNEL_ATTENTION_MAPS`` or
      ``features.SIGNED_ATTENTION_MAPS`` (``taylor``).
    num_features: for ``'kernel'``, M particles per head (φ has
      ``features.num_features(feature_map, M)`` entries).
    mlp_ratio: MLP hidden width = ``mlp_ratio · width``; 0 = attention-only blocks.
    orthogonal: for ``'kernel'``, draw the initial particles block-orthogonally per head
      (FAVOR+'s orthogonal random features).
    chunk_size: for ``'kernel'``, the causal chunk of ``KernelAttention`` (None: its default).
    causal_path: for ``'kernel'``, ``KernelAttention.causal_path`` (``'fused'``|``'materialized'``).
    identity_init: for ``'kernel'``, start the particles at the identity rows (Hedgehog).

  ``positions: [B, P]`` int (optional): the head is applied only at these positions and
  the logits are ``[B, P, V]`` (a large vocabulary costs only where the loss reads it).

  Bad ids. Float (or bool) ``tokens`` are one ``ValueError`` always (the dtype is static).
  An eager call with a token outside ``[0, V)`` (negative ids included, padded positions
  too) or a position outside ``[0, L)`` is one ``ValueError`` naming the value and its
  index. Under ``jit`` the ids cannot be read, so instead an id outside ``[0, V)`` is
  embedded as id 0 (never gathered out of range: no NaN enters the attention), and in its
  row the logits of every position i ≥ t are NaN, t the row's first bad position (they
  depend on the bad input; other rows are untouched). The logits of the positions i < t are
  the causal model's: bit for bit those of the same call with any id in ``[0, V)`` at t
  (both attentions, both causal paths, which shift the features per prefix; tested).
  A ``positions`` entry outside ``[0, L)`` under ``jit`` is not checked (it gathers as
  ``jnp.take_along_axis`` does).
  The guard leaves the logits of valid inputs exactly unchanged.
  """
  vocab_size: int
  max_len: int
  width: int = 64
  num_layers: int = 2
  num_heads: int = 2
  attention: str = 'softmax'
  feature_map: str = 'favor'
  num_features: int = 64
  mlp_ratio: int = 2
  orthogonal: bool = False
  chunk_size: Optional[int] = None
  causal_path: str = 'fused'
  identity_init: bool = False

  def check(self, length: int) -> None:
    """The fields and the input length; one ``ValueError`` naming the culprit."""
    for name in ('vocab_size', 'max_len', 'width', 'num_layers', 'num_heads', 'num_features'):
      _checks.check_int(name, getattr(self, name), 1)
    _checks.check_int('mlp_ratio', self.mlp_ratio, 0)
    if self.attention not in LM_ATTENTIONS:
      raise ValueError(f'attention must be one of {LM_ATTENTIONS}, got {self.attention!r}.')
    maps = features.KERNEL_ATTENTION_MAPS + features.SIGNED_ATTENTION_MAPS
    if self.attention == 'kernel' and self.feature_map not in maps:
      raise ValueError(f'feature_map must be one of {maps}, got {self.feature_map!r}.')
    if self.width % self.num_heads:
      raise ValueError(f'width must be divisible by num_heads={self.num_heads}, '
                       f'got {self.width}.')
    if length > self.max_len:
      raise ValueError(f'tokens length must be <= max_len={self.max_len}, got {length}.')

  def attention_factory(self) -> Callable[..., nn.Module]:
    """The causal attention of every block, as ``factory(name=...)``."""
    if self.attention == 'softmax':
      return functools.partial(models.SoftmaxAttention, self.num_heads, causal=True)
    return functools.partial(models.KernelAttention, num_heads=self.num_heads,
                             feature_map=self.feature_map, num_features=self.num_features,
                             qk_mode='projected', causal=True, orthogonal=self.orthogonal,
                             chunk_size=self.chunk_size, causal_path=self.causal_path,
                             identity_init=self.identity_init)

  @nn.compact
  def __call__(self, tokens: jax.Array, mask: Optional[jax.Array] = None,
               positions: Optional[jax.Array] = None) -> jax.Array:
    if tokens.ndim != 2:
      raise ValueError(f'tokens must have shape [B, L], got {tuple(tokens.shape)}.')
    self.check(tokens.shape[1])
    models.check_mask(mask, tokens.shape)
    _checks.check_ids('tokens', tokens, self.vocab_size)
    length = tokens.shape[1]
    if positions is not None:
      _checks.check_ids('positions', positions, length)
    models.check_param_shapes(
        self, {('embed', 'embedding'): (self.vocab_size, self.width),
               ('pos_embed',): (self.max_len, self.width),
               ('head', 'kernel'): (self.width, self.vocab_size)},
        f'vocab_size={self.vocab_size}, max_len={self.max_len}, width={self.width}')
    bad = (tokens < 0) | (tokens >= self.vocab_size)                    # [B, L]; jit only
    x = nn.Embed(self.vocab_size, self.width, name='embed')(jnp.where(bad, 0, tokens))
    pos = self.param('pos_embed', nn.initializers.normal(0.02), (self.max_len, self.width))
    x = x + pos[None, :length]
    factory = self.attention_factory()
    for i in range(self.num_layers):
      x = Block(factory, self.mlp_ratio * self.width, name=f'block_{i}')(x, mask)
    x = nn.LayerNorm(name='ln_final')(x)
    poisoned = jax.lax.cummax(bad.astype(jnp.int32), axis=1) > 0        # [B, L]: some j ≤ i bad
    if positions is not None:
      x = jnp.take_along_axis(x, positions[..., None], axis=1)          # [B, P, E]
      poisoned = jnp.take_along_axis(poisoned, positions, axis=1)       # [B, P]
    logits = nn.Dense(self.vocab_size, name='head')(x)
    return jnp.where(poisoned[..., None], jnp.nan, logits)


# The loss, optimiser and steps moved to ``coulomb_jax.training.lm`` (issue 37: layers never
# import training); their old names here resolve there for one release.
_MOVED_TO_TRAINING = ('answer_positions', 'mqar_loss_and_accuracy', 'MimicrySettings',
                      'make_optimizer', 'make_state', 'mimicry_force_terms', 'mimicry_forces',
                      'check_feature_map', 'train_step_fn', 'train_step', 'force_terms',
                      'evaluate')


def __getattr__(name):
  if name in _MOVED_TO_TRAINING:
    warnings.warn(f'coulomb_jax.layers.lm.{name} moved to coulomb_jax.training.lm.{name}; '
                  'the old name goes in the next release.', DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module('coulomb_jax.training.lm'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
