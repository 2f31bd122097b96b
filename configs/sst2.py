r"""SST-2 (GLUE): train on GLUE train minus 1,000 validation rows, report on GLUE dev.

  python -m experiments.train --config=configs/sst2.py:kernel-porf_softplus --workdir=workdir/sst2/kernel-porf_softplus/seed0

Variants and fields: see ``configs/text.py``.
"""

import os
import sys

try:
  from configs import text
except ImportError:  # Loaded by path from outside the repository (config_flags): add its root.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from configs import text


def get_config(variant: str = ''):
  return text.get_text_config('sst2', variant)
