"""Shared test settings: CPU only, fast compilation, a compilation cache per session."""

import os
import tempfile

# CPU unless the caller chooses (benchmarks/gpu_check.sh sets JAX_PLATFORMS=cuda,cpu).
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# Most of the suite's time is XLA compiling many small programs. Tests check values,
# not speed, so they compile with LLVM's cheap pipeline (about 40% less time on
# tests/library/test_models.py); benchmarks and experiments keep XLA's defaults.
# Subprocesses that set their own XLA_FLAGS add to TEST_XLA_FLAGS.
TEST_XLA_FLAGS = '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'
os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()


def _cache_dir() -> str:
  """This session's compilation cache folder: one per test run, shared by the xdist workers
  of that run (same ``PYTEST_XDIST_TESTRUNUID``), new otherwise."""
  run = os.environ.get('PYTEST_XDIST_TESTRUNUID')
  if not run:
    return tempfile.mkdtemp(prefix='coulomb_jax_xla_')
  path = os.path.join(tempfile.gettempdir(), f'coulomb_jax_xla_{run}')
  os.makedirs(path, exist_ok=True)
  return path


# Many tests compile the same programs again: each train_and_evaluate call of the resume
# tests, the runs that CLI tests launch as subprocesses, the notebooks' kernels, the
# other xdist worker. A persistent cache for this session turns those into cache hits.
# Through the environment (read when jax is imported) it reaches every subprocess too.
# Every compile is cached (threshold 0): a model's eager initialisation is ~100 small
# compiles, each paid again by every process that initialises the same model.
os.environ['JAX_COMPILATION_CACHE_DIR'] = _cache_dir()
os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)


def pytest_report_header(config):
  del config
  return f'jax {jax.__version__}, backend {jax.default_backend()}, {jax.device_count()} device(s)'
