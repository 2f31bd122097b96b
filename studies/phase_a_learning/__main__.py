"""``python -m studies.phase_a_learning``: ``studies.phase_a_learning.command``."""

from studies.phase_a_learning import command

__doc__ = command.__doc__       # --help prints the launching module's docstring
command.launch()
