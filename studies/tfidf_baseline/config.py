r"""The settings of the TF-IDF reference row (``python -m studies.tfidf_baseline``).

  python -m studies.tfidf_baseline --data_dir=../shared/data --out=results/tfidf
  python -m studies.tfidf_baseline --config.tasks="('sst2',)" \
      --config.validation_rule=sentences

Tuple fields take a Python tuple on the command line, as above. The defaults are the
settings of the committed rows (``results/tfidf/<task>.json`` record them). The vectorizer
and the classifier are fixed by the command (its docstring says why each choice).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """Returns the reference row's settings."""
  config = ml_collections.ConfigDict()
  # Tasks to fit, from coulomb_jax.tasks.data.TASKS.
  config.tasks = ('sst2', 'rotten_tomatoes', 'qqp_subset')
  # Inverse L2 strengths C tried; the kept one has the best validation accuracy.
  config.c_grid = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
  # How validation is held out of train (coulomb_jax.tasks.data.load_split): 'rows', or
  # 'sentences' (sst2 only: whole sentences held out, their phrases dropped from train).
  config.validation_rule = 'rows'
  return config
