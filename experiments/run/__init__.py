"""The parts of one training run (``experiments/train.py``), one job each.

``train_config`` (which configs are accepted, the data folder), ``train_flags`` (the
command line, ``--list_fields``), ``run_folder`` (the workdir's files, preflight
checks, lock), ``checkpoints`` (orbax save/restore, the Phase B prefix), ``sharding``
(the data mesh), ``summaries`` (TensorBoard) and ``stages`` (what each stage does).
"""
