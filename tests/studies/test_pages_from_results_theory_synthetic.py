"""docs/theory.md and docs/synthetic.md (their generated blocks and their figures) regenerate
from their committed results files alone, byte for byte, with the command the page names
(issue 37: every committed results page regenerates from its committed JSON):

  python -m studies.theory --page_from_results         (results/theory.json)
  python -m experiments.synthetic --page_from_results  (results/synthetic.json)

and ``--page_from_results`` with a flag of a run is one line that writes nothing."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name: (module, program, page, results file, figures the command draws, block markers)
PAGES = {
    'theory': ('studies.theory', 'theory', 'docs/theory.md', 'results/theory.json',
               ('fig_theory_free_energy.png', 'fig_theory_sw_vs_n.png',
                'fig_theory_kernel_spread.png'),
               ('<!-- theory:begin (written by python -m studies.theory --page_from_results) -->',
                '<!-- theory:end -->')),
    'synthetic': ('experiments.synthetic', 'synthetic', 'docs/synthetic.md',
                  'results/synthetic.json',
                  ('fig_accuracy_vs_noise.png', 'fig_accuracy_vs_budget.png',
                   'fig_lambda_ablation.png', 'fig_energy_vs_step.png'),
                  ('<!-- synthetic:begin (written by python -m experiments.synthetic '
                   '--page_from_results) -->', '<!-- synthetic:end -->')),
}


def _run(module, *args):
  return subprocess.run([sys.executable, '-m', module, *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, check=False)


def _bytes(path):
  with open(path, 'rb') as f:
    return f.read()


def _copies(tmp_path, name):
  """tmp_path/docs/<page> with its block emptied, tmp_path/<results>; returns their paths
  and the (empty) figures folder."""
  _, _, page, results, _, (begin, end) = PAGES[name]
  text = _bytes(os.path.join(ROOT, page)).decode('utf-8')
  assert text.count(begin) == 1 and text.count(end) == 1, page
  head, rest = text.split(begin)
  stale = head + begin + '\nstale\n' + end + rest.split(end)[1]
  page_copy, results_copy, figures = (tmp_path / page, tmp_path / results,
                                      tmp_path / 'docs' / 'figures')
  for path in (page_copy, results_copy, figures / 'x'):
    path.parent.mkdir(parents=True, exist_ok=True)
  page_copy.write_text(stale, encoding='utf-8')
  shutil.copy(os.path.join(ROOT, results), results_copy)
  return page_copy, results_copy, figures


def _files(folder):
  return sorted(os.path.relpath(os.path.join(d, f), folder)
                for d, _, names in os.walk(folder) for f in names)


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(PAGES))
def test_the_page_and_its_figures_regenerate_from_the_committed_results(tmp_path, name):
  module, _, page, results, figures, _ = PAGES[name]
  assert os.path.getsize(os.path.join(ROOT, results)) < 1_000_000      # small to commit
  page_copy, results_copy, figures_copy = _copies(tmp_path, name)
  done = _run(module, '--page_from_results', f'--results={results_copy}',
              f'--page={page_copy}', f'--figures={figures_copy}')
  assert done.returncode == 0, done.stderr[-3000:]
  assert _bytes(page_copy) == _bytes(os.path.join(ROOT, page))
  for figure in figures:
    assert _bytes(figures_copy / figure) == _bytes(os.path.join(ROOT, 'docs', 'figures',
                                                                figure)), figure
  assert _bytes(results_copy) == _bytes(os.path.join(ROOT, results))     # read, not written
  assert _files(tmp_path) == sorted([page, results] + [f'docs/figures/{f}' for f in figures])


@pytest.mark.parametrize('name, flag, shown', [
    ('theory', '--workdir={tmp}/w', '--workdir={tmp}/w'),
    ('synthetic', '--config=configs/synthetic.py', '--config=configs/synthetic.py'),
])
def test_page_from_results_with_a_flag_of_a_run_is_one_line_and_writes_nothing(
    tmp_path, name, flag, shown):
  module, program, page, _, _, _ = PAGES[name]
  page_copy, results_copy, figures_copy = _copies(tmp_path, name)
  before = {p: _bytes(tmp_path / p) for p in _files(tmp_path)}
  done = _run(module, '--page_from_results', f'--results={results_copy}',
              f'--page={page_copy}', f'--figures={figures_copy}', flag.format(tmp=tmp_path))
  assert done.returncode == 2
  assert done.stderr.strip().splitlines() == [
      f'{program}: error: --page_from_results writes only the page from --results; drop '
      f'{shown.format(tmp=tmp_path)}.']
  assert {p: _bytes(tmp_path / p) for p in _files(tmp_path)} == before
