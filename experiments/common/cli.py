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
refused a write, e.g. a checkpoint), a ``FloatingPointError`` (a run whose particles or
loss stopped being finite, stopped before saving; it names the layer and head) and any
``OSError`` of a full disk (ENOSPC) end the same way. Every other exception keeps its
traceback: it is a bug, not a typo.

A run that can be stopped and resumed wraps its work in ``stop_on_signals()``:
SIGINT (Ctrl-C) and SIGTERM then raise ``Stopped`` (a ``KeyboardInterrupt``) in
the main thread, a write inside ``signals_deferred()`` (a checkpoint save) finishing
first; the run turns it into ``Stopped(signum, what)`` (where it stopped, what is
kept) and ``run`` prints that in one line with the command that resumes it
(``command_line``), exit status 128 + the signal's number (130, 143).
"""

import contextlib
import errno
import os
import re
import shlex
import signal
import sys
from typing import Callable, Optional, Sequence

from absl import app
from absl import flags


class ConfigError(ValueError):
  """A bad config value or workdir, found before the run starts: reported in one line."""


def check_names(field: str, value, allowed: Sequence[str]) -> None:
  """``--config.<field>``, a tuple of names, is non-empty and within ``allowed``: one
  ``ConfigError`` naming the field, the names not allowed and the tuple syntax otherwise
  (``--config.f=a,b`` gives the one name ``'a,b'``)."""
  allowed = list(allowed)
  bad = [v for v in value if v not in allowed] if isinstance(value, (tuple, list)) else [value]
  if bad or not value:
    raise ConfigError(f'--config.{field}: {bad or value!r} not in {allowed} (a tuple: '
                      f'--config.{field}="({allowed[0]!r},)").')


def refuse_beside_page_from_results(source: str, names: Sequence[str], config=None,
                                    default=None, keep: Sequence[str] = (),
                                    any_value: bool = False) -> None:
  """``--page_from_results`` reads ``source`` (a flag, e.g. ``'--out'``) alone and writes only
  the page: one ``ConfigError`` naming the first flag of ``names`` given on the command line
  (a bool given as false aside, unless ``any_value``: a bool whose false also changes what is
  computed), or else the first field of ``config`` outside ``keep`` that differs from
  ``default`` (a config that would change what is computed)."""
  for name in names:
    flag = flags.FLAGS[name]
    if flag.present and (any_value or flag.value is not False):
      value = ','.join(map(str, flag.value)) if isinstance(flag.value, list) else flag.value
      raise ConfigError(f'--page_from_results writes only the page from {source}; drop '
                        f'--{name}={value}.')
  for field in (config or ()):
    if field not in keep and config[field] != default[field]:
      raise ConfigError(f'--page_from_results writes only the page from {source}; drop '
                        f'--config.{field}={config[field]}.')


class StorageError(OSError):
  """A write the disk refused (full, read-only, ...), with what was kept: one line."""


class Stopped(KeyboardInterrupt):
  """A run stopped by a signal: ``run`` prints ``<program>: <message>; to resume, run the
  same command: <command_line()>`` and exits with ``exit_code`` (128 + ``signum``).

  ``signum``: SIGINT or SIGTERM; ``message``: where the run stopped and what it kept (''
  when raised by the signal itself, before the run says)."""

  def __init__(self, signum: int = signal.SIGINT, message: str = ''):
    super().__init__(message)
    self.signum = int(signum)
    self.message = message

  @property
  def signal_name(self) -> str:
    return signal.Signals(self.signum).name

  @property
  def exit_code(self) -> int:
    return 128 + self.signum


# stop_on_signals' state: installed (nesting depth), deferring (signals_deferred depth),
# the signal that came while deferring, and whether a stop has been raised already.
_SIGNALS = {'installed': 0, 'deferring': 0, 'pending': None, 'stopping': False,
            'entered': False}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _on_signal(signum, frame):  # pylint: disable=unused-argument
  if _SIGNALS['stopping'] or _SIGNALS['pending'] is not None:
    return                        # Stopping already: the clean-up is not interrupted again.
  if _SIGNALS['deferring']:
    _SIGNALS['pending'] = signum  # Raised when the write in progress is complete.
    return
  _SIGNALS['stopping'] = True
  raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals():
  """While open (main thread only), SIGINT and SIGTERM raise ``Stopped(signum)``, once:
  later ones are ignored while the stop unwinds. Inside ``signals_deferred`` the signal
  waits for the block's end. The previous handlers are put back on leaving."""
  previous = {s: signal.signal(s, _on_signal) for s in STOP_SIGNALS}
  if not _SIGNALS['installed']:
    _SIGNALS.update(pending=None, stopping=False, entered=True)
  _SIGNALS['installed'] += 1
  try:
    yield
  finally:
    _SIGNALS['installed'] -= 1
    for s, handler in previous.items():
      signal.signal(s, handler)


@contextlib.contextmanager
def signals_deferred():
  """A block a stop must not cut in two (a checkpoint save): a SIGINT or SIGTERM caught
  by ``stop_on_signals`` while it runs is raised as ``Stopped`` once it has completed
  (if it raises, its own error goes on). Outside ``stop_on_signals``, nothing changes."""
  _SIGNALS['deferring'] += 1
  try:
    yield
  finally:
    _SIGNALS['deferring'] -= 1
  pending = _SIGNALS['pending']
  if pending is not None and not _SIGNALS['deferring'] and not _SIGNALS['stopping']:
    _SIGNALS.update(pending=None, stopping=True)
    raise Stopped(pending)


def exit_on_signals() -> None:
  """For the top of a command's script, before its slow imports: until ``stop_on_signals``
  takes over, SIGINT or SIGTERM ends the process at once (``SystemExit``, no traceback)
  with status 128 + the signal's number, and, before the run has started, one line
  saying that nothing was written. (Once the run has left ``stop_on_signals`` it has
  said how it ended: the exit is silent.)"""
  def handler(signum, frame):  # pylint: disable=unused-argument
    if not _SIGNALS['entered']:
      print(f'{program()}: stopped by {signal.Signals(signum).name} while starting, before '
            f'the run wrote anything; to run it, run the same command again: '
            f'{command_line()}', file=sys.stderr, flush=True)
    sys.exit(128 + signum)

  for s in STOP_SIGNALS:
    signal.signal(s, handler)


def command_line(argv: Optional[Sequence[str]] = None) -> str:
  """The command that started this process, to type again in the current folder: the
  interpreter (relative to the current folder when inside it), ``-m <module>`` or the
  script as given, then the arguments; shell-quoted."""
  argv = list(sys.argv if argv is None else argv)
  exe = sys.executable or 'python'
  rel = os.path.relpath(exe) if os.path.isabs(exe) else exe
  if not rel.startswith('..' + os.sep):
    exe = rel if os.sep in rel else os.path.join('.', rel)
  spec = getattr(sys.modules.get('__main__'), '__spec__', None)
  module = None if spec is None else spec.name.removesuffix('.__main__')
  head = ['-m', module] if module and module != '__main__' else argv[:1]
  return shlex.join([exe] + head + argv[1:])


def program() -> str:
  """The name errors and reports begin with: the script's, without ``.py`` (a package's
  ``__main__.py``, ``python -m studies.<name>``: the package's name)."""
  path = sys.argv[0] or 'experiment'
  name = os.path.splitext(os.path.basename(path))[0]
  if name == '__main__':
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) or name
  return name


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
  print(f'{program()}: error: {message}', file=sys.stderr, flush=True)
  if exit_now:
    os._exit(2)  # pylint: disable=protected-access
  sys.exit(2)


def define_page_flags(block: str, figures: str, page: str) -> None:
  """``--page_from_results``, ``--page`` and ``--figures`` of a study whose page has one
  generated ``block`` and ``figures`` (in words, e.g. 'four figures') drawn from its
  ``--results``: rewrite them from that file alone, running nothing."""
  flags.DEFINE_bool('page_from_results', False, f'Only rewrite --page\'s {block} block and '
                    f'its {figures} in --figures from --results; nothing is run, nothing '
                    'else written.')
  flags.DEFINE_string('page', page, f'With --page_from_results: the page whose {block} '
                      'block is rewritten.')
  flags.DEFINE_string('figures', 'docs/figures', 'With --page_from_results: the folder of the '
                      'page\'s figures.')


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
  """``absl.app.run(main)`` with one-line errors and stops (module docstring); never
  returns."""
  def checked_main(argv):
    try:
      return main(argv)
    except Stopped as e:
      message = e.message or f'stopped by {e.signal_name}'
      print(f'{program()}: {message}; to resume, run the same command: {command_line()}',
            file=sys.stderr, flush=True)
      sys.exit(e.exit_code)
    except (ConfigError, StorageError, FloatingPointError) as e:
      fail(str(e))
    except OSError as e:
      if e.errno != errno.ENOSPC:
        raise
      fail(f'{e.filename or "a file"}: no space left on device ({e.strerror}); what was '
           'written before is kept (files are replaced atomically). Free some space and '
           'rerun the same command.')
  app.run(checked_main, flags_parser=lambda argv: parse_flags(argv, config_flags))
