r"""Linear attention as Pallas kernels (GPU; interpret mode elsewhere).

* ``pallas_linear_attention(q, k, v, omega, ...)``: ``attention.fused_linear_attention``'s
  result from two kernels (keys in splits with per-feature online maxima, then
  queries), never storing the ``[B, L, H, M]`` features; ``fused_linear_attention``
  takes it by default on a single GPU (``use_by_default``).
* ``pallas_causal_linear_attention(q, k, v, omega, ...)``: the causal form in one
  kernel, one program per (batch, head) walking the chunks in order.

Both compute all seven maps of ``PALLAS_FEATURE_MAPS`` in log space
(``features.log_psi``), so each result is the kernel's exact ratio at any input
scale (see each function for the exceptions).

There is no backward kernel: under differentiation a ``jax.custom_vjp`` runs the
XLA path forward and backward (``fused_linear_attention``'s, or for the causal form
``xla.xla_fused_causal_linear_attention``), so gradients (and training cost)
are the reference path's and the kernels serve the forward passes of inference
and evaluation.

Written against the Triton backend of ``jax.experimental.pallas``. ``interpret=None``
(the default) is decided by the platform the program is lowered for, not the host
(``jax.lax.platform_dependent``): the compiled kernels for cuda, Pallas interpret mode
(float32 dots) for cpu, and for tpu the bidirectional Mosaic kernels of ``tpu`` (the
six maps of ``TPU_FEATURE_MAPS``; never run on a TPU) or, for softmaxfeat and the causal
kernel, a ValueError naming the call and the map (``attention``'s ``'auto'`` takes XLA on
TPU). Compiled, every matrix side (head dims, blocks, chunk) must be a power of two
≥ 16; other sizes are refused with a ValueError naming the value before lowering
(``core.triton_problem``). ``precision`` reaches every product, kernels included.

Layout: this package is the public module; it re-exports the names above from
``bidirectional`` (the key and query kernels, ``use_by_default``, ``shape_supported``) and ``causal``
(the chunked kernel), with ``tpu`` the bidirectional Mosaic kernels, and all build on ``core``: the feature maps, the float32
dots, the input plumbing, the checked block sizes and Triton shape rules, the
interpret decision by platform and the kernels-forward / XLA-backward wrapper.
"""

from coulomb_jax.attention.pallas.bidirectional import (pallas_linear_attention, shape_supported,
                                                        use_by_default)
from coulomb_jax.attention.pallas.causal import pallas_causal_linear_attention
from coulomb_jax.attention.pallas.core import PALLAS_FEATURE_MAPS
from coulomb_jax.attention.pallas.tpu import TPU_FEATURE_MAPS
