"""The paper's theory, measured (free energy, N vs 2N, kernel spread): ``docs/theory.md``.

``python -m studies.theory --config=studies/theory/config.py --workdir=workdir/theory``
(``command``: the study; ``config``: its settings).
"""
