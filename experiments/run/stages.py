r"""The stages of one training run, and what Phase A records about its dynamics.

``experiments/train.py`` turns ``config.phase_a.schedule`` into a list of
``training.Stage`` (``training.phase_schedule``) and hands each to ``run_stage``
with one ``Run`` (the run's model, data and checkpointed state). A stage is

* **Phase B** (``run_phase_b``): epochs of AdamW on everything but the particles.
  All Phase B stages of a run are one optimiser and one learning-rate schedule;
  the validation-best epoch among those from ``Run.select_from`` on is kept.
* **Phase A**, by variant: Kernel-X moves the particles by projected Langevin
  dynamics (``run_phase_a``); Ball-X only projects them onto the ball
  (``project_particles``, the control); Vanilla-X leaves them.

A Kernel-X Phase A stage also measures whether its particles learn, into
``<workdir>/phase_a_stages.json`` and ``results.json['phase_a']``
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
  onto the ball (what Ball-X trains with), of the learned ones, and of the
  particles the same stage learns from shuffled training labels (the null, when
  ``phase_a.null_run``); the particles' median displacement next to that of a
  noise-only projected walk of the same length, and the fraction of particles
  strictly inside the ball (not pinned to its sphere).
"""

import dataclasses
import itertools
import json
import os
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import traverse_util

from coulomb_jax import data
from coulomb_jax import langevin
from coulomb_jax import langevin_diagnostics as ld
from coulomb_jax import metrics as metrics_lib
from coulomb_jax import training
from experiments.common import provenance

STAGES_FILE = 'phase_a_stages.json'
# Probe points (besides the particles) where the one-particle potential's range is read.
NUM_PROBES = 1024
# Offsets of the keys the diagnostics draw (never the dynamics' own keys).
_PROBE_KEY, _WALK_KEY = 1 << 20, 1 << 21


f32 = lambda v: jnp.asarray(v, jnp.float32)
i32 = lambda v: jnp.asarray(v, jnp.int32)


# ----------------------------------------------------------------------------- data

def train_batches(encoded, batch_size, seed, step, steps_per_epoch, d, epoch_offset=0):
  """The shuffled batches of step's epoch, from step's position on (resume mid-epoch)."""
  epoch, offset = divmod(step, steps_per_epoch)
  it = data.batches(encoded, batch_size, seed=seed, epoch=epoch + epoch_offset,
                    pad_multiple=d.pad_multiple, bucket_size=d.bucket_size,
                    drop_remainder=True)
  for _ in range(offset):
    next(it)
  return it


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
      it = train_batches(encoded, a.batch_size, config.seed, step, steps_per_epoch, d,
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


def subset(encoded, size, seed=0):
  """A fixed random ``size`` rows of ``encoded`` (all of them if it has fewer), in order."""
  n = len(encoded.labels)
  if size >= n:
    return encoded
  keep = np.sort(np.random.default_rng(seed).permutation(n)[:size])
  return data.Encoded([encoded.ids[i] for i in keep], [encoded.segments[i] for i in keep],
                      np.asarray(encoded.labels)[keep])


def pooled_keys(inputs_fn, params, encoded, paths, sharder, config) -> dict:
  """``{path: [n, H, D_h]}``: every row's pooled keys r entering the attention at ``paths``.

  ``inputs_fn(params, batch, paths)``: the jitted ``training.phase_a_inputs`` restricted
  to ``paths`` (static; layers above them are not computed). One forward pass (no
  dropout) over ``encoded`` in length-bucketed batches of ``run.eval_batch_size``.
  """
  d = config.data
  tables = {}
  paths = tuple(tuple(p) for p in paths)
  for batch in data.batches(encoded, config.run.eval_batch_size, seed=0,
                            pad_multiple=d.pad_multiple, bucket_size=d.bucket_size):
    out = inputs_fn(params, sharder.batch(batch), paths)
    rows = batch['index'] >= 0
    for path in paths:
      r = sharder.to_host(out[tuple(path)])
      if path not in tables:
        tables[path] = np.zeros((len(encoded.labels),) + r.shape[1:], np.float32)
      tables[path][batch['index'][rows]] = r[rows]
  return tables


def evaluate(predict, params, encoded, batch_size, sharder, config, with_probs=False):
  """Metrics of ``coulomb_jax.metrics.classification_metrics`` on one split.

  ``with_probs``: also return the ``[n]`` probabilities of class 1, in row order.
  """
  probs = []
  for batch in data.batches(encoded, batch_size, pad_multiple=config.data.pad_multiple):
    p = sharder.to_host(predict(params, sharder.batch(batch)))
    probs.append(p[batch['weights'] > 0])
  probs = np.clip(np.concatenate(probs).astype(np.float64), 0.0, 1.0)
  metrics = metrics_lib.classification_metrics(encoded.labels, probs)
  return (metrics, probs) if with_probs else metrics


def better(new, best_accuracy, best_log_loss):
  """Higher accuracy, ties broken by lower log loss; compared as the stored float32."""
  acc, loss = np.float32(new['accuracy']), np.float32(new['log_loss'])
  return bool(acc > best_accuracy or (acc == best_accuracy and loss < best_log_loss))


# ----------------------------------------------------------------------------- the run

@dataclasses.dataclass
class Run:
  """What every stage of one run shares. ``ckpt`` is the checkpointed state (a dict
  of arrays, updated in place); ``save()`` writes it."""
  config: Any
  workdir: str
  kind: str                     # 'kernel', 'ball', 'vanilla' or 'other' (no particles)
  model: Any
  encoded: dict                 # 'train', 'validation', 'test': data.Encoded
  sharder: Any
  paths: list                   # attention modules holding particles, in layer order
  stages: list                  # training.Stage, in order
  ckpt: dict
  save: Callable[[], None]
  langevin_key: jax.Array
  dropout_key: jax.Array
  step_b: Callable
  predict: Callable
  inputs_fn: Callable           # jitted training.phase_a_inputs
  spe_a: int                    # Phase A steps per epoch
  spe_b: int                    # Phase B steps per epoch
  total_b: int                  # Phase B steps in all
  select_from: int              # first Phase B epoch model selection may keep
  writer: Any = None
  chief: bool = True
  stop_after_steps: Optional[int] = None
  save_prefix: Optional[Callable[[], None]] = None
  progress: Any = None          # experiments.common.progress.Progress over all the run's steps
  steps_this_call: int = 0

  def out_of_time(self) -> bool:
    return self.stop_after_steps is not None and self.steps_this_call >= self.stop_after_steps

  def global_step(self) -> int:
    return int(self.ckpt['step_a']) + int(self.ckpt['step_b'])

  def progress_line(self, done: int) -> str:
    """``done/total steps, elapsed, rate, ETA`` of the whole run (Phase A and B steps)."""
    if self.progress is None:
      return ''
    self.progress.done = done
    return self.progress.line().split('] ', 1)[-1]

  def log_record(self, record: dict) -> None:
    if self.chief:
      with open(os.path.join(self.workdir, 'history.jsonl'), 'a') as f:
        f.write(json.dumps(dict(record, t=self.global_step())) + '\n')

  def log_scalars(self, prefix, values, step):
    if self.writer is not None:
      for k, v in values.items():
        self.writer.add_scalar(f'{prefix}/{k}', float(v), step)


def run_stage(run: Run, index: int) -> bool:
  """Runs (or resumes) stage ``index``; False if the run must stop (out of time)."""
  stage = run.stages[index]
  if stage.phase == 'b':
    return run_phase_b(run, index, stage)
  if run.kind == 'kernel':
    return run_phase_a(run, index, stage)
  if run.kind == 'ball':
    project_particles(run, index, stage)
  else:
    run.ckpt.update(stage=i32(index + 1), stage_step=i32(0))
  return True


def _stage_paths(run, stage):
  return run.paths if stage.layer is None else [run.paths[stage.layer]]


def _only(run, stage):
  return None if stage.layer is None else run.paths[stage.layer]


def _projected(params, paths, radius):
  flat = traverse_util.flatten_dict(params)
  paths = {tuple(p) for p in paths}
  return traverse_util.unflatten_dict(
      {k: langevin.project_to_ball(v, radius) if k[-1] == training.PARTICLES and k[:-1] in paths
       else v for k, v in flat.items()})


def project_particles(run: Run, index: int, stage) -> None:
  """Ball-X: the stage's particles projected onto the ball; nothing else moves."""
  params = _projected(run.ckpt['params'], _stage_paths(run, stage), run.config.phase_a.radius)
  run.ckpt.update(params=run.sharder.replicate(params), stage=i32(index + 1),
                  stage_step=i32(0))
  run.save()


# ----------------------------------------------------------------------------- Phase B

def run_phase_b(run: Run, index: int, stage) -> bool:
  """Epochs ``stage.first_epoch`` .. of Phase B; validation after each epoch."""
  ck, config, b = run.ckpt, run.config, run.config.phase_b
  first, last = stage.first_epoch * run.spe_b, (stage.first_epoch + stage.num_epochs) * run.spe_b
  state = training.TrainState(ck['step_b'], ck['params'], ck['opt_b'])
  start, tick = max(int(state.step), first), time.time()
  if start < last:
    logging.info('phase B epochs %d-%d (stage %d/%d): compiling the step ...', stage.first_epoch,
                 stage.first_epoch + stage.num_epochs - 1, index + 1, len(run.stages))
  for t in range(start, last):
    epoch = t // run.spe_b
    if t == start or t % run.spe_b == 0:
      it = train_batches(run.encoded['train'], b.batch_size, config.seed + 1, t, run.spe_b,
                         config.data)
    state, m = run.step_b(run.dropout_key, state, run.sharder.batch(next(it)))
    run.steps_this_call += 1
    if (t + 1) % config.run.log_every == 0:
      m = jax.device_get(m)
      logging.info('phase B step %d/%d (epoch %d): loss %.4f acc %.3f; %s', t + 1, run.total_b,
                   epoch, m['loss'], m['accuracy'],
                   run.progress_line(int(ck['step_a']) + t + 1))
      run.log_scalars('phase_b', m, t + 1)
    end_of_epoch = (t + 1) % run.spe_b == 0
    periodic = config.run.checkpoint_every and (t + 1) % config.run.checkpoint_every == 0
    if end_of_epoch or periodic or run.out_of_time():
      jax.block_until_ready(state)
      ck.update(params=state.params, opt_b=state.opt_state, step_b=state.step,
                seconds_b=ck['seconds_b'] + f32(time.time() - tick))
      if end_of_epoch:
        _end_of_epoch(run, state, epoch, t)
      if t + 1 == last:
        ck.update(stage=i32(index + 1), stage_step=i32(0))
      run.save()
      tick = time.time()
      if t + 1 == last and run.save_prefix is not None and index == 0 and (
          index + 1 < len(run.stages) and run.stages[index + 1].phase == 'a'):
        run.save_prefix()
    if run.out_of_time() and t + 1 < last:
      return False
  if start >= last:   # Nothing left of this stage (a resumed run).
    ck.update(stage=i32(index + 1), stage_step=i32(0))
  return True


def _end_of_epoch(run, state, epoch, t):
  ck, config = run.ckpt, run.config
  val = evaluate(run.predict, state.params, run.encoded['validation'],
                 config.run.eval_batch_size, run.sharder, config)
  logging.info('epoch %d validation: %s', epoch, json.dumps(val))
  run.log_scalars('validation', val, t + 1)
  run.log_record({'epoch': epoch, 'step': t + 1, 'validation': val})
  if epoch >= run.select_from and better(val, np.float32(ck['best_accuracy']),
                                         np.float32(ck['best_log_loss'])):
    ck.update(best_params=state.params, best_accuracy=f32(val['accuracy']),
              best_log_loss=f32(val['log_loss']), best_epoch=i32(epoch))


# ----------------------------------------------------------------------------- Phase A

def stage_key(run: Run, stage) -> jax.Array:
  """The Langevin noise key of a Phase A stage: the run's key for the joint stage,
  ``fold_in(key, layer + cycle·L)`` for one layer (layer l of the first pass:
  ``fold_in(key, l)``, as the layer-wise schedule always had)."""
  if stage.layer is None:
    return run.langevin_key
  return jax.random.fold_in(run.langevin_key, stage.layer + stage.cycle * len(run.paths))


def _objective(config, lam):
  a = config.phase_a
  riesz_s = a.riesz_s if a.riesz_s == 'coulomb' else float(a.riesz_s)
  return dict(feature_map=config.model.feature_map, lam=lam, s=riesz_s, softening=a.softening)


def calibrate(run: Run, index: int, stage, params) -> dict:
  """λ, β, η of the stage and each head's potential range ΔU, at ``params`` projected.

  On ``phase_a.calibration_rows`` fixed training rows (deterministic, so a resumed
  stage recomputes the same values). Fixed config values unless a rule is on:
  λ = relative_lam·median‖∇A_k‖/median‖∇W_k‖; β = gibbs_tilt / median ΔU;
  η such that the median drift is relative_step·R.
  """
  a = run.config.phase_a
  paths = _stage_paths(run, stage)
  only = _only(run, stage)
  params = _projected(params, paths, a.radius)
  rows = subset(run.encoded['train'], a.calibration_rows, seed=run.config.seed)
  inputs = pooled_keys(run.inputs_fn, params, rows, paths, run.sharder, run.config)
  labels = np.asarray(rows.labels, np.int32)
  weights = np.ones(len(labels), np.float32)
  forces = jax.jit(lambda p, lam: training.phase_a_forces(
      p, inputs, labels, weights, only=only, **_objective(run.config, lam)))
  unit = forces(params, 1.0)
  lam = (ld.relative_lam(unit['repulsion'], unit['alignment'], a.relative_lam)
         if a.relative_lam else float(a.lam))
  ranges = training.phase_a_potential_range(
      jax.random.fold_in(stage_key(run, stage), _PROBE_KEY), params, inputs, labels,
      feature_map=run.config.model.feature_map, radius=a.radius, num_probes=NUM_PROBES,
      only=only)
  ranges = {'/'.join(p): [float(x) for x in np.asarray(v)] for p, v in ranges.items()}
  median_range = float(np.median(np.concatenate([np.asarray(v) for v in ranges.values()])))
  beta = ld.tilt_beta(median_range, a.gibbs_tilt) if a.gibbs_tilt else float(a.beta)
  grad_h = forces(params, lam)['hamiltonian'] if lam != 1.0 else unit['hamiltonian']
  step_size = (ld.relative_step_size(grad_h, fraction=a.relative_step, radius=a.radius,
                                     clip_norm=a.clip_norm)
               if a.relative_step else float(a.step_size))
  return {'step_size': step_size, 'beta': beta, 'lam': lam, 'potential_range': ranges,
          'median_potential_range': median_range}


def _heldout_fn(run, stage):
  """``params -> {path: {'alignment': [H], 'centered_alignment': [H]}}`` on validation rows."""
  a = run.config.phase_a
  rows = subset(run.encoded['validation'], a.heldout_rows)
  labels = np.asarray(rows.labels, np.int32)
  paths = _stage_paths(run, stage)
  score = jax.jit(lambda p, inputs: training.heldout_alignment(
      p, inputs, labels, feature_map=run.config.model.feature_map, only=_only(run, stage)))

  def heldout(params):
    inputs = pooled_keys(run.inputs_fn, params, rows, paths, run.sharder, run.config)
    out = jax.device_get(score(params, inputs))
    return {'/'.join(p): {k: [float(x) for x in v] for k, v in d.items()}
            for p, d in out.items()}

  return heldout


def _mean_heldout(per_path: dict) -> dict:
  """Means over the stage's heads (and layers) of each held-out statistic."""
  keys = ('alignment', 'centered_alignment')
  return {k: float(np.mean([x for d in per_path.values() for x in d[k]])) for k in keys}


def _stage_steps(run, stage, batches, state, step_fn, n_steps, start, on_step):
  """The Langevin loop shared by a stage and its shuffled-label null."""
  for t in range(start, n_steps):
    state, m = step_fn(state, run.sharder.batch(next(batches)))
    m = jax.device_get(m)
    if on_step(t, state, m):
      break
  return state


def run_phase_a(run: Run, index: int, stage) -> bool:
  """Kernel-X: the stage's particles move by projected Langevin dynamics (see module doc)."""
  ck, config, a = run.ckpt, run.config, run.config.phase_a
  only, paths = _only(run, stage), _stage_paths(run, stage)
  n_steps = run.spe_a * stage.num_epochs
  start = int(ck['stage_step'])
  if start == 0:
    ck.update(stage_start=ck['params'], hist_drift=np.zeros_like(ck['hist_drift']),
              hist_force=np.zeros_like(ck['hist_force']))
  what = f'phase A (stage {index + 1}/{len(run.stages)}, ' + (
      'all layers' if stage.layer is None else f'layer {stage.layer + 1}/{len(run.paths)}') + ')'
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
  objective = _objective(config, cal['lam'])
  diag = dict(step_size=cal['step_size'], beta=cal['beta'], clip_norm=a.clip_norm)
  if stage.layer is None:
    step_fn = jax.jit(training.make_phase_a_step(run.model, opt, langevin_settings=diag,
                                                 **objective))
    table = None
  else:
    layer_step = training.make_phase_a_layer_step(only, opt, langevin_settings=diag,
                                                  **objective)
    step_fn = jax.jit(lambda state, batch, f=layer_step: f(state, **batch))
    logging.info('%s: pooled keys of %d training rows ...', what, len(run.encoded['train'].labels))
    table = pooled_keys(run.inputs_fn, ck['params'], run.encoded['train'], [only], run.sharder,
                        config)[only]
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
    run.steps_this_call += 1
    hist_d.add(m['drift_to_noise'])
    hist_f.add(m['repulsion_to_alignment'])
    done = float(m['max_move']) < a.tolerance or t + 1 == n_steps
    if (t + 1) % config.run.log_every == 0 or done:
      eval_start = time.time()
      h = _mean_heldout(heldout(state.params))
      tick += time.time() - eval_start     # Held-out evaluation is not Phase A's time.
      logging.info('%s step %d/%d: H %.4g A %.4g W %.4g max move %.2e, drift/noise %.3g, '
                   'held-out ρ %.4f A %.4g; %s', what, t + 1, n_steps, m['hamiltonian'],
                   m['alignment'], m['repulsion'], m['max_move'],
                   float(np.median(m['drift_to_noise'])), h['centered_alignment'],
                   h['alignment'], run.progress_line(base + t + 1 + int(ck['step_b'])))
      scalars = {k: m[k] for k in ('hamiltonian', 'alignment', 'repulsion', 'max_move')}
      scalars.update(drift_to_noise=float(np.median(m['drift_to_noise'])),
                     heldout_alignment=h['alignment'],
                     heldout_centered_alignment=h['centered_alignment'])
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
  paths = _stage_paths(run, stage)
  tick = time.time()
  start = ck['stage_start']
  ball = _projected(start, paths, a.radius)
  learned = ck['params']
  result = {'initial': heldout(start), 'ball': heldout(ball), 'learned': heldout(learned)}
  moved = lambda p: training.particle_leaves(p, _only(run, stage))
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
  if a.null_run:
    logging.info('phase A stage %d: the same stage on shuffled training labels (null) ...',
                 index + 1)
    null_params = _null_run(run, stage, step_fn, opt, table, steps)
    result['null'] = heldout(null_params)
    summary['null_displacement'] = median(moved(ball), moved(null_params))
  summary['heldout_per_head'] = result
  summary['heldout'] = {k: _mean_heldout(v) for k, v in result.items()}
  summary['diagnostics_seconds'] = time.time() - tick
  logging.info('phase A stage %d: %s', index + 1, json.dumps(
      {k: summary[k] for k in ('drift_to_noise', 'repulsion_to_alignment', 'gibbs_tilt',
                               'displacement', 'random_walk_displacement', 'heldout')}))
  return summary


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
  if not run.chief:
    return
  path = os.path.join(run.workdir, STAGES_FILE)
  stages = {}
  if os.path.exists(path):
    with open(path) as f:
      stages = json.load(f)
  stages[str(index)] = summary
  provenance.write_json_atomic(path, stages, indent=1)


def phase_a_report(workdir: str) -> Optional[dict]:
  """``results.json['phase_a']``: the stage summaries and their aggregates (None if none).

  ``drift_to_noise`` / ``repulsion_to_alignment``: medians over every particle and
  step of every stage (the stages' histograms added); held-out statistics: means
  over the stages; ``gibbs_tilt`` and displacements: medians over the stages.
  """
  path = os.path.join(workdir, STAGES_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    stages = [s for _, s in sorted(json.load(f).items(), key=lambda kv: int(kv[0]))]
  hist = {k: ld.LogHistogram(counts=np.sum([s['histograms'][k] for s in stages], axis=0))
          for k in ('drift_to_noise', 'repulsion_to_alignment')}
  which = [k for k in ('initial', 'ball', 'learned', 'null') if k in stages[0]['heldout']]
  mean = lambda k, stat: float(np.mean([s['heldout'][k][stat] for s in stages]))
  med = lambda field: float(np.median([s[field] for s in stages]))
  return {'drift_to_noise': hist['drift_to_noise'].median(),
          'repulsion_to_alignment': hist['repulsion_to_alignment'].median(),
          'gibbs_tilt': med('gibbs_tilt'), 'displacement': med('displacement'),
          'random_walk_displacement': med('random_walk_displacement'),
          'inside_fraction': float(np.mean([s['inside_fraction'] for s in stages])),
          'heldout_alignment': {k: mean(k, 'alignment') for k in which},
          'heldout_centered_alignment': {k: mean(k, 'centered_alignment') for k in which},
          'stages': [{k: v for k, v in s.items() if k != 'histograms'} for s in stages]}
