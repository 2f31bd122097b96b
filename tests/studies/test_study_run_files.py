"""The studies' per-run files (issue 39 item 6): the committed ones give back the page tables,
and the writing path (run folders, a results file, a bad --runs_out) on hand-made runs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments.analysis import run_files
from experiments.run import run_identity
from studies.phase_a_repulsion import command as rep
from studies.phase_a_repulsion import softmax as pas
from studies.softmax_mimicry import collect as mimicry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(path):
  with open(os.path.join(REPO, path), encoding='utf-8') as f:
    return f.read()


def _rows(study, source=None):
  """The study rows of the committed per-run files of ``results/runs/<study>``, each written
  from ``source`` (default: the results file, its run folders gone)."""
  records = run_files.read_study_records(os.path.join(REPO, 'results', 'runs', study))
  source = source or f'results/{study}.json (run folders gone)'
  for name, r in records.items():
    assert r['study'] == study and r['run'] == name
    assert r['from'] == source
    assert r['config_sha256'] is None          # no digest is made up for a folder that is gone
  return [run_files.study_row(r) for r in records.values()]


def _block_tables(page, begin, end):
  block = _read(page).split(begin, 1)[1].split(end, 1)[0]
  return [line for line in block.splitlines() if line.startswith('|')]


def test_the_repulsion_table_is_recomputed_from_its_per_run_files():
  rows = sorted(_rows('phase_a_repulsion'),
                key=lambda r: (r['relative_lam'], r['riesz_s'], r['map'], r['seed']))
  committed = json.loads(_read('results/phase_a_repulsion.json'))
  assert len(rows) == 16
  summary = rep.summarize(rows)
  assert summary == committed['settings']            # every mean, exactly
  assert rows == committed['runs']
  lines = rep.markdown(summary, {'out': '', 'command': '', 'commit': '', 'machine': ''})
  assert [l for l in lines if l.startswith('|')] == _block_tables(
      'docs/phase_a_learning.md', rep.BEGIN, rep.END)


def test_the_softmax_target_table_is_recomputed_from_its_per_run_files():
  committed = json.loads(_read('results/phase_a_softmax.json'))
  order = {r['path']: i for i, r in enumerate(committed['runs'])}
  rows = sorted(_rows('phase_a_softmax'), key=lambda r: order[r['path']])
  assert len(rows) == 8 and rows == committed['runs']
  summary = pas.summarize(rows)
  assert summary == committed['settings']
  lines = pas.markdown(summary, {'out': '', 'command': '', 'commit': '', 'machine': ''})
  assert [l for l in lines if l.startswith('|')] == _block_tables(
      'docs/softmax_mimicry.md', pas.BEGIN, pas.END)


def test_the_mimicry_conversion_accuracies_are_the_seed_means_of_its_per_run_files():
  committed = json.loads(_read('results/softmax_mimicry.json'))
  records = {r['run']: r for r in (run_files.read_study_records(
      os.path.join(REPO, 'results', 'runs', 'softmax_mimicry')).values())}
  assert sorted(records) == sorted(mimicry.run_id(p) for p in committed['parts'])
  assert all('not_kept' in r for r in records.values())
  for dataset, entry in committed['conversion'].items():
    seeds = [records[f'conversion-{dataset}-seed{s}'] for s in (0, 1, 2)]
    soft = float(np.mean([s['softmax']['zero_shot']['accuracy'] for s in seeds]))
    assert soft == entry['softmax_accuracy']
    for method, by_n in entry.items():
      if method == 'softmax_accuracy':
        continue
      for n, cell in by_n.items():
        for when in ('zero_shot', 'finetuned'):
          got = float(np.mean([s['methods'][method][n][when]['accuracy'] for s in seeds]))
          assert got == cell[when]['accuracy'], (dataset, method, n, when)
        assert cell['recovery'] == pytest.approx(cell['finetuned']['accuracy'] / soft)


def test_the_conversion_per_run_files_are_its_rows():
  committed = json.loads(_read('results/mqar_conversion.json'))
  # Written by the collect command from the conversion folders (rerun at 707c4ae).
  rows = _rows('mqar_conversion', 'run folders under workdir/mqar/convert')
  key = lambda r: (r['seq_len'], r['method'])
  assert sorted(rows, key=key) == sorted(committed['runs'], key=key)
  assert all(r['machine'] == r_['machine'] for r, r_ in zip(
      sorted(rows, key=key), sorted(committed['runs'], key=key)))


def test_default_runs_out_follows_out():
  assert run_files.default_study_runs_out('s', 'results/s.json') == os.path.join(
      'results', 'runs', 's')
  assert run_files.default_study_runs_out('s', '/tmp/a/x.json') == '/tmp/a/runs/s'
  assert run_files.default_study_runs_out('s', 'x.json') == os.path.join('.', 'runs', 's')
  with pytest.raises(ValueError, match='not a run id'):
    run_files.study_run_file('/tmp', 'a/b')


# ----------------------------------------------------------------------------- hand-made runs

_PHASE_A = {'schedule': 'after_b', 'after_b_epochs': 3, 'num_epochs': 2, 'relative_step': 0.01,
            'gibbs_tilt': 1000.0, 'softening': 0.5, 'radius': 1.5, 'clip_norm': 10.0,
            'batch_size': 64, 'target': 'labels'}
_MACHINE = {'processor': 'x86_64', 'cpu_count': 2, 'platform': 'cpu'}


def _stage(layer, top, rho):
  head = {'top_direction_share': [top, top], 'effective_rank': [30.0, 30.0],
          'min_pairwise_distance': [1.0, 3.0]}
  return {'layer': layer,
          'diversity': {k: {f'attention_{layer}': head} for k in ('initial', 'ball', 'learned')},
          'heldout': {'ball': {'centered_alignment': 0.1},
                      'learned': {'centered_alignment': rho}}}


def _write(root, setting, variant, seed, acc, stages=()):
  run = os.path.join(root, setting, 'rotten_tomatoes', variant, f'seed{seed}')
  os.makedirs(run)
  config = {'data': {}, 'phase_a': dict(_PHASE_A, relative_lam=10.0, riesz_s='0.0')}
  results = {'dataset': 'rotten_tomatoes', 'variant': variant, 'seed': seed, 'config': config,
             'commit': f'c{seed}', 'machine': _MACHINE,
             'test': {'accuracy': acc}, 'validation': {'accuracy': acc - 0.01}}
  if stages:
    results['phase_a'] = {'stages': list(stages)}
  for name, obj in (('results.json', results), ('config.json', config)):
    with open(os.path.join(run, name), 'w') as f:
      json.dump(obj, f)
  return run


def _study(root):
  for seed in (0, 1):
    _write(root, 'base', 'ball-elu', seed, 0.70 + seed / 100)
  return [_write(root, 'lam10', 'kernel-elu', seed, 0.72 + seed / 100,
                 [_stage(0, 0.5 + seed / 10, 0.3 + seed / 10)]) for seed in (0, 1)]


def test_records_from_run_folders_carry_digest_machine_and_control(tmp_path):
  root = str(tmp_path / 'runs')
  kernels = _study(root)
  found = rep.collect_runs(root, 'rotten_tomatoes')
  records = rep.folder_records('phase_a_repulsion', root, found, 'python -m x')
  out = str(tmp_path / 'per_run')
  paths = run_files.write_study_records(records, out)
  assert [os.path.basename(p) for p in paths] == [
      'lam10-rotten_tomatoes-kernel-elu-seed0.json', 'lam10-rotten_tomatoes-kernel-elu-seed1.json']
  back = run_files.read_study_records(out)
  first = back['lam10-rotten_tomatoes-kernel-elu-seed0']
  with open(os.path.join(kernels[0], 'config.json')) as f:
    assert first['config_sha256'] == run_identity.config_digest(json.load(f))
  assert first['config_sha256_from'] == 'config.json'
  assert first['machine'] == _MACHINE and first['machine_from'] == 'results.json'
  assert first['commit'] == 'c0' and first['test_accuracy'] == 0.72
  assert first['controls']['ball']['path'] == 'base/rotten_tomatoes/ball-elu/seed0'
  assert first['from'] == f'run folders under {os.path.relpath(root, REPO)}'
  rows = [run_files.study_row(back[k]) for k in sorted(back)]
  assert rows == [row for row, _, _ in found]
  (entry,) = rep.summarize(rows)
  assert entry['layers'][0]['rho']['learned'] == pytest.approx(0.35)
  assert entry['kernel_minus_ball_test'] == pytest.approx(0.02)


def _command(*args):
  cmd = [sys.executable, '-m', 'studies.phase_a_repulsion', *args]
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_the_command_writes_per_run_files_next_to_out_and_from_its_rows(tmp_path):
  root = str(tmp_path / 'runs')
  _study(root)
  out = tmp_path / 'res' / 'rep.json'
  proc = _command(f'--runs={root}', f'--out={out}')
  assert proc.returncode == 0, proc.stderr
  folder = tmp_path / 'res' / 'runs' / 'phase_a_repulsion'            # follows --out
  made = run_files.read_study_records(str(folder))
  assert len(made) == 2 and all(r['config_sha256'] for r in made.values())
  # From the results file alone: the same rows, no digest; other files are kept.
  again = tmp_path / 'again'
  again.mkdir()
  (again / 'other.txt').write_text('kept')
  proc = _command('--runs_from_results', f'--out={out}', f'--runs_out={again}')
  assert proc.returncode == 0, proc.stderr
  assert (again / 'other.txt').read_text() == 'kept'
  back = run_files.read_study_records(str(again))
  assert sorted(back) == sorted(made)
  for name, r in back.items():
    assert r['from'] == f'{os.path.relpath(out, REPO)} (run folders gone)'
    assert r['config_sha256'] is None and r['machine'] is None
    assert run_files.study_row(r) == run_files.study_row(made[name])
  assert rep.summarize([run_files.study_row(back[k]) for k in sorted(back)]) == (
      json.loads(out.read_text())['settings'])


def test_a_runs_out_naming_a_file_is_one_line_and_nothing_is_written(tmp_path):
  root = str(tmp_path / 'runs')
  _study(root)
  blocker = tmp_path / 'blocker'
  blocker.write_text('a file')
  out, docs = tmp_path / 'rep.json', tmp_path / 'page.md'
  for args in ([f'--runs={root}', f'--out={out}', f'--docs={docs}'],
               ['--runs_from_results', f'--out={REPO}/results/phase_a_repulsion.json']):
    proc = _command(*args, f'--runs_out={blocker}/sub')
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count('\n') == 0 and '--runs_out' in proc.stderr
    assert 'Traceback' not in proc.stderr
  assert sorted(os.listdir(tmp_path)) == ['blocker', 'runs']       # no --out, page, files
  assert blocker.read_text() == 'a file'


def test_mimicry_records_from_part_files_keep_the_whole_part(tmp_path):
  workdir = tmp_path / 'mimicry'
  part = {'commit': 'abc', 'machine': _MACHINE, 'run_dir': 'workdir/gone/seed0', 'seed': 0,
          'encoder_commit': 'def', 'methods': {'ball': {'8': {'kl': [0.5, 0.25]}}}}
  (workdir / 'sst2' / 'seed0').mkdir(parents=True)
  (workdir / 'sst2' / 'seed0' / 'fidelity.json').write_text(json.dumps(part))
  (record,) = mimicry.run_records(str(workdir), 'python -m x')
  assert record['run'] == 'fidelity-sst2-seed0' and record['part'] == 'fidelity'
  assert record['methods'] == part['methods'] and record['machine'] == _MACHINE
  assert record['config_sha256'] is None
  assert record['config_sha256_from'] == 'none: the encoder folder workdir/gone/seed0 is not here'
  assert run_files.study_row(record) == dict({'part': 'fidelity', 'dataset': 'sst2'},
                                             **{k: v for k, v in part.items() if k != 'machine'})


def test_conversion_records_are_named_by_method_and_teacher():
  from studies.mqar_convert import command as convert_command  # pylint: disable=g-import-not-at-top
  row = {'method': 'elu', 'teacher': 'workdir/mqar/main/softmax-L64-P4-w64-seed0', 'seed': 0,
         'finetuned_accuracy': 0.9, 'commit': 'abc', 'machine': _MACHINE}
  (record,) = convert_command.records([row], 'workdir/mqar/convert')
  assert record['run'] == 'elu-softmax-L64-P4-w64-seed0'
  assert record['machine'] == _MACHINE and record['machine_from'] == 'the row'
  assert record['config_sha256'] is None and 'no config.json' in record['config_sha256_from']
  assert run_files.study_row(record) == row
