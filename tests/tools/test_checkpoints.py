"""experiments.run.checkpoints: a restored checkpoint with a non-finite parameter is refused
before any step, in one line naming the leaf."""

import numpy as np
import pytest

from experiments.run import checkpoints
from experiments.common import cli


def _ckpt(particles):
  return {'stage': np.int32(0), 'step_a': np.int32(3), 'step_b': np.int32(0),
          'params': {'encoder_0': {'attention': {'particles': particles}},
                     'head': {'bias': np.zeros(2, np.float32)}},
          'data_sha256': checkpoints.data_digest({'train.tsv': 'f' * 64})}


def test_check_finite_names_the_leaf_and_index():
  good = np.ones((2, 4, 3), np.float32)
  checkpoints.check_finite(_ckpt(good), 'here')            # finite: no error
  bad = good.copy()
  bad[1, 2, 0] = np.nan
  with pytest.raises(cli.ConfigError, match=r'^here: params/encoder_0/attention/particles '
                     r'holds 1 non-finite value\(s\) \(first nan at index \(1, 2, 0\)\)'):
    checkpoints.check_finite(_ckpt(bad), 'here')


def test_restore_refuses_a_nan_particle_before_any_step(tmp_path):
  bad = np.ones((2, 4, 3), np.float32)
  bad[0, 0, 1] = np.inf
  manager = checkpoints.checkpoint_manager(str(tmp_path))
  checkpoints.save(manager, _ckpt(bad))
  target = _ckpt(np.ones((2, 4, 3), np.float32))
  with pytest.raises(cli.ConfigError, match=r'checkpoint step 3 in .*: params/encoder_0/'
                     r'attention/particles holds 1 non-finite value\(s\) \(first inf'):
    checkpoints.restore(manager, target)
