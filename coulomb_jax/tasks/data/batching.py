"""Length-bucketed, dynamically padded batches of ``Encoded`` sequences (numpy only).

``batches`` yields dicts of ``[B, L]`` ids, segments and mask and ``[B]`` labels,
weights and row indices; ``batch_indices`` gives the same batches' rows without the
padded tokens; ``num_batches`` counts them.
"""

from typing import Iterator, Optional

import numpy as np

from coulomb_jax import _checks
from coulomb_jax.tasks.data.tokenizer import Encoded


def num_batches(n: int, batch_size: int, drop_remainder: bool) -> int:
  """How many batches ``batches`` yields for ``n`` examples."""
  n = _checks.check_int('n', n, 0)
  batch_size = _checks.check_int('batch_size', batch_size, 1)
  return n // batch_size if drop_remainder else -(-n // batch_size)


def batch_indices(lengths: np.ndarray, batch_size: int, *, seed: Optional[int] = None,
                  epoch: int = 0, bucket_size: int = 64,
                  drop_remainder: bool = False) -> list[np.ndarray]:
  """The rows of each batch ``batches`` makes from sequences of these ``lengths``.

  A list of int arrays (at most ``batch_size`` row numbers each), in batch order;
  for callers that need the rows but not the padded tokens.
  """
  return _batch_indices(np.asarray(lengths), batch_size, seed, epoch, bucket_size,
                        drop_remainder)


def _batch_indices(lengths: np.ndarray, batch_size: int, seed: Optional[int], epoch: int,
                   bucket_size: int, drop_remainder: bool) -> list[np.ndarray]:
  n = len(lengths)
  keep = num_batches(n, batch_size, True) * batch_size if drop_remainder else n
  if seed is None:
    order = np.arange(keep)
    return [order[i:i + batch_size] for i in range(0, keep, batch_size)]
  rng = np.random.default_rng((seed, epoch))
  order = rng.permutation(n)[:keep]  # A dropped remainder is a random set of examples.
  chunk = bucket_size * batch_size
  out = []
  for start in range(0, keep, chunk):
    bucket = order[start:start + chunk]
    bucket = bucket[np.argsort(lengths[bucket], kind='stable')]
    out.extend(bucket[i:i + batch_size] for i in range(0, len(bucket), batch_size))
  return [out[i] for i in rng.permutation(len(out))]


def _make_batch(encoded: Encoded, lengths: np.ndarray, index: np.ndarray, batch_size: int,
                pad_multiple: int) -> dict[str, np.ndarray]:
  size = max(1, -(-int(lengths[index].max()) // pad_multiple)) * pad_multiple
  ids = np.zeros((batch_size, size), np.int32)  # [PAD] = 0.
  segments = np.zeros((batch_size, size), np.int32)
  for row, i in enumerate(index.tolist()):
    ids[row, :lengths[i]] = encoded.ids[i]
    segments[row, :lengths[i]] = encoded.segments[i]
  row_lengths = np.zeros(batch_size, np.int64)
  row_lengths[:len(index)] = lengths[index]
  labels = np.zeros(batch_size, np.int32)
  labels[:len(index)] = encoded.labels[index]
  weights = np.zeros(batch_size, np.float32)
  weights[:len(index)] = 1.0
  rows = np.full(batch_size, -1, np.int32)
  rows[:len(index)] = index
  return {'ids': ids, 'segments': segments,
          'mask': np.arange(size)[None, :] < row_lengths[:, None],
          'labels': labels, 'weights': weights, 'index': rows}


def batches(encoded: Encoded, batch_size: int, *, seed: Optional[int] = None, epoch: int = 0,
            pad_multiple: int = 16, bucket_size: int = 64,
            drop_remainder: bool = False) -> Iterator[dict[str, np.ndarray]]:
  """Padded batches of ``batch_size`` rows, one pass over ``encoded``.

  Each batch: ``ids, segments: [B, L]`` int32, ``mask: [B, L]`` bool (True on
  real tokens), ``labels: [B]`` int32, ``weights: [B]`` float32 (0 on padding
  rows), ``index: [B]`` int32 (each row's position in ``encoded``, −1 on padding
  rows), with ``B = batch_size`` and ``L`` the batch's longest sequence rounded up
  to a multiple of ``pad_multiple``. A short last batch is filled with all-[PAD]
  rows of weight 0 and label 0, or dropped when ``drop_remainder``.

  ``seed=None`` keeps the examples in order (evaluation). With a seed, the order
  is a permutation drawn from ``default_rng((seed, epoch))``; every ``bucket_size``
  batches' worth of it is sorted by length and cut into batches (few padded
  tokens), and the batches are shuffled. Arguments are checked on the call.
  """
  batch_size = _checks.check_int('batch_size', batch_size, 1)
  pad_multiple = _checks.check_int('pad_multiple', pad_multiple, 1)
  bucket_size = _checks.check_int('bucket_size', bucket_size, 1)
  epoch = _checks.check_int('epoch', epoch, 0)
  if seed is not None:
    seed = _checks.check_int('seed', seed, 0)
  n = len(encoded.ids)
  if len(encoded.segments) != n or len(encoded.labels) != n:
    raise ValueError(f'encoded must have as many segments and labels as ids: {n} ids, '
                     f'{len(encoded.segments)} segments, {len(encoded.labels)} labels.')
  lengths = np.array([len(x) for x in encoded.ids], np.int64)
  labels = np.asarray(encoded.labels, np.int32)
  encoded = encoded._replace(labels=labels)
  indices = _batch_indices(lengths, batch_size, seed, epoch, bucket_size, drop_remainder)
  return (_make_batch(encoded, lengths, index, batch_size, pad_multiple) for index in indices)
