"""``python -m studies.phase_a_pilot``: ``studies.phase_a_pilot.command``."""

from studies.phase_a_pilot import command

__doc__ = command.__doc__       # --help prints the launching module's docstring
command.launch()
