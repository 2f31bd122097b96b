"""Tests of coulomb_jax.parallel on 8 fake CPU devices (in a subprocess)."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

from coulomb_jax import parallel

_SCRIPT = textwrap.dedent('''
    import math, unittest
    import chex
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, Mesh
    import coulomb_jax as cj
    from coulomb_jax import hamiltonian as hl, parallel

    assert jax.device_count() == 8, jax.devices()
    ko, kx = jax.random.split(jax.random.key(0))
    omega = 1.2 * cj.sample_gaussian(ko, 32, 4)
    x = jax.random.normal(kx, (50, 4))
    y = jnp.sign(jnp.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2])
    key = jax.random.key(42)
    grad_norm = lambda **e: float(jnp.linalg.norm(
        jax.grad(lambda w: hl.hamiltonian(w, x, y, **e))(omega)))
    favor_energy = dict(feature_map='favor', lam=1.0, s=1.0)
    # Radius 10: no projection, so the output shows the gradient itself; radius 1.5:
    # the projection is active. The favor case clips at 95% of the gradient norm.
    cases = [
        dict(feature_map='rff', lam=0.5, s='coulomb', beta=20.0, clip_norm=None, radius=10.0),
        dict(favor_energy, beta=math.inf, clip_norm=0.95 * grad_norm(**favor_energy),
             radius=10.0),
        dict(feature_map='softmaxfeat', lam=0.3, s=0.0, beta=50.0, clip_norm=None,
             radius=10.0),
        dict(feature_map='elu', lam=0.3, s='coulomb', beta=math.inf, clip_norm=None,
             radius=1.5),
    ]
    for case in cases:
        kw = dict(case, step_size=0.05)
        energy = dict(feature_map=kw['feature_map'], lam=kw['lam'], s=kw['s'])
        grad = jax.grad(lambda w: hl.hamiltonian(w, x, y, **energy))(omega)
        ref = cj.langevin_step(key, omega, grad, step_size=0.05, beta=kw['beta'],
                               radius=kw['radius'], clip_norm=kw['clip_norm'])
        # The data and the repulsion term each move the particles far more than the
        # 1e-5 tolerance (so dropping either would fail the comparison below).
        data = jax.grad(lambda w: hl.hamiltonian(w, x, y, **dict(energy, lam=0.0)))(omega)
        rep = jax.grad(lambda w: kw['lam'] * cj.riesz_energy(w, kw['s']))(omega)
        for g in (data, rep):
            assert 0.05 * 32 * float(jnp.max(jnp.abs(g))) > 1e-3, case

        pm = jax.pmap(lambda k, w: parallel.sharded_langevin_step(k, w, x, y, axis_name='p',
                                                                   **kw),
                      axis_name='p', in_axes=(None, 0))
        out_pmap = pm(key, omega.reshape(8, 4, 4)).reshape(32, 4)
        err = float(jnp.max(jnp.abs(out_pmap - ref)))
        assert err < 1e-5, ('pmap', case['feature_map'], err)

        for axis_type in (AxisType.Explicit, AxisType.Auto):
            mesh = jax.make_mesh((8,), ('p',), axis_types=(axis_type,))
            out = jax.jit(lambda k, w: parallel.langevin_step_on_mesh(
                k, w, x, y, mesh=mesh, axis_name='p', **kw))(key, omega)
            err = float(jnp.max(jnp.abs(out - ref)))
            assert err < 1e-5, ('shard_map', axis_type, case['feature_map'], err)
        print('ok', case['feature_map'])

    # jax_enable_x64: softmaxfeat's dynamic_update_slice mixed an int32 offset with an int64 0.
    case = cases[2]
    with jax.enable_x64(True):
        kw = dict(case, step_size=0.05)
        energy = dict(feature_map=kw['feature_map'], lam=kw['lam'], s=kw['s'])
        grad = jax.grad(lambda w: hl.hamiltonian(w, x, y, **energy))(omega)
        ref = cj.langevin_step(key, omega, grad, step_size=0.05, beta=kw['beta'],
                               radius=kw['radius'], clip_norm=kw['clip_norm'])
        mesh = jax.make_mesh((8,), ('p',), axis_types=(AxisType.Explicit,))
        # Jitted: the same trace (where the dtypes mixed) in one compile, not op by op.
        out = jax.jit(lambda k, w: parallel.langevin_step_on_mesh(
            k, w, x, y, mesh=mesh, axis_name='p', **kw))(key, omega)
        assert out.dtype == jnp.float32
        err = float(jnp.max(jnp.abs(out - ref)))
        assert err < 1e-5, ('x64', err)
        print('ok x64')


    class PmapVariantsTest(chex.TestCase):
        """chex's pmap variant on the 8 fake CPU devices."""

        @chex.variants(with_pmap=True)
        def test_sharded_step_equals_one_device_step(self):
            kw = dict(cases[3], step_size=0.05)
            energy = dict(feature_map=kw['feature_map'], lam=kw['lam'], s=kw['s'])
            grad = jax.grad(lambda w: hl.hamiltonian(w, x, y, **energy))(omega)
            ref = cj.langevin_step(key, omega, grad, step_size=0.05, beta=kw['beta'],
                                   radius=kw['radius'], clip_norm=kw['clip_norm'])
            step = self.variant(
                lambda k, w: parallel.sharded_langevin_step(k, w, x, y, axis_name='i', **kw),
                broadcast_args_to_devices=False, in_axes=(None, 0), reduce_fn='identity')
            out = step(key, omega.reshape(8, 4, 4))
            chex.assert_shape(out, (8, 4, 4))
            chex.assert_trees_all_close(out.reshape(32, 4), ref, atol=1e-5)

        @chex.variants(with_pmap=True)
        def test_bf16_particles_stay_bf16_and_inside_the_ball(self):
            kw = dict(cases[3], step_size=0.05)
            step = self.variant(
                lambda k, w: parallel.sharded_langevin_step(k, w, x, y, axis_name='i', **kw),
                broadcast_args_to_devices=False, in_axes=(None, 0), reduce_fn='identity')
            out = step(key, (3.0 * omega).astype(jnp.bfloat16).reshape(8, 4, 4))
            chex.assert_type(out, jnp.bfloat16)
            norms = np.linalg.norm(np.asarray(out, np.float64), axis=-1)
            assert norms.max() <= kw['radius'], norms.max()


    result = unittest.main(argv=['pmap_variants'], exit=False, verbosity=2).result
    assert result.wasSuccessful() and not result.skipped, (result.failures, result.skipped)
    print('all ok')
''')


@pytest.mark.slow
def test_sharded_updates_equal_single_device_on_8_fake_devices():
  flags = os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-c', _SCRIPT], env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert 'all ok' in proc.stdout


def test_mesh_size_must_divide_particles():
  mesh = jax.sharding.AbstractMesh((3,), ('p',))
  with pytest.raises(ValueError, match='omega has 5 particles, not divisible by the 3 devices'):
    parallel.langevin_step_on_mesh(
        jax.random.key(0), jnp.ones((5, 2)), jnp.ones((4, 2)), jnp.ones(4), mesh=mesh,
        axis_name='p', feature_map='rff', lam=0.1, step_size=0.1, beta=1.0, radius=1.0)
