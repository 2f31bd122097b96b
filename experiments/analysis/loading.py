r"""What a report reads: the runs' ``results.json`` and test predictions, earlier summaries.

``load_runs`` walks a grid (``experiments.grid``: ``<dataset>/<variant>/seed<s>/``)
into finished runs (their ``results.json``, with ``path`` and ``predictions``) and
unfinished ones (a ``config.json`` only); ``save_predictions`` / ``load_predictions``
are the ``predictions_test.npz`` of a run or of the TF-IDF row
(``reference_predictions_file``). "Never less" (``run_keys``, ``summary_run_keys``,
``check_not_fewer``): a report does not replace summaries by ones of fewer runs. A run
whose ``results.json`` names another config than its folder's ``config.json``
(``check_config``) is refused.
"""

import json
import os
import zipfile

import numpy as np

from experiments.common import cli
from experiments.run import run_identity

SPLIT_NAMES = {
    'sst2': 'GLUE SST-2 dev (872)',
    'rotten_tomatoes': 'test (1,066; HF split)',
    'qqp_subset': 'Quora 20k held-out (9,928): not GLUE QQP dev',
    'qqp': 'GLUE QQP dev (40,430)',
}
METRICS = ('accuracy', 'f1_micro', 'f1_macro', 'f1_weighted', 'roc_auc', 'pr_auc', 'mcc',
           'balanced_accuracy', 'log_loss', 'brier', 'ece')
"""The keys of ``coulomb_jax.metrics.classification_metrics``."""
TIMES = ('train_seconds', 'phase_a_seconds', 'phase_b_seconds')
RESULTS = 'results.json'
PREDICTIONS = 'predictions_test.npz'
"""Per-example test predictions of a run: ``labels`` [n] int 0/1, ``probs`` [n] P(class 1)."""


def load_runs(runs_dir: str, train_subsets: bool = False):
  """``(finished, unfinished)``: results dicts (with ``path``) and unfinished run dirs.

  Runs evaluated on a subset (``data.max_eval_examples``) are refused; so are runs trained
  on a subset (``data.max_train_examples``) unless ``train_subsets`` (a grid that trains
  every variant on the same fixed rows to fit a compute budget, said on the page)."""
  if not os.path.isdir(runs_dir):
    raise FileNotFoundError(f'--runs: {runs_dir!r} is not a folder.')
  finished, unfinished = [], []
  for root, dirs, files in os.walk(runs_dir):
    dirs.sort()
    path = os.path.relpath(root, runs_dir)
    if RESULTS in files or 'config.json' in files:
      dirs[:] = []                             # a run folder: skip its checkpoints
    if RESULTS in files:
      r = read_json(os.path.join(root, RESULTS))
      check_config(root, r)
      data_cfg = r.get('config', {}).get('data', {})
      if data_cfg.get('max_eval_examples') or (data_cfg.get('max_train_examples')
                                                and not train_subsets):
        raise ValueError(f'{os.path.join(root, RESULTS)} was trained or evaluated on a subset '
                         f'(data.max_train_examples / max_eval_examples); the tables are for '
                         f'full splits only: pass a --runs folder without smoke runs (or '
                         f'--train_subsets for a grid trained on the same fixed training '
                         f'rows throughout; evaluation is always on full splits).')
      predictions = os.path.join(root, PREDICTIONS)
      finished.append(dict(r, path=path,
                           predictions=predictions if PREDICTIONS in files else None))
    elif 'config.json' in files:
      with open(os.path.join(root, 'config.json')) as f:
        config = json.load(f)
      unfinished.append({'dataset': config['data']['task'], 'variant': config['variant'],
                         'seed': config['seed'], 'path': path})
  seen = {}
  for r in finished:
    key = (r['dataset'], r['variant'], r['seed'])
    if key in seen:
      raise ValueError(f'two results for dataset={key[0]!r} variant={key[1]!r} seed={key[2]}: '
                       f'{seen[key]} and {r["path"]} (under {runs_dir}); pass a --runs folder '
                       f'holding one grid.')
    seen[key] = r['path']
  return finished, unfinished


def check_config(run_dir: str, results: dict) -> None:
  """One ``cli.ConfigError`` naming ``run_dir`` when its ``results.json``'s ``config_sha256``
  is not the ``run_identity.config_digest`` of its ``config.json`` (the results of another
  config's run). Results written before digests, or a folder without config.json, pass."""
  theirs = results.get(run_identity.DIGEST) if isinstance(results, dict) else None
  path = os.path.join(run_dir, run_identity.CONFIG)
  if theirs is None or not os.path.isfile(path):
    return
  ours = run_identity.config_digest(run_identity.read_json(path))
  if theirs != ours:
    raise cli.ConfigError(
        f'--runs: {run_dir}: results.json was written by a run of another config (config '
        f'sha256 {run_identity.short(theirs)}; its config.json\'s is '
        f'{run_identity.short(ours)}); rerun it or remove the folder from the grid.')


def reference_file(dataset: str, validation_rule: str = 'rows') -> str:
  """``experiments.tfidf_baseline``'s file name for a dataset and validation rule."""
  return f'{dataset}.json' if validation_rule == 'rows' else f'{dataset}_{validation_rule}.json'


def reference_predictions_file(dataset: str, validation_rule: str = 'rows') -> str:
  """The reference's per-example test predictions, next to ``reference_file``."""
  return reference_file(dataset, validation_rule)[:-len('.json')] + '_' + PREDICTIONS


def save_predictions(path: str, labels, probs) -> None:
  """Writes ``labels`` (int 0/1) and ``probs`` (P(class 1)) of the test split to ``path``
  (``.npz``, atomically): what the reliability diagrams read."""
  labels, probs = np.asarray(labels), np.asarray(probs, np.float64)
  if labels.shape != probs.shape or labels.ndim != 1:
    raise ValueError(f'labels and probs must be [n] arrays of one shape, got {labels.shape} '
                     f'and {probs.shape}.')
  with open(path + '.tmp', 'wb') as f:
    np.savez(f, labels=labels.astype(np.int64), probs=probs)
  os.replace(path + '.tmp', path)


def load_predictions(path: str):
  """``(labels, probs)`` of a ``predictions_test.npz``; a damaged file or one without
  those arrays is one ``cli.ConfigError`` naming it."""
  try:
    with np.load(path, allow_pickle=False) as z:
      return np.asarray(z['labels'], np.int64), np.asarray(z['probs'], np.float64)
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    if isinstance(e, FileNotFoundError):
      raise
    raise cli.ConfigError(f'{path}: not a readable predictions .npz with arrays labels and '
                          f'probs ({type(e).__name__}: {e}).') from None


# ----------------------------------------------------------------------------- never less

def run_keys(runs) -> dict:
  """``{dataset: {(variant, seed)}}`` of finished runs (``load_runs`` rows)."""
  keys = {}
  for r in runs:
    keys.setdefault(r['dataset'], set()).add((r['variant'], int(r['seed'])))
  return keys


def summary_run_keys(out_dir: str) -> dict:
  """``{dataset: {(variant, seed)}}`` of the summaries ``write_report`` left in ``out_dir``."""
  keys = {}
  for d in SPLIT_NAMES:
    path = os.path.join(out_dir, f'{d}.json')
    if os.path.exists(path):
      keys[d] = {(r['variant'], int(r['seed'])) for r in read_json(path).get('runs', [])}
  return keys


def check_not_fewer(old: dict, new: dict, replaced: str, allow_fewer: bool = False) -> None:
  """Refuses, before anything is written, to replace results by fewer.

  ``old`` / ``new``: ``{dataset: {(variant, seed)}}`` of what ``replaced`` (the files named
  in the message) holds now and of what would be written. ValueError when ``new`` holds
  no run at all, or lacks a dataset or a (variant, seed) that ``old`` has (a
  ``cli.ConfigError``: one line from the command); ``allow_fewer``
  (``--allow_fewer``) writes anyway."""
  if allow_fewer:
    return
  if not any(new.values()):
    raise cli.ConfigError(f'--runs: no finished run found; refusing to replace {replaced} by an '
                     f'empty summary (pass --allow_fewer to write it anyway).')
  lost = {d: sorted(old[d] - new.get(d, set())) for d in sorted(old)
          if old[d] - new.get(d, set())}
  if lost:
    said = '; '.join(f'{d}: {len(v)} run(s), e.g. {v[0][0]} seed {v[0][1]}'
                     for d, v in lost.items())
    raise cli.ConfigError(f'--runs: the runs found lack what {replaced} holds now ({said}); '
                     f'refusing to replace results by fewer (pass --keep_others to keep the '
                     f'datasets without runs, --allow_fewer to write anyway).')


def read_json(path: str):
  """``json.load`` of ``path``; a corrupt file is one ValueError naming it."""
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise cli.ConfigError(f'{path}: not valid JSON ({e}).') from None
