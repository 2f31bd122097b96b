"""The softmax-mimicry study (studies/softmax_mimicry): conversion, fits, fidelity, results file."""

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import mimicry
from coulomb_jax.layers import models
from coulomb_jax.tasks import data
from experiments.common import cli
from studies.softmax_mimicry import collect
from studies.softmax_mimicry import config as study_config
from studies.softmax_mimicry import conversion
from studies.softmax_mimicry import encoders
from studies.softmax_mimicry import fidelity
from studies.softmax_mimicry import fit
from studies.softmax_mimicry import page

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB, WIDTH, HEADS, LAYERS = 40, 16, 2, 2


def _softmax_encoder():
  """A tiny random softmax EncoderClassifier wrapped as a study ``Encoder``."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  model = models.EncoderClassifier(vocab_size=VOCAB, max_length=16, width=WIDTH,
                                   num_layers=LAYERS, num_heads=HEADS, ffn_dim=32,
                                   dropout_rate=0.0, attention='softmax')
  rng = np.random.default_rng(0)
  ids = [list(rng.integers(1, VOCAB, rng.integers(3, 12))) for _ in range(24)]
  rows = data.Encoded(ids, [[0] * len(x) for x in ids], rng.integers(0, 2, 24))
  batch = next(data.batches(rows, 4))
  params = model.init(jax.random.PRNGKey(0), batch['ids'], batch['segments'],
                      batch['mask'])['params']
  config = ml_collections.ConfigDict({'model': {'attention': 'softmax', 'num_layers': LAYERS,
                                                'num_heads': HEADS, 'width': WIDTH}})
  enc = encoders.Encoder('tiny', config, model, params,
                         {'train': rows, 'validation': rows, 'test': rows}, {'commit': 'x'})
  return enc, rows, batch


@pytest.mark.slow
def test_converted_model_equals_kernel_attention_model_with_the_same_particles():
  enc, _, batch = _softmax_encoder()
  omega = jax.random.normal(jax.random.PRNGKey(1), (LAYERS * HEADS, 8, WIDTH // HEADS))
  converted = conversion.converted_model(enc, omega, 'favor')
  got = converted.apply({'params': enc.params}, batch['ids'], batch['segments'], batch['mask'])
  kernel = enc.model.clone(attention='kernel', feature_map='favor', num_features=8,
                           qk_mode='projected')
  params = dict(enc.params)
  per_layer = omega.reshape(LAYERS, HEADS, 8, -1)
  for i in range(LAYERS):
    params[f'attention_{i}'] = dict(enc.params[f'attention_{i}']['mha'],
                                    particles=per_layer[i])
  want = kernel.apply({'params': params}, batch['ids'], batch['segments'], batch['mask'])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  soft = enc.model.apply({'params': enc.params}, batch['ids'], batch['segments'],
                         batch['mask'])
  assert not np.allclose(got, soft, atol=1e-4)          # the attention really changed


def test_attention_fns_are_checked():
  enc, _, batch = _softmax_encoder()
  one = (lambda *a, **k: None,)
  with pytest.raises(ValueError, match='attention_fns: expected one per layer'):
    enc.model.clone(attention_fns=one).init(jax.random.PRNGKey(0), batch['ids'],
                                            batch['segments'], batch['mask'])
  with pytest.raises(ValueError, match="attention_fns: only for attention='softmax'"):
    enc.model.clone(attention='kernel', attention_fns=one * LAYERS).init(
        jax.random.PRNGKey(0), batch['ids'], batch['segments'], batch['mask'])


def test_head_batches_hold_each_heads_projections():
  enc, rows, _ = _softmax_encoder()
  b = encoders.head_batches(enc, rows, 8, 16)[0]
  g, bsz, length, d = b['q'].shape
  assert (g, bsz, d) == (LAYERS * HEADS, 8, WIDTH // HEADS) and b['mask'].shape == (8, length)
  # Layer 0's input is the embedding sum; its query projection by hand, group = head.
  p = enc.params
  batch = next(data.batches(rows, 8, pad_multiple=16))
  x = (p['tokens']['embedding'][batch['ids']] + p['segments']['embedding'][batch['segments']]
       + p['positions'][None, :length])
  ln = p['layer_0']['ln_attention']
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  h = (x - mu) / np.sqrt(var + 1e-6) * ln['scale'] + ln['bias']
  wq = p['attention_0']['mha']['query']
  q = np.einsum('ble,ehd->hbld', h, wq['kernel']) + np.moveaxis(wq['bias'], 0, 0)[:, None, None]
  np.testing.assert_allclose(b['q'][:HEADS], q, rtol=1e-4, atol=1e-5)
  assert set(np.unique(b['labels'][b['mask'].any(1)])) <= {-1.0, 1.0}


@pytest.mark.slow
@pytest.mark.parametrize('method', fit.METHODS)
def test_every_method_counts_n_features_and_fitted_ones_lower_their_loss(method):
  enc, rows, _ = _softmax_encoder()
  batches = encoders.head_batches(enc, rows, 8, 16, seed=0)
  settings = study_config.get_config().fit
  omega0 = fit.initial(method, jax.random.PRNGKey(0), 4, 16, WIDTH // HEADS, settings.radius)
  assert omega0.shape == (4, 8 if method == 'hedgehog' else 16, WIDTH // HEADS)
  omega, losses = fit.fit(method, jax.random.PRNGKey(1), omega0, batches, settings, steps=30)
  assert omega.shape == omega0.shape and np.all(np.isfinite(omega))
  if method in fit.FITTED:
    assert losses.shape == (30, 4)
    # The same batch (every len(batches) steps) has a lower loss at the end than at the start.
    last = 30 - 30 % len(batches) if 30 % len(batches) else 30 - len(batches)
    assert np.mean(losses[last]) < np.mean(losses[0])
  else:
    assert len(losses) == 0
  if method != 'hedgehog':
    assert np.all(np.linalg.norm(omega, axis=-1) <= settings.radius * (1 + 1e-5)) or \
        method in ('favor_iid', 'favor_orthogonal')


def test_gradient_flow_is_langevin_without_noise_and_repulsion():
  enc, rows, _ = _softmax_encoder()
  batches = encoders.head_batches(enc, rows, 8, 16, seed=0)
  s = study_config.get_config().fit
  omega0 = fit.initial('gradient_flow', jax.random.PRNGKey(0), 4, 8, WIDTH // HEADS, s.radius)
  a, _ = fit.fit('gradient_flow', jax.random.PRNGKey(1), omega0, batches, s, steps=3)
  b, _ = fit.fit('gradient_flow', jax.random.PRNGKey(2), omega0, batches, s, steps=3)
  np.testing.assert_array_equal(a, b)            # no noise: the key does not matter
  s2 = s.copy_and_resolve_references()
  s2.step_size, s2.beta, s2.lam = s.flow_step_size, 1e30, 0.0
  c, _ = fit.fit('particles_softmax', jax.random.PRNGKey(1), omega0, batches, s2, steps=3)
  np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)


def _brute_force_sums(omega, b, g):
  """(Σ row KL, rows, Σ‖ΔO‖², Σ‖O_soft‖²) of group g in float64 numpy, sentence by sentence."""
  kl = n = err = ref = 0.0
  w = np.asarray(omega[g], np.float64)
  for i in range(b['mask'].shape[0]):
    real = b['mask'][i]
    if not real.any():
      continue
    q, k, v = (np.asarray(b[x][g, i][real], np.float64) for x in 'qkv')
    d = q.shape[-1]
    s = q @ k.T / np.sqrt(d)
    soft = np.exp(s - s.max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    x_q, x_k = q * d ** -0.25, k * d ** -0.25
    feat = lambda x: np.exp(x @ w.T - 0.5 * np.sum(x * x, -1, keepdims=True))
    kern = feat(x_q) @ feat(x_k).T
    lin = kern / kern.sum(1, keepdims=True)
    kl += np.sum(soft * (np.log(soft) - np.log(lin)))
    n += len(q)
    err += np.sum((lin @ v - soft @ v) ** 2)
    ref += np.sum((soft @ v) ** 2)
  return np.array([kl, n, err, ref])


def test_heldout_fidelity_matches_brute_force():
  enc, rows, _ = _softmax_encoder()
  batches = encoders.head_batches(enc, rows, 8, 16)
  omega = fit.initial('favor_iid', jax.random.PRNGKey(3), 4, 16, WIDTH // HEADS, 12.0)
  got = fidelity.heldout_fidelity(omega, 'favor', batches)
  for g in range(4):
    kl, n, err, ref = sum(_brute_force_sums(omega, b, g) for b in batches)
    assert n == sum(b['mask'].sum() for b in batches)
    np.testing.assert_allclose(got['kl'][g], kl / n, rtol=1e-4)
    np.testing.assert_allclose(got['output_error'][g], np.sqrt(err / ref), rtol=1e-4)


@pytest.mark.slow
def test_padded_query_rows_change_neither_loss_nor_gradient():
  key = jax.random.PRNGKey(0)
  q = jax.random.normal(key, (2, 6, 8))
  omega = jax.random.normal(jax.random.PRNGKey(1), (5, 8))
  mask = jnp.array([[True] * 4 + [False] * 2, [True] * 6])
  padded_q = q.at[0, 4:].set(7.0)                      # padding rows hold anything
  f = lambda w, x: mimicry.attention_cross_entropy(x, x, w, 'favor', key_mask=mask,
                                                    query_mask=mask)
  np.testing.assert_allclose(f(omega, q), f(omega, padded_q), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(f)(omega, q), jax.grad(f)(omega, padded_q), rtol=1e-5,
                             atol=1e-7)
  # The mean runs over the 10 real rows: the sentence means weighted by their rows.
  one = lambda i, n: mimicry.attention_cross_entropy(q[i:i + 1, :n], q[i:i + 1, :n], omega)
  np.testing.assert_allclose(f(omega, q), (4 * one(0, 4) + 6 * one(1, 6)) / 10, rtol=1e-5)
  with pytest.raises(ValueError, match='query_mask must have shape'):
    mimicry.attention_kl(q, q, omega, query_mask=mask[:, :3])


def _fake_parts(root, seeds=(0, 1)):
  for dataset in ('rotten_tomatoes', 'sst2'):
    for s in seeds:
      out = os.path.join(root, dataset, f'seed{s}')
      os.makedirs(out)
      methods = {m: {str(n): {'kl': [1.0 / n + 0.01 * s + 0.1 * (m == 'favor_iid')] * 4,
                              'output_error': [0.5 / n] * 4}
                     for n in (8, 16, 256)} for m in fit.METHODS}
      methods['hedgehog'] = {str(n): {'kl': [0.001 + 0.001 * s] * 4, 'output_error': [0.01] * 4}
                             for n in (8, 16, 256)}
      with open(os.path.join(out, 'fidelity.json'), 'w') as f:
        json.dump({'run_dir': 'r', 'seed': s, 'commit': 'c', 'encoder_commit': 'e',
                   'methods': methods}, f)
      m = {'accuracy': 0.75 + 0.01 * s, 'log_loss': 0.5, 'ece': 0.05}
      with open(os.path.join(out, 'conversion.json'), 'w') as f:
        json.dump({'run_dir': 'r', 'seed': s, 'commit': 'c', 'test_rows': 10,
                   'finetune_rows': 64, 'softmax': {'zero_shot': m, 'finetuned': m},
                   'methods': {k: {str(n): {'zero_shot': m, 'finetuned': m} for n in (16, 256)}
                               for k in fit.METHODS}}, f)


def test_results_file_has_the_binding_schema_and_the_page_its_block(tmp_path):
  _fake_parts(str(tmp_path / 'w'))
  with open(tmp_path / 'w' / 'pilot.json', 'w') as f:
    json.dump({'dataset': 'rotten_tomatoes', 'seed': 0, 'commit': 'c', 'heldout': 'h',
               'chosen': {'16': {'radius': 8.0, 'step_size': 0.1}}}, f)
  out = str(tmp_path / 'r.json')
  table = collect.write_results(study_config.get_config(), str(tmp_path / 'w'), out)
  with open(out) as f:
    assert json.load(f)['fidelity'] == table['fidelity']
  for source in ('rotten_tomatoes', 'sst2'):
    cell = table['fidelity'][source]['ball']['16']
    assert cell['kl']['n'] == 2 and cell['kl']['ci95'][0] <= cell['kl']['mean']
    assert cell['kl']['mean'] == pytest.approx(1 / 16 + 0.005)
    head = table['headline'][source]
    # favor_orthogonal at 256: 1/256 + 0.005; hedgehog reaches it at N=8, favor_iid never.
    assert head['hedgehog'] == 8 and head['favor_iid'] is None and head['ball'] == 256
    conv = table['conversion'][source]
    assert conv['softmax_accuracy'] == pytest.approx(0.755)
    assert set(conv['particles_softmax']['16']) == {'zero_shot', 'finetuned', 'recovery'}
    assert conv['hedgehog']['256']['recovery'] == pytest.approx(1.0)
  md = str(tmp_path / 'page.md')
  with open(md, 'w') as f:
    f.write('# Title\n\nThe answer in words.\n')
  page.write_page(table, md, str(tmp_path / 'fig'))
  page.write_page(table, md, str(tmp_path / 'fig'))           # a second write replaces
  text = open(md).read()
  assert text.startswith('# Title\n\nThe answer in words.\n') and text.count(page.BEGIN) == 1
  assert '| hedgehog |' in text and os.path.isfile(tmp_path / 'fig' / page.FIDELITY_FIGURE)
  assert '| 16 | 8.0 | 0.1 |' in text                         # the pilot's choice per N


def test_an_empty_workdir_never_replaces_results(tmp_path):
  out = tmp_path / 'r.json'
  out.write_text('{"kept": 1}')
  with pytest.raises(cli.ConfigError, match='holds no finished fidelity part'):
    collect.write_results(study_config.get_config(), str(tmp_path / 'empty'), str(out))
  assert out.read_text() == '{"kept": 1}'


@pytest.mark.slow
@pytest.mark.parametrize('args, message', [
    (['--datasets=imdb'], '--datasets: names from'),
    (['--runs=/nonexistent'], 'has no results.json'),
])
def test_command_refuses_bad_input_in_one_line(args, message, tmp_path):
  proc = subprocess.run([sys.executable, '-m', 'studies.softmax_mimicry',
                         f'--workdir={tmp_path}/w', f'--out={tmp_path}/r.json'] + args,
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert message in proc.stderr and 'Traceback' not in proc.stderr
  assert not os.path.exists(tmp_path / 'r.json')


@pytest.mark.parametrize('field, value, message', [
    ('num_features', (8, 9), 'config.num_features: even integers'),
    ('conversion_features', (48,), 'config.conversion_features: [48] not in'),
    ('data.fit_rows', 0, 'config.data.fit_rows: an integer >= 1'),
    ('fit.step_size', -1.0, 'config.fit.step_size: a number > 0'),
    ('pilot.dataset', 'imdb', 'config.pilot.dataset'),
])
def test_config_is_checked_naming_the_field(field, value, message):
  from studies.softmax_mimicry import command as softmax_mimicry  # pylint: disable=g-import-not-at-top
  config = study_config.get_config()
  section, _, name = field.rpartition('.')
  (config[section] if section else config)[name] = value
  with pytest.raises(cli.ConfigError, match=re.escape(message)):
    softmax_mimicry.check_config(config)


@pytest.mark.slow
def test_pilot_chooses_the_lowest_heldout_kl_at_every_n_and_fidelity_uses_it(tmp_path):
  from studies.softmax_mimicry import study  # pylint: disable=g-import-not-at-top
  enc, _, _ = _softmax_encoder()
  config = study_config.get_config()
  config.num_features, config.conversion_features = (4, 8), (8,)
  config.data.fit_rows, config.data.heldout_rows, config.data.batch_size = 12, 8, 4
  config.pilot.heldout_rows, config.fit.steps = 8, 2
  config.pilot.radius, config.pilot.step_size = (8.0,), (0.03, 0.3)
  config.pilot.flow_step_size, config.pilot.labels_step_size = (0.1,), (0.1,)
  config.pilot.hedgehog_learning_rate = (1e-2,)
  pilot = study.run_pilot(config, enc, str(tmp_path / 'pilot.json'), log=lambda _: None)
  assert set(pilot['chosen']) == {'4', '8'}
  for n in ('4', '8'):
    rows = pilot['scores'][n]['particles_softmax']
    assert len(rows) == 2
    best = min(rows, key=lambda r: r['heldout_kl'])
    assert pilot['chosen'][n]['step_size'] == best['step_size']
    assert study.settings_from(config, pilot, int(n)).step_size == best['step_size']
  out = study.run_fidelity(config, pilot, enc, 0, str(tmp_path / 'part'), log=lambda _: None)
  assert set(out['methods']) == set(fit.METHODS)
  assert out['methods']['hedgehog']['8']['rows'] == 4               # N/2 rows
  assert os.path.isfile(tmp_path / 'part' / 'rows_particles_softmax_8.npy')
  assert not os.path.exists(tmp_path / 'part' / 'rows_particles_softmax_4.npy')


@pytest.mark.parametrize('method', fit.FITTED)
def test_a_fit_that_turns_non_finite_stops_naming_method_group_and_field(method):
  # Issue 39 item 3: the study's own fits stop like the library's (before: NaN features
  # went on into the held-out KL and the page).
  enc, rows, _ = _softmax_encoder()
  batches = encoders.head_batches(enc, rows, 8, 16, seed=0)
  poisoned = [dict(b, q=jnp.asarray(b['q']).at[2].set(jnp.nan),
                   k=jnp.asarray(b['k']).at[2].set(jnp.nan)) for b in batches]
  settings = study_config.get_config().fit
  omega0 = fit.initial(method, jax.random.PRNGKey(0), 4, 8, WIDTH // HEADS, settings.radius)
  with pytest.raises(FloatingPointError) as e:
    fit.fit(method, jax.random.PRNGKey(1), omega0, poisoned, settings, steps=3)
  assert str(e.value).startswith(f'{method}: group 2 (layer-major, layer × head) holds '
                                 'non-finite features after 3 steps')
  assert str(e.value).endswith(f'Lower config.fit.{fit.STEP_FIELD[method]}.')


@pytest.mark.slow
def test_the_pilot_never_chooses_a_candidate_that_diverged(tmp_path, monkeypatch):
  from studies.softmax_mimicry import study  # pylint: disable=g-import-not-at-top
  enc, _, _ = _softmax_encoder()
  config = study_config.get_config()
  config.num_features, config.conversion_features = (4,), (4,)
  config.data.fit_rows, config.data.heldout_rows, config.data.batch_size = 12, 8, 4
  config.pilot.heldout_rows, config.fit.steps = 8, 2
  config.pilot.radius, config.pilot.step_size = (8.0,), (0.03, 0.3)
  config.pilot.flow_step_size, config.pilot.labels_step_size = (0.1,), (0.1,)
  config.pilot.hedgehog_learning_rate = (1e-2,)
  real_fit = fit.fit

  def fit_diverging_at_0_03(method, key, omega0, batches, settings, steps):
    if method == 'particles_softmax' and settings.step_size == 0.03:
      raise FloatingPointError('particles_softmax: group 0 diverged')
    return real_fit(method, key, omega0, batches, settings, steps)
  monkeypatch.setattr(fit, 'fit', fit_diverging_at_0_03)
  pilot = study.run_pilot(config, enc, str(tmp_path / 'pilot.json'), log=lambda _: None)
  rows = pilot['scores']['4']['particles_softmax']
  assert rows[0]['heldout_kl'] is None and 'diverged' in rows[0]['diverged']
  assert np.isfinite(rows[1]['heldout_kl'])
  assert pilot['chosen']['4']['step_size'] == 0.3 and 'diverged' not in pilot['chosen']['4']
  config.pilot.step_size = (0.03,)                  # every candidate diverges: one error
  with pytest.raises(FloatingPointError, match='every particles_softmax candidate diverged'):
    study.run_pilot(config, enc, str(tmp_path / 'pilot2.json'), log=lambda _: None)
  assert not os.path.exists(tmp_path / 'pilot2.json')
