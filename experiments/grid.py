r"""Runs a grid of ``experiments.train`` runs (variants × seeds), one process each.

  python -m experiments.grid --dataset=rotten_tomatoes --seeds=0,1,2 --workdir=workdir/grid \
      -- --config.phase_b.num_epochs=5

Each run goes to ``<workdir>/<dataset>/<variant>/seed<s>`` with its own log.
Finished runs (``results.json`` present) are skipped and interrupted ones
resume from their checkpoint, so the same command continues a grid in a later
session. Arguments after ``--`` are passed to every run (config overrides).
``experiments/report.py`` turns the results into tables.
"""

import os
import subprocess
import sys
import time

from absl import app
from absl import flags
from absl import logging

from configs import text

DATASETS = {'sst2': 'configs/sst2.py', 'rotten_tomatoes': 'configs/rotten_tomatoes.py',
            'qqp_subset': 'configs/qqp.py'}


def run_dir(workdir, dataset, variant, seed):
  return os.path.join(workdir, dataset, variant, f'seed{seed}')


def main(argv):
  overrides = argv[1:]
  dataset = flags.FLAGS.dataset
  if dataset not in DATASETS:
    raise ValueError(f'--dataset: expected one of {sorted(DATASETS)}, got {dataset!r}.')
  variants = text.VARIANTS if flags.FLAGS.variants == ['all'] else flags.FLAGS.variants
  for v in variants:
    text.parse_variant(v)                     # fails on a bad name before anything runs
  seeds = [int(s) for s in flags.FLAGS.seeds]
  for seed in seeds:
    for variant in variants:
      out = run_dir(flags.FLAGS.workdir, dataset, variant, seed)
      if os.path.exists(os.path.join(out, 'results.json')):
        logging.info('done already: %s', out)
        continue
      os.makedirs(out, exist_ok=True)
      cmd = [sys.executable, '-m', 'experiments.train',
             f'--config={DATASETS[dataset]}:{variant}', f'--workdir={out}',
             f'--config.seed={seed}'] + overrides
      logging.info('running: %s', ' '.join(cmd))
      tick = time.time()
      with open(os.path.join(out, 'log.txt'), 'a') as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
      logging.info('%s: exit %d after %.0f s', out, rc, time.time() - tick)
      if rc:
        raise SystemExit(f'{out} failed (exit {rc}); see {out}/log.txt')


if __name__ == '__main__':
  flags.DEFINE_string('dataset', None, f'One of {sorted(DATASETS)}.')
  flags.DEFINE_list('variants', ['all'], f"Variants, or 'all' ({len(text.VARIANTS)}).")
  flags.DEFINE_list('seeds', ['0'], 'Seeds.')
  flags.DEFINE_string('workdir', 'workdir/grid', 'Root folder of the runs.')
  flags.mark_flags_as_required(['dataset'])
  app.run(main)
