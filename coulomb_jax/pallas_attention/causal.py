r"""Causal linear attention as one Pallas kernel: ``pallas_causal_linear_attention``.

One program per (batch, head) walks the sequence in chunks of C tokens, carrying
the state S = Σ φ(k_j) v_jᵀ, z = Σ φ(k_j) of the chunks before in registers
(``_causal_kernel``); within a chunk a masked C × C product. Every map in log
space, with each feature's running max over the prefix's keys and each query
row's max (they cancel). Under differentiation the XLA path (``_causal_reference``:
stored features, ``attention_core.causal_linear_attention``) runs instead.
"""

import contextlib
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from coulomb_jax import attention_core
from coulomb_jax import features
from coulomb_jax.pallas_attention import core
from coulomb_jax.pallas_attention.core import PALLAS_FEATURE_MAPS


def _causal_kernel(q_ref, k_ref, v_ref, mask_ref, omega_ref, o_ref, *, name, chunk,
                   block_f, num_chunks, num_feature_blocks, eps, precision):
  """One (b, h): out_i = Σ_{j≤i} φ(q_i)·φ(k_j) v_j / Σ_{j≤i} φ(q_i)·φ(k_j), chunk by chunk.

  The running state S = Σ φ(k_j) v_jᵀ, z = Σ φ(k_j) of the chunks before is kept
  in registers as one ``[F_b, D]`` block per feature block (a Python loop over
  the blocks; softmaxfeat has two per particle block, for s and −s). Per chunk
  of C rows: every block's log-features ℓ (``features.log_psi``; softmaxfeat:
  [s, −s] minus each key row's log-sum-exp), each feature's running max m_f
  over the real keys of the prefix (this chunk included), which rescales its row
  of S and z, the queries' ℓ + m_f minus each query row's max (as
  ``features.attention_pair``, with prefix maxima), then
  out = (A v + φ(q) S) / (A 1 + φ(q)·z) with A = tril(φ(q) φ(k)ᵀ) inside the
  chunk, and S, z updated. Every factor is common to a query's row, so the
  ratio is exact at any input scale.
  """
  n_f, m_total = num_feature_blocks, omega_ref.shape[0]
  d_v = v_ref.shape[-1]
  softmax = name == 'softmaxfeat'
  scale = 1.0 / math.sqrt(m_total)
  causal = jnp.arange(chunk)[:, None] >= jnp.arange(chunk)[None, :]
  omegas = [omega_ref[pl.ds(f * block_f, block_f), :] for f in range(n_f)]
  row_max = lambda blocks: functools.reduce(jnp.maximum, [jnp.max(b, axis=1) for b in blocks])

  def log_features(x, keys):
    """ℓ of a [C, d] row block: a list of [C, F_b] blocks (softmaxfeat: s blocks, then −s)."""
    xf = x.astype(jnp.float32)
    half = 0.5 * jnp.sum(xf * xf, axis=1, keepdims=True)           # [C, 1]
    s = [core.project(x, w, precision) for w in omegas]           # n_f × [C, F_b]
    if not softmax:
      return [features.log_psi(name, sb, half) for sb in s]
    blocks = s + [-sb for sb in s]
    if not keys:            # A query row's log-sum-exp is a factor of its row: it cancels.
      return blocks
    top = row_max(blocks)[:, None]
    lse = top + jnp.log(sum(jnp.sum(jnp.exp(b - top), axis=1, keepdims=True)
                            for b in blocks))
    return [b - lse for b in blocks]

  def body(t, carry):
    states, norms, m = carry             # width × [F_b, D], × [F_b], × [F_b] (running max)
    rows = pl.ds(t * chunk, chunk)
    q, k, v = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :]
    keep = mask_ref[rows] > 0                                       # [C]
    lk = [jnp.where(keep[:, None], l, core.NEG) for l in log_features(k, True)]
    m_new = [jnp.maximum(mf, jnp.max(l, axis=0)) for mf, l in zip(m, lk)]
    decay = [jnp.exp(mf - mn) for mf, mn in zip(m, m_new)]
    states = [s * dc[:, None] for s, dc in zip(states, decay)]
    norms = [z * dc for z, dc in zip(norms, decay)]
    m_q = [jnp.where(mn > 0.5 * core.NEG, mn, 0.0) for mn in m_new]  # 0 before any real key
    lq = [l + mq[None, :] for l, mq in zip(log_features(q, False), m_q)]
    shift_q = row_max(lq)[:, None]
    phi_q = [jnp.exp(l - shift_q) * scale for l in lq]
    phi_k = [jnp.where(keep[:, None], jnp.exp(l - mn[None, :]) * scale, 0.0)
             for l, mn in zip(lk, m_new)]
    v = jnp.where(keep[:, None], v, 0).astype(jnp.float32)
    a = sum(core.dot(pq, pk, trans_b=True, precision=precision)
            for pq, pk in zip(phi_q, phi_k))                                   # [C, C]
    a = jnp.where(causal, a, 0.0)
    num = core.dot(a, v, precision=precision) + sum(
        core.dot(pq, s, precision=precision) for pq, s in zip(phi_q, states))
    den = jnp.sum(a, axis=1) + sum(jnp.sum(pq * z[None, :], axis=1)
                                   for pq, z in zip(phi_q, norms))
    o_ref[rows, :] = (num / jnp.maximum(den, eps)[:, None]).astype(o_ref.dtype)
    states = [s + core.dot(pk, v, trans_a=True, precision=precision)
              for s, pk in zip(states, phi_k)]
    norms = [z + jnp.sum(pk, axis=0) for z, pk in zip(norms, phi_k)]
    return states, norms, m_new

  width = 2 * n_f if softmax else n_f
  init = ([jnp.zeros((block_f, d_v), jnp.float32)] * width,
          [jnp.zeros((block_f,), jnp.float32)] * width,
          [jnp.full((block_f,), core.NEG, jnp.float32)] * width)
  jax.lax.fori_loop(0, num_chunks, body, init)


def _causal_reference(q, k, v, omega, key_mask, *, name, eps, precision=None):
  """The XLA path: per-head features stored, then ``causal_linear_attention``.

  The features are ``features.attention_pair``'s (per key feature over all real
  keys, and per query row: factors common to a query's row, which cancel as the
  kernel's prefix maxima do). ``precision``: of every product, the features' included
  (``features.attention_pair`` takes none: it is traced under
  ``jax.default_matmul_precision``).
  """
  pair = lambda qh, kh, w: features.attention_pair(qh, kh, w, name, key_mask)
  with contextlib.ExitStack() as stack:
    if precision is not None:
      stack.enter_context(jax.default_matmul_precision(precision.name.lower()))
    qf, kf = jax.vmap(pair, in_axes=(2, 2, 0), out_axes=2)(q, k, omega)
  return attention_core.causal_linear_attention(qf, kf, v, key_mask, eps=eps,
                                                precision=precision)



def _causal_forward(q, k, v, omega, key_mask, *, interpret, problem, **options):
  """The kernel, interpreted or compiled as ``core.by_platform`` decides."""
  masks = () if key_mask is None else (key_mask,)
  run = lambda interp, q, k, v, omega, *m: _causal_kernel_call(
      q, k, v, omega, m[0] if m else None, interpret=interp, **options)
  out = jax.ShapeDtypeStruct(v.shape, v.dtype)
  what = f'pallas_causal_linear_attention(feature_map={options["name"]!r})'
  return core.by_platform(run, (q, k, v, omega) + masks, out, interpret, what, problem,
                          no_tpu_kernel='the causal kernel is Triton only')


def _causal_kernel_call(q, k, v, omega, key_mask, *, name, chunk, block_f, eps, interpret,
                        num_warps, num_stages, precision):
  b, length, h, dim = q.shape
  d_v, num_features = v.shape[-1], omega.shape[1]
  out_dtype = v.dtype
  q, k, v, mask = core.kernel_inputs(q, k, v, key_mask, interpret)
  padded = pl.cdiv(length, chunk) * chunk
  q, k, v, mask = (core.pad_rows(a, padded) for a in (q, k, v, mask))
  rows = lambda width: pl.BlockSpec((None, padded, None, width), lambda i, j: (i, 0, j, 0))
  out = pl.pallas_call(
      functools.partial(_causal_kernel, name=name, chunk=chunk, block_f=block_f,
                        num_chunks=padded // chunk,
                        num_feature_blocks=num_features // block_f, eps=eps,
                        precision=precision),
      grid=(b, h),
      in_specs=[rows(dim), rows(dim), rows(d_v),
                pl.BlockSpec((None, padded), lambda i, j: (i, 0)),
                pl.BlockSpec((None, num_features, dim), lambda i, j: (j, 0, 0))],
      out_specs=rows(d_v),
      out_shape=jax.ShapeDtypeStruct((b, padded, h, d_v), out_dtype),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret)(q, k, v, mask, omega.astype(jnp.float32))
  return out[:, :length]



_attend_causal = core.with_xla_gradients(
    _causal_forward, lambda q, k, v, omega, key_mask, opts: _causal_reference(
        q, k, v, omega, key_mask, name=opts['name'], eps=opts['eps'],
        precision=opts['precision']))



def pallas_causal_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                                   omega: jax.Array, *, feature_map: str = 'favor',
                                   key_mask: Optional[jax.Array] = None, chunk_size: int = 64,
                                   block_f: Optional[int] = None,
                                   eps: float = attention_core.DEFAULT_EPS,
                                   interpret: Optional[bool] = None, num_warps: int = 4,
                                   num_stages: int = 2, precision=None) -> jax.Array:
  r"""Causal linear attention from one Pallas kernel, ``[B, L, H, D]``: out_i sees j ≤ i.

  The result of ``attention.causal_linear_attention(φ(q), φ(k), v, key_mask)``
  with φ the per-head map of ``omega`` (every map in log space: each feature's running
  max over the keys of the prefix and each query row's max, which cancel), without storing the
  ``[B, L, H, M]`` features: one program per (batch, head) walks the chunks of
  C tokens in order, carrying S = Σ φ(k_j) v_jᵀ and z = Σ φ(k_j) of the chunks
  before in registers (see ``_causal_kernel``). The key shifts are running
  maxima up to the end of the current chunk, so a key later in a query's own chunk
  can move that query's shifts: exact in real arithmetic (the shifts cancel), equal
  up to float32 rounding in practice. The grid has only B·H programs,
  so it suits many sequences or heads; the chunks are sequential by nature.
  Under differentiation the XLA path (stored features, ``causal_linear_attention``)
  runs forward and backward, as for ``pallas_linear_attention``.

  Args: as ``pallas_linear_attention`` (``interpret`` decided by the lowering platform,
  ``precision``), with ``chunk_size`` C (a power of two; L need not be a multiple of it)
  instead of the block and split sizes. Compiled, C, ``block_f`` and the head dims d and D
  must be powers of two ≥ 16 (``core.triton_problem``).

  Not exact at large inputs for favor, porf_softplus and softmaxfeat: see
  ``attention_core.causal_linear_attention``; ``attention.fused_causal_linear_attention``
  (XLA) is exact for every map.
  """
  attention_core.check_fused_inputs(q, k, v, omega, key_mask, feature_map, PALLAS_FEATURE_MAPS)
  attention_core.check_eps(eps)
  precision = attention_core.check_precision(precision)
  chunk = core.power_of_two('chunk_size', chunk_size)
  block_f = core.feature_block(block_f, omega.shape[1])
  if interpret is not None:
    interpret = bool(interpret)
  problem = causal_triton_problem(q.shape, v.shape, chunk, block_f)
  core.check_compilable(
      interpret, f'pallas_causal_linear_attention(feature_map={feature_map!r})', problem)
  options = (('name', feature_map), ('chunk', chunk), ('block_f', block_f),
             ('eps', float(eps)), ('interpret', interpret), ('problem', problem),
             ('num_warps', num_warps), ('num_stages', num_stages), ('precision', precision))
  return _attend_causal(q, k, v, omega, key_mask, options)


def causal_triton_problem(q_shape, v_shape, chunk, block_f):
  """``core.triton_problem`` of the sides the causal kernel multiplies (None: it compiles)."""
  return core.triton_problem((('the head dim d of q', q_shape[-1]),
                              ('the value dim D of v', v_shape[-1]), ('chunk_size', chunk),
                              ('block_f', block_f)))
