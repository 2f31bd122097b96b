"""Text-classification data: the paper's tasks, a WordPiece tokenizer, padded batches.

Pipeline: ``load_split`` → ``train_tokenizer`` (on the training texts) →
``encode`` → ``batches``. Python, numpy and the ``tokenizers`` library only; the
batches are numpy arrays (no jax or tensorflow in the input pipeline).

Tasks and splits (every task has ``'train'``, ``'validation'`` and ``'test'``;
paths are relative to ``data_dir``, see the data README for the files):

* ``sst2``: ``glue/SST-2/{train,dev}.tsv``. GLUE's test labels are hidden, so
  ``'test'`` is GLUE dev (872 full sentences, what the paper reports on) and
  ``'validation'`` is ``validation_size`` rows of train.tsv picked by
  ``np.random.default_rng(validation_seed).permutation``; ``'train'`` is the
  rest (66,349 rows by default). Unlike dev, these validation rows include
  phrases as well as full sentences, so validation accuracy is not on the
  test distribution. Worse, GLUE's train.tsv holds many phrases of each
  training sentence, so most validation rows occur word for word inside
  training rows (a few are exact duplicates): validation accuracy rewards
  memorising and overstates test accuracy (TF-IDF: 0.940 against 0.820 in
  ``results/tfidf/sst2.json``), which biases the choice of epoch (or C) it
  makes. The test split is not affected (dev sentences are not in train.tsv).
  A sentence-level split needs the SST sentence ids, which GLUE drops. The
  trailing space GLUE leaves on every sentence is stripped.
* ``rotten_tomatoes``: ``rotten_tomatoes/rt-polarity.{pos,neg}`` split exactly
  as Hugging Face ``rotten_tomatoes`` does (latin-1, ``readlines``, ``strip``;
  per class the first 80%, next 10%, last 10%; positives first; neg = 0,
  pos = 1): 8,530 / 1,066 / 1,066. ``validation_size``/``validation_seed`` are
  ignored (the split is fixed).
* ``qqp_subset``: the 20k Quora pairs, ``glue/QQP/quora-pairs-20k/``:
  ``train_10k.utf8.tsv`` gives ``'train'`` and ``'validation'`` (carved as for
  sst2: 8,917 / 1,000) and ``heldout_10k.utf8.tsv`` is ``'test'`` (9,928).
  About 50% duplicates, so scores are not comparable to GLUE QQP.
* ``qqp``: full GLUE QQP, ``glue/QQP/{train,dev}.tsv`` (header
  ``id qid1 qid2 question1 question2 is_duplicate``); ``'test'`` is dev.tsv and
  validation is carved from train.tsv as for sst2. Not in the offline copy.

QQP fields are parsed with ``csv`` (tab, default quoting: a quoted field with
doubled inner quotes reads as the plain text); each record must be one line
with the expected number of fields.

Sources: the local files above (``source='files'``, the default, works offline) or,
with ``load_split(..., source='tfds')``, tensorflow_datasets copies read through
``tfds.data_source`` (array_record; tensorflow is not needed): ``glue/sst2``,
``glue/qqp`` and the project builder ``coulomb_rotten_tomatoes``
(``coulomb_jax.tfds_builders``, built from the MR files in a manual dir).
tensorflow_datasets is imported only then; nothing is downloaded unless
``download=True``.

Sanity and provenance:

* every split ``load_split`` produces goes through ``check_class_balance``: fewer
  than two classes, or a class below ``min_class_share`` (default 1%) of the
  split, raises one ValueError naming the file(s) and the class counts;
* files that are not valid UTF-8 (GLUE, QQP) and tokenizer files that do not
  parse raise a ValueError naming the file (and the line of the bad byte);
* ``source_files(task, data_dir)`` lists every file a task's loader reads and
  ``fingerprint(paths)`` hashes them (sha256); ``check_fingerprint(stored,
  current)`` names the files that changed since a run stored its fingerprint.

The pieces shared with ``tfds_builders`` (``Examples``, ``SPLITS``, the MR reader,
the class check) live in ``data_core`` and are re-exported here.
"""

import csv
import functools
import hashlib
import importlib
import io
import os
import tempfile
from typing import Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from coulomb_jax import _checks
from coulomb_jax import data_core
from coulomb_jax.data_core import (DEFAULT_MIN_CLASS_SHARE, SPLITS, TASKS, Examples,
                                   check_class_balance, read_rotten_tomatoes_files)

SOURCES = ('files', 'tfds')

SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
"""Ids 0..4 of a trained tokenizer; ``[PAD]`` is id 0 for every tokenizer here."""

_QQP_HEADER = ['id', 'qid1', 'qid2', 'question1', 'question2', 'is_duplicate']


class Encoded(NamedTuple):
  """``n`` token sequences, ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``."""
  ids: list[np.ndarray]       # n × [length_i] int32, length_i <= max_length
  segments: list[np.ndarray]  # n × [length_i] int32: 0 for [CLS] a [SEP], 1 for b [SEP]
  labels: np.ndarray          # [n] int32


# ----------------------------------------------------------------------------- loading


_require_file = data_core.require_file


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
  lines = data_core.read_text(path).split('\n')
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
  with io.StringIO(data_core.read_text(path), newline='') as f:
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
  """``coulomb_jax.tfds_builders``, imported only for ``source='tfds'``."""
  try:
    return importlib.import_module('coulomb_jax.tfds_builders')
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
  ``coulomb_rotten_tomatoes`` (``coulomb_jax.tfds_builders``), qqp_subset has no
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
      files = ', '.join(os.path.join(directory, f) for f in data_core.MR_FILES)
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
    names = [os.path.join('rotten_tomatoes', f) for f in data_core.MR_FILES]
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


# ----------------------------------------------------------------------------- tokenizer


def _bert_tokenizer(vocab: Optional[dict[str, int]]) -> tokenizers.Tokenizer:
  """An uncased BERT-style WordPiece pipeline (no post-processor, no padding).

  BertNormalizer lower-cases, strips accents (NFD, drop combining marks: as
  bert-base-uncased does), removes control characters and spaces out CJK
  characters; BertPreTokenizer splits on whitespace and punctuation.
  """
  model = models.WordPiece(vocab, unk_token='[UNK]', continuing_subword_prefix='##',
                           max_input_chars_per_word=100)
  tok = tokenizers.Tokenizer(model)
  tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                              strip_accents=True, lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix='##')
  if vocab is not None:
    tok.add_special_tokens(list(SPECIAL_TOKENS))
  return tok


def _check_special_tokens(tok: tokenizers.Tokenizer, source: str) -> None:
  missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
  if missing or tok.token_to_id('[PAD]') != 0:
    raise ValueError(f'{source} must hold the tokens {SPECIAL_TOKENS} with [PAD] = 0; '
                     f'missing {missing}, [PAD] = {tok.token_to_id("[PAD]")}.')


def _continuation_chars(tok: tokenizers.Tokenizer, texts: list[str]) -> list[str]:
  """The characters that occur after the first character of a pre-tokenized word.

  BertNormalizer maps all whitespace to ' ', so splitting its output on ' ' and
  pre-tokenizing the distinct pieces gives the same words, much faster.
  """
  pieces = set()
  for start in range(0, len(texts), 4096):
    pieces.update(tok.normalizer.normalize_str('\n'.join(texts[start:start + 4096])).split(' '))
  chars = set()
  for word, _ in tok.pre_tokenizer.pre_tokenize_str(' '.join(pieces)):
    chars.update(word[1:])
  return sorted(chars)


def train_tokenizer(texts: Iterable[str], vocab_size: int, *,
                    min_frequency: int = 2) -> tokenizers.Tokenizer:
  """An uncased WordPiece tokenizer trained on ``texts``; deterministic.

  ``tokenizers``' WordPiece trainer (BPE merges with a ``##`` prefix) numbers the
  ``##c`` continuation characters in hash order, and ties between merges follow
  those ids, so two runs on the same texts can give different vocabularies.
  Passing the sorted ``##c`` tokens up front (as extra special tokens of the
  trainer) fixes their ids and makes training deterministic; the returned
  tokenizer is rebuilt from the vocabulary, so only ``SPECIAL_TOKENS`` are special.
  The vocabulary holds at most ``vocab_size`` tokens, unless the special tokens
  and the characters alone are more; ``min_frequency`` is the least count of a merge.
  """
  texts = list(texts)
  if not texts:
    raise ValueError('texts must hold at least one text, got none.')
  vocab_size = _checks.check_int('vocab_size', vocab_size, len(SPECIAL_TOKENS) + 1)
  min_frequency = _checks.check_int('min_frequency', min_frequency, 0)
  tok = _bert_tokenizer(None)
  continuation = ['##' + c for c in _continuation_chars(tok, texts)]
  trainer = trainers.WordPieceTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency,
      special_tokens=list(SPECIAL_TOKENS) + continuation,
      continuing_subword_prefix='##', show_progress=False)
  tok.train_from_iterator(texts, trainer, length=len(texts))
  trained = _bert_tokenizer(tok.get_vocab(with_added_tokens=False))
  _check_special_tokens(trained, 'the trained vocabulary')
  return trained


def save_tokenizer(tok: tokenizers.Tokenizer, path: str) -> None:
  """Writes ``tok`` as ``tokenizers`` JSON, atomically (a temporary file, then rename)."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  with tempfile.NamedTemporaryFile('w', encoding='utf-8', dir=directory, delete=False,
                                   prefix='.tokenizer-', suffix='.tmp') as f:
    f.write(tok.to_str())
  os.replace(f.name, path)


def load_tokenizer(path: str) -> tokenizers.Tokenizer:
  """Reads a tokenizer written by ``save_tokenizer`` (checks ``[PAD]`` = 0)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'tokenizer file {path} not found.')
  try:
    tok = tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # pylint: disable=broad-except  (tokenizers raises plain Exception)
    reason = ' '.join(str(e).split())
    raise ValueError(f'tokenizer file {path} is not a valid tokenizers JSON file '
                     f'({reason}); delete it to retrain the tokenizer.') from None
  _check_special_tokens(tok, f'the tokenizer in {path}')
  return tok


def load_vocab_tokenizer(vocab_file: str) -> tokenizers.Tokenizer:
  """The uncased pipeline with a BERT ``vocab.txt`` (one token a line, id = line).

  With bert-base-uncased's vocab.txt this tokenizes like ``BertWordPieceTokenizer``
  (lowercase=True); the file must hold ``SPECIAL_TOKENS`` with ``[PAD]`` first.
  """
  if not os.path.isfile(vocab_file):
    raise FileNotFoundError(f'vocab_file {vocab_file} not found.')
  try:
    vocab = models.WordPiece.read_file(vocab_file)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'vocab_file {vocab_file} is not a readable vocab.txt '
                     f'({" ".join(str(e).split())}).') from None
  tok = _bert_tokenizer(vocab)
  _check_special_tokens(tok, f'vocab_file {vocab_file}')
  return tok


# ----------------------------------------------------------------------------- encoding


def _pair_lengths(len_a: np.ndarray, len_b: np.ndarray, budget: int):
  """BERT's longest-first truncation in closed form.

  BERT pops the last token of ``a`` while ``len(a) > len(b)``, else of ``b``, until
  ``len(a) + len(b) <= budget``. So a short side (≤ budget / 2) is kept whole and
  the long side cut to fill the budget; otherwise a keeps ⌈budget/2⌉ and b ⌊budget/2⌋.
  """
  short_side = 2 * np.minimum(len_a, len_b) <= budget
  a_shorter = len_a <= len_b
  cut_a = np.where(short_side, np.where(a_shorter, len_a, budget - len_b), (budget + 1) // 2)
  cut_b = np.where(short_side, np.where(a_shorter, budget - len_a, len_b), budget // 2)
  fits = len_a + len_b <= budget
  return np.where(fits, len_a, cut_a), np.where(fits, len_b, cut_b)


def encode(tok: tokenizers.Tokenizer, examples: Examples, max_length: int) -> Encoded:
  """``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` ids, truncated to ``max_length``.

  Pairs are truncated longest first (as BERT); the final ``[SEP]`` is always kept.
  ``tok`` must have no padding or truncation set (they would change the ids).
  """
  pair = examples.text_b is not None
  max_length = _checks.check_int('max_length', max_length, 3 if pair else 2)
  n = len(examples.text_a)
  if len(examples.labels) != n or (pair and len(examples.text_b) != n):
    raise ValueError(
        f'examples must have one label (and text_b) per text_a: {n} text_a, '
        f'{len(examples.labels)} labels, '
        f'{None if not pair else len(examples.text_b)} text_b.')
  if tok.padding is not None or tok.truncation is not None:
    raise ValueError(f'tok must have no padding or truncation set, got padding='
                     f'{tok.padding}, truncation={tok.truncation}.')
  _check_special_tokens(tok, 'tok')
  cls, sep = tok.token_to_id('[CLS]'), tok.token_to_id('[SEP]')

  def token_ids(texts):
    return [e.ids for e in tok.encode_batch_fast(list(texts), add_special_tokens=False)]

  ids_a = token_ids(examples.text_a)
  len_a = np.array([len(x) for x in ids_a], np.int64)
  if not pair:
    keep_a = np.minimum(len_a, max_length - 2)
    ids = [np.array([cls] + a[:k] + [sep], np.int32) for a, k in zip(ids_a, keep_a.tolist())]
    segments = [np.zeros(len(x), np.int32) for x in ids]
    return Encoded(ids, segments, np.asarray(examples.labels, np.int32))
  ids_b = token_ids(examples.text_b)
  len_b = np.array([len(x) for x in ids_b], np.int64)
  keep_a, keep_b = _pair_lengths(len_a, len_b, max_length - 3)
  ids, segments = [], []
  for a, b, ka, kb in zip(ids_a, ids_b, keep_a.tolist(), keep_b.tolist()):
    ids.append(np.array([cls] + a[:ka] + [sep] + b[:kb] + [sep], np.int32))
    seg = np.ones(ka + kb + 3, np.int32)
    seg[:ka + 2] = 0
    segments.append(seg)
  return Encoded(ids, segments, np.asarray(examples.labels, np.int32))


# ----------------------------------------------------------------------------- batching


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
