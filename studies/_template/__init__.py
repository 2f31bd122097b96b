"""<The question this study answers, in one line>: ``docs/<page>.md``.

``python -m studies.<name> --config=studies/<name>/config.py --workdir=workdir/<name>``
(``command``: the study; ``config``: its settings). Copy this folder to start a study.
"""
