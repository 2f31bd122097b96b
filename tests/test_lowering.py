"""Cross-platform lowering from this CPU (issue 26, item 1, first part): the library's
entry points lower for ``cuda`` and ``tpu`` without a device
(``jax.jit(f).trace(*args).lower(lowering_platforms=(p,))``; nothing is compiled).

Not yet covered here: the sharded step on an abstract mesh, Phase A/B steps, predict,
and the Pallas kernels for ``tpu`` (they do not lower there yet: they
always pass Triton compiler parameters; see issue 26)."""

import jax
import jax.numpy as jnp
import pytest

import coulomb_jax as cj
from coulomb_jax import attention
from coulomb_jax import hamiltonian as hl
from coulomb_jax import lm
from coulomb_jax import mimicry
from coulomb_jax import models
from coulomb_jax import pallas_attention

PLATFORMS = ('cuda', 'tpu')
X = jnp.linspace(-1.0, 1.0, 32).reshape(8, 4)              # [n, d]
Y = jnp.array([1.0, -1.0] * 4)
W = 0.1 * jnp.ones((6, 4))                                  # [N, d]
Q = jnp.ones((1, 16, 2, 4))                                 # [B, L, H, d]
OMEGA = 0.1 * jnp.ones((2, 6, 4))                           # [H, M, d]


def _encoder_grad():
  model = models.EncoderClassifier(vocab_size=10, max_length=16, width=8, num_heads=2,
                                   ffn_dim=8, num_features=4)
  ids, mask = jnp.ones((2, 8), jnp.int32), jnp.ones((2, 8), bool)
  params = model.init(jax.random.key(0), ids, ids, mask)
  return jax.grad(lambda p: model.apply(p, ids, ids, mask).sum()), (params,)


def _causal_lm_grad(attention):
  model = lm.CausalLM(vocab_size=16, max_len=16, width=8, num_layers=1, num_heads=2,
                      attention=attention, feature_map='favor', num_features=4)
  tokens = jnp.ones((2, 16), jnp.int32)
  params = model.init(jax.random.key(0), tokens)
  return jax.grad(lambda p: model.apply(p, tokens).sum()), (params,)


ENTRIES = {
    'rff': lambda: (lambda w: cj.features.rff(X, w), (W,)),
    'alignment': lambda: (lambda w: cj.target_alignment(cj.features.rff(X, w), Y), (W,)),
    'hamiltonian_grad': lambda: (jax.grad(lambda w: hl.hamiltonian(
        w, X, Y, feature_map='rff', lam=0.5, s='coulomb')), (W,)),
    'langevin_step': lambda: (lambda k, w: cj.langevin_step(
        k, w, w, step_size=0.1, beta=10.0, radius=1.0), (jax.random.key(0), W)),
    'fused_xla_bf16': lambda: (lambda q, om: attention.fused_linear_attention(
        q, q, q, om, implementation='xla'), (Q.astype(jnp.bfloat16), OMEGA)),
    'fused_causal_grad': lambda: (jax.grad(lambda q, om: attention.fused_causal_linear_attention(
        q, q, q, om).sum(), argnums=(0, 1)), (Q, OMEGA)),
    'mimicry_grad': lambda: (jax.grad(lambda w: mimicry.mimicry_hamiltonian(
        w, X, X, feature_map='favor', lam=0.1)), (W,)),
    'encoder_grad': _encoder_grad,
    'causal_lm_softmax_grad': lambda: _causal_lm_grad('softmax'),
    'causal_lm_kernel_grad': lambda: _causal_lm_grad('kernel'),
}


@pytest.mark.parametrize('platform', PLATFORMS)
@pytest.mark.parametrize('entry', sorted(ENTRIES))
def test_entry_point_lowers(entry, platform):
  f, args = ENTRIES[entry]()
  text = jax.jit(f).trace(*args).lower(lowering_platforms=(platform,)).as_text()
  assert 'func.func public @main' in text


def test_pallas_forward_lowers_to_a_triton_call_for_cuda():
  q, omega = jnp.ones((1, 32, 2, 16)), 0.1 * jnp.ones((2, 16, 16))
  f = lambda q, om: pallas_attention.pallas_linear_attention(
      q, q, q, om, feature_map='favor', interpret=False)
  text = jax.jit(f).trace(q, omega).lower(lowering_platforms=('cuda',)).as_text()
  assert '__gpu$xla.gpu.triton' in text


@pytest.mark.parametrize('masked', [False, True])
def test_auto_takes_the_kernels_by_the_lowering_platform_not_the_host(masked):
  from coulomb_jax import attention  # pylint: disable=g-import-not-at-top
  from coulomb_jax import attention_core  # pylint: disable=g-import-not-at-top
  q = 0.5 * jax.random.normal(jax.random.key(0), (1, 32, 2, 16))
  omega = jax.random.normal(jax.random.key(1), (2, 64, 16))
  mask = (jnp.arange(32)[None] < 20) if masked else None
  f = lambda q, om: attention.fused_linear_attention(q, q, q, om, key_mask=mask)
  lowered = {p: jax.jit(f).trace(q, omega).lower(lowering_platforms=(p,)).as_text()
             for p in ('cuda', 'tpu', 'cpu')}
  assert '__gpu$xla.gpu.triton' in lowered['cuda']
  assert 'triton' not in lowered['tpu'] and 'triton' not in lowered['cpu']
  # Run here (CPU), 'auto' is the XLA path exactly.
  want = attention_core.xla_fused_linear_attention(q, q, q, omega, feature_map='favor',
                                                   key_mask=mask)
  assert jnp.array_equal(jax.jit(f)(q, omega), want)
  # A shape the kernels do not take (head dim 8) is XLA for every platform.
  small = lambda q, om: attention.fused_linear_attention(q, q, q, om)
  text = jax.jit(small).trace(q[..., :8], omega[..., :8]).lower(
      lowering_platforms=('cuda',)).as_text()
  assert 'triton' not in text
