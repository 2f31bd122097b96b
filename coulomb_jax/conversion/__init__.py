r"""Converting a trained Flax model's softmax attention to linear attention with fitted features.

For any Flax model whose attention layers are ``nn.MultiHeadDotProductAttention`` (flax's
softmax or any ``attention_fn``) or ``models.KernelAttention``:

1. ``record_attention(model, variables, batches)``: per batch and attention layer (by
   module path), the per-head queries, keys and values ``[H, B, L, D]`` and the key and
   query masks ``[B, L]`` (``nn.intercept_methods`` reads each
   ``MultiHeadDotProductAttention``'s projections and mask; ``KernelAttention`` sows its
   (q, k) as ``flax_attention.MIMICRY_INPUTS``).
2. ``fit_features(key, recorded, method=..., num_features=N, steps=T)``: per layer
   ``omega: [H, M, D]``, each head's features fitted so that its linear attention
   reproduces its softmax attention on the recorded rows, by lowering the mimicry
   Hamiltonian (``mimicry.mimicry_hamiltonian``) H(Ω) = CE(A_soft ‖ A_lin) + λ·W_s(Ω):

   ==================  ======================================================================
   ``particles``       projected Langevin ω ← P_R(ω − η·M·clip(∇H) + √(2η/β)·ξ)
                       (``langevin.langevin_step``), from N(0, I) rows projected onto the ball.
   ``gradient_flow``   the same with λ = 0 and β = ∞: ω ← P_R(ω − η·M·clip(∇CE)).
   ``hedgehog``        Zhang et al.'s φ = [e^{Wx}, e^{−Wx}] (map ``hedgehog``), M = N/2 rows
                       of W from N(0, I/D), by Adam on H (λ = 0: Hedgehog's loss exactly).
   ``adam``            the same Adam fit for any positive map (``feature_map``).
   ==================  ======================================================================

3. ``linear_attention_fns(omegas, feature_map)``: one ``flax_attention.kernel_attention_fn``
   per layer, the ``attention_fn`` the model runs with in place of softmax (its trained
   parameters unchanged); ``with_particles(params, omegas)`` for ``KernelAttention``.

N = ``num_features`` is the length of φ per head: ``features.num_features(feature_map, M)``
= N (M = N for ``favor``, N/2 for ``hedgehog``, ``softmaxfeat``). All heads of all layers
are fitted at once, vmapped over G = Σ_layers H groups (layer-major, record order); step t
uses recorded batch ``t % len(recorded)`` and noise key ``fold_in(key, t)`` split over the
groups. The rows of a sequence are compared over all its recorded keys, so for a causal
model the target is the kernel (causality changes which keys a row sums, not the kernel):
run it with ``causal=True``. ``fit_in_model(key, model, variables, batches, method=...,
steps=T)`` is the same fit inside a model whose layers are already ``KernelAttention``
(a trained model rebuilt with kernel attention, its weights copied in): each step records
the model's own attention with its current features, so a later layer's queries and keys
follow the features fitted below it (``studies/mqar_convert``).

Example (``model`` takes its layers' attention functions from a field ``attention_fns``)::

  recorded = conversion.record_attention(model, variables, batches,
                                         inputs=lambda b: (b['x'], b['mask']))
  omegas, _ = conversion.fit_features(jax.random.key(0), recorded, method='particles',
                                      num_features=64, steps=300)
  linear = model.clone(attention_fns=conversion.linear_attention_fns(omegas, 'favor'))
  out = linear.apply(variables, x, mask)

Modules: ``record`` (recording and stacking), ``fit`` (the fits), ``fidelity`` (held-out KL
and output error of the fitted heads); running is here. Every
public name is here: ``conversion.fit_features``.
"""

from typing import Callable, Dict, Tuple

import jax
import jax.numpy as jnp

from coulomb_jax.conversion.fidelity import group_fidelity, heldout_fidelity
from coulomb_jax.conversion.fit import (ADAM_METHODS, FIT_METHODS, FitSettings,
                                        default_feature_map, fit_features, fit_groups,
                                        fit_in_model, head_grads, initial_features,
                                        make_fit_step, mimicry_energy, rows_for,
                                        with_particles)
from coulomb_jax.conversion.record import (AttentionRecord, Path, attention_records,
                                           record_attention, split_heads, stack_heads,
                                           stack_initial)
from coulomb_jax.layers import flax_attention

__all__ = ['ADAM_METHODS', 'FIT_METHODS', 'AttentionRecord', 'FitSettings', 'Path',
           'attention_records', 'default_feature_map', 'fit_features', 'fit_groups',
           'fit_in_model', 'group_fidelity', 'head_grads',
           'heldout_fidelity',
           'initial_features', 'linear_attention_fns', 'make_fit_step', 'mimicry_energy',
           'record_attention', 'rows_for', 'split_heads', 'stack_heads', 'stack_initial',
           'with_particles']

def linear_attention_fns(omegas: Dict[Path, jax.Array], feature_map: str, *,
                         causal: bool = False) -> Tuple[Callable, ...]:
  """One ``flax_attention.kernel_attention_fn(omega [H, M, D], feature_map, causal=causal)``
  per layer, in ``omegas``' order (the order ``record_attention`` met the layers in): the
  ``attention_fn`` of each ``nn.MultiHeadDotProductAttention`` of the converted model.

  ``causal=True`` for a causal model (flax's causal masks are then honoured exactly).
  """
  if not omegas:
    raise ValueError('omegas must hold at least one layer, got none.')
  return tuple(flax_attention.kernel_attention_fn(jnp.asarray(w), feature_map, causal=causal)
               for w in omegas.values())
