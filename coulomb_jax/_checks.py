"""Argument checks shared by the public functions.

Every check raises ``ValueError`` naming the argument and its value. Shape
checks only read static shapes, so they run at trace time and jit users see
them too. Scalar checks run whenever the value is concrete (a Python number or
a concrete array); a traced hyper-parameter cannot be inspected and is passed
through unchecked.
"""

from typing import Any, Optional

import jax
import numpy as np


def concrete_float(value: Any) -> Optional[float]:
  """``float(value)`` if the value is concrete, else ``None`` (a tracer)."""
  try:
    return float(value)
  except (jax.errors.ConcretizationTypeError,
          jax.errors.TracerArrayConversionError, TypeError):
    return None


def check_rank(name: str, x: Any, rank: int) -> None:
  if np.ndim(x) != rank:
    raise ValueError(
        f'{name} must have rank {rank}, got shape {np.shape(x)} (rank {np.ndim(x)}).')


def check_min_rank(name: str, x: Any, rank: int) -> None:
  if np.ndim(x) < rank:
    raise ValueError(
        f'{name} must have rank >= {rank}, got shape {np.shape(x)} (rank {np.ndim(x)}).')


def check_particles(name: str, omega: Any) -> None:
  """``omega: [N, d]`` with N >= 1 and d >= 1."""
  check_rank(name, omega, 2)
  num, dim = np.shape(omega)
  if num == 0 or dim == 0:
    raise ValueError(
        f'{name} must hold at least one particle of dimension >= 1, got shape '
        f'{np.shape(omega)}.')


def check_same_last_dim(name_a: str, a: Any, name_b: str, b: Any) -> None:
  if np.shape(a)[-1] != np.shape(b)[-1]:
    raise ValueError(
        f'last dimensions differ: {name_a} has shape {np.shape(a)}, {name_b} has '
        f'shape {np.shape(b)}.')


def check_labels(phi_name: str, phi: Any, y_name: str, y: Any) -> None:
  """``y: [n]`` with the same ``n`` as the leading axis of ``phi``."""
  check_rank(y_name, y, 1)
  if np.shape(y)[0] != np.shape(phi)[0]:
    raise ValueError(
        f'{y_name} has {np.shape(y)[0]} labels but {phi_name} has '
        f'{np.shape(phi)[0]} samples (shapes {np.shape(y)} and {np.shape(phi)}).')


def check_int(name: str, value: Any, low: int, high: Optional[int] = None) -> int:
  """An integer (Python or numpy, not bool) in [low, high]; returned as ``int``."""
  ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
  if not ok or value < low or (high is not None and value > high):
    bound = f'in [{low}, {high}]' if high is not None else f'>= {low}'
    raise ValueError(f'{name} must be an integer {bound}, got {value!r}.')
  return int(value)


def check_positive(name: str, value: Any) -> None:
  v = concrete_float(value)
  if v is not None and not v > 0:  # `not >` also rejects NaN.
    raise ValueError(f'{name} must be > 0, got {value!r}.')


def check_nonnegative(name: str, value: Any) -> None:
  v = concrete_float(value)
  if v is not None and not v >= 0:
    raise ValueError(f'{name} must be >= 0, got {value!r}.')
