"""Tests of coulomb_jax.training and experiments/train.py (Phase A, Phase B, resume)."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from coulomb_jax import hamiltonian
from coulomb_jax import langevin
from coulomb_jax import training
from coulomb_jax.layers import models
from experiments.run import run_folder
from experiments.run import sharding
from experiments.run import train_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_DIR = os.environ.get('COULOMB_DATA_DIR', os.path.join(REPO, '..', 'shared', 'data'))
VOCAB = 40


def _batch(b=8, length=12, key=0):
  k1, k2, k3 = jax.random.split(jax.random.key(key), 3)
  lengths = jax.random.randint(k1, (b,), 2, length + 1)
  mask = jnp.arange(length)[None] < lengths[:, None]
  ids = jnp.where(mask, jax.random.randint(k2, (b, length), 1, VOCAB), 0)
  return {'ids': ids, 'segments': jnp.zeros_like(ids), 'mask': mask,
          'labels': jax.random.bernoulli(k3, 0.5, (b,)).astype(jnp.int32),
          'weights': jnp.ones((b,), jnp.float32)}


def _model(**kw):
  return models.EncoderClassifier(vocab_size=VOCAB, max_length=16, width=16, num_heads=2,
                                  ffn_dim=16, num_features=8, **kw)


def _init(model, batch):
  return model.init(jax.random.key(1), batch['ids'], batch['segments'], batch['mask'])['params']


def _split(params):
  flat = traverse_util.flatten_dict(params)
  return ({k: v for k, v in flat.items() if k[-1] == 'particles'},
          {k: v for k, v in flat.items() if k[-1] != 'particles'})


def test_phase_a_moves_only_particles_and_phase_b_only_the_rest():
  model, batch = _model(feature_map='favor'), _batch()
  params = _init(model, batch)
  opt_a = training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=1e-2, beta=50.0,
                                     radius=1.5, clip_norm=10.0)
  step_a = jax.jit(training.make_phase_a_step(model, opt_a, feature_map='favor', lam=1e-3,
                                              s='coulomb', softening=0.5))
  state = training.TrainState(jnp.zeros([], jnp.int32), params, opt_a.init(params))
  for _ in range(2):
    state, metrics = step_a(state, batch)
  particles0, rest0 = _split(params)
  particles1, rest1 = _split(state.params)
  for k in rest0:                                    # bit-identical
    np.testing.assert_array_equal(rest1[k], rest0[k])
  assert all(not np.array_equal(particles1[k], particles0[k]) for k in particles0)
  assert float(metrics['max_move']) > 0
  # Every particle ends in the ball of radius 1.5.
  for v in particles1.values():
    assert float(jnp.max(jnp.linalg.norm(v, axis=-1))) <= 1.5 * (1 + 1e-6)

  opt_b = training.phase_b_optimizer(learning_rate=1e-2, warmup_steps=1, total_steps=4,
                                     weight_decay=1e-4, clip_norm=1.0)
  step_b = jax.jit(training.make_phase_b_step(model, opt_b))
  state_b = training.TrainState(jnp.zeros([], jnp.int32), state.params,
                                opt_b.init(state.params))
  for _ in range(3):
    state_b, metrics_b = step_b(jax.random.key(2), state_b, batch)
  particles2, rest2 = _split(state_b.params)
  for k in particles1:
    np.testing.assert_array_equal(particles2[k], particles1[k])
  assert all(not np.array_equal(rest2[k], rest1[k]) for k in rest1
             if k[-1] != 'positions')             # positions past L get no gradient
  assert np.isfinite(float(metrics_b['loss']))


def test_phase_a_objective_is_the_core_hamiltonian_summed_over_layers_and_heads():
  model, batch = _model(feature_map='softplus'), _batch()
  params = _init(model, batch)
  inputs = training.phase_a_inputs(model, params, batch)
  assert len(inputs) == 2 and all(r.shape == (8, 2, 8) for r in inputs.values())
  got, aux = training.phase_a_objective(params, inputs, batch['labels'], batch['weights'],
                                        feature_map='softplus', lam=0.3, s=1.0, softening=0.5)
  y = 2.0 * batch['labels'] - 1.0
  flat = traverse_util.flatten_dict(params)
  want = sum(hamiltonian.hamiltonian(flat[path + ('particles',)][h], r[:, h], y,
                                     feature_map='softplus', lam=0.3, s=1.0, softening=0.5)
             for path, r in inputs.items() for h in range(2))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(got, -aux['alignment'] + 0.3 * aux['repulsion'], rtol=1e-5)
  # Padding rows (weight 0) change nothing: the objective of the 5 real rows alone.
  weights = (jnp.arange(8) < 5).astype(jnp.float32)
  padded, _ = training.phase_a_objective(params, inputs, batch['labels'], weights,
                                         feature_map='softplus', lam=0.3, s=1.0, softening=0.5)
  real = sum(hamiltonian.hamiltonian(flat[path + ('particles',)][h], r[:5, h], y[:5],
                                     feature_map='softplus', lam=0.3, s=1.0, softening=0.5)
             for path, r in inputs.items() for h in range(2))
  np.testing.assert_allclose(padded, real, rtol=1e-5)


@pytest.mark.slow
def test_phase_a_raises_the_alignment_on_a_fixed_batch():
  model, batch = _model(feature_map='elu'), _batch(b=32, key=4)
  params = _init(model, batch)
  opt_a = training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=0.05, beta=1e6,
                                     radius=10.0, clip_norm=1e3)
  step_a = jax.jit(training.make_phase_a_step(model, opt_a, feature_map='elu', lam=0.0,
                                              s='coulomb', softening=0.5))
  state = training.TrainState(jnp.zeros([], jnp.int32), params, opt_a.init(params))
  first = None
  for _ in range(30):
    state, m = step_a(state, batch)
    first = float(m['alignment']) if first is None else first
  assert float(m['alignment']) > first


def test_partition_labels_select_exactly_the_particles():
  model, batch = _model(), _batch()
  labels = traverse_util.flatten_dict(training.partition_labels(_init(model, batch)))
  assert {k for k, v in labels.items() if v == 'particles'} == {
      ('attention_0', 'particles'), ('attention_1', 'particles')}
  assert not training.has_particles(_init(_model(attention='softmax'), batch))


def test_attention_paths_are_in_layer_order():
  params = {f'attention_{i}': {'particles': 0, 'value': 1} for i in (10, 2, 0)}
  assert training.attention_paths(params) == [('attention_0',), ('attention_2',),
                                              ('attention_10',)]


def test_layer_step_moves_only_its_layers_particles_on_cached_inputs():
  model, batch = _model(feature_map='favor'), _batch()
  params = _init(model, batch)
  paths = training.attention_paths(params)
  inputs = training.phase_a_inputs(model, params, batch)
  opt = training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=1e-2, beta=50.0,
                                   radius=1.5, clip_norm=10.0, only=paths[1])
  step = jax.jit(training.make_phase_a_layer_step(paths[1], opt, feature_map='favor',
                                                  lam=1e-3, s='coulomb', softening=0.5))
  state = training.TrainState(jnp.zeros([], jnp.int32), params, opt.init(params))
  new, m = step(state, inputs[paths[1]], batch['labels'], batch['weights'])
  before, after = traverse_util.flatten_dict(params), traverse_util.flatten_dict(new.params)
  moved = {k for k in before if not np.array_equal(before[k], after[k])}
  assert moved == {paths[1] + ('particles',)}
  assert float(m['max_move']) > 0 and int(new.step) == 1
  # Its H is this layer's term of the joint objective.
  want, _ = training.phase_a_objective(params, {paths[1]: inputs[paths[1]]}, batch['labels'],
                                       batch['weights'], feature_map='favor', lam=1e-3,
                                       s='coulomb', softening=0.5)
  np.testing.assert_allclose(m['hamiltonian'], want, rtol=1e-6)


@pytest.mark.slow
def test_pooled_keys_table_holds_each_rows_phase_a_inputs():
  from configs import text
  from coulomb_jax.tasks import data
  from experiments.run import evaluation
  rng = np.random.default_rng(0)
  ids = [rng.integers(1, VOCAB, size=n).astype(np.int32) for n in rng.integers(2, 16, size=11)]
  encoded = data.Encoded(ids, [np.zeros_like(x) for x in ids],
                         rng.integers(0, 2, 11).astype(np.int32))
  config = text.get_text_config('sst2', 'kernel-favor,quick')
  config.run.eval_batch_size, config.data.pad_multiple = 4, 8
  model, batch = _model(feature_map='favor'), _batch()
  params = _init(model, batch)
  path = training.attention_paths(params)[1]
  inputs_fn = jax.jit(lambda p, b, paths: {k: training.phase_a_inputs(model, p, b)[k]
                                            for k in paths}, static_argnames='paths')
  table = evaluation.pooled_keys(inputs_fn, params, encoded, [path], sharding.Sharder(),
                                 config)[path]
  assert table.shape == (11, 2, 8)
  # The same rows in another batch, in file order, padded to 16.
  rows = next(data.batches(encoded, 11, pad_multiple=16))
  want = training.phase_a_inputs(model, params, rows)[path]
  np.testing.assert_allclose(table, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- experiments/train.py

def _config(**overrides):
  from configs import text
  config = text.get_text_config('sst2', 'kernel-favor,quick')
  config.data.data_dir = DATA_DIR
  config.data.max_train_examples = 64
  config.data.vocab_size = 200
  config.phase_a.batch_size = config.phase_b.batch_size = 16
  config.data.max_eval_examples = 64
  config.model.num_layers = 1
  # One padded shape (64 tokens) for every batch: one compilation per step function.
  config.data.max_length = config.data.pad_multiple = 64
  config.run.checkpoint_every = 3
  for k, v in overrides.items():
    section, field = k.split('.')
    config[section][field] = v
  return config


def _final_params(workdir):
  from experiments.run import checkpoints
  manager = checkpoints.checkpoint_manager(workdir)
  return manager.restore(manager.latest_step())['best_params']


needs_data = pytest.mark.skipif(not os.path.isdir(os.path.join(DATA_DIR, 'glue', 'SST-2')),
                                reason='SST-2 copy not found')


@pytest.mark.slow
@needs_data
def test_end_to_end_on_64_sst2_rows_and_resume_gives_the_same_parameters(tmp_path):
  from experiments import train
  full = train.train_and_evaluate(_config(), str(tmp_path / 'full'))
  assert full['phase_a_steps'] == 4 and full['dataset'] == 'sst2'
  for split in ('validation', 'test'):
    assert 0.0 <= full[split]['accuracy'] <= 1.0
    assert np.isfinite(full[split]['log_loss'])
  assert json.load(open(tmp_path / 'full' / 'results.json'))['test'] == full['test']

  resumed_dir = str(tmp_path / 'resumed')
  assert train.train_and_evaluate(_config(), resumed_dir, stop_after_steps=2) is None  # in A
  assert train.train_and_evaluate(_config(), resumed_dir, stop_after_steps=5) is None  # in B
  resumed = train.train_and_evaluate(_config(), resumed_dir)
  assert resumed['test'] == full['test']
  assert len(full['sessions']) == 1 and len(resumed['sessions']) == 3   # one per call
  assert {s['device_count'] for s in resumed['sessions']} == {jax.device_count()}
  for a, b in zip(jax.tree.leaves(_final_params(resumed_dir)),
                  jax.tree.leaves(_final_params(str(tmp_path / 'full')))):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match='different config'):
    train.train_and_evaluate(_config(**{'phase_b.learning_rate': 1.0}), resumed_dir)


@pytest.mark.slow
@needs_data
def test_layerwise_phase_a_runs_every_layer_and_resumes_mid_layer(tmp_path):
  from experiments import train
  config = lambda: _config(**{'phase_a.schedule': 'layerwise', 'model.num_layers': 2,
                              'run.checkpoint_every': 0})
  full = train.train_and_evaluate(config(), str(tmp_path / 'full'))
  assert full['phase_a_steps'] == 8  # 4 steps per layer
  resumed_dir = str(tmp_path / 'resumed')
  # Stops after the first step of the second layer; the first is done and cached keys
  # of the second are computed again on resume.
  assert train.train_and_evaluate(config(), resumed_dir, stop_after_steps=5) is None
  resumed = train.train_and_evaluate(config(), resumed_dir)
  assert resumed['test'] == full['test']
  for a, b in zip(jax.tree.leaves(_final_params(resumed_dir)),
                  jax.tree.leaves(_final_params(str(tmp_path / 'full')))):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('field, value', [
    ('data.task', 'mnli'), ('data.data_dir', '/nonexistent'), ('model.feature_map', 'rff'),
    ('model.num_heads', 0), ('model.width', 33), ('phase_a.beta', 0.0), ('phase_b.batch_size', 0),
    ('phase_b.warmup_fraction', 1.5), ('model.attention', 'lstm'),
    ('phase_a.schedule', 'greedy')])
def test_bad_config_fails_before_any_compute(field, value, tmp_path):
  from experiments import train
  config = _config(**{field: value})
  with pytest.raises(ValueError, match=f'config.{field}'):
    train.train_and_evaluate(config, str(tmp_path / 'w'))
  assert not os.path.exists(tmp_path / 'w')


@pytest.mark.parametrize('field, value, match', [
    ('data.max_length', 100, 'multiple of data.pad_multiple'),
    ('phase_a.riesz_s', 'two', "'coulomb' or a number"),
    ('phase_a.num_epochs', 0, 'when phase_a.enabled'),
    ('model.feature_map', 'elu', "'favor' for variant 'kernel-favor'"),
    ('phase_a.enabled', False, "True for variant 'kernel-favor'"),
    ('model.init_radius', 1.5, "0 for variant 'kernel-favor'"),
    ('data.validation_rule', 'words', 'one of'),
    ('variant', 'nonsense', 'one of')])
def test_config_checks_catch_inconsistent_fields(field, value, match):
  from experiments.run import run_folder
  config = _config(**({} if field == 'variant' else {field: value}))
  if field == 'variant':
    config.variant = value
  with pytest.raises(ValueError, match=f'config.{field}: expected .*{match}'):
    train_config.check_config(config)
  config = _config(**{'phase_a.riesz_s': '1.0'})    # a number, as the command line gives it
  train_config.check_config(config)
  # A run saved before data.validation_rule existed resumes as the rule it used.
  saved = run_folder.saved_config(_config())
  del saved['data']['validation_rule']
  assert run_folder.with_added_fields(saved) == run_folder.saved_config(_config())


def test_phase_a_on_softmax_attention_is_refused():
  config = _config(**{'model.attention': 'softmax'})
  with pytest.raises(ValueError, match='config.phase_a.enabled'):
    train_config.check_config(config)


_SHARDED = r'''
import jax, jax.numpy as jnp, numpy as np
from coulomb_jax import training
from coulomb_jax.layers import models
from experiments.run import sharding
assert jax.device_count() == 8
model = models.EncoderClassifier(vocab_size=40, max_length=16, width=16, num_heads=2,
                                 ffn_dim=16, num_features=8, dropout_rate=0.1, num_layers=1)
rng = np.random.default_rng(0)
def batch(i):
  lengths = rng.integers(2, 13, 16)
  mask = np.arange(16)[None] < lengths[:, None]
  ids = np.where(mask, rng.integers(1, 40, (16, 16)), 0).astype(np.int32)
  return {'ids': ids, 'segments': np.zeros_like(ids), 'mask': mask,
          'labels': rng.integers(0, 2, 16).astype(np.int32), 'weights': np.ones(16, np.float32)}
batches = [batch(i) for i in range(4)]
params = model.init(jax.random.key(1), batches[0]['ids'], batches[0]['segments'],
                    batches[0]['mask'])['params']
opt_a = training.phase_a_optimizer(jax.random.PRNGKey(0), step_size=1e-2, beta=50.0,
                                   radius=1.5, clip_norm=10.0)
opt_b = training.phase_b_optimizer(learning_rate=1e-2, warmup_steps=1, total_steps=4,
                                   weight_decay=1e-4, clip_norm=1.0)
step_a = jax.jit(training.make_phase_a_step(model, opt_a, feature_map='favor', lam=1e-3,
                                            s='coulomb', softening=0.5))
step_b = jax.jit(training.make_phase_b_step(model, opt_b))
def trajectory(devices):
  sh = sharding.Sharder(devices)
  st = training.TrainState(jnp.zeros([], jnp.int32), sh.replicate(params),
                           sh.replicate(opt_a.init(params)))
  out = []
  for b in batches:
    st, m = step_a(st, sh.batch(b)); out.append(float(m['hamiltonian']))
  st = training.TrainState(jnp.zeros([], jnp.int32), st.params, sh.replicate(opt_b.init(st.params)))
  for b in batches:
    st, m = step_b(jax.random.key(2), st, sh.batch(b)); out.append(float(m['loss']))
  assert len(st.params['layer_0']['ffn_in']['kernel'].sharding.device_set) == len(devices)
  return np.array(out)
one, eight = trajectory(jax.devices()[:1]), trajectory(jax.devices())
np.testing.assert_allclose(eight, one, rtol=2e-5, atol=1e-6)
print('OK', one.tolist())
'''


@pytest.mark.slow
def test_eight_fake_devices_follow_the_one_device_trajectory():
  flags = os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', _SHARDED], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'OK' in out.stdout


# ----------------------------------------------------------------------------- schedules

def test_phase_schedules_and_the_epochs_model_selection_may_keep():
  S = training.Stage
  assert training.phase_schedule('joint', num_layers=2, a_epochs=3, b_epochs=5) == [
      S('a', 3), S('b', 5)]
  assert training.phase_schedule('layerwise', num_layers=2, a_epochs=1, b_epochs=5) == [
      S('a', 1, layer=0), S('a', 1, layer=1), S('b', 5)]
  after = training.phase_schedule('after_b', num_layers=2, a_epochs=2, b_epochs=5,
                                  after_b_epochs=3)
  assert after == [S('b', 3), S('a', 2, layer=0), S('a', 2, layer=1),
                   S('b', 2, first_epoch=3)]
  alternating = training.phase_schedule('alternating', num_layers=1, a_epochs=1, b_epochs=5,
                                        after_b_epochs=2)
  assert alternating == [S('b', 2), S('a', 1, layer=0), S('b', 2, first_epoch=2),
                         S('a', 1, layer=0, cycle=1), S('b', 1, first_epoch=4)]
  # Phase B epochs cover 0 .. b_epochs − 1 exactly once, in order.
  for stages in (after, alternating):
    epochs = [e for s in stages if s.phase == 'b'
              for e in range(s.first_epoch, s.first_epoch + s.num_epochs)]
    assert epochs == list(range(5))
  assert [training.first_selectable_epoch(s) for s in (after, alternating)] == [3, 2]
  assert training.first_selectable_epoch(
      training.phase_schedule('joint', num_layers=1, a_epochs=1, b_epochs=2)) == 0
  for bad in (0, 5):
    with pytest.raises(ValueError, match='after_b_epochs'):
      training.phase_schedule('after_b', num_layers=1, a_epochs=1, b_epochs=5,
                              after_b_epochs=bad)
  with pytest.raises(ValueError, match='schedule'):
    training.phase_schedule('greedy', num_layers=1, a_epochs=1, b_epochs=5)


@pytest.mark.slow
def test_phase_a_forces_split_the_hamiltonian_gradient():
  model, batch = _model(feature_map='elu'), _batch()
  params = _init(model, batch)
  inputs = training.phase_a_inputs(model, params, batch)
  kw = dict(feature_map='elu', lam=0.3, s=1.0, softening=0.5)
  forces = training.phase_a_forces(params, inputs, batch['labels'], batch['weights'], **kw)
  grads = jax.grad(lambda p: training.phase_a_objective(
      p, inputs, batch['labels'], batch['weights'], **kw)[0])(params)
  for path, g in training.particle_leaves(grads).items():
    np.testing.assert_allclose(forces['hamiltonian'][path], g, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(-forces['alignment'][path] + 0.3 * forces['repulsion'][path], g,
                               rtol=1e-4, atol=1e-6)
  only = training.attention_paths(params)[0]
  assert list(training.phase_a_forces(params, inputs, batch['labels'], batch['weights'],
                                      only=only, **kw)['alignment']) == [only]
  held = training.heldout_alignment(params, inputs, batch['labels'], feature_map='elu')
  for path, d in held.items():
    assert np.shape(d['alignment']) == (2,) == np.shape(d['centered_alignment'])  # per head
    assert np.all(np.abs(d['centered_alignment']) <= 1.0)


def _after_b(**overrides):
  return _config(**{'phase_a.schedule': 'after_b', 'phase_a.after_b_epochs': 1,
                    'phase_a.relative_step': 0.05, 'phase_a.gibbs_tilt': 100.0,
                    'phase_a.relative_lam': 0.5, 'phase_a.riesz_s': '1.0',
                    'phase_a.calibration_rows': 32, 'phase_a.heldout_rows': 32,
                    'run.log_every': 2, **overrides})


@pytest.mark.slow
@needs_data
def test_after_b_learns_on_the_trained_encoder_resumes_and_shares_its_prefix(tmp_path):
  from experiments import train
  full = train.train_and_evaluate(_after_b(), str(tmp_path / 'full'))
  assert full['selected_from_epoch'] == 1 and full['best_epoch'] == 1
  assert full['phase_a_steps'] == 4
  report = full['phase_a']
  for field in ('drift_to_noise', 'repulsion_to_alignment', 'gibbs_tilt', 'displacement',
                'random_walk_displacement', 'inside_fraction'):
    assert np.isfinite(report[field]), field
  for stat in ('heldout_alignment', 'heldout_centered_alignment'):
    assert set(report[stat]) == {'initial', 'ball', 'ball_own_keys', 'learned', 'null'}
  stage = report['stages'][0]
  assert stage['gibbs_tilt'] == pytest.approx(100.0, rel=1e-5)   # the tilt rule
  assert stage['layer'] == 0 and stage['steps'] == 4
  # The noise-only walk of the same length moves the particles about σ·√T.
  assert stage['random_walk_displacement'] == pytest.approx(
      stage['noise_per_step'] * 2.0, rel=0.5)
  assert os.path.exists(tmp_path / 'full' / 'predictions_test.npz')

  # Killed in the middle of Phase A (2 B steps, then 1 of 4 A steps): the same result.
  resumed_dir = str(tmp_path / 'resumed')
  assert train.train_and_evaluate(_after_b(), resumed_dir, stop_after_steps=5) is None
  resumed = train.train_and_evaluate(_after_b(), resumed_dir)
  assert resumed['test'] == full['test']
  assert resumed['phase_a']['heldout_centered_alignment'] == report['heldout_centered_alignment']

  # Vanilla-X of the same schedule saves the Phase B prefix; Kernel-X started from it is the
  # run above bit for bit; Ball-X from it projects at the Phase A point.
  vanilla_config = _after_b(**{'phase_a.enabled': False})
  vanilla_config.variant = 'vanilla-favor'
  vanilla = train.train_and_evaluate(vanilla_config, str(tmp_path / 'vanilla'))
  assert 'phase_a' not in vanilla and vanilla['selected_from_epoch'] == 1
  forked = train.train_and_evaluate(
      _after_b(**{'run.prefix_from': str(tmp_path / 'vanilla')}), str(tmp_path / 'forked'))
  assert forked['test'] == full['test']
  assert forked['prefix']['phase_b_steps'] == 4 and forked['prefix']['sessions']
  for a, b in zip(jax.tree.leaves(_final_params(str(tmp_path / 'forked'))),
                  jax.tree.leaves(_final_params(str(tmp_path / 'full')))):
    np.testing.assert_array_equal(a, b)
  ball_config = _after_b(**{'phase_a.enabled': False, 'model.init_radius': 1.5,
                            'run.prefix_from': str(tmp_path / 'vanilla')})
  ball_config.variant = 'ball-favor'
  train.train_and_evaluate(ball_config, str(tmp_path / 'ball'))
  norms = [np.linalg.norm(w, axis=-1) for path, w in training.particle_leaves(
      _final_params(str(tmp_path / 'ball'))).items()]
  assert max(float(n.max()) for n in norms) <= 1.5 + 1e-5
  # What the stages' ball_own_keys control assumes (stages.ball_control): Ball-X's particles
  # are the initial draw (Vanilla-X's, never moved) projected onto the ball.
  drawn = training.particle_leaves(_final_params(str(tmp_path / 'vanilla')))
  for path, w in training.particle_leaves(_final_params(str(tmp_path / 'ball'))).items():
    np.testing.assert_allclose(w, langevin.project_to_ball(drawn[path], 1.5), rtol=1e-6)
  # A prefix of another Phase B config is refused.
  other = _after_b(**{'run.prefix_from': str(tmp_path / 'vanilla'),
                      'phase_b.learning_rate': 1.0})
  with pytest.raises(ValueError, match=r'prefix_from.*phase_b.learning_rate'):
    train.train_and_evaluate(other, str(tmp_path / 'other'))


@pytest.mark.slow
@needs_data
def test_alternating_runs_a_phase_a_pass_between_phase_b_blocks(tmp_path):
  from experiments import train
  config = _after_b(**{'phase_a.schedule': 'alternating', 'phase_b.num_epochs': 3,
                       'phase_a.null_run': False, 'phase_a.relative_lam': 0.0})
  result = train.train_and_evaluate(config, str(tmp_path / 'alt'))
  assert [s['phase'] for s in result['schedule']] == ['b', 'a', 'b', 'a', 'b']
  assert [s['cycle'] for s in result['phase_a']['stages']] == [0, 1]
  assert set(result['phase_a']['heldout_alignment']) == {'initial', 'ball', 'ball_own_keys',
                                                          'learned'}
  assert result['phase_a_steps'] == 8 and result['best_epoch'] >= 1


# ----------------------------------------------------------------------------- the workdir

def _tiny(data_dir, **overrides):
  """Softmax attention (no Phase A), one layer, 64 generated rows, one padded shape."""
  from configs import text
  config = text.get_text_config('rotten_tomatoes', 'softmax,quick')
  config.data.data_dir = data_dir
  config.data.max_train_examples, config.data.vocab_size = 64, 120
  config.data.max_length = config.data.pad_multiple = 32
  config.model.num_layers, config.phase_b.batch_size = 1, 16
  config.run.eval_batch_size, config.run.checkpoint_every = 32, 2
  for k, v in overrides.items():
    section, field = k.split('.')
    config[section][field] = v
  return config


def _snapshot(workdir):
  return {os.path.relpath(os.path.join(d, f), workdir): (os.path.getsize(os.path.join(d, f)),
                                                          os.stat(os.path.join(d, f)).st_mtime_ns)
          for d, _, files in os.walk(workdir) for f in files}


@pytest.mark.slow
def test_a_workdir_whose_data_changed_is_refused_and_left_as_it_was(tmp_path):
  from test_distributed import _mr_data  # pylint: disable=g-import-not-at-top
  from experiments import train
  data_dir = _mr_data(str(tmp_path / 'data'))
  workdir = str(tmp_path / 'run')
  results = train.train_and_evaluate(_tiny(data_dir, **{'phase_b.num_epochs': 1}), workdir)
  stored = json.load(open(os.path.join(workdir, run_folder.FINGERPRINT)))
  assert stored['files'] == results['fingerprint'] and set(stored['files']) == {
      'rotten_tomatoes/rt-polarity.neg', 'rotten_tomatoes/rt-polarity.pos', 'tokenizer.json'}
  before = _snapshot(workdir)
  with open(os.path.join(data_dir, 'rotten_tomatoes', 'rt-polarity.pos'), 'a') as f:
    f.write('one more good line .\n')
  with pytest.raises(ValueError, match=r"^the data of the run in '.*run' changed since this "
                     r'fingerprint was stored: rotten_tomatoes/rt-polarity\.pos \(sha256 '):
    train.train_and_evaluate(_tiny(data_dir, **{'phase_b.num_epochs': 1}), workdir)
  assert _snapshot(workdir) == before                 # results.json and all: untouched.
  # A run continuing from that run's prefix compares the data that run trained on.
  with pytest.raises(ValueError, match=r"^config\.run\.prefix_from: the data '.*run' trained on "
                     r'changed since this fingerprint was stored: rotten_tomatoes/rt-polarity'):
    train.train_and_evaluate(_tiny(data_dir, **{'phase_b.num_epochs': 1,
                                                'run.prefix_from': workdir}),
                             str(tmp_path / 'forked'))
  assert not os.path.exists(tmp_path / 'forked')


@pytest.mark.slow
def test_an_unreadable_latest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
  from test_distributed import _mr_data  # pylint: disable=g-import-not-at-top
  from experiments.run import checkpoints
  from experiments import train

  def damage(step):
    for d, _, files in os.walk(os.path.join(workdir, 'checkpoints', str(step))):
      for f in files:
        if os.path.basename(d) == 'd':               # the array data files
          open(os.path.join(d, f), 'wb').close()

  data_dir = _mr_data(str(tmp_path / 'data'))
  whole = train.train_and_evaluate(_tiny(data_dir), str(tmp_path / 'whole'))
  workdir = str(tmp_path / 'run')
  assert train.train_and_evaluate(_tiny(data_dir), workdir, stop_after_steps=6) is None
  # Checkpoint numbers count the stages done too: softmax's (empty) Phase A stage is 1.
  assert sorted(checkpoints.checkpoint_manager(workdir).all_steps()) == [5, 7]
  damage(7)
  with caplog.at_level('WARNING'):
    resumed = train.train_and_evaluate(_tiny(data_dir), workdir)
  warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert len(warnings) == 1 and '\n' not in warnings[0]
  assert re.search(r'unreadable checkpoint in .*checkpoints \(step 7: .*\): resuming from '
                   r'step 5 instead', warnings[0])
  assert os.listdir(os.path.join(workdir, 'checkpoints_unreadable')) == ['7']
  assert resumed['test'] == whole['test'] and resumed['validation'] == whole['validation']
  # None readable: one error naming the folder (results.json removed: a finished run is
  # not run again, so its checkpoints would not be read).
  for step in checkpoints.checkpoint_manager(workdir).all_steps():
    damage(step)
  os.remove(os.path.join(workdir, 'results.json'))
  with pytest.raises(ValueError, match=r'^.*/run/checkpoints: no readable checkpoint \(step '):
    train.train_and_evaluate(_tiny(data_dir), workdir)


@pytest.mark.slow
def test_a_checkpoint_from_other_data_is_refused(tmp_path):
  """The data fingerprint is inside every checkpoint too: one copied into a run on
  other data (its fingerprint.json agreeing with that data) is refused, not resumed."""
  import shutil  # pylint: disable=g-import-not-at-top
  from test_distributed import _mr_data  # pylint: disable=g-import-not-at-top
  from experiments import train
  first, second = _mr_data(str(tmp_path / 'd1')), _mr_data(str(tmp_path / 'd2'))
  with open(os.path.join(second, 'rotten_tomatoes', 'rt-polarity.pos'), 'a') as f:
    f.write('one more good line .\n')
  ours, theirs = str(tmp_path / 'ours'), str(tmp_path / 'theirs')
  assert train.train_and_evaluate(_tiny(first), theirs, stop_after_steps=4) is None
  assert train.train_and_evaluate(_tiny(second), ours, stop_after_steps=2) is None
  shutil.rmtree(os.path.join(ours, 'checkpoints'))
  shutil.copytree(os.path.join(theirs, 'checkpoints'), os.path.join(ours, 'checkpoints'))
  with pytest.raises(ValueError, match=r'^checkpoint step \d+ in .*ours/checkpoints: written '
                     r'from other data \(data fingerprint sha256 [0-9a-f]{12}…, the data and '
                     r'tokenizer now hash to [0-9a-f]{12}…\)'):
    train.train_and_evaluate(_tiny(second), ours)
  assert not os.path.exists(os.path.join(ours, 'results.json'))
