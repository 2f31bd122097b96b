r"""TensorBoard for a run: scalars in ``<workdir>/tensorboard``, flushed as they come.

``open_writer(workdir)``: tensorboardX's ``SummaryWriter`` wrapped so that every
scalar is on disk at once (the curves of a killed run survive it), with the
config's fields and the final metrics on the HPARAMS tab at the end; None, with
one warning, if tensorboardX is not installed. A run opens it through its folder
(``run_folder.RunFolder.open_writer``, process 0).
"""

import os

from absl import logging

from experiments.run import train_config


class FlushingWriter:
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
    hparams = {k: v for k, v in train_config.flat(config).items()
               if isinstance(v, (bool, int, float, str))}
    metrics = {f'{split}/{k}': float(v) for split in ('validation', 'test')
               for k, v in results[split].items()}
    self.writer.add_hparams(hparams, metrics, name='hparams')
    self.writer.flush()

  def close(self):
    self.writer.close()


def open_writer(workdir):
  """A ``FlushingWriter`` on ``<workdir>/tensorboard``; None without tensorboardX."""
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  except ImportError:
    logging.warning('tensorboardX is not installed: no TensorBoard scalars.')
    return None
  return FlushingWriter(SummaryWriter(os.path.join(workdir, 'tensorboard')))
