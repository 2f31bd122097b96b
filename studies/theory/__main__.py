"""``python -m studies.theory``: ``studies.theory.command``."""

from studies.theory import command

__doc__ = command.__doc__       # --help prints the launching module's docstring
command.launch()
