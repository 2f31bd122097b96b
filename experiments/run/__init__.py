"""The parts of one training run (``experiments/train.py``), one job each.

``train_config`` (which configs are accepted, the data folder), ``train_flags`` (the
command line, ``--list_fields``), ``run_folder`` (``RunFolder``: the workdir, every
file of it, preflight checks, lock; it opens the checkpoints and the TensorBoard
writer), ``run_identity`` (the config digest every checkpoint, stage file and
``results.json`` carries, and the checks against it), ``checkpoints`` (orbax save/restore, the Phase B prefix), ``sharding``
(the data mesh), ``summaries`` (TensorBoard); the stages: ``stages`` (``Run``, what
every stage shares, and Ball-X's projection), ``phase_a`` (Kernel-X's Langevin stage
and what it records about its dynamics; ``phase_a_report`` aggregates its stage file
into ``results.json['phase_a']``), ``phase_b`` (AdamW epochs, model selection)
and ``evaluation`` (metrics, pooled keys: forward passes over a split). ``train.py``
assembles them and dispatches each stage (``setup.run_stage``).
"""
