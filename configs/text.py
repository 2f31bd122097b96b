r"""Shared config of the text-classification runs (SST-2, Rotten Tomatoes, QQP).

Not a launch config itself: ``configs/{sst2,rotten_tomatoes,qqp}.py`` call
``get_text_config(task, variant)``. A variant string is a comma-separated list:
one model variant (``kernel-<map>``, ``vanilla-<map>``, ``softmax``, ``performer``,
``linformer``, and the control ``ball-<map>``; default ``kernel-favor``) and optional
modifiers (``learn``: Phase A in the regime where the particles learn, see
docs/phase_a_learning.md; ``quick``: a tiny smoke-sized run). Example:

  python -m experiments.train --config=configs/sst2.py:kernel-porf_softplus --workdir=workdir/sst2/kernel-porf_softplus/seed0

Every field can be overridden on the command line (``--config.seed=1``).
"""

import ml_collections

from configs import common

# The seven attention feature maps of the paper, in its order (names of the library's
# registry, coulomb_jax.features.names(positive=True)): this study's choice, not a library
# list. Each is a Vanilla-X and a Kernel-X variant.
MAPS = ('favor', 'elu', 'softplus', 'sigmoid2', 'cos2', 'softmaxfeat', 'porf_softplus')
BASELINES = ('softmax', 'performer', 'linformer')
# Controls: 'ball-<map>' = Vanilla-X with its random particles projected onto the ball of
# radius phase_a.radius and no Phase A: separates the projection from the dynamics.
CONTROLS = tuple(f'ball-{m}' for m in MAPS)
VARIANTS = (tuple(f'{kind}-{m}' for kind in ('vanilla', 'kernel') for m in MAPS) + BASELINES
            + CONTROLS)
MODIFIERS = ('quick', 'learn')
# The fields a variant sets (below), besides model.init_radius (> 0 for ball-X only).
VARIANT_FIELDS = ('model.attention', 'model.feature_map', 'model.qk_mode', 'model.orthogonal',
                  'phase_a.enabled')


def parse_variant(variant: str):
  """``'kernel-favor,quick'`` → ``('kernel-favor', {'quick'})``; ValueError if unknown."""
  parts = common.variant_parts(variant)
  names = [p for p in parts if p not in MODIFIERS]
  if len(names) > 1 or (names and names[0] not in VARIANTS):
    raise ValueError(f'variant: expected one of {VARIANTS} plus modifiers {MODIFIERS}, '
                     f'got {variant!r}.')
  return (names[0] if names else 'kernel-favor'), {p for p in parts if p in MODIFIERS}


def _data(task: str) -> ml_collections.ConfigDict:
  """The data section: which task, where its copy is, how it is cut and padded."""
  c = ml_collections.ConfigDict()
  # Task name from coulomb_jax.tasks.data.TASKS.
  c.task = task
  # Folder with the offline copies (glue/, rotten_tomatoes/); '' = $COULOMB_JAX_DATA, else
  # ../shared/data next to the repository (experiments.run.train_config.data_dir; layout in
  # coulomb_jax/tasks/data/__init__.py). A relative path is read from the current folder.
  c.data_dir = ''
  # Rows held out of train for validation where the task has no labelled validation split.
  c.validation_size = 1000
  # How validation is held out of train (sst2 only has a choice): 'rows' = random rows of
  # the phrase-level train.tsv, most of them phrases of training sentences (a leaky
  # selector); 'sentences' = whole sentences, their own phrases dropped from train, so
  # validation is as unseen as dev (coulomb_jax.tasks.data.sentence_split). 'rows' is the
  # default only so that the earlier grids stay comparable and resumable.
  c.validation_rule = 'rows'
  # Token budget per sequence, [CLS] and [SEP] included (the paper: 128).
  c.max_length = 128
  # Uncased WordPiece vocabulary size, trained on the training split (no network here,
  # so not bert-base-uncased's vocabulary; set vocab_file to use one).
  c.vocab_size = 16384
  # Optional BERT vocab.txt; '' trains a WordPiece tokenizer on the training split.
  c.vocab_file = ''
  # Batches are padded to the longest row rounded up to this multiple (dynamic padding).
  c.pad_multiple = 16
  # Batches per length-bucketing chunk when shuffling training data.
  c.bucket_size = 64
  # Use only a fixed random N training rows (0 = all); for smoke runs and tests.
  c.max_train_examples = 0
  # Evaluate on only a fixed random N validation and test rows (0 = all); for smoke runs
  # and tests.
  c.max_eval_examples = 0
  return c


def _model() -> ml_collections.ConfigDict:
  """The model section: attention, feature map, particles and the encoder sizes."""
  c = ml_collections.ConfigDict()
  # 'kernel' (Vanilla-X, Kernel-X, Performer), 'softmax' or 'linformer'.
  c.attention = 'kernel'
  # Feature map of kernel attention (a positive map of coulomb_jax.features: MAPS above, or
  # any name registered with features.register(..., log_psi=...)).
  c.feature_map = 'favor'
  # Features (particles) per head M (the paper: 256).
  c.num_features = 256
  # 'shared': the paper's Q = K = per-head reshape of x (no W_q, W_k); 'projected': x W_q, x W_k.
  c.qk_mode = 'shared'
  # Draw initial particles in orthogonal blocks (Performer) instead of i.i.d. N(0, I).
  c.orthogonal = False
  # Model width d_model (the paper: 128).
  c.width = 128
  # Encoder blocks (the paper: 2).
  c.num_layers = 2
  # Attention heads (the paper: 2).
  c.num_heads = 2
  # Hidden width of the feed-forward block (the paper: 256).
  c.ffn_dim = 256
  # Dropout on embeddings and residual branches (the paper: 0.1).
  c.dropout_rate = 0.1
  # Linformer's projected length P (Linformer only).
  c.linformer_length = 64
  # Project the initial particles onto the ball of this radius (0 = no; the ball-X controls).
  c.init_radius = 0.0
  # Kernel attention in chunks of this many tokens without storing the [B, L, H, M]
  # features (attention.fused_linear_attention); 0 = the materialised path.
  c.chunk_size = 0
  return c


def _phase_a() -> ml_collections.ConfigDict:
  """The Phase A section (the particles), the paper's settings."""
  c = ml_collections.ConfigDict()
  # Learn the particles before Phase B (Kernel-X); False keeps them at their random draw.
  c.enabled = True
  # What the particles learn (coulomb_jax.training.PHASE_A_TARGETS). 'labels' (the paper):
  # −(kernel-target alignment of each head's pooled keys with the ±1 labels) + λ·repulsion.
  # 'softmax': each head's softmax-mimicry Hamiltonian, the cross-entropy between softmax
  # attention and the particles' linear attention on the head's own queries and keys of
  # the Phase A batch's real tokens (coulomb_jax.mimicry, Hedgehog's loss) + λ·repulsion;
  # labels unused, held-out attention KL instead of ρ, no shuffled-label null. It costs
  # [B, L, L, M] per head and step, and one encoder forward per step in every schedule.
  c.target = 'labels'
  # The paper's Langevin step (η 2e-3, β 50, clip 10, ball radius 1.5) and repulsion
  # (λ 1e-3, Coulomb s = D_h − 2); fields and comments in configs/common.py.
  common.add_langevin(c, step_size=2e-3, beta=50.0, clip_norm=10.0, radius=1.5)
  common.add_repulsion(c, lam=1e-3, riesz_s='coulomb', softening=0.5,
                       relative_lam=0.0)
  # Batch size (the paper: 64).
  c.batch_size = 64
  # Epochs at most (the paper: 10).
  c.num_epochs = 10
  # When Phase A runs (coulomb_jax.training.phase_schedule). 'joint' (the paper): before
  # Phase B, every step moves all layers' particles and runs the encoder forward for
  # their pooled keys. 'layerwise': before Phase B, the same objective one layer at a
  # time, num_epochs per layer, on pooled keys computed once per layer with the layers
  # below already learned (no forward pass per step; docs/performance.md). 'after_b':
  # after_b_epochs of Phase B, then Phase A layer by layer on the trained encoder, then
  # the remaining Phase B epochs. 'alternating': a layer-wise Phase A pass after every
  # block of after_b_epochs Phase B epochs. Vanilla-X and Ball-X follow the same
  # schedule (Ball-X projects where Phase A would run); in every schedule the kept
  # epoch is the best validation epoch after the first Phase A stage.
  c.schedule = 'joint'
  # 'after_b' / 'alternating': Phase B epochs before Phase A (alternating: per block).
  c.after_b_epochs = 1
  # Step size rule: 0 = step_size as given; r > 0 = each stage's η is set so that the
  # median particle's drift η·N·‖clip(∇H)_k‖ is r·radius per step at the stage start
  # (coulomb_jax.langevin_diagnostics.relative_step_size).
  c.relative_step = 0.0
  # Temperature rule: 0 = beta as given; t > 0 = each stage's β = t / ΔU, ΔU the median
  # over heads of the range of the one-particle potential over the ball, so that the
  # Gibbs tilt β·ΔU is t (tilt_beta).
  c.gibbs_tilt = 0.0
  # Training rows the rules and the potential range are measured on (fixed per seed).
  c.calibration_rows = 512
  # Validation rows of the held-out alignment diagnostics (n×n kernels: keep ≤ ~2000).
  c.heldout_rows = 1000
  # Also run each Phase A stage on shuffled training labels (the null of the held-out
  # alignment; costs one more Phase A stage, not counted in phase_a_seconds).
  c.null_run = True
  # Stop when the largest particle move of a step is below this (the paper: 1e-6). The move
  # includes the Langevin noise, about sqrt(2η/β)·sqrt(D_h) ≈ 0.07 at the paper's settings,
  # so at β = 50 this never fires and Phase A runs num_epochs.
  c.tolerance = 1e-6
  return c


def _phase_b() -> ml_collections.ConfigDict:
  """The Phase B section (everything but the particles), the paper's settings."""
  c = ml_collections.ConfigDict()
  # Peak AdamW learning rate (the paper: 2e-4).
  c.learning_rate = 2e-4
  # AdamW decoupled weight decay (not given by the paper; optax's default).
  c.weight_decay = 1e-4
  # Global-norm gradient clip (not given by the paper).
  c.clip_norm = 1.0
  # Linear warm-up as a fraction of all Phase B steps, then cosine decay to 0.
  c.warmup_fraction = 0.1
  # Batch size (the paper: 64).
  c.batch_size = 64
  # Epochs (the paper: 10); the epoch with the best validation accuracy is kept.
  c.num_epochs = 10
  return c


def _run() -> ml_collections.ConfigDict:
  """The run section: evaluation, logging, checkpoints, a shared prefix."""
  c = ml_collections.ConfigDict()
  # Evaluation batch size (validation and test).
  c.eval_batch_size = 256
  # Log a progress line (and TensorBoard scalars) every this many steps.
  c.log_every = 50
  # Save a checkpoint every this many steps (and at every epoch end); 0 = epoch ends only.
  c.checkpoint_every = 200
  # '' or the folder of a run with the same config up to Phase A's fields (variant,
  # phase_a.*, model.init_radius): start from its state at the end of the Phase B
  # epochs before the first Phase A stage ('after_b' / 'alternating'), which is the same
  # bit for bit, instead of training them again. Trains them itself if that run has
  # not reached that point yet.
  c.prefix_from = ''
  return c


def get_text_config(task: str, variant: str = '') -> ml_collections.ConfigDict:
  """The paper's settings for ``task`` and one model ``variant`` (see module docstring)."""
  name, modifiers = parse_variant(variant)
  config = ml_collections.ConfigDict()
  # The model variant this config trains (recorded in the results).
  config.variant = name
  # Root seed: parameter init, Langevin noise, dropout and data order derive from it.
  config.seed = 0

  config.data = _data(task)
  config.model = _model()
  config.phase_a = _phase_a()
  config.phase_b = _phase_b()
  config.run = _run()

  kind, _, fmap = name.partition('-')
  if kind in ('vanilla', 'kernel', 'ball'):
    config.model.feature_map = fmap
    config.phase_a.enabled = kind == 'kernel'
    if kind == 'ball':
      # A reference: --config.phase_a.radius=... moves the control's ball too.
      config.model.init_radius = config.phase_a.get_ref('radius')
  elif name == 'performer':
    # FAVOR+ with W_q/W_k and fixed orthogonal features (Choromanski et al. 2020).
    config.model.feature_map = 'favor'
    config.model.qk_mode = 'projected'
    config.model.orthogonal = True
    config.phase_a.enabled = False
  else:
    config.model.attention = name
    config.phase_a.enabled = False

  if 'learn' in modifiers:
    # Phase A in the regime where the particles learn (docs/phase_a_learning.md), chosen on
    # Rotten Tomatoes validation rows by studies/phase_a_pilot (setting 'repel_log',
    # results/phase_a_pilot_rotten_tomatoes.md): Phase A after Phase B has trained the
    # encoder, every layer's step, temperature and repulsion set from the measured forces.
    # The paper's two phases stay the default (no modifier).
    config.phase_a.schedule = 'after_b'
    # Phase A after all but the last two Phase B epochs (override for fewer than 3 epochs).
    config.phase_a.after_b_epochs = config.phase_b.get_ref('num_epochs') - 2
    config.phase_a.num_epochs = 2
    config.phase_a.relative_step = 0.01
    config.phase_a.gibbs_tilt = 1e3
    config.phase_a.relative_lam = 1.0
    config.phase_a.riesz_s = '0.0'
  if 'quick' in modifiers:
    # A first run that learns, not a result: a tiny model, 8000 training rows, 2 epochs
    # at a 10x learning rate. Rotten Tomatoes kernel-elu: test accuracy 0.743 in 76 s on
    # 2 CPU cores shared with other jobs (at 9c8762a).
    config.data.max_train_examples = 8000
    config.data.vocab_size = 4000
    config.data.max_length = 64
    config.model.width = 32
    config.model.num_features = 16
    config.model.ffn_dim = 64
    config.phase_a.num_epochs = 1
    config.phase_b.num_epochs = 2
    config.phase_b.learning_rate = 2e-3
    config.phase_b.batch_size = 32
    config.run.log_every = 50
    config.run.checkpoint_every = 0
    if 'learn' in modifiers:   # 2 Phase B epochs: one before Phase A, one after.
      config.phase_a.after_b_epochs = 1
  return config
