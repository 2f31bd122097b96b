"""Trained softmax MQAR models converted to linear attention (``docs/recall.md``).

``python -m studies.mqar_convert --teachers=workdir/mqar/main --workdir=workdir/mqar/convert``
(``command``); ``convert``: one conversion (the teacher's weights copied, the features
fitted to its queries and keys, then fine-tuned).
"""
