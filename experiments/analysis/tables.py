r"""A dataset's table as numbers: which runs may share it, means over seeds, paired differences.

``dataset_summary`` is the ``<out>/<dataset>.json`` of ``experiments.report``: per
variant ``{metric: summarize(values over seeds)}`` (``aggregate``), the paired
differences Kernel-X − Vanilla-X, Kernel-X − Ball-X and Ball-X − Vanilla-X per
feature map over the seeds both have, with their seed-unit and pooled-within-maps
95% intervals (``paired``, ``experiments.analysis.intervals``), the runs and their command
templates (``run_commands``), and the TF-IDF reference row (``load_reference``).
Seeds of one variant trained with different settings, or variants of one table
with different shared settings, are refused (``check_comparable``).
"""

import os
import re
from typing import Optional

import numpy as np

from configs import text
from experiments.analysis import intervals
from experiments.analysis import loading
from experiments.common import cli
from experiments.common import provenance

PAIRED_METRICS = (('accuracy', 'accuracy'), ('mcc', 'MCC'), ('ece', 'ECE'), ('brier', 'Brier'))
REFERENCE_NAME = 'TF-IDF (word uni+bigram) + logistic regression'
# Config fields that may differ between the seeds of one variant.
_FREE_FIELDS = ('seed', 'data.data_dir', 'run')
# Config fields added after some runs were made, with the value that reproduces what
# those runs did: a run recorded without the field counts as having this value.
_ADDED_FIELDS = {'model.chunk_size': 0, 'model.init_radius': 0.0,
                 'data.max_eval_examples': 0, 'phase_a.schedule': 'joint',
                 'data.validation_rule': 'rows'}


def load_reference(tfidf_dir: Optional[str], dataset: str,
                   validation_rule: str = 'rows') -> Optional[dict]:
  """The TF-IDF row of ``dataset`` (``studies.tfidf_baseline``'s file in ``tfidf_dir``),
  its metrics as one-run summaries; None when there is no such file."""
  path = tfidf_dir and os.path.join(tfidf_dir, loading.reference_file(dataset, validation_rule))
  if not path or not os.path.isfile(path):
    return None
  r = loading.read_json(path)
  missing = [k for k in ('test', 'train_seconds', 'variant', 'command', 'commit', 'date',
                         'machine') if not isinstance(r, dict) or k not in r]
  missing += [f'test.{k}' for k in loading.METRICS
              if isinstance(r, dict) and isinstance(r.get('test'), dict) and k not in r['test']]
  if missing:
    raise cli.ConfigError(f'{path}: the TF-IDF row lacks {missing} (studies.tfidf_baseline '
                          'writes them); rerun it or pass another --tfidf.')
  metrics = {k: summarize([r['test'][k]]) for k in loading.METRICS}
  metrics['train_seconds'] = summarize([r['train_seconds']])
  return {'name': REFERENCE_NAME, 'variant': r['variant'],
          'source': provenance.relative_path(path), 'C': r.get('C'),
          'command': r['command'], 'commit': r['commit'], 'date': r['date'],
          'machine': r['machine'], 'metrics': metrics,
          'validation_rule': r.get('validation_rule', 'rows')}


def _flat(config, prefix=''):
  out = {}
  for k, v in config.items():
    out.update(_flat(v, f'{prefix}{k}.') if isinstance(v, dict) else {f'{prefix}{k}': v})
  return out


def _settings(run):
  flat = {**_ADDED_FIELDS, **_flat(run.get('config', {}))}
  return {k: v for k, v in flat.items()
          if not any(k == f or k.startswith(f + '.') for f in _FREE_FIELDS)}


def _check_same_settings(runs):
  first = runs[0]
  for r in runs[1:]:
    a, b = _settings(first), _settings(r)
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if diff:
      raise cli.ConfigError(f'{first["path"]} and {r["path"]} (same dataset and variant) were '
                            f'trained with different settings: {diff[:5]}; their seeds cannot '
                            'be averaged.')


# Fields a variant sets (configs/text.py): they may differ between the rows of a table.
_VARIANT_FIELDS = ('variant', 'model.init_radius') + text.VARIANT_FIELDS


def _phase_a_on(run):
  return bool(run.get('config', {}).get('phase_a', {}).get('enabled'))


def _shared_diff(a_run, b_run):
  """Settings two variants of one table must share but do not: all but the variants' own
  fields, and Phase A's only when both run it (they do nothing otherwise)."""
  a, b = ({k: v for k, v in _settings(r).items() if k not in _VARIANT_FIELDS}
          for r in (a_run, b_run))
  if not (_phase_a_on(a_run) and _phase_a_on(b_run)):
    a, b = ({k: v for k, v in d.items() if not k.startswith('phase_a.')} for d in (a, b))
  return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def dataset_rule(runs, dataset):
  """The validation rule of a dataset's runs (the check in dataset_summary makes it one)."""
  rules = sorted({_settings(r).get('data.validation_rule') for r in runs
                  if r['dataset'] == dataset})
  return rules[0] if len(rules) == 1 else 'rows'


def check_comparable(runs):
  """Refuses a table (and its paired differences) whose variants were trained with
  different shared settings, e.g. a grid resumed with other epochs for some variants."""
  firsts = [group[0] for group in by_variant(runs).values()]
  for i, a in enumerate(firsts):
    for b in firsts[i + 1:]:
      diff = _shared_diff(a, b)
      if diff:
        raise cli.ConfigError(f'{a["path"]} and {b["path"]} (same dataset) were trained with '
                              f'different settings: {diff[:5]}; they cannot share a table.')


# ----------------------------------------------------------------------------- aggregation

def _number(x):
  return None if x is None or not np.isfinite(x) else float(x)


def summarize(values) -> dict:
  """``{mean, std, n}``: std with ddof = 1, ``None`` when n = 1 (and for nan)."""
  v = np.asarray([np.nan if x is None else x for x in values], np.float64)
  std = float(np.std(v, ddof=1)) if len(v) > 1 else None
  return {'mean': _number(float(np.mean(v))), 'std': _number(std), 'n': len(v)}


def variant_order(names):
  """Names in the order of ``configs.text.VARIANTS``, unknown ones sorted after."""
  known = [v for v in text.VARIANTS if v in names]
  return known + sorted(set(names) - set(known))


def by_variant(runs):
  groups = {}
  for r in runs:
    groups.setdefault(r['variant'], []).append(r)
  return {v: sorted(groups[v], key=lambda r: r['seed']) for v in variant_order(groups)}


def _values(run):
  return {**{k: run['test'][k] for k in loading.METRICS}, **{k: run.get(k) for k in loading.TIMES}}


def aggregate(runs) -> dict:
  """``{variant: {metric: {mean, std, n}}}`` over the seeds of each variant."""
  out = {}
  for variant, group in by_variant(runs).items():
    _check_same_settings(group)
    values = [_values(r) for r in group]
    out[variant] = {k: summarize([v[k] for v in values]) for k in loading.METRICS + loading.TIMES}
  return out


def paired(runs, baseline: str = 'vanilla', treatment: str = 'kernel') -> dict:
  """``{map: {metric: summary}}`` of <treatment>-X − <baseline>-X over the seeds both have.

  Each summary is ``{mean, std, n}`` with its two 95% intervals (``intervals.with_intervals``):
  ``ci95`` over the map's seeds, ``ci95_pooled`` with the variance pooled within the maps of
  this comparison (``sd_pooled``, ``df_pooled``).

  ``baseline`` and ``treatment``: ``'vanilla'`` (random particles), ``'ball'``
  (random particles projected onto Phase A's ball, the control that separates
  the projection from the dynamics) or ``'kernel'`` (particles learned by Phase A).
  """
  groups = by_variant(runs)
  out = {}
  for fmap in text.MAPS:
    treated = {r['seed']: r for r in groups.get(f'{treatment}-{fmap}', [])}
    base = {r['seed']: r for r in groups.get(f'{baseline}-{fmap}', [])}
    seeds = sorted(set(treated) & set(base))
    if seeds:
      out[fmap] = {k: summarize([treated[s]['test'][k] - base[s]['test'][k] for s in seeds])
                   for k, _ in PAIRED_METRICS}
      out[fmap]['seeds'] = seeds
  return intervals.with_intervals(out, [k for k, _ in PAIRED_METRICS])


def command_template(command: str, variant: str, seed: int) -> str:
  """The command with this run's variant and seed replaced by ``{variant}``, ``{seed}``."""
  v = re.escape(variant)
  words = []
  for word in command.split():
    if word == f'--config.seed={seed}':
      word = '--config.seed={seed}'
    elif word.startswith('--config='):
      word = re.sub(rf'([:,]){v}(?=,|$)', r'\1{variant}', word)
    else:
      word = re.sub(rf'(^|[/=]){v}(?=/|$)', r'\1{variant}', word)
      word = re.sub(rf'(^|/)seed{seed}(?=/|$)', r'\1seed{seed}', word)
    words.append(word)
  return ' '.join(words)


def run_commands(runs):
  """Distinct command templates with the runs, variants and seeds they cover."""
  out = {}
  for r in runs:
    t = out.setdefault(command_template(r['command'], r['variant'], r['seed']),
                       {'runs': 0, 'variants': set(), 'seeds': set()})
    t['runs'] += 1
    t['variants'].add(r['variant'])
    t['seeds'].add(r['seed'])
  return [{'command': c, 'runs': t['runs'], 'variants': variant_order(t['variants']),
           'seeds': sorted(t['seeds'])} for c, t in out.items()]


def dataset_summary(dataset, runs, unfinished, reference, meta) -> dict:
  if dataset not in loading.SPLIT_NAMES:
    raise cli.ConfigError(f'dataset {dataset!r}: expected one of {sorted(loading.SPLIT_NAMES)}.')
  check_comparable(runs)
  limits = {_settings(r).get('data.max_train_examples') or 0 for r in runs}
  if limits - {0}:          # Trained on fewer rows than the TF-IDF row: not comparable.
    reference = None
  rules = {_settings(r).get('data.validation_rule') for r in runs}
  ref_rule = (reference or {}).get('validation_rule', 'rows')
  if reference is not None and rules and rules != {ref_rule}:
    raise cli.ConfigError(f'{dataset}: the TF-IDF row held validation out by {ref_rule!r}, the '
                          f'runs by {sorted(rules)}; pass --tfidf with a matching row '
                          f'(studies.tfidf_baseline --validation_rule).')
  return {
      'dataset': dataset, 'split': loading.SPLIT_NAMES[dataset], 'command': meta['command'],
      'commit': meta['commit'], 'date': meta['date'], 'machine': meta['machine'],
      'variants': aggregate(runs),
      'paired': paired(runs),
      'paired_ball': paired(runs, 'ball'),
      'paired_ball_vanilla': paired(runs, 'vanilla', treatment='ball'),
      'runs': [{k: r.get(k) for k in ('variant', 'seed', 'commit', 'command', 'date', 'machine',
                                      'path', 'best_epoch')}
               for group in by_variant(runs).values() for r in group],
      'run_commands': run_commands(runs),
      'unfinished': [u['path'] for u in unfinished],
      'reference': reference,
      'max_train_examples': max(limits, default=0),
  }
