"""The batched recall grid (issue 36 item 4): K runs as one vmapped program equal the K
runs of ``experiments/recall/run.py``, early stopping per model, the batches, the choice
of (rate, η), and the command end to end on a tiny grid."""

import json
import os
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest
from scipy import stats

from configs import mqar as mqar_config
from experiments.recall import batched
from experiments.recall import grid as grid_lib
from experiments.recall import run as run_lib
from experiments.recall import zoology

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SILENT = lambda message: None


def _config(method, **overrides):
  return grid_lib.apply_overrides(mqar_config.get_config(f'zoology,quick,{method}'), overrides)


@pytest.mark.slow
@pytest.mark.parametrize('method, early_stop', [('particles_softmax', 1e-6),
                                                ('favor_mimicry', 1e-6),
                                                ('hedgehog_mimicry', 1.0)])
def test_a_program_equals_its_runs_made_one_by_one(tmp_path, method, early_stop):
  # particles_softmax: per-run rate, η, calibrated λ and β and Langevin key, all traced;
  # early_stop 1e-6 stops the runs whose validation accuracy is > 0 at step 2 and no other
  # (hedgehog_mimicry's all stay at 0 there: 1.0, no stop). The two AdamW mimicry methods
  # are in zoology_batched_long only. (Every other method was checked the same way by hand
  # at 5a11465: softmax, hedgehog_distilled, particles_flow and taylor equal their runs to
  # rtol 1e-6.)
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
    assert row['valid_curve']['step'] == single['valid_curve']['step']
    np.testing.assert_allclose(row['valid_curve']['accuracy'],
                               single['valid_curve']['accuracy'], rtol=1e-6)
    assert row['runs_in_program'] == len(specs)
    for key in ('learning_rate', 'seed', 'method', 'state_size'):
      assert row[key] == single[key]
    if eta is not None:
      assert row['particle_step_size'] == single['particle_step_size'] == eta
  if early_stop < 0.5:
    assert {r['steps_run'] for r in rows} == {2, 4}     # both cases were exercised


@pytest.mark.slow
def test_a_finished_program_is_read_not_trained(tmp_path):
  config = _config('softmax')
  specs = [batched.Spec(1e-2, 0)]
  first = batched.train_program(config, specs, str(tmp_path), SILENT)
  lines = []
  again = batched.train_program(config, specs, str(tmp_path), lines.append)
  assert again == first and not lines
  # A program that grew (a new seed): only the new run trains; the finished file stays.
  path = tmp_path / batched.run_name(config, specs[0]) / run_lib.RESULT_FILE
  before = path.read_bytes()
  grown = batched.train_program(config, specs + [batched.Spec(1e-2, 1)], str(tmp_path), SILENT)
  assert path.read_bytes() == before and grown[0] == first[0]
  assert grown[1]['seed'] == 1 and grown[1]['runs_in_program'] == 1


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
  programs = batched.batched_programs(batched.BATCHED_GRIDS['tiny_batched'])
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
  best = zoology.zoology_best(rows)['64/4/64/particles_softmax']
  assert (best['learning_rate'], best['particle_step_size']) == (1e-3, 3e-3)
  assert best['accuracy']['n'] == 2 and best['accuracy']['mean'] == pytest.approx(0.7)
  assert best['rates_tried'] == 2 and best['step_sizes_tried'] == 2


def test_the_coulomb_effect_pairs_the_two_particle_methods_by_seed_at_their_best_rates():
  # particles_softmax − particles_flow at each one's own chosen rate, over the seeds both
  # have there; the interval is t_{0.975, n−1}·std/√n around the mean, by hand.
  def row(method, lr, seed, valid, acc, ratio=None):
    r = dict(_row(lr, 1e-2, seed, valid, acc), method=method)
    if ratio is not None:
      r['calibration'] = {'force_ratio': ratio, 'drift_to_noise': 1.0}
    return r
  rows = [row('particles_softmax', 1e-3, 0, 0.9, 0.50, 0.1),
          row('particles_softmax', 1e-2, 0, 0.2, 0.20, 0.1),
          row('particles_softmax', 1e-3, 1, 0.0, 0.60, 0.12),
          row('particles_softmax', 1e-3, 2, 0.0, 0.70, 0.09),
          row('particles_flow', 1e-2, 0, 0.8, 0.40), row('particles_flow', 1e-3, 0, 0.3, 0.45),
          row('particles_flow', 1e-2, 1, 0.0, 0.40), row('particles_flow', 1e-2, 2, 0.0, 0.55),
          row('particles_flow', 1e-3, 1, 0.0, 0.99)]   # not at flow's chosen rate: by_rate only
  effect = zoology.coulomb_effect(rows, zoology.zoology_best(rows))
  e = effect['64/4/64']
  assert e['learning_rates'] == [1e-3, 1e-2] and e['seeds'] == [0, 1, 2]
  d = np.array([0.50 - 0.40, 0.60 - 0.40, 0.70 - 0.55])
  half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
  assert e['by_seed'] == pytest.approx({'0': d[0], '1': d[1], '2': d[2]})
  assert e['difference']['mean'] == pytest.approx(d.mean())
  assert e['difference']['std'] == pytest.approx(d.std(ddof=1))
  assert e['interval_95'] == pytest.approx([d.mean() - half, d.mean() + half])
  assert e['seed0_by_rate'] == pytest.approx({'0.001': 0.50 - 0.45, '0.01': 0.20 - 0.40})
  # by_rate: paired by seed at every rate both ran at two or more common seeds; here only
  # 1e-3 (seeds 0 and 1; at 1e-2 particles_softmax has seed 0 alone).
  at = e['by_rate']
  assert list(at) == ['0.001'] and at['0.001']['seeds'] == [0, 1]
  d_fixed = np.array([0.50 - 0.45, 0.60 - 0.99])
  half = stats.t.ppf(0.975, 1) * d_fixed.std(ddof=1) / np.sqrt(2)
  assert at['0.001']['difference']['mean'] == pytest.approx(d_fixed.mean())
  assert at['0.001']['interval_95'] == pytest.approx([d_fixed.mean() - half,
                                                      d_fixed.mean() + half])
  # The page shows it (a rate not both methods' choice), never a rate both chose.
  from experiments.recall import zoology_page  # pylint: disable=g-import-not-at-top
  line = zoology_page.coulomb_lines(effect)[-1]
  assert (f'paired by seed at 0.001: {d_fixed.mean():+.3f} (n = 2, '
          f'[{d_fixed.mean() - half:+.3f}, {d_fixed.mean() + half:+.3f}])') in line
  both = dict(e, learning_rates=[1e-3, 1e-3])
  assert 'paired by seed at' not in zoology_page.coulomb_lines({'64/4/64': both})[-1]
  # With η swept (the batched grid) only the runs at each method's chosen η are paired.
  swept = rows + [dict(r, particle_step_size=3e-3, valid_accuracy=0.0, accuracy=0.0)
                  for r in rows]
  assert zoology.coulomb_effect(swept, zoology.zoology_best(swept))['64/4/64'][
      'by_rate'] == at
  assert e['calibration']['force_ratio'] == [0.09, 0.1, 0.12]
  # One method alone in a cell: no entry; one seed: no interval.
  assert zoology.coulomb_effect(rows[:4], zoology.zoology_best(rows[:4])) == {}
  one = [r for r in rows if r['seed'] == 0]
  assert zoology.coulomb_effect(one, zoology.zoology_best(one))['64/4/64']['interval_95'] is None


@pytest.mark.slow
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
  # A new machine (an empty workdir) restores the runs the results file holds: none rerun.
  fresh = [c if not c.startswith('--workdir=') else f'--workdir={tmp_path / "new"}'
           for c in command]
  again = subprocess.run(fresh, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-2000:]
  assert '8 finished runs restored' in again.stdout and 'runs in' not in again.stdout
  assert results.read_text() == before


@pytest.mark.slow
def test_a_failing_program_is_recorded_and_the_worker_goes_on(tmp_path, monkeypatch):
  programs = batched.batched_programs(batched.BATCHED_GRIDS['tiny_batched'])
  real = batched.train_program

  def fail_the_first(config, specs, *args, **kwargs):
    if config.method == 'particles_softmax':
      raise ValueError('grad_repulsion: median particle gradient 0.0')
    return real(config, specs, *args, **kwargs)
  monkeypatch.setattr(batched, 'train_program', fail_the_first)
  lines = []
  config = mqar_config.get_config('zoology,quick')
  assert batched.run_programs(config, str(tmp_path), programs, lines.append) == 1
  failed = tmp_path / 'programs' / programs[0][0] / batched.FAILED_FILE
  assert 'median particle gradient 0.0' in json.loads(failed.read_text())['error']
  assert any('failed, not retried' in line for line in lines)
  # Not tried again in this folder.
  assert batched.run_programs(config, str(tmp_path), programs, lines.append) == 0


def test_a_batched_protocol_without_its_grid_is_refused():
  config = _config('softmax')
  with pytest.raises(ValueError, match=r'^zoology_protocol: a batched protocol needs its grid'):
    zoology.zoology_protocol(config, 'gpu', batched=True)


def test_the_langevin_methods_get_one_program_per_step_size():
  programs = batched.batched_programs()
  names = [name for name, _, _ in programs]
  assert 'particles_softmax-L128-P8-w64-eta3e-03' in names and 'hedgehog-L128-P8-w64' in names
  assert {len(specs) for _, _, specs in programs} == {12}
  assert len(programs) == 6 * (6 + 2 * 3)


def test_the_committed_zoology_block_is_the_committed_results_files(tmp_path):
  # docs/recall.md's mqar_zoology block regenerates from the committed JSON, byte for byte.
  from experiments import mqar  # pylint: disable=g-import-not-at-top
  from experiments.recall import zoology_page  # pylint: disable=g-import-not-at-top
  files = [os.path.join(ROOT, f) for f in mqar.ZOOLOGY_RESULTS
           if os.path.exists(os.path.join(ROOT, f))]
  page = tmp_path / 'recall.md'
  (tmp_path / 'figures').mkdir()
  zoology_page.write(files, str(page), str(tmp_path / 'figures' / os.path.basename(
      zoology_page.FIGURE)))
  # Both figures are drawn, the state-size one beside the rate one.
  assert (tmp_path / 'figures' / 'recall_zoology_accuracy_vs_state.png').stat().st_size > 0
  with open(os.path.join(ROOT, 'docs', 'recall.md'), encoding='utf-8') as f:
    committed = f.read()
  begin, end = zoology_page.page_lib.markers(zoology_page.BLOCK)
  block = lambda text: text[text.index(begin):text.index(end)]
  # The labels name the files by basename; the figure paths are relative to the page.
  assert block(page.read_text()) == block(committed)
  # A grid's results file with its pilots only (no run finished yet) adds nothing.
  pilots_only = tmp_path / 'mqar_zoology_pilots_only.json'
  with open(files[0], encoding='utf-8') as f:
    pilots_only.write_text(json.dumps(dict(json.load(f), runs=[], best={})))
  figure = tmp_path / 'figures' / os.path.basename(zoology_page.FIGURE)
  zoology_page.write(files + [str(pilots_only)], str(page), str(figure))
  assert block(page.read_text()) == block(committed)
  with pytest.raises(ValueError, match=r'^results_files: none of .* holds a finished run'):
    zoology_page.write([str(pilots_only)], str(page), str(figure))


def test_runs_that_kept_a_validation_curve_get_a_third_figure(tmp_path):
  from experiments.recall import zoology_page  # pylint: disable=g-import-not-at-top
  def run_row(method, seed, curve=True, seq_len=64):
    row = dict(_row(1e-3, 3e-3, seed, 0.5, 0.4), method=method, seq_len=seq_len,
               num_pairs=seq_len // 16, state_size=4096, learning_rate=1e-3, steps_run=500,
               commit='abc', machine={})
    if curve:
      row['valid_curve'] = {'step': [250, 500], 'accuracy': [0.2, 0.3], 'loss': [5.0, 4.0]}
    return row
  rows = [run_row('particles_softmax', 0), run_row('particles_flow', 0),
          run_row('particles_flow', 1, curve=False), run_row('elu', 0, seq_len=128)]
  protocol = {'vocab': 8192, 'train_examples': 100, 'steps': 500, 'batch': 4,
              'schedule': 'cosine', 'early_stop': 0.99, 'learning_rates': [1e-3],
              'where': 'cpu'}
  table = zoology.zoology_file(rows, [], protocol)
  panels = zoology_page.curve_panels([('a', table), ('b', dict(table, runs=rows[2:3]))])
  # Per file and cell, only the runs with a curve; a file with none has no panel.
  assert [(label, cell, sorted(r['method'] for r in got)) for label, cell, got in panels] == [
      ('a', (64, 4, 64), ['particles_flow', 'particles_softmax']),
      ('a', (128, 8, 64), ['elu'])]
  path = tmp_path / 'figures' / 'recall_zoology_accuracy_vs_rate.png'
  assert zoology_page.curve_figure_path(str(path)).endswith('recall_zoology_accuracy_vs_step.png')
  assert zoology_page.curve_figure_path('f/recall.png') == 'f/recall_step.png'
  assert zoology_page.state_figure_path('f/recall.png') == 'f/recall_state.png'
  (tmp_path / 'figures').mkdir()
  files = []
  for name, runs in (('with.json', rows), ('without.json', rows[2:3])):
    files.append(str(tmp_path / name))
    with open(files[-1], 'w') as f:
      json.dump(zoology.zoology_file(runs, [], protocol), f)
  for chosen, drawn in ((files, True), (files[1:], False)):
    page = tmp_path / 'recall.md'
    begin, end = zoology_page.page_lib.markers(zoology_page.BLOCK)
    page.write_text(f'{begin}\n{end}\n')
    curve_png = tmp_path / 'figures' / 'recall_zoology_accuracy_vs_step.png'
    if curve_png.exists():
      curve_png.unlink()
    zoology_page.write(chosen, str(page), str(path))
    assert curve_png.exists() == drawn
    assert ('](figures/recall_zoology_accuracy_vs_step.png)' in page.read_text()) == drawn


@pytest.mark.slow
@pytest.mark.parametrize('grid', ['', 'zoology', 'zoology_long'])
def test_a_bad_page_or_figure_changes_no_file(tmp_path, grid):
  # Issue 39 item 1: the committed figure and page are untouched by a failing command.
  committed = [os.path.join(ROOT, 'docs', 'figures', 'recall_accuracy_vs_length.png'),
               os.path.join(ROOT, 'docs', 'figures', 'recall_zoology_accuracy_vs_rate.png'),
               os.path.join(ROOT, 'docs', 'recall.md')]
  before = [open(p, 'rb').read() for p in committed]
  command = [sys.executable, '-m', 'experiments.mqar', '--collect_only',
             f'--workdir={tmp_path / "work"}', f'--results={tmp_path / "r.json"}',
             f'--page={tmp_path / "missing" / "page.md"}']
  if grid:
    command += ['--config=configs/mqar.py:zoology', f'--grid={grid}',
                f'--runs_dir={tmp_path / "runs"}']
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode != 0
  assert 'does not exist; nothing was written' in done.stderr.strip().splitlines()[-1]
  assert [open(p, 'rb').read() for p in committed] == before
  assert not os.path.exists(tmp_path / 'r.json')


def test_the_coulomb_figure_shows_each_seeds_paired_difference_and_the_interval(tmp_path):
  # From the committed (128, 8) file at 4x the steps: one point per seed, the difference of
  # the pair's test accuracies at their chosen rate; their mean is the effect's mean.
  from experiments.recall import zoology_page  # pylint: disable=g-import-not-at-top
  with open(os.path.join(ROOT, 'results', 'mqar_zoology_long_l128.json')) as f:
    table = json.load(f)
  points = zoology_page.coulomb_points([('cpu, 12000 steps (l128.json)', table)])
  assert [(label, cell) for label, cell, _, _ in points] == [
      ('cpu, 12000 steps (l128.json)', (128, 8, 64))]
  _, _, diffs, effect = points[0]
  accuracy = {(r['method'], r['seed']): r['accuracy'] for r in table['runs']}
  assert sorted(diffs) == effect['seeds'] and len(diffs) >= 3
  for seed, d in diffs.items():
    assert d == accuracy[('particles_softmax', seed)] - accuracy[('particles_flow', seed)]
  assert np.mean(list(diffs.values())) == pytest.approx(effect['difference']['mean'])
  # A file without the pair (the GPU grid's) adds no point; the figure is drawn beside the
  # rate figure.
  assert zoology_page.coulomb_points([('gpu', dict(table, coulomb_effect={}))]) == []
  path = zoology_page.coulomb_figure(points, zoology_page.coulomb_figure_path(
      str(tmp_path / 'recall_zoology_accuracy_vs_rate.png')))
  assert path.endswith('recall_zoology_coulomb_pair.png') and os.path.getsize(path) > 0
  assert zoology_page.coulomb_figure_path('f/recall.png') == 'f/recall_coulomb_pair.png'
