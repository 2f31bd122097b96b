r"""The Zoology-protocol block of ``docs/recall.md`` from the grid's results files.

``write(results_files, page, figure_path)`` reads every ``results/mqar_zoology*.json`` given
(the CPU grid's, the GPU grid's; each row keeps where it ran), draws test accuracy at answer
positions against the learning rate, one panel per (cell, width), one line per method (the
mean over the seeds run at that rate, a bar from the lowest to the highest seed; the
Langevin methods at the η chosen with the rate on seed 0's validation batch), then
accuracy at the chosen rate against the state size (Zoology's recall–memory view), the
validation curves of the runs that kept one, and the Coulomb pair's paired differences per
seed with their mean and interval (``coulomb_figure``), and replaces
the ``mqar_zoology`` block of the page with the best-rate table (``zoology.zoology_best``, per
file), the chance level 1/P, what has not run, and the runs' commands, commits and machines,
then the Coulomb pair across files at each (schedule, η) of its Langevin step
(``step_lines``).
"""

import collections
import json
import os
from typing import Sequence

import numpy as np

from experiments.analysis import intervals
from experiments.analysis import plots
from experiments.common import page_block
from experiments.recall import methods
from experiments.recall import page as page_lib
from experiments.recall import zoology

BLOCK = 'mqar_zoology'
FIGURE = 'docs/figures/recall_zoology_accuracy_vs_rate.png'


def _beside(figure_path: str, what: str) -> str:
  """``figure_path`` with its ``_vs_rate`` turned into ``_vs_<what>`` (else ``_<what>``
  added)."""
  head, name = os.path.split(figure_path)
  stem, ext = os.path.splitext(name)
  stem = (stem[:-len('_vs_rate')] + '_vs_' + what if stem.endswith('_vs_rate')
          else stem + '_' + what)
  return os.path.join(head, stem + ext)


def state_figure_path(figure_path: str) -> str:
  """Where the recall–state-size figure goes: beside ``figure_path``, its ``_vs_rate``
  turned into ``_vs_state`` (else ``<name>_state.png``)."""
  return _beside(figure_path, 'state')


def curve_figure_path(figure_path: str) -> str:
  """Where the validation-curve figure goes: beside ``figure_path``, its ``_vs_rate``
  turned into ``_vs_step`` (else ``<name>_step.png``)."""
  return _beside(figure_path, 'step')


def coulomb_figure_path(figure_path: str) -> str:
  """Where the Coulomb-pair figure goes: beside ``figure_path``, its ``_accuracy_vs_rate``
  turned into ``_coulomb_pair`` (else ``<name>_coulomb_pair.png``)."""
  head, name = os.path.split(figure_path)
  stem, ext = os.path.splitext(name)
  if stem.endswith('_accuracy_vs_rate'):
    stem = stem[:-len('_accuracy_vs_rate')]
  return os.path.join(head, stem + '_coulomb_pair' + ext)


def _load(path: str) -> dict:
  with open(path) as f:
    table = json.load(f)
  if not isinstance(table, dict) or 'runs' not in table or 'protocol' not in table:
    raise ValueError(f'{path}: not a results file of the zoology grid (no runs/protocol).')
  return table


def _label(path: str, table: dict) -> str:
  p = table['protocol']
  return f'{p["where"]}, {p["steps"]} steps ({os.path.basename(path)})'


def _chosen(rows, best):
  """The rows at each method's chosen (rate, η) of ``best`` (the others: other rates)."""
  entry = best.get(f'{rows[0]["seq_len"]}/{rows[0]["num_pairs"]}/{rows[0]["width"]}/'
                   f'{rows[0]["method"]}')
  if entry is None or 'particle_step_size' not in entry:
    return rows
  return [r for r in rows if r.get('particle_step_size') == entry['particle_step_size']]


def figure(tables, path: str) -> str:
  """Accuracy against the learning rate; one panel per (cell, width) of any file."""
  plt = plots.pyplot()
  cells = sorted({(r['seq_len'], r['num_pairs'], r['width']) for _, t in tables
                  for r in t['runs']})
  fig, axes = plt.subplots(1, len(cells), figsize=(5 * len(cells) + 2, 3.8), squeeze=False)
  used = {}
  for ax, (seq_len, pairs, width) in zip(axes[0], cells):
    for f, (label, table) in enumerate(tables):
      for method in methods.METHODS:
        group = [r for r in table['runs'] if (r['seq_len'], r['num_pairs'], r['width'],
                                              r['method']) == (seq_len, pairs, width, method)]
        if not group:
          continue
        by_rate = collections.defaultdict(list)
        for r in _chosen(group, table['best']):
          by_rate[r['learning_rate']].append(r['accuracy'])
        xs = sorted(by_rate)
        mean = np.array([np.mean(by_rate[x]) for x in xs])
        low = mean - np.array([min(by_rate[x]) for x in xs])
        high = np.array([max(by_rate[x]) for x in xs]) - mean
        color = used[method] = page_lib.method_color(method)
        ax.errorbar(xs, mean, yerr=[low, high], color=color, marker='os^'[f % 3],
                    linestyle=('-', '--', '-.')[f % 3], capsize=2, markersize=4,
                    mfc='none' if f % 2 else color)
    ax.axhline(1.0 / pairs, color='grey', linewidth=0.8, linestyle=':')
    ax.set_xscale('log')
    ax.set_xlabel('AdamW learning rate')
    ax.set_ylabel('test accuracy at answer positions')
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f'L = {seq_len}, {pairs} pairs, width {width} (dotted: 1/P)')
  handles = ([Line2D([], [], color=c, marker='o', label=m) for m, c in used.items()]
             + [Line2D([], [], color='black', linestyle=('-', '--', '-.')[f % 3],
                             marker='os^'[f % 3], mfc='none' if f % 2 else 'black',
                             label=label) for f, (label, _) in enumerate(tables)])
  axes[0][-1].legend(handles=handles, fontsize=6, loc='center left', bbox_to_anchor=(1.0, 0.5))
  fig.tight_layout()
  return plots.save(fig, path)


def state_figure(tables, path: str) -> str:
  """Zoology's recall–memory view: each method's accuracy at its chosen rate (mean over the
  seeds run there, a bar from the lowest to the highest seed) against its state size per
  layer (``methods.state_size``: features × head dim summed over heads; softmax 2·L·E); one
  panel per cell, widths side by side on the x axis, one marker per results file."""
  plt = plots.pyplot()
  cells = sorted({(r['seq_len'], r['num_pairs']) for _, t in tables for r in t['runs']})
  fig, axes = plt.subplots(1, len(cells), figsize=(5 * len(cells) + 2, 3.8), squeeze=False)
  used = {}
  for ax, (seq_len, pairs) in zip(axes[0], cells):
    for f, (_, table) in enumerate(tables):
      state = {(r['width'], r['method']): r['state_size'] for r in table['runs']
               if (r['seq_len'], r['num_pairs']) == (seq_len, pairs)}
      for key, entry in table['best'].items():
        k_len, k_pairs, width, method = key.split('/')
        if (int(k_len), int(k_pairs)) != (seq_len, pairs):
          continue
        color = used[method] = page_lib.method_color(method)
        rows = [r for r in _chosen([r for r in table['runs']
                                    if (r['seq_len'], r['num_pairs'], r['width'],
                                        r['method']) == (seq_len, pairs, int(width), method)],
                                   table['best'])
                if r['learning_rate'] == entry['learning_rate']]
        acc = [r['accuracy'] for r in rows]
        mean = entry['accuracy']['mean']
        ax.errorbar([state[(int(width), method)]], [mean],
                    yerr=[[mean - min(acc)], [max(acc) - mean]], color=color,
                    marker='os^'[f % 3], capsize=2, markersize=5,
                    mfc='none' if f % 2 else color, linestyle='none')
    ax.axhline(1.0 / pairs, color='grey', linewidth=0.8, linestyle=':')
    ax.set_xscale('log', base=2)
    ax.set_xlabel('state size per layer (floats; softmax: 2·L·E)')
    ax.set_ylabel('test accuracy at the chosen rate')
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f'L = {seq_len}, {pairs} pairs (dotted: 1/P)')
  handles = ([Line2D([], [], color=c, marker='o', linestyle='none', label=m)
              for m, c in used.items()]
             + [Line2D([], [], color='black', linestyle='none', marker='os^'[f % 3],
                       mfc='none' if f % 2 else 'black', label=label)
                for f, (label, _) in enumerate(tables)])
  axes[0][-1].legend(handles=handles, fontsize=6, loc='center left', bbox_to_anchor=(1.0, 0.5))
  fig.tight_layout()
  return plots.save(fig, path)


def curve_panels(tables) -> list:
  """``[(label, (seq_len, num_pairs, width), rows)]``: per results file and cell, the runs
  that kept a validation curve (``valid_curve``), in file order."""
  panels = []
  for label, table in tables:
    rows = [r for r in table['runs'] if r.get('valid_curve')]
    for cell in sorted({(r['seq_len'], r['num_pairs'], r['width']) for r in rows}):
      panels.append((label, cell, [r for r in rows
                                   if (r['seq_len'], r['num_pairs'], r['width']) == cell]))
  return panels


def curve_figure(panels, path: str) -> str:
  """Validation accuracy against the training step of every run in ``panels``
  (``curve_panels``): one colour per method, one line style per learning rate, one
  marker per seed; dotted: 1/P."""
  plt = plots.pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels) + 2, 3.8), squeeze=False)
  used, rates, seeds = {}, {}, {}
  for ax, (label, (seq_len, pairs, width), rows) in zip(axes[0], panels):
    for r in sorted(rows, key=lambda r: (r['method'], r['learning_rate'], r['seed'])):
      color = used[r['method']] = page_lib.method_color(r['method'])
      k = rates.setdefault(r['learning_rate'], len(rates))
      m = seeds.setdefault(r['seed'], len(seeds))
      c = r['valid_curve']
      ax.plot(c['step'], c['accuracy'], color=color, linestyle=('-', '--', ':', '-.')[k % 4],
              marker='os^dv'[m % 5], markersize=3, linewidth=1)
    ax.axhline(1.0 / pairs, color='grey', linewidth=0.8, linestyle=':')
    ax.set_xlabel('training step')
    ax.set_ylabel('validation accuracy at answer positions')
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f'L = {seq_len}, {pairs} pairs, width {width}\n({label})', fontsize=8)
  handles = ([Line2D([], [], color=c, label=m) for m, c in used.items()]
             + [Line2D([], [], color='black', linestyle=('-', '--', ':', '-.')[k % 4],
                       label=f'rate {lr:g}') for lr, k in rates.items()]
             + [Line2D([], [], color='black', linestyle='none', marker='os^dv'[m % 5],
                       label=f'seed {s}') for s, m in seeds.items()])
  axes[0][-1].legend(handles=handles, fontsize=6, loc='center left', bbox_to_anchor=(1.0, 0.5))
  fig.tight_layout()
  return plots.save(fig, path)


def coulomb_points(tables) -> list:
  """``[(label, (seq_len, num_pairs, width), {seed: difference}, effect)]``: per results
  file and cell with a ``coulomb_effect`` of one seed or more, the paired differences
  (first method − second) at each method's chosen rate and η, as ``zoology.coulomb_effect``
  chose them (its ``by_seed``: the seeds its mean is over)."""
  points = []
  for label, table in tables:
    for cell, effect in table.get('coulomb_effect', {}).items():
      if effect['seeds']:
        points.append((label, tuple(int(x) for x in cell.split('/')),
                       {int(s): d for s, d in effect['by_seed'].items()}, effect))
  return points


def coulomb_figure(points, path: str) -> str:
  """Whether the Coulomb terms change recall: per results file and cell (``coulomb_points``),
  the paired difference of every seed (a marker per seed) and their mean with its 95%
  interval over seeds (black; a bar from two seeds on; the axis stops at ±1.05, a longer
  bar runs off it); dashed: no change."""
  plt = plots.pyplot()
  fig, ax = plt.subplots(figsize=(1.9 * len(points) + 2.5, 3.8))
  seeds = {}
  for i, (_, _, diffs, effect) in enumerate(points):
    for s in sorted(diffs):
      m = seeds.setdefault(s, len(seeds))
      ax.plot([i + 0.15], [diffs[s]], linestyle='none', marker='os^dv'[m % 5], color='grey',
              mfc='none', markersize=5)
    mean, ci = effect['difference']['mean'], effect['interval_95']
    yerr = [[mean - ci[0]], [ci[1] - mean]] if ci else None
    ax.errorbar([i], [mean], yerr=yerr, color='black', marker='D', markersize=5, capsize=3)
  ax.axhline(0.0, color='grey', linewidth=0.8, linestyle='--')
  ticks = []
  for label, (seq_len, pairs, width), _, _ in points:
    where, _, source = label.partition(' (')          # 'cpu, 3000 steps', 'file.json)'
    ticks.append(f'L = {seq_len}, {pairs} pairs, width {width}\n{where}\n({source}')
  ax.set_xticks(range(len(points)))
  ax.set_xticklabels(ticks, fontsize=6)
  ax.set_xlim(-0.5, len(points) - 0.5)
  ax.set_ylim(-1.05, 1.05)
  first, second = points[0][3]['methods']
  ax.set_ylabel(f'test accuracy, {first} − {second}\n(paired by seed)', fontsize=8)
  ax.set_title('The Coulomb terms (repulsion and noise) against plain gradient flow', fontsize=9)
  handles = ([Line2D([], [], color='black', marker='D', label='mean, 95% interval')]
             + [Line2D([], [], color='grey', linestyle='none', marker='os^dv'[m % 5],
                       mfc='none', label=f'seed {s}') for s, m in seeds.items()])
  ax.legend(handles=handles, fontsize=6, loc='center left', bbox_to_anchor=(1.0, 0.5))
  fig.tight_layout()
  return plots.save(fig, path)


def Line2D(*args, **kwargs):  # pylint: disable=invalid-name
  """A legend handle (matplotlib imported only when a figure is drawn)."""
  from matplotlib import lines  # pylint: disable=g-import-not-at-top
  return lines.Line2D(*args, **kwargs)


def coulomb_lines(effect: dict) -> list:
  """One line per cell of ``zoology.coulomb_effect``: what the repulsion and the noise change."""
  if not effect:
    return []
  first, second = next(iter(effect.values()))['methods']
  lines = ['', f'Coulomb terms: {first} − {second}, paired by seed at each one\'s chosen '
           'rate (95% interval over seeds; none below two seeds), at seed 0 rate by rate, '
           'and paired by seed at any other rate both ran at two or more seeds:']
  for cell, e in effect.items():
    seq_len, pairs, width = cell.split('/')
    d, ci = e['difference'], e['interval_95']
    if d['mean'] is None:
      continue
    where = f'[{ci[0]:+.3f}, {ci[1]:+.3f}]' if ci else 'no interval'
    rates = ', '.join(f'{lr} {v:+.3f}' for lr, v in e['seed0_by_rate'].items())
    chosen = {f'{lr:g}' for lr in e['learning_rates']}
    fixed = ''.join(
        f'; paired by seed at {lr}: {a["difference"]["mean"]:+.3f} (n = '
        f'{a["difference"]["n"]}, [{a["interval_95"][0]:+.3f}, {a["interval_95"][1]:+.3f}])'
        for lr, a in e.get('by_rate', {}).items() if chosen != {lr})
    ratio = ', '.join(f'{x:.3g}' for x in e['calibration'].get('force_ratio', []))
    lines.append(f'- L = {seq_len}, {pairs} pairs, width {width}: {d["mean"]:+.3f} '
                 f'(n = {d["n"]}, {where}); seed 0 by rate: {rates}{fixed}; repulsion / '
                 f'target force at step 0 (over seeds, lowest first): '
                 f'{ratio or "not recorded"}.')
  return lines


def step_lines(tables) -> list:
  """The particles' Langevin step across results files: wherever the Coulomb pair
  (``zoology.COULOMB_PAIR``) ran at one (cell, width, steps, rate, platform) with more than
  one (schedule, η) — one grid per corner: ``zoology_long``, ``zoology_long_annealed`` and
  the two fixed-η grids — a table of each method's test accuracy by seed at each corner,
  and its paired difference by seed from the first corner (constant before cosine, then
  the smaller η), mean with its 95% interval over the seeds both ran
  (``intervals.seed_interval``; none below two seeds)."""
  groups = {}
  for label, table in tables:
    source = label.partition(' (')[2].rstrip(')')
    for r in table['runs']:
      if r['method'] not in zoology.COULOMB_PAIR or 'particle_step_size' not in r:
        continue
      key = (r['seq_len'], r['num_pairs'], r['width'],
             r.get('steps', table.get('protocol', {}).get('steps')), r['learning_rate'],
             r.get('machine', {}).get('platform', 'cpu'))
      corner = groups.setdefault(key, {}).setdefault(
          (r.get('particle_schedule', 'constant'), r['particle_step_size']),
          {'sources': set(), **{m: {} for m in zoology.COULOMB_PAIR}})
      corner['sources'].add(source)
      corner[r['method']].setdefault(r['seed'], r['accuracy'])
  lines = []
  for key, corners in sorted(groups.items()):
    if len(corners) < 2:
      continue
    if not lines:
      lines = ['', "**The particles' Langevin step**: the Coulomb pair across results files "
               'at each (schedule, η) it ran with; test accuracy by seed, mean ± sd, and '
               'the paired difference by seed from the first row (95% interval over '
               'seeds; none below two seeds).']
    seq_len, pairs, width, steps, lr, platform = key
    head = ' | '.join(f'{m} by seed | mean ± sd (n) | − first row' for m in zoology.COULOMB_PAIR)
    lines += ['', f'L = {seq_len}, {pairs} pairs, width {width}, {steps} steps, rate {lr:g} '
              f'({platform}):', '', f'| schedule | η | {head} | file |',
              '|---|---|' + '---|---|---|' * len(zoology.COULOMB_PAIR) + '---|']
    order = sorted(corners)
    first = corners[order[0]]
    for schedule, eta in order:
      corner, cells = corners[(schedule, eta)], []
      for m in zoology.COULOMB_PAIR:
        acc = corner[m]
        seeds = ', '.join(f'{s}: {acc[s]:.3f}' for s in sorted(acc))
        vals = list(acc.values())
        spread = (f'{np.mean(vals):.3f} ± {zoology.seed_std(vals):.3f} ({len(vals)})'
                  if vals else '')
        paired = sorted(set(acc) & set(first[m]))
        diff = ''
        if corner is not first and paired:
          d = [acc[s] - first[m][s] for s in paired]
          ci = intervals.seed_interval({'mean': float(np.mean(d)),
                                        'std': zoology.seed_std(d), 'n': len(d)})
          diff = f'{np.mean(d):+.3f} ' + (f'[{ci[0]:+.3f}, {ci[1]:+.3f}]' if ci
                                           else '(one seed)') + f' (n = {len(d)})'
        cells += [seeds, spread, diff]
      lines.append(f'| {schedule} | {eta:g} | ' + ' | '.join(cells)
                   + f' | {", ".join(sorted(corner["sources"]))} |')
  return lines


def table_lines(tables) -> list:
  lines = []
  for label, table in tables:
    p = table['protocol']
    annealed = p.get('particles', {}).get('schedule', 'constant') != 'constant'
    fixed = p.get('particles', {}).get('step_size')
    lines += [f'**{label}**: vocabulary {p["vocab"]}, {p["train_examples"]} training '
              f'sequences, {p["steps"]} steps of batch {p["batch"]}, {p["schedule"]} '
              f'schedule, early stop at {p["early_stop"]}; learning rates '
              f'{", ".join(f"{x:g}" for x in p["learning_rates"])}'
              + (f'; the particles\' Langevin step η follows a {p["particles"]["schedule"]} '
                 'schedule too' if annealed else '')
              + (f'; η fixed at {fixed:g} in advance (no pilot)' if fixed is not None else '')
              + '.', '',
              '| L | pairs | width | method | state size | rate (η) | accuracy mean ± std (n) '
              '| 1/P | rates tried |', '|---|---|---|---|---|---|---|---|---|']
    state = {(r['seq_len'], r['width'], r['method']): r['state_size'] for r in table['runs']}
    order = {m: i for i, m in enumerate(methods.METHODS)}
    keys = sorted(table['best'], key=lambda k: (int(k.split('/')[2]), int(k.split('/')[0]),
                                                order.get(k.split('/')[3], 99)))
    for key in keys:
      seq_len, pairs, width, method = key.split('/')
      b = table['best'][key]
      eta = f' ({b["particle_step_size"]:g})' if 'particle_step_size' in b else ''
      a = b['accuracy']
      lines.append(f'| {seq_len} | {pairs} | {width} | {method} | '
                   f'{state[(int(seq_len), int(width), method)]} | '
                   f'{b["learning_rate"]:g}{eta} | {a["mean"]:.3f} ± {a["std"]:.3f} ({a["n"]}) '
                   f'| {1 / int(pairs):.3f} | {b["rates_tried"]} |')
    lines += coulomb_lines(table.get('coulomb_effect', {}))
    for failed in table.get('failed_programs', []):
      lines.append(f'\nFailed program `{failed["program"]}`: {failed["error"]}')
    commits = sorted({r.get('commit', 'unknown') for r in table['runs']})
    machines = sorted({json.dumps(r.get('machine', {}), sort_keys=True) for r in table['runs']})
    commands = sorted({r.get('command', '') for r in table['runs']})
    lines += ['', f'{len(table["runs"])} runs. Commits: {", ".join(commits)}.',
              'Commands: ' + '; '.join(f'`{c}`' for c in commands) + '.',
              'Machines: ' + '; '.join(machines) + '.', '']
  lines.append('± is the standard deviation over the seeds run at the chosen rate (ddof 1; '
               '0 for one seed); the rate (and η) is chosen on seed 0\'s validation batch, '
               'the accuracy is on the test batch.')
  return lines


def write(results_files: Sequence[str], page: str, figure_path: str = FIGURE) -> None:
  """The block ``mqar_zoology`` of ``page`` and its figures (``figure_path`` and, beside
  it, ``state_figure_path(figure_path)``; ``curve_figure_path(figure_path)`` where a run
  kept its validation curve; ``coulomb_figure_path(figure_path)`` where a file has the
  Coulomb pair at a cell) from ``results_files``. A file with no finished run yet (a
  grid whose first runs are its pilots) is left out, so the page is the same with or
  without it."""
  tables = [(_label(p, t), t) for p, t in ((p, _load(p)) for p in results_files)
            if t['runs']]
  if not tables:
    raise ValueError(f'results_files: none of {list(results_files)} holds a finished run; '
                     f'nothing to write to {page}.')
  state_path = state_figure_path(figure_path)
  figure(tables, figure_path)
  state_figure(tables, state_path)
  rel = lambda path: os.path.relpath(path, os.path.dirname(page))
  images = [f'![accuracy against the learning rate]({rel(figure_path)})', '',
            f'![accuracy against the state size]({rel(state_path)})', '']
  panels = curve_panels(tables)
  if panels:
    curve_path = curve_figure(panels, curve_figure_path(figure_path))
    images += [f'![validation accuracy against the step]({rel(curve_path)})', '']
  points = coulomb_points(tables)
  if points:
    coulomb_path = coulomb_figure(points, coulomb_figure_path(figure_path))
    images += [f'![the Coulomb terms, paired by seed]({rel(coulomb_path)})', '']
  begin, end = page_lib.markers(BLOCK)
  page_block.write_block(page, begin, end, images + table_lines(tables) + step_lines(tables))
