r"""The settings of the Phase A pilot (``python -m studies.phase_a_pilot``).

  python -m studies.phase_a_pilot --runs=workdir/learn --out=results \
      --config.dataset=rotten_tomatoes
  python -m studies.phase_a_pilot --runs=workdir/learn --out=/tmp/pilot \
      --config.settings="('learn', 'repel_log')" --config.feature_maps="('elu',)"

Tuple fields take a Python tuple on the command line, as above. The defaults are the
settings of the committed pilots (``results/phase_a_pilot_<dataset>.json`` records them).
"""

import ml_collections

from configs import text as text_config

# Named Phase A settings: ``config.phase_a`` overrides on top of the Vanilla-X run's config.
# (A table, not config fields: the names hold dots, which ConfigDict keys may not.)
_LEARN = dict(relative_step=0.01, gibbs_tilt=1e3, relative_lam=0.0)
SETTINGS = {
    # The paper's fixed η = 2e-3, β = 50, λ = 1e-3, s = d − 2 (as the config defaults).
    'paper': dict(relative_step=0.0, gibbs_tilt=0.0, relative_lam=0.0),
    'learn': _LEARN,
    'step_0.003': dict(_LEARN, relative_step=0.003),
    'step_0.03': dict(_LEARN, relative_step=0.03),
    'tilt_1e2': dict(_LEARN, gibbs_tilt=1e2),
    'tilt_1e4': dict(_LEARN, gibbs_tilt=1e4),
    'repel_log': dict(_LEARN, relative_lam=1.0, riesz_s='0.0'),
    'repel_s1': dict(_LEARN, relative_lam=1.0, riesz_s='1.0'),
    'repel_coulomb': dict(_LEARN, relative_lam=1.0, riesz_s='coulomb'),
    'radius_3': dict(_LEARN, radius=3.0),
}


def get_config() -> ml_collections.ConfigDict:
  """Returns the pilot's settings."""
  config = ml_collections.ConfigDict()
  # The text task whose Vanilla-X runs are read (a key of experiments.run.train_config.DATASETS).
  config.dataset = 'rotten_tomatoes'
  # Seed of the Vanilla-X runs read (<runs>/<dataset>/vanilla-<map>/seed<seed>).
  config.seed = 0
  # Attention feature maps, each a kernel-<map> variant (from configs/text.py's MAPS).
  config.feature_maps = tuple(text_config.MAPS)
  # Names of SETTINGS to run, in order.
  config.settings = tuple(SETTINGS)
  # Phase A epochs per layer (0: the Vanilla-X run's config value).
  config.phase_a_epochs = 0
  return config
