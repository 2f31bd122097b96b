r"""Rotten Tomatoes (MR v1.0) with the Hugging Face split: 8,530 / 1,066 / 1,066.

  python -m experiments.train --config=configs/rotten_tomatoes.py:kernel-softmaxfeat --workdir=workdir/rotten_tomatoes/kernel-softmaxfeat/seed0

Variants and fields: see ``configs/text.py``.
"""

from configs import text   # importable anywhere: setup.py installs the configs package


def get_config(variant: str = ''):
  return text.get_text_config('rotten_tomatoes', variant)
