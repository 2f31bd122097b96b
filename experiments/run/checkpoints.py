r"""A run's checkpoints (orbax): saved, restored with a fallback, and the Phase B prefix.

``<workdir>/checkpoints`` holds the last two steps of the run's state
(``initial_state``: the stage and step within it, parameters, both optimisers'
states, the best epoch so far, timers, Phase A histograms, ``data_sha256``, the
digest of the run's data fingerprint, and ``config_sha256``, the digest of its config,
``run_identity.config_digest``); a step's number is ``step_a + step_b + stage``.
``restore`` takes the newest readable one: an unreadable one is reported in one
warning line, moved to ``<workdir>/checkpoints_unreadable`` and the one before it
used; one written from other data (its ``data_sha256`` differs) or by a run of
another config (its ``config_sha256``) is refused, and so is one holding a
non-finite parameter (``check_finite``), before any step. A checkpoint written
before config digests has no ``config_sha256``: it is restored without it, and the
folder's ``config.json`` vouches for it instead.

``<workdir>/prefix`` is the state at the end of the Phase B epochs before the
first Phase A stage (``save_prefix``); a run with ``run.prefix_from`` starts from
that run's (``restore_prefix``; ``run_folder.RunFolder.restore_prefix`` copies that
run's history up to there).

These functions take the manager or the folder path from ``run_folder.RunFolder``,
which opens the manager (``RunFolder.checkpoint_manager``) and calls them.
"""

import contextlib
import errno
import hashlib
import json
import logging as std_logging
import os
import shutil
import sys

import jax
import numpy as np
from absl import logging

from coulomb_jax import training
from experiments.common import cli
from experiments.run import sharding
from experiments.run import stages

CHECKPOINTS = 'checkpoints'
# Unreadable checkpoints are moved here (not deleted) when an older one is used instead.
UNREADABLE = 'checkpoints_unreadable'
PREFIX = 'prefix'
# The leaf of the run's config digest (``run_identity.config_digest``), uint8[32].
CONFIG_LEAF = 'config_sha256'


def checkpoint_manager(workdir):
  """Orbax's manager of ``<workdir>/checkpoints``, keeping the last two steps."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, CHECKPOINTS)),
                               options=options)


def data_digest(fingerprint: dict) -> np.ndarray:
  """uint8[32]: sha256 of a run's data fingerprint (``RunFolder.data_fingerprint``,
  ``{file: sha256}`` with the tokenizer), as a checkpoint leaf."""
  text = json.dumps(fingerprint, sort_keys=True)
  return np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8).copy()


def digest_leaf(digest: str) -> np.ndarray:
  """uint8[32]: a sha256 given as 64 hex digits (``run_identity.config_digest``), as a
  checkpoint leaf."""
  return np.frombuffer(bytes.fromhex(digest), np.uint8).copy()


def leaf_hex(leaf) -> str:
  """The hex digits of a digest leaf (``data_digest``, ``digest_leaf``), restored or not."""
  return _host(leaf).tobytes().hex()


def _host(x):
  """A leaf as a numpy array (a restored leaf is a global array, replicated, on several
  processes)."""
  return np.asarray(x.addressable_data(0) if isinstance(x, jax.Array) else x)


def initial_state(params, opt_b, num_bins, fingerprint: dict, config_digest=None):
  """The checkpointed state of a run that has not started (see ``stages.Run``);
  ``fingerprint``: the run's data fingerprint, ``config_digest`` its config's
  (``run_identity.config_digest``; None: no ``config_sha256`` leaf), kept in every
  checkpoint."""
  f32, i32 = stages.f32, stages.i32
  counts = np.zeros(num_bins, np.int32)
  return {'stage': i32(0), 'stage_step': i32(0), 'params': params, 'stage_start': params,
          'opt_a': training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=1.0, beta=1.0,
                                              radius=1.0, clip_norm=None).init(params),
          'opt_b': opt_b.init(params), 'step_a': i32(0), 'step_b': i32(0),
          'best_params': params, 'best_accuracy': f32(-1.0), 'best_log_loss': f32(np.inf),
          'best_epoch': i32(-1), 'seconds_a': f32(0.0), 'seconds_b': f32(0.0),
          'stopped_early_a': i32(0), 'hist_drift': counts, 'hist_force': counts,
          'data_sha256': data_digest(fingerprint),
          **({CONFIG_LEAF: digest_leaf(config_digest)} if config_digest else {})}


# Fields that only act from the first Phase A stage on: runs that differ in nothing
# else share their Phase B prefix bit for bit. (The data folder: the data fingerprint
# is compared instead.)
_PREFIX_FREE = ('variant', 'model.init_radius', 'run.prefix_from', 'run.log_every',
                'run.checkpoint_every', 'data.data_dir')


def prefix_fields(saved: dict) -> dict:
  """The flat fields (``section.field``) of a saved config (``run_folder.saved_config``)
  that a run's Phase B prefix depends on: two runs share it iff these are equal."""
  flat = {f'{section}.{k}': v for section, fields in saved.items()
          if isinstance(fields, dict) for k, v in fields.items()}
  flat.update({k: v for k, v in saved.items() if not isinstance(v, dict)})
  return {k: v for k, v in flat.items() if k not in _PREFIX_FREE and (
      not k.startswith('phase_a.') or k in ('phase_a.schedule', 'phase_a.after_b_epochs'))}


def check_data(ckpt, target, where: str):
  """One ``cli.ConfigError`` if ``ckpt`` was written from other data than ``target``'s."""
  saved, ours = (leaf_hex(x['data_sha256']) for x in (ckpt, target))
  if saved != ours:
    raise cli.ConfigError(
        f'{where}: written from other data (data fingerprint sha256 {saved[:12]}…, the data '
        f'and tokenizer now hash to {ours[:12]}…); use a new workdir or the data it was '
        'trained on.')


def check_config(ckpt, target, where: str, legacy=None):
  """``ckpt`` if it was written by the run of ``target``'s ``config_sha256``; one
  ``cli.ConfigError`` naming both digests if by another config's.

  A ``ckpt`` without the leaf (written before config digests) is taken as the run's
  when ``legacy`` (``(path, digest)`` of the config.json that vouches for it) has
  ``target``'s digest, and returned with the leaf added. Nothing is checked when
  ``target`` has no ``config_sha256``.
  """
  if CONFIG_LEAF not in target:
    return ckpt
  ours = leaf_hex(target[CONFIG_LEAF])
  if CONFIG_LEAF in ckpt:
    saved = leaf_hex(ckpt[CONFIG_LEAF])
    if saved != ours:
      raise cli.ConfigError(
          f'{where}: written by a run of another config (config sha256 {saved[:12]}…; this '
          f'run\'s config hashes to {ours[:12]}…); use that run\'s workdir, or a new one for '
          'this config.')
    return ckpt
  if legacy is not None and legacy[1] != ours:
    raise cli.ConfigError(
        f'{where}: written before config digests, and {legacy[0]} (config sha256 '
        f'{legacy[1][:12]}…) is not this run\'s config ({ours[:12]}…); use a new workdir.')
  logging.info('%s: written before config digests (no %s); %s vouches for it.', where,
               CONFIG_LEAF, legacy[0] if legacy else 'the run folder\'s config.json')
  return dict(ckpt, **{CONFIG_LEAF: target[CONFIG_LEAF]})


def _without_config_leaf(abstract, keys):
  """``abstract`` without ``config_sha256`` if the checkpoint's leaves ``keys`` lack it."""
  if CONFIG_LEAF in abstract and keys is not None and CONFIG_LEAF not in keys:
    return {k: v for k, v in abstract.items() if k != CONFIG_LEAF}
  return abstract


def _saved_keys(read_metadata):
  """The top-level keys of a checkpoint's tree metadata (``read_metadata()``, orbax's), or
  None if they cannot be read (the restore then says why)."""
  try:
    tree = read_metadata()
  except Exception:  # pylint: disable=broad-except  (orbax/tensorstore raise many kinds)
    return None
  tree = getattr(tree, 'item_metadata', tree)
  tree = getattr(tree, 'tree', tree)
  return set(tree.keys()) if hasattr(tree, 'keys') else None


def _step_keys(manager, step):
  """The top-level keys of the state saved at ``step`` by ``manager`` (``_saved_keys``)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.abspath(str(manager.directory)), str(step), 'default')
  return _saved_keys(lambda: ocp.StandardCheckpointer().metadata(path))


def _leaf_name(path) -> str:
  """A pytree key path as ``a/b/c`` (dict keys and sequence indices)."""
  return '/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path)


def check_finite(ckpt, where: str, parts=('params', 'best_params', 'stage_start')):
  """One ``cli.ConfigError`` if a floating leaf of ``ckpt[part]`` holds NaN or ±inf,
  naming the first such leaf (e.g. ``params/encoder_0/attention/particles``) and where it
  came from: a restored run stops before its first step, not at validation."""
  for part in parts:
    if part not in ckpt:
      continue
    for path, leaf in jax.tree_util.tree_flatten_with_path(ckpt[part])[0]:
      a = np.asarray(leaf.addressable_data(0) if isinstance(leaf, jax.Array) else leaf)
      if not np.issubdtype(a.dtype, np.inexact):
        continue
      bad = ~np.isfinite(a.astype(np.float32))
      if bad.any():
        name = _leaf_name(path)
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise cli.ConfigError(
            f'{where}: {part}/{name} holds {int(bad.sum())} non-finite value(s) (first '
            f'{a[first]} at index {first}); the checkpoint is damaged: use an earlier one or a '
            f'new workdir.')


def non_finite_particles(params):
  """``(name, head, count)`` of the first ``particles`` leaf of ``params`` ([H, M, D]) with a
  non-finite value (``name`` e.g. ``attention_0/particles``, ``head`` its first bad head,
  ``count`` the bad values in that head), or None when every particle is finite."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    if getattr(path[-1], 'key', None) != 'particles':
      continue
    a = np.asarray(jax.device_get(leaf), np.float32)
    bad = ~np.isfinite(a.reshape((-1,) + a.shape[-2:]))
    heads = np.flatnonzero(bad.any(axis=(1, 2)))
    if heads.size:
      return _leaf_name(path), int(heads[0]), int(bad[heads[0]].sum())
  return None


def save(manager, ckpt, sharder=None):
  """Saves ``ckpt`` (all processes call it; with several, every leaf made a global array).

  A failed save (a full disk, most often) is one ``cli.StorageError`` line naming the
  folder, the step and the cause, instead of orbax's tracebacks; the unfinished step's
  temporary folder is removed and the earlier checkpoints stay as they were. A SIGINT
  or SIGTERM under ``cli.stop_on_signals`` waits for the save to complete
  (``cli.signals_deferred``); a bare ``KeyboardInterrupt`` in the middle of it removes
  the unfinished step, as a failure does. Returns the step saved (its folder's name).
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  step = int(ckpt['step_a']) + int(ckpt['step_b']) + int(ckpt['stage'])
  if jax.process_count() > 1:
    ckpt = (sharder or sharding.Sharder()).replicate(ckpt)
  with _quiet_orbax(), cli.signals_deferred():
    try:
      manager.save(step, args=ocp.args.StandardSave(ckpt), force=True)
      manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many kinds)
      raise _save_failed(str(manager.directory), step, e) from None
    except BaseException:   # KeyboardInterrupt: no half-written step is left behind.
      _remove_unfinished(str(manager.directory), step)
      raise
  return step


def checkpoint_bytes(ckpt) -> int:
  """Bytes of the arrays of a checkpoint tree (what one saved step holds, about)."""
  return int(sum(a.nbytes if hasattr(a, 'nbytes') else np.asarray(a).nbytes
                 for a in jax.tree_util.tree_leaves(ckpt)))


def check_free_space(workdir, ckpt, manager=None, kept: int = 2) -> None:
  """One ``cli.StorageError`` before any compute if ``workdir``'s filesystem cannot hold
  the checkpoints this run will write: ``kept`` steps plus the one being written, less
  those already there (raw array bytes: orbax compresses, so this errs high)."""
  size = checkpoint_bytes(ckpt)
  have = len(manager.all_steps()) if manager is not None else 0
  need = size * (kept + 1 - min(have, kept))
  free = shutil.disk_usage(workdir).free
  if free < need:
    raise cli.StorageError(
        f'workdir {workdir!r}: {_mib(free)} free on its filesystem, but this run\'s '
        f'checkpoints need about {_mib(need)} ({kept} kept plus one being written, '
        f'{_mib(size)} each); free some space or choose another --workdir.')


def _mib(n: int) -> str:
  return f'{n / 2**20:.1f} MiB'


def _error_chain(error: BaseException) -> str:
  """The messages of ``error`` and of every exception it was raised from, joined."""
  seen, texts = set(), []
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    texts.append(f'{type(error).__name__}: {error}')
    error = error.__cause__ or error.__context__
  return ' | '.join(' '.join(t.split()) for t in texts)


def _remove_unfinished(directory: str, step) -> None:
  """Removes the temporary folder of an unfinished save of ``step`` in ``directory``
  (orbax's ``<step>.orbax-checkpoint-tmp-…``; process 0)."""
  if jax.process_index() == 0 and os.path.isdir(directory):
    for name in os.listdir(directory):
      if name.startswith(f'{step}.') and 'tmp' in name:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _save_failed(directory: str, step, error: BaseException) -> 'cli.StorageError':
  """The one-line error of a failed save of checkpoint ``step`` (an int) or of the folder
  ``step`` (a name: ``prefix``) in ``directory``; removes its unfinished temporary folder."""
  _remove_unfinished(directory, step)
  if isinstance(step, str):
    what, last = f'{step}/', 'the checkpoints in checkpoints/ are kept'
  else:
    kept = sorted(int(n) for n in os.listdir(directory) if n.isdigit() and int(n) != step)
    what = f'checkpoint step {step}'
    last = (f'the last complete checkpoint (step {kept[-1]}) is kept' if kept else
            'there is no earlier checkpoint')
  chain = _error_chain(error)
  full = ('No space left on device' in chain or "os_error_code='28'" in chain
          or getattr(error, 'errno', None) == errno.ENOSPC)
  if full:
    free = shutil.disk_usage(directory).free if os.path.isdir(directory) else 0
    return cli.StorageError(
        f'{directory}: no space left on device while saving {what} '
        f'({_mib(free)} free after removing the unfinished one); {last}. Free some space '
        'and rerun the same command: it resumes from there.')
  first = chain if len(chain) < 300 else chain[:297] + '...'
  return cli.StorageError(
      f'{directory}: saving {what} failed ({first}); {last} and the '
      'unfinished one removed.')


@contextlib.contextmanager
def _quiet_orbax():
  """While open: orbax's own log records dropped and its closed-event-loop reports
  silenced (``_DropOrbaxRecords``, ``_quiet_closed_loop``); the caller reports failures."""
  quiet = _DropOrbaxRecords()
  std_logging.getLogger('absl').addFilter(quiet)
  if not getattr(sys.unraisablehook, 'quiets_closed_loops', False):
    sys.unraisablehook = _quiet_closed_loop(sys.unraisablehook)
  try:
    yield
  finally:
    std_logging.getLogger('absl').removeFilter(quiet)


def restore(manager, target, sharder=None, legacy=None):
  """The newest readable checkpoint (``target`` if there is none yet), replicated.

  It must be of ``target``'s data and config (``check_data``, ``check_config``; ``legacy``:
  the ``(config.json path, digest)`` that vouches for a checkpoint written before config
  digests) and finite (``check_finite``).

  An unreadable one is reported in one warning line and the one before it tried;
  the newer unreadable steps are then moved to ``<workdir>/checkpoints_unreadable``
  (so that the run can save those step numbers again). None readable: one
  ``cli.ConfigError`` naming the folder and why each step failed.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  steps = sorted(manager.all_steps(), reverse=True)
  if not steps:
    return target
  abstract = (sharder or sharding.Sharder()).abstract(target)
  failures = []
  quiet = _DropOrbaxRecords()
  if not getattr(sys.unraisablehook, 'quiets_closed_loops', False):
    sys.unraisablehook = _quiet_closed_loop(sys.unraisablehook)
  for step in steps:
    std_logging.getLogger('absl').addFilter(quiet)
    try:
      ckpt = manager.restore(step, args=ocp.args.StandardRestore(
          _without_config_leaf(abstract, _step_keys(manager, step))))
    except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many kinds)
      reason = ' '.join(f'{type(e).__name__}: {e}'.split())
      failures.append(f'step {step}: {reason if len(reason) < 300 else reason[:297] + "..."}')
      continue
    finally:
      std_logging.getLogger('absl').removeFilter(quiet)
    if failures:
      aside = _set_aside(manager, [s for s in steps if s > step])
      logging.warning('unreadable checkpoint in %s (%s): resuming from step %d instead; the '
                      'unreadable one is moved to %s.', manager.directory, '; '.join(failures),
                      step, aside)
    where = f'checkpoint step {step} in {manager.directory}'
    check_data(ckpt, target, where)
    ckpt = check_config(ckpt, target, where, legacy)
    check_finite(ckpt, where)
    return ckpt
  raise cli.ConfigError(
      f'{manager.directory}: no readable checkpoint ({"; ".join(failures)}); if they were '
      'written by an older experiments.train, or are damaged, use a new workdir.')


class _DropOrbaxRecords(std_logging.Filter):
  """Drops orbax's own log records (its errors about a file it could not read)."""

  def filter(self, record):
    return '/orbax/' not in record.pathname


def _quiet_closed_loop(hook):
  """``sys.unraisablehook`` ``hook``, silent for ``RuntimeError('Event loop is closed')``:
  when one read of a damaged checkpoint fails, orbax closes its event loop and each of
  tensorstore's other reads reports to it, printing that traceback (some 180 lines)."""

  def unraisablehook(unraisable):
    value = unraisable.exc_value
    if isinstance(value, RuntimeError) and str(value) == 'Event loop is closed':
      return
    hook(unraisable)

  unraisablehook.quiets_closed_loops = True
  return unraisablehook


def _set_aside(manager, steps):
  """Moves unreadable checkpoint steps out of the manager's folder (process 0); returns
  where they went."""
  directory = str(manager.directory)
  aside = os.path.join(os.path.dirname(directory), UNREADABLE)
  if jax.process_index() == 0:
    os.makedirs(aside, exist_ok=True)
    for step in steps:
      target = os.path.join(aside, str(step))
      if os.path.exists(target):
        shutil.rmtree(target)
      os.replace(os.path.join(directory, str(step)), target)
  sharding.sync('checkpoints: set aside')
  manager.reload()
  return aside


def save_prefix(workdir, ckpt, sharder=None):
  """The state at the end of the Phase B epochs before the first Phase A stage, kept
  in ``<workdir>/prefix`` for runs that share them (``run.prefix_from``)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(os.path.join(workdir, PREFIX))
  exists = os.path.exists(path)
  sharding.sync('prefix: looked')      # Every process decides before process 0 writes.
  if not exists:
    if jax.process_count() > 1:
      ckpt = (sharder or sharding.Sharder()).replicate(ckpt)
    checkpointer = ocp.StandardCheckpointer()
    with _quiet_orbax(), cli.signals_deferred():
      try:
        checkpointer.save(path, ckpt)
        checkpointer.wait_until_finished()
      except Exception as e:  # pylint: disable=broad-except  (as in save)
        raise _save_failed(os.path.dirname(path), PREFIX, e) from None
      except BaseException:   # KeyboardInterrupt (as in save)
        _remove_unfinished(os.path.dirname(path), PREFIX)
        raise


def restore_prefix(source, target, sharder=None, source_digest=None):
  """``target`` restored from ``<source>/prefix`` (``source``: a ``run.prefix_from`` run
  folder), or None if that run has not saved it yet (``RunFolder.preflight`` has
  compared its config and data).

  Its data digest and finiteness are checked, and its ``config_sha256`` must be
  ``source_digest`` (the digest of ``source``'s config.json: the prefix is that run's;
  none: written before config digests). It is returned with ``target``'s
  ``config_sha256``: from here on the state is this run's.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(os.path.join(source, PREFIX))
  if not os.path.exists(path):
    return None
  abstract = (sharder or sharding.Sharder()).abstract(target)
  checkpointer = ocp.StandardCheckpointer()
  restored = checkpointer.restore(
      path, _without_config_leaf(abstract, _saved_keys(lambda: checkpointer.metadata(path))))
  where = f'config.run.prefix_from: {path}'
  check_data(restored, target, where)
  if CONFIG_LEAF in restored and source_digest is not None:
    theirs = leaf_hex(restored[CONFIG_LEAF])
    if theirs != source_digest:
      raise cli.ConfigError(
          f'{where}: written by a run of another config (config sha256 {theirs[:12]}…; the '
          f'config.json of {source} hashes to {source_digest[:12]}…): that folder\'s prefix is '
          'not its own run\'s; use another prefix_from.')
  step_b = f' (Phase B step {int(_host(restored["step_b"]))})' if 'step_b' in restored else ''
  check_finite(restored, where + step_b)
  if CONFIG_LEAF in target:
    restored = dict(restored, **{CONFIG_LEAF: target[CONFIG_LEAF]})
  return restored


def read_latest(manager):
  """The newest checkpoint of ``manager`` as saved (no target: plain arrays), e.g. a
  finished run's ``best_params``."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.abspath(str(manager.directory)), str(manager.latest_step()),
                      'default')
  return ocp.StandardCheckpointer().restore(path)
