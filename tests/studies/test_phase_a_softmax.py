"""studies.phase_a_repulsion.softmax on hand-made run folders: rows, paired means, refusals."""

import json
import os

import pytest

from studies.phase_a_repulsion import softmax as pas
from experiments.common import cli

_PHASE_A = {'relative_lam': 1.0, 'riesz_s': 'coulomb', 'radius': 1.5}


def _stage(layer, kl_learned, dn=0.5):
  return {'layer': layer, 'drift_to_noise': dn,
          'heldout': {'initial': {'kl': 1.0}, 'ball': {'kl': 1.2}, 'learned': {'kl': kl_learned}}}


def _write(root, setting, variant, seed, acc, stages=(), **phase_a):
  run = os.path.join(root, setting, 'rotten_tomatoes', variant, f'seed{seed}')
  os.makedirs(run)
  results = {'dataset': 'rotten_tomatoes', 'variant': variant, 'seed': seed,
             'config': {'data': {}, 'phase_a': dict(_PHASE_A, **phase_a)},
             'test': {'accuracy': acc}, 'validation': {'accuracy': acc - 0.01}}
  if stages:
    results['phase_a'] = {'stages': list(stages)}
  with open(os.path.join(run, 'results.json'), 'w') as f:
    json.dump(results, f)


def _study(root):
  for seed in (0, 1):
    _write(root, 'base', 'ball-elu', seed, 0.70 + seed / 100)
    _write(root, 'base', 'vanilla-elu', seed, 0.71 + seed / 100)
    _write(root, 'labels', 'kernel-elu', seed, 0.72, target='labels')
  _write(root, 'soft', 'kernel-elu', 0, 0.75, [_stage(0, 0.8), _stage(1, 0.4)], target='softmax')
  _write(root, 'soft', 'kernel-elu', 1, 0.73, [_stage(0, 0.6), _stage(1, 0.2)], target='softmax')


def test_rows_and_paired_means_are_the_hand_computed_ones(tmp_path):
  root = str(tmp_path)
  _study(root)
  rows = pas.collect(root, ['soft'], 'labels', 'rotten_tomatoes')
  assert [(r['map'], r['seed']) for r in rows] == [('elu', 0), ('elu', 1)]
  assert rows[1]['vanilla_test_accuracy'] == pytest.approx(0.72)
  (entry,) = pas.summarize(rows)
  assert entry['layers'][1]['kl']['learned'] == pytest.approx(0.3)
  assert entry['minus_ball_test'] == pytest.approx(0.74 - 0.705)
  assert entry['minus_labels_test'] == pytest.approx(0.02)
  lines = pas.markdown([entry], {'out': 'x.json', 'command': 'c', 'commit': 'abc',
                                 'machine': 'm'})
  assert lines[2].startswith('| 1.5 | elu | 0 | 1.000 | 1.200 | 0.700 | 0.5 | 0.7400 | +0.0350 |')
  assert lines[3].endswith('| 0.300 | 0.5 |  |  |  |  |')


def test_a_missing_control_or_a_wrong_target_is_refused(tmp_path):
  root = str(tmp_path)
  _study(root)
  _write(root, 'soft', 'kernel-favor', 0, 0.7, [_stage(0, 0.5)], target='softmax')
  with pytest.raises(ValueError, match=r"soft/rotten_tomatoes/kernel-favor/seed0: no \['ball', "
                                       r"'vanilla', 'labels'\] control"):
    pas.collect(root, ['soft'], 'labels', 'rotten_tomatoes')
  with pytest.raises(ValueError, match="phase_a.target is 'labels', expected 'softmax'"):
    pas.collect(root, ['labels'], 'labels', 'rotten_tomatoes')


def test_fewer_runs_do_not_replace_the_file(tmp_path):
  root = str(tmp_path)
  _study(root)
  out = tmp_path / 'out.json'
  out.write_text(json.dumps({'runs': [{'setting': 'soft', 'map': 'favor', 'seed': 0}]}))
  rows = pas.collect(root, ['soft'], 'labels', 'rotten_tomatoes')
  new = {'runs': {(f'{r["setting"]}/{r["map"]}', r['seed']) for r in rows}}
  with pytest.raises(cli.ConfigError, match='refusing to replace results by fewer'):
    pas.loading.check_not_fewer(pas.phase_a_repulsion.run_keys(str(out)), new, str(out))
