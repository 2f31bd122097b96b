"""coulomb_jax: learned random-feature kernels as interacting Coulomb particles.

The feature parameters ω_1..ω_N are particles. The Hamiltonian
H = −(kernel-target alignment) + λ·(Riesz repulsion) is lowered by projected
Langevin dynamics; the learned feature map can then be used in any kernel
method or in linear attention.

The library, grouped by job (imports go one way: nothing here imports ``experiments``,
``studies``, ``configs`` or ``benchmarks``):

* ``features`` (the feature-map registry, the maps, the samplers), ``alignment``,
  ``repulsion``, ``hamiltonian``, ``langevin``, ``parallel``, ``diagnostics``,
  ``langevin_diagnostics``: the particle model;
* ``attention`` (the public linear-attention entry points; ``attention.xla`` the XLA
  paths and checks, ``attention.pallas`` the GPU/TPU kernels);
* ``layers`` (the Flax side: ``layers.models`` with ``KernelAttention`` and the encoder,
  ``layers.flax_attention`` the ``attention_fn`` drop-in and the sow names, ``layers.lm``
  the causal LM);
* ``training`` (the state, both phases' optimisers and steps, the label and the softmax
  targets, the schedules, the causal LM's MQAR step ``training.lm``), ``mimicry`` (softmax
  as the particles' target), ``conversion``
  (a trained Flax model to linear attention: ``record``, ``fit``, ``fidelity``), ``metrics``,
  ``checks``;
* ``tasks`` (``tasks.synthetic``, ``tasks.mqar``, ``tasks.data``: the text data,
  tokenizer, batches, fingerprints) and ``baselines`` (``baselines.importance_sampling``).

``import coulomb_jax`` keeps flax out: import ``layers.models`` / ``training`` explicitly.
The most used names are re-exported here. The modules' old flat names
(``from coulomb_jax import models``, ``… import data``, … see ``_MOVED``) still import,
with a ``DeprecationWarning``, for one release. Everything works with ``jax_enable_x64``; eager
calls check their arguments' values (NaN/inf, numbers given as strings), jitted calls only
what is static.
"""

from coulomb_jax import alignment
from coulomb_jax import attention
from coulomb_jax import diagnostics
from coulomb_jax import features
from coulomb_jax import hamiltonian
from coulomb_jax import langevin
from coulomb_jax import layers
from coulomb_jax import mimicry
from coulomb_jax import parallel
from coulomb_jax import repulsion
from coulomb_jax import tasks
from coulomb_jax.alignment import centered_alignment, target_alignment
from coulomb_jax.features import (FEATURE_MAPS, get_feature_map, sample_gaussian,
                                  sample_orthogonal)
# ``coulomb_jax.hamiltonian`` stays the module: call ``hamiltonian.hamiltonian``.
from coulomb_jax.hamiltonian import hamiltonian_terms, particle_potentials
from coulomb_jax.langevin import (LangevinHistory, gibbs_resample, langevin_step,
                                  langevin_transform, run_langevin)
# Softmax mimicry (Hedgehog's target) and the flax attention_fn drop-in; neither imports flax.
from coulomb_jax.layers.flax_attention import kernel_attention_fn
from coulomb_jax.mimicry import (attention_cross_entropy, attention_kl, gradient_flow, hedgehog,
                                 linear_attention_weights, mimicry_hamiltonian,
                                 mimicry_hamiltonian_terms, softmax_attention_weights,
                                 softmax_kernel_alignment, train_hedgehog)
from coulomb_jax.parallel import langevin_step_on_mesh, sharded_langevin_step
from coulomb_jax.repulsion import DEFAULT_SOFTENING, riesz_energy

__version__ = '0.1.0'

_MOVED = {
    'attention_core': 'coulomb_jax.attention.xla',
    'pallas_attention': 'coulomb_jax.attention.pallas',
    'models': 'coulomb_jax.layers.models',
    'flax_attention': 'coulomb_jax.layers.flax_attention',
    'lm': 'coulomb_jax.layers.lm',
    'phase_a_mimicry': 'coulomb_jax.training.phase_a_mimicry',
    'synthetic': 'coulomb_jax.tasks.synthetic',
    'mqar': 'coulomb_jax.tasks.mqar',
    'data': 'coulomb_jax.tasks.data',
    'data_core': 'coulomb_jax.tasks.data.core',
    'tfds_builders': 'coulomb_jax.tasks.data.tfds_builders',
    'importance_sampling': 'coulomb_jax.baselines.importance_sampling',
}
"""Old flat module name → its home since the library was grouped by job (issue 37)."""


def __getattr__(name):
  """``from coulomb_jax import models`` (an old flat name): the moved module, with a
  ``DeprecationWarning`` naming its new home; it is then also importable under the old
  dotted name (``sys.modules``) for the rest of the session."""
  if name not in _MOVED:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  import importlib  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  warnings.warn(f'coulomb_jax.{name} moved to {_MOVED[name]}; import it from there (the old '
                'name goes in the next release).', DeprecationWarning, stacklevel=2)
  module = importlib.import_module(_MOVED[name])
  sys.modules.setdefault(f'{__name__}.{name}', module)
  for full, sub in list(sys.modules.items()):     # a package's loaded submodules, too
    if full.startswith(_MOVED[name] + '.'):
      sys.modules.setdefault(f'{__name__}.{name}{full[len(_MOVED[name]):]}', sub)
  return module
