"""Tests of the tensorflow_datasets source: ``coulomb_jax.tasks.data.tfds_builders`` and
``data.load_split(..., source='tfds')``, all without tensorflow or network.

The argument tests need neither tensorflow_datasets nor data; the others skip
without tensorflow_datasets, and the Rotten Tomatoes ones without the offline MR
files (``COULOMB_DATA_DIR``, as in test_data.py). Datasets are built in tmp dirs.
"""

import os
import socket
import sys

import numpy as np
import pytest

from coulomb_jax.tasks import data

DATA_DIR = os.environ.get(
    'COULOMB_DATA_DIR',
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '..', '..', 'shared', 'data'))
MR_DIR = os.path.join(DATA_DIR, 'rotten_tomatoes')


@pytest.fixture(scope='module')
def builders():
  pytest.importorskip('tensorflow_datasets')
  from coulomb_jax.tasks.data import tfds_builders  # pylint: disable=import-outside-toplevel
  return tfds_builders


@pytest.fixture(scope='module')
def rt_tfds_dir(builders, tmp_path_factory):
  """A tfds data dir with coulomb_rotten_tomatoes built from the MR files."""
  if not all(os.path.isfile(os.path.join(MR_DIR, f))
             for f in ('rt-polarity.pos', 'rt-polarity.neg')):
    pytest.skip(f'MR files not found in {MR_DIR} (set COULOMB_DATA_DIR).')
  tfds_dir = str(tmp_path_factory.mktemp('tfds'))
  builders.prepare_rotten_tomatoes(MR_DIR, tfds_dir)
  return tfds_dir


# ----------------------------------------------------------------------------- arguments


def test_bad_source_raises_before_reading():
  with pytest.raises(ValueError, match='source must be one of'):
    data.load_split('sst2', '/nonexistent', 'test', source='hub')
  with pytest.raises(ValueError, match="'qqp_subset' has no tfds copy"):
    data.load_split('qqp_subset', '/nonexistent', 'test', source='tfds')
  with pytest.raises(TypeError, match='download must be a bool'):
    data.load_split('sst2', '/nonexistent', 'test', source='tfds', download='no')


def test_missing_tfds_names_the_pip_package(monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)  # Import fails.
  monkeypatch.delitem(sys.modules, 'coulomb_jax.tasks.data.tfds_builders', raising=False)
  with pytest.raises(ImportError, match='pip install tensorflow-datasets'):
    data.load_split('sst2', '/nonexistent', 'test', source='tfds')


def test_files_source_does_not_import_tfds(monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)
  with pytest.raises(FileNotFoundError):  # The files path, as before.
    data.load_split('rotten_tomatoes', '/nonexistent', 'test')


# ----------------------------------------------------------------------------- rotten tomatoes


def test_rotten_tomatoes_builder_matches_files(builders, rt_tfds_dir):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  assert 'tensorflow' not in sys.modules
  builder = tfds.builder('coulomb_rotten_tomatoes', data_dir=rt_tfds_dir)
  assert builder.info.file_format.value == 'array_record'
  assert builder.info.features['label'].names == ['neg', 'pos']
  sizes = {'train': 8530, 'validation': 1066, 'test': 1066}
  for split, size in sizes.items():
    assert builder.info.splits[split].num_examples == size
    source = tfds.data_source('coulomb_rotten_tomatoes', split=split, data_dir=rt_tfds_dir,
                              download=False)
    assert len(source) == size
    files = data.load_split('rotten_tomatoes', DATA_DIR, split)
    for i in (0, size // 2 - 1, size // 2, size - 1):  # First/last positive, negative.
      row = source[i]
      assert row['text'].decode('utf-8') == files.text_a[i]
      assert row['label'] == files.labels[i]


def test_load_split_tfds_rotten_tomatoes_equals_files(rt_tfds_dir):
  for split in data.SPLITS:
    files = data.load_split('rotten_tomatoes', DATA_DIR, split)
    ex = data.load_split('rotten_tomatoes', DATA_DIR, split, source='tfds',
                         tfds_data_dir=rt_tfds_dir)
    assert ex.text_a == files.text_a and ex.text_b is None
    assert ex.labels.dtype == np.int32
    np.testing.assert_array_equal(ex.labels, files.labels)


def test_tfds_source_files_are_the_prepared_copy_and_fingerprint(builders, rt_tfds_dir,
                                                                tmp_path):
  files = data.source_files('rotten_tomatoes', DATA_DIR, source='tfds',
                            tfds_data_dir=rt_tfds_dir)
  assert files == sorted(files) and any(f.endswith('dataset_info.json') for f in files)
  assert any('array_record' in os.path.basename(f) for f in files)
  assert all(os.path.commonpath([f, rt_tfds_dir]) == rt_tfds_dir for f in files)
  prints = data.fingerprint(files, root=rt_tfds_dir)
  assert len(prints) == len(files) and all(len(h) == 64 for h in prints.values())
  with pytest.raises(FileNotFoundError, match='not prepared'):
    data.source_files('rotten_tomatoes', DATA_DIR, source='tfds', tfds_data_dir=str(tmp_path))


def test_load_split_tfds_rotten_tomatoes_not_prepared(builders, tmp_path):
  with pytest.raises(FileNotFoundError, match='not prepared.*download=True'):
    data.load_split('rotten_tomatoes', DATA_DIR, 'test', source='tfds',
                    tfds_data_dir=str(tmp_path))
  assert not (tmp_path / 'coulomb_rotten_tomatoes' / '1.0.0').exists()  # Nothing built.


def test_load_split_tfds_rotten_tomatoes_download_builds_from_manual_dir(builders, tmp_path):
  if not os.path.isdir(MR_DIR):
    pytest.skip(f'MR files not found in {MR_DIR}.')
  ex = data.load_split('rotten_tomatoes', DATA_DIR, 'validation', source='tfds',
                       tfds_data_dir=str(tmp_path), download=True)
  assert ex.text_a == data.load_split('rotten_tomatoes', DATA_DIR, 'validation').text_a


# ----------------------------------------------------------------------------- glue offline


@pytest.mark.parametrize('task', ['sst2', 'qqp'])
def test_glue_offline_without_download_fails_fast(builders, tmp_path, task, monkeypatch):
  attempts = []

  def no_network(sock, address, *args):
    attempts.append(address)
    raise OSError(f'network disabled in this test ({address})')

  # Any connection attempt is recorded (and refused): download=False must not try one.
  monkeypatch.setattr(socket.socket, 'connect', no_network)
  monkeypatch.setattr(socket.socket, 'connect_ex', no_network)
  for split in ('train', 'test'):
    with pytest.raises(FileNotFoundError, match=r'glue/.*not prepared.*download=False'):
      data.load_split(task, DATA_DIR, split, source='tfds', tfds_data_dir=str(tmp_path))
  assert not attempts
  assert not (tmp_path / 'downloads').exists()


def _write_tiny_glue(root):
  """Small GLUE-format SST-2 and QQP copies (with test.tsv, as in the GLUE zips)."""
  sst2, qqp = root / 'SST-2', root / 'QQP'
  sst2.mkdir(parents=True)
  qqp.mkdir()
  lines = ['sentence\tlabel'] + [f'sentence number {i} , good or bad \t{i % 3 % 2}'
                                 for i in range(40)]
  (sst2 / 'train.tsv').write_text('\n'.join(lines) + '\n', encoding='utf-8')
  lines = ['sentence\tlabel'] + [f'dev sentence {i} \t{i % 2}' for i in range(7)]
  (sst2 / 'dev.tsv').write_text('\n'.join(lines) + '\n', encoding='utf-8')
  (sst2 / 'test.tsv').write_text('index\tsentence\n0\tunlabelled\n', encoding='utf-8')
  header = '\t'.join(['id', 'qid1', 'qid2', 'question1', 'question2', 'is_duplicate'])
  for name, n in (('train.tsv', 40), ('dev.tsv', 7)):
    lines = [header] + [f'{i}\t{2 * i}\t{2 * i + 1}\twhat is {i} ?\thow is {i} ?\t{i % 3 % 2}'
                        for i in range(n)]
    (qqp / name).write_text('\n'.join(lines) + '\n', encoding='utf-8')
  (qqp / 'test.tsv').write_text('id\tquestion1\tquestion2\n0\ta ?\tb ?\n', encoding='utf-8')


@pytest.mark.parametrize('task', ['sst2', 'qqp'])
def test_glue_tfds_matches_files(builders, tmp_path, monkeypatch, task):
  """tfds' glue builder on a tiny local GLUE copy (its download stubbed: no network)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  glue_dir = tmp_path / 'files' / 'glue'
  _write_tiny_glue(glue_dir)
  monkeypatch.setattr(tfds.download.DownloadManager, 'download_and_extract',
                      lambda self, url: str(glue_dir))
  tfds_dir = str(tmp_path / 'tfds')
  files_dir = str(tmp_path / 'files')
  for split in data.SPLITS:
    # Seed 4: both classes among the 5 held-out rows (load_split refuses a one-class split).
    files = data.load_split(task, files_dir, split, validation_size=5, validation_seed=4)
    ex = data.load_split(task, files_dir, split, validation_size=5, validation_seed=4,
                         source='tfds', tfds_data_dir=tfds_dir, download=True)
    assert ex.text_a == files.text_a and ex.text_b == files.text_b
    np.testing.assert_array_equal(ex.labels, files.labels)
  assert len(ex.labels) == 7  # 'test' is GLUE dev.
  assert 'tensorflow' not in sys.modules
