"""Shared test settings: CPU only, fast compilation, a compilation cache per session."""

import os
import tempfile

# CPU unless the caller chooses (benchmarks/gpu_check.sh sets JAX_PLATFORMS=cuda,cpu).
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# Most of the suite's time is XLA compiling many small programs. Tests check values,
# not speed, so they compile with LLVM's cheap pipeline (about 40% less time on
# tests/test_models.py); benchmarks and experiments keep XLA's defaults.
# Subprocesses that set their own XLA_FLAGS add to TEST_XLA_FLAGS.
TEST_XLA_FLAGS = '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'
os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

# Many tests compile the same step functions again (e.g. each train_and_evaluate call of
# the resume test); a persistent cache for this session turns those into cache hits.
jax.config.update('jax_compilation_cache_dir', tempfile.mkdtemp(prefix='coulomb_jax_xla_'))
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)


def pytest_report_header(config):
  del config
  return f'jax {jax.__version__}, backend {jax.default_backend()}, {jax.device_count()} device(s)'
