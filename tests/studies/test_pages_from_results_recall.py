"""docs/recall.md's generated blocks (and figures) regenerate from the committed results files
alone, byte for byte, with the commands the page names (issue 37: every committed results
page regenerates from its committed JSON). The mqar_zoology block has its own test
(tests/tools/test_recall_batched.py)."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, 'docs', 'recall.md')


def _run(*args):
  return subprocess.run([sys.executable, '-m', *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, check=False)


def _bytes(path):
  with open(path, 'rb') as f:
    return f.read()


def test_the_conversion_block_regenerates_from_the_committed_results(tmp_path):
  page = tmp_path / 'recall.md'
  shutil.copy(PAGE, page)
  page.write_text(page.read_text().replace('| fine-tune steps |', '| old header |'))
  done = _run('studies.mqar_convert', '--page_from_results', f'--page={page}')
  assert done.returncode == 0, done.stderr[-3000:]
  assert _bytes(page) == _bytes(PAGE)
  assert sorted(os.listdir(tmp_path)) == ['recall.md']       # nothing else written


@pytest.mark.parametrize('flag', ['--collect_only', '--runs_from_results', '--workdir=w'])
def test_page_from_results_with_a_flag_that_runs_or_collects_is_one_line(tmp_path, flag):
  page = tmp_path / 'recall.md'
  shutil.copy(PAGE, page)
  done = _run('studies.mqar_convert', '--page_from_results', f'--page={page}', flag)
  assert done.returncode == 2
  name = flag.lstrip('-').split('=')[0]
  assert done.stderr.strip().splitlines() == [
      f'mqar_convert: error: --page_from_results writes only the page from --results; drop '
      f'--{name}={"w" if name == "workdir" else "True"}.']
  assert _bytes(page) == _bytes(PAGE) and sorted(os.listdir(tmp_path)) == ['recall.md']


@pytest.mark.parametrize('block, results, figure', [
    ('mqar', 'results/mqar.json', 'docs/figures/recall_accuracy_vs_length.png'),
    ('mqar_long', 'results/mqar_long.json', 'docs/figures/recall_long_accuracy_vs_length.png'),
])
def test_the_first_grids_blocks_and_figures_regenerate_from_the_committed_results(
    tmp_path, block, results, figure):
  # The page names its figure relative to itself: the copies keep the repository's layout.
  page, out, fig = (tmp_path / p for p in ('docs/recall.md', results, figure))
  for path, source in ((page, PAGE), (out, os.path.join(ROOT, results))):
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, path)
  fig.parent.mkdir(parents=True, exist_ok=True)
  done = _run('experiments.mqar', f'--workdir={tmp_path / "gone"}', '--collect_only',
              f'--results={out}', f'--page={page}', f'--block={block}', f'--figure={fig}')
  assert done.returncode == 0, done.stderr[-3000:]
  assert _bytes(page) == _bytes(PAGE)
  assert _bytes(out) == _bytes(os.path.join(ROOT, results))
  assert _bytes(fig) == _bytes(os.path.join(ROOT, figure))
