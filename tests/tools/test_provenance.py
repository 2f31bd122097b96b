"""Tests of experiments.common.provenance: commands relative to the repository, the path migration."""

import json
import os
import sys

import pytest

from experiments.common import provenance

ROOT = provenance.REPO_ROOT


def test_repo_root_is_this_checkout():
  assert os.path.isfile(os.path.join(ROOT, 'experiments', 'common', 'provenance.py'))
  assert os.path.isfile(os.path.join(ROOT, 'configs', 'synthetic.py'))


def test_relative_args_from_another_folder(tmp_path):
  cwd = str(tmp_path)
  args = provenance.relative_args(
      [f'--config={ROOT}/configs/synthetic.py:quick', '--workdir=out/quick',
       f'--config.data.data_dir={os.path.dirname(ROOT)}/shared/data', '--config.seed=3',
       '--config.methods=rff,coulomb', '--out', f'{ROOT}/results', '--flag',
       '--url=https://example.org/a/b'], cwd=cwd, root=ROOT)
  to_tmp = os.path.relpath(cwd, ROOT)                     # e.g. ../../tmp/pytest-…
  assert args == ['--config=configs/synthetic.py:quick', f'--workdir={to_tmp}/out/quick',
                  '--config.data.data_dir=../shared/data', '--config.seed=3',
                  '--config.methods=rff,coulomb', '--out', 'results', '--flag',
                  '--url=https://example.org/a/b']
  assert not any(a.partition('=')[2].startswith('/') for a in args)


def test_relative_args_from_the_root_leave_relative_paths_alone():
  args = ['--config=configs/sst2.py:kernel-favor,quick', '--workdir=workdir/x/seed0',
          '--runs=workdir/grid', '--tasks=sst2']
  assert provenance.relative_args(args, cwd=ROOT, root=ROOT) == args


def test_run_metadata_records_the_command_from_the_root(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, 'argv', [f'{ROOT}/experiments/synthetic.py',
                                    f'--config={os.path.relpath(ROOT, tmp_path)}/configs/synthetic.py',
                                    f'--workdir={tmp_path}/w'])
  monkeypatch.setattr(provenance, 'machine', lambda: {'platform': 'cpu'})
  meta = provenance.run_metadata('experiments.synthetic')
  assert meta['command'] == (f'python -m experiments.synthetic --config=configs/synthetic.py '
                             f'--workdir={os.path.relpath(tmp_path, ROOT)}/w')
  # The commit is the repository's, whatever the current folder.
  here = meta['commit']
  monkeypatch.chdir(ROOT)
  assert provenance.git_commit() == here


def test_relativize_text_only_touches_paths_under_the_root_and_its_parent():
  text = ('`python -m experiments.report --runs=/work/main/workdir/grid` and '
          '--data=/work/shared/data, /work/main alone, 0.8 runs/s, (a + b)/2, /usr/bin/env, '
          '/work/mainly/x')
  new, count = provenance.relativize_text(text, '/work/main')
  assert new == ('`python -m experiments.report --runs=workdir/grid` and '
                 '--data=../shared/data, . alone, 0.8 runs/s, (a + b)/2, /usr/bin/env, '
                 '../mainly/x')
  assert count == 4


def test_relativize_files_keeps_every_number(tmp_path):
  results = tmp_path / 'results'
  results.mkdir()
  record = {'command': 'python -m experiments.train --workdir=/work/main/workdir/g/seed0',
            'accuracy': 0.8123456789, 'nan': float('nan'), 'runs': [1, 2.5, None],
            'nested': {'path': '/work/main/results/tfidf/sst2.json', 'n': 3}}
  (results / 'sst2.json').write_text(json.dumps(record, indent=1))
  (results / 'notes.md').write_text('Command: `--out=/work/main/results/tfidf`\n')
  (results / 'clean.md').write_text('nothing to do\n')
  (results / 'data.npz').write_bytes(b'/work/main/binary')     # not .json/.md: untouched
  changed = provenance.relativize_files([str(results)], root='/work/main')
  assert changed == {str(results / 'notes.md'): 1, str(results / 'sst2.json'): 2}
  got = json.loads((results / 'sst2.json').read_text())
  assert got['command'] == 'python -m experiments.train --workdir=workdir/g/seed0'
  assert got['nested'] == {'path': 'results/tfidf/sst2.json', 'n': 3}
  assert got['accuracy'] == 0.8123456789 and got['runs'] == [1, 2.5, None]
  assert (results / 'notes.md').read_text() == 'Command: `--out=results/tfidf`\n'
  assert (results / 'data.npz').read_bytes() == b'/work/main/binary'
  assert provenance.relativize_files([str(results)], root='/work/main') == {}   # idempotent


@pytest.mark.parametrize('folder', ['results', 'docs'])
def test_committed_results_and_docs_carry_no_absolute_paths(folder):
  """What `git grep -E '/(work|tmp|home|root)/' -- results docs` checks, for the files here."""
  offenders = []
  for base, _, names in os.walk(os.path.join(ROOT, folder)):
    for name in names:
      if name.endswith(('.json', '.md')):
        with open(os.path.join(base, name)) as f:
          text = f.read()
        for prefix in ('/work/', '/tmp/', '/home/', '/root/', ROOT + '/'):
          if prefix in text:
            offenders.append(f'{os.path.join(base, name)}: {prefix}')
  assert not offenders


def test_the_relativize_command_launches_through_cli_run(tmp_path):
  # Issue 37 item 4: one launcher; a call without --relativize is one line, exit 2.
  import subprocess  # pylint: disable=g-import-not-at-top
  proc = subprocess.run([sys.executable, '-m', 'experiments.common.provenance', str(tmp_path)],
                        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 2
  assert proc.stderr == ('provenance: error: usage: python -m experiments.common.provenance '
                         '--relativize PATH...\n')
