"""The commands of the project; each module at this level is one (``python -m experiments.<name>``).

  train             one text-classification run: Phase A, Phase B, evaluation (or by path)
  grid              every variant × seed of a dataset, one ``train`` run each
  report            the grid's tables, figures and ``docs/results.md``
  tfidf_baseline    the TF-IDF + logistic-regression reference row of the tables
  phase_a_learning  learned vs ball vs vanilla particles: does Phase A learn?
  phase_a_pilot     Phase A settings chosen on validation rows
  phase_a_drift     Phase A's alignment drift against the Langevin noise, per step
  synthetic         the synthetic study (the main job, ``make run``)
  synthetic_report  the synthetic study's tables and figures rebuilt from its records
  synthetic_pilot   the validation pilot that set the study's η and β
  theory            free energy, N-vs-2N distance and kernel spread on the synthetic problem
  attention_figure  kernel attention's time and memory against softmax (``docs/performance.md``)
  mqar              MQAR associative recall: one run or the grid
  mqar_convert      trained softmax MQAR models converted to linear attention
  phase_a_repulsion does stronger repulsion keep the particles apart (``.sh``: its runs)
  phase_a_softmax   Phase A on the softmax target inside the encoder (runs: the same ``.sh``)
  softmax_mimicry   fidelity to softmax against N and conversion of trained softmax encoders
  gpu_grid.sh       the paper-length grid on the GPU machine (``bash experiments/gpu_grid.sh``)

Their parts live in sub-packages named for their job: ``run`` (one training run),
``study`` (the synthetic study), ``analysis`` (the reports), ``common`` (what every
command shares: one-line errors, progress lines, provenance; ``python -m
experiments.common.provenance --relativize PATH...`` rewrites old absolute paths).
"""
