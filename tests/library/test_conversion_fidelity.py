"""``conversion.heldout_fidelity`` / ``group_fidelity`` (issue 38: one held-out fidelity
helper, used by the mimicry study): per head, the mean attention KL(softmax ‖ linear) over
real query rows and the relative output error, against a brute-force loop over heads."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import conversion
from coulomb_jax import mimicry

HEADS, WIDTH, LENGTH = 2, 16, 7


class _Softmax(nn.Module):
  @nn.compact
  def __call__(self, x, mask):
    for i in range(2):
      x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS, name=f'attn_{i}')(
          x, mask=nn.make_attention_mask(mask, mask))
    return x


def _batch(seed):
  x = jax.random.normal(jax.random.PRNGKey(seed), (3, LENGTH, WIDTH))
  lengths = jnp.array([[7], [4], [6]])
  return x, jnp.arange(LENGTH)[None, :] < lengths


def _brute(omegas, feature_map, recorded):
  """Per (path, head): Σ rows·KL / Σ rows and √(Σ‖ΔO‖² / Σ‖O‖²) over the batches, a loop."""
  out = {}
  for path in recorded[0]:
    kl, err = [], []
    for h in range(HEADS):
      s_kl = s_rows = s_err = s_ref = 0.0
      for rec in recorded:
        r = rec[path]
        q, k, v, w = r.q[h], r.k[h], r.v[h], omegas[path][h]
        rows = float(jnp.sum(r.query_mask))
        s_kl += rows * float(mimicry.attention_kl(q, k, w, feature_map, key_mask=r.key_mask,
                                                  query_mask=r.query_mask))
        s_rows += rows
        real = r.query_mask[..., None]
        lin = mimicry.kernel_attention_weights(q, k, w, feature_map, key_mask=r.key_mask) @ v
        soft = mimicry.softmax_attention_weights(q, k, key_mask=r.key_mask) @ v
        s_err += float(jnp.sum(jnp.where(real, lin - soft, 0.0) ** 2))
        s_ref += float(jnp.sum(jnp.where(real, soft, 0.0) ** 2))
      kl.append(s_kl / s_rows)
      err.append(np.sqrt(s_err / s_ref))
    out[path] = {'kl': np.array(kl), 'output_error': np.array(err)}
  return out


@pytest.mark.slow
@pytest.mark.parametrize('method', ['particles', 'hedgehog'])
def test_heldout_fidelity_is_the_per_head_kl_and_output_error(method):
  model = _Softmax()
  x, mask = _batch(0)
  variables = jax.jit(model.init)(jax.random.PRNGKey(1), x, mask)
  fit_on = conversion.record_attention(model, variables, [_batch(2)], inputs=lambda b: b)
  held = conversion.record_attention(model, variables, [_batch(3), _batch(4)],
                                     inputs=lambda b: b)
  omegas, _ = conversion.fit_features(jax.random.PRNGKey(5), fit_on, method=method,
                                      num_features=8, steps=5)
  fm = conversion.default_feature_map(method)
  got = conversion.heldout_fidelity(omegas, fm, held)
  want = _brute(omegas, fm, held)
  assert set(got) == set(want) == {('attn_0',), ('attn_1',)}
  for path in want:
    for name in ('kl', 'output_error'):
      assert got[path][name].shape == (HEADS,)
      np.testing.assert_allclose(got[path][name], want[path][name], rtol=2e-5, atol=1e-7)
      assert np.all(got[path][name] > 0)


def test_fidelity_refuses_what_it_cannot_measure():
  model = _Softmax()
  x, mask = _batch(0)
  variables = jax.jit(model.init)(jax.random.PRNGKey(1), x, mask)
  held = conversion.record_attention(model, variables, [_batch(3)], inputs=lambda b: b)
  omega = jnp.ones((HEADS, 8, WIDTH // HEADS))
  with pytest.raises(ValueError, match=r'^omegas: no fitted features for the recorded layers '
                                       r"\['attn_1'\]\.$"):
    conversion.heldout_fidelity({('attn_0',): omega}, 'favor', held)
  with pytest.raises(ValueError, match='^recorded must hold at least one batch'):
    conversion.heldout_fidelity({('attn_0',): omega}, 'favor', [])
  batch, _ = conversion.stack_heads(held[0])
  with pytest.raises(ValueError, match='^batches: the output error needs the values v'):
    conversion.group_fidelity(jnp.ones((2 * HEADS, 8, WIDTH // HEADS)), 'favor',
                              [dict(batch, v=None)])
