r"""The theory figures: free energy along a run, N vs 2N clouds, kernel spread.

  python -m studies.theory --config=studies/theory/config.py --workdir=workdir/theory
  python -m studies.theory --config=studies/theory/config.py:quick --workdir=/tmp/theory
"""

import ml_collections


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """Returns the config; ``variant='quick'`` is a smoke-sized version."""
  config = ml_collections.ConfigDict()
  # Root seed of every key in the experiment.
  config.seed = 0
  # Number of independent repeats (initial draws and noise) per setting.
  config.num_seeds = 8

  config.data = ml_collections.ConfigDict()
  # Training samples n (full batch: the dynamics sees the whole set every step).
  config.data.num_train = 400
  # Samples of the fixed set on which learned kernel matrices are compared.
  config.data.num_eval = 200
  # Input and particle dimension p (5: the kNN entropy is reliable in low d).
  config.data.dim = 5
  # Label noise σ.
  config.data.noise = 0.1

  config.dynamics = ml_collections.ConfigDict()
  # Feature map of the particles.
  config.dynamics.feature_map = 'rff'
  # Repulsion weight λ and Riesz exponent s ('coulomb': s = p − 2).
  config.dynamics.lam = 0.05
  config.dynamics.s = 'coulomb'
  # Softening ε of the Riesz kernel.
  config.dynamics.softening = 0.5
  # Initial particles ω ~ N(0, σ_k⁻² I) with this bandwidth σ_k.
  config.dynamics.bandwidth = 2.0
  # Step size η, ball radius R.
  config.dynamics.step_size = 0.3
  config.dynamics.radius = 4.0
  # Full-batch steps per run, and the number of snapshots taken along it.
  config.dynamics.num_steps = 300
  config.dynamics.num_snapshots = 30

  # Figure 1: free energy along one run, for each β.
  config.free_energy_betas = [30.0, 100.0, 1000.0]
  # Figure 1: particles of that run.
  config.free_energy_particles = 256
  # Figure 2: sliced-Wasserstein distance between runs with N and 2N particles.
  config.sw_particles = [16, 32, 64, 128, 256]
  # Inverse temperature β of the N-vs-2N runs.
  config.sw_beta = 1000.0
  # Random projections of the sliced-Wasserstein estimate.
  config.sw_projections = 256
  # Figure 3: spread of the learned kernel across seeds, for each N and β.
  config.spread_particles = [16, 32, 64, 128, 256]
  config.spread_betas = [100.0, 1000.0, 10000.0]

  if variant == 'quick':
    config.num_seeds = 3
    config.data.num_train = 100
    config.data.num_eval = 50
    config.dynamics.num_steps = 20
    config.dynamics.num_snapshots = 4
    config.free_energy_betas = [100.0]
    config.free_energy_particles = 32
    config.sw_particles = [8, 16]
    config.sw_projections = 32
    config.spread_particles = [8, 16]
    config.spread_betas = [100.0, 1000.0]
  elif variant:
    raise ValueError(f"config variant: unknown {variant!r}; known: '', 'quick'.")
  return config
