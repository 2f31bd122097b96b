r"""The feature-map registry: ``register`` a map by its log ψ (positive) or its φ (signed),
``get`` its ``MapSpec``, list the ``names``. Every ``feature_map=`` of the library resolves
here; the library's own maps (``maps``) are registered when this module is imported."""

import collections.abc
import math
from typing import Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp

from coulomb_jax import _checks
from coulomb_jax.features.maps import (FeatureMap, _half_sq_norm, _log_psi_cos2, _log_psi_elu,
                                       _log_psi_favor, _log_psi_hedgehog,
                                       _log_psi_porf_softplus, _log_psi_sigmoid2,
                                       _log_psi_softmaxfeat, _log_psi_softplus, _projection,
                                       cos2, elu, favor, hedgehog, porf_softplus, rff, sigmoid2,
                                       softmaxfeat, softplus, taylor)

class MapSpec(NamedTuple):
  """A registered feature map (``register``; read with ``get``).

  Attributes:
    name: its name, the ``feature_map=`` string everywhere in the library.
    phi: ``phi(x [..., d], omega [N, d]) -> [..., F]``, the map itself (scaled 1/√N).
    log_psi: ``log_psi(s = x Ωᵀ [..., N], ‖x‖²/2 [..., 1]) -> [..., F]`` for a positive
      map (φ = exp(log ψ)/√N: the attention paths stabilise in this space); None for a
      signed map.
    per_particle: F / N (1 or 2), when ``num_features`` is not given.
    separable: whether feature k (or pair k) depends on ω_k only.
    attention: whether linear attention takes it: every positive map; a signed map whose
      kernel is positive (``taylor``) as stored features.
    num_features: ``N -> F``.
  """
  name: str
  phi: FeatureMap
  log_psi: Optional[Callable[[jax.Array, jax.Array], jax.Array]]
  per_particle: int
  separable: bool
  attention: bool
  num_features: Callable[[int], int]


_REGISTRY = {}
_BUILTIN = frozenset()      # the library's own maps, set once they are registered below


def register(name: str, *, log_psi: Optional[Callable] = None, phi: Optional[FeatureMap] = None,
             per_particle: int = 1, separable: bool = True, attention: Optional[bool] = None,
             num_features: Optional[Callable[[int], int]] = None,
             replace: bool = False) -> MapSpec:
  r"""Adds a feature map under ``name``; every ``feature_map=`` of the library then takes it.

  A positive map is given by its log ψ: ``log_psi(s, half_sq_norm)`` with s = x Ωᵀ
  ``[..., N]`` and ‖x‖²/2 ``[..., 1]`` → ``[..., per_particle·N]``; then φ = exp(log ψ)/√N
  (``phi``, if also given, is the direct form used outside attention, e.g. by the label
  Hamiltonian), and the attention paths stabilise it in log space, exact at any input
  scale. A signed map is given by ``phi(x, omega)`` alone (``rff``); ``attention=True``
  lets linear attention take it as stored features when its kernel is positive
  (``taylor``). The Pallas kernels compute the maps they were written for
  (``pallas.PALLAS_FEATURE_MAPS``); for any other, ``implementation='auto'``
  takes the XLA path and ``'pallas'`` refuses in one line.

  Example (the same log ψ as ``elu`` under a new name)::

    features.register('my_elu', log_psi=features.get('elu').log_psi)
    models.KernelAttention(num_heads=2, feature_map='my_elu')

  Args:
    name: a new name (``replace=True`` to redefine one of yours; the library's own maps
      cannot be redefined).
    log_psi, phi: as above; at least one.
    per_particle: F / N of ``log_psi`` or ``phi``.
    separable: feature k (or pair k) depends on ω_k only (the data term splits per
      particle: ``parallel``, ``langevin`` use it).
    attention: None: True for a positive map, False for a signed one.
    num_features: ``N -> F`` when F is not ``per_particle·N``.
  """
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f'name must be an identifier string, got {name!r}.')
  if name in _BUILTIN:
    raise ValueError(f'name: {name!r} is one of the library\'s maps {tuple(sorted(_BUILTIN))}, '
                     'which the Pallas kernels and the committed results compute; register '
                     'another name.')
  if name in _REGISTRY and not replace:
    raise ValueError(f'name: {name!r} is registered already; pass replace=True to redefine '
                     'it.')
  if log_psi is None and phi is None:
    raise ValueError(f'register({name!r}): give log_psi (a positive map) or phi (a signed '
                     'map), got neither.')
  for arg, fn in (('log_psi', log_psi), ('phi', phi), ('num_features', num_features)):
    if fn is not None and not callable(fn):
      raise ValueError(f'{arg} must be a function, got {type(fn).__name__}.')
  _checks.check_int('per_particle', per_particle, 1)
  if attention is None:
    attention = log_psi is not None
  if phi is None:
    phi = _phi_from_log_psi(log_psi)
  count = num_features or (lambda n, k=per_particle: k * n)
  spec = MapSpec(name, phi, log_psi, per_particle, bool(separable), bool(attention), count)
  if name in _REGISTRY:
    # Jitted functions take the name as a static argument: their compiled programs hold
    # the old map. Drop them so the next call traces the new one.
    jax.clear_caches()
  _REGISTRY[name] = spec
  return spec


def _phi_from_log_psi(log_psi):
  def phi(x: jax.Array, omega: jax.Array) -> jax.Array:
    x, s = _projection(x, omega)
    return jnp.exp(log_psi(s, _half_sq_norm(x))) / math.sqrt(omega.shape[0])
  return phi


def get(name, *, positive: Optional[bool] = None, attention: Optional[bool] = None) -> MapSpec:
  """The ``MapSpec`` registered as ``name``; one ValueError naming it and the names that fit.

  ``positive=True`` (a log ψ) / ``attention=True`` (linear attention takes it): refuse a
  map without that property, naming the maps that have it.
  """
  spec = _REGISTRY.get(name) if isinstance(name, str) else None
  if spec is None and positive is None and attention is None:
    raise ValueError(f'feature_map: unknown name {name!r}; known names: {sorted(_REGISTRY)}.')
  fits = names(positive=positive, attention=attention)
  if spec is None:
    raise ValueError(f'feature_map must be one of {fits}, got {name!r}.')
  if positive is not None and (spec.log_psi is not None) != positive:
    what = 'attention maps' if positive else 'signed maps'
    why = 'a signed map: no log ψ' if positive else 'a positive map'
    raise ValueError(f'feature_map must be one of the {what} {fits}, got {name!r} ({why}).')
  if attention and not spec.attention:
    raise ValueError(f'feature_map: {name!r} is not non-negative and its kernel is not '
                     f'positive; use an attention map {fits}.')
  if attention is False and spec.attention:
    raise ValueError(f'feature_map must be one of {fits}, got {name!r}.')
  return spec


def names(*, positive: Optional[bool] = None, attention: Optional[bool] = None) -> tuple:
  """The registered names, in registration order; ``positive``: only the maps with (True)
  or without (False) a log ψ; ``attention``: only those linear attention takes (or not)."""
  return tuple(n for n, m in _REGISTRY.items()
               if (positive is None or (m.log_psi is not None) == positive)
               and (attention is None or m.attention == attention))


register('rff', phi=rff, per_particle=2)
register('favor', log_psi=_log_psi_favor, phi=favor)
register('elu', log_psi=_log_psi_elu, phi=elu)
register('softplus', log_psi=_log_psi_softplus, phi=softplus)
register('sigmoid2', log_psi=_log_psi_sigmoid2, phi=sigmoid2)
register('cos2', log_psi=_log_psi_cos2, phi=cos2)
register('softmaxfeat', log_psi=_log_psi_softmaxfeat, phi=softmaxfeat, per_particle=2,
         separable=False)
register('porf_softplus', log_psi=_log_psi_porf_softplus, phi=porf_softplus)
register('hedgehog', log_psi=_log_psi_hedgehog, phi=hedgehog, per_particle=2)
register('taylor', phi=taylor, separable=False, attention=True,
         num_features=lambda n: 1 + n + n * n)
_BUILTIN = frozenset(_REGISTRY)


class _Maps(collections.abc.Mapping):
  """``FEATURE_MAPS``: name → φ of every registered map (a live view of the registry)."""

  def __getitem__(self, name):
    if name not in _REGISTRY:
      raise KeyError(name)
    return _REGISTRY[name].phi

  def __iter__(self):
    return iter(_REGISTRY)

  def __len__(self):
    return len(_REGISTRY)

  def __repr__(self):
    return f'FEATURE_MAPS({list(_REGISTRY)})'


FEATURE_MAPS = _Maps()
"""Name → φ of every registered map (``register``): ``rff`` (the synthetic study's),
the paper's seven attention maps, ``hedgehog`` and ``taylor``, and any added at run time."""

ATTENTION_FEATURE_MAPS = ('favor', 'elu', 'softplus', 'sigmoid2', 'cos2',
                          'softmaxfeat', 'porf_softplus')
"""The paper's seven attention maps, in its order (kept for one release; the text study's own
list is ``configs/text.py`` ``MAPS``; new code should use ``names``)."""


def num_features(name: str, num_particles: int) -> int:
  """F, the length of φ(x), for ``num_particles`` particles of the map ``name``: 2N for
  ``rff``, ``softmaxfeat`` and ``hedgehog`` ([·(s), ·(−s)] or [cos s, sin s]), 1 + N + N²
  for ``taylor``, N otherwise (a registered map: its ``num_features``)."""
  return get(name).num_features(num_particles)


def get_feature_map(name: Union[str, FeatureMap]) -> FeatureMap:
  """The feature map called ``name`` (its φ); a callable is returned unchanged."""
  if callable(name):
    return name
  if not isinstance(name, str) or name not in _REGISTRY:
    raise ValueError(
        f'feature_map: unknown name {name!r}; known names: {sorted(_REGISTRY)}.')
  return _REGISTRY[name].phi


def is_separable(feature_map: Union[str, FeatureMap]) -> bool:
  """Whether feature k depends on ω_k only (so the data term splits per particle).

  A registered map: its ``separable`` (False for ``softmaxfeat`` and ``taylor``); a user
  callable counts as separable only if it carries the attribute ``separable = True``.
  """
  if isinstance(feature_map, str):
    get_feature_map(feature_map)
    return _REGISTRY[feature_map].separable
  for spec in _REGISTRY.values():
    if feature_map is spec.phi:
      return spec.separable
  return bool(getattr(feature_map, 'separable', False))
