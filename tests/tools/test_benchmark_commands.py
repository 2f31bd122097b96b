"""The four benchmark commands (benchmarks/attention.py, hamiltonian.py, phase_a.py,
recall_compile.py) launch through ``experiments.common.cli.run``, as every other command:
``python -m benchmarks.<name> --help`` from the repository root prints the usage line and
every flag the module defines, and one bad flag value ends in one line
``<name>: error: --<flag>: ...`` naming the value, exit status 2, with nothing written (no
``--out`` folder; recall_compile: no temporary folder). No benchmark runs: each bad value is
refused before any compute, so each case costs one import of the command.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name -> (bad arguments, the flag named, the value the line must quote)
BAD = {
    'attention': (['--impls=materialized,flash'], 'impls', "'flash'"),
    'hamiltonian': (['--feature_map=rf'], 'feature_map', "'rf'"),
    'phase_a': (['--lengths=32,-64'], 'lengths', "'-64'"),
    'recall_compile': (['--method=particle_flow'], 'method', "'particle_flow'"),
}


def _run(name, args, tmp_path):
  env = dict(os.environ, JAX_PLATFORMS='cpu', TMPDIR=str(tmp_path / 'tmp'))
  return subprocess.run([sys.executable, '-m', f'benchmarks.{name}', *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=120)


def _flags(name):
  """The flags the module defines, read from its source."""
  with open(os.path.join(ROOT, 'benchmarks', f'{name}.py'), encoding='utf-8') as f:
    found = re.findall(r"DEFINE_\w+\(\s*'(\w+)'", f.read())
  assert found, name
  return found


@pytest.mark.parametrize('name', sorted(BAD))
def test_help_lists_the_flags(name, tmp_path):
  (tmp_path / 'tmp').mkdir()
  out = _run(name, ['--help'], tmp_path)
  # absl's --help prints the module's docstring and its flags, and exits with 1.
  assert out.returncode == 1 and 'Traceback' not in out.stderr, out.stderr[-2000:]
  assert f'python -m benchmarks.{name}' in out.stdout
  assert 'Try --helpfull to get a list of all flags.' in out.stdout
  missing = [flag for flag in _flags(name)                  # a bool flag: --[no]learned
             if not re.search(rf'--(\[no\])?{flag}:', out.stdout)]
  assert not missing, out.stdout


@pytest.mark.parametrize('name', sorted(BAD))
def test_a_bad_flag_value_ends_in_one_line_and_writes_nothing(name, tmp_path):
  args, flag, value = BAD[name]
  (tmp_path / 'tmp').mkdir()
  out_dir = tmp_path / 'out'
  if name != 'recall_compile':                   # it has no output flag
    args = args + [f'--out={out_dir}']
  out = _run(name, args, tmp_path)
  lines = out.stderr.splitlines()
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
  assert lines[0].startswith(f'{name}: error: --{flag}') and value in lines[0], lines
  assert not out_dir.exists()
  assert not os.listdir(tmp_path / 'tmp')        # recall_compile's program folder too
