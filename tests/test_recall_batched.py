"""The batched recall grid (issue 36 item 4): K runs as one vmapped program equal the K
runs of ``experiments/recall/run.py``, early stopping per model, the batches, the choice
of (rate, η), and the command end to end on a tiny grid."""

import json
import os
import subprocess
import sys
import tarfile
import time

import jax
import numpy as np
import pytest

from configs import mqar as mqar_config
from experiments.recall import batched
from experiments.recall import grid as grid_lib
from experiments.recall import run as run_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SILENT = lambda message: None


def _config(method, **overrides):
  return grid_lib.apply_overrides(mqar_config.get_config(f'zoology,quick,{method}'), overrides)


@pytest.mark.parametrize('method, early_stop', [('particles_softmax', 1e-6), ('taylor', 0.99)])
def test_a_program_equals_its_runs_made_one_by_one(tmp_path, method, early_stop):
  # particles_softmax: per-run rate, η, calibrated λ and β and Langevin key, all traced;
  # early_stop 1e-6 stops the runs whose validation accuracy is > 0 at step 2 and no other.
  config = _config(method, **{'train.early_stop': early_stop})
  eta = 1e-2 if method == 'particles_softmax' else None
  specs = [batched.Spec(lr, seed, eta) for lr in (1e-2, 3e-3) for seed in (0, 1)]
  rows = batched.train_program(config, specs, str(tmp_path / 'program'), SILENT)
  assert len(rows) == len(specs)
  for spec, row in zip(specs, rows):
    single = run_lib.train_and_evaluate(batched.run_config(config, spec),
                                        str(tmp_path / batched.run_name(config, spec)), SILENT)
    assert row['steps_run'] == single['steps_run']
    assert row['accuracy'] == single['accuracy']
    assert row['valid_accuracy'] == single['valid_accuracy']
    np.testing.assert_allclose([row['loss'], row['valid_loss']],
                               [single['loss'], single['valid_loss']], rtol=1e-5)
    assert row.get('calibration') == single.get('calibration')
    assert row['runs_in_program'] == len(specs)
    for key in ('learning_rate', 'seed', 'method', 'state_size'):
      assert row[key] == single[key]
    if eta is not None:
      assert row['particle_step_size'] == single['particle_step_size'] == eta
  if early_stop < 0.5:
    assert {r['steps_run'] for r in rows} == {2, 4}     # both cases were exercised


def test_a_finished_program_is_read_not_trained(tmp_path):
  config = _config('softmax')
  specs = [batched.Spec(1e-2, 0)]
  first = batched.train_program(config, specs, str(tmp_path), SILENT)
  lines = []
  again = batched.train_program(config, specs, str(tmp_path), lines.append)
  assert again == first and not lines


def test_the_rows_of_each_step_are_the_training_sets_across_epochs():
  config = _config('softmax', **{'train.steps': 40})
  keys = run_lib._keys(3)                             # pylint: disable=protected-access
  data = run_lib.TrainingSet(config, keys)
  rows = batched._rows(config, [keys['shuffle']], 10, 40)[0]   # epochs of 16 steps
  inputs = np.asarray(data.data.inputs)
  for i, step in enumerate(range(10, 40)):
    np.testing.assert_array_equal(inputs[np.asarray(rows[i])],
                                  np.asarray(data.batch(step).inputs))


def test_a_spec_that_does_not_fit_the_method_is_refused_before_compute():
  with pytest.raises(Exception, match='step_size'):
    batched.check_program(_config('softmax'), [batched.Spec(1e-2, 0, 1e-3)])
  with pytest.raises(Exception, match='step_size'):
    batched.check_program(_config('particles_flow'), [batched.Spec(1e-2, 0)])
  with pytest.raises(Exception, match='train_examples'):
    batched.check_program(_config('softmax', **{'data.train_examples': 0}),
                          [batched.Spec(1e-2, 0)])
  with pytest.raises(Exception, match='learning_rate'):
    batched.check_program(_config('softmax'), [batched.Spec(-1.0, 0)])


def test_no_program_starts_after_the_budget(tmp_path):
  programs = grid_lib.batched_programs(grid_lib.BATCHED_GRIDS['tiny_batched'])
  lines = []
  made = batched.run_programs(mqar_config.get_config('zoology,quick'), str(tmp_path), programs,
                              lines.append, stop_starting_at=time.time() - 1)
  assert made == 0 and 'not started' in lines[-1]
  assert not os.path.exists(tmp_path / 'programs')


def _row(lr, eta, seed, valid, acc):
  return {'seq_len': 64, 'num_pairs': 4, 'width': 64, 'method': 'particles_softmax',
          'learning_rate': lr, 'particle_step_size': eta, 'seed': seed,
          'valid_accuracy': valid, 'valid_loss': 1.0, 'accuracy': acc}


def test_rate_and_step_size_are_chosen_together_on_seed_0():
  rows = [_row(1e-3, 1e-2, 0, 0.5, 0.4), _row(1e-3, 3e-3, 0, 0.9, 0.8),
          _row(1e-2, 1e-2, 0, 0.7, 0.6), _row(1e-2, 3e-3, 0, 0.1, 0.1),
          _row(1e-3, 3e-3, 1, 0.0, 0.6), _row(1e-3, 1e-2, 1, 0.0, 0.99)]
  best = grid_lib.zoology_best(rows)['64/4/64/particles_softmax']
  assert (best['learning_rate'], best['particle_step_size']) == (1e-3, 3e-3)
  assert best['accuracy']['n'] == 2 and best['accuracy']['mean'] == pytest.approx(0.7)
  assert best['rates_tried'] == 2 and best['step_sizes_tried'] == 2


def test_the_batched_grid_command_end_to_end(tmp_path):
  work, results = tmp_path / 'work', tmp_path / 'results.json'
  runs_dir, archive = tmp_path / 'runs', tmp_path / 'runs.tar.gz'
  command = [sys.executable, '-m', 'experiments.mqar', '--config=configs/mqar.py:zoology,quick',
             '--grid=tiny_batched', f'--workdir={work}', f'--results={results}',
             f'--runs_dir={runs_dir}', f'--archive={archive}', '--budget_s=600']
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  table = json.loads(results.read_text())
  assert table['protocol']['where'] == 'cpu' and 'program' in table['protocol']
  assert len(table['runs']) == 8 and len(os.listdir(runs_dir)) == 8
  assert {r['runs_in_program'] for r in table['runs']} == {4}
  assert set(table['best']) == {'16/2/16/particles_softmax', '16/2/16/softmax'}
  with tarfile.open(archive) as tar:
    assert len([n for n in tar.getnames() if n.endswith('result.json')]) == 8
  # Collected again from the workdir alone: the same file.
  before = results.read_text()
  results.unlink()
  again = subprocess.run(command[:6] + [f'--results={results}', f'--runs_dir={runs_dir}',
                                        '--collect_only'],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-2000:]
  assert results.read_text() == before
