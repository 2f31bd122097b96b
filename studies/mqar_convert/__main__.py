"""``python -m studies.mqar_convert``: ``studies.mqar_convert.command``."""

from studies.mqar_convert import command

__doc__ = command.__doc__       # --help prints the launching module's docstring
command.launch()
