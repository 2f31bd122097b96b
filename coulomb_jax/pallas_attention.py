r"""Linear attention as Pallas kernels (GPU; interpret mode elsewhere).

Bidirectional (``pallas_linear_attention``, below) and causal
(``pallas_causal_linear_attention``, at the end of the module).

``pallas_linear_attention(q, k, v, omega, ...)`` computes the same thing as
``attention.fused_linear_attention`` (φ = the per-head feature map of the
particles ``omega``, never stored for all L) but as two kernels, so that on a
GPU every feature block lives in registers / shared memory and only q, k, v,
the output and the small ``[F, D]`` states cross HBM:

1. **keys** (grid ``[B, H, S, F/F_b]``): program (b, h, s, f) walks its split s
   of the keys in blocks of C_k rows, computes φ_f(k) ``[C_k, F_b]`` for its
   feature block f and accumulates the partial state

   .. math:: S_{s,f} = \sum_{j ∈ s} φ_f(k_j) v_jᵀ  \;[F_b, D],\qquad
             z_{s,f} = \sum_{j ∈ s} φ_f(k_j) \;[F_b].

   For ``favor`` the exponent of feature f is shifted by an online max
   m_{s,f} (rescaling row f of S and z when a block raises it, as in flash
   attention); the partials are then combined in JAX with the factors
   e^{m_{s,f} − max_s m_{s,f}}, so the final shift of feature f is its max
   over all real keys of (b, h): exactly ``features.favor_pair``'s.
2. **queries** (grid ``[B, H, L/C_q]``): out = φ(q) S / max(φ(q)ᵀ z, eps),
   walking the feature blocks with an online per-row max for ``favor`` (its
   logits plus the keys' shifts m_f, as in ``features.favor_pair``; the row
   shift cancels between numerator and denominator).

Splitting the keys over S programs gives the GPU B·H·S·F/F_b programs even for
small B·H. HBM traffic: q, k, v read once, the output written once, plus the
partial states ``[B, H, S, F, D]`` (small next to q, k, v at long L).

All seven attention maps (``PALLAS_FEATURE_MAPS``). ``softmaxfeat``'s per-row
softmax couples every feature: its key kernel first walks all particle blocks
for each key row's log-sum-exp (so the key-side projections are computed
M/F_b + 1 times), and its query kernel carries an online sum alongside the max.

There is no backward kernel: under differentiation a ``jax.custom_vjp`` runs
``fused_linear_attention``'s XLA path forward and backward, so gradients (and
training cost) are the reference path's and the kernels serve the forward
passes of inference and evaluation.

Written against the Triton backend of ``jax.experimental.pallas``. On a CPU
(tests) the kernels run in Pallas interpret mode, with float32 dots.
"""

import functools
import logging
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from coulomb_jax import _checks
from coulomb_jax import attention

PALLAS_FEATURE_MAPS = ('favor', 'elu', 'softplus', 'sigmoid2', 'cos2', 'softmaxfeat',
                       'porf_softplus')
"""The maps ``pallas_linear_attention`` computes inside its kernels."""

_NEG = -1e30  # Finite "minus infinity" for masked logits and empty running maxima.


def _dot(a, b, trans_a=False, trans_b=False, precision=None):
  """2-D a @ b (either side transposed) accumulated in float32."""
  dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
  return jax.lax.dot_general(a, b, dims, precision=precision,
                             preferred_element_type=jnp.float32)


def _project(x, omega):
  """s = x ωᵀ in float32: the exponent of most maps, so never with bf16 operands.

  Float32 inputs: the backend's default float32 dot (on recent NVIDIA GPUs Triton
  lowers it to TF32, as XLA's default precision does for the reference path).
  16-bit inputs: TF32 explicitly; the particles stay float32, so they are not
  rounded to bf16.
  """
  fast = x.dtype.itemsize < 4
  return _dot(x.astype(jnp.float32), omega, trans_b=True,
              precision=jax.lax.Precision.HIGH if fast else None)


def _softplus(s):
  return jnp.maximum(s, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(s)))


def _psi(name, s, half_sq_norm, shift):
  """ψ(s) of ``features.<name>`` in float32 (before the 1/√M); ``shift``: favor's m."""
  if name == 'favor':
    return jnp.exp(s - half_sq_norm - shift)
  if name == 'elu':
    return jnp.where(s > 0, s + 1.0, jnp.exp(jnp.minimum(s, 0.0)))
  if name == 'softplus':
    return _softplus(s)
  if name == 'sigmoid2':
    sig = 1.0 / (1.0 + jnp.exp(-s))
    return sig * sig
  if name == 'cos2':
    c = jnp.cos(s)
    return c * c
  if name == 'porf_softplus':
    return _softplus(s - half_sq_norm)
  raise ValueError(f'feature_map: no elementwise ψ for {name!r}.')


def _key_kernel(k_ref, v_ref, mask_ref, omega_ref, s_ref, z_ref, m_ref, *, name,
                block_k, num_blocks, scale):
  """One (b, h, split, feature block): partial S [F_b, D], z [F_b] and favor's shifts m [F_b]."""
  omega = omega_ref[...]                                   # [F_b, d]
  f_b, d_v = omega.shape[0], v_ref.shape[-1]

  def body(i, carry):
    acc, z, m = carry
    rows = pl.ds(i * block_k, block_k)
    k = k_ref[rows, :]                                     # [C_k, d]
    v = v_ref[rows, :]                                     # [C_k, D]
    keep = mask_ref[rows] > 0                              # [C_k]
    s = _project(k, omega)                                 # [C_k, F_b]
    kf = k.astype(jnp.float32)
    half = 0.5 * jnp.sum(kf * kf, axis=1, keepdims=True)   # [C_k, 1]
    if name == 'favor':
      # One running max per feature (row f of acc and z rescaled when it rises).
      logits = jnp.where(keep[:, None], s - half, _NEG)
      m_new = jnp.maximum(m, jnp.max(logits, axis=0))     # [F_b]
      decay = jnp.exp(m - m_new)
      acc, z = acc * decay[:, None], z * decay
      phi = jnp.exp(logits - m_new[None, :])
    else:
      m_new = m
      phi = _psi(name, s, half, 0.0)
    # where, not a product: masked rows are 0 even while the running max is still −1e30.
    phi = jnp.where(keep[:, None], phi * scale, 0.0).astype(v.dtype)
    v = jnp.where(keep[:, None], v, 0).astype(v.dtype)   # never read padded values
    acc = acc + _dot(phi, v, trans_a=True)
    z = z + jnp.sum(phi.astype(jnp.float32), axis=0)     # the same (rounded) φ as in S
    return acc, z, m_new

  init = (jnp.zeros((f_b, d_v), jnp.float32), jnp.zeros((f_b,), jnp.float32),
          jnp.full((f_b,), _NEG if name == 'favor' else 0.0, jnp.float32))
  acc, z, m = jax.lax.fori_loop(0, num_blocks, body, init)
  s_ref[...] = acc
  z_ref[...] = z
  m_ref[...] = m


def _query_kernel(q_ref, omega_ref, s_ref, z_ref, *refs, name, block_f, num_blocks,
                  scale, eps):
  """One (b, h, query block): out = φ(q) S / max(φ(q)ᵀ z, eps), [C_q, D].

  ``refs``: (m_ref, o_ref) for favor (m: the keys' per-feature shifts, added to
  the query logits as in ``features.favor_pair``), else (o_ref,).
  """
  m_ref, o_ref = refs if name == 'favor' else (None,) + refs
  q = q_ref[...]                                           # [C_q, d]
  c_q, d_v = q.shape[0], s_ref.shape[-1]
  qf = q.astype(jnp.float32)
  half = 0.5 * jnp.sum(qf * qf, axis=1, keepdims=True)     # [C_q, 1]

  def body(i, carry):
    num, den, m = carry                                    # [C_q, D], [C_q], [C_q]
    feats = pl.ds(i * block_f, block_f)
    omega = omega_ref[feats, :]                            # [F_b, d]
    s_blk = s_ref[feats, :]                                # [F_b, D] float32
    z_blk = z_ref[feats]                                   # [F_b]
    s = _project(q, omega)                                 # [C_q, F_b]
    if name == 'favor':
      logits = s - half + m_ref[feats][None, :]
      m_new = jnp.maximum(m, jnp.max(logits, axis=1))
      rescale = jnp.exp(m - m_new)
      num, den = num * rescale[:, None], den * rescale
      phi = jnp.exp(logits - m_new[:, None])
    else:
      m_new = m
      phi = _psi(name, s, half, 0.0)
    # φ(q) S in q's dtype (bf16 inputs: a bf16 product; the denominator uses the
    # same rounded φ, so only the state's rounding differs between the two).
    phi = (phi * scale).astype(q.dtype)
    num = num + _dot(phi, s_blk.astype(q.dtype))
    den = den + jnp.sum(phi.astype(jnp.float32) * z_blk[None, :], axis=1)
    return num, den, m_new

  init = (jnp.zeros((c_q, d_v), jnp.float32), jnp.zeros((c_q,), jnp.float32),
          jnp.full((c_q,), _NEG if name == 'favor' else 0.0, jnp.float32))
  num, den, _ = jax.lax.fori_loop(0, num_blocks, body, init)
  o_ref[...] = (num / jnp.maximum(den, eps)[:, None]).astype(o_ref.dtype)


def _key_kernel_softmax(k_ref, v_ref, mask_ref, omega_ref, sp_ref, sm_ref, zp_ref, zm_ref, *,
                        block_k, block_f, num_blocks, num_feature_blocks, scale):
  """``softmaxfeat`` keys, one (b, h, split, particle block f).

  φ(k) = 2√M·softmax([s, −s]) couples all 2M features through the row's
  log-sum-exp, so each key block first walks every particle block for it
  (online, as flash attention's softmax), then accumulates its own block's
  features [φ⁺ | φ⁻] = 2√M·exp([s_f, −s_f] − lse) into S⁺, S⁻ and z⁺, z⁻. No
  shift is left over: every feature is at most 2√M.
  """
  f = pl.program_id(3)
  omega = omega_ref[pl.ds(f * block_f, block_f), :]        # [F_b, d]
  d_v = v_ref.shape[-1]

  def body(i, carry):
    acc_p, acc_m, z_p, z_m = carry
    rows = pl.ds(i * block_k, block_k)
    k = k_ref[rows, :]                                     # [C_k, d]
    v = v_ref[rows, :]                                     # [C_k, D]
    keep = mask_ref[rows] > 0                              # [C_k]

    def lse_body(g, mc):
      m, total = mc                                        # [C_k], [C_k]
      s_g = _project(k, omega_ref[pl.ds(g * block_f, block_f), :])
      m_new = jnp.maximum(m, jnp.max(jnp.abs(s_g), axis=1))   # max over [s, −s]
      total = total * jnp.exp(m - m_new) + jnp.sum(
          jnp.exp(s_g - m_new[:, None]) + jnp.exp(-s_g - m_new[:, None]), axis=1)
      return m_new, total

    m, total = jax.lax.fori_loop(
        0, num_feature_blocks, lse_body,
        (jnp.zeros((block_k,), jnp.float32), jnp.zeros((block_k,), jnp.float32)))
    lse = (m + jnp.log(total))[:, None]                     # [C_k, 1]; |s| ≥ 0 so m ≥ 0
    s = _project(k, omega)                                 # [C_k, F_b]
    phi_p = jnp.where(keep[:, None], jnp.exp(s - lse), 0.0) * scale
    phi_m = jnp.where(keep[:, None], jnp.exp(-s - lse), 0.0) * scale
    v = jnp.where(keep[:, None], v, 0).astype(v.dtype)
    acc_p = acc_p + _dot(phi_p.astype(v.dtype), v, trans_a=True)
    acc_m = acc_m + _dot(phi_m.astype(v.dtype), v, trans_a=True)
    return acc_p, acc_m, z_p + jnp.sum(phi_p, axis=0), z_m + jnp.sum(phi_m, axis=0)

  zeros = lambda *shape: jnp.zeros(shape, jnp.float32)
  acc_p, acc_m, z_p, z_m = jax.lax.fori_loop(
      0, num_blocks, body, (zeros(block_f, d_v), zeros(block_f, d_v), zeros(block_f),
                            zeros(block_f)))
  sp_ref[...] = acc_p
  sm_ref[...] = acc_m
  zp_ref[...] = z_p
  zm_ref[...] = z_m


def _query_kernel_softmax(q_ref, omega_ref, sp_ref, sm_ref, zp_ref, zm_ref, o_ref, *,
                          block_f, num_blocks, scale, eps):
  """``softmaxfeat`` queries, one (b, h, query block).

  Walks the particle blocks with an online row max m and sum Σ e^{±s − m}, so
  that φ(q) = 2√M·e^{[s, −s] − m} / Σ is exact at the end (the eps guard sees
  the true denominator, as in the XLA path).
  """
  q = q_ref[...]                                           # [C_q, d]
  c_q, d_v = q.shape[0], sp_ref.shape[-1]

  def body(i, carry):
    num, den, m, total = carry                             # [C_q, D], [C_q] × 3
    feats = pl.ds(i * block_f, block_f)
    s = _project(q, omega_ref[feats, :])                   # [C_q, F_b]
    m_new = jnp.maximum(m, jnp.max(jnp.abs(s), axis=1))
    rescale = jnp.exp(m - m_new)
    e_p, e_m = jnp.exp(s - m_new[:, None]), jnp.exp(-s - m_new[:, None])
    cast = lambda a: a.astype(q.dtype)
    num = (num * rescale[:, None] + _dot(cast(e_p), cast(sp_ref[feats, :]))
           + _dot(cast(e_m), cast(sm_ref[feats, :])))
    den = (den * rescale + jnp.sum(e_p * zp_ref[feats][None, :], axis=1)
           + jnp.sum(e_m * zm_ref[feats][None, :], axis=1))
    total = total * rescale + jnp.sum(e_p + e_m, axis=1)
    return num, den, m_new, total

  zeros = lambda *shape: jnp.zeros(shape, jnp.float32)
  num, den, _, total = jax.lax.fori_loop(
      0, num_blocks, body, (zeros(c_q, d_v), zeros(c_q), zeros(c_q), zeros(c_q)))
  norm = (scale / total)[:, None]                          # 2√M / Σ
  o_ref[...] = (num * norm / jnp.maximum(den[:, None] * norm, eps)).astype(o_ref.dtype)


def _pad_rows(a, length):
  pad = length - a.shape[1]
  if not pad:
    return a
  return jnp.pad(a, ((0, 0), (0, pad)) + ((0, 0),) * (a.ndim - 2))


def _forward(q, k, v, omega, key_mask, *, name, block_q, block_k, block_f, num_splits, eps,
             interpret, num_warps, num_stages):
  b, length, h, dim = q.shape
  d_v, num_features = v.shape[-1], omega.shape[1]
  out_dtype = v.dtype
  if interpret:  # XLA's CPU backend has no bf16 × bf16 → f32 dot.
    q, k, v = (a.astype(jnp.promote_types(a.dtype, jnp.float32)) for a in (q, k, v))
  omega = omega.astype(jnp.float32)
  scale = 1.0 / math.sqrt(num_features)
  params = dict(compiler_params=plgpu.CompilerParams(num_warps=num_warps,
                                                     num_stages=num_stages),
                interpret=interpret)

  # Keys: split L into num_splits ranges of a whole number of C_k blocks.
  blocks_per_split = pl.cdiv(pl.cdiv(length, block_k), num_splits)
  split_len = blocks_per_split * block_k
  mask = jnp.ones((b, length), jnp.int32) if key_mask is None else key_mask.astype(jnp.int32)
  k_p, v_p, mask_p = (_pad_rows(a, num_splits * split_len) for a in (k, v, mask))
  n_f = num_features // block_f
  part = lambda *shape: jax.ShapeDtypeStruct((b, h, num_splits) + shape, jnp.float32)
  rows_spec = lambda width: pl.BlockSpec((None, split_len, None, width),
                                         lambda i, j, s, f: (i, s, j, 0))
  state_spec = pl.BlockSpec((None, None, None, block_f, d_v), lambda i, j, s, f: (i, j, s, f, 0))
  norm_spec = pl.BlockSpec((None, None, None, block_f), lambda i, j, s, f: (i, j, s, f))
  key_inputs = [rows_spec(dim), rows_spec(d_v),
                pl.BlockSpec((None, split_len), lambda i, j, s, f: (i, s))]
  if name == 'softmaxfeat':
    # Outputs S⁺, S⁻, z⁺, z⁻ (features [φ⁺ | φ⁻]); every program reads all particles.
    sp, sm, zp, zm = pl.pallas_call(
        functools.partial(_key_kernel_softmax, block_k=block_k, block_f=block_f,
                          num_blocks=blocks_per_split, num_feature_blocks=n_f,
                          scale=2.0 * math.sqrt(num_features)),
        grid=(b, h, num_splits, n_f),
        in_specs=key_inputs + [pl.BlockSpec((None, num_features, dim),
                                            lambda i, j, s, f: (j, 0, 0))],
        out_specs=[state_spec, state_spec, norm_spec, norm_spec],
        out_shape=[part(num_features, d_v)] * 2 + [part(num_features)] * 2,
        **params)(k_p, v_p, mask_p, omega)
    states = [jnp.sum(a, axis=2) for a in (sp, sm, zp, zm)]      # Over the splits.
    kernel = functools.partial(_query_kernel_softmax, block_f=block_f, num_blocks=n_f,
                               scale=2.0 * math.sqrt(num_features), eps=eps)
  else:
    s_part, z_part, m_part = pl.pallas_call(
        functools.partial(_key_kernel, name=name, block_k=block_k,
                          num_blocks=blocks_per_split, scale=scale),
        grid=(b, h, num_splits, n_f),
        in_specs=key_inputs + [pl.BlockSpec((None, block_f, dim),
                                            lambda i, j, s, f: (j, f, 0))],
        out_specs=[state_spec, norm_spec, norm_spec],
        out_shape=[part(num_features, d_v), part(num_features), part(num_features)],
        **params)(k_p, v_p, mask_p, omega)
    # Combine the partials on one shift per feature (favor): the max over the splits.
    m = jnp.max(m_part, axis=2, keepdims=True)                    # [B, H, 1, F]
    w = jnp.exp(m_part - m)                                       # [B, H, S, F]
    states = [jnp.einsum('bhsf,bhsfd->bhfd', w, s_part),          # [B, H, F, D]
              jnp.sum(w * z_part, axis=2)]                        # [B, H, F]
    if name == 'favor':       # No real key at all: m stays −1e30 (S, z are 0); use 0.
      states.append(jnp.where(m[:, :, 0] > 0.5 * _NEG, m[:, :, 0], 0.0))
    kernel = functools.partial(_query_kernel, name=name, block_f=block_f, num_blocks=n_f,
                               scale=scale, eps=eps)

  # Queries.
  q_len = pl.cdiv(length, block_q) * block_q
  state_in = pl.BlockSpec((None, None, num_features, d_v), lambda i, j, c: (i, j, 0, 0))
  norm_in = pl.BlockSpec((None, None, num_features), lambda i, j, c: (i, j, 0))
  out = pl.pallas_call(
      kernel,
      grid=(b, h, q_len // block_q),
      in_specs=[pl.BlockSpec((None, block_q, None, dim), lambda i, j, c: (i, c, j, 0)),
                pl.BlockSpec((None, num_features, dim), lambda i, j, c: (j, 0, 0))]
               + [state_in if a.ndim == 4 else norm_in for a in states],
      out_specs=pl.BlockSpec((None, block_q, None, d_v), lambda i, j, c: (i, c, j, 0)),
      out_shape=jax.ShapeDtypeStruct((b, q_len, h, d_v), out_dtype),
      **params)(_pad_rows(q, q_len), omega, *states)
  return out[:, :length]


def _with_xla_gradients(forward, reference):
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


_attend = _with_xla_gradients(
    _forward, lambda q, k, v, omega, key_mask, opts: attention.fused_linear_attention(
        q, k, v, omega, feature_map=opts['name'], key_mask=key_mask, eps=opts['eps'],
        implementation='xla'))


def _power_of_two(name, value):
  value = _checks.check_int(name, value, 1)
  if value & (value - 1):
    raise ValueError(f'{name} must be a power of two (Triton block shapes), got {value}.')
  return value


def pallas_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, omega: jax.Array, *,
                            feature_map: str = 'favor', key_mask: Optional[jax.Array] = None,
                            block_q: int = 64, block_k: int = 64, block_f: Optional[int] = None,
                            num_splits: Optional[int] = None,
                            eps: float = attention.DEFAULT_EPS,
                            interpret: Optional[bool] = None, num_warps: int = 4,
                            num_stages: int = 2) -> jax.Array:
  r"""``fused_linear_attention``'s result from two Pallas kernels, ``[B, L, H, D]``.

  Args:
    q, k: ``[B, L, H, d]`` queries and keys, already scaled; v: ``[B, L, H, D]``.
    omega: ``[H, M, d]`` particles, one set per head.
    feature_map: a name in ``PALLAS_FEATURE_MAPS``.
    key_mask: optional ``[B, L]`` bool, True for real tokens.
    block_q, block_k: rows of queries / keys per block (powers of two; L need
      not be a multiple: the tail is padded and masked).
    block_f: features per block; a power of two dividing M (default:
      gcd(M, 64), the largest such power up to 64).
    num_splits: key splits S per (b, h) (default: one per 4096 keys, at most
      64), so that the key kernel has B·H·S·M/F_b programs.
    eps: denominator guard.
    interpret: run the kernels in Pallas interpret mode (default: True unless
      the default backend is a GPU).
    num_warps, num_stages: Triton launch parameters.
  """
  attention.check_fused_inputs(q, k, v, omega, key_mask, feature_map, PALLAS_FEATURE_MAPS)
  length = q.shape[1]
  if block_f is None:
    block_f = math.gcd(omega.shape[1], 64)
  block_q, block_k, block_f = (_power_of_two(n, x) for n, x in
                               (('block_q', block_q), ('block_k', block_k),
                                ('block_f', block_f)))
  if omega.shape[1] % block_f:
    raise ValueError(f'block_f must divide the number of particles M = {omega.shape[1]}, '
                     f'got {block_f}.')
  if num_splits is None:
    num_splits = min(64, pl.cdiv(length, 4096))
  num_splits = _checks.check_int('num_splits', num_splits, 1)
  if interpret is None:
    interpret = jax.default_backend() != 'gpu'
  options = (('name', feature_map), ('block_q', block_q), ('block_k', block_k),
             ('block_f', block_f), ('num_splits', num_splits), ('eps', float(eps)),
             ('interpret', bool(interpret)), ('num_warps', num_warps),
             ('num_stages', num_stages))
  return _attend(q, k, v, omega, key_mask, options)


def _shape_supported(q_shape, v_shape, omega_shape, feature_map) -> bool:
  """Whether the default blocks fit: Triton dots need power-of-two sides ≥ 16."""
  pow2 = lambda x: x >= 16 and not x & (x - 1)
  return (feature_map in PALLAS_FEATURE_MAPS and pow2(q_shape[-1]) and pow2(v_shape[-1])
          and omega_shape[1] % 64 == 0)


@functools.lru_cache(maxsize=None)
def _compiles(q, k, v, omega, key_mask, feature_map, interpret) -> bool:
  """Whether the kernels lower and compile for these ``ShapeDtypeStruct``s (cached)."""
  fn = functools.partial(pallas_linear_attention, feature_map=feature_map,
                         interpret=interpret)
  try:
    jax.jit(fn).lower(q, k, v, omega, key_mask=key_mask).compile()
    return True
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('pallas_linear_attention does not compile for %s (%s: %s); using the '
                    'XLA path.', (q, feature_map), type(e).__name__, e)
    return False


def use_by_default(q, k, v, omega, feature_map, key_mask=None, *, interpret=False) -> bool:
  """Whether ``fused_linear_attention(implementation='auto')`` takes the kernels.

  True on a single-device GPU process for a supported map and shape whose
  kernels compile (tried once per shape, then cached; a failure logs a warning
  and keeps the XLA path). Several devices keep the XLA path: a ``pallas_call``
  is not split by XLA's SPMD partitioner (wrap this module's function in
  ``shard_map`` to use it per device). ``interpret`` only exists for tests.
  """
  if not interpret and (jax.default_backend() != 'gpu' or jax.device_count() != 1):
    return False
  if not _shape_supported(q.shape, v.shape, omega.shape, feature_map):
    return False
  spec = lambda a: None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype)
  return _compiles(spec(q), spec(k), spec(v), spec(omega), spec(key_mask), feature_map,
                   interpret)


# ------------------------------------------------------------------------------ causal

def _causal_kernel(q_ref, k_ref, v_ref, mask_ref, omega_ref, o_ref, *, name, chunk,
                   block_f, num_chunks, num_feature_blocks, eps):
  """One (b, h): out_i = Σ_{j≤i} φ(q_i)·φ(k_j) v_j / Σ_{j≤i} φ(q_i)·φ(k_j), chunk by chunk.

  The running state S = Σ φ(k_j) v_jᵀ, z = Σ φ(k_j) of the chunks before is kept
  in registers as one ``[F_b, D]`` block per particle block (a Python loop over
  the blocks). Per chunk of C rows: every block's projections, the shifts (favor:
  each feature's running max over the keys of the prefix, which rescales its row
  of S and z, added to the query logits, then each query row's max, as in
  ``features.favor_pair``; softmaxfeat: each row's log-sum-exp), then
  out = (A v + φ(q) S) / (A 1 + φ(q)·z) with A = tril(φ(q) φ(k)ᵀ) inside the
  chunk, and S, z updated.
  """
  n_f, m_total = num_feature_blocks, omega_ref.shape[0]
  d_v = v_ref.shape[-1]
  favor, softmax = name == 'favor', name == 'softmaxfeat'
  scale = 2.0 * math.sqrt(m_total) if softmax else 1.0 / math.sqrt(m_total)
  causal = jnp.arange(chunk)[:, None] >= jnp.arange(chunk)[None, :]
  omegas = [omega_ref[pl.ds(f * block_f, block_f), :] for f in range(n_f)]

  def row_shift(logits):
    """Per row of [C, ·] logits: max (favor) or log-sum-exp over [s, −s] (softmaxfeat)."""
    if favor:
      return functools.reduce(jnp.maximum, [jnp.max(s, axis=1) for s in logits])
    m = functools.reduce(jnp.maximum, [jnp.max(jnp.abs(s), axis=1) for s in logits])
    total = sum(jnp.sum(jnp.exp(s - m[:, None]) + jnp.exp(-s - m[:, None]), axis=1)
                for s in logits)
    return m + jnp.log(total)

  def feats(s, half, shift):
    """[C, F_b] features of one particle block (softmaxfeat: the [φ⁺, φ⁻] pair)."""
    if softmax:
      return (jnp.exp(s - shift) * scale, jnp.exp(-s - shift) * scale)
    return (_psi(name, s, half, shift) * scale,)

  def body(t, carry):
    states, norms, m = carry    # n_f (or 2·n_f) × [F_b, D], × [F_b]; favor: n_f × [F_b] shifts
    rows = pl.ds(t * chunk, chunk)
    q, k, v = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :]
    keep = mask_ref[rows] > 0                                       # [C]
    qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
    half_q = 0.5 * jnp.sum(qf * qf, axis=1, keepdims=True)         # [C, 1]
    half_k = 0.5 * jnp.sum(kf * kf, axis=1, keepdims=True)
    sq = [_project(q, w) for w in omegas]                          # n_f × [C, F_b]
    sk = [_project(k, w) for w in omegas]
    if favor:
      # Keys: each feature's running max over the prefix (this chunk included); queries:
      # logits plus those shifts, minus each row's max (as features.favor_pair).
      lk = [jnp.where(keep[:, None], s - half_k, _NEG) for s in sk]
      m_new = [jnp.maximum(mf, jnp.max(l, axis=0)) for mf, l in zip(m, lk)]
      decay = [jnp.exp(mf - mn) for mf, mn in zip(m, m_new)]
      states = [s * dc[:, None] for s, dc in zip(states, decay)]
      norms = [z * dc for z, dc in zip(norms, decay)]
      m_q = [jnp.where(mn > 0.5 * _NEG, mn, 0.0) for mn in m_new]   # 0 before any real key
      shift_q = row_shift([s - half_q + mq[None, :] for s, mq in zip(sq, m_q)])[:, None]
      phi_q = [_psi(name, s, half_q, shift_q - mq[None, :]) * scale for s, mq in zip(sq, m_q)]
      phi_k = [jnp.where(keep[:, None], jnp.exp(l - mn[None, :]) * scale, 0.0)
               for l, mn in zip(lk, m_new)]
    else:
      m_new = m
      shift_q = shift_k = 0.0
      if softmax:
        shift_q, shift_k = row_shift(sq)[:, None], row_shift(sk)[:, None]
      phi_q = [p for s in sq for p in feats(s, half_q, shift_q)]
      phi_k = [jnp.where(keep[:, None], p, 0.0) for s in sk for p in feats(s, half_k, shift_k)]
    v = jnp.where(keep[:, None], v, 0).astype(jnp.float32)
    a = sum(_dot(pq, pk, trans_b=True) for pq, pk in zip(phi_q, phi_k))   # [C, C]
    a = jnp.where(causal, a, 0.0)
    num = _dot(a, v) + sum(_dot(pq, s) for pq, s in zip(phi_q, states))
    den = jnp.sum(a, axis=1) + sum(jnp.sum(pq * z[None, :], axis=1)
                                   for pq, z in zip(phi_q, norms))
    o_ref[rows, :] = (num / jnp.maximum(den, eps)[:, None]).astype(o_ref.dtype)
    states = [s + _dot(pk, v, trans_a=True) for s, pk in zip(states, phi_k)]
    norms = [z + jnp.sum(pk, axis=0) for z, pk in zip(norms, phi_k)]
    return states, norms, m_new

  width = 2 * n_f if softmax else n_f
  init = ([jnp.zeros((block_f, d_v), jnp.float32)] * width,
          [jnp.zeros((block_f,), jnp.float32)] * width,
          [jnp.full((block_f,), _NEG, jnp.float32)] * n_f if favor else jnp.float32(0.0))
  jax.lax.fori_loop(0, num_chunks, body, init)


def _causal_reference(q, k, v, omega, key_mask, *, name, eps):
  """The XLA path: per-head features stored, then ``attention.causal_linear_attention``.

  favor: ``features.favor_pair`` (per key feature over all real keys, and per
  query row; constants per feature, so they cancel as the kernel's prefix maxima do).
  """
  from coulomb_jax import features  # pylint: disable=g-import-not-at-top
  per_head = lambda f, x: jax.vmap(f, in_axes=(2, 0), out_axes=2)(x, omega)
  if name == 'favor':
    pair = lambda qh, kh, w: features.favor_pair(qh, kh, w, key_mask)
    qf, kf = jax.vmap(pair, in_axes=(2, 2, 0), out_axes=2)(q, k, omega)
  else:
    fm = features.get_feature_map(name)
    qf, kf = per_head(fm, q), per_head(fm, k)
  return attention.causal_linear_attention(qf, kf, v, key_mask, eps=eps)


def _causal_forward(q, k, v, omega, key_mask, *, name, chunk, block_f, eps, interpret,
                    num_warps, num_stages):
  b, length, h, dim = q.shape
  d_v, num_features = v.shape[-1], omega.shape[1]
  out_dtype = v.dtype
  if interpret:
    q, k, v = (a.astype(jnp.promote_types(a.dtype, jnp.float32)) for a in (q, k, v))
  padded = pl.cdiv(length, chunk) * chunk
  mask = jnp.ones((b, length), jnp.int32) if key_mask is None else key_mask.astype(jnp.int32)
  q, k, v, mask = (_pad_rows(a, padded) for a in (q, k, v, mask))
  rows = lambda width: pl.BlockSpec((None, padded, None, width), lambda i, j: (i, 0, j, 0))
  out = pl.pallas_call(
      functools.partial(_causal_kernel, name=name, chunk=chunk, block_f=block_f,
                        num_chunks=padded // chunk,
                        num_feature_blocks=num_features // block_f, eps=eps),
      grid=(b, h),
      in_specs=[rows(dim), rows(dim), rows(d_v),
                pl.BlockSpec((None, padded), lambda i, j: (i, 0)),
                pl.BlockSpec((None, num_features, dim), lambda i, j: (j, 0, 0))],
      out_specs=rows(d_v),
      out_shape=jax.ShapeDtypeStruct((b, padded, h, d_v), out_dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret)(q, k, v, mask, omega.astype(jnp.float32))
  return out[:, :length]


_attend_causal = _with_xla_gradients(
    _causal_forward, lambda q, k, v, omega, key_mask, opts: _causal_reference(
        q, k, v, omega, key_mask, name=opts['name'], eps=opts['eps']))


def pallas_causal_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                                   omega: jax.Array, *, feature_map: str = 'favor',
                                   key_mask: Optional[jax.Array] = None, chunk_size: int = 64,
                                   block_f: Optional[int] = None,
                                   eps: float = attention.DEFAULT_EPS,
                                   interpret: Optional[bool] = None, num_warps: int = 4,
                                   num_stages: int = 2) -> jax.Array:
  r"""Causal linear attention from one Pallas kernel, ``[B, L, H, D]``: out_i sees j ≤ i.

  The result of ``attention.causal_linear_attention(φ(q), φ(k), v, key_mask)``
  with φ the per-head map of ``omega`` (favor: each feature's running max over
  the keys of the prefix and each query row's max, which cancel), without storing the
  ``[B, L, H, M]`` features: one program per (batch, head) walks the chunks of
  C tokens in order, carrying S = Σ φ(k_j) v_jᵀ and z = Σ φ(k_j) of the chunks
  before in registers (see ``_causal_kernel``). favor's key shifts are running
  maxima up to the end of the current chunk, so a key later in a query's own chunk
  can move that query's shifts: exact in real arithmetic (the shifts cancel), equal
  up to float32 rounding in practice. The grid has only B·H programs,
  so it suits many sequences or heads; the chunks are sequential by nature.
  Under differentiation the XLA path (stored features, ``causal_linear_attention``)
  runs forward and backward, as for ``pallas_linear_attention``.

  Args: as ``pallas_linear_attention``, with ``chunk_size`` C (a power of two;
  L need not be a multiple of it) instead of the block and split sizes.
  """
  attention.check_fused_inputs(q, k, v, omega, key_mask, feature_map, PALLAS_FEATURE_MAPS)
  if block_f is None:
    block_f = math.gcd(omega.shape[1], 64)
  chunk, block_f = (_power_of_two(n, x) for n, x in (('chunk_size', chunk_size),
                                                     ('block_f', block_f)))
  if omega.shape[1] % block_f:
    raise ValueError(f'block_f must divide the number of particles M = {omega.shape[1]}, '
                     f'got {block_f}.')
  if interpret is None:
    interpret = jax.default_backend() != 'gpu'
  options = (('name', feature_map), ('chunk', chunk), ('block_f', block_f),
             ('eps', float(eps)), ('interpret', bool(interpret)), ('num_warps', num_warps),
             ('num_stages', num_stages))
  return _attend_causal(q, k, v, omega, key_mask, options)
