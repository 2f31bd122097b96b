r"""The Langevin update with particles sharded across devices.

P devices each hold a block of M = N/P particles (``omega_shard: [M, d]``);
inputs ``x: [n, d]`` and labels ``y: [n]`` are replicated. One step:

* data term: for a separable feature map, ∇_{ω_k}(−A) depends on ω_k only and
  −A = −(1/N) Σ_k A({ω_k}), so each device differentiates
  −(M/N)·A(Ω_shard) over its own particles: O(n·M·d) per device. For
  ``softmaxfeat`` (not separable: its softmax couples all particles) each
  device evaluates the full feature map on the gathered particles and keeps
  the gradient of its own rows.
* repulsion: Ω is ``all_gather``-ed; ∇_{ω_k} W = (2/N) ∇_{ω_k} u(ω_k) with
  u the mean-field potential (``repulsion.riesz_potential``), the self pair
  excluded by global index: O(M·N·d) per device.
* clipping uses the global norm (``psum``), and the noise of particle k comes
  from ``fold_in(key, k)`` with k its global index, as in
  ``langevin.langevin_step``: the result equals the one-device update up to
  float rounding.

``sharded_langevin_step`` is the per-device body: call it inside ``jax.pmap``
or ``jax.shard_map`` with the axis name of the particle axis (outside them, or
with an axis name they do not bind, it raises a ValueError naming the axis).
``langevin_step_on_mesh`` wraps it in ``jax.shard_map`` for global arrays and
checks that ``axis_name`` is an axis of the mesh. Both work with
``jax_enable_x64`` (index arithmetic keeps one integer dtype) and move particles
of any real dtype as ``langevin.langevin_step`` does.
"""

import functools
from typing import Optional, Union

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from coulomb_jax import _checks
from coulomb_jax import alignment
from coulomb_jax import features
from coulomb_jax import hamiltonian as hamiltonian_lib
from coulomb_jax import langevin
from coulomb_jax import repulsion


def sharded_langevin_step(
    key: jax.Array, omega_shard: jax.Array, x: jax.Array, y: jax.Array, *,
    axis_name: str, feature_map: Union[str, features.FeatureMap], lam: float,
    s: repulsion.Exponent = 'coulomb',
    softening: float = repulsion.DEFAULT_SOFTENING,
    step_size: float, beta: float, radius: float,
    clip_norm: Optional[float] = None, precision=None,
) -> jax.Array:
  r"""One projected Langevin step on this device's particles, ``[M, d] → [M, d]``.

  Must run under a named axis ``axis_name`` (``pmap`` or ``shard_map``) whose
  devices hold consecutive blocks of the N = M·P particles. Equal (to float
  rounding) to ``langevin_step(key, Ω, jax.grad(hamiltonian)(Ω, x, y, ...))``
  restricted to this block.

  Args:
    key: the step's PRNG key, the same on every device.
    omega_shard: ``[M, d]`` this device's particles.
    x: ``[n, d]`` inputs and y: ``[n]`` labels, replicated.
    axis_name: the mapped axis over which particles are sharded.
    Other arguments: as ``hamiltonian.hamiltonian`` and ``langevin.langevin_step``.
  """
  hamiltonian_lib._check_data(omega_shard, x, y)
  langevin._check_step_args(step_size, beta, radius, clip_norm)
  _checks.check_nonnegative('lam', lam)
  _checks.check_nonnegative('softening', softening)
  fm = features.get_feature_map(feature_map)
  s = repulsion.resolve_exponent(s, omega_shard.shape[-1])
  m = omega_shard.shape[0]
  try:
    num = m * jax.lax.psum(1, axis_name)
  except NameError:
    raise ValueError(
        f'axis_name {axis_name!r} is not bound here: sharded_langevin_step must run inside '
        f'jax.pmap or jax.shard_map over that axis (langevin_step_on_mesh does this for '
        f'global arrays).') from None
  offset = jax.lax.axis_index(axis_name) * m
  dtype, out_dtype = langevin.particle_dtypes(omega_shard.dtype)
  omega_shard = omega_shard.astype(dtype)     # integer / bf16 particles: moved in float32
  omega_all = jax.lax.all_gather(omega_shard, axis_name, tiled=True)   # [N, d]

  def local_energy(w):
    """A function of this block whose gradient is ∇_{block} H."""
    if features.is_separable(fm):
      data = -(m / num) * alignment.target_alignment(fm(x, w), y)
    else:
      # One integer dtype for both indices (a literal 0 is int64 under jax_enable_x64).
      full = jax.lax.dynamic_update_slice(omega_all, w, (offset, jnp.zeros_like(offset)))
      data = -alignment.target_alignment(fm(x, full), y)
    pot = repulsion.riesz_potential(w, jax.lax.stop_gradient(omega_all), s, softening,
                                    self_index_offset=offset)
    return data + lam * (2.0 / num) * jnp.sum(pot)

  with hamiltonian_lib.matmul_precision(precision):
    grad = jax.grad(local_energy)(omega_shard)
  grad = langevin.clip_by_global_norm(grad, clip_norm, langevin.global_norm(grad, axis_name))
  new, _ = langevin._move(key, omega_shard, grad, step_size=step_size, beta=beta,
                          radius=radius, num_particles=num, row_offset=offset)
  return langevin.round_into_ball(new, radius, out_dtype)


def langevin_step_on_mesh(
    key: jax.Array, omega: jax.Array, x: jax.Array, y: jax.Array, *,
    mesh: jax.sharding.Mesh, axis_name: str, **kwargs,
) -> jax.Array:
  """``sharded_langevin_step`` under ``jax.shard_map`` on global arrays.

  ``omega: [N, d]`` is split into blocks along ``axis_name`` of ``mesh`` (N must
  be divisible by that axis' size); key, x and y are replicated. ``kwargs`` are
  those of ``sharded_langevin_step``. Returns the new ``[N, d]`` particles,
  sharded the same way. Works with meshes of either axis type. Eager calls
  refuse NaN/inf in ``omega``, ``x`` and ``y``.
  """
  if axis_name not in mesh.axis_names:
    raise ValueError(f'axis_name {axis_name!r} is not an axis of mesh; its axes are '
                     f'{tuple(mesh.axis_names)}.')
  for name, a in (('omega', omega), ('x', x), ('y', y)):
    _checks.check_finite(name, a)
  size = mesh.shape[axis_name]
  if omega.shape[0] % size:
    raise ValueError(
        f'omega has {omega.shape[0]} particles, not divisible by the {size} devices '
        f'of mesh axis {axis_name!r}.')
  replicated, split = PartitionSpec(), PartitionSpec(axis_name)
  if jax.sharding.AxisType.Explicit in tuple(mesh.axis_types):
    # Explicit axes: shard_map wants inputs already laid out as in_specs say.
    omega = jax.reshard(omega, jax.sharding.NamedSharding(mesh, split))
    x, y = (jax.reshard(a, jax.sharding.NamedSharding(mesh, replicated)) for a in (x, y))
  body = functools.partial(sharded_langevin_step, axis_name=axis_name, **kwargs)
  return jax.shard_map(body, mesh=mesh, in_specs=(replicated, split, replicated, replicated),
                       out_specs=split)(key, omega, x, y)
