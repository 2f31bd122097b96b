r"""The figure and table of ``docs/recall.md`` from ``results/mqar.json``.

``write_page(results, page, figure, block)`` draws accuracy at answer positions against sequence
length (one line per method, one panel per width; seeds averaged, each seed a dot) and
replaces the part of ``page`` between the ``block``'s markers (``markers(block)``; the
default ``mqar`` block is ``BEGIN`` … ``END``) with the table (one row per run, then the
runs' commands and commits), so one page can hold the tables of several grids. The text outside the markers (the answer, in
words) is kept as written.
"""

import collections
import json
import os

import numpy as np

from experiments.analysis import plots
from experiments.common import page_block
from experiments.recall import methods



def markers(block: str):
  """``(begin, end)`` marker lines of a page block named ``block``."""
  if not block.replace('_', '').isalnum():
    raise ValueError(f'--block must be letters, digits and _, got {block!r}.')
  return (f'<!-- {block}:begin (written by python -m experiments.mqar --page) -->',
          f'<!-- {block}:end -->')


BEGIN, END = markers('mqar')


def method_color(method: str) -> str:
  """A method's colour in every recall figure: matplotlib's ten cycle colours by its place
  in ``methods.METHODS``, then colours of their own (``'C10'`` would repeat C0); grey for
  a name not in it."""
  if method not in methods.METHODS:
    return 'grey'
  i = methods.METHODS.index(method)
  return f'C{i}' if i < 10 else ('navy', 'darkgoldenrod', 'olive')[(i - 10) % 3]


def figure(table: dict, path: str) -> str:
  plt = plots.pyplot()
  widths = sorted({r['width'] for r in table['runs']})
  fig, axes = plt.subplots(1, len(widths), figsize=(5 * len(widths), 3.6), squeeze=False)
  for ax, width in zip(axes[0], widths):
    for method in methods.METHODS:
      by_len = collections.defaultdict(list)
      for r in table['runs']:
        if r['width'] == width and r['method'] == method:
          by_len[r['seq_len']].append(r['accuracy'])
      if not by_len:
        continue
      xs = sorted(by_len)
      style, color = '--' if method == 'softmax' else '-', method_color(method)
      ax.plot(xs, [np.mean(by_len[x]) for x in xs], style, marker='o', color=color,
              label=method)
      for x in xs:
        ax.scatter([x] * len(by_len[x]), by_len[x], s=8, color=color)
    ax.set_xscale('log', base=2)
    ax.set_xlabel('sequence length L (pairs = L/16)')
    ax.set_ylabel('accuracy at answer positions')
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f'width {width}')
    ax.legend(fontsize=7)
  fig.tight_layout()
  return plots.save(fig, path)


def table_lines(table: dict) -> list:
  lines = [f'Vocabulary {table["vocab"]}, {table["num_train"]} training sequences per run '
           f'(fresh batches), N = num_features per head (0 for softmax).', '',
           '| L | pairs | width | method | N | seed | accuracy | loss | train s |',
           '|---|---|---|---|---|---|---|---|---|']
  for r in table['runs']:
    lines.append(f'| {r["seq_len"]} | {r["num_pairs"]} | {r["width"]} | {r["method"]} | '
                 f'{r["num_features"]} | {r["seed"]} | {r["accuracy"]:.4f} | '
                 f'{r.get("loss", float("nan")):.4f} | {r["train_seconds"]:.0f} |')
  diverse = [r for r in table['runs'] if r.get('diversity')]
  if diverse:
    lines += ['', 'Particle diversity per layer (mean over heads; initial → final): share of the '
              "cloud's variance in its top direction, effective rank, smallest pairwise distance.",
              '', '| L | width | method | seed | layer | top share | effective rank | min distance |',
              '|---|---|---|---|---|---|---|---|']
    for r in diverse:
      for layer, final in r['diversity']['final'].items():
        init = r['diversity']['initial'][layer]
        cell = lambda k: f'{init[k]:.3f} → {final[k]:.3f}'
        lines.append(f'| {r["seq_len"]} | {r["width"]} | {r["method"]} | {r["seed"]} | '
                     f'{layer} | {cell("top_direction_share")} | {cell("effective_rank")} | '
                     f'{cell("min_pairwise_distance")} |')
  commits = sorted({r.get('commit', 'unknown') for r in table['runs']})
  machines = sorted({json.dumps(r.get('machine', {}), sort_keys=True) for r in table['runs']})
  commands = sorted({r.get('command', '') for r in table['runs']})
  lines += ['', f'Commits of the runs: {", ".join(commits)}.',
            "Commands of the runs (a grid's workers all ran the same one): "
            + '; '.join(f'`{c}`' for c in commands) + '.',
            'Machines: ' + '; '.join(machines) + '.']
  return lines


def write_page(results: str, page: str, figure_path: str, block: str = 'mqar') -> None:
  begin, end = markers(block)
  with open(results) as f:
    table = json.load(f)
  figure(table, figure_path)
  rel = os.path.relpath(figure_path, os.path.dirname(page))
  page_block.write_block(page, begin, end,
                         [f'![accuracy against sequence length]({rel})', ''] + table_lines(table))
