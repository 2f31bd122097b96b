"""studies.phase_a_repulsion on hand-made run folders: per-run rows, means, refusals."""

import json
import os

import pytest

from studies.phase_a_repulsion import command as rep

_PHASE_A = {'schedule': 'after_b', 'after_b_epochs': 3, 'num_epochs': 2, 'relative_step': 0.01,
            'gibbs_tilt': 1000.0, 'softening': 0.5, 'radius': 1.5, 'clip_norm': 10.0,
            'batch_size': 64, 'target': 'labels'}


def _stage(layer, top, rank, dist, rho_ball, rho_learned):
  head = lambda t: {'top_direction_share': [t, t], 'effective_rank': [rank, rank],
                    'min_pairwise_distance': [dist, dist + 2.0]}   # two heads
  return {'layer': layer,
          'diversity': {k: {f'attention_{layer}': head(t)}
                        for k, t in (('initial', 0.1), ('ball', 0.2), ('learned', top))},
          'heldout': {'ball': {'centered_alignment': rho_ball},
                      'learned': {'centered_alignment': rho_learned}}}


def _write(root, parts, variant, seed, acc, lam=1.0, s='0.0', stages=(), **phase_a):
  run = os.path.join(root, *parts, 'rotten_tomatoes', variant, f'seed{seed}')
  os.makedirs(run)
  results = {'dataset': 'rotten_tomatoes', 'variant': variant, 'seed': seed,
             'config': {'data': {}, 'phase_a': dict(_PHASE_A, relative_lam=lam, riesz_s=s,
                                                    **phase_a)},
             'test': {'accuracy': acc}, 'validation': {'accuracy': acc - 0.01}}
  if stages:
    results['phase_a'] = {'stages': list(stages)}
  with open(os.path.join(run, 'results.json'), 'w') as f:
    json.dump(results, f)


def _study(root):
  for seed, ball_acc in ((0, 0.70), (1, 0.74)):
    _write(root, ['base'], 'ball-elu', seed, ball_acc)
  _write(root, ['lam10'], 'kernel-elu', 0, 0.72, lam=10.0,
         stages=[_stage(0, 0.5, 40.0, 1.0, 0.1, 0.3)])
  _write(root, ['lam10'], 'kernel-elu', 1, 0.73, lam=10.0,
         stages=[_stage(0, 0.7, 20.0, 3.0, 0.1, 0.5)])


def test_rows_and_means_are_the_hand_computed_ones(tmp_path):
  _study(str(tmp_path))
  rows = rep.collect(str(tmp_path), 'rotten_tomatoes')
  assert [(r['setting'], r['map'], r['seed']) for r in rows] == [('lam10', 'elu', 0),
                                                                 ('lam10', 'elu', 1)]
  layer = rows[0]['layers'][0]
  assert layer['diversity']['learned']['min_pairwise_distance'] == pytest.approx(2.0)  # (1+3)/2
  assert layer['diversity']['ball']['top_direction_share'] == pytest.approx(0.2)
  assert rows[1]['ball_test_accuracy'] == pytest.approx(0.74)
  (entry,) = rep.summarize(rows)
  mean = entry['layers'][0]
  assert mean['diversity']['learned']['top_direction_share'] == pytest.approx(0.6)
  assert mean['diversity']['learned']['effective_rank'] == pytest.approx(30.0)
  assert mean['rho']['learned'] == pytest.approx(0.4)
  assert entry['kernel_minus_ball_test'] == pytest.approx((0.72 + 0.73 - 0.70 - 0.74) / 2)
  lines = rep.markdown([entry], {'out': 'x.json', 'command': 'c', 'commit': 'abc',
                                 'machine': 'm'})
  assert '| 10× · log | elu | 0 | 0.200 → 0.600 |' in lines[2]
  assert '+0.0050' in lines[2]


def test_a_setting_folder_mixing_repulsions_is_refused(tmp_path):
  _study(str(tmp_path))
  _write(str(tmp_path), ['lam10'], 'kernel-elu', 2, 0.7, lam=1.0,
         stages=[_stage(0, 0.5, 40.0, 1.0, 0.1, 0.3)])
  with pytest.raises(ValueError, match=r"seed2.*relative_lam"):
    rep.collect(str(tmp_path), 'rotten_tomatoes')


def test_other_phase_a_fields_must_agree_and_every_run_needs_its_ball(tmp_path):
  _study(str(tmp_path))
  _write(str(tmp_path), ['coulomb'], 'kernel-elu', 0, 0.7, s='coulomb', radius=3.0,
         stages=[_stage(0, 0.5, 40.0, 1.0, 0.1, 0.3)])
  with pytest.raises(ValueError, match='radius'):
    rep.collect(str(tmp_path), 'rotten_tomatoes')
  other = tmp_path / 'other'
  _study(str(other))
  _write(str(other), ['lam10'], 'kernel-elu', 5, 0.7, lam=10.0,
         stages=[_stage(0, 0.5, 40.0, 1.0, 0.1, 0.3)])
  with pytest.raises(ValueError, match='no Ball-X run'):
    rep.collect(str(other), 'rotten_tomatoes')


def test_own_key_ball_rho_is_averaged_when_every_seed_has_it_and_softmax_runs_are_skipped(
    tmp_path):
  root = str(tmp_path)
  _study(root)
  with_own = [_stage(0, 0.5, 40.0, 1.0, 0.1, 0.3), _stage(1, 0.5, 40.0, 1.0, 0.2, 0.4)]
  for stage, own in zip(with_own, (0.1, 0.26)):
    stage['heldout']['ball_own_keys'] = {'centered_alignment': own}
  _write(root, ['lam1'], 'kernel-elu', 0, 0.71, stages=with_own)
  # A softmax-target run in the study folder is another study's: not read.
  _write(root, ['softmax'], 'kernel-elu', 0, 0.5, target='softmax',
         stages=[{'layer': 0, 'heldout': {'ball': {'kl': 1.0}}}])
  rows = rep.collect(root, 'rotten_tomatoes')
  assert sorted({r['setting'] for r in rows}) == ['lam1', 'lam10']
  entries = {e['setting']: e for e in rep.summarize(rows)}
  assert entries['lam1']['layers'][1]['rho']['ball_own_keys'] == pytest.approx(0.26)
  assert 'ball_own_keys' not in entries['lam10']['layers'][0]['rho']     # older stage files
  lines = rep.markdown([entries['lam1'], entries['lam10']],
                       {'out': 'x.json', 'command': 'c', 'commit': 'abc', 'machine': 'm'})
  assert '| 0.200 | 0.260 | 0.400 |' in lines[3] and '| 0.100 | – | 0.400 |' in lines[4]


def test_the_command_refuses_to_replace_its_file_by_fewer_runs(tmp_path):
  import subprocess, sys  # pylint: disable=g-import-not-at-top,multiple-imports
  root = str(tmp_path / 'runs')
  _study(root)
  out = tmp_path / 'rep.json'
  held = {'runs': [{'setting': 'lam1', 'map': 'favor', 'seed': 0}]}
  out.write_text(json.dumps(held))
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  cmd = [sys.executable, '-m', 'studies.phase_a_repulsion', f'--runs={root}', f'--out={out}']
  proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0 and 'refusing to replace results by fewer' in proc.stderr
  assert json.loads(out.read_text()) == held                 # untouched
  proc = subprocess.run(cmd + ['--allow_fewer'], cwd=repo, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert len(json.loads(out.read_text())['runs']) == 2
