"""studies.phase_a_learning on fake run folders: pairing, intervals, diagnostics, files."""

import json
import os

import numpy as np
import pytest

from studies.phase_a_learning import command as phase_a_learning

_METRICS = {'accuracy': 0.7, 'f1_micro': 0.7, 'f1_macro': 0.7, 'f1_weighted': 0.7,
            'roc_auc': 0.8, 'pr_auc': 0.8, 'mcc': 0.4, 'balanced_accuracy': 0.7,
            'log_loss': 0.6, 'brier': 0.2, 'ece': 0.1}
_PHASE_A = {'schedule': 'after_b', 'after_b_epochs': 3, 'num_epochs': 2, 'relative_step': 0.01,
            'gibbs_tilt': 1e3, 'relative_lam': 0.0, 'riesz_s': 'coulomb', 'softening': 0.5,
            'radius': 1.5, 'clip_norm': 10.0, 'step_size': 2e-3, 'beta': 50.0, 'lam': 1e-3,
            'batch_size': 64, 'null_run': True, 'calibration_rows': 512, 'heldout_rows': 1000}


def _write_run(root, variant, seed, accuracy, rho_learned=None, dataset='rotten_tomatoes',
               max_train_examples=0):
  run = os.path.join(root, dataset, variant, f'seed{seed}')
  os.makedirs(run)
  config = {'variant': variant, 'seed': seed,
            'data': {'task': dataset, 'max_train_examples': max_train_examples},
            'model': {}, 'phase_a': dict(_PHASE_A, enabled=variant.startswith('kernel')),
            'phase_b': {'num_epochs': 5}, 'run': {}}
  results = {'dataset': dataset, 'variant': variant, 'seed': seed, 'config': config,
             'test': dict(_METRICS, accuracy=accuracy), 'validation': _METRICS,
             'sessions': [{'commit': 'abc1234'}]}
  history = []
  if rho_learned is not None:
    stage = {'stage': 1, 'layer': 0, 'steps': 4,
             'heldout': {'initial': {'alignment': 0.0, 'centered_alignment': 0.1},
                         'ball': {'alignment': 0.0, 'centered_alignment': 0.12},
                         'learned': {'alignment': 0.1, 'centered_alignment': rho_learned},
                         'null': {'alignment': 0.0, 'centered_alignment': 0.11}}}
    results['phase_a'] = {
        'drift_to_noise': 2.0 + seed, 'repulsion_to_alignment': 0.5, 'gibbs_tilt': 1e3,
        'displacement': 1.0, 'random_walk_displacement': 0.1, 'inside_fraction': 0.3,
        'heldout_alignment': {k: v['alignment'] for k, v in stage['heldout'].items()},
        'heldout_centered_alignment': {k: v['centered_alignment']
                                       for k, v in stage['heldout'].items()},
        'stages': [stage]}
    history = [{'stage': 1, 'layer': 0, 'phase_a_step': t,
                'heldout': {'alignment': 0.0, 'centered_alignment': 0.1 + 0.05 * t}, 't': t}
               for t in (2, 4)]
  with open(os.path.join(run, 'results.json'), 'w') as f:
    json.dump(results, f)
  with open(os.path.join(run, 'history.jsonl'), 'w') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in history))


def test_paired_differences_intervals_diagnostics_and_files(tmp_path):
  root = str(tmp_path / 'runs')
  for seed, (k, b, v) in enumerate([(0.72, 0.70, 0.69), (0.74, 0.71, 0.70), (0.73, 0.72, 0.72)]):
    _write_run(root, 'kernel-elu', seed, k, rho_learned=0.3)
    _write_run(root, 'ball-elu', seed, b)
    _write_run(root, 'vanilla-elu', seed, v)
  out, docs = str(tmp_path / 'out.json'), str(tmp_path / 'docs' / 'page.md')
  meta = {'command': 'python -m experiments.phase_a_learning', 'commit': 'abc', 'date': 'now',
          'machine': {}}
  result = phase_a_learning.write(root, str(tmp_path), out, docs, str(tmp_path / 'docs' / 'f'),
                                  meta)
  elu = json.load(open(out))['datasets']['rotten_tomatoes']['maps']['elu']
  assert elu == json.loads(json.dumps(result['datasets']['rotten_tomatoes']['maps']['elu']))
  p = elu['paired_kernel_minus_ball']['accuracy']
  diffs = np.array([0.02, 0.03, 0.01])
  half = 4.302652729911275 * diffs.std(ddof=1) / np.sqrt(3)     # t_{0.975, 2}
  assert p['n'] == 3 and p['mean'] == pytest.approx(0.02)
  np.testing.assert_allclose(p['ci95'], [0.02 - half, 0.02 + half], rtol=1e-9)
  assert elu['paired_kernel_minus_vanilla']['accuracy']['mean'] == pytest.approx(
      np.mean([0.03, 0.04, 0.01]))
  assert set(elu['paired_kernel_minus_ball']) == set(phase_a_learning.METRICS)
  assert elu['drift_to_noise'] == 3.0                       # median over seeds
  assert elu['heldout_centered_alignment'] == pytest.approx(
      {'initial': 0.1, 'ball': 0.12, 'learned': 0.3, 'null': 0.11})
  # One map: 'all maps' is that map's comparison.
  pooled = json.load(open(out))['datasets']['rotten_tomatoes']['all_maps']
  assert pooled['paired_kernel_minus_ball']['accuracy']['mean'] == pytest.approx(0.02)
  assert pooled['paired_kernel_minus_ball']['maps'] == ['elu']
  for name in ('alignment', 'paired'):
    assert os.path.getsize(tmp_path / 'docs' / 'f' / f'phase_a_learning_rotten_tomatoes_{name}.png')
  page = open(docs).read()
  assert '<!-- analysis -->' in page and '| elu |' in page and '| **all 1 maps**' in page
  assert 'f/phase_a_learning_rotten_tomatoes_alignment.png' in page
  curves = phase_a_learning.alignment_curves(
      os.path.join(root, 'rotten_tomatoes', 'kernel-elu', 'seed0'),
      json.load(open(os.path.join(root, 'rotten_tomatoes', 'kernel-elu', 'seed0',
                                  'results.json')))['phase_a'])
  assert curves[0]['steps'] == [2, 4] and curves[0]['ball'] == 0.12


def test_kernel_runs_with_other_settings_are_refused(tmp_path):
  root = str(tmp_path / 'runs')
  _write_run(root, 'kernel-elu', 0, 0.7, rho_learned=0.3)
  _write_run(root, 'kernel-cos2', 0, 0.7, rho_learned=0.3)
  path = os.path.join(root, 'rotten_tomatoes', 'kernel-cos2', 'seed0', 'results.json')
  r = json.load(open(path))
  r['config']['phase_a']['gibbs_tilt'] = 10.0
  json.dump(r, open(path, 'w'))
  meta = {'command': 'c', 'commit': 'abc', 'date': 'now', 'machine': {}}
  with pytest.raises(ValueError, match='gibbs_tilt'):
    phase_a_learning.write(root, str(tmp_path), str(tmp_path / 'o.json'),
                           str(tmp_path / 'p.md'), str(tmp_path / 'f'), meta)


def test_a_pilot_of_another_dataset_is_named_when_its_setting_was_transferred(tmp_path):
  root = str(tmp_path / 'runs')
  _write_run(root, 'kernel-elu', 0, 0.7, rho_learned=0.3)
  pilots = tmp_path / 'pilots'
  pilots.mkdir()
  chosen = {'relative_step': 0.01, 'gibbs_tilt': 1e3, 'relative_lam': 0.0}
  json.dump({'command': 'python -m experiments.phase_a_pilot', 'commit': 'c0ffee',
             'dataset': 'sst2', 'seed': 0, 'chosen': 'learn',
             'settings': {'learn': chosen, 'other': dict(chosen, gibbs_tilt=1.0)}},
            open(pilots / 'phase_a_pilot_sst2.json', 'w'))
  meta = {'command': 'c', 'commit': 'abc', 'date': 'now', 'machine': {}}
  result = phase_a_learning.write(root, str(pilots), str(tmp_path / 'o.json'),
                                  str(tmp_path / 'p.md'), str(tmp_path / 'f'), meta)
  by = result['datasets']['rotten_tomatoes']['settings']['chosen_by']
  assert by['pilot_dataset'] == 'sst2' and by['setting'] == 'learn'


def test_all_maps_is_the_per_seed_mean_over_maps_on_the_seeds_every_map_has():
  by = {}
  acc = {('kernel', 'elu'): [0.80, 0.82, 0.81], ('ball', 'elu'): [0.78, 0.80, 0.80],
         ('kernel', 'cos2'): [0.70, 0.74], ('ball', 'cos2'): [0.70, 0.70]}
  for (kind, fmap), values in acc.items():
    by[f'{kind}-{fmap}'] = {s: {'test': dict(_METRICS, accuracy=a)}
                            for s, a in enumerate(values)}
  p = phase_a_learning.all_maps_diff(by, 'ball')
  assert p['maps'] == ['elu', 'cos2'] and p['accuracy']['n'] == 2   # seed 2: elu only
  d = np.array([(0.02 + 0.0) / 2, (0.02 + 0.04) / 2])
  assert p['accuracy']['mean'] == pytest.approx(d.mean())
  half = 12.706204736174698 * d.std(ddof=1) / np.sqrt(2)          # t_{0.975, 1}
  np.testing.assert_allclose(p['accuracy']['ci95'], [d.mean() - half, d.mean() + half],
                             rtol=1e-9)


def test_keep_others_keeps_an_earlier_datasets_entry_with_its_provenance(tmp_path):
  rt, sst2 = str(tmp_path / 'rt'), str(tmp_path / 'sst2')
  for variant, acc in (('kernel-elu', 0.72), ('ball-elu', 0.70), ('vanilla-elu', 0.69)):
    _write_run(rt, variant, 0, acc, rho_learned=0.3 if variant.startswith('kernel') else None)
    _write_run(sst2, variant, 0, acc + 0.1, dataset='sst2', max_train_examples=8530,
               rho_learned=0.2 if variant.startswith('kernel') else None)
  out, docs, figs = str(tmp_path / 'o.json'), str(tmp_path / 'p.md'), str(tmp_path / 'f')
  first = {'command': 'first', 'commit': 'aaa', 'date': 'then', 'machine': {}}
  phase_a_learning.write(rt, str(tmp_path), out, docs, figs, first)
  entry = json.load(open(out))['datasets']['rotten_tomatoes']
  assert entry['generated'] == first
  later = dict(first, command='later', commit='bbb')
  with pytest.raises(ValueError, match='subset'):    # trained on 8530 rows: only if asked
    phase_a_learning.write(sst2, str(tmp_path), out, docs, figs, later)
  # Without keep_others Rotten Tomatoes would be dropped: refused, nothing written.
  saved_before, page = open(out, 'rb').read(), open(docs, 'rb').read()
  with pytest.raises(ValueError, match=r'rotten_tomatoes: 3 run\(s\).*fewer'):
    phase_a_learning.write(sst2, str(tmp_path), out, docs, figs, later, train_subsets=True)
  assert open(out, 'rb').read() == saved_before and open(docs, 'rb').read() == page
  # allow_fewer: only the datasets with runs stay.
  assert list(phase_a_learning.write(sst2, str(tmp_path), out, docs, figs, later,
                                     train_subsets=True, allow_fewer=True)['datasets']) == ['sst2']
  phase_a_learning.write(rt, str(tmp_path), out, docs, figs, first, allow_fewer=True)
  result = phase_a_learning.write(sst2, str(tmp_path), out, docs, figs, later, keep_others=True,
                                  train_subsets=True)
  assert result['datasets']['sst2']['settings']['data.max_train_examples'] == 8530
  saved = json.load(open(out))
  assert list(saved['datasets']) == ['sst2', 'rotten_tomatoes'] == list(result['datasets'])
  assert saved['datasets']['rotten_tomatoes'] == entry            # verbatim, first's provenance
  assert saved['datasets']['sst2']['generated']['commit'] == 'bbb' == saved['commit']
  page = open(docs).read()
  assert page.count('| elu |') == 2 * 6 and '## rotten_tomatoes' in page and '## sst2' in page
  assert 'f/phase_a_learning_rotten_tomatoes_alignment.png' in page
  assert 'rotten_tomatoes: entry and figures kept (`--keep_others`) from `first` at `aaa`' in page


def test_an_empty_runs_folder_leaves_the_files_byte_identical(tmp_path):
  rt = str(tmp_path / 'rt')
  for variant, acc in (('kernel-elu', 0.72), ('ball-elu', 0.70), ('vanilla-elu', 0.69)):
    _write_run(rt, variant, 0, acc, rho_learned=0.3 if variant.startswith('kernel') else None)
  out, docs, figs = str(tmp_path / 'o.json'), str(tmp_path / 'p.md'), str(tmp_path / 'f')
  meta = {'command': 'c', 'commit': 'aaa', 'date': 'then', 'machine': {}}
  phase_a_learning.write(rt, str(tmp_path), out, docs, figs, meta)
  saved, page = open(out, 'rb').read(), open(docs, 'rb').read()
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(ValueError, match='no finished run found'):
    phase_a_learning.write(str(empty), str(tmp_path), out, docs, figs, meta)
  assert open(out, 'rb').read() == saved and open(docs, 'rb').read() == page
