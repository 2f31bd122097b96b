"""``python -m studies.phase_a_repulsion``: ``studies.phase_a_repulsion.command``."""

from studies.phase_a_repulsion import command

__doc__ = command.__doc__       # --help prints the launching module's docstring
command.launch()
