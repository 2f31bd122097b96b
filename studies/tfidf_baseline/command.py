r"""Reference row: TF-IDF (word uni+bigram) + logistic regression, C chosen on validation.

  python -m studies.tfidf_baseline --data_dir=../shared/data --out=results/tfidf

(settings: ``studies/tfidf_baseline/config.py``: the tasks, the C grid, the validation
rule; ``--data_dir`` and ``--out`` are where it reads and writes.)

writes ``<out>/<task>.json`` for sst2, rotten_tomatoes and qqp_subset, with the
same schema as a ``results.json`` of ``experiments.train`` where it makes sense
(``variant='tfidf_logreg'``, ``validation`` and ``test`` metrics of
``coulomb_jax.metrics``, ``train_seconds``, command, commit, machine), and next
to it ``<task>_predictions_test.npz`` (``labels``, ``probs`` = P(class 1) per
test example: what ``experiments.report`` draws the reliability diagrams from).
Splits are those of ``coulomb_jax.tasks.data.load_split`` (the same validation rows
as the neural runs). Choices:

* ``TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2)``, fitted
  on the training split only. ``min_df=2`` drops terms seen in a single
  training text (mostly one-off bigrams, which a linear model can only
  memorise); lower-cased; tokens are runs of word characters and apostrophes
  (``n't``, ``don't`` stay whole) or single punctuation marks (``!``, ``?``),
  which sklearn's default pattern would drop.
* Pairs (qqp_subset): one vectorizer fitted on the training questions of both
  sides; the features of question 1 and of question 2 are concatenated
  ``[tfidf(q1), tfidf(q2)]``, so the classifier knows which side a term is
  on. No cross-question features (overlap, products): this is the plain
  bag-of-words row, weak on duplicate detection by construction.
* L2 ``LogisticRegression`` (lbfgs, intercept not penalised) fitted on train
  for every C of ``c_grid``; the kept C has the best validation accuracy (ties:
  lower validation log loss, as ``experiments.train`` keeps its epoch); the
  test split is only scored, with the model of that C (not refitted).
* ``train_seconds`` covers fitting the vectorizer, featurising every split, and
  fitting every C of the grid and scoring it on validation (the selection);
  only the test scoring is left out.
"""

import os
import time
from typing import Optional, Sequence


import numpy as np
from scipy import sparse
from sklearn import feature_extraction
from sklearn import linear_model

from coulomb_jax import metrics as metrics_lib
from coulomb_jax.tasks import data
from experiments.analysis import loading
from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance

VARIANT = 'tfidf_logreg'
MIN_DF = 2
TOKEN_PATTERN = r"(?u)[\w']+|[^\w\s]"
MAX_ITER = 2000


def make_vectorizer() -> feature_extraction.text.TfidfVectorizer:
  return feature_extraction.text.TfidfVectorizer(
      ngram_range=(1, 2), sublinear_tf=True, min_df=MIN_DF, lowercase=True,
      token_pattern=TOKEN_PATTERN)


def featurize(vectorizer, examples: data.Examples) -> sparse.csr_matrix:
  """``tfidf(a)``, or ``[tfidf(a), tfidf(b)]`` for pairs; ``vectorizer`` already fitted."""
  x = vectorizer.transform(examples.text_a)
  if examples.text_b is not None:
    x = sparse.hstack([x, vectorizer.transform(examples.text_b)], format='csr')
  return x


def _better(new, best):
  return best is None or (new['accuracy'] > best['accuracy'] or (
      new['accuracy'] == best['accuracy'] and new['log_loss'] < best['log_loss']))


def check_c_grid(c_grid) -> list:
  """``c_grid`` as floats; ValueError naming it unless a non-empty list of numbers > 0."""
  try:
    values = [float(c) for c in c_grid]
  except (TypeError, ValueError):
    values = []
  if not values or any(not c > 0 for c in values):
    raise ValueError(f'c_grid must be a non-empty list of numbers > 0, got {c_grid!r}.')
  return values


def run_tfidf(task: str, data_dir: str, c_grid: Sequence[float], *,
              validation_rule: str = 'rows', meta: Optional[dict] = None,
              predictions_path: Optional[str] = None) -> dict:
  """Fits the reference on ``task``'s train split; returns a results dict (see module doc).

  ``predictions_path``: where to write the test split's labels and P(class 1)
  (``loading.save_predictions``); not written when None.
  """
  if task not in data.TASKS:
    raise ValueError(f'task must be one of {data.TASKS}, got {task!r}.')
  c_grid = check_c_grid(c_grid)
  meta = meta or provenance.run_metadata('studies.tfidf_baseline')
  splits = {s: data.load_split(task, data_dir, s, validation_rule=validation_rule)
            for s in data.SPLITS}

  tick = time.perf_counter()
  train = splits['train']
  vectorizer = make_vectorizer().fit(train.text_a + (train.text_b or []))
  x = {s: featurize(vectorizer, ex) for s, ex in splits.items()}
  selection, best, best_model = [], None, None
  for c in c_grid:
    model = linear_model.LogisticRegression(C=c, max_iter=MAX_ITER)
    model.fit(x['train'], train.labels)
    val = metrics_lib.classification_metrics(splits['validation'].labels,
                                             model.predict_proba(x['validation'])[:, 1])
    selection.append({'C': c, 'validation_accuracy': val['accuracy'],
                      'validation_log_loss': val['log_loss'], 'iterations': int(model.n_iter_[0])})
    if _better(val, best):
      best, best_model = dict(val, C=c), model
  train_seconds = time.perf_counter() - tick

  results = dict(meta, dataset=task, variant=VARIANT, seed=0,
                 config={'ngram_range': [1, 2], 'sublinear_tf': True, 'min_df': MIN_DF,
                         'lowercase': True, 'token_pattern': TOKEN_PATTERN,
                         'pair_features': 'concat' if train.text_b is not None else None,
                         'classifier': 'LogisticRegression(l2, lbfgs)', 'max_iter': MAX_ITER,
                         'c_grid': c_grid, 'selection': 'validation accuracy, then log loss'},
                 split={'validation': 'validation', 'test': 'test'},
                 validation_rule=validation_rule,
                 C=best['C'], selection=selection,
                 num_train=len(train.labels), num_features=int(x['train'].shape[1]),
                 num_params=int(best_model.coef_.size + best_model.intercept_.size),
                 train_seconds=train_seconds)
  for split in ('validation', 'test'):
    probs = best_model.predict_proba(x[split])[:, 1].astype(np.float64)
    results[split] = metrics_lib.classification_metrics(splits[split].labels, probs)
    if split == 'test' and predictions_path:
      loading.save_predictions(predictions_path, splits[split].labels, probs)
  return results


def check_config(config) -> list:
  """``config.c_grid`` as floats; one ``cli.ConfigError`` naming the field unless ``config``
  can run (every check before any fit)."""
  cli.check_names('tasks', config.tasks, data.TASKS)
  if config.validation_rule not in data.VALIDATION_RULES:
    raise cli.ConfigError(f'--config.validation_rule: expected one of '
                          f'{list(data.VALIDATION_RULES)}, got {config.validation_rule!r}.')
  if config.validation_rule == 'sentences' and config.tasks != ('sst2',):
    raise cli.ConfigError(f"--config.validation_rule=sentences is for sst2 only, got tasks "
                          f"{config.tasks!r} (pass --config.tasks=\"('sst2',)\").")
  try:
    return check_c_grid(config.c_grid)
  except ValueError as e:
    raise cli.ConfigError(f'--config.{e}') from None


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.tfidf_baseline``."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  _CONFIG = config_flags.DEFINE_config_file('config', 'studies/tfidf_baseline/config.py',
                                            'The reference row\'s settings.', lock_config=True)
  _DATA_DIR = flags.DEFINE_string('data_dir', '../shared/data', 'Folder of the offline data.')
  _OUT = flags.DEFINE_string('out', 'results/tfidf', "Folder for <task>.json (<task>_<rule>.json "
                             "for a validation rule other than 'rows').")

  def main(argv):
    if len(argv) > 1:
      raise cli.ConfigError(f'unexpected arguments: {argv[1:]}')
    config = _CONFIG.value
    c_grid = check_config(config)
    rule = config.validation_rule
    outputs.check_folder('--out', _OUT.value)        # before any fit (issue 39 item 1)
    meta = provenance.run_metadata('studies.tfidf_baseline')
    os.makedirs(_OUT.value, exist_ok=True)
    for task in config.tasks:
      predictions = os.path.join(_OUT.value, loading.reference_predictions_file(task, rule))
      r = run_tfidf(task, _DATA_DIR.value, c_grid, validation_rule=rule, meta=meta,
                    predictions_path=predictions)
      name = loading.reference_file(task, rule)
      provenance.write_json_atomic(os.path.join(_OUT.value, name), r, indent=1)
      v, t = r['validation'], r['test']
      print(f"{task}: C={r['C']:g} validation accuracy {v['accuracy']:.4f}; test accuracy "
            f"{t['accuracy']:.4f} MCC {t['mcc']:.4f} ECE {t['ece']:.4f} Brier {t['brier']:.4f} "
            f"({r['num_features']} features, {r['train_seconds']:.1f} s)", flush=True)

  cli.run(main)
