r"""The run folder (``--workdir``): ``RunFolder`` owns its files, their checks and its lock.

``RunFolder(workdir)`` is the one object that names a file of a run folder (its
docstring: the layout and the life of a run); ``experiments/train.py`` holds one
per run and hands it, not the path, to what reads or writes the folder. Module
level: ``WorkdirBusy``, the error of a folder in use, and the names of
``run_identity`` (the JSON readers ``read_json``, ``stored_files``; the config as saved,
``saved_config``, ``with_added_fields``; the config digest that every checkpoint, stage
file and results.json of the folder carries).
"""

import functools
import json
import os
import shutil
from typing import Optional

import jax
import ml_collections
import numpy as np
from absl import logging

from coulomb_jax.tasks import data
from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance
from experiments.run import checkpoints
from experiments.run import run_identity
from experiments.run import sharding
from experiments.run import summaries
from experiments.run import train_config
from experiments.run import workdir_lock

LOCK = workdir_lock.LOCK
CONFIG = run_identity.CONFIG
FINGERPRINT = run_identity.FINGERPRINT
TOKENIZER = run_identity.TOKENIZER
SESSIONS = 'sessions.json'
HISTORY = 'history.jsonl'
PREFIX_RECORD = checkpoints.PREFIX + '.json'
RESULTS = run_identity.RESULTS
STAGES = run_identity.STAGES
# What a run writes in its folder (``check_paths``): files, then folders.
FILES = (LOCK, CONFIG, FINGERPRINT, TOKENIZER, SESSIONS, HISTORY, PREFIX_RECORD, STAGES,
         'predictions_validation.npz', 'predictions_test.npz', RESULTS)
FOLDERS = (checkpoints.CHECKPOINTS, checkpoints.UNREADABLE, checkpoints.PREFIX, 'tensorboard')


# The JSON readers and the config's identity live in run_identity; their names stay here.
read_json = run_identity.read_json
stored_files = run_identity.stored_files
saved_config = run_identity.saved_config
with_added_fields = run_identity.with_added_fields


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


WorkdirBusy = workdir_lock.WorkdirBusy


class RunFolder:
  r"""One run's folder: every file of it is read and written here. Layout of ``path``:

  * ``lock``: held by the running process (``fcntl.flock``; it names pid, host, start);
  * ``config.json``: the config (``saved_config``), written once;
  * ``fingerprint.json``: ``{"data_dir", "files": {name: sha256}}`` of every data file
    read, of the ``vocab_file`` and of ``tokenizer.json`` (the WordPiece tokenizer);
  * ``sessions.json``: commit, date and devices of every call that ran the folder;
  * ``history.jsonl``: one JSON record per log line, ``t`` its global step;
  * ``checkpoints/``: orbax, the last two steps (``checkpoints_unreadable/``: set aside),
    each with the digests of the run's data and config (``run_identity``);
  * ``prefix/``: the state after the Phase B epochs before Phase A, for runs with
    ``run.prefix_from``; ``prefix.json``: where this run's prefix came from;
  * ``phase_a_stages.json``: Phase A stage summaries (``experiments.run.phase_a``), each
    with the config digest (``config_sha256``, added by ``save``);
  * ``tensorboard/``: scalars as they come, hparams at the end (``summaries``);
  * ``predictions_{validation,test}.npz``, ``results.json`` (with ``config_sha256``):
    written last.

  Life of a run (``experiments/train.py``): ``preflight`` (reads and checks, writes
  nothing); ``finished`` (the results of a finished run, read back: nothing more is
  done); ``lock``; ``write_config_and_fingerprint``; ``record_session``; the
  tokenizer (``tokenizer``, ``with_tokenizer``); ``restore`` (or ``restore_prefix``)
  and ``truncate_history`` to the restored step; while training ``save``,
  ``append_history`` and ``open_writer``'s scalars; at the end ``write_predictions``
  and ``write_json(RESULTS, ...)``. ``with RunFolder(w) as folder:`` releases the lock
  on leaving if it was taken inside the block. Process 0 alone writes.
  """

  def __init__(self, workdir: str):
    if not isinstance(workdir, (str, os.PathLike)) or not os.fspath(workdir):
      raise ValueError(f'workdir: expected a folder path, got {workdir!r}.')
    self.path = os.fspath(workdir)
    self._release_on_exit = []
    self._kept = None        # (step folder, global step) of the newest checkpoint known

  def __repr__(self):
    return f'RunFolder({self.path!r})'

  def file(self, name: str) -> str:
    """``<workdir>/<name>``."""
    return os.path.join(self.path, name)

  def exists(self, name: str) -> bool:
    return os.path.exists(self.file(name))

  @property
  def chief(self) -> bool:
    """Whether this process writes the folder (process 0)."""
    return jax.process_index() == 0

  # --------------------------------------------------------------------------- lock

  @property
  def held(self) -> bool:
    """Whether this process holds the folder's lock (``lock``)."""
    return workdir_lock.held(self.path)

  def lock(self) -> bool:
    """Takes ``<workdir>/lock`` for this process (process 0 for a multi-process job).

    ``fcntl.flock``: held until ``release`` or the process ends, however it ends (a
    killed run leaves no stale lock). Raises ``WorkdirBusy`` naming the holder if
    another process has it; returns False if this process already held it, True if it
    took it now (``workdir_lock.take``).
    """
    return workdir_lock.take(self.path, self.chief)

  def release(self) -> None:
    """Lets go of the lock (nothing if this process does not hold it)."""
    workdir_lock.release(self.path)

  def __enter__(self):
    self._release_on_exit.append(not self.held)
    return self

  def __exit__(self, *exc_info):
    if self._release_on_exit.pop():
      self.release()

  # --------------------------------------------------------------------------- checks

  def preflight(self, config: ml_collections.ConfigDict) -> dict:
    """Every check of a run before it writes anything; returns the data fingerprint.

    The config (``train_config.check_config``), the data files, and an existing folder:
    its ``config.json`` must be this config's (the data folder aside: the fingerprint
    compares the data itself), its ``results.json`` and ``phase_a_stages.json`` of this
    config's digest (``run_identity``), its files readable, and its ``fingerprint.json``
    must match the files now on disk. ``run.prefix_from``: that run's config and data.
    Raises ``cli.ConfigError`` (a ValueError) naming the field or file. First of all
    ``check_paths``: the folder and what the run writes in it can be written.
    """
    self.check_paths()
    train_config.check_config(config, jax.device_count())
    workdir, config_path = self.path, self.file(CONFIG)
    if os.path.exists(config_path):
      saved = read_json(config_path)
      if run_identity.identity(saved) != run_identity.identity(saved_config(config)):
        raise cli.ConfigError(f'workdir: {workdir!r} holds a run with a different config '
                              f'({config_path}); use a new workdir.')
    digest = run_identity.digest_of(config)
    run_identity.check_results(workdir, digest)
    self.check_stages(digest)
    _check_history(self.file(HISTORY))
    if self.exists(SESSIONS):
      read_json(self.file(SESSIONS))
    try:
      current = self.data_fingerprint(config)
    except FileNotFoundError as e:
      raise cli.ConfigError(str(e)) from None
    stored_path = self.file(FINGERPRINT)
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
        data.load_tokenizer(self.file(TOKENIZER))
      except ValueError as e:
        raise cli.ConfigError(str(e)) from None
    if config.run.prefix_from:
      run_identity.check_prefix_source(config, current)
    return expected

  def check_paths(self) -> None:
    """One ``cli.ConfigError`` naming ``--workdir`` when the run folder is a file or lies
    under one, or when a file the run writes in it (``FILES``) is a folder or a folder it
    writes (``FOLDERS``) a file: refused before anything is read, computed or written."""
    outputs.check_folder('--workdir', self.path)
    outputs.check_files_in('--workdir', self.path, FILES)
    for name in FOLDERS:
      outputs.check_folder('--workdir', self.file(name))

  def finished(self, config: ml_collections.ConfigDict) -> Optional[dict]:
    """``results.json`` if this folder holds the finished run of ``config``, else None.

    Call it after ``preflight`` (which has refused a results.json of another config, by
    its ``config_sha256``, and a folder whose data changed). It is the run's when
    ``run_identity.finished_run_difference`` finds no difference, and complete when it
    has the validation and test metrics; one that is not (written by hand, cut short)
    is reported in a warning line and the kept parameters are scored again.
    """
    path = self.file(RESULTS)
    if not os.path.isfile(path):
      return None
    if run_identity.finished_run_difference(self.path, config) is not None:
      return None                       # preflight names the difference
    results = read_json(path)
    missing = [k for k in ('validation', 'test')
               if not isinstance(results, dict) or not isinstance(results.get(k), dict)]
    if missing:
      logging.warning('%s has no %s metrics: scoring the kept parameters again.', path,
                      ' or '.join(missing))
      return None
    return results

  def check_stages(self, digest: str) -> None:
    """``phase_a_stages.json`` must be of the run of config digest ``digest``
    (``run_identity.check_stages``: one line naming both digests and the file)."""
    run_identity.check_stages(self.file(STAGES), digest)

  def data_fingerprint(self, config) -> dict:
    """``{name: sha256}`` of every file a run reads: the task's data files (named relative
    to ``train_config.data_dir(config)``), ``config.data.vocab_file`` if set
    (``vocab_file <path>``) and, once it exists, ``tokenizer.json``."""
    root = train_config.data_dir(config)
    files = data.fingerprint(data.source_files(config.data.task, root), root=root)
    vocab = config.data.vocab_file
    if vocab:
      files[f'vocab_file {provenance.relative_path(vocab)}'] = data.fingerprint([vocab])[vocab]
    tok = self.file(TOKENIZER)
    if os.path.isfile(tok):
      files[TOKENIZER] = data.fingerprint([tok])[tok]
    return dict(sorted(files.items()))

  def write_config_and_fingerprint(self, config, fingerprint: dict) -> None:
    """``config.json`` (once) and ``fingerprint.json`` (process 0)."""
    if not self.exists(CONFIG):
      self.write_json(CONFIG, saved_config(config))
    self.write_json(FINGERPRINT, {
        'data_dir': provenance.relative_path(train_config.data_dir(config)),
        'files': fingerprint})

  def stored_fingerprint(self) -> dict:
    """``fingerprint.json``: ``{"data_dir", "files"}``."""
    return read_json(self.file(FINGERPRINT))

  # --------------------------------------------------------------------------- tokenizer

  def copy_tokenizer(self, source: str) -> None:
    """A run continuing ``source``'s prefix starts with that run's tokenizer (process 0
    copies it, if this folder has none yet)."""
    theirs = os.path.join(source, TOKENIZER)
    if not self.exists(TOKENIZER) and os.path.exists(theirs) and self.chief:
      shutil.copyfile(theirs, self.file(TOKENIZER))

  def tokenizer(self, train_texts: list, vocab_size: int):
    """``tokenizer.json``, trained (by process 0 alone when there are several) on
    ``train_texts`` with ``vocab_size`` entries if it is not there yet."""
    path = self.file(TOKENIZER)
    sharding.sync('tokenizer: before looking')   # Every earlier write of process 0 is done.
    exists = os.path.exists(path)
    sharding.sync('tokenizer: looked')           # Nobody looks after process 0 writes it.
    if exists:
      return data.load_tokenizer(path)
    tok = None
    if self.chief:
      tok = data.train_tokenizer(train_texts, vocab_size)
      with cli.signals_deferred():          # A stop leaves no temporary file behind.
        data.save_tokenizer(tok, path)
    sharding.sync('tokenizer: written')
    return tok if tok is not None else data.load_tokenizer(path)

  def with_tokenizer(self, config, fingerprint: dict) -> dict:
    """``fingerprint`` with the digest of ``tokenizer.json``, once it exists (and
    ``fingerprint.json`` rewritten if that adds it); a retrained tokenizer must equal
    the one the run started with."""
    path = self.file(TOKENIZER)
    if not os.path.isfile(path):
      return fingerprint
    digest = data.fingerprint([path])[path]
    if fingerprint.get(TOKENIZER, digest) != digest:
      raise cli.ConfigError(f'{path}: the tokenizer trained again (sha256 {digest[:12]}…) is '
                            f'not the one this run started with ({fingerprint[TOKENIZER][:12]}…)'
                            '; use a new workdir.')
    new = dict(sorted({**fingerprint, TOKENIZER: digest}.items()))
    if new != fingerprint:
      self.write_config_and_fingerprint(config, new)
    return new

  # --------------------------------------------------------------------------- sessions, history

  def sessions(self) -> list:
    """``sessions.json`` (empty before the first session)."""
    return read_json(self.file(SESSIONS)) if self.exists(SESSIONS) else []

  def record_session(self, meta: dict) -> list:
    """Appends this call's commit, date and devices to ``sessions.json``; returns them all.

    A run resumed in a later session may run other code or on other devices: the
    results keep every session (``results['sessions']``), not only the last one's
    commit, and a change of device count (sharded sums, so the final parameters are
    no longer bit-identical to an uninterrupted run) is logged as a warning.
    """
    sessions = self.sessions()
    now = {'commit': meta.get('commit'), 'date': meta.get('date'),
           'device_count': jax.device_count(), 'platform': jax.default_backend()}
    if sessions and (sessions[-1]['device_count'], sessions[-1]['platform']) != (
        now['device_count'], now['platform']):
      logging.warning('Resuming %s on %d %s device(s) after %d %s: not bit-identical to an '
                      'uninterrupted run.', self.path, now['device_count'], now['platform'],
                      sessions[-1]['device_count'], sessions[-1]['platform'])
    if sessions and sessions[-1]['commit'] != now['commit']:
      logging.warning('Resuming %s at commit %s after %s.', self.path, now['commit'],
                      sessions[-1]['commit'])
    sessions.append(now)
    self.write_json(SESSIONS, sessions)
    return sessions

  def history(self) -> list:
    """The lines of ``history.jsonl`` (empty ones dropped; none before the first)."""
    if not self.exists(HISTORY):
      return []
    with open(self.file(HISTORY)) as f:
      return [line for line in f if line.strip()]

  def append_history(self, record: dict) -> None:
    """One line of ``history.jsonl`` (process 0); ``record['t']`` is its global step."""
    if self.chief:
      with open(self.file(HISTORY), 'a') as f:
        f.write(json.dumps(record) + '\n')

  def truncate_history(self, t: int) -> None:
    """Drops history records written after the restored checkpoint (step ``t``): those
    epochs and evaluations run again. A last line torn by a kill is dropped too."""
    if not self.chief or not self.exists(HISTORY):
      return
    lines, kept = self.history(), []
    for i, line in enumerate(lines):
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        if i == len(lines) - 1:
          continue
        raise
      if record['t'] <= t:
        kept.append(line if line.endswith('\n') else line + '\n')
    self.write_text(HISTORY, ''.join(kept))

  # --------------------------------------------------------------------------- checkpoints

  @functools.cached_property
  def checkpoint_manager(self):
    """Orbax's manager of ``checkpoints/`` (the last two steps), opened on first use."""
    return checkpoints.checkpoint_manager(self.path)

  def save(self, ckpt, sharder=None) -> None:
    """Saves the run's state (all processes call it; ``checkpoints.save``). First the
    stages of ``phase_a_stages.json`` get the state's config digest (process 0,
    ``run_identity.stamp_stages``): a Phase A stage is done only once a checkpoint says
    so, and by then its summary names its run."""
    if self.chief and checkpoints.CONFIG_LEAF in ckpt:
      run_identity.stamp_stages(self.file(STAGES), checkpoints.leaf_hex(
          ckpt[checkpoints.CONFIG_LEAF]))
    with cli.signals_deferred():   # A stop during the save is raised once it is recorded.
      step = checkpoints.save(self.checkpoint_manager, ckpt, sharder)
      self._kept = (self._step_folder(step), int(ckpt['step_a']) + int(ckpt['step_b']))

  def restore(self, target, sharder=None):
    """The newest readable checkpoint, or ``target`` if none (``checkpoints.restore``);
    one written before config digests is vouched for by ``config.json``."""
    legacy = None
    if self.exists(CONFIG):
      legacy = (self.file(CONFIG), run_identity.config_digest(read_json(self.file(CONFIG))))
    ckpt = checkpoints.restore(self.checkpoint_manager, target, sharder, legacy)
    if ckpt is not target:
      done = int(ckpt['step_a']) + int(ckpt['step_b'])
      self._kept = (self._step_folder(done + int(ckpt['stage'])), done)
    return ckpt

  def _step_folder(self, step: int) -> str:
    return os.path.join(self.path, checkpoints.CHECKPOINTS, str(step))

  def kept_checkpoint(self):
    """``(folder, step)`` of the newest complete checkpoint: the one this process saved
    or restored last (``step``: the training steps it holds), else the newest step
    folder on disk (``step`` None: not read); None if there is none."""
    if self._kept is not None and os.path.isdir(self._kept[0]):
      return self._kept
    directory = os.path.join(self.path, checkpoints.CHECKPOINTS)
    steps = sorted(int(n) for n in (os.listdir(directory) if os.path.isdir(directory) else [])
                   if n.isdigit())
    return (self._step_folder(steps[-1]), None) if steps else None

  def latest_checkpoint(self):
    """The newest checkpoint as saved, without a target (a finished run's ``best_params``)."""
    return checkpoints.read_latest(self.checkpoint_manager)

  def save_prefix(self, ckpt, sharder=None) -> None:
    """``prefix/``: the state after the Phase B epochs before the first Phase A stage."""
    checkpoints.save_prefix(self.path, ckpt, sharder)

  def restore_prefix(self, source: str, target, sharder=None):
    """``target`` restored from ``<source>/prefix`` (``run.prefix_from``), or None if that
    run has not saved it yet; this folder then starts with ``source``'s history up to
    there and a ``prefix.json`` naming it (its sessions and its Phase B steps)."""
    restored = checkpoints.restore_prefix(source, target, sharder,
                                          run_identity.prefix_source_digest(source))
    if restored is None:
      return None
    theirs, t = RunFolder(source), int(restored['step_a']) + int(restored['step_b'])
    self.write_text(HISTORY, ''.join(line for line in theirs.history()
                                     if json.loads(line)['t'] <= t))
    self.write_json(PREFIX_RECORD, {'from': source, 'phase_b_steps': int(restored['step_b']),
                                    'sessions': theirs.sessions()})
    logging.info('Phase B prefix (%d steps) taken from %s.', int(restored['step_b']),
                 os.path.abspath(theirs.file(checkpoints.PREFIX)))
    return restored

  def prefix_record(self) -> Optional[dict]:
    """``prefix.json`` (where the Phase B prefix was trained, and when), or None."""
    return read_json(self.file(PREFIX_RECORD)) if self.exists(PREFIX_RECORD) else None

  # --------------------------------------------------------------------------- writes

  def open_writer(self):
    """TensorBoard's ``tensorboard/`` (``summaries.FlushingWriter``) on process 0; None
    elsewhere and without tensorboardX."""
    return summaries.open_writer(self.path) if self.chief else None

  def write_text(self, name: str, text: str) -> None:
    """``<workdir>/<name>`` replaced atomically (process 0): a failed or killed write
    leaves the old file (``provenance.write_atomic``)."""
    if self.chief:
      provenance.write_atomic(self.file(name), text)

  def write_json(self, name: str, obj) -> None:
    """``obj`` as ``<workdir>/<name>`` (indent 1), atomically, by process 0."""
    if self.chief:
      provenance.write_json_atomic(self.file(name), obj, indent=1)

  def write_predictions(self, split: str, labels, probs) -> None:
    """``predictions_<split>.npz`` (process 0), written atomically: ``labels`` [n] int32
    and ``probs`` [n] float32, P(class 1) in row order."""
    path = self.file(f'predictions_{split}.npz')
    if self.chief:
      with provenance.atomic_open(path, 'wb') as f:
        np.savez(f, labels=np.asarray(labels, np.int32), probs=np.asarray(probs, np.float32))

