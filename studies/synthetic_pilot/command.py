r"""Validation pilot that set the Langevin step size and temperature of the study.

  python -m studies.synthetic_pilot --config=configs/synthetic.py --workdir=workdir/pilot

Draws data sets from an independent root key (``config.seed + 1000``: none of
the study's data), picks the fixed-RFF bandwidth of the config's grid on
validation, and reports the validation-accuracy gain of the learned
particles over their fixed initial draw for a grid of (λ, η, β), averaged over
seeds, and for each (η, β) the gain averaged over λ as well (the study sweeps λ,
so its η and β should work for all of them). Only validation data is used.
Writes ``pilot.json``.
"""

import itertools
import json
import math
import os

from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

import coulomb_jax as cj
from coulomb_jax.tasks import synthetic
from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance
from experiments.study import methods
from experiments.study import tables

GRID = {'lam': [0.0, 0.01, 0.05], 'step_size': [0.03, 0.3, 3.0], 'beta': [1e4, 1e6]}
NUM_SEEDS, BUDGET = 2, 64


def run_pilot(config):
  noise = config.data.noise_levels[config.report.noise_index]
  gains = {}
  for seed in range(NUM_SEEDS):
    key = jax.random.fold_in(jax.random.key(config.seed + 1000), seed)
    data = methods.np_splits(synthetic.make_splits(
        key, num_train=config.data.num_train, num_val=config.data.num_val, num_test=1,
        dim=config.data.dim, noise=noise))
    x, y = (jnp.asarray(a) for a in data['train'])
    z = cj.sample_gaussian(jax.random.fold_in(key, 7), BUDGET, config.data.dim)
    val = lambda om: methods.linear_classifier(
        config, methods.np_splits(data, lambda a: cj.features.rff(a, om)))['val_accuracy']
    bw = max(config.features.bandwidths, key=lambda b: val(z / b))
    base = val(z / bw)
    for lam, eta, beta in itertools.product(*GRID.values()):
      omega, _ = cj.run_langevin(
          jax.random.fold_in(key, 8), z / bw, x, y, feature_map='rff', lam=lam,
          s=config.hamiltonian.s, softening=config.hamiltonian.softening, step_size=eta,
          beta=beta, radius=config.langevin.radius_scale * math.sqrt(config.data.dim) / bw,
          batch_size=config.langevin.batch_size, num_epochs=config.langevin.num_epochs)
      gains.setdefault((lam, eta, beta), []).append(val(omega) - base)
      print(f'seed {seed} bandwidth {bw:g} λ {lam:g} η {eta:g} β {beta:g}: '
            f'validation gain {gains[(lam, eta, beta)][-1]:+.3f}', flush=True)
  return [{'lam': k[0], 'step_size': k[1], 'beta': k[2], 'mean_val_gain': float(np.mean(v))}
          for k, v in gains.items()]


def main(argv):
  del argv
  if flags.FLAGS.workdir:                     # before any compute (issue 39 item 1)
    outputs.check_folder('--workdir', flags.FLAGS.workdir)
    outputs.check_files_in('--workdir', flags.FLAGS.workdir, ['pilot.json'])
  meta = tables.run_metadata('studies.synthetic_pilot')
  print(f"{meta['command']} at commit {meta['commit']} on {json.dumps(meta['machine'])}")
  rows = run_pilot(flags.FLAGS.config)
  for r in sorted(rows, key=lambda r: -r['mean_val_gain']):
    print(f"λ {r['lam']:<5g} η {r['step_size']:<5g} β {r['beta']:<8g} "
          f"mean validation gain {r['mean_val_gain']:+.4f}")
  by_dynamics = {}
  for r in rows:
    by_dynamics.setdefault((r['step_size'], r['beta']), []).append(r['mean_val_gain'])
  print('averaged over λ:')
  for (eta, beta), gains in sorted(by_dynamics.items(), key=lambda kv: -np.mean(kv[1])):
    print(f'η {eta:<5g} β {beta:<8g} mean validation gain {np.mean(gains):+.4f}')
  if flags.FLAGS.workdir:
    os.makedirs(flags.FLAGS.workdir, exist_ok=True)
    provenance.write_json_atomic(os.path.join(flags.FLAGS.workdir, 'pilot.json'),
                                 {**meta, 'rows': rows}, indent=1)


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.synthetic_pilot``."""
  # Flags are defined here, not at import, so tests can import every experiment module.
  config_flags.DEFINE_config_file('config', None, 'Study config.', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Directory for pilot.json.')
  flags.mark_flags_as_required(['config'])
  cli.run(main)
