r"""Tables and figures of the synthetic study, from its records.

``write_report(config, records, workdir, meta)`` writes ``results.json``,
``results.md`` and ``fig_*.png`` in ``workdir`` (``experiments/synthetic.py`` at
the end of a study; ``experiments/synthetic_report.py`` rebuilds them from
``records.jsonl``). Means are over seeds with 95% Student-t intervals; "Δ" columns
are paired differences (same data set and initial draw) between two methods.
"""

import json
import os

import numpy as np
from scipy import stats

from experiments.common import provenance

BASELINES = ('logreg', 'rbf_svm', 'mkl')


SELECTED = 'coulomb λ*'
"""The label of the learned particles with λ chosen on validation per data set."""


def label(r):
  return f"coulomb λ={r['lam']:g}" if r['method'] == 'coulomb' else r['method']


def with_selected_lambda(records):
  """Adds, per (σ, seed, N), the coulomb record whose λ has the best validation accuracy."""
  best = {}
  for r in records:
    if r['method'] == 'coulomb':
      key = (r['noise_index'], r['seed'], r['budget'])
      if key not in best or r['val_accuracy'] > best[key]['val_accuracy']:
        best[key] = r
  return records + [{**r, 'method': SELECTED, 'selected_lam': r['lam']} for r in best.values()]


def mean_ci(values):
  v = np.asarray(values, np.float64)
  if len(v) < 2:
    return float(v.mean()), float('nan'), len(v)
  half = stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
  return float(v.mean()), float(half), len(v)


def fmt(mean, half, digits=3):
  return f'{mean:.{digits}f}' if np.isnan(half) else f'{mean:.{digits}f} ± {half:.{digits}f}'


def _select(records, metric='test_accuracy', **match):
  """{(label, noise_index, budget, seed): value} of the records that match."""
  out = {}
  for r in records:
    if metric in r and all(r.get(k) == v for k, v in match.items()):
      out[(label(r), r['noise_index'], r.get('budget'), r['seed'])] = r[metric]
  return out


def aggregate(records, metric='test_accuracy'):
  """{(label, noise_index, budget): (mean, ci95 half-width, n)} over seeds."""
  groups = {}
  for (lab, i, budget, _), v in _select(records, metric).items():
    groups.setdefault((lab, i, budget), []).append(v)
  return {k: mean_ci(v) for k, v in groups.items()}


def paired(records, a, b, noise_index, budget):
  """Mean ± CI of (a − b) over seeds with both; a, b are labels."""
  vals = _select(records)
  seeds = {s for (lab, i, n, s) in vals if lab == a and i == noise_index and n == budget}
  diffs = [vals[(a, noise_index, budget, s)] - vals[(b, noise_index, budget, s)]
           for s in sorted(seeds) if (b, noise_index, budget, s) in vals]
  return mean_ci(diffs) if diffs else (float('nan'), float('nan'), 0)


def cell_summary(cell_records):
  """Each method's validation accuracy at its best budget, on one line."""
  best = {}
  for r in cell_records:
    best[label(r)] = max(best.get(label(r), 0.0), r['val_accuracy'])
  return 'best validation accuracy: ' + ' '.join(f'{k} {v:.3f}' for k, v in best.items())


def tables(config, records):
  """The markdown tables, as one string."""
  agg = aggregate(records)
  f1 = aggregate(records, 'test_f1')
  noise = config.data.noise_levels
  budgets = list(config.features.budgets)
  top, mid = budgets[-1], config.report.ablation_budget
  lams = list(config.hamiltonian.lams)
  learned = [SELECTED] + [f'coulomb λ={lam:g}' for lam in lams if lam in (0.5, 0.0)]
  labels = [m for m in BASELINES if m in config.methods]
  labels += [m for m in ('rff', 'importance') if m in config.methods]
  labels += learned if 'coulomb' in config.methods else []
  out = []

  def table(title, header, rows):
    out.append(f'\n### {title}\n')
    out.append('| ' + ' | '.join(header) + ' |')
    out.append('|' + '---|' * len(header))
    out.extend('| ' + ' | '.join(row) + ' |' for row in rows)

  def cell(lab, i, budget, source=agg):
    key = (lab, i, None if lab in BASELINES else budget)
    return fmt(*source[key][:2]) if key in source else '–'

  for title, source in ((f'Test accuracy, N = {top} features (baselines use no budget)', agg),
                        (f'Test F1, N = {top}', f1)):
    table(title, ['σ'] + labels,
          [[f'{s:.3g}'] + [cell(l, i, top, source) for l in labels] for i, s in enumerate(noise)])
  if 'coulomb' in config.methods:
    refs = [m for m in ('rff', 'importance') if m in config.methods]
    sizes = sorted({mid, top})
    header = ['σ'] + [f'{l} − {r}, N={n}' for l in learned for r in refs for n in sizes]
    rows = []
    for i, s in enumerate(noise):
      rows.append([f'{s:.3g}'] + [fmt(*paired(records, l, r, i, n)[:2])
                                  for l in learned for r in refs for n in sizes])
    table('Paired accuracy differences (learned − fixed/IS), mean ± 95% CI over seeds',
          header, rows)
  feature_labels = [m for m in labels if m not in BASELINES]
  if mid in budgets and mid != top and feature_labels:
    rows = []
    for i, s in enumerate(noise):
      rows.append([f'{s:.3g}'] + [
          f"{agg[(l, i, mid)][0] / agg[(l, i, top)][0]:.3f}"
          if (l, i, mid) in agg and (l, i, top) in agg else '–' for l in feature_labels])
    table(f'Retention: accuracy at N = {mid} / accuracy at N = {top}', ['σ'] + feature_labels,
          rows)
  if feature_labels:
    table(f"Accuracy vs budget at σ = {noise[config.report.noise_index]:.3g}",
          ['N'] + feature_labels,
          [[str(n)] + [cell(l, config.report.noise_index, n) for l in feature_labels]
           for n in budgets])
  if 'coulomb' in config.methods:
    table(f'λ ablation: test accuracy of coulomb at N = {mid}',
          ['σ'] + [f'λ={lam:g}' for lam in lams],
          [[f'{s:.3g}'] + [cell(f'coulomb λ={lam:g}', i, mid) for lam in lams]
           for i, s in enumerate(noise)])
    secs = aggregate(records, 'seconds')
    table('Kernel-learning wall time (s, after compilation), mean over σ and seeds',
          ['N'] + [l for l in feature_labels if l != 'rff'],
          [[str(n)] + [f"{np.mean([secs[(l, i, n)][0] for i in range(len(noise)) if (l, i, n) in secs]):.3f}"
                       for l in feature_labels if l != 'rff'] for n in budgets])
  return '\n'.join(out)


def accuracy_band(mean, half):
  """(lower, upper) of mean ± half clipped to [0, 1]: a t-interval over 2 seeds can leave it."""
  mean, half = np.asarray(mean, np.float64), np.nan_to_num(np.asarray(half, np.float64))
  return np.clip(mean - half, 0.0, 1.0), np.clip(mean + half, 0.0, 1.0)


def figures(config, records, workdir):
  import matplotlib                                  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt                    # pylint: disable=g-import-not-at-top
  from matplotlib import ticker                      # pylint: disable=g-import-not-at-top
  agg = aggregate(records)
  noise = np.asarray(config.data.noise_levels)
  budgets = list(config.features.budgets)
  top, mid = budgets[-1], config.report.ablation_budget
  labs = sorted({label(r) for r in records})
  paths = []

  def band(ax, xs, keys, name, color=None):
    pts = [(x, agg[k]) for x, k in zip(xs, keys) if k in agg]
    if not pts:
      return
    x = np.array([p[0] for p in pts])
    m = np.array([p[1][0] for p in pts])
    h = np.array([p[1][1] for p in pts])
    line, = ax.plot(x, m, marker='o', label=name, color=color)
    ax.fill_between(x, *accuracy_band(m, h), alpha=0.15, color=line.get_color())

  def log_ticks(ax, values, fmt):
    """Ticks at the values used, labelled once: no minor labels over them."""
    ax.set_xticks(values, [fmt(v) for v in values])
    ax.xaxis.set_minor_locator(ticker.NullLocator())

  # The main figures show the baselines, the fixed maps and three learned rows; every
  # λ is in the ablation figure.
  labs = [l for l in labs if not l.startswith('coulomb λ=') or l in ('coulomb λ=0',
                                                                      'coulomb λ=0.5')]
  colors = dict(zip(labs, plt.get_cmap('tab10').colors))
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for lab in labs:
    budget = None if lab in BASELINES else top
    band(ax, noise, [(lab, i, budget) for i in range(len(noise))], lab, colors[lab])
  ax.set(xscale='log', xlabel='label noise σ', ylabel='test accuracy',
         title=f'Accuracy vs noise (N = {top}; 95% CI over seeds)')
  if len(noise) <= 5:
    log_ticks(ax, noise, lambda v: f'{v:.2g}')
  ax.legend(fontsize=7)
  paths.append(_save(fig, workdir, 'fig_accuracy_vs_noise.png', config))

  i0 = config.report.noise_index
  fig, ax = plt.subplots(figsize=(6, 4))
  for lab in labs:
    if lab not in BASELINES:
      band(ax, budgets, [(lab, i0, n) for n in budgets], lab, colors[lab])
  ax.set(xscale='log', xlabel='features N', ylabel='test accuracy',
         title=f'Accuracy vs budget (σ = {noise[i0]:.3g})')
  log_ticks(ax, budgets, str)
  ax.legend(fontsize=7)
  paths.append(_save(fig, workdir, 'fig_accuracy_vs_budget.png', config))

  lams = list(config.hamiltonian.lams)
  fig, ax = plt.subplots(figsize=(6, 4))
  for i in range(len(noise)):
    if any((f'coulomb λ={lam:g}', i, mid) in agg for lam in lams):
      band(ax, lams, [(f'coulomb λ={lam:g}', i, mid) for lam in lams], f'σ = {noise[i]:.3g}')
  ax.set(xlabel='λ', ylabel='test accuracy', title=f'λ ablation (N = {mid})')
  ax.legend(fontsize=6, ncol=2)
  paths.append(_save(fig, workdir, 'fig_lambda_ablation.png', config))

  hist_path = os.path.join(workdir, 'histories.json')
  if os.path.exists(hist_path):
    with open(hist_path) as f:
      hist = json.load(f)
    key = f'N={top},lam=0.5' if f'N={top},lam=0.5' in hist else sorted(hist)[-1]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, name in zip(axes, ('hamiltonian', 'alignment', 'repulsion')):
      ax.plot(hist[key][name])
      ax.set(xlabel='Langevin step', title=name)
    fig.suptitle(f'One run: {key}, σ = {noise[i0]:.3g}, seed 0 (minibatch values)')
    paths.append(_save(fig, workdir, 'fig_energy_vs_step.png', config))
  return paths


def smoke_label(config):
  """The banner of a smoke-sized study's figures ('' for a real study)."""
  if not config.report.smoke_run:
    return ''
  seeds = f"{config.num_seeds} seed{'s' * (config.num_seeds != 1)}"
  return f'quick variant: smoke run, {seeds} — not results'


def _save(fig, workdir, name, config):
  banner = smoke_label(config)
  if banner:
    title = fig.get_suptitle()
    fig.suptitle(f'{banner}\n{title}' if title else banner, color='firebrick', fontsize=9)
  fig.tight_layout()
  path = os.path.join(workdir, name)
  fig.savefig(path, dpi=90)
  import matplotlib.pyplot as plt                    # pylint: disable=g-import-not-at-top
  plt.close(fig)
  return path


def run_metadata(module='experiments.synthetic'):
  """``provenance.run_metadata`` with the study as the default module."""
  return provenance.run_metadata(module)


def write_report(config, records, workdir, meta):
  """Writes results.json, results.md and the figures; returns the results dict.

  ``meta`` (``run_metadata()`` of the run that produced the records) is copied
  into both files, so a rebuilt report keeps the run's command and commit.
  """
  meta = dict(meta, record_commits=sorted({r.get('commit', 'unknown') for r in records}))
  records = with_selected_lambda(records)
  md = tables(config, records)
  results = {**meta, 'config': config.to_dict(),
             'records': [r for r in records if r['method'] != SELECTED],
             'markdown_summary': md}
  provenance.write_json_atomic(os.path.join(workdir, 'results.json'), results, indent=1)
  banner = smoke_label(config)
  header = ('# Synthetic study results\n\n' + (f'**{banner}**\n\n' if banner else '')
            + f"Command: `{meta['command']}`  \n"
            f"Commit: {meta['commit']} (records from: {', '.join(meta['record_commits'])})  \n"
            f"Date: {meta['date']}  \n"
            f"Machine: {json.dumps(meta['machine'])}\n")
  provenance.write_atomic(os.path.join(workdir, 'results.md'), header + md + '\n')
  results['figures'] = figures(config, records, workdir)
  return results
