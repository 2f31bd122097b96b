"""Tests of coulomb_jax.hamiltonian.

The value tests run as ``chex.variants`` with and without jit; with
``COULOMB_JAX_TEST_PMAP=1`` (and several CPU devices) they run under pmap instead:
``test_core_variants_under_pmap_on_four_cpu_devices`` does that for the variant
tests of alignment, repulsion, hamiltonian, diagnostics and importance_sampling,
in a subprocess with 4 fake CPU devices.
"""

import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import alignment
from coulomb_jax import features
from coulomb_jax import hamiltonian as hl
from coulomb_jax import repulsion

_PMAP = os.environ.get('COULOMB_JAX_TEST_PMAP') == '1'
variants = chex.variants(with_jit=not _PMAP, without_jit=not _PMAP, with_pmap=_PMAP)
_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '..')


def _problem(num_particles=10, n=30, d=3):
  ko, kx = jax.random.split(jax.random.key(0))
  omega = features.sample_gaussian(ko, num_particles, d)
  x = jax.random.normal(kx, (n, d))
  y = jnp.sign(jnp.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2])
  return omega, x, y


class HamiltonianVariantsTest(chex.TestCase):

  @variants
  def test_hamiltonian_is_minus_alignment_plus_lam_repulsion(self):
    if self.variant.type == chex.ChexVariantType.WITH_PMAP:   # a real pmap, over all devices
      assert jax.device_count() == 4, jax.devices()
    omega, x, y = _problem()
    h, terms = self.variant(lambda w, a, b: hl.hamiltonian_terms(
        w, a, b, feature_map='rff', lam=0.7, s=1.0))(omega, x, y)
    chex.assert_shape([h, terms['alignment'], terms['repulsion']], ())
    chex.assert_type([h, terms['alignment'], terms['repulsion']], jnp.float32)
    a = alignment.target_alignment(features.rff(x, omega), y)
    w = repulsion.riesz_energy(omega, 1.0)
    chex.assert_trees_all_close({'alignment': terms['alignment'], 'repulsion': terms['repulsion']},
                                {'alignment': a, 'repulsion': w}, rtol=1e-6)
    chex.assert_trees_all_close(h, -a + 0.7 * w, rtol=1e-6)
    by_fn = self.variant(lambda w, a, b: hl.hamiltonian(w, a, b, feature_map=features.rff,
                                                        lam=0.7, s=1.0))(omega, x, y)
    chex.assert_trees_all_close(by_fn, h, rtol=1e-6)

  @variants
  def test_particle_potentials_average_to_the_energy_terms(self):
    """mean_k U_k = −A + 2λW (the factor 2 counts both orders of a pair)."""
    omega, x, y = _problem()
    kwargs = dict(feature_map='rff', lam=0.4, s='coulomb')
    u = self.variant(lambda w, a, b: hl.particle_potentials(w, a, b, **kwargs))(omega, x, y)
    chex.assert_shape(u, (10,))
    chex.assert_type(u, jnp.float32)
    _, terms = hl.hamiltonian_terms(omega, x, y, **kwargs)
    chex.assert_trees_all_close(jnp.mean(u), -terms['alignment'] + 0.8 * terms['repulsion'],
                                rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_core_variants_under_pmap_on_four_cpu_devices():
  """The chex variant tests of the core modules, as the pmap variant on 4 fake CPU devices."""
  files = [os.path.join(_ROOT, 'tests', 'library', f'test_{m}.py')
           for m in ('alignment', 'repulsion', 'hamiltonian', 'diagnostics',
                     'importance_sampling')]
  env = dict(os.environ, COULOMB_JAX_TEST_PMAP='1', JAX_PLATFORMS='cpu',
             XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                       '--xla_force_host_platform_device_count=4')
  proc = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                         '-p', 'no:xdist', '-k', 'VariantsTest', *files], cwd=_ROOT, env=env,
                        capture_output=True, text=True, timeout=600, check=False)
  tail = proc.stdout[-3000:]
  assert proc.returncode == 0, tail
  summary = tail.strip().splitlines()[-1]
  assert 'passed' in summary and 'skipped' not in summary and 'failed' not in summary, summary


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(features.FEATURE_MAPS))
@pytest.mark.parametrize('lam', [0.0, 0.3])
def test_gradient_matches_finite_differences(name, lam):
  """Central differences of H along ∇H and two random directions, in float32.

  λ = 0 isolates the data term (it is small next to the repulsion otherwise).
  The tolerance is relative to |∇H|: float32 rounding of H ~ 1e-7·|H|/h with
  h = 1e-2·|ω|, plus the O(h²) truncation.
  """
  omega, x, y = _problem(num_particles=5, n=12, d=3)
  omega = 0.5 * omega
  energy = jax.jit(lambda w: hl.hamiltonian(w, x, y, feature_map=name, lam=lam, s=1.0))
  grad = np.asarray(jax.grad(energy)(omega), np.float64)
  gnorm = np.linalg.norm(grad)
  assert gnorm > 0
  rand = np.asarray(jax.random.normal(jax.random.key(1), (2,) + omega.shape), np.float64)
  for direction in (grad, rand[0], rand[1]):
    direction = direction / np.linalg.norm(direction)
    h = 1e-2
    fd = (float(energy(omega + h * direction)) - float(energy(omega - h * direction))) / (2 * h)
    np.testing.assert_allclose(np.sum(grad * direction), fd, atol=2e-2 * gnorm)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['rff', 'favor', 'elu', 'cos2'])
def test_particle_potentials_drive_the_step(name):
  """With the others fixed, ∇_{ω_k} U_k = N ∇_{ω_k} H; and mean U = −A + 2λW."""
  omega, x, y = _problem()
  kwargs = dict(feature_map=name, lam=0.4, s='coulomb')
  u = hl.particle_potentials(omega, x, y, **kwargs)
  assert u.shape == (10,)
  _, terms = hl.hamiltonian_terms(omega, x, y, **kwargs)
  np.testing.assert_allclose(jnp.mean(u), -terms['alignment'] + 0.8 * terms['repulsion'],
                             rtol=1e-5, atol=1e-6)
  full = 10 * jax.grad(lambda w: hl.hamiltonian(w, x, y, **kwargs))(omega)
  for k in (0, 7):
    own = jax.grad(lambda w: hl.particle_potentials(omega.at[k].set(w), x, y, **kwargs)[k])
    np.testing.assert_allclose(own(omega[k]), full[k], rtol=1e-4, atol=1e-6)


def test_jit_and_vmap():
  omega, x, y = _problem()
  energy = lambda w, lam: hl.hamiltonian(w, x, y, feature_map='favor', lam=lam)
  lams = jnp.array([0.0, 0.5, 1.0])
  np.testing.assert_allclose(jax.vmap(energy, (None, 0))(omega, lams),
                             [energy(omega, float(l)) for l in lams], rtol=1e-6)
  stack = jnp.stack([omega, 2 * omega])
  np.testing.assert_allclose(jax.jit(jax.vmap(energy, (0, None)))(stack, 0.5),
                             [energy(omega, 0.5), energy(2 * omega, 0.5)], rtol=1e-5)


def test_bad_input():
  omega, x, y = _problem()
  kw = dict(feature_map='rff', lam=0.5)
  with pytest.raises(ValueError, match='y has 29 labels but x has 30 samples'):
    hl.hamiltonian(omega, x, y[:-1], **kw)
  with pytest.raises(ValueError, match='last dimensions differ'):
    hl.hamiltonian(omega, x[:, :2], y, **kw)
  with pytest.raises(ValueError, match="unknown name 'gauss'"):
    hl.hamiltonian(omega, x, y, feature_map='gauss', lam=0.5)
  with pytest.raises(ValueError, match=r's must be >= 0, got -2'):
    hl.hamiltonian(omega, x, y, s=-2, **kw)
  with pytest.raises(ValueError, match='at least one particle'):
    hl.hamiltonian(omega[:0], x, y, **kw)
  with pytest.raises(ValueError, match='y has 29 labels'):
    jax.jit(lambda w, a, b: hl.hamiltonian(w, a, b, **kw))(omega, x, y[:-1])
