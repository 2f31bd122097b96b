"""What a step reads from the batch and the model: the encoder's positional inputs, a forward
pass, the intermediates the attention layers sow, the label target's labels and weights."""

from typing import Any, Callable, Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from coulomb_jax.layers import flax_attention
from coulomb_jax.training.state import particle_leaves

PHASE_A_INPUTS = flax_attention.PHASE_A_INPUTS


def encoder_inputs(batch) -> tuple:
  """``models.EncoderClassifier``'s positional inputs: ``(ids, segments, mask)``."""
  return tuple(_field(batch, name, 'inputs') for name in ('ids', 'segments', 'mask'))


def _field(batch, name: str, argument: str):
  """``batch[name]``, or one line naming the builder argument that says where it is."""
  try:
    return batch[name]
  except (KeyError, TypeError):
    signature = '(outputs, batch)' if argument == 'loss' else 'batch'
    raise ValueError(f'{argument}: the batch has no {name!r}; pass {argument}=lambda '
                     f'{signature}: ... to the step builder (it reads what your model '
                     'needs).') from None


def _model_call(inputs, apply_kwargs, encoder_kwargs):
  """(inputs function, keyword arguments): the encoder's defaults unless ``inputs`` is given."""
  if inputs is None:
    return encoder_inputs, dict(encoder_kwargs if apply_kwargs is None else apply_kwargs)
  if not callable(inputs):
    raise ValueError(f'inputs must be a function batch -> tuple of model inputs, got '
                     f'{type(inputs).__name__}.')
  return inputs, dict(apply_kwargs or {})


def forward(model: nn.Module, params, batch, *, inputs: Optional[Callable] = None, **kwargs):
  """``model.apply({'params': params}, *inputs(batch), **kwargs)`` (default ``encoder_inputs``)."""
  args = (encoder_inputs if inputs is None else inputs)(batch)
  if not isinstance(args, (tuple, list)):
    args = (args,)
  return model.apply({'params': params}, *args, **kwargs)


def sown(model: nn.Module, params, batch, name: str, *, inputs: Optional[Callable] = None,
         apply_kwargs: Optional[Dict[str, Any]] = None) -> Dict[Tuple[str, ...], Any]:
  """``{path of the sowing module: value}`` of what the kernel layers sow under ``name``
  (``PHASE_A_INPUTS`` or ``flax_attention.MIMICRY_INPUTS``) on one batch, no gradient.

  Every path must hold particles (``KernelAttention``, or the module passed as
  ``sow_into`` to ``kernel_attention_fn``); none sown is one ValueError.
  """
  fn, kwargs = _model_call(inputs, apply_kwargs, {'deterministic': True})
  _, state = forward(model, params, batch, inputs=fn, mutable=['intermediates'], **kwargs)
  flat = traverse_util.flatten_dict(state.get('intermediates', {}))
  out = {k[:-1]: jax.tree.map(jax.lax.stop_gradient, v[0]) for k, v in flat.items()
         if k[-1] == name}
  if not out:
    raise ValueError(f'model: no attention layer sowed {name!r}; its attention layers must be '
                     'models.KernelAttention or flax_attention.kernel_attention_fn(omega, '
                     'sow_into=self) with omega = models.particles_param(self, ...).')
  holders = set(particle_leaves(params))
  missing = sorted('/'.join(p) for p in out if p not in holders)
  if missing:
    raise ValueError(f'model: {missing} sowed {name!r} but hold no particles; make omega with '
                     'models.particles_param(self, ...) in the module passed as sow_into.')
  return out


def phase_a_inputs(model: nn.Module, params, batch, *, inputs: Optional[Callable] = None,
                   apply_kwargs: Optional[Dict[str, Any]] = None
                   ) -> Dict[Tuple[str, ...], jax.Array]:
  """``{path of the attention module: r [B, H, D_h]}`` for one batch (no gradient)."""
  return sown(model, params, batch, PHASE_A_INPUTS, inputs=inputs, apply_kwargs=apply_kwargs)


def _has(batch, name: str) -> bool:
  try:
    batch[name]  # pylint: disable=pointless-statement
    return True
  except (KeyError, TypeError, IndexError):
    return False


def _labels_and_weights(batch, labels, weights):
  y = _field(batch, 'labels', 'labels') if labels is None else labels(batch)
  if weights is not None:
    return y, weights(batch)
  if labels is None or _has(batch, 'weights'):
    return y, _field(batch, 'weights', 'weights')
  return y, jnp.ones(jnp.shape(y), jnp.float32)
