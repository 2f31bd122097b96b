"""The softmax_mimicry, phase-a-softmax and repulsion page blocks (and the mimicry figures)
regenerate from the committed results files alone, byte for byte, with the commands the pages
name (``--page_from_results``; issue 37: every committed results page regenerates from its
committed JSON); with a flag that would read runs or write other files it is one line and
writes nothing."""

import os
import shutil
import subprocess
import sys

import pytest

from studies.phase_a_repulsion import command as rep
from studies.phase_a_repulsion import softmax as pas
from studies.softmax_mimicry import page as mimicry_page

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIMICRY_FIGURES = [f'docs/figures/{name}' for name in (mimicry_page.FIDELITY_FIGURE,
                                                       mimicry_page.CONVERSION_FIGURE)]
REPULSION = {   # module: (page, results file, block markers)
    'studies.phase_a_repulsion': ('docs/phase_a_learning.md', 'results/phase_a_repulsion.json',
                                  rep.BEGIN, rep.END),
    'studies.phase_a_repulsion.softmax': ('docs/softmax_mimicry.md', 'results/phase_a_softmax.json',
                                          pas.BEGIN, pas.END),
}


def _run(cwd, *args):
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
  return subprocess.run([sys.executable, '-m', *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=300, check=False)


def _bytes(path):
  with open(path, 'rb') as f:
    return f.read()


def _copy(tmp_path, *paths):
  """Copies the committed ``paths`` (relative to the repository) into ``tmp_path``, keeping
  the repository's layout (the pages name their figures and results relative to it)."""
  for path in paths:
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(os.path.join(ROOT, path), tmp_path / path)


def _blank_block(page, begin, end):
  """Replaces the block between ``begin`` and ``end`` of ``page`` by one stale line."""
  text = page.read_text(encoding='utf-8')
  head, rest = text.split(begin, 1)
  page.write_text(head + begin + '\nstale\n' + end + rest.split(end, 1)[1], encoding='utf-8')


def _files(folder):
  return sorted(os.path.relpath(os.path.join(d, f), folder)
                for d, _, names in os.walk(folder) for f in names)


def test_the_mimicry_block_and_figures_regenerate_from_the_committed_results(tmp_path):
  _copy(tmp_path, 'docs/softmax_mimicry.md', 'results/softmax_mimicry.json')
  _blank_block(tmp_path / 'docs/softmax_mimicry.md', mimicry_page.BEGIN, mimicry_page.END)
  # The figures are not copied: the command draws them. The page names neither --out nor its
  # own path, so it runs from the repository root (where --config's default file is).
  done = _run(ROOT, 'studies.softmax_mimicry', '--page_from_results',
              f'--out={tmp_path}/results/softmax_mimicry.json',
              f'--page={tmp_path}/docs/softmax_mimicry.md', f'--figures={tmp_path}/docs/figures')
  assert done.returncode == 0, done.stderr[-3000:]
  for path in ['docs/softmax_mimicry.md', 'results/softmax_mimicry.json'] + MIMICRY_FIGURES:
    assert _bytes(tmp_path / path) == _bytes(os.path.join(ROOT, path)), path
  assert _files(tmp_path) == sorted(
      ['docs/softmax_mimicry.md', 'results/softmax_mimicry.json'] + MIMICRY_FIGURES)


@pytest.mark.parametrize('module', sorted(REPULSION))
def test_the_repulsion_blocks_regenerate_from_the_committed_results(tmp_path, module):
  page, results, begin, end = REPULSION[module]
  _copy(tmp_path, page, results)
  _blank_block(tmp_path / page, begin, end)
  # The block names --out as given: run where the copies keep the repository's layout.
  done = _run(tmp_path, module, '--page_from_results', f'--docs={page}')
  assert done.returncode == 0, done.stderr[-3000:]
  assert _bytes(tmp_path / page) == _bytes(os.path.join(ROOT, page))
  assert _bytes(tmp_path / results) == _bytes(os.path.join(ROOT, results))
  assert _files(tmp_path) == sorted([page, results])      # no per-run files, nothing else


@pytest.mark.parametrize('module, page, flag', [
    ('studies.softmax_mimicry', '--page=docs/softmax_mimicry.md', '--workdir=w'),
    ('studies.phase_a_repulsion', '--docs=docs/phase_a_learning.md', '--runs=workdir/repulsion'),
    ('studies.phase_a_repulsion.softmax', '--docs=docs/softmax_mimicry.md',
     '--runs_from_results'),
])
def test_page_from_results_with_a_flag_that_runs_or_collects_is_one_line(tmp_path, module,
                                                                          page, flag):
  paths = ['docs/softmax_mimicry.md', 'docs/phase_a_learning.md', 'results/softmax_mimicry.json',
           'results/phase_a_repulsion.json', 'results/phase_a_softmax.json']
  _copy(tmp_path, *paths)
  _blank_block(tmp_path / 'docs/softmax_mimicry.md', mimicry_page.BEGIN, mimicry_page.END)
  before = {p: _bytes(tmp_path / p) for p in paths}
  config = [f'--config={ROOT}/studies/softmax_mimicry/config.py'] if 'mimicry' in module else []
  done = _run(tmp_path, module, '--page_from_results', page, flag, *config)
  assert done.returncode == 2, done.stderr[-3000:]
  name, _, value = flag.lstrip('-').partition('=')
  (line,) = done.stderr.strip().splitlines()
  assert line.endswith(f': error: --page_from_results writes only the page from --out; drop '
                       f'--{name}={value or True}.'), line
  assert {p: _bytes(tmp_path / p) for p in paths} == before and _files(tmp_path) == sorted(paths)
