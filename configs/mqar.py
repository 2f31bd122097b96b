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

from configs import common

# The recall methods (experiments/recall/methods.py METHODS; a config imports no
# experiment code, so run.check_config validates the name).
VARIANT_PARTS = ('quick', 'zoology')


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """The run config; ``variant``: a method name, ``zoology`` and/or ``quick``, comma-separated.

  ``zoology``: issue 36's protocol, Zoology's data and optimiser scaled to this CPU
  (vocabulary 8,192, a fixed set of 100k training sequences in shuffled epochs, cosine
  schedule, early stop at 0.99 validation accuracy, the particles' λ and β set relative
  to the measured forces).
  """
  parts = common.variant_parts(variant)
  config = ml_collections.ConfigDict()
  # PRNG seed of the run: model init fold_in 0, training batches fold_in 1, evaluation
  # batch fold_in 2, Langevin noise fold_in 3.
  config.seed = 0
  # Attention of every block, one of experiments.recall.methods.METHODS (what each means
  # and how its features and state are counted is in that module).
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
  # Sequences in the test batch (drawn once from its own key, never trained on).
  config.data.num_eval = 1024
  # Training set: 0 draws a fresh batch every step (num_train = steps·batch); N > 0 draws
  # N sequences once and iterates them in shuffled epochs (Zoology: 100,000).
  config.data.train_examples = 0
  # Sequences in the validation batch (its own key): early stopping and, in a grid, the
  # choice of the learning rate; never the test batch.
  config.data.num_valid = 1024

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
  # AdamW learning rate and weight decay, for everything but Langevin particles (maps
  # trained by the task, e.g. hedgehog's W, included, as Zoology's AdamW does).
  config.train.learning_rate = 1e-3
  config.train.weight_decay = 0.1
  # 'constant' or 'cosine' (from learning_rate to 0 over train.steps: Zoology's schedule).
  config.train.schedule = 'constant'
  # Stop once the validation accuracy reaches this (0: never; Zoology: 0.99), checked
  # every eval_every steps.
  config.train.early_stop = 0.0
  config.train.eval_every = 500
  # Steps between checkpoints (atomic; a killed run resumes from the last one).
  config.train.checkpoint_every = 100
  # Steps between progress lines.
  config.train.log_every = 100

  config.particles = ml_collections.ConfigDict()
  # particles_softmax only: projected Langevin on the softmax-mimicry Hamiltonian of each
  # layer's own queries and keys (coulomb_jax.training.lm.MimicrySettings), interleaved with AdamW.
  # The Langevin step and the repulsion (fields and comments in configs/common.py); the
  # initial N(0, I) rows have norm ≈ √D_h, inside the radius.
  common.add_langevin(config.particles, step_size=1e-4, beta=1e5, clip_norm=10.0, radius=8.0)
  common.add_repulsion(config.particles, lam=1e-3, riesz_s='coulomb', softening=0.5,
                       relative_lam=0.0)
  # drift_to_noise > 0 replaces beta: β set at step 0 so that the median particle's drift
  # η·N·‖clip(∇H)‖ is drift_to_noise × the RMS noise norm √(2η/β)·√D_h.
  config.particles.drift_to_noise = 0.0
  # The Langevin step over the run: 'constant' (η every step, the paper's dynamics) or
  # 'cosine' (η·½(1 + cos(πt/T)) over train.steps: drift and noise annealed to 0 with the
  # rest's cosine rate, so the particles settle while the rest can still follow).
  config.particles.schedule = 'constant'
  # Data term: 'cross_entropy' (Hedgehog's loss), 'kl' or 'alignment'.
  config.particles.target = 'cross_entropy'
  # Sequences of the batch the force is computed on.
  config.particles.rows = 8

  # The protocol first, the smoke sizes last, whatever the order written.
  for part in sorted(parts, key=lambda p: {'zoology': 0, 'quick': 2}.get(p, 1)):
    if part == 'zoology':
      config.data.vocab_size = 8192
      config.data.train_examples = 100_000
      config.train.schedule = 'cosine'
      config.train.early_stop = 0.99
      config.train.steps = 3000
      config.train.eval_every = 250
      config.particles.step_size = 3e-3
      config.particles.relative_lam = 0.1
      config.particles.drift_to_noise = 1.0
    elif part == 'quick':
      config.data.seq_len = 16
      config.data.vocab_size = 32
      config.data.num_pairs = 2
      config.data.num_eval = 16
      config.data.num_valid = 16
      config.data.train_examples = min(config.data.train_examples, 64)
      config.model.width = 16
      config.model.num_layers = 1
      config.model.num_features = 8
      config.model.chunk_size = 8
      config.train.steps = 4
      config.train.batch_size = 4
      config.train.checkpoint_every = 2
      config.train.log_every = 2
      config.train.eval_every = 2
    elif part.isidentifier():
      config.method = part            # checked by experiments.recall.run.check_config
    else:
      raise ValueError(f'variant: unknown part {part!r}; a method name or {VARIANT_PARTS}.')
  return config
