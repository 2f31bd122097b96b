r"""The attention methods of the recall study, at an equal number N of features per head.

=====================  ==========================================================================
``softmax``            causal softmax attention (the reference; no features).
``favor_orthogonal``   FAVOR+ positive random features exp(ωᵀx − ‖x‖²/2), N block-orthogonal
                       ω per head, frozen (Performer without redraws).
``elu``                elu(xΩᵀ) + 1 on N block-orthogonal random projections, frozen.
``hedgehog``           Hedgehog-style φ(x) = softmax over [Wx, −Wx] (``softmaxfeat``): N/2 rows
                       of W per head give N features; W trained by AdamW with the rest of the
                       model on the task loss (the gradient-trained map).
``particles_softmax``  FAVOR+ features of N particles per head, started block-orthogonal and
                       moved by projected Langevin on the softmax-mimicry Hamiltonian of the
                       layer's own queries and keys, every step, while AdamW trains the rest
                       (Phase A interleaved with training; ``lm.MimicrySettings``).
=====================  ==========================================================================

Features are counted as the length of φ(x), not as parameters. Every kernel method starts
from the same kind of draw (block-orthogonal N(0, I) rows per head).
"""

from typing import NamedTuple, Optional

import jax
import optax

from coulomb_jax import langevin
from coulomb_jax import lm

METHODS = ('softmax', 'favor_orthogonal', 'elu', 'hedgehog', 'particles_softmax')


class Method(NamedTuple):
  """How one method is built: the model, the particles' optax transformation, the force."""
  model: lm.CausalLM
  particle_tx: Optional[optax.GradientTransformation]   # None: AdamW with the rest
  mimicry: Optional[lm.MimicrySettings]                 # None: the task gradient
  feature_map: str


def rows_per_head(method: str, num_features: int) -> int:
  """Rows M of the particle array for N = ``num_features`` features (hedgehog: N/2)."""
  return num_features // 2 if method == 'hedgehog' else num_features


def build(config, key: jax.Array) -> Method:
  """The ``Method`` of ``config.method``; ``key`` seeds the Langevin noise."""
  m, p = config.model, config.particles
  common = dict(vocab_size=config.data.vocab_size, max_len=config.data.seq_len,
                width=m.width, num_layers=m.num_layers, num_heads=m.num_heads,
                mlp_ratio=m.mlp_ratio)
  if config.method == 'softmax':
    return Method(lm.CausalLM(attention='softmax', **common), None, None, 'favor')
  feature_map = {'elu': 'elu', 'hedgehog': 'softmaxfeat'}.get(config.method, 'favor')
  model = lm.CausalLM(attention='kernel', feature_map=feature_map,
                      num_features=rows_per_head(config.method, m.num_features),
                      orthogonal=True, chunk_size=m.chunk_size,
                      causal_path=m.causal_path, **common)
  if config.method == 'hedgehog':
    return Method(model, None, None, feature_map)
  if config.method in ('favor_orthogonal', 'elu'):
    return Method(model, optax.set_to_zero(), None, feature_map)
  tx = langevin.langevin_transform(key, step_size=p.step_size, beta=p.beta, radius=p.radius,
                                   clip_norm=p.clip_norm)
  settings = lm.MimicrySettings(lam=p.lam, riesz_s=p.riesz_s, softening=p.softening,
                                target=p.target, rows=p.rows)
  return Method(model, tx, settings, feature_map)
