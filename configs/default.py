r"""Default config of the main job: a short Langevin run on a synthetic problem.

Launch (from the repository root):

  python -m experiments.main --config=configs/default.py --workdir=/tmp/cj
  python -m experiments.main --config=configs/default.py:quick --workdir=/tmp/cj
  python -m experiments.main --config=configs/default.py \
      --config.hamiltonian.lam=0.0 --workdir=/tmp/cj_nolam
"""

import ml_collections


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """Returns the config; ``variant='quick'`` shrinks it to a smoke run."""
  config = ml_collections.ConfigDict()
  # Seed of the single root key; every other key is split or fold_in-ed from it.
  config.seed = 0

  config.data = ml_collections.ConfigDict()
  # Training samples n (the particles learn on these).
  config.data.num_train = 400
  # Held-out samples for the test accuracy and alignment.
  config.data.num_test = 2000
  # Input dimension p (>= 3: the target uses x_1, x_2, x_3).
  config.data.dim = 5
  # Label noise σ in y = sign(f(x) + σ·ε).
  config.data.noise = 0.1

  config.features = ml_collections.ConfigDict()
  # Feature map name from coulomb_jax.features.FEATURE_MAPS.
  config.features.name = 'rff'
  # Number of particles N.
  config.features.num_particles = 128
  # Initial particles ω ~ N(0, init_scale² I): RFF bandwidth 1/init_scale.
  config.features.init_scale = 0.5

  config.hamiltonian = ml_collections.ConfigDict()
  # Repulsion weight λ (0: no repulsion).
  config.hamiltonian.lam = 0.5
  # Riesz exponent s >= 0, or 'coulomb' for s = d - 2.
  config.hamiltonian.s = 'coulomb'
  # Softening ε of the Riesz kernel.
  config.hamiltonian.softening = 0.5

  config.langevin = ml_collections.ConfigDict()
  # Step size η (drift η·N·∇H per step).
  config.langevin.step_size = 0.05
  # Inverse temperature β (noise √(2η/β)); float('inf') for no noise.
  config.langevin.beta = 1000.0
  # Radius R of the ball every particle is projected onto.
  config.langevin.radius = 3.0
  # Global-norm clip of ∇H before the step (None: no clipping).
  config.langevin.clip_norm = ml_collections.config_dict.placeholder(float)
  # Minibatch size.
  config.langevin.batch_size = 100
  # Passes over the training data.
  config.langevin.num_epochs = 60
  # Early stop when the largest particle move is below tol (0: never).
  config.langevin.tol = 0.0
  # Print H, alignment and repulsion every this many epochs.
  config.langevin.log_every = 5

  config.eval = ml_collections.ConfigDict()
  # Ridge penalty of the linear classifier fitted on the features.
  config.eval.ridge = 1e-3

  if variant == 'quick':
    config.data.num_test = 500
    config.features.num_particles = 32
    config.langevin.num_epochs = 10
    config.langevin.log_every = 2
  elif variant:
    raise ValueError(f"config variant: unknown {variant!r}; known: '', 'quick'.")
  return config
