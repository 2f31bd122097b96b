"""A run that stops says so (issue 38, item 6): experiments/train.py stopped by SIGINT or
SIGTERM ends in one line (the step reached, the checkpoint kept, the command that resumes),
exit status 130 or 143, and leaves no half-written file; the same command resumes and
finishes; given once more, a finished run says so in one line and recomputes nothing.

The command line is the real one, in a subprocess, with the ``quick`` variant made tiny
(softmax attention, one layer, 160 generated training rows, 12 epochs of 20 steps, a
checkpoint at each epoch end). A signal during a checkpoint save is sent from inside
orbax's save (in this process): the save completes first, or, without
``cli.stop_on_signals``, its unfinished folder is removed.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from test_distributed import _mr_data
from experiments.common import cli
from experiments.run import checkpoints
from experiments.run import run_folder

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, 'experiments', 'train.py')
RT = os.path.join(REPO, 'configs', 'rotten_tomatoes.py')
EPOCHS, STEPS_PER_EPOCH = 12, 20          # 160 training rows in batches of 8
TOTAL = EPOCHS * STEPS_PER_EPOCH
TINY = {'data.vocab_size': 120, 'data.max_length': 32, 'data.pad_multiple': 32,
        'model.num_layers': 1, 'phase_b.batch_size': 8, 'phase_b.num_epochs': EPOCHS,
        'run.eval_batch_size': 32, 'run.log_every': 4}


def _steps(workdir):
  """The complete checkpoint steps in ``workdir`` (orbax's step folders), in order."""
  path = os.path.join(workdir, 'checkpoints')
  return sorted(int(n) for n in os.listdir(path) if n.isdigit()) if os.path.isdir(path) else []


def _leftovers(workdir):
  """Files or folders a write left unfinished (``*.tmp``, orbax's ``*-tmp-*``)."""
  return [os.path.join(d, n) for d, dirs, files in os.walk(workdir) for n in dirs + files
          if 'tmp' in n]


def _snapshot(workdir):
  return {os.path.relpath(os.path.join(d, f), workdir): os.stat(os.path.join(d, f)).st_mtime_ns
          for d, _, files in os.walk(workdir) for f in files}


def _stop(argv, cwd, workdir, signum, after):
  """Starts the command, sends ``signum`` once a checkpoint folder numbered above
  ``after`` is on disk; returns ``(returncode, stdout, stderr)``."""
  proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  try:
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not any(
        s > after for s in _steps(workdir)):
      time.sleep(0.02)
    assert proc.poll() is None, 'the run ended before it could be stopped'
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  return proc.returncode, out, err


def _check_stop_line(err, name, workdir, command):
  """The last line of stderr: step reached, checkpoint kept; returns (reached, kept, its
  folder's number)."""
  assert 'Traceback' not in err, err[-3000:]
  last = err.splitlines()[-1]
  match = re.fullmatch(
      rf'train: stopped by {name} at step (\d+)/{TOTAL}; the last checkpoint \(step (\d+)\) '
      rf'is kept in {re.escape(workdir)}/checkpoints/(\d+); to resume, run the same command: '
      rf'(.*)', last)
  assert match, last
  reached, kept, folder = (int(match.group(i)) for i in (1, 2, 3))
  assert match.group(4) == command
  # The checkpoint named is the newest complete one, saved at an epoch end (its folder's
  # number also counts the stages done); nothing half written is left (orbax's temporary
  # folders, *.tmp files).
  assert _steps(workdir)[-1] == folder and 0 <= folder - kept <= 3
  assert kept % STEPS_PER_EPOCH == 0 and kept > 0
  assert kept <= reached < TOTAL
  assert _leftovers(workdir) == []
  return reached, kept, folder


@pytest.mark.slow
def test_sigint_and_sigterm_end_in_one_line_and_the_same_command_resumes(tmp_path):
  data_dir = _mr_data(str(tmp_path / 'data'))
  workdir = str(tmp_path / 'w')
  argv = [sys.executable, TRAIN, f'--config={RT}:softmax,quick', f'--workdir={workdir}',
          f'--config.data.data_dir={data_dir}', *[f'--config.{k}={v}' for k, v in TINY.items()]]
  command = shlex.join(argv)                 # what the line says: the same command line
  cwd = str(tmp_path)

  code, out, err = _stop(argv, cwd, workdir, signal.SIGINT, after=0)
  assert code == 130, err[-3000:]
  _, first, folder = _check_stop_line(err, 'SIGINT', workdir, command)
  assert not os.path.exists(os.path.join(workdir, 'results.json'))

  code, out, err = _stop(argv, cwd, workdir, signal.SIGTERM, after=folder)
  assert code == 143, err[-3000:]
  assert re.search(rf'Resumed from {re.escape(workdir)}/checkpoints: stage \d+/\d+, \d+ steps '
                   rf'into it \(0 Phase A and {first} Phase B steps done in all\)', err)
  _check_stop_line(err, 'SIGTERM', workdir, command)

  done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'Resumed from' in done.stderr and 'Traceback' not in done.stderr
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert len(results['sessions']) == 3 and results['test']['accuracy'] > 0.5
  # Each epoch's validation once in the history: what the stops cut off was run again.
  history = [json.loads(line) for line in open(os.path.join(workdir, 'history.jsonl'))]
  assert [r['epoch'] for r in history if 'epoch' in r] == list(range(EPOCHS))

  before = _snapshot(workdir)
  again = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout == (
      f'train: this run is finished; its results are in {workdir}/results.json (test '
      f'accuracy {results["test"]["accuracy"]:.4f}). Nothing was run again.\n')
  assert again.stderr == ''
  assert _snapshot(workdir) == before        # results.json and all: not written again


def _state(step):
  i32 = lambda v: np.asarray(v, np.int32)
  return {'step_a': i32(0), 'step_b': i32(step), 'stage': i32(0), 'w': np.arange(6.0)}


@pytest.fixture
def signal_in_save(monkeypatch):
  """Makes orbax's finalisation of a save (tmp folder → step folder) send ``signum`` to
  this process first, while the step is still a temporary folder. SIGINT has Python's own
  handler meanwhile, as in a terminal, even where pytest was started with SIGINT ignored
  (a background job of a non-interactive shell); the earlier handler is put back after."""
  from orbax.checkpoint._src.path import atomicity  # pylint: disable=g-import-not-at-top
  original = atomicity.AtomicRenameTemporaryPath.finalize
  sent = []

  def arm(signum):
    async def finalize(self, *args, **kwargs):
      if not sent:
        sent.append(os.listdir(os.path.dirname(str(self._tmp_path))))  # pylint: disable=protected-access
        signal.raise_signal(signum)
      return await original(self, *args, **kwargs)
    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, 'finalize', finalize)
    return sent

  earlier = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield arm                              # pytest runs the rest at teardown, pass or fail
  signal.signal(signal.SIGINT, earlier)


def test_a_stop_during_a_checkpoint_save_waits_for_the_save(tmp_path, signal_in_save):
  manager = checkpoints.checkpoint_manager(str(tmp_path))
  assert checkpoints.save(manager, _state(20)) == 20
  sent = signal_in_save(signal.SIGTERM)
  with pytest.raises(cli.Stopped) as stopped:
    with cli.stop_on_signals():
      checkpoints.save(manager, _state(40))
  assert sent and stopped.value.signum == signal.SIGTERM and stopped.value.exit_code == 143
  assert _steps(str(tmp_path)) == [20, 40] and _leftovers(str(tmp_path)) == []
  assert int(checkpoints.read_latest(manager)['step_b']) == 40      # complete and readable
  assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL         # handlers put back
  assert signal.getsignal(signal.SIGINT) == signal.default_int_handler


def test_a_bare_ctrl_c_during_a_save_leaves_the_last_complete_checkpoint(tmp_path,
                                                                          signal_in_save):
  manager = checkpoints.checkpoint_manager(str(tmp_path))
  checkpoints.save(manager, _state(20))
  sent = signal_in_save(signal.SIGINT)                # Python's own handler: no waiting
  with pytest.raises(KeyboardInterrupt) as interrupted:
    checkpoints.save(manager, _state(40))
  assert sent and not isinstance(interrupted.value, cli.Stopped)
  assert _steps(str(tmp_path)) == [20] and _leftovers(str(tmp_path)) == []
  assert int(checkpoints.read_latest(checkpoints.checkpoint_manager(str(tmp_path)))
             ['step_b']) == 20


def test_a_stop_before_the_first_checkpoint_says_there_is_none(tmp_path):
  from experiments import train  # pylint: disable=g-import-not-at-top
  folder = run_folder.RunFolder(str(tmp_path / 'w'))
  assert train.stop_message(signal.SIGTERM, folder, None) == (
      'stopped by SIGTERM while setting up, before its first step; no checkpoint yet (it '
      'starts again from step 0)')
  folder.save(_state(20))
  assert train.stop_message(signal.SIGINT, folder, None) == (
      'stopped by SIGINT while setting up, before its first step; the last checkpoint (step '
      f'20) is kept in {folder.path}/checkpoints/20')
  # Stopped before it restored one: the newest step folder on disk, its step not read.
  assert train.stop_message(signal.SIGINT, run_folder.RunFolder(folder.path), None) == (
      'stopped by SIGINT while setting up, before its first step; the last checkpoint is '
      f'kept in {folder.path}/checkpoints/20')


def test_a_second_signal_while_stopping_is_ignored():
  with pytest.raises(cli.Stopped) as stopped:
    with cli.stop_on_signals():
      try:
        signal.raise_signal(signal.SIGINT)
      finally:
        signal.raise_signal(signal.SIGTERM)           # during the clean-up: ignored
  assert stopped.value.signum == signal.SIGINT and stopped.value.exit_code == 130
