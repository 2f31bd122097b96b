"""Tests of experiments.common.progress (a fake clock: no timed assertions)."""

import io

import pytest

from experiments.common import progress


class FakeClock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


@pytest.mark.parametrize('seconds, text', [(0, '00:00'), (41.4, '00:41'), (72, '01:12'),
                                           (3599.6, '1:00:00'), (3 * 3600 + 61, '3:01:01'),
                                           (float('inf'), '--:--'), (float('nan'), '--:--'),
                                           (-1, '--:--')])
def test_format_duration(seconds, text):
  assert progress.format_duration(seconds) == text


def test_format_rate_switches_to_seconds_per_unit_when_slow():
  assert progress.format_rate(0.8) == '0.8 runs/s'
  assert progress.format_rate(2.345, 'step') == '2.3 steps/s'
  assert progress.format_rate(25.0, 'batch', 'batches') == '25 batches/s'
  assert progress.format_rate(1 / 40, 'cell') == '40 s/cell'
  assert progress.format_rate(0.0) == '– runs/s'


def test_line_elapsed_rate_and_eta():
  clock, out = FakeClock(), io.StringIO()
  p = progress.Progress('synthetic', total=9, unit='run', stream=out, clock=clock)
  assert p.eta == float('inf')
  assert p.line('starting') == ('[synthetic] starting — 0/9 runs, 00:00 elapsed, – runs/s, '
                                'ETA --:--')
  clock.now += 5.0
  p.update('noise 1/3 method rff seed 1/3', n=4)   # 4 runs in 5 s: 0.8/s, 5 left: 6.25 s
  assert p.rate == pytest.approx(0.8) and p.eta == pytest.approx(6.25)
  assert out.getvalue() == ('[synthetic] noise 1/3 method rff seed 1/3 — 4/9 runs, 00:05 '
                            'elapsed, 0.8 runs/s, ETA 00:06\n')
  p.say('compiling the Langevin run (N = 16) …')
  assert out.getvalue().endswith('[synthetic] compiling the Langevin run (N = 16) …\n')
  clock.now += 60.0
  p.update(n=5)
  assert p.eta == 0.0 and p.line().endswith('9/9 runs, 01:05 elapsed, 0.14 runs/s, ETA 00:00')


def test_resumed_work_counts_towards_total_not_rate():
  clock = FakeClock()
  p = progress.Progress('grid', total=10, done=6, stream=io.StringIO(), clock=clock)
  clock.now += 30.0
  assert p.rate == 0.0                     # the 6 were done by an earlier process
  p.update()
  # 1 unit in 30 s; 3 left: 90 s.
  assert p.rate == pytest.approx(1 / 30) and p.eta == pytest.approx(90.0)
  assert '7/10 runs' in p.line() and '30 s/run' in p.line() and 'ETA 01:30' in p.line()


def test_every_throttles_update_lines_but_not_the_last_or_say():
  clock, out = FakeClock(), io.StringIO()
  p = progress.Progress('theory', total=4, unit='step', every=10.0, stream=out, clock=clock)
  for _ in range(3):
    clock.now += 3.0
    p.update('step')                       # printed at 3 s; 6 s and 9 s are within 10 s
  p.say('compiling …')
  clock.now += 3.0
  p.update('last')                         # the last unit: always printed
  assert out.getvalue().splitlines() == [
      '[theory] step — 1/4 steps, 00:03 elapsed, 0.33 steps/s, ETA 00:09',
      '[theory] compiling …',
      '[theory] last — 4/4 steps, 00:12 elapsed, 0.33 steps/s, ETA 00:00']


def test_bad_counts():
  with pytest.raises(ValueError, match='total and done must be >= 0'):
    progress.Progress('x', total=-1)
