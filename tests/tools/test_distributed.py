"""experiments.train on jax.distributed: two CPU processes on 127.0.0.1 (gloo) train to
the metrics of one process, only process 0 writes the workdir, and a run resumes across
process counts (issue 16, item 7): one test, a run of 1 -> 2 -> 1 processes.

The two processes are real subprocesses of ``python experiments/train.py
--jax_distributed --coordinator_address=127.0.0.1:<free port> --num_processes=2
--process_id=I``; the one-process runs are ``train_and_evaluate`` in this process.
The model is tiny (one layer, one padded shape) and the data a generated Rotten
Tomatoes folder of 200 sentences.
"""

import glob
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, 'experiments', 'train.py')
VARIANT = 'kernel-elu,quick'
# One layer, 64 training rows, batches of 16 (a multiple of the 2 devices), one padded
# shape: 4 Phase A steps (and their null run), then 2 Phase B epochs of 4 steps. Saves at
# stage and epoch ends and where a call stops (--stop_after_steps), none in between (each
# save is a collective of both processes).
OVERRIDES = {'data.max_train_examples': 64, 'data.vocab_size': 120, 'data.max_length': 32,
             'data.pad_multiple': 32, 'model.num_layers': 1, 'phase_a.batch_size': 16,
             'phase_b.batch_size': 16, 'run.eval_batch_size': 32, 'run.log_every': 2,
             'run.checkpoint_every': 0}
TOLERANCE = 1e-5


def _mr_data(root):
  """``root/rotten_tomatoes/rt-polarity.{pos,neg}``: 100 sentences each, class words mixed
  with shared filler words."""
  rng = np.random.default_rng(0)
  filler = ['the', 'film', 'a', 'story', 'is', 'and', 'of', 'it', 'plot', 'actors']
  words = {'pos': ['good', 'great', 'moving', 'fine'], 'neg': ['bad', 'dull', 'weak', 'flat']}
  os.makedirs(os.path.join(root, 'rotten_tomatoes'))
  for name, own in words.items():
    lines = [' '.join(rng.choice(filler + own, size=rng.integers(4, 12))) + ' .'
             for _ in range(100)]
    with open(os.path.join(root, 'rotten_tomatoes', f'rt-polarity.{name}'), 'w',
              encoding='latin-1') as f:
      f.write('\n'.join(lines) + '\n')
  return root


def _config(data_dir, variant=VARIANT):
  from configs import rotten_tomatoes  # pylint: disable=g-import-not-at-top
  config = rotten_tomatoes.get_config(variant)
  config.data.data_dir = data_dir
  for key, value in OVERRIDES.items():
    section, field = key.split('.')
    config[section][field] = value
  return config


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _two_processes(workdir, data_dir, *extra, variant=VARIANT):
  """Runs the two-process job to its end; returns process 0's pid."""
  args = [f'--config={os.path.join(REPO, "configs", "rotten_tomatoes.py")}:{variant}',
          f'--workdir={workdir}', f'--config.data.data_dir={data_dir}', '--jax_distributed',
          f'--coordinator_address=127.0.0.1:{_free_port()}', '--num_processes=2',
          *[f'--config.{k}={v}' for k, v in OVERRIDES.items()], *extra]
  procs, logs = [], []
  for i in range(2):
    logs.append(open(f'{workdir}.process{i}.log', 'w'))  # pylint: disable=consider-using-with
    procs.append(subprocess.Popen([sys.executable, TRAIN, *args, f'--process_id={i}'],
                                  stdout=logs[-1], stderr=subprocess.STDOUT))
  try:
    for proc in procs:
      proc.wait(timeout=300)
  finally:
    for proc, log in zip(procs, logs):
      if proc.poll() is None:
        proc.kill()
        proc.wait()
      log.close()
  for i, proc in enumerate(procs):
    with open(f'{workdir}.process{i}.log') as f:
      assert proc.returncode == 0, f.read()[-4000:]
  return procs[0].pid


def _max_difference(a, b):
  return max(abs(a[split][k] - b[split][k]) for split in ('validation', 'test') for k in a[split])


@pytest.fixture(scope='module')
def one_process(tmp_path_factory):
  """The one-process run of the config, and the data folder."""
  from experiments import train  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('distributed')
  data_dir = _mr_data(str(root / 'data'))
  return train.train_and_evaluate(_config(data_dir), str(root / 'one')), data_dir


@pytest.mark.slow
def test_two_processes_resume_one_and_train_to_the_one_process_metrics(one_process, tmp_path):
  # One process: 3 steps; two processes: 3 more; one process: the rest (1 -> 2 -> 1).
  from experiments import train  # pylint: disable=g-import-not-at-top
  reference, data_dir = one_process
  workdir = str(tmp_path / 'two')
  assert train.train_and_evaluate(_config(data_dir), workdir, stop_after_steps=3) is None
  pid0 = _two_processes(workdir, data_dir, '--stop_after_steps=3')
  assert not os.path.exists(os.path.join(workdir, 'results.json'))
  # Process 0 alone wrote the workdir: the lock names it and no temporary file is left.
  with open(os.path.join(workdir, 'lock')) as f:
    assert f.read().startswith(f'pid {pid0} on host ')
  assert not glob.glob(os.path.join(workdir, '**', '*.tmp'), recursive=True)
  results = train.train_and_evaluate(_config(data_dir), workdir)
  assert [s['device_count'] for s in results['sessions']] == [1, 2, 1]
  print('resumed 1 -> 2 -> 1 processes vs one: max |difference| of the metrics',
        _max_difference(results, reference))
  assert _max_difference(results, reference) < TOLERANCE
  assert results['fingerprint'] == reference['fingerprint']
  # One history record per evaluation across the three sessions.
  with open(os.path.join(workdir, 'history.jsonl')) as f:
    records = [json.loads(line) for line in f]
  assert [r.get('phase_a_step', r.get('epoch')) for r in records] == [2, 4, 0, 1]
  assert not glob.glob(os.path.join(workdir, '**', '*.tmp'), recursive=True)
