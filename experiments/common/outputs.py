"""Output paths, checked before a command writes any of them (issue 39 item 1).

A command that fails changes nothing: every folder and file it will write is checked
first, and a path that cannot be written ends in one ``cli.ConfigError`` naming the flag
and the value (``cli.run`` prints it as one line, exit status 2). The files themselves
are written atomically (``provenance.atomic_open``, ``plots.save``).

* ``check_folder(flag, path)``: a folder the command makes if it is missing (a workdir,
  ``--out``): refused when it is a file or lies under one; ``must_exist=True``: also when
  it is not there (a folder the command reads, ``--runs``).
* ``check_file(flag, path)``: a file the command writes (``--results``, ``--page``, a
  figure): refused when it is a folder, when its folder lies under a file, or
  (``folder_must_exist``, the default) when its folder does not exist: a typo in the
  folder would otherwise surface only at the first write, after the work.
* ``check_files_in(flag, folder, names)``: the files a command writes inside a folder it
  owns (a workdir's ``results.md``) are not folders.
"""

import os
from typing import Iterable

from experiments.common import cli


def _file_above(path: str):
  """The nearest existing ancestor of ``path`` (itself included) if it is a file, else None."""
  current = os.path.abspath(path)
  while not os.path.exists(current):
    parent = os.path.dirname(current)
    if parent == current:
      return None
    current = parent
  return None if os.path.isdir(current) else current


def check_folder(flag: str, path: str, must_exist: bool = False) -> None:
  """One ``cli.ConfigError`` naming ``flag`` when ``path`` is a file, when a parent of it
  that exists is a file (the folder cannot be made), or (``must_exist``) when it is not
  there."""
  if os.path.isdir(path):
    return
  if os.path.exists(path):
    raise cli.ConfigError(f'{flag}: {path!r} is a file, not a folder.')
  if must_exist:
    raise cli.ConfigError(f'{flag}: {path!r} does not exist (expected a folder).')
  above = _file_above(path)
  if above is not None:
    raise cli.ConfigError(f'{flag}: {path!r} cannot be a folder: {above!r} is a file.')


def check_file(flag: str, path: str, folder_must_exist: bool = True) -> None:
  """One ``cli.ConfigError`` naming ``flag`` when the file ``path`` cannot be written: it
  is a folder, a parent of it is a file, or (``folder_must_exist``) its folder does not
  exist. The messages end in 'nothing was written' (the check comes before any write)."""
  if os.path.isdir(path):
    raise cli.ConfigError(f'--{flag.lstrip("-")}: {path} is a folder, not a file; nothing '
                          'was written.')
  folder = os.path.dirname(os.path.abspath(path))
  above = _file_above(folder)
  if above is not None:
    raise cli.ConfigError(f'--{flag.lstrip("-")}: {path} cannot be written: {above} is a '
                          'file, not a folder; nothing was written.')
  if folder_must_exist and not os.path.isdir(folder):
    raise cli.ConfigError(f'--{flag.lstrip("-")}: the folder {folder} of {path} does not '
                          'exist; nothing was written.')


def check_files_in(flag: str, folder: str, names: Iterable[str]) -> None:
  """One ``cli.ConfigError`` naming ``flag`` when a file ``<folder>/<name>`` the command
  will write is a folder (``os.replace`` cannot put a file there)."""
  for name in names:
    path = os.path.join(folder, name)
    if os.path.isdir(path):
      raise cli.ConfigError(f'{flag}: {path} is a folder, but this command writes a file '
                            'there; move it away. Nothing was written.')
