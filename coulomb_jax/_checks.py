"""Argument checks shared by the public functions.

Every check raises ``ValueError`` naming the argument and its value. Shape
checks only read static shapes, so they run at trace time and jit users see
them too. Scalar checks run whenever the value is concrete (a Python number or
a concrete array); a traced hyper-parameter cannot be inspected and is passed
through unchecked. Numbers passed as strings (``step_size='0.1'``) are refused,
not parsed. ``check_positive`` and ``check_nonnegative`` refuse NaN and ±inf; a caller
where +∞ has a meaning (β = ∞, R = ∞) passes ``allow_inf=True``. ``check_finite``
looks at the values of concrete arrays only (eager calls; under ``jit`` the inputs are
tracers and it does nothing), so it costs one device-to-host read per eager call and
nothing inside compiled code.
"""

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(value: Any) -> bool:
  """Whether ``value`` can be inspected now (not a tracer of ``jit``/``grad``/``vmap``)."""
  return not isinstance(value, jax.core.Tracer)


def concrete_float(value: Any, name: str = 'value') -> Optional[float]:
  """``float(value)`` if the value is a concrete scalar, else ``None`` (a tracer).

  A string or bytes raises ``ValueError`` naming ``name``: ``'0.1'`` is not a number.
  """
  if isinstance(value, (str, bytes)):
    raise ValueError(f'{name} must be a number, got the string {value!r}.')
  if not is_concrete(value):
    return None
  try:
    return float(value)
  except (jax.errors.ConcretizationTypeError,
          jax.errors.TracerArrayConversionError, TypeError):
    return None


def _scalar(name: str, value: Any) -> Optional[float]:
  """A real scalar (Python, numpy or a 0-d array) as ``float``; ``None`` when traced."""
  if isinstance(value, (str, bytes)):
    raise ValueError(f'{name} must be a number, got the string {value!r}.')
  if value is None or isinstance(value, bool):
    raise ValueError(f'{name} must be a number, got {value!r}.')
  if not is_concrete(value):
    return None
  if np.ndim(value) != 0:
    raise ValueError(f'{name} must be a scalar, got shape {np.shape(value)}.')
  try:
    return float(value)
  except TypeError:
    raise ValueError(f'{name} must be a real number, got {value!r}.') from None


def check_finite(name: str, x: Any) -> None:
  """No NaN or ±inf in a concrete floating array (tracers and integers pass).

  Reads the values with numpy, so a concrete array closed over by a traced
  function is checked at trace time and nothing is staged into the computation.
  """
  if x is None or not is_concrete(x):
    return
  a = np.asarray(x)
  if not jnp.issubdtype(a.dtype, jnp.inexact):
    return
  if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating)):
    a = a.astype(np.float32)                                 # bf16 and other ml_dtypes
  bad = ~np.isfinite(a)
  if bad.any():
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(
        f'{name} must be finite, got {a[first]} at index {first} ({int(bad.sum())} of '
        f'{bad.size} entries NaN or inf, shape {a.shape}).')


def _describe(value: Any) -> str:
  """One line for an error message: an array by dtype and shape (its repr can span lines)."""
  shape, dtype = getattr(value, 'shape', None), getattr(value, 'dtype', None)
  if shape is not None and dtype is not None and (len(shape) or jax.dtypes.issubdtype(
      dtype, jax.dtypes.prng_key)):
    return f'an array of dtype {dtype} and shape {tuple(shape)} ({type(value).__name__})'
  return f'{value!r} ({type(value).__name__})'


def check_key(name: str, key: Any) -> None:
  """Exactly one JAX PRNG key: a typed key of shape () (``jax.random.key``) or a raw
  ``uint32[2]`` one (``jax.random.PRNGKey``); one TypeError naming ``name`` and the value
  otherwise (instead of jax's "invalid PRNG key data" from inside the call). A batch of keys
  (``jax.random.split(key, n)``) is refused too: the functions draw from one key, so vmap
  over the batch instead. Shapes are static, so this also runs under jit and vmap."""
  dtype = getattr(key, 'dtype', None)
  typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
  raw = (dtype is not None and not typed and np.dtype(dtype) == np.uint32
         and np.shape(key)[-1:] == (2,))
  if (typed and np.shape(key) == ()) or (raw and np.shape(key) == (2,)):
    return
  expected = f'{name} must be a JAX PRNG key (jax.random.key(seed))'
  if typed or raw:
    shape = np.shape(key)
    count = math.prod(shape[:-1] if raw else shape)
    raise TypeError(f'{expected}, got a batch of {count} {"raw " if raw else ""}keys of '
                    f'shape {shape} ({dtype}); pass one key, or jax.vmap over the batch.')
  raise TypeError(f'{expected}, got {_describe(key)}.')


def check_ids(name: str, ids: Any, high: int, where: Any = None) -> None:
  """Integer ids with 0 <= id < ``high``; when concrete, checked at the positions
  where ``where`` (a bool mask of the same shape, or None = all) is True, naming the
  first bad value and its index. Float ids are a ValueError, not flax's own error."""
  dtype = np.dtype(ids.dtype if hasattr(ids, 'dtype') else np.asarray(ids).dtype)
  if dtype == np.bool_ or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f'{name} must be integers, got dtype {dtype}.')
  if not is_concrete(ids) or (where is not None and not is_concrete(where)):
    return
  a = np.asarray(ids)
  bad = (a < 0) | (a >= high)
  if where is not None:
    bad &= np.asarray(where, bool)
  if bad.any():
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(f'{name} must lie in [0, {high}), got {int(a[first])} at index {first} '
                     f'({int(bad.sum())} such entries).')


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
  """``y: [n]`` real labels with the same ``n`` as the leading axis of ``phi``.

  Numbers only (strings and booleans refused), finite, and, when concrete, a labelling
  with exactly two integer values must be ±1: the alignment's y_i·y_j counts a pair of
  classes {0, 1} or {3, 7} differently from ±1 without any error, so such labels are
  refused with the mapping to use (``2·y − 1``). Real-valued targets pass (the
  U-statistic is defined for them): only two integer values other than ±1 are refused."""
  check_rank(y_name, y, 1)
  if np.shape(y)[0] != np.shape(phi)[0]:
    raise ValueError(
        f'{y_name} has {np.shape(y)[0]} labels but {phi_name} has '
        f'{np.shape(phi)[0]} samples (shapes {np.shape(y)} and {np.shape(phi)}).')
  dtype = np.dtype(y.dtype if hasattr(y, 'dtype') else np.asarray(y).dtype)
  if dtype == np.bool_ or not (jnp.issubdtype(dtype, jnp.integer)
                               or jnp.issubdtype(dtype, jnp.inexact)):
    raise ValueError(f'{y_name} must hold numbers (±1 for two classes), got dtype {dtype}.')
  check_finite(y_name, y)
  if is_concrete(y):
    values = np.unique(np.asarray(y).astype(np.float64))
    if (values.size == 2 and np.array_equal(values, np.round(values))
        and not np.array_equal(values, [-1.0, 1.0])):
      raise ValueError(
          f'{y_name}: two-class labels must be ±1, got values {values.tolist()}; map '
          f'them first (for {{0, 1}}: 2·{y_name} − 1).')


def check_int(name: str, value: Any, low: int, high: Optional[int] = None) -> int:
  """An integer (Python or numpy, not bool) in [low, high]; returned as ``int``."""
  ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
  if not ok or value < low or (high is not None and value > high):
    bound = f'in [{low}, {high}]' if high is not None else f'>= {low}'
    raise ValueError(f'{name} must be an integer {bound}, got {value!r}.')
  return int(value)


def _check_bound(name: str, value: Any, ok, bound: str, allow_inf: bool) -> None:
  v = _scalar(name, value)
  if v is None:
    return
  if not ok(v):                         # `not ok` also rejects NaN.
    raise ValueError(f'{name} must be {bound}, got {value!r}.')
  if v == math.inf and not allow_inf:
    raise ValueError(f'{name} must be a finite number {bound}, got {value!r}.')


def check_positive(name: str, value: Any, allow_inf: bool = False) -> None:
  """A finite number > 0; NaN, ±inf, strings and non-scalars are refused.

  ``allow_inf=True`` also lets +∞ through, for the arguments where it means something
  (an inverse temperature β = ∞: no noise; a radius R = ∞: no projection).
  """
  _check_bound(name, value, lambda v: v > 0, '> 0', allow_inf)


def check_nonnegative(name: str, value: Any, allow_inf: bool = False) -> None:
  """A finite number >= 0; NaN, ±inf, strings and non-scalars are refused
  (``allow_inf=True``: +∞ allowed, as ``check_positive``)."""
  _check_bound(name, value, lambda v: v >= 0, '>= 0', allow_inf)


PRECISIONS = ('default', 'high', 'highest')
"""``precision`` as a string (or a ``jax.lax.Precision``, or None: the backend's default)."""


def check_precision(precision):
  """``precision`` as a ``jax.lax.Precision`` or None; a bad value names the argument."""
  if precision is None or isinstance(precision, jax.lax.Precision):
    return precision
  if isinstance(precision, str) and precision.lower() in PRECISIONS:
    return jax.lax.Precision[precision.upper()]
  raise ValueError(f'precision must be None, a jax.lax.Precision or one of {PRECISIONS}, '
                   f'got {precision!r}.')
