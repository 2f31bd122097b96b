"""The TF-IDF + logistic-regression reference row of the text tables (``results/tfidf/``).

``python -m studies.tfidf_baseline --data_dir=../shared/data --out=results/tfidf``
(``command``; settings in ``config``); the report (``experiments.report --tfidf``) reads
its files.
"""
