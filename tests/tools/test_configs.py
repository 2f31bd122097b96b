"""Every launch config and variant is valid, and bad variants fail early."""

import importlib
import os

import ml_collections
import pytest

from configs import text
from experiments.run import train_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_DIR = os.environ.get('COULOMB_DATA_DIR', os.path.join(REPO, '..', 'shared', 'data'))
CONFIGS = {'sst2': 'sst2', 'rotten_tomatoes': 'rotten_tomatoes', 'qqp_subset': 'qqp'}


@pytest.mark.parametrize('task', sorted(CONFIGS))
@pytest.mark.parametrize('variant', text.VARIANTS + ('', 'quick', 'kernel-elu,quick'))
def test_every_variant_passes_the_config_check(task, variant):
  module = importlib.import_module(f'configs.{CONFIGS[task]}')
  config = module.get_config(variant)
  assert config.data.task == task
  config.data.data_dir = DATA_DIR if os.path.isdir(DATA_DIR) else REPO
  train_config.check_config(config)
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


def test_the_data_folder_defaults_to_the_environment_then_next_to_the_repository(monkeypatch):
  config = text.get_text_config('sst2', 'softmax')
  assert config.data.data_dir == ''
  monkeypatch.setenv('COULOMB_JAX_DATA', '/data/here')
  assert train_config.data_dir(config) == '/data/here'
  monkeypatch.delenv('COULOMB_JAX_DATA')
  # Next to the repository, not the current folder.
  assert train_config.data_dir(config) == os.path.join(os.path.dirname(REPO), 'shared', 'data')
  config.data.data_dir = 'relative/data'                # An explicit value is kept as is.
  assert train_config.data_dir(config) == 'relative/data'


def test_quick_is_a_small_run_that_learns():
  c = text.get_text_config('rotten_tomatoes', 'kernel-elu,quick')
  assert (c.data.max_train_examples, c.data.vocab_size, c.data.max_length) == (8000, 4000, 64)
  assert (c.model.width, c.model.num_features, c.model.ffn_dim) == (32, 16, 64)
  assert (c.phase_a.num_epochs, c.phase_b.num_epochs) == (1, 2)
  assert (c.phase_b.learning_rate, c.phase_b.batch_size) == (2e-3, 32)


@pytest.mark.parametrize('name', sorted(set(CONFIGS.values())))
def test_a_config_loads_by_path_from_another_folder(name, tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  path = os.path.join(REPO, 'configs', f'{name}.py')
  # -I: neither the current folder nor PYTHONPATH is on sys.path; the repository is not.
  code = ('import runpy, sys; assert not any(p.rstrip("/") == %r for p in sys.path); '
          'print(runpy.run_path(%r)["get_config"]("softmax").data.task)' % (REPO, path))
  out = subprocess.run([sys.executable, '-I', '-c', code], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == [t for t, n in CONFIGS.items() if n == name][0]


def test_learn_modifier_sets_the_learning_regime_and_passes_the_checks():
  c = text.get_text_config('rotten_tomatoes', 'kernel-elu,learn')
  assert (c.phase_a.schedule, c.phase_a.relative_step, c.phase_a.gibbs_tilt,
          c.phase_a.relative_lam, c.phase_a.riesz_s) == ('after_b', 0.01, 1e3, 1.0, '0.0')
  assert c.phase_a.after_b_epochs == c.phase_b.num_epochs - 2 == 8
  c.phase_b.num_epochs = 5                      # the reference follows an override
  assert c.phase_a.after_b_epochs == 3
  c.data.data_dir = DATA_DIR if os.path.isdir(DATA_DIR) else REPO
  train_config.check_config(c)
  quick = text.get_text_config('rotten_tomatoes', 'vanilla-elu,learn,quick')
  assert quick.phase_a.after_b_epochs == 1 and quick.phase_b.num_epochs == 2
  quick.data.data_dir = c.data.data_dir
  train_config.check_config(quick)
  # The paper's settings stay the default.
  assert text.get_text_config('rotten_tomatoes', 'kernel-elu').phase_a.schedule == 'joint'


@pytest.mark.parametrize('variant', ['kernel-favor', 'kernel-elu,learn', 'kernel-softmaxfeat,quick'])
def test_phase_a_target_is_labels_by_default_and_softmax_passes_the_checks(variant):
  c = text.get_text_config('rotten_tomatoes', variant)
  assert c.phase_a.target == 'labels'
  c.data.data_dir = DATA_DIR if os.path.isdir(DATA_DIR) else REPO
  c.phase_a.target = 'softmax'
  train_config.check_config(c)
  c.phase_a.target = 'hedgehog'
  with pytest.raises(ValueError, match=r"config\.phase_a\.target: expected one of \('labels', "
                                       r"'softmax'\), got 'hedgehog'"):
    train_config.check_config(c)


def test_shared_langevin_and_repulsion_fields_come_from_configs_common():
  # One builder per shared block (issue 37 item 1): the three launch configs carry the same
  # field names, set by configs/common.py, with their own values.
  from configs import common, mqar, synthetic  # pylint: disable=g-import-not-at-top
  langevin = ('step_size', 'beta', 'clip_norm')
  repel = ('lam', 'riesz_s', 'softening', 'relative_lam')
  phase_a = text.get_text_config('sst2').phase_a
  particles = mqar.get_config('').particles
  for section in (phase_a, particles):
    assert set(langevin + ('radius',) + repel) <= set(section.keys())
  assert set(langevin) <= set(synthetic.get_config('').langevin.keys())
  assert (phase_a.step_size, phase_a.beta, phase_a.clip_norm, phase_a.radius) == (
      2e-3, 50.0, 10.0, 1.5)
  assert (particles.step_size, particles.beta, particles.radius) == (1e-4, 1e5, 8.0)
  assert synthetic.get_config('').langevin.clip_norm is None
  built = common.add_repulsion(common.add_langevin(
      ml_collections.ConfigDict(), step_size=0.1, beta=2.0, clip_norm=None),
      lam=0.3, riesz_s=0.0, softening=0.1)
  assert built.to_dict() == {'step_size': 0.1, 'beta': 2.0, 'clip_norm': None, 'lam': 0.3,
                             'riesz_s': 0.0, 'softening': 0.1}


def test_one_parser_for_variant_strings():
  from configs import common  # pylint: disable=g-import-not-at-top
  assert common.variant_parts('kernel-favor,,quick') == ['kernel-favor', 'quick']
  assert common.variant_parts('') == []
  with pytest.raises(TypeError, match='variant must be a string'):
    common.variant_parts(None)
