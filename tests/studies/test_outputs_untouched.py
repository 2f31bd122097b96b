"""A failing command changes nothing (issue 39 item 1): one test per tool command family.

Each case gives a command (run as a user does, ``python -m experiments.<command>``) an
output path it cannot write: a file where a folder is expected, a folder where a file is
expected, a file in a folder that does not exist, or an output flag the mode would ignore.
The command must end in one line on standard error naming the flag and the value, exit
status 2, before any compute, and change no file: neither under the test's folder (where
earlier runs left results, pages, figures and per-run files a late failure would have
rewritten) nor in the repository (``git status`` and the bytes of every changed or
untracked file; the background grid worker's ``workdir/``, ``results/mqar_zoology*`` and
``results/runs/mqar_zoology/`` and Python sources, which no command writes, are left out,
so an editor's save or a running grid does not count).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from test_bad_inputs_reports import _reported_grid   # a reported grid of two runs
from test_distributed import _mr_data                 # a small Rotten Tomatoes folder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What the long-running zoology grid worker writes; not this test's business.
_WORKER = ('workdir/', 'results/mqar_zoology', 'results/runs/mqar_zoology/')


def _repo_state() -> dict:
  """``{path: (status, sha1 of its bytes)}`` of every changed or untracked file of the
  repository (``git status --porcelain --untracked-files=all``), the worker's paths and
  ``*.py`` aside."""
  import hashlib  # pylint: disable=g-import-not-at-top
  lines = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=all'], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
  state = {}
  for line in lines:
    path = line[3:].split(' -> ')[-1].strip('"')
    if path.startswith(_WORKER) or path.endswith('.py'):
      continue
    full = os.path.join(ROOT, path)
    digest = (hashlib.sha1(open(full, 'rb').read()).hexdigest()
              if os.path.isfile(full) else None)
    state[path] = (line[:2], digest)
  return state


def _tree(root) -> dict:
  """``{relative path: bytes, or None for a folder}`` of everything under ``root``."""
  out = {}
  for d, dirs, files in os.walk(root):
    out.update({os.path.relpath(os.path.join(d, x), root) + '/': None for x in dirs})
    for f in files:
      with open(os.path.join(d, f), 'rb') as handle:
        out[os.path.relpath(os.path.join(d, f), root)] = handle.read()
  return out


def _fails(tmp_path, module, *args) -> str:
  """Runs ``python -m <module> args`` from the repository root; asserts exit status 2, one
  line on standard error, no file changed under ``tmp_path`` or in the repository; returns
  the line without ``<program>: error: ``."""
  before, repo = _tree(tmp_path), _repo_state()
  proc = subprocess.run([sys.executable, '-m', module, *map(str, args)], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.count('\n') == 1, proc.stderr[-3000:]
  assert _tree(tmp_path) == before
  assert _repo_state() == repo
  program = module.rsplit('.', 1)[-1]
  assert proc.stderr.startswith(f'{program}: error: '), proc.stderr
  return proc.stderr[len(f'{program}: error: '):].rstrip('\n')


@pytest.fixture
def scratch(tmp_path):
  """``tmp_path`` with ``a_file`` (a file) and ``a_dir`` (an empty folder)."""
  (tmp_path / 'a_file').write_text('not a folder')
  (tmp_path / 'a_dir').mkdir()
  return tmp_path


# ----------------------------------------------------------------------------- experiments.train

@pytest.mark.parametrize('where', ['file', 'results.json a folder'])
def test_train_refuses_a_workdir_it_cannot_write(scratch, where):
  data = _mr_data(str(scratch / 'data'))
  if where == 'file':
    workdir, says = scratch / 'a_file', f"--workdir: '{scratch / 'a_file'}' is a file, not a folder."
  else:                               # a run folder whose results.json is a folder
    workdir = scratch / 'w'
    (workdir / 'results.json').mkdir(parents=True)
    says = (f'--workdir: {workdir / "results.json"} is a folder, but this command writes a '
            'file there; move it away. Nothing was written.')
  assert _fails(scratch, 'experiments.train', '--config=configs/rotten_tomatoes.py:kernel-elu,quick',
                f'--workdir={workdir}', f'--config.data.data_dir={data}') == says


# ----------------------------------------------------------------------------- experiments.grid

def test_grid_refuses_a_workdir_under_a_file(scratch):
  workdir = scratch / 'a_file' / 'grid'
  assert _fails(scratch, 'experiments.grid', '--dataset=rotten_tomatoes', '--variants=softmax',
                f'--workdir={workdir}', '--', f'--config.data.data_dir={scratch}') == (
      f"--workdir: '{workdir}' cannot be a folder: '{scratch / 'a_file'}' is a file.")


# ----------------------------------------------------------------------------- experiments.synthetic

def test_synthetic_refuses_an_output_that_is_a_folder_before_any_compute(scratch):
  # Before: the whole study ran (a minute), then results.md failed with a traceback,
  # leaving results.json and the figures of a study whose page was never written.
  (scratch / 'w' / 'results.md').mkdir(parents=True)
  assert _fails(scratch, 'experiments.synthetic', '--config=configs/synthetic.py:quick',
                f'--workdir={scratch / "w"}') == (
      f'--workdir: {scratch / "w" / "results.md"} is a folder, but this command writes a '
      'file there; move it away. Nothing was written.')


# ----------------------------------------------------------------------------- experiments.synthetic_report

def _study(workdir: pathlib.Path) -> None:
  """What experiments.synthetic leaves: results.json and one finished cell of records."""
  workdir.mkdir()
  (workdir / 'results.json').write_text(json.dumps(
      {'config': {}, 'command': 'python -m experiments.synthetic', 'commit': 'abc',
       'date': '2025-01-01', 'machine': {}}))
  (workdir / 'records.jsonl').write_text(
      json.dumps({'method': 'logreg', 'noise_index': 0, 'seed': 0, 'test_accuracy': 0.9})
      + '\n' + json.dumps({'cell_done': True, 'noise_index': 0, 'seed': 0}) + '\n')


@pytest.mark.slow
@pytest.mark.parametrize('where', ['missing', 'figure a folder'])
def test_synthetic_report_refuses_a_workdir_it_cannot_read_or_write(scratch, where):
  workdir = scratch / 'w'
  if where == 'missing':
    says = f"--workdir: '{workdir}' does not exist (expected a folder)."
  else:
    _study(workdir)
    (workdir / 'fig_accuracy_vs_noise.png').mkdir()
    says = (f'--workdir: {workdir / "fig_accuracy_vs_noise.png"} is a folder, but this '
            'command writes a file there; move it away. Nothing was written.')
  assert _fails(scratch, 'experiments.synthetic_report', f'--workdir={workdir}') == says


# ----------------------------------------------------------------------------- experiments.report

@pytest.mark.slow
@pytest.mark.parametrize('where', ['figure', 'summary', 'per-run file'])
def test_report_refuses_an_output_file_that_is_a_folder(tmp_path, where):
  _, args = _reported_grid(tmp_path)      # summaries, page, figures, per-run files exist
  path = {'figure': tmp_path / 'docs' / 'figures' / 'rotten_tomatoes_paired.png',
          'summary': tmp_path / 'results' / 'rotten_tomatoes.json',
          'per-run file': tmp_path / 'runs' / 'rotten_tomatoes' / 'kernel-favor' /
                          'seed0.json'}[where]
  flag = {'figure': '--figures', 'summary': '--out', 'per-run file': '--runs_out'}[where]
  path.unlink()
  path.mkdir()
  assert _fails(tmp_path, 'experiments.report', *args) == (
      f'{flag}: {path} is a folder, not a file; nothing was written.')


# ----------------------------------------------------------------------------- experiments.mqar

_TINY = ['--config=configs/mqar.py:quick', '--grid=tiny']


@pytest.mark.slow
@pytest.mark.parametrize('case', ['results in a missing folder', 'results a folder',
                                  'workdir under a file', 'page without collect_only',
                                  'results for one run'])
def test_mqar_refuses_an_output_it_cannot_write_before_any_run(scratch, case):
  # Before: the tiny grid trained its first run into --workdir, then failed on --results
  # with a traceback; --page without --collect_only was ignored without a word.
  work, results = scratch / 'work', scratch / 'r.json'
  args, says = {
      'results in a missing folder': (
          _TINY + [f'--workdir={work}', f'--results={scratch / "missing" / "r.json"}'],
          f'--results: the folder {scratch / "missing"} of {scratch / "missing" / "r.json"} '
          'does not exist; nothing was written.'),
      'results a folder': (
          _TINY + [f'--workdir={work}', f'--results={scratch / "a_dir"}'],
          f'--results: {scratch / "a_dir"} is a folder, not a file; nothing was written.'),
      'workdir under a file': (
          ['--config=configs/mqar.py:zoology', '--grid=zoology',
           f'--workdir={scratch / "a_file" / "w"}', f'--results={results}',
           f'--runs_dir={scratch / "runs"}'],
          f"--workdir: '{scratch / 'a_file' / 'w'}' cannot be a folder: "
          f"'{scratch / 'a_file'}' is a file."),
      'page without collect_only': (
          _TINY + [f'--workdir={work}', f'--results={results}',
                   f'--page={scratch / "page.md"}'],
          f'--page={scratch / "page.md"}: only with --collect_only; this command would ignore '
          'it. Nothing was run or written.'),
      'results for one run': (
          ['--config=configs/mqar.py:quick', f'--workdir={work}', f'--results={results}'],
          f'--results={results}: only with --grid or --collect_only (a single run writes '
          '<workdir>/result.json); this command would ignore it. Nothing was run or written.'),
  }[case]
  assert _fails(scratch, 'experiments.mqar', *args) == says
  assert not work.exists()


# ----------------------------------------------------------------------------- the studies
# Every study that writes into a --workdir or --out folder checks it before any compute.

@pytest.mark.slow
@pytest.mark.parametrize('module, args, flag', [
    ('studies.theory', ['--config=studies/theory/config.py'], '--workdir'),
    ('studies.synthetic_pilot', ['--config=configs/synthetic.py:quick'], '--workdir'),
    ('studies.phase_a_drift', [], '--out'),
    ('studies.phase_a_pilot', [], '--out'),
    ('studies.tfidf_baseline', [], '--out'),
])
def test_a_study_refuses_an_output_folder_that_is_a_file(scratch, module, args, flag):
  line = _fails(scratch, module, *args, f'{flag}={scratch / "a_file"}')
  assert line.startswith(f'{flag}: ') and str(scratch / 'a_file') in line, line


@pytest.mark.parametrize('module, args, flag, path', [
    ('studies.phase_a_repulsion', ['--runs={a_dir}'], '--docs', '{missing}/page.md'),
    ('studies.phase_a_repulsion.softmax', ['--runs={a_dir}'], '--docs', '{missing}/page.md'),
    ('studies.phase_a_repulsion', ['--runs={a_dir}'], '--out', '{a_dir}'),
    ('studies.softmax_mimicry', ['--runs={a_dir}'], '--page', '{missing}/page.md'),
    ('studies.softmax_mimicry', ['--runs={a_dir}', '--page={a_dir}/page.md'], '--figures',
     '{a_file}'),
    ('studies.softmax_mimicry', ['--runs={a_dir}'], '--workdir', '{a_file}/w'),
])
def test_a_study_checks_its_page_and_outputs_before_reading_any_run(scratch, module, args,
                                                                    flag, path):
  # Before: the repulsion studies wrote --out, then failed on a --docs in a missing folder
  # with a traceback; the mimicry study ran its parts before a bad --page or --figures.
  names = {'a_dir': scratch / 'a_dir', 'a_file': scratch / 'a_file',
           'missing': scratch / 'missing'}
  args = [a.format(**names) for a in args]
  value = path.format(**names)
  out = [] if flag == '--out' else [f'--out={scratch / "a_dir" / "r.json"}']
  line = _fails(scratch, module, *args, *out, f'{flag}={value}')
  assert line.startswith(f'{flag}: ') and value in line, line
