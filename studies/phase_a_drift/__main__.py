"""``python -m studies.phase_a_drift``: ``studies.phase_a_drift.command``."""

from studies.phase_a_drift import command

__doc__ = command.__doc__       # --help prints the launching module's docstring
command.launch()
