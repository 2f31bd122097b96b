r"""A report's page: its markdown (tables, commands, provenance) and the figures it embeds.

``markdown`` writes the page: the hand-written analysis block first (kept verbatim
between ``<!-- analysis -->`` and ``<!-- /analysis -->``, ``read_analysis``), then per
dataset its section (``dataset_markdown``: the table of every variant and the
reference, the commands, commits, machines and dates, the paired tables with their two
95% intervals, ``experiments.analysis.intervals``) and figures
(``draw_figures``: the forest plot of paired differences and the reliability diagrams
from the runs' pooled test predictions, ``reliability_panels``; drawn by
``experiments.analysis.plots``), then where it came from.
"""

import os
from typing import List, Optional

import numpy as np

from configs import text
from experiments.analysis import intervals
from experiments.analysis import loading
from experiments.analysis import plots
from experiments.analysis import run_files
from experiments.analysis import tables
from experiments.common import cli

TITLES = {'sst2': 'SST-2', 'rotten_tomatoes': 'Rotten Tomatoes', 'qqp_subset': 'QQP subset (20k)',
          'qqp': 'QQP'}
TABLE_COLUMNS = (('accuracy', 'accuracy'), ('f1_macro', 'F1 macro'), ('mcc', 'MCC'),
                 ('roc_auc', 'ROC-AUC'), ('log_loss', 'LogLoss'), ('brier', 'Brier'),
                 ('ece', 'ECE'))
ANALYSIS_START, ANALYSIS_END = '<!-- analysis -->', '<!-- /analysis -->'
PLACEHOLDER = '(analysis to be written)'
RELIABILITY_BINS = 10
RELIABILITY_KINDS = ('kernel', 'vanilla', 'ball')
PAIRED_TITLES = (
    ('paired', 'Paired Kernel-X − Vanilla-X (difference per seed, then mean ± std over seeds):'),
    ('paired_ball', 'Paired Kernel-X − Ball-X (the control: the same ball, no Langevin '
                    'dynamics):'),
    ('paired_ball_vanilla', 'Paired Ball-X − Vanilla-X (what the projection onto the ball '
                            'does by itself):'))
INTERVALS_TITLE = ('The same differences, 95% t-intervals: over each map\'s seeds (seeds) and '
                   'with the variance pooled within maps (pooled):')


# ----------------------------------------------------------------------------- figures

def _pooled(paths, expected_labels):
  """Labels and P(class 1) of several runs, concatenated; every run must hold the same labels."""
  labels, probs = [], []
  for path in paths:
    y, p = loading.load_predictions(path)
    if expected_labels[0] is None:
      expected_labels[0] = (y, path)
    elif not np.array_equal(y, expected_labels[0][0]):
      raise cli.ConfigError(f'{path} and {expected_labels[0][1]} hold different test labels; '
                            'the reliability diagrams compare predictions on one test split.')
    labels.append(y)
    probs.append(p)
  return np.concatenate(labels), np.concatenate(probs), len(paths)


def reliability_panels(runs, reference_predictions: Optional[str] = None) -> dict:
  """``{panel: {curve: (labels, probs, runs)}}`` for ``plots.reliability_figure``.

  One panel per feature map with predictions for Kernel-, Vanilla- or Ball-X, each
  with softmax and the reference as well; a single panel when only those two have
  predictions; ``{}`` when no run has any.
  """
  expected = [None]
  groups = tables.by_variant(runs)
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
    out['paired'] = plots.paired_figure(
        os.path.join(figures_dir, names['paired']), f'{title}: paired differences per map',
        comparisons, maps=maps)
  panels = reliability_panels(runs, reference_predictions)
  if panels:
    out['reliability'] = plots.reliability_figure(
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
  if not s['paired']:
    lines += ['Paired Kernel-X − Vanilla-X: no map has both variants yet.', '']
  for key, title in PAIRED_TITLES:
    if s.get(key):
      lines += _paired_table(title, s[key])
  if figures is not None:
    lines += _figure_lines(s, figures)
  return '\n'.join(lines)


def _figure_lines(s, figures):
  title = TITLES.get(s['dataset'], s['dataset'])
  lines = []
  if figures.get('paired'):
    lines += ['Paired differences per map (Kernel-X − Vanilla-X and Kernel-X − Ball-X; mean '
              'over seeds with its 95% t-interval, a hollow point for one seed):', '',
              f"![{title}: paired differences]({figures['paired']})", '']
  if figures.get('reliability'):
    lines += ['Reliability diagrams on the test split (fraction of class 1 against the mean '
              f'predicted P(class 1) in {RELIABILITY_BINS} equal-width bins; the seeds of a '
              'variant pooled; softmax and the TF-IDF row in every panel):', '',
              f"![{title}: reliability diagrams]({figures['reliability']})", '']
  else:
    lines += [f'Reliability diagrams: no run here saved its per-example test predictions '
              f'(`{loading.PREDICTIONS}`).', '']
  return lines


def _paired_table(title, pairs):
  """Markdown lines of one paired-difference table (title, header, one row per map), then
  its two 95% intervals per map (``intervals.interval_table``; recomputed from the
  summaries' mean, std and n, so a page redrawn from older summaries has them too)."""
  header = ['map'] + [f'Δ {name}' for _, name in tables.PAIRED_METRICS] + ['n pairs']
  lines = [title, '', '| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for fmap, d in pairs.items():
    cells = [fmt(d[k], signed=True) for k, _ in tables.PAIRED_METRICS] + [str(len(d['seeds']))]
    lines.append(f'| {fmap} | ' + ' | '.join(cells) + ' |')
  metrics = [k for k, _ in tables.PAIRED_METRICS]
  return lines + [''] + intervals.interval_table(
      INTERVALS_TITLE, intervals.with_intervals(pairs, metrics), tables.PAIRED_METRICS)


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
    raise cli.ConfigError(f'{docs_path} exists but has no {ANALYSIS_START} … {ANALYSIS_END} '
                          'block; refusing to overwrite it (move it away or add the markers).')
  return old[start:end + len(ANALYSIS_END)]


def markdown(summaries, analysis, meta, figures: Optional[dict] = None,
             redrawn: Optional[dict] = None, kept: Optional[List[str]] = None,
             runs_out: Optional[str] = None) -> str:
  """The page: the (hand-written) analysis first, then per dataset its figures and
  tables, then where it came from (``redrawn``: ``{command, kept_reliability}`` of a
  redraw from the summaries, ``redraw_from_summaries``, named without a date or commit;
  ``kept``: datasets whose summary was kept from an earlier report run,
  ``write_report(keep_others=True)``; ``runs_out``: the folder of the per-run files
  written with it, ``experiments.analysis.run_files``)."""
  parts = ['# Text classification: results', '', analysis, '',
           'Mean ± sample std (ddof = 1) over seeds on the evaluation split; one value when '
           'there is one seed. Train seconds: Phase A + Phase B, evaluation excluded.', '']
  figures = figures or {}
  parts += [dataset_markdown(s, figures.get(d)) for d, s in summaries.items()]
  parts += ['## Provenance', '',
            f"Generated by `{meta['command']}` at `{meta['commit']}` ({meta['date']}). "
            'Everything outside the analysis block is rewritten on every run of the report.', '']
  if runs_out:
    parts += [run_files.describe(runs_out), '']
  for d in kept or []:
    k = summaries[d]
    parts += [f"{TITLES.get(d, d)}: summary `<out>/{d}.json` and figures kept from "
              f"`{k['command']}` at `{k['commit']}` ({k['date']}); its runs were not read "
              'this time.', '']
  if redrawn:
    parts += [f"Page and paired figures redrawn from the summaries above "
              f"(`<out>/<dataset>.json`, tables unchanged) by `{redrawn['command']}`: the same "
              'summaries give the same page and figures, so the redraw adds no date or commit '
              'of its own.' + (
                  ' The reliability diagrams need the runs\' predictions and were not redrawn: '
                  'those shown are the ones the page showed before.'
                  if redrawn.get('kept_reliability') else ''), '']
  return '\n'.join(parts)
