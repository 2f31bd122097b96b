"""The Flax side of the library: the layers a model is built from.

* ``models``: ``KernelAttention`` (multi-head linear attention on a ``particles``
  parameter; causal or not, shared or projected queries and keys), ``SoftmaxAttention``,
  ``LinformerAttention``, the encoder classifier, and ``particles_param`` to create the
  particles inside a user's ``@nn.compact`` method;
* ``flax_attention``: ``kernel_attention_fn``, an ``attention_fn`` for
  ``nn.MultiHeadDotProductAttention`` (no flax import), and the names the layers sow
  (``PHASE_A_INPUTS``, ``MIMICRY_INPUTS``);
* ``lm``: the causal LM on MQAR (its optimiser and train step: ``training.lm``).

Only ``flax_attention`` is imported here (``import coulomb_jax`` keeps flax out):
``from coulomb_jax.layers import models``.
"""

from coulomb_jax.layers import flax_attention
