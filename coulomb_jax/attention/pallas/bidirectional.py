r"""Bidirectional linear attention as two Pallas kernels: ``pallas_linear_attention``.

``pallas_linear_attention(q, k, v, omega, ...)`` computes the same thing as
``attention.fused_linear_attention`` (φ = the per-head feature map of the
particles ``omega``, never stored for all L) but as two kernels:

1. **keys** (grid ``[B, H, S, F/F_b]``): program (b, h, s, f) walks its split s
   of the keys in blocks of C_k rows, computes φ_f(k) ``[C_k, F_b]`` for its
   feature block f and accumulates the partial state

   .. math:: S_{s,f} = \sum_{j ∈ s} φ_f(k_j) v_jᵀ  \;[F_b, D],\qquad
             z_{s,f} = \sum_{j ∈ s} φ_f(k_j) \;[F_b].

   Every map works in log space (ℓ = log ψ, ``features.log_psi``): the
   exponent of feature f is shifted by an online max m_{s,f} over the split's
   real keys (rescaling row f of S and z when a block raises it, as in flash
   attention); the partials are then combined in JAX with the factors
   e^{m_{s,f} − max_s m_{s,f}}, so the final shift of feature f is its max
   over all real keys of (b, h): exactly ``features.attention_pair``'s.
2. **queries** (grid ``[B, H, L/C_q]``): out = φ(q) S / max(φ(q)ᵀ z, eps),
   walking the feature blocks with an online per-row max of ℓ(q) + m_f (as in
   ``features.attention_pair``; the row shift cancels between numerator and
   denominator). So the result is the kernel's exact ratio at any input scale,
   with a denominator ≥ 1/M that the guard ``eps`` never reaches.

All seven attention maps (``PALLAS_FEATURE_MAPS``). ``softmaxfeat``'s per-row
softmax couples every feature: its key kernel first walks all particle blocks
for each key row's log-sum-exp; a query row's own log-sum-exp is a factor of its row and
cancels. Grid, HBM traffic and cost: docs/performance.md#attentionpallasbidirectional.

``use_by_default`` says whether ``fused_linear_attention(implementation='auto')``
takes these kernels. Under differentiation the XLA path runs instead (no backward
kernel; ``coulomb_jax.attention.pallas``).
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
from coulomb_jax import features
from coulomb_jax.attention import xla
from coulomb_jax.attention.pallas import core
from coulomb_jax.attention.pallas import tpu
from coulomb_jax.attention.pallas.core import PALLAS_FEATURE_MAPS


def _key_kernel(k_ref, v_ref, mask_ref, omega_ref, s_ref, z_ref, m_ref, *, name,
                block_k, num_blocks, scale, precision):
  """One (b, h, split, feature block): partial S [F_b, D], z [F_b] and the shifts m [F_b].

  Keys in log space: ℓ = ``features.log_psi``, φ = e^{ℓ − m_f}·scale with m_f the
  running max of feature f over this split's real keys (row f of S and z rescaled
  when it rises).
  """
  omega = omega_ref[...]                                   # [F_b, d]
  f_b, d_v = omega.shape[0], v_ref.shape[-1]

  def body(i, carry):
    acc, z, m = carry
    rows = pl.ds(i * block_k, block_k)
    k = k_ref[rows, :]                                     # [C_k, d]
    v = v_ref[rows, :]                                     # [C_k, D]
    keep = mask_ref[rows] > 0                              # [C_k]
    s = core.project(k, omega, precision)                  # [C_k, F_b]
    kf = k.astype(jnp.float32)
    half = 0.5 * jnp.sum(kf * kf, axis=1, keepdims=True)   # [C_k, 1]
    logits = jnp.where(keep[:, None], features.log_psi(name, s, half), core.NEG)
    m_new = jnp.maximum(m, jnp.max(logits, axis=0))       # [F_b]
    decay = jnp.exp(m - m_new)
    acc, z = acc * decay[:, None], z * decay
    # where, not a product: masked rows are 0 even while the running max is still −1e30.
    phi = jnp.where(keep[:, None], jnp.exp(logits - m_new[None, :]) * scale,
                    0.0).astype(v.dtype)
    v = jnp.where(keep[:, None], v, 0).astype(v.dtype)   # never read padded values
    acc = acc + core.dot(phi, v, trans_a=True, precision=precision)
    z = z + jnp.sum(phi.astype(jnp.float32), axis=0)     # the same (rounded) φ as in S
    return acc, z, m_new

  init = (jnp.zeros((f_b, d_v), jnp.float32), jnp.zeros((f_b,), jnp.float32),
          jnp.full((f_b,), core.NEG, jnp.float32))
  acc, z, m = jax.lax.fori_loop(0, num_blocks, body, init)
  s_ref[...] = acc
  z_ref[...] = z
  m_ref[...] = m


def _query_kernel(q_ref, omega_ref, s_ref, z_ref, m_ref, o_ref, *, name, block_f,
                  num_blocks, scale, eps, precision):
  """One (b, h, query block): out = φ(q) S / max(φ(q)ᵀ z, eps), [C_q, D].

  φ(q) = e^{ℓ(q) + m_f − M_i}·scale with the keys' shifts m_f (``m_ref``) and M_i an
  online max over the feature blocks (``num`` and ``den`` rescaled when it rises),
  as in ``features.attention_pair``.
  """
  q = q_ref[...]                                           # [C_q, d]
  c_q, d_v = q.shape[0], s_ref.shape[-1]
  qf = q.astype(jnp.float32)
  half = 0.5 * jnp.sum(qf * qf, axis=1, keepdims=True)     # [C_q, 1]

  def body(i, carry):
    num, den, m = carry                                    # [C_q, D], [C_q], [C_q]
    feats = pl.ds(i * block_f, block_f)
    s = core.project(q, omega_ref[feats, :], precision)    # [C_q, F_b]
    logits = features.log_psi(name, s, half) + m_ref[feats][None, :]
    m_new = jnp.maximum(m, jnp.max(logits, axis=1))
    rescale = jnp.exp(m - m_new)
    num, den = num * rescale[:, None], den * rescale
    # φ(q) S in q's dtype (bf16 inputs: a bf16 product; the denominator uses the
    # same rounded φ, so only the state's rounding differs between the two).
    phi = (jnp.exp(logits - m_new[:, None]) * scale).astype(q.dtype)
    num = num + core.dot(phi, s_ref[feats, :].astype(q.dtype), precision=precision)
    den = den + jnp.sum(phi.astype(jnp.float32) * z_ref[feats][None, :], axis=1)
    return num, den, m_new

  init = (jnp.zeros((c_q, d_v), jnp.float32), jnp.zeros((c_q,), jnp.float32),
          jnp.full((c_q,), core.NEG, jnp.float32))
  num, den, _ = jax.lax.fori_loop(0, num_blocks, body, init)
  o_ref[...] = (num / jnp.maximum(den, eps)[:, None]).astype(o_ref.dtype)


def _key_kernel_softmax(k_ref, v_ref, mask_ref, omega_ref, sp_ref, sm_ref, zp_ref, zm_ref,
                        mp_ref, mm_ref, *, block_k, block_f, num_blocks, num_feature_blocks,
                        scale, precision):
  """``softmaxfeat`` keys, one (b, h, split, particle block f).

  log ψ = [s, −s] − lse (+ log 2M, a constant that cancels) couples all 2M features
  through the row's log-sum-exp, so each key block first walks every particle
  block for it (online, as flash attention's softmax), then accumulates its own
  block's features [φ⁺ | φ⁻] = e^{[s_f, −s_f] − lse − m^±_f}·scale into S⁺, S⁻
  and z⁺, z⁻, with m^±_f running maxima per feature over the real keys, as for
  the other maps.
  """
  f = pl.program_id(3)
  omega = omega_ref[pl.ds(f * block_f, block_f), :]        # [F_b, d]
  d_v = v_ref.shape[-1]

  def body(i, carry):
    acc_p, acc_m, z_p, z_m, m_p, m_m = carry
    rows = pl.ds(i * block_k, block_k)
    k = k_ref[rows, :]                                     # [C_k, d]
    v = v_ref[rows, :]                                     # [C_k, D]
    keep = mask_ref[rows] > 0                              # [C_k]

    def lse_body(g, mc):
      m, total = mc                                        # [C_k], [C_k]
      s_g = core.project(k, omega_ref[pl.ds(g * block_f, block_f), :], precision)
      m_new = jnp.maximum(m, jnp.max(jnp.abs(s_g), axis=1))   # max over [s, −s]
      total = total * jnp.exp(m - m_new) + jnp.sum(
          jnp.exp(s_g - m_new[:, None]) + jnp.exp(-s_g - m_new[:, None]), axis=1)
      return m_new, total

    m, total = jax.lax.fori_loop(
        0, num_feature_blocks, lse_body,
        (jnp.zeros((block_k,), jnp.float32), jnp.zeros((block_k,), jnp.float32)))
    lse = (m + jnp.log(total))[:, None]                     # [C_k, 1]; |s| ≥ 0 so m ≥ 0
    s = core.project(k, omega, precision)                  # [C_k, F_b]
    l_p = jnp.where(keep[:, None], s - lse, core.NEG)
    l_m = jnp.where(keep[:, None], -s - lse, core.NEG)
    mp_new = jnp.maximum(m_p, jnp.max(l_p, axis=0))
    mm_new = jnp.maximum(m_m, jnp.max(l_m, axis=0))
    d_p, d_m = jnp.exp(m_p - mp_new), jnp.exp(m_m - mm_new)
    phi_p = jnp.where(keep[:, None], jnp.exp(l_p - mp_new[None, :]) * scale, 0.0)
    phi_m = jnp.where(keep[:, None], jnp.exp(l_m - mm_new[None, :]) * scale, 0.0)
    v = jnp.where(keep[:, None], v, 0).astype(v.dtype)
    acc_p = acc_p * d_p[:, None] + core.dot(phi_p.astype(v.dtype), v, trans_a=True,
                                            precision=precision)
    acc_m = acc_m * d_m[:, None] + core.dot(phi_m.astype(v.dtype), v, trans_a=True,
                                            precision=precision)
    return (acc_p, acc_m, z_p * d_p + jnp.sum(phi_p, axis=0),
            z_m * d_m + jnp.sum(phi_m, axis=0), mp_new, mm_new)

  zeros = lambda *shape: jnp.zeros(shape, jnp.float32)
  neg = jnp.full((block_f,), core.NEG, jnp.float32)
  acc_p, acc_m, z_p, z_m, m_p, m_m = jax.lax.fori_loop(
      0, num_blocks, body, (zeros(block_f, d_v), zeros(block_f, d_v), zeros(block_f),
                            zeros(block_f), neg, neg))
  sp_ref[...] = acc_p
  sm_ref[...] = acc_m
  zp_ref[...] = z_p
  zm_ref[...] = z_m
  mp_ref[...] = m_p
  mm_ref[...] = m_m


def _query_kernel_softmax(q_ref, omega_ref, sp_ref, sm_ref, zp_ref, zm_ref, mp_ref, mm_ref,
                          o_ref, *, block_f, num_blocks, scale, eps, precision):
  """``softmaxfeat`` queries, one (b, h, query block).

  The query row's own log-sum-exp is a factor of the whole row, so it cancels:
  log-features [s, −s] + m^± (the keys' shifts), and an online row max over the
  particle blocks, as ``_query_kernel``.
  """
  q = q_ref[...]                                           # [C_q, d]
  c_q, d_v = q.shape[0], sp_ref.shape[-1]
  cast = lambda a: a.astype(q.dtype)

  def body(i, carry):
    num, den, m = carry                                    # [C_q, D], [C_q], [C_q]
    feats = pl.ds(i * block_f, block_f)
    s = core.project(q, omega_ref[feats, :], precision)    # [C_q, F_b]
    l_p = s + mp_ref[feats][None, :]
    l_m = -s + mm_ref[feats][None, :]
    m_new = jnp.maximum(m, jnp.maximum(jnp.max(l_p, axis=1), jnp.max(l_m, axis=1)))
    rescale = jnp.exp(m - m_new)
    e_p = cast(jnp.exp(l_p - m_new[:, None]) * scale)
    e_m = cast(jnp.exp(l_m - m_new[:, None]) * scale)
    num = (num * rescale[:, None] + core.dot(e_p, cast(sp_ref[feats, :]), precision=precision)
           + core.dot(e_m, cast(sm_ref[feats, :]), precision=precision))
    den = (den * rescale
           + jnp.sum(e_p.astype(jnp.float32) * zp_ref[feats][None, :], axis=1)
           + jnp.sum(e_m.astype(jnp.float32) * zm_ref[feats][None, :], axis=1))
    return num, den, m_new

  init = (jnp.zeros((c_q, d_v), jnp.float32), jnp.zeros((c_q,), jnp.float32),
          jnp.full((c_q,), core.NEG, jnp.float32))
  num, den, _ = jax.lax.fori_loop(0, num_blocks, body, init)
  o_ref[...] = (num / jnp.maximum(den, eps)[:, None]).astype(o_ref.dtype)


def _combine_splits(s_part, z_part, m_part, precision=None):
  """One state per (b, h) from the splits' partials ``[B, H, S, F(, D)]``.

  Each split's feature f is shifted by its own max m_{s,f}; rescaled by
  e^{m_{s,f} − max_s m_{s,f}} they share the max over all real keys (a split
  without real keys has m = −1e30 and weight 0; with none at all, m is set to 0).
  """
  m = jnp.max(m_part, axis=2, keepdims=True)                    # [B, H, 1, F]
  w = jnp.exp(m_part - m)                                       # [B, H, S, F]
  return (jnp.einsum('bhsf,bhsfd->bhfd', w, s_part, precision=precision),
          jnp.sum(w * z_part, axis=2),
          jnp.where(m[:, :, 0] > 0.5 * core.NEG, m[:, :, 0], 0.0))



def _forward(q, k, v, omega, key_mask, *, interpret, problem, **options):
  """The kernels, interpreted or compiled as ``core.by_platform`` decides."""
  masks = () if key_mask is None else (key_mask,)
  run = lambda interp, q, k, v, omega, *m: _kernels(
      q, k, v, omega, m[0] if m else None, interpret=interp, **options)
  out = jax.ShapeDtypeStruct(v.shape, v.dtype)
  tpu_run = None
  if options['name'] in tpu.TPU_FEATURE_MAPS:
    tpu_run = lambda interp, q, k, v, omega, *m: tpu.tpu_kernels(
        q, k, v, omega, m[0] if m else None, name=options['name'], eps=options['eps'],
        interpret=interp, precision=options['precision'])
  return core.by_platform(run, (q, k, v, omega) + masks, out, interpret,
                          f'pallas_linear_attention(feature_map={options["name"]!r})', problem,
                          tpu_run, f'the TPU kernels compute {tpu.TPU_FEATURE_MAPS}: '
                          f'softmaxfeat\'s per-row softmax couples the features')


def _kernels(q, k, v, omega, key_mask, *, name, block_q, block_k, block_f, num_splits, eps,
             interpret, num_warps, num_stages, precision):
  b, length, h, dim = q.shape
  d_v, num_features = v.shape[-1], omega.shape[1]
  out_dtype = v.dtype
  q, k, v, mask = core.kernel_inputs(q, k, v, key_mask, interpret)
  omega = omega.astype(jnp.float32)
  scale = 1.0 / math.sqrt(num_features)
  params = dict(compiler_params=plgpu.CompilerParams(num_warps=num_warps,
                                                     num_stages=num_stages),
                interpret=interpret)

  # Keys: split L into num_splits ranges of a whole number of C_k blocks.
  blocks_per_split = pl.cdiv(pl.cdiv(length, block_k), num_splits)
  split_len = blocks_per_split * block_k
  k_p, v_p, mask_p = (core.pad_rows(a, num_splits * split_len) for a in (k, v, mask))
  n_f = num_features // block_f
  part = lambda *shape: jax.ShapeDtypeStruct((b, h, num_splits) + shape, jnp.float32)
  rows_spec = lambda width: pl.BlockSpec((None, split_len, None, width),
                                         lambda i, j, s, f: (i, s, j, 0))
  state_spec = pl.BlockSpec((None, None, None, block_f, d_v), lambda i, j, s, f: (i, j, s, f, 0))
  norm_spec = pl.BlockSpec((None, None, None, block_f), lambda i, j, s, f: (i, j, s, f))
  key_inputs = [rows_spec(dim), rows_spec(d_v),
                pl.BlockSpec((None, split_len), lambda i, j, s, f: (i, s))]
  if name == 'softmaxfeat':
    # Outputs S⁺, S⁻, z⁺, z⁻, m⁺, m⁻ (features [φ⁺ | φ⁻]); every program reads all particles.
    sp, sm, zp, zm, mp, mm = pl.pallas_call(
        functools.partial(_key_kernel_softmax, block_k=block_k, block_f=block_f,
                          num_blocks=blocks_per_split, num_feature_blocks=n_f, scale=scale,
                          precision=precision),
        grid=(b, h, num_splits, n_f),
        in_specs=key_inputs + [pl.BlockSpec((None, num_features, dim),
                                            lambda i, j, s, f: (j, 0, 0))],
        out_specs=[state_spec] * 2 + [norm_spec] * 4,
        out_shape=[part(num_features, d_v)] * 2 + [part(num_features)] * 4,
        **params)(k_p, v_p, mask_p, omega)
    s_p, z_p, m_p = _combine_splits(sp, zp, mp, precision)
    s_m, z_m, m_m = _combine_splits(sm, zm, mm, precision)
    states = [s_p, s_m, z_p, z_m, m_p, m_m]
    kernel = functools.partial(_query_kernel_softmax, block_f=block_f, num_blocks=n_f,
                               scale=scale, eps=eps, precision=precision)
  else:
    s_part, z_part, m_part = pl.pallas_call(
        functools.partial(_key_kernel, name=name, block_k=block_k,
                          num_blocks=blocks_per_split, scale=scale, precision=precision),
        grid=(b, h, num_splits, n_f),
        in_specs=key_inputs + [pl.BlockSpec((None, block_f, dim),
                                            lambda i, j, s, f: (j, f, 0))],
        out_specs=[state_spec, norm_spec, norm_spec],
        out_shape=[part(num_features, d_v), part(num_features), part(num_features)],
        **params)(k_p, v_p, mask_p, omega)
    states = list(_combine_splits(s_part, z_part, m_part, precision))
    kernel = functools.partial(_query_kernel, name=name, block_f=block_f, num_blocks=n_f,
                               scale=scale, eps=eps, precision=precision)

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
      **params)(core.pad_rows(q, q_len), omega, *states)
  return out[:, :length]



_attend = core.with_xla_gradients(
    _forward, lambda q, k, v, omega, key_mask, opts: xla.xla_fused_linear_attention(
        q, k, v, omega, feature_map=opts['name'], key_mask=key_mask, eps=opts['eps'],
        precision=opts['precision']))



def pallas_linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, omega: jax.Array, *,
                            feature_map: str = 'favor', key_mask: Optional[jax.Array] = None,
                            block_q: int = 64, block_k: int = 64, block_f: Optional[int] = None,
                            num_splits: Optional[int] = None,
                            eps: float = xla.DEFAULT_EPS,
                            interpret: Optional[bool] = None, num_warps: int = 4,
                            num_stages: int = 2, precision=None) -> jax.Array:
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
    interpret: True: Pallas interpret mode (plain XLA ops, any platform); False: the
      compiled Triton kernels (cuda only); None (default): decided by the platform the
      program is lowered for, not the host (``jax.lax.platform_dependent``): the Triton
      kernels for cuda, the Mosaic kernels of ``pallas.tpu`` for tpu (six maps,
      never run on a TPU; softmaxfeat: a ValueError), interpreted for cpu.
    num_warps, num_stages: Triton launch parameters.
    precision: of every matrix product, kernels and (under ``grad``) the XLA path
      alike (``attention.linear_attention``'s argument: None = the backend's default,
      TF32 for float32 on recent NVIDIA GPUs; ``'highest'``: IEEE float32).

  Compiled, every side of a matrix product (the head dims d and D, ``block_q``,
  ``block_k``, ``block_f``) must be a power of two ≥ 16 (``core.triton_problem``):
  ``interpret=False`` refuses other sizes with a ValueError naming the value before
  anything is lowered; ``interpret=None`` when lowered for cuda.
  """
  xla.check_fused_inputs(q, k, v, omega, key_mask, feature_map, PALLAS_FEATURE_MAPS)
  xla.check_eps(eps)
  precision = xla.check_precision(precision)
  length = q.shape[1]
  block_q, block_k = (core.power_of_two(n, x) for n, x in
                      (('block_q', block_q), ('block_k', block_k)))
  block_f = core.feature_block(block_f, omega.shape[1])
  if num_splits is None:
    num_splits = min(64, pl.cdiv(length, 4096))
  num_splits = _checks.check_int('num_splits', num_splits, 1)
  if interpret is not None:
    interpret = bool(interpret)
  problem = _triton_problem(q.shape, v.shape, block_q, block_k, block_f)
  core.check_compilable(interpret, f'pallas_linear_attention(feature_map={feature_map!r})',
                        problem)
  options = (('name', feature_map), ('block_q', block_q), ('block_k', block_k),
             ('block_f', block_f), ('num_splits', num_splits), ('eps', float(eps)),
             ('interpret', interpret), ('problem', problem), ('num_warps', num_warps),
             ('num_stages', num_stages), ('precision', precision))
  return _attend(q, k, v, omega, key_mask, options)


def _triton_problem(q_shape, v_shape, block_q, block_k, block_f):
  """``core.triton_problem`` of the sides the two kernels multiply."""
  return core.triton_problem((('the head dim d of q', q_shape[-1]),
                              ('the value dim D of v', v_shape[-1]), ('block_q', block_q),
                              ('block_k', block_k), ('block_f', block_f)))


def shape_supported(q_shape, v_shape, omega_shape, feature_map) -> bool:
  """Whether ``'auto'`` may take the kernels: a kernel map, M a multiple of 64 (default
  ``block_f`` = 64) and the default blocks within Triton's rules (``core.triton_problem``:
  d and D powers of two ≥ 16). The causal kernel's rules are the same (its chunk 64)."""
  return (feature_map in PALLAS_FEATURE_MAPS and omega_shape[1] % 64 == 0
          and _triton_problem(q_shape, v_shape, 64, 64, 64) is None)


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
  if not shape_supported(q.shape, v.shape, omega.shape, feature_map):
    return False
  spec = lambda a: None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype)
  return _compiles(spec(q), spec(k), spec(v), spec(omega), spec(key_mask), feature_map,
                   interpret)

