"""Phase A's drift against the Langevin noise, per particle and step (``docs/results.md``;
``results/phase_a_drift_<dataset>[_trained].{json,md}``).

``python -m studies.phase_a_drift --dataset=rotten_tomatoes --out=results`` (``command``).
"""
