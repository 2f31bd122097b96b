r"""How close fitted heads come to the softmax heads they replace, on held-out rows.

For one group (layer, head) with queries, keys and values of held-out sequences (every
sequence its own attention context; padded keys and query rows masked):

* ``kl``: the mean over real query rows i of KL(A_soft[i] ‖ A_lin[i]) =
  Σ_j A_soft[i, j] (log A_soft[i, j] − log A_lin[i, j]) (``mimicry.attention_kl``);
* ``output_error``: ‖A_lin V − A_soft V‖_F / ‖A_soft V‖_F over all real query rows of all
  held-out sequences (V the head's value projections): the relative error of what the head
  passes on.

Sums run over batches first (rows weight the KL), so the result does not depend on how the
rows are batched. ``group_fidelity`` takes stacked groups (``[G, ...]``, e.g.
``stack_heads``' batches); ``heldout_fidelity`` takes ``record_attention``'s list and
answers per layer.
"""

from typing import Dict, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import mimicry
from coulomb_jax.conversion.record import AttentionRecord, Path, split_heads, stack_heads


def _group_sums(omega, q, k, v, key_mask, query_mask, feature_map):
  """(Σ_i KL_i, n rows, Σ‖ΔO‖², Σ‖O_soft‖²) of one group's batch."""
  kl = mimicry.attention_kl(q, k, omega, feature_map, key_mask=key_mask, query_mask=query_mask)
  rows = jnp.sum(query_mask)
  a_lin = mimicry.kernel_attention_weights(q, k, omega, feature_map, key_mask=key_mask)
  a_soft = mimicry.softmax_attention_weights(q, k, key_mask=key_mask)
  real = query_mask[..., None]
  o_lin = jnp.where(real, a_lin @ v, 0.0)
  o_soft = jnp.where(real, a_soft @ v, 0.0)
  return kl * rows, rows, jnp.sum((o_lin - o_soft) ** 2), jnp.sum(o_soft ** 2)


_sums = jax.jit(jax.vmap(_group_sums, in_axes=(0, 0, 0, 0, None, None, None)),
                static_argnums=6)


def group_fidelity(omega: jax.Array, feature_map: str,
                   batches: Sequence[Dict[str, jax.Array]]) -> Dict[str, np.ndarray]:
  """``{'kl': [G], 'output_error': [G]}`` (numpy) of ``omega [G, M, D]`` on ``batches``, each
  ``{'q', 'k', 'v': [G, B, L, D], 'key_mask', 'query_mask': [B, L] bool}``."""
  if not batches:
    raise ValueError('batches must hold at least one batch, got none.')
  totals = None
  for b in batches:
    if b.get('v') is None:
      raise ValueError('batches: the output error needs the values v; record layers whose '
                       'value projections are read (nn.MultiHeadDotProductAttention).')
    key_mask = b['key_mask'] if b['key_mask'] is not None else jnp.ones(b['k'].shape[1:3], bool)
    query_mask = (b['query_mask'] if b['query_mask'] is not None
                  else jnp.ones(b['q'].shape[1:3], bool))
    out = _sums(omega, b['q'], b['k'], b['v'], key_mask, query_mask, feature_map)
    out = [np.asarray(x, np.float64) for x in out]
    totals = out if totals is None else [t + x for t, x in zip(totals, out)]
  kl_sum, rows, err, ref = totals
  return {'kl': kl_sum / np.maximum(rows, 1.0),
          'output_error': np.sqrt(err / np.maximum(ref, 1e-30))}


def heldout_fidelity(omegas: Dict[Path, jax.Array], feature_map: str,
                     recorded: Sequence[Dict[Path, AttentionRecord]]
                     ) -> Dict[Path, Dict[str, np.ndarray]]:
  """``{path: {'kl': [H], 'output_error': [H]}}`` of fitted ``omegas`` (``fit_features``)
  on held-out ``recorded`` batches (``record_attention`` of rows the fit did not see)."""
  stacked = [stack_heads(r) for r in recorded]
  if not stacked:
    raise ValueError('recorded must hold at least one batch, got none.')
  layout = stacked[0][1]
  missing = [('/'.join(p)) for p, _ in layout if p not in omegas]
  if missing:
    raise ValueError(f'omegas: no fitted features for the recorded layers {missing}.')
  omega = jnp.concatenate([jnp.asarray(omegas[p]) for p, _ in layout], axis=0)
  out = group_fidelity(omega, feature_map, [b for b, _ in stacked])
  kl, err = split_heads(out['kl'], layout), split_heads(out['output_error'], layout)
  return {p: {'kl': kl[p], 'output_error': err[p]} for p, _ in layout}
