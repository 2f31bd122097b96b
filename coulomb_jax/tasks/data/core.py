"""What ``data`` and ``tfds_builders`` share: examples, split names, the MR reader, checks.

``data`` imports ``tfds_builders`` only for ``source='tfds'`` (tensorflow-datasets is
optional); both import this module, so neither imports the other at module level.

* ``Examples``: the labelled texts every loader returns.
* ``read_text``: a file's text; bytes that are not valid in its encoding raise a
  ValueError naming the file, the line and the byte.
* ``read_rotten_tomatoes_files``: the Hugging Face split of the MR files.
* ``check_class_balance``: a split with fewer than two classes, or a class below
  ``min_share`` of it, raises one ValueError naming where the split came from
  and its class counts. An empty or truncated ``rt-polarity.pos`` would otherwise
  train on one class and report a test accuracy of 1.0.
"""

import io
import os
from typing import NamedTuple, Optional

import numpy as np

from coulomb_jax import _checks

TASKS = ('sst2', 'rotten_tomatoes', 'qqp_subset', 'qqp')
SPLITS = ('train', 'validation', 'test')

DEFAULT_MIN_CLASS_SHARE = 0.01
"""The least share of a split each class must hold (``check_class_balance``)."""

MR_FILES = ('rt-polarity.pos', 'rt-polarity.neg')
"""The MR sentence-polarity files (positives, negatives) of Rotten Tomatoes."""


class Examples(NamedTuple):
  """``n`` labelled examples; ``text_b`` is ``None`` for single-sentence tasks."""
  text_a: list[str]
  text_b: Optional[list[str]]
  labels: np.ndarray  # [n] int32 in {0, 1}


def require_file(path: str, hint: str = '') -> None:
  if not os.path.isfile(path):
    raise FileNotFoundError(f'data file {path} not found.{hint}')


def read_text(path: str, encoding: str = 'utf-8') -> str:
  """The whole file as text (no newline translation); undecodable bytes name the file.

  Raises ValueError ``'{path}:{line}: not valid UTF-8: byte 0x.. at offset N (...)'``.
  """
  with open(path, 'rb') as f:
    raw = f.read()
  try:
    return raw.decode(encoding)
  except UnicodeDecodeError as e:
    line = raw.count(b'\n', 0, e.start) + 1
    raise ValueError(f'{path}:{line}: not valid {encoding.upper()}: byte '
                     f'0x{raw[e.start]:02x} at offset {e.start} ({e.reason}).') from None


def read_rotten_tomatoes_files(directory: str, split: str) -> Examples:
  """The Hugging Face ``rotten_tomatoes`` split of ``directory/rt-polarity.{pos,neg}``.

  latin-1, ``readlines``, ``strip``; per class the first 80%, next 10%, last 10%
  (rounded half up); positives first; neg = 0, pos = 1. Also what the tfds builder
  ``coulomb_rotten_tomatoes`` writes (from its manual dir).
  """
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}.')
  per_class = []
  for name in MR_FILES:
    path = os.path.join(directory, name)
    require_file(path, ' Expected the MR sentence-polarity files rt-polarity.{pos,neg}.')
    # As open(path, encoding='latin-1').readlines(): universal newlines only (not str.splitlines,
    # which also splits on latin-1's \x85).
    lines = [line.strip() for line in io.StringIO(read_text(path, 'latin-1'), newline=None)]
    n = len(lines)
    i1, i2 = int(n * 0.8 + 0.5), int(n * 0.9 + 0.5)
    per_class.append({'train': lines[:i1], 'validation': lines[i1:i2], 'test': lines[i2:]}[split])
  pos, neg = per_class
  labels = np.concatenate([np.ones(len(pos), np.int32), np.zeros(len(neg), np.int32)])
  return Examples(pos + neg, None, labels)


def check_class_balance(labels, source: str, *, min_share: float = DEFAULT_MIN_CLASS_SHARE,
                        num_classes: int = 2) -> dict[int, int]:
  """Refuses a split whose classes are missing or rarer than ``min_share``; returns the counts.

  Args:
    labels: ``[n]`` integer labels in ``[0, num_classes)``.
    source: where the split came from (its file or files), for the message.
    min_share: each class must hold at least this share of the n rows, in
      [0, 1/num_classes]; 0 still requires every class to occur.
    num_classes: the task's classes (2 for every task here).

  Raises:
    ValueError: one line, ``'{source}: class counts {0: a, 1: b} (n rows): ...'``.
  """
  num_classes = _checks.check_int('num_classes', num_classes, 2)
  _checks.check_nonnegative('min_share', min_share)
  if not min_share <= 1.0 / num_classes:
    raise ValueError(f'min_share must be <= 1/num_classes = {1.0 / num_classes:.3g}, got '
                     f'{min_share!r}.')
  labels = np.asarray(labels)
  n = labels.size
  counts = {c: int(np.sum(labels == c)) for c in range(num_classes)}
  missing = [c for c, k in counts.items() if k == 0]
  rare = [c for c, k in counts.items() if k and k < min_share * n]
  if missing or rare:
    what = (f'class {missing[0]} is missing' if len(missing) == 1 else
            f'classes {missing} are missing' if missing else
            ', '.join(f'class {c} holds {counts[c] / n:.2%}' for c in rare))
    raise ValueError(
        f'{source}: class counts {counts} ({n} rows): {what}; every class must hold at '
        f'least {min_share:.0%} of a split (min_class_share={min_share}), so this file is '
        f'probably empty, truncated or not the expected data.')
  return counts
