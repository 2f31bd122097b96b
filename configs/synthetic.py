r"""The synthetic study (the paper's first experiment).

Full study (all noise levels, budgets, λ values and seeds):

  python -m experiments.synthetic --config=configs/synthetic.py --workdir=workdir/synthetic

Smoke run (the README's first command; 30 s on the 2-core CPU at 04a5d92, see README):

  python -m experiments.synthetic --config=configs/synthetic.py:quick --workdir=workdir/quick

Hyper-parameters that are not the paper's were set on the validation split only.
"""

import ml_collections

from configs import common
from coulomb_jax.tasks import synthetic


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """Returns the study config; ``variant='quick'`` is a smoke-sized version."""
  config = ml_collections.ConfigDict()
  # Root seed; seed s of the study uses fold_in(key(seed), s).
  config.seed = 0
  # Number of repeats (independent data sets and feature draws).
  config.num_seeds = 5
  # Methods to run, from: logreg, rbf_svm, mkl, rff, importance, coulomb.
  config.methods = ['logreg', 'rbf_svm', 'mkl', 'rff', 'importance', 'coulomb']

  config.data = ml_collections.ConfigDict()
  # Training samples n (the paper: 400).
  config.data.num_train = 400
  # Validation samples: every hyper-parameter is chosen on these.
  config.data.num_val = 400
  # Test samples: only ever used for the reported numbers.
  config.data.num_test = 2000
  # Input dimension p (≥ 5; coordinates beyond x_5 carry no signal).
  config.data.dim = 10
  # Label-noise levels σ (the paper: logspace(−5, 5, 10)).
  config.data.noise_levels = list(synthetic.NOISE_LEVELS)

  config.features = ml_collections.ConfigDict()
  # Feature budgets N (number of particles / random features).
  config.features.budgets = [16, 32, 64, 128, 256]
  # Gaussian-kernel bandwidths σ_k tried for fixed RFF (ω ~ N(0, σ_k⁻² I)); the one
  # with the best validation accuracy also initialises IS and the particles.
  config.features.bandwidths = [1.0, 2.0, 4.0, 8.0]

  config.classifier = ml_collections.ConfigDict()
  # Inverse L2 strengths C of the logistic regression on features, chosen on validation.
  config.classifier.c_grid = [0.1, 1.0, 10.0, 100.0, 1000.0]
  # L-BFGS iteration cap of scikit-learn's LogisticRegression.
  config.classifier.max_iter = 1000

  config.rbf_svm = ml_collections.ConfigDict()
  # RBF-SVM kernel width γ in exp(−γ‖x − x'‖²) (the paper: 0.5).
  config.rbf_svm.gamma = 0.5
  # Its C grid, chosen on validation.
  config.rbf_svm.c_grid = [0.1, 1.0, 10.0]

  config.mkl = ml_collections.ConfigDict()
  # Bandwidths of the Gaussian kernels combined by alignment-weighted MKL.
  config.mkl.bandwidths = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
  # SVM C grid on the combined kernel, chosen on validation.
  config.mkl.c_grid = [0.1, 1.0, 10.0]

  config.importance = ml_collections.ConfigDict()
  # Candidates Nw = factor · N (Sinha & Duchi draw many more candidates than N).
  config.importance.candidates_factor = 10
  # χ²-ball size ρ = rho_factor · Nw (their default 0.005 · Nw).
  config.importance.rho_factor = 0.005

  config.hamiltonian = ml_collections.ConfigDict()
  # Repulsion weights λ of the ablation: the paper's grid {0, 0.2, 0.5, 0.8, 1, 1.5}
  # (0.5 is the proposed method, 0 no repulsion) plus 0.01 and 0.05, because in
  # this normalisation W is O(0.1–1) while A is O(0.01–0.1), so λ ≥ 0.2 lets the
  # repulsion dominate (seen in the validation pilot, studies/synthetic_pilot).
  config.hamiltonian.lams = [0.0, 0.01, 0.05, 0.2, 0.5, 0.8, 1.0, 1.5]
  # Riesz exponent: 'coulomb' is s = p − 2.
  config.hamiltonian.s = 'coulomb'
  # Softening ε of the Riesz kernel.
  config.hamiltonian.softening = 0.5

  config.langevin = ml_collections.ConfigDict()
  # Step size η and inverse temperature β: picked from an earlier run on other seeds;
  # studies/synthetic_pilot checks them on validation data of seeds the study never uses
  # (η ∈ {0.03, 0.3, 3} × β ∈ {1e4, 1e6}: they tie for the best gain averaged over λ;
  # docs/synthetic.md has its output). No clipping. Fields in configs/common.py.
  common.add_langevin(config.langevin, step_size=0.3, beta=1e4,
                      clip_norm=ml_collections.config_dict.placeholder(float))
  # Ball radius R as a multiple of the initial particle norm √p / σ_k.
  config.langevin.radius_scale = 2.0
  # Minibatch size.
  config.langevin.batch_size = 100
  # Epochs over the training set (4 steps each at n = 400, b = 100).
  config.langevin.num_epochs = 50
  # Early stop when the largest particle move is below tol (0: off).
  config.langevin.tol = 0.0

  config.report = ml_collections.ConfigDict()
  # Noise level (index into noise_levels) of the budget and λ figures.
  config.report.noise_index = 4
  # Budget of the λ-ablation figure.
  config.report.ablation_budget = 64
  # Smoke-sized study: every figure says 'quick variant: smoke run, <n> seeds — not results'.
  config.report.smoke_run = False

  if variant == 'quick':
    config.num_seeds = 2
    config.data.num_test = 500
    config.data.noise_levels = [config.data.noise_levels[i] for i in (0, 4, 9)]
    config.features.budgets = [16, 64]
    config.report.ablation_budget = 16
    config.features.bandwidths = [2.0, 4.0]
    config.classifier.c_grid = [1.0, 100.0]
    config.rbf_svm.c_grid = [1.0]
    config.mkl.c_grid = [1.0]
    config.hamiltonian.lams = [0.0, 0.5]
    config.langevin.num_epochs = 10
    config.report.noise_index = 1
    config.report.smoke_run = True
  elif variant:
    raise ValueError(f"config variant: unknown {variant!r}; known: '', 'quick'.")
  return config
