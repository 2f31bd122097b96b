"""Tests of experiments/grid.py (run order, skipping, parallel runs, limits, failures)
and of the commit that runs record on a copy without git."""

import os
import sys

from experiments import grid


def _py(code):
  return [sys.executable, '-c', code]


def test_plan_order_and_skips_finished_runs(tmp_path):
  done = grid.run_dir(str(tmp_path), 'sst2', 'softmax', 0)
  os.makedirs(done)
  open(os.path.join(done, 'results.json'), 'w').close()
  runs = grid.plan(['sst2', 'qqp_subset'], ['softmax', 'kernel-elu'], [0, 1], str(tmp_path))
  assert [(d, v, s) for d, v, s, _ in runs] == [
      ('sst2', 'kernel-elu', 0), ('qqp_subset', 'softmax', 0), ('qqp_subset', 'kernel-elu', 0),
      ('sst2', 'softmax', 1), ('sst2', 'kernel-elu', 1), ('qqp_subset', 'softmax', 1),
      ('qqp_subset', 'kernel-elu', 1)]
  assert runs[0][3] == grid.run_dir(str(tmp_path), 'sst2', 'kernel-elu', 0)
  # Repeated names: one run each (two processes must never share a folder).
  assert grid.plan(['sst2', 'sst2'], ['softmax'], [1, 1], str(tmp_path)) == [
      ('sst2', 'softmax', 1, grid.run_dir(str(tmp_path), 'sst2', 'softmax', 1))]


def test_dataset_scoped_overrides():
  args = ['--config.phase_b.num_epochs=5', 'sst2:--config.data.validation_rule=sentences']
  assert grid.overrides_for(args, 'sst2') == ['--config.phase_b.num_epochs=5',
                                              '--config.data.validation_rule=sentences']
  assert grid.overrides_for(args, 'rotten_tomatoes') == ['--config.phase_b.num_epochs=5']
  # A value that merely contains a colon is passed through untouched.
  assert grid.overrides_for(['--config.data.data_dir=c:/x'], 'sst2') == [
      '--config.data.data_dir=c:/x']


def test_runs_in_parallel_and_logs(tmp_path):
  # Each run logs when it starts and ends; run at once, the four intervals overlap.
  code = ('import time; print(time.time()); time.sleep(1.0); print(time.time()); '
          'print("run {}")')
  runs = [(str(tmp_path / f'r{i}'), _py(code.format(i))) for i in range(4)]
  assert grid.run_all(runs, jobs=4, poll_s=0.05) == []
  spans = []
  for i in range(4):
    with open(tmp_path / f'r{i}' / 'log.txt') as f:
      start, end, name = f.read().splitlines()
    assert name == f'run {i}'
    spans.append((float(start), float(end)))
  assert max(s for s, _ in spans) < min(e for _, e in spans)


def test_a_failure_stops_new_runs(tmp_path):
  runs = [(str(tmp_path / 'bad'), _py('raise SystemExit(3)')),
          (str(tmp_path / 'later'), _py('print(1)'))]
  assert grid.run_all(runs, jobs=1, poll_s=0.05) == [str(tmp_path / 'bad')]
  assert not os.path.exists(tmp_path / 'later')


def test_limits_stop_starting_and_end_running_runs(tmp_path):
  runs = [(str(tmp_path / 'long'), _py('import time; time.sleep(60); print("finished")')),
          (str(tmp_path / 'queued'), _py('print(1)'))]
  failed = grid.run_all(runs, jobs=1, no_new_runs_after_s=1, kill_after_s=1, poll_s=0.05)
  assert failed == []                       # Ended at the limit: resumable, not failed.
  with open(tmp_path / 'long' / 'log.txt') as f:
    assert 'finished' not in f.read()      # Terminated, not waited for.
  assert not os.path.exists(tmp_path / 'queued')


def test_a_run_that_fails_by_itself_near_the_kill_limit_counts_as_failed(tmp_path):
  # One poll every 1.5 s: 'crash' exits by itself long before the first poll, which
  # comes after the 0.5 s limit and terminates only 'long' (resumable, not failed).
  runs = [(str(tmp_path / 'long'), _py('import time; time.sleep(60)')),
          (str(tmp_path / 'crash'), _py('raise SystemExit(2)'))]
  failed = grid.run_all(runs, jobs=2, kill_after_s=0.5, poll_s=1.5)
  assert failed == [str(tmp_path / 'crash')]


def test_commit_of_a_copy_without_git(tmp_path, monkeypatch):
  from experiments.common import provenance  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)                          # No git checkout here.
  monkeypatch.setattr(provenance, 'REPO_ROOT', str(tmp_path))
  monkeypatch.setenv('GIT_CEILING_DIRECTORIES', str(tmp_path.parent))
  monkeypatch.delenv('COULOMB_JAX_COMMIT', raising=False)
  assert provenance.git_commit() == 'unknown'
  monkeypatch.setenv('COULOMB_JAX_COMMIT', 'abc123')
  assert provenance.git_commit() == 'abc123 (from COULOMB_JAX_COMMIT)'


def test_the_commit_a_sender_names_wins_over_a_git_checkout(monkeypatch):
  # A device copy may carry another commit's .git (its files then read as '-dirty').
  from experiments.common import provenance  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('COULOMB_JAX_COMMIT', 'abc123')
  assert provenance.git_commit() == 'abc123 (from COULOMB_JAX_COMMIT)'
  monkeypatch.delenv('COULOMB_JAX_COMMIT')
  assert '(from' not in provenance.git_commit()


def test_prefix_root_points_every_particle_variant_at_its_vanilla_run():
  out = lambda v, s=1: grid.run_dir('new', 'rotten_tomatoes', v, s)
  for variant in ('kernel-elu', 'ball-elu', 'vanilla-elu'):
    assert grid.prefix_override('old', 'rotten_tomatoes', variant, 1, out(variant)) == [
        '--config.run.prefix_from=' + grid.run_dir('old', 'rotten_tomatoes', 'vanilla-elu', 1)]
  # A vanilla run is never its own prefix; other variants and an unset root get nothing.
  assert grid.prefix_override('new', 'rotten_tomatoes', 'vanilla-elu', 1,
                              out('vanilla-elu')) == []
  assert grid.prefix_override('old', 'rotten_tomatoes', 'softmax', 1, out('softmax')) == []
  assert grid.prefix_override('', 'rotten_tomatoes', 'kernel-elu', 1, out('kernel-elu')) == []


def test_runs_launch_train_as_a_module_with_the_configs_absolute_path(tmp_path):
  from absl import flags  # pylint: disable=g-import-not-at-top
  fv = flags.FlagValues()
  grid.define_flags(fv)
  fv(['grid', '--dataset=rotten_tomatoes,sst2', '--variants=softmax', '--seeds=2',
      f'--workdir={tmp_path}'])
  runs = grid.commands(fv, ['--config.data.data_dir=' + str(tmp_path),
                            'sst2:--config.data.validation_rule=sentences'])
  assert [out for out, _ in runs] == [grid.run_dir(str(tmp_path), d, 'softmax', 2)
                                      for d in ('rotten_tomatoes', 'sst2')]
  _, command = runs[1]
  assert command[:3] == [sys.executable, '-m', 'experiments.train']
  assert command[3] == f'--config={os.path.join(grid.REPO_ROOT, "configs", "sst2.py")}:softmax'
  assert command[4:] == [f'--workdir={runs[1][0]}', '--config.seed=2',
                         f'--config.data.data_dir={tmp_path}',
                         '--config.data.validation_rule=sentences']


def test_a_prefix_root_that_is_not_there_is_refused_before_any_run(tmp_path):
  # Before: every kernel- and ball- run looked for a prefix there, found none and trained
  # its Phase B epochs again without a word.
  import pytest  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from experiments.common import cli  # pylint: disable=g-import-not-at-top

  def commands(prefix_root):
    fv = flags.FlagValues()
    grid.define_flags(fv)
    fv(['grid', '--dataset=rotten_tomatoes', '--variants=kernel-elu', f'--workdir={tmp_path}/w',
        f'--prefix_root={prefix_root}'])
    return grid.commands(fv, ['--config.data.data_dir=' + str(tmp_path)])
  missing = tmp_path / 'old_grid'
  with pytest.raises(cli.ConfigError) as e:
    commands(missing)
  assert str(e.value) == f"--prefix_root: '{missing}' does not exist (expected a folder)."
  assert not (tmp_path / 'w').exists()
  (tmp_path / 'a_file').write_text('x')
  with pytest.raises(cli.ConfigError, match="--prefix_root: .* is a file, not a folder"):
    commands(tmp_path / 'a_file')
  missing.mkdir()
  assert '--config.run.prefix_from=' + grid.run_dir(str(missing), 'rotten_tomatoes',
                                                    'vanilla-elu', 0) in commands(missing)[0][1]
  # The grid's own root (its vanilla runs are made here first) need not exist yet.
  assert len(commands(tmp_path / 'w')) == 1
