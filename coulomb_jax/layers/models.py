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
``favor``), and every map is stabilised in log space with
``features.attention_pair`` (``favor``: ``features.favor_pair``): one shift per key
feature (over real keys) and one per query row, which cancel in the attention
ratio and keep its denominator ≥ 1/M, so the output is the kernel's exact ratio at
any input scale.

Masks are ``[B, L]`` bool, True on real tokens; ``KernelAttention`` also takes flax's
``[B, 1 | H, L_q, L_k]`` attention masks (padding, or causal padding with ``causal=True``:
``flax_attention.key_mask_of``). A mask of another shape is refused with a ValueError
naming both shapes.

In your own ``@nn.compact`` module, ``particles_param(self, num_heads, num_features,
head_dim)`` creates the particles under the name the optimisers look for
(``training.phase_a_optimizer`` moves only leaves named ``particles``).
"""

import functools
from typing import Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from coulomb_jax import _checks
from coulomb_jax import attention
from coulomb_jax import features
from coulomb_jax import langevin
from coulomb_jax.layers import flax_attention

PARTICLES = 'particles'
"""The parameter name of the particles: the optimisers' label functions select it."""

QK_MODES = ('shared', 'projected')
CAUSAL_PATHS = attention.CAUSAL_PATHS
"""``KernelAttention(causal=True)``'s paths: chunked and exact at any scale, or L×L matmuls."""
ATTENTION_KINDS = ('kernel', 'softmax', 'linformer')


def check_mask(mask: Optional[jax.Array], shape, name: str = 'mask') -> None:
  """``mask`` is None or has ``shape`` = (B, L) of the input (a clear error, not a broadcast)."""
  if mask is not None and tuple(jnp.shape(mask)) != tuple(shape):
    raise ValueError(f'{name} must have shape [B, L] = {tuple(shape)} (one entry per '
                     f'token), got {tuple(jnp.shape(mask))}.')


def check_param_shapes(module: nn.Module, expected: dict, fields: str) -> None:
  """Params made for another model (another vocabulary, width or length): one
  ``ValueError`` naming the parameter, its shape, the shape this model expects and the
  fields that set it, where flax would raise its ``ScopeParamShapeError``.

  ``expected``: ``{(name, ..., leaf): shape}`` under ``params``; ``fields``: the module's
  fields that set those shapes, as text. A parameter not there yet (``init``) is skipped.
  """
  for path, shape in expected.items():
    value = module.variables.get('params', {}) if module.scope is not None else {}
    for name in path:
      value = value.get(name) if hasattr(value, 'get') else None
    if value is None:
      continue
    got = tuple(jnp.shape(value))
    if got != tuple(shape):
      raise ValueError(f"params: {'/'.join(path)} has shape {got}, but this model "
                       f'({fields}) expects {tuple(shape)}: params of another model; build '
                       'the model with the fields the params were made with.')


def masked_mean(x: jax.Array, mask: Optional[jax.Array], axis: int = 1) -> jax.Array:
  """Mean of ``x: [B, L, ...]`` over real tokens (``mask: [B, L]``); 0 for empty rows.

  Accumulated in (at least) float32, returned in ``x``'s dtype. The count is guarded (max(count, 1)), so fully padded rows give zeros, not NaN.
  """
  dtype = jnp.promote_types(x.dtype, jnp.float32)        # bf16 sums and counts are inexact
  if mask is None:
    return jnp.mean(x.astype(dtype), axis=axis).astype(x.dtype)
  m = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim)).astype(dtype)
  total = jnp.sum(x.astype(dtype) * m, axis=axis)
  count = jnp.maximum(jnp.sum(m, axis=axis), 1.0)
  return (total / count).astype(x.dtype)


def init_particles(key, shape, dtype=jnp.float32, *, orthogonal=False, radius=None,
                   identity=False):
  """``[H, M, D_h]`` particles: N(0, I) rows, block-orthogonal ones per head, or the identity.

  ``identity``: every head's rows are those of I_{D_h} (M ≤ D_h: the first M; M > D_h:
  I repeated), Hedgehog's initialisation of its map W (Zhang et al. 2024). ``radius``: if
  set, each row is projected onto the ball ‖ω‖ ≤ radius (the control that separates
  Phase A's projection from its dynamics).
  """
  heads, num, dim = shape
  if identity:
    rows = jnp.tile(jnp.eye(dim, dtype=dtype), (-(-num // dim), 1))[:num]
    omega = jnp.broadcast_to(rows, shape)
    return omega if radius is None else langevin.project_to_ball(omega, radius)
  sample = features.sample_orthogonal if orthogonal else features.sample_gaussian
  keys = jax.random.split(key, heads)
  omega = jax.vmap(lambda k: sample(k, num, dim, dtype))(keys)
  if radius is not None:
    omega = langevin.project_to_ball(omega, radius)
  return omega


def particles_param(module: nn.Module, num_heads: int, num_features: int, head_dim: int, *,
                    orthogonal: bool = False, identity: bool = False,
                    radius: Optional[float] = None) -> jax.Array:
  """The ``[H, M, D_h]`` particles as a parameter of ``module`` (call inside ``@nn.compact``).

  Drawn by ``init_particles`` (N(0, I) rows; ``orthogonal``: block-orthogonal per head;
  ``identity``: Hedgehog's identity rows; ``radius``: projected onto that ball), under the
  name ``particles`` that ``training.phase_a_optimizer`` / ``phase_b_optimizer`` select.
  Give them to ``flax_attention.kernel_attention_fn(omega)`` inside the same module. M
  particles give ``features.num_features(feature_map, M)`` features (2M for ``hedgehog``
  and ``softmaxfeat``). One set per module: a module that needs two holds two submodules.
  """
  for arg, value in (('num_heads', num_heads), ('num_features', num_features),
                     ('head_dim', head_dim)):
    _checks.check_int(arg, value, 1)
  init = functools.partial(init_particles, orthogonal=orthogonal, radius=radius,
                           identity=identity)
  return module.param(PARTICLES, init, (num_heads, num_features, head_dim))


class KernelAttention(nn.Module):
  """Multi-head linear attention with a particle feature map.

  Attributes:
    num_heads: H; the input width must be divisible by it (D_h = width / H).
    feature_map: a name in ``features.KERNEL_ATTENTION_MAPS``: the paper's seven maps or
      ``hedgehog`` (not ``rff``: attention needs non-negative features), or ``taylor``
      (``features.SIGNED_ATTENTION_MAPS``: Based's signed features of a positive kernel,
      stored, on the materialised and chunked paths). ``hedgehog`` and ``softmaxfeat``
      give 2M features from M particles, ``taylor`` 1 + M + M².
    num_features: M particles per head.
    qk_mode: ``"projected"`` (the default: q = x W_q, k = x W_k, as dot-product attention)
      or ``"shared"`` (Q = K = x, no W_q/W_k: the paper's encoder, which sets it).
    orthogonal: draw the initial particles with ``features.sample_orthogonal``.
    identity_init: start every head's particles at the identity rows (Hedgehog's W).
    init_radius: project the initial particles onto the ball of this radius.
    causal: token i attends to tokens j ≤ i only, through
      ``attention.fused_causal_linear_attention`` (exact at any input scale for every
      map) with chunks of ``chunk_size`` tokens (16 if None).
    chunk_size: if set, ``attention.fused_linear_attention`` with chunks of this many
      tokens: the ``[B, L, H, M]`` features are never stored (long sequences); same
      outputs and gradients up to rounding. With ``causal``: the causal chunk.
    causal_path: with ``causal``, ``'fused'`` (the default above) or ``'materialized'``:
      ``attention.materialized_causal_attention``, the L×L weights in matmuls with
      per-token shifts (causal at any scale, exact unless a query–key pair's features are
      ~87 nats apart, see its docstring). Speed: docs/performance.md#layersmodelskernelattention.
  """
  num_heads: int
  feature_map: str = 'favor'
  num_features: int = 256
  qk_mode: str = 'projected'
  orthogonal: bool = False
  causal: bool = False
  chunk_size: Optional[int] = None
  init_radius: Optional[float] = None
  causal_path: str = 'fused'
  identity_init: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, mask: Optional[jax.Array] = None, *,
               inputs_kv: Optional[jax.Array] = None) -> jax.Array:
    """``x: [B, L, E]`` → ``[B, L, E]``.

    ``mask``: ``[B, L]`` (True for real tokens; with ``inputs_kv``: ``[B, L_kv]``, its
    real keys) or flax's ``[B, 1 | H, L, L_kv]`` (``nn.make_attention_mask``; with
    ``causal``, ``nn.combine_masks(nn.make_causal_mask(x), ...)``). ``inputs_kv``:
    ``[B, L_kv, E]`` keys and values for cross-attention (not causal); queries from x.
    """
    if self.qk_mode not in QK_MODES:
      raise ValueError(f'qk_mode must be one of {QK_MODES}, got {self.qk_mode!r}.')
    spec = features.get(self.feature_map, attention=True)   # rff: one line naming the maps
    _checks.check_rank('x', x, 3)
    b, length, width = x.shape
    kv = x if inputs_kv is None else inputs_kv
    if inputs_kv is not None:
      if self.causal:
        raise ValueError('inputs_kv: cross-attention is not causal; got causal=True.')
      if self.chunk_size is not None:
        raise ValueError('inputs_kv: cross-attention runs on stored features; got '
                         f'chunk_size={self.chunk_size} (set None).')
      _checks.check_rank('inputs_kv', inputs_kv, 3)
      if inputs_kv.shape[0] != b or inputs_kv.shape[2] != width:
        raise ValueError(f'inputs_kv must be [B, L_kv, E] with B, E of x {x.shape}, got '
                         f'{inputs_kv.shape}.')
    if width % self.num_heads:
      raise ValueError(f'input width {width} is not divisible by num_heads={self.num_heads}.')
    if mask is not None and jnp.ndim(mask) == 4:
      mask, _ = flax_attention.key_mask_of(mask, b, self.num_heads, length, kv.shape[1],
                                           causal=self.causal)
    check_mask(mask, kv.shape[:2])
    head_dim = width // self.num_heads
    particles = particles_param(self, self.num_heads, self.num_features, head_dim,
                                orthogonal=self.orthogonal, identity=self.identity_init,
                                radius=self.init_radius)
    dense = functools.partial(nn.DenseGeneral, features=(self.num_heads, head_dim))
    if self.qk_mode == 'shared':
      q = x.reshape(b, length, self.num_heads, head_dim)
      k = kv.reshape(b, kv.shape[1], self.num_heads, head_dim)
    else:
      q, k = dense(name='query')(x), dense(name='key')(kv)
    v = dense(name='value')(kv)
    scale = head_dim ** -0.25
    # One feature map per head: vmap over the head axis of inputs and particles.
    # Phase A's data: the per-head mean over real tokens of the (scaled) keys,
    # ``[B, H, D_h]``; collected with ``mutable=['intermediates']``.
    # The mimicry target's data (``coulomb_jax.mimicry``): the unscaled per-head queries
    # and keys, ``([B, L, H, D_h], [B, L, H, D_h])``; a no-op unless collected.
    self.sow('intermediates', flax_attention.MIMICRY_INPUTS, (q, k))
    q, k = q * scale, k * scale
    self.sow('intermediates', flax_attention.PHASE_A_INPUTS, masked_mean(k, mask, axis=1))
    if self.causal_path not in CAUSAL_PATHS:
      raise ValueError(f'causal_path must be one of {CAUSAL_PATHS}, got {self.causal_path!r}.')
    if spec.log_psi is None:           # a signed map (taylor): stored features
      out = self._signed_attention(q, k, v, particles, mask)
    elif self.causal and self.causal_path == 'materialized':
      out = attention.materialized_causal_attention(
          q, k, v, particles, feature_map=self.feature_map, key_mask=mask)
    elif self.causal:
      out = attention.fused_causal_linear_attention(
          q, k, v, particles, feature_map=self.feature_map, key_mask=mask,
          chunk_size=16 if self.chunk_size is None else self.chunk_size)
    elif self.chunk_size is not None:
      out = attention.fused_linear_attention(
          q, k, v, particles, feature_map=self.feature_map, key_mask=mask,
          chunk_size=self.chunk_size)
    else:
      # Stabilised together in log space (shifts per key feature over real keys, and per
      # query row): exact at any input scale.
      pair = lambda qh, kh, w: features.attention_pair(qh, kh, w, self.feature_map, mask)
      q_feat, k_feat = jax.vmap(pair, in_axes=(2, 2, 0), out_axes=2)(q, k, particles)
      out = attention.linear_attention(q_feat, k_feat, v, mask)
    return nn.DenseGeneral(width, axis=(-2, -1), name='out')(out)

  def _signed_attention(self, q, k, v, particles, mask):
    """A signed map (``taylor``): per-token features, stored, then linear attention.

    Per-token features are causal as they are; the kernel is positive, so the denominator
    needs no shift.
    """
    fn = features.get_feature_map(self.feature_map)
    per_head = lambda x: jax.vmap(fn, in_axes=(2, 0), out_axes=2)(x, particles)
    q_feat, k_feat = per_head(q), per_head(k)
    if not self.causal:
      return attention.linear_attention(q_feat, k_feat, v, mask)
    if self.causal_path == 'materialized':
      return attention.materialized_causal_linear_attention(q_feat, k_feat, v, mask)
    return attention.causal_linear_attention(
        q_feat, k_feat, v, mask, chunk_size=16 if self.chunk_size is None else self.chunk_size)


class LinformerAttention(nn.Module):
  r"""Linformer (Wang et al. 2020): keys and values projected along the length.

  K' = Eᵀ K and V' = Fᵀ V with E, F: ``[max_length, P]`` shared by the heads;
  out = softmax(Q K'ᵀ/√D_h) V'. Padded keys and values are zeroed before the
  projection, so padding changes nothing; E and F are sliced to the batch's L.
  """
  num_heads: int
  max_length: int = 128
  proj_length: int = 64

  @nn.compact
  def __call__(self, x: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    b, length, width = x.shape
    check_mask(mask, (b, length))
    if width % self.num_heads:
      raise ValueError(f'input width {width} is not divisible by num_heads={self.num_heads}.')
    if length > self.max_length:
      raise ValueError(f'sequence length {length} exceeds max_length={self.max_length}.')
    head_dim = width // self.num_heads
    dense = functools.partial(nn.DenseGeneral, features=(self.num_heads, head_dim))
    q, k, v = dense(name='query')(x), dense(name='key')(x), dense(name='value')(x)
    if mask is not None:
      keep = mask[:, :, None, None]
      k, v = jnp.where(keep, k, 0.0), jnp.where(keep, v, 0.0)
    init = nn.initializers.normal(stddev=self.proj_length ** -0.5)
    e = self.param('proj_key', init, (self.max_length, self.proj_length))[:length]
    f = self.param('proj_value', init, (self.max_length, self.proj_length))[:length]
    k = jnp.einsum('blhd,lp->bphd', k, e)
    v = jnp.einsum('blhd,lp->bphd', v, f)
    logits = jnp.einsum('bqhd,bphd->bhqp', q, k) / jnp.sqrt(head_dim).astype(q.dtype)
    weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(v.dtype)
    out = jnp.einsum('bhqp,bphd->bqhd', weights, v)
    return nn.DenseGeneral(width, axis=(-2, -1), name='out')(out)


class SoftmaxAttention(nn.Module):
  """Softmax attention (Vaswani et al.): flax's dot-product attention, padded keys
  (``mask: [B, L]`` False) masked; ``causal=True`` also hides keys after each query.

  ``attention_fn``: what ``nn.MultiHeadDotProductAttention`` computes from its projected
  ``(query, key, value)`` (default flax's ``dot_product_attention``). A trained softmax
  model is *converted* to linear attention by passing
  ``flax_attention.kernel_attention_fn(omega)``: the parameters (query, key, value,
  out) are the same, so the trained ones load unchanged.
  """
  num_heads: int
  causal: bool = False
  attention_fn: Optional[Callable] = None

  @nn.compact
  def __call__(self, x: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    check_mask(mask, x.shape[:2])
    attn_mask = None if mask is None else nn.make_attention_mask(mask, mask)
    if self.causal:
      attn_mask = nn.combine_masks(nn.make_causal_mask(jnp.ones(x.shape[:2], bool)), attn_mask)
    kwargs = {} if self.attention_fn is None else {'attention_fn': self.attention_fn}
    return nn.MultiHeadDotProductAttention(num_heads=self.num_heads, name='mha', **kwargs)(
        x, x, mask=attn_mask, deterministic=True)


class EncoderLayer(nn.Module):
  """Pre-LayerNorm Transformer block: x + Attn(LN x), then x + FFN(LN x)."""
  attention: nn.Module
  ffn_dim: int
  dropout_rate: float

  @nn.compact
  def __call__(self, x, mask, deterministic: bool):
    drop = nn.Dropout(self.dropout_rate, deterministic=deterministic)
    x = x + drop(self.attention(nn.LayerNorm(name='ln_attention')(x), mask))
    h = nn.LayerNorm(name='ln_ffn')(x)
    h = nn.Dense(self.ffn_dim, name='ffn_in')(h)
    h = nn.Dense(x.shape[-1], name='ffn_out')(nn.gelu(h))
    return x + drop(h)


class EncoderClassifier(nn.Module):
  """Token + position (+ segment) embeddings, ``num_layers`` blocks, mean pooling, logits.

  ``attention`` picks the block's attention: ``"kernel"`` (``KernelAttention``:
  the Vanilla-X / Kernel-X models, and Performer with ``feature_map="favor"``,
  ``qk_mode="projected"``, ``orthogonal=True``), ``"softmax"`` or ``"linformer"``.
  Call with ``ids, segments: [B, L]`` int and ``mask: [B, L]`` bool (True = real
  token); returns ``[B, num_classes]`` float32 logits. Padding changes neither: padded
  slots may hold any integer (they are embedded as id 0). ``attention_fns`` (with
  ``attention="softmax"``): one ``attention_fn`` per layer for ``SoftmaxAttention``, e.g.
  ``flax_attention.kernel_attention_fn`` of that layer's particles (the conversion of a
  trained softmax model; same parameters). Eager calls check that real
  ids lie in [0, vocab_size) and segments in {0, 1} (one ValueError naming the value);
  under jit out-of-range real ids are not checked.
  """
  vocab_size: int
  num_classes: int = 2
  max_length: int = 128
  width: int = 128
  num_layers: int = 2
  num_heads: int = 2
  ffn_dim: int = 256
  dropout_rate: float = 0.1
  attention: str = 'kernel'
  feature_map: str = 'favor'
  num_features: int = 256
  qk_mode: str = 'shared'
  orthogonal: bool = False
  linformer_length: int = 64
  chunk_size: Optional[int] = None
  init_radius: Optional[float] = None
  attention_fns: Optional[Sequence[Callable]] = None

  def _attention(self, index):
    name = f'attention_{index}'
    if self.attention_fns is not None and self.attention != 'softmax':
      raise ValueError("attention_fns: only for attention='softmax' (the model to convert), "
                       f'got attention={self.attention!r}.')
    if self.attention == 'kernel':
      return KernelAttention(num_heads=self.num_heads, feature_map=self.feature_map,
                             num_features=self.num_features, qk_mode=self.qk_mode,
                             orthogonal=self.orthogonal, chunk_size=self.chunk_size,
                             init_radius=self.init_radius, name=name)
    if self.attention == 'softmax':
      fns = self.attention_fns
      if fns is not None and len(fns) != self.num_layers:
        raise ValueError(f'attention_fns: expected one per layer ({self.num_layers}), got '
                         f'{len(fns)}.')
      return SoftmaxAttention(num_heads=self.num_heads, name=name,
                              attention_fn=None if fns is None else fns[index])
    if self.attention == 'linformer':
      return LinformerAttention(num_heads=self.num_heads, max_length=self.max_length,
                                proj_length=self.linformer_length, name=name)
    raise ValueError(f'attention must be one of {ATTENTION_KINDS}, got {self.attention!r}.')

  @nn.compact
  def __call__(self, ids, segments, mask, *, deterministic: bool = True):
    _checks.check_rank('ids', ids, 2)
    if jnp.shape(segments) != jnp.shape(ids):
      raise ValueError(f'segments must have the shape of ids {jnp.shape(ids)}, got '
                       f'{jnp.shape(segments)}.')
    check_mask(mask, ids.shape)
    _checks.check_ids('ids', ids, self.vocab_size, mask)
    _checks.check_ids('segments', segments, 2, mask)
    length = ids.shape[1]
    if length > self.max_length:
      raise ValueError(f'ids: length {length} exceeds max_length={self.max_length}.')
    check_param_shapes(self, {('tokens', 'embedding'): (self.vocab_size, self.width),
                              ('positions',): (self.max_length, self.width)},
                       f'vocab_size={self.vocab_size}, max_length={self.max_length}, '
                       f'width={self.width}')
    if mask is not None:           # padded slots may hold anything: they embed as id 0
      ids, segments = jnp.where(mask, ids, 0), jnp.where(mask, segments, 0)
    embed_init = nn.initializers.normal(stddev=0.02)
    x = nn.Embed(self.vocab_size, self.width, embedding_init=embed_init, name='tokens')(ids)
    x = x + nn.Embed(2, self.width, embedding_init=embed_init, name='segments')(segments)
    pos = self.param('positions', embed_init, (self.max_length, self.width))
    x = x + pos[None, :length]
    x = nn.Dropout(self.dropout_rate, deterministic=deterministic)(x)
    for i in range(self.num_layers):
      x = EncoderLayer(self._attention(i), self.ffn_dim, self.dropout_rate,
                       name=f'layer_{i}')(x, mask, deterministic)
    pooled = masked_mean(nn.LayerNorm(name='ln_final')(x), mask, axis=1)
    return nn.Dense(self.num_classes, name='classifier')(pooled).astype(jnp.float32)
