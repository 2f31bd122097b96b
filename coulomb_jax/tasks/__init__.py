"""The tasks the library's studies run on, generated or read locally (never downloaded
unless asked).

* ``synthetic``: the synthetic classification problem (keyed generator, 2-D version);
* ``mqar``: Zoology's multi-query associative recall, generated (``mqar_batch``);
* ``data``: the text tasks (SST-2, Rotten Tomatoes, QQP) from local files or tfds, the
  tokenizer, length-bucketed batches and data fingerprints (``data.core`` the examples and
  the class-balance check, ``data.tfds_builders`` the tfds sources).

``synthetic`` and ``mqar`` are imported here; ``data`` explicitly
(``from coulomb_jax.tasks import data``: it loads the tokenizer library).
"""

from coulomb_jax.tasks import mqar
from coulomb_jax.tasks import synthetic
