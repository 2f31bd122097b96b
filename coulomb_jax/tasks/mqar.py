r"""Multi-query associative recall (MQAR), generated locally with ``jax.random``.

Follows the MQAR definition of Zoology (Arora et al. 2023, "Zoology: Measuring and
Improving Recall in Efficient Language Models"), written from its description:

* vocabulary: id 0 is reserved (never a data token here; free for padding), keys are
  drawn from the lower half ``K = {1, …, V//2 − 1}`` and values from the upper half
  ``{V//2, …, V − 1}``; the halves are disjoint;
* context: each sequence starts with P key–value pairs ``k_1 v_1 k_2 v_2 … k_P v_P``
  (2P tokens); the P keys are distinct, and so are the P values;
* queries: the remaining ``L − 2P`` positions are split into ``S = (L − 2P) // 2`` slots
  of two tokens; every key is queried exactly once, at slot g (distinct slots, drawn
  without replacement) with p(g) ∝ a·(g + 1)^{a−1}, g = 0..S−1, a = ``power_a``
  (Zoology's power law: small a puts most queries close to the context). The query
  key sits at position ``2P + 2g``; its target there is the paired value;
* filler: every other position holds a token drawn uniformly from ``{1, …, V − 1}``
  (Zoology's ``random_non_queries``; Zoology also draws 0, we keep 0 reserved). As in
  Zoology the paired value is *not* written into the input after a query: it is only the
  target, and the next input token is filler.

The draw without replacement with probabilities p is the Gumbel top-k trick
(top P of log p_g + Gumbel noise), the same law as sequential sampling without
replacement. Deterministic for a key.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from coulomb_jax import _checks


class MQARBatch(NamedTuple):
  """One MQAR batch.

  inputs: ``[B, L]`` int32 token ids.
  targets: ``[B, L]`` int32; the paired value where ``answer_mask``, else 0 (ignored).
  answer_mask: ``[B, L]`` bool; True at query positions (the next token is an answer):
    loss and accuracy count only these positions (P per row).
  """
  inputs: jax.Array
  targets: jax.Array
  answer_mask: jax.Array


def check_mqar_args(num_examples, vocab_size, seq_len, num_pairs, power_a) -> None:
  """The up-front rules: one ``ValueError`` naming the argument and its value."""
  _checks.check_int('num_examples', num_examples, 1)
  _checks.check_int('vocab_size', vocab_size, 1)
  _checks.check_int('seq_len', seq_len, 1)
  _checks.check_int('num_pairs', num_pairs, 1)
  _checks.check_positive('power_a', power_a)
  if vocab_size <= seq_len:
    raise ValueError(f'vocab_size must be > seq_len={seq_len}, got {vocab_size}.')
  if 4 * num_pairs > seq_len:
    raise ValueError(f'num_pairs must satisfy 4·num_pairs <= seq_len={seq_len}, '
                     f'got {num_pairs}.')
  num_keys = vocab_size // 2 - 1
  if num_pairs > num_keys:
    raise ValueError(f'num_pairs must be <= the {num_keys} keys (ids 1..vocab_size//2 − 1) '
                     f'of vocab_size={vocab_size}, got {num_pairs}.')


def _distinct(key: jax.Array, shape, num_choices: int, log_p: jax.Array) -> jax.Array:
  """``[B, P]`` distinct indices in ``[0, num_choices)`` per row, drawn with weights e^{log_p}.

  Gumbel top-k: the top P of ``log_p + G`` (G i.i.d. Gumbel) is a draw without
  replacement, in order, from the normalised weights.
  """
  b, p = shape
  g = jax.random.gumbel(key, (b, num_choices), jnp.float32)
  return jax.lax.top_k(log_p + g, p)[1].astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _mqar(key, num_examples, vocab_size, seq_len, num_pairs, power_a):
  b, length, p = num_examples, seq_len, num_pairs
  half = vocab_size // 2
  k_key, k_val, k_gap, k_fill = jax.random.split(key, 4)
  uniform = lambda n: jnp.zeros((n,), jnp.float32)
  keys = 1 + _distinct(k_key, (b, p), half - 1, uniform(half - 1))             # [B, P]
  values = half + _distinct(k_val, (b, p), vocab_size - half, uniform(vocab_size - half))
  slots = (length - 2 * p) // 2
  g = jnp.arange(1, slots + 1, dtype=jnp.float32)
  log_p = jnp.log(power_a) + (power_a - 1.0) * jnp.log(g)                      # [S]
  gaps = _distinct(k_gap, (b, p), slots, log_p)                                # [B, P]
  query_pos = 2 * p + 2 * gaps                                                 # [B, P]
  inputs = jax.random.randint(k_fill, (b, length), 1, vocab_size, jnp.int32)
  rows = jnp.arange(b)[:, None]
  inputs = inputs.at[:, 0:2 * p:2].set(keys).at[:, 1:2 * p:2].set(values)
  inputs = inputs.at[rows, query_pos].set(keys)
  targets = jnp.zeros((b, length), jnp.int32).at[rows, query_pos].set(values)
  mask = jnp.zeros((b, length), bool).at[rows, query_pos].set(True)
  return MQARBatch(inputs, targets, mask)


def mqar_batch(key: jax.Array, num_examples: int, *, vocab_size: int, seq_len: int,
               num_pairs: int, power_a: float = 0.01) -> MQARBatch:
  r"""A batch of Zoology MQAR sequences (see the module docstring for the law).

  Args:
    key: one PRNG key (``jax.random.key`` or a raw ``uint32[2]``; an int or a batch of
      keys is one ``TypeError``); the same key gives the same batch.
    num_examples: B rows.
    vocab_size: V > seq_len; keys ``1..V//2−1``, values ``V//2..V−1``, 0 reserved.
    seq_len: L >= 4·num_pairs.
    num_pairs: P key–value pairs per row (P <= V//2 − 1), each key queried once.
    power_a: a > 0, finite, of the gap law p(g) ∝ a·(g + 1)^{a−1} over the
      S = (L − 2P)//2 slots.

  Returns:
    ``MQARBatch(inputs [B, L] int32, targets [B, L] int32, answer_mask [B, L] bool)``;
    ``targets[b, t]`` is the value paired with the key ``inputs[b, t]`` where
    ``answer_mask[b, t]``, else 0.
  """
  _checks.check_key('key', key)
  check_mqar_args(num_examples, vocab_size, seq_len, num_pairs, power_a)
  return _mqar(key, int(num_examples), int(vocab_size), int(seq_len), int(num_pairs),
               float(power_a))
