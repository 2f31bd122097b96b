"""End-to-end test of the main job (experiments/main.py) on its quick config."""

import json
import os

import numpy as np
import pytest

from configs import default
from experiments import main


def test_quick_run_writes_results(tmp_path):
  config = default.get_config('quick')
  config.langevin.num_epochs = 4
  config.data.num_test = 200
  results = main.run(config, str(tmp_path))
  with open(os.path.join(tmp_path, 'results.json')) as f:
    on_disk = json.load(f)
  assert on_disk['learned'] == results['learned']
  assert [row['epoch'] for row in results['history']] == [2, 4]
  for row in results['history']:
    assert row['steps'] == 2 * (400 // 100)
    assert np.isfinite(row['hamiltonian'])
    np.testing.assert_allclose(row['hamiltonian'],
                               -row['alignment'] + config.hamiltonian.lam * row['repulsion'],
                               rtol=1e-4, atol=1e-6)
  for name in ('fixed', 'learned'):
    assert 0.0 <= results[name]['test_accuracy'] <= 1.0


def test_problem_is_reproducible_and_labels_are_pm1():
  import jax
  x1, y1 = main.make_problem(jax.random.key(0), 50, 4, 0.1)
  x2, y2 = main.make_problem(jax.random.key(0), 50, 4, 0.1)
  np.testing.assert_array_equal(x1, x2)
  np.testing.assert_array_equal(y1, y2)
  assert set(np.unique(y1)) <= {-1.0, 1.0}
  with pytest.raises(ValueError, match='config.data.dim must be >= 3, got 2'):
    main.make_problem(jax.random.key(0), 10, 2, 0.1)


def test_unknown_variant():
  with pytest.raises(ValueError, match="unknown 'fast'"):
    default.get_config('fast')
