"""The paper's tasks read from their files or tfds copies: ``load_split`` and its provenance.

Readers of GLUE SST-2 and QQP and of the 20k Quora pairs (the MR reader, shared
with ``tfds_builders``, is in ``core``); the two rules that carve 'validation'
out of a training file (``'rows'``, or ``sentence_split`` for SST-2's phrase rows);
``source_files``, the files a task's loader reads, and ``fingerprint`` /
``check_fingerprint``, their sha256. The tasks, files and split rules are described
in the ``coulomb_jax.tasks.data`` docstring.
"""

import csv
import functools
import hashlib
import importlib
import io
import os
from typing import Mapping, Optional, Sequence

import numpy as np

from coulomb_jax import _checks
from coulomb_jax.tasks.data import core
from coulomb_jax.tasks.data.core import (DEFAULT_MIN_CLASS_SHARE, SPLITS, TASKS, Examples,
                                         check_class_balance, read_rotten_tomatoes_files)

SOURCES = ('files', 'tfds')

_QQP_HEADER = ['id', 'qid1', 'qid2', 'question1', 'question2', 'is_duplicate']


# ----------------------------------------------------------------------------- loading


_require_file = core.require_file


def _labels(values: list[str], path: str) -> np.ndarray:
  try:
    labels = np.array([int(v) for v in values], np.int32)
  except ValueError as e:
    raise ValueError(f'{path}: non-integer label ({e}).') from None
  if labels.size and not np.all((labels == 0) | (labels == 1)):
    raise ValueError(f'{path}: labels must be 0 or 1, got {sorted(set(labels.tolist()))}.')
  return labels


def _read_sst2(path: str) -> Examples:
  """GLUE SST-2 train/dev: header ``sentence\\tlabel``, no quoting."""
  _require_file(path, ' Expected the GLUE SST-2 files (glue/SST-2/{train,dev}.tsv).')
  lines = core.read_text(path).split('\n')
  if lines[0] != 'sentence\tlabel':
    raise ValueError(f'{path}: expected the header "sentence\\tlabel", got {lines[0]!r}.')
  texts, labels = [], []
  for number, line in enumerate(lines[1:], start=2):
    if not line:
      continue
    fields = line.split('\t')
    if len(fields) != 2:
      raise ValueError(f'{path}:{number}: expected 2 tab-separated fields, got {len(fields)}.')
    texts.append(fields[0].strip())
    labels.append(fields[1])
  return Examples(texts, None, _labels(labels, path))


def _read_tsv(path: str, num_fields: int, header: Optional[list[str]]) -> list[list[str]]:
  """csv rows (tab, default quoting); each record must be exactly one line."""
  with io.StringIO(core.read_text(path), newline='') as f:
    reader = csv.reader(f, delimiter='\t')
    rows = []
    for row in reader:
      line = reader.line_num
      if len(rows) + 1 != line:
        raise ValueError(f'{path}:{len(rows) + 1}: a quoted field runs on to line {line}.')
      if len(row) != num_fields:
        raise ValueError(f'{path}:{line}: expected {num_fields} fields, got {len(row)}.')
      rows.append(row)
  if header is not None:
    if not rows or rows[0] != header:
      raise ValueError(f'{path}: expected the header {header}, got {rows[:1]}.')
    rows = rows[1:]
  return rows


def _read_qqp_subset(path: str) -> Examples:
  """``is_duplicate \\t question1 \\t question2 \\t id``, no header."""
  _require_file(path, ' Expected the 20k Quora pairs (glue/QQP/quora-pairs-20k/).')
  rows = _read_tsv(path, 4, None)
  return Examples([r[1] for r in rows], [r[2] for r in rows], _labels([r[0] for r in rows], path))


def _read_qqp_glue(path: str) -> Examples:
  """GLUE QQP train/dev: ``id qid1 qid2 question1 question2 is_duplicate``."""
  _require_file(
      path, " Task 'qqp' expects the full GLUE QQP train.tsv and dev.tsv (header "
      "'id qid1 qid2 question1 question2 is_duplicate') in glue/QQP/; they are not in "
      "the offline data copy. The 20k Quora-pairs subset that is there is task 'qqp_subset'.")
  rows = _read_tsv(path, 6, _QQP_HEADER)
  return Examples([r[3] for r in rows], [r[4] for r in rows], _labels([r[5] for r in rows], path))


def _take(examples: Examples, index: np.ndarray) -> Examples:
  text_b = None if examples.text_b is None else [examples.text_b[i] for i in index]
  return Examples([examples.text_a[i] for i in index], text_b, examples.labels[index])


VALIDATION_RULES = ('rows', 'sentences')
"""How ``load_split`` carves 'validation' out of a training file (see its docstring)."""


def _spans(tokens):
  """Every contiguous span of a token list (itself included), as strings."""
  n = len(tokens)
  return {' '.join(tokens[i:j]) for i in range(n) for j in range(i + 1, n + 1)}


@functools.lru_cache(maxsize=4)
def _sentence_split_cached(texts, validation_size, validation_seed):
  return sentence_split(list(texts), validation_size, validation_seed)


def sentence_split(texts, validation_size: int, validation_seed: int = 0):
  """SST-2's phrase-level rows split by sentence: ``(train_index, validation_index)``.

  GLUE's train.tsv holds, deduplicated, every phrase of the parse trees of the
  training sentences, and not the sentence ids. Here a *sentence* is a row that is
  not a proper token span of another row (processing rows longest first, a row is
  one iff no earlier sentence contains it). 'validation' is ``validation_size``
  sentences drawn with ``np.random.default_rng(validation_seed)``; 'train' keeps
  every other row that is a span of a sentence left in train, i.e. it drops the
  rows that can only have come from the validation sentences. So validation
  relates to train as GLUE dev does (full sentences; their generic sub-phrases,
  e.g. "the film", may occur in train as phrases of other sentences, their own
  phrases do not). Indices are sorted (file order).
  """
  tokens = [t.split() for t in texts]
  order = sorted(range(len(texts)), key=lambda i: -len(tokens[i]))
  contained, sentences = set(), []
  for i in order:
    if texts[i] not in contained and ' '.join(tokens[i]) not in contained:
      sentences.append(i)
      contained |= _spans(tokens[i])
  sentences.sort()
  if validation_size >= len(sentences):
    raise ValueError(f'validation_size must be < the {len(sentences)} sentences of the '
                     f'training file, got {validation_size}.')
  perm = np.random.default_rng(validation_seed).permutation(len(sentences))
  chosen = {sentences[k] for k in perm[:validation_size]}
  keep = set()
  for i in sentences:
    if i not in chosen:
      keep |= _spans(tokens[i])
  train = [i for i in range(len(texts)) if i not in chosen and ' '.join(tokens[i]) in keep]
  return np.asarray(train, np.int64), np.asarray(sorted(chosen), np.int64)


_FILES = {  # task → (file of train+validation, file of test, reader)
    'sst2': ('glue/SST-2/train.tsv', 'glue/SST-2/dev.tsv', _read_sst2),
    'qqp_subset': ('glue/QQP/quora-pairs-20k/train_10k.utf8.tsv',
                   'glue/QQP/quora-pairs-20k/heldout_10k.utf8.tsv', _read_qqp_subset),
    'qqp': ('glue/QQP/train.tsv', 'glue/QQP/dev.tsv', _read_qqp_glue),
}


def _import_tfds_builders():
  """``coulomb_jax.tasks.data.tfds_builders``, imported only for ``source='tfds'``."""
  try:
    return importlib.import_module('coulomb_jax.tasks.data.tfds_builders')
  except ImportError as e:
    raise ImportError(
        "source='tfds' needs tensorflow-datasets (tensorflow is not needed): pip install "
        f"tensorflow-datasets importlib_resources array_record ({e}).") from e


def load_split(task: str, data_dir: str, split: str, *, validation_size: int = 1000,
               validation_seed: int = 0, validation_rule: str = 'rows', source: str = 'files',
               tfds_data_dir: Optional[str] = None, download: bool = False,
               min_class_share: Optional[float] = DEFAULT_MIN_CLASS_SHARE) -> Examples:
  """One split of a task (see the module docstring); examples keep file order.

  For sst2, qqp_subset and qqp, 'validation' is rows ``perm[:validation_size]`` of
  the training file and 'train' the rows ``perm[validation_size:]``, with
  ``perm = np.random.default_rng(validation_seed).permutation(num_rows)``; both
  are disjoint and sorted back into file order. ``validation_rule='sentences'``
  (sst2 only) draws ``validation_size`` whole sentences instead and drops from
  'train' the phrases that only they contain (``sentence_split``): the held-out
  rows are then as unseen as GLUE dev's, unlike 'rows' (the module docstring).

  ``source='files'`` (the default) reads the local files under ``data_dir``.
  ``source='tfds'`` reads a tensorflow_datasets copy in ``tfds_data_dir`` (tfds'
  default when None) through ``tfds.data_source`` (array_record; no tensorflow):
  sst2 and qqp are ``glue/sst2`` and ``glue/qqp`` ('test' is tfds 'validation', i.e.
  GLUE dev; 'train'/'validation' are carved from tfds 'train' as above, in file
  order by its ``idx``), rotten_tomatoes is the project builder
  ``coulomb_rotten_tomatoes`` (``coulomb_jax.tasks.data.tfds_builders``), qqp_subset has no
  tfds copy. With ``download=False`` (the default) nothing is downloaded or built:
  a copy that is not prepared raises FileNotFoundError. ``download=True`` prepares
  it first (GLUE from the network; rotten_tomatoes from ``data_dir/rotten_tomatoes``,
  the manual dir, without network).

  The split is checked by ``check_class_balance(labels, <its files>,
  min_share=min_class_share)``: fewer than two classes, or a class below
  ``min_class_share`` of the split, raises one ValueError naming the file(s) and the
  class counts (``None`` skips the check).
  """
  if task not in TASKS:
    raise ValueError(f'task must be one of {TASKS}, got {task!r}.')
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}.')
  if source not in SOURCES:
    raise ValueError(f'source must be one of {SOURCES}, got {source!r}.')
  if source == 'tfds' and task == 'qqp_subset':
    raise ValueError("task 'qqp_subset' has no tfds copy; use source='files'.")
  if not isinstance(download, bool):
    raise TypeError(f'download must be a bool, got {download!r}.')
  validation_size = _checks.check_int('validation_size', validation_size, 0)
  validation_seed = _checks.check_int('validation_seed', validation_seed, 0)
  if validation_rule not in VALIDATION_RULES:
    raise ValueError(f'validation_rule must be one of {VALIDATION_RULES}, got '
                     f'{validation_rule!r}.')
  if validation_rule == 'sentences' and task != 'sst2':
    raise ValueError(f"validation_rule='sentences' is for sst2 (phrase-level rows), got "
                     f'task={task!r}.')
  if min_class_share is not None:
    _checks.check_nonnegative('min_class_share', min_class_share)
    if not min_class_share <= 0.5:
      raise ValueError(f'min_class_share must be in [0, 0.5] (two classes), got '
                       f'{min_class_share!r}.')
  examples, where = _load_split(task, data_dir, split, validation_size, validation_seed,
                                validation_rule, source, tfds_data_dir, download)
  if min_class_share is not None:
    check_class_balance(examples.labels, f'{task} {split!r} split of {where}',
                        min_share=min_class_share)
  return examples


def _load_split(task, data_dir, split, validation_size, validation_seed, validation_rule,
                source, tfds_data_dir, download):
  """``load_split`` after its checks: ``(examples, where they came from)``."""
  if source == 'tfds':
    builders = _import_tfds_builders()
    manual_dir = os.path.join(data_dir, 'rotten_tomatoes') if data_dir else None
    name = f'tfds {builders.TFDS_NAMES[task]} in {tfds_data_dir or "the default tfds dir"}'

    def read(part):  # part: 'train' (train + validation) or 'test'.
      return builders.read_examples(task, part, data_dir=tfds_data_dir, download=download,
                                    manual_dir=manual_dir)

    if task == 'rotten_tomatoes':
      return read(split), f'{name} ({split!r})'
    if split == 'test':
      return read('test'), f"{name} ('validation')"
    where = f"{name} ('train')"
    examples = read('train')
  else:
    if task == 'rotten_tomatoes':
      directory = os.path.join(data_dir, 'rotten_tomatoes')
      files = ', '.join(os.path.join(directory, f) for f in core.MR_FILES)
      return read_rotten_tomatoes_files(directory, split), files
    train_file, test_file, read_file = _FILES[task]
    if split == 'test':
      where = os.path.join(data_dir, test_file)
      return read_file(where), where
    where = os.path.join(data_dir, train_file)
    examples = read_file(where)
  if validation_rule == 'sentences':
    # Cached: the train and validation splits are loaded by separate calls.
    train, validation = _sentence_split_cached(tuple(examples.text_a), validation_size,
                                               validation_seed)
    return _take(examples, validation if split == 'validation' else train), where
  n = len(examples.labels)
  if validation_size >= n:
    raise ValueError(
        f'validation_size must be < the {n} rows of {where}, got {validation_size}.')
  perm = np.random.default_rng(validation_seed).permutation(n)
  index = perm[:validation_size] if split == 'validation' else perm[validation_size:]
  return _take(examples, np.sort(index)), where


# ----------------------------------------------------------------------------- provenance


def source_files(task: str, data_dir: str, *, source: str = 'files',
                 tfds_data_dir: Optional[str] = None) -> list[str]:
  """Every file ``load_split(task, data_dir, ..., source=source)`` reads, sorted.

  ``source='files'``: the task's files under ``data_dir`` (train and test file, or
  the two MR files), whether or not they exist yet (``fingerprint`` then names the
  missing one). ``source='tfds'``: every file of the prepared tfds copy in
  ``tfds_data_dir`` (``tfds_builders.dataset_files``; FileNotFoundError if it is not
  prepared). Add the tokenizer file to fingerprint it as well.
  """
  if task not in TASKS:
    raise ValueError(f'task must be one of {TASKS}, got {task!r}.')
  if source not in SOURCES:
    raise ValueError(f'source must be one of {SOURCES}, got {source!r}.')
  if source == 'tfds':
    if task == 'qqp_subset':
      raise ValueError("task 'qqp_subset' has no tfds copy; use source='files'.")
    return _import_tfds_builders().dataset_files(task, tfds_data_dir)
  if task == 'rotten_tomatoes':
    names = [os.path.join('rotten_tomatoes', f) for f in core.MR_FILES]
  else:
    names = list(_FILES[task][:2])
  return sorted(os.path.join(data_dir, name) for name in names)


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def fingerprint(paths: Sequence[str], *, root: Optional[str] = None) -> dict[str, str]:
  """``{path: sha256 hex digest}`` of each file, keys sorted.

  ``root``: keys are paths relative to it (so a fingerprint survives moving the
  data folder); else the paths as given. A missing file raises FileNotFoundError
  naming it.
  """
  if isinstance(paths, (str, bytes)):
    raise ValueError(f'paths must be a sequence of file paths, got the string {paths!r}.')
  out = {}
  for path in paths:
    _require_file(path)
    out[os.path.relpath(path, root) if root is not None else path] = _sha256(path)
  return dict(sorted(out.items()))


def changed_files(stored: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
  """The keys whose digests differ, or that only one fingerprint has, sorted."""
  return sorted(p for p in set(stored) | set(current) if stored.get(p) != current.get(p))


def check_fingerprint(stored: Mapping[str, str], current: Mapping[str, str],
                      what: str = 'the data') -> None:
  """Raises one ValueError naming every file that changed between two fingerprints.

  ``'{what} changed since this fingerprint was stored: glue/SST-2/train.tsv (sha256
  0123abcd… now 4567ef01…); ...'``; a file in only one of them reads 'missing'.
  """
  changed = changed_files(stored, current)
  if changed:
    short = lambda d: 'missing' if d is None else d[:12] + '…'
    items = '; '.join(f'{p} (sha256 {short(stored.get(p))} now {short(current.get(p))})'
                      for p in changed)
    raise ValueError(f'{what} changed since this fingerprint was stored: {items}.')
