r"""Runs a grid of ``experiments.train`` runs (datasets × variants × seeds), one process each.

  python -m experiments.grid --dataset=rotten_tomatoes --seeds=0,1,2 --workdir=workdir/grid \
      -- --config.phase_b.num_epochs=5

or ``python path/to/experiments/grid.py ...`` from any folder (each run is
``experiments/train.py`` launched by path). A bad ``--dataset``, ``--variants`` or
``--seeds`` ends in one line before any run starts (``experiments.common.cli``).

Each run goes to ``<workdir>/<dataset>/<variant>/seed<s>`` with its own log.
Finished runs (``results.json`` present) are skipped and interrupted ones
resume from their checkpoint, so the same command continues a grid in a later
session. A finished folder must hold the run asked for: its ``results.json``'s
config digest (or, before digests, its ``config.json``) is compared with the
config the grid would run, and a folder of another variant's or config's run is
refused in one line naming what differs (``check_finished``). Arguments after
``--`` are passed to every run (config overrides); one written
``<dataset>:--config.x=y`` only to that dataset's runs, e.g.
``sst2:--config.data.validation_rule=sentences``.
``experiments/report.py`` turns the results into tables.

Runs start in order seed, dataset, variant (all of seed 0 first), ``--jobs`` at
a time (several runs share one GPU well: the paper-sized model is far too small
to fill one; with ``--jobs`` > 1 they do not preallocate its memory).
``--no_new_runs_after_s`` stops starting runs after that many seconds and
``--kill_after_s`` ends the runs still going (they keep their last checkpoint),
so a grid fits a fixed lease; see ``experiments/gpu_grid.sh``.
After a failed run no new run starts; the command exits non-zero once the
others have ended.
"""

import os
import subprocess
import sys
import time

from absl import flags
from absl import logging

from configs import text
from experiments.common import cli
from experiments.common import outputs
from experiments.run.train_config import DATASETS, run_dir

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each run is `python -m experiments.train` with the repository root importable: it works
# from any current folder.
TRAIN = ['-m', 'experiments.train']


def plan(datasets, variants, seeds, workdir, expected=None):
  """``[(dataset, variant, seed, run_dir)]`` of the runs without ``results.json``, in order.

  Repeated names are dropped (two processes must never share a run folder).
  ``expected(dataset, variant, seed, run_dir)``: the config that run would have; a
  finished folder must hold that config's run (``check_finished``), else one
  ``cli.ConfigError``. Without it, any ``results.json`` counts as done.
  """
  runs = []
  unique = lambda names: list(dict.fromkeys(names))
  for seed in unique(seeds):
    for dataset in unique(datasets):
      for variant in unique(variants):
        out = run_dir(workdir, dataset, variant, seed)
        if os.path.exists(os.path.join(out, 'results.json')):
          if expected is not None:
            check_finished(out, expected(dataset, variant, seed, out))
          logging.info('done already: %s', out)
        else:
          runs.append((dataset, variant, seed, out))
  return runs


def check_finished(out, config) -> None:
  """One ``cli.ConfigError`` naming the folder and what differs if ``<out>/results.json``
  is not a finished run of ``config`` (``run_identity.finished_run_difference``: its
  config digest, else its config.json)."""
  from experiments.run import run_identity  # pylint: disable=g-import-not-at-top
  what = run_identity.finished_run_difference(out, config)
  if what is not None:
    raise cli.ConfigError(f'{out}: holds a finished run of another config ({what}), not '
                          'the run this grid asks for; move it away or use another --workdir.')


def overrides_for(overrides, dataset):
  """The arguments after ``--`` that apply to ``dataset`` (``<dataset>:`` prefix removed)."""
  out = []
  for arg in overrides:
    scope, sep, rest = arg.partition(':')
    if sep and scope in DATASETS and rest.startswith('--'):
      if scope == dataset:
        out.append(rest)
    else:
      out.append(arg)
  return out


def prefix_override(prefix_root, dataset, variant, seed, out):
  """``--config.run.prefix_from=<prefix_root>/<dataset>/vanilla-<map>/seed<s>`` for a
  kernel-, ball- or vanilla- run when ``prefix_root`` is set (not for that run itself).

  With the ``after_b`` / ``alternating`` schedules, Kernel-X, Ball-X and Vanilla-X of
  one map and seed train the same Phase B epochs before Phase A, bit for bit: one
  Vanilla-X run's saved prefix spares the others those epochs, and all three then
  continue from the very same state.
  """
  kind, _, fmap = variant.partition('-')
  if not prefix_root or kind not in ('kernel', 'ball', 'vanilla'):
    return []
  source = run_dir(prefix_root, dataset, f'vanilla-{fmap}', seed)
  if os.path.abspath(source) == os.path.abspath(out):
    return []
  return [f'--config.run.prefix_from={source}']


def run_all(runs, jobs=1, no_new_runs_after_s=0, kill_after_s=0, poll_s=0.2):
  """Runs ``[(run_dir, command)]`` in order, ``jobs`` at a time; returns the failed dirs.

  Each command's output goes to ``<run_dir>/log.txt``. Limits in seconds from
  the call, 0 for none: no start after ``no_new_runs_after_s``; the runs still
  going at ``kill_after_s`` are terminated (not counted as failed; a run that
  exits non-zero without being terminated is, whenever it ends). After a failure
  no run starts. With ``jobs`` > 1 the runs get ``XLA_PYTHON_CLIENT_PREALLOCATE=false``
  (unless set), so that no process takes most of a shared GPU's memory up front.
  """
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO_ROOT, env.get('PYTHONPATH')) if p)
  if jobs > 1:
    env.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  todo, running, failed, ended = list(runs), {}, [], set()
  begin = time.time()
  while todo or running:
    elapsed = time.time() - begin
    may_start = not failed and not (no_new_runs_after_s and elapsed > no_new_runs_after_s)
    while todo and may_start and len(running) < jobs:
      out, cmd = todo.pop(0)
      os.makedirs(out, exist_ok=True)
      logging.info('running: %s', ' '.join(cmd))
      log = open(os.path.join(out, 'log.txt'), 'a')  # pylint: disable=consider-using-with
      proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
      running[proc] = (out, time.time(), log)
    if todo and not may_start:
      logging.warning('%d run(s) not started: %s', len(todo), [out for out, _ in todo])
      todo = []
    killing = bool(kill_after_s) and elapsed > kill_after_s
    for proc, (out, _, _) in running.items():
      if killing and proc.poll() is None and proc not in ended:
        logging.warning('%s: still running at %d s; ended (it resumes from its checkpoint).',
                        out, kill_after_s)
        proc.terminate()
        ended.add(proc)
    for proc in [p for p in running if p.poll() is not None]:
      out, tick, log = running.pop(proc)
      log.close()
      logging.info('%s: exit %d after %.0f s', out, proc.returncode, time.time() - tick)
      if proc.returncode and proc not in ended:
        failed.append(out)
    if running:
      time.sleep(poll_s)
  return failed


def check_flags(fv) -> tuple:
  """``(variants, seeds)`` of the flags; ``cli.ConfigError`` naming a bad value."""
  if not fv.dataset:
    raise cli.ConfigError(f'--dataset: expected names in {sorted(DATASETS)}, got none.')
  for dataset in fv.dataset:
    if dataset not in DATASETS:
      raise cli.ConfigError(f'--dataset: expected names in {sorted(DATASETS)}, got '
                            f'{dataset!r}.')
  variants = text.VARIANTS if fv.variants == ['all'] else fv.variants
  for v in variants:
    try:
      text.parse_variant(v)                   # fails on a bad name before anything runs
    except ValueError:
      raise cli.ConfigError(f'--variants: {v!r} is not a variant; expected names from '
                            f'{text.VARIANTS} (with modifiers {text.MODIFIERS}) or '
                            "'all'.") from None
  seeds = []
  for s in fv.seeds:
    try:
      seeds.append(int(s))
    except ValueError:
      raise cli.ConfigError(f'--seeds: expected integers ≥ 0, got {s!r} in '
                            f'{",".join(fv.seeds)!r}.') from None
    if seeds[-1] < 0:
      raise cli.ConfigError(f'--seeds: expected integers ≥ 0, got {s!r}.')
  if not seeds:
    raise cli.ConfigError('--seeds: expected integers ≥ 0, got none.')
  for name, low in (('jobs', 1), ('no_new_runs_after_s', 0), ('kill_after_s', 0)):
    if fv[name].value < low:
      raise cli.ConfigError(f'--{name}: expected an integer ≥ {low}, got {fv[name].value}.')
  return variants, seeds


def load_config(dataset, variant, args):
  """The run config of ``dataset`` and ``variant`` with the ``--config.`` arguments
  ``args`` (as ``experiments/train.py`` would load it); one ``cli.ConfigError`` naming the
  dataset, variant and mistake (a misspelled field, a wrong type)."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  argv = ['grid', f'--config={os.path.join(REPO_ROOT, DATASETS[dataset])}:{variant}',
          *[a for a in args if a.startswith('--config.')]]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, 'A run config.', lock_config=True,
                                  flag_values=fv, sys_argv=argv)
  try:
    fv(argv)
    config = fv.config
    config.keys()
  except (flags.Error, KeyError, AttributeError, OSError, TypeError, ValueError) as e:
    raise cli.ConfigError(f'{dataset} {variant}: {cli.one_line(e, argv)}') from None
  return config


def check_overrides(datasets, variants, overrides) -> None:
  """Loads every run's config with its ``--config.`` overrides (``load_config``) and checks
  it (``train_config.check_config``) before any run starts: one ``cli.ConfigError`` naming
  the dataset, variant and mistake (a misspelled field, a wrong type, a bad value)."""
  from experiments.run import train_config  # pylint: disable=g-import-not-at-top
  for dataset in datasets:
    for variant in variants:
      config = load_config(dataset, variant, overrides_for(overrides, dataset))
      try:
        train_config.check_config(config)
      except ValueError as e:
        raise cli.ConfigError(f'{dataset} {variant}: {e}') from None


def run_args(fv, overrides, dataset, variant, seed, out) -> list:
  """The arguments of one run's ``experiments/train.py`` command, after the program."""
  return ([f'--config={os.path.join(REPO_ROOT, DATASETS[dataset])}:{variant}',
           f'--workdir={out}', f'--config.seed={seed}'] + overrides_for(overrides, dataset)
          + prefix_override(fv.prefix_root, dataset, variant, seed, out))


def commands(fv, overrides) -> list:
  """``[(run_dir, command)]`` of the runs still to do (``plan``); every flag and run
  config checked first, and every finished folder against the config it would run."""
  variants, seeds = check_flags(fv)
  outputs.check_folder('--workdir', fv.workdir)  # a file, or under one: before any run
  if fv.prefix_root and os.path.abspath(fv.prefix_root) != os.path.abspath(fv.workdir):
    # Another grid's root must be there: a missing one would leave every run to train its
    # Phase B prefix again without a word (restore_prefix finds nothing to restore).
    outputs.check_folder('--prefix_root', fv.prefix_root, must_exist=True)
  check_overrides(fv.dataset, variants, overrides)
  expected = lambda dataset, variant, seed, out: load_config(
      dataset, variant, run_args(fv, overrides, dataset, variant, seed, out))
  runs = plan(fv.dataset, variants, seeds, fv.workdir, expected)
  for _, _, _, out in runs:                  # each run folder and its log.txt can be made
    outputs.check_folder('--workdir', out)
    outputs.check_files_in('--workdir', out, ['log.txt'])
  return [(out, [sys.executable] + TRAIN + run_args(fv, overrides, dataset, variant, seed, out))
          for dataset, variant, seed, out in runs]


def main(argv, flag_values=None):
  fv = flag_values if flag_values is not None else flags.FLAGS
  failed = run_all(commands(fv, argv[1:]), fv.jobs, fv.no_new_runs_after_s, fv.kill_after_s)
  if failed:
    raise SystemExit(f'{len(failed)} run(s) failed: {failed}; see their log.txt')


def define_flags(flag_values=None) -> None:
  """The flags of ``python -m experiments.grid`` (on ``flag_values``, default absl's)."""
  fv = flag_values if flag_values is not None else flags.FLAGS
  flags.DEFINE_list('dataset', None, f'Datasets, from {sorted(DATASETS)}.', flag_values=fv)
  flags.DEFINE_list('variants', ['all'], f"Variants, or 'all' ({len(text.VARIANTS)}).",
                    flag_values=fv)
  flags.DEFINE_list('seeds', ['0'], 'Seeds (integers ≥ 0).', flag_values=fv)
  flags.DEFINE_string('workdir', 'workdir/grid', 'Root folder of the runs.', flag_values=fv)
  flags.DEFINE_integer('jobs', 1, 'Runs at the same time.', flag_values=fv)
  flags.DEFINE_string('prefix_root', '', "A grid root: kernel-, ball- and vanilla- runs start "
                      "from the Phase B prefix of that root's vanilla-<map> run of their seed "
                      "(after_b / alternating schedules; '' = off).", flag_values=fv)
  flags.DEFINE_integer('no_new_runs_after_s', 0, 'Start no run after this many seconds '
                       '(0: no limit).', flag_values=fv)
  flags.DEFINE_integer('kill_after_s', 0, 'End the runs still going after this many '
                       'seconds; they resume later from their checkpoint (0: no limit).',
                       flag_values=fv)
  flags.mark_flags_as_required(['dataset'], flag_values=fv)


if __name__ == '__main__':
  define_flags()
  cli.run(main, config_flags=())
