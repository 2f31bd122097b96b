r"""What a report reads: the runs' ``results.json`` and test predictions, earlier summaries.

``load_runs`` walks a grid (``experiments.grid``: ``<dataset>/<variant>/seed<s>/``)
into finished runs (their ``results.json``, with ``path`` and ``predictions``) and
unfinished ones (a ``config.json`` only); ``save_predictions`` / ``load_predictions``
are the ``predictions_test.npz`` of a run or of the TF-IDF row
(``reference_predictions_file``). "Never less" (``run_keys``, ``summary_run_keys``,
``check_not_fewer``): a report does not replace summaries by ones of fewer runs. A run
whose ``results.json`` names another config than its folder's ``config.json``
(``check_config``) is refused.

What cannot be right is refused before anything is written, in one ``cli.ConfigError``
naming the file (or the flag) and what is wrong: a run folder whose ``results.json``
lacks a section its readers index (``check_results``: ``dataset``, ``variant``,
``seed``, ``test``; ``heldout`` in every Phase A stage) or whose ``history.jsonl`` is not
JSON lines (``check_history``), a predictions file whose probabilities are not finite
numbers in [0, 1], whose labels are not 0/1 or whose row count is not the test split's
(``load_predictions`` with ``rows``, ``TEST_ROWS``), and a folder flag that names a file
(``check_folder``).
"""

import json
import os
from typing import Callable, Optional
import zipfile

import numpy as np

from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance
from experiments.run import run_identity

SPLIT_NAMES = {
    'sst2': 'GLUE SST-2 dev (872)',
    'rotten_tomatoes': 'test (1,066; HF split)',
    'qqp_subset': 'Quora 20k held-out (9,928): not GLUE QQP dev',
    'qqp': 'GLUE QQP dev (40,430)',
}
TEST_ROWS = {'sst2': 872, 'rotten_tomatoes': 1066, 'qqp_subset': 9928, 'qqp': 40430}
"""Rows of each dataset's test split (the counts in ``SPLIT_NAMES``): one prediction each."""
METRICS = ('accuracy', 'f1_micro', 'f1_macro', 'f1_weighted', 'roc_auc', 'pr_auc', 'mcc',
           'balanced_accuracy', 'log_loss', 'brier', 'ece')
"""The keys of ``coulomb_jax.metrics.classification_metrics``."""
TIMES = ('train_seconds', 'phase_a_seconds', 'phase_b_seconds')
RESULTS = 'results.json'
HISTORY = 'history.jsonl'
PREDICTIONS = 'predictions_test.npz'
"""Per-example test predictions of a run: ``labels`` [n] int 0/1, ``probs`` [n] P(class 1)."""


def load_runs(runs_dir: str, train_subsets: bool = False):
  """``(finished, unfinished)``: results dicts (with ``path``) and unfinished run dirs.

  Runs evaluated on a subset (``data.max_eval_examples``) are refused; so are runs trained
  on a subset (``data.max_train_examples``) unless ``train_subsets`` (a grid that trains
  every variant on the same fixed rows to fit a compute budget, said on the page)."""
  check_folder('--runs', runs_dir, must_exist=True)
  finished, unfinished = [], []
  for root, dirs, files in os.walk(runs_dir):
    dirs.sort()
    path = os.path.relpath(root, runs_dir)
    if RESULTS in files or 'config.json' in files:
      dirs[:] = []                             # a run folder: skip its checkpoints
    if RESULTS in files:
      r = read_json(os.path.join(root, RESULTS))
      check_results(os.path.join(root, RESULTS), r)
      check_config(root, r)
      if r.get('phase_a') is not None and HISTORY in files:
        check_history(os.path.join(root, HISTORY))
      data_cfg = r.get('config', {}).get('data', {})
      if data_cfg.get('max_eval_examples') or (data_cfg.get('max_train_examples')
                                                and not train_subsets):
        raise cli.ConfigError(
            f'{os.path.join(root, RESULTS)} was trained or evaluated on a subset '
            f'(data.max_train_examples / max_eval_examples); the tables are for full splits '
            f'only: pass a --runs folder without smoke runs (or --train_subsets for a grid '
            f'trained on the same fixed training rows throughout; evaluation is always on '
            f'full splits).')
      predictions = os.path.join(root, PREDICTIONS)
      finished.append(dict(r, path=path,
                           predictions=predictions if PREDICTIONS in files else None))
    elif 'config.json' in files:
      config = read_json(os.path.join(root, 'config.json'))
      unfinished.append({'dataset': config['data']['task'], 'variant': config['variant'],
                         'seed': config['seed'], 'path': path})
  seen = {}
  for r in finished:
    key = (r['dataset'], r['variant'], r['seed'])
    if key in seen:
      raise cli.ConfigError(f'two results for dataset={key[0]!r} variant={key[1]!r} '
                            f'seed={key[2]}: {seen[key]} and {r["path"]} (under {runs_dir}); '
                            'pass a --runs folder holding one grid.')
    seen[key] = r['path']
  return finished, unfinished


def check_results(path: str, results) -> None:
  """One ``cli.ConfigError`` naming ``path`` (a ``results.json``) when it is not an object
  with ``dataset``, ``variant``, ``seed`` and a ``test`` object (the test-split metrics),
  or when a stage of its ``phase_a`` section has no ``heldout`` object (``experiments.train``
  writes both; the reports index them)."""
  if not isinstance(results, dict):
    raise cli.ConfigError(f'{path}: not a results object (a JSON {type(results).__name__}).')
  missing = [k for k in ('dataset', 'variant', 'seed', 'test') if k not in results]
  if missing:
    raise cli.ConfigError(f'{path}: no {", ".join(repr(k) for k in missing)} section '
                          f'(a results.json of experiments.train has them); rerun the run or '
                          f'remove its folder from the grid.')
  if not isinstance(results['test'], dict):
    raise cli.ConfigError(f"{path}: 'test' is a {type(results['test']).__name__}, not the "
                          f'object of test-split metrics.')
  phase_a = results.get('phase_a')
  stages = phase_a.get('stages') if isinstance(phase_a, dict) else None
  for i, stage in enumerate(stages or []):
    if not isinstance(stage, dict) or not isinstance(stage.get('heldout'), dict):
      raise cli.ConfigError(f"{path}: Phase A stage {i} (phase_a.stages[{i}]) has no 'heldout' "
                            f'section (the held-out alignment each stage records); rerun the '
                            f'run or remove its folder from the grid.')


def check_history(path: str) -> None:
  """One ``cli.ConfigError`` naming ``path`` and the line when a non-empty line of a
  finished run's ``history.jsonl`` is not a JSON object, or a Phase A line (one with
  ``phase_a_step``) has no ``heldout`` object."""
  with open(path, encoding='utf-8', errors='replace') as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise cli.ConfigError(f'{path}:{number}: not valid JSON ({e.msg} at character '
                              f'{e.pos + 1}); the run folder is damaged: restore the file or '
                              'rerun the run.') from None
      if not isinstance(record, dict):
        raise cli.ConfigError(f'{path}:{number}: a JSON {type(record).__name__}, not a '
                              'history record (an object).')
      if 'phase_a_step' in record and not isinstance(record.get('heldout'), dict):
        raise cli.ConfigError(f"{path}:{number}: a Phase A record (phase_a_step "
                              f"{record['phase_a_step']}) without its 'heldout' section.")


def check_folder(argument: str, path: str, must_exist: bool = False) -> None:
  """One ``cli.ConfigError`` naming ``argument`` when ``path`` is a file, when a parent of
  it that exists is a file (the folder cannot be made), or (``must_exist``) when it is not
  there (``experiments.common.outputs.check_folder``)."""
  outputs.check_folder(argument, path, must_exist)


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
  """``studies.tfidf_baseline``'s file name for a dataset and validation rule."""
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


def load_predictions(path: str, dataset: Optional[str] = None):
  """``(labels [n] int64, probs [n] float64)`` of a ``predictions_test.npz``.

  One ``cli.ConfigError`` naming the file for what cannot be right: a damaged file or
  one without those arrays, arrays that are not [n] of one length, a probability that is
  not finite or not in [0, 1], a label other than 0 and 1, or (``dataset`` given) n other
  than its test split's ``TEST_ROWS[dataset]``."""
  try:
    with np.load(path, allow_pickle=False) as z:
      labels, probs = np.asarray(z['labels']), np.asarray(z['probs'])
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    if isinstance(e, FileNotFoundError):
      raise
    raise cli.ConfigError(f'{path}: not a readable predictions .npz with arrays labels and '
                          f'probs ({type(e).__name__}: {e}).') from None
  problem = prediction_problem(labels, probs, dataset)
  if problem:
    raise cli.ConfigError(f'{path}: {problem}')
  return labels.astype(np.int64), probs.astype(np.float64)


def _first(bad, values) -> str:
  i = int(np.flatnonzero(bad)[0])
  return f'{int(bad.sum())} of {bad.size} rows, the first row {i}: {values[i]!r}'


def prediction_problem(labels: np.ndarray, probs: np.ndarray,
                       dataset: Optional[str] = None) -> Optional[str]:
  """What is wrong with a predictions file's arrays, in words (None when nothing is):
  ``labels`` and ``probs`` must be [n] arrays of one n (``TEST_ROWS[dataset]`` when
  ``dataset`` is given), ``probs`` finite real numbers in [0, 1] and ``labels`` 0 or 1."""
  if labels.ndim != 1 or labels.shape != probs.shape:
    return (f'labels {labels.shape} and probs {probs.shape} are not [n] arrays of one '
            'length n.')
  if dataset is not None and len(labels) != TEST_ROWS[dataset]:
    return (f'{len(labels)} rows, but the {dataset} test split ({SPLIT_NAMES[dataset]}) has '
            f'{TEST_ROWS[dataset]}: predictions of another split or of a subset.')
  for name, a in (('probs', probs), ('labels', labels)):
    if a.dtype.kind not in 'biuf':
      return f'{name} is of dtype {a.dtype}, not real numbers.'
  p = probs.astype(np.float64)
  bad = ~np.isfinite(p)
  if bad.any():
    return f'probs P(class 1) is not finite in {_first(bad, p.tolist())}.'
  bad = (p < 0) | (p > 1)
  if bad.any():
    return f'probs P(class 1) is outside [0, 1] in {_first(bad, p.tolist())}.'
  bad = (labels != 0) & (labels != 1)
  if bad.any():
    return f'labels is not 0 or 1 in {_first(bad, labels.tolist())}.'
  return None


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


def rewrite_page_beside(out: str, stem: str, markdown: Callable[[dict], str]) -> str:
  """``--page_from_results`` of a command whose page ``<out>/<stem>.md`` is ``markdown`` of the
  record ``<out>/<stem>.json`` beside it: reads that JSON alone and replaces the page
  atomically; writes nothing else. One ``cli.ConfigError`` naming ``--out`` before any write:
  a missing folder or JSON, a page path that is a folder, a record the page cannot be made
  from. Returns the page's path."""
  outputs.check_folder('--out', out, must_exist=True)
  outputs.check_files_in('--out', out, [stem + '.md'])
  path = os.path.join(out, stem + '.json')
  if not os.path.isfile(path):
    raise cli.ConfigError(f'--out: {path!r} is not a file (--page_from_results reads it).')
  try:
    record = read_json(path)
  except cli.ConfigError as e:
    raise cli.ConfigError(f'--out: {e}') from None
  try:
    text = markdown(record)
  except (KeyError, IndexError, TypeError, ValueError, StopIteration) as e:
    raise cli.ConfigError(f'--out: {path}: it cannot give the page ({e!r}).') from None
  page = os.path.join(out, stem + '.md')
  provenance.write_atomic(page, text)
  return page
