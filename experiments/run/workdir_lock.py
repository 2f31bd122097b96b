"""The lock of a run folder: one process at a time (``fcntl.flock`` on ``<workdir>/lock``,
released when the process ends however it ends), shared by every process of a
multi-process job through process 0. ``RunFolder.lock`` / ``release`` / ``held`` call it."""

import datetime
import fcntl
import os
import socket
import time

import jax
import numpy as np

from experiments.common import cli

LOCK = 'lock'


class WorkdirBusy(cli.ConfigError):
  """Another process holds the workdir's lock."""


# The workdirs this process holds (realpath → the open lock file; None on processes > 0).
_HELD = {}


def _flock(workdir):
  """Takes ``<workdir>/lock`` with ``fcntl.flock`` and writes the holder's name in it."""
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


def held(path: str) -> bool:
  """Whether this process holds ``path``'s lock."""
  return os.path.realpath(path) in _HELD


def take(path: str, chief: bool) -> bool:
  """Takes ``<path>/lock`` for this process (``chief``: process 0 takes the file lock; the
  others learn whether it could). Raises ``WorkdirBusy`` naming the holder if another
  process has it; returns False if this process already held it, True if it took it now."""
  key = os.path.realpath(path)
  if key in _HELD:
    return False
  error, lock_file = None, None
  if chief:
    try:
      lock_file = _flock(path)
    except WorkdirBusy as e:
      error = e
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    if int(multihost_utils.broadcast_one_to_all(np.int32(error is not None))) and not error:
      error = WorkdirBusy(f'workdir {path!r} is in use by another run (process 0 names it).')
  if error:
    raise error
  _HELD[key] = lock_file
  return True


def release(path: str) -> None:
  """Lets go of ``path``'s lock (nothing if this process does not hold it)."""
  f = _HELD.pop(os.path.realpath(path), None)
  if f is not None:
    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()
