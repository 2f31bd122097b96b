r"""Tables of the text-classification grid: per-dataset JSON and docs/results.md.

  python -m experiments.report --runs=workdir/grid --out=results --docs=docs/results.md

reads every ``results.json`` under ``--runs`` (``experiments.grid`` lays them
out as ``<dataset>/<variant>/seed<s>/``) and writes

* ``<out>/<dataset>.json``: ``{dataset, split, command, commit, date, machine,
  variants: {variant: {metric: {mean, std, n}}}, paired, paired_ball, paired_ball_vanilla,
  runs, run_commands,
  unfinished, reference}``. Metrics are those of the test split (the
  evaluation split named by ``split``) plus ``train_seconds``,
  ``phase_a_seconds`` and ``phase_b_seconds``; ``std`` is the sample standard
  deviation (ddof = 1) over seeds, ``null`` when n = 1. A variant without a
  finished run is left out. ``paired`` holds Kernel-X − Vanilla-X per feature
  map, per seed both variants have, summarised the same way; ``paired_ball`` the
  same for Kernel-X − Ball-X (the control), ``paired_ball_vanilla`` for
  Ball-X − Vanilla-X (what the projection alone does). ``reference`` is
  the TF-IDF row of ``experiments.tfidf_baseline`` (``<out>/tfidf/<dataset>.json``)
  when that file exists.
* ``--docs``: one table per dataset (variants in the order of
  ``configs.text.VARIANTS``, then the reference), the commands, commits,
  machines and dates of the runs, the paired tables and the two figures below.
  The block between ``<!-- analysis -->`` and ``<!-- /analysis -->`` of an
  existing file is kept verbatim; everything else is rewritten.
* ``<figures>/<dataset>_paired.png`` (``--figures``, default ``figures/`` next to
  ``--docs``; for a docs file other than ``results.md`` the names start with its
  stem, e.g. ``results_paper_length_sst2_paired.png``): a forest plot of the
  paired differences Kernel-X − Vanilla-X and Kernel-X − Ball-X per feature map,
  accuracy and ECE, mean with its 95% Student-t interval over seeds
  (mean ± t₀.₉₇₅,ₙ₋₁ · std/√n; a point without interval when n = 1).
* ``<figures>/<dataset>_reliability.png``: reliability diagrams, one panel per
  feature map with Kernel-X, Vanilla-X and Ball-X, plus softmax and the TF-IDF
  row in every panel, from the per-example test predictions: each run's
  ``predictions_test.npz`` (arrays ``labels``, int 0/1, and ``probs``, float
  P(class 1), in the order of the test split; ``save_predictions`` writes it),
  and the reference's ``<tfidf>/<dataset>[_<rule>]_predictions_test.npz``. The
  seeds of a variant are pooled. Drawn only when some run has predictions.

Runs directories with a ``config.json`` but no ``results.json`` are listed as
unfinished and left out of the means. Two results for the same (dataset,
variant, seed), or seeds of one variant trained with different settings, are
refused rather than averaged.

  python -m experiments.report --from_summaries --out=results --docs=docs/results.md

redraws the page and its paired figures from the ``<out>/<dataset>.json`` already
there, without the runs (once their folder is gone): the tables and their
provenance stay those of the summaries, a second line names the redraw.
"""

import json
import os
import re
import sys
from typing import List, Optional

if __name__ == '__main__' and not __package__:
  # Launched as a file: make the repository root importable (as experiments/synthetic.py).
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from configs import text
from experiments.common import cli
from experiments.common import progress as progress_lib
from experiments.common import provenance
from experiments import report_figures

SPLIT_NAMES = {
    'sst2': 'GLUE SST-2 dev (872)',
    'rotten_tomatoes': 'test (1,066; HF split)',
    'qqp_subset': 'Quora 20k held-out (9,928): not GLUE QQP dev',
    'qqp': 'GLUE QQP dev (40,430)',
}
TITLES = {'sst2': 'SST-2', 'rotten_tomatoes': 'Rotten Tomatoes', 'qqp_subset': 'QQP subset (20k)',
          'qqp': 'QQP'}
METRICS = ('accuracy', 'f1_micro', 'f1_macro', 'f1_weighted', 'roc_auc', 'pr_auc', 'mcc',
           'balanced_accuracy', 'log_loss', 'brier', 'ece')
"""The keys of ``coulomb_jax.metrics.classification_metrics``."""
TIMES = ('train_seconds', 'phase_a_seconds', 'phase_b_seconds')
TABLE_COLUMNS = (('accuracy', 'accuracy'), ('f1_macro', 'F1 macro'), ('mcc', 'MCC'),
                 ('roc_auc', 'ROC-AUC'), ('log_loss', 'LogLoss'), ('brier', 'Brier'),
                 ('ece', 'ECE'))
PAIRED_METRICS = (('accuracy', 'accuracy'), ('mcc', 'MCC'), ('ece', 'ECE'), ('brier', 'Brier'))
REFERENCE_NAME = 'TF-IDF (word uni+bigram) + logistic regression'
ANALYSIS_START, ANALYSIS_END = '<!-- analysis -->', '<!-- /analysis -->'
PLACEHOLDER = '(analysis to be written)'
RESULTS = 'results.json'
PREDICTIONS = 'predictions_test.npz'
"""Per-example test predictions of a run: ``labels`` [n] int 0/1, ``probs`` [n] P(class 1)."""
RELIABILITY_BINS = 10
RELIABILITY_KINDS = ('kernel', 'vanilla', 'ball')
# Config fields that may differ between the seeds of one variant.
_FREE_FIELDS = ('seed', 'data.data_dir', 'run')
# Config fields added after some runs were made, with the value that reproduces what
# those runs did: a run recorded without the field counts as having this value.
_ADDED_FIELDS = {'model.chunk_size': 0, 'model.init_radius': 0.0,
                 'data.max_eval_examples': 0, 'phase_a.schedule': 'joint',
                 'data.validation_rule': 'rows'}


# ----------------------------------------------------------------------------- loading

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
      with open(os.path.join(root, RESULTS)) as f:
        r = json.load(f)
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
  except (OSError, ValueError, KeyError, EOFError) as e:
    if isinstance(e, FileNotFoundError):
      raise
    raise cli.ConfigError(f'{path}: not a readable predictions .npz with arrays labels and '
                          f'probs ({type(e).__name__}: {e}).') from None


def load_reference(tfidf_dir: Optional[str], dataset: str,
                   validation_rule: str = 'rows') -> Optional[dict]:
  path = tfidf_dir and os.path.join(tfidf_dir, reference_file(dataset, validation_rule))
  if not path or not os.path.isfile(path):
    return None
  with open(path) as f:
    r = json.load(f)
  metrics = {k: summarize([r['test'][k]]) for k in METRICS}
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
      raise ValueError(f'{first["path"]} and {r["path"]} (same dataset and variant) were trained '
                       f'with different settings: {diff[:5]}; their seeds cannot be averaged.')


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


def _rule(runs, dataset):
  """The validation rule of a dataset's runs (the check in dataset_summary makes it one)."""
  rules = sorted({_settings(r).get('data.validation_rule') for r in runs
                  if r['dataset'] == dataset})
  return rules[0] if len(rules) == 1 else 'rows'


def check_comparable(runs):
  """Refuses a table (and its paired differences) whose variants were trained with
  different shared settings, e.g. a grid resumed with other epochs for some variants."""
  firsts = [group[0] for group in _by_variant(runs).values()]
  for i, a in enumerate(firsts):
    for b in firsts[i + 1:]:
      diff = _shared_diff(a, b)
      if diff:
        raise ValueError(f'{a["path"]} and {b["path"]} (same dataset) were trained with '
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


def _by_variant(runs):
  groups = {}
  for r in runs:
    groups.setdefault(r['variant'], []).append(r)
  return {v: sorted(groups[v], key=lambda r: r['seed']) for v in variant_order(groups)}


def _values(run):
  return {**{k: run['test'][k] for k in METRICS}, **{k: run.get(k) for k in TIMES}}


def aggregate(runs) -> dict:
  """``{variant: {metric: {mean, std, n}}}`` over the seeds of each variant."""
  out = {}
  for variant, group in _by_variant(runs).items():
    _check_same_settings(group)
    values = [_values(r) for r in group]
    out[variant] = {k: summarize([v[k] for v in values]) for k in METRICS + TIMES}
  return out


def paired(runs, baseline: str = 'vanilla', treatment: str = 'kernel') -> dict:
  """``{map: {metric: summary}}`` of <treatment>-X − <baseline>-X over the seeds both have.

  ``baseline`` and ``treatment``: ``'vanilla'`` (random particles), ``'ball'``
  (random particles projected onto Phase A's ball, the control that separates
  the projection from the dynamics) or ``'kernel'`` (particles learned by Phase A).
  """
  groups = _by_variant(runs)
  out = {}
  for fmap in text.MAPS:
    treated = {r['seed']: r for r in groups.get(f'{treatment}-{fmap}', [])}
    base = {r['seed']: r for r in groups.get(f'{baseline}-{fmap}', [])}
    seeds = sorted(set(treated) & set(base))
    if seeds:
      out[fmap] = {k: summarize([treated[s]['test'][k] - base[s]['test'][k] for s in seeds])
                   for k, _ in PAIRED_METRICS}
      out[fmap]['seeds'] = seeds
  return out


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
  if dataset not in SPLIT_NAMES:
    raise ValueError(f'dataset {dataset!r}: expected one of {sorted(SPLIT_NAMES)}.')
  check_comparable(runs)
  limits = {_settings(r).get('data.max_train_examples') or 0 for r in runs}
  if limits - {0}:          # Trained on fewer rows than the TF-IDF row: not comparable.
    reference = None
  rules = {_settings(r).get('data.validation_rule') for r in runs}
  ref_rule = (reference or {}).get('validation_rule', 'rows')
  if reference is not None and rules and rules != {ref_rule}:
    raise ValueError(f'{dataset}: the TF-IDF row held validation out by {ref_rule!r}, the runs '
                     f'by {sorted(rules)}; pass --tfidf with a matching row '
                     f'(experiments.tfidf_baseline --validation_rule).')
  return {
      'dataset': dataset, 'split': SPLIT_NAMES[dataset], 'command': meta['command'],
      'commit': meta['commit'], 'date': meta['date'], 'machine': meta['machine'],
      'variants': aggregate(runs),
      'paired': paired(runs),
      'paired_ball': paired(runs, 'ball'),
      'paired_ball_vanilla': paired(runs, 'vanilla', treatment='ball'),
      'runs': [{k: r.get(k) for k in ('variant', 'seed', 'commit', 'command', 'date', 'machine',
                                      'path', 'best_epoch')}
               for group in _by_variant(runs).values() for r in group],
      'run_commands': run_commands(runs),
      'unfinished': [u['path'] for u in unfinished],
      'reference': reference,
      'max_train_examples': max(limits, default=0),
  }


# ----------------------------------------------------------------------------- figures

def _pooled(paths, expected_labels):
  """Labels and P(class 1) of several runs, concatenated; every run must hold the same labels."""
  labels, probs = [], []
  for path in paths:
    y, p = load_predictions(path)
    if expected_labels[0] is None:
      expected_labels[0] = (y, path)
    elif not np.array_equal(y, expected_labels[0][0]):
      raise ValueError(f'{path} and {expected_labels[0][1]} hold different test labels; the '
                       f'reliability diagrams compare predictions on one test split.')
    labels.append(y)
    probs.append(p)
  return np.concatenate(labels), np.concatenate(probs), len(paths)


def reliability_panels(runs, reference_predictions: Optional[str] = None) -> dict:
  """``{panel: {curve: (labels, probs, runs)}}`` for ``report_figures.reliability_figure``.

  One panel per feature map with predictions for Kernel-, Vanilla- or Ball-X, each
  with softmax and the reference as well; a single panel when only those two have
  predictions; ``{}`` when no run has any.
  """
  expected = [None]
  groups = _by_variant(runs)
  with_predictions = lambda v: [r['predictions'] for r in groups.get(v, []) if r.get('predictions')]
  common = {}
  if with_predictions('softmax'):
    common['softmax'] = _pooled(with_predictions('softmax'), expected)
  if reference_predictions and os.path.isfile(reference_predictions):
    common['reference'] = _pooled([reference_predictions], expected)
  panels = {}
  for fmap in text.MAPS:
    curves = {kind: _pooled(with_predictions(f'{kind}-{fmap}'), expected)
              for kind in RELIABILITY_KINDS if with_predictions(f'{kind}-{fmap}')}
    if curves:
      panels[fmap] = {**curves, **common}
  if not panels and common:
    panels['softmax and TF-IDF'] = common
  return panels


def figure_names(docs_path: str, dataset: str) -> dict:
  """File names of a dataset's figures: ``<dataset>_{paired,reliability}.png``, prefixed
  with the docs file's stem unless it is ``results.md``."""
  stem = os.path.splitext(os.path.basename(docs_path))[0]
  prefix = '' if stem == 'results' else stem + '_'
  return {kind: f'{prefix}{dataset}_{kind}.png' for kind in ('paired', 'reliability')}


def draw_figures(summary, runs, figures_dir: str, names: dict,
                 reference_predictions: Optional[str] = None) -> dict:
  """Draws a dataset's figures; returns ``{'paired': path or None, 'reliability': ...}``."""
  title = TITLES.get(summary['dataset'], summary['dataset'])
  out = {'paired': None, 'reliability': None}
  comparisons = {name: summary[key] for name, key in (('Kernel − Vanilla', 'paired'),
                                                      ('Kernel − Ball', 'paired_ball'))
                 if summary.get(key)}
  if comparisons:
    maps = [m for m in text.MAPS if any(m in c for c in comparisons.values())]
    out['paired'] = report_figures.paired_figure(
        os.path.join(figures_dir, names['paired']), f'{title}: paired differences per map',
        comparisons, maps=maps)
  panels = reliability_panels(runs, reference_predictions)
  if panels:
    out['reliability'] = report_figures.reliability_figure(
        os.path.join(figures_dir, names['reliability']),
        f'{title}: reliability on the test split ({RELIABILITY_BINS} equal-width bins of '
        f'P(class 1), seeds pooled)', panels, RELIABILITY_BINS)
  return out


# ----------------------------------------------------------------------------- markdown

def fmt(summary, digits=4, signed=False):
  if summary is None or summary['mean'] is None:
    return '—'
  f = lambda x: f'{x:+.{digits}f}' if signed else f'{x:.{digits}f}'
  if summary['std'] is None:
    return f(summary['mean'])
  return f'{f(summary["mean"])} ± {summary["std"]:.{digits}f}'


def _seconds(metrics):
  total = fmt(metrics['train_seconds'], 0)
  if 'phase_a_seconds' not in metrics or metrics['phase_a_seconds']['mean'] is None:
    return total
  return (f"{total} (A {fmt({**metrics['phase_a_seconds'], 'std': None}, 0)} + "
          f"B {fmt({**metrics['phase_b_seconds'], 'std': None}, 0)})")


def describe_machine(m) -> str:
  if not isinstance(m, dict):
    return str(m)
  return (f"{m.get('device_count', '?')} × {m.get('device_kind', '?')} "
          f"({m.get('platform', '?')}), "
          f"{m.get('processor', '?')} with {m.get('cpu_count', '?')} CPUs, "
          f"python {m.get('python', '?')}, jax {m.get('jax', '?')}")


def _counted(values):
  counts = {}
  for v in values:
    counts[v] = counts.get(v, 0) + 1
  return ', '.join(f'{v} ({n} run{"s" * (n > 1)})' for v, n in counts.items())


def dataset_markdown(s, figures: Optional[dict] = None) -> str:
  """The dataset's section; ``figures``: ``{'paired', 'reliability'}`` paths relative to
  the docs file (``None`` where not drawn), embedded after the tables."""
  runs = s['runs']
  lines = [f"## {TITLES.get(s['dataset'], s['dataset'])}: {s['split']}", '']
  lines.append(f"{len(runs)} finished run{'s' * (len(runs) != 1)} "
               f"({len(s['variants'])} variant{'s' * (len(s['variants']) != 1)})." + (
                   f" Unfinished, not included: {', '.join(f'`{p}`' for p in s['unfinished'])}."
                   if s['unfinished'] else ''))
  lines.append('')
  if runs:
    lines += ['Commands (`{variant}` and `{seed}` stand for each run\'s):', '', '```']
    for c in s['run_commands']:
      seeds, variants = ', '.join(map(str, c['seeds'])), ', '.join(c['variants'])
      lines.append(f"{c['command']}\n  # {c['runs']} run{'s' * (c['runs'] != 1)}; "
                   f"seeds {seeds}; variants {variants}")
    lines += ['```', '']
    dates = sorted(r['date'] for r in runs if r.get('date'))
    lines.append(f"Commits: {_counted('`' + r['commit'] + '`' for r in runs)}  ")
    lines.append(f"Machines: {_counted(describe_machine(r['machine']) for r in runs)}  ")
    lines.append(f"Dates: {dates[0]} to {dates[-1]}" if dates else 'Dates: unknown')
    lines.append('')
  if s.get('max_train_examples'):
    lines += [f"Every run trained on the same fixed random {s['max_train_examples']:,} rows of "
              'the training split (`data.max_train_examples`, a compute budget); evaluation on '
              'the full splits. No TF-IDF row: it trained on all rows.', '']
  ref = s.get('reference')
  if ref:
    lines.append(f"Reference row: `{ref['command']}` at `{ref['commit']}` ({ref['date']}; "
                 f"{describe_machine(ref['machine'])}), C = {ref['C']:g} chosen on validation.")
    lines.append('')
  header = ['variant'] + [name for _, name in TABLE_COLUMNS] + ['train s (A + B)', 'n seeds']
  lines += ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for variant, m in s['variants'].items():
    cells = [fmt(m[k]) for k, _ in TABLE_COLUMNS] + [_seconds(m), str(m['accuracy']['n'])]
    lines.append(f'| {variant} | ' + ' | '.join(cells) + ' |')
  if ref:
    m = ref['metrics']
    cells = [fmt(m[k]) for k, _ in TABLE_COLUMNS] + [_seconds(m), '—']
    lines.append(f"| {ref['name']} | " + ' | '.join(cells) + ' |')
  lines.append('')
  if s['paired']:
    lines += _paired_table('Paired Kernel-X − Vanilla-X (difference per seed, then mean ± std '
                           'over seeds):', s['paired'])
  else:
    lines += ['Paired Kernel-X − Vanilla-X: no map has both variants yet.', '']
  if s.get('paired_ball'):
    lines += _paired_table('Paired Kernel-X − Ball-X (the control: the same ball, no Langevin '
                           'dynamics):', s['paired_ball'])
  if s.get('paired_ball_vanilla'):
    lines += _paired_table('Paired Ball-X − Vanilla-X (what the projection onto the ball does '
                           'by itself):', s['paired_ball_vanilla'])
  if figures is not None:
    lines += _figure_lines(s, figures)
  return '\n'.join(lines)


def _figure_lines(s, figures):
  title = TITLES.get(s['dataset'], s['dataset'])
  lines = []
  if figures.get('paired'):
    lines += [f'Paired differences per map (Kernel-X − Vanilla-X and Kernel-X − Ball-X; mean '
              f'over seeds with its 95% t-interval, a hollow point for one seed):', '',
              f"![{title}: paired differences]({figures['paired']})", '']
  if figures.get('reliability'):
    lines += ['Reliability diagrams on the test split (fraction of class 1 against the mean '
              f'predicted P(class 1) in {RELIABILITY_BINS} equal-width bins; the seeds of a '
              'variant pooled; softmax and the TF-IDF row in every panel):', '',
              f"![{title}: reliability diagrams]({figures['reliability']})", '']
  else:
    lines += [f'Reliability diagrams: no run here saved its per-example test predictions '
              f'(`{PREDICTIONS}`).', '']
  return lines


def _paired_table(title, pairs):
  """Markdown lines of one paired-difference table (title, header, one row per map)."""
  header = ['map'] + [f'Δ {name}' for _, name in PAIRED_METRICS] + ['n pairs']
  lines = [title, '', '| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for fmap, d in pairs.items():
    cells = [fmt(d[k], signed=True) for k, _ in PAIRED_METRICS] + [str(len(d['seeds']))]
    lines.append(f'| {fmap} | ' + ' | '.join(cells) + ' |')
  return lines + ['']


def read_analysis(docs_path: str) -> str:
  """The analysis block of an existing file (markers included), or a placeholder block."""
  default = f'{ANALYSIS_START}\n{PLACEHOLDER}\n{ANALYSIS_END}'
  if not os.path.exists(docs_path):
    return default
  with open(docs_path) as f:
    old = f.read()
  start, end = old.find(ANALYSIS_START), old.find(ANALYSIS_END)
  if start < 0 and end < 0 and not old.strip():
    return default
  if start < 0 or end < start:
    raise ValueError(f'{docs_path} exists but has no {ANALYSIS_START} … {ANALYSIS_END} block; '
                     f'refusing to overwrite it (move it away or add the markers).')
  return old[start:end + len(ANALYSIS_END)]


def markdown(summaries, analysis, meta, figures: Optional[dict] = None,
             redrawn: Optional[dict] = None, kept: Optional[List[str]] = None) -> str:
  """The page: the (hand-written) analysis first, then per dataset its figures and
  tables, then where it came from (``redrawn``: the metadata of a redraw from the
  summaries, ``redraw_from_summaries``; ``kept``: datasets whose summary was kept from an
  earlier report run, ``write_report(keep_others=True)``)."""
  parts = ['# Text classification: results', '', analysis, '',
           'Mean ± sample std (ddof = 1) over seeds on the evaluation split; one value when '
           'there is one seed. Train seconds: Phase A + Phase B, evaluation excluded.', '']
  figures = figures or {}
  parts += [dataset_markdown(s, figures.get(d)) for d, s in summaries.items()]
  parts += ['## Provenance', '',
            f"Generated by `{meta['command']}` at `{meta['commit']}` ({meta['date']}). "
            'Everything outside the analysis block is rewritten on every run of the report.', '']
  for d in kept or []:
    k = summaries[d]
    parts += [f"{TITLES.get(d, d)}: summary `<out>/{d}.json` and figures kept from "
              f"`{k['command']}` at `{k['commit']}` ({k['date']}); its runs were not read "
              'this time.', '']
  if redrawn:
    parts += [f"Page and figures redrawn from the summaries above (`<out>/<dataset>.json`, "
              f"tables unchanged) by `{redrawn['command']}` at `{redrawn['commit']}` "
              f"({redrawn['date']}).", '']
  return '\n'.join(parts)


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


# ----------------------------------------------------------------------------- entry point

def write_report(runs_dir: str, out_dir: str, docs_path: str, *,
                 tfidf_dir: Optional[str] = None, meta: Optional[dict] = None,
                 figures_dir: Optional[str] = None, draw: bool = True,
                 keep_others: bool = False, train_subsets: bool = False,
                 allow_fewer: bool = False) -> dict:
  """Writes ``<out_dir>/<dataset>.json``, ``docs_path`` and (``draw``) the figures in
  ``figures_dir`` (default ``figures/`` next to ``docs_path``); returns ``{dataset: summary}``.

  ``keep_others``: a dataset without runs under ``runs_dir`` whose ``<out_dir>/<dataset>.json``
  exists keeps that summary and its figures on the page (a grid run one dataset at a time,
  after the earlier dataset's runs are gone); the page names the command and commit each
  kept summary came from. ``train_subsets``: see ``load_runs``. Results are never replaced
  by fewer (``check_not_fewer``): with no finished run, or with fewer datasets, variants or
  seeds than the summaries in ``out_dir``, nothing is written unless ``allow_fewer``."""
  meta = meta or provenance.run_metadata('experiments.report')
  tfidf_dir = os.path.join(out_dir, 'tfidf') if tfidf_dir is None else tfidf_dir
  docs_dir = os.path.dirname(docs_path)
  figures_dir = os.path.join(docs_dir, 'figures') if figures_dir is None else figures_dir
  analysis = read_analysis(docs_path)          # fails before anything is written
  progress = progress_lib.Progress('report', total=0, unit='dataset')
  progress.say(f'reading the runs under {runs_dir} …')
  finished, unfinished = load_runs(runs_dir, train_subsets)
  old, new = summary_run_keys(out_dir), run_keys(finished)
  if keep_others:
    new.update({d: keys for d, keys in old.items() if d not in new})
  check_not_fewer(old, new, f'{out_dir}/<dataset>.json and {docs_path}', allow_fewer)
  # The datasets with runs; with none at all, those with a reference row.
  datasets = ({r['dataset'] for r in finished + unfinished}
              or {d for d in SPLIT_NAMES if load_reference(tfidf_dir, d)})
  unknown = datasets - set(SPLIT_NAMES)
  if unknown:
    raise ValueError(f'datasets {sorted(unknown)}: expected ones of {sorted(SPLIT_NAMES)}.')
  progress.total = len(datasets)
  summaries, figures = {}, {}
  for d in (d for d in SPLIT_NAMES if d in datasets):
    runs, rule = [r for r in finished if r['dataset'] == d], _rule(finished, d)
    summaries[d] = dataset_summary(d, runs, [u for u in unfinished if u['dataset'] == d],
                                   load_reference(tfidf_dir, d, rule), meta)
    if draw:
      progress.say(f'{d}: {len(runs)} runs; drawing the paired and reliability figures …')
      drawn = draw_figures(summaries[d], runs, figures_dir, figure_names(docs_path, d),
                           os.path.join(tfidf_dir, reference_predictions_file(d, rule)))
      figures[d] = {k: v and os.path.relpath(v, docs_dir or '.') for k, v in drawn.items()}
    progress.update(f'{d}: {len(runs)} runs, {len(summaries[d]["variants"])} variants')
  fresh = list(summaries)
  kept = []
  for d in SPLIT_NAMES if keep_others else ():
    path = os.path.join(out_dir, f'{d}.json')
    if d not in summaries and os.path.exists(path):
      with open(path) as f:
        summaries[d] = json.load(f)
      kept.append(d)
      names = figure_names(docs_path, d)
      figures[d] = {k: (os.path.relpath(os.path.join(figures_dir, v), docs_dir or '.')
                        if os.path.exists(os.path.join(figures_dir, v)) else None)
                    for k, v in names.items()}
  summaries = {d: summaries[d] for d in SPLIT_NAMES if d in summaries}
  os.makedirs(out_dir, exist_ok=True)
  for d in fresh:
    provenance.write_json_atomic(os.path.join(out_dir, f'{d}.json'), summaries[d], indent=1)
  if docs_dir:
    os.makedirs(docs_dir, exist_ok=True)
  provenance.write_atomic(docs_path, markdown(summaries, analysis, meta,
                                              figures if draw else None, kept=kept))
  return summaries


def redraw_from_summaries(out_dir: str, docs_path: str, *, figures_dir: Optional[str] = None,
                          meta: Optional[dict] = None) -> dict:
  """Rewrites ``docs_path`` and its paired-difference figures from the summaries
  ``write_report`` left in ``out_dir`` (``<dataset>.json``), without the runs (e.g.
  once their folder is gone). The tables and the Provenance line keep the summaries'
  command and commit; a second line names this redraw. Reliability diagrams need the
  runs' predictions, so a redrawn page has none. Returns ``{dataset: summary}``."""
  meta = meta or provenance.run_metadata('experiments.report')
  analysis = read_analysis(docs_path)          # fails before anything is written
  summaries = {}
  for d in SPLIT_NAMES:
    path = os.path.join(out_dir, f'{d}.json')
    if os.path.exists(path):
      with open(path) as f:
        summaries[d] = json.load(f)
  if not summaries:
    raise ValueError(f'--out: {out_dir!r} holds no summary (<dataset>.json for a dataset of '
                     f'{sorted(SPLIT_NAMES)}) to redraw from.')
  made = {(s['command'], s['commit'], s['date']) for s in summaries.values()}
  if len(made) > 1:
    raise ValueError(f'--out: the summaries in {out_dir!r} come from {len(made)} different '
                     f'report runs {sorted(made)}; one page names one.')
  docs_dir = os.path.dirname(docs_path)
  figures_dir = os.path.join(docs_dir, 'figures') if figures_dir is None else figures_dir
  figures = {}
  for d, s in summaries.items():
    drawn = draw_figures(s, [], figures_dir, figure_names(docs_path, d))
    figures[d] = {k: v and os.path.relpath(v, docs_dir or '.') for k, v in drawn.items()}
  first = next(iter(summaries.values()))
  provenance.write_atomic(docs_path, markdown(summaries, analysis, first, figures,
                                              redrawn=meta))
  return summaries


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top

  _RUNS = flags.DEFINE_string('runs', 'workdir/grid', 'Root of the runs (experiments.grid).')
  _OUT = flags.DEFINE_string('out', 'results', 'Folder for <dataset>.json.')
  _DOCS = flags.DEFINE_string('docs', 'docs/results.md', 'Markdown tables.')
  _TFIDF = flags.DEFINE_string('tfidf', None, 'Folder of the TF-IDF rows (default <out>/tfidf).')
  _FIGURES = flags.DEFINE_string('figures', None, 'Folder for the figures (default figures/ '
                                 'next to --docs).')

  _FROM_SUMMARIES = flags.DEFINE_bool(
      'from_summaries', False, 'Redraw --docs and its paired figures from the summaries '
      'already in --out (<dataset>.json) instead of reading --runs (tables unchanged; no '
      'reliability diagrams, which need the runs).')

  _KEEP_OTHERS = flags.DEFINE_bool(
      'keep_others', False, 'Keep on the page the summaries (<out>/<dataset>.json) and '
      'figures of datasets that have no runs under --runs (instead of dropping them).')

  _TRAIN_SUBSETS = flags.DEFINE_bool(
      'train_subsets', False, 'Accept runs trained on a fixed subset of the training rows '
      '(data.max_train_examples, the same in every run); the page says so.')

  _ALLOW_FEWER = flags.DEFINE_bool(
      'allow_fewer', False, 'Write even when the runs found hold fewer datasets, variants or '
      'seeds than the summaries in --out (or none): by default that is refused.')

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    if _FROM_SUMMARIES.value:
      summaries = redraw_from_summaries(_OUT.value, _DOCS.value, figures_dir=_FIGURES.value)
      print(f'redrew {_DOCS.value} from {sorted(summaries)}', flush=True)
      return
    summaries = write_report(_RUNS.value, _OUT.value, _DOCS.value, tfidf_dir=_TFIDF.value,
                             figures_dir=_FIGURES.value, keep_others=_KEEP_OTHERS.value,
                             train_subsets=_TRAIN_SUBSETS.value,
                             allow_fewer=_ALLOW_FEWER.value)
    for d, s in summaries.items():
      print(f"{d}: {len(s['runs'])} runs, {len(s['variants'])} variants, "
            f"{len(s['unfinished'])} unfinished", flush=True)

  cli.run(main, config_flags=())
