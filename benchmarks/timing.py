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
