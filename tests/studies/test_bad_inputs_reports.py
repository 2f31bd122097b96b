"""Bad inputs to the report commands, the synthetic study and the recall command's collection
(issue 39, items 5, 7 and 8).

Each test damages one thing a command reads, runs the command as a user does
(``python -m experiments.<command>``) and asserts its standard error is exactly one
line naming the file or flag and what is wrong, exit status 2, and that no file under
the test's folder changed (the reports ran once before on the undamaged input, so
there are summaries, pages and figures that a late failure would have rewritten).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from studies.phase_a_learning import command as phase_a_learning
from experiments import report
from experiments.analysis import loading
from experiments.common import provenance

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '..')
META = {'command': 'python -m experiments.report', 'commit': 'abc123',
        'date': '2025-01-02T00:00:00+00:00', 'machine': {'platform': 'cpu'}}
ROWS = loading.TEST_ROWS['rotten_tomatoes']          # 1,066
METRICS = {k: 0.5 for k in loading.METRICS}


def _tree(root):
  """``{relative path: bytes}`` of every file under ``root``."""
  return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), 'rb').read()
          for d, _, files in os.walk(root) for f in files}


def _fails(tmp_path, module, *args):
  """Runs ``python -m <module> args`` and returns its one stderr line; asserts exit status
  2, nothing on stderr but that line, and no file under ``tmp_path`` changed."""
  before = _tree(str(tmp_path))
  proc = subprocess.run([sys.executable, '-m', module, *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.count('\n') == 1, proc.stderr[-3000:]
  assert _tree(str(tmp_path)) == before
  program = module.rsplit('.', 1)[-1]
  assert proc.stderr.startswith(f'{program}: error: '), proc.stderr
  return proc.stderr[len(f'{program}: error: '):].rstrip('\n')


# ----------------------------------------------------------------------------- experiments.report

def _run_folder(root, variant, accuracy, probs=None):
  """A finished ``experiments.train`` run of rotten_tomatoes seed 0 with its predictions."""
  out = os.path.join(root, 'rotten_tomatoes', variant, 'seed0')
  os.makedirs(out)
  config = {'variant': variant, 'seed': 0, 'data': {'task': 'rotten_tomatoes'},
            'phase_b': {'num_epochs': 5}}
  provenance.write_json_atomic(os.path.join(out, 'results.json'), {
      'command': f'python -m experiments.train --config=configs/rotten_tomatoes.py:{variant}',
      'commit': 'c0ffee', 'date': '2025-01-01T00:00:00+00:00', 'machine': {'platform': 'gpu'},
      'dataset': 'rotten_tomatoes', 'variant': variant, 'seed': 0, 'config': config,
      'best_epoch': 3, 'phase_a_seconds': 1.0, 'phase_b_seconds': 9.0, 'train_seconds': 10.0,
      'validation': METRICS, 'test': dict(METRICS, accuracy=accuracy)})
  labels = np.arange(ROWS) % 2
  probs = np.where(labels == 1, 0.7, 0.3) if probs is None else probs
  loading.save_predictions(os.path.join(out, loading.PREDICTIONS), labels, probs)
  return out


def _reported_grid(tmp_path):
  """A grid of two runs, reported once (summaries, page, figures, per-run files); returns
  ``(kernel run folder, the command's arguments)``."""
  grid = str(tmp_path / 'grid')
  kernel = _run_folder(grid, 'kernel-favor', 0.80)
  _run_folder(grid, 'vanilla-favor', 0.78)
  out, docs, runs_out = (str(tmp_path / k) for k in ('results', 'docs/results.md', 'runs'))
  report.write_report(grid, out, docs, meta=META, runs_out=runs_out)
  assert os.path.isfile(tmp_path / 'docs' / 'figures' / 'rotten_tomatoes_reliability.png')
  return kernel, [f'--runs={grid}', f'--out={out}', f'--docs={docs}', f'--runs_out={runs_out}']


def _damage_results(run, change):
  path = os.path.join(run, 'results.json')
  results = json.load(open(path))
  change(results)
  provenance.write_json_atomic(path, results)
  return path


def test_non_finite_probabilities_are_refused(tmp_path):
  kernel, args = _reported_grid(tmp_path)
  path = os.path.join(kernel, loading.PREDICTIONS)
  probs = np.full(ROWS, 0.6)
  probs[3] = np.nan
  loading.save_predictions(path, np.arange(ROWS) % 2, probs)
  assert _fails(tmp_path, 'experiments.report', *args) == (
      f'{path}: probs P(class 1) is not finite in 1 of 1066 rows, the first row 3: nan.')


def test_a_row_count_other_than_the_test_splits_is_refused(tmp_path):
  kernel, args = _reported_grid(tmp_path)
  path = os.path.join(kernel, loading.PREDICTIONS)
  loading.save_predictions(path, np.arange(ROWS - 1) % 2, np.full(ROWS - 1, 0.6))
  assert _fails(tmp_path, 'experiments.report', *args) == (
      f'{path}: 1065 rows, but the rotten_tomatoes test split (test (1,066; HF split)) has '
      '1066: predictions of another split or of a subset.')


def test_a_predictions_file_of_zero_rows_is_refused(tmp_path):
  kernel, args = _reported_grid(tmp_path)
  path = os.path.join(kernel, loading.PREDICTIONS)
  loading.save_predictions(path, np.zeros(0, np.int64), np.zeros(0))
  assert _fails(tmp_path, 'experiments.report', *args) == (
      f'{path}: 0 rows, but the rotten_tomatoes test split (test (1,066; HF split)) has '
      '1066: predictions of another split or of a subset.')


def test_probabilities_outside_zero_one_are_refused(tmp_path):
  kernel, args = _reported_grid(tmp_path)
  path = os.path.join(kernel, loading.PREDICTIONS)
  probs = np.full(ROWS, 0.6)
  probs[10] = 1.5
  loading.save_predictions(path, np.arange(ROWS) % 2, probs)
  assert _fails(tmp_path, 'experiments.report', *args) == (
      f'{path}: probs P(class 1) is outside [0, 1] in 1 of 1066 rows, the first row 10: 1.5.')


def test_results_without_a_test_section_are_refused(tmp_path):
  kernel, args = _reported_grid(tmp_path)
  path = _damage_results(kernel, lambda r: r.pop('test'))
  assert _fails(tmp_path, 'experiments.report', *args) == (
      f"{path}: no 'test' section (a results.json of experiments.train has them); rerun the "
      'run or remove its folder from the grid.')


def test_a_test_section_without_a_metric_is_refused(tmp_path):
  kernel, args = _reported_grid(tmp_path)
  path = _damage_results(kernel, lambda r: r['test'].pop('ece'))
  assert _fails(tmp_path, 'experiments.report', *args) == (
      f"{path}: its 'test' section lacks ['ece'] (every metric of "
      'coulomb_jax.metrics.classification_metrics is a column of the table).')


def test_a_runs_folder_that_is_a_file_is_refused(tmp_path):
  _, args = _reported_grid(tmp_path)
  (tmp_path / 'a_file').write_text('not a folder')
  args[0] = f'--runs={tmp_path / "a_file"}'
  assert _fails(tmp_path, 'experiments.report', *args) == (
      f"--runs: '{tmp_path / 'a_file'}' is a file, not a folder.")


def test_an_out_folder_that_is_a_file_is_refused(tmp_path):
  _, args = _reported_grid(tmp_path)
  (tmp_path / 'a_file').write_text('not a folder')
  args[1] = f'--out={tmp_path / "a_file" / "results"}'
  assert _fails(tmp_path, 'experiments.report', *args) == (
      f"--out: '{tmp_path / 'a_file' / 'results'}' cannot be a folder: "
      f"'{tmp_path / 'a_file'}' is a file.")


# ----------------------------------------------------------------------------- phase_a_learning

def _learning_run(root, variant, seed, accuracy):
  """A finished run of the learning grid; Kernel-X with its Phase A stage and history."""
  run = os.path.join(root, 'rotten_tomatoes', variant, f'seed{seed}')
  os.makedirs(run)
  config = {'variant': variant, 'seed': seed, 'data': {'task': 'rotten_tomatoes'},
            'model': {}, 'phase_a': {'enabled': variant.startswith('kernel'), 'radius': 1.5},
            'phase_b': {'num_epochs': 5}, 'run': {}}
  results = {'dataset': 'rotten_tomatoes', 'variant': variant, 'seed': seed, 'config': config,
             'test': dict(METRICS, accuracy=accuracy), 'validation': METRICS,
             'sessions': [{'commit': 'abc1234'}]}
  history = []
  if variant.startswith('kernel'):
    heldout = {k: {'alignment': 0.0, 'centered_alignment': rho}
               for k, rho in (('initial', 0.1), ('ball', 0.12), ('learned', 0.3))}
    results['phase_a'] = {
        'heldout_alignment': {k: v['alignment'] for k, v in heldout.items()},
        'heldout_centered_alignment': {k: v['centered_alignment'] for k, v in heldout.items()},
        'stages': [{'stage': 1, 'layer': 0, 'steps': 4, 'heldout': heldout}]}
    history = [{'stage': 1, 'layer': 0, 'phase_a_step': t, 't': t,
                'heldout': {'alignment': 0.0, 'centered_alignment': 0.1 + 0.05 * t}}
               for t in (2, 4)]
  provenance.write_json_atomic(os.path.join(run, 'results.json'), results)
  with open(os.path.join(run, 'history.jsonl'), 'w') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in history))
  return run


def _learned_grid(tmp_path):
  """A learning grid, reported once by studies.phase_a_learning; returns
  ``(the Kernel-X seed-0 folder, the command's arguments)``."""
  grid = str(tmp_path / 'grid')
  for seed, (k, b, v) in enumerate([(0.72, 0.70, 0.69), (0.74, 0.71, 0.70)]):
    _learning_run(grid, 'kernel-elu', seed, k)
    _learning_run(grid, 'ball-elu', seed, b)
    _learning_run(grid, 'vanilla-elu', seed, v)
  paths = {k: str(tmp_path / v) for k, v in (('out', 'learning.json'), ('docs', 'docs/p.md'),
                                              ('figures', 'docs/figures'),
                                              ('runs_out', 'runs'), ('pilots', 'pilots'))}
  phase_a_learning.write(grid, paths['pilots'], paths['out'], paths['docs'], paths['figures'],
                         META, runs_out=paths['runs_out'])
  assert os.path.isfile(os.path.join(paths['figures'],
                                     'phase_a_learning_rotten_tomatoes_alignment.png'))
  args = [f'--runs={grid}'] + [f'--{k}={v}' for k, v in paths.items()]
  return os.path.join(grid, 'rotten_tomatoes', 'kernel-elu', 'seed0'), args


def test_a_phase_a_stage_without_heldout_is_refused(tmp_path):
  kernel, args = _learned_grid(tmp_path)
  path = _damage_results(kernel, lambda r: r['phase_a']['stages'][0].pop('heldout'))
  assert _fails(tmp_path, 'studies.phase_a_learning', *args) == (
      f"{path}: Phase A stage 0 (phase_a.stages[0]) has no 'heldout' section (the held-out "
      'alignment each stage records); rerun the run or remove its folder from the grid.')


@pytest.mark.slow
def test_a_corrupt_history_is_refused(tmp_path):
  kernel, args = _learned_grid(tmp_path)
  path = os.path.join(kernel, 'history.jsonl')
  with open(path, 'a') as f:
    f.write('{"stage": 1, "phase_a_step": 6, "heldout": \n')  # cut: no value
  assert _fails(tmp_path, 'studies.phase_a_learning', *args) == (
      f'{path}:3: not valid JSON (Expecting value at character 45); the run folder is '
      'damaged: restore the file or rerun the run.')


# ----------------------------------------------------------------------------- experiments.synthetic

def test_a_synthetic_workdir_that_is_a_file_is_refused(tmp_path):
  (tmp_path / 'a_file').write_text('not a folder')
  assert _fails(tmp_path, 'experiments.synthetic', '--config=configs/synthetic.py:quick',
                f'--workdir={tmp_path / "a_file"}') == (
      f"--workdir: '{tmp_path / 'a_file'}' is a file, not a folder.")


def test_a_synthetic_workdir_under_a_file_is_refused(tmp_path):
  (tmp_path / 'a_file').write_text('not a folder')
  assert _fails(tmp_path, 'experiments.synthetic', '--config=configs/synthetic.py:quick',
                f'--workdir={tmp_path / "a_file" / "quick"}') == (
      f"--workdir: '{tmp_path / 'a_file' / 'quick'}' cannot be a folder: "
      f"'{tmp_path / 'a_file'}' is a file.")


# ----------------------------------------------------------------------------- experiments.mqar

def test_mqar_collect_only_without_workdir_or_results_names_the_workdir(tmp_path):
  # Was '--results: ...: no finished run to write.', naming neither the missing folder nor
  # the flag to fix.
  work, results = tmp_path / 'nowhere', tmp_path / 'r.json'
  assert _fails(tmp_path, 'experiments.mqar', '--collect_only', f'--workdir={work}',
                f'--results={results}') == (
      f'--workdir: {work} does not exist, and --results {results} does not exist either: no '
      'finished run to collect; nothing was written.')


@pytest.mark.slow
def test_mqar_results_holding_a_json_list_is_refused(tmp_path):
  # Was a bare AttributeError ('list' object has no attribute 'get').
  (tmp_path / 'work').mkdir()
  results = tmp_path / 'r.json'
  results.write_text('[1, 2]')
  assert _fails(tmp_path, 'experiments.mqar', '--collect_only', f'--workdir={tmp_path / "work"}',
                f'--results={results}') == (
      f'--results: {results}: not a results file of experiments.mqar (an object with vocab, '
      'num_train and a list of runs), but a JSON list; nothing was written.')
  assert _fails(tmp_path, 'experiments.mqar', '--config=configs/mqar.py:zoology',
                '--grid=zoology', '--collect_only', f'--workdir={tmp_path / "work"}',
                f'--results={results}', f'--runs_dir={tmp_path / "runs"}') == (
      f"--results: {results}: not a results file of this grid (TypeError('a JSON list, not "
      "an object')); nothing was written.")


# ----------------------------------------------------------------------------- the studies
# The review's two study cases: a bare TypeError in stage_row, a bare JSONDecodeError that
# named no file. Both are now one line.

def test_a_joint_schedule_run_given_to_the_repulsion_study_is_refused(tmp_path):
  from studies.phase_a_repulsion import command as repulsion  # pylint: disable=g-import-not-at-top
  import test_phase_a_repulsion as rep_test  # pylint: disable=g-import-not-at-top
  root = str(tmp_path)
  for seed in (0, 1):
    rep_test._write(root, ['base'], 'ball-elu', seed, 0.7)
  stage = dict(rep_test._stage(0, 0.5, 40.0, 1.0, 0.1, 0.3), layer=None)   # all layers at once
  rep_test._write(root, ['lam10'], 'kernel-elu', 0, 0.72, lam=10.0, stages=[stage],
                  schedule='joint')
  with pytest.raises(ValueError, match=r'lam10/rotten_tomatoes/kernel-elu/seed0.*joint'):
    repulsion.collect_runs(root, 'rotten_tomatoes')


def test_a_teachers_corrupt_result_json_is_refused_naming_the_file(tmp_path):
  from experiments.common import cli  # pylint: disable=g-import-not-at-top
  from studies.mqar_convert import command as mqar_convert  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'softmax-L16-P2-w16-seed0' / 'result.json'
  path.parent.mkdir()
  path.write_text('{"seq_len": 1')
  with pytest.raises(cli.ConfigError, match=f'{path}: not valid JSON'):
    mqar_convert.teachers(str(tmp_path))


@pytest.mark.parametrize('override, message', [
    ('--config.fit_steps=-1', 'config.fit_steps: an integer >= 0, got -1.'),
    ('--config.particle_step_size=0.0', 'config.particle_step_size: a finite number > 0, got 0.0.'),
    ("--config.methods=('elu', 'favor')", "config.methods: names from ('favor_orthogonal', "
     "'elu', 'softmaxfeat_trained', 'hedgehog', 'particles_softmax'), got ['elu', 'favor']."),
])
def test_the_mqar_conversion_settings_are_a_config_checked_before_any_teacher(tmp_path,
                                                                               override,
                                                                               message):
  # Issue 37 item 4: the study's settings moved from flags to studies/mqar_convert/config.py.
  proc = subprocess.run([sys.executable, '-m', 'studies.mqar_convert',
                         f'--teachers={tmp_path / "none"}', f'--workdir={tmp_path / "w"}',
                         f'--results={tmp_path / "r.json"}', override], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr == f'mqar_convert: error: {message}\n'
  assert not os.listdir(tmp_path)


def test_per_run_files_follow_out_by_default(tmp_path):
  # Issue 39 item 6: with --out, --docs and --figures outside the repository and no
  # --runs_out, the per-run files go under <--out>/runs/<grid>, not results/runs/.
  grid = str(tmp_path / 'mygrid')
  _run_folder(grid, 'kernel-favor', 0.80)
  out = str(tmp_path / 'out')
  proc = subprocess.run([sys.executable, '-m', 'experiments.report', f'--runs={grid}',
                         f'--out={out}', f'--docs={tmp_path / "docs" / "r.md"}'], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert os.path.isfile(os.path.join(out, 'runs', 'mygrid', 'rotten_tomatoes', 'kernel-favor',
                                     'seed0.json'))
  assert not os.path.exists(os.path.join(ROOT, 'results', 'runs', 'mygrid'))
