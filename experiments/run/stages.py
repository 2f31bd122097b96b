r"""The stages of one training run: what every stage shares (``Run``), and Ball-X's projection.

``experiments/train.py`` turns ``config.phase_a.schedule`` into a list of
``training.Stage`` (``training.phase_schedule``) and runs each (``setup.run_stage``)
with one ``Run`` (the run's model, data and checkpointed state). A stage is

* **Phase B** (``experiments.run.phase_b``): epochs of AdamW on everything but the
  particles. All Phase B stages of a run are one optimiser and one learning-rate
  schedule; the validation-best epoch among those from ``Run.select_from`` on is kept.
* **Phase A**, by variant: Kernel-X moves the particles by projected Langevin
  dynamics and measures whether they learn (``experiments.run.phase_a``); Ball-X only
  projects them onto the ball (``project_particles``, the control); Vanilla-X leaves
  them.

The forward passes over a split that both phases use (metrics, pooled keys) are
``experiments.run.evaluation``.
"""

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import traverse_util

from coulomb_jax import langevin
from coulomb_jax import training
from coulomb_jax.tasks import data


f32 = lambda v: jnp.asarray(v, jnp.float32)
i32 = lambda v: jnp.asarray(v, jnp.int32)


def train_batches(encoded, batch_size, seed, step, steps_per_epoch, d, epoch_offset=0):
  """The shuffled batches of step's epoch, from step's position on (resume mid-epoch)."""
  epoch, offset = divmod(step, steps_per_epoch)
  it = data.batches(encoded, batch_size, seed=seed, epoch=epoch + epoch_offset,
                    pad_multiple=d.pad_multiple, bucket_size=d.bucket_size,
                    drop_remainder=True)
  for _ in range(offset):
    next(it)
  return it


# ----------------------------------------------------------------------------- the run

@dataclasses.dataclass
class Run:
  """What every stage of one run shares. ``ckpt`` is the checkpointed state (a dict
  of arrays, updated in place); ``save()`` writes it. ``folder``: the run's
  ``run_folder.RunFolder`` (history, checkpoints and results go through it)."""
  config: Any
  folder: Any                   # experiments.run.run_folder.RunFolder
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
  first_step: int = 0           # the global step this call started from (restored)
  total_steps: Optional[int] = None   # Phase A (at most) and Phase B steps of the run
  # The particles of the run's fresh init ({attention module path: [H, M, D_h]}), before
  # any Phase A: the seed fixes them, and Phase B never moves them (``ball_control``).
  initial_particles: Optional[dict] = None

  @property
  def workdir(self) -> str:
    """The run folder's path (``folder.path``)."""
    return self.folder.path

  def out_of_time(self) -> bool:
    return self.stop_after_steps is not None and self.steps_this_call >= self.stop_after_steps

  def global_step(self) -> int:
    """The global step of ``ckpt`` (as last saved or restored)."""
    return int(self.ckpt['step_a']) + int(self.ckpt['step_b'])

  def steps_reached(self) -> int:
    """The global step this call has reached (steps taken, saved or not)."""
    return self.first_step + self.steps_this_call

  def finished_training(self) -> bool:
    """Whether every stage is done (what is left: scoring the kept parameters)."""
    return int(self.ckpt['stage']) >= len(self.stages)

  def progress_line(self, done: int) -> str:
    """``done/total steps, elapsed, rate, ETA`` of the whole run (Phase A and B steps)."""
    if self.progress is None:
      return ''
    self.progress.done = done
    return self.progress.line().split('] ', 1)[-1]

  def log_record(self, record: dict) -> None:
    """One line of ``history.jsonl`` (process 0), ``t`` the global step."""
    self.folder.append_history(dict(record, t=self.global_step()))

  def log_scalars(self, prefix, values, step):
    if self.writer is not None:
      for k, v in values.items():
        self.writer.add_scalar(f'{prefix}/{k}', float(v), step)


def stage_paths(run, stage):
  return run.paths if stage.layer is None else [run.paths[stage.layer]]


def only_path(run, stage):
  return None if stage.layer is None else run.paths[stage.layer]


def projected(params, paths, radius):
  flat = traverse_util.flatten_dict(params)
  paths = {tuple(p) for p in paths}
  return traverse_util.unflatten_dict(
      {k: langevin.project_to_ball(v, radius) if k[-1] == training.PARTICLES and k[:-1] in paths
       else v for k, v in flat.items()})


def ball_control(run: Run, params):
  """``params`` with *every* layer's particles at Ball-X's: the run's initial particles
  projected onto the ball (what Ball-X's projection gives them: they are the same draw,
  and Phase B does not move particles). None if the run has no initial particles.

  ``projected(stage_start, [layer l])`` keeps the layers below l at their learned
  particles, so the layer-l keys it is measured on are Kernel-X's; with this, they are
  Ball-X's own. The other parameters are ``params``' (in every schedule but
  ``'alternating'`` after its first block, Ball-X's too: Phase A moves nothing else).
  """
  if not run.initial_particles:
    return None
  radius = run.config.phase_a.radius
  flat = traverse_util.flatten_dict(params)
  flat.update({path + (training.PARTICLES,): langevin.project_to_ball(jnp.asarray(w), radius)
               for path, w in run.initial_particles.items()})
  return run.sharder.replicate(traverse_util.unflatten_dict(flat))


def project_particles(run: Run, index: int, stage) -> None:
  """Ball-X: the stage's particles projected onto the ball; nothing else moves."""
  params = projected(run.ckpt['params'], stage_paths(run, stage), run.config.phase_a.radius)
  run.ckpt.update(params=run.sharder.replicate(params), stage=i32(index + 1),
                  stage_step=i32(0))
  run.save()
