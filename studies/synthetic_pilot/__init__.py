"""The validation pilot that set the synthetic study's η and β (``docs/synthetic.md``).

``python -m studies.synthetic_pilot --config=configs/synthetic.py --workdir=workdir/pilot``.
"""
