"""experiments.analysis: the pooled-within-maps intervals by hand, the reviewer's SST-2
interval from the committed summaries, per-run files that recompute a page's interval and
survive a later report, and a run of another config refused (issue 27 items 5 and 6)."""

import json
import os

import numpy as np
import pytest
from scipy import stats

from studies.phase_a_learning import command as phase_a_learning
from studies.phase_a_learning import page as learning_page
from experiments.analysis import intervals
from experiments.analysis import loading
from experiments.analysis import run_files
from experiments.common import cli
from experiments.run import run_identity
from test_phase_a_learning import _write_run

_META = {'command': 'python -m experiments.phase_a_learning', 'commit': 'abc', 'date': 'now',
         'machine': {}}
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _summary(d):
  d = np.asarray(d, float)
  return {'mean': float(d.mean()), 'std': float(d.std(ddof=1)), 'n': len(d)}


def test_pooled_intervals_equal_the_hand_computation():
  a, b = np.array([0.02, 0.03, 0.01]), np.array([-0.01, 0.00, 0.04, 0.01])
  residuals = np.concatenate([a - a.mean(), b - b.mean()])
  df = len(residuals) - 2                                    # ν = Σ (n_m − 1) = 5
  sp = np.sqrt((residuals ** 2).sum() / df)
  t = stats.t.ppf(0.975, df)
  assert intervals.pooled_sd([_summary(a), _summary(b)]) == (pytest.approx(sp), df)
  lo, hi = intervals.pooled_interval(_summary(a), sp, df)
  assert (lo, hi) == (pytest.approx(a.mean() - t * sp / np.sqrt(3)),
                      pytest.approx(a.mean() + t * sp / np.sqrt(3)))
  pool = intervals.pooled_mean([_summary(a), _summary(b)])
  mean = (a.mean() + b.mean()) / 2
  half = t * sp * np.sqrt(1 / 3 + 1 / 4) / 2
  np.testing.assert_allclose(pool['ci95'], [mean - half, mean + half], rtol=1e-12)
  assert pool['df_pooled'] == df and pool['maps'] == 2
  seed = intervals.seed_interval(_summary(a))
  half_a = stats.t.ppf(0.975, 2) * a.std(ddof=1) / np.sqrt(3)
  np.testing.assert_allclose(seed, [a.mean() - half_a, a.mean() + half_a], rtol=1e-12)
  assert intervals.wider(seed, [lo, hi]) == ('pooled' if hi - lo > seed[1] - seed[0]
                                             else 'seeds')


def test_the_reviewers_sst2_interval_from_the_committed_summaries():
  with open(os.path.join(_ROOT, 'results', 'phase_a_learning.json')) as f:
    sst2 = json.load(f)['datasets']['sst2']
  rows = [m['paired_kernel_minus_ball']['accuracy'] for m in sst2['maps'].values()]
  pool = intervals.pooled_mean(rows)
  assert pool['maps'] == 7 and pool['df_pooled'] == 14
  np.testing.assert_allclose(pool['ci95'], [-0.0055, 0.0023], atol=5e-5)


def _grid(root, seeds, maps=('elu', 'cos2')):
  for m, shift in zip(maps, (0.0, -0.01)):
    for seed, (k, b) in enumerate([(0.72, 0.70), (0.74, 0.71), (0.73, 0.72)]):
      if seed in seeds:
        _write_run(root, f'kernel-{m}', seed, k + shift, rho_learned=0.3)
        _write_run(root, f'ball-{m}', seed, b)
        _write_run(root, f'vanilla-{m}', seed, b - 0.01)


def test_per_run_files_recompute_the_pages_interval_and_survive_a_later_report(tmp_path):
  root, runs_out = str(tmp_path / 'runs'), str(tmp_path / 'per_run')
  _grid(root, seeds=(0, 1, 2))
  out = str(tmp_path / 'out.json')
  phase_a_learning.write(root, str(tmp_path), out, str(tmp_path / 'p.md'),
                         str(tmp_path / 'f'), _META, runs_out=runs_out)
  files = run_files.read_run_files(runs_out)
  assert len(files) == 2 * 3 * 3
  rows = []
  for m in ('elu', 'cos2'):            # the per-map differences from the per-run files alone
    d = [files[('rotten_tomatoes', f'kernel-{m}', s)]['test']['accuracy']
         - files[('rotten_tomatoes', f'ball-{m}', s)]['test']['accuracy'] for s in range(3)]
    rows.append(_summary(d))
  entry = json.load(open(out))['datasets']['rotten_tomatoes']
  page = entry['maps']['elu']['paired_kernel_minus_ball']['accuracy']
  assert page['mean'] == pytest.approx(rows[0]['mean'])
  np.testing.assert_allclose(page['ci95'], intervals.seed_interval(rows[0]), rtol=1e-9)
  _, all_maps = learning_page.pooled(entry['maps'], entry['all_maps'])
  np.testing.assert_allclose(all_maps['paired_kernel_minus_ball']['accuracy']['ci95_pooled'],
                             intervals.pooled_mean(rows)['ci95'], rtol=1e-9)
  record = files[('rotten_tomatoes', 'kernel-elu', 0)]
  assert record['phase_a']['stages'][0]['heldout']['learned']['centered_alignment'] == 0.3
  assert record['config_sha256'] and record['commit'] == 'abc1234'
  # A later report of a grid holding only seed 0 (the others' folders gone) keeps their files.
  other = str(tmp_path / 'runs_seed0')
  _grid(other, seeds=(0,))
  run_files.write_run_files(other, loading.load_runs(other)[0], runs_out)
  assert set(run_files.read_run_files(runs_out)) == set(files)


def test_a_run_whose_results_name_another_config_is_refused(tmp_path):
  root = str(tmp_path / 'runs')
  _write_run(root, 'kernel-elu', 0, 0.7, rho_learned=0.3)
  run = os.path.join(root, 'rotten_tomatoes', 'kernel-elu', 'seed0')
  results = json.load(open(os.path.join(run, 'results.json')))
  with open(os.path.join(run, run_identity.CONFIG), 'w') as f:
    json.dump(results['config'], f)
  results[run_identity.DIGEST] = 'f' * 64                    # another config's digest
  with open(os.path.join(run, 'results.json'), 'w') as f:
    json.dump(results, f)
  with pytest.raises(cli.ConfigError, match=r'--runs: .*seed0: results.json was written by a '
                     r'run of another config'):
    loading.load_runs(root)
  results[run_identity.DIGEST] = run_identity.config_digest(results['config'])
  with open(os.path.join(run, 'results.json'), 'w') as f:
    json.dump(results, f)
  assert len(loading.load_runs(root)[0]) == 1                # its own digest: read
