"""``python -m studies.tfidf_baseline``: ``studies.tfidf_baseline.command``."""

from studies.tfidf_baseline import command

__doc__ = command.__doc__       # --help prints the launching module's docstring
command.launch()
