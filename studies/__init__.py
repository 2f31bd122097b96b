"""The studies: one package per committed study (``studies/README.md``).

A study may import the library (``coulomb_jax``) and the tools' parts (``experiments.*``
packages), never another study's command. Launch one with ``python -m studies.<name>``.
"""
