r"""Converting a trained softmax MQAR model to linear attention: fit the features, then tune.

``convert(teacher_dir, method, workdir, fit_steps, finetune_steps)`` reads a finished
``softmax`` run of ``experiments.mqar`` (its ``config.json`` and ``checkpoint.msgpack``),
builds the same ``CausalLM`` with ``KernelAttention`` of ``method`` (N features per head,
``methods.build``), copies every teacher weight into it (W_q, W_k, W_v, W_o under
``attn``: the kernel path scales q and k by D_h^{-1/4}, so FAVOR+ estimates the teacher's
exp(q·k/√D_h) exactly in expectation), and then:

1. **Fit** (``fit_steps`` steps, every weight but the features frozen): the library's
   ``conversion.fit_in_model``. At every step each layer's own (q, k) on the first
   ``config.particles.rows`` sequences of a fresh batch are recorded from the student (layer
   1's are the teacher's; a later layer's follow the features fitted below it), and every
   head moves once on its mimicry Hamiltonian (Hedgehog's cross-entropy between softmax and
   linear attention rows, plus λ·repulsion for the particles), by the fit's method
   (``fit_settings``):

   ==================== ==================================================================
   ``particles_softmax`` ``'particles'``: projected Langevin with the teacher's
                         ``config.particles`` (β, R, λ, Riesz s, ε, per-head clip);
                         η = ``particle_step_size`` (default 3e-3, as the long grid).
   ``softmaxfeat_trained`` ``'adam'`` on W of φ = softmax([Wx, −Wx]) (random orthogonal
                         rows), rate ``hedgehog_learning_rate``, λ = 0 (the map the first
                         grids called ``hedgehog``).
   ``hedgehog``          ``'hedgehog'``: W of Zhang et al.'s φ = [e^{Wx}, e^{−Wx}] from the
                         identity, the same Adam fit.
   ``favor_orthogonal``, no fit: the random features (the control).
   ``elu``
   ==================== ==================================================================

2. **Zero-shot** accuracy at answer positions on the teacher's own evaluation batch (the
   key of its seed), beside the teacher's accuracy on it (from its ``result.json``).
3. **Fine-tune** (``finetune_steps`` steps, features frozen): every other weight by AdamW
   on the task loss (the teacher's learning rate), fresh batches; accuracy again.

Batches of the fit and the fine-tune are fresh: the teacher's training key folded with
10,000,000 + t and 20,000,000 + t, steps its training never reached. ``<workdir>/result.json`` (atomic) holds the row;
a finished workdir is not run again. The fit and fine-tune are short (no checkpoint).
"""

import json
import os
import time

import jax
import ml_collections
import optax
from flax import serialization
from flax.training import train_state

from coulomb_jax import conversion
from coulomb_jax import training
from coulomb_jax.tasks import mqar
from experiments.analysis import loading
from experiments.common import cli
from experiments.common import provenance
from experiments.recall import grid as grid_lib
from experiments.recall import methods
from experiments.recall import run as run_lib
from studies.mqar_convert import config as study_config

CONVERT_METHODS = study_config.METHODS
FITTED = ('softmaxfeat_trained', 'hedgehog', 'particles_softmax')
RESULT_FILE = 'result.json'


def read_teacher(teacher_dir: str):
  """``(config, params, result)`` of a finished softmax run (``result``: its
  ``result.json``, whose accuracy is on the evaluation batch the conversion uses too); one
  ``cli.ConfigError`` otherwise."""
  paths = [os.path.join(teacher_dir, f) for f in (run_lib.CONFIG_FILE, run_lib.CHECKPOINT_FILE,
                                                  run_lib.RESULT_FILE)]
  for path in paths:
    if not os.path.isfile(path):
      raise cli.ConfigError(f'--teacher: {teacher_dir} is not a finished experiments.mqar run '
                            f'({os.path.basename(path)} missing).')
  try:
    with open(paths[0]) as f:
      config = ml_collections.ConfigDict(run_lib.with_added_fields(json.load(f)))
  except json.JSONDecodeError as e:
    raise cli.ConfigError(f'--teacher: {paths[0]}: not valid JSON ({e}).') from None
  if config.method != 'softmax':
    raise cli.ConfigError(f'--teacher: {teacher_dir} is a {config.method!r} run; the teacher '
                          'must be a softmax run.')
  with open(paths[1], 'rb') as f:
    blob = serialization.msgpack_restore(f.read())
  if int(blob['step']) != config.train.steps:
    raise cli.ConfigError(f'--teacher: {teacher_dir} stopped at step {blob["step"]} of '
                          f'{config.train.steps}.')
  result = loading.read_json(paths[2])
  return config, blob['state']['params'], result


def student_params(teacher: dict, student: dict) -> dict:
  """The student's params with every teacher weight copied in (its features kept)."""
  out = {}
  for name, value in student.items():
    if name.startswith('block_'):
      block = dict(teacher[name])
      block['attn'] = dict(teacher[name]['attn']['mha'],
                           **{training.PARTICLES: value['attn'][training.PARTICLES]})
      out[name] = block
    else:
      out[name] = teacher[name]
  shapes = jax.tree.map(lambda x: x.shape, out), jax.tree.map(lambda x: x.shape, student)
  if shapes[0] != shapes[1]:
    raise ValueError(f'teacher and student params differ: {shapes[0]} vs {shapes[1]}.')
  return out


def _state(model, params, particle_tx, rest_tx):
  tx = optax.partition({training.PARTICLES: particle_tx, 'rest': rest_tx},
                       training.partition_labels)
  return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def fit_settings(method: str, config, hedgehog_learning_rate: float,
                 particle_step_size: float):
  """``(fit method, feature map, conversion.FitSettings)`` of a fitted ``method`` (the table
  in the module docstring), from the teacher's ``config``."""
  p = config.particles
  if method == 'particles_softmax':
    return 'particles', 'favor', conversion.FitSettings(
        step_size=particle_step_size, beta=p.beta, lam=p.lam, radius=p.radius,
        clip_norm=p.clip_norm, riesz_s=p.riesz_s, softening=p.softening, target=p.target)
  adam = conversion.FitSettings(lam=0.0, learning_rate=hedgehog_learning_rate, target=p.target)
  if method == 'hedgehog':
    return 'hedgehog', 'hedgehog', adam
  if method == 'softmaxfeat_trained':
    return 'adam', 'softmaxfeat', adam
  raise ValueError(f'method: {method!r} is not fitted; fitted are {FITTED}.')


def convert(teacher_dir: str, method: str, workdir: str, fit_steps: int, finetune_steps: int,
            hedgehog_learning_rate: float = 3e-3, particle_step_size: float = 3e-3,
            log=run_lib.log_line,
            metadata=None) -> dict:
  """One conversion (module docstring); returns and writes ``<workdir>/result.json``."""
  if method not in CONVERT_METHODS:
    raise cli.ConfigError(f'--method must be one of {CONVERT_METHODS}, got {method!r}.')
  for name, value in (('fit_steps', fit_steps), ('finetune_steps', finetune_steps)):
    if not isinstance(value, int) or value < 0:
      raise cli.ConfigError(f'--{name} must be an integer >= 0, got {value!r}.')
  if not hedgehog_learning_rate > 0:
    raise cli.ConfigError(f'--hedgehog_learning_rate must be > 0, got {hedgehog_learning_rate}.')
  config, teacher, teacher_result = read_teacher(teacher_dir)
  result_path = os.path.join(workdir, RESULT_FILE)
  if os.path.exists(result_path):
    return loading.read_json(result_path)
  metadata = metadata or provenance.run_metadata('studies.mqar_convert')
  config = grid_lib.apply_overrides(config, {'method': method,
                                             'particles.step_size': particle_step_size})
  run_lib.check_config(config)
  keys = run_lib._keys(config.seed)   # pylint: disable=protected-access
  built = methods.build(config, jax.random.key_data(keys['langevin']))
  model = built.model
  init = training.lm.make_state(keys['init'], model, config.data.seq_len).params
  params = student_params(teacher, jax.device_get(init))
  start = time.time()
  data = run_lib.data_args(config)
  if method in FITTED and fit_steps:
    fit_method, feature_map, settings = fit_settings(method, config, hedgehog_learning_rate,
                                                     particle_step_size)
    if feature_map != built.feature_map:
      raise ValueError(f'{method}: the fit\'s map {feature_map!r} is not the model\'s '
                       f'{built.feature_map!r}.')
    rows = config.particles.rows
    batches = [jax.tree.map(lambda x: x[:rows], mqar.mqar_batch(
        jax.random.fold_in(keys['train'], 10_000_000 + t), config.train.batch_size, **data))
               for t in range(fit_steps)]
    variables, _ = conversion.fit_in_model(keys['langevin'], model, {'params': params}, batches,
                                           method=fit_method, steps=fit_steps,
                                           feature_map=feature_map, settings=settings,
                                           inputs=lambda b: (b.inputs,))
    params = variables['params']
  zero_shot = run_lib.evaluate(params, model, config, keys['eval'])
  log(f'{workdir}: teacher {teacher_result["accuracy"]:.4f}, zero-shot {method} '
      f'{zero_shot["accuracy"]:.4f}')
  t_cfg = config.train
  state = _state(model, params, optax.set_to_zero(),
                 optax.adamw(t_cfg.learning_rate, weight_decay=t_cfg.weight_decay))
  for t in range(finetune_steps):
    batch = mqar.mqar_batch(jax.random.fold_in(keys['train'], 20_000_000 + t),
                            t_cfg.batch_size, **data)
    state, _ = training.lm.train_step(state, batch, None, built.feature_map)
  tuned = run_lib.evaluate(state.params, model, config, keys['eval'])
  d = config.data
  row = {'seq_len': d.seq_len, 'num_pairs': d.num_pairs, 'width': config.model.width,
         'method': method, 'num_features': config.model.num_features, 'seed': config.seed,
         'teacher_accuracy': float(teacher_result['accuracy']),
         'zero_shot_accuracy': float(zero_shot['accuracy']),
         'finetuned_accuracy': float(tuned['accuracy']),
         'zero_shot_loss': float(zero_shot['loss']), 'finetuned_loss': float(tuned['loss']),
         'fit_steps': fit_steps if method in FITTED else 0, 'finetune_steps': finetune_steps,
         'seconds': round(time.time() - start, 1),
         'teacher': provenance.relative_path(teacher_dir), **metadata}
  os.makedirs(workdir, exist_ok=True)
  provenance.write_json_atomic(result_path, row, indent=2)
  log(f'{workdir}: fine-tuned {row["finetuned_accuracy"]:.4f} ({row["seconds"]} s)')
  return row
