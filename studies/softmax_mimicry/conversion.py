r"""Converting a trained softmax encoder to linear attention with fitted features.

Every head's softmax attention is replaced by linear attention with that head's fitted
rows: the encoder is rebuilt with ``attention_fns`` (``models.EncoderClassifier``), one
``flax_attention.kernel_attention_fn(omega_layer [H, M, d])`` per layer
(``coulomb_jax.conversion.linear_attention_fns``), which ``nn.MultiHeadDotProductAttention``
calls on its own projections; the parameters are the trained ones, unchanged. Measured on
the test split:

* ``zero_shot``: the converted model as it is;
* ``finetuned``: after one short epoch (``conversion.finetune_rows`` training rows, batch
  ``conversion.batch_size``, AdamW at a constant ``conversion.learning_rate``, global-norm
  clip 1, the run's dropout) that trains every parameter but the features, which stay
  frozen (they are constants of the attention functions).

``recovery`` = finetuned accuracy / softmax accuracy (the softmax model as trained);
``zero_shot_recovery`` the same before fine-tuning.
"""

from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np
import optax

from coulomb_jax import conversion as lib_conversion
from coulomb_jax import metrics as metrics_lib
from coulomb_jax import training
from coulomb_jax.tasks import data

METRICS = ('accuracy', 'log_loss', 'ece')


def converted_model(encoder, omega: jax.Array, feature_map: str):
  """The encoder with each head's attention linear: ``omega: [G = layers·H, M, d]``
  (``coulomb_jax.conversion.linear_attention_fns``, one per layer)."""
  m = encoder.config.model
  layout = tuple(((f'attention_{i}', 'mha'), m.num_heads) for i in range(m.num_layers))
  omegas = lib_conversion.split_heads(jnp.asarray(omega), layout)
  return encoder.model.clone(attention_fns=lib_conversion.linear_attention_fns(omegas,
                                                                                feature_map))


def evaluate(model, params, rows: data.Encoded, batch_size: int = 256,
             pad_multiple: int = 16) -> Dict[str, float]:
  """``{accuracy, log_loss, ece}`` of ``model`` on ``rows`` (no dropout)."""
  predict = jax.jit(training.make_predict(model))
  probs = []
  for batch in data.batches(rows, batch_size, pad_multiple=pad_multiple):
    p = np.asarray(predict(params, batch))
    probs.append(p[batch['weights'] > 0])
  probs = np.clip(np.concatenate(probs).astype(np.float64), 0.0, 1.0)
  out = metrics_lib.classification_metrics(rows.labels, probs)
  return {k: float(out[k]) for k in METRICS}


def finetune(key: jax.Array, model, params, rows: data.Encoded, *, batch_size: int,
             learning_rate: float, seed: int, pad_multiple: int = 16):
  """``params`` after one epoch over ``rows`` (shuffled with ``seed``); returns them."""
  opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate))
  step = jax.jit(training.make_phase_b_step(model, opt))
  state = training.TrainState(jnp.zeros((), jnp.int32), params, opt.init(params))
  for batch in data.batches(rows, batch_size, seed=seed, pad_multiple=pad_multiple,
                            drop_remainder=True):
    state, _ = step(key, state, batch)
  return state.params
