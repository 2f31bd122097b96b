r"""How close a head's linear attention is to its softmax attention, on held-out rows.

For one group (layer, head) with queries, keys and values of the held-out sentences
(real tokens only; every sentence is its own attention context):

* ``kl``: the mean over real query rows i of KL(A_soft[i] ‖ A_lin[i]) =
  Σ_j A_soft[i, j] (log A_soft[i, j] − log A_lin[i, j]) (``mimicry.attention_kl``);
* ``output_error``: ‖A_lin V − A_soft V‖_F / ‖A_soft V‖_F over all real query rows of all
  held-out sentences (V the head's value projections): the relative error of what the
  head passes on.

``summary`` turns per-seed values into ``{"mean", "ci95", "n"}`` (Student t over seeds,
each seed's value the mean over its layers and heads).
"""

from typing import Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import mimicry

# Two-sided 95% Student t quantiles by degrees of freedom (n − 1).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228}


def _group_sums(omega, q, k, v, mask, feature_map):
  """(Σ_i KL_i, n rows, Σ‖ΔO‖², Σ‖O_soft‖²) of one group's batch."""
  kl = mimicry.attention_kl(q, k, omega, feature_map, key_mask=mask, query_mask=mask)
  rows = jnp.sum(mask)
  a_lin = mimicry.kernel_attention_weights(q, k, omega, feature_map, key_mask=mask)
  a_soft = mimicry.softmax_attention_weights(q, k, key_mask=mask)
  real = mask[..., None]
  o_lin = jnp.where(real, a_lin @ v, 0.0)
  o_soft = jnp.where(real, a_soft @ v, 0.0)
  return kl * rows, rows, jnp.sum((o_lin - o_soft) ** 2), jnp.sum(o_soft ** 2)


_sums = jax.jit(jax.vmap(_group_sums, in_axes=(0, 0, 0, 0, None, None)), static_argnums=5)


def heldout_fidelity(omega: jax.Array, feature_map: str, batches: List[dict]) -> Dict:
  """``{"kl": [G], "output_error": [G]}`` (numpy) of ``omega: [G, M, d]`` on ``batches``
  (``encoders.head_batches`` of held-out rows)."""
  totals = None
  for b in batches:
    out = _sums(omega, b['q'], b['k'], b['v'], b['mask'], feature_map)
    out = [np.asarray(x, np.float64) for x in out]
    totals = out if totals is None else [t + x for t, x in zip(totals, out)]
  kl_sum, rows, err, ref = totals
  return {'kl': kl_sum / np.maximum(rows, 1.0),
          'output_error': np.sqrt(err / np.maximum(ref, 1e-30))}


def summary(values) -> Dict:
  """``{"mean", "ci95": [lo, hi], "n"}`` of per-seed values (t interval; n = 1: [mean, mean])."""
  x = np.asarray(values, np.float64)
  n, mean = len(x), float(np.mean(x))
  if n < 2:
    return {'mean': mean, 'ci95': [mean, mean], 'n': n}
  half = _T95.get(n - 1, 1.96) * float(np.std(x, ddof=1)) / np.sqrt(n)
  return {'mean': mean, 'ci95': [mean - half, mean + half], 'n': n}
