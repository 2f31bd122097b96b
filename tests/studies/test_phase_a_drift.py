"""studies.phase_a_drift on a tiny synthetic task."""

import numpy as np
import pytest

from configs import text
from coulomb_jax.tasks import data
from experiments.run import run_folder
from experiments.run import setup
from studies.phase_a_drift import command as phase_a_drift


@pytest.mark.slow
def test_drift_statistics_are_consistent_and_scale_with_the_step_size():
  rng = np.random.default_rng(0)
  ids = [rng.integers(1, 40, size=n).astype(np.int32) for n in rng.integers(3, 12, size=48)]
  encoded = {'train': data.Encoded(ids, [np.zeros_like(x) for x in ids],
                                   rng.integers(0, 2, 48).astype(np.int32))}

  def stats(step_size):
    config = text.get_text_config('sst2', 'kernel-softmaxfeat,quick')
    config.data.data_dir = '.'
    config.model.width, config.model.num_features, config.model.ffn_dim = 16, 8, 16
    config.phase_a.batch_size, config.phase_a.step_size = 16, step_size
    return phase_a_drift.drift_stats(config, encoded, 40, num_batches=2)

  small, large = stats(1e-3), stats(1e-1)
  # 2 layers x 2 heads x 8 particles per batch; 3 batches per epoch.
  assert small['particles'] == 32 and small['phase_a_steps'] == 3
  assert 0 < small['drift_median'] <= small['drift_p90']
  np.testing.assert_allclose(small['noise'], np.sqrt(2 * 1e-3 / 50.0 * 8), rtol=1e-6)
  np.testing.assert_allclose(small['ratio_per_step'], small['drift_median'] / small['noise'])
  np.testing.assert_allclose(small['beta_star'],
                             2 * 1e-3 * 8 / small['drift_median'] ** 2, rtol=1e-6)
  # Without clipping, the drift is linear in η (the gradient does not depend on η).
  np.testing.assert_allclose(large['drift_median'], 100 * small['drift_median'], rtol=1e-4)


@pytest.mark.slow
def test_trained_params_round_trip_and_drift_on_given_params(tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  from experiments.run import checkpoints  # pylint: disable=g-import-not-at-top
  from experiments import train  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  ids = [rng.integers(1, 40, size=n).astype(np.int32) for n in rng.integers(3, 12, size=32)]
  encoded = {'train': data.Encoded(ids, [np.zeros_like(x) for x in ids],
                                   rng.integers(0, 2, 32).astype(np.int32))}
  config = text.get_text_config('sst2', 'kernel-favor,quick')
  config.data.data_dir = '.'
  config.model.width, config.model.num_features, config.model.ffn_dim = 16, 8, 16
  config.phase_a.batch_size = 16
  model = setup.make_model(config, 40)
  example = next(data.batches(encoded['train'], 2))
  init_key = jax.random.split(jax.random.PRNGKey(config.seed), 3)[0]   # As train.py.
  params = model.init(init_key, example['ids'], example['segments'], example['mask'])['params']
  # A finished run's checkpoint holding these as its kept parameters.
  run = str(tmp_path / 'run')
  int32 = lambda v: np.asarray(v, np.int32)
  checkpoints.save(checkpoints.checkpoint_manager(run),
                   {'stage': int32(2), 'step_a': int32(0), 'step_b': int32(3),
                    'best_params': params})
  with pytest.raises(ValueError, match=r'--trained_runs: .* \(not a finished run\)'):
    phase_a_drift.trained_params(run)
  open(f'{run}/{run_folder.RESULTS}', 'w').close()
  restored = phase_a_drift.trained_params(run)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(a, b)
  # Given the initial parameters, the statistics are those of the default path.
  given = phase_a_drift.drift_stats(config, encoded, 40, num_batches=1, params=restored)
  default = phase_a_drift.drift_stats(config, encoded, 40, num_batches=1)
  assert given == pytest.approx(default, rel=1e-6)
