"""coulomb_jax: learned random-feature kernels as interacting Coulomb particles.

The feature parameters ω_1..ω_N are particles. The Hamiltonian
H = −(kernel-target alignment) + λ·(Riesz repulsion) is lowered by projected
Langevin dynamics; the learned feature map can then be used in any kernel
method or in linear attention.

Modules: ``features``, ``alignment``, ``repulsion``, ``hamiltonian``,
``langevin``, ``parallel``, ``attention``, ``diagnostics``, ``synthetic``.
Import these explicitly: ``models`` (the Flax modules; keeps flax out of
``import coulomb_jax``), ``data`` (text data, tokenizer, batches, data fingerprints)
and ``importance_sampling`` (a baseline). The most used names are re-exported here.

Layering (no import circles): ``attention`` → ``pallas_attention`` (a package:
``bidirectional`` and ``causal`` → its ``core``) → ``attention_core`` (the XLA
paths and checks both share) → ``features``; ``data`` (a package: ``readers``,
``tokenizer``, ``batching``) and ``tfds_builders`` → ``data_core`` (examples, the
MR reader, the class-balance check). Everything works with ``jax_enable_x64``; eager calls
check their arguments' values (NaN/inf, numbers given as strings), jitted calls
only what is static.
"""

from coulomb_jax import alignment
from coulomb_jax import attention
from coulomb_jax import diagnostics
from coulomb_jax import features
from coulomb_jax import flax_attention
from coulomb_jax import hamiltonian
from coulomb_jax import langevin
from coulomb_jax import mimicry
from coulomb_jax import parallel
from coulomb_jax import repulsion
from coulomb_jax import synthetic
from coulomb_jax.alignment import centered_alignment, target_alignment
from coulomb_jax.features import (FEATURE_MAPS, get_feature_map, sample_gaussian,
                                  sample_orthogonal)
# ``coulomb_jax.hamiltonian`` stays the module: call ``hamiltonian.hamiltonian``.
from coulomb_jax.hamiltonian import hamiltonian_terms, particle_potentials
from coulomb_jax.langevin import (LangevinHistory, gibbs_resample, langevin_step,
                                  langevin_transform, run_langevin)
# Softmax mimicry (Hedgehog's target) and the flax attention_fn drop-in; neither imports flax.
from coulomb_jax.flax_attention import kernel_attention_fn
from coulomb_jax.mimicry import (attention_cross_entropy, attention_kl, gradient_flow, hedgehog,
                                 linear_attention_weights, mimicry_hamiltonian,
                                 mimicry_hamiltonian_terms, softmax_attention_weights,
                                 softmax_kernel_alignment, train_hedgehog)
from coulomb_jax.parallel import langevin_step_on_mesh, sharded_langevin_step
from coulomb_jax.repulsion import DEFAULT_SOFTENING, riesz_energy

__version__ = '0.1.0'
