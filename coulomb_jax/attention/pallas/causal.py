r"""Causal linear attention as one Pallas kernel: ``pallas_causal_linear_attention``.

One program per (batch, head) walks the sequence in chunks of C tokens, carrying
the state S = Σ φ(k_j) v_jᵀ, z = Σ φ(k_j) of the chunks before in registers
(``_causal_kernel``); within a chunk a masked C × C product. Every map in log
space, with each feature's running max over the prefix's keys and each query
row's max (they cancel). Under differentiation the XLA path (``_causal_reference``:
``xla.xla_fused_causal_linear_attention``) runs instead.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from coulomb_jax import features
from coulomb_jax.attention import xla
from coulomb_jax.attention.pallas import core
from coulomb_jax.attention.pallas.core import PALLAS_FEATURE_MAPS


def _causal_kernel(q_ref, k_ref, v_ref, mask_ref, omega_ref, o_ref, *, name, chunk,
                   block_f, num_chunks, num_feature_blocks, eps, precision):
  """One (b, h): out_i = Σ_{j≤i} w_ij v_j / Σ_{j≤i} w_ij, w_ij = ψ(q_i)ᵀψ(k_j), chunk by chunk.

  ℓ = log ψ per feature block (a Python loop over the blocks; softmaxfeat has two per
  particle block, for s and −s, minus each key row's log-sum-exp). Per chunk of C rows:

  * the earlier chunks, through the state S_f = Σ_j e^{ℓ(k_j)_f − m_f} v_j,
    z_f = Σ_j e^{ℓ(k_j)_f − m_f}, m_f the running max over the *earlier* chunks' real
    keys: query i reads them with a_if = ℓ(q_i)_f + m_f;
  * inside the chunk, per-token shifts only: M_i = max_f ℓ(q_i)_f, c_j = max_f ℓ(k_j)_f,
    p_ij = e^{ℓ(q_i) − M_i}·e^{ℓ(k_j) − c_j}, log w_ij = M_i + c_j + log p_ij (j ≤ i, real);
  * one shift per query row, T_i = max(max_f a_if, max_j log w_ij), which cancels;
  * then the chunk's keys enter the state, rescaled to the new running max.

  No shift of row i depends on a key after i, so the kernel is causal at any input scale;
  exact wherever no in-chunk p_ij underflows (``xla.xla_materialized_causal_attention``'s
  caveat) — the state part is exact at any scale.
  """
  n_f = num_feature_blocks
  d_v = v_ref.shape[-1]
  softmax = name == 'softmaxfeat'
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
    states, norms, m = carry     # width × [F_b, D], × [F_b], × [F_b] (max over earlier chunks)
    rows = pl.ds(t * chunk, chunk)
    q, k, v = q_ref[rows, :], k_ref[rows, :], v_ref[rows, :]
    keep = mask_ref[rows] > 0                                       # [C]
    v = jnp.where(keep[:, None], v, 0).astype(jnp.float32)
    lq = log_features(q, False)
    lk = [jnp.where(keep[:, None], l, core.NEG) for l in log_features(k, True)]
    # Inside the chunk: per-token shifts, log w_ij for real j ≤ i.
    mq = row_max(lq)[:, None]                                       # [C, 1]
    ck = row_max(lk)                                                # [C]
    pq = [jnp.exp(l - mq) for l in lq]
    pk = [jnp.where(keep[:, None], jnp.exp(l - ck[:, None]), 0.0) for l in lk]
    p = sum(core.dot(a, b, trans_b=True, precision=precision) for a, b in zip(pq, pk))
    seen = causal & keep[None, :] & (p > 0)                          # [C, C]
    log_w = jnp.where(seen, jnp.log(jnp.where(seen, p, 1.0)) + mq + ck[None, :], core.NEG)
    # The earlier chunks through the state: a_if = ℓ(q_i)_f + m_f.
    started = [mf > 0.5 * core.NEG for mf in m]                     # a real key before
    a = [jnp.where(st[None, :], l + mf[None, :], core.NEG) for l, mf, st in zip(lq, m, started)]
    top = jnp.maximum(row_max(a), jnp.max(log_w, axis=1))[:, None]  # [C, 1]
    w = jnp.where(seen, jnp.exp(log_w - top), 0.0)
    wa = [jnp.where(st[None, :], jnp.exp(al - top), 0.0) for al, st in zip(a, started)]
    num = core.dot(w, v, precision=precision) + sum(
        core.dot(x, s, precision=precision) for x, s in zip(wa, states))
    den = jnp.sum(w, axis=1) + sum(jnp.sum(x * z[None, :], axis=1) for x, z in zip(wa, norms))
    o_ref[rows, :] = (num / jnp.maximum(den, eps)[:, None]).astype(o_ref.dtype)
    # The chunk's real keys enter the state, rescaled to the new running max.
    m_new = [jnp.maximum(mf, jnp.max(l, axis=0)) for mf, l in zip(m, lk)]
    decay = [jnp.exp(mf - mn) for mf, mn in zip(m, m_new)]
    phi_k = [jnp.where(keep[:, None], jnp.exp(l - mn[None, :]), 0.0) for l, mn in zip(lk, m_new)]
    states = [s * dc[:, None] + core.dot(pk_, v, trans_a=True, precision=precision)
              for s, dc, pk_ in zip(states, decay, phi_k)]
    norms = [z * dc + jnp.sum(pk_, axis=0) for z, dc, pk_ in zip(norms, decay, phi_k)]
    return states, norms, m_new

  width = 2 * n_f if softmax else n_f
  init = ([jnp.zeros((block_f, d_v), jnp.float32)] * width,
          [jnp.zeros((block_f,), jnp.float32)] * width,
          [jnp.full((block_f,), core.NEG, jnp.float32)] * width)
  jax.lax.fori_loop(0, num_chunks, body, init)


def _causal_reference(q, k, v, omega, key_mask, *, name, eps, precision=None):
  """The XLA path that gives the kernel its gradients: ``xla_fused_causal_linear_attention``
  (exact and causal at any input scale, for every map)."""
  return xla.xla_fused_causal_linear_attention(
      q, k, v, omega, feature_map=name, key_mask=key_mask, eps=eps, precision=precision)


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
                                   eps: float = xla.DEFAULT_EPS,
                                   interpret: Optional[bool] = None, num_warps: int = 4,
                                   num_stages: int = 2, precision=None) -> jax.Array:
  r"""Causal linear attention from one Pallas kernel, ``[B, L, H, D]``: out_i sees j ≤ i.

  Causal linear attention with φ the per-head map of ``omega``, without storing the
  ``[B, L, H, M]`` features: one program per (batch, head) walks the chunks of
  C tokens in order, carrying S = Σ φ(k_j) v_jᵀ and z = Σ φ(k_j) of the chunks
  before in registers (see ``_causal_kernel``). The state's shifts are running maxima
  over the earlier chunks, the shifts inside a chunk are per token: no output reads a
  later token, at any input scale. The grid has B·H programs. Under differentiation the
  XLA path (``xla.xla_fused_causal_linear_attention``) runs forward and backward, as for
  ``pallas_linear_attention``.

  Args: as ``pallas_linear_attention`` (``interpret`` decided by the lowering platform,
  ``precision``), with ``chunk_size`` C (a power of two; L need not be a multiple of it)
  instead of the block and split sizes. Compiled, C, ``block_f`` and the head dims d and D
  must be powers of two ≥ 16 (``core.triton_problem``).

  Exact wherever no query–key pair inside a chunk has features ~87 nats apart (very large
  inputs of favor-type maps; see ``_causal_kernel``). When to prefer it, and the exact path:
  docs/performance.md#attentionpallascausalpallas_causal_linear_attention.
  """
  xla.check_fused_inputs(q, k, v, omega, key_mask, feature_map, PALLAS_FEATURE_MAPS)
  xla.check_eps(eps)
  precision = xla.check_precision(precision)
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
