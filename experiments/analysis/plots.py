"""The figures of the reports: reliability diagrams, paired-difference forest plots, attention cost.

matplotlib with the Agg backend (no display needed); every function takes the
numbers it draws, so the figures can be redrawn from a report's JSON and the
runs' ``predictions_test.npz`` files.
"""

import math
import os
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
from scipy import stats


def reliability_bins(labels, probs, num_bins: int = 10) -> Dict[str, np.ndarray]:
  """Equal-width bins of the predicted P(class 1) and the observed frequency of class 1.

  Bin b ∈ {0, …, B−1} holds the examples with e_b < p_i ≤ e_{b+1}, e = linspace(0, 1,
  B + 1) (right-closed, bin 0 also holding p = 0: the edges of ``metrics.ece``).

  Returns ``{'edges': [B + 1], 'count': [B], 'mean_prob': [B], 'frac_pos': [B]}``:
  per bin the number of examples, their mean p_i and the fraction with label 1
  (both nan for an empty bin). A calibrated model has frac_pos ≈ mean_prob.
  """
  y = np.asarray(labels, np.float64)
  p = np.asarray(probs, np.float64)
  if y.shape != p.shape or y.ndim != 1:
    raise ValueError(f'labels and probs must be [n] arrays of one shape, got {y.shape} and '
                     f'{p.shape}.')
  if num_bins < 1:
    raise ValueError(f'num_bins must be >= 1, got {num_bins}.')
  edges = np.linspace(0.0, 1.0, num_bins + 1)
  bins = np.clip(np.searchsorted(edges, p, side='left') - 1, 0, num_bins - 1)
  count = np.bincount(bins, minlength=num_bins).astype(np.float64)
  with np.errstate(invalid='ignore', divide='ignore'):
    mean_prob = np.bincount(bins, weights=p, minlength=num_bins) / count
    frac_pos = np.bincount(bins, weights=y, minlength=num_bins) / count
  return {'edges': edges, 'count': count.astype(np.int64), 'mean_prob': mean_prob,
          'frac_pos': frac_pos}


def t_interval(summary: dict) -> Tuple[float, float]:
  """``(mean, half-width)`` of the 95% Student-t interval from ``{mean, std, n}``.

  half = t_{0.975, n−1} · std / √n; nan when n < 2 or std is unknown.
  """
  mean, std, n = summary.get('mean'), summary.get('std'), summary.get('n', 0)
  if mean is None:
    return float('nan'), float('nan')
  if std is None or n < 2:
    return float(mean), float('nan')
  return float(mean), float(stats.t.ppf(0.975, n - 1) * std / math.sqrt(n))


def pyplot():
  """``matplotlib.pyplot`` with the Agg backend (no display needed)."""
  import matplotlib                                  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt                    # pylint: disable=g-import-not-at-top
  return plt


def save(fig, path):
  """Writes ``fig`` to the PNG ``path`` (atomically, its folder made) and closes it; returns
  ``path``."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  try:
    fig.savefig(path + '.tmp.png', dpi=90)
    os.replace(path + '.tmp.png', path)
  finally:                               # a failed write leaves no .tmp.png behind
    if os.path.lexists(path + '.tmp.png'):
      os.remove(path + '.tmp.png')
    pyplot().close(fig)
  return path


# (label, colour, line style) of the curves of a reliability panel.
_STYLES = {'kernel': ('Kernel', 'C3', '-'), 'vanilla': ('Vanilla', 'C0', '-'),
           'ball': ('Ball', 'C2', '-'), 'softmax': ('softmax', 'dimgray', '--'),
           'reference': ('TF-IDF', 'black', ':')}


def reliability_figure(path: str, title: str, panels: Dict[str, Dict[str, Tuple]],
                       num_bins: int = 10) -> str:
  """Writes one reliability diagram per panel; returns ``path``.

  Args:
    path: the PNG to write.
    title: the figure's title.
    panels: ``{panel title: {curve: (labels, probs, runs)}}``: the pooled labels and
      P(class 1) of ``runs`` runs; curves named by a key of ``_STYLES`` (``kernel``,
      ``vanilla``, ``ball``, ``softmax``, ``reference``).
    num_bins: bins of ``reliability_bins``.
  """
  plt = pyplot()
  ncols = min(4, len(panels))
  nrows = math.ceil(len(panels) / ncols)
  fig, axes = plt.subplots(nrows, ncols, figsize=(3.1 * ncols, 3.3 * nrows + 0.8),
                           squeeze=False, sharex=True, sharey=True)
  for ax, (name, curves) in zip(axes.flat, panels.items()):
    ax.plot([0, 1], [0, 1], color='lightgray', lw=1)
    for curve, (labels, probs, runs) in curves.items():
      label, color, style = _STYLES[curve]
      b = reliability_bins(labels, probs, num_bins)
      keep = b['count'] > 0
      ax.plot(b['mean_prob'][keep], b['frac_pos'][keep], style, marker='o', ms=3, lw=1.2,
              color=color, label=label)
    counts = ', '.join(f'{_STYLES[c][0]} {v[2]}' for c, v in curves.items())
    ax.set(xlim=(0, 1), ylim=(0, 1), aspect='equal')
    ax.set_title(f'{name}\nruns: {counts}', fontsize=8)
    ax.set_xticks([0, 0.5, 1])
    ax.set_yticks([0, 0.5, 1])
  for i, ax in enumerate(axes.flat):
    if i >= len(panels):
      ax.set_visible(False)
    elif i + ncols >= len(panels):    # the lowest panel of its column
      ax.xaxis.set_tick_params(labelbottom=True)
      ax.set_xlabel('mean predicted P(class 1)')
  for ax in axes[:, 0]:
    ax.set_ylabel('fraction of class 1')
  handles = {}
  for ax in axes.flat[:len(panels)]:
    for h, l in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(l, h)
  fig.suptitle(title, fontsize=10)
  fig.legend(handles.values(), handles.keys(), loc='upper center', ncol=len(handles),
             fontsize=8, bbox_to_anchor=(0.5, 0.96), frameon=False)
  fig.tight_layout(rect=(0, 0, 1, 0.93))
  return save(fig, path)


def paired_figure(path: str, title: str, comparisons: Dict[str, Dict[str, dict]],
                  metrics: Sequence[Tuple[str, str]] = (('accuracy', 'Δ accuracy'),
                                                        ('ece', 'Δ ECE')),
                  maps: Optional[Sequence[str]] = None) -> str:
  """A forest plot: per map, each comparison's mean difference with its 95% t-interval.

  Args:
    path: the PNG to write.
    title: the figure's title.
    comparisons: ``{name: {map: {metric: {mean, std, n}, 'seeds': [...]}}}``, e.g.
      ``{'Kernel − Vanilla': summary['paired'], 'Kernel − Ball': summary['paired_ball']}``.
    metrics: ``(key, axis label)`` per panel.
    maps: the rows, top to bottom (default: every map of any comparison, in order).
  """
  plt = pyplot()
  from matplotlib import ticker                      # pylint: disable=g-import-not-at-top
  if maps is None:
    maps = list(dict.fromkeys(m for pairs in comparisons.values() for m in pairs))
  fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics),
                                                     1.0 + 0.45 * max(len(maps), 1)),
                           squeeze=False, sharey=True)
  step = 0.5 / max(len(comparisons), 1)
  for ax, (metric, label) in zip(axes[0], metrics):
    ax.axvline(0.0, color='gray', lw=0.8)
    for j, (name, pairs) in enumerate(comparisons.items()):
      color = f'C{j}'
      for i, fmap in enumerate(maps):
        if fmap not in pairs:
          continue
        mean, half = t_interval(pairs[fmap][metric])
        row = i + (j - (len(comparisons) - 1) / 2) * step
        if np.isnan(half):      # one seed: a hollow point, no interval
          ax.plot(mean, row, 'o', mfc='white', color=color)
        else:
          ax.errorbar(mean, row, xerr=half, fmt='o', color=color, capsize=3)
      ax.plot([], [], 'o', color=color, label=name)
    ax.set(xlabel=label)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=5))   # readable at any range
    ax.set_yticks(range(len(maps)), maps)
    ax.set_ylim(len(maps) - 0.5, -0.5)
    ax.grid(axis='x', lw=0.3)
  axes[0][0].legend(fontsize=7, loc='best')
  fig.suptitle(title + '\n(mean over seeds, 95% t-interval; hollow: one seed)', fontsize=9)
  fig.tight_layout()
  return save(fig, path)


def attention_figure(path: str, record: dict, feature_map: str = 'favor',
                     dtype: str = 'float32') -> str:
  """Forward + backward time and temporary memory against sequence length, per implementation.

  ``record``: the JSON of ``benchmarks.attention`` (``rows`` with ``impl``,
  ``feature_map``, ``particles``, ``dtype``, ``L``, ``forward_backward_ms``,
  ``temp_mb``); the rows of vanilla particles of one map and dtype are drawn, and
  softmax's (``feature_map`` '-').
  """
  plt = pyplot()
  rows = [r for r in record['rows'] if r['feature_map'] in (feature_map, '-')
          and r['dtype'] == dtype and r.get('particles', 'vanilla') == 'vanilla']
  impls = list(dict.fromkeys(r['impl'] for r in rows))
  if not any(r['feature_map'] == feature_map for r in rows):
    raise ValueError(f'no {feature_map}/{dtype} rows with vanilla particles in the record.')
  lengths = sorted({r['L'] for r in rows})
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
  from matplotlib import ticker                      # pylint: disable=g-import-not-at-top
  for ax, field, label in ((axes[0], 'forward_backward_ms', 'forward + backward (ms)'),
                           (axes[1], 'temp_mb', 'XLA temporary memory (MB)')):
    for impl in impls:
      pts = sorted((r['L'], r[field]) for r in rows if r['impl'] == impl and r[field] is not None)
      if pts:
        ax.plot(*zip(*pts), marker='o', label=impl)
    ax.set(xscale='log', yscale='log', xlabel='sequence length L', ylabel=label)
    ax.set_xticks(lengths, [f'{n:,}' for n in lengths])
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.grid(lw=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(f'Kernel attention ({feature_map}) vs softmax, {dtype}: time and memory '
               'against L (CPU)', fontsize=9)
  fig.tight_layout()
  return save(fig, path)

