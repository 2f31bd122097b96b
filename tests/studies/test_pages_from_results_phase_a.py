"""The Phase A pages regenerate from their committed JSON alone, byte for byte, with
``--page_from_results`` (issue 37: every committed results page regenerates from its committed
JSON): ``results/phase_a_drift_<dataset>[_trained].md``, ``results/phase_a_pilot_<dataset>.md``
and ``docs/phase_a_learning.md`` with its paired figures. Each case copies the committed files
into a folder of its own, spoils the page (and removes the figures the mode draws), runs the
command as a user does and compares every file with the committed one; nothing else is
written. A flag that would compute is refused in one line before any write."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIFT = [(d, trained) for d in ('rotten_tomatoes', 'sst2', 'qqp_subset')
         for trained in (False, True)]
LEARNING = ('results/phase_a_learning.json', 'docs/phase_a_learning.md',
            *[f'docs/figures/phase_a_learning_{d}_{kind}.png'
              for d in ('sst2', 'rotten_tomatoes', 'qqp_subset') for kind in ('alignment', 'paired')])


def _run(*args):
  return subprocess.run([sys.executable, '-m', *map(str, args)], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, check=False)


def _bytes(path):
  with open(path, 'rb') as f:
    return f.read()


def _tree(root) -> dict:
  """``{relative path: bytes}`` of every file under ``root``."""
  return {os.path.relpath(os.path.join(d, f), root): _bytes(os.path.join(d, f))
          for d, _, files in os.walk(root) for f in files}


def _copy(tmp_path, paths) -> None:
  """The committed ``paths`` (from the repository root) under ``tmp_path``, same layout."""
  for path in paths:
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(os.path.join(ROOT, path), tmp_path / path)


def _committed(paths) -> dict:
  return {path: _bytes(os.path.join(ROOT, path)) for path in paths}


def _spoil(path) -> None:
  """The page with its generated tables' headers changed (after the analysis block, which
  the mode keeps, where there is one)."""
  text = path.read_text(encoding='utf-8')
  head, marker, tail = text.rpartition('<!-- /analysis -->')
  path.write_text(head + marker + tail.replace('| map |', '| old header |'), encoding='utf-8')
  assert path.read_text(encoding='utf-8') != text


@pytest.mark.parametrize('dataset, trained', DRIFT)
def test_a_drift_page_regenerates_from_its_committed_json(tmp_path, dataset, trained):
  stem = f'results/phase_a_drift_{dataset}' + ('_trained' if trained else '')
  paths = [stem + '.json', stem + '.md']
  _copy(tmp_path, paths)
  _spoil(tmp_path / paths[1])
  done = _run('studies.phase_a_drift', '--page_from_results', f'--config.dataset={dataset}',
              f'--out={tmp_path / "results"}',
              *(['--trained_runs=workdir/grid'] if trained else []))
  assert done.returncode == 0, done.stderr[-3000:]
  assert _tree(tmp_path) == _committed(paths)          # the page as committed, nothing else


def test_the_pilot_page_regenerates_from_its_committed_json(tmp_path):
  paths = ['results/phase_a_pilot_rotten_tomatoes.json', 'results/phase_a_pilot_rotten_tomatoes.md']
  _copy(tmp_path, paths)
  _spoil(tmp_path / paths[1])
  done = _run('studies.phase_a_pilot', '--page_from_results', '--config.dataset=rotten_tomatoes',
              f'--out={tmp_path / "results"}')
  assert done.returncode == 0, done.stderr[-3000:]
  assert _tree(tmp_path) == _committed(paths)


def test_the_learning_page_and_paired_figures_regenerate_from_the_committed_json(tmp_path):
  # The page names its figures relative to itself: the copies keep the repository's layout.
  _copy(tmp_path, LEARNING)
  _spoil(tmp_path / 'docs/phase_a_learning.md')
  for path in LEARNING:
    if path.endswith('_paired.png'):
      os.remove(tmp_path / path)                       # drawn again from the JSON
  done = _run('studies.phase_a_learning', '--page_from_results',
              f'--out={tmp_path / LEARNING[0]}', f'--docs={tmp_path / LEARNING[1]}',
              f'--figures={tmp_path / "docs/figures"}')
  assert done.returncode == 0, done.stderr[-3000:]
  assert _tree(tmp_path) == _committed(LEARNING)       # the JSON untouched, nothing else written


@pytest.mark.parametrize('module, paths, args, says', [
    ('studies.phase_a_drift', ['results/phase_a_drift_sst2.json', 'results/phase_a_drift_sst2.md'],
     ['--config.dataset=sst2', '--config.batches=5'], '--config.batches=5'),
    ('studies.phase_a_pilot', ['results/phase_a_pilot_rotten_tomatoes.json',
                               'results/phase_a_pilot_rotten_tomatoes.md'],
     ['--runs=workdir/learn'], '--runs=workdir/learn'),
    ('studies.phase_a_learning', LEARNING[:2], ['--keep_others'], '--keep_others=True'),
])
def test_page_from_results_with_a_flag_that_computes_is_one_line_and_writes_nothing(
    tmp_path, module, paths, args, says):
  _copy(tmp_path, paths)
  _spoil(tmp_path / paths[1])
  before = _tree(tmp_path)
  where = ([f'--out={tmp_path / "results"}'] if module != 'studies.phase_a_learning' else
           [f'--out={tmp_path / paths[0]}', f'--docs={tmp_path / paths[1]}',
            f'--figures={tmp_path / "docs/figures"}'])
  done = _run(module, '--page_from_results', *where, *args)
  assert done.returncode == 2
  assert done.stderr.splitlines() == [
      f'{module.rsplit(".", 1)[-1]}: error: --page_from_results writes only the page from '
      f'--out; drop {says}.']
  assert _tree(tmp_path) == before
