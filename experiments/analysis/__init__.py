"""The parts of the reports (``experiments/report.py``, ``experiments/phase_a_learning.py``).

``loading`` (what a report reads: the runs' ``results.json`` and test predictions,
earlier summaries; results never replaced by fewer), ``tables`` (a dataset's table as
numbers: which runs may share it, means over seeds, paired differences, the TF-IDF
row), ``pages`` (the markdown page and the figures it embeds) and ``plots`` (the
matplotlib figures: reliability diagrams, forest plots, attention cost). The commands
that use them stay at the top of ``experiments/``: ``report``, ``phase_a_learning``,
``tfidf_baseline`` (the reference row), ``attention_figure``.
"""
