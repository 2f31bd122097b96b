r"""Phase A of one Kernel-X run: the particles move by projected Langevin dynamics.

A Kernel-X Phase A stage also measures whether its particles learn, into
``<workdir>/phase_a_stages.json`` and, through ``phase_a_report``, ``results.json['phase_a']``
(``coulomb_jax.langevin_diagnostics`` for the definitions):

* calibration at the stage start, on ``phase_a.calibration_rows`` training rows:
  λ, β and η from the fixed config values or from the rules
  ``phase_a.relative_lam``, ``gibbs_tilt`` and ``relative_step``, and the range
  ΔU of each head's one-particle potential over the ball (Gibbs tilt β·ΔU);
* every step: the per-particle drift/noise and repulsion/alignment ratios
  (log-histograms, medians at the end);
* every ``run.log_every`` steps: the held-out alignment (objective A and the
  centered ρ) of the current particles on pooled keys of up to
  ``phase_a.heldout_rows`` validation rows (``history.jsonl``, TensorBoard);
* at the end: held-out alignment of the initial particles, of the same projected
  onto the ball (what Ball-X trains with; ``ball`` on the keys Kernel-X's layers below
  give, ``ball_own_keys`` with those layers at Ball-X's particles too, as in the
  Ball-X run: ``stages.ball_control``), of the learned ones, and of the
  particles the same stage learns from shuffled training labels (the null, when
  ``phase_a.null_run``); the particles' median displacement next to that of a
  noise-only projected walk of the same length, and the fraction of particles
  strictly inside the ball (not pinned to its sphere).

``phase_a.target = 'softmax'`` (``phase_a_mimicry.phase_a_mimicry_objective``): the same
dynamics, schedules and diagnostics on each layer's softmax-mimicry Hamiltonian of
its own queries and keys (one encoder forward per step, in the layer-wise stages
too: nothing is cached). Then the data force is ∇CE (``repulsion_to_alignment`` is
λ‖∇W‖/‖∇CE‖), ΔU is the range of the first variation of CE
(``phase_a_mimicry.phase_a_mimicry_potentials``), the held-out statistic is the attention
KL(softmax ‖ linear) (``phase_a_mimicry.heldout_attention_kl``, ``heldout_kl``) on the
held-out rows' tokens, and there is no shuffled-label null (the target uses no
labels); the stage summary says so under ``null_run``.

A step with a non-finite particle or particle gradient (the counts the jitted step
reports, ``training.nonfinite_counts``), or whose largest move or Hamiltonian is not
finite, stops the run with one ``FloatingPointError`` naming the stage, the step, and the
first particle leaf and head holding NaN/inf (``training.first_nonfinite``, else
``checkpoints.non_finite_particles``), before anything is saved.
"""

import itertools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from coulomb_jax import diagnostics
from coulomb_jax import langevin_diagnostics as ld
from coulomb_jax import training
from coulomb_jax.tasks import data
from coulomb_jax.training import phase_a_mimicry
from experiments.run import checkpoints
from experiments.run import evaluation
from experiments.run import run_folder
from experiments.run import run_identity
from experiments.run import stages
from experiments.run.phase_a_calibration import (calibrate, mimicry_fn, objective_settings,
                                                 softmax_target, stage_key, token_mean)
from experiments.run.stages import f32, i32

# What the stage summary of a softmax-target stage says instead of the null's results.
NULL_SKIPPED = ('shuffled-label null not run: the softmax target uses no labels, so it '
                'would be the same run')
# The offset of the key the noise-only walk draws (never the dynamics' own keys).
_WALK_KEY = 1 << 21


def phase_a_batches(encoded, table, config, start, steps_per_epoch, epoch_offset=0):
  """Phase A's batches from step ``start`` on, epochs counted from ``epoch_offset``.

  ``table`` None (joint objective): token batches, as ``train_batches``. Otherwise
  (one layer) the same rows' cached pooled keys ``{'r': table[rows], 'labels',
  'weights'}``: ``data.batch_indices`` gives the rows of those batches without tokens.
  """
  a, d = config.phase_a, config.data
  lengths = np.array([len(x) for x in encoded.ids])
  labels = np.asarray(encoded.labels, np.int32)
  step = start
  while True:
    epoch, offset = divmod(step, steps_per_epoch)
    if table is None:
      it = stages.train_batches(encoded, a.batch_size, config.seed, step, steps_per_epoch, d,
                                epoch_offset)
      yield from itertools.islice(it, steps_per_epoch - offset)
    else:
      epoch_rows = data.batch_indices(lengths, a.batch_size, seed=config.seed,
                                      epoch=epoch + epoch_offset, bucket_size=d.bucket_size,
                                      drop_remainder=True)
      for rows in epoch_rows[offset:steps_per_epoch]:
        yield {'r': table[rows], 'labels': labels[rows],
               'weights': np.ones(len(rows), np.float32)}
    step = (epoch + 1) * steps_per_epoch


def _heldout_fn(run, stage):
  """``params -> {path: {'alignment': [H], 'centered_alignment': [H]}}`` on validation rows
  (the softmax target: ``{path: {'kl': [H]}}``)."""
  a = run.config.phase_a
  rows = evaluation.subset(run.encoded['validation'], a.heldout_rows)
  if softmax_target(run.config):
    return _heldout_kl_fn(run, stage, rows)
  labels = np.asarray(rows.labels, np.int32)
  paths = stages.stage_paths(run, stage)
  only = stages.only_path(run, stage)
  score = jax.jit(lambda p, inputs: training.heldout_alignment(
      p, inputs, labels, feature_map=run.config.model.feature_map, only=only))

  def heldout(params):
    inputs = evaluation.pooled_keys(run.inputs_fn, params, rows, paths, run.sharder, run.config)
    out = jax.device_get(score(params, inputs))
    return {'/'.join(p): {k: [float(x) for x in v] for k, v in d.items()}
            for p, d in out.items()}

  return heldout


def _heldout_kl_fn(run, stage, rows):
  """``params -> {path: {'kl': [H]}}``: the held-out attention KL of each head, averaged
  over the real query tokens of ``rows``."""
  only, fm = stages.only_path(run, stage), run.config.model.feature_map
  fn = mimicry_fn(run, stages.stage_paths(run, stage), lambda p, inputs, mask: (
      phase_a_mimicry.heldout_attention_kl(p, inputs, mask, feature_map=fm, only=only)))

  def heldout(params):
    out = token_mean(run, rows, fn, params)
    return {'/'.join(p): {'kl': [float(x) for x in v]} for p, v in out.items()}

  return heldout


def _mean_heldout(per_path: dict) -> dict:
  """Means over the stage's heads (and layers) of each held-out statistic."""
  keys = ('kl',) if 'kl' in next(iter(per_path.values())) else (
      'alignment', 'centered_alignment')
  return {k: float(np.mean([x for d in per_path.values() for x in d[k]])) for k in keys}


def _stage_steps(run, stage, batches, state, step_fn, n_steps, start, on_step):
  """The Langevin loop shared by a stage and its shuffled-label null."""
  for t in range(start, n_steps):
    state, m = step_fn(state, run.sharder.batch(next(batches)))
    m = jax.device_get(m)
    if on_step(t, state, m):
      break
  return state


def _calibrated_step(run, index, stage, what):
  """The stage's calibration (``calibrate``, logged), Langevin optimiser and jitted step,
  and for one layer the pooled keys of every training row: ``(cal, opt, step_fn, table)``."""
  ck, config, a = run.ckpt, run.config, run.config.phase_a
  only = stages.only_path(run, stage)
  logging.info('%s: calibrating on %d training rows ...', what, a.calibration_rows)
  cal_start = time.time()
  cal = calibrate(run, index, stage, ck['stage_start'])
  cal['seconds'] = time.time() - cal_start
  settings = dict(step_size=cal['step_size'], beta=cal['beta'], radius=a.radius,
                  clip_norm=a.clip_norm)
  logging.info('%s: η %.3g, β %.3g, λ %.3g (potential range %.3g, Gibbs tilt %.3g)', what,
               cal['step_size'], cal['beta'], cal['lam'], cal['median_potential_range'],
               cal['beta'] * cal['median_potential_range'])
  key = stage_key(run, stage)
  opt = training.phase_a_optimizer(key, only=only, **settings)
  objective = objective_settings(config, cal['lam'])
  diag = dict(step_size=cal['step_size'], beta=cal['beta'], clip_norm=a.clip_norm)
  if softmax_target(config):      # Token batches for one layer too: q and k are not cached.
    step_fn = jax.jit(training.make_phase_a_step(run.model, opt, target='softmax', only=only,
                                                 langevin_settings=diag, **objective))
    table = None
  elif stage.layer is None:
    step_fn = jax.jit(training.make_phase_a_step(run.model, opt, langevin_settings=diag,
                                                 **objective))
    table = None
  else:
    layer_step = training.make_phase_a_layer_step(only, opt, langevin_settings=diag,
                                                  **objective)
    step_fn = jax.jit(lambda state, batch, f=layer_step: f(state, **batch))
    logging.info('%s: pooled keys of %d training rows ...', what, len(run.encoded['train'].labels))
    table = evaluation.pooled_keys(run.inputs_fn, ck['params'], run.encoded['train'], [only],
                                   run.sharder, config)[only]
  return cal, opt, step_fn, table


def _check_finite(what: str, step: str, state, m, saved_step: int) -> None:
  """One ``FloatingPointError`` at the first non-finite count of a step's metrics
  (``training.first_nonfinite``: the step's particles, then their gradients, naming the
  leaf and head), or if its largest move or Hamiltonian is not finite (naming the first
  particle leaf and head holding NaN/inf after the step); raised before any save. The leaf
  names the layer (``attention_0/particles``: the first attention module)."""
  first = training.first_nonfinite(m)
  if first is None and np.isfinite(m['max_move']) and np.isfinite(m['hamiltonian']):
    return
  if first is not None:
    kind, leaf, head, count = first
    where = (f'{leaf} head {head} holds {count} non-finite value(s) at the step start'
             if kind == 'particles' else
             f'the gradient of {leaf} head {head} holds {count} non-finite value(s)')
  else:
    bad = checkpoints.non_finite_particles(state.params)
    where = (f'{bad[0]} head {bad[1]} holds {bad[2]} non-finite value(s)' if bad else
             f'the Hamiltonian is {float(m["hamiltonian"])} and the largest move '
             f'{float(m["max_move"])}')
  raise FloatingPointError(
      f'{what} step {step}: {where}; stopped before saving (the last checkpoint, Phase A '
      f'step {saved_step}, is kept). Lower phase_a.relative_step, or check the inputs.')


def run_phase_a(run: stages.Run, index: int, stage) -> bool:
  """Kernel-X: the stage's particles move by projected Langevin dynamics (see module doc)."""
  ck, config, a = run.ckpt, run.config, run.config.phase_a
  n_steps = run.spe_a * stage.num_epochs
  start = int(ck['stage_step'])
  if start == 0:
    ck.update(stage_start=ck['params'], hist_drift=np.zeros_like(ck['hist_drift']),
              hist_force=np.zeros_like(ck['hist_force']))
  what = f'phase A (stage {index + 1}/{len(run.stages)}, ' + (
      'all layers' if stage.layer is None else f'layer {stage.layer + 1}/{len(run.paths)}') + ')'
  cal, opt, step_fn, table = _calibrated_step(run, index, stage, what)
  if start == 0:
    ck['opt_a'] = opt.init(ck['params'])
  heldout = _heldout_fn(run, stage)
  base = int(ck['step_a']) - start       # Phase A steps before this stage.
  epoch_offset = stage.cycle * stage.num_epochs
  hist_d = ld.LogHistogram(counts=ck['hist_drift'])
  hist_f = ld.LogHistogram(counts=ck['hist_force'])
  state = training.TrainState(i32(start), ck['params'], ck['opt_a'])
  tick = time.time()
  if start < n_steps:
    logging.info('%s: compiling and running %d steps ...', what, n_steps - start)

  def on_step(t, state, m):
    nonlocal tick
    _check_finite(what, f'{t + 1}/{n_steps}', state, m, int(ck['step_a']))
    run.steps_this_call += 1
    hist_d.add(m['drift_to_noise'])
    hist_f.add(m['repulsion_to_alignment'])
    done = float(m['max_move']) < a.tolerance or t + 1 == n_steps
    if (t + 1) % config.run.log_every == 0 or done:
      eval_start = time.time()
      h = _mean_heldout(heldout(state.params))
      tick += time.time() - eval_start     # Held-out evaluation is not Phase A's time.
      data_term = 'cross_entropy' if softmax_target(config) else 'alignment'
      held = (f"held-out KL {h['kl']:.4g}" if softmax_target(config) else
              f"held-out ρ {h['centered_alignment']:.4f} A {h['alignment']:.4g}")
      logging.info('%s step %d/%d: H %.4g %s %.4g W %.4g max move %.2e, drift/noise %.3g, '
                   '%s; %s', what, t + 1, n_steps, m['hamiltonian'],
                   'CE' if softmax_target(config) else 'A', m[data_term], m['repulsion'],
                   m['max_move'], float(np.median(m['drift_to_noise'])), held,
                   run.progress_line(base + t + 1 + int(ck['step_b'])))
      scalars = {k: m[k] for k in ('hamiltonian', data_term, 'repulsion', 'max_move')}
      scalars.update(drift_to_noise=float(np.median(m['drift_to_noise'])),
                     **{f'heldout_{k}': v for k, v in h.items()})
      run.log_scalars(f'phase_a/stage_{index}', scalars, base + t + 1)
      ck.update(step_a=i32(base + t + 1))
      run.log_record({'stage': index, 'layer': stage.layer, 'phase_a_step': t + 1,
                      'heldout': h})
    periodic = config.run.checkpoint_every and (t + 1) % config.run.checkpoint_every == 0
    if done or (t + 1) % run.spe_a == 0 or periodic or run.out_of_time():
      jax.block_until_ready(state)
      ck.update(params=state.params, opt_a=state.opt_state, step_a=i32(base + t + 1),
                stage_step=i32(n_steps if done else t + 1),
                seconds_a=ck['seconds_a'] + f32(time.time() - tick),
                hist_drift=hist_d.counts.astype(np.int32),
                hist_force=hist_f.counts.astype(np.int32))
      if done and t + 1 < n_steps:
        ck.update(stopped_early_a=i32(1))
      run.save()
      tick = time.time()
    return done or run.out_of_time()

  batches = phase_a_batches(run.encoded['train'], table, config, start, run.spe_a, epoch_offset)
  _stage_steps(run, stage, batches, state, step_fn, n_steps, start, on_step)
  if int(ck['stage_step']) < n_steps:
    return False
  summary = _stage_summary(run, index, stage, cal, heldout, step_fn, opt, table,
                           int(ck['step_a']) - base, hist_d, hist_f)
  _write_stage_summary(run, index, summary)
  ck.update(stage=i32(index + 1), stage_step=i32(0))
  run.save()
  return True


def _stage_summary(run, index, stage, cal, heldout, step_fn, opt, table, steps, hist_d,
                   hist_f) -> dict:
  """Everything a finished Phase A stage reports (module docstring)."""
  ck, config, a = run.ckpt, run.config, run.config.phase_a
  paths = stages.stage_paths(run, stage)
  tick = time.time()
  start = ck['stage_start']
  ball = stages.projected(start, paths, a.radius)
  learned = ck['params']
  result = {'initial': heldout(start), 'ball': heldout(ball), 'learned': heldout(learned)}
  own = stages.ball_control(run, start)     # = 'ball' where no layer below has moved
  if own is not None:
    result['ball_own_keys'] = (result['ball'] if not stage.layer and stage.cycle == 0
                               else heldout(own))
  moved = lambda p: training.particle_leaves(p, stages.only_path(run, stage))
  key = jax.random.fold_in(stage_key(run, stage), _WALK_KEY)
  walk = {p: ld.random_walk(jax.random.fold_in(key, i), w, num_steps=steps,
                            step_size=cal['step_size'], beta=cal['beta'], radius=a.radius)
          for i, (p, w) in enumerate(sorted(moved(ball).items()))}
  median = lambda tree_a, tree_b: float(np.median(np.concatenate(
      [np.asarray(ld.displacement(tree_a[p], tree_b[p])).ravel() for p in tree_a])))
  summary = {'stage': index, 'layer': stage.layer, 'cycle': stage.cycle, 'steps': steps,
             'settings': {'step_size': cal['step_size'], 'beta': cal['beta'],
                          'lam': cal['lam'], 'riesz_s': a.riesz_s, 'radius': a.radius,
                          'clip_norm': a.clip_norm},
             'noise_per_step': ld.noise_scale(cal['step_size'], cal['beta'],
                                               config.model.width // config.model.num_heads),
             'drift_to_noise': hist_d.median(),
             'drift_to_noise_p10_p90': [hist_d.quantile(0.1), hist_d.quantile(0.9)],
             'repulsion_to_alignment': hist_f.median(),
             'potential_range': cal['potential_range'],
             'gibbs_tilt': cal['beta'] * cal['median_potential_range'],
             'calibration_seconds': cal['seconds'],
             'displacement': median(moved(ball), moved(learned)),
             'inside_fraction': float(np.mean(np.concatenate([
                 np.asarray(jnp.linalg.norm(w, axis=-1)).ravel() < (1 - 1e-3) * a.radius
                 for w in moved(learned).values()]))),
             'random_walk_displacement': median(moved(ball), walk),
             'histograms': {'drift_to_noise': hist_d.counts.tolist(),
                            'repulsion_to_alignment': hist_f.counts.tolist()}}
  if softmax_target(config):
    summary['target'] = a.target
    if a.null_run:
      summary['null_run'] = NULL_SKIPPED
      logging.info('phase A stage %d: %s', index + 1, NULL_SKIPPED)
  elif a.null_run:
    logging.info('phase A stage %d: the same stage on shuffled training labels (null) ...',
                 index + 1)
    null_params = _null_run(run, stage, step_fn, opt, table, steps)
    result['null'] = heldout(null_params)
    summary['null_displacement'] = median(moved(ball), moved(null_params))
  summary['heldout_per_head'] = result
  summary['heldout'] = {k: _mean_heldout(v) for k, v in result.items()}
  summary['diversity'] = {name: _diversity(moved(p)) for name, p in
                          (('initial', start), ('ball', ball), ('learned', learned))}
  summary['diagnostics_seconds'] = time.time() - tick
  logging.info('phase A stage %d: %s', index + 1, json.dumps(
      {k: summary[k] for k in ('drift_to_noise', 'repulsion_to_alignment', 'gibbs_tilt',
                               'displacement', 'random_walk_displacement', 'heldout')}))
  return summary


def _diversity(leaves) -> dict:
  """``{path: {statistic: [per head]}}`` of ``diagnostics.particle_diversity``: the share of
  the cloud's variance in its top direction, its effective rank, its smallest pairwise
  distance (does the repulsion keep the particles apart?)."""
  return {'/'.join(path): {k: np.asarray(v, np.float64).ravel().tolist()
                           for k, v in diagnostics.particle_diversity(w).items()}
          for path, w in sorted(leaves.items())}


def _null_run(run, stage, step_fn, opt, table, steps):
  """The stage again from its start, same noise, training labels shuffled."""
  ck, config = run.ckpt, run.config
  rng = np.random.default_rng((config.seed, 7919, stage.layer or 0, stage.cycle))
  train = run.encoded['train']
  shuffled = train._replace(labels=rng.permutation(np.asarray(train.labels)))
  state = training.TrainState(i32(0), ck['stage_start'], opt.init(ck['stage_start']))
  batches = phase_a_batches(shuffled, table, config, 0, run.spe_a,
                            stage.cycle * stage.num_epochs)
  return _stage_steps(run, stage, batches, state, step_fn, steps, 0,
                      lambda t, s, m: False).params


def _write_stage_summary(run, index, summary):
  """Adds stage ``index``'s summary to the run folder's ``phase_a_stages.json`` (process 0)."""
  if not run.chief:
    return
  stages = (run_folder.read_json(run.folder.file(run_identity.STAGES))
            if run.folder.exists(run_identity.STAGES) else {})
  stages[str(index)] = summary
  run.folder.write_json(run_identity.STAGES, stages)
