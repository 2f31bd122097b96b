r"""Rotten Tomatoes (MR v1.0) with the Hugging Face split: 8,530 / 1,066 / 1,066.

  python -m experiments.train --config=configs/rotten_tomatoes.py:kernel-softmaxfeat --workdir=workdir/rotten_tomatoes/kernel-softmaxfeat/seed0

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
  return text.get_text_config('rotten_tomatoes', variant)
