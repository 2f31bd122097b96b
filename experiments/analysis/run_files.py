r"""One small JSON per finished run, committed beside the summaries: what anyone can recompute.

  <runs_out>/<dataset>/<variant>/seed<k>.json

``runs_out`` defaults to ``results/runs/<grid>``, ``<grid>`` the basename of the
``--runs`` folder (``default_runs_out``). A file (``run_record``) holds

* ``dataset``, ``variant``, ``seed``, ``path`` (the run folder under the grid root);
* ``config_sha256`` (``experiments.run.run_identity.config_digest`` of the run's
  resolved config) and ``config_sha256_from``: ``'results.json'`` (written by the
  run), ``'config.json'`` (computed here from the folder's config, for runs made
  before digests) or ``'results.json config'`` (neither: from the config that
  ``results.json`` holds);
* ``commit`` (the run's; ``sessions``: the commit of every training session, when
  recorded), ``best_epoch``, ``test`` and ``validation`` (every metric of
  ``coulomb_jax.metrics.classification_metrics``), ``train_seconds``,
  ``phase_a_seconds``, ``phase_b_seconds``;
* ``phase_a``: None without Phase A; else its aggregates and ``stages``, one per
  Phase A stage: held-out statistics (``heldout``, ``heldout_per_head``),
  drift/noise and repulsion/alignment medians, Gibbs tilt, displacements,
  ``diversity`` where the run recorded it; no histograms.

``write_run_files`` (``run_records``, then ``write_records``) writes one per run read
and removes none: the files of runs that
are not in the folder read stay (a grid reported a dataset at a time keeps them all).
``read_run_files`` reads them back (``{(dataset, variant, seed): record}``).
"""

import json
import os
from typing import Dict, List, Optional, Tuple

from experiments.analysis import loading
from experiments.common import provenance
from experiments.run import run_identity

DEFAULT_ROOT = os.path.join('results', 'runs')
# Stage fields left out of a per-run file: the log-histograms (what medians summarise).
_DROPPED = ('histograms',)


def default_runs_out(runs_dir: str, root: str = DEFAULT_ROOT) -> str:
  """``<root>/<basename of runs_dir>``: ``results/runs/learn`` for ``--runs=workdir/learn``."""
  name = os.path.basename(os.path.normpath(os.path.abspath(runs_dir)))
  if not name:
    raise ValueError(f'--runs: {runs_dir!r} has no folder name to name its per-run files by; '
                     'pass --runs_out.')
  return os.path.join(root, name)


def config_sha256(run_dir: str, results: dict) -> Tuple[str, str]:
  """``(digest, where from)`` of a run: results.json's ``config_sha256``, else the
  ``config_digest`` of the folder's ``config.json``, else of results.json's config."""
  if results.get(run_identity.DIGEST):
    return results[run_identity.DIGEST], 'results.json'
  path = os.path.join(run_dir, run_identity.CONFIG)
  if os.path.isfile(path):
    return run_identity.config_digest(run_identity.read_json(path)), 'config.json'
  return run_identity.config_digest(results.get('config', {})), 'results.json config'


def _stage(stage: dict) -> dict:
  return {k: v for k, v in stage.items() if k not in _DROPPED}


def phase_a_record(run_dir: str, results: dict) -> Optional[dict]:
  """``results['phase_a']`` without histograms; its stages from ``phase_a_stages.json``
  when results.json has none (None when the run has no Phase A)."""
  phase_a = results.get('phase_a')
  path = os.path.join(run_dir, run_identity.STAGES)
  if phase_a is None and not os.path.isfile(path):
    return None
  out = {k: v for k, v in (phase_a or {}).items() if k != 'stages'}
  if phase_a and phase_a.get('stages') is not None:
    stages = phase_a['stages']
  else:
    stored = run_identity.read_json(path)
    stages = [s for _, s in sorted(stored.items(), key=lambda kv: int(kv[0]))]
  out['stages'] = [_stage(s) for s in stages]
  return out


def run_record(runs_dir: str, run: dict) -> dict:
  """The per-run file of one ``loading.load_runs`` row (module docstring)."""
  run_dir = os.path.join(runs_dir, run['path'])
  digest, source = config_sha256(run_dir, run)
  sessions = [s.get('commit') for s in run.get('sessions', []) if isinstance(s, dict)]
  record = {'dataset': run['dataset'], 'variant': run['variant'], 'seed': int(run['seed']),
            'path': run['path'], 'config_sha256': digest, 'config_sha256_from': source,
            'commit': run.get('commit') or (sessions[-1] if sessions else None)}
  if sessions:
    record['sessions'] = sessions
  record.update({'best_epoch': run.get('best_epoch'), 'test': run['test'],
                 'validation': run.get('validation'),
                 **{k: run.get(k) for k in loading.TIMES},
                 'phase_a': phase_a_record(run_dir, run)})
  return record


def run_file(runs_out: str, dataset: str, variant: str, seed: int) -> str:
  """``<runs_out>/<dataset>/<variant>/seed<seed>.json``."""
  return os.path.join(runs_out, dataset, variant, f'seed{int(seed)}.json')


def run_records(runs_dir: str, runs: List[dict]) -> List[dict]:
  """``run_record`` of every run: made (and a damaged run folder refused) before anything
  is written."""
  return [run_record(runs_dir, r) for r in runs]


def write_records(records: List[dict], runs_out: str) -> List[str]:
  """Writes each record to its ``run_file`` (atomically); removes nothing. Returns the paths."""
  paths = []
  for r in records:
    path = run_file(runs_out, r['dataset'], r['variant'], r['seed'])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    provenance.write_json_atomic(path, r, indent=1)
    paths.append(path)
  return paths


def write_run_files(runs_dir: str, runs: List[dict], runs_out: str) -> List[str]:
  """Writes the per-run file of every run (``loading.load_runs`` rows under ``runs_dir``);
  removes nothing: ``write_records(run_records(runs_dir, runs), runs_out)``."""
  return write_records(run_records(runs_dir, runs), runs_out)


def read_run_files(runs_out: str) -> Dict[Tuple[str, str, int], dict]:
  """``{(dataset, variant, seed): record}`` of every per-run file under ``runs_out``."""
  out = {}
  for root, dirs, files in os.walk(runs_out):
    dirs.sort()
    for name in sorted(files):
      if name.startswith('seed') and name.endswith('.json'):
        r = loading.read_json(os.path.join(root, name))
        out[(r['dataset'], r['variant'], int(r['seed']))] = r
  return out


def describe(runs_out: str) -> str:
  """The page's line naming the per-run files."""
  return (f'Per-run files: `{provenance.relative_path(runs_out)}/<dataset>/<variant>/'
          'seed<k>.json`, one per run read (config sha256, commit, best epoch, every test '
          'and validation metric, Phase A diagnostics per stage); the paired intervals '
          'above can be recomputed from them alone.')
