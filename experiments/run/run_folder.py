r"""The run folder (``--workdir``): its files, the checks before a run writes to it, its lock.

Files: ``config.json`` (the config, written once), ``fingerprint.json`` (the
data folder and ``{name: sha256}`` of every data file read and of
``tokenizer.json``), ``history.jsonl`` (one JSON record per log line, ``t`` its
step), ``sessions.json`` (commit, date and devices of every call that ran it),
``results.json``; process 0 alone writes them. A damaged one is reported in one
``cli.ConfigError`` naming it.

``preflight(config, workdir)`` does every check before anything is written: the
config, a workdir of another config or whose data fingerprint differs from the
files now on disk (the changed files named), and a ``run.prefix_from`` source of
another config or data. ``lock_workdir`` then holds ``<workdir>/lock``
(``fcntl.flock``) for the run's lifetime: a second run on the same folder is
refused naming the first, and a killed run leaves no stale lock.
"""

import datetime
import fcntl
import json
import os
import socket
import time
from typing import Optional

import jax
import ml_collections
import numpy as np
from absl import logging

from coulomb_jax import data
from experiments.common import cli
from experiments.common import provenance
from experiments.run import train_config

RESULTS = 'results.json'
FINGERPRINT = 'fingerprint.json'
TOKENIZER = 'tokenizer.json'
LOCK = 'lock'


def read_json(path):
  """A JSON file of a run folder; one ``cli.ConfigError`` naming it if it is damaged."""
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise cli.ConfigError(f'{path} is not valid JSON ({e}): the file is damaged; restore it '
                          'or use a new workdir.') from None


def stored_files(path):
  """The ``{name: sha256}`` of a ``fingerprint.json``; one ``cli.ConfigError`` if malformed."""
  stored = read_json(path)
  if not isinstance(stored, dict) or not isinstance(stored.get('files'), dict):
    raise cli.ConfigError(f'{path}: expected {{"files": {{name: sha256}}}}, got '
                          f'{json.dumps(stored)[:80]}; restore it or use a new workdir.')
  return stored['files']


# Config fields added after runs were started, with the value that reproduces what
# those runs did: a config.json without the field resumes as having this value.
_ADDED_FIELDS = {('data', 'validation_rule'): 'rows'}


def saved_config(config):
  """``config`` as ``config.json`` holds it (a plain nested dict)."""
  return json.loads(config.to_json())


def with_added_fields(saved):
  """A saved config (``saved_config``) with every field added since it was written."""
  for (section, field), value in _ADDED_FIELDS.items():
    saved.setdefault(section, {}).setdefault(field, value)
  return saved


def _without_data_dir(saved):
  """A saved config without ``data.data_dir`` (the data fingerprint compares the data)."""
  return {k: ({f: v for f, v in fields.items() if f != 'data_dir'} if k == 'data' else fields)
          for k, fields in saved.items()}


def data_fingerprint(config, workdir: Optional[str] = None) -> dict:
  """``{name: sha256}`` of every file a run reads: the task's data files (named relative
  to ``train_config.data_dir(config)``), ``config.data.vocab_file`` if set
  (``vocab_file <path>``) and, once it exists, ``<workdir>/tokenizer.json``
  (``tokenizer.json``)."""
  root = train_config.data_dir(config)
  files = data.fingerprint(data.source_files(config.data.task, root), root=root)
  vocab = config.data.vocab_file
  if vocab:
    files[f'vocab_file {provenance.relative_path(vocab)}'] = data.fingerprint([vocab])[vocab]
  tok = os.path.join(workdir, TOKENIZER) if workdir else None
  if tok and os.path.isfile(tok):
    files[TOKENIZER] = data.fingerprint([tok])[tok]
  return dict(sorted(files.items()))


def with_tokenizer(workdir, fingerprint):
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


def write_config_and_fingerprint(config, workdir, fingerprint):
  """``config.json`` (once) and ``fingerprint.json`` (process 0)."""
  if jax.process_index():
    return
  config_path = os.path.join(workdir, 'config.json')
  if not os.path.exists(config_path):
    provenance.write_json_atomic(config_path, saved_config(config), indent=1)
  provenance.write_json_atomic(os.path.join(workdir, FINGERPRINT), {
      'data_dir': provenance.relative_path(train_config.data_dir(config)),
      'files': fingerprint}, indent=1)


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


def truncate_history(workdir, t):
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


def record_session(workdir, meta):
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


def preflight(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Every check of a run before it writes anything; returns the data fingerprint.

  The config (``train_config.check_config``), the data files, and an existing ``workdir``: its
  ``config.json`` must be this config's (the data folder aside: the fingerprint
  compares the data itself), its files readable, and its ``fingerprint.json`` must
  match the files now on disk. ``run.prefix_from``: that run's config and data.
  Raises ``cli.ConfigError`` (a ValueError) naming the field or file.
  """
  train_config.check_config(config, jax.device_count())
  config_path = os.path.join(workdir, 'config.json')
  if os.path.exists(config_path):
    saved = with_added_fields(read_json(config_path))
    if _without_data_dir(saved) != _without_data_dir(saved_config(config)):
      raise cli.ConfigError(f'workdir: {workdir!r} holds a run with a different config '
                            f'({config_path}); use a new workdir.')
  _check_history(os.path.join(workdir, 'history.jsonl'))
  if os.path.exists(os.path.join(workdir, 'sessions.json')):
    read_json(os.path.join(workdir, 'sessions.json'))
  try:
    current = data_fingerprint(config, workdir)
  except FileNotFoundError as e:
    raise cli.ConfigError(str(e)) from None
  stored_path = os.path.join(workdir, FINGERPRINT)
  stored = stored_files(stored_path) if os.path.exists(stored_path) else {}
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


# Fields that only act from the first Phase A stage on: runs that differ in nothing
# else share their Phase B prefix bit for bit. (The data folder: the data fingerprint
# is compared instead.)
_PREFIX_FREE = ('variant', 'model.init_radius', 'run.prefix_from', 'run.log_every',
                'run.checkpoint_every', 'data.data_dir')


def _prefix_fields(fingerprint):
  """The flat fields of a saved config that a run's Phase B prefix depends on."""
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
  theirs = _prefix_fields(with_added_fields(read_json(os.path.join(source, 'config.json'))))
  mine = _prefix_fields(saved_config(config))
  diff = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
  if diff:
    raise cli.ConfigError(f'config.run.prefix_from: {source!r} trained with other values of '
                          f'{diff}; its Phase B prefix is not this run\'s.')
  path = os.path.join(source, FINGERPRINT)
  if not os.path.exists(path):
    logging.warning('config.run.prefix_from: %s has no %s (trained before data fingerprints): '
                    'its data is not compared with this run\'s.', source, FINGERPRINT)
    return
  stored = stored_files(path)
  if TOKENIZER not in ours:      # Ours is copied from theirs.
    stored = {k: v for k, v in stored.items() if k != TOKENIZER}
  try:
    data.check_fingerprint(stored, ours, what=f'config.run.prefix_from: the data {source!r} '
                           'trained on')
  except ValueError as e:
    raise cli.ConfigError(f'{e} Its Phase B prefix is not this run\'s.') from None


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


def holds(workdir: str) -> bool:
  """Whether this process holds ``workdir``'s lock (``lock_workdir``)."""
  return os.path.realpath(workdir) in _HELD


def release_workdir(workdir: str) -> None:
  """Lets go of a workdir this process locked (nothing if it did not)."""
  f = _HELD.pop(os.path.realpath(workdir), None)
  if f is not None:
    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()
