"""Baselines the particles are compared with that are not feature maps of the registry.

* ``importance_sampling``: Sinha & Duchi (2016)'s learned random features, re-weighting a
  fixed draw by a convex program on the label alignment (``from coulomb_jax.baselines
  import importance_sampling``).
"""
