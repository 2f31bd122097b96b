"""Wall-clock timing shared by the benchmarks."""

import statistics
import time

import jax


def median_seconds(fn, *args, repeats):
  """Median wall time of ``fn(*args)`` over ``repeats`` calls, after one untimed
  call (compilation and warm-up); every call ends with ``block_until_ready``."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def paired_ratio(fn, args_a, args_b, *, pairs):
  """Time of ``fn(*args_b)`` ÷ time of ``fn(*args_a)``, measured in interleaved pairs.

  After one untimed call of each, ``pairs`` times: call a, call b (the order
  alternating from pair to pair so neither side always runs second), each ended
  by ``block_until_ready``. Slow drifts of a shared machine hit both sides of a
  pair alike, so the per-pair ratios are much tighter than a ratio of two
  separate medians. Returns ``{'median', 'q25', 'q75', 'pairs'}`` of the ratios.
  """
  def once(args):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start

  jax.block_until_ready(fn(*args_a))
  jax.block_until_ready(fn(*args_b))
  ratios = []
  for i in range(pairs):
    if i % 2:
      tb, ta = once(args_b), once(args_a)
    else:
      ta, tb = once(args_a), once(args_b)
    ratios.append(tb / ta)
  q25, q50, q75 = statistics.quantiles(ratios, n=4) if pairs > 1 else (ratios[0],) * 3
  return {'median': q50, 'q25': q25, 'q75': q75, 'pairs': pairs}
