r"""Main job: learn Coulomb particles on a synthetic problem and evaluate them.

  python -m experiments.main --config=configs/default.py --workdir=/tmp/cj

Draws a synthetic classification problem, runs projected Langevin dynamics on
the particles (printing H, alignment and repulsion as it goes), then fits the
same ridge classifier on the features of the initial (fixed, random) and the
learned particles and reports held-out accuracy and alignment. Writes
``results.json`` into ``--workdir``.
"""

import json
import os
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags

import coulomb_jax as cj

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for results.json.')


def make_problem(key: jax.Array, num: int, dim: int, noise: float):
  r"""Synthetic data: x ~ N(0, I_p), y = sign(f(x) + σ·ε), ε ~ N(0, 1).

  f(x) = sin(2 x_1) + x_2 x_3 (a sine plus an interaction term; needs p ≥ 3).
  Returns ``x: [num, dim]``, ``y: [num]`` in {−1, +1}.
  """
  if dim < 3:
    raise ValueError(f'config.data.dim must be >= 3, got {dim}.')
  kx, ke = jax.random.split(key)
  x = jax.random.normal(kx, (num, dim))
  f = jnp.sin(2.0 * x[:, 0]) + x[:, 1] * x[:, 2]
  y = jnp.where(f + noise * jax.random.normal(ke, (num,)) >= 0, 1.0, -1.0)
  return x, y


def evaluate(phi_train, y_train, phi_test, y_test, ridge):
  """Ridge classifier w = (ΦᵀΦ + αI)⁻¹Φᵀy on the features: test accuracy and alignment."""
  gram = phi_train.T @ phi_train + ridge * jnp.eye(phi_train.shape[1])
  w = jnp.linalg.solve(gram, phi_train.T @ y_train)
  accuracy = jnp.mean(jnp.sign(phi_test @ w) == y_test)
  return {'test_accuracy': float(accuracy),
          'test_alignment': float(cj.target_alignment(phi_test, y_test))}


def run(config, workdir):
  """Runs the job for ``config``; returns the results dict (also written to workdir)."""
  key = jax.random.key(config.seed)
  train_key, test_key, init_key, run_key = jax.random.split(key, 4)
  x, y = make_problem(train_key, config.data.num_train, config.data.dim, config.data.noise)
  x_test, y_test = make_problem(test_key, config.data.num_test, config.data.dim,
                                config.data.noise)
  omega0 = config.features.init_scale * cj.sample_gaussian(
      init_key, config.features.num_particles, config.data.dim)
  energy = dict(feature_map=config.features.name, lam=config.hamiltonian.lam,
                s=config.hamiltonian.s, softening=config.hamiltonian.softening)
  lcfg = config.langevin
  dynamics = dict(step_size=lcfg.step_size, beta=lcfg.beta, radius=lcfg.radius,
                  clip_norm=lcfg.clip_norm, batch_size=lcfg.batch_size, tol=lcfg.tol)

  h0, terms0 = cj.hamiltonian_terms(omega0, x, y, **energy)
  print(f'start      H {float(h0):+.5f}  alignment {float(terms0["alignment"]):+.5f}  '
        f'repulsion {float(terms0["repulsion"]):.5f}', flush=True)
  omega, log, start, epoch = omega0, [], time.perf_counter(), 0
  while epoch < lcfg.num_epochs:
    chunk = min(lcfg.log_every, lcfg.num_epochs - epoch)
    omega, hist = cj.run_langevin(jax.random.fold_in(run_key, epoch), omega, x, y,
                                  num_epochs=chunk, **energy, **dynamics)
    epoch += chunk
    active = hist.active
    mean = lambda v: float(jnp.sum(jnp.where(active, v, 0)) / jnp.maximum(active.sum(), 1))
    row = {'epoch': epoch, 'hamiltonian': mean(hist.hamiltonian),
           'alignment': mean(hist.alignment), 'repulsion': mean(hist.repulsion),
           'max_move': float(jnp.max(hist.max_move)), 'steps': int(active.sum())}
    log.append(row)
    print(f'epoch {epoch:4d}  H {row["hamiltonian"]:+.5f}  alignment {row["alignment"]:+.5f}  '
          f'repulsion {row["repulsion"]:.5f}  max move {row["max_move"]:.2e}  '
          f'({time.perf_counter() - start:.1f}s)', flush=True)
    if row['steps'] < chunk * (config.data.num_train // lcfg.batch_size):
      print('early stop: max particle move below tol', flush=True)
      break

  fm = cj.get_feature_map(config.features.name)
  results = {'config': config.to_dict(), 'history': log}
  for name, particles in (('fixed', omega0), ('learned', omega)):
    results[name] = evaluate(fm(x, particles), y, fm(x_test, particles), y_test,
                             config.eval.ridge)
    print(f'{name:8s} particles: test accuracy {results[name]["test_accuracy"]:.4f}  '
          f'test alignment {results[name]["test_alignment"]:+.5f}', flush=True)
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, 'results.json')
    with open(path + '.tmp', 'w') as f:
      json.dump(results, f, indent=1)
    os.replace(path + '.tmp', path)
    print(f'wrote {path}')
  return results


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  run(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  app.run(main)
