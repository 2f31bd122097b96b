r"""The library's argument checks, public: one ``ValueError`` (``TypeError`` for keys) that
names the argument and the value, before any compute.

Tools and studies validate their configs with these, so a bad field reads the same
wherever it is caught. Concrete values only: a traced value passes (under ``jit`` shapes
are checked, values are not).

=======================  ==================================================================
``check_int``            an integer (not a bool) in [low, high]; returned as ``int``.
``check_positive``       a finite number > 0 (``allow_inf=True``: +∞ too).
``check_nonnegative``    a finite number ≥ 0 (``allow_inf=True``: +∞ too).
``check_finite``         no NaN or ±inf in a concrete floating array.
``check_key``            exactly one JAX PRNG key (typed, or raw ``uint32[2]``).
``check_ids``            integer ids in [0, high) (where a mask says).
``check_rank``           ``x.ndim == rank``; ``check_min_rank``: ≥.
``check_particles``      a ``[N, d]`` particle array.
``check_precision``      None, a ``jax.lax.Precision`` or one of ``PRECISIONS``.
``is_concrete``          whether a value can be read now (not a tracer).
=======================  ==================================================================
"""

from coulomb_jax._checks import PRECISIONS
from coulomb_jax._checks import check_finite
from coulomb_jax._checks import check_ids
from coulomb_jax._checks import check_int
from coulomb_jax._checks import check_key
from coulomb_jax._checks import check_min_rank
from coulomb_jax._checks import check_nonnegative
from coulomb_jax._checks import check_particles
from coulomb_jax._checks import check_positive
from coulomb_jax._checks import check_precision
from coulomb_jax._checks import check_rank
from coulomb_jax._checks import is_concrete

__all__ = ['PRECISIONS', 'check_finite', 'check_ids', 'check_int', 'check_key',
           'check_min_rank', 'check_nonnegative', 'check_particles', 'check_positive',
           'check_precision', 'check_rank', 'is_concrete']
