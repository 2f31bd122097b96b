"""Recording a trained Flax model's attention: per layer and head, the queries, keys and
values and the masks (``record_attention``), stacked on one group axis (``stack_heads``)."""

import functools
import inspect
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from coulomb_jax import _checks
from coulomb_jax.layers import flax_attention
from coulomb_jax.layers import models

Path = Tuple[str, ...]

_PROJECTIONS = {'query': 'q', 'key': 'k', 'value': 'v', 'query_ln': 'q', 'key_ln': 'k'}


class AttentionRecord(NamedTuple):
  """One attention layer on one batch: per-head unscaled inputs of its attention.

  ``q: [H, B, L_q, D]``, ``k: [H, B, L_k, D]``, ``v: [H, B, L_k, D_v]`` (None for
  ``KernelAttention``, which sows no values), ``key_mask: [B, L_k]`` and
  ``query_mask: [B, L_q]`` bool, True = real (None: every token real).
  """
  q: Any
  k: Any
  v: Any
  key_mask: Any
  query_mask: Any


def _bound(module, args, kwargs):
  """The arguments of ``module.__call__(*args, **kwargs)`` by name."""
  bound = inspect.signature(type(module).__call__).bind(module, *args, **kwargs)
  return bound.arguments


def _masks(mask, shape_q, shape_k, self_attention):
  """``(key_mask [B, L_k], query_mask [B, L_q])`` of a layer's mask (None: all real).

  A flax mask ``[B | 1, H | 1, L_q | 1, L_k]``: key j is real when some query attends it,
  row i when it attends some key. A ``[B, L]`` mask (``KernelAttention``): the real keys,
  and the real rows too in self-attention.
  """
  if mask is None:
    return None, None
  m = jnp.asarray(mask, bool)
  (b, lq, h, _), lk = shape_q, shape_k[1]
  if m.ndim == 2:
    return m, (m if self_attention else None)
  if m.ndim != 4:
    raise ValueError(f'mask must be [B, L] or [B, H, L_q, L_k] (broadcastable), got shape '
                     f'{m.shape}.')
  m = jnp.broadcast_to(m, (b, h, lq, lk))
  return jnp.any(m, axis=(1, 2)), jnp.any(m, axis=(1, 3))


def attention_records(model: nn.Module, variables, batch, *, inputs: Optional[Callable] = None,
                      apply_kwargs: Optional[Dict[str, Any]] = None
                      ) -> Dict[Path, AttentionRecord]:
  """``{path: AttentionRecord}`` of every attention layer of ``model`` on one batch (jittable).

  ``path``: the module path of each ``nn.MultiHeadDotProductAttention`` (its ``query``,
  ``key``, ``value`` projections, after ``query_ln``/``key_ln`` with ``normalize_qk``) and
  each ``models.KernelAttention`` (its sown ``MIMICRY_INPUTS``), in call order.
  ``inputs(batch)``: the positional arguments of ``model.apply`` after the variables
  (default ``(batch,)``); ``apply_kwargs``: its keyword arguments. No gradient flows
  back through the records (``stop_gradient``).
  """
  args = (batch,) if inputs is None else tuple(inputs(batch))
  parts: Dict[Path, Dict[str, Any]] = {}

  def interceptor(next_fun, call_args, call_kwargs, context):
    module = context.module
    if context.method_name != '__call__':
      return next_fun(*call_args, **call_kwargs)
    if isinstance(module, (nn.MultiHeadDotProductAttention, models.KernelAttention)):
      if module.path in parts:
        raise ValueError(f'model: the attention layer {"/".join(module.path)} ran twice in '
                         'one apply; record_attention keeps one record per layer.')
      named = _bound(module, call_args, call_kwargs)
      self_attention = all(named.get(n) is None for n in ('inputs_k', 'inputs_kv'))
      parts[module.path] = dict(mask=named.get('mask'), self_attention=self_attention,
                                kernel=isinstance(module, models.KernelAttention))
    out = next_fun(*call_args, **call_kwargs)
    parent = module.parent
    if (isinstance(parent, nn.MultiHeadDotProductAttention) and module.name in _PROJECTIONS
        and parent.path in parts):
      parts[parent.path][_PROJECTIONS[module.name]] = out
    return out

  with nn.intercept_methods(interceptor):
    _, state = model.apply(variables, *args, mutable=['intermediates'], **(apply_kwargs or {}))
  if not parts:
    raise ValueError('model: no nn.MultiHeadDotProductAttention or models.KernelAttention '
                     'ran in model.apply; nothing to record.')
  sown = traverse_util.flatten_dict(state.get('intermediates', {}))
  out = {}
  for path, p in parts.items():
    if p['kernel']:
      q, k = sown[path + (flax_attention.MIMICRY_INPUTS,)][0]
      p = dict(p, q=q, k=k, v=None)
    q, k, v = (None if p[n] is None else jax.lax.stop_gradient(jnp.moveaxis(p[n], 2, 0))
               for n in 'qkv')
    if q.ndim != 4:
      raise ValueError(f'model: attention layer {"/".join(path)} has queries of shape '
                       f'{p["q"].shape}; record_attention reads [B, L, H, D] (one batch axis).')
    key_mask, query_mask = _masks(p['mask'], p['q'].shape, p['k'].shape, p['self_attention'])
    out[path] = AttentionRecord(q, k, v, key_mask, query_mask)
  return out


def record_attention(model: nn.Module, variables, batches: Sequence[Any], *,
                     inputs: Optional[Callable] = None,
                     apply_kwargs: Optional[Dict[str, Any]] = None
                     ) -> List[Dict[Path, AttentionRecord]]:
  """Per batch, ``attention_records`` of ``model`` (jitted once; numpy arrays).

  ``recorded[b][path]`` is layer ``path`` on ``batches[b]``: ``q, k, v: [H, B, L, D]``
  and its masks (``AttentionRecord``). ``inputs``, ``apply_kwargs``: as
  ``attention_records``.
  """
  if len(batches) == 0:
    raise ValueError('batches must hold at least one batch, got none.')
  record = jax.jit(functools.partial(attention_records, model, inputs=inputs,
                                     apply_kwargs=apply_kwargs))
  return [jax.device_get(record(variables, b)) for b in batches]


def stack_heads(records: Dict[Path, AttentionRecord]) -> Tuple[Dict[str, Any],
                                                              Tuple[Tuple[Path, int], ...]]:
  """``(batch, layout)``: one batch's layers stacked on a group axis G = Σ_layers H.

  ``batch``: ``{q, k, v: [G, B, L, D], key_mask, query_mask: [B, L]}`` (group g = the
  g-th head in record order; ``v`` None if a layer has none); ``layout``: ``((path,
  H), ...)``, which ``split_heads`` undoes. Every layer must have the same (B, L_q,
  L_k, D) and the same masks (self-attention over one batch); else one ValueError.
  """
  if not records:
    raise ValueError('records must hold at least one attention layer, got none.')
  paths = list(records)
  first = records[paths[0]]
  for path in paths[1:]:
    r = records[path]
    if r.q.shape[1:] != first.q.shape[1:] or r.k.shape[1:] != first.k.shape[1:]:
      raise ValueError(f'records: layer {"/".join(path)} has q, k of shapes {r.q.shape}, '
                       f'{r.k.shape}, layer {"/".join(paths[0])} {first.q.shape}, '
                       f'{first.k.shape}; stack layers of one shape (fit the others apart).')
    for name in ('key_mask', 'query_mask'):
      a, b = getattr(first, name), getattr(r, name)
      same = (a is None) == (b is None) and (a is None or not _checks.is_concrete(a)
                                             or np.array_equal(a, b))
      if not same:
        raise ValueError(f'records: layer {"/".join(path)} has another {name} than layer '
                         f'{"/".join(paths[0])}; stack layers that see the same tokens.')
  cat = lambda xs: jnp.concatenate(xs, axis=0) if len(xs) > 1 else xs[0]
  values = [records[p].v for p in paths]
  batch = {'q': cat([records[p].q for p in paths]), 'k': cat([records[p].k for p in paths]),
           'v': None if any(v is None for v in values) else cat(values),
           'key_mask': first.key_mask, 'query_mask': first.query_mask}
  return batch, tuple((p, records[p].q.shape[0]) for p in paths)


def split_heads(x, layout: Tuple[Tuple[Path, int], ...], axis: int = 0) -> Dict[Path, Any]:
  """``{path: x[..., g0:g0 + H, ...]}`` along ``axis`` (the group axis of ``stack_heads``)."""
  total = sum(h for _, h in layout)
  if np.shape(x)[axis] != total:
    raise ValueError(f'x must have {total} groups on axis {axis} (layout), got shape '
                     f'{np.shape(x)}.')
  out, start = {}, 0
  for path, h in layout:
    index = [slice(None)] * np.ndim(x)
    index[axis] = slice(start, start + h)
    out[path], start = x[tuple(index)], start + h
  return out


def stack_initial(initial: Dict[Path, jax.Array], layout: Tuple[Tuple[Path, int], ...],
                  rows_dim: Tuple[int, int]) -> jax.Array:
  """``initial`` ``{path: [H, M, D]}`` on the group axis of ``layout`` → ``[G, M, D]``
  (``split_heads`` undone); one ValueError naming a missing, extra or misshapen layer, or a
  non-finite entry (eager)."""
  if not isinstance(initial, dict):
    raise ValueError(f'initial must be a dict {{path: omega [H, M, D]}}, got '
                     f'{type(initial).__name__}.')
  want = [p for p, _ in layout]
  missing = [('/'.join(p)) for p in want if p not in initial]
  extra = [('/'.join(p)) for p in initial if p not in want]
  if missing or extra:
    raise ValueError(f'initial must hold exactly the recorded layers {["/".join(p) for p in want]}'
                     f'; missing {missing}, not recorded {extra}.')
  parts = []
  for path, heads in layout:
    omega = jnp.asarray(initial[path], jnp.float32)
    if omega.shape != (heads,) + tuple(rows_dim):
      raise ValueError(f'initial[{"/".join(path)}] must have shape [H, M, D] = '
                       f'{[heads, *rows_dim]}, got {list(omega.shape)}.')
    _checks.check_finite(f'initial[{"/".join(path)}]', omega)
    parts.append(omega)
  return jnp.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
