"""``python -m studies._template``: ``studies._template.command``."""

from studies._template import command

__doc__ = command.__doc__       # --help prints the launching module's docstring
command.launch()
