r"""The settings of the MQAR conversion study (``python -m studies.mqar_convert``).

  python -m studies.mqar_convert --config=studies/mqar_convert/config.py \
      --teachers=workdir/mqar/main --workdir=workdir/mqar/convert
  python -m studies.mqar_convert --config.fit_steps=50      # one field changed

The defaults are the settings of the committed conversions (``results/mqar_conversion.json``
records them per row).
"""

import ml_collections

# The linear attentions a teacher can be converted to (``convert.CONVERT_METHODS`` is this
# tuple; ``studies/mqar_convert/convert.py`` says what each one fits).
METHODS = ('favor_orthogonal', 'elu', 'softmaxfeat_trained', 'hedgehog', 'particles_softmax')


def get_config() -> ml_collections.ConfigDict:
  """Returns the study's settings."""
  config = ml_collections.ConfigDict()
  # The methods converted to, a subset of METHODS.
  config.methods = METHODS
  # Feature-fitting steps (hedgehog and the particles; the other maps are not fitted).
  config.fit_steps = 200
  # Fine-tuning steps with the features frozen, every other weight by AdamW.
  config.finetune_steps = 300
  # Adam's step of the hedgehog fit.
  config.hedgehog_learning_rate = 3e-3
  # The Langevin step η of the particles' fit (the long grid's).
  config.particle_step_size = 3e-3
  return config
