"""Does Phase A learn inside the Transformer, and does it help? ``docs/phase_a_learning.md``.

``python -m studies.phase_a_learning --runs=workdir/learn --pilots=results
--out=results/phase_a_learning.json --docs=docs/phase_a_learning.md`` (``command``): reads a
grid of ``experiments.train`` runs (Kernel-X, Ball-X, Vanilla-X) and reports the paired
differences and Phase A's diagnostics (the page and its paired figures: ``page``). The page
and its paired figures again from the JSON alone, no run read:
``python -m studies.phase_a_learning --page_from_results``.
"""
