r"""Tables and figures of the synthetic study, from its records.

``write_report(config, records, workdir, meta)`` writes ``results.json``,
``fig_*.png`` and ``results.md`` (which embeds the figures) in ``workdir``
(``experiments/synthetic.py`` at the end of a study; ``experiments/synthetic_report.py``
rebuilds them from ``records.jsonl``). Means are over seeds; a "±" is the half-width of
the 95% Student-t interval over the n seeds, t_{0.975, n−1} · s/√n (``mean_ci``), said
under every table that has one (``interval_note``); "Δ" columns are paired differences
(same data set and initial draw) between two methods. ``energy_caption`` says, from the
recorded history, why H falls to ≈ 0 after step 0 of the Langevin run drawn.
"""

import json
import os

import numpy as np
from scipy import stats

from coulomb_jax import repulsion
from experiments.common import provenance

BASELINES = ('logreg', 'rbf_svm', 'mkl')


SELECTED = 'coulomb λ*'
"""The label of the learned particles with λ chosen on validation per data set."""
# Every figure ``figures`` may draw, and with them every file ``write_report`` writes in
# the workdir (checked before the study or its report writes any: ``OUTPUTS``).
FIGURES = ('fig_accuracy_vs_noise.png', 'fig_accuracy_vs_budget.png', 'fig_lambda_ablation.png',
           'fig_energy_vs_step.png')
OUTPUTS = ('results.json', 'results.md') + FIGURES


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


def seeds_text(ns) -> str:
  """``'n = 2 seeds'`` (or ``'n = 1–3 seeds'``) for the seed counts ``ns`` of some cells."""
  ns = sorted(set(ns))
  if not ns:
    return 'no seeds'
  n = f'{ns[0]}' if len(ns) == 1 else f'{ns[0]}–{ns[-1]}'
  return f"n = {n} seed{'s' * (ns[-1] != 1)}"


def interval_note(ns, of='mean') -> str:
  """The line under a table whose cells are ``fmt(mean, half)`` over ``ns`` seeds (one n
  per cell shown): what its ± is, and n.

  ± = t_{0.975, n−1} · s/√n, s the sample standard deviation (ddof = 1) of the n values:
  the half-width of the 95% Student-t interval of the ``of`` (``mean_ci``); no ± at n = 1."""
  with_ci = sorted({n for n in ns if n >= 2})
  if not with_ci:
    return f'No ±: one seed per cell ({seeds_text(ns)}), so no interval.'
  t = ', '.join(f't_{{0.975, {n - 1}}} = {stats.t.ppf(0.975, n - 1):.2f}' for n in with_ci)
  one = '; a cell of one seed has no ±' if 1 in ns else ''
  return (f'± = half-width of the 95% Student-t interval of the {of} over the seeds, '
          f't_{{0.975, n−1}} · s/√n with s the sample std (ddof = 1): {seeds_text(ns)} per '
          f'cell ({t}){one}.')


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

  def table(title, header, rows, ns=None, of='mean'):
    """A markdown table; ``ns``: the seed counts of its ± cells (then a line says what ± is)."""
    out.append(f'\n### {title}\n')
    out.append('| ' + ' | '.join(header) + ' |')
    out.append('|' + '---|' * len(header))
    out.extend('| ' + ' | '.join(row) + ' |' for row in rows)
    if ns is not None:
      out.append('\n' + interval_note(ns, of))

  def cell(lab, i, budget, source=agg, ns=None):
    key = (lab, i, None if lab in BASELINES else budget)
    if key not in source:
      return '–'
    mean, half, n = source[key]
    if ns is not None:
      ns.append(n)
    return fmt(mean, half)

  for title, source in ((f'Test accuracy, N = {top} features (baselines use no budget)', agg),
                        (f'Test F1, N = {top}', f1)):
    ns = []
    table(title, ['σ'] + labels,
          [[f'{s:.3g}'] + [cell(l, i, top, source, ns) for l in labels]
           for i, s in enumerate(noise)], ns)
  if 'coulomb' in config.methods:
    refs = [m for m in ('rff', 'importance') if m in config.methods]
    sizes = sorted({mid, top})
    header = ['σ'] + [f'{l} − {r}, N={n}' for l in learned for r in refs for n in sizes]
    rows, ns = [], []
    for i, s in enumerate(noise):
      diffs = [paired(records, l, r, i, n) for l in learned for r in refs for n in sizes]
      ns += [d[2] for d in diffs if d[2]]
      rows.append([f'{s:.3g}'] + [fmt(*d[:2]) for d in diffs])
    table('Paired accuracy differences (learned − fixed/IS), mean ± 95% CI over seeds',
          header, rows, ns, of='paired difference (same data set and initial draw)')
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
    ns = []
    table(f"Accuracy vs budget at σ = {noise[config.report.noise_index]:.3g}",
          ['N'] + feature_labels,
          [[str(n)] + [cell(l, config.report.noise_index, n, ns=ns) for l in feature_labels]
           for n in budgets], ns)
  if 'coulomb' in config.methods:
    ns = []
    table(f'λ ablation: test accuracy of coulomb at N = {mid}',
          ['σ'] + [f'λ={lam:g}' for lam in lams],
          [[f'{s:.3g}'] + [cell(f'coulomb λ={lam:g}', i, mid, ns=ns) for lam in lams]
           for i, s in enumerate(noise)], ns)
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


def energy_caption(config, hist, key):
  """``(title, caption)`` of ``fig_energy_vs_step``: why H = −A + λW falls to ≈ 0 after
  step 0, in numbers from the run's history.

  ``hist[key]`` (``key`` = ``'N=<N>,lam=<λ>'``) holds per Langevin step t the minibatch
  ``hamiltonian``, ``alignment``, ``repulsion`` at the particles *before* move t (step 0
  is the initial draw) and ``max_move`` = max_k ‖Δω_k‖ of move t; ``hist['N=<N>,lam=0.0']``,
  when recorded, is the run without repulsion from the same draw. When W does not fall
  tenfold in the first move (or λ = 0) there is no drop to explain: ``title`` is ''."""
  h = {k: np.asarray(hist[key][k], np.float64) for k in ('hamiltonian', 'alignment',
                                                         'repulsion', 'max_move')}
  budget, lam = key.split(',')[0], float(key.split('lam=')[1])
  generic = (f'H = −A + λW along one Langevin run ({key}): A on each step\'s minibatch; step '
             't is H at the particles before move t.')
  steps = len(h['hamiltonian'])
  if steps < 2 or lam == 0 or not h['repulsion'][1] < h['repulsion'][0] / 10:
    return '', generic
  s = float(repulsion.resolve_exponent(config.hamiltonian.s, config.data.dim))
  eps = config.hamiltonian.softening
  h0, a0, w0, w1 = h['hamiltonian'][0], h['alignment'][0], h['repulsion'][0], h['repulsion'][1]
  later = slice(1, None)
  tenth = max(1, (steps - 1) // 10)
  first_last = lambda v: (np.mean(v[1:1 + tenth]), np.mean(v[-tenth:]))
  (a_first, a_last), (w_first, w_last) = first_last(h['alignment']), first_last(h['repulsion'])
  without = hist.get(f'{budget},lam=0.0')
  if without is not None and len(without['max_move']) > 1:
    without = (f'; the λ = 0 run from the same draw moves at most {without["max_move"][0]:.3f} '
               f'in its first move and keeps W at {without["repulsion"][1]:.3f}')
  else:
    without = ''
  title = (f'step 0 is the initial draw: H = {h0:.3f}, almost all λW = {lam * w0:.3f}; the '
           f'repulsion spreads the particles in one move\n(W {w0:.3f} → {w1:.4f}), after which '
           'H = −A + λW is the sum of two small terms: ≈ 0')
  caption = (
      f'Why H drops to ≈ 0 after step 0: step 0 is H at the initial draw (the RFF '
      f'frequencies, before any move), where the particles are close together on the scale '
      f'of the Riesz kernel g_s(r) = (r² + ε²)^(−s/2), s = p − 2 = {s:g}, ε = {eps:g}: '
      f'W = {w0:.3f}, so H = −A + λW = {h0:.3f} is almost all λW = {lam * w0:.3f} '
      f'(λ = {lam:g}, A = {a0:.3f}). The repulsion\'s drift pushes the particles apart in '
      f'the first move (largest move {h["max_move"][0]:.2f}, against a median '
      f'{np.median(h["max_move"][later]):.3f} for the later moves{without}), W falls to '
      f'{w1:.4f}, and from then on H = −A + λW is the sum of two small terms (medians over '
      f'the later steps: A = {np.median(h["alignment"][later]):.3f}, '
      f'λW = {lam * np.median(h["repulsion"][later]):.4f}): ≈ 0 on the scale of step 0. '
      f'After that H follows −A (means of the first and of the last tenth of the later '
      f'steps: A {a_first:.3f} → {a_last:.3f}, λW {lam * w_first:.4f} → {lam * w_last:.4f}).')
  return title, caption


def energy_key(config, hist):
  """The run of ``hist`` (``'N=<N>,lam=<λ>'`` → its history) that ``fig_energy_vs_step``
  draws: N = the largest budget, λ = 0.5 if recorded, else the last key."""
  top = list(config.features.budgets)[-1]
  return f'N={top},lam=0.5' if f'N={top},lam=0.5' in hist else sorted(hist)[-1]


def figures(config, records, workdir, hist=None):
  """Draws the ``fig_*.png`` of the study in ``workdir``; returns ``(paths, energy caption
  or None)``. The energy figure draws ``hist`` (the Langevin histories, ``energy_key``),
  by default ``<workdir>/histories.json`` when it exists."""
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
  band_n = f'band: 95% t-interval over {seeds_text(v[2] for v in agg.values())}'
  ax.set(xscale='log', xlabel='label noise σ', ylabel='test accuracy',
         title=f'Accuracy vs noise (N = {top}; {band_n})')
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
         title=f'Accuracy vs budget (σ = {noise[i0]:.3g}; {band_n})')
  log_ticks(ax, budgets, str)
  ax.legend(fontsize=7)
  paths.append(_save(fig, workdir, 'fig_accuracy_vs_budget.png', config))

  lams = list(config.hamiltonian.lams)
  fig, ax = plt.subplots(figsize=(6, 4))
  for i in range(len(noise)):
    if any((f'coulomb λ={lam:g}', i, mid) in agg for lam in lams):
      band(ax, lams, [(f'coulomb λ={lam:g}', i, mid) for lam in lams], f'σ = {noise[i]:.3g}')
  ax.set(xlabel='λ', ylabel='test accuracy', title=f'λ ablation (N = {mid}; {band_n})')
  ax.legend(fontsize=6, ncol=2)
  paths.append(_save(fig, workdir, 'fig_lambda_ablation.png', config))

  hist_path = os.path.join(workdir, 'histories.json')
  caption = None
  if hist is None and os.path.exists(hist_path):
    with open(hist_path) as f:
      hist = json.load(f)
  if hist:
    key = energy_key(config, hist)
    reason, caption = energy_caption(config, hist, key)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
    for ax, name in zip(axes, ('hamiltonian', 'alignment', 'repulsion')):
      ax.plot(hist[key][name])
      ax.set(xlabel='Langevin step', title=name)
    fig.suptitle(f'One run: {key}, σ = {noise[i0]:.3g}, seed 0 (minibatch values)'
                 + (f'\n{reason}' if reason else ''), fontsize=9)
    paths.append(_save(fig, workdir, 'fig_energy_vs_step.png', config))
  return paths, caption


def smoke_label(config):
  """The banner of a smoke-sized study's figures ('' for a real study)."""
  if not config.report.smoke_run:
    return ''
  seeds = f"{config.num_seeds} seed{'s' * (config.num_seeds != 1)}"
  return f'quick variant: smoke run, {seeds} — not results'


def _save(fig, workdir, name, config):
  """``fig`` to ``<workdir>/<name>``, atomically (a ``.tmp.png`` moved into place; removed
  if the move fails); closes it."""
  banner = smoke_label(config)
  if banner:
    title = fig.get_suptitle()
    fig.suptitle(f'{banner}\n{title}' if title else banner, color='firebrick', fontsize=9)
  fig.tight_layout()
  path = os.path.join(workdir, name)
  import matplotlib.pyplot as plt                    # pylint: disable=g-import-not-at-top
  try:
    fig.savefig(path + '.tmp.png', dpi=90)
    os.replace(path + '.tmp.png', path)
  finally:
    if os.path.lexists(path + '.tmp.png'):
      os.remove(path + '.tmp.png')
    plt.close(fig)
  return path


def run_metadata(module='experiments.synthetic'):
  """``provenance.run_metadata`` with the study as the default module."""
  return provenance.run_metadata(module)


FIGURE_TEXT = {'fig_accuracy_vs_noise.png': 'accuracy vs noise',
               'fig_accuracy_vs_budget.png': 'accuracy vs budget',
               'fig_lambda_ablation.png': 'λ ablation',
               'fig_energy_vs_step.png': 'H, alignment and repulsion along one Langevin run'}
"""The alt text of each figure in results.md."""


def figures_markdown(paths, workdir, energy=None) -> str:
  """The ``## Figures`` section of results.md: each of ``paths`` as a markdown image, its
  path relative to ``workdir`` (where results.md is), the energy figure followed by its
  caption ``energy`` (``energy_caption``)."""
  lines = ['## Figures', '']
  for path in paths:
    name = os.path.basename(path)
    lines.append(f'![{FIGURE_TEXT.get(name, name)}]({os.path.relpath(path, workdir)})')
    lines.append('')
    if name == 'fig_energy_vs_step.png' and energy:
      lines += [energy, '']
  return '\n'.join(lines)


def write_report(config, records, workdir, meta):
  """Writes results.json, the figures and results.md (which links them); returns the
  results dict (with ``figures``, their paths).

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
  results['figures'], energy = figures(config, records, workdir)
  banner = smoke_label(config)
  header = ('# Synthetic study results\n\n' + (f'**{banner}**\n\n' if banner else '')
            + f"Command: `{meta['command']}`  \n"
            f"Commit: {meta['commit']} (records from: {', '.join(meta['record_commits'])})  \n"
            f"Date: {meta['date']}  \n"
            f"Machine: {json.dumps(meta['machine'])}\n")
  provenance.write_atomic(os.path.join(workdir, 'results.md'),
                          header + md + '\n\n' + figures_markdown(results['figures'], workdir,
                                                                  energy) + '\n')
  return results
