r"""Pieces shared by the launch configs: the variant parser and the Langevin and repulsion
fields, each field and its comment written once.

A config calls them on one of its sections::

  config.particles = ml_collections.ConfigDict()
  common.add_langevin(config.particles, step_size=1e-4, beta=1e5, clip_norm=10.0, radius=8.0)
  common.add_repulsion(config.particles, lam=1e-3, riesz_s='coulomb', softening=0.5,
                       relative_lam=0.0)

The fields keep the names the library's functions take (``langevin.langevin_step``,
``repulsion.riesz_energy``); a config's own rules (``relative_step``, ``gibbs_tilt``,
``drift_to_noise``, ...) stay in the config that uses them. Like every config, this module
imports neither ``experiments`` nor ``studies``.
"""

from typing import List, Optional, Union

import ml_collections


def variant_parts(variant: str) -> List[str]:
  """``'kernel-favor,quick'`` → ``['kernel-favor', 'quick']`` (empty parts dropped): the one
  parser of the ``config.py:<variant>`` strings; each config says what its parts mean."""
  if not isinstance(variant, str):
    raise TypeError(f'variant must be a string such as "quick" or "kernel-favor,quick", got '
                    f'{variant!r}.')
  return [p for p in variant.split(',') if p]


def add_langevin(section: ml_collections.ConfigDict, *, step_size: float, beta: float,
                 clip_norm: Union[float, ml_collections.FieldReference],
                 radius: Optional[float] = None) -> ml_collections.ConfigDict:
  """Sets the projected Langevin step's fields on ``section`` and returns it."""
  # Step size η: the drift of a particle is −η·N·clip(∇H).
  section.step_size = step_size
  # Inverse temperature β: the noise is √(2η/β)·ξ (β = inf: no noise).
  section.beta = beta
  # Global-norm clip of ∇H before the η·N factor (None: off).
  section.clip_norm = clip_norm
  if radius is not None:
    # Radius R of the ball every particle is projected onto after each step.
    section.radius = radius
  return section


def add_repulsion(section: ml_collections.ConfigDict, *, lam: float,
                  riesz_s: Union[str, float], softening: float,
                  relative_lam: Optional[float] = None) -> ml_collections.ConfigDict:
  """Sets the Riesz repulsion's fields on ``section`` and returns it."""
  # Repulsion weight λ of H = −(target term) + λ·W.
  section.lam = lam
  # Riesz exponent s of W = 1/N² Σ_{k≠l} (‖ω_k − ω_l‖² + ε²)^(−s/2) ('coulomb': s = D − 2
  # for particles of dimension D; 0: the log kernel).
  section.riesz_s = riesz_s
  # Softening ε of the Riesz kernel.
  section.softening = softening
  if relative_lam is not None:
    # 0 = lam as given; r > 0 = λ set at the start (of each stage) so that the median
    # particle's repulsion force is r × its median target force
    # (coulomb_jax.langevin_diagnostics.relative_lam).
    section.relative_lam = relative_lam
  return section
