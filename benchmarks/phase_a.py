r"""What Phase A costs: H + ∇H per step vs n and N, and Phase A against Phase B.

  python -m benchmarks.phase_a --out=benchmarks/results
  python -m benchmarks.phase_a --runs=workdir/grid      # also the measured shares of real runs
  python -m benchmarks.phase_a --page_from_results     # the page from benchmarks/results/phase_a.json

Three tables (median of repeated calls after one warm-up, ``block_until_ready``):

1. ``objective``: one jitted H + ∇H of one head's Phase A objective
   (``hamiltonian.hamiltonian_terms``: alignment of the feature map of n pooled
   representations ``[n, D_h]`` + λ·Riesz energy of N particles), vs n and N.
2. ``steps``: one Phase A step (``training.make_phase_a_step``: a forward pass
   for the pooled keys, H + ∇H, the Langevin move) and one Phase B step
   (forward + backward + AdamW) of the paper-sized encoder (2 layers, width 128,
   2 heads, FFN 256, 256 features per head), batch 64, vs the padded length L.
   ``share`` = e_A·t_A / (e_A·t_A + e_B·t_B): Phase A's fraction of the training
   time for e_A, e_B epochs of the same number of steps (the paper: 10 and 10).
3. ``runs`` (with ``--runs``): the measured ``phase_a_seconds`` and
   ``phase_b_seconds`` of finished ``experiments.train`` runs.

Writes ``phase_a.json`` and ``phase_a.md`` (``markdown`` of the JSON alone, so
``--page_from_results`` rewrites it from a committed JSON), each replaced atomically. A bad flag value (a map linear attention does
not take, n below 2, a size below 1, a malformed ``--epochs``, a ``--runs`` folder that is
not there, an ``--out`` that is a file) ends in one line naming the flag, exit status 2,
before anything is computed or written.
"""

import datetime
import glob
import json
import os

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import flag_checks
from benchmarks import pages
from benchmarks.timing import median_seconds
from coulomb_jax import features
from coulomb_jax import hamiltonian
from coulomb_jax import training
from coulomb_jax.layers import models
from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance

_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output directory.')
_NS = flags.DEFINE_list('n', ['64', '256', '1024', '4096'], 'Rows n of the objective.')
_MS = flags.DEFINE_list('num_features', ['64', '256', '1024'], 'Particles N per head.')
_LENGTHS = flags.DEFINE_list('lengths', ['32', '64', '128'], 'Padded lengths L of the steps.')
_MAP = flags.DEFINE_string('feature_map', 'favor', 'Feature map.')
_EPOCHS = flags.DEFINE_string('epochs', '10,10:1,2:2,5',
                              'Phase A,B epoch pairs (colon-separated) for the share column.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per case (median reported).')
_RUNS = flags.DEFINE_string('runs', '', 'Root of experiments.train runs (optional).')
_PAGE_FROM_RESULTS = flags.DEFINE_bool(
    'page_from_results', False, 'Only rewrite <--out>/phase_a.md from <--out>/phase_a.json '
    '(nothing measured; refused beside a flag that changes what is measured).')
# Refused with --page_from_results: the flags that say what is measured.
RUN_FLAGS = ('n', 'num_features', 'lengths', 'feature_map', 'epochs', 'repeats', 'runs')


def objective_rows():
  rows = []
  key = jax.random.key(0)
  for num in map(int, _MS.value):
    for n in map(int, _NS.value):
      omega = 0.2 * jax.random.normal(jax.random.fold_in(key, num), (num, 64))
      x = 0.3 * jax.random.normal(jax.random.fold_in(key, n), (n, 64))
      y = jnp.sign(jax.random.normal(jax.random.fold_in(key, 7), (n,)))
      fn = jax.jit(jax.value_and_grad(lambda o, x, y: hamiltonian.hamiltonian(
          o, x, y, feature_map=_MAP.value, lam=1e-3)))
      rows.append({'n': n, 'N': num, 'ms': 1e3 * median_seconds(fn, omega, x, y,
                                                               repeats=_REPEATS.value)})
      print(json.dumps(rows[-1]), flush=True)
  return rows


def step_rows():
  model = models.EncoderClassifier(vocab_size=16384, feature_map=_MAP.value)
  rows = []
  for length in map(int, _LENGTHS.value):
    rng = np.random.default_rng(length)
    lengths = rng.integers(length // 2, length + 1, 64)
    mask = np.arange(length)[None] < lengths[:, None]
    ids = np.where(mask, rng.integers(5, 16384, (64, length)), 0).astype(np.int32)
    batch = {'ids': ids, 'segments': np.zeros_like(ids), 'mask': mask,
             'labels': rng.integers(0, 2, 64).astype(np.int32),
             'weights': np.ones(64, np.float32)}
    params = model.init(jax.random.key(0), ids, batch['segments'], mask)['params']
    opt_a = training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=2e-3, beta=50.0,
                                       radius=1.5, clip_norm=10.0)
    opt_b = training.phase_b_optimizer(learning_rate=2e-4, warmup_steps=10, total_steps=100,
                                       weight_decay=1e-4, clip_norm=1.0)
    step_a = jax.jit(training.make_phase_a_step(model, opt_a, feature_map=_MAP.value,
                                                lam=1e-3, s='coulomb', softening=0.5))
    step_b = jax.jit(training.make_phase_b_step(model, opt_b))
    zero = jnp.zeros([], jnp.int32)
    state_a = training.TrainState(zero, params, opt_a.init(params))
    state_b = training.TrainState(zero, params, opt_b.init(params))
    t_a = median_seconds(step_a, state_a, batch, repeats=_REPEATS.value)
    t_b = median_seconds(lambda s, b: step_b(jax.random.key(1), s, b), state_b, batch,
                         repeats=_REPEATS.value)
    # Layer-wise schedule: per layer, one forward pass for the cache (timed for the
    # deepest layer, an upper bound) and e_A epochs of steps on cached [B, H, D_h] keys.
    paths = training.attention_paths(params)
    deepest = paths[-1]
    cache = jax.jit(lambda p, b: training.phase_a_inputs(model, p, b)[deepest])
    t_c = median_seconds(cache, params, batch, repeats=_REPEATS.value)
    opt_l = training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=2e-3, beta=50.0,
                                       radius=1.5, clip_norm=10.0, only=deepest)
    step_l = jax.jit(training.make_phase_a_layer_step(deepest, opt_l, feature_map=_MAP.value,
                                                      lam=1e-3, s='coulomb', softening=0.5))
    r = cache(params, batch)
    t_l = median_seconds(step_l, training.TrainState(zero, params, opt_l.init(params)), r,
                         batch['labels'], batch['weights'], repeats=_REPEATS.value)
    row = {'L': length, 'phase_a_ms': 1e3 * t_a, 'phase_b_ms': 1e3 * t_b,
           'layerwise_cache_ms': 1e3 * t_c, 'layerwise_step_ms': 1e3 * t_l,
           'num_layers': len(paths)}
    for pair in _EPOCHS.value.split(':'):
      e_a, e_b = map(int, pair.split(','))
      row[f'share_{e_a}_{e_b}'] = e_a * t_a / (e_a * t_a + e_b * t_b)
      t_lw = len(paths) * (t_c + e_a * t_l)
      row[f'layerwise_share_{e_a}_{e_b}'] = t_lw / (t_lw + e_b * t_b)
    rows.append(row)
    print(json.dumps(row), flush=True)
  return rows


def run_rows(root):
  rows = []
  for path in sorted(glob.glob(os.path.join(root, '*', '*', 'seed*', 'results.json'))):
    with open(path) as f:
      r = json.load(f)
    if r.get('phase_a_steps'):
      total = r['phase_a_seconds'] + r['phase_b_seconds']
      rows.append({'dataset': r['dataset'], 'variant': r['variant'], 'seed': r['seed'],
                   'phase_a_epochs': r['config']['phase_a']['num_epochs'],
                   'phase_b_epochs': r['config']['phase_b']['num_epochs'],
                   'phase_a_seconds': r['phase_a_seconds'],
                   'phase_b_seconds': r['phase_b_seconds'],
                   'share': r['phase_a_seconds'] / total, 'commit': r['commit']})
  return rows


def _share_table(steps, pairs, columns, share_key):
  """Markdown rows: L, the ``(header, cell_fn)`` columns, then one share column per pair."""
  header = ['L'] + [h for h, _ in columns] + [f'A share ({a} A + {b} B epochs)' for a, b in pairs]
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for r in steps:
    cells = [str(r['L'])] + [fn(r) for _, fn in columns]
    cells += [f"{100 * r[f'{share_key}_{a}_{b}']:.1f}%" for a, b in pairs]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return lines


def markdown(record: dict) -> str:
  """The page of a record (``phase_a.json``): its provenance and the three tables, with the
  n, N and epoch pairs of the record's command."""
  settings = pages.command_flags(record['command'])
  ns = settings['n'].split(',')
  objective, steps, runs = record['objective'], record['steps'], record['runs']
  lines = ['## H + ∇H of one head (ms)', '', '| N \\ n | ' + ' | '.join(ns) + ' |',
           '|---|' + '---|' * len(ns)]
  for num in map(int, settings['num_features'].split(',')):
    cells = [f"{r['ms']:.2f}" for r in objective if r['N'] == num]
    lines.append(f'| {num} | ' + ' | '.join(cells) + ' |')
  pairs = [tuple(map(int, p.split(','))) for p in settings['epochs'].split(':')]
  joint = [('Phase A step', lambda r: f"{r['phase_a_ms']:.1f}"),
           ('Phase B step', lambda r: f"{r['phase_b_ms']:.1f}"),
           ('A ÷ B', lambda r: f"{r['phase_a_ms'] / r['phase_b_ms']:.3f}")]
  layerwise = [('cache forward', lambda r: f"{r['layerwise_cache_ms']:.1f}"),
               ('layer step', lambda r: f"{r['layerwise_step_ms']:.2f}")]
  lines += ['', '## One step of the paper-sized encoder, batch 64 (ms)', '',
            'Joint schedule (`phase_a.schedule=joint`): every Phase A step runs the encoder '
            'forward.', '', *_share_table(steps, pairs, joint, 'share'), '',
            'Layer-wise schedule (`phase_a.schedule=layerwise`): per layer, one forward '
            'pass for the cached pooled keys (the deepest layer\'s, timed per batch) and '
            'e_A epochs of steps on them; share = n_layers·(cache + e_A·step) / (that + '
            'e_B·Phase B step), per batch.', '',
            *_share_table(steps, pairs, layerwise, 'layerwise_share')]
  if runs:
    lines += ['', '## Measured in experiments.train runs', '',
              '| dataset | variant | seed | epochs A / B | Phase A (s) | Phase B (s) | A share |',
              '|---|---|---|---|---|---|---|']
    for r in runs:
      lines.append(f"| {r['dataset']} | {r['variant']} | {r['seed']} | "
                   f"{r['phase_a_epochs']} / {r['phase_b_epochs']} | {r['phase_a_seconds']:.0f} | "
                   f"{r['phase_b_seconds']:.0f} | {100 * r['share']:.1f}% |")
  table = '\n'.join(lines)
  return (f"# Phase A cost\n\nCommand: `{record['command']}`  \n"
          f"Date: {record['date']}  \nCommit: {record['commit']}  \n"
          f"Machine: {json.dumps(record['machine'])}\n\n{table}\n")


def check_flags(argv) -> None:
  """Every flag, before anything is computed or written: one ``cli.ConfigError`` naming
  the flag and its value."""
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  maps = features.names(attention=True)        # the encoder's attention takes the map
  if _MAP.value not in maps:
    raise cli.ConfigError(f'--feature_map: expected a map of linear attention, one of '
                          f'{sorted(maps)}, got {_MAP.value!r}.')
  flag_checks.check_ints(_NS, 2)                                # the alignment pairs distinct rows: n ≥ 2
  flag_checks.check_ints(_MS, 1)
  flag_checks.check_ints(_LENGTHS, 1)
  for pair in _EPOCHS.value.split(':'):
    try:
      e_a, e_b = map(int, pair.split(','))
      ok = e_a >= 0 and e_b >= 0 and e_a + e_b > 0
    except ValueError:
      ok = False
    if not ok:
      raise cli.ConfigError(f'--epochs: expected Phase A,B epoch pairs of integers ≥ 0, not '
                            f'both 0, separated by colons (10,10:1,2), got {pair!r} in '
                            f'{_EPOCHS.value!r}.')
  if _REPEATS.value < 1:
    raise cli.ConfigError(f'--repeats: expected an integer ≥ 1, got {_REPEATS.value}.')
  if _RUNS.value:
    outputs.check_folder('--runs', _RUNS.value, must_exist=True)
  outputs.check_folder('--out', _OUT.value)
  outputs.check_files_in('--out', _OUT.value, ('phase_a.json', 'phase_a.md'))


def main(argv):
  if _PAGE_FROM_RESULTS.value:
    if len(argv) > 1:
      raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
    print(pages.rewrite_page(_OUT.value, 'phase_a', markdown, RUN_FLAGS))
    return
  check_flags(argv)
  objective, steps = objective_rows(), step_rows()
  runs = run_rows(_RUNS.value) if _RUNS.value else []
  flag_text = ' '.join(f'--{f.name}={",".join(f.value) if isinstance(f.value, list) else f.value}'
                       for f in (_NS, _MS, _LENGTHS, _MAP, _EPOCHS, _REPEATS, _RUNS))
  record = {'benchmark': 'phase_a', 'command': f'python -m benchmarks.phase_a {flag_text}',
            'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            'commit': provenance.git_commit(), 'machine': provenance.machine(),
            'objective': objective, 'steps': steps, 'runs': runs}
  pages.write_record(_OUT.value, 'phase_a', record, markdown)


if __name__ == '__main__':
  cli.run(main, config_flags=())
