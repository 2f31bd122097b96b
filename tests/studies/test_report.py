"""experiments.report on fake grid results; studies.tfidf_baseline on real data."""

import json
import os
import shutil

import numpy as np
import pytest

from coulomb_jax import metrics as metrics_lib
from experiments.common import provenance
from experiments import report
from experiments.analysis import loading
from experiments.analysis import pages
from experiments.analysis import tables
from studies.tfidf_baseline import command as tfidf_baseline

META = {'command': 'python -m experiments.report --runs=grid', 'commit': 'abc123',
        'date': '2025-01-02T00:00:00+00:00', 'machine': {'platform': 'cpu', 'cpu_count': 2}}
DATA_DIR = os.environ.get('COULOMB_DATA_DIR', '/work/shared/data')


def _metrics(accuracy, ece=0.05):
  m = {k: 0.5 for k in loading.METRICS}
  return dict(m, accuracy=accuracy, mcc=2 * accuracy - 1, ece=ece, brier=1 - accuracy)


def _write_run(root, dataset, variant, seed, accuracy, seconds=(10.0, 90.0), epochs=5,
               phase_a=None):
  out = os.path.join(root, dataset, variant, f'seed{seed}')
  os.makedirs(out)
  config = {'variant': variant, 'seed': seed, 'data': {'task': dataset, 'data_dir': 'x'},
            'phase_b': {'num_epochs': epochs}}
  if phase_a is not None:
    config['phase_a'] = phase_a
  result = {
      'command': (f'python -m experiments.train --config=configs/rotten_tomatoes.py:{variant} '
                  f'--workdir={out} --config.seed={seed} --config.phase_b.num_epochs={epochs}'),
      'commit': 'c0ffee', 'date': f'2025-01-0{seed + 1}T00:00:00+00:00',
      'machine': {'platform': 'gpu', 'device_kind': 'H200', 'device_count': 1},
      'dataset': dataset, 'variant': variant, 'seed': seed, 'config': config, 'best_epoch': 3,
      'phase_a_steps': 10, 'phase_a_seconds': seconds[0], 'phase_b_seconds': seconds[1],
      'train_seconds': sum(seconds), 'num_devices': 1, 'num_params': 100,
      'validation': _metrics(accuracy + 0.01), 'test': _metrics(accuracy, ece=0.1 * accuracy)}
  provenance.write_json_atomic(os.path.join(out, 'results.json'), result)


@pytest.fixture
def grid(tmp_path):
  root = str(tmp_path / 'grid')
  _write_run(root, 'rotten_tomatoes', 'kernel-favor', 0, 0.80)
  _write_run(root, 'rotten_tomatoes', 'kernel-favor', 1, 0.84, seconds=(20.0, 100.0))
  _write_run(root, 'rotten_tomatoes', 'vanilla-favor', 0, 0.78, seconds=(0.0, 80.0))
  # Started but not finished: listed, never averaged.
  os.makedirs(os.path.join(root, 'rotten_tomatoes', 'softmax', 'seed0'))
  provenance.write_json_atomic(
      os.path.join(root, 'rotten_tomatoes', 'softmax', 'seed0', 'config.json'),
      {'variant': 'softmax', 'seed': 0, 'data': {'task': 'rotten_tomatoes'}})
  return root


def test_metric_names_match_the_metrics_module():
  got = metrics_lib.classification_metrics([0, 1, 1], [0.2, 0.7, 0.4])
  assert tuple(got) == loading.METRICS


def test_aggregation_schema_mean_and_sample_std(grid, tmp_path):
  out, docs = str(tmp_path / 'results'), str(tmp_path / 'docs' / 'results.md')
  summaries = report.write_report(grid, out, docs, meta=META)
  assert list(summaries) == ['rotten_tomatoes']
  assert not os.path.exists(os.path.join(out, 'sst2.json'))
  with open(os.path.join(out, 'rotten_tomatoes.json')) as f:
    s = json.load(f)
  assert {'dataset', 'split', 'command', 'commit', 'machine', 'variants'} <= set(s)
  assert s['dataset'] == 'rotten_tomatoes' and s['split'] == 'test (1,066; HF split)'
  assert (s['command'], s['commit'], s['machine']) == (META['command'], META['commit'],
                                                       META['machine'])
  # Only variants with finished runs; softmax (unfinished) is listed, not invented.
  assert list(s['variants']) == ['vanilla-favor', 'kernel-favor']
  assert s['unfinished'] == [os.path.join('rotten_tomatoes', 'softmax', 'seed0')]
  kernel, vanilla = s['variants']['kernel-favor'], s['variants']['vanilla-favor']
  assert set(kernel) == set(loading.METRICS + loading.TIMES)
  for m in kernel.values():
    assert set(m) == {'mean', 'std', 'n'}
  acc = kernel['accuracy']
  assert acc['n'] == 2 and acc['mean'] == pytest.approx(0.82)
  assert acc['std'] == pytest.approx(np.std([0.80, 0.84], ddof=1))
  assert acc['std'] == pytest.approx(0.04 / np.sqrt(2))
  assert kernel['train_seconds']['mean'] == pytest.approx(110.0)
  assert kernel['phase_a_seconds']['std'] == pytest.approx(np.std([10.0, 20.0], ddof=1))
  assert vanilla['accuracy'] == {'mean': pytest.approx(0.78), 'std': None, 'n': 1}
  # Paired on seed 0 only (vanilla has no seed 1).
  d = s['paired']['favor']
  assert d['seeds'] == [0] and d['accuracy']['n'] == 1 and d['accuracy']['std'] is None
  assert d['accuracy']['mean'] == pytest.approx(0.02)
  assert d['ece']['mean'] == pytest.approx(0.002)
  assert s['paired_ball'] == {} and s['paired_ball_vanilla'] == {}
  assert [(r['variant'], r['seed']) for r in s['runs']] == [
      ('vanilla-favor', 0), ('kernel-favor', 0), ('kernel-favor', 1)]
  assert s['reference'] is None
  # Seeds and variants collapse to one command template.
  [c] = s['run_commands']
  assert c['runs'] == 3 and c['seeds'] == [0, 1]
  assert ':{variant} ' in c['command'] and '/{variant}/seed{seed} ' in c['command']
  assert '--config.seed={seed}' in c['command']


def test_markdown_rows_reference_and_analysis_survive(grid, tmp_path):
  out, docs = str(tmp_path / 'results'), str(tmp_path / 'results.md')
  os.makedirs(os.path.join(out, 'tfidf'))
  tfidf = {'command': 'python -m experiments.tfidf_baseline', 'commit': 'abc', 'date': 'd',
           'machine': {}, 'dataset': 'rotten_tomatoes', 'variant': 'tfidf_logreg', 'seed': 0,
           'C': 4.0, 'train_seconds': 3.0, 'validation': _metrics(0.75),
           'test': _metrics(0.7852)}
  provenance.write_json_atomic(os.path.join(out, 'tfidf', 'rotten_tomatoes.json'), tfidf)
  report.write_report(grid, out, docs, meta=META)
  with open(docs) as f:
    md = f.read()
  assert '| vanilla-favor | 0.7800 |' in md
  assert '| kernel-favor | 0.8200 ± 0.0283 |' in md
  assert md.index('| vanilla-favor |') < md.index('| kernel-favor |') < md.index('| TF-IDF')
  assert f'| {tables.REFERENCE_NAME} | 0.7852 |' in md
  assert '| softmax |' not in md
  assert '110 ± 14 (A 15 + B 95)' in md
  assert '| favor | +0.0200 |' in md
  assert 'c0ffee' in md and '2025-01-01' in md and '2025-01-02' in md
  assert f'{pages.ANALYSIS_START}\n{pages.PLACEHOLDER}\n{pages.ANALYSIS_END}' in md
  with open(os.path.join(out, 'rotten_tomatoes.json')) as f:
    assert json.load(f)['reference']['metrics']['accuracy']['mean'] == 0.7852

  analysis = f'{pages.ANALYSIS_START}\nKernel-FAVOR beats the paper by 1.2 points.\n\n' \
             f'| hand | table |\n{pages.ANALYSIS_END}'
  provenance.write_atomic(docs, md.replace(
      f'{pages.ANALYSIS_START}\n{pages.PLACEHOLDER}\n{pages.ANALYSIS_END}', analysis))
  _write_run(grid, 'rotten_tomatoes', 'vanilla-favor', 1, 0.80)
  report.write_report(grid, out, docs, meta=META)
  with open(docs) as f:
    md = f.read()
  assert analysis in md and pages.PLACEHOLDER not in md
  assert '| vanilla-favor | 0.7900 ± 0.0141 |' in md


def test_refuses_to_overwrite_a_file_without_markers_and_duplicate_runs(grid, tmp_path):
  docs = str(tmp_path / 'results.md')
  provenance.write_atomic(docs, 'hand-written notes\n')
  with pytest.raises(ValueError, match='no <!-- analysis -->'):
    report.write_report(grid, str(tmp_path / 'results'), docs, meta=META)
  with open(docs) as f:
    assert f.read() == 'hand-written notes\n'
  _write_run(str(tmp_path / 'grid' / 'again'), 'rotten_tomatoes', 'kernel-favor', 0, 0.5)
  with pytest.raises(ValueError, match='two results'):
    loading.load_runs(str(tmp_path / 'grid'))


def test_seeds_with_different_settings_are_not_averaged(tmp_path):
  root = str(tmp_path / 'grid')
  _write_run(root, 'sst2', 'softmax', 0, 0.8, epochs=5)
  _write_run(root, 'sst2', 'softmax', 1, 0.8, epochs=10)
  with pytest.raises(ValueError, match='phase_b.num_epochs'):
    report.write_report(root, str(tmp_path / 'out'), str(tmp_path / 'r.md'), meta=META)


def test_variants_with_different_shared_settings_cannot_share_a_table(tmp_path):
  root = str(tmp_path / 'grid')
  _write_run(root, 'sst2', 'kernel-favor', 0, 0.8, epochs=2,
             phase_a={'enabled': True, 'num_epochs': 1})
  _write_run(root, 'sst2', 'vanilla-favor', 0, 0.8, epochs=2,
             phase_a={'enabled': False, 'num_epochs': 10})   # Phase A off: its fields ignored
  report.write_report(root, str(tmp_path / 'out'), str(tmp_path / 'r.md'), meta=META)
  _write_run(root, 'sst2', 'softmax', 0, 0.8, epochs=5)
  with pytest.raises(ValueError, match=r"\['phase_b.num_epochs'\]; they cannot share a table"):
    report.write_report(root, str(tmp_path / 'out2'), str(tmp_path / 'r2.md'), meta=META)


def test_the_reference_row_is_the_one_held_out_as_the_runs_are(tmp_path):
  root, tfidf = str(tmp_path / 'grid'), str(tmp_path / 'tfidf')
  _write_run(root, 'sst2', 'softmax', 0, 0.8)
  run = os.path.join(root, 'sst2', 'softmax', 'seed0', 'results.json')
  with open(run) as f:
    r = json.load(f)
  r['config']['data']['validation_rule'] = 'sentences'
  provenance.write_json_atomic(run, r)
  ref = dict(r, variant='tfidf_logreg', C=32.0, train_seconds=1.0, validation_rule='rows')
  os.makedirs(tfidf)
  provenance.write_json_atomic(os.path.join(tfidf, 'sst2.json'), ref)      # 'rows': not used
  out = report.write_report(root, str(tmp_path / 'o1'), str(tmp_path / 'r1.md'),
                            tfidf_dir=tfidf, meta=META)
  assert out['sst2']['reference'] is None
  provenance.write_json_atomic(os.path.join(tfidf, 'sst2_sentences.json'),
                               dict(ref, C=2.0, validation_rule='sentences'))
  out = report.write_report(root, str(tmp_path / 'o2'), str(tmp_path / 'r2.md'),
                            tfidf_dir=tfidf, meta=META)
  assert out['sst2']['reference']['C'] == 2.0
  # A mislabelled file is refused rather than compared.
  provenance.write_json_atomic(os.path.join(tfidf, 'sst2_sentences.json'), ref)
  with pytest.raises(ValueError, match="TF-IDF row held validation out by 'rows'"):
    report.write_report(root, str(tmp_path / 'o3'), str(tmp_path / 'r3.md'), tfidf_dir=tfidf,
                        meta=META)


def test_a_field_added_later_counts_as_its_old_behaviour(tmp_path):
  root = str(tmp_path / 'grid')
  _write_run(root, 'sst2', 'kernel-favor', 0, 0.8)  # recorded before phase_a.schedule existed
  _write_run(root, 'sst2', 'kernel-favor', 1, 0.8, phase_a={'schedule': 'joint'})
  report.write_report(root, str(tmp_path / 'out'), str(tmp_path / 'r.md'), meta=META)
  _write_run(root, 'sst2', 'kernel-favor', 2, 0.8, phase_a={'schedule': 'layerwise'})
  with pytest.raises(ValueError, match='phase_a.schedule'):
    report.write_report(root, str(tmp_path / 'out2'), str(tmp_path / 'r2.md'), meta=META)


@pytest.mark.skipif(not os.path.isdir(os.path.join(DATA_DIR, 'rotten_tomatoes')),
                    reason=f'no Rotten Tomatoes data under {DATA_DIR} (set COULOMB_DATA_DIR)')
def test_tfidf_on_rotten_tomatoes(tmp_path):
  predictions = str(tmp_path / loading.reference_predictions_file('rotten_tomatoes'))
  r = tfidf_baseline.run_tfidf('rotten_tomatoes', DATA_DIR, c_grid=(1.0, 8.0), meta=META,
                               predictions_path=predictions)
  assert r['C'] in (1.0, 8.0) and [s['C'] for s in r['selection']] == [1.0, 8.0]
  best = max(r['selection'], key=lambda s: (s['validation_accuracy'], -s['validation_log_loss']))
  assert best['C'] == r['C'] and best['validation_accuracy'] == r['validation']['accuracy']
  assert r['test']['accuracy'] > 0.7
  assert set(r['test']) == set(loading.METRICS)
  assert (r['dataset'], r['variant'], r['seed']) == ('rotten_tomatoes', 'tfidf_logreg', 0)
  assert r['commit'] == META['commit'] and r['train_seconds'] > 0
  # Its test predictions, for the reliability diagrams: they reproduce the test metrics.
  labels, probs = loading.load_predictions(predictions)
  assert len(labels) == 1066 and predictions.endswith('rotten_tomatoes_predictions_test.npz')
  assert metrics_lib.classification_metrics(labels, probs) == r['test']


def test_subset_runs_are_refused(tmp_path):
  root = str(tmp_path / 'grid')
  _write_run(root, 'rotten_tomatoes', 'kernel-favor', 0, 0.80)
  path = os.path.join(root, 'rotten_tomatoes', 'kernel-favor', 'seed0', 'results.json')
  with open(path) as f:
    r = json.load(f)
  r['config']['data']['max_train_examples'] = 64
  provenance.write_json_atomic(path, r)
  with pytest.raises(ValueError, match='subset'):
    loading.load_runs(root)
  # A grid trained on fixed rows on purpose: accepted, said on the page, no TF-IDF row.
  assert len(loading.load_runs(root, train_subsets=True)[0]) == 1
  docs = str(tmp_path / 'results.md')
  s = report.write_report(root, str(tmp_path / 'out'), docs, meta=META, draw=False,
                          train_subsets=True)['rotten_tomatoes']
  assert s['max_train_examples'] == 64 and s['reference'] is None
  assert 'Every run trained on the same fixed random 64 rows' in open(docs).read()
  r['config']['data']['max_eval_examples'] = 32           # evaluation: full splits only
  provenance.write_json_atomic(path, r)
  with pytest.raises(ValueError, match='subset'):
    loading.load_runs(root, train_subsets=True)


def test_kernel_and_ball_are_paired_per_seed(tmp_path):
  root = str(tmp_path / 'grid')
  for seed, (k, b) in enumerate([(0.80, 0.79), (0.84, 0.80)]):
    _write_run(root, 'rotten_tomatoes', 'kernel-favor', seed, k)
    _write_run(root, 'rotten_tomatoes', 'ball-favor', seed, b)
  _write_run(root, 'rotten_tomatoes', 'vanilla-favor', 1, 0.77)
  report.write_report(root, str(tmp_path / 'out'), str(tmp_path / 'r.md'), meta=META)
  s = json.load(open(tmp_path / 'out' / 'rotten_tomatoes.json'))
  d = s['paired_ball']['favor']
  assert d['seeds'] == [0, 1] and d['accuracy']['mean'] == pytest.approx(0.025)
  # Ball − Vanilla on the one seed both have: 0.80 − 0.77.
  d = s['paired_ball_vanilla']['favor']
  assert d['seeds'] == [1] and d['accuracy']['mean'] == pytest.approx(0.03)
  md = open(tmp_path / 'r.md').read()
  assert 'Paired Kernel-X − Ball-X' in md and 'Paired Ball-X − Vanilla-X' in md


# ----------------------------------------------------------------------------- figures

def test_reliability_bins_hand_computed():
  from experiments.analysis import plots  # pylint: disable=g-import-not-at-top
  # Edges 0, .25, .5, .75, 1 (right-closed, 0 in bin 0): 0.0 and 0.25 → bin 0; 0.3 → 1;
  # 0.5 → 1; 0.9, 1.0 → 3; bin 2 empty.
  labels = [0, 1, 0, 1, 1, 0]
  probs = [0.0, 0.25, 0.3, 0.5, 0.9, 1.0]
  b = plots.reliability_bins(labels, probs, num_bins=4)
  np.testing.assert_allclose(b['edges'], [0, 0.25, 0.5, 0.75, 1.0])
  assert b['count'].tolist() == [2, 2, 0, 2]
  np.testing.assert_allclose(b['mean_prob'], [0.125, 0.4, np.nan, 0.95])
  np.testing.assert_allclose(b['frac_pos'], [0.5, 0.5, np.nan, 0.5])
  # The same edges as metrics.ece: a confidence on an edge falls in the bin below it.
  with pytest.raises(ValueError, match='one shape'):
    plots.reliability_bins([0, 1], [0.5])


def test_t_interval():
  from experiments.analysis import plots  # pylint: disable=g-import-not-at-top
  # n = 3, std 0.02: t_{0.975, 2} = 4.3027; half = 4.3027 · 0.02 / √3 = 0.049683.
  mean, half = plots.t_interval({'mean': 0.01, 'std': 0.02, 'n': 3})
  assert mean == 0.01 and half == pytest.approx(0.049683, rel=1e-4)
  mean, half = plots.t_interval({'mean': 0.01, 'std': None, 'n': 1})
  assert mean == 0.01 and np.isnan(half)


def _write_predictions(root, dataset, variant, seed, labels, shift):
  probs = np.clip(0.5 + shift * (2 * labels - 1), 0.0, 1.0)
  loading.save_predictions(os.path.join(root, dataset, variant, f'seed{seed}',
                                       loading.PREDICTIONS), labels, probs)
  return probs


def test_figures_are_drawn_and_embedded(tmp_path):
  root, out = str(tmp_path / 'grid'), str(tmp_path / 'results')
  docs = str(tmp_path / 'docs' / 'results.md')
  labels = np.array([0, 1] * 533)            # the 1,066 rows of the test split
  for seed in (0, 1):
    for variant, acc, shift in (('kernel-favor', 0.80, 0.3), ('vanilla-favor', 0.78, 0.2),
                                ('ball-favor', 0.79, 0.25), ('softmax', 0.81, 0.35)):
      _write_run(root, 'rotten_tomatoes', variant, seed, acc + 0.01 * seed)
      _write_predictions(root, 'rotten_tomatoes', variant, seed, labels, shift)
  # A run without predictions (an older run): listed in the tables, left out of the diagrams.
  _write_run(root, 'rotten_tomatoes', 'kernel-elu', 0, 0.7)
  os.makedirs(os.path.join(out, 'tfidf'))
  tfidf = {'command': 'python -m experiments.tfidf_baseline', 'commit': 'abc', 'date': 'd',
           'machine': {}, 'dataset': 'rotten_tomatoes', 'variant': 'tfidf_logreg', 'seed': 0,
           'C': 4.0, 'train_seconds': 3.0, 'validation': _metrics(0.75), 'test': _metrics(0.78)}
  provenance.write_json_atomic(os.path.join(out, 'tfidf', 'rotten_tomatoes.json'), tfidf)
  loading.save_predictions(os.path.join(out, 'tfidf', 'rotten_tomatoes_predictions_test.npz'),
                          labels, np.where(labels == 1, 0.7, 0.3))

  run = next(r for r in loading.load_runs(root)[0] if r['variant'] == 'kernel-favor')
  got_labels, got_probs = loading.load_predictions(run['predictions'])
  assert got_labels.dtype == np.int64 and got_labels.tolist() == labels.tolist()
  np.testing.assert_allclose(got_probs, np.where(labels == 1, 0.8, 0.2))

  report.write_report(root, out, docs, meta=META)
  figures = tmp_path / 'docs' / 'figures'
  for name in ('rotten_tomatoes_paired.png', 'rotten_tomatoes_reliability.png'):
    with open(figures / name, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n', name
  md = open(docs).read()
  assert '![Rotten Tomatoes: paired differences](figures/rotten_tomatoes_paired.png)' in md
  assert '![Rotten Tomatoes: reliability diagrams](figures/rotten_tomatoes_reliability.png)' in md
  assert md.index('Paired Kernel-X − Vanilla-X') < md.index('rotten_tomatoes_paired.png')

  runs = loading.load_runs(root)[0]
  panels = pages.reliability_panels(runs, os.path.join(
      out, 'tfidf', loading.reference_predictions_file('rotten_tomatoes')))
  assert list(panels) == ['favor']          # kernel-elu has no predictions
  assert set(panels['favor']) == {'kernel', 'vanilla', 'ball', 'softmax', 'reference'}
  y, p, n = panels['favor']['kernel']
  assert n == 2 and len(y) == len(p) == 2 * 1066  # two seeds pooled
  assert pages.figure_names('docs/results_paper_length.md', 'sst2') == {
      'paired': 'results_paper_length_sst2_paired.png',
      'reliability': 'results_paper_length_sst2_reliability.png'}

  # Predictions on another test split are refused, not pooled.
  _write_predictions(root, 'rotten_tomatoes', 'softmax', 1, labels[::-1].copy(), 0.3)
  with pytest.raises(ValueError, match='hold different test labels'):
    pages.reliability_panels(loading.load_runs(root)[0])


def test_without_predictions_the_docs_say_so(grid, tmp_path):
  docs = str(tmp_path / 'results.md')
  report.write_report(grid, str(tmp_path / 'results'), docs, meta=META)
  md = open(docs).read()
  assert 'Reliability diagrams: no run here saved its per-example test predictions' in md
  assert '(figures/rotten_tomatoes_paired.png)' in md
  assert not os.path.exists(tmp_path / 'figures' / 'rotten_tomatoes_reliability.png')


def test_attention_figure_from_a_benchmark_record(tmp_path):
  from experiments.analysis import plots  # pylint: disable=g-import-not-at-top
  rows = [{'impl': impl, 'feature_map': fmap, 'particles': 'vanilla', 'dtype': 'float32',
           'L': n, 'forward_ms': 1.0, 'forward_backward_ms': 2.0 * n, 'temp_mb': 0.1 * n}
          for impl, fmap, lengths in (('materialized', 'favor', (512, 2048)),
                                      ('softmax', '-', (512,)))
          for n in lengths]
  rows.append(dict(rows[0], particles='learned'))
  path = plots.attention_figure(str(tmp_path / 'f' / 'attention.png'), {'rows': rows})
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  with pytest.raises(ValueError, match='no elu/float32 rows'):
    plots.attention_figure(str(tmp_path / 'x.png'), {'rows': rows}, feature_map='elu')


def test_redraw_from_summaries_keeps_the_tables_and_draws_the_paired_figure(grid, tmp_path):
  out, docs = str(tmp_path / 'results'), str(tmp_path / 'docs' / 'results.md')
  report.write_report(grid, out, docs, meta=META, draw=False)
  before = open(docs).read()
  again = 'python -m experiments.report --from_summaries'
  summaries = report.redraw_from_summaries(out, docs, command=again)   # the runs are not read
  assert list(summaries) == ['rotten_tomatoes']
  md = open(docs).read()
  assert '(figures/rotten_tomatoes_paired.png)' in md
  with open(tmp_path / 'docs' / 'figures' / 'rotten_tomatoes_paired.png', 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  table = lambda text: [l for l in text.splitlines() if l.startswith('|')]
  assert table(md) == table(before) and table(md)
  assert f"at `{META['commit']}`" in md and f'by `{again}`: the same summaries' in md
  with open(tmp_path / 'docs' / 'figures' / 'rotten_tomatoes_paired.png', 'rb') as f:
    figure = f.read()
  report.redraw_from_summaries(out, docs, command=again)       # no date or commit of its own
  assert open(docs).read() == md
  with open(tmp_path / 'docs' / 'figures' / 'rotten_tomatoes_paired.png', 'rb') as f:
    assert f.read() == figure

  other = json.load(open(os.path.join(out, 'rotten_tomatoes.json')))
  provenance.write_json_atomic(os.path.join(out, 'sst2.json'),
                               dict(other, dataset='sst2', commit='fff'))
  with pytest.raises(ValueError, match='come from 2 different report runs'):
    report.redraw_from_summaries(out, docs, command=again)
  with pytest.raises(ValueError, match='holds no summary'):
    report.redraw_from_summaries(str(tmp_path / 'empty'), docs, command=again)


def test_keep_others_keeps_an_earlier_datasets_summary_and_figures(grid, tmp_path):
  out, docs = str(tmp_path / 'results'), str(tmp_path / 'docs' / 'results.md')
  report.write_report(grid, out, docs, meta=META)                 # rotten_tomatoes, then
  rt = open(os.path.join(out, 'rotten_tomatoes.json')).read()     # its runs are gone
  sst2 = str(tmp_path / 'grid2')
  _write_run(sst2, 'sst2', 'kernel-favor', 0, 0.81)
  _write_run(sst2, 'sst2', 'vanilla-favor', 0, 0.79)
  later = dict(META, commit='def456')
  # Without keep_others the page would lose Rotten Tomatoes: refused, nothing written.
  page = open(docs).read()
  with pytest.raises(ValueError, match=r'rotten_tomatoes: 3 run\(s\).*fewer'):
    report.write_report(sst2, out, docs, meta=later, draw=False)
  assert open(docs).read() == page and not os.path.exists(os.path.join(out, 'sst2.json'))
  # allow_fewer: the page is only what the runs show.
  assert list(report.write_report(sst2, out, docs, meta=later, draw=False,
                                  allow_fewer=True)) == ['sst2']
  assert 'Rotten Tomatoes' not in open(docs).read().split('## Provenance')[0]
  summaries = report.write_report(sst2, out, docs, meta=later, keep_others=True)
  assert list(summaries) == ['sst2', 'rotten_tomatoes']            # SPLIT_NAMES order
  assert open(os.path.join(out, 'rotten_tomatoes.json')).read() == rt   # not rewritten
  assert json.load(open(os.path.join(out, 'sst2.json')))['commit'] == 'def456'
  md = open(docs).read()
  assert '(figures/rotten_tomatoes_paired.png)' in md and '(figures/sst2_paired.png)' in md
  assert ("summary `<out>/rotten_tomatoes.json` and figures kept from "
          f"`{META['command']}` at `{META['commit']}`") in md
  assert 'kept from' not in md.split('## Provenance')[0]


def _tree_bytes(root):
  return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), 'rb').read()
          for d, _, files in os.walk(root) for f in files}


def test_results_are_never_replaced_by_fewer(grid, tmp_path):
  out, docs = str(tmp_path / 'results'), str(tmp_path / 'docs' / 'results.md')
  report.write_report(grid, out, docs, meta=META)
  before = _tree_bytes(str(tmp_path))
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(ValueError, match='no finished run found'):
    report.write_report(str(empty), out, docs, meta=META)
  # A folder holding only an unfinished run (a config.json, no results.json).
  unfinished = tmp_path / 'unfinished' / 'rotten_tomatoes' / 'kernel-favor' / 'seed0'
  unfinished.mkdir(parents=True)
  (unfinished / 'config.json').write_text(json.dumps(
      {'data': {'task': 'rotten_tomatoes'}, 'variant': 'kernel-favor', 'seed': 0}))
  with pytest.raises(ValueError, match='no finished run found'):
    report.write_report(str(tmp_path / 'unfinished'), out, docs, meta=META)
  # One seed fewer than the summary holds.
  fewer = str(tmp_path / 'fewer')
  shutil.copytree(grid, fewer)
  shutil.rmtree(os.path.join(fewer, 'rotten_tomatoes', 'kernel-favor', 'seed1'))
  with pytest.raises(ValueError, match=r'kernel-favor seed 1.*fewer'):
    report.write_report(fewer, out, docs, meta=META)
  after = _tree_bytes(str(tmp_path))
  assert {k: v for k, v in after.items() if k in before} == before
  # The same runs again (or more) are fine.
  report.write_report(grid, out, docs, meta=META)


def test_a_corrupt_summary_is_named(grid, tmp_path):
  out, docs = str(tmp_path / 'results'), str(tmp_path / 'results.md')
  os.makedirs(out)
  with open(os.path.join(out, 'rotten_tomatoes.json'), 'w') as f:
    f.write('{"runs": [')
  with pytest.raises(ValueError, match=r'rotten_tomatoes.json: not valid JSON'):
    report.write_report(grid, out, docs, meta=META)


def test_a_corrupt_predictions_file_is_named(tmp_path):
  path = str(tmp_path / 'predictions_test.npz')
  with open(path, 'wb') as f:
    f.write(b'not an npz at all')
  with pytest.raises(ValueError, match=r'predictions_test\.npz: not a readable predictions '
                     r'\.npz with arrays labels and probs'):
    loading.load_predictions(path)
  np.savez(path, other=np.zeros(3))
  with pytest.raises(ValueError, match=r'predictions_test\.npz: not a readable'):
    loading.load_predictions(path)
  loading.save_predictions(path, [0, 1], [0.2, 0.9])
  labels, probs = loading.load_predictions(path)
  assert labels.tolist() == [0, 1] and probs.tolist() == [0.2, 0.9]
