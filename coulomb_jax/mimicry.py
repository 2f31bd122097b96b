r"""Particles that mimic softmax attention: a second target for the Hamiltonian.

The label Hamiltonian (``hamiltonian``) moves the particles towards the labels.
Here the target is softmax attention itself (Hedgehog, Zhang et al. 2024): for
queries ``q: [..., L_q, d]`` and keys ``k: [..., L_k, d]`` (the same leading axes)

.. math::
   A^{soft}_{ij} = \frac{e^{q_iᵀk_j/√d}}{\sum_{j'} e^{q_iᵀk_{j'}/√d}},\qquad
   A^{lin}_{ij} = \frac{φ(\tilde q_i)ᵀφ(\tilde k_j)}{\sum_{j'} φ(\tilde q_i)ᵀφ(\tilde k_{j'})},
   \qquad \tilde q = d^{−1/4} q,\ \tilde k = d^{−1/4} k.

**Where the 1/√d goes.** Queries and keys are each scaled by d^{−1/4} before the
feature map (as ``models.KernelAttention`` does), so q̃ᵀk̃ = qᵀk/√d and φ(q̃)ᵀφ(k̃)
estimates exp(qᵀk/√d) for ``favor``.

* ``attention_cross_entropy``: CE = mean_i −Σ_j A^soft_ij log A^lin_ij (Hedgehog's loss);
* ``attention_kl``: KL = CE − H(A^soft) = mean_i Σ_j A^soft_ij (log A^soft_ij − log A^lin_ij)
  ≥ 0, and 0 iff the rows are equal;
* ``softmax_kernel_alignment``: ⟨K_φ, K_soft⟩_F / (‖K_φ‖_F ‖K_soft‖_F) with
  K_φ = φ(q̃)φ(k̃)ᵀ and K_soft = exp(qkᵀ/√d).

Everything is computed in log space: log K_φ[i, j] = logsumexp_f (log φ(q̃_i)_f +
log φ(k̃_j)_f) (``features.log_features``), so nothing over- or underflows at any
input scale; this costs ``[..., L_q, L_k, F]`` memory (meant for the tiny row
sets of mimicry training, not for long sequences). Masked keys (``key_mask``
False) get weight 0 in both rows; their values are replaced by 0 before any
compute, so they change neither outputs nor gradients, NaN included. Padded query
rows (``query_mask`` False) are left out of every mean (a loss over a padded batch
is the loss over its real rows). ``q`` without query rows (a mean over none is NaN) or
``k`` without keys (a softmax over none) is one ``ValueError`` naming it and its shape;
``train_hedgehog`` takes exactly one PRNG key (``_checks.check_key``).

**Counting features N.** ``favor`` (and the other separable maps but
``softmaxfeat``): M particles ``[M, d]`` → M features. ``hedgehog`` and
``softmaxfeat``: M rows ``[M, d]`` → 2M features; at equal N use M = N/2.

The flax drop-in built on these maps is ``flax_attention.kernel_attention_fn``;
neither module imports flax.
"""

import math
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from coulomb_jax import _checks
from coulomb_jax import features
from coulomb_jax import hamiltonian
from coulomb_jax import langevin
from coulomb_jax import repulsion
from coulomb_jax.attention import xla

def __getattr__(attr):
  """``MIMICRY_FEATURE_MAPS``: the maps the mimicry functions accept, read from the registry
  when asked (``features.names(positive=True)``: the seven attention maps, ``hedgehog``
  and any positive map registered since)."""
  if attr == 'MIMICRY_FEATURE_MAPS':
    return features.names(positive=True)
  raise AttributeError(f'module {__name__!r} has no attribute {attr!r}')

TARGETS = ('cross_entropy', 'kl', 'alignment')
"""Data terms of ``mimicry_hamiltonian``: CE, KL, or −(softmax-kernel alignment)."""


# ----------------------------------------------------------------------------- checks

def _check_map(feature_map) -> None:
  if not isinstance(feature_map, str) or feature_map not in features.names(positive=True):
    raise ValueError(f'feature_map must be one of {features.names(positive=True)}, got '
                     f'{feature_map!r}.')


def _check_qk(q, k, key_mask, query_mask=None) -> None:
  _checks.check_min_rank('q', q, 2)
  _checks.check_min_rank('k', k, 2)
  if np.shape(q)[:-2] != np.shape(k)[:-2] or np.shape(q)[-1] != np.shape(k)[-1]:
    raise ValueError(f'q and k must be [..., L_q, d] and [..., L_k, d] with the same leading '
                     f'axes and d, got shapes {np.shape(q)} and {np.shape(k)}.')
  for name, x, what in (('q', q, 'query row'), ('k', k, 'key')):
    if math.prod(np.shape(x)[:-1]) == 0:
      raise ValueError(f'{name} must hold at least one {what} (every axis but the last >= 1), '
                       f'got shape {np.shape(x)}.')
  if key_mask is not None and np.shape(key_mask) != np.shape(k)[:-1]:
    raise ValueError(f'key_mask must have shape {np.shape(k)[:-1]} (k without its last axis), '
                     f'got {np.shape(key_mask)}.')
  if query_mask is not None and np.shape(query_mask) != np.shape(q)[:-1]:
    raise ValueError(f'query_mask must have shape {np.shape(q)[:-1]} (q without its last '
                     f'axis), got {np.shape(query_mask)}.')


def _check_all(q, k, omega, feature_map, key_mask, query_mask=None) -> None:
  _check_map(feature_map)
  _check_qk(q, k, key_mask, query_mask)
  _checks.check_particles('omega', omega)
  _checks.check_same_last_dim('q', q, 'omega', omega)


def _prepare(q, k, key_mask, *others):
  """Promotes to float32 (or wider) and zeroes masked keys (``where``: NaN never leaks)."""
  dtype = jnp.promote_types(jnp.result_type(q, k, *others), jnp.float32)
  q, k = jnp.asarray(q, dtype), jnp.asarray(k, dtype)
  mask = (jnp.ones(k.shape[:-1], bool) if key_mask is None
          else jnp.asarray(key_mask, bool))
  k = jnp.where(mask[..., None], k, 0.0)
  return q, k, mask, dtype


def _row_mean(values, query_mask):
  """Mean of per-row ``values: [..., L_q]`` over the real query rows (all if ``None``)."""
  if query_mask is None:
    return jnp.mean(values)
  w = jnp.asarray(query_mask, values.dtype)
  return jnp.sum(jnp.where(w > 0, values, 0.0)) / jnp.maximum(jnp.sum(w), 1.0)


def _masked_log_softmax(x, mask):
  """log softmax of ``x: [..., L_k]`` over the entries where ``mask`` (broadcast) is True.

  Max-shifted (stop-gradient, over real entries only) and guarded: a row without
  real entries gives finite values (its weights, masked to 0 by the caller, vanish).
  """
  m = jnp.max(jnp.where(mask, x, -jnp.inf), axis=-1, keepdims=True)
  m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
  xs = jnp.where(mask, x, 0.0) - m
  den = jnp.sum(jnp.where(mask, jnp.exp(xs), 0.0), axis=-1, keepdims=True)
  return xs - jnp.log(jnp.maximum(den, jnp.finfo(x.dtype).tiny))


# ----------------------------------------------------------------------------- maps

def hedgehog(x: jax.Array, w: jax.Array, stabilize: bool = True) -> jax.Array:
  r"""Hedgehog-style exponential features, ``[..., 2M]``.

  φ(x) = [exp(Wx − m), exp(−Wx − m)] / √(2M) for ``w: [M, d]`` and ``x: [..., d]``,
  so M rows give 2M features (at N features use M = N/2). Without the shift,
  ⟨φ(x), φ(y)⟩ = (1/2M) Σ_k (e^{w_kᵀ(x+y)} + e^{−w_kᵀ(x+y)}) = (1/M) Σ_k cosh(w_kᵀ(x+y)).

  ``stabilize=True``: m = stop_gradient(max over the 2M entries of [Wx, −Wx]), one
  per row, as ``features.favor(..., stabilize=True)``; the largest entry is then
  1/√(2M) and nothing overflows. The factor e^{−m} cancels in attention for *query*
  rows (it is common to a query's numerator and denominator); on keys a per-row
  shift reweights the keys, so use ``stabilize=False`` there, or the log-space
  forms (``hedgehog_log_features``, which ``kernel_attention_fn`` and the losses
  use and which need no shift). ``stabilize=False``: the exact formula.
  """
  _checks.check_min_rank('x', x, 1)
  _checks.check_particles('w', w)
  _checks.check_same_last_dim('x', x, 'w', w)
  z = _hedgehog_logits(x, w)
  if stabilize:
    m = jnp.max(z, axis=-1, keepdims=True)
    z = z - jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
  return jnp.exp(z) / math.sqrt(z.shape[-1])


hedgehog.separable = True     # feature pair k depends on row w_k only


def _hedgehog_logits(x, w):
  dtype = jnp.promote_types(jnp.result_type(x, w), jnp.float32)
  s = jnp.einsum('...d,md->...m', jnp.asarray(x, dtype), jnp.asarray(w, dtype))
  return jnp.concatenate([s, -s], axis=-1)


def hedgehog_log_features(x: jax.Array, w: jax.Array) -> jax.Array:
  """log φ(x) of ``hedgehog`` ``[..., 2M]``: [Wx, −Wx] − ½·log(2M), no shift needed."""
  z = _hedgehog_logits(x, w)
  return z - 0.5 * math.log(z.shape[-1])


def _log_features(x, omega, feature_map):
  """log φ of any positive map (``features.log_features``). ``hedgehog`` keeps its own
  expression, [s, −s] − ½·log(2M), which rounds differently from the registry's
  [s, −s] − ½·log 2 − ½·log M: the committed mimicry results were computed with it."""
  if feature_map == 'hedgehog':
    return hedgehog_log_features(x, omega)
  return features.log_features(x, omega, feature_map)


# ----------------------------------------------------------------------------- weights

def softmax_attention_weights(q: jax.Array, k: jax.Array,
                              key_mask: Optional[jax.Array] = None) -> jax.Array:
  r"""A_soft = softmax_j(q_iᵀk_j/√d), ``[..., L_q, L_k]``, masked keys weight 0.

  ``q: [..., L_q, d]``, ``k: [..., L_k, d]``, ``key_mask: [..., L_k]`` (True = real).
  Max-shifted over the real keys; a query with no real key gets a row of zeros.
  """
  _check_qk(q, k, key_mask)
  return jnp.exp(_log_softmax_weights(q, k, key_mask)[0]) * _row_mask(k, key_mask)


def _row_mask(k, key_mask):
  if key_mask is None:
    return jnp.ones(k.shape[:-1], jnp.float32)[..., None, :]
  return jnp.asarray(key_mask, jnp.float32)[..., None, :]


def _log_softmax_weights(q, k, key_mask):
  """(log A_soft ``[..., L_q, L_k]``, mask ``[..., 1, L_k]``) after ``_prepare``."""
  q, k, mask, _ = _prepare(q, k, key_mask)
  logits = jnp.einsum('...qd,...kd->...qk', q, k) / math.sqrt(q.shape[-1])
  return _masked_log_softmax(logits, mask[..., None, :]), mask[..., None, :]


def linear_attention_weights(phi_q: jax.Array, phi_k: jax.Array,
                             key_mask: Optional[jax.Array] = None, *,
                             eps: float = xla.DEFAULT_EPS) -> jax.Array:
  r"""A_lin[i, j] = φ(q_i)ᵀφ(k_j) / max(Σ_{j' real} φ(q_i)ᵀφ(k_{j'}), eps), ``[..., L_q, L_k]``.

  ``phi_q: [..., L_q, F]``, ``phi_k: [..., L_k, F]`` non-negative features (already
  computed); masked keys are excluded from the sum and get weight 0.
  """
  _check_qk(phi_q, phi_k, key_mask)
  xla.check_eps(eps)
  phi_q, phi_k, mask, _ = _prepare(phi_q, phi_k, key_mask)
  kern = jnp.where(mask[..., None, :], jnp.einsum('...qf,...kf->...qk', phi_q, phi_k), 0.0)
  return kern / jnp.maximum(jnp.sum(kern, axis=-1, keepdims=True), eps)


def kernel_attention_weights(q: jax.Array, k: jax.Array, omega: jax.Array,
                             feature_map: str = 'favor',
                             key_mask: Optional[jax.Array] = None) -> jax.Array:
  r"""A_lin of the particles, ``[..., L_q, L_k]``: the rows linear attention uses.

  A_lin[i, j] = K_φ[i, j] / Σ_{j' real} K_φ[i, j'] with K_φ = φ(q̃)φ(k̃)ᵀ, q̃ = d^{−1/4} q,
  k̃ = d^{−1/4} k, computed in log space (exact at any input scale); masked keys get
  weight 0. ``A_lin @ v`` is what linear attention outputs (without ever forming A_lin);
  compare with ``softmax_attention_weights(q, k, key_mask)``. Arguments as
  ``attention_cross_entropy``.
  """
  _check_all(q, k, omega, feature_map, key_mask)
  _, log_lin, mask = _log_weights(q, k, omega, feature_map, key_mask)
  return jnp.where(mask, jnp.exp(log_lin), 0.0)


def _log_kernel(q, k, omega, feature_map):
  """log K_φ ``[..., L_q, L_k]`` of the scaled inputs, exact in log space."""
  scale = q.shape[-1] ** -0.25
  lq = _log_features(q * scale, omega, feature_map)               # [..., L_q, F]
  lk = _log_features(k * scale, omega, feature_map)               # [..., L_k, F]
  return jax.nn.logsumexp(lq[..., :, None, :] + lk[..., None, :, :], axis=-1)


def _log_weights(q, k, omega, feature_map, key_mask):
  """(log A_soft, log A_lin, mask ``[..., 1, L_k]``); inputs checked by the caller."""
  q, k, mask, dtype = _prepare(q, k, key_mask, omega)
  omega = jnp.asarray(omega, dtype)
  log_soft, row_mask = _log_softmax_weights(q, k, mask)
  log_lin = _masked_log_softmax(_log_kernel(q, k, omega, feature_map), row_mask)
  return log_soft, log_lin, row_mask


def attention_cross_entropy(q: jax.Array, k: jax.Array, omega: jax.Array,
                            feature_map: str = 'favor',
                            key_mask: Optional[jax.Array] = None,
                            query_mask: Optional[jax.Array] = None) -> jax.Array:
  r"""Hedgehog's loss CE = mean_i −Σ_j A_soft[i, j] log A_lin[i, j] (scalar).

  log A_lin[i, j] = log K_φ[i, j] − logsumexp_{j' real} log K_φ[i, j'] with
  log K_φ[i, j] = logsumexp_f (log φ(q̃_i)_f + log φ(k̃_j)_f), q̃ = d^{−1/4} q,
  k̃ = d^{−1/4} k. The mean runs over the real query rows and leading axes.

  Args:
    q: ``[..., L_q, d]`` queries; k: ``[..., L_k, d]`` keys.
    omega: ``[M, d]`` particles (``hedgehog``: its W).
    feature_map: a name in ``MIMICRY_FEATURE_MAPS``.
    key_mask: optional ``[..., L_k]`` bool, True for real keys.
    query_mask: optional ``[..., L_q]`` bool, True for real query rows (the others are
      left out of the mean).
  """
  _check_all(q, k, omega, feature_map, key_mask, query_mask)
  log_soft, log_lin, mask = _log_weights(q, k, omega, feature_map, key_mask)
  terms = jnp.where(mask, jnp.exp(log_soft) * log_lin, 0.0)
  return -_row_mean(jnp.sum(terms, axis=-1), query_mask)


def attention_kl(q: jax.Array, k: jax.Array, omega: jax.Array,
                 feature_map: str = 'favor',
                 key_mask: Optional[jax.Array] = None,
                 query_mask: Optional[jax.Array] = None) -> jax.Array:
  r"""KL = CE − H(A_soft) = mean_i Σ_j A_soft[i, j](log A_soft[i, j] − log A_lin[i, j]).

  ≥ 0 and 0 iff every row of A_lin equals A_soft's; summed as one difference of
  logarithms (no cancellation between CE and the entropy). Arguments as
  ``attention_cross_entropy``.
  """
  _check_all(q, k, omega, feature_map, key_mask, query_mask)
  log_soft, log_lin, mask = _log_weights(q, k, omega, feature_map, key_mask)
  terms = jnp.where(mask, jnp.exp(log_soft) * (log_soft - log_lin), 0.0)
  return _row_mean(jnp.sum(terms, axis=-1), query_mask)


def softmax_kernel_alignment(q: jax.Array, k: jax.Array, omega: jax.Array,
                             feature_map: str = 'favor',
                             key_mask: Optional[jax.Array] = None,
                             query_mask: Optional[jax.Array] = None) -> jax.Array:
  r"""Cosine ⟨K_φ, K_soft⟩_F / (‖K_φ‖_F ‖K_soft‖_F) ∈ [0, 1] (positive maps), scalar.

  K_φ = φ(q̃)φ(k̃)ᵀ and K_soft = exp(qkᵀ/√d), ``[..., L_q, L_k]``, over the real keys.
  Each matrix is divided by its largest entry (a stop-gradient shift in log space:
  a common factor cancels in the cosine), so neither over- nor underflows. With
  leading axes the cosine is taken per leading index and averaged. ``query_mask``:
  only the real query rows' entries count.
  """
  _check_all(q, k, omega, feature_map, key_mask, query_mask)
  q, k, mask, dtype = _prepare(q, k, key_mask, omega)
  pair = mask[..., None, :]
  if query_mask is not None:
    pair = pair & jnp.asarray(query_mask, bool)[..., :, None]

  def unit_max(log_m):
    m = jnp.max(jnp.where(pair, log_m, -jnp.inf), axis=(-2, -1), keepdims=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    return jnp.where(pair, jnp.exp(jnp.where(pair, log_m, 0.0) - m), 0.0)

  a = unit_max(_log_kernel(q, k, jnp.asarray(omega, dtype), feature_map))
  b = unit_max(jnp.einsum('...qd,...kd->...qk', q, k) / math.sqrt(q.shape[-1]))
  tiny = jnp.finfo(dtype).tiny
  norm = jnp.sqrt(jnp.maximum(jnp.sum(a * a, axis=(-2, -1)) * jnp.sum(b * b, axis=(-2, -1)),
                              tiny))
  return jnp.mean(jnp.sum(a * b, axis=(-2, -1)) / norm)


# ----------------------------------------------------------------------------- Hamiltonian

_DATA_TERMS = {
    'cross_entropy': attention_cross_entropy,
    'kl': attention_kl,
    'alignment': lambda *a, **kw: -softmax_kernel_alignment(*a, **kw),
}


def mimicry_hamiltonian_terms(
    omega: jax.Array, q: jax.Array, k: jax.Array, *,
    feature_map: str, lam: float, s: repulsion.Exponent = 'coulomb',
    softening: float = repulsion.DEFAULT_SOFTENING, target: str = 'cross_entropy',
    key_mask: Optional[jax.Array] = None,
    query_mask: Optional[jax.Array] = None, precision=None) -> Tuple[jax.Array, jax.Array]:
  """``(data_term, repulsion_term)``; arguments as ``mimicry_hamiltonian``."""
  if target not in TARGETS:
    raise ValueError(f'target must be one of {TARGETS}, got {target!r}.')
  _check_all(q, k, omega, feature_map, key_mask, query_mask)
  _checks.check_nonnegative('lam', lam)   # λ < 0 would attract the particles together
  with hamiltonian.matmul_precision(precision):
    data = _DATA_TERMS[target](q, k, omega, feature_map, key_mask, query_mask=query_mask)
    return data, repulsion.riesz_energy(omega, s, softening)


def mimicry_hamiltonian(
    omega: jax.Array, q: jax.Array, k: jax.Array, *,
    feature_map: str, lam: float, s: repulsion.Exponent = 'coulomb',
    softening: float = repulsion.DEFAULT_SOFTENING, target: str = 'cross_entropy',
    key_mask: Optional[jax.Array] = None,
    query_mask: Optional[jax.Array] = None, precision=None) -> jax.Array:
  r"""H(Ω) = D(Ω) + λ·W_s(Ω) (scalar): the label Hamiltonian with softmax as the target.

  D is CE (``"cross_entropy"``), KL (``"kl"``, same gradient as CE) or
  −(softmax-kernel alignment) (``"alignment"``); W_s is ``repulsion.riesz_energy``.
  ``jax.grad`` of it is the ``grad`` of ``langevin.langevin_step``.

  Args:
    omega: ``[M, d]`` particles.
    q: ``[..., L_q, d]`` queries; k: ``[..., L_k, d]`` keys (unscaled: d^{−1/4} is applied here).
    feature_map: a name in ``MIMICRY_FEATURE_MAPS``.
    lam: repulsion weight λ ≥ 0.
    s: Riesz exponent ≥ 0 or ``"coulomb"`` (s = d − 2).
    softening: ε ≥ 0 of the Riesz kernel.
    target: a name in ``TARGETS``.
    key_mask: optional ``[..., L_k]`` bool, True for real keys.
    query_mask: optional ``[..., L_q]`` bool, True for real query rows.
    precision: of every matrix product (``hamiltonian.matmul_precision``; None: the
      backend's default).
  """
  data, rep = mimicry_hamiltonian_terms(omega, q, k, feature_map=feature_map, lam=lam, s=s,
                                        softening=softening, target=target, key_mask=key_mask,
                                        query_mask=query_mask, precision=precision)
  return data + lam * rep


# ----------------------------------------------------------------------------- training

def train_hedgehog(key: jax.Array, q: jax.Array, k: jax.Array, num_features: int, *,
                   steps: int, learning_rate: float,
                   key_mask: Optional[jax.Array] = None) -> Tuple[jax.Array, jax.Array]:
  r"""Fits Hedgehog's W ``[M, d]`` by ``optax.adam`` on ``attention_cross_entropy``.

  ``num_features`` is M, the rows of W: the map has 2M features (at N features pass
  N/2). W starts at N(0, I/d) drawn with ``key`` (so Wq̃ has the scale of q̃ᵀq̃/d);
  every step takes the full batch (q, k). Returns ``(w [M, d], losses [steps])``
  with ``losses[t]`` the CE at the start of step t.
  """
  _checks.check_key('key', key)
  _check_qk(q, k, key_mask)
  m = _checks.check_int('num_features', num_features, 1)
  steps = _checks.check_int('steps', steps, 1)
  _checks.check_positive('learning_rate', learning_rate)
  d = np.shape(q)[-1]
  w0 = features.sample_gaussian(key, m, d) / math.sqrt(d)
  opt = optax.adam(learning_rate)
  loss_fn = lambda w: attention_cross_entropy(q, k, w, 'hedgehog', key_mask)

  def step(carry, _):
    w, state = carry
    loss, grad = jax.value_and_grad(loss_fn)(w)
    updates, state = opt.update(grad, state, w)
    return (optax.apply_updates(w, updates), state), loss

  (w, _), losses = jax.lax.scan(step, (w0, opt.init(w0)), None, length=steps)
  return w, losses


def gradient_flow(omega0: jax.Array, q: jax.Array, k: jax.Array, *,
                  feature_map: str = 'favor', target: str = 'cross_entropy', steps: int,
                  step_size: float, radius: Optional[float] = None,
                  key_mask: Optional[jax.Array] = None) -> Tuple[jax.Array, jax.Array]:
  r"""The particles moved by plain projected gradient descent on the mimicry Hamiltonian.

  ω ← P_R(ω − η ∇_Ω D(Ω)) with D the data term of ``mimicry_hamiltonian`` (λ = 0, no
  noise: Langevin at β = ∞ without its factor N), P_R the per-particle ball of
  ``radius`` (``None``: no projection). Counting: ``favor`` M particles → M features,
  ``hedgehog``/``softmaxfeat`` M rows → 2M features. Returns
  ``(omega [M, d], losses [steps])``, ``losses[t]`` = D before step t. ``step_size`` is a
  finite η > 0; ``radius`` R > 0 (∞ allowed: the same as ``None``).
  """
  _checks.check_positive('step_size', step_size)
  steps = _checks.check_int('steps', steps, 1)
  if radius is not None:
    _checks.check_positive('radius', radius, allow_inf=True)    # R = ∞: no projection
  energy = lambda w: mimicry_hamiltonian(w, q, k, feature_map=feature_map, lam=0.0,
                                         target=target, key_mask=key_mask)
  energy(omega0)                                  # checks every argument eagerly, once

  def step(w, _):
    loss, grad = jax.value_and_grad(energy)(w)
    w = w - step_size * grad
    return (w if radius is None else langevin.project_to_ball(w, radius)), loss

  return jax.lax.scan(step, jnp.asarray(omega0, jnp.promote_types(omega0.dtype, jnp.float32)),
                      None, length=steps)
