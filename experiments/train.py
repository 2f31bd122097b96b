r"""Train and evaluate one kernel-attention text classifier (Phase A, then Phase B).

  python -m experiments.train --config=configs/sst2.py:kernel-favor --workdir=workdir/sst2/kernel-favor/seed0

or, from any folder, ``python path/to/experiments/train.py
--config=path/to/configs/sst2.py:kernel-favor,quick --workdir=...``. Every config
field with its value and comment: ``--config=configs/sst2.py --list_fields``; any
field can be overridden (``--config.phase_b.learning_rate=1e-3``). A misspelled
field, a wrong variant or a bad value ends in one line (``experiments.cli``).

``train_and_evaluate(config, workdir)`` is the one path from the command line to
the code:

1. checks the whole config (one ValueError naming the field) and the workdir
   before any compute or write: a workdir of another config, or whose data
   fingerprint (sha256 of every data file read and of its ``tokenizer.json``,
   ``fingerprint.json``) differs from the files now on disk, is refused with the
   changed files named; a workdir another process is using (``lock``, held with
   ``fcntl.flock`` for the run's lifetime, released by the OS if it is killed) too;
2. loads the task's splits (``coulomb_jax.data``) from ``data_dir(config)``
   (``config.data.data_dir``, else ``$COULOMB_JAX_DATA``, else ``../shared/data``
   next to the repository), trains (or reloads) the WordPiece tokenizer in
   ``workdir``, and encodes;
3. Phase A (Kernel-X only): Langevin moves of the particles on the alignment of
   per-head mean-pooled keys (``coulomb_jax.training``), until the largest move
   is below ``phase_a.tolerance`` or after ``phase_a.num_epochs``: all layers at
   once (``phase_a.schedule='joint'``), or one layer after the other on pooled
   keys computed once per layer (``'layerwise'``);
4. Phase B: AdamW on everything else, particles frozen; the epoch with the best
   validation accuracy (ties: lower log loss) is kept;
5. writes ``results.json``: validation and test metrics of the kept parameters,
   the time of each phase, the data folder and fingerprint, the command, commit
   and machine; TensorBoard scalars (flushed at every log line) and hparams go to
   ``<workdir>/tensorboard``.

Batches are sharded over all devices along a ``data`` mesh axis (parameters
replicated). ``--jax_distributed`` calls ``jax.distributed.initialize()`` first:
with ``--coordinator_address=HOST:PORT --num_processes=N --process_id=I`` on
each host, or without them on a cluster jax detects (CPU collectives: gloo).
Every process trains; process 0 alone writes the workdir's files. Orbax
checkpoints (every ``run.checkpoint_every`` steps and every epoch end; the last
two kept) make a killed run resume where it stopped, with the same result as an
uninterrupted one, on any number of processes; an unreadable latest checkpoint
is reported in one line and the previous one used; resuming with a different
config is refused.
"""

import datetime
import fcntl
import json
import logging as std_logging
import math
import os
import re
import shutil
import socket
import sys
import textwrap
import time
from typing import Optional

if __name__ == '__main__' and not __package__:
  # Launched as a file (python path/to/experiments/train.py): the repository root
  # must be importable for `experiments`, `configs` and (uninstalled) `coulomb_jax`.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from coulomb_jax import data
from coulomb_jax import features
from coulomb_jax import langevin_diagnostics as ld
from coulomb_jax import models
from coulomb_jax import training
from experiments import cli
from experiments import progress
from experiments import provenance
from experiments import stages

RESULTS = 'results.json'
PHASE_A_SCHEDULES = training.SCHEDULES
FINGERPRINT = 'fingerprint.json'
TOKENIZER = 'tokenizer.json'
LOCK = 'lock'
# The data folder when config.data.data_dir is '': this variable, else DEFAULT_DATA_DIR.
DATA_ENV = 'COULOMB_JAX_DATA'
DEFAULT_DATA_DIR = os.path.join(os.path.dirname(provenance.REPO_ROOT), 'shared', 'data')


# ----------------------------------------------------------------------------- config

def data_dir(config: ml_collections.ConfigDict) -> str:
  """The data folder: ``config.data.data_dir`` if set (relative to the current
  folder), else ``$COULOMB_JAX_DATA``, else ``../shared/data`` next to the repository."""
  return config.data.data_dir or os.environ.get(DATA_ENV) or DEFAULT_DATA_DIR


def check_config(config: ml_collections.ConfigDict, num_devices: int = 1) -> None:
  """Raises one ValueError (``cli.ConfigError``) naming the field and its value; reads
  nothing big."""

  def fail(field, value, expected):
    raise cli.ConfigError(f'config.{field}: expected {expected}, got {value!r}.')

  def positive_int(field, value, low=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      fail(field, value, f'an integer ≥ {low}')

  def positive(field, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        value > 0 or (allow_zero and value == 0)) or math.isinf(value):
      fail(field, value, 'a finite number ≥ 0' if allow_zero else 'a finite number > 0')

  d, m, a, b, r = config.data, config.model, config.phase_a, config.phase_b, config.run
  if d.task not in data.TASKS:
    fail('data.task', d.task, f'one of {data.TASKS}')
  if not isinstance(d.data_dir, str):
    fail('data.data_dir', d.data_dir, "'' or a folder")
  if not os.path.isdir(data_dir(config)):
    if d.data_dir:
      fail('data.data_dir', d.data_dir, 'an existing folder with the data')
    where = (f'${DATA_ENV}={os.environ[DATA_ENV]!r}' if os.environ.get(DATA_ENV) else
             f'${DATA_ENV} is not set and ../shared/data next to the repository '
             f'({DEFAULT_DATA_DIR})')
    raise cli.ConfigError(f'config.data.data_dir: not set, and {where} is not a folder; set '
                          f'--config.data.data_dir=FOLDER or {DATA_ENV}=FOLDER (layout: '
                          'coulomb_jax/data.py).')
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
  """Returns ``({'train', 'validation', 'test'}: data.Encoded, vocab_size)``.

  The tokenizer is ``<workdir>/tokenizer.json``, trained (by process 0 alone when
  there are several) on the training split if it is not there yet.
  """
  d = config.data
  splits = {s: data.load_split(d.task, data_dir(config), s, validation_size=d.validation_size,
                               validation_rule=d.validation_rule)
            for s in ('train', 'validation', 'test')}
  for names, limit in ((('train',), d.max_train_examples),
                       (('validation', 'test'), d.max_eval_examples)):
    for name in names:
      if limit:
        splits[name] = _subset(splits[name], limit)
  tok_path = os.path.join(workdir, TOKENIZER)
  if d.vocab_file:
    tok = data.load_vocab_tokenizer(d.vocab_file)
  else:
    _sync('tokenizer: before looking')        # Every earlier write of process 0 is done.
    exists = os.path.exists(tok_path)
    _sync('tokenizer: looked')                # Nobody looks after process 0 writes it.
    if exists:
      tok = data.load_tokenizer(tok_path)
    else:
      if jax.process_index() == 0:
        tr = splits['train']
        tok = data.train_tokenizer(tr.text_a + (tr.text_b or []), d.vocab_size)
        data.save_tokenizer(tok, tok_path)
      _sync('tokenizer: written')
      if jax.process_index():
        tok = data.load_tokenizer(tok_path)
  encoded = {s: data.encode(tok, ex, d.max_length) for s, ex in splits.items()}
  return encoded, tok.get_vocab_size()


def _sync(name: str) -> None:
  """A barrier of all processes (nothing with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


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
    """``tree`` on every device. With several processes, a leaf that is not yet a global
    array is taken as this process's value (each process holds the same one)."""
    if jax.process_count() == 1:
      return jax.device_put(tree, self.replicated)

    def put(x):
      if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.device_put(x, self.replicated)
      host = np.asarray(x)
      return jax.make_array_from_callback(host.shape, self.replicated, lambda index: host[index])

    return jax.tree.map(put, tree)

  def abstract(self, tree):
    """The shapes and dtypes of ``tree``, replicated: a restore target for orbax."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=self.replicated), tree)

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


CHECKPOINTS = 'checkpoints'
# Unreadable checkpoints are moved here (not deleted) when an older one is used instead.
UNREADABLE = 'checkpoints_unreadable'


def _checkpoint_manager(workdir):
  """Orbax's manager of ``<workdir>/checkpoints``, keeping the last two steps."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, CHECKPOINTS)),
                               options=options)


def _save(manager, ckpt, sharder=None):
  """Saves ``ckpt`` (all processes call it; with several, every leaf made a global array)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step = int(ckpt['step_a']) + int(ckpt['step_b']) + int(ckpt['stage'])
  if jax.process_count() > 1:
    ckpt = (sharder or Sharder()).replicate(ckpt)
  manager.save(step, args=ocp.args.StandardSave(ckpt), force=True)
  manager.wait_until_finished()


class _DropOrbaxRecords(std_logging.Filter):
  """Drops orbax's own log records (its errors about a file it could not read)."""

  def filter(self, record):
    return '/orbax/' not in record.pathname


def _quiet_closed_loop(hook):
  """``sys.unraisablehook`` ``hook``, silent for ``RuntimeError('Event loop is closed')``:
  when one read of a damaged checkpoint fails, orbax closes its event loop and each of
  tensorstore's other reads reports to it, printing that traceback (some 180 lines)."""

  def unraisablehook(unraisable):
    value = unraisable.exc_value
    if isinstance(value, RuntimeError) and str(value) == 'Event loop is closed':
      return
    hook(unraisable)

  unraisablehook.quiets_closed_loops = True
  return unraisablehook


def _restore(manager, target, sharder=None):
  """The newest readable checkpoint (``target`` if there is none yet), replicated.

  An unreadable one is reported in one warning line and the one before it tried;
  the newer unreadable steps are then moved to ``<workdir>/checkpoints_unreadable``
  (so that the run can save those step numbers again). None readable: one
  ``cli.ConfigError`` naming the folder and why each step failed.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  steps = sorted(manager.all_steps(), reverse=True)
  if not steps:
    return target
  abstract = (sharder or Sharder()).abstract(target)
  failures = []
  quiet = _DropOrbaxRecords()
  if not getattr(sys.unraisablehook, 'quiets_closed_loops', False):
    sys.unraisablehook = _quiet_closed_loop(sys.unraisablehook)
  for step in steps:
    std_logging.getLogger('absl').addFilter(quiet)
    try:
      ckpt = manager.restore(step, args=ocp.args.StandardRestore(abstract))
    except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many kinds)
      reason = ' '.join(f'{type(e).__name__}: {e}'.split())
      failures.append(f'step {step}: {reason if len(reason) < 300 else reason[:297] + "..."}')
      continue
    finally:
      std_logging.getLogger('absl').removeFilter(quiet)
    if failures:
      aside = _set_aside(manager, [s for s in steps if s > step])
      logging.warning('unreadable checkpoint in %s (%s): resuming from step %d instead; the '
                      'unreadable one is moved to %s.', manager.directory, '; '.join(failures),
                      step, aside)
    return ckpt
  raise cli.ConfigError(
      f'{manager.directory}: no readable checkpoint ({"; ".join(failures)}); if they were '
      'written by an older experiments.train, or are damaged, use a new workdir.')


def _set_aside(manager, steps):
  """Moves unreadable checkpoint steps out of the manager's folder (process 0); returns
  where they went."""
  directory = str(manager.directory)
  aside = os.path.join(os.path.dirname(directory), UNREADABLE)
  if jax.process_index() == 0:
    os.makedirs(aside, exist_ok=True)
    for step in steps:
      target = os.path.join(aside, str(step))
      if os.path.exists(target):
        shutil.rmtree(target)
      os.replace(os.path.join(directory, str(step)), target)
  _sync('checkpoints: set aside')
  manager.reload()
  return aside


def _save_prefix(workdir, ckpt, sharder=None):
  """The state at the end of the Phase B epochs before the first Phase A stage, kept
  in ``<workdir>/prefix`` for runs that share them (``run.prefix_from``)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(os.path.join(workdir, PREFIX))
  exists = os.path.exists(path)
  _sync('prefix: looked')               # Every process decides before process 0 writes.
  if not exists:
    if jax.process_count() > 1:
      ckpt = (sharder or Sharder()).replicate(ckpt)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, ckpt)
    checkpointer.wait_until_finished()


# Fields that only act from the first Phase A stage on: runs that differ in nothing
# else share their Phase B prefix bit for bit. (The data folder: the data fingerprint
# is compared instead.)
_PREFIX_FREE = ('variant', 'model.init_radius', 'run.prefix_from', 'run.log_every',
                'run.checkpoint_every', 'data.data_dir')


def _prefix_fields(fingerprint):
  flat = {f'{section}.{k}': v for section, fields in fingerprint.items()
          if isinstance(fields, dict) for k, v in fields.items()}
  flat.update({k: v for k, v in fingerprint.items() if not isinstance(v, dict)})
  return {k: v for k, v in flat.items() if k not in _PREFIX_FREE and (
      not k.startswith('phase_a.') or k in ('phase_a.schedule', 'phase_a.after_b_epochs'))}


def _check_prefix_source(config, ours):
  """Refuses a ``run.prefix_from`` run whose config differs in a field the prefix depends
  on, or whose data fingerprint differs from ``ours`` (this run's, data now on disk)."""
  source = config.run.prefix_from
  if not os.path.isfile(os.path.join(source, 'config.json')):
    raise cli.ConfigError(f'config.run.prefix_from: {source!r} is not a run folder (no '
                          'config.json).')
  theirs = _prefix_fields(_with_added_fields(_read_json(os.path.join(source, 'config.json'))))
  mine = _prefix_fields(_fingerprint(config))
  diff = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
  if diff:
    raise cli.ConfigError(f'config.run.prefix_from: {source!r} trained with other values of '
                          f'{diff}; its Phase B prefix is not this run\'s.')
  path = os.path.join(source, FINGERPRINT)
  if not os.path.exists(path):
    logging.warning('config.run.prefix_from: %s has no %s (trained before data fingerprints): '
                    'its data is not compared with this run\'s.', source, FINGERPRINT)
    return
  stored = _stored_files(path)
  if TOKENIZER not in ours:      # Ours is copied from theirs.
    stored = {k: v for k, v in stored.items() if k != TOKENIZER}
  try:
    data.check_fingerprint(stored, ours, what=f'config.run.prefix_from: the data {source!r} '
                           'trained on')
  except ValueError as e:
    raise cli.ConfigError(f'{e} Its Phase B prefix is not this run\'s.') from None


def _restore_prefix(config, workdir, target, sharder=None):
  """``target`` restored from ``<run.prefix_from>/prefix``, or None if that run has not
  saved it yet (``_check_prefix_source`` has compared its config and data)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  source = config.run.prefix_from
  path = os.path.abspath(os.path.join(source, PREFIX))
  if not os.path.exists(path):
    return None
  restored = ocp.StandardCheckpointer().restore(path, (sharder or Sharder()).abstract(target))
  with open(os.path.join(source, 'history.jsonl')) as f:
    lines = [line for line in f if line.strip()]
  t = int(restored['step_a']) + int(restored['step_b'])
  sessions = []
  if os.path.exists(os.path.join(source, 'sessions.json')):
    sessions = _read_json(os.path.join(source, 'sessions.json'))
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


class _FlushingWriter:
  """tensorboardX's ``SummaryWriter``, flushed to disk after every scalar: the curves of
  a killed run survive it (``stages.Run.log_scalars`` writes one log line's scalars)."""

  def __init__(self, writer):
    self.writer = writer

  def add_scalar(self, tag, value, step):
    self.writer.add_scalar(tag, value, step)
    self.writer.flush()

  def add_hparams(self, config, results):
    """The config's flat fields and the final metrics (``validation/*``, ``test/*``) on
    TensorBoard's HPARAMS tab (a sub-run ``hparams``)."""
    hparams = {k: v for k, v in _flat(config).items()
               if isinstance(v, (bool, int, float, str))}
    metrics = {f'{split}/{k}': float(v) for split in ('validation', 'test')
               for k, v in results[split].items()}
    self.writer.add_hparams(hparams, metrics, name='hparams')
    self.writer.flush()

  def close(self):
    self.writer.close()


def _open_writer(workdir):
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning('tensorboardX is not installed: no TensorBoard scalars.')
    return None
  return _FlushingWriter(SummaryWriter(os.path.join(workdir, 'tensorboard')))


def _flat(config) -> dict:
  """``{'data.task': 'sst2', ..., 'seed': 0}``: every field of a (nested) config."""
  out = {}

  def walk(prefix, node):
    for k, v in node.items():
      if isinstance(v, (dict, ml_collections.ConfigDict)):
        walk(f'{prefix}{k}.', v)
      else:
        out[prefix + k] = v

  walk('', config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config)
  return out


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


# ----------------------------------------------------------------------------- the workdir

def _read_json(path):
  """A JSON file of a run folder; one ``cli.ConfigError`` naming it if it is damaged."""
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise cli.ConfigError(f'{path} is not valid JSON ({e}): the file is damaged; restore it '
                          'or use a new workdir.') from None


def _stored_files(path):
  stored = _read_json(path)
  if not isinstance(stored, dict) or not isinstance(stored.get('files'), dict):
    raise cli.ConfigError(f'{path}: expected {{"files": {{name: sha256}}}}, got '
                          f'{json.dumps(stored)[:80]}; restore it or use a new workdir.')
  return stored['files']


def data_fingerprint(config, workdir: Optional[str] = None) -> dict:
  """``{name: sha256}`` of every file a run reads: the task's data files (named relative
  to ``data_dir(config)``), ``config.data.vocab_file`` if set (``vocab_file <path>``)
  and, once it exists, ``<workdir>/tokenizer.json`` (``tokenizer.json``)."""
  root = data_dir(config)
  files = data.fingerprint(data.source_files(config.data.task, root), root=root)
  vocab = config.data.vocab_file
  if vocab:
    files[f'vocab_file {provenance.relative_path(vocab)}'] = data.fingerprint([vocab])[vocab]
  tok = os.path.join(workdir, TOKENIZER) if workdir else None
  if tok and os.path.isfile(tok):
    files[TOKENIZER] = data.fingerprint([tok])[tok]
  return dict(sorted(files.items()))


def _check_history(path):
  """Every line of ``history.jsonl`` but a last one torn by a kill must be JSON."""
  if not os.path.exists(path):
    return
  with open(path, encoding='utf-8', errors='replace') as f:
    lines = [line for line in f if line.strip()]
  for i, line in enumerate(lines[:-1]):
    try:
      json.loads(line)
    except json.JSONDecodeError as e:
      raise cli.ConfigError(f'{path}:{i + 1} is not valid JSON ({e}): the file is damaged; '
                            'restore it or use a new workdir.') from None


def preflight(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Every check of a run before it writes anything; returns the data fingerprint.

  The config (``check_config``), the data files, and an existing ``workdir``: its
  ``config.json`` must be this config's (the data folder aside: the fingerprint
  compares the data itself), its files readable, and its ``fingerprint.json`` must
  match the files now on disk. ``run.prefix_from``: that run's config and data.
  Raises ``cli.ConfigError`` (a ValueError) naming the field or file.
  """
  check_config(config, jax.device_count())
  config_path = os.path.join(workdir, 'config.json')
  if os.path.exists(config_path):
    saved = _with_added_fields(_read_json(config_path))
    if _without_data_dir(saved) != _without_data_dir(_fingerprint(config)):
      raise cli.ConfigError(f'workdir: {workdir!r} holds a run with a different config '
                            f'({config_path}); use a new workdir.')
  _check_history(os.path.join(workdir, 'history.jsonl'))
  if os.path.exists(os.path.join(workdir, 'sessions.json')):
    _read_json(os.path.join(workdir, 'sessions.json'))
  try:
    current = data_fingerprint(config, workdir)
  except FileNotFoundError as e:
    raise cli.ConfigError(str(e)) from None
  stored_path = os.path.join(workdir, FINGERPRINT)
  stored = _stored_files(stored_path) if os.path.exists(stored_path) else {}
  expected = dict(current)
  if TOKENIZER not in current and TOKENIZER in stored:
    # A deleted tokenizer is trained again from the same data: compared once it is.
    expected[TOKENIZER] = stored[TOKENIZER]
  if os.path.exists(stored_path):
    try:
      data.check_fingerprint(stored, expected, what=f'the data of the run in {workdir!r}')
    except ValueError as e:
      raise cli.ConfigError(f'{e} Restore those files or use a new workdir ({stored_path} '
                            'holds the digests the run started with).') from None
  if TOKENIZER in current and TOKENIZER not in stored:
    try:
      data.load_tokenizer(os.path.join(workdir, TOKENIZER))
    except ValueError as e:
      raise cli.ConfigError(str(e)) from None
  if config.run.prefix_from:
    _check_prefix_source(config, current)
  return expected


def _with_tokenizer(workdir, fingerprint):
  """``fingerprint`` with the digest of ``<workdir>/tokenizer.json``, once it exists; a
  retrained tokenizer must equal the one the run started with."""
  path = os.path.join(workdir, TOKENIZER)
  if not os.path.isfile(path):
    return fingerprint
  digest = data.fingerprint([path])[path]
  if fingerprint.get(TOKENIZER, digest) != digest:
    raise cli.ConfigError(f'{path}: the tokenizer trained again (sha256 {digest[:12]}…) is not '
                          f'the one this run started with ({fingerprint[TOKENIZER][:12]}…); '
                          'use a new workdir.')
  return dict(sorted({**fingerprint, TOKENIZER: digest}.items()))


def _without_data_dir(saved):
  return {k: ({f: v for f, v in fields.items() if f != 'data_dir'} if k == 'data' else fields)
          for k, fields in saved.items()}


def _write_config_and_fingerprint(config, workdir, fingerprint):
  """``config.json`` (once) and ``fingerprint.json`` (process 0)."""
  if jax.process_index():
    return
  config_path = os.path.join(workdir, 'config.json')
  if not os.path.exists(config_path):
    provenance.write_json_atomic(config_path, _fingerprint(config), indent=1)
  provenance.write_json_atomic(os.path.join(workdir, FINGERPRINT), {
      'data_dir': provenance.relative_path(data_dir(config)), 'files': fingerprint}, indent=1)


# The workdirs this process holds (realpath → the open lock file; None on processes > 0).
_HELD = {}


class WorkdirBusy(cli.ConfigError):
  """Another process holds the workdir's lock."""


def lock_workdir(workdir: str) -> bool:
  """Takes ``<workdir>/lock`` for this process (process 0 for a multi-process job).

  ``fcntl.flock``: held until ``release_workdir`` or the process ends, however it
  ends (a killed run leaves no stale lock). The file names the holder (pid, host,
  start time). Raises ``WorkdirBusy`` naming the holder if another process has it;
  returns False if this process already held it, True if it took it now.
  """
  key = os.path.realpath(workdir)
  if key in _HELD:
    return False
  error, held = None, None
  if jax.process_index() == 0:
    try:
      held = _flock(workdir)
    except WorkdirBusy as e:
      error = e
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    if int(multihost_utils.broadcast_one_to_all(np.int32(error is not None))) and not error:
      error = WorkdirBusy(f'workdir {workdir!r} is in use by another run (process 0 names it).')
  if error:
    raise error
  _HELD[key] = held
  return True


def _flock(workdir):
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK)
  f = open(path, 'a+', encoding='utf-8')  # pylint: disable=consider-using-with
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    holder = ''
    for _ in range(20):                     # The holder may not have written its name yet.
      f.seek(0)
      holder = f.read().strip()
      if holder:
        break
      time.sleep(0.05)
    f.close()
    raise WorkdirBusy(f'workdir {workdir!r} is in use by {holder or "another process"} '
                      f'(lock {path}); wait for that run to end, or use another workdir.'
                      ) from None
  f.seek(0)
  f.truncate()
  f.write(f'pid {os.getpid()} on host {socket.gethostname()} since '
          f'{datetime.datetime.now().astimezone().isoformat(timespec="seconds")}\n')
  f.flush()
  return f


def release_workdir(workdir: str) -> None:
  """Lets go of a workdir this process locked (nothing if it did not)."""
  f = _HELD.pop(os.path.realpath(workdir), None)
  if f is not None:
    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()


def _log_config(config, workdir):
  lines = '\n'.join(f'  {k} = {v!r}' for k, v in _flat(config).items())
  logging.info('config (saved in %s; data from %s):\n%s', os.path.join(workdir, 'config.json'),
               data_dir(config), lines)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       stop_after_steps: Optional[int] = None,
                       meta: Optional[dict] = None) -> Optional[dict]:
  """Runs (or resumes) one training run; returns the results dict, or None if stopped.

  ``stop_after_steps``: leave after this many optimisation steps in this call,
  with a checkpoint, as a preempted job would (for time-boxed sessions; tests
  use it to check that resuming changes nothing). The workdir's lock is released
  on return unless this process held it before the call.
  """
  meta = meta or provenance.run_metadata('experiments.train')
  held_before = os.path.realpath(workdir) in _HELD
  try:
    run, sessions = setup_run(config, workdir, meta, stop_after_steps=stop_after_steps)
    for index in range(int(run.ckpt['stage']), len(run.stages)):
      if not stages.run_stage(run, index) or (
          run.out_of_time() and index + 1 < len(run.stages)):
        return None
    return _finish(run, meta, sessions)
  finally:
    if not held_before:
      release_workdir(workdir)


def setup_run(config: ml_collections.ConfigDict, workdir: str, meta: dict, *,
              stop_after_steps: Optional[int] = None):
  """Checks, data, model, optimisers and the restored state of a run: ``(stages.Run,
  sessions)``, ready for ``stages.run_stage`` from ``run.ckpt['stage']`` on.

  Nothing is written before ``preflight`` has passed; then the workdir is locked
  for this process (``lock_workdir``; ``release_workdir`` lets go).
  """
  fingerprint = preflight(config, workdir)
  lock_workdir(workdir)
  _log_config(config, workdir)
  _write_config_and_fingerprint(config, workdir, fingerprint)
  sessions = _record_session(workdir, meta)
  if config.run.prefix_from and not os.path.exists(os.path.join(workdir, TOKENIZER)):
    source = os.path.join(config.run.prefix_from, TOKENIZER)   # The prefix's own.
    if os.path.exists(source) and jax.process_index() == 0:
      shutil.copyfile(source, os.path.join(workdir, TOKENIZER))
  try:
    encoded, vocab_size = load_data(config, workdir)
  except (ValueError, FileNotFoundError) as e:   # Bad data: named by coulomb_jax.data.
    raise cli.ConfigError(str(e)) from None
  new = _with_tokenizer(workdir, fingerprint)
  if new != fingerprint:
    _write_config_and_fingerprint(config, workdir, new)
  sharder = Sharder()
  model = make_model(config, vocab_size)
  a, b, d = config.phase_a, config.phase_b, config.data
  init_key, langevin_key, dropout_key = jax.random.split(jax.random.PRNGKey(config.seed), 3)
  example = next(data.batches(encoded['train'], 2, pad_multiple=d.pad_multiple))
  params = model.init(init_key, example['ids'], example['segments'], example['mask'])['params']
  if a.enabled and not training.has_particles(params):
    raise cli.ConfigError(f'phase_a.enabled: the model {config.variant!r} has no particles.')
  n_train = len(encoded['train'].labels)
  spe_a = data.num_batches(n_train, a.batch_size, drop_remainder=True)
  spe_b = data.num_batches(n_train, b.batch_size, drop_remainder=True)
  for field, value, steps in (('phase_b.batch_size', b.batch_size, spe_b),
                              ('phase_a.batch_size', a.batch_size, spe_a if a.enabled else 1)):
    if not steps:
      raise cli.ConfigError(f'config.{field}: {value} exceeds the {n_train} training rows.')
  paths = training.attention_paths(params)
  stage_list = schedule(config, max(len(paths), 1))
  opt_b = training.phase_b_optimizer(
      learning_rate=b.learning_rate, warmup_steps=int(b.warmup_fraction * spe_b * b.num_epochs),
      total_steps=spe_b * b.num_epochs, weight_decay=b.weight_decay, clip_norm=b.clip_norm)

  manager = _checkpoint_manager(workdir)
  target = _initial_state(params, opt_b, len(ld.LogHistogram().counts))
  ckpt = _restore(manager, target, sharder)
  if ckpt is target and config.run.prefix_from:
    ckpt = _restore_prefix(config, workdir, target, sharder) or target
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
      save=lambda: _save(manager, run.ckpt, sharder), langevin_key=langevin_key,
      dropout_key=dropout_key, step_b=jax.jit(training.make_phase_b_step(model, opt_b)),
      predict=jax.jit(training.make_predict(model)),
      inputs_fn=jax.jit(lambda p, batch, paths: {
          k: training.phase_a_inputs(model, p, batch)[k] for k in paths},
                        static_argnames='paths'),
      spe_a=spe_a, spe_b=spe_b, total_b=spe_b * b.num_epochs,
      select_from=training.first_selectable_epoch(stage_list),
      writer=_open_writer(workdir) if chief else None, chief=chief,
      stop_after_steps=stop_after_steps,
      save_prefix=lambda: _save_prefix(workdir, run.ckpt, sharder),
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
  # The data folder (relative to the repository) and the digests of what the run read.
  stored = _read_json(os.path.join(run.workdir, FINGERPRINT))
  results.update(data_dir=stored['data_dir'], fingerprint=stored['files'])
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
    if hasattr(run.writer, 'add_hparams'):
      run.writer.add_hparams(config, results)
    run.writer.close()
  if run.chief:
    provenance.write_json_atomic(os.path.join(run.workdir, RESULTS), results, indent=1)
  logging.info('test: %s', json.dumps(results['test']))
  return results


# ----------------------------------------------------------------------------- command line

def define_flags(flag_values: Optional[flags.FlagValues] = None) -> None:
  """The flags of ``python -m experiments.train`` (on ``flag_values``, default absl's)."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  fv = flag_values if flag_values is not None else flags.FLAGS
  config_flags.DEFINE_config_file(
      'config', None, 'A config file and variant, e.g. configs/sst2.py:kernel-favor,quick; '
      'override any field with --config.<field>=<value>; --list_fields prints them all.',
      lock_config=True, flag_values=fv)
  flags.DEFINE_string('workdir', None, 'The run folder: checkpoints, logs, results.',
                      flag_values=fv)
  flags.DEFINE_bool('list_fields', False, 'Print every field of --config with its value and '
                    'comment, then exit.', flag_values=fv)
  flags.DEFINE_bool('jax_distributed', False, 'Call jax.distributed.initialize() first '
                    '(multi-process or multi-host training).', flag_values=fv)
  flags.DEFINE_string('coordinator_address', None, 'With --jax_distributed: HOST:PORT of '
                      'process 0 (default: detected on a cluster).', flag_values=fv)
  flags.DEFINE_integer('num_processes', None, 'With --jax_distributed: how many processes.',
                       flag_values=fv)
  flags.DEFINE_integer('process_id', None, 'With --jax_distributed: this process, 0 .. '
                       'num_processes − 1.', flag_values=fv)
  flags.DEFINE_integer('stop_after_steps', None, 'Checkpoint and exit after this many steps '
                       '(resumable).', flag_values=fv)
  flags.mark_flag_as_required('config', flag_values=fv)


def field_comments(*paths: str) -> dict:
  """``{'data.task': 'Task name from ...'}``: the comment above each field's first
  assignment (``config.<field> = ...``) in these config files."""
  comments = {}
  for path in paths:
    block = []
    with open(path, encoding='utf-8') as f:
      for line in f:
        text = line.strip()
        if text.startswith('#'):
          block.append(text.lstrip('#').strip())
          continue
        match = re.match(r'config\.([\w.]+)\s*=', text)
        if match and block and match.group(1) not in comments:
          comments[match.group(1)] = ' '.join(block)
        block = []
  return comments


def describe_fields(config: ml_collections.ConfigDict, comments: dict) -> str:
  """Every field as ``--config.<field>=<value>`` with its comment below it."""
  lines = []
  for key, value in _flat(config).items():
    lines.append(f'--config.{key}={value!r}')
    lines += textwrap.wrap(comments.get(key, ''), 88, initial_indent='    ',
                           subsequent_indent='    ')
  return '\n'.join(lines)


def init_distributed(coordinator_address: Optional[str] = None,
                     num_processes: Optional[int] = None,
                     process_id: Optional[int] = None) -> None:
  """``jax.distributed.initialize``, with gloo for collectives between CPU processes.

  All three None: jax detects the cluster (SLURM, Open MPI, Cloud TPU, ...).
  """
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)
  logging.info('jax.distributed: process %d of %d, %d of %d devices here.',
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())


def _check_flags(fv) -> None:
  """The flags besides --config (the config itself is ``check_config``'s)."""
  given = [n for n in ('coordinator_address', 'num_processes', 'process_id')
           if fv[n].value is not None]
  if given and not fv.jax_distributed:
    raise cli.ConfigError(f'--{given[0]}={fv[given[0]].value}: needs --jax_distributed.')
  if given and len(given) < 3:
    missing = [f'--{n}' for n in ('coordinator_address', 'num_processes', 'process_id')
               if n not in given]
    raise cli.ConfigError(f'--{given[0]}={fv[given[0]].value}: give --coordinator_address, '
                          f'--num_processes and --process_id together (missing '
                          f'{", ".join(missing)}), or none of them on a cluster.')
  if given:
    if not re.fullmatch(r'\S+:\d+', fv.coordinator_address):
      raise cli.ConfigError(f'--coordinator_address: expected HOST:PORT, got '
                            f'{fv.coordinator_address!r}.')
    if fv.num_processes < 1:
      raise cli.ConfigError(f'--num_processes: expected an integer ≥ 1, got '
                            f'{fv.num_processes}.')
    if not 0 <= fv.process_id < fv.num_processes:
      raise cli.ConfigError(f'--process_id: expected 0 .. {fv.num_processes - 1} (for '
                            f'--num_processes={fv.num_processes}), got {fv.process_id}.')
  if fv.stop_after_steps is not None and fv.stop_after_steps < 1:
    raise cli.ConfigError(f'--stop_after_steps: expected an integer ≥ 1, got '
                          f'{fv.stop_after_steps}.')


class _QuietOrbax(std_logging.Filter):
  """Drops orbax's per-save INFO lines; warnings and errors still pass."""

  def filter(self, record):
    return record.levelno >= std_logging.WARNING or '/orbax/' not in record.pathname


def main(argv, flag_values: Optional[flags.FlagValues] = None) -> None:
  """The command line (``define_flags``); mistakes raise ``cli.ConfigError``."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  from configs import text  # pylint: disable=g-import-not-at-top
  fv = flag_values if flag_values is not None else flags.FLAGS
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected argument(s) {" ".join(argv[1:])} (flags are '
                          '--name=value).')
  config = fv.config
  if fv.list_fields:
    paths = [text.__file__, config_flags.get_config_filename(fv['config'])]
    print(describe_fields(config, field_comments(*[p for p in paths if os.path.isfile(p)])))
    return
  if not fv.workdir:
    raise cli.ConfigError('--workdir: required (the run folder: checkpoints, logs, results).')
  _check_flags(fv)
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _QuietOrbax) for f in handler.filters):
    handler.addFilter(_QuietOrbax())
  if fv.jax_distributed:
    try:
      init_distributed(fv.coordinator_address, fv.num_processes, fv.process_id)
    except ValueError as e:    # e.g. no cluster detected and no --coordinator_address
      raise cli.ConfigError(f'--jax_distributed: {" ".join(str(e).split())} (no cluster '
                            'detected? give --coordinator_address=HOST:PORT --num_processes=N '
                            '--process_id=I)') from None
  train_and_evaluate(config, fv.workdir, stop_after_steps=fv.stop_after_steps)


if __name__ == '__main__':
  define_flags()
  cli.run(main)
