"""The uncased WordPiece tokenizer and ``encode``: texts to BERT-style id sequences.

``train_tokenizer`` (deterministic, on a task's training texts), ``save_tokenizer`` /
``load_tokenizer`` (``tokenizers`` JSON), ``load_vocab_tokenizer`` (a BERT
``vocab.txt``), and ``encode``: ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` ids and
segments, pairs truncated longest first as BERT does.
"""

import os
import tempfile
from typing import Iterable, NamedTuple, Optional

import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from coulomb_jax import _checks
from coulomb_jax.tasks.data.core import Examples

SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
"""Ids 0..4 of a trained tokenizer; ``[PAD]`` is id 0 for every tokenizer here."""


class Encoded(NamedTuple):
  """``n`` token sequences, ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``."""
  ids: list[np.ndarray]       # n × [length_i] int32, length_i <= max_length
  segments: list[np.ndarray]  # n × [length_i] int32: 0 for [CLS] a [SEP], 1 for b [SEP]
  labels: np.ndarray          # [n] int32


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

