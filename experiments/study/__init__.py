"""The parts of the synthetic study (``experiments/synthetic.py``), one job each.

``methods`` (every method fitted and scored on one (σ, seed) cell), ``record_file``
(``records.jsonl``: a cell counts once its marker is written) and ``tables`` (the
tables, figures and ``results.json`` / ``results.md`` from the records). The
commands stay at the top of ``experiments/``: ``synthetic`` (the study),
``synthetic_report`` (rebuild the tables from the records), ``synthetic_pilot``
(the validation pilot for η and β) and ``theory`` (free energy, N-vs-2N distance and
kernel spread: one self-contained command, its measurements next to its ``main``).
"""
