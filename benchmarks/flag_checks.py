"""Checks of the benchmarks' list flags, before any compute (one ``cli.ConfigError`` each)."""

from experiments.common import cli


def check_ints(flag, low: int) -> None:
  """One ``cli.ConfigError`` naming the flag unless the list flag ``flag`` (an absl
  ``FlagHolder``) holds integers ≥ ``low``, at least one."""
  for value in flag.value:
    try:
      ok = int(value) >= low
    except ValueError:
      ok = False
    if not ok:
      raise cli.ConfigError(f'--{flag.name}: expected integers ≥ {low}, got {value!r} in '
                            f'{",".join(flag.value)!r}.')
  if not flag.value:
    raise cli.ConfigError(f'--{flag.name}: expected integers ≥ {low}, got none.')
