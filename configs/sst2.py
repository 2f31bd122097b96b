r"""SST-2 (GLUE): train on GLUE train minus 1,000 validation rows, report on GLUE dev.

  python -m experiments.train --config=configs/sst2.py:kernel-porf_softplus --workdir=workdir/sst2/kernel-porf_softplus/seed0

Variants and fields: see ``configs/text.py``.
"""

from configs import text   # importable anywhere: setup.py installs the configs package


def get_config(variant: str = ''):
  return text.get_text_config('sst2', variant)
