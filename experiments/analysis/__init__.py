"""The parts of the reports (``experiments/report.py``, ``studies/phase_a_learning``).

``loading`` (what a report reads: the runs' ``results.json`` and test predictions,
earlier summaries; results never replaced by fewer), ``tables`` (a dataset's table as
numbers: which runs may share it, means over seeds, paired differences, the TF-IDF
row), ``pages`` (the markdown page and the figures it embeds) and ``plots`` (the
matplotlib figures: reliability diagrams, forest plots, attention cost). They serve the
tool ``experiments.report`` and the studies and benchmarks that report (``studies.
phase_a_learning``, ``studies.tfidf_baseline``, ``benchmarks.attention_figure``).
"""
