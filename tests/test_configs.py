"""Every launch config and variant is valid, and bad variants fail early."""

import importlib
import os

import pytest

from configs import text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.environ.get('COULOMB_DATA_DIR', os.path.join(REPO, '..', 'shared', 'data'))
CONFIGS = {'sst2': 'sst2', 'rotten_tomatoes': 'rotten_tomatoes', 'qqp_subset': 'qqp'}


@pytest.mark.parametrize('task', sorted(CONFIGS))
@pytest.mark.parametrize('variant', text.VARIANTS + ('', 'quick', 'kernel-elu,quick'))
def test_every_variant_passes_the_config_check(task, variant):
  from experiments import train
  module = importlib.import_module(f'configs.{CONFIGS[task]}')
  config = module.get_config(variant)
  assert config.data.task == task
  config.data.data_dir = DATA_DIR if os.path.isdir(DATA_DIR) else REPO
  train.check_config(config)
  name = variant.split(',')[0] or 'kernel-favor'
  if name in ('quick',):
    name = 'kernel-favor'
  assert config.variant == name
  assert config.phase_a.enabled == name.startswith('kernel-')
  if name.startswith(('vanilla-', 'kernel-', 'ball-')):
    assert config.model.attention == 'kernel' and config.model.qk_mode == 'shared'
    assert config.model.feature_map == name.split('-', 1)[1]
  assert (config.model.init_radius > 0) == name.startswith('ball-')


def test_paper_settings_are_the_defaults():
  c = text.get_text_config('sst2', 'kernel-favor')
  assert (c.phase_a.step_size, c.phase_a.beta, c.phase_a.lam, c.phase_a.clip_norm,
          c.phase_a.radius, c.phase_a.batch_size, c.phase_a.num_epochs,
          c.phase_a.tolerance) == (2e-3, 50.0, 1e-3, 10.0, 1.5, 64, 10, 1e-6)
  assert (c.phase_b.learning_rate, c.phase_b.batch_size, c.phase_b.num_epochs) == (2e-4, 64, 10)
  assert (c.model.width, c.model.num_layers, c.model.num_heads, c.model.ffn_dim,
          c.model.num_features, c.model.dropout_rate, c.data.max_length) == (
              128, 2, 2, 256, 256, 0.1, 128)
  p = text.get_text_config('sst2', 'performer')
  assert (p.model.qk_mode, p.model.orthogonal, p.phase_a.enabled) == ('projected', True, False)


@pytest.mark.parametrize('variant', ['kernel-rff', 'vanilla', 'softmax,linformer', 'kernel-favor,fast'])
def test_unknown_variants_are_refused(variant):
  with pytest.raises(ValueError, match='variant'):
    text.get_text_config('sst2', variant)
