"""The tools: six commands (``python -m experiments.<name>``) and their parts.

  synthetic         the synthetic study (the main job, ``make run``)
  synthetic_report  the synthetic study's tables and figures rebuilt from its records
  train             one text-classification run: Phase A, Phase B, evaluation
  grid              every variant × seed of a dataset, one ``train`` run each
  report            the grid's tables, figures and ``docs/results.md``
  mqar              MQAR associative recall: one run, a grid, or the batched grid for a GPU

Parts: ``run/`` (one training run), ``study/`` (the synthetic study), ``analysis/`` (the
reports), ``recall/`` (the recall runs and grids), ``common/`` (shared by all). Scripts:
``gpu_grid.sh`` (the paper-length text grid on the GPU machine), ``recall/gpu_grid.sh`` (the
recall grid on one GPU). The one-off studies are in ``studies/`` (``studies/README.md``); a
tool imports the library and the tools' parts, never a study.
"""
