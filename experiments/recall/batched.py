r"""Many MQAR runs of one method and cell as one vmapped program (the GPU grid).

``train_program(config, specs, root)`` trains every run ``specs = [Spec(learning_rate,
seed, step_size)]`` of ``config.method`` at ``config``'s cell and width together: one
``jax.jit(jax.vmap(...))`` of ``lax.scan`` over ``train.eval_every`` steps, K = len(specs)
models side by side. Each model is the run ``experiments/recall/run.py`` makes of the
same config, step for step:

* its params are ``training.lm.make_state``'s from ``run._keys(seed)['init']``; its optimizer is
  ``training.lm.make_optimizer`` built *inside* the vmapped function from the run's own learning
  rate and, for the Langevin methods, its own η, λ and β (``methods.build``): the
  hyper-parameters are traced values, one per model;
* its batches are ``run.TrainingSet``'s (the seed's fixed training set, shuffled per
  epoch from the seed's key), gathered inside the scan from the seeds' data on device;
* its step is ``training.lm.train_step_fn``;
* λ and β of a Langevin method are ``run.calibrate``'s, on the run's initial particles and
  its first batch (once per seed and η);
* early stopping is per model: every ``eval_every`` steps each model's validation accuracy
  is read; a model at or above ``train.early_stop`` is frozen (its params, optimizer state
  and step count no longer change) and its ``steps_run`` is that step;
* its validation and test batches and their scores are ``run.evaluate``'s.

So the K = 1 program equals ``run.train_and_evaluate`` (tests/tools/test_recall_batched.py
checks the params and the scores). ``result.json`` of each run is written into
``<root>/<run name>/`` as ``run.py`` writes it, with ``runs_in_program`` = K and
``train_seconds`` = the program's training time (shared by its K runs).

The grids (``BATCHED_GRIDS``: cells × methods × rates × seeds, × η for the Langevin
methods) and their programs in order (``batched_programs``) are at the end.
"""

import json
import os
import time
import types
from typing import List, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax.training import train_state

from coulomb_jax import training
from coulomb_jax.tasks import mqar
from experiments.common import cli
from experiments.common import provenance
from experiments.recall import grid as grid_lib
from experiments.recall import methods
from experiments.recall import run as run_lib
from experiments.recall import zoology


FAILED_FILE = 'failed.json'


class Spec(NamedTuple):
  """One run of a program: its learning rate, seed and (Langevin methods) step size η."""
  learning_rate: float
  seed: int
  step_size: Optional[float] = None


def run_config(config, spec: Spec):
  """``config`` with the run's learning rate, seed and η."""
  overrides = {'train.learning_rate': spec.learning_rate, 'seed': spec.seed}
  if spec.step_size is not None:
    overrides['particles.step_size'] = spec.step_size
  return grid_lib.apply_overrides(config, overrides)


def run_name(config, spec: Spec) -> str:
  """The run's folder: ``zoology.zoology_name`` (+ ``-eta<η>`` when η is swept)."""
  d = config.data
  name = zoology.zoology_name(config.method, d.seq_len, d.num_pairs, config.model.width,
                               spec.learning_rate, spec.seed)
  return name if spec.step_size is None else f'{name}-eta{spec.step_size:.0e}'


def check_program(config, specs: Sequence[Spec]) -> None:
  """Every run's config (``run.check_config``) and what a program needs, before compute."""
  if not specs:
    raise cli.ConfigError('specs: a program needs at least one run.')
  for spec in specs:
    run_lib.check_config(run_config(config, spec))
    if (spec.step_size is not None) != (config.method in methods.LANGEVIN_METHODS):
      raise cli.ConfigError(f'specs: step_size is the Langevin methods\' (η), got '
                            f'{spec.step_size!r} for {config.method}.')
  if not config.data.train_examples:
    raise cli.ConfigError('config.data.train_examples must be > 0 for a batched program (a '
                          'fixed training set on device), got 0.')


def _stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _take(tree, k):
  return jax.tree.map(lambda x: x[k], tree)


class _Data(NamedTuple):
  train: mqar.MQARBatch     # [S, N, L]
  valid: mqar.MQARBatch     # [S, num_valid, L]
  test: mqar.MQARBatch      # [S, num_eval, L]


def _seed_data(config, seeds):
  d = config.data
  args = run_lib.data_args(config)
  per = [run_lib._keys(s) for s in seeds]   # pylint: disable=protected-access
  draw = lambda key, n: mqar.mqar_batch(key, n, **args)
  return per, _Data(_stack([draw(k['train'], d.train_examples) for k in per]),
                    _stack([draw(k['valid'], d.num_valid) for k in per]),
                    _stack([draw(k['eval'], d.num_eval) for k in per]))


def _rows(config, shuffle_keys, start: int, stop: int) -> jax.Array:
  """``[S, stop − start, B]``: the training rows of steps start..stop−1 of every seed
  (``run.TrainingSet.batch``: epoch e = t // (N // B), rows perm_e[i·B:(i+1)·B])."""
  n, b = config.data.train_examples, config.train.batch_size
  per_epoch = n // b
  steps = np.arange(start, stop)
  epochs, within = steps // per_epoch, steps % per_epoch
  first = int(epochs[0])
  cols = within[:, None] * b + np.arange(b)                     # [T, B] within the epoch
  out = []
  for key in shuffle_keys:
    perms = np.stack([np.asarray(jax.random.permutation(jax.random.fold_in(key, int(e)), n))
                      for e in range(first, int(epochs[-1]) + 1)])
    out.append(perms[epochs[:, None] - first, cols])
  return jnp.asarray(np.stack(out))


def train_program(config, specs: Sequence[Spec], root: str, log=run_lib.log_line,
                  metadata: Optional[dict] = None, deadline: Optional[float] = None
                  ) -> List[dict]:
  """Trains the runs ``specs`` of ``config.method`` as one program; writes and returns
  their rows (runs already finished under ``root`` are read, not trained, and their files
  never rewritten: a program of which some runs are finished trains only the others).

  ``deadline``: a ``time.time()`` after which the program stops between chunks and
  writes nothing (its runs stay unfinished); None: no limit.
  """
  metadata = metadata or provenance.run_metadata('experiments.mqar')
  check_program(config, specs)
  done = {s: os.path.join(root, run_name(config, s), run_lib.RESULT_FILE) for s in specs}
  done = {s: p for s, p in done.items() if os.path.exists(p)}
  if done:         # finished runs are read, never trained or written again
    todo = [s for s in specs if s not in done]
    rows = train_program(config, todo, root, log, metadata, deadline) if todo else []
    if todo and not rows:
      return []
    trained = dict(zip(todo, rows))
    return [trained[s] if s in trained else json.load(open(done[s])) for s in specs]
  names = [run_name(config, s) for s in specs]
  paths = [os.path.join(root, n, run_lib.RESULT_FILE) for n in names]
  t, d, p = config.train, config.data, config.particles
  seeds = sorted({s.seed for s in specs})
  seed_index = jnp.asarray([seeds.index(s.seed) for s in specs])
  keys, data = _seed_data(config, seeds)
  model = methods.build(config, jax.random.key_data(keys[0]['langevin'])).model
  num_answers = d.num_pairs
  # Params: training.lm.make_state's, one per seed.
  init = jax.jit(model.init)
  params0 = [init(k['init'], jnp.zeros((1, d.seq_len), jnp.int32))['params'] for k in keys]
  with_particles = training.has_particles(params0[0])
  # λ and β: run.calibrate on each (seed, η)'s initial particles and first batch.
  calibration = [None] * len(specs)
  lam = np.zeros(len(specs), np.float32)
  beta = np.full(len(specs), np.inf, np.float32)
  if config.method in methods.LANGEVIN_METHODS:
    first = _rows(config, [k['shuffle'] for k in keys], 0, 1)[:, 0]
    cache = {}
    for i, spec in enumerate(specs):
      key = (spec.seed, spec.step_size)
      if key not in cache:
        s = seeds.index(spec.seed)
        c = run_config(config, spec)
        built = methods.build(c, jax.random.key_data(keys[s]['langevin']))
        state = types.SimpleNamespace(params=params0[s])      # what calibrate reads
        batch = jax.tree.map(lambda a: a[s][first[s]], data.train)
        cache[key] = run_lib.calibrate(c, state, built.model, batch)
        log(f'{config.method} L{d.seq_len} w{config.model.width} seed {spec.seed} η '
            f'{c.particles.step_size:g}: calibrated ' +
            ', '.join(f'{a} {v:.4g}' for a, v in cache[key].items()))
      calibration[i] = cache[key]
      lam[i], beta[i] = cache[key]['lam'], cache[key]['beta']
  hyper = {'lr': jnp.asarray([s.learning_rate for s in specs], jnp.float32),
           'eta': jnp.asarray([s.step_size or p.step_size for s in specs], jnp.float32),
           'lam': jnp.asarray(lam), 'beta': jnp.asarray(beta),
           'key': jnp.stack([jax.random.key_data(keys[seeds.index(s.seed)]['langevin'])
                             for s in specs])}
  decay = t.steps if t.schedule == 'cosine' else None

  def build(h):
    m = methods.build(config, h['key'], lam=h['lam'], beta=h['beta'], step_size=h['eta'])
    tx = training.lm.make_optimizer(h['lr'], weight_decay=t.weight_decay, particle_tx=m.particle_tx,
                                    decay_steps=decay, with_particles=with_particles)
    return m, tx

  @jax.jit
  def init_opt(params, h):
    return jax.vmap(lambda pr, hh: build(hh)[1].init(pr))(params, h)

  @jax.jit
  def chunk(params, opt_state, count, active, h, sidx, rows, train):
    """``eval_every`` steps of every model; ``rows: [K, T, B]`` its seed's training rows."""
    def one(pr, os_, c, act, hh, s, rws):
      m, tx = build(hh)

      def body(carry, r):
        pr, os_, c = carry
        batch = jax.tree.map(lambda a: a[s, r], train)     # one [B, L] gather
        state = train_state.TrainState(step=c, apply_fn=model.apply, params=pr, tx=tx,
                                       opt_state=os_)
        new, metrics = training.lm.train_step_fn(state, batch, m.mimicry, m.feature_map,
                                                 num_answers)
        keep = lambda a, b: jnp.where(act, a, b)
        return (jax.tree.map(keep, new.params, pr), jax.tree.map(keep, new.opt_state, os_),
                c + act.astype(c.dtype)), None

      return jax.lax.scan(body, (pr, os_, c), rws)[0]
    return jax.vmap(one)(params, opt_state, count, active, h, sidx, rows)

  evaluate_one = jax.jit(jax.vmap(lambda pr, b: training.lm.evaluate(pr, b, model, num_answers)))

  def scores(params, split):
    """``run.evaluate`` of every model on its seed's batch of ``split`` (chunks of 256)."""
    num = split.inputs.shape[1]
    totals, count = np.zeros((len(specs), 2)), 0
    for start in range(0, num, run_lib.EVAL_CHUNK):
      part = jax.tree.map(lambda a: a[seed_index, start:start + run_lib.EVAL_CHUNK], split)
      out = evaluate_one(params, part)
      rows = part.inputs.shape[1]
      totals += rows * np.stack([np.asarray(out['loss'], np.float64),
                                 np.asarray(out['accuracy'], np.float64)], 1)
      count += rows
    return totals / count

  params = _stack([params0[seeds.index(s.seed)] for s in specs])
  initial_diversity = [run_lib.particle_diversity(jax.device_get(_take(params, k)))
                       for k in range(len(specs))]
  opt_state = init_opt(params, hyper)
  count = jnp.zeros(len(specs), jnp.int32)
  active = jnp.ones(len(specs), bool)
  stopped = [None] * len(specs)
  curves = [run_lib.valid_curve() for _ in specs]     # as run.py keeps them
  shuffle = [k['shuffle'] for k in keys]
  step, seconds = 0, 0.0
  while step < t.steps and any(s is None for s in stopped):
    stop = min(step + t.eval_every, t.steps)
    rows = _rows(config, shuffle, step, stop)              # [S, T, B]
    start = time.time()
    params, opt_state, count = chunk(params, opt_state, count, active, hyper, seed_index,
                                     rows[seed_index], data.train)
    jax.block_until_ready(params)
    seconds += time.time() - start
    step = stop
    if deadline is not None and time.time() > deadline and step < t.steps:
      log(f'{names[0]} (+{len(specs) - 1}): deadline at step {step}; nothing written')
      return []
    valid = scores(params, data.valid)
    for k in range(len(specs)):
      if stopped[k] is None and t.early_stop:
        run_lib.add_point(curves[k], step, valid[k, 1], valid[k, 0])
        if valid[k, 1] >= t.early_stop:
          stopped[k] = step
    active = jnp.asarray([s is None for s in stopped])
    log(f'{config.method} L{d.seq_len} w{config.model.width}: step {step}/{t.steps}, '
        f'{seconds:.0f} s; validation accuracy ' +
        ' '.join(f'{a:.2f}' for a in valid[:, 1]))
  test, valid = scores(params, data.test), scores(params, data.valid)
  out = []
  for k, spec in enumerate(specs):
    c = run_config(config, spec)
    row = dict(run_lib.result_row(c, {'loss': test[k, 0], 'accuracy': test[k, 1]}, seconds),
               **metadata)
    row['steps_run'] = int(count[k])
    row['valid_accuracy'] = float(valid[k, 1])
    row['valid_loss'] = float(valid[k, 0])
    row['runs_in_program'] = len(specs)
    if curves[k]['step']:
      row['valid_curve'] = curves[k]
    if calibration[k] is not None:
      row['calibration'] = calibration[k]
    if initial_diversity[k]:
      row['diversity'] = {'initial': initial_diversity[k],
                          'final': run_lib.particle_diversity(jax.device_get(_take(params, k)))}
    os.makedirs(os.path.dirname(paths[k]), exist_ok=True)
    provenance.write_json_atomic(paths[k], row, indent=2)
    out.append(row)
  log(f'{config.method} L{d.seq_len} w{config.model.width}: {len(specs)} runs in '
      f'{seconds:.0f} s; test accuracy ' + ' '.join(f'{r["accuracy"]:.3f}' for r in out))
  return out


def run_programs(config, root: str, programs, log=run_lib.log_line, *,
                 stop_starting_at: Optional[float] = None, deadline: Optional[float] = None,
                 after_program=None) -> int:
  """Every program of ``programs`` (``batched_programs``) not finished or claimed,
  in order; several workers may share ``root`` (a program is claimed by a lock on
  ``<root>/programs/<name>/lock``). No program starts after ``stop_starting_at`` and a
  program still training at ``deadline`` stops and writes nothing (``time.time()``
  values; None: no limit). ``after_program()`` runs after each finished program (the
  worker rewrites its results file there). Returns how many programs this worker made.
  A program that fails with a ``ValueError`` (e.g. a relative λ where the repulsion
  underflows to 0) writes ``<root>/programs/<name>/failed.json`` with the message and is
  not tried again there; the worker goes on with the next.
  """
  metadata = provenance.run_metadata('experiments.mqar')
  made = 0
  for name, overrides, specs in programs:
    specs = [Spec(*s) for s in specs]
    program_config = grid_lib.apply_overrides(config, overrides)
    paths = [os.path.join(root, run_name(program_config, s), run_lib.RESULT_FILE)
             for s in specs]
    if all(os.path.exists(p) for p in paths):
      continue
    if stop_starting_at is not None and time.time() > stop_starting_at:
      log(f'{root}: no program started after the budget; {name} and later not started')
      break
    failed = os.path.join(root, 'programs', name, FAILED_FILE)
    if os.path.exists(failed):
      continue
    lock = grid_lib.claim(os.path.join(root, 'programs', name))
    if lock is None:
      continue
    with lock:
      try:
        rows = train_program(program_config, specs, root, log, metadata, deadline)
      except (ValueError, cli.ConfigError) as e:     # e.g. a relative λ with no force
        log(f'{name}: failed, not retried in {root}: {e}')
        provenance.write_json_atomic(failed, dict(metadata, program=name, error=str(e)),
                                     indent=2)
        continue
    if rows:
      made += 1
      if after_program is not None:
        after_program()
  return made


# Issue 36 item 4: the whole grid as vmapped programs (``train_program``), for one GPU. A
# program is one (cell, width, method); its runs are every rate × seed (× η for the
# Langevin methods: the pilot becomes part of the sweep, (rate, η) chosen together on
# seed 0's validation batch). Most informative first: (128, 8) at width 64 (the open
# question), (64, 4), then width 128, then (256, 16).
ZOOLOGY_BATCHED = {
    'cells': (((128, 8), 64), ((64, 4), 64), ((128, 8), 128), ((64, 4), 128),
              ((256, 16), 64), ((256, 16), 128)),
    'methods': ('particles_softmax', 'particles_flow', 'hedgehog', 'taylor', 'elu',
                'favor_orthogonal', 'hedgehog_distilled', 'softmax'),
    'learning_rates': zoology.ZOOLOGY['learning_rates'],
    'seeds': zoology.ZOOLOGY['seeds'],
    'step_sizes': zoology.ZOOLOGY['pilot_step_sizes'],
    'results': 'results/mqar_zoology_gpu.json',    # its results file (runs: <name>/ beside)
}


def batched_programs(grid: dict = None):
  """``[(program name, {config field: value}, [(learning_rate, seed, step_size or None)])]``
  in the order the programs are made: per cell, every method's rates × seeds, one program
  per η for the Langevin methods (at 36 runs per program their XLA GPU compile did not end
  in 8 minutes on an H200, 2026-12-04; 12 compile in under a minute)."""
  g = grid or ZOOLOGY_BATCHED
  out = []
  for (seq_len, num_pairs), width in g['cells']:
    for method in g['methods']:
      etas = g['step_sizes'] if method in methods.LANGEVIN_METHODS else (None,)
      for eta in etas:
        specs = [(lr, seed, eta) for lr in g['learning_rates'] for seed in g['seeds']]
        name = f'{method}-L{seq_len}-P{num_pairs}-w{width}'
        out.append((name if eta is None else f'{name}-eta{eta:.0e}',
                    {'data.seq_len': seq_len, 'data.num_pairs': num_pairs,
                     'model.width': width, 'method': method}, specs))
  return out


BATCHED_GRIDS = {
    'zoology_batched': ZOOLOGY_BATCHED,
    # The same at 4x the steps (12,000, about 8 epochs of the 100k set; Zoology trains up
    # to 64), width 64 only: at 3000 steps no linear map left 0.25 at (64, 4) on the GPU
    # (results/mqar_zoology_gpu.json). (64, 4) first: there the CPU's 4x runs (seed 0)
    # left 1/P (results/mqar_zoology_long.json), so its rates x seeds answer most. Its own
    # results file (one protocol per file). The ladder from particles_flow to the distilled
    # Hedgehog (ZOOLOGY_LONG) first, one part apart per method, then the other maps.
    'zoology_batched_long': dict(ZOOLOGY_BATCHED, cells=(((64, 4), 64), ((128, 8), 64)),
                                 methods=('particles_softmax', 'particles_flow',
                                          'favor_mimicry', 'hedgehog_mimicry',
                                          'hedgehog_distilled', 'hedgehog', 'taylor', 'elu',
                                          'favor_orthogonal', 'softmax'),
                                 overrides={'train.steps': 12000},
                                 results='results/mqar_zoology_gpu_long.json'),
    # A test-sized batched grid (with configs/mqar.py:zoology,quick).
    'tiny_batched': {'results': 'workdir/mqar_tiny_batched.json',
                     'cells': (((16, 2), 16),), 'methods': ('particles_softmax', 'softmax'),
                     'learning_rates': (1e-2, 3e-3), 'seeds': (0, 1), 'step_sizes': (1e-2,)},
}
