r"""One text-classification run's building blocks, shared by the ``train`` command and the
studies that drive runs themselves (``studies.phase_a_pilot``, ``studies.phase_a_drift``,
``studies.softmax_mimicry``): the data (``load_data``), the model (``make_model``), the
stage schedule (``schedule``, ``run_stage``) and a run set up and restored from its folder
(``setup_run``). ``experiments/train.py`` is the command around them.
"""

from typing import Optional

import jax
import ml_collections
import numpy as np
from absl import logging

from coulomb_jax import langevin_diagnostics as ld
from coulomb_jax import training
from coulomb_jax.layers import models
from coulomb_jax.tasks import data
from experiments.common import cli
from experiments.common import progress
from experiments.run import checkpoints
from experiments.run import phase_a
from experiments.run import phase_b
from experiments.run import run_folder
from experiments.run import run_identity
from experiments.run import sharding
from experiments.run import stages
from experiments.run import train_config


# ----------------------------------------------------------------------------- data

def _subset(examples, size):
  """A fixed random ``size`` rows in file order (files can be sorted by label, e.g. MR)."""
  keep = np.sort(np.random.default_rng(0).permutation(len(examples.labels))[:size])
  pick = lambda texts: None if texts is None else [texts[i] for i in keep]
  return data.Examples(pick(examples.text_a), pick(examples.text_b), examples.labels[keep])


def load_data(config, folder: run_folder.RunFolder):
  """Returns ``({'train', 'validation', 'test'}: data.Encoded, vocab_size)``.

  The tokenizer is ``config.data.vocab_file``'s, else the folder's ``tokenizer.json``
  (``RunFolder.tokenizer``: trained by process 0 on the training split if it is not
  there yet).
  """
  d = config.data
  root = train_config.data_dir(config)
  splits = {s: data.load_split(d.task, root, s, validation_size=d.validation_size,
                               validation_rule=d.validation_rule)
            for s in ('train', 'validation', 'test')}
  for names, limit in ((('train',), d.max_train_examples),
                       (('validation', 'test'), d.max_eval_examples)):
    for name in names:
      if limit:
        splits[name] = _subset(splits[name], limit)
  if d.vocab_file:
    tok = data.load_vocab_tokenizer(d.vocab_file)
  else:
    tr = splits['train']
    tok = folder.tokenizer(tr.text_a + (tr.text_b or []), d.vocab_size)
  encoded = {s: data.encode(tok, ex, d.max_length) for s, ex in splits.items()}
  return encoded, tok.get_vocab_size()


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


def run_stage(run: stages.Run, index: int) -> bool:
  """Runs (or resumes) stage ``index``; False if the run must stop (out of time).

  Phase B: ``phase_b.run_phase_b``; Phase A by ``run.kind``: Langevin
  (``phase_a.run_phase_a``), the projection onto the ball (``stages.project_particles``)
  or nothing."""
  stage = run.stages[index]
  if stage.phase == 'b':
    return phase_b.run_phase_b(run, index, stage)
  if run.kind == 'kernel':
    return phase_a.run_phase_a(run, index, stage)
  if run.kind == 'ball':
    stages.project_particles(run, index, stage)
  else:
    run.ckpt.update(stage=stages.i32(index + 1), stage_step=stages.i32(0))
  return True


# ----------------------------------------------------------------------------- a run

def _log_config(config, folder):
  lines = '\n'.join(f'  {k} = {v!r}' for k, v in train_config.flat(config).items())
  logging.info('config (saved in %s; data from %s):\n%s', folder.file(run_folder.CONFIG),
               train_config.data_dir(config), lines)


def _open_folder(config, folder: run_folder.RunFolder, meta: dict,
                 fingerprint: Optional[dict] = None):
  """The folder's checks and first writes, then the data: ``(fingerprint, sessions,
  encoded, vocab_size)``.

  Nothing is written before ``folder.preflight`` has passed; then the folder is locked
  for this process (``folder.lock``; leaving a ``with folder:`` block releases it),
  ``config.json`` and ``fingerprint.json`` are written, this session is recorded, and
  the tokenizer and data are loaded (``load_data``); the fingerprint returned has the
  tokenizer's digest. ``fingerprint``: what ``folder.preflight(config)`` returned, if
  the caller has run it already.
  """
  if fingerprint is None:
    fingerprint = folder.preflight(config)
  folder.lock()
  _log_config(config, folder)
  folder.write_config_and_fingerprint(config, fingerprint)
  sessions = folder.record_session(meta)
  if config.run.prefix_from:
    folder.copy_tokenizer(config.run.prefix_from)   # The prefix's own.
  try:
    encoded, vocab_size = load_data(config, folder)
  except (ValueError, FileNotFoundError) as e:   # Bad data: named by coulomb_jax.tasks.data.
    raise cli.ConfigError(str(e)) from None
  return folder.with_tokenizer(config, fingerprint), sessions, encoded, vocab_size


def _steps_per_epoch(config, n_train):
  """``(Phase A, Phase B)`` steps per epoch; a batch larger than the data is refused."""
  a, b = config.phase_a, config.phase_b
  spe_a = data.num_batches(n_train, a.batch_size, drop_remainder=True)
  spe_b = data.num_batches(n_train, b.batch_size, drop_remainder=True)
  for field, value, steps in (('phase_b.batch_size', b.batch_size, spe_b),
                              ('phase_a.batch_size', a.batch_size, spe_a if a.enabled else 1)):
    if not steps:
      raise cli.ConfigError(f'config.{field}: {value} exceeds the {n_train} training rows.')
  return spe_a, spe_b


def _restore(config, folder, target, sharder, num_stages):
  """The run's state: the folder's newest checkpoint, else ``run.prefix_from``'s prefix,
  else ``target``; the history is cut back to it."""
  ckpt = folder.restore(target, sharder)
  if ckpt is target and config.run.prefix_from:
    ckpt = folder.restore_prefix(config.run.prefix_from, target, sharder) or target
  ckpt = sharder.replicate(ckpt)
  folder.truncate_history(int(ckpt['step_a']) + int(ckpt['step_b']))
  if int(ckpt['stage']) >= num_stages:
    logging.info('Resumed from %s: training is finished (%d Phase A and %d Phase B steps); '
                 'scoring the kept parameters.', folder.checkpoint_manager.directory,
                 int(ckpt['step_a']), int(ckpt['step_b']))
  elif int(ckpt['stage']) or int(ckpt['stage_step']) or int(ckpt['step_b']):
    logging.info('Resumed from %s: stage %d/%d, %d steps into it (%d Phase A and %d Phase B '
                 'steps done in all).', folder.checkpoint_manager.directory,
                 int(ckpt['stage']) + 1, num_stages, int(ckpt['stage_step']),
                 int(ckpt['step_a']), int(ckpt['step_b']))
  return ckpt


def setup_run(config: ml_collections.ConfigDict, folder: run_folder.RunFolder, meta: dict, *,
              stop_after_steps: Optional[int] = None, fingerprint: Optional[dict] = None):
  """Checks, data, model, optimisers and the restored state of a run: ``(stages.Run,
  sessions)``, ready for ``run_stage`` from ``run.ckpt['stage']`` on.

  ``folder``: the run folder (``_open_folder``: nothing is written before its preflight
  has passed; then it is locked for this process). ``fingerprint``: preflight's, if the
  caller has run it.
  """
  fingerprint, sessions, encoded, vocab_size = _open_folder(config, folder, meta,
                                                            fingerprint)
  sharder = sharding.Sharder()
  model = make_model(config, vocab_size)
  a, b, d = config.phase_a, config.phase_b, config.data
  init_key, langevin_key, dropout_key = jax.random.split(jax.random.PRNGKey(config.seed), 3)
  example = next(data.batches(encoded['train'], 2, pad_multiple=d.pad_multiple))
  params = model.init(init_key, example['ids'], example['segments'], example['mask'])['params']
  if a.enabled and not training.has_particles(params):
    raise cli.ConfigError(f'phase_a.enabled: the model {config.variant!r} has no particles.')
  spe_a, spe_b = _steps_per_epoch(config, len(encoded['train'].labels))
  paths = training.attention_paths(params)
  stage_list = schedule(config, max(len(paths), 1))
  opt_b = training.phase_b_optimizer(
      learning_rate=b.learning_rate, warmup_steps=int(b.warmup_fraction * spe_b * b.num_epochs),
      total_steps=spe_b * b.num_epochs, weight_decay=b.weight_decay, clip_norm=b.clip_norm)
  target = checkpoints.initial_state(params, opt_b, len(ld.LogHistogram().counts), fingerprint,
                                     config_digest=run_identity.digest_of(config))
  ckpt = _restore(config, folder, target, sharder, len(stage_list))
  checkpoints.check_free_space(folder.path, ckpt, folder.checkpoint_manager)
  chief = jax.process_index() == 0
  kind = run_kind(config, params)
  total_a = (sum(spe_a * s.num_epochs for s in stage_list if s.phase == 'a')
             if kind == 'kernel' else 0)
  done = int(ckpt['step_a']) + int(ckpt['step_b'])
  run = stages.Run(
      config=config, folder=folder, kind=kind, model=model,
      encoded=encoded, sharder=sharder, paths=paths, stages=stage_list, ckpt=ckpt,
      save=lambda: folder.save(run.ckpt, sharder), langevin_key=langevin_key,
      dropout_key=dropout_key, step_b=jax.jit(training.make_phase_b_step(model, opt_b)),
      predict=jax.jit(training.make_predict(model)),
      inputs_fn=jax.jit(lambda p, batch, paths: {
          k: training.phase_a_inputs(model, p, batch)[k] for k in paths},
                        static_argnames='paths'),
      spe_a=spe_a, spe_b=spe_b, total_b=spe_b * b.num_epochs,
      select_from=training.first_selectable_epoch(stage_list),
      writer=folder.open_writer(), chief=chief, stop_after_steps=stop_after_steps,
      save_prefix=lambda: folder.save_prefix(run.ckpt, sharder),
      progress=progress.Progress('train', total=total_a + spe_b * b.num_epochs, unit='step',
                                 done=done),
      first_step=done, total_steps=total_a + spe_b * b.num_epochs,
      initial_particles=training.particle_leaves(params))
  return run, sessions
