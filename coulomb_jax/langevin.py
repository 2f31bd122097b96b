r"""Projected Langevin dynamics of the particles (the paper's Algorithm 1).

One step moves every particle k by

.. math::
   ω_k ← P_R\big(ω_k − η N ∇_{ω_k} H + \sqrt{2η/β}\, ξ_k\big),\qquad ξ_k ∼ N(0, I_d),

where P_R projects each particle onto the ball ‖ω_k‖ ≤ R. The factor N makes
the drift of one particle O(1) (∇_{ω_k} H is O(1/N) in the mean-field scaling),
so the empirical measure follows the McKean–Vlasov flow with time step η.
β = ∞ is noise-free projected gradient descent.

Conventions:

* ``grad`` is ∇_Ω H exactly as ``jax.grad(hamiltonian)`` returns it; the
  optional clipping rescales it to global norm ≤ ``clip_norm`` *before* the
  factor η·N.
* The noise of particle (row) k is drawn from ``fold_in(key, k)``, so it does
  not depend on how the particles are sharded (``coulomb_jax.parallel`` gives
  the same update as one device).

* Particles of any real dtype are moved in float32 (or wider): integer particles
  come back as float32 (never truncated), bf16/float16 ones in their own dtype,
  rounded so that they stay inside the ball (``round_into_ball``: rows that
  round-to-nearest would push outside are rounded toward zero instead).
* Eager calls refuse NaN/inf particles, gradients and data, and hyper-parameters
  that are not numbers (``step_size='0.1'``), negative, NaN or infinite (λ < 0
  included; β = ∞ and R = ∞ are allowed), each with a one-line ``ValueError`` naming
  the argument and the value; under ``jit`` only the static checks (shapes, Python
  numbers) run. There ``langevin_transform`` counts instead: its state holds the
  number of non-finite gradient and particle entries of the last update
  (``LangevinState.nonfinite_grads``, ``nonfinite_params``), for a driver to stop on.

Three ways in: ``langevin_step`` (one update), ``run_langevin`` (Algorithm 1
over minibatches with ``lax.scan`` and early stop) and ``langevin_transform``
(the same update as an optax ``GradientTransformation``). ``gibbs_resample``
is Algorithm 1's final resampling step.
"""

import functools
import math
from typing import NamedTuple, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from coulomb_jax import _checks
from coulomb_jax import features
from coulomb_jax import hamiltonian as hamiltonian_lib
from coulomb_jax import repulsion


def _check_step_args(step_size, beta, radius, clip_norm):
  """η, β, R > 0 and clip_norm > 0 if set: numbers, not NaN; finite but for β = ∞ (no
  noise) and R = ∞ (no projection). ``clip_norm = None`` is no clipping (∞ is refused)."""
  _checks.check_positive('step_size', step_size)
  _checks.check_positive('beta', beta, allow_inf=True)
  _checks.check_positive('radius', radius, allow_inf=True)
  if clip_norm is not None:
    _checks.check_positive('clip_norm', clip_norm)


def project_to_ball(omega: jax.Array, radius: Union[float, jax.Array]) -> jax.Array:
  """P_R: each row (particle) of ``omega: [..., d]`` onto the ball ‖ω‖ ≤ R.

  P_R(ω) = ω · min(1, R/‖ω‖): the per-row form of
  ``optax.projections.projection_l2_ball``, written out so that R = ∞ (also
  when traced) is the identity instead of inf/inf.
  """
  norm = jnp.linalg.norm(omega, axis=-1, keepdims=True)
  scale = jnp.where(norm > radius, radius / jnp.where(norm > 0, norm, 1.0), 1.0)
  return omega * scale.astype(omega.dtype)


def global_norm(tree, axis_name=None) -> jax.Array:
  """‖tree‖₂ over all leaves (and over the devices of ``axis_name``), in float32.

  Computed as m·√(Σ (g/m)²) with m = max |g|, so it stays finite up to float32's
  largest value: Σ g² itself overflows once ‖g‖ ≳ 1.8e19, which the Riesz
  gradient reaches for large exponents s (close pairs give ε^{−s−1}).
  """
  leaves = [jnp.asarray(g, jnp.promote_types(g.dtype, jnp.float32))
            for g in jax.tree.leaves(tree)]
  m = functools.reduce(jnp.maximum, [jnp.max(jnp.abs(g)) for g in leaves])
  if axis_name is not None:
    m = jax.lax.pmax(m, axis_name)
  safe = jnp.where((m > 0) & jnp.isfinite(m), m, 1.0)
  sq = sum(jnp.sum(jnp.square(g / safe)) for g in leaves)
  if axis_name is not None:
    sq = jax.lax.psum(sq, axis_name)
  return jnp.where(jnp.isfinite(m), safe * jnp.sqrt(sq), m)


def clip_by_global_norm(grad, clip_norm, norm=None):
  """``grad · min(1, clip_norm / ‖grad‖)``; ``norm`` overrides ‖grad‖ (e.g. over devices).

  The rule of ``optax.clip_by_global_norm``, as a function: the sharded step needs
  to pass the norm over all devices, which the optax transformation cannot take.
  The norm is ``global_norm``'s (no overflow of the sum of squares).
  """
  if clip_norm is None:
    return grad
  if norm is None:
    norm = global_norm(grad)
  scale = jnp.where(norm > clip_norm, clip_norm / jnp.where(norm > 0, norm, 1.0), 1.0)
  return jax.tree.map(lambda g: g * scale.astype(g.dtype), grad)


def _row_noise(key, shape, dtype, row_offset=0):
  """ξ of ``shape = [..., d]``: row r drawn from ``fold_in(key, row_offset + r)``."""
  rows = math.prod(shape[:-1])
  keys = jax.vmap(jax.random.fold_in, (None, 0))(key, row_offset + jnp.arange(rows))
  xi = jax.vmap(lambda k: jax.random.normal(k, (shape[-1],), dtype))(keys)
  return xi.reshape(shape)


def particle_dtypes(dtype):
  """``(compute, result)`` dtypes for particles of ``dtype``.

  Computed in float32 or wider; the result keeps a floating dtype (bf16 stays
  bf16) and is float32 (the compute dtype) for integer particles, which a step
  would otherwise truncate.
  """
  compute = jnp.promote_types(dtype, jnp.float32)
  return compute, (dtype if jnp.issubdtype(dtype, jnp.floating) else compute)


def round_into_ball(omega: jax.Array, radius, dtype) -> jax.Array:
  """Rows of ``omega`` (inside the ball ‖ω‖ ≤ R, in a wider dtype) cast to ``dtype``.

  Round to nearest, except in rows whose rounded norm (measured in ``omega``'s
  dtype) exceeds R: there every entry is rounded toward zero, which cannot
  increase the norm; a row still outside (every entry exactly representable, and
  ``omega`` itself a few ulps outside) moves one more ulp toward zero. So bf16
  particles on the sphere stay inside it (round to nearest leaves up to 2⁻⁹
  relative outside).
  """
  zero = jnp.zeros((), dtype)
  norm = lambda a: jnp.linalg.norm(a.astype(omega.dtype), axis=-1, keepdims=True)
  r = omega.astype(dtype)
  if dtype != omega.dtype:
    down = jnp.where(jnp.abs(r.astype(omega.dtype)) > jnp.abs(omega), jnp.nextafter(r, zero), r)
    r = jnp.where(norm(r) > radius, down, r)
  return jnp.where(norm(r) > radius, jnp.nextafter(r, zero), r)


def _move(key, omega, grad, *, step_size, beta, radius, num_particles, row_offset=0):
  """The update on an already clipped gradient. Returns (new omega, projected fraction).

  Computed in float32 (or wider) and rounded into the ball in the result dtype
  (``particle_dtypes``), so bf16 particles take the same step as float32 ones up
  to the final rounding, and integer particles come back as float32.
  """
  dtype, out_dtype = particle_dtypes(omega.dtype)
  moved = omega.astype(dtype) - (step_size * num_particles) * grad.astype(dtype)
  if _checks.concrete_float(beta, 'beta') != math.inf:
    noise = _row_noise(key, omega.shape, dtype, row_offset)
    moved = moved + jnp.sqrt(2.0 * step_size / beta).astype(dtype) * noise
  outside = jnp.linalg.norm(moved, axis=-1) > radius
  return (round_into_ball(project_to_ball(moved, radius), radius, out_dtype),
          jnp.mean(outside.astype(jnp.float32)))


def langevin_step(key: jax.Array, omega: jax.Array, grad: jax.Array, *,
                  step_size: float, beta: float, radius: float,
                  clip_norm: Optional[float] = None) -> jax.Array:
  r"""One projected Langevin step, ``[..., N, d] → [..., N, d]``.

  ω ← P_R(ω − η·N·clip(∇H) + √(2η/β)·ξ), N = ``omega.shape[-2]``, computed in
  float32 (or wider); the result has ``omega``'s floating dtype, rounded so that it
  stays in the ball, or float32 for integer ``omega``.

  Args:
    key: PRNG key of this step (ignored when β = ∞).
    omega: ``[N, d]`` particles. Leading axes ``[..., N, d]`` hold several
      particle sets (e.g. one per attention head) that share one global clip.
    grad: ∇_Ω H, same shape as ``omega``.
    step_size: η > 0.
    beta: inverse temperature β > 0; ``jnp.inf`` for no noise.
    radius: R > 0 of the per-particle ball (``math.inf``: no projection).
    clip_norm: if set, ``grad`` is first rescaled to global norm ≤ clip_norm.
  """
  _checks.check_key('key', key)
  _checks.check_min_rank('omega', omega, 2)
  if grad.shape != omega.shape:
    raise ValueError(f'grad must have the shape of omega {omega.shape}, got {grad.shape}.')
  if omega.shape[-2] == 0 or omega.shape[-1] == 0:
    raise ValueError(
        f'omega must hold at least one particle of dimension >= 1, got shape {omega.shape}.')
  _check_step_args(step_size, beta, radius, clip_norm)
  _checks.check_finite('omega', omega)
  _checks.check_finite('grad', grad)
  grad = clip_by_global_norm(grad, clip_norm)
  return _move(key, omega, grad, step_size=step_size, beta=beta, radius=radius,
               num_particles=omega.shape[-2])[0]


class LangevinHistory(NamedTuple):
  """Per-step diagnostics of ``run_langevin``; every field is ``[num_steps]``.

  Energy terms are those of the step's minibatch at the particles *before*
  the step. Steps after the early stop are not run: ``active`` is False there
  and the other fields are 0.
  """
  hamiltonian: jax.Array
  alignment: jax.Array
  repulsion: jax.Array
  grad_norm: jax.Array           # ‖∇_Ω H‖ before clipping
  max_move: jax.Array            # max_k ‖ω_k(new) − ω_k(old)‖
  projected_fraction: jax.Array  # fraction of particles the projection moved
  active: jax.Array              # bool: the step ran


def run_langevin(
    key: jax.Array, omega: jax.Array, x: jax.Array, y: jax.Array, *,
    feature_map: Union[str, features.FeatureMap], lam: float,
    s: repulsion.Exponent = 'coulomb',
    softening: float = repulsion.DEFAULT_SOFTENING,
    step_size: float, beta: float, radius: float,
    clip_norm: Optional[float] = None, batch_size: Optional[int] = None,
    num_epochs: int = 1, tol: float = 0.0,
) -> Tuple[jax.Array, LangevinHistory]:
  r"""Algorithm 1: projected Langevin on H over shuffled minibatches.

  Each epoch draws a permutation of the n samples and cuts it into
  ⌊n / batch_size⌋ minibatches (the remainder is dropped); each minibatch is
  one ``langevin_step`` on ∇H of that minibatch. The loop is one ``lax.scan``
  of num_epochs·⌊n/b⌋ steps; after the first step whose largest particle move
  is below ``tol`` the remaining steps are skipped (early stop; ``tol = 0``
  never stops). With noise (β < ∞) moves are ~√(2ηd/β), so a small ``tol``
  only stops noise-free runs.

  Keys: ``key`` splits into a data key (one permutation per epoch, by
  ``fold_in`` of the epoch) and a noise key (step t uses ``fold_in(·, t)``).

  Args:
    key: PRNG key.
    omega: ``[N, d]`` initial particles.
    x: ``[n, d]`` inputs; y: ``[n]`` labels.
    feature_map, lam, s, softening: as ``hamiltonian``.
    step_size, beta, radius, clip_norm: as ``langevin_step``.
    batch_size: minibatch size b (``None``: full batch).
    num_epochs: passes over the data.
    tol: early-stop threshold on max_k ‖Δω_k‖.

  Returns:
    ``(omega, history)``: final ``[N, d]`` particles and a ``LangevinHistory``.
    The run is computed in float32 (or wider) whatever ``omega``'s dtype; the
    particles come back in its floating dtype (rounded into the ball once, at
    the end) or as float32 for integer ``omega``.
  """
  _checks.check_key('key', key)
  hamiltonian_lib._check_data(omega, x, y)
  n = x.shape[0]
  if n < 2:
    raise ValueError(f'x must hold at least 2 samples (the alignment averages over pairs '
                     f'i != j), got {n} (shape {x.shape}).')
  _check_step_args(step_size, beta, radius, clip_norm)
  _checks.check_nonnegative('lam', lam)
  _checks.check_nonnegative('softening', softening)
  _checks.check_nonnegative('tol', tol)
  for name, a in (('omega', omega), ('x', x), ('y', y)):
    _checks.check_finite(name, a)
  batch_size = n if batch_size is None else _checks.check_int('batch_size', batch_size, 2, n)
  num_epochs = _checks.check_int('num_epochs', num_epochs, 1)
  s = repulsion.resolve_exponent(s, omega.shape[-1])
  dtype, out_dtype = particle_dtypes(omega.dtype)
  omega, history = _run_langevin(
      key, omega.astype(dtype), x, y, lam, s, softening, step_size, beta, radius, clip_norm,
      tol, feature_map=features.get_feature_map(feature_map), batch_size=batch_size,
      num_epochs=num_epochs)
  return round_into_ball(omega, radius, out_dtype), history


@functools.partial(jax.jit, static_argnames=('feature_map', 'batch_size', 'num_epochs'))
def _run_langevin(key, omega, x, y, lam, s, softening, step_size, beta, radius,
                  clip_norm, tol, *, feature_map, batch_size, num_epochs):
  n = x.shape[0]
  steps_per_epoch = n // batch_size
  data_key, noise_key = jax.random.split(key)
  perms = jax.vmap(lambda e: jax.random.permutation(jax.random.fold_in(data_key, e), n))(
      jnp.arange(num_epochs))
  batches = perms[:, :steps_per_epoch * batch_size].reshape(-1, batch_size)
  energy = functools.partial(hamiltonian_lib.hamiltonian_terms, feature_map=feature_map,
                             lam=lam, s=s, softening=softening)

  def active_step(omega, t, idx):
    (h, terms), grad = jax.value_and_grad(energy, has_aux=True)(omega, x[idx], y[idx])
    grad_norm = global_norm(grad)
    grad = clip_by_global_norm(grad, clip_norm, grad_norm)
    new, frac = _move(jax.random.fold_in(noise_key, t), omega, grad, step_size=step_size,
                      beta=beta, radius=radius, num_particles=omega.shape[0])
    move = jnp.max(jnp.linalg.norm(new - omega, axis=-1))
    info = LangevinHistory(h, terms['alignment'], terms['repulsion'], grad_norm, move,
                           frac, jnp.array(True))
    return new, info

  def skipped_step(omega, t, idx):
    info = jax.eval_shape(active_step, omega, t, idx)[1]
    info = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), info)
    return omega, info._replace(active=jnp.array(False))

  def body(carry, inputs):
    omega, done = carry
    omega, info = jax.lax.cond(done, skipped_step, active_step, omega, *inputs)
    done = done | (info.active & (info.max_move < tol))
    return (omega, done), info

  steps = jnp.arange(batches.shape[0])
  (omega, _), history = jax.lax.scan(body, (omega, jnp.array(False)), (steps, batches))
  return omega, history


def gibbs_resample(
    key: jax.Array, omega: jax.Array, x: jax.Array, y: jax.Array, num_samples: int, *,
    beta: float, feature_map: Union[str, features.FeatureMap], lam: float,
    s: repulsion.Exponent = 'coulomb',
    softening: float = repulsion.DEFAULT_SOFTENING,
) -> Tuple[jax.Array, jax.Array]:
  r"""Algorithm 1's last step: D particles drawn from the particles' Gibbs weights.

  Draws D indices i.i.d. (with replacement) from p_k ∝ exp(−β U_k), with
  U_k = ``hamiltonian.particle_potentials``: the potential that drives particle
  k in the step (its data potential V_D(ω_k) plus 2λ times its mean-field
  repulsion, so that ∇U_k = N·∇_{ω_k}H), whose Gibbs density exp(−βU_k) is
  what the dynamics samples particle k from given the others. Returns those
  particles. β = ∞ puts all mass on the minimisers of U.

  This is the literal reading of the paper's "resample D particles from the
  particles' Gibbs distribution". Note what it implies: particles that already
  sample exp(−βU) (a stationary run) reweighted by exp(−βU) again give draws
  from ∝ exp(−2βU) restricted to the particles, i.e. twice the temperature's
  inverse; pass ``beta / 2`` for draws at β. Nothing in ``experiments/`` uses it.

  Returns:
    ``(samples [D, d], indices [D])``.
  """
  _checks.check_key('key', key)
  _checks.check_positive('beta', beta, allow_inf=True)     # β = ∞: the minimisers of U
  _checks.check_nonnegative('lam', lam)
  num_samples = _checks.check_int('num_samples', num_samples, 1)
  for name, a in (('omega', omega), ('x', x), ('y', y)):
    _checks.check_finite(name, a)
  u = hamiltonian_lib.particle_potentials(omega, x, y, feature_map=feature_map, lam=lam,
                                          s=s, softening=softening)
  u_min = jnp.min(u)
  logits = jnp.where(u == u_min, 0.0, -beta * (u - u_min))
  idx = jax.random.categorical(key, logits, shape=(num_samples,))
  return omega[idx], idx


class LangevinState(NamedTuple):
  """State of ``langevin_transform``: step count and the base key (as ``optax.add_noise``),
  and what the last update saw: ``nonfinite_grads``, ``nonfinite_params`` (int32 scalars),
  the number of NaN/±inf entries of the gradient (before clipping) and of the particles
  over all leaves (0 before the first update). Counted inside the update, so they are read
  under ``jit`` too, where the eager ``check_finite`` does nothing; a driver stops on the
  first non-zero one (the step moves a NaN gradient entry into its particle, silently).
  A checkpoint written before these two fields restores through ``to_legacy_state`` and
  ``from_legacy_state``.
  """
  count: jax.Array
  rng_key: jax.Array
  nonfinite_grads: jax.Array = np.int32(0)
  nonfinite_params: jax.Array = np.int32(0)


class LegacyLangevinState(NamedTuple):
  """``LangevinState`` as it was saved before the non-finite counts (two fields)."""
  count: jax.Array
  rng_key: jax.Array


def to_legacy_state(tree):
  """``tree`` (an optimiser state, or a template of one) with every ``LangevinState`` as a
  ``LegacyLangevinState``: the structure of a checkpoint written before the counts, to
  restore it with (then ``from_legacy_state``)."""
  return jax.tree.map(lambda s: LegacyLangevinState(s.count, s.rng_key) if isinstance(
      s, LangevinState) else s, tree, is_leaf=lambda s: isinstance(s, LangevinState))


def from_legacy_state(tree):
  """``tree`` with every ``LegacyLangevinState`` a ``LangevinState`` with zero counts (host
  int32 scalars: no device placement of their own)."""
  zero = lambda: np.zeros((), np.int32)
  return jax.tree.map(lambda s: LangevinState(s.count, s.rng_key, zero(), zero()) if isinstance(
      s, LegacyLangevinState) else s, tree, is_leaf=lambda s: isinstance(s, LegacyLangevinState))


def count_nonfinite(tree) -> jax.Array:
  """int32 scalar: the NaN/±inf entries over all floating leaves of ``tree`` (0 if none)."""
  counts = [jnp.sum(~jnp.isfinite(x), dtype=jnp.int32) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  return sum(counts, jnp.zeros([], jnp.int32))


def langevin_transform(key: jax.Array, *, step_size: Union[float, optax.Schedule],
                       beta: float, radius: float,
                       clip_norm: Optional[float] = None) -> optax.GradientTransformation:
  r"""The Langevin step as an optax ``GradientTransformation``.

  ``step_size``: η, or an optax schedule ``count → η_t`` (e.g.
  ``optax.cosine_decay_schedule(η, T)``), so step t (counted from 0) moves by
  P_R(ω − η_t·N·clip(g) + √(2η_t/β)ξ): a decreasing η_t anneals drift and noise together
  (stochastic-gradient Langevin with a decaying step); η_t = 0 leaves a particle inside
  the ball where it is. A schedule's values are not checked (they may be traced).

  ``update(grads, state, params)`` needs ``params`` (the particles): it returns
  ``updates = P_R(ω − η·N·clip(g) + √(2η/β)ξ) − ω`` for every leaf, so
  ``optax.apply_updates`` lands on the projected Langevin step. Each leaf is a
  particle array ``[..., N, d]`` with its own N = ``shape[-2]`` and per-row
  balls; clipping uses the global norm over all leaves. Step t's noise comes
  from ``fold_in(key, t)``, split over leaves. Meant as the particles' entry of
  ``optax.partition`` in Phase A. Returning a difference that ``apply_updates``
  adds back costs one more rounding than ``langevin_step``: a particle on the
  sphere can end a few ulps outside the ball (float32: ~1e-7 relative). For
  bf16/float16 particles the updates are float32 differences to the rounded new
  particles (``apply_updates`` adds them in float32 and rounds back to the same
  particles, inside the ball). Integer particles are refused: ``apply_updates``
  would truncate the moved particles back to integers.

  The state after an update counts the NaN/±inf entries of that update's ``grads`` and
  ``params`` (``LangevinState``): under ``jit`` a NaN gradient entry becomes a NaN
  particle without an error (a NaN global norm clips nothing), so read
  ``state.nonfinite_grads`` and ``state.nonfinite_params`` (inside ``optax.partition``:
  ``optax.tree_utils.tree_get(opt_state, 'nonfinite_grads')``) and stop on a non-zero one.
  """
  _checks.check_key('key', key)
  scheduled = callable(step_size)
  _check_step_args(1.0 if scheduled else step_size, beta, radius, clip_norm)

  def init_fn(params):
    del params
    zero = jnp.zeros([], jnp.int32)
    return LangevinState(count=zero, rng_key=key, nonfinite_grads=zero, nonfinite_params=zero)

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('params: langevin_transform needs the particles (params), got None.')
    bad_grads, bad_params = count_nonfinite(updates), count_nonfinite(params)
    updates = clip_by_global_norm(updates, clip_norm)
    leaves, treedef = jax.tree.flatten(params)
    grads = treedef.flatten_up_to(updates)
    keys = jax.random.split(jax.random.fold_in(state.rng_key, state.count), len(leaves))
    eta = step_size(state.count) if scheduled else step_size
    new_updates = []
    for k, p, g in zip(keys, leaves, grads):
      _checks.check_min_rank('params leaf', p, 2)
      if not jnp.issubdtype(p.dtype, jnp.floating):
        raise ValueError(f'params leaf of shape {p.shape} has dtype {p.dtype}: particles '
                         f'must be floating (optax.apply_updates would truncate the moved '
                         f'particles to {p.dtype}).')
      _checks.check_finite('params leaf', p)
      _checks.check_finite('updates leaf', g)
      new, _ = _move(k, p, g, step_size=eta, beta=beta, radius=radius,
                     num_particles=p.shape[-2])
      if new.dtype.itemsize < 4:   # bf16/float16: a float32 update lands on `new` exactly.
        new_updates.append(new.astype(jnp.float32) - p.astype(jnp.float32))
      else:
        new_updates.append(new - p)
    return (jax.tree.unflatten(treedef, new_updates),
            LangevinState(count=optax.safe_increment(state.count), rng_key=state.rng_key,
                          nonfinite_grads=bad_grads, nonfinite_params=bad_params))

  return optax.GradientTransformation(init_fn, update_fn)
