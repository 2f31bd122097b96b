r"""One MQAR run: check the config, train (resuming from the last checkpoint), evaluate.

``train_and_evaluate(config, workdir)`` writes into ``workdir``:

* ``config.json``: the run's config; a workdir holding another config is refused;
* ``checkpoint.msgpack``: ``{step, seconds, state, valid_curve, segments}`` every
  ``train.checkpoint_every`` steps, written to a temporary file and renamed (a killed run
  loses at most that many steps);
* ``result.json``: the binding row of ``results/mqar.json`` (seq_len, num_pairs, width,
  method, num_features, seed, accuracy, train_seconds) plus loss, steps, vocab, num_train
  and provenance, and for the kernel methods the particles' diversity at initialisation and
  at the end (``particle_diversity``); with early stopping on, ``valid_curve``
  ``{step, accuracy, loss}`` on the validation batch at every ``train.eval_every`` steps
  (kept in the checkpoint; a run resumed from a checkpoint older than the curve has it
  from the resume on); ``segments``, one ``{commit, date, from_step}`` per stretch of
  training (the first start, then each resume: ``segment``; kept in the checkpoint, from
  the resume on for a checkpoint older than them), while the row's own ``commit`` and
  ``date`` stay those of the process that finished the run. A finished run is not trained
  again.

Training batches: with ``data.train_examples = 0`` step t draws
``mqar_batch(fold_in(k_train, t), batch_size, ...)``, so every step sees fresh sequences and
``num_train = steps · batch_size``; with N > 0 the N sequences are drawn once from
``k_train`` and step t reads rows ``perm_e[i·B:(i+1)·B]`` of epoch e = t // (N // B)
(``perm_e`` a permutation from ``fold_in(k_shuffle, e)``; the last partial batch of an
epoch is dropped), so ``num_train = N``. The validation batch (``data.num_valid``,
early stopping every ``train.eval_every`` steps at ``train.early_stop``) and the test
batch (``data.num_eval``, the reported accuracy) come from their own keys and are never
trained on. Accuracy is over answer positions only (every key queried once per
sequence); the head runs only there (``training.lm.train_step(num_answers=P)``).

The Langevin methods with ``particles.relative_lam`` / ``drift_to_noise`` > 0 set λ and β
once, from the forces on the initial particles and the first training batch
(``calibrate``): the same numbers on every resume.
"""

import datetime
import json
import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import serialization

from coulomb_jax import checks
from coulomb_jax import diagnostics
from coulomb_jax import langevin_diagnostics
from coulomb_jax import mimicry
from coulomb_jax import training
from coulomb_jax.layers import models
from coulomb_jax.tasks import mqar
from experiments.common import cli
from experiments.common import provenance
from experiments.recall import methods
from experiments.run import run_identity

CONFIG_FILE = 'config.json'
SCHEDULES = ('constant', 'cosine')
CHECKPOINT_FILE = 'checkpoint.msgpack'
RESULT_FILE = 'result.json'
EVAL_CHUNK = 256


def check_config(config: ml_collections.ConfigDict) -> None:
  """Every field, before any compute: one ``cli.ConfigError`` naming it and its value."""
  try:
    if config.method not in methods.METHODS:
      raise ValueError(f'config.method must be one of {methods.METHODS}, got {config.method!r}.')
    d, m, t, p = config.data, config.model, config.train, config.particles
    checks.check_int('config.seed', config.seed, 0)
    mqar.check_mqar_args(d.num_eval, d.vocab_size, d.seq_len, d.num_pairs, d.power_a)
    for name in ('width', 'num_layers', 'num_heads', 'num_features', 'chunk_size'):
      checks.check_int(f'config.model.{name}', m[name], 1)
    checks.check_int('config.model.mlp_ratio', m.mlp_ratio, 0)
    checks.check_int('config.data.train_examples', d.train_examples, 0)
    checks.check_int('config.data.num_valid', d.num_valid, 1)
    if d.train_examples and d.train_examples < t.batch_size:
      raise ValueError(f'config.data.train_examples must be 0 or >= config.train.batch_size='
                       f'{t.batch_size}, got {d.train_examples}.')
    if t.schedule not in SCHEDULES:
      raise ValueError(f'config.train.schedule must be one of {SCHEDULES}, got {t.schedule!r}.')
    checks.check_nonnegative('config.train.early_stop', t.early_stop)
    if t.early_stop > 1:
      raise ValueError(f'config.train.early_stop must be in [0, 1], got {t.early_stop}.')
    checks.check_int('config.train.eval_every', t.eval_every, 1)
    checks.check_nonnegative('config.particles.relative_lam', p.relative_lam)
    checks.check_nonnegative('config.particles.drift_to_noise', p.drift_to_noise)
    if m.causal_path not in models.CAUSAL_PATHS:
      raise ValueError(f'config.model.causal_path must be one of {models.CAUSAL_PATHS}, '
                       f'got {m.causal_path!r}.')
    if m.width % m.num_heads:
      raise ValueError(f'config.model.width must be divisible by config.model.num_heads='
                       f'{m.num_heads}, got {m.width}.')
    if methods.rows_per_head(config.method, 2) == 1 and m.num_features % 2:
      raise ValueError(f'config.model.num_features must be even for {config.method} (N/2 rows '
                       f'give N features), got {m.num_features}.')
    for name in ('steps', 'batch_size', 'checkpoint_every', 'log_every'):
      checks.check_int(f'config.train.{name}', t[name], 1)
    checks.check_positive('config.train.learning_rate', t.learning_rate)
    checks.check_nonnegative('config.train.weight_decay', t.weight_decay)
    for name in ('step_size', 'beta', 'radius', 'clip_norm'):
      checks.check_positive(f'config.particles.{name}', p[name])
    if p.schedule not in SCHEDULES:
      raise ValueError(f'config.particles.schedule must be one of {SCHEDULES}, '
                       f'got {p.schedule!r}.')
    checks.check_nonnegative('config.particles.lam', p.lam)
    checks.check_nonnegative('config.particles.softening', p.softening)
    if p.target not in mimicry.TARGETS:
      raise ValueError(f'config.particles.target must be one of {mimicry.TARGETS}, '
                       f'got {p.target!r}.')
    checks.check_int('config.particles.rows', p.rows, 1)
  except ValueError as e:
    raise cli.ConfigError(str(e)) from None


def _keys(seed: int):
  root = jax.random.key(seed)
  return {name: jax.random.fold_in(root, i) for i, name in
          enumerate(('init', 'train', 'eval', 'langevin', 'valid', 'shuffle'))}


# Config fields added after runs were started, with the value that reproduces what those
# runs did: a saved config.json without the field is that value's run (and resumes).
ADDED_FIELDS = {('particles', 'schedule'): 'constant'}


def with_added_fields(saved: dict) -> dict:
  """A saved ``config.json`` (a dict) with every field of ``ADDED_FIELDS`` it lacks."""
  return run_identity.with_added_fields(saved, ADDED_FIELDS)


def _check_workdir(config, workdir: str) -> None:
  path = os.path.join(workdir, CONFIG_FILE)
  if os.path.isfile(workdir):
    raise cli.ConfigError(f'--workdir: {workdir} is a file, not a folder.')
  if os.path.exists(path):
    with open(path) as f:
      old = f.read()
    if with_added_fields(json.loads(old)) != json.loads(config.to_json()):
      raise cli.ConfigError(f'--workdir: {workdir} holds a run of another config ({path}); '
                            f'use a new workdir.')


def _restore(workdir: str, state):
  """``(state, step, seconds, valid curve, segments)`` of the checkpoint (a checkpoint
  written before the curve or the segments were kept: empty ones, so they start at the
  resume)."""
  path = os.path.join(workdir, CHECKPOINT_FILE)
  if not os.path.exists(path):
    return state, 0, 0.0, valid_curve(), []
  with open(path, 'rb') as f:
    blob = serialization.msgpack_restore(f.read())
  state = serialization.from_state_dict(state, blob['state'])
  curve = valid_curve(**blob.get('valid_curve', {}))
  return state, int(blob['step']), float(blob['seconds']), curve, list(blob.get('segments', []))


def valid_curve(step=(), accuracy=(), loss=()) -> dict:
  """A run's validation curve: ``{step, accuracy, loss}``, one entry per evaluation."""
  return {'step': [int(x) for x in step], 'accuracy': [float(x) for x in accuracy],
          'loss': [float(x) for x in loss]}


def add_point(curve: dict, step: int, accuracy, loss) -> None:
  """Appends one evaluation to ``curve`` (``valid_curve``)."""
  curve['step'].append(int(step))
  curve['accuracy'].append(float(accuracy))
  curve['loss'].append(float(loss))


def segment(metadata: dict, from_step: int) -> dict:
  """One stretch of a run's training: ``{commit, date, from_step}``, the commit of the code
  that trained from ``from_step`` on (``metadata``'s, taken when its process started) and
  the UTC date it began. A run trained in one go has one; each resume adds one."""
  return {'commit': metadata['commit'],
          'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
          'from_step': int(from_step)}


def _save(workdir: str, state, step: int, seconds: float, curve: dict,
          segments: list) -> None:
  blob = serialization.msgpack_serialize(
      {'step': step, 'seconds': seconds, 'state': serialization.to_state_dict(state),
       'valid_curve': curve, 'segments': segments})
  with provenance.atomic_open(os.path.join(workdir, CHECKPOINT_FILE), 'wb') as f:
    f.write(blob)


def check_finite(state, metrics: dict, step: int, saved_step: int) -> None:
  """One ``FloatingPointError`` when the particles or the loss stopped being finite, raised
  before a save: the first particle leaf and head holding a non-finite value
  (``training.nonfinite_counts`` / ``first_nonfinite``; the leaf names the block), else the
  loss. The last checkpoint (``saved_step``) is kept."""
  counts = jax.device_get(training.nonfinite_counts(state.params))
  first = training.first_nonfinite({'nonfinite_particles': counts})
  loss = float(metrics['loss'])
  if first is None and np.isfinite(loss):
    return
  if first is not None:
    _, leaf, head, count = first
    where = f'{leaf} head {head} holds {count} non-finite value(s)'
  else:
    where = f'the loss is {loss}'
  raise FloatingPointError(
      f'step {step}: {where}; stopped before saving (the last checkpoint, step {saved_step}, '
      'is kept). Lower train.learning_rate or particles.step_size, or check the inputs.')


def data_args(config) -> dict:
  d = config.data
  return dict(vocab_size=d.vocab_size, seq_len=d.seq_len, num_pairs=d.num_pairs,
              power_a=d.power_a)


def evaluate(params, model, config, key, num: Optional[int] = None) -> dict:
  """Loss and accuracy over the answers of ``num`` (default ``data.num_eval``) sequences
  drawn from ``key`` (chunks of 256)."""
  num = config.data.num_eval if num is None else num
  batch = mqar.mqar_batch(key, num, **data_args(config))
  totals, count = np.zeros(2), 0
  for start in range(0, num, EVAL_CHUNK):
    chunk = jax.tree.map(lambda x: x[start:start + EVAL_CHUNK], batch)
    out = training.lm.evaluate(params, chunk, model, config.data.num_pairs)
    rows = chunk.inputs.shape[0]
    totals += rows * np.array([float(out['loss']), float(out['accuracy'])])
    count += rows
  return {'loss': totals[0] / count, 'accuracy': totals[1] / count}


def particle_diversity(params) -> dict:
  """``{block: {diagnostic: mean over heads}}`` of every layer's particles (empty: softmax).

  ``diagnostics.particle_diversity``: top-direction variance share, effective rank and
  smallest pairwise distance of each head's particle set, averaged over the heads.
  """
  out = {}
  for block in sorted(params, key=lambda b: (len(b), b)):
    attn = params[block].get('attn', {}) if isinstance(params[block], dict) else {}
    if 'particles' in attn:
      stats = diagnostics.particle_diversity(jnp.asarray(attn['particles']))
      out[block] = {k: round(float(jnp.mean(v)), 4) for k, v in stats.items()}
  return out


def checkpoint_diversity(workdir: str) -> dict:
  """``particle_diversity`` of the particles in ``workdir``'s checkpoint ({} if none)."""
  path = os.path.join(workdir, CHECKPOINT_FILE)
  if not os.path.exists(path):
    return {}
  with open(path, 'rb') as f:
    blob = serialization.msgpack_restore(f.read())
  return particle_diversity(blob['state']['params'])


def result_row(config, metrics: dict, seconds: float) -> dict:
  """The binding fields of a ``results/mqar.json`` run, then the rest."""
  d, m = config.data, config.model
  return {'seq_len': d.seq_len, 'num_pairs': d.num_pairs, 'width': m.width,
          'method': config.method,
          'num_features': 0 if config.method == 'softmax' else m.num_features,
          'seed': config.seed, 'accuracy': float(metrics['accuracy']),
          'train_seconds': round(seconds, 1), 'loss': float(metrics['loss']),
          'steps': config.train.steps, 'vocab': d.vocab_size,
          'num_train': d.train_examples or config.train.steps * config.train.batch_size,
          'learning_rate': config.train.learning_rate,
          'state_size': methods.state_size(config.method, m.num_features, m.width,
                                           m.num_heads, d.seq_len),
          **({'particle_step_size': config.particles.step_size,
              'particle_schedule': config.particles.schedule}
             if config.method in methods.LANGEVIN_METHODS else {})}


class TrainingSet:
  """The batches of ``train_and_evaluate``: fresh per step, or epochs of a fixed set."""

  def __init__(self, config, keys):
    self.config, self.keys = config, keys
    n, b = config.data.train_examples, config.train.batch_size
    self.data = (mqar.mqar_batch(keys['train'], n, **data_args(config)) if n else None)
    self.per_epoch = n // b if n else 0

  def batch(self, step: int):
    """The batch of step ``step`` (deterministic: the same on every resume)."""
    b = self.config.train.batch_size
    if self.data is None:
      return mqar.mqar_batch(jax.random.fold_in(self.keys['train'], step), b,
                             **data_args(self.config))
    epoch, i = divmod(step, self.per_epoch)
    if getattr(self, '_epoch', None) != epoch:
      self._epoch, self._perm = epoch, jax.random.permutation(
          jax.random.fold_in(self.keys['shuffle'], epoch), self.config.data.train_examples)
    rows = self._perm[i * b:(i + 1) * b]
    return jax.tree.map(lambda x: x[rows], self.data)


def calibrate(config, state, model, batch) -> dict:
  """λ and β of a Langevin method from the forces at the initial particles on ``batch``.

  ``relative_lam`` > 0: λ = relative_lam · median‖∇D‖ / median‖∇W_s‖ over every particle
  (``langevin_diagnostics.relative_lam``); ``drift_to_noise`` > 0: β such that the median
  drift η·N·‖clip(∇D + λ∇W_s)‖ is drift_to_noise × the noise RMS √(2η/β)·√D_h, i.e.
  β = 2η·D_h·r² / median(drift)². Returns ``{'lam', 'beta', 'force_ratio', 'drift_to_noise'}``
  (the last two at the chosen λ, β: medians over particles).
  """
  p = config.particles
  if config.method == 'particles_flow':
    return {'lam': 0.0, 'beta': float('inf')}
  settings = methods.mimicry_settings(config, 1.0)
  data, rep = training.lm.force_terms(state.params, batch, model, settings,
                                      methods.FEATURE_MAP[config.method], config.data.num_pairs)
  lam = (langevin_diagnostics.relative_lam(rep, data, p.relative_lam) if p.relative_lam
         else p.lam)
  grad = jax.tree.map(lambda a, b: a + lam * b, data, rep)
  head_dim = config.model.width // config.model.num_heads
  if p.drift_to_noise:
    d = float(np.median(np.asarray(langevin_diagnostics.drift(
        grad, step_size=p.step_size, clip_norm=p.clip_norm))))
    beta = 2.0 * p.step_size * head_dim * p.drift_to_noise ** 2 / max(d, 1e-30) ** 2
  else:
    beta = p.beta
  ratio = langevin_diagnostics.force_ratio(rep, data, lam)
  dn = langevin_diagnostics.drift_to_noise(grad, step_size=p.step_size, beta=beta,
                                           clip_norm=p.clip_norm)
  return {'lam': float(lam), 'beta': float(beta),
          'force_ratio': float(np.median(np.asarray(ratio))),
          'drift_to_noise': float(np.median(np.asarray(dn)))}


def log_line(message: str) -> None:
  """The default ``log``: one line on stdout, flushed (runs go to log files)."""
  print(message, flush=True)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, log=log_line,
                       metadata: Optional[dict] = None) -> dict:
  """Trains one run in ``workdir`` (resuming), evaluates it, writes ``result.json``.

  ``metadata``: the command, commit, date and machine to record (``provenance.run_metadata``
  taken when the process started, which is the code it runs); None: taken now.
  """
  metadata = metadata or provenance.run_metadata('experiments.mqar')
  check_config(config)
  _check_workdir(config, workdir)
  result_path = os.path.join(workdir, RESULT_FILE)
  if os.path.exists(result_path):
    with open(result_path) as f:
      return json.load(f)
  os.makedirs(workdir, exist_ok=True)
  provenance.write_atomic(os.path.join(workdir, CONFIG_FILE), config.to_json(indent=2))
  keys = _keys(config.seed)
  t, d = config.train, config.data
  batches = TrainingSet(config, keys)
  make = lambda method: training.lm.make_state(
      keys['init'], method.model, d.seq_len, learning_rate=t.learning_rate,
      weight_decay=t.weight_decay, particle_tx=method.particle_tx,
      decay_steps=t.steps if t.schedule == 'cosine' else None)
  langevin_key = jax.random.key_data(keys['langevin'])
  method = methods.build(config, langevin_key)
  state = make(method)
  calibration = None
  if config.method in methods.LANGEVIN_METHODS:
    calibration = calibrate(config, state, method.model, batches.batch(0))
    method = methods.build(config, langevin_key, lam=calibration['lam'],
                           beta=calibration['beta'])
    state = make(method)
    log(f'{workdir}: calibrated ' + ', '.join(f'{k} {v:.4g}' for k, v in calibration.items()))
  initial_diversity = particle_diversity(jax.device_get(state.params))
  state, step, seconds, curve, segments = _restore(workdir, state)
  segments.append(segment(metadata, step))
  saved_step = step
  if step:
    log(f'{workdir}: resumed at step {step} of {t.steps}')
  valid = lambda: evaluate(state.params, method.model, config, keys['valid'], d.num_valid)
  stopped = None
  if t.early_stop and step and step < t.steps and step % t.eval_every == 0:
    if valid()['accuracy'] >= t.early_stop:     # killed after an early stop's checkpoint
      stopped = step
  while step < t.steps and not stopped:
    start = time.time()
    state, metrics = training.lm.train_step(state, batches.batch(step), method.mimicry,
                                            method.feature_map, d.num_pairs)
    step += 1
    check_finite(state, metrics, step, saved_step)       # every step, before any save
    if step % t.log_every == 0 or step == t.steps:
      log(f'{workdir}: step {step}/{t.steps} loss {float(metrics["loss"]):.4f} '
          f'accuracy {float(metrics["accuracy"]):.4f}')
    seconds += time.time() - start
    if t.early_stop and (step % t.eval_every == 0 or step == t.steps):
      checked = valid()
      accuracy = checked['accuracy']
      add_point(curve, step, accuracy, checked['loss'])
      if accuracy >= t.early_stop:
        stopped = step
        log(f'{workdir}: validation accuracy {accuracy:.4f} >= {t.early_stop} at step {step}: '
            f'early stop')
    if step % t.checkpoint_every == 0 or step == t.steps or stopped:
      _save(workdir, state, step, seconds, curve, segments)
      saved_step = step
    if stopped:
      break
  metrics = evaluate(state.params, method.model, config, keys['eval'])
  row = dict(result_row(config, metrics, seconds), **metadata)
  row['steps_run'] = step
  valid_metrics = valid()
  row['valid_accuracy'] = float(valid_metrics['accuracy'])
  row['valid_loss'] = float(valid_metrics['loss'])
  if curve['step']:
    row['valid_curve'] = curve
  row['segments'] = segments
  if calibration is not None:
    row['calibration'] = calibration
  if initial_diversity:
    row['diversity'] = {'initial': initial_diversity,
                        'final': particle_diversity(jax.device_get(state.params))}
  provenance.write_json_atomic(result_path, row, indent=2)
  log(f'{workdir}: accuracy {row["accuracy"]:.4f} ({row["train_seconds"]} s)')
  return row
