"""Shared test settings: float32 everywhere, CPU only."""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
