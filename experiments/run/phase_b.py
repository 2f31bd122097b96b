r"""Phase B of one run: epochs of AdamW on everything but the particles.

``run_phase_b(run, index, stage)`` runs (or resumes) the epochs of one Phase B stage
(``experiments.run.stages``): all Phase B stages of a run are one optimiser and one
learning-rate schedule; after each epoch the validation metrics are logged
(``history.jsonl``, TensorBoard) and the epoch is kept if it is the best so far
(higher accuracy, ties: lower log loss) among those from ``Run.select_from`` on.
"""

import json
import time

import jax
import numpy as np
from absl import logging

from coulomb_jax import training
from experiments.run import evaluation
from experiments.run import stages
from experiments.run.stages import f32, i32


def run_phase_b(run: stages.Run, index: int, stage) -> bool:
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
      it = stages.train_batches(run.encoded['train'], b.batch_size, config.seed + 1, t,
                                run.spe_b, config.data)
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
  val = evaluation.evaluate(run.predict, state.params, run.encoded['validation'],
                            config.run.eval_batch_size, run.sharder, config)
  logging.info('epoch %d validation: %s', epoch, json.dumps(val))
  run.log_scalars('validation', val, t + 1)
  run.log_record({'epoch': epoch, 'step': t + 1, 'validation': val})
  if epoch >= run.select_from and evaluation.better(val, np.float32(ck['best_accuracy']),
                                                    np.float32(ck['best_log_loss'])):
    ck.update(best_params=state.params, best_accuracy=f32(val['accuracy']),
              best_log_loss=f32(val['log_loss']), best_epoch=i32(epoch))
