"""The recall command's parts (experiments/recall) on configs/mqar.py:quick: run, resume, grid."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

from configs import mqar as mqar_config
from experiments import mqar as mqar_cmd
from experiments.common import cli
from experiments.recall import grid
from experiments.recall import methods
from experiments.recall import run
from experiments.recall import zoology

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quick(method='softmax'):
  return mqar_config.get_config(f'quick,{method}')


@pytest.mark.parametrize('method', methods.METHODS)
def test_every_method_builds_with_n_features(method):
  from coulomb_jax import features  # pylint: disable=g-import-not-at-top
  config = quick(method)
  n = config.model.num_features
  built = methods.build(config, jax.random.key_data(jax.random.key(0)))
  if method == 'softmax':
    assert built.model.attention == 'softmax'
  else:
    rows = built.model.num_features
    assert rows == methods.rows_per_head(method, n)
    f = features.num_features(methods.FEATURE_MAP[method], rows)
    assert f <= n and (method == 'taylor' or f == n)          # equal state size
    assert built.model.identity_init == (method in ('hedgehog', 'hedgehog_distilled',
                                                    'hedgehog_mimicry'))
  uses_force = method in ('particles_softmax', 'particles_flow', 'hedgehog_distilled',
                          'favor_mimicry', 'hedgehog_mimicry')
  assert (built.mimicry is not None) == uses_force


def test_taylor_dim_and_state_sizes():
  assert [methods.taylor_dim(n) for n in (3, 7, 57, 64, 72, 73)] == [1, 2, 7, 7, 7, 8]
  # H·F·D_h per layer: N = 64 features, width 64, 2 heads (D_h = 32).
  assert methods.state_size('elu', 64, 64, 2, 128) == 2 * 64 * 32
  assert methods.state_size('hedgehog', 64, 64, 2, 128) == 2 * 64 * 32
  assert methods.state_size('taylor', 64, 64, 2, 128) == 2 * 57 * 32
  assert methods.state_size('softmax', 64, 64, 2, 128) == 2 * 128 * 64


def test_every_method_has_a_colour_of_its_own_in_the_figures():
  import matplotlib.colors  # pylint: disable=g-import-not-at-top
  from experiments.recall import page  # pylint: disable=g-import-not-at-top
  colors = [matplotlib.colors.to_hex(page.method_color(m)) for m in methods.METHODS]
  assert len(set(colors)) == len(methods.METHODS)
  assert page.method_color('softmax') == 'C0' and page.method_color('unknown') == 'grey'


@pytest.mark.slow
def test_a_run_writes_its_row_and_resumes_from_its_checkpoint(tmp_path):
  workdir = str(tmp_path / 'run')
  config = quick('particles_softmax')
  row = run.train_and_evaluate(config, workdir, log=lambda *_: None)
  for field in grid.BINDING:
    assert field in row
  assert row['method'] == 'particles_softmax' and row['num_features'] == 8
  assert 0.0 <= row['accuracy'] <= 1.0 and row['num_train'] == 4 * 4
  div = row['diversity']
  assert set(div['initial']) == set(div['final']) == {'block_0'}
  assert 1.0 <= div['final']['block_0']['effective_rank'] <= 8.0   # ≤ min(M, D_h) = 8
  assert div['final'] == run.checkpoint_diversity(workdir)
  # A finished run is not trained again; one killed after its last checkpoint resumes there.
  logs = []
  assert run.train_and_evaluate(config, workdir, log=logs.append) == row and not logs
  os.remove(os.path.join(workdir, run.RESULT_FILE))
  again = run.train_and_evaluate(config, workdir, log=logs.append)
  assert any('resumed at step 4 of 4' in line for line in logs)
  assert again['accuracy'] == row['accuracy'] and again['loss'] == pytest.approx(row['loss'])


@pytest.mark.slow
def test_the_validation_curve_is_kept_across_a_resume(tmp_path):
  # With early stopping on, the validation batch at every eval_every steps: the curve of a
  # run killed after step 2 and resumed equals the uninterrupted run's, and its last point
  # is the row's validation accuracy.
  config = grid.apply_overrides(quick('elu'), {'train.early_stop': 1.0, 'train.steps': 6})
  whole = run.train_and_evaluate(config, str(tmp_path / 'whole'), log=lambda *_: None)
  curve = whole['valid_curve']
  assert curve['step'] == [2, 4, 6] and len(curve['accuracy']) == len(curve['loss']) == 3
  assert curve['accuracy'][-1] == pytest.approx(whole['valid_accuracy'])
  assert curve['loss'][-1] == pytest.approx(whole['valid_loss'])
  cut = str(tmp_path / 'cut')
  first = {'command': 'c', 'commit': 'aaa', 'date': 'd', 'machine': {}}
  run.train_and_evaluate(grid.apply_overrides(config, {'train.steps': 2}), cut + '_2',
                         log=lambda *_: None, metadata=first)
  os.makedirs(cut)
  shutil.copy(os.path.join(cut + '_2', run.CHECKPOINT_FILE), cut)
  logs = []
  resumed = run.train_and_evaluate(config, cut, log=logs.append,
                                   metadata=dict(first, commit='bbb'))
  assert any('resumed at step 2 of 6' in line for line in logs)
  assert resumed['valid_curve']['step'] == curve['step']
  assert resumed['valid_curve']['accuracy'] == pytest.approx(curve['accuracy'])
  # Each stretch of training names the commit that ran it and the step it began at; the
  # row's commit is the last one's. A run trained in one go has one stretch.
  assert [(s['commit'], s['from_step']) for s in resumed['segments']] == [('aaa', 0),
                                                                           ('bbb', 2)]
  assert resumed['commit'] == 'bbb' and all('T' in s['date'] for s in resumed['segments'])
  assert [s['from_step'] for s in whole['segments']] == [0]
  # A checkpoint written before segments were kept: they start at the resume.
  path = os.path.join(cut + '_2', run.CHECKPOINT_FILE)
  with open(path, 'rb') as f:
    blob = serialization.msgpack_restore(f.read())
  del blob['segments']
  with open(path, 'wb') as f:
    f.write(serialization.msgpack_serialize(blob))
  os.remove(os.path.join(cut + '_2', run.RESULT_FILE))
  old = run.train_and_evaluate(grid.apply_overrides(config, {'train.steps': 2}), cut + '_2',
                               log=lambda *_: None, metadata=dict(first, commit='ccc'))
  assert [(s['commit'], s['from_step']) for s in old['segments']] == [('ccc', 2)]
  # Without early stopping no validation batch is evaluated during training: no curve.
  assert 'valid_curve' not in run.train_and_evaluate(quick('elu'), str(tmp_path / 'plain'),
                                                     log=lambda *_: None)


@pytest.mark.slow
def test_a_workdir_of_another_config_is_refused(tmp_path):
  workdir = str(tmp_path / 'run')
  run.train_and_evaluate(quick(), workdir, log=lambda *_: None)
  with pytest.raises(cli.ConfigError, match='another config'):
    run.train_and_evaluate(quick('elu'), workdir)
  # A run saved before a field was added (run.ADDED_FIELDS) is that field's old value's
  # run: it is read back, and refused under another value.
  path = os.path.join(workdir, run.CONFIG_FILE)
  with open(path) as f:
    saved = json.load(f)
  del saved['particles']['schedule']
  with open(path, 'w') as f:
    json.dump(saved, f)
  assert run.train_and_evaluate(quick(), workdir, log=lambda *_: None)['method'] == (
      quick().method)
  with pytest.raises(cli.ConfigError, match='another config'):
    run.train_and_evaluate(grid.apply_overrides(quick(), {'particles.schedule': 'cosine'}),
                           workdir)


def test_a_cosine_particle_schedule_anneals_the_langevin_step():
  # particles.schedule = 'cosine': the particles' transform at count t moves by
  # η·½(1 + cos(πt/T)), T = train.steps; 'constant' by η at every count.
  config = grid.apply_overrides(quick('particles_flow'), {'train.steps': 4})
  params = {'w': jnp.zeros((3, 2))}     # at 0 the update is exactly the move
  grads = {'w': jnp.full((3, 2), 0.1)}
  moved = {}
  for schedule in ('constant', 'cosine'):
    tx = methods.build(grid.apply_overrides(config, {'particles.schedule': schedule}),
                       jax.random.key_data(jax.random.key(0))).particle_tx
    state = tx.init(params)
    steps = []
    for _ in range(3):
      updates, state = tx.update(grads, state, params)
      steps.append(float(updates['w'][0, 0]))
    moved[schedule] = np.array(steps)
  np.testing.assert_allclose(moved['cosine'] / moved['constant'],
                             [1.0, 0.5 * (1 + np.cos(np.pi / 4)), 0.5], rtol=1e-5)


@pytest.mark.parametrize('field,value,match', [
    ('method', 'lstm', 'config.method'),
    ('model.num_features', 7, 'num_features must be even'),
    ('data.num_pairs', 9, 'num_pairs'),
    ('train.steps', 0, 'config.train.steps'),
    ('particles.target', 'mse', 'config.particles.target'),
    ('particles.beta', -1.0, 'config.particles.beta'),
    ('particles.schedule', 'linear', 'config.particles.schedule'),
])
def test_bad_config_fields_are_one_line_errors(field, value, match):
  config = quick('hedgehog')
  config = grid.apply_overrides(config, {field: value})
  with pytest.raises(cli.ConfigError, match=match):
    run.check_config(config)


@pytest.mark.slow
def test_the_grid_resumes_and_its_results_file_never_loses_a_run(tmp_path):
  root, results = str(tmp_path / 'grid'), str(tmp_path / 'mqar.json')
  log = lambda *_: None
  base = quick()
  assert mqar_cmd.run_grid(base, 'tiny', root, results, log) == 2
  with open(results) as f:
    table = json.load(f)
  assert table['vocab'] == 32 and table['num_train'] == 16
  assert [r['method'] for r in table['runs']] == ['softmax', 'elu']
  assert mqar_cmd.run_grid(base, 'tiny', root, results, log) == 0
  # A run the workdir lost (or a new checkout's empty workdir) stays in the results file.
  os.remove(os.path.join(root, grid.run_name('elu', 16, 2, 16, 0), run.RESULT_FILE))
  assert mqar_cmd.write_results(root, results, log) == 2
  with open(results) as f:
    assert json.load(f) == table
  assert mqar_cmd.write_results(str(tmp_path / 'empty'), results, log) == 2


def test_plan_is_cheapest_first_and_complete():
  names = [name for name, _ in grid.plan('main')]
  assert len(names) == len(set(names)) == 3 * 2 * 5 * 2
  assert names[0] == 'softmax-L64-P4-w64-seed0' and names[4].startswith('particles_softmax-L64')
  with pytest.raises(ValueError, match='--grid'):
    grid.plan('huge')


def test_a_grid_with_its_own_overrides_sets_them_on_every_run():
  runs = grid.plan('long')
  assert [name.split('-')[0] for name, _ in runs] == [
      'particles_softmax', 'softmaxfeat_trained', 'elu', 'favor_orthogonal'] * 6
  assert [name.split('-', 2)[1] + name[-1] for name, _ in runs[::4]] == [
      'L640', 'L641', 'L1280', 'L1281', 'L2560', 'L2561']   # length-major: both seeds per length
  for _, overrides in runs:
    config = grid.apply_overrides(mqar_config.get_config(), overrides)
    assert config.train.steps == 6000 and config.particles.step_size == 3e-3
    assert (config.data.seq_len, config.data.num_pairs) in ((64, 4), (128, 8), (256, 16))
    run.check_config(config)


@pytest.mark.slow
def test_the_page_keeps_its_text_and_redraws_its_table(tmp_path):
  from experiments.recall import page  # pylint: disable=g-import-not-at-top
  root, results = str(tmp_path / 'grid'), str(tmp_path / 'mqar.json')
  mqar_cmd.run_grid(quick(), 'tiny', root, results, lambda *_: None)
  doc, fig = str(tmp_path / 'recall.md'), str(tmp_path / 'figures' / 'recall.png')
  with open(doc, 'w') as f:
    f.write('# Recall\n\nThe answer in words.\n')
  for _ in range(2):                                   # the second call replaces, not appends
    page.write_page(results, doc, fig)
  with open(doc) as f:
    text = f.read()
  assert text.startswith('# Recall\n\nThe answer in words.\n')
  assert text.count(page.BEGIN) == 1 and text.count('| 16 | 2 | 16 | elu |') == 1
  assert os.path.getsize(fig) > 1000
  page.write_page(results, doc, fig, block='mqar_long')   # a second grid's own block
  with open(doc) as f:
    text = f.read()
  begin, end = page.markers('mqar_long')
  assert text.count(page.BEGIN) == text.count(begin) == text.count(end) == 1
  assert text.count('| 16 | 2 | 16 | elu |') == 2
  with pytest.raises(ValueError, match='--block'):
    page.markers('a -->')


@pytest.mark.slow
def test_conversion_copies_the_teacher_and_fits_only_the_features(tmp_path):
  from studies.mqar_convert import convert  # pylint: disable=g-import-not-at-top
  teacher_dir = str(tmp_path / 'softmax-L16-P2-w16-seed0')
  run.train_and_evaluate(quick(), teacher_dir, lambda *_: None)
  config, teacher, _ = convert.read_teacher(teacher_dir)
  student = methods.build(grid.apply_overrides(config, {'method': 'particles_softmax'}),
                          jax.random.key_data(jax.random.key(0))).model
  from coulomb_jax import training  # pylint: disable=g-import-not-at-top
  init = jax.device_get(training.lm.make_state(jax.random.key(0), student, 16).params)
  params = convert.student_params(teacher, init)
  np.testing.assert_array_equal(params['block_0']['attn']['query']['kernel'],
                                teacher['block_0']['attn']['mha']['query']['kernel'])
  np.testing.assert_array_equal(params['head']['kernel'], teacher['head']['kernel'])
  np.testing.assert_array_equal(params['block_0']['attn']['particles'],
                                init['block_0']['attn']['particles'])
  rows = {m: convert.convert(teacher_dir, m, str(tmp_path / m), fit_steps=2, finetune_steps=2,
                             log=lambda *_: None, metadata={'command': 'c', 'commit': 'x'})
          for m in ('favor_orthogonal', 'particles_softmax', 'softmaxfeat_trained')}
  teacher_acc = json.load(open(os.path.join(teacher_dir, run.RESULT_FILE)))['accuracy']
  for m, r in rows.items():
    assert r['teacher_accuracy'] == pytest.approx(teacher_acc)    # the same evaluation batch
    assert 0.0 <= r['zero_shot_accuracy'] <= 1.0 and 0.0 <= r['finetuned_accuracy'] <= 1.0
    assert r['fit_steps'] == (0 if m == 'favor_orthogonal' else 2)
  with pytest.raises(cli.ConfigError, match=r"^--teacher: .* is a 'elu' run"):
    elu_dir = str(tmp_path / 'elu')
    run.train_and_evaluate(quick('elu'), elu_dir, lambda *_: None)
    convert.read_teacher(elu_dir)
  with pytest.raises(cli.ConfigError, match=r"^--method must be one of"):
    convert.convert(teacher_dir, 'softmax', str(tmp_path / 'x'), 1, 1)


@pytest.mark.slow
def test_the_zoology_grid_runs_pilots_sweep_seeds_and_writes_the_binding_file(tmp_path):
  tiny = dict(zoology.ZOOLOGY, sweep_cells=((16, 2),), long_cell=(24, 3), width=16,
              learning_rates=(1e-3, 1e-2), methods=('particles_flow', 'taylor'),
              seeds=(0, 1), pilot_step_sizes=(1e-3, 1e-2), pilot_steps=2)
  config = mqar_config.get_config('zoology,quick')
  config.data.seq_len = 24
  root, results, runs_dir = (str(tmp_path / n) for n in ('grid', 'z.json', 'runs'))
  planned, waiting = zoology.zoology_plan(root, tiny)
  assert [n for n, _ in planned][:2] == ['pilot/particles_softmax-L16-P2-w16-eta1e-03',
                                         'pilot/particles_softmax-L16-P2-w16-eta1e-02']
  assert waiting > 0                      # the sweep of particles_flow waits on the pilots
  made = mqar_cmd.run_zoology(config, root, results, runs_dir, log=lambda *_: None,
                              poll_seconds=0.0, grid=tiny)
  # 2 pilots, 2 methods × 2 rates, the long cell at seed 0 and 1, seed 1 of the sweep cell.
  assert made == 2 + 4 + 2 + 2 + 2
  with open(results) as f:
    table = json.load(f)
  assert set(table) == {'protocol', 'runs', 'best', 'coulomb_effect', 'pilots'}
  assert table['coulomb_effect'] == {}       # particles_softmax is not in this grid's sweep
  assert table['protocol']['vocab'] == config.data.vocab_size
  assert table['protocol']['where'] == 'cpu'
  for r in table['runs']:
    for field in zoology.RUN_FIELDS:
      assert field in r
  assert len(table['runs']) == 10 and len(table['pilots']) == 2
  assert len(os.listdir(runs_dir)) == 12
  best = table['best']['16/2/16/particles_flow']
  seed0 = [r for r in table['runs'] if r['method'] == 'particles_flow' and r['seq_len'] == 16
           and r['seed'] == 0]
  assert best['learning_rate'] == max(seed0, key=zoology.selection_key)['learning_rate']
  assert best['accuracy']['n'] == 2 and best['rates_tried'] == 2
  chosen_eta = max(table['pilots'], key=zoology.selection_key)['particle_step_size']
  assert all(r['particle_step_size'] == chosen_eta for r in table['runs']
             if r['method'] == 'particles_flow')
  # A rerun makes nothing; an empty workdir keeps the committed rows.
  assert mqar_cmd.run_zoology(config, root, results, runs_dir, log=lambda *_: None,
                              poll_seconds=0.0, grid=tiny) == 0
  assert mqar_cmd.write_zoology(config, str(tmp_path / 'empty'), results, runs_dir,
                                log=lambda *_: None, grid=tiny) == 10
  # A new machine: the run folders are gone, the committed file restores them.
  assert mqar_cmd.run_zoology(config, str(tmp_path / 'new'), results, runs_dir,
                              log=lambda *_: None, poll_seconds=0.0, grid=tiny) == 0


def _finished(root, name, valid_accuracy):
  """A grid run ``name`` under ``root`` with the result a plan reads (validation only)."""
  (root / name).mkdir(parents=True)
  (root / name / 'result.json').write_text(json.dumps({'valid_accuracy': valid_accuracy,
                                                       'valid_loss': 1.0}))


def test_the_coulomb_pairs_later_seeds_run_first_once_both_sweeps_of_a_cell_are_done(tmp_path):
  # The paired interval particles_softmax − particles_flow needs seeds 1 and 2 of both; they
  # come right after the pilots, before the other methods' sweeps.
  tiny = dict(zoology.ZOOLOGY, sweep_cells=((16, 2), (24, 3)), long_cell=(32, 4), width=16,
              learning_rates=(1e-3, 1e-2),
              methods=('particles_softmax', 'particles_flow', 'taylor'), seeds=(0, 1, 2),
              pilot_step_sizes=(1e-3,), pilot_steps=2)
  root = tmp_path / 'grid'

  done = lambda name, valid: _finished(root, name, valid)
  for cell in ('L16-P2', 'L24-P3'):
    done(f'pilot/particles_softmax-{cell}-w16-eta1e-03', 0.5)
  for method in ('particles_softmax', 'particles_flow'):       # only (16, 2) swept
    done(f'{method}-L16-P2-w16-lr1.0e-03-seed0', 0.2)
    done(f'{method}-L16-P2-w16-lr1.0e-02-seed0', 0.3 if method == 'particles_flow' else 0.1)
  names = [n for n, _ in zoology.zoology_plan(str(root), tiny)[0]]
  assert names[:6] == ['pilot/particles_softmax-L16-P2-w16-eta1e-03',
                       'pilot/particles_softmax-L24-P3-w16-eta1e-03',
                       'particles_softmax-L16-P2-w16-lr1.0e-03-seed1',
                       'particles_flow-L16-P2-w16-lr1.0e-02-seed1',
                       'particles_softmax-L16-P2-w16-lr1.0e-03-seed2',
                       'particles_flow-L16-P2-w16-lr1.0e-02-seed2']
  # The rest keeps its order: the sweeps, then the long cell, then the other seeds.
  assert names[6] == 'particles_softmax-L16-P2-w16-lr1.0e-03-seed0'
  assert len(names) == len(set(names))


def test_a_deferred_methods_sweep_runs_go_last_and_its_long_cell_does_not(tmp_path):
  # 'deferred' (the methods the GPU grid ran at both sweep cells): their sweep-cell runs go
  # after every other run, in the same order; their long-cell runs keep their place.
  tiny = dict(zoology.ZOOLOGY, sweep_cells=((16, 2),), long_cell=(24, 3), width=16,
              learning_rates=(1e-3, 1e-2), methods=('taylor', 'elu', 'hedgehog_distilled'),
              seeds=(0, 1), pilot_step_sizes=(1e-3,), pilot_steps=2, deferred=('taylor', 'elu'))
  root = tmp_path / 'grid'
  for lr in ('1.0e-03', '1.0e-02'):                 # taylor's sweep is done: its long cell runs
    (root / f'taylor-L16-P2-w16-lr{lr}-seed0').mkdir(parents=True)
    (root / f'taylor-L16-P2-w16-lr{lr}-seed0' / 'result.json').write_text(
        json.dumps({'valid_accuracy': 0.3 if lr == '1.0e-02' else 0.2, 'valid_loss': 1.0}))
  names = [n for n, _ in zoology.zoology_plan(str(root), tiny)[0]]
  undeferred = [n for n, _ in zoology.zoology_plan(str(root), dict(tiny, deferred=()))[0]]
  assert sorted(names) == sorted(undeferred)
  last = [n for n in undeferred if n.split('-')[0] in ('taylor', 'elu') and '-L16-' in n]
  assert names[-len(last):] == last and len(last) == 2 + 2 + 1     # 2 sweeps + taylor's seed 1
  assert names[:-len(last)] == [n for n in undeferred if n not in last]
  assert names.index('taylor-L24-P3-w16-lr1.0e-02-seed0') < len(names) - len(last)


def test_the_long_cpu_grid_is_one_cell_two_rates_seed_zero_at_four_times_the_steps(tmp_path):
  long_grid, overrides, results = zoology.ZOOLOGY_GRIDS['zoology_long']
  assert overrides == {'train.steps': 4 * mqar_config.get_config('zoology').train.steps}
  assert results == 'results/mqar_zoology_long.json'
  planned, waiting = zoology.zoology_plan(str(tmp_path), long_grid)
  pilots = ['pilot/particles_softmax-L64-P4-w64-eta1e-03',
            'pilot/particles_softmax-L64-P4-w64-eta3e-03',
            'pilot/particles_softmax-L64-P4-w64-eta1e-02']
  # waiting on the pilots: the Langevin pair's two rates and its two fixed-rate seeds; on
  # their own seed-0 runs, seeds 1 and 2 of each extra_seeds method (the ladder's two
  # middle steps, then the four maps run at seed 0 alone; the list is pinned below)
  extra = long_grid['extra_seeds']['methods']
  assert [n for n, _ in planned][:3] == pilots and waiting == 2 * 2 + 2 * 2 + 2 * len(extra)
  for name in pilots:                         # every pilot done: η = 3e-3 chosen
    _finished(tmp_path, name, 0.3 if 'eta3e-03' in name else 0.2)
  planned, waiting = zoology.zoology_plan(str(tmp_path), long_grid)
  runs = [o for n, o in planned if not n.startswith('pilot/')]
  # The pair's seeds 1 and 2 at the fixed rate wait on both seed-0 runs there, and so do
  # the extra seeds of each extra_seeds method on its own seed-0 run.
  assert waiting == 2 * 2 + 2 * len(extra) and len(runs) == len(long_grid['methods']) * 2
  assert {(o['data.seq_len'], o['data.num_pairs'], o['seed']) for o in runs} == {(64, 4, 0)}
  assert {o['train.learning_rate'] for o in runs} == {2.154e-3, 1e-2}
  # rates_first: every method at 2.15e-3, in the grid's method order, before any at 1e-2.
  assert [(o['method'], o['train.learning_rate']) for o in runs] == (
      [(m, 2.154e-3) for m in long_grid['methods']] + [(m, 1e-2) for m in long_grid['methods']])
  assert {o.get('particles.step_size') for o in runs
          if o['method'].startswith('particles')} == {3e-3}
  # The two methods between particles_flow and hedgehog_distilled, at 2.15e-3 before 1e-2.
  assert long_grid['methods'][-2:] == ('favor_mimicry', 'hedgehog_mimicry')
  protocol = zoology.zoology_protocol(grid.apply_overrides(mqar_config.get_config('zoology'),
                                                        overrides), 'cpu', grid=long_grid)
  assert protocol['steps'] == 12000 and protocol['learning_rates'] == [2.154e-3, 1e-2]
  assert protocol['coulomb_seeds'] == {'seeds': [1, 2], 'learning_rate': 2.154e-3}
  assert protocol['extra_seeds'] == {
      'methods': ['favor_mimicry', 'hedgehog_mimicry', 'hedgehog_distilled', 'taylor',
                  'hedgehog', 'elu'], 'seeds': [1, 2], 'learning_rate': 2.154e-3}
  # Both seed-0 runs of the pair at 2.15e-3 done: seeds 1 and 2 of the pair there, at the
  # pilot's η, right after the pilots, each run planned once.
  for method in zoology.COULOMB_PAIR:
    name = zoology.zoology_name(method, 64, 4, 64, 2.154e-3, 0)
    _finished(tmp_path, name, 0.5)
  planned, waiting = zoology.zoology_plan(str(tmp_path), long_grid)
  names = [n for n, _ in planned]
  assert waiting == 2 * len(extra) and len(names) == len(set(names)) == 3 + 4 + len(runs)
  assert names[3:7] == [zoology.zoology_name(m, 64, 4, 64, 2.154e-3, s)
                        for s in (1, 2) for m in zoology.COULOMB_PAIR]
  fixed = [o for _, o in planned[3:7]]
  assert {(o['train.learning_rate'], o['particles.step_size']) for o in fixed} == {
      (2.154e-3, 3e-3)}
  # favor_mimicry's seed 0 done (hedgehog_mimicry's not): its seeds 1 and 2 at 2.15e-3 go
  # right after the pair's, ahead of every run at 1e-2; hedgehog_mimicry's still wait.
  _finished(tmp_path, zoology.zoology_name('favor_mimicry', 64, 4, 64, 2.154e-3, 0), 0.8)
  planned, waiting = zoology.zoology_plan(str(tmp_path), long_grid)
  assert waiting == 2 * (len(extra) - 1) and [n for n, _ in planned][7:9] == [
      zoology.zoology_name('favor_mimicry', 64, 4, 64, 2.154e-3, s) for s in (1, 2)]
  assert [(o['method'], o['seed'], o['train.learning_rate']) for _, o in planned[7:9]] == [
      ('favor_mimicry', s, 2.154e-3) for s in (1, 2)]
  assert 'particles.step_size' not in planned[7][1]
  # elu's seed 0 done too: its seeds follow favor_mimicry's, in extra_seeds' method order.
  assert extra[-1] == 'elu'
  _finished(tmp_path, zoology.zoology_name('elu', 64, 4, 64, 2.154e-3, 0), 0.2)
  planned, waiting = zoology.zoology_plan(str(tmp_path), long_grid)
  assert waiting == 2 * (len(extra) - 2) and [n for n, _ in planned][7:11] == [
      zoology.zoology_name(m, 64, 4, 64, 2.154e-3, s)
      for m in ('favor_mimicry', 'elu') for s in (1, 2)]
  for bad, match in (({'learning_rate': 3e-3}, r'^extra_seeds learning_rate 0\.003 is not'),
                     ({'methods': ('softmax',)}, r"^extra_seeds methods \['softmax'\] are not")):
    with pytest.raises(ValueError, match=match):
      zoology.zoology_plan(str(tmp_path), dict(
          long_grid, extra_seeds=dict(long_grid['extra_seeds'], **bad)))
  # A run due twice (a seed of the fixed rate that is also a best rate's seed) is listed once.
  again = dict(long_grid, seeds=(0, 1, 2))
  for method in zoology.COULOMB_PAIR:
    name = zoology.zoology_name(method, 64, 4, 64, 1e-2, 0)
    _finished(tmp_path, name, 0.1)
  names = [n for n, _ in zoology.zoology_plan(str(tmp_path), again)[0]]
  assert len(names) == len(set(names))
  with pytest.raises(ValueError, match=r'^coulomb_rate 0\.003 is not one of'):
    zoology.zoology_plan(str(tmp_path), dict(long_grid, coulomb_rate=3e-3))
  assert names[3:7] == [zoology.zoology_name(m, 64, 4, 64, 2.154e-3, s)
                        for s in (1, 2) for m in zoology.COULOMB_PAIR]


def test_a_grid_refuses_runs_and_results_of_another_budget_before_any_write(tmp_path):
  # zoology and zoology_long give one (64, 4) run one name: a folder or results file of
  # 3,000-step runs is never taken as the long grid's (nor the other way round).
  long_grid, overrides, _ = zoology.ZOOLOGY_GRIDS['zoology_long']
  config = grid.apply_overrides(mqar_config.get_config('zoology'), overrides)
  row = {'seq_len': 64, 'num_pairs': 4, 'width': 64, 'method': 'taylor', 'seed': 0,
         'learning_rate': 2.154e-3, 'steps': 3000, 'valid_accuracy': 0.2, 'valid_loss': 1.0}
  root = tmp_path / 'grid'
  (root / zoology.zoology_row_name(row)).mkdir(parents=True)
  (root / zoology.zoology_row_name(row) / 'result.json').write_text(json.dumps(row))
  results, runs_dir = tmp_path / 'long.json', tmp_path / 'runs'
  with pytest.raises(cli.ConfigError, match=r'^--workdir: .*taylor-L64-P4-w64-lr2\.2e-03-seed0 '
                                            r'trained for 3000 steps, this grid runs 12000'):
    mqar_cmd.run_zoology(config, str(root), str(results), str(runs_dir), log=lambda *_: None,
                         grid=long_grid)
  assert not results.exists() and not runs_dir.exists()
  results.write_text(json.dumps({'protocol': {}, 'runs': [row], 'pilots': []}))
  with pytest.raises(cli.ConfigError, match=r'^--results: .*trained for 3000 steps'):
    mqar_cmd.run_zoology(config, str(tmp_path / 'empty'), str(results), str(runs_dir),
                         log=lambda *_: None, grid=long_grid)
  assert not (tmp_path / 'empty').exists() and not runs_dir.exists()


def test_the_annealed_grid_is_the_coulomb_pair_at_one_rate_with_a_cosine_step(tmp_path):
  annealed, overrides, results = zoology.ZOOLOGY_GRIDS['zoology_long_annealed']
  assert overrides == {'train.steps': 12000, 'particles.schedule': 'cosine'}
  assert results == 'results/mqar_zoology_long_annealed.json'
  for name in [n for n, _ in zoology.zoology_plan(str(tmp_path), annealed)[0]]:
    _finished(tmp_path, name, 0.3 if 'eta3e-03' in name else 0.2)  # η = 3e-3 chosen
  planned, waiting = zoology.zoology_plan(str(tmp_path), annealed)
  runs = [(o['method'], o['train.learning_rate'], o['seed'], o['particles.step_size'])
          for n, o in planned if not n.startswith('pilot/')]
  assert runs == [(m, 2.154e-3, 0, 3e-3) for m in zoology.COULOMB_PAIR] and waiting == 4
  config = grid.apply_overrides(mqar_config.get_config('zoology'), overrides)
  protocol = zoology.zoology_protocol(config, 'cpu', grid=annealed)
  assert protocol['particles']['schedule'] == 'cosine'
  assert protocol['coulomb_seeds'] == {'seeds': [1, 2], 'learning_rate': 2.154e-3}
  from experiments.recall import zoology_page  # pylint: disable=g-import-not-at-top
  line = zoology_page.table_lines([('x', {'protocol': protocol, 'runs': [], 'best': {}})])[0]
  assert line.endswith("the particles' Langevin step η follows a cosine schedule too.")


@pytest.mark.parametrize('name,step_size,schedule', [
    ('zoology_long_eta1e-2', 1e-2, 'constant'), ('zoology_long_annealed_eta3e-3', 3e-3, 'cosine')])
def test_the_fixed_eta_grids_are_the_annealed_pair_with_eta_given_and_no_pilot(
    tmp_path, name, step_size, schedule):
  # The other two corners of (schedule) x (eta): no pilot, the pair at seed 0 at once, at
  # the grid's eta; seeds 1 and 2 wait on both seed-0 runs.
  fixed, overrides, results = zoology.ZOOLOGY_GRIDS[name]
  assert fixed['step_size'] == step_size and results in mqar_cmd.ZOOLOGY_RESULTS
  assert results == f'results/mqar_{name}.json'
  config = grid.apply_overrides(mqar_config.get_config('zoology'), overrides)
  assert config.train.steps == 12000 and config.particles.schedule == schedule
  planned, waiting = zoology.zoology_plan(str(tmp_path), fixed)
  assert [(o['method'], o['seed'], o['train.learning_rate'], o['particles.step_size'])
          for _, o in planned] == [(m, 0, 2.154e-3, step_size) for m in zoology.COULOMB_PAIR]
  assert waiting == 4
  for n, _ in planned:
    _finished(tmp_path, n, 0.5)
  planned, waiting = zoology.zoology_plan(str(tmp_path), fixed)
  assert [(o['method'], o['seed'], o['particles.step_size']) for _, o in planned[:4]] == [
      (m, s, step_size) for s in (1, 2) for m in zoology.COULOMB_PAIR] and waiting == 0
  protocol = zoology.zoology_protocol(config, 'cpu', grid=fixed)
  assert protocol['particles']['step_size'] == step_size
  assert 'pilot_step_sizes' not in protocol['particles']
  assert protocol['particles']['schedule'] == schedule
  from experiments.recall import zoology_page  # pylint: disable=g-import-not-at-top
  line = zoology_page.table_lines([('x', {'protocol': protocol, 'runs': [], 'best': {}})])[0]
  assert line.endswith(f'; η fixed at {step_size:g} in advance (no pilot).')
  # Runs or pilots at another eta (the annealed grid's folder) are refused, naming the flag.
  row = {'seq_len': 64, 'num_pairs': 4, 'width': 64, 'method': 'particles_flow', 'seed': 0,
         'learning_rate': 2.154e-3, 'steps': 12000, 'particle_schedule': schedule,
         'particle_step_size': 5e-3, 'valid_accuracy': 0.2, 'valid_loss': 1.0}
  pilot = dict(row, method='particles_softmax', steps=1000, particle_step_size=step_size)
  for runs, pilots, match in (([row], [], r"at the particles' step 0\.005, where this grid "
                                            rf"runs {step_size!r}"),
                              ([], [pilot], 'a pilot, where this grid runs none')):
    with pytest.raises(cli.ConfigError, match=r'^--workdir: .*' + match):
      mqar_cmd.check_budget(runs, pilots, 12000, 1000, '--workdir', 'w', schedule, step_size)
  mqar_cmd.check_budget([dict(row, particle_step_size=step_size)], [], 12000, 1000,
                        '--workdir', 'w', schedule, step_size)
  mqar_cmd.check_budget([row], [pilot], 12000, 1000, '--workdir', 'w', schedule)  # no fixed η
  # The other way round: the grid of the same schedule whose pilots choose eta refuses this
  # grid's folder (its Langevin runs and no pilot), through check_sources.
  ours = dict(row, particle_step_size=step_size)
  (tmp_path / 'ours' / zoology.zoology_row_name(ours)).mkdir(parents=True)
  (tmp_path / 'ours' / zoology.zoology_row_name(ours) / 'result.json').write_text(
      json.dumps(ours))
  piloted, more, _ = zoology.ZOOLOGY_GRIDS[
      'zoology_long' if schedule == 'constant' else 'zoology_long_annealed']
  theirs = grid.apply_overrides(mqar_config.get_config('zoology'), more)
  assert more == overrides and piloted['step_size'] is None
  with pytest.raises(cli.ConfigError, match=r"^--workdir: .*particles_flow-L64-P4-w64-lr2\.2e"
                                            r"-03-seed0 and no pilot, where this grid's pilots"):
    mqar_cmd.check_sources(theirs, str(tmp_path / 'ours'), str(tmp_path / 'none.json'),
                           piloted)
  mqar_cmd.check_sources(config, str(tmp_path / 'ours'), str(tmp_path / 'none.json'), fixed)


def test_step_lines_pair_each_corner_of_the_langevin_step_with_the_first_by_seed():
  # Two files at one cell and rate (constant 3e-3; cosine 1e-2), a third corner on another
  # platform (its own table, alone: left out), a method outside the pair: ignored.
  from experiments.recall import zoology_page  # pylint: disable=g-import-not-at-top
  def row(method, seed, acc, schedule, eta, platform='cpu'):
    return {'seq_len': 64, 'num_pairs': 4, 'width': 64, 'steps': 12000, 'seed': seed,
            'learning_rate': 2.154e-3, 'method': method, 'accuracy': acc,
            'particle_schedule': schedule, 'particle_step_size': eta,
            'machine': {'platform': platform}}
  constant = [row(m, s, a, 'constant', 3e-3) for m, accs in (
      ('particles_softmax', (0.4, 0.5, 0.3)), ('particles_flow', (0.6, 0.4, 0.6)))
              for s, a in enumerate(accs)] + [dict(row('elu', 0, 0.2, 'constant', 3e-3))]
  cosine = [row(m, s, a, 'cosine', 1e-2) for m, accs in (
      ('particles_softmax', (0.9, 0.8)), ('particles_flow', (0.9,))) for s, a in enumerate(accs)]
  gpu = [row('particles_flow', 0, 0.7, 'constant', 1e-3, 'gpu')]
  lines = zoology_page.step_lines([('cpu (a.json)', {'runs': constant}),
                                   ('cpu (b.json)', {'runs': cosine + gpu})])
  rows = [l for l in lines if l.startswith('| constant') or l.startswith('| cosine')]
  assert len(rows) == 2 and sum(l.startswith('L = ') for l in lines) == 1
  assert rows[0] == ('| constant | 0.003 | 0: 0.400, 1: 0.500, 2: 0.300 | 0.400 ± 0.100 (3) |  '
                     '| 0: 0.600, 1: 0.400, 2: 0.600 | 0.533 ± 0.115 (3) |  | a.json |')
  # softmax: differences +0.5, +0.3 over seeds 0-1: mean +0.4, sd 0.1414, t_{0.975,1} 12.706
  half = 12.706 * 0.1 * 2 ** 0.5 / 2 ** 0.5
  assert rows[1].startswith(f'| cosine | 0.01 | 0: 0.900, 1: 0.800 | 0.850 ± 0.071 (2) | '
                            f'+0.400 [{0.4 - half:+.3f}, {0.4 + half:+.3f}] (n = 2) | ')
  assert rows[1].endswith('| 0: 0.900 | 0.900 ± 0.000 (1) | +0.300 (one seed) (n = 1) | b.json |')
  assert zoology_page.step_lines([('cpu (a.json)', {'runs': constant})]) == []


def test_the_l128_grid_is_one_rate_the_pair_and_the_hedgehogs_first_then_the_pairs_seeds(
    tmp_path):
  l128, overrides, results = zoology.ZOOLOGY_GRIDS['zoology_long_l128']
  assert overrides == {'train.steps': 12000}
  assert results == 'results/mqar_zoology_long_l128.json' and results in mqar_cmd.ZOOLOGY_RESULTS
  planned, waiting = zoology.zoology_plan(str(tmp_path), l128)
  pilots = [n for n, _ in planned if n.startswith('pilot/')]
  assert pilots == [f'pilot/particles_softmax-L128-P8-w64-eta{eta}'
                    for eta in ('1e-03', '3e-03', '1e-02')] and waiting == 2 + 8 + 8
  for name in pilots:                             # every pilot done: η = 1e-2 chosen
    _finished(tmp_path, name, 0.3 if 'eta1e-02' in name else 0.2)
  planned, waiting = zoology.zoology_plan(str(tmp_path), l128)
  runs = [(o['method'], o['data.seq_len'], o['data.num_pairs'], o['train.learning_rate'],
           o['seed'], o.get('particles.step_size')) for n, o in planned if n not in pilots]
  # one rate, seed 0; the pair and the Hedgehogs first; the pair's seeds 1, 2 wait on both
  # seed-0 runs of the pair, then go ahead of every seed-0 run not yet finished (seeds 3
  # and 4 too, added after seeds 0-2 disagreed)
  assert runs == [(m, 128, 8, 2.154e-3, 0, 1e-2 if m.startswith('particles') else None)
                  for m in ('particles_softmax', 'hedgehog', 'particles_flow',
                            'hedgehog_distilled', 'taylor', 'elu')] and waiting == 8 + 8
  for method in zoology.COULOMB_PAIR:
    name = zoology.zoology_name(method, 128, 8, 64, 2.154e-3, 0)
    _finished(tmp_path, name, 0.5)
  planned, waiting = zoology.zoology_plan(str(tmp_path), l128)
  pair_seeds = [zoology.zoology_name(m, 128, 8, 64, 2.154e-3, s)
                for s in (1, 2, 3, 4) for m in zoology.COULOMB_PAIR]
  assert waiting == 8 and [n for n, _ in planned][3:11] == pair_seeds
  # Seeds 1 and 2 of the three maps that ended ahead at seed 0 (extra_seeds): each waits on
  # its own seed-0 run, then goes right after the pair's seeds, ahead of any seed-0 run.
  # (elu's, added last, wait on its seed-0 run, the last of the grid's order.)
  assert l128['extra_seeds'] == {'methods': ('hedgehog_distilled', 'hedgehog', 'taylor',
                                             'elu'),
                                 'seeds': (1, 2), 'learning_rate': 2.154e-3}
  for method in ('hedgehog_distilled', 'hedgehog', 'taylor'):
    _finished(tmp_path, zoology.zoology_name(method, 128, 8, 64, 2.154e-3, 0), 0.8)
  planned, waiting = zoology.zoology_plan(str(tmp_path), l128)
  assert waiting == 2 and [n for n, _ in planned][3:17] == pair_seeds + [
      zoology.zoology_name(m, 128, 8, 64, 2.154e-3, s)
      for m in ('hedgehog_distilled', 'hedgehog', 'taylor') for s in (1, 2)]
  _finished(tmp_path, zoology.zoology_name('elu', 128, 8, 64, 2.154e-3, 0), 0.9)
  planned, waiting = zoology.zoology_plan(str(tmp_path), l128)
  assert waiting == 0 and [n for n, _ in planned][17:19] == [
      zoology.zoology_name('elu', 128, 8, 64, 2.154e-3, s) for s in (1, 2)]
  assert [o for n, o in planned if n.endswith('seed1') and 'taylor' in n] == [
      {'data.seq_len': 128, 'data.num_pairs': 8, 'model.width': 64, 'method': 'taylor',
       'seed': 1, 'train.learning_rate': 2.154e-3}]


def test_a_grid_refuses_langevin_rows_of_another_particle_schedule():
  # A row without particle_schedule is 'constant' (runs made before the field); a cosine
  # grid refuses it, and a constant grid a cosine row; other methods carry no schedule.
  row = {'seq_len': 64, 'num_pairs': 4, 'width': 64, 'method': 'particles_flow', 'seed': 0,
         'learning_rate': 2.154e-3, 'steps': 12000}
  mqar_cmd.check_budget([row], [], 12000, 1000, '--workdir', 'w')
  with pytest.raises(cli.ConfigError, match=r"^--workdir: w holds particles_flow-L64-P4-w64-"
                                            r"lr2\.2e-03-seed0 with the particles' 'constant' "
                                            r"schedule, this grid runs 'cosine'"):
    mqar_cmd.check_budget([row], [], 12000, 1000, '--workdir', 'w', 'cosine')
  cosine = dict(row, particle_schedule='cosine')
  with pytest.raises(cli.ConfigError, match="'cosine' schedule, this grid runs 'constant'"):
    mqar_cmd.check_budget([], [cosine], 12000, 12000, '--results', 'r.json')
  mqar_cmd.check_budget([dict(row, method='taylor')], [], 12000, 1000, '--workdir', 'w',
                        'cosine')
  # A run's row records its schedule (Langevin methods only).
  config = grid.apply_overrides(quick('particles_flow'), {'particles.schedule': 'cosine'})
  assert run.result_row(config, {'accuracy': 0.5, 'loss': 1.0}, 1.0)[
      'particle_schedule'] == 'cosine'
  assert 'particle_schedule' not in run.result_row(quick('elu'), {'accuracy': 0.5,
                                                                  'loss': 1.0}, 1.0)


def test_the_long_grid_refuses_a_steps_flag_it_would_replace(tmp_path):
  out = subprocess.run([sys.executable, '-m', 'experiments.mqar',
                        '--config=configs/mqar.py:zoology', '--grid=zoology_long',
                        '--config.train.steps=50', f'--workdir={tmp_path / "w"}'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and lines[-1].startswith(
      'mqar: error: --config.train.steps=50: the grid zoology_long sets train.steps = 12000'), lines
  assert not os.listdir(tmp_path)
