"""Shared test settings: float32 everywhere, CPU only, a compilation cache per session."""

import os
import tempfile

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

# Many tests compile the same step functions again (e.g. each train_and_evaluate call of
# the resume test); a persistent cache for this session turns those into cache hits.
jax.config.update('jax_compilation_cache_dir', tempfile.mkdtemp(prefix='coulomb_jax_xla_'))
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
