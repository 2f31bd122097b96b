"""Tests of coulomb_jax.metrics: cross-checks against scikit-learn.

The metrics are host functions (numpy, float64), not traced: ``chex.variants`` here
checks that they read the outputs of a jitted and of an eager JAX model alike.
"""

import math
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn import metrics as skm

from coulomb_jax import metrics

TOL = 1e-10
KEYS = ('accuracy', 'f1_micro', 'f1_macro', 'f1_weighted', 'roc_auc', 'pr_auc', 'mcc',
        'balanced_accuracy', 'log_loss', 'brier', 'ece')


def _sample(seed, n, prevalence, decimals):
  """Labels with the given prevalence and noisy probabilities of class 1.

  ``decimals`` rounds the probabilities (None: continuous), which creates ties,
  exact 0.5s and, at 1 decimal, exact 0s and 1s.
  """
  rng = np.random.default_rng(seed)
  y = (rng.random(n) < prevalence).astype(np.int64)
  logits = 1.5 * (2 * y - 1) + rng.normal(0.0, 1.5, n)
  p = 1.0 / (1.0 + np.exp(-logits))
  if decimals is not None:
    p = np.round(p, decimals)
  return y, p


CASES = [
    (0, 200, 0.5, None),
    (1, 157, 0.1, None),     # Imbalanced: few positives.
    (2, 240, 0.93, None),    # Imbalanced: few negatives.
    (3, 300, 0.5, 2),        # Ties.
    (4, 173, 0.2, 1),        # Heavy ties, exact 0, 0.5 and 1.
    (5, 61, 0.7, 1),
    (6, 12, 0.5, 1),         # Tiny.
]


@pytest.mark.parametrize('seed,n,prevalence,decimals', CASES)
def test_matches_sklearn(seed, n, prevalence, decimals):
  y, p = _sample(seed, n, prevalence, decimals)
  assert 0 < y.sum() < n
  pred = (p >= 0.5).astype(np.int64)
  got = metrics.classification_metrics(y, p)
  want = {
      'accuracy': skm.accuracy_score(y, pred),
      'f1_micro': skm.f1_score(y, pred, average='micro'),
      'f1_macro': skm.f1_score(y, pred, average='macro'),
      'f1_weighted': skm.f1_score(y, pred, average='weighted'),
      'roc_auc': skm.roc_auc_score(y, p),
      'pr_auc': skm.average_precision_score(y, p),
      'mcc': skm.matthews_corrcoef(y, pred),
      'balanced_accuracy': skm.balanced_accuracy_score(y, pred),
      'brier': skm.brier_score_loss(y, p),
  }
  for key, value in want.items():
    assert got[key] == pytest.approx(value, abs=TOL, rel=TOL), key
  # scikit-learn clips at float64 eps, we at 1e-7: compare away from 0 and 1.
  q = np.clip(p, 1e-3, 1 - 1e-3)
  assert metrics.log_loss(y, q) == pytest.approx(
      skm.log_loss(y, q, labels=[0, 1]), abs=TOL, rel=TOL)


@pytest.mark.parametrize('threshold', [0.0, 0.3, 0.5, 0.71, 1.0])
def test_accuracy_threshold(threshold):
  y, p = _sample(7, 150, 0.4, 2)
  want = skm.accuracy_score(y, (p >= threshold).astype(int))
  assert metrics.accuracy(y, p, threshold) == pytest.approx(want, abs=TOL)


def test_one_class_hard_metrics_match_sklearn():
  # All labels 0; predictions of both classes, and of class 0 only.
  y = np.zeros(20, np.int64)
  for p in (np.linspace(0.0, 1.0, 20), np.full(20, 0.2)):
    pred = (p >= 0.5).astype(np.int64)
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')
      for avg in ('macro', 'micro', 'weighted'):
        assert metrics.f1(y, p, avg) == pytest.approx(
            skm.f1_score(y, pred, average=avg), abs=TOL), avg
      assert metrics.balanced_accuracy(y, p) == pytest.approx(
          skm.balanced_accuracy_score(y, pred), abs=TOL)
      assert metrics.mcc(y, p) == skm.matthews_corrcoef(y, pred) == 0.0


def test_mcc_zero_when_predictions_are_one_class():
  y = np.array([0, 1, 1, 0, 1])
  p = np.full(5, 0.9)
  assert metrics.mcc(y, p) == 0.0 == skm.matthews_corrcoef(y, np.ones(5, int))


@pytest.mark.parametrize('y', [np.zeros(8, np.int64), np.ones(8, np.int64)])
def test_one_class_auc_is_nan(y):
  p = np.linspace(0.1, 0.9, 8)
  assert math.isnan(metrics.roc_auc(y, p))
  assert math.isnan(metrics.pr_auc(y, p))
  out = metrics.classification_metrics(y, p)
  assert math.isnan(out['roc_auc']) and math.isnan(out['pr_auc'])
  assert all(not math.isnan(out[k]) for k in KEYS if k not in ('roc_auc', 'pr_auc'))


def test_auc_all_scores_tied_is_half():
  y = np.array([0, 1, 0, 1, 1])
  p = np.full(5, 0.3)
  assert metrics.roc_auc(y, p) == 0.5 == skm.roc_auc_score(y, p)
  assert metrics.pr_auc(y, p) == pytest.approx(0.6) == skm.average_precision_score(y, p)


def test_log_loss_clips_probabilities():
  y = np.array([1, 0, 1, 0])
  p = np.array([0.0, 1.0, 1.0, 0.25])
  for eps in (1e-7, 1e-3):
    lo, hi = eps, 1.0 - eps  # p̃ = clip(p, ε, 1 − ε) = [lo, hi, hi, 0.25].
    want = -np.mean([np.log(lo), np.log(1.0 - hi), np.log(hi), np.log(0.75)])
    got = metrics.log_loss(y, p) if eps == 1e-7 else metrics.log_loss(y, p, eps=eps)
    assert got == pytest.approx(want, rel=1e-12)


def _ece_reference(y, p, num_bins):
  """Slow loop over bins (e_b, e_{b+1}], bin 0 closed at 0."""
  edges = np.linspace(0.0, 1.0, num_bins + 1)
  n = len(y)
  total = 0.0
  for b in range(num_bins):
    lo, hi = edges[b], edges[b + 1]
    acc_sum = conf_sum = 0.0
    count = 0
    for yi, pi in zip(y, p):
      conf = max(pi, 1.0 - pi)
      if (lo < conf <= hi) or (b == 0 and conf == 0.0):
        count += 1
        conf_sum += conf
        acc_sum += float(int(pi >= 0.5) == yi)
    if count:
      total += count / n * abs(acc_sum / count - conf_sum / count)
  return total


@pytest.mark.parametrize('seed,n,prevalence,decimals', CASES)
@pytest.mark.parametrize('num_bins', [1, 4, 15])
def test_ece_matches_reference_loop(seed, n, prevalence, decimals, num_bins):
  y, p = _sample(seed, n, prevalence, decimals)
  assert metrics.ece(y, p, num_bins) == pytest.approx(
      _ece_reference(y, p, num_bins), abs=TOL)


def test_ece_edges_are_right_closed():
  # num_bins=10: a confidence exactly on the edge e_6 = 0.6 goes to the bin below.
  edges = np.linspace(0.0, 1.0, 11)
  y = np.array([1, 0, 1])
  p = np.array([edges[6], edges[6], 0.65])
  # Bin (0.5, 0.6]: two samples, acc ½, conf 0.6 → |½ − 0.6| = 0.1, weight ⅔.
  # Bin (0.6, 0.7]: one sample, acc 1, conf 0.65 → 0.35, weight ⅓.
  want = 2 / 3 * 0.1 + 1 / 3 * 0.35
  assert metrics.ece(y, p, num_bins=10) == pytest.approx(want, abs=TOL)
  assert _ece_reference(y, p, 10) == pytest.approx(want, abs=TOL)


def test_ece_hand_computed():
  y = np.array([1, 0, 1, 0, 1])
  p = np.array([0.9, 0.2, 0.4, 0.5, 0.95])
  # Confidences 0.9, 0.8, 0.6, 0.5, 0.95; predictions 1, 0, 0, 1, 1;
  # correct: yes, yes, no, no, yes. With 4 bins (0,.25], (.25,.5], (.5,.75], (.75,1]:
  #   (.25,.5]: {0.5 wrong}          → |0 − 0.5|   = 0.5,    weight 1/5
  #   (.5,.75]: {0.6 wrong}          → |0 − 0.6|   = 0.6,    weight 1/5
  #   (.75,1]:  {0.9, 0.8, 0.95 ok}  → |1 − 0.883…| = 0.35/3, weight 3/5
  want = 0.5 / 5 + 0.6 / 5 + 3 / 5 * (0.35 / 3)
  assert metrics.ece(y, p, num_bins=4) == pytest.approx(want, abs=TOL)
  # One bin: |acc − mean conf| = |3/5 − 3.75/5|.
  assert metrics.ece(y, p, num_bins=1) == pytest.approx(0.15, abs=TOL)


def test_ece_perfectly_calibrated_certain_predictions():
  y = np.array([0, 1, 1, 0])
  assert metrics.ece(y, y.astype(float)) == 0.0


class MetricsVariantsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_metrics_of_jax_model_outputs(self):
    y, p = _sample(10, 64, 0.5, None)
    logits = jnp.asarray(np.log(p) - np.log1p(-p), jnp.float32)
    probs = self.variant(jax.nn.sigmoid)(logits)
    chex.assert_shape(probs, (64,))
    chex.assert_type(probs, jnp.float32)
    got = metrics.classification_metrics(y, probs)
    host = np.asarray(probs, np.float64)
    assert got == metrics.classification_metrics(y, host)
    assert got['accuracy'] == pytest.approx(skm.accuracy_score(y, host >= 0.5), abs=TOL)
    assert got['roc_auc'] == pytest.approx(skm.roc_auc_score(y, host), abs=TOL)
    assert got['brier'] == pytest.approx(skm.brier_score_loss(y, host), abs=TOL)


def test_classification_metrics_keys_and_types():
  y, p = _sample(8, 50, 0.5, 2)
  out = metrics.classification_metrics(jnp.asarray(y), jnp.asarray(p, jnp.float32))
  assert tuple(out) == KEYS
  assert all(type(v) is float for v in out.values())
  # jnp inputs give the same values as numpy inputs of the same precision.
  ref = metrics.classification_metrics(y, np.asarray(jnp.asarray(p, jnp.float32)))
  assert out == ref


def test_labels_accept_bool_and_float():
  y, p = _sample(9, 40, 0.5, None)
  want = metrics.classification_metrics(y, p)
  assert metrics.classification_metrics(y.astype(bool), p) == want
  assert metrics.classification_metrics(y.astype(float), p) == want


ALL = [metrics.accuracy, metrics.f1, metrics.roc_auc, metrics.pr_auc, metrics.mcc,
       metrics.balanced_accuracy, metrics.log_loss, metrics.brier, metrics.ece,
       metrics.classification_metrics]


@pytest.mark.parametrize('fn', ALL, ids=lambda f: f.__name__)
def test_bad_inputs(fn):
  y = np.array([0, 1, 1, 0])
  p = np.array([0.1, 0.8, 0.6, 0.3])
  with pytest.raises(ValueError, match=r'labels.*\(4,\).*probs.*\(3,\)'):
    fn(y, p[:3])
  with pytest.raises(ValueError, match=r'labels.*2'):
    fn(np.array([0, 1, 2, 0]), p)
  with pytest.raises(ValueError, match=r'labels.*-1'):
    fn(np.array([0, 1, -1, 0]), p)
  with pytest.raises(ValueError, match='labels'):
    fn(np.array([0.0, 1.0, 0.5, 0.0]), p)
  with pytest.raises(ValueError, match='probs'):
    fn(y, np.array([0.1, 1.2, 0.6, 0.3]))
  with pytest.raises(ValueError, match='probs'):
    fn(y, np.array([0.1, -0.1, 0.6, 0.3]))
  with pytest.raises(ValueError, match='probs'):
    fn(y, np.array([0.1, np.nan, 0.6, 0.3]))
  with pytest.raises(ValueError, match='probs'):
    fn(y, np.array([0.1, np.inf, 0.6, 0.3]))
  with pytest.raises(ValueError, match='probs'):
    fn(y, p[:, None])
  with pytest.raises(ValueError, match='at least one'):
    fn(np.zeros(0, int), np.zeros(0))


def test_bad_hyper_parameters():
  y = np.array([0, 1, 1, 0])
  p = np.array([0.1, 0.8, 0.6, 0.3])
  for bins in (0, -3, 2.5, True):
    with pytest.raises(ValueError, match='num_bins'):
      metrics.ece(y, p, num_bins=bins)
  with pytest.raises(ValueError, match='average'):
    metrics.f1(y, p, average='binary')
  with pytest.raises(ValueError, match='eps'):
    metrics.log_loss(y, p, eps=0.0)
  with pytest.raises(ValueError, match='threshold'):
    metrics.accuracy(y, p, threshold=float('nan'))
