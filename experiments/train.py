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

import json
import os
import shutil
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from coulomb_jax import data
from coulomb_jax import features
from coulomb_jax import langevin_diagnostics as ld
from coulomb_jax import models
from coulomb_jax import training
from experiments import progress
from experiments import provenance
from experiments import stages

RESULTS = 'results.json'
PHASE_A_SCHEDULES = training.SCHEDULES


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
  if a.schedule in ('after_b', 'alternating'):
    positive_int('phase_a.after_b_epochs', a.after_b_epochs)
    if a.after_b_epochs >= b.num_epochs:
      fail('phase_a.after_b_epochs', a.after_b_epochs, f'fewer than phase_b.num_epochs='
           f'{b.num_epochs} (Phase B epochs must follow Phase A)')
  for field in ('relative_step', 'relative_lam', 'gibbs_tilt'):
    positive(f'phase_a.{field}', a[field], allow_zero=True)
  positive_int('phase_a.calibration_rows', a.calibration_rows, 2)
  positive_int('phase_a.heldout_rows', a.heldout_rows, 2)
  if not isinstance(a.null_run, bool):
    fail('phase_a.null_run', a.null_run, 'True or False')
  if not isinstance(r.prefix_from, str):
    fail('run.prefix_from', r.prefix_from, "'' or a run folder")
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
  """The encoder of ``config.model``; Ball-X's projection happens in the schedule
  (``stages.project_particles``), not at initialisation."""
  m = config.model
  return models.EncoderClassifier(
      vocab_size=vocab_size, max_length=config.data.max_length, width=m.width,
      num_layers=m.num_layers, num_heads=m.num_heads, ffn_dim=m.ffn_dim,
      dropout_rate=m.dropout_rate, attention=m.attention, feature_map=m.feature_map,
      num_features=m.num_features, qk_mode=m.qk_mode, orthogonal=m.orthogonal,
      linformer_length=m.linformer_length, chunk_size=m.chunk_size or None)


def run_kind(config, params) -> str:
  """What Phase A stages do: 'kernel' (Langevin), 'ball' (project), 'vanilla' (nothing);
  'other' for models without particles."""
  if not training.has_particles(params):
    return 'other'
  if config.phase_a.enabled:
    return 'kernel'
  return 'ball' if config.model.init_radius > 0 else 'vanilla'


def schedule(config, num_layers: int) -> list:
  """The run's ``training.Stage`` list (``config.phase_a.schedule``)."""
  a, b = config.phase_a, config.phase_b
  return training.phase_schedule(a.schedule, num_layers=num_layers, a_epochs=a.num_epochs,
                                 b_epochs=b.num_epochs, after_b_epochs=a.after_b_epochs)


# ----------------------------------------------------------------------------- checkpoints

PREFIX = 'prefix'


def _checkpoint_manager(workdir):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  options = ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, 'checkpoints')),
                               options=options)


def _save(manager, ckpt):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step = int(ckpt['step_a']) + int(ckpt['step_b']) + int(ckpt['stage'])
  manager.save(step, args=ocp.args.StandardSave(ckpt), force=True)
  manager.wait_until_finished()


def _restore(manager, target):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step = manager.latest_step()
  if step is None:
    return target
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
  try:
    return manager.restore(step, args=ocp.args.StandardRestore(abstract))
  except (ValueError, KeyError) as e:
    raise ValueError(f'workdir: the checkpoint {manager.directory}/{step} does not match this '
                     f'code\'s state (written by an older experiments.train?): {e}') from None


def _save_prefix(workdir, ckpt):
  """The state at the end of the Phase B epochs before the first Phase A stage, kept
  in ``<workdir>/prefix`` for runs that share them (``run.prefix_from``)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(os.path.join(workdir, PREFIX))
  if not os.path.exists(path):
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, ckpt)
    checkpointer.wait_until_finished()


# Fields that only act from the first Phase A stage on: runs that differ in nothing
# else share their Phase B prefix bit for bit.
_PREFIX_FREE = ('variant', 'model.init_radius', 'run.prefix_from', 'run.log_every',
                'run.checkpoint_every')


def _prefix_fields(fingerprint):
  flat = {f'{section}.{k}': v for section, fields in fingerprint.items()
          if isinstance(fields, dict) for k, v in fields.items()}
  flat.update({k: v for k, v in fingerprint.items() if not isinstance(v, dict)})
  return {k: v for k, v in flat.items() if k not in _PREFIX_FREE and (
      not k.startswith('phase_a.') or k in ('phase_a.schedule', 'phase_a.after_b_epochs'))}


def _restore_prefix(config, workdir, target):
  """``target`` restored from ``<run.prefix_from>/prefix``, or None if that run has not
  saved it yet. Refuses a source whose config differs in a field the prefix depends on."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  source = config.run.prefix_from
  with open(os.path.join(source, 'config.json')) as f:
    theirs = _prefix_fields(_with_added_fields(json.load(f)))
  ours = _prefix_fields(_fingerprint(config))
  diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
  if diff:
    raise ValueError(f'config.run.prefix_from: {source!r} trained with other values of '
                     f'{diff}; its Phase B prefix is not this run\'s.')
  path = os.path.abspath(os.path.join(source, PREFIX))
  if not os.path.exists(path):
    return None
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
  restored = ocp.StandardCheckpointer().restore(path, abstract)
  with open(os.path.join(source, 'history.jsonl')) as f:
    lines = [line for line in f if line.strip()]
  t = int(restored['step_a']) + int(restored['step_b'])
  sessions = []
  if os.path.exists(os.path.join(source, 'sessions.json')):
    with open(os.path.join(source, 'sessions.json')) as f:
      sessions = json.load(f)
  if jax.process_index() == 0:
    provenance.write_atomic(os.path.join(workdir, 'history.jsonl'), ''.join(
        line for line in lines if json.loads(line)['t'] <= t))
    provenance.write_json_atomic(os.path.join(workdir, PREFIX + '.json'), {
        'from': source, 'phase_b_steps': int(restored['step_b']), 'sessions': sessions},
                                 indent=1)
  logging.info('Phase B prefix (%d steps) taken from %s.', int(restored['step_b']), path)
  return restored


# Config fields added after runs were started, with the value that reproduces what
# those runs did: a config.json without the field resumes as having this value.
_ADDED_FIELDS = {('data', 'validation_rule'): 'rows'}


def _fingerprint(config):
  return json.loads(config.to_json())


def _with_added_fields(saved):
  for (section, field), value in _ADDED_FIELDS.items():
    saved.setdefault(section, {}).setdefault(field, value)
  return saved


def _open_writer(workdir):
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning('tensorboardX is not installed: no TensorBoard scalars.')
    return None
  return SummaryWriter(os.path.join(workdir, 'tensorboard'))


def _truncate_history(workdir, t):
  """Drops history records written after the restored checkpoint (step ``t``): those
  epochs and evaluations run again. A last line torn by a kill is dropped too."""
  path = os.path.join(workdir, 'history.jsonl')
  if jax.process_index() or not os.path.exists(path):
    return
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  kept = []
  for i, line in enumerate(lines):
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      if i == len(lines) - 1:
        continue
      raise
    if record['t'] <= t:
      kept.append(line if line.endswith('\n') else line + '\n')
  provenance.write_atomic(path, ''.join(kept))


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


def _initial_state(params, opt_b, num_bins):
  """The checkpointed state of a run that has not started (see ``stages.Run``)."""
  f32, i32 = stages.f32, stages.i32
  counts = np.zeros(num_bins, np.int32)
  return {'stage': i32(0), 'stage_step': i32(0), 'params': params, 'stage_start': params,
          'opt_a': training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=1.0, beta=1.0,
                                              radius=1.0, clip_norm=None).init(params),
          'opt_b': opt_b.init(params), 'step_a': i32(0), 'step_b': i32(0),
          'best_params': params, 'best_accuracy': f32(-1.0), 'best_log_loss': f32(np.inf),
          'best_epoch': i32(-1), 'seconds_a': f32(0.0), 'seconds_b': f32(0.0),
          'stopped_early_a': i32(0), 'hist_drift': counts, 'hist_force': counts}


def _check_workdir(config, workdir):
  """Creates ``workdir`` or checks that it holds a run of this very config."""
  os.makedirs(workdir, exist_ok=True)
  config_path = os.path.join(workdir, 'config.json')
  if os.path.exists(config_path):
    with open(config_path) as f:
      if _with_added_fields(json.load(f)) != _fingerprint(config):
        raise ValueError(f'workdir: {workdir!r} holds a run with a different config '
                         f'({config_path}); use a new workdir.')
  else:
    provenance.write_json_atomic(config_path, _fingerprint(config), indent=1)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_steps: Optional[int] = None,
                       meta: Optional[dict] = None) -> Optional[dict]:
  """Runs (or resumes) one training run; returns the results dict, or None if stopped.

  ``stop_after_steps``: leave after this many optimisation steps in this call,
  with a checkpoint, as a preempted job would (for time-boxed sessions; tests
  use it to check that resuming changes nothing).
  """
  meta = meta or provenance.run_metadata('experiments.train')
  run, sessions = setup_run(config, workdir, meta, stop_after_steps=stop_after_steps)
  for index in range(int(run.ckpt['stage']), len(run.stages)):
    if not stages.run_stage(run, index) or (run.out_of_time() and index + 1 < len(run.stages)):
      return None
  return _finish(run, meta, sessions)


def setup_run(config: ml_collections.ConfigDict, workdir: str, meta: dict, *,
              stop_after_steps: Optional[int] = None):
  """Checks, data, model, optimisers and the restored state of a run: ``(stages.Run,
  sessions)``, ready for ``stages.run_stage`` from ``run.ckpt['stage']`` on."""
  check_config(config, jax.device_count())
  if config.run.prefix_from and not os.path.isfile(
      os.path.join(config.run.prefix_from, 'config.json')):
    raise ValueError(f'config.run.prefix_from: {config.run.prefix_from!r} is not a run folder '
                     '(no config.json).')
  _check_workdir(config, workdir)
  sessions = _record_session(workdir, meta)
  if config.run.prefix_from and not os.path.exists(os.path.join(workdir, 'tokenizer.json')):
    source = os.path.join(config.run.prefix_from, 'tokenizer.json')   # The prefix's own.
    if os.path.exists(source) and jax.process_index() == 0:
      shutil.copyfile(source, os.path.join(workdir, 'tokenizer.json'))
  encoded, vocab_size = load_data(config, workdir)
  sharder = Sharder()
  model = make_model(config, vocab_size)
  a, b, d = config.phase_a, config.phase_b, config.data
  init_key, langevin_key, dropout_key = jax.random.split(jax.random.PRNGKey(config.seed), 3)
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
  paths = training.attention_paths(params)
  stage_list = schedule(config, max(len(paths), 1))
  opt_b = training.phase_b_optimizer(
      learning_rate=b.learning_rate, warmup_steps=int(b.warmup_fraction * spe_b * b.num_epochs),
      total_steps=spe_b * b.num_epochs, weight_decay=b.weight_decay, clip_norm=b.clip_norm)

  manager = _checkpoint_manager(workdir)
  target = _initial_state(params, opt_b, len(ld.LogHistogram().counts))
  ckpt = _restore(manager, target)
  if ckpt is target and config.run.prefix_from:
    ckpt = _restore_prefix(config, workdir, target) or target
  ckpt = sharder.replicate(ckpt)
  _truncate_history(workdir, int(ckpt['step_a']) + int(ckpt['step_b']))
  if int(ckpt['stage']) or int(ckpt['stage_step']) or int(ckpt['step_b']):
    logging.info('Resumed from %s: stage %d/%d, step %d of it.', manager.directory,
                 int(ckpt['stage']) + 1, len(stage_list), int(ckpt['stage_step']))
  chief = jax.process_index() == 0
  kind = run_kind(config, params)
  total_a = sum(spe_a * s.num_epochs for s in stage_list if s.phase == 'a') if kind == 'kernel' else 0
  done = int(ckpt['step_a']) + int(ckpt['step_b'])
  run = stages.Run(
      config=config, workdir=workdir, kind=kind, model=model,
      encoded=encoded, sharder=sharder, paths=paths, stages=stage_list, ckpt=ckpt,
      save=lambda: _save(manager, run.ckpt), langevin_key=langevin_key,
      dropout_key=dropout_key, step_b=jax.jit(training.make_phase_b_step(model, opt_b)),
      predict=jax.jit(training.make_predict(model)),
      inputs_fn=jax.jit(lambda p, batch, paths: {
          k: training.phase_a_inputs(model, p, batch)[k] for k in paths},
                        static_argnames='paths'),
      spe_a=spe_a, spe_b=spe_b, total_b=spe_b * b.num_epochs,
      select_from=training.first_selectable_epoch(stage_list),
      writer=_open_writer(workdir) if chief else None, chief=chief,
      stop_after_steps=stop_after_steps,
      save_prefix=lambda: _save_prefix(workdir, run.ckpt),
      progress=progress.Progress('train', total=total_a + spe_b * b.num_epochs, unit='step',
                                 done=done))
  return run, sessions


def _finish(run, meta, sessions) -> dict:
  """Evaluates the kept parameters; writes ``results.json`` and the test predictions."""
  ck, config = run.ckpt, run.config
  best = ck['best_params']
  results = dict(meta, dataset=config.data.task, variant=config.variant, seed=config.seed,
                 config=config.to_dict(),
                 split={'validation': 'validation', 'test': 'test'},
                 schedule=[s._asdict() for s in run.stages],
                 selected_from_epoch=run.select_from,
                 best_epoch=int(ck['best_epoch']),
                 phase_a_steps=int(ck['step_a']),
                 phase_a_stopped_early=bool(int(ck['stopped_early_a'])),
                 phase_a_seconds=float(ck['seconds_a']),
                 phase_b_seconds=float(ck['seconds_b']),
                 train_seconds=float(ck['seconds_a'] + ck['seconds_b']),
                 num_devices=jax.device_count(),
                 sessions=sessions,
                 num_params=int(sum(x.size for x in jax.tree.leaves(best))))
  if os.path.exists(os.path.join(run.workdir, PREFIX + '.json')):
    with open(os.path.join(run.workdir, PREFIX + '.json')) as f:
      results['prefix'] = json.load(f)   # Where the Phase B prefix was trained, and when.
  phase_a = stages.phase_a_report(run.workdir) if run.kind == 'kernel' else None
  if phase_a is not None:
    results['phase_a'] = phase_a
  for split in ('validation', 'test'):
    results[split], probs = stages.evaluate(run.predict, best, run.encoded[split],
                                            config.run.eval_batch_size, run.sharder, config,
                                            with_probs=True)
    if run.chief:
      path = os.path.join(run.workdir, f'predictions_{split}.npz')
      with open(path + '.tmp', 'wb') as f:
        np.savez(f, labels=np.asarray(run.encoded[split].labels, np.int32),
                 probs=probs.astype(np.float32))
      os.replace(path + '.tmp', path)
  if run.writer is not None:
    run.writer.close()
  if run.chief:
    provenance.write_json_atomic(os.path.join(run.workdir, RESULTS), results, indent=1)
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
