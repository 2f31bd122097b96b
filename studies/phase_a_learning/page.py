"""The page of ``studies.phase_a_learning`` (``docs/phase_a_learning.md``) and its paired
figures, from the binding JSON alone: per dataset its tables (``dataset_markdown``) and forest
plot (``paired_figure``), then the whole page around the hand-written analysis block
(``page_markdown``). ``command`` writes them after a collection and, with
``--page_from_results``, from the committed JSON; nothing here reads a run.
"""

import json
import os
from typing import Dict, List, Optional

from experiments.analysis import intervals
from experiments.analysis import plots
from experiments.analysis import run_files

METRICS = ('accuracy', 'mcc', 'log_loss', 'brier', 'ece')
LABELS = {'accuracy': 'accuracy', 'mcc': 'MCC', 'log_loss': 'LogLoss', 'brier': 'Brier',
          'ece': 'ECE'}
# A dataset's two figures in --figures: phase_a_learning_<dataset><suffix>.
FIGURES = (('curves', '_alignment.png'), ('paired', '_paired.png'))

COMPARISONS = (('paired_kernel_minus_ball', 'Kernel − Ball (the same ball, no Langevin)'),
               ('paired_kernel_minus_vanilla', 'Kernel − Vanilla'))


def pooled(maps: Dict[str, dict], all_maps: Dict[str, dict]):
  """``(maps, all_maps)`` of a dataset's entry with the intervals pooled within maps added
  (copies; ``intervals.with_intervals`` per map, ``intervals.pooled_mean`` for all maps as
  ``pooled``, its interval also as ``ci95_pooled``): recomputed from the means, stds and
  counts alone, so an entry written before them gets them too."""
  maps = {m: dict(r) for m, r in maps.items()}
  all_maps = {key: dict(p) for key, p in all_maps.items()}
  for key, _ in COMPARISONS:
    rows = intervals.with_intervals({m: r[key] for m, r in maps.items()}, METRICS)
    for m in maps:
      maps[m][key] = rows[m]
    if key in all_maps:
      for k in METRICS:
        pool = intervals.pooled_mean([rows[m][k] for m in rows])
        all_maps[key][k] = {**all_maps[key][k], 'pooled': pool, 'ci95_pooled': pool['ci95'],
                            'df_pooled': pool['df_pooled']}
  return maps, all_maps


def _fmt(x, digits=3):
  return '—' if x is None else f'{x:.{digits}g}'


def _ci(p):
  if p['mean'] is None:
    return '—'
  ci = p['ci95']
  inner = f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else ''
  return f"{p['mean']:+.4f}{inner}"


def dataset_markdown(dataset: str, s: dict, figures: Dict[str, str]) -> str:
  lines = [f'## {dataset}', '',
           f"Settings: `{json.dumps({k: v for k, v in s['settings'].items() if k != 'chosen_by'})}`",
           '']
  if 'chosen_by' in s['settings']:
    c = s['settings']['chosen_by']
    lines += [f"Chosen on validation rows by `{c['pilot']}` (setting `{c['setting']}`; "
              f"{c['rule']}).", '']
  lines += [f"![{alt}]({figures[k]})\n" for k, alt in
            (('curves', 'held-out alignment against Phase A step'),
             ('paired', 'paired differences')) if figures.get(k)]
  lines += ['**Phase A diagnostics** (Kernel-X; medians over seeds; ρ: held-out centered '
            'alignment on validation rows, mean over layers, heads and seeds):', '',
            '| map | drift/noise | repulsion/alignment | Gibbs tilt β·ΔU | moved | noise-only walk '
            '| inside ball | ρ initial | ρ ball | ρ learned | ρ null |', '|' + '---|' * 11]
  for m, r in s['maps'].items():
    h = r['heldout_centered_alignment']
    lines.append(f"| {m} | {_fmt(r['drift_to_noise'])} | {_fmt(r['repulsion_to_alignment'])} | "
                 f"{_fmt(r['gibbs_tilt'])} | {_fmt(r['displacement'])} | "
                 f"{_fmt(r['random_walk_displacement'])} | {_fmt(r['inside_fraction'], 2)} | "
                 + ' | '.join(_fmt(h.get(k), 3) for k in ('initial', 'ball', 'learned', 'null'))
                 + ' |')
  maps, all_maps = pooled(s['maps'], s['all_maps'])
  for key, title in COMPARISONS:
    lines += ['', f'**{title}**, test split, paired by seed: mean [95% t-interval]:', '',
              '| map | ' + ' | '.join(f'Δ {LABELS[k]}' for k in METRICS) + ' | n |',
              '|' + '---|' * (len(METRICS) + 2)]
    for m, r in s['maps'].items():
      p = r[key]
      lines.append(f'| {m} | ' + ' | '.join(_ci(p[k]) for k in METRICS)
                   + f" | {p['accuracy']['n']} |")
    p = s['all_maps'][key]
    lines.append(f"| **all {len(p['maps'])} maps** (per seed, mean over maps) | "
                 + ' | '.join(_ci(p[k]) for k in METRICS) + f" | {p['accuracy']['n']} |")
    rows = {m: r[key] for m, r in maps.items()}
    rows[f"**all {len(p['maps'])} maps**"] = all_maps[key]
    lines += [''] + intervals.interval_table(
        f'{title}: 95% t-intervals with the variance pooled within maps (for all maps '
        'D̄ ± t_{0.975, ν} · s_p · √(Σ 1/n_m) / M), and the wider of the two for Δ accuracy:',
        rows, [(k, LABELS[k]) for k in METRICS], seed_columns=False)[:-1]
  lines += ['', '**Test metrics** (mean ± std over seeds):', '',
            '| map | ' + ' | '.join(f'{v} {LABELS[k]}' for v in ('Kernel', 'Ball', 'Vanilla')
                                     for k in ('accuracy', 'ece')) + ' |',
            '|' + '---|' * 7]
  for m, r in s['maps'].items():
    cells = []
    for kind in ('kernel', 'ball', 'vanilla'):
      for k in ('accuracy', 'ece'):
        t = r['test'][kind][k]
        cells.append('—' if t['mean'] is None else
                     f"{t['mean']:.4f}" + (f" ± {t['std']:.4f}" if t['std'] is not None else ''))
    lines.append(f'| {m} | ' + ' | '.join(cells) + ' |')
  prefix = (f"; their shared Phase B prefix (`run.prefix_from`) trained at "
            f"{', '.join(c[:7] for c in s['prefix_commits'])}" if s['prefix_commits'] else '')
  lines += ['', f"Runs: {s['runs']}, trained at {', '.join(c[:7] for c in s['commits'])}"
            f"{prefix}.", '']
  return '\n'.join(lines)


def paired_figure(path: str, dataset: str, s: dict) -> str:
  """Writes the forest plot of one dataset's entry ``s`` (its maps' and all maps' paired
  differences) to the PNG ``path``; returns ``path``."""
  return plots.paired_figure(
      path, f'{dataset}: Kernel-X in the learning regime',
      {name: {**{m: r[key] for m, r in s['maps'].items()}, 'all maps': s['all_maps'][key]}
       for name, key in (('Kernel − Ball', 'paired_kernel_minus_ball'),
                         ('Kernel − Vanilla', 'paired_kernel_minus_vanilla'))},
      metrics=(('accuracy', 'Δ accuracy'), ('log_loss', 'Δ LogLoss'), ('ece', 'Δ ECE')))


def figure_stem(figures_dir: str, dataset: str) -> str:
  """``<figures_dir>/phase_a_learning_<dataset>``: a figure's path without its ``FIGURES``
  suffix."""
  return os.path.join(figures_dir, f'phase_a_learning_{dataset}')


def existing_figures(figures_dir: str, dataset: str, docs_dir: str) -> Dict[str, str]:
  """``{kind: path relative to docs_dir}`` of the dataset's ``FIGURES`` that exist."""
  stem = figure_stem(figures_dir, dataset)
  return {k: os.path.relpath(stem + suffix, docs_dir) for k, suffix in FIGURES
          if os.path.exists(stem + suffix)}


def page_markdown(result: dict, analysis: str, figures: Dict[str, Dict[str, str]],
                  kept: List[str], runs_out: Optional[str]) -> str:
  """The page from the written JSON ``result`` alone: the title, ``analysis`` (the
  hand-written block), per dataset its figures (``figures[dataset]``: kind → path from the
  page) and tables, and the provenance: ``result``'s command, commit, date and machine,
  the per-run files' folder (``runs_out``; no line when None) and, per dataset of ``kept``,
  the command that made its entry (its ``generated``)."""
  parts = [dataset_markdown(d, s, figures.get(d, {})) for d, s in result['datasets'].items()]
  page = ['# Does Phase A learn inside the Transformer, and does it help?', '', analysis, '',
          *parts, '## Provenance', '',
          f"Generated by `{result['command']}` at `{result['commit']}` ({result['date']}); "
          f"machine {json.dumps(result['machine'])}. Everything outside the analysis block is "
          'rewritten on every run of this command.', '']
  if runs_out:
    page += [run_files.describe(runs_out), '']
  for d in kept:
    g = result['datasets'][d]['generated']
    page += [f"{d}: entry and figures kept (`--keep_others`) from `{g['command']}` at "
             f"`{g['commit']}` ({g['date']}); its runs were not read this time.", '']
  return '\n'.join(page)
