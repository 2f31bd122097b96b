"""Phase A's drift against the Langevin noise, per particle and step (``docs/results.md``;
``results/phase_a_drift_<dataset>[_trained].{json,md}``).

``python -m studies.phase_a_drift --out=results --config.dataset=rotten_tomatoes``
(``command``; settings in ``config``); the page again from its JSON alone, nothing computed:
``python -m studies.phase_a_drift --page_from_results --config.dataset=rotten_tomatoes``.
"""
