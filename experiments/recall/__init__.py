"""Parts of ``python -m experiments.mqar`` (associative recall): ``methods`` (what each
attention method is and how its features are counted), ``run`` (one resumable training
run), ``grid`` (the planned runs and ``results/mqar.json``)."""
