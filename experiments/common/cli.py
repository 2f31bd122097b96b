"""Entry points of the experiments: flag and config mistakes end in one line, not a traceback.

  if __name__ == '__main__':
    config_flags.DEFINE_config_file('config', None, 'Study config.', lock_config=True)
    flags.DEFINE_string('workdir', None, '...')
    cli.run(main)                        # instead of absl's app.run(main)

``run`` parses the flags itself and turns what ml_collections and absl raise
for a misspelled or unknown config field (``--config.langevin.stepsize=0.1``),
a wrong variant (``--config=configs/synthetic.py:quik``), a config file that
does not exist, an unknown flag or a value of the wrong type into one line on
standard error, with ml_collections' "Did you mean" suggestion when it has one,
and exit status 2. Inside ``main``, a ``ConfigError`` (a ``ValueError``; raise it
for a bad config value found before any work starts), a ``StorageError`` (the disk
refused a write, e.g. a checkpoint) and any ``OSError`` of a full disk (ENOSPC) end
the same way. Every other exception keeps its traceback: it is a bug, not a typo.
"""

import errno
import os
import re
import sys
from typing import Callable, Sequence

from absl import app
from absl import flags


class ConfigError(ValueError):
  """A bad config value or workdir, found before the run starts: reported in one line."""


class StorageError(OSError):
  """A write the disk refused (full, read-only, ...), with what was kept: one line."""


_EXCEPTION_LINE = re.compile(r'^\s*(?:[\w.]+\.)?\w*(?:Error|Exception): (.*)$')


def _innermost(error: BaseException) -> BaseException:
  """ml_collections wraps a KeyError in an AttributeError: the first one carrying text."""
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  return error


def one_line(error: BaseException, argv: Sequence[str] = ()) -> str:
  """The message of a flag or config error as one line, naming the argument when it can."""
  error = _innermost(error)
  text = error.args[0] if (isinstance(error, KeyError) and error.args
                           and isinstance(error.args[0], str)) else str(error)
  lines = [l.strip() for l in text.splitlines()
           if l.strip() and not l.strip().startswith('Pass --helpshort')]
  missing = re.match(r"^'([^']+)'$", lines[0]) if lines else None
  if missing and len(lines) > 1:                   # KeyError('\'stepsize\'\nDid you mean …')
    key = missing.group(1)
    arg = next((a for a in argv if re.search(rf'\.{re.escape(key)}(=|\.|$)', a)), None)
    where = f'{arg}: ' if arg else ''
    return f"{where}unknown config field '{key}'. {' '.join(lines[1:])}"
  if any(l.startswith('Traceback') for l in lines):  # an error raised inside the config file
    flag = next((m.group(1) for l in lines for m in [re.match(r'^flag (--\S+):', l)] if m), '')
    cause = [m.group(1) for l in lines for m in [_EXCEPTION_LINE.match(l)] if m]
    return f"{flag}: {cause[-1]}" if flag and cause else ' '.join(lines[-1:])
  if any('Failed loading config file' in l for l in lines):
    errno = next((l for l in lines if l.startswith('[Errno')), lines[-1])
    return f'--config: cannot load the config file: {errno}'
  return ' '.join(lines) if lines else type(error).__name__


def fail(message: str, exit_now: bool = False) -> None:
  """Prints ``<program>: error: <message>`` on standard error and exits with status 2.

  ``exit_now``: ``os._exit(2)`` instead of ``sys.exit(2)``, for a thread that must end
  the process while the main thread is blocked in native code.
  """
  program = os.path.splitext(os.path.basename(sys.argv[0] or 'experiment'))[0]
  print(f'{program}: error: {message}', file=sys.stderr, flush=True)
  if exit_now:
    os._exit(2)  # pylint: disable=protected-access
  sys.exit(2)


def parse_flags(argv: Sequence[str], config_flags: Sequence[str] = ('config',),
                flag_values: flags.FlagValues = flags.FLAGS) -> list:
  """``flag_values(argv)``, loading every config flag now; one-line ``fail`` on a mistake."""
  try:
    rest = flag_values(list(argv))
    for name in config_flags:
      if name in flag_values:
        config = flag_values[name].value
        if config is not None:
          config.keys()                  # a config that failed to load raises here
  except (flags.Error, KeyError, AttributeError, OSError, TypeError, ValueError) as e:
    fail(one_line(e, argv))
  return rest


def run(main: Callable[[list], object], config_flags: Sequence[str] = ('config',)) -> None:
  """``absl.app.run(main)`` with one-line errors (module docstring); never returns."""
  def checked_main(argv):
    try:
      return main(argv)
    except (ConfigError, StorageError) as e:
      fail(str(e))
    except OSError as e:
      if e.errno != errno.ENOSPC:
        raise
      fail(f'{e.filename or "a file"}: no space left on device ({e.strerror}); what was '
           'written before is kept (files are replaced atomically). Free some space and '
           'rerun the same command.')
  app.run(checked_main, flags_parser=lambda argv: parse_flags(argv, config_flags))
