"""Where a result came from (git commit, machine), and atomic writes of results."""

import datetime
import json
import os
import platform
import subprocess
import sys

import jax


def git_commit() -> str:
  """HEAD of the working tree, with ``-dirty`` if tracked files differ from it.

  Without a git checkout (e.g. a copy of the tree on a GPU machine) the value of
  ``$COULOMB_JAX_COMMIT``, set by whoever sent the copy, marked as such; else
  ``'unknown'``.
  """
  try:
    head = subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'],
                           capture_output=True, text=True, check=True).stdout.strip()
    return head + ('-dirty' if dirty else '')
  except (OSError, subprocess.CalledProcessError):
    given = os.environ.get('COULOMB_JAX_COMMIT')
    return f'{given} (from COULOMB_JAX_COMMIT, no git checkout)' if given else 'unknown'


def machine() -> dict:
  """Processor, core count, Python, jax and the default device."""
  dev = jax.devices()[0]
  return {'processor': platform.processor() or platform.machine(),
          'cpu_count': os.cpu_count(), 'python': platform.python_version(),
          'jax': jax.__version__, 'platform': dev.platform, 'device_kind': dev.device_kind,
          'device_count': jax.device_count()}


def write_atomic(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` through a temporary file and ``os.replace``:
  a killed run leaves the old file or the new one, never half of one."""
  with open(path + '.tmp', 'w') as f:
    f.write(text)
  os.replace(path + '.tmp', path)


def write_json_atomic(path: str, obj, indent=None) -> None:
  write_atomic(path, json.dumps(obj, indent=indent))


def run_metadata(module: str) -> dict:
  """Command, commit, start date and machine: taken when a run of ``module`` starts."""
  return {'command': ' '.join(['python', '-m', module] + sys.argv[1:]),
          'commit': git_commit(),
          'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
          'machine': machine()}
