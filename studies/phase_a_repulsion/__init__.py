"""Does stronger repulsion keep the particles apart (``docs/phase_a_learning.md``,
``results/phase_a_repulsion.json``), and what does Phase A on the softmax target do inside
the same encoders (``docs/softmax_mimicry.md``, ``results/phase_a_softmax.json``)?

``bash studies/phase_a_repulsion/run.sh`` (the runs, both parts), then
``python -m studies.phase_a_repulsion --runs=workdir/repulsion`` (``command``) and
``python -m studies.phase_a_repulsion.softmax --runs=workdir/repulsion`` (``softmax``).
"""
