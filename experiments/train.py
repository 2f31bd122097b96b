r"""Train and evaluate one kernel-attention text classifier (Phase A, then Phase B).

  python -m experiments.train --config=configs/sst2.py:kernel-favor --workdir=workdir/sst2/kernel-favor/seed0

``train_and_evaluate(config, workdir)`` is the one path from the command line to
the code:

1. checks the whole config (one ValueError naming the field) before any compute;
2. loads the task's splits (``coulomb_jax.data``), trains (or reloads) the
   WordPiece tokenizer in ``workdir``, and encodes;
3. Phase A (Kernel-X only): Langevin moves of the particles on the alignment of
   per-head mean-pooled keys (``coulomb_jax.training``), until the largest move
   is below ``phase_a.tolerance`` or after ``phase_a.num_epochs``: all layers at
   once (``phase_a.schedule='joint'``), or one layer after the other on pooled
   keys computed once per layer (``'layerwise'``);
4. Phase B: AdamW on everything else, particles frozen; the epoch with the best
   validation accuracy (ties: lower log loss) is kept;
5. writes ``results.json``: validation and test metrics of the kept parameters,
   the time of each phase, the command, commit and machine.

Batches are sharded over all devices along a ``data`` mesh axis (parameters
replicated); ``--jax_distributed`` calls ``jax.distributed.initialize()`` first
for multi-host launches. Orbax checkpoints (every ``run.checkpoint_every`` steps
and every epoch end) make a killed run resume where it stopped, with the same
result as an uninterrupted one; resuming with a different config is refused.
"""

import itertools
import json
import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from coulomb_jax import data
from coulomb_jax import features
from coulomb_jax import metrics as metrics_lib
from coulomb_jax import models
from coulomb_jax import training
from experiments import provenance

RESULTS = 'results.json'
PHASE_A_SCHEDULES = ('joint', 'layerwise')


# ----------------------------------------------------------------------------- config

def check_config(config: ml_collections.ConfigDict, num_devices: int = 1) -> None:
  """Raises one ValueError naming the field and its value; reads nothing big."""

  def fail(field, value, expected):
    raise ValueError(f'config.{field}: expected {expected}, got {value!r}.')

  def positive_int(field, value, low=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      fail(field, value, f'an integer ≥ {low}')

  def positive(field, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        value > 0 or (allow_zero and value == 0)):
      fail(field, value, 'a number ≥ 0' if allow_zero else 'a number > 0')

  d, m, a, b, r = config.data, config.model, config.phase_a, config.phase_b, config.run
  if d.task not in data.TASKS:
    fail('data.task', d.task, f'one of {data.TASKS}')
  if not os.path.isdir(d.data_dir):
    fail('data.data_dir', d.data_dir, 'an existing folder with the data (see ../shared/data)')
  if d.vocab_file and not os.path.isfile(d.vocab_file):
    fail('data.vocab_file', d.vocab_file, "'' or an existing vocab.txt")
  positive_int('data.validation_size', d.validation_size)
  if d.validation_rule not in data.VALIDATION_RULES:
    fail('data.validation_rule', d.validation_rule, f'one of {data.VALIDATION_RULES}')
  if d.validation_rule == 'sentences' and d.task != 'sst2':
    fail('data.validation_rule', d.validation_rule, f"'rows' for task {d.task!r} (only sst2 "
         f"has phrase-level rows)")
  positive_int('data.max_length', d.max_length, 4)
  positive_int('data.vocab_size', d.vocab_size, 16)
  positive_int('data.pad_multiple', d.pad_multiple)
  if d.max_length % d.pad_multiple:      # Padded batches must never exceed max_length.
    fail('data.max_length', d.max_length, f'a multiple of data.pad_multiple={d.pad_multiple}')
  positive_int('data.bucket_size', d.bucket_size)
  positive_int('data.max_train_examples', d.max_train_examples, 0)
  positive_int('data.max_eval_examples', d.max_eval_examples, 0)
  if m.attention not in models.ATTENTION_KINDS:
    fail('model.attention', m.attention, f'one of {models.ATTENTION_KINDS}')
  if m.feature_map not in features.ATTENTION_FEATURE_MAPS:
    fail('model.feature_map', m.feature_map, f'one of {features.ATTENTION_FEATURE_MAPS}')
  if m.qk_mode not in models.QK_MODES:
    fail('model.qk_mode', m.qk_mode, f'one of {models.QK_MODES}')
  for field in ('num_features', 'width', 'num_layers', 'num_heads', 'ffn_dim',
                'linformer_length'):
    positive_int(f'model.{field}', m[field])
  if m.width % m.num_heads:
    fail('model.width', m.width, f'a multiple of model.num_heads={m.num_heads}')
  if not 0 <= m.dropout_rate < 1:
    fail('model.dropout_rate', m.dropout_rate, 'a number in [0, 1)')
  if a.enabled and m.attention != 'kernel':
    fail('phase_a.enabled', a.enabled, f"False for model.attention={m.attention!r}")
  for field in ('step_size', 'beta', 'clip_norm', 'radius'):
    positive(f'phase_a.{field}', a[field])
  positive('phase_a.lam', a.lam, allow_zero=True)
  positive('phase_a.softening', a.softening, allow_zero=True)
  positive('phase_a.tolerance', a.tolerance, allow_zero=True)
  if a.riesz_s != 'coulomb':             # A string field: a number arrives as '1.0'.
    try:
      riesz_s = float(a.riesz_s)
    except (TypeError, ValueError):
      riesz_s = -1.0
    if not riesz_s >= 0:
      fail('phase_a.riesz_s', a.riesz_s, "'coulomb' or a number ≥ 0 (as a string, e.g. '1.0')")
  elif a.enabled and m.width // m.num_heads < 2:
    fail('phase_a.riesz_s', a.riesz_s, f'a number for head dimension '
         f'{m.width // m.num_heads} (coulomb is s = D_h − 2, D_h ≥ 2)')
  positive_int('phase_a.num_epochs', a.num_epochs, 0)
  if a.enabled and a.num_epochs == 0:
    fail('phase_a.num_epochs', a.num_epochs, 'an integer ≥ 1 when phase_a.enabled')
  if a.schedule not in PHASE_A_SCHEDULES:
    fail('phase_a.schedule', a.schedule, f'one of {PHASE_A_SCHEDULES}')
  for field in ('learning_rate', 'clip_norm'):
    positive(f'phase_b.{field}', b[field])
  positive('phase_b.weight_decay', b.weight_decay, allow_zero=True)
  if not 0 <= b.warmup_fraction < 1:
    fail('phase_b.warmup_fraction', b.warmup_fraction, 'a number in [0, 1)')
  positive_int('phase_b.num_epochs', b.num_epochs)
  for field, value in (('phase_a.batch_size', a.batch_size), ('phase_b.batch_size', b.batch_size),
                       ('run.eval_batch_size', r.eval_batch_size)):
    positive_int(field, value)
    if value % num_devices:
      fail(field, value, f'a multiple of the device count {num_devices}')
  positive_int('model.chunk_size', m.chunk_size, 0)
  positive('model.init_radius', m.init_radius, allow_zero=True)
  positive_int('run.log_every', r.log_every)
  positive_int('run.checkpoint_every', r.checkpoint_every, 0)
  positive_int('seed', config.seed, 0)
  _check_variant(config, fail)


def _check_variant(config, fail) -> None:
  """The fields ``config.variant`` implies (``configs/text.py``), so a run is never
  reported (and paired) under a variant it did not train."""
  from configs import text  # pylint: disable=g-import-not-at-top
  try:
    name, _ = text.parse_variant(config.variant)
  except ValueError:
    fail('variant', config.variant, f'one of {text.VARIANTS}')
  want = text.get_text_config(config.data.task, name)
  for field in text.VARIANT_FIELDS:
    section, key = field.split('.')
    if config[section][key] != want[section][key]:
      fail(field, config[section][key],
           f'{want[section][key]!r} for variant {name!r} (or change config.variant)')
  kind = name.partition('-')[0]
  if (config.model.init_radius > 0) != (kind == 'ball'):
    fail('model.init_radius', config.model.init_radius,
         f"{'> 0' if kind == 'ball' else '0'} for variant {name!r} (only ball-X projects its "
         f"initial particles)")


# ----------------------------------------------------------------------------- data

def _subset(examples, size):
  """A fixed random ``size`` rows in file order (files can be sorted by label, e.g. MR)."""
  keep = np.sort(np.random.default_rng(0).permutation(len(examples.labels))[:size])
  pick = lambda texts: None if texts is None else [texts[i] for i in keep]
  return data.Examples(pick(examples.text_a), pick(examples.text_b), examples.labels[keep])


def load_data(config, workdir):
  """Returns ``({'train', 'validation', 'test'}: data.Encoded, vocab_size)``."""
  d = config.data
  splits = {s: data.load_split(d.task, d.data_dir, s, validation_size=d.validation_size,
                               validation_rule=d.validation_rule)
            for s in ('train', 'validation', 'test')}
  for names, limit in ((('train',), d.max_train_examples),
                       (('validation', 'test'), d.max_eval_examples)):
    for name in names:
      if limit:
        splits[name] = _subset(splits[name], limit)
  tok_path = os.path.join(workdir, 'tokenizer.json')
  if d.vocab_file:
    tok = data.load_vocab_tokenizer(d.vocab_file)
  elif os.path.exists(tok_path):
    tok = data.load_tokenizer(tok_path)
  else:
    tr = splits['train']
    tok = data.train_tokenizer(tr.text_a + (tr.text_b or []), d.vocab_size)
    data.save_tokenizer(tok, tok_path)
  encoded = {s: data.encode(tok, ex, d.max_length) for s, ex in splits.items()}
  return encoded, tok.get_vocab_size()


def _train_batches(encoded, batch_size, seed, step, steps_per_epoch, d):
  """The shuffled batches of step's epoch, from step's position on (resume mid-epoch)."""
  epoch, offset = divmod(step, steps_per_epoch)
  it = data.batches(encoded, batch_size, seed=seed, epoch=epoch, pad_multiple=d.pad_multiple,
                    bucket_size=d.bucket_size, drop_remainder=True)
  for _ in range(offset):
    next(it)
  return it


def _phase_a_batches(encoded, table, config, start, steps_per_epoch):
  """Phase A's batches from step ``start`` on.

  ``table`` None (joint schedule): token batches, as ``_train_batches``. Otherwise
  (layer-wise) the same rows' cached pooled keys ``{'r': table[rows], 'labels',
  'weights'}``: ``data.batch_indices`` gives the rows of those batches without tokens.
  """
  a, d = config.phase_a, config.data
  lengths = np.array([len(x) for x in encoded.ids])
  labels = np.asarray(encoded.labels, np.int32)
  step = start
  while True:
    epoch, offset = divmod(step, steps_per_epoch)
    if table is None:
      it = _train_batches(encoded, a.batch_size, config.seed, step, steps_per_epoch, d)
      yield from itertools.islice(it, steps_per_epoch - offset)
    else:
      epoch_rows = data.batch_indices(lengths, a.batch_size, seed=config.seed, epoch=epoch,
                                      bucket_size=d.bucket_size, drop_remainder=True)
      for rows in epoch_rows[offset:steps_per_epoch]:
        yield {'r': table[rows], 'labels': labels[rows],
               'weights': np.ones(len(rows), np.float32)}
    step = (epoch + 1) * steps_per_epoch


def _pooled_keys(model, params, encoded, path, sharder, config) -> np.ndarray:
  """``[n, H, D_h]``: every training row's pooled keys r entering the attention at ``path``.

  One forward pass (no dropout) over ``encoded`` in length-bucketed batches of
  ``run.eval_batch_size``; the layers above ``path`` are not computed.
  """
  d = config.data
  inputs = jax.jit(lambda p, b: training.phase_a_inputs(model, p, b)[tuple(path)])
  table = None
  for batch in data.batches(encoded, config.run.eval_batch_size, seed=0,
                            pad_multiple=d.pad_multiple, bucket_size=d.bucket_size):
    r = sharder.to_host(inputs(params, sharder.batch(batch)))
    if table is None:
      table = np.zeros((len(encoded.labels),) + r.shape[1:], np.float32)
    rows = batch['index'] >= 0
    table[batch['index'][rows]] = r[rows]
  return table


class Sharder:
  """Puts host batches on a 1-D ``data`` mesh (rows split, the rest replicated).

  ``devices``: the mesh's devices (default: all of them, across hosts).
  """

  def __init__(self, devices=None):
    self.mesh = Mesh(np.array(devices or jax.devices()), ('data',))
    self.rows = NamedSharding(self.mesh, P('data'))
    self.replicated = NamedSharding(self.mesh, P())

  def batch(self, batch):
    """Every host holds the whole global batch; each device takes its rows of it."""
    put = lambda x: jax.make_array_from_callback(x.shape, self.rows, lambda index: x[index])
    return {k: put(v) for k, v in batch.items()}

  def replicate(self, tree):
    return jax.device_put(tree, self.replicated)

  @staticmethod
  def to_host(x):
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


# ----------------------------------------------------------------------------- model

def make_model(config, vocab_size) -> models.EncoderClassifier:
  m = config.model
  return models.EncoderClassifier(
      vocab_size=vocab_size, max_length=config.data.max_length, width=m.width,
      num_layers=m.num_layers, num_heads=m.num_heads, ffn_dim=m.ffn_dim,
      dropout_rate=m.dropout_rate, attention=m.attention, feature_map=m.feature_map,
      num_features=m.num_features, qk_mode=m.qk_mode, orthogonal=m.orthogonal,
      linformer_length=m.linformer_length, chunk_size=m.chunk_size or None,
      init_radius=m.init_radius or None)


def evaluate(predict, params, encoded, batch_size, sharder, config):
  """Metrics of ``coulomb_jax.metrics.classification_metrics`` on one split."""
  probs = []
  for batch in data.batches(encoded, batch_size, pad_multiple=config.data.pad_multiple):
    p = sharder.to_host(predict(params, sharder.batch(batch)))
    probs.append(p[batch['weights'] > 0])
  probs = np.clip(np.concatenate(probs).astype(np.float64), 0.0, 1.0)
  return metrics_lib.classification_metrics(encoded.labels, probs)


def _better(new, best_accuracy, best_log_loss):
  """Higher accuracy, ties broken by lower log loss; compared as the stored float32."""
  acc, loss = np.float32(new['accuracy']), np.float32(new['log_loss'])
  return bool(acc > best_accuracy or (acc == best_accuracy and loss < best_log_loss))


# ----------------------------------------------------------------------------- checkpoints

def _checkpoint_manager(workdir):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  options = ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, 'checkpoints')),
                               options=options)


def _save(manager, ckpt):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step = int(ckpt['step_a']) + int(ckpt['step_b']) + int(ckpt['phase'])
  manager.save(step, args=ocp.args.StandardSave(ckpt), force=True)
  manager.wait_until_finished()


def _restore(manager, target):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step = manager.latest_step()
  if step is None:
    return target
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
  return manager.restore(step, args=ocp.args.StandardRestore(abstract))


# Config fields added after runs were started, with the value that reproduces what
# those runs did: a config.json without the field resumes as having this value.
_ADDED_FIELDS = {('data', 'validation_rule'): 'rows'}


def _fingerprint(config):
  return json.loads(config.to_json())


def _with_added_fields(saved):
  for (section, field), value in _ADDED_FIELDS.items():
    saved.setdefault(section, {}).setdefault(field, value)
  return saved


class _Throughput:
  """Steps/s and examples/s since the previous progress line (evaluation included)."""

  def __init__(self, step):
    self.step, self.time = step, time.time()

  def rate(self, step, batch_size):
    now = time.time()
    per_s = (step - self.step) / max(now - self.time, 1e-9)
    self.step, self.time = step, now
    return f'{per_s:.1f} steps/s, {per_s * batch_size:.0f} examples/s'


def _log_scalars(writer, prefix, values, step):
  if writer is not None:
    for k, v in values.items():
      writer.add_scalar(f'{prefix}/{k}', float(v), step)


def _open_writer(workdir):
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning('tensorboardX is not installed: no TensorBoard scalars.')
    return None
  return SummaryWriter(os.path.join(workdir, 'tensorboard'))


# ----------------------------------------------------------------------------- main loop

def _record_session(workdir, meta):
  """Appends this call's commit, date and devices to ``<workdir>/sessions.json``.

  A run resumed in a later session may run other code or on other devices: the
  results keep every session (``results['sessions']``), not only the last one's
  commit, and a change of device count (sharded sums, so the final parameters are
  no longer bit-identical to an uninterrupted run) is logged as a warning.
  """
  path = os.path.join(workdir, 'sessions.json')
  sessions = []
  if os.path.exists(path):
    with open(path) as f:
      sessions = json.load(f)
  now = {'commit': meta.get('commit'), 'date': meta.get('date'),
         'device_count': jax.device_count(), 'platform': jax.default_backend()}
  if sessions and (sessions[-1]['device_count'], sessions[-1]['platform']) != (
      now['device_count'], now['platform']):
    logging.warning('Resuming %s on %d %s device(s) after %d %s: not bit-identical to an '
                    'uninterrupted run.', workdir, now['device_count'], now['platform'],
                    sessions[-1]['device_count'], sessions[-1]['platform'])
  if sessions and sessions[-1]['commit'] != now['commit']:
    logging.warning('Resuming %s at commit %s after %s.', workdir, now['commit'],
                    sessions[-1]['commit'])
  sessions.append(now)
  if jax.process_index() == 0:
    provenance.write_json_atomic(path, sessions, indent=1)
  return sessions


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_steps: Optional[int] = None,
                       meta: Optional[dict] = None) -> Optional[dict]:
  """Runs (or resumes) one training run; returns the results dict, or None if stopped.

  ``stop_after_steps``: leave after this many optimisation steps in this call,
  with a checkpoint, as a preempted job would (for time-boxed sessions; tests
  use it to check that resuming changes nothing).
  """
  check_config(config, jax.device_count())
  os.makedirs(workdir, exist_ok=True)
  config_path = os.path.join(workdir, 'config.json')
  if os.path.exists(config_path):
    with open(config_path) as f:
      if _with_added_fields(json.load(f)) != _fingerprint(config):
        raise ValueError(f'workdir: {workdir!r} holds a run with a different config '
                         f'({config_path}); use a new workdir.')
  else:
    provenance.write_json_atomic(config_path, _fingerprint(config), indent=1)
  meta = meta or provenance.run_metadata('experiments.train')
  sessions = _record_session(workdir, meta)

  encoded, vocab_size = load_data(config, workdir)
  sharder = Sharder()
  model = make_model(config, vocab_size)
  a, b, d = config.phase_a, config.phase_b, config.data
  key = jax.random.PRNGKey(config.seed)
  init_key, langevin_key, dropout_key = jax.random.split(key, 3)
  example = next(data.batches(encoded['train'], 2, pad_multiple=d.pad_multiple))
  params = model.init(init_key, example['ids'], example['segments'], example['mask'])['params']
  if a.enabled and not training.has_particles(params):
    raise ValueError(f'phase_a.enabled: the model {config.variant!r} has no particles.')

  n_train = len(encoded['train'].labels)
  spe_a = data.num_batches(n_train, a.batch_size, drop_remainder=True)
  spe_b = data.num_batches(n_train, b.batch_size, drop_remainder=True)
  for field, value, steps in (('phase_b.batch_size', b.batch_size, spe_b),
                              ('phase_a.batch_size', a.batch_size, spe_a if a.enabled else 1)):
    if not steps:
      raise ValueError(f'config.{field}: {value} exceeds the {n_train} training rows.')
  if a.enabled and not a.num_epochs:
    raise ValueError('config.phase_a.num_epochs: 0 with phase_a.enabled=True would train a '
                     'Vanilla model under a Kernel name; set phase_a.enabled=False.')
  layerwise = a.enabled and a.schedule == 'layerwise'
  paths = training.attention_paths(params)
  stage_a = spe_a * a.num_epochs  # Steps of one Phase A stage (layer-wise: one per layer).
  total_a = stage_a * (len(paths) if layerwise else 1) if a.enabled else 0
  total_b = spe_b * b.num_epochs
  langevin = dict(step_size=a.step_size, beta=a.beta, radius=a.radius, clip_norm=a.clip_norm)
  opt_a = training.phase_a_optimizer(langevin_key, **langevin)
  # Layer-wise: one optimiser per layer, moving only that layer's particles, each
  # with its own noise key; their states have the joint optimiser's structure.
  opt_layers = [training.phase_a_optimizer(jax.random.fold_in(langevin_key, i), only=p,
                                           **langevin) for i, p in enumerate(paths)]
  opt_b = training.phase_b_optimizer(
      learning_rate=b.learning_rate, warmup_steps=int(b.warmup_fraction * total_b),
      total_steps=total_b, weight_decay=b.weight_decay, clip_norm=b.clip_norm)
  riesz_s = a.riesz_s if a.riesz_s == 'coulomb' else float(a.riesz_s)
  objective = dict(feature_map=config.model.feature_map, lam=a.lam, s=riesz_s,
                     softening=a.softening)
  step_a = jax.jit(training.make_phase_a_step(model, opt_a, **objective))
  step_b = jax.jit(training.make_phase_b_step(model, opt_b))
  predict = jax.jit(training.make_predict(model))

  f32 = lambda v: jnp.asarray(v, jnp.float32)
  i32 = lambda v: jnp.asarray(v, jnp.int32)
  ckpt = {'phase': i32(0 if a.enabled else 1), 'params': params,
          'opt_a': (opt_layers[0] if layerwise else opt_a).init(params),
          'opt_b': opt_b.init(params), 'step_a': i32(0), 'step_b': i32(0),
          'layer_a': i32(0), 'layer_step_a': i32(0), 'best_params': params,
          'best_accuracy': f32(-1.0), 'best_log_loss': f32(np.inf), 'best_epoch': i32(-1),
          'seconds_a': f32(0.0), 'seconds_b': f32(0.0), 'stopped_early_a': i32(0)}
  manager = _checkpoint_manager(workdir)
  ckpt = sharder.replicate(_restore(manager, ckpt))
  if int(ckpt['phase']) > 0 or int(ckpt['step_a']) or int(ckpt['step_b']):
    logging.info('Resumed from %s: phase %d, steps %d / %d.', manager.directory,
                 int(ckpt['phase']), int(ckpt['step_a']), int(ckpt['step_b']))
  chief = jax.process_index() == 0
  writer = _open_writer(workdir) if chief else None
  history_path = os.path.join(workdir, 'history.jsonl')
  if chief and os.path.exists(history_path):
    # Epochs evaluated after the restored checkpoint are evaluated again: drop them.
    with open(history_path) as f:
      lines = [line for line in f if line.strip()]
    kept = []
    for i, line in enumerate(lines):
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        if i == len(lines) - 1:           # A last line torn by the kill: evaluated again.
          continue
        raise
      if record['step'] <= int(ckpt['step_b']):
        kept.append(line if line.endswith('\n') else line + '\n')
    provenance.write_atomic(history_path, ''.join(kept))
  steps_this_call = 0

  def out_of_time():
    return stop_after_steps is not None and steps_this_call >= stop_after_steps

  def save():
    _save(manager, ckpt)

  # ---- Phase A: only the particles move. Joint: one stage over all layers, each step
  # runs the encoder forward. Layer-wise: one stage per layer, bottom up, each on the
  # pooled keys entering its layer, computed once with the layers below already learned.
  if int(ckpt['phase']) == 0 and total_a:
    for layer in range(int(ckpt['layer_a']), len(paths)) if layerwise else [None]:
      tick = time.time()
      if layer is None:
        step, n_steps, tag, what = step_a, total_a, 'phase_a', 'phase A'
        start, before = int(ckpt['step_a']), 0
        table = None
      else:
        layer_step = training.make_phase_a_layer_step(paths[layer], opt_layers[layer],
                                                      **objective)
        step = jax.jit(lambda state, batch, f=layer_step: f(state, **batch))
        n_steps, tag = stage_a, f'phase_a/layer_{layer}'
        what = f'phase A layer {layer + 1}/{len(paths)}'
        start = int(ckpt['layer_step_a'])
        before = int(ckpt['step_a']) - start  # Phase A steps of the layers below.
        table = _pooled_keys(model, ckpt['params'], encoded['train'], paths[layer], sharder,
                             config)
      last = layer is None or layer + 1 == len(paths)
      state = training.TrainState(i32(start), ckpt['params'], ckpt['opt_a'])
      meter = _Throughput(start)
      batches = _phase_a_batches(encoded['train'], table, config, start, spe_a)
      for t in range(start, n_steps):
        state, m = step(state, sharder.batch(next(batches)))
        steps_this_call += 1
        done = float(m['max_move']) < a.tolerance or t + 1 == n_steps
        if (t + 1) % config.run.log_every == 0 or done:
          m = jax.device_get(m)
          logging.info('%s step %d/%d (epoch %d): H %.5f A %.5f W %.5f max move %.2e; %s',
                       what, t + 1, n_steps, t // spe_a, m['hamiltonian'], m['alignment'],
                       m['repulsion'], m['max_move'], meter.rate(t + 1, a.batch_size))
          _log_scalars(writer, tag, m, before + t + 1)
        periodic = config.run.checkpoint_every and (t + 1) % config.run.checkpoint_every == 0
        if done or (t + 1) % spe_a == 0 or periodic or out_of_time():
          jax.block_until_ready(state)
          ckpt.update(params=state.params, opt_a=state.opt_state, step_a=i32(before + t + 1),
                      seconds_a=ckpt['seconds_a'] + f32(time.time() - tick))
          if layer is not None:
            ckpt.update(layer_step_a=state.step)
          if done:
            ckpt.update(stopped_early_a=ckpt['stopped_early_a'] | i32(t + 1 < n_steps))
            if layer is not None:
              ckpt.update(layer_a=i32(layer + 1), layer_step_a=i32(0))
            if last:
              ckpt.update(phase=i32(1))
            else:  # The next layer's optimiser starts fresh (its own noise key).
              ckpt.update(opt_a=opt_layers[layer + 1].init(params))
          save()
          tick = time.time()
        if done:
          break
        if out_of_time():
          return None
  if int(ckpt['phase']) == 0 and not total_a:
    ckpt.update(phase=i32(1))
  if out_of_time():
    return None

  # ---- Phase B: particles frozen, everything else trained.
  if int(ckpt['phase']) == 1:
    state = training.TrainState(ckpt['step_b'], ckpt['params'], ckpt['opt_b'])
    start, tick = int(state.step), time.time()
    meter = _Throughput(start)
    for t in range(start, total_b):
      epoch = t // spe_b
      if t == start or t % spe_b == 0:
        it = _train_batches(encoded['train'], b.batch_size, config.seed + 1, t, spe_b, d)
      state, m = step_b(dropout_key, state, sharder.batch(next(it)))
      steps_this_call += 1
      if (t + 1) % config.run.log_every == 0:
        m = jax.device_get(m)
        logging.info('phase B step %d/%d (epoch %d): loss %.4f acc %.3f; %s',
                     t + 1, total_b, epoch, m['loss'], m['accuracy'],
                     meter.rate(t + 1, b.batch_size))
        _log_scalars(writer, 'phase_b', m, t + 1)
      end_of_epoch = (t + 1) % spe_b == 0
      periodic = config.run.checkpoint_every and (t + 1) % config.run.checkpoint_every == 0
      if end_of_epoch or periodic or out_of_time():
        jax.block_until_ready(state)
        ckpt.update(params=state.params, opt_b=state.opt_state, step_b=state.step,
                    seconds_b=ckpt['seconds_b'] + f32(time.time() - tick))
        if end_of_epoch:
          val = evaluate(predict, state.params, encoded['validation'],
                         config.run.eval_batch_size, sharder, config)
          logging.info('epoch %d validation: %s', epoch, json.dumps(val))
          _log_scalars(writer, 'validation', val, t + 1)
          if chief:
            with open(history_path, 'a') as f:
              f.write(json.dumps({'epoch': epoch, 'step': t + 1, 'validation': val}) + '\n')
          if _better(val, np.float32(ckpt['best_accuracy']), np.float32(ckpt['best_log_loss'])):
            ckpt.update(best_params=state.params, best_accuracy=f32(val['accuracy']),
                        best_log_loss=f32(val['log_loss']), best_epoch=i32(epoch))
          if t + 1 == total_b:
            ckpt.update(phase=i32(2))
        save()
        tick = time.time()
      if out_of_time() and t + 1 < total_b:
        return None

  # ---- Evaluation of the kept (best-validation) parameters.
  best = ckpt['best_params']
  results = dict(meta, dataset=d.task, variant=config.variant, seed=config.seed,
                 config=config.to_dict(),
                 split={'validation': 'validation', 'test': 'test'},
                 best_epoch=int(ckpt['best_epoch']),
                 phase_a_steps=int(ckpt['step_a']),
                 phase_a_stopped_early=bool(int(ckpt['stopped_early_a'])),
                 phase_a_seconds=float(ckpt['seconds_a']),
                 phase_b_seconds=float(ckpt['seconds_b']),
                 train_seconds=float(ckpt['seconds_a'] + ckpt['seconds_b']),
                 num_devices=jax.device_count(),
                 sessions=sessions,
                 num_params=int(sum(x.size for x in jax.tree.leaves(best))))
  for split in ('validation', 'test'):
    results[split] = evaluate(predict, best, encoded[split], config.run.eval_batch_size,
                              sharder, config)
  if writer is not None:
    writer.close()
  if jax.process_index() == 0:
    provenance.write_json_atomic(os.path.join(workdir, RESULTS), results, indent=1)
  logging.info('test: %s', json.dumps(results['test']))
  return results


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  _CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a config file.',
                                            lock_config=True)
  _WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints and results go.')
  _DISTRIBUTED = flags.DEFINE_bool('jax_distributed', False,
                                   'Call jax.distributed.initialize() (multi-host launches).')
  _STOP_AFTER = flags.DEFINE_integer('stop_after_steps', None,
                                     'Checkpoint and exit after this many steps (resumable).')
  flags.mark_flags_as_required(['config', 'workdir'])

  class _QuietOrbax(logging.logging.Filter):
    """Drops orbax's per-save INFO lines; warnings and errors still pass."""

    def filter(self, record):
      return record.levelno >= logging.logging.WARNING or '/orbax/' not in record.pathname

  def main(argv):
    del argv
    logging.get_absl_handler().addFilter(_QuietOrbax())
    if _DISTRIBUTED.value:
      jax.distributed.initialize()
    train_and_evaluate(_CONFIG.value, _WORKDIR.value, stop_after_steps=_STOP_AFTER.value)

  app.run(main)
