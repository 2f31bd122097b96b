r"""Multi-query associative recall (MQAR): one causal LM run, or the grid.

One run (the defaults below: softmax attention, L = 64, 4 pairs, width 64):

  python -m experiments.mqar --config=configs/mqar.py --workdir=workdir/mqar/one

A method and a size: ``--config=configs/mqar.py:particles_softmax`` (any name in
``experiments.recall.methods.METHODS``) and ``--config.data.seq_len=128
--config.data.num_pairs=8``. The grid of issue 25 (resumable; start one worker per core):

  python -m experiments.mqar --config=configs/mqar.py --grid=main --workdir=workdir/mqar/main

Smoke size (a few steps, for tests): ``--config=configs/mqar.py:quick``.
Sizes were set on softmax's *training* accuracy at L = 64 (never on the evaluation batch),
2-core CPU, 2026-12-02: batch 64, lr 1e-3 with V = 256 jumped from 0.25 to 0.98 between
steps 600 and 1000; V = 512 (lr 1e-3, batch 32, or lr 3e-3, batch 64) stayed at 0.25
through 800 steps. V = 272 is the smallest vocabulary > 256 (the longest L) near 256.
"""

import ml_collections

from experiments.recall.methods import METHODS


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """The run config; ``variant``: a method name and/or ``quick``, comma-separated."""
  parts = [p for p in variant.split(',') if p]
  config = ml_collections.ConfigDict()
  # PRNG seed of the run: model init fold_in 0, training batches fold_in 1, evaluation
  # batch fold_in 2, Langevin noise fold_in 3.
  config.seed = 0
  # Attention of every block, one of METHODS (see experiments/recall/run.py for what
  # each means and how its features are counted).
  config.method = 'softmax'

  config.data = ml_collections.ConfigDict()
  # Vocabulary V (> seq_len); keys from 1..V//2−1, values from V//2..V−1, 0 reserved.
  config.data.vocab_size = 272
  # Sequence length L.
  config.data.seq_len = 64
  # Key–value pairs P per sequence (4·P ≤ L); every key is queried once.
  config.data.num_pairs = 4
  # Zoology's power-law exponent a of the query gaps (small: queries close to the context).
  config.data.power_a = 0.01
  # Sequences in the evaluation batch (drawn once, never trained on).
  config.data.num_eval = 1024

  config.model = ml_collections.ConfigDict()
  # Model width E (divisible by num_heads).
  config.model.width = 64
  # Number of pre-LayerNorm blocks.
  config.model.num_layers = 2
  # Attention heads H (head dim E/H).
  config.model.num_heads = 2
  # MLP hidden width = mlp_ratio·E (0: attention-only blocks).
  config.model.mlp_ratio = 2
  # Features N per head for the kernel methods (counted as features, not parameters:
  # favor/elu/particles use N particles, hedgehog N/2 rows giving [φ₊, φ₋]).
  config.model.num_features = 64
  # Causal path of the kernel attention: 'materialized' (L×L weights in matmuls, the
  # fastest on CPU at L ≤ 256) or 'fused' (chunked, exact at any input scale).
  config.model.causal_path = 'materialized'
  # Causal chunk of the fused path (tokens per block).
  config.model.chunk_size = 32

  config.train = ml_collections.ConfigDict()
  # Optimizer steps; every step draws a fresh batch, so num_train = steps·batch_size.
  config.train.steps = 1200
  # Sequences per step.
  config.train.batch_size = 64
  # AdamW learning rate (constant) and weight decay, for everything but Langevin particles.
  config.train.learning_rate = 1e-3
  config.train.weight_decay = 0.1
  # Steps between checkpoints (atomic; a killed run resumes from the last one).
  config.train.checkpoint_every = 100
  # Steps between progress lines.
  config.train.log_every = 100

  config.particles = ml_collections.ConfigDict()
  # particles_softmax only: projected Langevin on the softmax-mimicry Hamiltonian of each
  # layer's own queries and keys (coulomb_jax.lm.MimicrySettings), interleaved with AdamW.
  # Step size η (the drift is −η·N·∇H).
  config.particles.step_size = 1e-4
  # Inverse temperature β (noise √(2η/β)).
  config.particles.beta = 1e5
  # Ball radius R of every particle (the initial N(0, I) rows have norm ≈ √D_h).
  config.particles.radius = 8.0
  # Global-norm clip of the force before the step.
  config.particles.clip_norm = 10.0
  # Repulsion weight λ and Riesz exponent ('coulomb': s = D_h − 2) with its softening.
  config.particles.lam = 1e-3
  config.particles.riesz_s = 'coulomb'
  config.particles.softening = 0.5
  # Data term: 'cross_entropy' (Hedgehog's loss), 'kl' or 'alignment'.
  config.particles.target = 'cross_entropy'
  # Sequences of the batch the force is computed on.
  config.particles.rows = 8

  for part in parts:
    if part in METHODS:
      config.method = part
    elif part == 'quick':
      config.data.seq_len = 16
      config.data.vocab_size = 32
      config.data.num_pairs = 2
      config.data.num_eval = 16
      config.model.width = 16
      config.model.num_layers = 1
      config.model.num_features = 8
      config.model.chunk_size = 8
      config.train.steps = 4
      config.train.batch_size = 4
      config.train.checkpoint_every = 2
      config.train.log_every = 2
    else:
      raise ValueError(f'variant: unknown part {part!r}; known: {list(METHODS)} and quick.')
  return config
