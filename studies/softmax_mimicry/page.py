r"""The figures and tables of ``docs/softmax_mimicry.md`` from the results of
``python -m studies.softmax_mimicry``.

``write_page(table, page, figures)`` draws held-out KL against N (one panel per source
dataset, one line per method, log x; the seed mean, bars = 95% t interval) and the
conversion recovery (bars per method and N, zero-shot and fine-tuned), and replaces the
part of ``page`` between ``BEGIN`` and ``END`` with the figures, the tables and the
provenance. The text outside the markers (the answer, in words) is kept as written.
"""

import json
import os

import numpy as np

from experiments.analysis import plots
from experiments.common import page_block
from studies.softmax_mimicry import fit

BEGIN = '<!-- softmax_mimicry:begin (written by python -m studies.softmax_mimicry --page) -->'
END = '<!-- softmax_mimicry:end -->'
FIDELITY_FIGURE = 'softmax_mimicry_fidelity.png'
CONVERSION_FIGURE = 'softmax_mimicry_conversion.png'
PILOT_COLUMNS = ('radius', 'step_size', 'flow_step_size', 'labels_step_size',
                 'hedgehog_learning_rate')


def fidelity_figure(table: dict, path: str) -> str:
  plt = plots.pyplot()
  sources = sorted(table['fidelity'])
  fig, axes = plt.subplots(2, len(sources), figsize=(5.2 * len(sources), 7), squeeze=False)
  for col, source in enumerate(sources):
    for row, metric in enumerate(('kl', 'output_error')):
      ax = axes[row][col]
      for i, method in enumerate(fit.METHODS):
        by_n = table['fidelity'][source][method]
        ns = sorted(by_n, key=int)
        mean = np.array([by_n[n][metric]['mean'] for n in ns])
        lo = np.array([by_n[n][metric]['ci95'][0] for n in ns])
        hi = np.array([by_n[n][metric]['ci95'][1] for n in ns])
        ax.errorbar([int(n) for n in ns], mean, yerr=[mean - lo, hi - mean], marker='o',
                    ms=3, capsize=2, color=f'C{i}', label=method,
                    linestyle='--' if method in ('favor_iid', 'ball') else '-')
      ax.set_xscale('log', base=2)
      ax.set_yscale('log')
      ax.set_xlabel('features per head N')
      ax.set_ylabel({'kl': 'held-out KL(softmax ‖ linear)',
                     'output_error': 'relative output error'}[metric])
      ax.set_title(source)
      ax.legend(fontsize=7)
  fig.tight_layout()
  return plots.save(fig, path)


def conversion_figure(table: dict, path: str) -> str:
  plt = plots.pyplot()
  datasets = sorted(table['conversion'])
  fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 3.8), squeeze=False)
  for ax, dataset in zip(axes[0], datasets):
    entry, det = table['conversion'][dataset], table['conversion_details'][dataset]
    ns = sorted(entry[fit.METHODS[0]], key=int)
    width = 0.8 / len(ns)
    for j, n in enumerate(ns):
      x = np.arange(len(fit.METHODS)) + (j - (len(ns) - 1) / 2) * width
      tuned = [entry[m][n]['recovery'] for m in fit.METHODS]
      zero = [det['methods'][m][n]['zero_shot_recovery'] for m in fit.METHODS]
      ax.bar(x, tuned, width, color=f'C{j}', label=f'N={n} fine-tuned')
      ax.scatter(x, zero, marker='_', s=60, color='k', zorder=3,
                 label='zero-shot' if j == 0 else None)
    ax.axhline(1.0, color='grey', lw=0.8)
    ax.axhline(0.99, color='grey', lw=0.8, ls=':')
    ax.set_xticks(np.arange(len(fit.METHODS)))
    ax.set_xticklabels(fit.METHODS, rotation=30, ha='right', fontsize=8)
    ax.set_ylabel('test accuracy / softmax accuracy')
    ax.set_ylim(0.6, 1.05)
    ax.set_title(f'{dataset} (softmax {entry["softmax_accuracy"]:.4f})')
    ax.legend(fontsize=7)
  fig.tight_layout()
  return plots.save(fig, path)


def _cell(s):
  return f'{s["mean"]:.4f} [{s["ci95"][0]:.4f}, {s["ci95"][1]:.4f}]'


def fidelity_lines(table: dict) -> list:
  lines = []
  for source, methods in sorted(table['fidelity'].items()):
    ns = sorted(methods[fit.METHODS[0]], key=int)
    head = table['headline'][source]
    lines += [f'**{source}**: held-out KL(softmax ‖ linear), seed mean [95% t interval, '
              f'n = {methods[fit.METHODS[0]][ns[0]]["kl"]["n"]} encoders]; reference '
              f'{head["reference"]}: KL {head["reference_kl"]:.4f}.', '',
              '| method | ' + ' | '.join(f'N={n}' for n in ns) + ' | smallest N ≤ reference |',
              '|---|' + '---|' * (len(ns) + 1)]
    for method in fit.METHODS:
      lines.append(f'| {method} | ' + ' | '.join(_cell(methods[method][n]['kl']) for n in ns)
                   + f' | {head[method]} |')
    lines += ['', f'{source}: relative output error ‖A_lin V − A_soft V‖ / ‖A_soft V‖.', '',
              '| method | ' + ' | '.join(f'N={n}' for n in ns) + ' |',
              '|---|' + '---|' * len(ns)]
    for method in fit.METHODS:
      lines.append(f'| {method} | ' + ' | '.join(
          f'{methods[method][n]["output_error"]["mean"]:.4f}' for n in ns) + ' |')
    lines.append('')
  return lines


def conversion_lines(table: dict) -> list:
  lines = []
  for dataset, entry in sorted(table['conversion'].items()):
    det = table['conversion_details'][dataset]
    soft = det['softmax']
    lines += [f'**{dataset}**: test accuracy / log loss / ECE, mean of seeds {det["seeds"]} '
              f'({det["test_rows"]} test rows; fine-tuning: one epoch of '
              f'{det["finetune_rows"]} training rows). Softmax as trained: '
              f'{soft["zero_shot"]["accuracy"]:.4f} / {soft["zero_shot"]["log_loss"]:.4f} / '
              f'{soft["zero_shot"]["ece"]:.4f}; the same fine-tuning epoch on softmax: '
              f'{soft["finetuned"]["accuracy"]:.4f} / {soft["finetuned"]["log_loss"]:.4f} / '
              f'{soft["finetuned"]["ece"]:.4f}.', '',
              '| method | N | zero-shot acc | LogLoss | ECE | fine-tuned acc | LogLoss | ECE | '
              'recovery (zero-shot → fine-tuned) |', '|---|---|---|---|---|---|---|---|---|']
    for method in fit.METHODS:
      for n in sorted(entry[method], key=int):
        z, t = entry[method][n]['zero_shot'], entry[method][n]['finetuned']
        zr = det['methods'][method][n]['zero_shot_recovery']
        lines.append(f'| {method} | {n} | {z["accuracy"]:.4f} | {z["log_loss"]:.4f} | '
                     f'{z["ece"]:.4f} | {t["accuracy"]:.4f} | {t["log_loss"]:.4f} | '
                     f'{t["ece"]:.4f} | {zr:.3f} → {entry[method][n]["recovery"]:.3f} |')
    lines.append('')
  return lines


def provenance_lines(table: dict) -> list:
  pilot = table.get('pilot') or {}
  commits = sorted({p['commit'] for p in table['parts'] if p.get('commit')})
  enc = sorted({p['encoder_commit'] for p in table['parts'] if p.get('encoder_commit')})
  chosen = sorted((pilot.get('chosen') or {}).items(), key=lambda kv: int(kv[0]))
  lines = [f'Pilot ({pilot.get("dataset")} seed {pilot.get("seed")}, every N, scored on '
           f'{pilot.get("heldout")}; commit `{pilot.get("commit")}`): the settings chosen '
           'per N.', '',
           '| N | ' + ' | '.join(PILOT_COLUMNS) + ' |', '|---|' + '---|' * len(PILOT_COLUMNS)]
  lines += [f'| {n} | ' + ' | '.join(str(c.get(k, '')) for k in PILOT_COLUMNS) + ' |'
            for n, c in chosen]
  return lines + [
      '', f'Written by `{table["command"]}` at `{table["commit"]}` ({table["date"]}); machine '
      f'`{json.dumps(table["machine"], sort_keys=True)}`. Part files made at '
      f'{", ".join(f"`{c}`" for c in commits)}; encoders trained at '
      f'{", ".join(f"`{c}`" for c in enc)}.']


def write_page(table: dict, page: str, figures: str) -> None:
  """Draws both figures into ``figures`` and rewrites ``page``'s block."""
  rel = lambda name: os.path.relpath(os.path.join(figures, name), os.path.dirname(page))
  fidelity_figure(table, os.path.join(figures, FIDELITY_FIGURE))
  lines = [f'![held-out KL and output error against N]({rel(FIDELITY_FIGURE)})', '']
  if table['conversion']:
    conversion_figure(table, os.path.join(figures, CONVERSION_FIGURE))
    lines += [f'![conversion recovery]({rel(CONVERSION_FIGURE)})', '']
  lines += ['### Fidelity', ''] + fidelity_lines(table)
  if table['conversion']:
    lines += ['### Conversion', ''] + conversion_lines(table)
  lines += ['### Provenance of this block', ''] + provenance_lines(table)
  page_block.write_block(page, BEGIN, END, lines)
