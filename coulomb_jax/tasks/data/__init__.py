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
  memorising and overstates test accuracy, which biases the choice of epoch (or C) it
  makes (measured for TF-IDF in ``results/tfidf/sst2.json``:
  docs/results.md#what-ran-and-how-it-differs-from-the-paper). The test split is not
  affected (dev sentences are not in train.tsv). A sentence-level split needs the SST
  sentence ids, which GLUE drops. The trailing space GLUE leaves on every sentence is
  stripped.
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
(``coulomb_jax.tasks.data.tfds_builders``, built from the MR files in a manual dir).
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

Layout: this package is the public module (``from coulomb_jax.tasks import data;
data.load_split(...)``); it re-exports the names of its parts, which follow the
pipeline's seams, so each reads on its own:

* ``data.readers``: the file readers, ``load_split``, ``sentence_split``,
  ``source_files`` and the fingerprints;
* ``data.tokenizer``: the WordPiece tokenizer and ``encode``;
* ``data.batching``: ``batches``, ``batch_indices``, ``num_batches``.

What ``data`` shares with ``tfds_builders`` (``Examples``, ``TASKS``, ``SPLITS``, the MR
reader, the class check) is in ``coulomb_jax.tasks.data.core``, re-exported here. Why a
package, and why ``core``: docs/modules.md#coulomb_jaxtasksdata.
"""

from coulomb_jax.tasks.data.batching import batch_indices, batches, num_batches
from coulomb_jax.tasks.data.core import (DEFAULT_MIN_CLASS_SHARE, SPLITS, TASKS, Examples,
                                         check_class_balance, read_rotten_tomatoes_files)
from coulomb_jax.tasks.data.readers import (SOURCES, VALIDATION_RULES, changed_files,
                                            check_fingerprint, fingerprint, load_split,
                                            sentence_split, source_files)
from coulomb_jax.tasks.data.tokenizer import (SPECIAL_TOKENS, Encoded, encode, load_tokenizer,
                                              load_vocab_tokenizer, save_tokenizer, train_tokenizer)
