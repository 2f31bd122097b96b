r"""The softmax-mimicry study: fidelity against N and conversion of trained softmax encoders.

  python -m studies.softmax_mimicry --runs=workdir/softmax --out=results/softmax_mimicry.json

reads the trained softmax encoders ``<runs>/<dataset>/softmax/seed<k>`` (made by
``python -m experiments.grid --variants=softmax ...``, see docs/softmax_mimicry.md),
fits every method's features to every layer and head, and measures them
(``studies/softmax_mimicry``). Every field can be overridden (``--config.fit.steps=100``).
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  # Feature counts N per head (features, not parameters: hedgehog's N/2 rows give N).
  config.num_features = (8, 16, 32, 64, 128, 256)
  # The N of the conversion (a subset of num_features).
  config.conversion_features = (16, 64, 256)

  config.data = ml_collections.ConfigDict()
  # Training rows (sentences) the features are fitted on, a fixed random subset per seed.
  config.data.fit_rows = 256
  # Validation rows the fidelity is measured on (held out of the fit and of training).
  config.data.heldout_rows = 256
  # Sentences per fitting step (every layer and head fitted at once, vmapped).
  config.data.batch_size = 16
  # Batches are padded to a multiple of this many tokens (few compiled shapes).
  config.data.pad_multiple = 16

  config.fit = ml_collections.ConfigDict()
  # Steps of every fitted method (the same for all: equal budget).
  config.fit.steps = 300
  # Radius R of the ball the particles live in (Langevin projects onto it; the 'ball'
  # control is the random draw projected onto it). For head dim d, N(0, I_d) rows have
  # norm ≈ √d (8 for the paper's d = 64): 8 binds for about half of them, 12 for none.
  # Chosen by the pilot.
  config.fit.radius = 12.0
  # Global-norm clip of ∇H before the η·N factor (the paper: 10).
  config.fit.clip_norm = 10.0
  # Langevin step size η of particles_softmax (drift −η·N·clip(∇H)). This and the other
  # step sizes and R below are defaults: the pilot chooses them per N.
  config.fit.step_size = 0.03
  # Inverse temperature β of particles_softmax and particles_labels (noise √(2η/β)).
  config.fit.beta = 1e4
  # Repulsion weight λ (the paper: 1e-3) and Riesz exponent ('coulomb' = d − 2).
  config.fit.lam = 1e-3
  config.fit.riesz_s = 'coulomb'
  # Softening ε of the Riesz kernel.
  config.fit.softening = 0.5
  # Step size η of gradient_flow (λ = 0, β = ∞: the same drift, no noise, no repulsion).
  config.fit.flow_step_size = 0.03
  # Langevin step size η of particles_labels (the label Hamiltonian of pooled keys).
  config.fit.labels_step_size = 0.03
  # Adam learning rate of hedgehog's W (trained on the same CE, Zhang et al. 2024).
  config.fit.hedgehog_learning_rate = 3e-3

  config.pilot = ml_collections.ConfigDict()
  # The pilot picks each fitted method's step size on held-out *training* rows of one
  # encoder (never the validation rows of the fidelity, never test).
  config.pilot.dataset = 'rotten_tomatoes'
  config.pilot.seed = 0
  # Training rows (disjoint from fit_rows) the pilot scores on.
  config.pilot.heldout_rows = 128
  # Candidates of each field the pilot sets (the one with the lowest held-out KL wins).
  # R is piloted with particles_softmax's step size (the other methods then use it).
  # Piloted at every N of num_features separately.
  config.pilot.radius = (8.0, 12.0)
  config.pilot.step_size = (0.03, 0.1, 0.3)
  config.pilot.flow_step_size = (0.03, 0.1, 0.3)
  config.pilot.labels_step_size = (0.01, 0.1)
  config.pilot.hedgehog_learning_rate = (3e-3, 1e-2, 3e-2)

  config.conversion = ml_collections.ConfigDict()
  # Fine-tuning after conversion: one epoch of this many training rows (a fixed random
  # subset per seed: all of Rotten Tomatoes' 8,530, as many of SST-2's; 133 steps),
  # features frozen, the rest by AdamW. About 1 min per model on this CPU (22 per encoder).
  config.conversion.finetune_rows = 8530
  # Fine-tuning batches are padded to a multiple of this many tokens (64: fewer compiles).
  config.conversion.pad_multiple = 16
  # Batch size and constant learning rate of that epoch (AdamW, global-norm clip 1).
  config.conversion.batch_size = 64
  config.conversion.learning_rate = 1e-4
  # Test rows evaluated (0 = all).
  config.conversion.test_rows = 0
  return config
