"""Phase A's softmax target (``config.phase_a.target = 'softmax'``): the objective against
brute force, padding, the first-variation potential, and a tiny end-to-end run."""

import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import mimicry
from coulomb_jax import training
from coulomb_jax.layers import models
from coulomb_jax.training import phase_a_mimicry
from experiments.run import train_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_DIR = os.environ.get('COULOMB_DATA_DIR', os.path.join(REPO, '..', 'shared', 'data'))
PATH = ('attention_0',)
KW = dict(feature_map='favor', lam=0.3, s=1.0, softening=0.5)


def _case(b=2, length=5, h=2, d=4, m=3, lengths=(5, 3), key=0):
  """Particles ``[H, M, D]``, separate q and k ``[B, L, H, D]`` and a token mask."""
  kw, kq, kk = jax.random.split(jax.random.key(key), 3)
  omega = 0.7 * jax.random.normal(kw, (h, m, d))
  q = jax.random.normal(kq, (b, length, h, d))
  k = jax.random.normal(kk, (b, length, h, d))
  mask = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  return {'attention_0': {'particles': omega}}, {PATH: (q, k)}, jnp.asarray(mask)


def _brute_force(omega, q, k, mask, lam, s, eps):
  """H in float64 numpy: per head, the mean over real queries of −Σ_j A_soft log A_lin
  (FAVOR+ features, keys over the row's real tokens) plus λ·W_s."""
  omega, q, k = (np.asarray(x, np.float64) for x in (omega, q, k))
  heads, m, d = omega.shape
  total = 0.0
  for h in range(heads):
    w = omega[h]
    phi = lambda x: np.exp(x @ w.T - 0.5 * np.sum(x * x, -1, keepdims=True)) / np.sqrt(m)
    ces = []
    for b in range(q.shape[0]):
      real = np.flatnonzero(mask[b])
      qb, kb = q[b, real, h], k[b, real, h]
      logits = qb @ kb.T / np.sqrt(d)
      soft = np.exp(logits - logits.max(1, keepdims=True))
      soft /= soft.sum(1, keepdims=True)
      kern = phi(qb * d ** -0.25) @ phi(kb * d ** -0.25).T
      lin = kern / kern.sum(1, keepdims=True)
      ces += list(-np.sum(soft * np.log(lin), axis=1))
    sq = np.sum((w[:, None] - w[None]) ** 2, -1)
    g = (sq + eps ** 2) ** (-s / 2)
    total += np.mean(ces) + lam * (g.sum() - np.trace(g)) / m ** 2
  return total


def test_softmax_objective_value_and_gradient_equal_brute_force():
  params, inputs, mask = _case()
  q, k = inputs[PATH]
  mask_np = np.asarray(mask)
  objective = jax.jit(lambda p: phase_a_mimicry.phase_a_mimicry_objective(p, inputs, mask, **KW))
  h, aux = objective(params)
  omega = np.asarray(params['attention_0']['particles'], np.float64)
  f = lambda w: _brute_force(w, q, k, mask_np, 0.3, 1.0, 0.5)
  assert float(h) == pytest.approx(f(omega), rel=1e-5)
  assert float(aux['cross_entropy']) == pytest.approx(_brute_force(
      omega, q, k, mask_np, 0.0, 1.0, 0.5), rel=1e-5)
  grad = jax.jit(jax.grad(lambda p: objective(p)[0]))(params)
  numeric = np.zeros_like(omega)
  for i in np.ndindex(*omega.shape):          # central differences in float64
    e = np.zeros_like(omega)
    e[i] = 1e-6
    numeric[i] = (f(omega + e) - f(omega - e)) / 2e-6
  np.testing.assert_allclose(grad['attention_0']['particles'], numeric, rtol=2e-4, atol=1e-5)
  # The forces split ∇H = ∇CE + λ∇W, and the labels play no part.
  forces = jax.jit(lambda p: phase_a_mimicry.phase_a_mimicry_forces(p, inputs, mask, **KW))(params)
  want = grad['attention_0']['particles']
  np.testing.assert_allclose(forces['hamiltonian'][PATH], want, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(forces['cross_entropy'][PATH] + 0.3 * forces['repulsion'][PATH],
                             want, rtol=1e-5, atol=1e-7)


def test_padding_changes_neither_the_objective_nor_its_gradient():
  params, inputs, mask = _case(lengths=(5, 3))
  q, k = inputs[PATH]
  # The same rows padded to 8 tokens with wild values, and a third row of NaN padding.
  pad = lambda x, key: jnp.concatenate(
      [jnp.concatenate([x, 30.0 * jax.random.normal(key, (2, 3) + x.shape[2:])], axis=1),
       jnp.full((1, 8) + x.shape[2:], jnp.nan)], axis=0)
  padded = {PATH: (pad(q, jax.random.key(5)), pad(k, jax.random.key(6)))}
  batch = {'mask': np.pad(np.asarray(mask), ((0, 1), (0, 3)), constant_values=False),
           'weights': np.array([1.0, 1.0, 0.0], np.float32)}
  batch['mask'][2, :4] = True                   # a padding row's tokens count for nothing
  padded_mask = phase_a_mimicry.token_mask(batch)
  assert not np.any(np.asarray(padded_mask)[2])
  value = lambda p, i, mk: phase_a_mimicry.phase_a_mimicry_objective(p, i, mk, **KW)[0]
  value_and_grad = jax.jit(jax.value_and_grad(value))
  v0, g0 = value_and_grad(params, inputs, mask)
  v1, g1 = value_and_grad(params, padded, padded_mask)
  assert float(v1) == pytest.approx(float(v0), rel=1e-6)
  np.testing.assert_allclose(g1['attention_0']['particles'], g0['attention_0']['particles'],
                             rtol=1e-5, atol=1e-7)
  heldout = jax.jit(lambda p, i, mk: phase_a_mimicry.heldout_attention_kl(
      p, i, mk, feature_map='favor'))
  kl0 = heldout(params, inputs, mask)[PATH]
  kl1 = heldout(params, padded, padded_mask)[PATH]
  np.testing.assert_allclose(kl1, kl0, rtol=1e-5)
  # Without padding the held-out KL is mimicry.attention_kl of each head.
  full = jnp.ones_like(mask)
  kl = heldout(params, inputs, full)[PATH]
  for h in range(2):
    assert float(kl[h]) == pytest.approx(float(mimicry.attention_kl(
        q[:, :, h], k[:, :, h], params['attention_0']['particles'][h], 'favor')), rel=1e-5)
    assert kl[h] > 0


def test_the_potential_is_the_first_variation_of_the_cross_entropy():
  """∇U(ω_k) = M·∇_{ω_k} CE at the particles (as V_D is for the labels)."""
  params, inputs, mask = _case(m=4)
  q, k = (jnp.asarray(x[:, :, 0]) for x in inputs[PATH])
  omega = params['attention_0']['particles'][0]
  u = lambda p: jnp.sum(phase_a_mimicry._head_potentials(p, omega, q, k, mask, 'favor'))
  ce = lambda w: phase_a_mimicry._query_mean(mimicry.attention_cross_entropy, w, q, k, mask,
                                             'favor')
  np.testing.assert_allclose(jax.jit(jax.grad(u))(omega), 4 * jax.jit(jax.grad(ce))(omega),
                             rtol=1e-4, atol=1e-6)
  # Mean of U over the particles is 0: the linear attention's rows sum to 1.
  mean_u = jnp.mean(jax.jit(phase_a_mimicry._head_potentials, static_argnums=5)(
      omega, omega, q, k, mask, 'favor'))
  assert float(mean_u) == pytest.approx(0.0, abs=1e-5)
  pots = jax.jit(lambda key, p: phase_a_mimicry.phase_a_mimicry_potentials(
      key, p, inputs, mask, feature_map='favor', radius=1.5, num_probes=10))(
          jax.random.key(0), params)
  assert pots[PATH].shape == (2, 4 + 10) and np.all(np.isfinite(pots[PATH]))


@pytest.mark.slow
def test_the_mimicry_step_moves_only_the_layers_particles_and_lowers_the_cross_entropy():
  model = models.EncoderClassifier(vocab_size=40, max_length=16, width=16, num_heads=2,
                                   ffn_dim=16, num_features=8, feature_map='favor')
  ids = jax.random.randint(jax.random.key(0), (8, 12), 1, 40)
  mask = jnp.arange(12)[None] < jax.random.randint(jax.random.key(1), (8,), 2, 13)[:, None]
  batch = {'ids': jnp.where(mask, ids, 0), 'segments': jnp.zeros_like(ids), 'mask': mask,
           'labels': jnp.zeros((8,), jnp.int32), 'weights': jnp.ones((8,), jnp.float32)}
  params = model.init(jax.random.key(1), batch['ids'], batch['segments'], mask)['params']
  paths = training.attention_paths(params)
  only = paths[1]
  opt = training.phase_a_optimizer(jax.random.key(2), step_size=1e-2, beta=1e4, radius=1.5,
                                   clip_norm=10.0, only=only)
  step = jax.jit(phase_a_mimicry.make_phase_a_mimicry_step(
      model, opt, only=only, langevin_settings=dict(step_size=1e-2, beta=1e4, clip_norm=10.0),
      feature_map='favor', lam=1e-3, s='coulomb', softening=0.5))
  state = training.TrainState(jnp.zeros([], jnp.int32), params, opt.init(params))
  ce = []
  for _ in range(15):
    state, m = step(state, batch)
    ce.append(float(m['cross_entropy']))
  assert ce[-1] < ce[1]            # ce[0]: before the first projection onto the ball
  assert m['drift_to_noise'].shape == m['repulsion_to_alignment'].shape == (2 * 8,)
  before, after = training.particle_leaves(params), training.particle_leaves(state.params)
  np.testing.assert_array_equal(after[paths[0]], before[paths[0]])
  assert not np.array_equal(after[only], before[only])
  assert float(jnp.max(jnp.linalg.norm(after[only], axis=-1))) <= 1.5 * (1 + 1e-6)


def _config(**overrides):
  from configs import rotten_tomatoes
  config = rotten_tomatoes.get_config('kernel-favor,quick')
  config.data.data_dir = DATA_DIR
  config.data.max_train_examples, config.data.max_eval_examples = 64, 32
  config.data.vocab_size = 200
  config.data.max_length = config.data.pad_multiple = 32     # one padded shape
  config.model.num_layers = 1
  config.phase_a.target = 'softmax'
  config.phase_a.batch_size, config.phase_a.num_epochs = 16, 3
  config.phase_a.relative_step = 0.02
  config.phase_a.gibbs_tilt = 1e3
  config.phase_a.calibration_rows = config.phase_a.heldout_rows = 32
  config.phase_b.num_epochs, config.phase_b.batch_size = 1, 16
  config.run.eval_batch_size, config.run.log_every = 32, 6
  for key, value in overrides.items():
    section, field = key.split('.')
    config[section][field] = value
  return config


needs_data = pytest.mark.skipif(not os.path.isdir(os.path.join(DATA_DIR, 'rotten_tomatoes')),
                                reason='Rotten Tomatoes copy not found')


@pytest.mark.slow
@needs_data
def test_end_to_end_softmax_target_lowers_the_heldout_attention_kl(tmp_path):
  from experiments import train
  result = train.train_and_evaluate(_config(), str(tmp_path / 'run'))
  report = result['phase_a']
  assert result['phase_a_steps'] == 12 and report['target'] == 'softmax'
  kl = report['heldout_kl']
  assert set(kl) == {'initial', 'ball', 'ball_own_keys', 'learned'}   # no shuffled-label null
  assert kl['ball_own_keys'] == kl['ball']                 # one layer: no layers below
  assert kl['learned'] < kl['ball'] and kl['learned'] < kl['initial']
  assert 'heldout_centered_alignment' not in report
  stage = report['stages'][0]
  assert stage['target'] == 'softmax' and 'no labels' in stage['null_run']
  assert stage['gibbs_tilt'] == pytest.approx(1e3, rel=1e-5)
  for field in ('drift_to_noise', 'repulsion_to_alignment', 'displacement',
                'random_walk_displacement', 'inside_fraction'):
    assert np.isfinite(report[field]), field
  assert 0.0 <= result['test']['accuracy'] <= 1.0
  # Diversity of the initial, ball and learned particles, per layer and head, and its means.
  div = stage['diversity']
  assert set(div) == {'initial', 'ball', 'learned'}
  heads = result['config']['model']['num_heads']
  for name, per_path in div.items():
    assert per_path and all(len(v['effective_rank']) == heads for v in per_path.values())
  assert div['ball'] != div['initial']                      # the projection changes the cloud
  for name in ('initial', 'ball', 'learned'):
    assert 1.0 <= report['diversity'][name]['effective_rank'] <= 16.0     # ≤ min(M, D_h)
    assert 0.0 < report['diversity'][name]['top_direction_share'] <= 1.0
    assert report['diversity'][name]['min_pairwise_distance'] > 0.0


@pytest.mark.parametrize('value', ['softmx', '', 'Softmax'])
def test_a_bad_target_is_refused_before_any_compute(value, tmp_path):
  config = _config(**{'phase_a.target': value})
  with pytest.raises(ValueError, match=r"config\.phase_a\.target: expected one of "
                                       r"\('labels', 'softmax'\), got " + repr(value)):
    train_config.check_config(config)
  if os.path.isdir(DATA_DIR):
    from experiments import train
    with pytest.raises(ValueError, match='config.phase_a.target'):
      train.train_and_evaluate(config, str(tmp_path / 'w'))
    assert not os.path.exists(tmp_path / 'w')


def test_labels_stay_the_default_target():
  from configs import text
  for variant in ('kernel-favor', 'kernel-elu,learn', 'vanilla-favor,quick', 'softmax'):
    assert text.get_text_config('sst2', variant).phase_a.target == 'labels'


def test_a_run_saved_before_the_field_existed_resumes_as_labels():
  from experiments.run import run_folder  # pylint: disable=g-import-not-at-top
  from experiments.run import run_identity  # pylint: disable=g-import-not-at-top
  config = _config(**{'phase_a.target': 'labels'})
  saved = run_folder.saved_config(config)
  del saved['phase_a']['target']
  assert run_folder.with_added_fields(saved) == run_folder.saved_config(config)
  assert run_identity.config_digest(saved) == run_identity.digest_of(config)


def test_ball_control_puts_every_layer_at_the_projected_initial_particles():
  from experiments.run import stages
  config = _config()
  init = {('attention_0',): 3.0 * jnp.ones((2, 4, 8)), ('attention_1',): 0.1 * jnp.ones((2, 4, 8))}
  params = {'attention_0': {'particles': jnp.zeros((2, 4, 8)), 'query': jnp.ones(3)},
            'attention_1': {'particles': 5.0 * jnp.ones((2, 4, 8))}, 'head': jnp.arange(2.0)}
  run = types.SimpleNamespace(config=config, initial_particles=init,
                              sharder=types.SimpleNamespace(replicate=lambda t: t))
  out = stages.ball_control(run, params)
  norms = jnp.linalg.norm(out['attention_0']['particles'], axis=-1)
  np.testing.assert_allclose(norms, config.phase_a.radius, rtol=1e-6)    # 3·√8 > 1.5: on the sphere
  np.testing.assert_array_equal(out['attention_1']['particles'], init[('attention_1',)])  # inside
  np.testing.assert_array_equal(out['attention_0']['query'], params['attention_0']['query'])
  np.testing.assert_array_equal(out['head'], params['head'])
  run.initial_particles = None
  assert stages.ball_control(run, params) is None


@pytest.mark.slow
@needs_data
def test_layer_two_ball_control_is_measured_on_ball_x_keys(tmp_path):
  # Layer-wise labels target, two layers: at layer 0 the layers below are none, so the
  # two ball controls agree; at layer 1 'ball' sees Kernel-X's learned layer 0, while
  # 'ball_own_keys' sees Ball-X's (the projected initial particles).
  from experiments import train
  config = _config(**{'phase_a.target': 'labels', 'phase_a.schedule': 'layerwise',
                      'phase_a.null_run': False, 'phase_a.num_epochs': 2,
                      'model.num_layers': 2})
  result = train.train_and_evaluate(config, str(tmp_path / 'run'))
  first, second = result['phase_a']['stages']
  assert first['heldout']['ball_own_keys'] == first['heldout']['ball']
  own, ball = (second['heldout'][k]['centered_alignment'] for k in ('ball_own_keys', 'ball'))
  assert np.all(np.isfinite(own)) and own != ball
  assert set(result['phase_a']['heldout_centered_alignment']) == {
      'initial', 'ball', 'ball_own_keys', 'learned'}


@pytest.mark.slow
@needs_data
def test_a_repulsion_that_underflows_is_one_config_error(tmp_path):
  # s = 200 at distances ~4 (D_h = 8 draws, inside a ball of radius 12): r^-s is 0 in
  # float32, so relative_lam has nothing to scale; before, a ValueError traceback.
  from experiments import train
  from experiments.common import cli
  config = _config(**{'phase_a.relative_lam': 1.0, 'phase_a.riesz_s': '200.0',
                      'phase_a.radius': 12.0})
  with pytest.raises(cli.ConfigError, match=r"phase_a.relative_lam=1.0: no repulsion force .*"
                                            r"riesz_s='200.0'.*riesz_s=0.0 \(log\)"):
    train.train_and_evaluate(config, str(tmp_path / 'run'))
