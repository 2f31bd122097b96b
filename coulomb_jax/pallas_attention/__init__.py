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
stored features and ``causal_linear_attention``), so gradients (and training cost)
are the reference path's and the kernels serve the forward passes of inference
and evaluation.

Written against the Triton backend of ``jax.experimental.pallas``. On a CPU
(tests) the kernels run in Pallas interpret mode, with float32 dots.

Layout: this package is the public module; it re-exports the names above from
``bidirectional`` (the key and query kernels, ``use_by_default``, ``shape_supported``) and ``causal``
(the chunked kernel), and both build on ``core``: the feature maps, the float32
dots, the input plumbing, the checked block sizes, the interpret default and the
kernels-forward / XLA-backward wrapper.
"""

from coulomb_jax.pallas_attention.bidirectional import (pallas_linear_attention, shape_supported,
                                                     use_by_default)
from coulomb_jax.pallas_attention.causal import pallas_causal_linear_attention
from coulomb_jax.pallas_attention.core import PALLAS_FEATURE_MAPS
