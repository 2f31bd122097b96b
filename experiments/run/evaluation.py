r"""Forward passes of one run's model over a split: metrics, model selection, pooled keys.

``evaluate`` gives ``coulomb_jax.metrics.classification_metrics`` of a split (Phase B's
validation after each epoch, the final validation and test metrics); ``better`` is
the model-selection rule; ``pooled_keys`` is every row's pooled keys r entering the
attention modules (what Phase A's calibration, held-out alignment and layer-wise
steps read), on a fixed ``subset`` of rows where a stage asks for one.
"""

import numpy as np

from coulomb_jax import metrics as metrics_lib
from coulomb_jax.tasks import data


def subset(encoded, size, seed=0):
  """A fixed random ``size`` rows of ``encoded`` (all of them if it has fewer), in order."""
  n = len(encoded.labels)
  if size >= n:
    return encoded
  keep = np.sort(np.random.default_rng(seed).permutation(n)[:size])
  return data.Encoded([encoded.ids[i] for i in keep], [encoded.segments[i] for i in keep],
                      np.asarray(encoded.labels)[keep])


def pooled_keys(inputs_fn, params, encoded, paths, sharder, config) -> dict:
  """``{path: [n, H, D_h]}``: every row's pooled keys r entering the attention at ``paths``.

  ``inputs_fn(params, batch, paths)``: the jitted ``training.phase_a_inputs`` restricted
  to ``paths`` (static; layers above them are not computed). One forward pass (no
  dropout) over ``encoded`` in length-bucketed batches of ``run.eval_batch_size``.
  """
  d = config.data
  tables = {}
  paths = tuple(tuple(p) for p in paths)
  for batch in data.batches(encoded, config.run.eval_batch_size, seed=0,
                            pad_multiple=d.pad_multiple, bucket_size=d.bucket_size):
    out = inputs_fn(params, sharder.batch(batch), paths)
    rows = batch['index'] >= 0
    for path in paths:
      r = sharder.to_host(out[tuple(path)])
      if path not in tables:
        tables[path] = np.zeros((len(encoded.labels),) + r.shape[1:], np.float32)
      tables[path][batch['index'][rows]] = r[rows]
  return tables


def evaluate(predict, params, encoded, batch_size, sharder, config, with_probs=False):
  """Metrics of ``coulomb_jax.metrics.classification_metrics`` on one split.

  ``with_probs``: also return the ``[n]`` probabilities of class 1, in row order.
  """
  probs = []
  for batch in data.batches(encoded, batch_size, pad_multiple=config.data.pad_multiple):
    p = sharder.to_host(predict(params, sharder.batch(batch)))
    probs.append(p[batch['weights'] > 0])
  probs = np.clip(np.concatenate(probs).astype(np.float64), 0.0, 1.0)
  metrics = metrics_lib.classification_metrics(encoded.labels, probs)
  return (metrics, probs) if with_probs else metrics


def better(new, best_accuracy, best_log_loss):
  """Higher accuracy, ties broken by lower log loss; compared as the stored float32."""
  acc, loss = np.float32(new['accuracy']), np.float32(new['log_loss'])
  return bool(acc > best_accuracy or (acc == best_accuracy and loss < best_log_loss))
