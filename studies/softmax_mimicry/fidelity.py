r"""How close a head's linear attention is to its softmax attention, on held-out rows.

For one group (layer, head) with queries, keys and values of the held-out sentences
(real tokens only; every sentence is its own attention context), the library's
``coulomb_jax.conversion.group_fidelity``: ``kl``, the mean over real query rows of
KL(A_soft ‖ A_lin), and ``output_error``, ‖A_lin V − A_soft V‖_F / ‖A_soft V‖_F (the
formulas in ``coulomb_jax/conversion/fidelity.py``).

``summary`` turns per-seed values into ``{"mean", "ci95", "n"}`` (Student t over seeds,
each seed's value the mean over its layers and heads).
"""

from typing import Dict, List

import jax
import numpy as np

from coulomb_jax import conversion

# Two-sided 95% Student t quantiles by degrees of freedom (n − 1).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228}


def heldout_fidelity(omega: jax.Array, feature_map: str, batches: List[dict]) -> Dict:
  """``{"kl": [G], "output_error": [G]}`` (numpy) of ``omega: [G, M, d]`` on ``batches``
  (``encoders.head_batches`` of held-out rows; each sentence's mask is both its key and its
  query mask): ``coulomb_jax.conversion.group_fidelity``."""
  return conversion.group_fidelity(
      omega, feature_map, [{'q': b['q'], 'k': b['k'], 'v': b['v'], 'key_mask': b['mask'],
                            'query_mask': b['mask']} for b in batches])


def summary(values) -> Dict:
  """``{"mean", "ci95": [lo, hi], "n"}`` of per-seed values (t interval; n = 1: [mean, mean])."""
  x = np.asarray(values, np.float64)
  n, mean = len(x), float(np.mean(x))
  if n < 2:
    return {'mean': mean, 'ci95': [mean, mean], 'n': n}
  half = _T95.get(n - 1, 1.96) * float(np.std(x, ddof=1)) / np.sqrt(n)
  return {'mean': mean, 'ci95': [mean - half, mean + half], 'n': n}
