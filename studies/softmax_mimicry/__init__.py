"""At equal N, how close do particles fitted to softmax attention come to it, and how much of
a trained softmax encoder do they keep when they replace it? ``docs/softmax_mimicry.md``,
``results/softmax_mimicry.json``.

``python -m studies.softmax_mimicry --config=studies/softmax_mimicry/config.py
--runs=workdir/softmax --workdir=workdir/softmax_mimicry --out=results/softmax_mimicry.json
--page=docs/softmax_mimicry.md`` (``command``). Parts: ``encoders`` (the trained encoders and
their per-head queries and keys), ``fit`` (the fitting methods, ``coulomb_jax.conversion``),
``fidelity``, ``conversion``, ``study`` (one dataset and seed), ``collect``, ``page``.
"""
