r"""Where a result came from (command, git commit, machine), and atomic writes of results.

Commands are recorded as run from the repository root, with every path argument
relative to it (``--workdir=/tmp/x`` launched from ``/tmp`` as ``--workdir=x``
is recorded as ``--workdir=../../tmp/x`` when the repository is ``/work/main``):
results never carry the absolute path of the machine that made them.

Files written before that rule can be rewritten in place:

  python -m experiments.common.provenance --relativize results docs [--root=/work/main]

replaces, in every ``.json`` and ``.md`` file under the given files or folders,
each absolute path under ``--root`` (the repository root the files were made in;
default: this checkout's) or under its parent folder (``../shared/data``) by the
path relative to ``--root``. Nothing else changes: a JSON file is rewritten only
if every number, key and non-path string reads back the same.
"""

import contextlib
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from typing import Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The root of this checkout (the folder holding ``experiments/``)."""


def git_commit() -> str:
  """HEAD of the repository, with ``-dirty`` if tracked files differ from it.

  ``$COULOMB_JAX_COMMIT``, when set, wins, marked as such: whoever sent a copy of the tree
  to another machine (the GPU scripts) names the commit it holds. A device copy may carry
  a ``.git`` of another commit than its files (seen 2026-12-04: the session's starting
  commit, so git said ``<that>-dirty``). Else, without a git checkout, ``'unknown'``.
  Asks the repository of this file, whatever the current folder.
  """
  given = os.environ.get('COULOMB_JAX_COMMIT')
  if given:
    return f'{given} (from COULOMB_JAX_COMMIT)'
  try:
    git = ['git', '-C', REPO_ROOT]
    head = subprocess.run(git + ['rev-parse', 'HEAD'], capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(git + ['status', '--porcelain', '--untracked-files=no'],
                           capture_output=True, text=True, check=True).stdout.strip()
    return head + ('-dirty' if dirty else '')
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'


def machine() -> dict:
  """Processor, core count, Python, jax and the default device."""
  import jax  # pylint: disable=g-import-not-at-top  (the --relativize command needs no jax)
  dev = jax.devices()[0]
  return {'processor': platform.processor() or platform.machine(),
          'cpu_count': os.cpu_count(), 'python': platform.python_version(),
          'jax': jax.__version__, 'platform': dev.platform, 'device_kind': dev.device_kind,
          'device_count': jax.device_count()}


@contextlib.contextmanager
def atomic_open(path: str, mode: str = 'w'):
  """``open`` of ``path + '.tmp'``, moved onto ``path`` by ``os.replace`` once the block
  ends: a killed run leaves the old file or the new one, never half of one; a write
  that fails (an unencodable character, a full disk) leaves the old file, removes the
  temporary one and, for an ``OSError`` that names no file (``f.write``'s), names
  ``path`` in it."""
  tmp = path + '.tmp'
  try:
    with open(tmp, mode) as f:
      yield f
    os.replace(tmp, path)
  except BaseException as e:
    if os.path.lexists(tmp):
      os.remove(tmp)
    if isinstance(e, OSError) and e.filename is None:
      e.filename = path
    raise


def write_atomic(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` through ``atomic_open``."""
  with atomic_open(path) as f:
    f.write(text)


def write_json_atomic(path: str, obj, indent=None) -> None:
  """``obj`` as JSON, written by ``write_atomic`` (serialised first: an object JSON cannot
  hold raises before anything is written)."""
  write_atomic(path, json.dumps(obj, indent=indent))


# ----------------------------------------------------------------------------- paths

def relative_path(path: str, cwd: Optional[str] = None, root: str = REPO_ROOT) -> str:
  """``path`` (absolute, or relative to ``cwd``, default the current folder) relative to
  ``root``: what the path is called from the repository root."""
  full = os.path.normpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(path)))
  return os.path.relpath(full, root)


def _is_path(value: str, cwd: str) -> bool:
  if not value or '://' in value:
    return False
  return (value.startswith(('/', '~', './', '../')) or '/' in value
          or os.path.exists(os.path.join(cwd, value)))


def _relative_value(value: str, cwd: str, root: str) -> str:
  """A flag value with its path part made relative; ``configs/x.py:variant`` keeps its variant."""
  head, sep, tail = value.partition(':')
  if sep and head.endswith('.py') and _is_path(head, cwd):
    return relative_path(head, cwd, root) + sep + tail
  return relative_path(value, cwd, root) if _is_path(value, cwd) else value


def relative_args(argv: Sequence[str], cwd: Optional[str] = None,
                  root: str = REPO_ROOT) -> list:
  """Command-line arguments with every path argument relative to ``root``.

  ``--flag=value`` and bare arguments are read as paths when they are absolute,
  start with ``~``/``./``/``../``, contain a ``/`` or name something that exists in
  ``cwd``; anything else (numbers, names, lists) is kept as it is.
  """
  cwd = cwd or os.getcwd()
  out = []
  for arg in argv:
    if arg.startswith('-'):
      name, sep, value = arg.partition('=')
      out.append(name + sep + _relative_value(value, cwd, root) if sep else arg)
    else:
      out.append(_relative_value(arg, cwd, root))
  return out


def run_metadata(module: str) -> dict:
  """Command, commit, start date and machine: taken when a run of ``module`` starts.

  The command is ``python -m <module>`` with the arguments of ``sys.argv`` made
  relative to the repository root (``relative_args``): it reruns from the root.
  """
  return {'command': ' '.join(['python', '-m', module] + relative_args(sys.argv[1:])),
          'commit': git_commit(),
          'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
          'machine': machine()}


# ----------------------------------------------------------------------------- migration

_ABSOLUTE = re.compile(r"(?<![\w.~/-])/[^\s\"'`()\[\],;|<>]*")


def relativize_text(text: str, root: str = REPO_ROOT):
  """``(new_text, count)``: absolute paths under ``root`` or its parent made relative to it."""
  root = os.path.normpath(root)
  parent = os.path.dirname(root)
  count = 0

  def replace(match):
    nonlocal count
    path = match.group(0)
    if parent == '/' or not (path == parent or path.startswith(parent + '/')):
      return path
    count += 1
    return os.path.relpath(os.path.normpath(path), root)

  return _ABSOLUTE.sub(replace, text), count


def _same_but_paths(old, new, root):
  """True when ``new`` is ``old`` with only path strings relativized."""
  if isinstance(old, dict):
    return (isinstance(new, dict) and list(old) == list(new)
            and all(_same_but_paths(old[k], new[k], root) for k in old))
  if isinstance(old, list):
    return (isinstance(new, list) and len(old) == len(new)
            and all(_same_but_paths(a, b, root) for a, b in zip(old, new)))
  if isinstance(old, str):
    return isinstance(new, str) and relativize_text(old, root)[0] == new
  return old == new or (old != old and new != new)      # nan reads back as nan


def relativize_files(paths: Sequence[str], root: str = REPO_ROOT) -> dict:
  """Rewrites the ``.json``/``.md`` files under ``paths``; returns ``{file: replacements}``."""
  files = []
  for path in paths:
    if os.path.isdir(path):
      for folder, dirs, names in os.walk(path):
        dirs.sort()
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(('.json', '.md'))]
    else:
      files.append(path)
  changed = {}
  for name in files:
    with open(name) as f:
      old = f.read()
    new, count = relativize_text(old, root)
    if not count:
      continue
    if name.endswith('.json') and not _same_but_paths(json.loads(old), json.loads(new), root):
      raise ValueError(f'{name}: relativizing would change more than paths; left as it is.')
    write_atomic(name, new)
    changed[name] = count
  return changed


if __name__ == '__main__':
  from absl import flags  # pylint: disable=g-import-not-at-top
  from experiments.common import cli  # pylint: disable=g-import-not-at-top

  _RELATIVIZE = flags.DEFINE_bool('relativize', False, 'Rewrite absolute paths in the .json '
                                  'and .md files under the arguments as relative ones.')
  _ROOT = flags.DEFINE_string('root', REPO_ROOT, 'The repository root the files were made in.')

  def main(argv):
    if not _RELATIVIZE.value or len(argv) < 2:
      raise cli.ConfigError('usage: python -m experiments.common.provenance --relativize PATH...')
    changed = relativize_files(argv[1:], _ROOT.value)
    for name, count in changed.items():
      print(f'{name}: {count} path{"s" * (count != 1)} made relative to the repository root')
    print(f'{len(changed)} file{"s" * (len(changed) != 1)} rewritten')

  cli.run(main, config_flags=())
