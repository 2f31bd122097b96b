r"""The two 95% intervals of a paired table: seed-unit, and pooled within maps.

A paired table holds, per feature map m = 1 … M, the differences d_{m,s} =
treated − base of a test metric over the n_m seeds s both variants have, summarised
as ``{mean: d̄_m, std: s_m (ddof = 1), n: n_m}`` (``tables.summarize``).

*Seed-unit* (``seed_interval``): each map (or the all-maps row, whose unit is the
seed's mean over maps) on its own,

    d̄ ± t_{0.975, n−1} · s / √n        (n − 1 degrees of freedom).

*Pooled within maps* (``pooled_sd``, ``pooled_interval``, ``pooled_mean``): the
differences centred on their map's mean, e_{m,s} = d_{m,s} − d̄_m, share one variance

    s_p² = Σ_m Σ_s e_{m,s}² / ν = Σ_m (n_m − 1) s_m² / ν,   ν = Σ_m (n_m − 1),

so a map's row is d̄_m ± t_{0.975, ν} · s_p / √n_m, and the mean over maps
D̄ = (1/M) Σ_m d̄_m is D̄ ± t_{0.975, ν} · s_p · √(Σ_m 1/n_m) / M. The pooled interval
rests on ν degrees of freedom instead of n − 1 (a 3-seed standard deviation can be
small by chance), but takes the maps' differences as independent: where the seeds
move every map alike, the seed-unit all-maps interval is the one that sees it. A
page gives both and reads the wider (``wider``, ``allows``). Both need only the
summaries, so a page redrawn from old summaries gets them too.
"""

import math
from typing import Dict, List, Optional, Sequence, Tuple

from scipy import stats

Interval = Optional[List[float]]


def _t(df: int) -> float:
  return float(stats.t.ppf(0.975, df))


def seed_interval(summary: dict) -> Interval:
  """``[lo, hi]`` = mean ± t_{0.975, n−1} · std/√n of ``{mean, std, n}``; None when n < 2
  or the std is unknown."""
  mean, std, n = summary.get('mean'), summary.get('std'), summary.get('n', 0)
  if mean is None or std is None or n < 2:
    return None
  half = _t(n - 1) * std / math.sqrt(n)
  return [mean - half, mean + half]


def pooled_sd(summaries: Sequence[dict]) -> Tuple[Optional[float], int]:
  """``(s_p, ν)`` of the module docstring over the maps' ``{mean, std, n}``; s_p is None
  when ν = 0 (every map has one seed). A map with n_m > 1 and no std is refused."""
  num, df = 0.0, 0
  for s in summaries:
    if s.get('mean') is None or s.get('n', 0) < 2:
      continue
    if s.get('std') is None:
      raise ValueError(f'summary {s}: n = {s["n"]} differences but no std; cannot pool.')
    num += (s['n'] - 1) * s['std'] ** 2
    df += s['n'] - 1
  return (math.sqrt(num / df) if df else None), df


def pooled_interval(summary: dict, sd: Optional[float], df: int) -> Interval:
  """``[lo, hi]`` = mean ± t_{0.975, ν} · s_p/√n of one map (``pooled_sd``'s ``sd``, ``df``)."""
  if summary.get('mean') is None or sd is None or not df or summary.get('n', 0) < 1:
    return None
  half = _t(df) * sd / math.sqrt(summary['n'])
  return [summary['mean'] - half, summary['mean'] + half]


def pooled_mean(summaries: Sequence[dict]) -> dict:
  """``{mean: D̄, ci95, sd_pooled, df_pooled, maps}`` of the mean over maps (module
  docstring): D̄ ± t_{0.975, ν} · s_p · √(Σ_m 1/n_m) / M."""
  rows = [s for s in summaries if s.get('mean') is not None and s.get('n', 0) >= 1]
  sd, df = pooled_sd(rows)
  if not rows:
    return {'mean': None, 'ci95': None, 'sd_pooled': sd, 'df_pooled': df, 'maps': 0}
  mean = sum(s['mean'] for s in rows) / len(rows)
  ci = None
  if sd is not None:
    half = _t(df) * sd * math.sqrt(sum(1.0 / s['n'] for s in rows)) / len(rows)
    ci = [mean - half, mean + half]
  return {'mean': mean, 'ci95': ci, 'sd_pooled': sd, 'df_pooled': df, 'maps': len(rows)}


def with_intervals(pairs: Dict[str, dict], metrics: Sequence[str]) -> Dict[str, dict]:
  """A copy of ``{map: {metric: {mean, std, n}, ...}}`` where each metric's summary also
  holds ``ci95`` (``seed_interval``), ``ci95_pooled`` (``pooled_interval``, pooled over
  the maps of ``pairs``), ``sd_pooled`` and ``df_pooled``."""
  out = {m: dict(d) for m, d in pairs.items()}
  for k in metrics:
    sd, df = pooled_sd([d[k] for d in pairs.values()])
    for m, d in pairs.items():
      out[m][k] = {**d[k], 'ci95': seed_interval(d[k]),
                   'ci95_pooled': pooled_interval(d[k], sd, df), 'sd_pooled': sd,
                   'df_pooled': df}
  return out


# ----------------------------------------------------------------------------- words

def width(ci: Interval) -> float:
  return -1.0 if ci is None else ci[1] - ci[0]


def wider(seed_ci: Interval, pooled_ci: Interval) -> Optional[str]:
  """``'seeds'`` or ``'pooled'``: the wider of the two (``'seeds'`` on a tie); None
  when neither exists."""
  if seed_ci is None and pooled_ci is None:
    return None
  return 'pooled' if width(pooled_ci) > width(seed_ci) else 'seeds'


def fmt_ci(ci: Interval, digits: int = 4) -> str:
  return '—' if ci is None else f'[{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]'


def allows(ci: Interval, digits: int = 4) -> str:
  """What a difference interval allows, in words: a gain, a loss, or either."""
  if ci is None:
    return 'no interval (one seed)'
  lo, hi = (f'{x:+.{digits}f}' for x in ci)
  if ci[0] > 0:
    return f'only a gain, {lo} to {hi}'
  if ci[1] < 0:
    return f'only a loss, {lo} to {hi}'
  return f'anything from {lo} to {hi} (0 inside)'


def interval_table(title: str, rows: Dict[str, dict], metrics: Sequence[Tuple[str, str]],
                   lead: str = 'accuracy', seed_columns: bool = True) -> List[str]:
  """Markdown lines: per row both 95% intervals of every metric, the wider for ``lead``
  and what it allows, then a sentence that says which is wider how often.

  ``rows``: ``{row name: {metric: {mean, ci95, ci95_pooled, df_pooled, n}}}``
  (``with_intervals``); ``metrics``: ``(key, label)``; ``seed_columns``: False leaves out
  the seed-unit intervals (a page that shows them already), the ``wider`` column still
  compares both."""
  kinds = ('ci95', 'ci95_pooled') if seed_columns else ('ci95_pooled',)
  names = {'ci95': 'seeds', 'ci95_pooled': 'pooled'}
  header = ['map'] + [f'Δ {name} 95% {names[c]}' for _, name in metrics for c in kinds]
  label = dict(metrics).get(lead, lead)
  header += [f'wider Δ {label}: it allows', 'n']
  lines = [title, '', '| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  count = {'seeds': [], 'pooled': []}
  for name, d in rows.items():
    cells = [fmt_ci(d[k].get(c)) for k, _ in metrics for c in kinds]
    p = d[lead]
    which = wider(p.get('ci95'), p.get('ci95_pooled'))
    if which:
      count[which].append(name)
      ci = p['ci95_pooled' if which == 'pooled' else 'ci95']
      cells.append(f"{which}: {allows(ci)}")
    else:
      cells.append('—')
    lines.append(f'| {name} | ' + ' | '.join(cells) + f" | {p.get('n', '—')} |")
  dfs = sorted({d[lead].get('df_pooled') for d in rows.values()} - {None})
  said = ', '.join(f'ν = {df}' for df in dfs) or 'no degrees of freedom'
  lines += ['', f'Seeds: mean ± t_{{0.975, n−1}} · s/√n per row; pooled within maps: the '
            f'differences centred on their map\'s mean share one variance ({said}), mean ± '
            f't_{{0.975, ν}} · s_p/√n (see `experiments/analysis/intervals.py`). For Δ {label} '
            f'the pooled interval is wider in {len(count["pooled"])} of '
            f'{len(count["pooled"]) + len(count["seeds"])} rows, the seed-unit one in '
            f'{len(count["seeds"])}; the wider one is what the data allow.', '']
  return lines
