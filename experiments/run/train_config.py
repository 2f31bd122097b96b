r"""Which configs ``experiments/train.py`` accepts, and where a run's data is.

``check_config(config, num_devices)`` reads nothing big and raises one
``cli.ConfigError`` (a ValueError) naming the first bad field and its value: a
value out of range, a choice not offered (``data.TASKS``, ``models.ATTENTION_KINDS``,
``training.SCHEDULES``, ...), a batch size the devices cannot split, or a field
that contradicts ``config.variant`` (``configs/text.py``).

``data_dir(config)``: ``config.data.data_dir`` if set, else ``$COULOMB_JAX_DATA``,
else ``../shared/data`` next to the repository. ``flat(config)``: every field as
``{'data.task': ..., 'seed': ...}`` (logs, ``--list_fields``, TensorBoard hparams).
"""

import math
import os

import ml_collections

from coulomb_jax import features
from coulomb_jax import training
from coulomb_jax.layers import models
from coulomb_jax.tasks import data
from experiments.common import cli
from experiments.common import provenance

PHASE_A_SCHEDULES = training.SCHEDULES
DATASETS = {'sst2': 'configs/sst2.py', 'rotten_tomatoes': 'configs/rotten_tomatoes.py',
            'qqp_subset': 'configs/qqp.py'}
"""Each dataset's launch config, relative to the repository root."""


def run_dir(workdir: str, dataset: str, variant: str, seed: int) -> str:
  """A grid's run folder: ``<workdir>/<dataset>/<variant>/seed<seed>``."""
  return os.path.join(workdir, dataset, variant, f'seed{seed}')


# The data folder when config.data.data_dir is '': this variable, else DEFAULT_DATA_DIR.
DATA_ENV = 'COULOMB_JAX_DATA'
DEFAULT_DATA_DIR = os.path.join(os.path.dirname(provenance.REPO_ROOT), 'shared', 'data')


def data_dir(config: ml_collections.ConfigDict) -> str:
  """The data folder: ``config.data.data_dir`` if set (relative to the current
  folder), else ``$COULOMB_JAX_DATA``, else ``../shared/data`` next to the repository."""
  return config.data.data_dir or os.environ.get(DATA_ENV) or DEFAULT_DATA_DIR


def check_config(config: ml_collections.ConfigDict, num_devices: int = 1) -> None:
  """Raises one ValueError (``cli.ConfigError``) naming the field and its value; reads
  nothing big. The checks run in order: data, model, Phase A, then Phase B, batch
  sizes and the run's fields, then the variant's fields; the first failing one is
  reported."""
  _check_data(config)
  _check_model(config.model)
  _check_phase_a(config)
  m, a, b, r = config.model, config.phase_a, config.phase_b, config.run
  if not isinstance(r.prefix_from, str):
    _fail('run.prefix_from', r.prefix_from, "'' or a run folder")
  for field in ('learning_rate', 'clip_norm'):
    _positive(f'phase_b.{field}', b[field])
  _positive('phase_b.weight_decay', b.weight_decay, allow_zero=True)
  if not 0 <= b.warmup_fraction < 1:
    _fail('phase_b.warmup_fraction', b.warmup_fraction, 'a number in [0, 1)')
  _positive_int('phase_b.num_epochs', b.num_epochs)
  for field, value in (('phase_a.batch_size', a.batch_size), ('phase_b.batch_size', b.batch_size),
                       ('run.eval_batch_size', r.eval_batch_size)):
    _positive_int(field, value)
    if value % num_devices:
      _fail(field, value, f'a multiple of the device count {num_devices}')
  _positive_int('model.chunk_size', m.chunk_size, 0)
  _positive('model.init_radius', m.init_radius, allow_zero=True)
  _positive_int('run.log_every', r.log_every)
  _positive_int('run.checkpoint_every', r.checkpoint_every, 0)
  _positive_int('seed', config.seed, 0)
  _check_variant(config, _fail)


def _fail(field, value, expected):
  raise cli.ConfigError(f'config.{field}: expected {expected}, got {value!r}.')


def _positive_int(field, value, low=1):
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    _fail(field, value, f'an integer ≥ {low}')


def _positive(field, value, allow_zero=False):
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
      value > 0 or (allow_zero and value == 0)) or math.isinf(value):
    _fail(field, value, 'a finite number ≥ 0' if allow_zero else 'a finite number > 0')


def _check_data(config) -> None:
  """``config.data``: the task, the data folder, the validation rule, lengths and limits."""
  d = config.data
  if d.task not in data.TASKS:
    _fail('data.task', d.task, f'one of {data.TASKS}')
  if not isinstance(d.data_dir, str):
    _fail('data.data_dir', d.data_dir, "'' or a folder")
  if not os.path.isdir(data_dir(config)):
    if d.data_dir:
      _fail('data.data_dir', d.data_dir, 'an existing folder with the data')
    where = (f'${DATA_ENV}={os.environ[DATA_ENV]!r}' if os.environ.get(DATA_ENV) else
             f'${DATA_ENV} is not set and ../shared/data next to the repository '
             f'({DEFAULT_DATA_DIR})')
    raise cli.ConfigError(f'config.data.data_dir: not set, and {where} is not a folder; set '
                          f'--config.data.data_dir=FOLDER or {DATA_ENV}=FOLDER (layout: '
                          'coulomb_jax/tasks/data/__init__.py).')
  if d.vocab_file and not os.path.isfile(d.vocab_file):
    _fail('data.vocab_file', d.vocab_file, "'' or an existing vocab.txt")
  _positive_int('data.validation_size', d.validation_size)
  if d.validation_rule not in data.VALIDATION_RULES:
    _fail('data.validation_rule', d.validation_rule, f'one of {data.VALIDATION_RULES}')
  if d.validation_rule == 'sentences' and d.task != 'sst2':
    _fail('data.validation_rule', d.validation_rule, f"'rows' for task {d.task!r} (only sst2 "
         f"has phrase-level rows)")
  _positive_int('data.max_length', d.max_length, 4)
  _positive_int('data.vocab_size', d.vocab_size, 16)
  _positive_int('data.pad_multiple', d.pad_multiple)
  if d.max_length % d.pad_multiple:      # Padded batches must never exceed max_length.
    _fail('data.max_length', d.max_length, f'a multiple of data.pad_multiple={d.pad_multiple}')
  _positive_int('data.bucket_size', d.bucket_size)
  _positive_int('data.max_train_examples', d.max_train_examples, 0)
  _positive_int('data.max_eval_examples', d.max_eval_examples, 0)


def _check_model(m) -> None:
  """``config.model``: the attention, its feature map, and the sizes."""
  if m.attention not in models.ATTENTION_KINDS:
    _fail('model.attention', m.attention, f'one of {models.ATTENTION_KINDS}')
  if m.feature_map not in features.names(positive=True):
    _fail('model.feature_map', m.feature_map, f'one of {features.names(positive=True)}')
  if m.qk_mode not in models.QK_MODES:
    _fail('model.qk_mode', m.qk_mode, f'one of {models.QK_MODES}')
  for field in ('num_features', 'width', 'num_layers', 'num_heads', 'ffn_dim',
                'linformer_length'):
    _positive_int(f'model.{field}', m[field])
  if m.width % m.num_heads:
    _fail('model.width', m.width, f'a multiple of model.num_heads={m.num_heads}')
  if not 0 <= m.dropout_rate < 1:
    _fail('model.dropout_rate', m.dropout_rate, 'a number in [0, 1)')


def _check_phase_a(config) -> None:
  """``config.phase_a`` (Langevin settings, schedule, calibration rules; given the model)."""
  m, a, b = config.model, config.phase_a, config.phase_b
  if a.enabled and m.attention != 'kernel':
    _fail('phase_a.enabled', a.enabled, f"False for model.attention={m.attention!r}")
  if not isinstance(a.target, str) or a.target not in training.PHASE_A_TARGETS:
    _fail('phase_a.target', a.target, f'one of {training.PHASE_A_TARGETS}')
  for field in ('step_size', 'beta', 'clip_norm', 'radius'):
    _positive(f'phase_a.{field}', a[field])
  _positive('phase_a.lam', a.lam, allow_zero=True)
  _positive('phase_a.softening', a.softening, allow_zero=True)
  _positive('phase_a.tolerance', a.tolerance, allow_zero=True)
  if a.riesz_s != 'coulomb':             # A string field: a number arrives as '1.0'.
    try:
      riesz_s = float(a.riesz_s)
    except (TypeError, ValueError):
      riesz_s = -1.0
    if not riesz_s >= 0:
      _fail('phase_a.riesz_s', a.riesz_s, "'coulomb' or a number ≥ 0 (as a string, e.g. '1.0')")
  elif a.enabled and m.width // m.num_heads < 2:
    _fail('phase_a.riesz_s', a.riesz_s, f'a number for head dimension '
         f'{m.width // m.num_heads} (coulomb is s = D_h − 2, D_h ≥ 2)')
  _positive_int('phase_a.num_epochs', a.num_epochs, 0)
  if a.enabled and a.num_epochs == 0:
    _fail('phase_a.num_epochs', a.num_epochs, 'an integer ≥ 1 when phase_a.enabled')
  if a.schedule not in PHASE_A_SCHEDULES:
    _fail('phase_a.schedule', a.schedule, f'one of {PHASE_A_SCHEDULES}')
  if a.schedule in ('after_b', 'alternating'):
    _positive_int('phase_a.after_b_epochs', a.after_b_epochs)
    if a.after_b_epochs >= b.num_epochs:
      _fail('phase_a.after_b_epochs', a.after_b_epochs, f'fewer than phase_b.num_epochs='
           f'{b.num_epochs} (Phase B epochs must follow Phase A)')
  for field in ('relative_step', 'relative_lam', 'gibbs_tilt'):
    _positive(f'phase_a.{field}', a[field], allow_zero=True)
  _positive_int('phase_a.calibration_rows', a.calibration_rows, 2)
  _positive_int('phase_a.heldout_rows', a.heldout_rows, 2)
  if not isinstance(a.null_run, bool):
    _fail('phase_a.null_run', a.null_run, 'True or False')


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


def flat(config) -> dict:
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
