"""Progress lines for long runs: what is being done, elapsed time, rate and ETA.

  progress = Progress('synthetic', total=30, unit='run')
  progress.say('compiling the Langevin run (N = 16) …')
  ...
  progress.update('noise 2/3 method rff seed 3/5')
  # [synthetic] noise 2/3 method rff seed 3/5 — 1/30 runs, 00:41 elapsed, 0.8 runs/s, ETA 01:12

The rate counts the units done since the ``Progress`` was made (``done`` given
at construction, e.g. the cells a resumed run finds finished, count towards the
total but not towards the rate), so the ETA of a resumed run is not fooled by
the work it skipped. Lines go to ``stream`` (standard output by default),
flushed, so a log file shows them as they happen.
"""

import sys
import time
from typing import Callable, Optional, TextIO


def format_duration(seconds: float) -> str:
  """``mm:ss`` below an hour, ``h:mm:ss`` above; ``--:--`` for an unknown time."""
  if seconds is None or not seconds >= 0 or seconds == float('inf'):
    return '--:--'
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, secs = divmod(rest, 60)
  return f'{hours}:{minutes:02d}:{secs:02d}' if hours else f'{minutes:02d}:{secs:02d}'


def format_rate(rate: float, unit: str = 'run', units: Optional[str] = None) -> str:
  """``0.8 runs/s`` at 0.1 per second or more, ``12 s/run`` below (slow units read better)."""
  units = units or unit + 's'
  if not rate > 0:
    return f'– {units}/s'
  if rate >= 0.1:
    return f'{rate:.2g} {units}/s' if rate < 10 else f'{rate:.0f} {units}/s'
  return f'{1 / rate:.0f} s/{unit}'


class Progress:
  """Prints ``[tag] what — done/total units, elapsed, rate, ETA`` lines.

  Args:
    tag: the run's name, printed in brackets at the start of every line.
    total: units of work in the whole run (≥ 0).
    unit: the singular name of a unit (``'run'``, ``'step'``); ``units`` the plural
      (default ``unit + 's'``).
    done: units already done before this process started (a resumed run).
    every: least seconds between two printed ``update`` lines (0: print all); the
      last unit's line is always printed. ``say`` always prints.
    stream: where lines go; ``None``: ``sys.stdout`` at the time of printing.
    clock: seconds, monotonic (tests pass a fake one).
  """

  def __init__(self, tag: str, total: int, unit: str = 'run', *, units: Optional[str] = None,
               done: int = 0, every: float = 0.0, stream: Optional[TextIO] = None,
               clock: Callable[[], float] = time.perf_counter):
    if total < 0 or done < 0:
      raise ValueError(f'total and done must be >= 0, got total={total}, done={done}.')
    self.tag, self.total, self.unit = tag, total, unit
    self.units = units or unit + 's'
    self.done = self._done_at_start = done
    self.every, self._stream, self._clock = every, stream, clock
    self._start = clock()
    self._last_printed = None

  @property
  def elapsed(self) -> float:
    """Seconds since the ``Progress`` was made."""
    return self._clock() - self._start

  @property
  def rate(self) -> float:
    """Units per second done by this process (0 before the first)."""
    elapsed = self.elapsed
    new = self.done - self._done_at_start
    return new / elapsed if new > 0 and elapsed > 0 else 0.0

  @property
  def eta(self) -> float:
    """Seconds left at the current rate (``inf`` while unknown, 0 when done)."""
    left = max(self.total - self.done, 0)
    if left == 0:
      return 0.0
    rate = self.rate
    return left / rate if rate > 0 else float('inf')

  def line(self, what: str = '') -> str:
    """The progress line for the current state, without printing it."""
    stats = (f'{self.done}/{self.total} {self.units}, {format_duration(self.elapsed)} elapsed, '
             f'{format_rate(self.rate, self.unit, self.units)}, ETA {format_duration(self.eta)}')
    return f'[{self.tag}] {what} — {stats}' if what else f'[{self.tag}] {stats}'

  def update(self, what: str = '', n: int = 1) -> str:
    """Counts ``n`` more units done; returns the line and prints it (see ``every``)."""
    self.done += n
    text = self.line(what)
    now = self._clock()
    if (self._last_printed is None or now - self._last_printed >= self.every
        or self.done >= self.total):
      self._last_printed = now
      self._print(text)
    return text

  def say(self, message: str) -> str:
    """Prints and returns ``[tag] message`` (e.g. ``'compiling … '``): what the run does now."""
    return self._print(f'[{self.tag}] {message}')

  def _print(self, text: str) -> str:
    print(text, file=self._stream or sys.stdout, flush=True)
    return text
