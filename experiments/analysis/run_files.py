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

The studies that collect runs into one results JSON write flat files instead,
``<runs_out>/<run id>.json`` (``study_record``, ``write_study_records``,
``read_study_records``; ``--runs_out`` defaults to ``default_study_runs_out``: next to
``--out``), from their run folders or, where those are gone, from the results file's rows
(``summary_records``); the section "studies" below.
"""

import os
import sys
from typing import Dict, List, Optional, Tuple

from experiments.analysis import loading
from experiments.common import cli
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


# ----------------------------------------------------------------------------- studies
#
# A study that collects runs into one results JSON (``studies.phase_a_repulsion``, its
# softmax part, ``studies.mqar_convert``, ``studies.softmax_mimicry``) writes one flat file
# per run, ``<runs_out>/<run id>.json`` (``study_record``): ``study``, ``run`` (the id),
# ``from`` (what it was made from), ``written_by`` (the command), the study's own row of the
# run (identifying fields, ``commit``, every metric), ``config_sha256`` with
# ``config_sha256_from`` (None where no run folder was read) and ``machine`` with
# ``machine_from``. Where the run folders are gone, ``summary_records`` makes them from the
# rows of the committed results JSON: ``from`` says so, and no digest is made up.

FROM_RESULTS = '{} (run folders gone)'
"""``from`` of a per-run file made from a results file's rows."""
NO_FOLDER = 'none: made from the summary row; the run folder is gone'
"""``config_sha256_from`` (and ``machine_from``) when no run folder was read."""
PROVENANCE = ('study', 'run', 'from', 'written_by', 'config_sha256', 'config_sha256_from',
              'machine', 'machine_from', 'summary_machine', 'controls')
"""Keys ``study_record`` adds to a study's row (``study_row`` drops them again)."""


def default_study_runs_out(study: str, out: str) -> str:
  """``<folder of out>/runs/<study>``: ``results/runs/<study>`` for ``--out=results/<x>.json``
  (the default of every study), ``/tmp/a/runs/<study>`` for ``--out=/tmp/a/x.json``."""
  return os.path.join(os.path.dirname(out) or '.', 'runs', study)


def check_runs_out(path: str, flag: str = '--runs_out') -> None:
  """One ``cli.ConfigError`` naming ``flag`` when ``path`` is a file or lies under one (made
  before anything is written)."""
  loading.check_folder(flag, path)


def written_by(module: str) -> str:
  """``python -m <module> <arguments>``, paths relative to the repository root (no commit or
  date: the same command writes the same files)."""
  return ' '.join(['python', '-m', module] + provenance.relative_args(sys.argv[1:]))


def study_record(study: str, run_id: str, row: dict, source: str, command: str,
                 config_sha256: Optional[str] = None, config_sha256_from: Optional[str] = None,
                 machine: Optional[dict] = None, machine_from: Optional[str] = None,
                 summary_machine: Optional[dict] = None,
                 controls: Optional[dict] = None) -> dict:
  """The per-run file of one run of a study: the provenance keys (``PROVENANCE``), then
  ``row`` (the study's row, as its results JSON holds it). ``controls``: the runs the row
  pairs with, ``{name: {path, commit, config_sha256, ...}}`` (None: not recorded)."""
  clash = sorted(set(row) & set(PROVENANCE) - {'machine'})
  if clash:
    raise ValueError(f'{run_id}: the row has keys {clash} that a per-run file uses itself.')
  row = dict(row)
  if row.get('machine') is not None and machine is None:     # the row's own (a conversion's)
    machine, machine_from = row['machine'], machine_from or 'the row'
  row.pop('machine', None)
  record = {'study': study, 'run': run_id, 'from': source, 'written_by': command,
            'config_sha256': config_sha256, 'config_sha256_from': config_sha256_from,
            'machine': machine, 'machine_from': machine_from}
  if summary_machine is not None:
    record['summary_machine'] = summary_machine
  if controls is not None:
    record['controls'] = controls
  record.update(row)
  return record


def study_row(record: dict) -> dict:
  """A per-run file without the keys ``study_record`` added: the study's row again (with
  ``machine`` where the row had it: ``machine_from == 'the row'``)."""
  row = {k: v for k, v in record.items() if k not in PROVENANCE}
  if record.get('machine_from') == 'the row':
    row['machine'] = record['machine']
  return row


def folder_provenance(run_dir: str, results: dict) -> dict:
  """``config_sha256``, ``config_sha256_from`` (``config_sha256``), ``machine`` and
  ``machine_from`` of a text run's folder (``experiments.train``'s results.json): the
  ``study_record`` keyword arguments of a run read from its folder."""
  digest, source = config_sha256(run_dir, results)
  machine = results.get('machine')
  return {'config_sha256': digest, 'config_sha256_from': source, 'machine': machine,
          'machine_from': 'results.json' if machine else 'none: its results.json has none'}


def control_entry(path: str, run_dir: str, results: dict) -> dict:
  """``{path, commit, config_sha256}`` of a control run a study's row pairs with."""
  return {'path': path, 'commit': results.get('commit'),
          'config_sha256': config_sha256(run_dir, results)[0]}


def summary_records(study: str, results_path: str, rows: List[dict], run_id, command: str,
                    summary_machine: Optional[dict] = None) -> List[dict]:
  """``study_record`` of every row of a results file whose run folders are gone: ``from``
  ``'<results_path> (run folders gone)'``, no digest (``NO_FOLDER``); ``machine`` only where
  the row holds it, else None beside ``summary_machine`` (the machine of the command that
  wrote the summary, not necessarily the run's). ``run_id(row)`` names each file."""
  source = FROM_RESULTS.format(provenance.relative_path(results_path))
  out = []
  for row in rows:
    has_machine = row.get('machine') is not None
    out.append(study_record(
        study, run_id(row), row, source, command, None, NO_FOLDER,
        machine_from='the row' if has_machine else NO_FOLDER,
        summary_machine=None if has_machine else summary_machine))
  return out


def study_run_file(runs_out: str, run_id: str) -> str:
  """``<runs_out>/<run id>.json``; a ValueError for an id that is not one plain file name."""
  if (not run_id or run_id in ('.', '..') or '/' in run_id or os.sep in run_id
      or run_id.startswith('.')):
    raise ValueError(f'{run_id!r} is not a run id (one file name, no folders).')
  return os.path.join(runs_out, run_id + '.json')


def check_records(records: List[dict], runs_out: str) -> List[str]:
  """The files of ``records`` (``study_run_file``); a ValueError for a bad id or two records
  of one id (their files would collide). Writes nothing."""
  paths, seen = [], set()
  for r in records:
    paths.append(study_run_file(runs_out, r['run']))
    if r['run'] in seen:
      raise ValueError(f'two runs have the id {r["run"]!r}; their files would collide.')
    seen.add(r['run'])
  return paths


def write_study_records(records: List[dict], runs_out: str) -> List[str]:
  """Writes each record to ``study_run_file(runs_out, record['run'])`` (atomically); every
  id is checked, and two records of one id refused, before the first write (``runs_out``
  itself by ``check_runs_out``, before any output of the command). Removes
  nothing. Returns the paths."""
  paths = check_records(records, runs_out)
  if records:
    os.makedirs(runs_out, exist_ok=True)
  for path, r in zip(paths, records):
    provenance.write_json_atomic(path, r, indent=1)
  return paths


def write_study_command_records(records: List[dict], runs_out: str) -> List[str]:
  """``write_study_records`` for a study command: a refused id is one ``cli.ConfigError``
  naming ``--runs_out``; prints how many files it wrote. Returns the paths."""
  try:
    paths = write_study_records(records, runs_out)
  except ValueError as e:
    raise cli.ConfigError(f'--runs_out: {e}') from None
  print(f'{runs_out}: {len(paths)} per-run files', flush=True)
  return paths


def read_study_records(runs_out: str) -> Dict[str, dict]:
  """``{run id: record}`` of every ``<runs_out>/*.json`` written by ``write_study_records``."""
  out = {}
  for name in sorted(os.listdir(runs_out)):
    if name.endswith('.json'):
      r = loading.read_json(os.path.join(runs_out, name))
      out[r['run']] = r
  return out

