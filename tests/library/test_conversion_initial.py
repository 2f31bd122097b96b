"""``conversion.fit_features(..., initial=)``: a fit from given rows (issue 38 item 4: a warm
start, e.g. a model's current particles), exact against the default draw, refused in one line
when the rows do not fit the recorded layers."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from coulomb_jax import conversion
from coulomb_jax.layers import models

HEADS, WIDTH, LENGTH, N = 2, 16, 6, 8


class _Tiny(nn.Module):
  @nn.compact
  def __call__(self, x, mask):
    for i in range(2):
      x = x + models.KernelAttention(num_heads=HEADS, qk_mode='projected', num_features=N,
                                     name=f'attn_{i}')(x, mask)
    return x


@pytest.fixture(scope='module')
def recorded():
  x = jax.random.normal(jax.random.PRNGKey(0), (4, LENGTH, WIDTH))
  mask = jnp.arange(LENGTH)[None, :] < jnp.array([[6], [5], [4], [6]])
  variables = jax.jit(_Tiny().init)(jax.random.PRNGKey(1), x, mask)
  return variables, conversion.record_attention(_Tiny(), variables, [(x, mask)],
                                                inputs=lambda b: b)


def test_the_default_draw_given_as_initial_is_the_default_fit_exactly(recorded):
  _, rec = recorded
  key = jax.random.PRNGKey(3)
  layout = tuple((p, HEADS) for p in rec[0])
  draw = conversion.initial_features(jax.random.split(key)[0], 2 * HEADS, N, WIDTH // HEADS,
                                     method='particles')
  default, losses = conversion.fit_features(key, rec, method='particles', num_features=N,
                                            steps=3)
  given, given_losses = conversion.fit_features(
      key, rec, method='particles', num_features=N, steps=3,
      initial=conversion.split_heads(draw, layout))
  for path in default:
    np.testing.assert_array_equal(given[path], default[path])
    np.testing.assert_array_equal(given_losses[path], losses[path])


def test_a_warm_start_from_the_models_particles_starts_where_they_are(recorded):
  variables, rec = recorded
  key = jax.random.PRNGKey(3)
  own = {p: variables['params'][p[0]]['particles'] for p in rec[0]}
  _, warm = conversion.fit_features(key, rec, method='gradient_flow', num_features=N,
                                    steps=1, initial=own)
  # Step 0's loss is the mimicry Hamiltonian of the rows it starts from: the model's own.
  energy = conversion.mimicry_energy('favor', lam=0.0)
  batch, _ = conversion.stack_heads(rec[0])
  for g, path in enumerate([p for p in rec[0] for _ in range(HEADS)]):
    head = g % HEADS
    want = energy(own[path][head], batch['q'][g], batch['k'][g],
                  {'key_mask': batch['key_mask'], 'query_mask': batch['query_mask']})
    np.testing.assert_allclose(warm[path][0, head], want, rtol=1e-5)


@pytest.mark.parametrize('change, message', [
    (lambda own: {k: v for k, v in own.items() if k != ('attn_1',)},
     r"^initial must hold exactly the recorded layers \['attn_0', 'attn_1'\]; missing "
     r"\['attn_1'\], not recorded \[\]\.$"),
    (lambda own: {**own, ('attn_1',): own[('attn_1',)][:, :4]},
     r'^initial\[attn_1\] must have shape \[H, M, D\] = \[2, 8, 8\], got \[2, 4, 8\]\.$'),
    (lambda own: {**own, ('attn_0',): own[('attn_0',)].at[1, 2, 3].set(jnp.nan)},
     r'^initial\[attn_0\]'),
    (lambda own: list(own.values()), r'^initial must be a dict'),
])
def test_initial_rows_that_do_not_fit_the_recorded_layers_are_one_line(recorded, change,
                                                                        message):
  variables, rec = recorded
  own = {p: variables['params'][p[0]]['particles'] for p in rec[0]}
  with pytest.raises(ValueError, match=message):
    conversion.fit_features(jax.random.PRNGKey(0), rec, method='particles', num_features=N,
                            steps=1, initial=change(own))
