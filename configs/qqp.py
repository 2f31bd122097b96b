r"""QQP question pairs ([CLS] q1 [SEP] q2 [SEP] with segment ids).

The default task is ``qqp_subset``: the balanced 20k Quora sample in
``../shared/data`` (train on 9,917 rows minus 1,000 validation rows, report on
the 9,928 held-out rows). Its numbers are NOT comparable with GLUE QQP dev
numbers (different rows, 50/50 labels instead of ~37% duplicates). With the full
GLUE files, use ``--config.data.task=qqp``.

  python -m experiments.train --config=configs/qqp.py:kernel-softmaxfeat --workdir=workdir/qqp_subset/kernel-softmaxfeat/seed0

Variants and fields: see ``configs/text.py``.
"""

from configs import text   # importable anywhere: setup.py installs the configs package


def get_config(variant: str = ''):
  return text.get_text_config('qqp_subset', variant)
