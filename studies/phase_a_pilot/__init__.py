"""Which Phase A settings make the particles learn, chosen on validation rows only
(``docs/phase_a_learning.md``; ``results/phase_a_pilot_<dataset>.{json,md}``).

``python -m studies.phase_a_pilot --runs=workdir/learn --out=results
--config.dataset=rotten_tomatoes`` (``command``; settings in ``config``); the page again from
its JSON alone, nothing run: ``python -m studies.phase_a_pilot --page_from_results
--config.dataset=rotten_tomatoes``.
"""
