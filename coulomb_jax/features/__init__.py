r"""Random-feature maps built from particles: the registry, the maps, and the samplers that
draw the particles.

Every map has the signature ``phi = feature_map(x, omega)`` with

* ``x: [..., d]`` inputs (any number of leading axes),
* ``omega: [N, d]`` particles ω_1..ω_N,
* ``phi: [..., F]`` features, F = N or 2N,

and is scaled by 1/√N so that

.. math:: \langle φ(x), φ(x')\rangle = \frac1N \sum_k ψ(x; ω_k)ᵀ ψ(x'; ω_k)

is a Monte-Carlo estimate of a kernel k(x, x') = E_ω[ψ(x; ω)ᵀψ(x'; ω)].
Inputs of any float dtype are accepted; features are computed and returned in
at least float32 (bf16 inputs give float32 features).

The paper names seven positive maps for attention without giving every formula.
The formulas chosen here are in each docstring; write ``s = x ωᵀ`` (``[..., N]``).

All maps except ``softmaxfeat`` are *separable*: feature k (for ``rff`` and
``hedgehog``, the pair of features k) depends on ω_k only,
so the alignment splits into a sum of one-particle potentials (see
``is_separable``).

For attention the seven positive maps and ``hedgehog`` (``KERNEL_ATTENTION_MAPS``)
are also available in log space:
``log_psi`` / ``attention_log_psi`` give log ψ without underflow,
and ``attention_pair`` stabilises queries and keys together in that space
(one shift per key feature over the real keys, one per query row). Every shift
is a common factor of a query's row of φ(q)ᵀφ(k), so linear attention with
these features is the exact ratio of the kernel at any input scale (why log space:
docs/math.md#features-package).

Eager calls check that ``x`` and ``omega`` are finite (``_checks.check_finite``);
under ``jit`` nothing is checked.

Modules: ``registry`` (``register``, ``get``, ``names``, ``FEATURE_MAPS``,
``num_features``), ``maps`` (the library's maps: φ and log ψ), ``log_space``
(``log_psi``, ``attention_log_psi``, ``log_features``, ``attention_pair``) and
``sampling`` (``sample_gaussian``, ``sample_orthogonal``); every public name is here.
"""

from coulomb_jax.features.log_space import (attention_log_psi, attention_pair, favor_pair,
                                            log_features, log_psi)
from coulomb_jax.features.maps import (FeatureMap, cos2, elu, favor, hedgehog,
                                       porf_softplus, rff, sigmoid2, softmaxfeat, softplus,
                                       taylor)
from coulomb_jax.features.registry import (ATTENTION_FEATURE_MAPS, FEATURE_MAPS,
                                           MapSpec, get, get_feature_map, is_separable, names,
                                           num_features, register)
from coulomb_jax.features.sampling import sample_gaussian, sample_orthogonal

__all__ = ['ATTENTION_FEATURE_MAPS', 'FEATURE_MAPS', 'FeatureMap', 'MapSpec',
           'attention_log_psi', 'attention_pair', 'cos2', 'elu', 'favor', 'favor_pair', 'get',
           'get_feature_map', 'hedgehog', 'is_separable', 'log_features', 'log_psi', 'names',
           'num_features', 'porf_softplus', 'register', 'rff', 'sample_gaussian',
           'sample_orthogonal', 'sigmoid2', 'softmaxfeat', 'softplus', 'taylor']


def __getattr__(attr):
  """Names that follow the registry (module attributes computed when read, PEP 562)."""
  if attr == 'KERNEL_ATTENTION_MAPS':      # every attention map with a log ψ: the log-space paths
    return names(positive=True, attention=True)
  if attr == 'SIGNED_ATTENTION_MAPS':      # signed maps attention takes as stored features
    return names(positive=False, attention=True)
  raise AttributeError(f'module {__name__!r} has no attribute {attr!r}')
