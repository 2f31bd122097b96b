"""When each phase runs: the stages of a schedule (joint, layer-wise, after B, alternating)."""

from typing import NamedTuple, Optional


class Stage(NamedTuple):
  """One phase of a training schedule (``phase_schedule``).

  ``phase``: ``'a'`` (the particles move, everything else frozen) or ``'b'``
  (particles frozen). For ``'a'``: ``layer`` is the index of the attention module
  whose particles move (None: all of them at once, the joint objective), ``cycle``
  the how-manieth Phase A pass this is (noise key and data order), ``num_epochs``
  its epochs over the training rows. For ``'b'``: epochs ``first_epoch`` to
  ``first_epoch + num_epochs − 1`` of one Phase B run (one optimiser and one
  learning-rate schedule over all its stages).
  """
  phase: str
  num_epochs: int
  first_epoch: int = 0
  layer: Optional[int] = None
  cycle: int = 0


SCHEDULES = ('joint', 'layerwise', 'after_b', 'alternating')


def phase_schedule(schedule: str, *, num_layers: int, a_epochs: int, b_epochs: int,
                   after_b_epochs: int = 0) -> list:
  """The stages of a schedule, in order (a list of ``Stage``).

  * ``joint`` (the paper): Phase A on all layers at once, then Phase B.
  * ``layerwise``: Phase A one layer after the other (bottom up), then Phase B.
  * ``after_b``: ``after_b_epochs`` epochs of Phase B, Phase A layer by layer on
    the trained encoder, then the remaining Phase B epochs with the new particles.
  * ``alternating``: blocks of ``after_b_epochs`` Phase B epochs with a layer-wise
    Phase A pass between consecutive blocks.

  Phase A always sees the representations of the encoder as it is at that point.
  """
  if schedule not in SCHEDULES:
    raise ValueError(f'schedule: expected one of {SCHEDULES}, got {schedule!r}.')
  layer_pass = lambda cycle: [Stage('a', a_epochs, layer=l, cycle=cycle)
                              for l in range(num_layers)]
  if schedule == 'joint':
    return [Stage('a', a_epochs), Stage('b', b_epochs)]
  if schedule == 'layerwise':
    return layer_pass(0) + [Stage('b', b_epochs)]
  if not 1 <= after_b_epochs < b_epochs:
    raise ValueError(f'after_b_epochs: expected an integer in [1, {b_epochs - 1}] (Phase B '
                     f'epochs on both sides of Phase A), got {after_b_epochs!r}.')
  if schedule == 'after_b':
    return ([Stage('b', after_b_epochs)] + layer_pass(0)
            + [Stage('b', b_epochs - after_b_epochs, first_epoch=after_b_epochs)])
  stages, epoch, cycle = [], 0, 0
  while epoch < b_epochs:
    if epoch:
      stages += layer_pass(cycle)
      cycle += 1
    size = min(after_b_epochs, b_epochs - epoch)
    stages.append(Stage('b', size, first_epoch=epoch))
    epoch += size
  return stages


def first_selectable_epoch(stages) -> int:
  """The first Phase B epoch that ends after the schedule's first Phase A stage.

  Model selection keeps the best validation epoch from here on, so that a kept
  model has the particles Phase A gave it (0 when Phase A comes first or never).
  """
  for i, stage in enumerate(stages):
    if stage.phase == 'a':
      later = [s.first_epoch for s in stages[i:] if s.phase == 'b']
      return later[0] if later else 0
  return 0
