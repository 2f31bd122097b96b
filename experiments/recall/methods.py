r"""The attention methods of the recall study, each one name for one map, at equal state size.

=======================  ==========================================================================
``softmax``              causal softmax attention (the reference; no features).
``elu``                  elu(xΩᵀ) + 1 on N block-orthogonal random projections, frozen.
``taylor``               Based's second-order Taylor map [1, s, vec(s sᵀ)/√2] (scaled, see
                         ``features.taylor``) on d' projections s = xΩᵀ trained by AdamW with
                         the rest; d' chosen so that 1 + d' + d'² ≤ N is largest (N = 64: d' = 7,
                         57 features).
``favor_orthogonal``     FAVOR+ exp(ωᵀx − ‖x‖²/2), N block-orthogonal ω per head, frozen
                         (Zoology's Performer without redraws).
``hedgehog``             Zhang et al.'s [e^{Wx}, e^{−Wx}] (``features.hedgehog``): N/2 rows of W
                         per head started at the identity, trained by AdamW on the task loss.
``hedgehog_distilled``   the same map and init; W's gradient is the task gradient *plus* the
                         gradient of Hedgehog's attention-distillation loss (cross-entropy
                         between the layer's softmax and linear attention rows on its own
                         queries and keys,
                         ``training.lm.MimicrySettings(with_task_gradient=True)``).
``particles_softmax``    FAVOR+ features of N particles, started block-orthogonal, moved by
                         projected Langevin on the softmax-mimicry Hamiltonian D + λ·W_s of the
                         layer's own queries and keys, every step, while AdamW trains the rest;
                         λ set at step 0 so the median repulsion force is ``relative_lam`` of the
                         median target force, β so the median drift is ``drift_to_noise``
                         times the noise.
``particles_flow``       the same target, features, init and step size with λ = 0 and no noise
                         (β = ∞): plain projected gradient flow. The pair isolates the Coulomb
                         terms.
``softmaxfeat_trained``  the method the first grids called ``hedgehog``: one softmax over
                         [Wx, −Wx] (``softmaxfeat``), N/2 random orthogonal rows, trained by
                         AdamW on the task loss. Kept so the old grids rerun under their map's
                         name.
``favor_mimicry``        ``particles_flow``'s features and init, trained by AdamW (with the
                         rest's rate and weight decay, no ball) on the distillation gradient
                         alone, as in ``particles_flow`` (no task gradient).
``hedgehog_mimicry``     ``hedgehog_distilled``'s map and init, trained by AdamW on the
                         distillation gradient alone (no task gradient).
=======================  ==========================================================================

State size (``state_size``): what a layer carries from one token to the next at inference,
per layer, summed over heads: F × D_h per head for a linear map (F = the length of φ, the
numerator state S = Σ φ(k) vᵀ; the normaliser's F more are not counted), 2·L·E for softmax
(its key and value cache at length L).

The last two go from ``particles_flow`` to ``hedgehog_distilled`` (which differ in map,
gradient and optimiser) one part at a time: ``particles_flow`` → ``favor_mimicry`` (the
optimiser: projected gradient flow at the pilot's constant η, clipped at ``clip_norm``, on
the ball of ``radius`` → AdamW at the rest's cosine rate with its weight decay, no clip, no
ball) → ``hedgehog_mimicry`` (the map: N block-orthogonal FAVOR+ rows → Zhang et al.'s
[e^{Wx}, e^{−Wx}] with N/2 rows from the identity, the same state size) →
``hedgehog_distilled`` (the gradient: the task gradient added).
"""

from typing import NamedTuple, Optional

import jax
import optax

from coulomb_jax import features
from coulomb_jax import langevin
from coulomb_jax.layers import lm
from coulomb_jax import training

METHODS = ('softmax', 'elu', 'taylor', 'favor_orthogonal', 'hedgehog', 'hedgehog_distilled',
           'particles_softmax', 'particles_flow', 'softmaxfeat_trained', 'favor_mimicry',
           'hedgehog_mimicry')
LANGEVIN_METHODS = ('particles_softmax', 'particles_flow')
"""The methods whose particles move by ``langevin.langevin_transform`` on the mimicry force."""
MIMICRY_ADAMW_METHODS = ('hedgehog_distilled', 'favor_mimicry', 'hedgehog_mimicry')
"""The methods whose particles (W) AdamW trains on the distillation gradient (λ = 0)."""
HEDGEHOG_METHODS = ('hedgehog', 'hedgehog_distilled', 'hedgehog_mimicry')
"""Zhang et al.'s map [e^{Wx}, e^{−Wx}], W of N/2 rows from the identity."""

FEATURE_MAP = {'elu': 'elu', 'taylor': 'taylor', 'favor_orthogonal': 'favor',
               'hedgehog': 'hedgehog', 'hedgehog_distilled': 'hedgehog',
               'particles_softmax': 'favor', 'particles_flow': 'favor',
               'softmaxfeat_trained': 'softmaxfeat', 'favor_mimicry': 'favor',
               'hedgehog_mimicry': 'hedgehog'}
"""Each kernel method's map (``features``)."""


class Method(NamedTuple):
  """How one method is built: the model, the particles' optax transformation, the force."""
  model: lm.CausalLM
  particle_tx: Optional[optax.GradientTransformation]   # None: AdamW with the rest
  mimicry: Optional[training.lm.MimicrySettings]                 # None: the task gradient
  feature_map: str


def taylor_dim(num_features: int) -> int:
  """The largest d' ≥ 1 with 1 + d' + d'² ≤ ``num_features`` (1 if none)."""
  d = 1
  while 1 + (d + 1) + (d + 1) ** 2 <= num_features:
    d += 1
  return d


def rows_per_head(method: str, num_features: int) -> int:
  """Rows M of the particle array for N = ``num_features`` features per head."""
  if method in HEDGEHOG_METHODS + ('softmaxfeat_trained',):
    return num_features // 2
  if method == 'taylor':
    return taylor_dim(num_features)
  return num_features


def state_size(method: str, num_features: int, width: int, num_heads: int,
               seq_len: int) -> int:
  """Per layer: H·F·D_h for a linear map (F = length of φ), 2·L·E for softmax."""
  if method == 'softmax':
    return 2 * seq_len * width
  f = features.num_features(FEATURE_MAP[method], rows_per_head(method, num_features))
  return num_heads * f * (width // num_heads)


def mimicry_settings(config, lam: float) -> training.lm.MimicrySettings:
  """The mimicry force of ``config.method`` with repulsion weight ``lam``."""
  p = config.particles
  adamw = config.method in MIMICRY_ADAMW_METHODS           # no repulsion
  return training.lm.MimicrySettings(lam=0.0 if adamw else lam, riesz_s=p.riesz_s,
                                     softening=p.softening, target=p.target, rows=p.rows,
                                     with_task_gradient=config.method == 'hedgehog_distilled')


def build(config, key: jax.Array, *, lam: Optional[float] = None,
          beta: Optional[float] = None, step_size: Optional[float] = None) -> Method:
  """The ``Method`` of ``config.method``; ``key`` seeds the Langevin noise.

  ``lam``, ``beta``: the Langevin methods' repulsion weight and inverse temperature when
  calibrated at step 0 (None: ``config.particles.lam`` / ``.beta``); ``particles_flow``
  always has λ = 0 and β = ∞. ``step_size``: η (None: ``config.particles.step_size``);
  with ``config.particles.schedule = 'cosine'`` step t moves by η·½(1 + cos(πt/T)),
  T = ``config.train.steps`` (drift and noise annealed with the rest's rate).
  All three may be traced (one value per run of a vmapped program, ``batched``).
  """
  m, p = config.model, config.particles
  common = dict(vocab_size=config.data.vocab_size, max_len=config.data.seq_len,
                width=m.width, num_layers=m.num_layers, num_heads=m.num_heads,
                mlp_ratio=m.mlp_ratio)
  if config.method == 'softmax':
    return Method(lm.CausalLM(attention='softmax', **common), None, None, 'favor')
  feature_map = FEATURE_MAP[config.method]
  hedgehog = config.method in HEDGEHOG_METHODS
  model = lm.CausalLM(attention='kernel', feature_map=feature_map,
                      num_features=rows_per_head(config.method, m.num_features),
                      orthogonal=not hedgehog, identity_init=hedgehog,
                      chunk_size=m.chunk_size, causal_path=m.causal_path, **common)
  if config.method in ('hedgehog', 'taylor', 'softmaxfeat_trained'):
    return Method(model, None, None, feature_map)
  if config.method in MIMICRY_ADAMW_METHODS:
    return Method(model, None, mimicry_settings(config, 0.0), feature_map)
  if config.method in ('favor_orthogonal', 'elu'):
    return Method(model, optax.set_to_zero(), None, feature_map)
  if config.method == 'particles_flow':
    lam, beta = 0.0, float('inf')
  else:
    lam = p.lam if lam is None else lam
    beta = p.beta if beta is None else beta
  step_size = p.step_size if step_size is None else step_size
  if p.schedule == 'cosine':              # η follows the rest's cosine over the run
    step_size = optax.cosine_decay_schedule(step_size, config.train.steps)
  tx = langevin.langevin_transform(key, step_size=step_size, beta=beta, radius=p.radius,
                                   clip_norm=p.clip_norm)
  return Method(model, tx, mimicry_settings(config, lam), feature_map)
