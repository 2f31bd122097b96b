"""A tiny end-to-end run of studies/theory."""

import json
import os

import numpy as np
import pytest

from studies.theory import command as theory
from studies.theory import config as theory_config


@pytest.mark.slow
def test_theory_tiny_run(tmp_path, capsys):
  config = theory_config.get_config('quick')
  config.num_seeds = 2
  config.data.num_train, config.data.num_eval = 40, 20
  config.dynamics.num_steps, config.dynamics.num_snapshots = 4, 2
  config.free_energy_particles = 8
  config.sw_particles = [4, 8]
  config.spread_particles = [4, 8]
  config.spread_betas = [100.0]
  results = theory.run_theory(config, str(tmp_path))
  out = capsys.readouterr().out
  # 2 snapshots + 2 N × 2 seeds × 2 clouds + 1 β × 2 N × 2 seeds = 14 runs.
  assert theory.count_runs(config) == 14
  assert '[theory] 14 Langevin runs' in out
  assert 'compiling the Langevin run (N=4, 4 steps) …' in out
  assert [l for l in out.splitlines() if '14/14 runs' in l][0].endswith('ETA 00:00')
  rows = results['free_energy'][100.0]
  assert [r[0] for r in rows] == [0, 2, 4]
  for step, h, ent, f in rows:
    np.testing.assert_allclose(f, h - ent / 100.0, rtol=1e-4, atol=1e-6)
  assert all(len(v) == 2 and min(v) > 0 for v in results['sliced_wasserstein'].values())
  assert set(results['sliced_wasserstein_initial']) == {4, 8}
  assert all(s > 0 for s in results['kernel_spread'][100.0].values())
  with open(tmp_path / 'theory.json') as f:
    assert json.load(f)['command'].startswith('python -m studies.theory')
  assert 'log-log slope' in (tmp_path / 'theory.md').read_text()
  for name in ('fig_theory_free_energy.png', 'fig_theory_sw_vs_n.png',
               'fig_theory_kernel_spread.png'):
    assert os.path.getsize(tmp_path / name) > 0
