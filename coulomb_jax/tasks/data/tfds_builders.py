"""tensorflow_datasets sources of ``coulomb_jax.tasks.data`` (``load_split(..., source='tfds')``).

Everything here runs without tensorflow: datasets are written and read as
array_record (``tfds.data_source``), never as tfrecord or ``tf.data``. Needs
``pip install tensorflow-datasets importlib_resources`` (tfds 4.9.10 imports
``importlib_resources``; ``array_record`` comes with tensorflow-datasets on Linux).

* ``CoulombRottenTomatoes`` (``coulomb_rotten_tomatoes``): Rotten Tomatoes has no
  tfds builder, so the project adds one. It reads the MR files
  ``rt-polarity.{pos,neg}`` from the manual dir and writes the Hugging Face split
  (``core.read_rotten_tomatoes_files``: latin-1, strip, per class the first 4,265 /
  next 533 / last 533 lines, positives first) in that order: 8,530 / 1,066 / 1,066.
* ``glue/sst2`` and ``glue/qqp``: tfds' own GLUE builders.

Building::

  prepare_rotten_tomatoes('/path/to/dir/with/rt-polarity-files', data_dir=tfds_dir)
  # or: tfds.builder('coulomb_rotten_tomatoes', data_dir=tfds_dir,
  #                  file_format='array_record').download_and_prepare(
  #       download_config=tfds.download.DownloadConfig(manual_dir=...))

Nothing downloads or builds on read (``download=False``, the default): a dataset
that is not prepared raises FileNotFoundError saying how to prepare it.
``dataset_files`` lists the files of a prepared copy (``data.source_files`` for
``source='tfds'``, so a run can fingerprint what it read).

This module imports ``core`` (shared with ``data``), never ``data`` itself:
``data`` imports it only for ``source='tfds'``, so there is no import circle.
"""

import os
from typing import Any, Optional

import numpy as np
import tensorflow_datasets as tfds
import tensorflow_datasets.text  # noqa: F401  Registers the GLUE builders.

from coulomb_jax.tasks.data import core

FILE_FORMAT = 'array_record'
"""Random access without tensorflow (tfds' default, tfrecord, needs tf.data to read)."""

TFDS_NAMES = {'sst2': 'glue/sst2', 'qqp': 'glue/qqp',
              'rotten_tomatoes': 'coulomb_rotten_tomatoes'}
"""``data.TASKS`` with a tfds copy → its tfds name (qqp_subset has none)."""

_MR_FILES = core.MR_FILES


class CoulombRottenTomatoes(tfds.core.GeneratorBasedBuilder):
  """Rotten Tomatoes (MR sentence polarity, Pang & Lee 2005), Hugging Face split."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'The Hugging Face rotten_tomatoes split of the MR files.'}
  MANUAL_DOWNLOAD_INSTRUCTIONS = """\
  Put rt-polarity.pos and rt-polarity.neg (from rt-polaritydata.tar.gz of the MR
  sentence polarity dataset v1.0, https://www.cs.cornell.edu/people/pabo/movie-review-data/)
  in the manual dir: pass download_config=tfds.download.DownloadConfig(manual_dir=DIR)
  to download_and_prepare, or use <data_dir>/downloads/manual/.
  """

  def __init__(self, *, file_format=None, **kwargs: Any):
    super().__init__(file_format=file_format or FILE_FORMAT, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=('Movie-review sentences labelled negative (0) or positive (1); '
                     'the Hugging Face rotten_tomatoes train/validation/test split.'),
        features=tfds.features.FeaturesDict({
            'text': tfds.features.Text(),
            'label': tfds.features.ClassLabel(names=['neg', 'pos']),
        }),
        supervised_keys=('text', 'label'),
        homepage='https://www.cs.cornell.edu/people/pabo/movie-review-data/',
        citation=('@inproceedings{pang2005seeing, author={Bo Pang and Lillian Lee}, '
                  'title={Seeing stars: Exploiting class relationships for sentiment '
                  'categorization with respect to rating scales}, booktitle={ACL}, '
                  'year={2005}}'),
        disable_shuffling=True,  # Written (and read) in the Hugging Face order.
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    directory = os.fspath(dl_manager.manual_dir)
    return {split: self._generate_examples(directory, split) for split in core.SPLITS}

  def _generate_examples(self, directory: str, split: str):
    examples = core.read_rotten_tomatoes_files(directory, split)
    for key, (text, label) in enumerate(zip(examples.text_a, examples.labels.tolist())):
      yield key, {'text': text, 'label': label}


def prepare_rotten_tomatoes(manual_dir: str,
                            data_dir: Optional[str] = None) -> tfds.core.DatasetBuilder:
  """Builds ``coulomb_rotten_tomatoes`` into ``data_dir`` from ``manual_dir``; no network."""
  for name in _MR_FILES:
    path = os.path.join(manual_dir, name)
    if not os.path.isfile(path):
      raise FileNotFoundError(f'{path} not found: manual_dir must hold {_MR_FILES}.')
  builder = tfds.builder(TFDS_NAMES['rotten_tomatoes'], data_dir=data_dir,
                         file_format=FILE_FORMAT)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return builder


def _not_prepared(task: str, builder: tfds.core.DatasetBuilder,
                  manual_dir: Optional[str]) -> FileNotFoundError:
  name = TFDS_NAMES[task]
  if task == 'rotten_tomatoes':
    how = ('build it from the MR files (no network): load_split(..., download=True) '
           f'with data_dir/rotten_tomatoes holding {_MR_FILES} (now {manual_dir}), or '
           'coulomb_jax.tasks.data.tfds_builders.prepare_rotten_tomatoes(manual_dir, data_dir)')
  else:
    how = ("pass download=True to download and prepare it (needs network), point "
           "tfds_data_dir at a prepared array_record copy, or use source='files'")
  return FileNotFoundError(
      f'tfds dataset {name} is not prepared in {builder.data_dir} and download=False, '
      f'so nothing is downloaded: {how}.')


def read_examples(task: str, split: str, *, data_dir: Optional[str] = None,
                  download: bool = False, manual_dir: Optional[str] = None) -> core.Examples:
  """All examples of one tfds split of ``task``, in file order.

  ``split`` is a ``core.SPLITS`` name for rotten_tomatoes; for sst2 and qqp it is
  'train' (tfds 'train', from which ``data.load_split`` carves validation) or
  'test' (tfds 'validation': GLUE dev, since GLUE test has no labels). GLUE rows
  are put back in file order by their ``idx``; SST-2 sentences are stripped, as by
  ``data``'s file reader (tfds parses QQP with ``csv.QUOTE_NONE``, so quotes stay
  literal there, unlike the files path). ``data_dir`` is tfds' (None: tfds'
  default); ``download=True`` prepares a missing copy first, rotten_tomatoes from
  ``manual_dir`` (or tfds' ``<data_dir>/downloads/manual``).
  """
  if task not in TFDS_NAMES:
    raise ValueError(f'task must be one of {tuple(TFDS_NAMES)}, got {task!r}.')
  glue = task != 'rotten_tomatoes'
  splits = ('train', 'test') if glue else core.SPLITS
  if split not in splits:
    raise ValueError(f'split must be one of {splits} for task {task!r}, got {split!r}.')
  name = TFDS_NAMES[task]
  builder = tfds.builder(name, data_dir=data_dir, file_format=FILE_FORMAT)
  if not builder.is_prepared() and not download:
    raise _not_prepared(task, builder, manual_dir)
  prepare_kwargs = None
  if not glue and manual_dir is not None:
    prepare_kwargs = {'download_config': tfds.download.DownloadConfig(manual_dir=manual_dir)}
  source = tfds.data_source(
      name, split={'train': 'train', 'test': 'validation'}[split] if glue else split,
      data_dir=data_dir, download=download, builder_kwargs={'file_format': FILE_FORMAT},
      download_and_prepare_kwargs=prepare_kwargs)
  rows = source.__getitems__(list(range(len(source))))
  if glue:
    rows.sort(key=lambda row: int(row['idx']))
  labels = np.array([int(row['label']) for row in rows], np.int32)
  if task == 'sst2':
    return core.Examples([row['sentence'].decode('utf-8').strip() for row in rows], None, labels)
  if task == 'qqp':
    return core.Examples([row['question1'].decode('utf-8') for row in rows],
                         [row['question2'].decode('utf-8') for row in rows], labels)
  return core.Examples([row['text'].decode('utf-8') for row in rows], None, labels)


def dataset_files(task: str, data_dir: Optional[str] = None) -> list[str]:
  """Every file of the prepared tfds copy of ``task`` in ``data_dir``, sorted.

  The version directory ``<data_dir>/<name>/<config>/<version>`` (records and
  metadata). FileNotFoundError if it is not prepared (nothing is built).
  """
  if task not in TFDS_NAMES:
    raise ValueError(f'task must be one of {tuple(TFDS_NAMES)}, got {task!r}.')
  builder = tfds.builder(TFDS_NAMES[task], data_dir=data_dir, file_format=FILE_FORMAT)
  if not builder.is_prepared():
    raise _not_prepared(task, builder, None)
  root = os.fspath(builder.data_dir)
  return sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)
