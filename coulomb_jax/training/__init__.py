r"""The two training phases of a kernel-attention model, as pure jitted steps.

**Phase A** moves only the particles Ω (every ``particles`` leaf, ``[H, M, D_h]``
per layer) by projected Langevin dynamics (``langevin.langevin_transform``) on

.. math::
   H(Ω) = \sum_{l,h} \big[ −A(φ_{Ω_{l,h}}(r_{l,h}), y) + λ\,W_s(Ω_{l,h}) \big]

where r_{l,h} ``[B, D_h]`` is the mean over real tokens of the (scaled) keys
entering head h of layer l (``models.KernelAttention`` sows it as
``phase_a_inputs``), y = 2·label − 1, A the alignment U-statistic and W_s the
Riesz energy (``hamiltonian.hamiltonian_terms``). The representations are
treated as data (``stop_gradient``): each head's particles feel the alignment of
their own head, which is the core library's Hamiltonian with x = r. Every other
parameter gets ``optax.set_to_zero`` and stays bit-identical.

**The softmax target** (``phase_a.target = 'softmax'``): the same dynamics on
Σ_{l,h} [CE_{l,h}(Ω_{l,h}) + λ W_s(Ω_{l,h})], CE the cross-entropy between softmax
attention and the head's linear attention on its own queries and keys of the batch's
real tokens, in ``coulomb_jax.training.phase_a_mimicry`` (its objective, step, forces,
held-out attention KL and potentials).

**Phase B** freezes the particles (``set_to_zero``) and trains the rest with
AdamW under a linear warm-up + cosine schedule on the weighted cross-entropy.

Both optimisers are one ``optax.partition`` over the labels of
``partition_labels``. Steps take the key first-class: dropout uses
``fold_in(key, step)``.

**Any Flax model.** The step builders take the model's inputs as functions of the batch:
``inputs(batch)`` gives the positional arguments of ``model.apply`` after the variables
(default ``encoder_inputs``: ``models.EncoderClassifier``'s ``ids, segments, mask``),
``apply_kwargs`` its keyword arguments (default for the encoder: ``deterministic``),
``labels`` / ``weights`` / ``mask`` what each target reads. They work for any model whose
attention layers are ``models.KernelAttention`` or
``flax_attention.kernel_attention_fn(omega, sow_into=self)`` with ω from
``models.particles_param``: those layers sow each target's data beside their particles.

**Layer-wise Phase A** (``make_phase_a_layer_step``, ``attention_paths``): the
same Hamiltonian, minimised one layer at a time on cached ``[B, H, D_h]`` inputs r_l
(one forward pass per layer, none per step). Why it is the same Hamiltonian, and how
it differs from the joint schedule: docs/math.md#training-package.

Modules: ``state`` (``TrainState``, the partition, ``phase_a_optimizer``,
``phase_b_optimizer``, per-leaf views), ``inputs`` (what a step reads from the batch and
the model), ``phase_a`` (the label target), ``phase_a_mimicry`` (the softmax target),
``phase_b``, ``schedule``, ``interleaved`` (Phase A interleaved with training: the
particles feel the softmax target's force in the same update as the task gradient), ``lm``
(the causal LM's loss, optimiser and MQAR step: ``training.lm.train_step``). Every other
public name is here: ``training.make_phase_a_step``.
"""

from coulomb_jax.training import interleaved
from coulomb_jax.training import lm
from coulomb_jax.training import phase_a_mimicry
from coulomb_jax.training.inputs import (PHASE_A_INPUTS, encoder_inputs, forward,
                                         phase_a_inputs, sown)
from coulomb_jax.training.interleaved import interleaved_grads, make_interleaved_step
from coulomb_jax.training.phase_a import (PHASE_A_TARGETS, heldout_alignment,
                                          make_phase_a_layer_step, make_phase_a_step,
                                          phase_a_forces, phase_a_objective,
                                          phase_a_potential_range)
from coulomb_jax.training.phase_b import cross_entropy, make_phase_b_step, make_predict
from coulomb_jax.training.schedule import (SCHEDULES, Stage, first_selectable_epoch,
                                           phase_schedule)
from coulomb_jax.training.state import (PARTICLES, TrainState, apply_particle_step,
                                        attention_paths,
                                        first_nonfinite, has_particles, nonfinite_counts,
                                        particle_leaves, partition_labels, phase_a_optimizer,
                                        phase_b_optimizer, phase_b_schedule)

__all__ = ['PARTICLES', 'PHASE_A_INPUTS', 'PHASE_A_TARGETS', 'SCHEDULES', 'Stage',
           'TrainState', 'apply_particle_step', 'attention_paths', 'cross_entropy', 'encoder_inputs',
           'first_nonfinite', 'first_selectable_epoch', 'forward', 'has_particles',
           'heldout_alignment', 'interleaved', 'interleaved_grads', 'lm', 'make_interleaved_step',
           'make_phase_a_layer_step', 'make_phase_a_step',
           'make_phase_b_step', 'make_predict', 'nonfinite_counts', 'particle_leaves',
           'partition_labels', 'phase_a_forces', 'phase_a_inputs', 'phase_a_mimicry',
           'phase_a_objective', 'phase_a_optimizer', 'phase_a_potential_range',
           'phase_b_optimizer', 'phase_b_schedule', 'phase_schedule', 'sown']
