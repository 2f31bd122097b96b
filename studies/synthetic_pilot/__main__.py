"""``python -m studies.synthetic_pilot``: ``studies.synthetic_pilot.command``."""

from studies.synthetic_pilot import command

__doc__ = command.__doc__       # --help prints the launching module's docstring
command.launch()
