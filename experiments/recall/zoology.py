r"""Zoology's protocol (issue 36, configs/mqar.py:zoology): which runs, in which order, and
``results/mqar_zoology*.json`` from their files.

The sequential grids (``ZOOLOGY_GRIDS``: one run per worker at a time, resumable, claimed
with ``grid.claim``): ``zoology_plan(root, grid)`` lists the runs whose prerequisites are
finished (a cell's pilot picks the particles' step size, a cell's sweep picks each
method's rate). The batched grids, for one GPU, are experiments/recall/batched.py's
(``BATCHED_GRIDS``: one vmapped program per (cell, width, method[, η])).
``zoology_file(runs, pilots, protocol)`` is the binding results object: protocol, runs,
``best`` (``zoology_best``) and ``coulomb_effect``.
"""

import glob
import json
import os
from typing import List

from experiments.analysis import intervals
from experiments.recall import methods

# The pair that isolates the Coulomb terms: the same mimicry target and Langevin step, with
# the repulsion felt and the noise on (first) and with λ = 0 and no noise (second).
COULOMB_PAIR = ('particles_softmax', 'particles_flow')

# Issue 36: Zoology's protocol (configs/mqar.py:zoology), a learning-rate sweep per method.
ZOOLOGY = {
    'sweep_cells': ((64, 4), (128, 8)),        # every method at every rate, seed 0
    'long_cell': (256, 16),                    # at each method's best rate of (128, 8)
    'width': 64,
    # logspace(-4, -2, 4), the middle rates first (a grid cut short has the likeliest best).
    'learning_rates': (2.154e-3, 4.642e-4, 1e-2, 1e-4),
    'methods': ('hedgehog', 'particles_softmax', 'particles_flow', 'elu', 'taylor',
                'favor_orthogonal', 'hedgehog_distilled', 'softmax'),
    'seeds': (0, 1, 2),
    # The particles' Langevin step η: a pilot per cell (particles_softmax, seed 0, at the
    # second-largest rate, pilot_steps), chosen on validation accuracy then loss.
    'pilot_step_sizes': (1e-3, 3e-3, 1e-2),
    'pilot_learning_rate': 2.154e-3,
    'pilot_steps': 1000,
    # η fixed in advance for every cell instead (no pilot run); None: the pilot picks it.
    'step_size': None,
    # Runs at the sweep cells of these methods go after every other run: the GPU grid ran
    # them at every rate and seed of both sweep cells (results/mqar_zoology_gpu.json; their CPU
    # twins agree, docs/recall.md), so on this CPU they add least. The methods it did not
    # run (the Coulomb pair, the distilled Hedgehog) come first, with their (256, 16) runs;
    # a deferred method's (256, 16) runs wait on its (128, 8) sweep, then go ahead of the
    # deferred runs still left.
    'deferred': ('hedgehog', 'elu', 'taylor', 'favor_orthogonal', 'softmax'),
}


# The same protocol at 4x the steps (12,000, about 8 epochs of the 100k set; Zoology trains up
# to 64) on this CPU: does the budget, not the map, hold the linear maps at 1/P? (64, 4),
# seed 0, the two rates of every linear method's 3,000-step best; Taylor (Zoology's anchor)
# first, then every method at 2.15e-3 before any at 1e-2 (rates_first: the Coulomb pair
# compared at one rate as early as possible). The last two methods (added after the
# distilled Hedgehog's 0.975 against particles_flow's 0.640 at 2.15e-3, seed 0) go from
# particles_flow to hedgehog_distilled one change at a time (experiments/recall/methods.py):
# which of optimiser, map and task gradient makes the gap?
ZOOLOGY_LONG = dict(
    ZOOLOGY, sweep_cells=((64, 4),), long_cell=None, learning_rates=(2.154e-3, 1e-2),
    methods=('taylor', 'particles_softmax', 'particles_flow', 'hedgehog', 'elu',
             'hedgehog_distilled', 'favor_mimicry', 'hedgehog_mimicry'),
    seeds=(0,), deferred=(), rates_first=True,
    # After their seed 0 at 2.15e-3 (particles_softmax 0.435, particles_flow 0.640; no
    # interval at n = 1), the pair's seeds 1 and 2 at that rate, before the rest: paired
    # by seed at one rate fixed in advance (``coulomb_effect``'s ``by_rate``).
    coulomb_seeds=(1, 2), coulomb_rate=2.154e-3,
    # Then seeds 1 and 2 at that rate of the ladder's two middle steps (seed 0: favor_mimicry
    # 0.883, hedgehog_mimicry 0.974, against particles_flow's 0.43-0.64 over three seeds),
    # before the runs at 1e-2: is the optimiser's step more than one seed's luck?
    # Seeds 1 and 2 at that rate of the four maps run at seed 0 alone (distilled Hedgehog
    # 0.975, Taylor 0.877, Hedgehog 0.614, elu 0.234) were added once every run above had
    # finished, before any of them ran: docs/recall.md called their order a comparison, not
    # a ranking; three seeds give a mean ± std at one rate, as ReBased reports. Reported
    # whatever they give.
    extra_seeds={'methods': ('favor_mimicry', 'hedgehog_mimicry', 'hedgehog_distilled',
                             'taylor', 'hedgehog', 'elu'), 'seeds': (1, 2),
                 'learning_rate': 2.154e-3})

# The Coulomb pair of zoology_long with the particles' Langevin step annealed by the rest's
# cosine (particles.schedule = 'cosine'): in zoology_long the Langevin step stays at η while
# the rest's rate falls to 0, so near the end the particles still move (with noise, for
# particles_softmax) where the rest can no longer follow. Does the pair's difference stay
# when drift and noise anneal with the rest? One rate, fixed in advance (2.15e-3, the
# rate of zoology_long's pair), seeds 0, 1 and 2; its own pilot of η.
ZOOLOGY_LONG_ANNEALED = dict(
    ZOOLOGY_LONG, methods=COULOMB_PAIR, learning_rates=(2.154e-3,), seeds=(0,),
    coulomb_seeds=(1, 2), coulomb_rate=2.154e-3, extra_seeds=None)

# zoology_long_annealed's lift over zoology_long (the pair at seeds 0-1: 0.435/0.455 and
# 0.640/0.429 with the constant step, 0.911/0.833 and 0.918/0.894 annealed) changed two
# things at once: the schedule, and η (its pilot chose 1e-2, zoology_long's 3e-3). These two
# grids fill the other corners of that 2 x 2, η fixed in advance (``step_size``: no pilot),
# the rest as in zoology_long_annealed (the pair, 2.15e-3, seed 0 then seeds 1 and 2):
# the constant step at η = 1e-2, and the annealed step at η = 3e-3. Added after both
# grids above had run seeds 0 and 1, before either of these ran; reported whatever they give.
ZOOLOGY_LONG_ETA = dict(ZOOLOGY_LONG_ANNEALED, step_size=1e-2)
ZOOLOGY_LONG_ANNEALED_ETA = dict(ZOOLOGY_LONG_ANNEALED, step_size=3e-3)

# The same 4x budget at (128, 8), where the particles' lead was first seen (docs/recall.md,
# the first study: 0.70 at 6,000 steps) and one outside test found Zhang et al.'s Hedgehog
# at 1/P: does the lead survive Zoology's data and protocol? One rate fixed in advance,
# 2.15e-3 (zoology_long's comparison, and the best 12,000-step rate of the one method run
# at two there), seed 0 of every method in this order: the Coulomb pair and Hedgehog,
# then the distilled Hedgehog (the best linear map at (64, 4)); as in zoology_long, the
# pair's later seeds at that rate go ahead of every seed-0 run not yet finished once both
# of the pair's seed-0 runs are done. No rate sweep: this compares, it does not rank.
# Seeds 3 and 4 of the pair (ReBased's five seeds) were added after seeds 0-2 gave paired
# differences +0.593, -0.014, +0.443 (95% interval -0.444 to +1.126): fixed before any of
# them ran, reported whatever they give; they go ahead of the other seed-0 runs too.
# Seeds 1 and 2 of the three maps that ended ahead of the particles at seed 0 (distilled
# Hedgehog 0.961, Hedgehog 0.884, Taylor 0.862 against 0.800; the particles' five seeds span
# 0.653-0.895) were added after those seed-0 runs and before any of these ran: does the
# order hold over seeds (ReBased's mean ± std at one rate)? Reported whatever they give.
# Seeds 1 and 2 of elu, the highest at seed 0 (0.979) and the one method left at one seed,
# were added once every other run had finished, before either ran; reported whatever they
# give.
ZOOLOGY_LONG_L128 = dict(
    ZOOLOGY_LONG, sweep_cells=((128, 8),), learning_rates=(2.154e-3,),
    methods=('particles_softmax', 'hedgehog', 'particles_flow', 'hedgehog_distilled',
             'taylor', 'elu'), coulomb_seeds=(1, 2, 3, 4),
    extra_seeds={'methods': ('hedgehog_distilled', 'hedgehog', 'taylor', 'elu'),
                 'seeds': (1, 2), 'learning_rate': 2.154e-3})

# The sequential (one run per worker at a time) grids of the zoology protocol: grid ->
# (the grid, config overrides of every run, its default results file).
ZOOLOGY_GRIDS = {
    'zoology': (ZOOLOGY, {}, 'results/mqar_zoology.json'),
    'zoology_long': (ZOOLOGY_LONG, {'train.steps': 12000}, 'results/mqar_zoology_long.json'),
    'zoology_long_annealed': (ZOOLOGY_LONG_ANNEALED,
                              {'train.steps': 12000, 'particles.schedule': 'cosine'},
                              'results/mqar_zoology_long_annealed.json'),
    'zoology_long_l128': (ZOOLOGY_LONG_L128, {'train.steps': 12000},
                          'results/mqar_zoology_long_l128.json'),
    'zoology_long_eta1e-2': (ZOOLOGY_LONG_ETA, {'train.steps': 12000},
                             'results/mqar_zoology_long_eta1e-2.json'),
    'zoology_long_annealed_eta3e-3': (ZOOLOGY_LONG_ANNEALED_ETA,
                                      {'train.steps': 12000, 'particles.schedule': 'cosine'},
                                      'results/mqar_zoology_long_annealed_eta3e-3.json'),
}


def zoology_name(method, seq_len, num_pairs, width, learning_rate, seed) -> str:
  return f'{method}-L{seq_len}-P{num_pairs}-w{width}-lr{learning_rate:.1e}-seed{seed}'


def zoology_row_name(row: dict) -> str:
  """A finished run's folder (and per-run file) name: ``zoology_name``, with ``-eta<η>``
  for a batched Langevin run (η swept there: ``batched.run_name``)."""
  name = zoology_name(row['method'], row['seq_len'], row['num_pairs'], row['width'],
                      row['learning_rate'], row['seed'])
  if 'runs_in_program' in row and 'particle_step_size' in row:
    name += f'-eta{row["particle_step_size"]:.0e}'
  return name


def _cell(seq_len, num_pairs, width, **more):
  return dict({'data.seq_len': seq_len, 'data.num_pairs': num_pairs, 'model.width': width},
              **more)


def _read(root: str, name: str):
  path = os.path.join(root, name, 'result.json')
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f'{path}: not a readable run result ({e}).') from None


def selection_key(row: dict):
  """Validation accuracy, then lower validation loss: how a rate or a step size is chosen."""
  return (row['valid_accuracy'], -row['valid_loss'])


def zoology_plan(root: str, grid: dict = None):
  """``(runnable, waiting)``: the runs whose prerequisites are finished, in order, and how
  many runs still wait on an unfinished one (a pilot, or a cell's sweep).

  Order: the pilots (none where the grid fixes η: ``step_size``); the later seeds of
  ``COULOMB_PAIR`` at a sweep cell as soon as both methods' sweeps of that cell are done
  (the question whether the Coulomb terms change anything needs them paired by seed);
  where the grid has ``coulomb_seeds``, those seeds of the pair at ``coulomb_rate`` as
  soon as both seed-0 runs at that rate are done; where it has ``extra_seeds`` ({methods,
  seeds, learning_rate}), those seeds of each of those methods at that rate as soon as
  the method's own seed-0 run there is done; each sweep cell (methods × rates, seed 0;
  rates × methods where the grid says ``rates_first``); (256, 16) (the grid's
  ``long_cell``, where it has one) seed 0 at each method's best rate of (128, 8); seeds 1
  and 2 at each method's best rate of each sweep cell, then at (256, 16); last, the sweep
  cells' runs of the grid's ``deferred`` methods, in the same order. A run due twice (at
  the fixed rate and at a best rate) is listed once. The particles' step size is the
  pilot's choice for the cell (the (256, 16) runs take (128, 8)'s), or the grid's
  ``step_size``. The best rate of a method is the argmax of ``selection_key`` over its
  seed-0 runs (validation batch, never the test batch).
  """
  g = grid or ZOOLOGY
  if g.get('coulomb_seeds') and g['coulomb_rate'] not in g['learning_rates']:
    # its seed-0 runs would never be planned: the later seeds would wait for ever
    raise ValueError(f'coulomb_rate {g["coulomb_rate"]!r} is not one of the grid\'s '
                     f'learning_rates {g["learning_rates"]}.')
  extra_seeds = g.get('extra_seeds')            # the same wait for ever, named
  if extra_seeds and extra_seeds['learning_rate'] not in g['learning_rates']:
    raise ValueError(f'extra_seeds learning_rate {extra_seeds["learning_rate"]!r} is not '
                     f'one of the grid\'s learning_rates {g["learning_rates"]}.')
  missing = sorted(set(extra_seeds['methods']) - set(g['methods'])) if extra_seeds else []
  if missing:
    raise ValueError(f'extra_seeds methods {missing} are not among the grid\'s methods '
                     f'{g["methods"]}.')
  w = g['width']
  runs, waiting = [], 0
  eta = {}
  for seq_len, num_pairs in g['sweep_cells']:
    if g.get('step_size') is not None:          # η fixed in advance: no pilot
      eta[(seq_len, num_pairs)] = g['step_size']
      continue
    rows = []
    for step_size in g['pilot_step_sizes']:
      name = f'pilot/particles_softmax-L{seq_len}-P{num_pairs}-w{w}-eta{step_size:.0e}'
      runs.append((name, _cell(seq_len, num_pairs, w, method='particles_softmax', seed=0,
                               **{'train.learning_rate': g['pilot_learning_rate'],
                                  'train.steps': g['pilot_steps'],
                                  'particles.step_size': step_size})))
      row = _read(root, name)
      rows.append((row, step_size))
    if all(r is not None for r, _ in rows):
      eta[(seq_len, num_pairs)] = max(rows, key=lambda r: selection_key(r[0]))[1]
  best = {}
  for seq_len, num_pairs in g['sweep_cells']:
    rows = {m: [] for m in g['methods']}
    order = ([(m, lr) for lr in g['learning_rates'] for m in g['methods']]
             if g.get('rates_first') else
             [(m, lr) for m in g['methods'] for lr in g['learning_rates']])
    for method, lr in order:
      extra = {'train.learning_rate': lr}
      if method in methods.LANGEVIN_METHODS:
        if (seq_len, num_pairs) not in eta:
          waiting += 1
          rows[method].append(None)
          continue
        extra['particles.step_size'] = eta[(seq_len, num_pairs)]
      name = zoology_name(method, seq_len, num_pairs, w, lr, 0)
      runs.append((name, _cell(seq_len, num_pairs, w, method=method, seed=0, **extra)))
      row = _read(root, name)
      rows[method].append(None if row is None else (row, lr, extra))
    for method, found in rows.items():
      if all(r is not None for r in found):
        best[(seq_len, num_pairs, method)] = max(found, key=lambda r: selection_key(r[0]))[1:]

  def at_best(method, sweep_cell, cell, seed):
    """The run of ``method`` at ``cell`` with its best (rate, extra) of ``sweep_cell``."""
    lr, extra = best[(*sweep_cell, method)]
    return (zoology_name(method, *cell, w, lr, seed),
            _cell(*cell, w, method=method, seed=seed, **extra))

  last = g['sweep_cells'][-1]
  later = []
  for seed in (g['seeds'] if g['long_cell'] else ()):
    for method in g['methods']:
      if (*last, method) not in best:
        waiting += 1
        continue
      (runs if seed == 0 else later).append(at_best(method, last, g['long_cell'], seed))
  pair = []
  for seed in g['seeds'][1:]:
    for cell in g['sweep_cells']:
      paired = all((*cell, m) in best for m in COULOMB_PAIR)
      for method in g['methods']:
        if (*cell, method) not in best:
          waiting += 1
          continue
        entry = at_best(method, cell, cell, seed)
        (pair if paired and method in COULOMB_PAIR else runs).append(entry)
  fixed = []
  for seq_len, num_pairs in (g['sweep_cells'] if g.get('coulomb_seeds') else ()):
    lr = g['coulomb_rate']
    seed0 = [_read(root, zoology_name(m, seq_len, num_pairs, w, lr, 0)) for m in COULOMB_PAIR]
    for seed in g['coulomb_seeds']:
      for method in COULOMB_PAIR:
        if (seq_len, num_pairs) not in eta or None in seed0:
          waiting += 1
          continue
        fixed.append((zoology_name(method, seq_len, num_pairs, w, lr, seed),
                      _cell(seq_len, num_pairs, w, method=method, seed=seed,
                            **{'train.learning_rate': lr,
                               'particles.step_size': eta[(seq_len, num_pairs)]})))
  for seq_len, num_pairs in (g['sweep_cells'] if extra_seeds else ()):
    lr = extra_seeds['learning_rate']
    for method in extra_seeds['methods']:
      extra = {'train.learning_rate': lr}
      langevin = method in methods.LANGEVIN_METHODS
      if ((langevin and (seq_len, num_pairs) not in eta)
          or _read(root, zoology_name(method, seq_len, num_pairs, w, lr, 0)) is None):
        waiting += len(extra_seeds['seeds'])
        continue
      if langevin:
        extra['particles.step_size'] = eta[(seq_len, num_pairs)]
      fixed.extend((zoology_name(method, seq_len, num_pairs, w, lr, seed),
                    _cell(seq_len, num_pairs, w, method=method, seed=seed, **extra))
                   for seed in extra_seeds['seeds'])
  pilots = [r for r in runs if r[0].startswith('pilot/')]
  ordered = pilots + pair + fixed + runs[len(pilots):] + later
  seen = set()                  # a run both at the fixed rate and at a best rate: once
  ordered = [r for r in ordered if not (r[0] in seen or seen.add(r[0]))]
  sweep = set(g['sweep_cells'])
  deferred = [r for r in ordered if r[1].get('method') in g.get('deferred', ())
              and (r[1]['data.seq_len'], r[1]['data.num_pairs']) in sweep]
  return [r for r in ordered if r not in deferred] + deferred, waiting


def zoology_best(rows: List[dict]) -> dict:
  """``{"L/P/width/method": {"learning_rate", "accuracy": {"mean", "std", "n"}}}``: each
  method's rate chosen on its seed-0 validation accuracy, its test accuracy over the seeds
  run at that rate (std with ddof = 1; 0 for one seed). Where the rows hold several
  particle step sizes η per rate (the batched grid), (rate, η) is chosen together and the
  entry adds ``particle_step_size``."""
  groups = {}
  for r in rows:
    groups.setdefault((r['seq_len'], r['num_pairs'], r['width'], r['method']), []).append(r)
  out = {}
  choice = lambda r: (r['learning_rate'], r.get('particle_step_size'))
  for (seq_len, num_pairs, width, method), group in sorted(groups.items()):
    seed0 = [r for r in group if r['seed'] == 0]
    if not seed0:
      continue
    best = choice(max(seed0, key=selection_key))
    acc = [r['accuracy'] for r in group if choice(r) == best]
    entry = {'learning_rate': best[0], 'rates_tried': len({r['learning_rate'] for r in seed0})}
    if len({choice(r)[1] for r in seed0}) > 1:     # η swept with the rate (batched grid)
      entry['particle_step_size'] = best[1]
      entry['step_sizes_tried'] = len({choice(r)[1] for r in seed0})
    entry['accuracy'] = {'mean': float(sum(acc) / len(acc)), 'std': float(seed_std(acc)),
                         'n': len(acc)}
    out[f'{seq_len}/{num_pairs}/{width}/{method}'] = entry
  return out


def seed_std(values) -> float:
  """The standard deviation over seeds (ddof 1; 0 for one seed), as the results report it."""
  if len(values) < 2:
    return 0.0
  mean = sum(values) / len(values)
  return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def coulomb_effect(rows: List[dict], best: dict) -> dict:
  r"""``{"L/P/width": ...}``: what the Coulomb terms change, per cell where both methods of
  ``COULOMB_PAIR`` have a best rate in ``best`` (``zoology_best(rows)``).

  At each method's own chosen rate (and η), over the seeds s both have run there:
  d_s = acc(particles_softmax, s) − acc(particles_flow, s); ``difference`` is
  ``{mean, std (ddof 1), n}`` of d and ``interval_95`` d̄ ± t_{0.975, n−1}·std/√n
  (``intervals.seed_interval``; None below two seeds); ``by_seed`` is ``{"s": d_s}`` (the
  points the mean is over, drawn by ``zoology_page.coulomb_figure``). ``seed0_by_rate``: the same
  difference at seed 0 at every rate both have run (each at its chosen η), the rate's
  window side by side. ``by_rate``: at every rate both have run at two or more common
  seeds, ``{seeds, difference, interval_95}`` as above (a rate fixed in advance, e.g. the
  grid's ``coulomb_rate``, paired by seed whichever rate validation picks).
  ``calibration``: the particles_softmax runs' force ratio (repulsion / target force at
  step 0) and drift-to-noise, at the chosen rate.
  """
  first, second = COULOMB_PAIR
  out = {}
  for key in sorted(best, key=lambda k: [int(x) if x.isdigit() else x for x in k.split('/')]):
    cell, method = key.rsplit('/', 1)
    if method != first or f'{cell}/{second}' not in best:
      continue
    seq_len, num_pairs, width = (int(x) for x in cell.split('/'))

    def runs_of(name, _cell=(seq_len, num_pairs, width), _key=cell):
      eta = best[f'{_key}/{name}'].get('particle_step_size')
      return [r for r in rows
              if (r['seq_len'], r['num_pairs'], r['width'], r['method']) == (*_cell, name)
              and (eta is None or r.get('particle_step_size') == eta)]

    chosen = {}
    for name in COULOMB_PAIR:
      lr = best[f'{cell}/{name}']['learning_rate']
      chosen[name] = {r['seed']: r for r in runs_of(name) if r['learning_rate'] == lr}
    seeds = sorted(set(chosen[first]) & set(chosen[second]))
    d = [chosen[first][s]['accuracy'] - chosen[second][s]['accuracy'] for s in seeds]
    summary = {'mean': float(sum(d) / len(d)) if d else None, 'std': float(seed_std(d)),
               'n': len(d)}
    by_rate, paired = {}, {}
    for name in COULOMB_PAIR:
      for r in runs_of(name):
        paired.setdefault(r['learning_rate'], {}).setdefault(name, {})[r['seed']] = r
        if r['seed'] == 0:
          by_rate.setdefault(r['learning_rate'], {})[name] = r['accuracy']
    at_rate = {}
    for lr, got in sorted(paired.items()):
      common = sorted(set(got.get(first, {})) & set(got.get(second, {})))
      if len(common) < 2:
        continue
      d_lr = [got[first][s]['accuracy'] - got[second][s]['accuracy'] for s in common]
      at = {'mean': float(sum(d_lr) / len(d_lr)), 'std': float(seed_std(d_lr)), 'n': len(d_lr)}
      at_rate[f'{lr:g}'] = {'seeds': common, 'difference': at,
                            'interval_95': intervals.seed_interval(at)}
    calib = [r.get('calibration', {}) for r in chosen[first].values()]
    out[cell] = {
        'methods': list(COULOMB_PAIR),
        'learning_rates': [best[f'{cell}/{n}']['learning_rate'] for n in COULOMB_PAIR],
        'seeds': seeds, 'by_seed': {str(s): v for s, v in zip(seeds, d)},
        'difference': summary, 'interval_95': intervals.seed_interval(summary),
        'seed0_by_rate': {f'{lr:g}': v[first] - v[second]
                          for lr, v in sorted(by_rate.items()) if len(v) == 2},
        'by_rate': at_rate,
        'calibration': {k: sorted(c[k] for c in calib if k in c)
                        for k in ('force_ratio', 'drift_to_noise')}}
  return out


RUN_FIELDS = ('seq_len', 'num_pairs', 'width', 'method', 'learning_rate', 'seed', 'accuracy',
              'steps_run', 'state_size', 'commit', 'machine')
"""The binding fields of a ``results/mqar_zoology.json`` run (then the rest of its row)."""


def zoology_protocol(config, where: str, batched: bool = False, grid: dict = None) -> dict:
  """The settings every run of the grid shares (``config``: configs/mqar.py:zoology, with
  the grid's overrides); ``batched``: the vmapped grid's (η swept with the rate instead of a
  pilot); ``grid``: the grid's plan, for its rates and step sizes (default ``ZOOLOGY``; a
  batched one, ``batched.BATCHED_GRIDS``, must be given)."""
  if batched and grid is None:
    raise ValueError('zoology_protocol: a batched protocol needs its grid '
                     '(experiments/recall/batched.py: BATCHED_GRIDS).')
  grid = grid or ZOOLOGY
  protocol = _zoology_protocol(config, where, dict(ZOOLOGY, **grid) if batched else grid)
  if grid.get('coulomb_seeds'):
    protocol['coulomb_seeds'] = {'seeds': list(grid['coulomb_seeds']),
                                 'learning_rate': grid['coulomb_rate']}
  if grid.get('extra_seeds'):
    e = grid['extra_seeds']
    protocol['extra_seeds'] = {'methods': list(e['methods']), 'seeds': list(e['seeds']),
                               'learning_rate': e['learning_rate']}
  particles = protocol['particles']
  fixed = grid.get('step_size') is not None
  if batched or fixed:                 # η swept with the rate, or fixed in advance: no pilot
    for k in ('pilot_step_sizes', 'pilot_learning_rate', 'pilot_steps'):
      del particles[k]
  if fixed:
    particles['step_size'] = grid['step_size']
  if batched:
    particles['step_sizes'] = list(grid['step_sizes'])
    protocol['program'] = ('every (cell, width, method) one jax.vmap over its runs '
                           '(experiments/recall/batched.py)')
  return protocol


def _zoology_protocol(config, where: str, grid: dict) -> dict:
  d, m, t, p = config.data, config.model, config.train, config.particles
  return {'vocab': d.vocab_size, 'train_examples': d.train_examples, 'steps': t.steps,
          'batch': t.batch_size, 'early_stop': t.early_stop,
          'learning_rates': sorted(grid['learning_rates']), 'where': where,
          'schedule': t.schedule, 'weight_decay': t.weight_decay, 'eval_every': t.eval_every,
          'num_valid': d.num_valid, 'num_eval': d.num_eval, 'power_a': d.power_a,
          'num_layers': m.num_layers, 'num_heads': m.num_heads, 'mlp_ratio': m.mlp_ratio,
          'num_features': m.num_features, 'causal_path': m.causal_path,
          'particles': {'relative_lam': p.relative_lam, 'drift_to_noise': p.drift_to_noise,
                        'schedule': p.schedule,
                        'radius': p.radius, 'clip_norm': p.clip_norm, 'target': p.target,
                        'rows': p.rows, 'riesz_s': p.riesz_s,
                        'pilot_step_sizes': list(grid['pilot_step_sizes']),
                        'pilot_learning_rate': grid['pilot_learning_rate'],
                        'pilot_steps': grid['pilot_steps']}}


def zoology_rows(root: str):
  """``(runs, pilots)``: every finished run's row under ``root`` and under ``root/pilot``."""
  read = lambda pattern: [json.load(open(p)) for p in sorted(glob.glob(pattern))]
  try:
    return (read(os.path.join(root, '*', 'result.json')),
            read(os.path.join(root, 'pilot', '*', 'result.json')))
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f'{root}: a run result is not readable ({e}).') from None


def zoology_key(row: dict) -> tuple:
  return tuple(row.get(k) for k in ('seq_len', 'num_pairs', 'width', 'method',
                                    'learning_rate', 'seed', 'steps', 'particle_step_size'))


def zoology_file(runs: List[dict], pilots: List[dict], protocol: dict) -> dict:
  """The binding ``results/mqar_zoology.json`` object."""
  order = {m: i for i, m in enumerate(methods.METHODS)}
  sort = lambda rows: sorted(rows, key=lambda r: (r['seq_len'], r['width'],
                                                  order.get(r['method'], 99),
                                                  r['learning_rate'], r['seed']))
  shape = lambda r: dict({k: r[k] for k in RUN_FIELDS},
                         **{k: v for k, v in r.items() if k not in RUN_FIELDS})
  runs = [shape(r) for r in sort(runs)]
  best = zoology_best(runs)
  return {'protocol': protocol, 'runs': runs, 'best': best,
          'coulomb_effect': coulomb_effect(runs, best),
          'pilots': [shape(r) for r in sort(pilots)]}
