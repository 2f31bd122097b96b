r"""Binary classification metrics in NumPy.

Every function takes ``labels: [n]`` in {0, 1} (ints, bools or floats equal to
0 or 1) and ``probs: [n]``, the predicted probability p_i = P(y_i = 1) in
[0, 1]. JAX arrays are accepted and converted with ``np.asarray``; all sums
run in float64 and every metric is returned as a Python ``float``.

Prediction rule, used everywhere a hard prediction is needed:
ŷ_i = 1 if p_i ≥ 0.5 else 0 (``accuracy`` lets the threshold be changed).

Each metric equals its scikit-learn namesake (``accuracy_score``, ``f1_score``,
``roc_auc_score``, ``average_precision_score``, ``matthews_corrcoef``,
``balanced_accuracy_score``, ``log_loss``, ``brier_score_loss``) on the same
hard predictions or scores, except where a docstring says otherwise (the
one-class ``nan`` of ``roc_auc`` and ``pr_auc``, and the fixed ``eps`` of
``log_loss``).
"""

from typing import Any, Dict, Tuple

import numpy as np

from coulomb_jax import _checks

F1_AVERAGES = ('macro', 'micro', 'weighted')


def _as_inputs(labels: Any, probs: Any) -> Tuple[np.ndarray, np.ndarray]:
  """Checks and converts to ``(labels int64 [n], probs float64 [n])``, n ≥ 1."""
  labels, probs = np.asarray(labels), np.asarray(probs)
  _checks.check_rank('labels', labels, 1)
  _checks.check_rank('probs', probs, 1)
  if labels.shape != probs.shape:
    raise ValueError(
        f'labels has shape {labels.shape} but probs has shape {probs.shape}; they '
        f'must have the same length.')
  if labels.shape[0] == 0:
    raise ValueError(f'labels and probs must hold at least one sample, got shape '
                     f'{labels.shape}.')
  if not (np.issubdtype(labels.dtype, np.number) or labels.dtype == np.bool_):
    raise ValueError(f'labels must be numeric 0/1, got dtype {labels.dtype}.')
  bad = ~np.isin(labels, (0, 1))
  if np.any(bad):
    raise ValueError(f'labels must be 0 or 1, got values {np.unique(labels[bad])[:10]}.')
  if not (np.issubdtype(probs.dtype, np.number) or probs.dtype == np.bool_):
    raise ValueError(f'probs must be numeric, got dtype {probs.dtype}.')
  probs = probs.astype(np.float64)
  bad = ~(np.isfinite(probs) & (probs >= 0.0) & (probs <= 1.0))
  if np.any(bad):
    raise ValueError(
        f'probs must be finite and in [0, 1], got values {np.unique(probs[bad])[:10]}.')
  return labels.astype(np.int64), probs


def _confusion(y: np.ndarray, pred: np.ndarray) -> Tuple[int, int, int, int]:
  """``(tp, fp, fn, tn)`` of 0/1 arrays, as Python ints."""
  tp = int(np.sum((y == 1) & (pred == 1)))
  fp = int(np.sum((y == 0) & (pred == 1)))
  fn = int(np.sum((y == 1) & (pred == 0)))
  tn = int(np.sum((y == 0) & (pred == 0)))
  return tp, fp, fn, tn


def _predict(p: np.ndarray, threshold: float = 0.5) -> np.ndarray:
  return (p >= threshold).astype(np.int64)


def accuracy(labels: Any, probs: Any, threshold: float = 0.5) -> float:
  r"""Fraction of correct hard predictions: (1/n) Σ_i [ŷ_i = y_i].

  Here ŷ_i = [p_i ≥ threshold].

  Args:
    labels: ``[n]`` 0/1 labels.
    probs: ``[n]`` probabilities of class 1.
    threshold: decision threshold, finite (0.5 gives the module's rule).
  """
  y, p = _as_inputs(labels, probs)
  t = _checks.concrete_float(threshold)
  if t is None or not np.isfinite(t):
    raise ValueError(f'threshold must be a finite number, got {threshold!r}.')
  return float(np.mean(_predict(p, t) == y))


def f1(labels: Any, probs: Any, average: str = 'macro') -> float:
  r"""F1 score of the hard predictions ŷ = [p ≥ 0.5].

  Per class c: F1_c = 2·tp_c / (2·tp_c + fp_c + fn_c), with class 0 treated
  as the positive class for c = 0. As in scikit-learn's default, the classes
  averaged over are those present in ``labels`` or in the predictions (so
  F1_c never divides by zero):

  * ``'macro'``: unweighted mean of F1_c.
  * ``'weighted'``: mean of F1_c weighted by the support n_c = #{y_i = c}.
  * ``'micro'``: F1 of the pooled counts, which for single-label binary
    predictions equals the accuracy.

  Args:
    labels: ``[n]`` 0/1 labels.
    probs: ``[n]`` probabilities of class 1.
    average: one of ``'macro'``, ``'micro'``, ``'weighted'``.
  """
  if average not in F1_AVERAGES:
    raise ValueError(f'average must be one of {F1_AVERAGES}, got {average!r}.')
  y, p = _as_inputs(labels, probs)
  pred = _predict(p)
  if average == 'micro':
    return float(np.mean(pred == y))
  scores, support = [], []
  for c in (0, 1):
    tp, fp, fn, _ = _confusion((y == c).astype(np.int64), (pred == c).astype(np.int64))
    if tp + fp + fn == 0:  # Class absent from labels and predictions.
      continue
    scores.append(2.0 * tp / (2.0 * tp + fp + fn))
    support.append(float(np.sum(y == c)))
  scores, support = np.asarray(scores), np.asarray(support)
  if average == 'macro':
    return float(np.mean(scores))
  return float(np.sum(scores * support) / np.sum(support))


def _average_ranks(x: np.ndarray) -> np.ndarray:
  """1-based ranks of ``x: [n]``; tied values share the mean of their ranks."""
  order = np.argsort(x, kind='mergesort')
  xs = x[order]
  starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])  # First index of each tie group.
  ends = np.r_[starts[1:], len(x)]                          # One past its last index.
  group_rank = 0.5 * (starts + 1 + ends)                     # Mean of ranks starts+1..ends.
  ranks = np.empty(len(x))
  ranks[order] = np.repeat(group_rank, ends - starts)
  return ranks


def roc_auc(labels: Any, probs: Any) -> float:
  r"""Area under the ROC curve, by the Mann–Whitney rank statistic.

  .. math:: AUC = \frac{\sum_{i: y_i = 1} r_i − n_1(n_1 + 1)/2}{n_1 n_0}

  with r_i the 1-based rank of p_i among all n scores, tied scores sharing
  their average rank (a tied positive–negative pair counts ½). Equals
  ``sklearn.metrics.roc_auc_score``. Returns ``nan`` when ``labels`` holds
  only one class (n_1 = 0 or n_0 = 0), where scikit-learn raises.

  Args:
    labels: ``[n]`` 0/1 labels.
    probs: ``[n]`` scores (probabilities of class 1).
  """
  y, p = _as_inputs(labels, probs)
  n1 = int(np.sum(y))
  n0 = len(y) - n1
  if n1 == 0 or n0 == 0:
    return float('nan')
  rank_sum = float(np.sum(_average_ranks(p)[y == 1]))
  return float((rank_sum - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def pr_auc(labels: Any, probs: Any) -> float:
  r"""Average precision: the step-wise area under the precision–recall curve.

  .. math:: AP = \sum_k (R_k − R_{k−1})\, P_k,\qquad R_0 = 0

  over the distinct scores t_1 > t_2 > … taken as thresholds (predict 1 iff
  p ≥ t_k), with P_k, R_k the precision and recall at threshold t_k; tied
  scores enter together. Equals ``sklearn.metrics.average_precision_score``
  (no interpolation). Returns ``nan`` when ``labels`` holds only one class,
  where scikit-learn returns 1 (all positive) or 0 with a warning (none).

  Args:
    labels: ``[n]`` 0/1 labels.
    probs: ``[n]`` scores (probabilities of class 1).
  """
  y, p = _as_inputs(labels, probs)
  n1 = int(np.sum(y))
  if n1 == 0 or n1 == len(y):
    return float('nan')
  order = np.argsort(-p, kind='mergesort')
  ps, ys = p[order], y[order]
  last = np.flatnonzero(np.r_[ps[1:] != ps[:-1], True])  # Last index of each tie group.
  tp = np.cumsum(ys)[last].astype(np.float64)
  predicted = (last + 1).astype(np.float64)
  precision = tp / predicted
  recall = tp / n1
  return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def mcc(labels: Any, probs: Any) -> float:
  r"""Matthews correlation coefficient of the hard predictions ŷ = [p ≥ 0.5].

  .. math:: MCC = \frac{tp·tn − fp·fn}{\sqrt{(tp+fp)(tp+fn)(tn+fp)(tn+fn)}}

  and 0 when the denominator is 0 (one class in the labels or in the
  predictions), as ``sklearn.metrics.matthews_corrcoef``.

  Args:
    labels: ``[n]`` 0/1 labels.
    probs: ``[n]`` probabilities of class 1.
  """
  y, p = _as_inputs(labels, probs)
  tp, fp, fn, tn = _confusion(y, _predict(p))
  den = float(tp + fp) * float(tp + fn) * float(tn + fp) * float(tn + fn)
  if den == 0.0:
    return 0.0
  return float((float(tp) * tn - float(fp) * fn) / np.sqrt(den))


def balanced_accuracy(labels: Any, probs: Any) -> float:
  r"""Mean per-class recall of the hard predictions ŷ = [p ≥ 0.5].

  .. math:: BA = \tfrac12 \left(\frac{tp}{tp + fn} + \frac{tn}{tn + fp}\right)

  averaged over the classes present in ``labels`` only (with one class it is
  that class's recall), as ``sklearn.metrics.balanced_accuracy_score``.

  Args:
    labels: ``[n]`` 0/1 labels.
    probs: ``[n]`` probabilities of class 1.
  """
  y, p = _as_inputs(labels, probs)
  tp, fp, fn, tn = _confusion(y, _predict(p))
  recalls = [tp / (tp + fn)] if tp + fn else []
  if tn + fp:
    recalls.append(tn / (tn + fp))
  return float(np.mean(recalls))


def log_loss(labels: Any, probs: Any, eps: float = 1e-7) -> float:
  r"""Mean negative log-likelihood (natural log) of the labels.

  .. math:: L = −\frac1n \sum_i \big[y_i \log \tilde p_i
              + (1 − y_i) \log(1 − \tilde p_i)\big],
            \quad \tilde p_i = \mathrm{clip}(p_i, ε, 1 − ε)

  Equals ``sklearn.metrics.log_loss(labels, probs, labels=[0, 1])`` whenever
  no p_i is clipped (scikit-learn clips at the float64 machine epsilon).

  Args:
    labels: ``[n]`` 0/1 labels.
    probs: ``[n]`` probabilities of class 1.
    eps: clipping bound, in (0, 0.5).
  """
  e = _checks.concrete_float(eps)
  if e is None or not 0.0 < e < 0.5:
    raise ValueError(f'eps must be in (0, 0.5), got {eps!r}.')
  y, p = _as_inputs(labels, probs)
  p = np.clip(p, e, 1.0 - e)
  return float(-np.mean(np.where(y == 1, np.log(p), np.log1p(-p))))


def brier(labels: Any, probs: Any) -> float:
  r"""Brier score of the positive class: (1/n) Σ_i (p_i − y_i)².

  Equals ``sklearn.metrics.brier_score_loss``.

  Args:
    labels: ``[n]`` 0/1 labels.
    probs: ``[n]`` probabilities of class 1.
  """
  y, p = _as_inputs(labels, probs)
  return float(np.mean(np.square(p - y)))


def ece(labels: Any, probs: Any, num_bins: int = 15) -> float:
  r"""Top-label expected calibration error with equal-width confidence bins.

  Confidence c_i = max(p_i, 1 − p_i) ∈ [½, 1], prediction ŷ_i = [p_i ≥ 0.5]
  (so p_i = 0.5 predicts class 1 with confidence ½). With B = ``num_bins``
  and edges e_k = ``np.linspace(0, 1, B + 1)[k]``, bin b ∈ {0, …, B−1} holds
  the samples with e_b < c_i ≤ e_{b+1} (right-closed), bin 0 also holding
  c_i = 0. Then

  .. math:: ECE = \sum_b \frac{n_b}{n} \left| acc_b − conf_b \right|,
            \quad acc_b = \frac1{n_b} \sum_{i ∈ b} [ŷ_i = y_i],
            \quad conf_b = \frac1{n_b} \sum_{i ∈ b} c_i

  over the non-empty bins. Since c_i ≥ ½, bins below ½ stay empty.

  Args:
    labels: ``[n]`` 0/1 labels.
    probs: ``[n]`` probabilities of class 1.
    num_bins: number of bins B ≥ 1.
  """
  num_bins = _checks.check_int('num_bins', num_bins, 1)
  y, p = _as_inputs(labels, probs)
  conf = np.maximum(p, 1.0 - p)
  correct = (_predict(p) == y).astype(np.float64)
  edges = np.linspace(0.0, 1.0, num_bins + 1)
  # side='left' gives the k with e_{k-1} < c ≤ e_k; bin = k − 1, and c = 0 → bin 0.
  bins = np.clip(np.searchsorted(edges, conf, side='left') - 1, 0, num_bins - 1)
  counts = np.bincount(bins, minlength=num_bins).astype(np.float64)
  gap = (np.bincount(bins, weights=correct, minlength=num_bins)
         - np.bincount(bins, weights=conf, minlength=num_bins))
  # Σ_b (n_b/n)|acc_b − conf_b| = (1/n) Σ_b |Σ_{i∈b} ([ŷ_i = y_i] − c_i)|.
  return float(np.sum(np.abs(gap[counts > 0])) / len(y))


def classification_metrics(labels: Any, probs: Any) -> Dict[str, float]:
  """All metrics of this module with their defaults, as Python floats.

  Keys: ``accuracy``, ``f1_micro``, ``f1_macro``, ``f1_weighted``, ``roc_auc``,
  ``pr_auc``, ``mcc``, ``balanced_accuracy``, ``log_loss``, ``brier``, ``ece``.
  ``roc_auc`` and ``pr_auc`` are ``nan`` when ``labels`` holds one class.

  Args:
    labels: ``[n]`` 0/1 labels.
    probs: ``[n]`` probabilities of class 1.
  """
  y, p = _as_inputs(labels, probs)
  return {
      'accuracy': accuracy(y, p),
      'f1_micro': f1(y, p, 'micro'),
      'f1_macro': f1(y, p, 'macro'),
      'f1_weighted': f1(y, p, 'weighted'),
      'roc_auc': roc_auc(y, p),
      'pr_auc': pr_auc(y, p),
      'mcc': mcc(y, p),
      'balanced_accuracy': balanced_accuracy(y, p),
      'log_loss': log_loss(y, p),
      'brier': brier(y, p),
      'ece': ece(y, p),
  }
