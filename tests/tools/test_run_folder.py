"""experiments.run.run_folder.RunFolder: the lock against a real second process, preflight
refusing another config or changed data before any write, atomic writes that leave the
old file when they fail, the sessions and history records, the Phase B prefix's history.

No training: a generated 200-sentence rotten_tomatoes folder and a 3-float checkpoint.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from test_distributed import _mr_data
from experiments.common import cli
from experiments.run import checkpoints
from experiments.run import run_folder

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOLD = ('import sys; from experiments.run import run_folder; '
        'run_folder.RunFolder(sys.argv[1]).lock(); print("held", flush=True); sys.stdin.read()')


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return _mr_data(str(tmp_path_factory.mktemp('data')))


def _config(data_dir, **more):
  from configs import rotten_tomatoes  # pylint: disable=g-import-not-at-top
  config = rotten_tomatoes.get_config('softmax,quick')
  config.data.data_dir = data_dir
  for key, value in more.items():
    section, field = key.split('.')
    config[section][field] = value
  return config


def _snapshot(path):
  return {os.path.join(d, f): open(os.path.join(d, f), 'rb').read()
          for d, _, files in os.walk(path) for f in files}


def test_a_folder_locked_by_another_process_is_refused_naming_it(tmp_path):
  workdir = str(tmp_path / 'w')
  env = dict(os.environ, PYTHONPATH=REPO)
  holder = subprocess.Popen([sys.executable, '-c', HOLD, workdir], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'held'
    folder = run_folder.RunFolder(workdir)
    with pytest.raises(run_folder.WorkdirBusy, match=(
        rf"^workdir '{re.escape(workdir)}' is in use by pid {holder.pid} on host .* \(lock "
        rf'{re.escape(workdir)}/lock\); wait for that run to end, or use another workdir\.$')):
      folder.lock()
    assert not folder.held
  finally:
    holder.stdin.close()                 # The holder ends: the OS lets go of its lock.
    holder.wait(timeout=60)
  assert folder.lock() is True and folder.held
  assert folder.lock() is False          # Held already by this process: not taken twice.
  with open(folder.file(run_folder.LOCK)) as f:
    assert f.read().startswith(f'pid {os.getpid()} on host ')
  with folder:                           # Held before the block: kept after it.
    pass
  assert folder.held
  folder.release()
  assert not folder.held
  with run_folder.RunFolder(workdir) as again:   # Taken inside the block: released.
    assert again.lock() and run_folder.RunFolder(workdir).held
  assert not again.held and not folder.held


def test_preflight_refuses_another_config_or_changed_data_and_writes_nothing(data_dir,
                                                                              tmp_path):
  folder = run_folder.RunFolder(str(tmp_path / 'run'))
  with pytest.raises(ValueError, match='config.phase_b.batch_size'):
    folder.preflight(_config(data_dir, **{'phase_b.batch_size': 0}))
  fingerprint = folder.preflight(_config(data_dir))
  assert sorted(fingerprint) == ['rotten_tomatoes/rt-polarity.neg',
                                 'rotten_tomatoes/rt-polarity.pos']
  assert not os.path.exists(folder.path)            # Checks only.
  with folder:
    assert folder.lock()                            # Makes the folder.
    folder.write_config_and_fingerprint(_config(data_dir), fingerprint)
  assert sorted(os.listdir(folder.path)) == ['config.json', 'fingerprint.json', 'lock']
  assert run_folder.read_json(folder.file('config.json')) == run_folder.saved_config(
      _config(data_dir))
  assert folder.stored_fingerprint()['files'] == fingerprint
  assert folder.preflight(_config(data_dir)) == fingerprint        # The same run again.
  before = _snapshot(folder.path)
  with pytest.raises(cli.ConfigError, match=(
      rf"^workdir: '{re.escape(folder.path)}' holds a run with a different config "
      rf'\({re.escape(folder.path)}/config\.json\); use a new workdir\.$')):
    folder.preflight(_config(data_dir, **{'phase_b.learning_rate': 1.0}))
  # Another data folder with the same files is the same run; changed files are not.
  copy = _mr_data(str(tmp_path / 'copy'))
  assert folder.preflight(_config(copy)) == fingerprint
  with open(os.path.join(copy, 'rotten_tomatoes', 'rt-polarity.neg'), 'a') as f:
    f.write('one more dull line .\n')
  with pytest.raises(cli.ConfigError, match=(
      rf"^the data of the run in '{re.escape(folder.path)}' changed since this fingerprint "
      r'was stored: rotten_tomatoes/rt-polarity\.neg \(sha256 ')):
    folder.preflight(_config(copy))
  assert _snapshot(folder.path) == before


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
  folder = run_folder.RunFolder(str(tmp_path))
  folder.write_json(run_folder.RESULTS, {'test': {'accuracy': 0.5}})
  old = open(folder.file(run_folder.RESULTS)).read()
  assert json.loads(old) == {'test': {'accuracy': 0.5}} and old.startswith('{\n "test"')
  with pytest.raises(TypeError):                     # Not JSON: refused before any write.
    folder.write_json(run_folder.RESULTS, {'test': object()})
  with pytest.raises(UnicodeEncodeError):            # Fails while writing the file.
    folder.write_text(run_folder.RESULTS, 'half \udc80 of a file')

  def no_replace(src, dst):
    raise OSError(28, 'No space left on device')

  monkeypatch.setattr(os, 'replace', no_replace)
  with pytest.raises(OSError, match='No space left'):
    folder.write_json(run_folder.RESULTS, {'test': {'accuracy': 0.9}})
  monkeypatch.undo()
  assert open(folder.file(run_folder.RESULTS)).read() == old
  assert os.listdir(tmp_path) == [run_folder.RESULTS]


def test_sessions_and_history_records(data_dir, tmp_path, caplog):
  folder = run_folder.RunFolder(str(tmp_path / 'run'))
  os.makedirs(folder.path)
  assert folder.sessions() == [] and folder.history() == []
  first = folder.record_session({'commit': 'abc', 'date': '2026-01-01T00:00:00+00:00'})
  assert [s['commit'] for s in first] == ['abc'] and first[0]['device_count'] >= 1
  with caplog.at_level('WARNING'):
    both = folder.record_session({'commit': 'def', 'date': '2026-01-02T00:00:00+00:00'})
  assert [s['commit'] for s in both] == ['abc', 'def'] == [
      s['commit'] for s in run_folder.read_json(folder.file('sessions.json'))]
  assert [r.getMessage() for r in caplog.records if r.levelname == 'WARNING'] == [
      f'Resuming {folder.path} at commit def after abc.']
  for t in (2, 4, 6):
    folder.append_history({'epoch': t // 2, 't': t})
  with open(folder.file('history.jsonl'), 'a') as f:
    f.write('{"epoch": 4, "t"')                       # Torn by a kill.
  folder.truncate_history(4)
  assert [json.loads(line)['t'] for line in folder.history()] == [2, 4]
  # A damaged line that is not the last: refused, naming the file and the line.
  with open(folder.file('history.jsonl'), 'a') as f:
    f.write('not json\n{"t": 6}\n')
  with pytest.raises(cli.ConfigError, match=r'history\.jsonl:3 is not valid JSON'):
    folder.preflight(_config(data_dir))


def test_restore_prefix_takes_the_source_history_up_to_the_prefix(tmp_path):
  i32 = lambda v: np.asarray(v, np.int32)
  state = {'stage': i32(1), 'step_a': i32(0), 'step_b': i32(4),
           'params': {'w': np.arange(3, dtype=np.float32)},
           'data_sha256': checkpoints.data_digest({'train.tsv': 'f' * 64})}
  source = run_folder.RunFolder(str(tmp_path / 'source'))
  os.makedirs(source.path)
  source.record_session({'commit': 'abc', 'date': '2026-01-01T00:00:00+00:00'})
  for t in (2, 4, 6):
    source.append_history({'epoch': t // 2, 't': t})
  ours = run_folder.RunFolder(str(tmp_path / 'ours'))
  os.makedirs(ours.path)
  assert ours.restore_prefix(source.path, state) is None and ours.prefix_record() is None
  source.save_prefix(state)
  restored = ours.restore_prefix(source.path, state)
  np.testing.assert_array_equal(restored['params']['w'], state['params']['w'])
  assert [json.loads(line)['t'] for line in ours.history()] == [2, 4]
  assert ours.prefix_record() == {'from': source.path, 'phase_b_steps': 4,
                                  'sessions': source.sessions()}
