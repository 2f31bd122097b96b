"""``python -m studies.softmax_mimicry``: ``studies.softmax_mimicry.command``."""

from studies.softmax_mimicry import command

__doc__ = command.__doc__       # --help prints the launching module's docstring
command.launch()
