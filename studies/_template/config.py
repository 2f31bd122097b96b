r"""The study's settings: every field with a comment; ``--config.<field>=...`` overrides.

  python -m studies._template --config=studies/_template/config.py --workdir=/tmp/template
"""

import ml_collections


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  """``variant``: '' (the study) or 'quick' (a smoke run, not results)."""
  config = ml_collections.ConfigDict()
  # PRNG seed of every draw.
  config.seed = 0
  # Particles N of the toy problem below.
  config.num_particles = 8
  if variant == 'quick':
    config.num_particles = 4
  elif variant:
    raise ValueError(f"variant must be '' or 'quick', got {variant!r}.")
  return config
