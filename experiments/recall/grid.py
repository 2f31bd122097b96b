r"""The recall grid: which runs, in which order, and ``results/mqar.json`` from their files.

``plan(name)`` lists ``(run_name, overrides)`` (a grid's own ``overrides`` first, e.g.
more steps) cheapest first: every method at every
(seq_len, num_pairs) for width 64 and seed 0, then width 128, then seed 1, so a grid cut
short by the machine still has whole lines. Several workers may share one grid folder:
each run is claimed with a non-blocking ``fcntl`` lock on ``<run>/lock`` (released by the
OS if a worker dies), finished runs (``result.json``) are skipped, unfinished ones resume.

``collect(root)`` reads every ``<root>/*/result.json``; ``results_file`` shapes them into
the binding schema ``{"vocab", "num_train", "runs": [...]}``.
"""

import fcntl
import glob
import itertools
import json
import os
from typing import Dict, List, Tuple

from experiments.recall import methods

GRIDS = {
    # Issue 25: L = 64/128/256 with 4/8/16 pairs, widths 64 and 128, 2 seeds.
    # (Its 'hedgehog' runs are the method now called softmaxfeat_trained.)
    'main': {'lengths': ((64, 4), (128, 8), (256, 16)), 'widths': (64, 128),
             'methods': ('softmax', 'favor_orthogonal', 'elu', 'softmaxfeat_trained',
                         'particles_softmax'), 'seeds': (0, 1)},
    # The linear maps at L = 64, 128 and 256 for 5x the steps (6000; softmax leaves the 1/P plateau by
    # step 900 of 1200), particles with a 30x larger Langevin step (3e-3; at 1e-4 they
    # barely moved). Write it to its own results file: its runs share main's run keys.
    'long': {'lengths': ((64, 4), (128, 8), (256, 16)), 'widths': (64,),
             'methods': ('particles_softmax', 'softmaxfeat_trained', 'elu', 'favor_orthogonal'),
             'seeds': (0, 1), 'overrides': {'train.steps': 6000, 'particles.step_size': 3e-3},
             'length_major': True},   # both seeds at one length before the next length
    # A test-sized grid (with configs/mqar.py:quick).
    'tiny': {'lengths': ((16, 2),), 'widths': (16,), 'methods': ('softmax', 'elu'),
             'seeds': (0,)},
}


def check_grid(name: str) -> dict:
  if name not in GRIDS:
    raise ValueError(f'--grid must be one of {sorted(GRIDS)}, got {name!r}.')
  return GRIDS[name]


def run_name(method: str, seq_len: int, num_pairs: int, width: int, seed: int) -> str:
  return f'{method}-L{seq_len}-P{num_pairs}-w{width}-seed{seed}'


def plan(name: str) -> List[Tuple[str, Dict[str, object]]]:
  """``[(run_name, {config field: value})]`` in the order the runs are made."""
  grid = check_grid(name)
  runs = []
  for seed, width in itertools.product(grid['seeds'], grid['widths']):
    for (seq_len, num_pairs), method in itertools.product(grid['lengths'], grid['methods']):
      overrides = dict(grid.get('overrides', {}), method=method, seed=seed)
      overrides.update({'model.width': width, 'data.seq_len': seq_len,
                        'data.num_pairs': num_pairs})
      runs.append((run_name(method, seq_len, num_pairs, width, seed), overrides))
  if grid.get('length_major'):
    runs.sort(key=lambda r: r[1]['data.seq_len'])   # stable: seed order kept per length
  return runs


def apply_overrides(config, overrides: Dict[str, object]):
  """A copy of ``config`` with dotted fields set."""
  config = config.copy_and_resolve_references()
  for field, value in overrides.items():
    *parents, leaf = field.split('.')
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def claim(run_dir: str):
  """An open, locked ``<run_dir>/lock`` file, or None if another worker holds it."""
  os.makedirs(run_dir, exist_ok=True)
  handle = open(os.path.join(run_dir, 'lock'), 'w')
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    handle.close()
    return None
  return handle


def collect(root: str) -> List[dict]:
  """Every finished run's ``result.json`` under ``root``, sorted by grid position."""
  rows = []
  for path in sorted(glob.glob(os.path.join(root, '*', 'result.json'))):
    try:
      with open(path) as f:
        rows.append(json.load(f))
    except (OSError, json.JSONDecodeError) as e:
      raise ValueError(f'{path}: not a readable run result ({e}).') from None
  return sort_rows(rows)


def sort_rows(rows: List[dict]) -> List[dict]:
  """Rows in grid order: seed, width, length, then the order of ``methods.METHODS``."""
  order = {m: i for i, m in enumerate(methods.METHODS)}
  return sorted(rows, key=lambda r: (r['seed'], r['width'], r['seq_len'],
                                     order.get(r['method'], 99)))


BINDING = ('seq_len', 'num_pairs', 'width', 'method', 'num_features', 'seed', 'accuracy',
           'train_seconds')


def results_file(rows: List[dict]) -> dict:
  """The binding ``results/mqar.json`` object; every run must share vocab and num_train."""
  if not rows:
    raise ValueError('no finished run to write.')
  for field in ('vocab', 'num_train'):
    values = sorted({r[field] for r in rows})
    if len(values) > 1:
      raise ValueError(f'runs disagree on {field}: {values}; one results file holds one setting.')
  runs = [dict({k: r[k] for k in BINDING},
               **{k: r[k] for k in ('loss', 'steps', 'diversity', 'command', 'commit',
                                    'machine') if k in r})
          for r in rows]
  return {'vocab': rows[0]['vocab'], 'num_train': rows[0]['num_train'], 'runs': runs}
