"""Tests of coulomb_jax.tasks.data: splits, tokenizer, encoding, batches.

The split tests read the offline data copy (``COULOMB_DATA_DIR``, by default
``../shared/data`` next to the repository) and are skipped when it is missing.
"""

import collections
import os

import numpy as np
import pytest

from coulomb_jax.tasks import data
from coulomb_jax.tasks.data import tokenizer

DATA_DIR = os.environ.get(
    'COULOMB_DATA_DIR',
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '..', '..', 'shared', 'data'))
QQP_KSHOT = os.path.join(DATA_DIR, 'glue', 'QQP', 'k-shot')

# A corpus that needs no data files, for the tokenizer and encoding tests.
CORPUS = [
    'the cat sat on the mat .', 'the dog sat on the log .', 'cats and dogs are playing',
    'a playful cat is playing with a ball', 'dogs love playing outside',
    'the movie was unbelievably good', 'the film was not good at all',
    'an unforgettable , charming movie', 'playing , played , plays , player',
] * 3


@pytest.fixture(scope='module')
def data_dir():
  if not os.path.isdir(DATA_DIR):
    pytest.skip(f'offline data not found at {DATA_DIR} (set COULOMB_DATA_DIR).')
  return DATA_DIR


@pytest.fixture(scope='module')
def tok():
  return data.train_tokenizer(CORPUS, 200, min_frequency=1)


# ----------------------------------------------------------------------------- splits


@pytest.mark.parametrize('task,sizes,pairs', [
    ('sst2', (66349, 1000, 872), False),
    ('rotten_tomatoes', (8530, 1066, 1066), False),
    ('qqp_subset', (8917, 1000, 9928), True),
])
def test_split_sizes_and_types(data_dir, task, sizes, pairs):
  for split, size in zip(data.SPLITS, sizes):
    ex = data.load_split(task, data_dir, split)
    assert len(ex.text_a) == len(ex.labels) == size
    assert (ex.text_b is not None) == pairs
    if pairs:
      assert len(ex.text_b) == size
    assert ex.labels.dtype == np.int32 and set(np.unique(ex.labels)) == {0, 1}
    # Label balance: between 45% and 60% positive in every split of these tasks.
    assert 0.45 < ex.labels.mean() < 0.6, (split, ex.labels.mean())
    assert all(ex.text_a) and (pairs or all(t == t.strip() for t in ex.text_a))


def test_rotten_tomatoes_hugging_face_rule(data_dir):
  first = {
      'train': 'the rock is destined to be the 21st century\'s new " conan "',
      'validation': 'compassionately explores the seemingly irreconcilable situation',
      'test': 'lovingly photographed in the manner of a golden book sprung to life',
  }
  for split, start in first.items():
    ex = data.load_split('rotten_tomatoes', data_dir, split)
    assert ex.text_a[0].startswith(start)
    half = len(ex.labels) // 2   # Positives first, then negatives.
    np.testing.assert_array_equal(ex.labels, [1] * half + [0] * half)
  train = data.load_split('rotten_tomatoes', data_dir, 'train')
  test = data.load_split('rotten_tomatoes', data_dir, 'test')
  assert not set(train.text_a) & set(test.text_a)


def test_sst2_train_validation_partition_train_tsv(data_dir):
  train = data.load_split('sst2', data_dir, 'train')
  val = data.load_split('sst2', data_dir, 'validation')
  with open(os.path.join(data_dir, 'glue', 'SST-2', 'train.tsv'), encoding='utf-8') as f:
    rows = [line.split('\t') for line in f.read().split('\n')[1:] if line]
  file_rows = sorted((s.strip(), int(y)) for s, y in rows)
  assert sorted(zip(train.text_a + val.text_a,
                    train.labels.tolist() + val.labels.tolist())) == file_rows
  # The data README's label counts: train.tsv 37,569 positive, dev.tsv 444 of 872.
  assert int(train.labels.sum() + val.labels.sum()) == 37569
  test = data.load_split('sst2', data_dir, 'test')
  assert int(test.labels.sum()) == 444
  assert test.text_a[0] == "it 's a charming and often affecting journey ."


def test_validation_carving_is_deterministic_and_seeded(data_dir):
  a = data.load_split('qqp_subset', data_dir, 'validation')
  b = data.load_split('qqp_subset', data_dir, 'validation')
  c = data.load_split('qqp_subset', data_dir, 'validation', validation_seed=1)
  assert a.text_a == b.text_a and a.text_b == b.text_b
  np.testing.assert_array_equal(a.labels, b.labels)
  assert a.text_a != c.text_a
  train = data.load_split('qqp_subset', data_dir, 'train', validation_size=500)
  val = data.load_split('qqp_subset', data_dir, 'validation', validation_size=500)
  assert (len(train.labels), len(val.labels)) == (9417, 500)
  assert not set(zip(train.text_a, train.text_b)) & set(zip(val.text_a, val.text_b))
  # The data README's label counts: train_10k.utf8 4,973 duplicates, heldout 4,980.
  assert int(train.labels.sum() + val.labels.sum()) == 4973
  assert int(data.load_split('qqp_subset', data_dir, 'test').labels.sum()) == 4980


def test_qqp_subset_unquotes_fields(data_dir):
  ex = data.load_split('qqp_subset', data_dir, 'train', validation_size=0)
  texts = ex.text_a + ex.text_b
  assert not any('""' in t for t in texts)
  assert "What is that 80's song that has a chorus of \"woah oh oh oh\"?" in texts


# ----------------------------------------------------------------------------- GLUE QQP


def _glue_qqp_fixture(root):
  """glue/QQP/{train,dev}.tsv in GLUE format, from the real k-shot GLUE rows."""
  def lines(name):
    with open(os.path.join(QQP_KSHOT, name), encoding='utf-8') as f:
      return f.read().split('\n')
  qqp = root / 'glue' / 'QQP'
  qqp.mkdir(parents=True)
  train = lines('16-21/train.tsv')[:-1] + lines('16-13/train.tsv')[1:]
  (qqp / 'train.tsv').write_text('\n'.join(train), encoding='utf-8')
  (qqp / 'dev.tsv').write_text('\n'.join(lines('16-21/dev.tsv')), encoding='utf-8')
  return qqp


def test_qqp_glue_format(data_dir, tmp_path):
  _glue_qqp_fixture(tmp_path)
  test = data.load_split('qqp', str(tmp_path), 'test')
  assert len(test.labels) == 32 and int(test.labels.sum()) == 16
  assert 'How do I use "lest" in a sentence?' in test.text_b
  train = data.load_split('qqp', str(tmp_path), 'train', validation_size=10)
  val = data.load_split('qqp', str(tmp_path), 'validation', validation_size=10)
  assert (len(train.labels), len(val.labels)) == (54, 10)
  assert not set(train.text_a) & set(val.text_a)
  lyrics = 'What is the song with the lyrics "Let me tell you about my best friend"?'
  assert lyrics in train.text_a + val.text_a
  with pytest.raises(ValueError, match='validation_size'):
    data.load_split('qqp', str(tmp_path), 'train', validation_size=64)


def test_qqp_malformed_files(data_dir, tmp_path):
  qqp = _glue_qqp_fixture(tmp_path)
  text = (qqp / 'dev.tsv').read_text(encoding='utf-8')
  (qqp / 'dev.tsv').write_text(text.replace('qid1', 'qid_1', 1), encoding='utf-8')
  with pytest.raises(ValueError, match='header'):
    data.load_split('qqp', str(tmp_path), 'test')
  (qqp / 'dev.tsv').write_text(text + '1\t2\t3\tonly four\n', encoding='utf-8')
  with pytest.raises(ValueError, match='expected 6 fields'):
    data.load_split('qqp', str(tmp_path), 'test')


def test_qqp_missing_names_path_and_subset(tmp_path):
  with pytest.raises(FileNotFoundError, match='qqp_subset') as info:
    data.load_split('qqp', str(tmp_path), 'train')
  assert os.path.join(str(tmp_path), 'glue/QQP/train.tsv') in str(info.value)


# ----------------------------------------------------------------------------- bad input


def test_sentence_split_holds_out_whole_sentences_and_only_their_phrases():
  # Two "parse trees" as GLUE keeps them: sentences and their deduplicated phrases.
  texts = ['a great film', 'a great', 'great film', 'great', 'film',
           'a dull plot', 'dull plot', 'dull', 'plot', 'a',
           'the end', 'the', 'end']
  train, val = data.sentence_split(texts, 1, validation_seed=0)
  sentences = {'a great film', 'a dull plot', 'the end'}
  (held,) = [texts[i] for i in val]
  assert held in sentences
  kept = {texts[i] for i in train}
  assert held not in kept and kept | {held} <= set(texts)
  # What stays: exactly the spans of the other two sentences ("a" is shared, so it stays).
  others = sentences - {held}
  spans = {' '.join(s.split()[i:j]) for s in others
           for i in range(len(s.split())) for j in range(i + 1, len(s.split()) + 1)}
  assert kept == spans & set(texts)
  assert 'a' in kept
  np.testing.assert_array_equal(train, np.sort(train))
  with pytest.raises(ValueError, match='validation_size must be < the 3 sentences'):
    data.sentence_split(texts, 3)


def test_sst2_sentence_rule_on_the_real_file(data_dir):
  val = data.load_split('sst2', data_dir, 'validation', validation_rule='sentences')
  train = data.load_split('sst2', data_dir, 'train', validation_rule='sentences')
  assert len(val.labels) == 1000
  joined = '\n'.join(' ' + t + ' ' for t in train.text_a)
  assert not any(' ' + t + ' ' in joined for t in val.text_a[:100])   # no row inside train
  with pytest.raises(ValueError, match="validation_rule='sentences' is for sst2"):
    data.load_split('rotten_tomatoes', data_dir, 'validation', validation_rule='sentences')


def test_bad_arguments_raise_before_reading():
  with pytest.raises(ValueError, match="task.*'sst-2'"):
    data.load_split('sst-2', '/nonexistent', 'train')
  with pytest.raises(ValueError, match="split.*'dev'"):
    data.load_split('sst2', '/nonexistent', 'dev')
  with pytest.raises(ValueError, match='validation_size'):
    data.load_split('sst2', '/nonexistent', 'train', validation_size=-1)
  with pytest.raises(FileNotFoundError, match='/nonexistent/glue/SST-2/dev.tsv'):
    data.load_split('sst2', '/nonexistent', 'test')
  with pytest.raises(FileNotFoundError, match='rt-polarity.pos'):
    data.load_split('rotten_tomatoes', '/nonexistent', 'test')


# ----------------------------------------------------------------------------- data sanity


def _mr_files(root, num_pos, num_neg=400):
  """rotten_tomatoes/rt-polarity.{pos,neg} with synthetic sentences."""
  directory = root / 'rotten_tomatoes'
  directory.mkdir(parents=True, exist_ok=True)
  for name, num in (('rt-polarity.pos', num_pos), ('rt-polarity.neg', num_neg)):
    (directory / name).write_text(''.join(f'{name[-3:]} sentence {i} .\n' for i in range(num)),
                                  encoding='latin-1')
  return directory


def test_one_class_or_truncated_rotten_tomatoes_is_refused_naming_files_and_counts(tmp_path):
  directory = _mr_files(tmp_path, 400)
  ok = data.load_split('rotten_tomatoes', str(tmp_path), 'train')
  assert np.bincount(ok.labels).tolist() == [320, 320]
  pos = os.path.join(str(directory), 'rt-polarity.pos')
  _mr_files(tmp_path, 0)                                         # empty positives
  for split in data.SPLITS:
    with pytest.raises(ValueError, match=r"rotten_tomatoes '%s' split of .*rt-polarity\.pos.*"
                       r'class counts \{0: \d+, 1: 0\}.*class 1 is missing' % split):
      data.load_split('rotten_tomatoes', str(tmp_path), split)
  _mr_files(tmp_path, 3)                                         # truncated: 2 of 322 train rows
  with pytest.raises(ValueError, match=r'class counts \{0: 320, 1: 2\} \(322 rows\): '
                     r'class 1 holds 0\.62%'):
    data.load_split('rotten_tomatoes', str(tmp_path), 'train')
  assert len(data.load_split('rotten_tomatoes', str(tmp_path), 'train',
                             min_class_share=0.005).labels) == 322
  assert len(data.load_split('rotten_tomatoes', str(tmp_path), 'train',
                             min_class_share=None).labels) == 322
  assert pos in data.source_files('rotten_tomatoes', str(tmp_path))


@pytest.mark.parametrize('labels, match', [
    ([], r'class counts \{0: 0, 1: 0\} \(0 rows\): classes \[0, 1\] are missing'),
    ([1, 1, 1], r'class counts \{0: 0, 1: 3\} \(3 rows\): class 0 is missing'),
    ([0] * 199 + [1], r'class counts \{0: 199, 1: 1\} \(200 rows\): class 1 holds 0\.50%'),
])
def test_check_class_balance(labels, match):
  with pytest.raises(ValueError, match='^f.tsv: ' + match):
    data.check_class_balance(np.array(labels, np.int32), 'f.tsv')
  assert data.check_class_balance([0] * 99 + [1], 'f.tsv') == {0: 99, 1: 1}


def test_non_utf8_glue_file_names_the_file_and_line(tmp_path):
  sst2 = tmp_path / 'glue' / 'SST-2'
  sst2.mkdir(parents=True)
  (sst2 / 'dev.tsv').write_bytes(b'sentence\tlabel\ngood\t1\nbad \xff\t0\n')
  path = os.path.join(str(tmp_path), 'glue/SST-2/dev.tsv')
  with pytest.raises(ValueError, match=f'^{path}:3: not valid UTF-8: byte 0xff at offset 26'):
    data.load_split('sst2', str(tmp_path), 'test')
  subset = tmp_path / 'glue' / 'QQP' / 'quora-pairs-20k'
  subset.mkdir(parents=True)
  (subset / 'heldout_10k.utf8.tsv').write_bytes(b'1\ta?\tb?\t0\n0\t\xc3(\tc\t1\n')
  with pytest.raises(ValueError, match=r'heldout_10k\.utf8\.tsv:2: not valid UTF-8'):
    data.load_split('qqp_subset', str(tmp_path), 'test')


def test_source_files_fingerprint_and_check(tmp_path):
  _mr_files(tmp_path, 400)
  files = data.source_files('rotten_tomatoes', str(tmp_path))
  assert [os.path.basename(f) for f in files] == ['rt-polarity.neg', 'rt-polarity.pos']
  assert data.source_files('sst2', '/d') == ['/d/glue/SST-2/dev.tsv', '/d/glue/SST-2/train.tsv']
  before = data.fingerprint(files, root=str(tmp_path))
  assert list(before) == ['rotten_tomatoes/rt-polarity.neg', 'rotten_tomatoes/rt-polarity.pos']
  import hashlib  # pylint: disable=import-outside-toplevel
  with open(files[0], 'rb') as f:
    assert before['rotten_tomatoes/rt-polarity.neg'] == hashlib.sha256(f.read()).hexdigest()
  data.check_fingerprint(before, data.fingerprint(files, root=str(tmp_path)))   # unchanged
  _mr_files(tmp_path, 399)                                       # one positive line fewer
  after = data.fingerprint(files, root=str(tmp_path))
  assert data.changed_files(before, after) == ['rotten_tomatoes/rt-polarity.pos']
  with pytest.raises(ValueError, match=r'the data changed since this fingerprint was stored: '
                     r'rotten_tomatoes/rt-polarity\.pos \(sha256 [0-9a-f]{12}… now '
                     r'[0-9a-f]{12}…\)\.$'):
    data.check_fingerprint(before, after)
  with pytest.raises(ValueError, match=r'x\.json \(sha256 missing now'):
    data.check_fingerprint(before, dict(before, **{'x.json': '0' * 64}))
  with pytest.raises(FileNotFoundError, match=r'rt-polarity\.neg\.zip not found'):
    data.fingerprint([files[0], files[0] + '.zip'])


# ----------------------------------------------------------------------------- tokenizer


def test_corrupt_tokenizer_file_names_the_file(tok, tmp_path):
  path = str(tmp_path / 'tokenizer.json')
  data.save_tokenizer(tok, path)
  with open(path, encoding='utf-8') as f:
    text = f.read()
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text[:len(text) // 2])                              # truncated, as by a crash
  with pytest.raises(ValueError, match=f'^tokenizer file {path} is not a valid tokenizers '
                     r'JSON file \(.*\); delete it'):
    data.load_tokenizer(path)


def test_tokenizer_special_tokens_and_uncased(tok):
  assert [tok.token_to_id(t) for t in data.SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
  assert tok.encode('Hello CATS, Café').ids == tok.encode('hello cats, cafe').ids
  assert tok.encode('playing').tokens == ['playing']
  assert tok.encode('[CLS]').ids == [2]
  assert len(tok.get_vocab()) <= 200


def test_tokenizer_training_is_deterministic(data_dir):
  # The bare tokenizers trainer gives different vocabularies here from run to run.
  texts = data.load_split('sst2', data_dir, 'test').text_a * 2
  vocabs = [data.train_tokenizer(texts, 1000).get_vocab() for _ in range(3)]
  assert vocabs[0] == vocabs[1] == vocabs[2]
  assert len(vocabs[0]) == 1000


def test_tokenizer_save_load_round_trip(tok, tmp_path):
  path = tmp_path / 'sub' / 'tokenizer.json'
  data.save_tokenizer(tok, str(path))
  assert os.listdir(path.parent) == ['tokenizer.json']   # no temporary file left
  loaded = data.load_tokenizer(str(path))
  assert loaded.get_vocab() == tok.get_vocab()
  for text in CORPUS[:9] + ['Unseen WORDS, zebra!']:
    assert loaded.encode(text).ids == tok.encode(text).ids
  with pytest.raises(FileNotFoundError, match='missing.json'):
    data.load_tokenizer(str(tmp_path / 'missing.json'))


def test_load_vocab_tokenizer(tmp_path):
  vocab = list(data.SPECIAL_TOKENS) + ['the', 'cat', 'sat', '##s', '.', 'un', '##aff']
  path = tmp_path / 'vocab.txt'
  path.write_text('\n'.join(vocab) + '\n', encoding='utf-8')
  tok = data.load_vocab_tokenizer(str(path))
  tokens = tok.encode('The CATS sat. Unaff').tokens
  assert tokens == ['the', 'cat', '##s', 'sat', '.', 'un', '##aff']
  assert tok.encode('dog').ids == [1]
  path.write_text('\n'.join(vocab[1:]) + '\n', encoding='utf-8')
  with pytest.raises(ValueError, match=r'\[PAD\]'):
    data.load_vocab_tokenizer(str(path))
  with pytest.raises(FileNotFoundError):
    data.load_vocab_tokenizer(str(tmp_path / 'nope.txt'))


def test_train_tokenizer_bad_arguments():
  with pytest.raises(ValueError, match='vocab_size'):
    data.train_tokenizer(CORPUS, 3)
  with pytest.raises(ValueError, match='texts'):
    data.train_tokenizer([], 100)


# ----------------------------------------------------------------------------- encode


def _examples(text_a, text_b=None):
  return data.Examples(list(text_a), None if text_b is None else list(text_b),
                       np.arange(len(text_a), dtype=np.int32) % 2)


def test_encode_single(tok):
  texts = CORPUS[:4] + ['Dogs', '']
  enc = data.encode(tok, _examples(texts), max_length=6)
  for text, ids, seg in zip(texts, enc.ids, enc.segments):
    body = tok.encode(text).ids
    np.testing.assert_array_equal(ids, [2] + body[:4] + [3])
    assert ids.dtype == np.int32 and seg.dtype == np.int32 and not seg.any()
  assert [len(x) for x in enc.ids] == [6, 6, 6, 6, 3, 2]
  np.testing.assert_array_equal(enc.labels, [0, 1, 0, 1, 0, 1])
  assert enc.labels.dtype == np.int32
  with pytest.raises(ValueError, match='max_length'):
    data.encode(tok, _examples(texts), max_length=1)


def _bert_truncate(len_a, len_b, budget):
  while len_a + len_b > budget:
    if len_a > len_b:
      len_a -= 1
    else:
      len_b -= 1
  return len_a, len_b


def test_pair_truncation_matches_bert_longest_first():
  la, lb = np.meshgrid(np.arange(13), np.arange(13))
  la, lb = la.ravel(), lb.ravel()
  for budget in range(16):
    got_a, got_b = tokenizer._pair_lengths(la, lb, budget)
    want = [_bert_truncate(a, b, budget) for a, b in zip(la.tolist(), lb.tolist())]
    assert list(zip(got_a.tolist(), got_b.tolist())) == want, budget


def test_encode_pair_format_and_truncation(tok):
  a, b = 'the cat sat on the mat .', 'dogs love playing'
  ea, eb = tok.encode(a).ids, tok.encode(b).ids
  enc = data.encode(tok, _examples([a], [b]), max_length=64)
  np.testing.assert_array_equal(enc.ids[0], [2] + ea + [3] + eb + [3])
  np.testing.assert_array_equal(enc.segments[0], [0] * (len(ea) + 2) + [1] * (len(eb) + 1))
  # max_length 8: budget 5; b (3 tokens) is the longer side only at the end.
  enc = data.encode(tok, _examples([a], [b]), max_length=8)
  ka, kb = _bert_truncate(len(ea), len(eb), 5)
  np.testing.assert_array_equal(enc.ids[0], [2] + ea[:ka] + [3] + eb[:kb] + [3])
  np.testing.assert_array_equal(enc.segments[0], [0] * (ka + 2) + [1] * (kb + 1))
  assert len(enc.ids[0]) == 8 and enc.ids[0][-1] == 3
  enc = data.encode(tok, _examples([a], ['']), max_length=3)
  np.testing.assert_array_equal(enc.ids[0], [2, 3, 3])
  with pytest.raises(ValueError, match='max_length'):
    data.encode(tok, _examples([a], [b]), max_length=2)


def test_encode_on_real_pairs(data_dir):
  ex = data.load_split('qqp_subset', data_dir, 'validation')
  tok = data.train_tokenizer(ex.text_a + ex.text_b, 2000)
  enc = data.encode(tok, ex, max_length=32)
  assert len(enc.ids) == 1000 and max(len(x) for x in enc.ids) == 32
  for ids, seg in zip(enc.ids, enc.segments):
    assert ids[0] == 2 and ids[-1] == 3 and (ids == 3).sum() >= 2 and (ids != 0).all()
    first_sep = int(np.argmax(ids == 3))
    assert not seg[:first_sep + 1].any() and seg[first_sep + 1:].all()


# ----------------------------------------------------------------------------- batches


def _synthetic_encoded(n=203, seed=0):
  """Example i's first token is i + 5, so batches can be traced back to examples."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, 41, n)
  ids = [np.concatenate([[i + 5], rng.integers(5, 100, k - 1)]).astype(np.int32)
         for i, k in enumerate(lengths)]
  segments = [(np.arange(k) >= k // 2).astype(np.int32) for k in lengths]
  return data.Encoded(ids, segments, rng.integers(0, 2, n).astype(np.int32))


def _check_batch(batch, enc, batch_size, pad_multiple):
  """Returns the example indices of the real rows."""
  ids, mask = batch['ids'], batch['mask']
  assert ids.shape[0] == batch_size and ids.shape[1] % pad_multiple == 0
  assert batch['segments'].shape == ids.shape and mask.shape == ids.shape
  assert ids.dtype == np.int32 and batch['segments'].dtype == np.int32
  assert mask.dtype == bool and batch['labels'].dtype == np.int32
  assert batch['weights'].dtype == np.float32 and batch['labels'].shape == (batch_size,)
  real = batch['weights'] == 1
  assert set(np.unique(batch['weights'])) <= {0.0, 1.0}
  assert not ids[~real].any() and not mask[~real].any() and not batch['labels'][~real].any()
  longest = mask.sum(1).max()
  assert ids.shape[1] - pad_multiple < longest <= ids.shape[1]
  index = (ids[real, 0] - 5).tolist()
  for row, i in zip(np.flatnonzero(real), index):
    k = len(enc.ids[i])
    assert mask[row, :k].all() and not mask[row, k:].any()
    np.testing.assert_array_equal(ids[row, :k], enc.ids[i])
    np.testing.assert_array_equal(batch['segments'][row, :k], enc.segments[i])
    assert not ids[row, k:].any() and batch['labels'][row] == enc.labels[i]
  return index


def test_eval_batches_keep_order_and_pad_last_batch():
  enc = _synthetic_encoded()
  out = list(data.batches(enc, 32))
  assert len(out) == data.num_batches(203, 32, False) == 7
  order = [i for b in out for i in _check_batch(b, enc, 32, 16)]
  assert order == list(range(203))
  assert out[-1]['weights'].sum() == 203 - 6 * 32


@pytest.mark.parametrize('drop_remainder', [False, True])
def test_shuffled_batches_cover_each_example_once(drop_remainder):
  enc = _synthetic_encoded()
  out = list(data.batches(enc, 16, seed=3, epoch=0, pad_multiple=8, bucket_size=4,
                          drop_remainder=drop_remainder))
  assert len(out) == data.num_batches(203, 16, drop_remainder)
  seen = [i for b in out for i in _check_batch(b, enc, 16, 8)]
  counts = collections.Counter(seen)
  assert max(counts.values()) == 1
  assert len(seen) == (203 - 203 % 16 if drop_remainder else 203)
  assert seen != sorted(seen)
  # Each batch says which rows it holds, and batch_indices gives the same rows.
  rows = data.batch_indices([len(x) for x in enc.ids], 16, seed=3, epoch=0, bucket_size=4,
                            drop_remainder=drop_remainder)
  for b, r in zip(out, rows, strict=True):
    np.testing.assert_array_equal(b['index'][b['weights'] > 0], r)
    assert (b['index'][b['weights'] == 0] == -1).all()


def test_shuffle_is_deterministic_per_seed_and_epoch():
  enc = _synthetic_encoded()

  def order(seed, epoch):
    return [b['ids'][:, 0].tolist() for b in data.batches(enc, 16, seed=seed, epoch=epoch)]

  assert order(0, 0) == order(0, 0)
  assert order(0, 1) != order(0, 0)
  assert order(1, 0) != order(0, 0)


def test_length_bucketing():
  """With one bucket for the whole epoch, batches hold consecutive lengths."""
  enc = _synthetic_encoded()
  out = list(data.batches(enc, 16, seed=0, bucket_size=13, pad_multiple=1))
  ranges = sorted((b['mask'][b['weights'] == 1].sum(1).min(),
                   b['mask'][b['weights'] == 1].sum(1).max()) for b in out)
  assert all(hi <= lo_next for (_, hi), (lo_next, _) in zip(ranges, ranges[1:]))
  padded = sum(b['mask'].size for b in out)
  unbucketed = sum(b['mask'].size for b in data.batches(enc, 16, seed=0, bucket_size=1,
                                                        pad_multiple=1))
  assert padded < unbucketed


def test_num_batches_and_bad_arguments():
  assert [data.num_batches(n, 4, d) for n in (0, 3, 4, 5) for d in (False, True)] == [
      0, 0, 1, 0, 1, 1, 2, 1]
  enc = _synthetic_encoded(n=5)
  assert list(data.batches(enc._replace(ids=[], segments=[], labels=enc.labels[:0]), 4)) == []
  for kwargs, name in (({'batch_size': 0}, 'batch_size'), ({'pad_multiple': 0}, 'pad_multiple'),
                       ({'seed': -1}, 'seed'), ({'epoch': -1}, 'epoch'),
                       ({'bucket_size': 0}, 'bucket_size')):
    kwargs = {'batch_size': 4, **kwargs}
    with pytest.raises(ValueError, match=name):
      data.batches(enc, **kwargs)   # raised on the call, not on iteration
  with pytest.raises(ValueError, match='labels'):
    data.batches(enc._replace(labels=enc.labels[:3]), 4)
