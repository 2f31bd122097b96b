"""The benchmark pages regenerate from their committed JSON alone, byte for byte (issue 37:
every committed results page regenerates from its committed JSON): each of
``benchmarks/results/**/{attention,hamiltonian_<map>,phase_a}.md`` with
``python -m benchmarks.<name> --page_from_results``, and ``docs/figures/performance_attention.png``
with ``benchmarks.attention_figure``. Each case copies the committed JSON into a folder of its
own beside a spoiled page, runs the command as a user does and compares the page with the
committed one; nothing else is written and nothing is measured. A flag that would change what
is measured is refused in one line, before any write."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join('benchmarks', 'results')
# (command, folder under benchmarks/results, page stem, extra flags)
PAGES = [('attention', folder, 'attention', [])
         for folder in ('', 'causal_cpu', 'learned_vs_vanilla', 'learned_vs_vanilla_favor')]
PAGES += [('hamiltonian', '', f'hamiltonian_{m}', [f'--feature_map={m}']) for m in ('favor', 'rff')]
PAGES += [('phase_a', '', 'phase_a', [])]


def _run(name, *args):
  return subprocess.run([sys.executable, '-m', f'benchmarks.{name}', *map(str, args)], cwd=ROOT,
                        capture_output=True, text=True, timeout=120, check=False,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))


def _bytes(path):
  with open(path, 'rb') as f:
    return f.read()


def test_every_committed_benchmark_page_is_covered():
  covered = {os.path.join(RESULTS, folder, stem + '.md') for _, folder, stem, _ in PAGES}
  committed = {os.path.relpath(os.path.join(d, f), ROOT)
               for d, _, files in os.walk(os.path.join(ROOT, RESULTS)) for f in files
               if f.endswith('.md') and os.path.isfile(os.path.join(d, f[:-3] + '.json'))}
  assert committed == covered


@pytest.mark.parametrize('name, folder, stem, extra', PAGES)
def test_page_regenerates_byte_for_byte(name, folder, stem, extra, tmp_path):
  committed = os.path.join(ROOT, RESULTS, folder, stem)
  shutil.copy(committed + '.json', tmp_path / (stem + '.json'))
  (tmp_path / (stem + '.md')).write_text('an old page\n', encoding='utf-8')
  out = _run(name, '--page_from_results', f'--out={tmp_path}', *extra)
  assert out.returncode == 0, out.stderr[-2000:]
  assert (tmp_path / (stem + '.md')).read_bytes() == _bytes(committed + '.md')
  assert sorted(os.listdir(tmp_path)) == [stem + '.json', stem + '.md']   # nothing else
  assert _bytes(tmp_path / (stem + '.json')) == _bytes(committed + '.json')


def test_attention_figure_redraws_byte_for_byte(tmp_path):
  png = tmp_path / 'performance_attention.png'
  out = _run('attention_figure', f'--attention={ROOT}/{RESULTS}/attention.json', f'--out={png}')
  assert out.returncode == 0, out.stderr[-2000:]
  assert png.read_bytes() == _bytes(os.path.join(ROOT, 'docs', 'figures',
                                                 'performance_attention.png'))


@pytest.mark.parametrize('name, args, message', [
    ('attention', ['--nolearned'], 'drop --learned=False'),
    ('hamiltonian', ['--feature_map=favor', '--n=100'], 'drop --n=100'),
    ('phase_a', ['--repeats=3'], 'drop --repeats=3'),
])
def test_a_flag_that_would_measure_is_refused_before_any_write(name, args, message, tmp_path):
  stem = {'attention': 'attention', 'hamiltonian': 'hamiltonian_favor', 'phase_a': 'phase_a'}
  shutil.copy(os.path.join(ROOT, RESULTS, stem[name] + '.json'), tmp_path)
  out = _run(name, '--page_from_results', f'--out={tmp_path}', *args)
  lines = out.stderr.splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith(f'{name}: error: --page_from_results') and message in lines[0]
  assert os.listdir(tmp_path) == [stem[name] + '.json']


def test_a_missing_record_is_one_line_naming_out(tmp_path):
  out = _run('phase_a', '--page_from_results', f'--out={tmp_path}')
  lines = out.stderr.splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith('phase_a: error: --out:') and 'phase_a.json' in lines[0]
  assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_a_measured_page_is_the_page_of_its_own_record(tmp_path):
  # A tiny measuring run: its page equals --page_from_results of the JSON it wrote, so the
  # command string the record keeps and the page's reading of it cannot drift apart.
  out = _run('hamiltonian', '--feature_map=favor', '--n=4,6', '--num_particles=2', '--dim=2',
             '--repeats=1', '--naive_max_n=4', f'--out={tmp_path}')
  assert out.returncode == 0, out.stderr[-2000:]
  measured = (tmp_path / 'hamiltonian_favor.md').read_bytes()
  assert b'| 2 | 6 |' in measured and '| – |'.encode() in measured   # naive skipped at n = 6
  (tmp_path / 'hamiltonian_favor.md').unlink()
  out = _run('hamiltonian', '--page_from_results', '--feature_map=favor', f'--out={tmp_path}')
  assert out.returncode == 0, out.stderr[-2000:]
  assert (tmp_path / 'hamiltonian_favor.md').read_bytes() == measured


def test_a_corrupt_record_is_one_line_naming_out(tmp_path):
  (tmp_path / 'phase_a.json').write_text('{not json', encoding='utf-8')
  out = _run('phase_a', '--page_from_results', f'--out={tmp_path}')
  lines = out.stderr.splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith('phase_a: error: --out:') and 'not valid JSON' in lines[0]
  assert os.listdir(tmp_path) == ['phase_a.json']
