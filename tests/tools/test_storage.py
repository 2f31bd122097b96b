"""A full disk (issue 27): one line naming the folder or file, and nothing already written
lost. A run whose workdir cannot hold its checkpoints is refused before any compute; a
checkpoint save the disk refuses mid-run keeps the last complete step and removes the
unfinished one; an atomic write that fails leaves the old file and names its path.

The disk is filled for real only where it costs nothing: ``/dev/full`` (every write gives
ENOSPC) behind a symlink. Orbax's failure is replayed with the message tensorstore gives
on a full tmpfs (seen at the commit of this test: 2,596 lines of tracebacks before)."""

import collections
import errno
import os
import re
import sys

import numpy as np
import pytest

from experiments.common import cli
from experiments.common import provenance
from experiments.run import checkpoints

_Usage = collections.namedtuple('_Usage', 'total used free')
# What tensorstore raised on a 12 MiB tmpfs filled mid-run (path shortened).
_TENSORSTORE_ENOSPC = (
    'RESOURCE_EXHAUSTED: Error writing "params.head.bias/0" in OCDBT database at local file '
    '"{d}/126.orbax-checkpoint-tmp/default.orbax-checkpoint-tmp/ocdbt.process_0/": Failed '
    'to write 3801 bytes to file 18: No space left on device [os_error_code=\'28\']')


def _ckpt(step_a=3):
  return {'stage': np.int32(0), 'step_a': np.int32(step_a), 'step_b': np.int32(0),
          'params': {'w': np.ones((64, 64), np.float32)},           # 16 KiB of arrays
          'data_sha256': checkpoints.data_digest({'train.tsv': 'f' * 64})}


def test_checkpoint_bytes_counts_every_array():
  assert checkpoints.checkpoint_bytes(_ckpt()) == 3 * 4 + 64 * 64 * 4 + 32   # + the digest


def test_a_workdir_too_small_for_the_checkpoints_is_refused_up_front(tmp_path, monkeypatch):
  size = checkpoints.checkpoint_bytes(_ckpt())
  monkeypatch.setattr(checkpoints.shutil, 'disk_usage',
                      lambda _: _Usage(10**9, 10**9 - 2 * size, 2 * size))
  with pytest.raises(cli.StorageError, match=re.escape(
      f"workdir '{tmp_path}': {2 * size / 2**20:.1f} MiB free on its filesystem, but this "
      f"run's checkpoints need about {3 * size / 2**20:.1f} MiB (2 kept plus one being "
      f"written, {size / 2**20:.1f} MiB each); free some space or choose another --workdir.")):
    checkpoints.check_free_space(str(tmp_path), _ckpt())
  manager = checkpoints.checkpoint_manager(str(tmp_path))   # one step kept: needs 2 more
  monkeypatch.undo()
  checkpoints.save(manager, _ckpt())
  monkeypatch.setattr(checkpoints.shutil, 'disk_usage',
                      lambda _: _Usage(10**9, 10**9 - 2 * size, 2 * size))
  checkpoints.check_free_space(str(tmp_path), _ckpt(), manager)


def test_a_save_the_disk_refuses_keeps_the_last_step_and_removes_the_unfinished(tmp_path):
  manager = checkpoints.checkpoint_manager(str(tmp_path))
  checkpoints.save(manager, _ckpt(3))
  directory = str(manager.directory)

  def full_disk(step, *args, **kwargs):
    os.makedirs(os.path.join(directory, f'{step}.orbax-checkpoint-tmp', 'default'))
    try:
      raise OSError(errno.ENOSPC, 'No space left on device')
    except OSError as cause:             # tensorstore's message, raised from the OS error
      raise ValueError(_TENSORSTORE_ENOSPC.format(d=directory)) from cause

  manager.save = full_disk
  with pytest.raises(cli.StorageError) as info:
    checkpoints.save(manager, _ckpt(7))
  message = str(info.value)
  assert '\n' not in message
  assert re.match(rf'^{re.escape(directory)}: no space left on device while saving '
                  r'checkpoint step 7 \(\d+\.\d MiB free after removing the unfinished one\); '
                  r'the last complete checkpoint \(step 3\) is kept\. Free some space and '
                  r'rerun the same command: it resumes from there\.$', message), message
  assert sorted(os.listdir(directory)) == ['3']
  restored = checkpoints.restore(checkpoints.checkpoint_manager(str(tmp_path)), _ckpt(0))
  assert int(restored['step_a']) == 3


def test_another_save_failure_is_one_line_with_its_cause(tmp_path):
  manager = checkpoints.checkpoint_manager(str(tmp_path))

  def read_only(step, *args, **kwargs):
    raise PermissionError(errno.EACCES, 'Permission denied', str(manager.directory))

  manager.save = read_only
  with pytest.raises(cli.StorageError, match=r"saving checkpoint step 3 failed \(PermissionError: "
                     r"\[Errno 13\] Permission denied: '.*checkpoints'\); there is no earlier "
                     r'checkpoint and the unfinished one removed\.$'):
    checkpoints.save(manager, _ckpt(3))


def test_an_atomic_write_on_a_full_disk_keeps_the_old_file_and_names_it(tmp_path):
  if not os.path.exists('/dev/full'):
    pytest.skip('no /dev/full on this system')
  path = str(tmp_path / 'results.json')
  provenance.write_atomic(path, '{"old": 1}')
  os.symlink('/dev/full', path + '.tmp')         # the temporary file's writes give ENOSPC
  with pytest.raises(OSError) as info:
    provenance.write_atomic(path, '{"new": 2}' * 10000)
  assert info.value.errno == errno.ENOSPC and info.value.filename == path
  assert not os.path.lexists(path + '.tmp')
  with open(path) as f:
    assert f.read() == '{"old": 1}'


@pytest.mark.parametrize('error, says', [
    (cli.StorageError('/w/checkpoints: no space left on device while saving checkpoint step 7'),
     r'^/w/checkpoints: no space left on device while saving checkpoint step 7$'),
    (OSError(errno.ENOSPC, 'No space left on device', '/w/phase_a_stages.json'),
     r'^/w/phase_a_stages\.json: no space left on device \(No space left on device\); what was '
     r'written before is kept \(files are replaced atomically\)\. Free some space and rerun'),
])
def test_cli_ends_a_full_disk_in_one_line(error, says, monkeypatch, capsys):
  def main(argv):
    raise error
  monkeypatch.setattr(sys, 'argv', ['train.py'])
  with pytest.raises(SystemExit) as info:
    cli.run(main, config_flags=())
  assert info.value.code == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and re.search(says, err[len('train: error: '):]), err


def test_cli_keeps_the_traceback_of_other_os_errors(monkeypatch):
  def main(argv):
    raise FileNotFoundError(errno.ENOENT, 'No such file or directory', '/nowhere')
  monkeypatch.setattr(sys, 'argv', ['train.py'])
  with pytest.raises(FileNotFoundError):
    cli.run(main, config_flags=())
