"""A tiny end-to-end run of the synthetic study: every method, report, figures, resume."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import synthetic as synthetic_config
from experiments.common import cli
from experiments import synthetic
from experiments.study import methods
from experiments.study import record_file
from experiments.study import tables

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '..')


def _tiny_config():
  config = synthetic_config.get_config('quick')
  config.num_seeds = 1
  config.data.num_train, config.data.num_val, config.data.num_test = 40, 40, 50
  config.data.dim = 5
  config.data.noise_levels = [0.1]
  config.features.budgets = [8, 16]
  config.features.bandwidths = [2.0]
  config.classifier.c_grid = [1.0]
  config.mkl.bandwidths = [1.0, 2.0]
  config.importance.candidates_factor = 4
  config.hamiltonian.lams = [0.0, 0.5]
  config.langevin.batch_size = 20
  config.langevin.num_epochs = 2
  config.report.noise_index = 0
  config.report.ablation_budget = 8
  return config


@pytest.mark.slow
def test_every_method_runs_and_report_is_written(tmp_path, capsys):
  config = _tiny_config()
  results = synthetic.run_study(config, str(tmp_path), 'quick')
  out = capsys.readouterr().out
  # It says which variant ran, that it is a smoke run, first and last.
  lines = out.splitlines()
  assert lines[0] == (
      "[synthetic] variant 'quick': a smoke run (1 seed, 1 noise level, N ∈ [8, 16], "
      'λ ∈ [0.0, 0.5], 2 Langevin epochs, 50 test points) that checks the pipeline end to '
      'end; its numbers are not results (the study is --config=configs/synthetic.py, no '
      'variant).')
  assert lines[-1].startswith('[synthetic] done in ') and lines[-1].endswith(
      f'results in {tmp_path} — quick variant: smoke run, 1 seed — not results')
  # One seed: no ±, and the tables say why.
  assert not [l for l in results['markdown_summary'].splitlines()
              if l.startswith('|') and '±' in l]
  assert results['markdown_summary'].count(
      'No ±: one seed per cell (n = 1 seed), so no interval.') == 5
  # It says what it does: compilations, and progress lines with elapsed time, rate and ETA.
  assert '[synthetic] noise 1/1 (σ=0.1) seed 1/1: compiling the Langevin run (N=8 particles) …' in out
  assert 'compiling importance sampling (N=16, 64 candidates) …' in out
  runs = methods.cell_runs(config)
  assert runs == ['logreg', 'rbf_svm', 'mkl', 'rff N=8', 'importance N=8', 'coulomb N=8 λ=0',
                  'coulomb N=8 λ=0.5', 'rff N=16', 'importance N=16', 'coulomb N=16 λ=0',
                  'coulomb N=16 λ=0.5']
  last = [l for l in out.splitlines() if f'{len(runs)}/{len(runs)} runs' in l]
  assert len(last) == 1 and 'method coulomb N=16 λ=0.5 — 11/11 runs' in last[0]
  assert ' elapsed, ' in last[0] and ' runs/s' in last[0] and last[0].endswith('ETA 00:00')
  fitted = {(r['method'], r.get('budget'), r.get('lam')) for r in results['records']}
  assert {('logreg', None, None), ('rbf_svm', None, None), ('mkl', None, None)} <= fitted
  for budget in (8, 16):
    assert {('rff', budget, None), ('importance', budget, None), ('coulomb', budget, 0.0),
            ('coulomb', budget, 0.5)} <= fitted
  for r in results['records']:
    assert 0.0 <= r['test_accuracy'] <= 1.0 and 0.0 <= r['val_accuracy'] <= 1.0
  coulomb = [r for r in results['records'] if r['method'] == 'coulomb']
  assert all(r['steps'] == 2 * (40 // 20) for r in coulomb)
  for name in ('results.json', 'results.md', 'records.jsonl', 'histories.json',
               'fig_accuracy_vs_noise.png', 'fig_accuracy_vs_budget.png',
               'fig_lambda_ablation.png', 'fig_energy_vs_step.png'):
    assert os.path.getsize(tmp_path / name) > 0, name
  md = (tmp_path / 'results.md').read_text()
  assert '**quick variant: smoke run, 1 seed — not results**' in md     # from :quick
  # The figures, linked from results.md by paths relative to it.
  for name, text in tables.FIGURE_TEXT.items():
    assert f'![{text}]({name})' in md and os.path.isfile(tmp_path / name), name
  assert [os.path.basename(p) for p in results['figures']] == list(tables.FIGURE_TEXT)
  assert all('commit' in r for r in results['records'])
  assert f"records from: {results['records'][0]['commit']}" in md
  for lab in ('logreg', 'rbf_svm', 'mkl', 'rff', 'importance', 'coulomb λ*', 'coulomb λ=0.5'):
    assert lab in md
  with open(tmp_path / 'results.json') as f:
    assert json.load(f)['records'] == results['records']

  # A second call resumes: every cell is done, nothing is recomputed.
  capsys.readouterr()
  again = synthetic.run_study(config, str(tmp_path))
  out = capsys.readouterr().out
  assert '[synthetic] resuming: 1 cells already done' in out and 'compiling' not in out
  assert again['records'] == results['records']

  # Resuming with a different config is refused instead of mixing records.
  config.langevin.step_size = 0.1
  with pytest.raises(cli.ConfigError, match='holds records of a different config'):
    synthetic.run_study(config, str(tmp_path))


def test_cut_record_line_is_dropped_and_cell_redone(tmp_path):
  path = tmp_path / 'records.jsonl'
  path.write_text(json.dumps({'method': 'logreg', 'noise_index': 0, 'seed': 0}) + '\n'
                  + json.dumps({'cell_done': True, 'noise_index': 0, 'seed': 0}) + '\n'
                  + json.dumps({'method': 'logreg', 'noise_index': 1, 'seed': 0}) + '\n'
                  + '{"method": "rff", "noi')
  records, done = record_file.load_done(str(path))
  assert done == {(0, 0)} and len(records) == 1


def test_selected_lambda_and_intervals():
  recs = [{'method': 'coulomb', 'noise_index': 0, 'seed': 0, 'budget': 8, 'lam': lam,
           'val_accuracy': v, 'test_accuracy': t}
          for lam, v, t in ((0.0, 0.7, 0.6), (0.5, 0.8, 0.65))]
  sel = [r for r in tables.with_selected_lambda(recs)
         if r['method'] == tables.SELECTED]
  assert len(sel) == 1 and sel[0]['selected_lam'] == 0.5 and sel[0]['test_accuracy'] == 0.65
  mean, half, n = tables.mean_ci([0.5, 0.7])
  # t_{0.975, 1} = 12.706; std = 0.1414; half = 12.706 · 0.1414 / √2 = 1.2706.
  assert (n, mean) == (2, pytest.approx(0.6)) and half == pytest.approx(1.2706, rel=1e-3)


def test_unknown_method_is_rejected_before_compute(tmp_path):
  config = _tiny_config()
  config.methods = ['rff', 'svm']
  with pytest.raises(cli.ConfigError, match=r"config.methods: unknown \['svm'\]"):
    synthetic.run_study(config, str(tmp_path))
  assert not os.listdir(tmp_path)

  for field, value, match in (
      ('report.ablation_budget', 32, 'config.report.ablation_budget must be one of'),
      ('langevin.beta', -1.0, r'config.langevin.beta must be > 0, got -1.0'),
      ('langevin.batch_size', 1000, r'config.langevin.batch_size must be an integer in \[2, 40\]'),
      ('features.bandwidths', [0.0], 'config.features.bandwidths entry must be > 0'),
      ('classifier.c_grid', [], 'config.classifier.c_grid must not be empty'),
      ('hamiltonian.s', 'newton', "s must be a float >= 0 or 'coulomb'")):
    config = _tiny_config()
    section, name = field.split('.')
    config[section][name] = value
    with pytest.raises(ValueError, match=match):
      synthetic.run_study(config, str(tmp_path))
    assert not os.listdir(tmp_path)


def test_pilot_runs_on_validation_only(monkeypatch):
  from studies.synthetic_pilot import command as synthetic_pilot
  monkeypatch.setattr(synthetic_pilot, 'GRID',
                      {'lam': [0.0], 'step_size': [0.3], 'beta': [1e4]})
  monkeypatch.setattr(synthetic_pilot, 'NUM_SEEDS', 1)
  monkeypatch.setattr(synthetic_pilot, 'BUDGET', 8)
  config = _tiny_config()
  rows = synthetic_pilot.run_pilot(config)
  assert len(rows) == 1 and set(rows[0]) == {'lam', 'step_size', 'beta', 'mean_val_gain'}
  assert -1.0 <= rows[0]['mean_val_gain'] <= 1.0


def test_accuracy_band_is_clipped_and_smoke_runs_say_so():
  lower, upper = tables.accuracy_band([0.9, 0.05, 0.5], [0.3, 0.2, float('nan')])
  np.testing.assert_allclose(lower, [0.6, 0.0, 0.5])
  np.testing.assert_allclose(upper, [1.0, 0.25, 0.5])
  config = synthetic_config.get_config('quick')
  assert tables.smoke_label(config) == (
      'quick variant: smoke run, 2 seeds — not results')
  assert tables.smoke_label(synthetic_config.get_config()) == ''


@pytest.mark.slow
def test_launched_as_a_file_from_another_folder_a_typo_is_one_line(tmp_path):
  """python path/to/experiments/synthetic.py --config=path/to/configs/synthetic.py …"""
  script = os.path.join(ROOT, 'experiments', 'synthetic.py')
  config = os.path.join(ROOT, 'configs', 'synthetic.py')
  env = dict(os.environ, PYTHONPATH='')
  for override, message in (
      ('--config.langevin.stepsize=0.1',
       "synthetic: error: --config.langevin.stepsize=0.1: unknown config field 'stepsize'. "
       'Did you mean "step_size" instead of "stepsize"?'),
      ('--config.langevin.beta=-1',                     # a bad value: check_config's error
       'synthetic: error: config.langevin.beta must be > 0, got -1.0.')):
    proc = subprocess.run([sys.executable, script, f'--config={config}:quick',
                           f'--workdir={tmp_path / "w"}', override], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == message
    assert 'Traceback' not in proc.stderr
    assert not (tmp_path / 'w').exists()


@pytest.mark.slow
def test_list_fields_and_the_resolved_config_are_printed(tmp_path):
  script = os.path.join(ROOT, 'experiments', 'synthetic.py')
  config = os.path.join(ROOT, 'configs', 'synthetic.py')
  run = lambda *args: subprocess.run([sys.executable, script, *args], cwd=str(tmp_path),
                                     capture_output=True, text=True, timeout=120)
  out = run(f'--config={config}:quick', '--list_fields', '--config.num_seeds=3')
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.splitlines()
  assert '--config.num_seeds=3' in lines
  assert lines[lines.index('--config.num_seeds=3') + 1] == (
      '    Number of repeats (independent data sets and feature draws).')
  assert all(lines[i + 1].startswith('    ') for i, line in enumerate(lines)
             if line.startswith('--config.'))     # every field has its comment
  # A run prints its resolved config first; a bad value then ends in one line.
  out = run(f'--config={config}:quick', f'--workdir={tmp_path / "w"}', '--config.num_seeds=0')
  assert out.returncode != 0 and 'Traceback' not in out.stderr
  assert out.stdout.startswith('config:\n') and '  num_seeds = 0' in out.stdout
  assert 'config.num_seeds' in out.stderr.strip().splitlines()[-1]
  out = run(f'--config={config}:quick')
  assert out.returncode != 0 and out.stderr.strip().splitlines()[-1].endswith(
      '--workdir: required (the folder for records, results and figures).')


def test_every_plus_minus_is_defined_with_its_n():
  # t_{0.975, 1} = 12.706, t_{0.975, 4} = 2.776.
  assert tables.interval_note([2, 2, 2]) == (
      '± = half-width of the 95% Student-t interval of the mean over the seeds, '
      't_{0.975, n−1} · s/√n with s the sample std (ddof = 1): n = 2 seeds per cell '
      '(t_{0.975, 1} = 12.71).')
  assert tables.interval_note([5, 1, 2], of='paired difference') == (
      '± = half-width of the 95% Student-t interval of the paired difference over the seeds, '
      't_{0.975, n−1} · s/√n with s the sample std (ddof = 1): n = 1–5 seeds per cell '
      '(t_{0.975, 1} = 12.71, t_{0.975, 4} = 2.78); a cell of one seed has no ±.')
  config = synthetic_config.get_config('quick')
  records = [{'method': m, 'noise_index': i, 'seed': s, 'budget': n, 'lam': lam,
              'val_accuracy': 0.6, 'test_accuracy': 0.6 + 0.01 * s, 'test_f1': 0.5,
              'seconds': 0.1}
             for i in range(3) for s in range(2) for n in (16, 64)
             for m, lam in (('rff', None), ('importance', None), ('coulomb', 0.0),
                            ('coulomb', 0.5))]
  records += [{'method': m, 'noise_index': i, 'seed': s, 'val_accuracy': 0.6,
               'test_accuracy': 0.6, 'test_f1': 0.5} for i in range(3) for s in range(2)
              for m in tables.BASELINES]
  md = tables.tables(config, tables.with_selected_lambda(records))
  blocks = md.split('\n### ')[1:]
  for block in blocks:            # every table with a ± has its definition under it
    has = '±' in '\n'.join(l for l in block.splitlines() if l.startswith('|'))
    assert has == ('\n± = half-width of the 95% Student-t interval' in block), block[:60]
  assert sum('n = 2 seeds per cell (t_{0.975, 1} = 12.71)' in b for b in blocks) == 5


def _history(w0, w1, lam_moves):
  steps = 11
  alignment = [0.01] + list(np.linspace(0.005, 0.015, steps - 1))
  repulsion = [w0] + [w1] * (steps - 1)
  return {'alignment': alignment, 'repulsion': repulsion,
          'hamiltonian': [-a + 0.5 * w for a, w in zip(alignment, repulsion)],
          'max_move': [lam_moves] + [0.05] * (steps - 1)}


def test_the_energy_figure_says_why_h_drops_after_step_0():
  config = synthetic_config.get_config('quick')      # p = 10: s = 8
  hist = {'N=64,lam=0.5': _history(0.8, 0.006, 1.2),
          'N=64,lam=0.0': dict(_history(0.8, 0.79, 0.057))}
  title, caption = tables.energy_caption(config, hist, 'N=64,lam=0.5')
  assert title == ('step 0 is the initial draw: H = 0.390, almost all λW = 0.400; the '
                   'repulsion spreads the particles in one move\n(W 0.800 → 0.0060), after '
                   'which H = −A + λW is the sum of two small terms: ≈ 0')
  assert caption.startswith('Why H drops to ≈ 0 after step 0: step 0 is H at the initial '
                            'draw (the RFF frequencies, before any move)')
  for said in ('s = p − 2 = 8, ε = 0.5: W = 0.800, so H = −A + λW = 0.390 is almost all '
               'λW = 0.400 (λ = 0.5, A = 0.010)',
               'largest move 1.20, against a median 0.050 for the later moves; the λ = 0 run '
               'from the same draw moves at most 0.057 in its first move and keeps W at 0.790',
               'W falls to 0.0060', 'medians over the later steps: A = 0.010, λW = 0.0030',
               'A 0.005 → 0.015, λW 0.0030 → 0.0030'):
    assert said in caption, said
  # No drop (λ = 0, or W not falling tenfold): nothing to explain.
  for key in ('N=64,lam=0.0',):
    title, caption = tables.energy_caption(config, hist, key)
    assert title == '' and caption.startswith('H = −A + λW along one Langevin run (N=64,lam=0.0)')


def test_the_variant_is_read_from_the_config_flag():
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  path = os.path.join(ROOT, 'configs', 'synthetic.py')
  for arg, variant in ((f'{path}:quick', 'quick'), (path, '')):
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file('config', None, 'config', flag_values=fv)
    fv(['synthetic', f'--config={arg}'])
    assert synthetic.config_variant(fv['config']) == variant
  assert synthetic.describe_variant(synthetic_config.get_config(), '') == (
      'the default variant: the study (5 seeds, 10 noise levels, N ∈ [16, 32, 64, 128, 256], '
      'λ ∈ [0.0, 0.01, 0.05, 0.2, 0.5, 0.8, 1.0, 1.5], 50 Langevin epochs, 2000 test points).')
