r"""One MQAR run: check the config, train (resuming from the last checkpoint), evaluate.

``train_and_evaluate(config, workdir)`` writes into ``workdir``:

* ``config.json``: the run's config; a workdir holding another config is refused;
* ``checkpoint.msgpack``: ``{step, seconds, state}`` every ``train.checkpoint_every`` steps,
  written to a temporary file and renamed (a killed run loses at most that many steps);
* ``result.json``: the binding row of ``results/mqar.json`` (seq_len, num_pairs, width,
  method, num_features, seed, accuracy, train_seconds) plus loss, steps, vocab, num_train
  and provenance, and for the kernel methods the particles' diversity at initialisation and
  at the end (``particle_diversity``). A finished run is not trained again.

Training batches: step t draws ``mqar_batch(fold_in(k_train, t), batch_size, ...)``, so
every step sees fresh sequences and ``num_train = steps · batch_size``; the evaluation
batch (``data.num_eval`` sequences) comes from its own key and is never trained on.
Accuracy is over answer positions only (every key queried once per sequence).
"""

import json
import os
import time
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import serialization

from coulomb_jax import _checks
from coulomb_jax import diagnostics
from coulomb_jax import lm
from coulomb_jax import mimicry
from coulomb_jax import models
from coulomb_jax import mqar
from experiments.common import cli
from experiments.common import provenance
from experiments.recall import methods

CONFIG_FILE = 'config.json'
CHECKPOINT_FILE = 'checkpoint.msgpack'
RESULT_FILE = 'result.json'
EVAL_CHUNK = 256


def check_config(config: ml_collections.ConfigDict) -> None:
  """Every field, before any compute: one ``cli.ConfigError`` naming it and its value."""
  try:
    if config.method not in methods.METHODS:
      raise ValueError(f'config.method must be one of {methods.METHODS}, got {config.method!r}.')
    d, m, t, p = config.data, config.model, config.train, config.particles
    _checks.check_int('config.seed', config.seed, 0)
    mqar.check_mqar_args(d.num_eval, d.vocab_size, d.seq_len, d.num_pairs, d.power_a)
    for name in ('width', 'num_layers', 'num_heads', 'num_features', 'chunk_size'):
      _checks.check_int(f'config.model.{name}', m[name], 1)
    _checks.check_int('config.model.mlp_ratio', m.mlp_ratio, 0)
    if m.causal_path not in models.CAUSAL_PATHS:
      raise ValueError(f'config.model.causal_path must be one of {models.CAUSAL_PATHS}, '
                       f'got {m.causal_path!r}.')
    if m.width % m.num_heads:
      raise ValueError(f'config.model.width must be divisible by config.model.num_heads='
                       f'{m.num_heads}, got {m.width}.')
    if config.method == 'hedgehog' and m.num_features % 2:
      raise ValueError(f'config.model.num_features must be even for hedgehog (N/2 rows give '
                       f'N features), got {m.num_features}.')
    for name in ('steps', 'batch_size', 'checkpoint_every', 'log_every'):
      _checks.check_int(f'config.train.{name}', t[name], 1)
    _checks.check_positive('config.train.learning_rate', t.learning_rate)
    _checks.check_nonnegative('config.train.weight_decay', t.weight_decay)
    for name in ('step_size', 'beta', 'radius', 'clip_norm'):
      _checks.check_positive(f'config.particles.{name}', p[name])
    _checks.check_nonnegative('config.particles.lam', p.lam)
    _checks.check_nonnegative('config.particles.softening', p.softening)
    if p.target not in mimicry.TARGETS:
      raise ValueError(f'config.particles.target must be one of {mimicry.TARGETS}, '
                       f'got {p.target!r}.')
    _checks.check_int('config.particles.rows', p.rows, 1)
  except ValueError as e:
    raise cli.ConfigError(str(e)) from None


def _keys(seed: int):
  root = jax.random.key(seed)
  return {name: jax.random.fold_in(root, i) for i, name in
          enumerate(('init', 'train', 'eval', 'langevin'))}


def _check_workdir(config, workdir: str) -> None:
  path = os.path.join(workdir, CONFIG_FILE)
  if os.path.isfile(workdir):
    raise cli.ConfigError(f'--workdir: {workdir} is a file, not a folder.')
  if os.path.exists(path):
    with open(path) as f:
      old = f.read()
    if json.loads(old) != json.loads(config.to_json()):
      raise cli.ConfigError(f'--workdir: {workdir} holds a run of another config ({path}); '
                            f'use a new workdir.')


def _restore(workdir: str, state):
  path = os.path.join(workdir, CHECKPOINT_FILE)
  if not os.path.exists(path):
    return state, 0, 0.0
  with open(path, 'rb') as f:
    blob = serialization.msgpack_restore(f.read())
  state = serialization.from_state_dict(state, blob['state'])
  return state, int(blob['step']), float(blob['seconds'])


def _save(workdir: str, state, step: int, seconds: float) -> None:
  blob = serialization.msgpack_serialize(
      {'step': step, 'seconds': seconds, 'state': serialization.to_state_dict(state)})
  with provenance.atomic_open(os.path.join(workdir, CHECKPOINT_FILE), 'wb') as f:
    f.write(blob)


def data_args(config) -> dict:
  d = config.data
  return dict(vocab_size=d.vocab_size, seq_len=d.seq_len, num_pairs=d.num_pairs,
              power_a=d.power_a)


def evaluate(params, model, config, key) -> dict:
  """Loss and accuracy over the answers of ``data.num_eval`` sequences (chunks of 256)."""
  batch = mqar.mqar_batch(key, config.data.num_eval, **data_args(config))
  totals, count = np.zeros(2), 0
  for start in range(0, config.data.num_eval, EVAL_CHUNK):
    chunk = jax.tree.map(lambda x: x[start:start + EVAL_CHUNK], batch)
    out = lm.evaluate(params, chunk, model)
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
  d = config.data
  return {'seq_len': d.seq_len, 'num_pairs': d.num_pairs, 'width': config.model.width,
          'method': config.method,
          'num_features': 0 if config.method == 'softmax' else config.model.num_features,
          'seed': config.seed, 'accuracy': float(metrics['accuracy']),
          'train_seconds': round(seconds, 1), 'loss': float(metrics['loss']),
          'steps': config.train.steps, 'vocab': d.vocab_size,
          'num_train': config.train.steps * config.train.batch_size}


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
  method = methods.build(config, jax.random.key_data(keys['langevin']))
  state = lm.make_state(keys['init'], method.model, config.data.seq_len,
                        learning_rate=config.train.learning_rate,
                        weight_decay=config.train.weight_decay,
                        particle_tx=method.particle_tx)
  initial_diversity = particle_diversity(jax.device_get(state.params))
  state, step, seconds = _restore(workdir, state)
  if step:
    log(f'{workdir}: resumed at step {step} of {config.train.steps}')
  t = config.train
  while step < t.steps:
    start = time.time()
    batch = mqar.mqar_batch(jax.random.fold_in(keys['train'], step), t.batch_size,
                            **data_args(config))
    state, metrics = lm.train_step(state, batch, method.mimicry, method.feature_map)
    step += 1
    if step % t.log_every == 0 or step == t.steps:
      log(f'{workdir}: step {step}/{t.steps} loss {float(metrics["loss"]):.4f} '
          f'accuracy {float(metrics["accuracy"]):.4f}')
    seconds += time.time() - start
    if step % t.checkpoint_every == 0 or step == t.steps:
      _save(workdir, state, step, seconds)
  metrics = evaluate(state.params, method.model, config, keys['eval'])
  row = dict(result_row(config, metrics, seconds), **metadata)
  if initial_diversity:
    row['diversity'] = {'initial': initial_diversity,
                        'final': particle_diversity(jax.device_get(state.params))}
  provenance.write_json_atomic(result_path, row, indent=2)
  log(f'{workdir}: accuracy {row["accuracy"]:.4f} ({row["train_seconds"]} s)')
  return row
