r"""The settings of the drift-against-noise measurement (``python -m studies.phase_a_drift``).

  python -m studies.phase_a_drift --out=results --config.dataset=rotten_tomatoes
  python -m studies.phase_a_drift --out=results --config.dataset=sst2 \
      --trained_runs=workdir/grid        # on trained encoders instead

Tuple fields take a Python tuple on the command line (``--config.feature_maps="('elu',)"``).
The defaults are the settings of the committed tables
(``results/phase_a_drift_<dataset>[_trained].{json,md}`` record them).
"""

import ml_collections

from configs import text as text_config


def get_config() -> ml_collections.ConfigDict:
  """Returns the measurement's settings."""
  config = ml_collections.ConfigDict()
  # The text task (a key of experiments.run.train_config.DATASETS); its config file gives
  # the model, the data and the Phase A settings (η, β, λ, clip, radius, batch, epochs).
  config.dataset = 'rotten_tomatoes'
  # Attention feature maps, each a kernel-<map> variant (from configs/text.py's MAPS).
  config.feature_maps = tuple(text_config.MAPS)
  # Phase A batches the drift is measured on (the first ones of the first epoch).
  config.batches = 20
  # Seed of the Vanilla-X runs read with --trained_runs (<root>/<dataset>/vanilla-<map>/seed<k>).
  config.trained_seed = 0
  return config
