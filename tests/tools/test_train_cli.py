"""experiments/train.py and experiments/grid.py as a newcomer runs them: from another
folder, with the data folder from COULOMB_JAX_DATA, one-line mistakes, --help and
--list_fields, the workdir lock against a real second process, a SIGKILLed run that
keeps its TensorBoard curves and resumes without clean-up (issues 16 and 17).

The runs are tiny: softmax attention (no Phase A), one layer of width 32, 64 generated
rows, 6 epochs of 4 steps. One run launched through grid.py (``grid_run``) is checked as a
newcomer's run and is the uninterrupted reference of the killed run, which trains the same
config (and so finds its programs in the session's compilation cache).
"""

import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from test_distributed import _mr_data
from experiments.run import run_folder

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, 'experiments', 'train.py')
GRID = os.path.join(REPO, 'experiments', 'grid.py')
RT = os.path.join(REPO, 'configs', 'rotten_tomatoes.py')
VARIANT = 'softmax'
# The quick variant's sizes and learning rate, as overrides: grid.py's --variants names
# variants without modifiers.
TINY = {'data.max_train_examples': 64, 'data.vocab_size': 120, 'data.max_length': 32,
        'data.pad_multiple': 32, 'model.num_layers': 1, 'model.width': 32,
        'model.ffn_dim': 64, 'phase_b.batch_size': 16, 'phase_b.learning_rate': 0.002,
        'run.eval_batch_size': 32, 'run.log_every': 2, 'run.checkpoint_every': 2}
# The grid run and the killed run: a save at every epoch end only, and enough epochs
# after the first save that the killed run is still going when the test kills it.
RUN = {'phase_b.num_epochs': 6, 'run.checkpoint_every': 0}
STEPS = 6 * 4                                  # 64 rows in batches of 16


def _overrides(**more):
  return [f'--config.{k}={v}' for k, v in dict(TINY, **more).items()]


def _config(data_dir, **more):
  from configs import rotten_tomatoes  # pylint: disable=g-import-not-at-top
  config = rotten_tomatoes.get_config(VARIANT)
  config.data.data_dir = data_dir
  for key, value in dict(TINY, **more).items():
    section, field = key.split('.')
    config[section][field] = value
  return config


def _run(args, cwd, env=None, timeout=300):
  return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=timeout)


def _events(path):
  """The events of a TensorBoard event file (TFRecord frames of ``Event`` protos)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  events = []
  with open(path, 'rb') as f:
    while header := f.read(12):
      (length,) = struct.unpack('<Q', header[:8])
      events.append(event_pb2.Event.FromString(f.read(length)))
      f.read(4)
  return events


def _scalars(logdir):
  """``{tag: [steps]}`` of every scalar in the event files directly in ``logdir``."""
  out = {}
  for name in sorted(os.listdir(logdir)):
    if name.startswith('events.out.tfevents'):
      for event in _events(os.path.join(logdir, name)):
        for value in event.summary.value:
          out.setdefault(value.tag, []).append(event.step)
  return out


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return _mr_data(str(tmp_path_factory.mktemp('cli') / 'data'))


@pytest.fixture(scope='module')
def grid_run(data_dir, tmp_path_factory):
  """grid.py run from another folder with the data folder from COULOMB_JAX_DATA: its run
  folder (``RUN``) and the log it wrote."""
  cwd = tmp_path_factory.mktemp('grid')
  env = dict(os.environ, COULOMB_JAX_DATA=data_dir)
  out = _run([GRID, '--dataset=rotten_tomatoes', f'--variants={VARIANT}', '--workdir=g', '--',
              *_overrides(**RUN)], cwd=str(cwd), env=env)
  run_dir = cwd / 'g' / 'rotten_tomatoes' / VARIANT / 'seed0'
  log = (run_dir / 'log.txt').read_text() if (run_dir / 'log.txt').exists() else ''
  assert out.returncode == 0, out.stderr[-3000:] + log[-3000:]
  return run_dir, log


@pytest.mark.slow
def test_grid_and_train_run_from_another_folder_with_the_data_from_the_environment(
    data_dir, grid_run):
  run_dir, log = grid_run
  results = json.loads((run_dir / 'results.json').read_text())
  # The data folder and the command, relative to the repository; the data's digests.
  assert results['data_dir'] == os.path.relpath(data_dir, REPO)
  assert results['config']['data']['data_dir'] == ''
  assert results['command'].startswith(
      'python -m experiments.train --config=configs/rotten_tomatoes.py:softmax --workdir=')
  assert sorted(results['fingerprint']) == ['rotten_tomatoes/rt-polarity.neg',
                                            'rotten_tomatoes/rt-polarity.pos', 'tokenizer.json']
  # The resolved config is logged at the start and saved in the workdir.
  assert f'data from {data_dir}' in log and "  data.task = 'rotten_tomatoes'" in log
  assert json.loads((run_dir / 'config.json').read_text())['variant'] == 'softmax'
  # TensorBoard: the curves and the hparams (config fields, final metrics).
  tensorboard = str(run_dir / 'tensorboard')
  assert _scalars(tensorboard)['phase_b/loss'] == list(range(2, STEPS + 1, 2))
  hparams = _scalars(os.path.join(tensorboard, 'hparams'))
  assert {'test/accuracy', 'validation/log_loss'} <= set(hparams)
  plugins = {v.metadata.plugin_data.plugin_name for name in os.listdir(
      os.path.join(tensorboard, 'hparams')) for e in _events(os.path.join(
          tensorboard, 'hparams', name)) for v in e.summary.value}
  assert 'hparams' in plugins


@pytest.mark.slow
def test_a_mistake_is_one_line_without_traceback(data_dir, tmp_path):
  out = _run([TRAIN, f'--config={RT}:kernel-elu,quick', '--workdir=w',
              '--config.phase_a.lamb=0.1'], cwd=str(tmp_path))
  assert out.returncode == 2 and 'Traceback' not in out.stderr
  assert out.stderr.splitlines()[-1] == (
      "train: error: --config.phase_a.lamb=0.1: unknown config field 'lamb'. "
      'Did you mean "lam" instead of "lamb"?')
  out = _run([TRAIN, f'--config={RT}:kernel-elu,quick', '--workdir=w',
              f'--config.data.data_dir={data_dir}', '--config.phase_a.lam=-1'],
             cwd=str(tmp_path))
  assert out.returncode == 2 and 'Traceback' not in out.stderr
  assert out.stderr.splitlines()[-1] == (
      'train: error: config.phase_a.lam: expected a finite number ≥ 0, got -1.0.')
  # --jax_distributed alone where jax detects no cluster.
  out = _run([TRAIN, f'--config={RT}:kernel-elu,quick', '--workdir=w', '--jax_distributed'],
             cwd=str(tmp_path))
  assert out.returncode == 2 and 'Traceback' not in out.stderr
  last = out.stderr.splitlines()[-1]                      # jax's words, then ours
  assert last.startswith('train: error: --jax_distributed: ') and (
      '(no cluster detected? give --coordinator_address=HOST:PORT' in last)
  assert not (tmp_path / 'w').exists()


def test_help_says_how_to_list_the_fields_and_list_fields_prints_them(tmp_path):
  out = _run([TRAIN, '--help'], cwd=str(tmp_path))      # absl's --help exits with 1
  assert out.returncode == 1 and 'Traceback' not in out.stderr
  assert '--list_fields' in out.stdout and '--config=configs/sst2.py --list_fields' in out.stdout
  out = _run([TRAIN, f'--config={RT}:kernel-elu,quick', '--list_fields',
              '--config.phase_a.lam=0.5'], cwd=str(tmp_path))
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.splitlines()
  fields = [line for line in lines if line.startswith('--config.')]
  assert '--config.phase_a.lam=0.5' in fields and "--config.model.feature_map='elu'" in fields
  # A field set by a configs/common.py builder: its comment there, then the config's note.
  assert lines[lines.index('--config.phase_a.lam=0.5') + 1].startswith(
      '    Repulsion weight λ of H = −(target term) + λ·W. The paper\'s Langevin step')
  # Every field has its comment.
  assert all(lines[i + 1].startswith('    ') for i, line in enumerate(lines)
             if line.startswith('--config.'))


def test_a_second_process_on_a_busy_workdir_exits_at_once_naming_the_holder(data_dir, tmp_path):
  workdir = str(tmp_path / 'w')
  with run_folder.RunFolder(workdir) as folder:
    assert folder.lock()                                   # This process holds it.
    out = _run([TRAIN, f'--config={RT}:softmax,quick', f'--workdir={workdir}',
                f'--config.data.data_dir={data_dir}', *_overrides()], cwd=str(tmp_path))
  assert not folder.held
  assert out.returncode == 2
  assert out.stderr.splitlines()[-1].startswith(
      f"train: error: workdir '{workdir}' is in use by pid {os.getpid()} on host ")
  assert os.listdir(workdir) == ['lock']               # It wrote nothing.


@pytest.mark.slow
def test_a_killed_run_keeps_its_curves_and_resumes_without_clean_up(data_dir, grid_run,
                                                                    tmp_path):
  from experiments import train  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'killed')
  proc = subprocess.Popen([sys.executable, TRAIN, f'--config={RT}:{VARIANT}',
                           f'--workdir={workdir}', f'--config.data.data_dir={data_dir}',
                           *_overrides(**RUN)], cwd=str(tmp_path),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  checkpoints = os.path.join(workdir, 'checkpoints')
  try:
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not (
        os.path.isdir(checkpoints) and any(n.isdigit() for n in os.listdir(checkpoints))):
      time.sleep(0.02)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert proc.returncode == -signal.SIGKILL
  assert not os.path.exists(os.path.join(workdir, 'results.json'))   # Killed mid-run.
  with open(os.path.join(workdir, 'lock')) as f:
    assert f.read().startswith(f'pid {proc.pid} on host ')           # Left behind.
  # The curves logged before the kill are on disk.
  assert _scalars(os.path.join(workdir, 'tensorboard'))['phase_b/loss'][0] == 2
  resumed = train.train_and_evaluate(_config(data_dir, **RUN), workdir)
  assert len(resumed['sessions']) == 2
  # The same metrics as the uninterrupted run of the same config (grid_run's).
  whole = json.loads((grid_run[0] / 'results.json').read_text())
  assert whole['config']['phase_b'] == resumed['config']['phase_b']
  assert resumed['test'] == whole['test'] and resumed['validation'] == whole['validation']
