"""Cross-platform lowering from this CPU (issue 26): the library's entry points lower
for ``cuda`` and ``tpu`` without a device
(``jax.jit(f).trace(*args).lower(lowering_platforms=(p,))``; nothing is compiled), and
the attention kernels are chosen by the platform lowered for, not the host: ``'auto'``
is Triton for cuda and XLA for cpu and tpu; the Pallas kernels (``interpret=None``)
are Triton for cuda, interpreted for cpu, and for tpu the Mosaic kernels
(``pallas.tpu``: bidirectional, six maps) or a one-line ValueError (softmaxfeat,
the causal kernel); shapes Triton cannot compile are refused before lowering;
``precision`` reaches every product, of the attention paths, the Hamiltonians, the Phase A
steps and the sharded Langevin step.

Phase A and Phase B steps and predict of a tiny encoder lower too, and the sharded
Langevin step on an abstract mesh of 4 and 8 devices (``jax.sharding.AbstractMesh``: no
such devices needed). ``pmap`` needs real devices, so it is tested on fake CPU devices
in tests/library/test_parallel.py instead."""

import contextlib

import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import pytest

import coulomb_jax as cj
from coulomb_jax import attention
from coulomb_jax import hamiltonian as hl
from coulomb_jax import mimicry
from coulomb_jax.attention import pallas
from coulomb_jax.layers import lm
from coulomb_jax.layers import models

PLATFORMS = ('cuda', 'tpu')
ON_CPU = jax.default_backend() == 'cpu'    # where "run here" means the XLA / interpret path
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


def _encoder_steps(which):
  """A Phase A step, a Phase B step or predict of a tiny encoder (``training``)."""
  from coulomb_jax import training  # pylint: disable=g-import-not-at-top
  model = models.EncoderClassifier(vocab_size=10, max_length=16, width=8, num_heads=2,
                                   ffn_dim=8, num_features=4)
  ids, mask = jnp.ones((2, 8), jnp.int32), jnp.ones((2, 8), bool)
  batch = {'ids': ids, 'segments': ids, 'mask': mask, 'labels': jnp.array([0, 1]),
           'weights': jnp.ones(2)}
  params = model.init(jax.random.key(0), ids, ids, mask)['params']
  if which == 'predict':
    return training.make_predict(model), (params, batch)
  if which == 'phase_a':
    opt = training.phase_a_optimizer(jax.random.key(1), step_size=0.1, beta=10.0,
                                     radius=1.0, clip_norm=10.0)
    step = training.make_phase_a_step(model, opt, feature_map='favor', lam=0.1,
                                      s='coulomb', softening=0.5)
    return step, (training.TrainState(jnp.int32(0), params, opt.init(params)), batch)
  opt = training.phase_b_optimizer(learning_rate=1e-3, warmup_steps=1, total_steps=4,
                                   weight_decay=0.01, clip_norm=1.0)
  step = training.make_phase_b_step(model, opt)
  return (lambda state, b: step(jax.random.key(2), state, b),
          (training.TrainState(jnp.int32(0), params, opt.init(params)), batch))


# From jax 0.11 on, Pallas' Triton lowering asks the device for its compute capability and
# fails on a host without a GPU unless an abstract GPU device is in context (an abstract
# mesh, all axes Explicit): the H200 of the project's device sessions (132 SMs).
_H200 = jax.sharding.AbstractMesh(
    (1,), ('host',), axis_types=(jax.sharding.AxisType.Explicit,),
    abstract_device=jax.sharding.AbstractDevice(device_kind='NVIDIA H200', num_cores=132,
                                                platform='gpu'))


def _lower(f, *args, platform, abstract_gpu=True):
  """The program text of ``jax.jit(f)`` traced and lowered for ``platform`` (nothing
  compiled); for cuda under an abstract H200 (``_H200``) unless ``abstract_gpu=False``
  (Pallas' interpret mode does not trace under an Explicit mesh on jax 0.11: a
  ShardingTypeError in its dynamic_update_slice)."""
  context = (jax.sharding.use_abstract_mesh(_H200) if platform == 'cuda' and abstract_gpu
             else contextlib.nullcontext())
  with context:
    return jax.jit(f).trace(*args).lower(lowering_platforms=(platform,)).as_text()


ENTRIES = {
    'phase_a_step': lambda: _encoder_steps('phase_a'),
    'phase_b_step': lambda: _encoder_steps('phase_b'),
    'predict': lambda: _encoder_steps('predict'),
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


@pytest.mark.slow
@pytest.mark.parametrize('platform', PLATFORMS)
@pytest.mark.parametrize('entry', sorted(ENTRIES))
def test_entry_point_lowers(entry, platform):
  f, args = ENTRIES[entry]()
  assert 'func.func public @main' in _lower(f, *args, platform=platform)


def test_pallas_forward_lowers_to_a_triton_call_for_cuda():
  q, omega = jnp.ones((1, 32, 2, 16)), 0.1 * jnp.ones((2, 16, 16))
  f = lambda q, om: pallas.pallas_linear_attention(
      q, q, q, om, feature_map='favor', interpret=False)
  assert '__gpu$xla.gpu.triton' in _lower(f, q, omega, platform='cuda')


@pytest.mark.parametrize('masked', [False, True])
def test_auto_takes_the_kernels_by_the_lowering_platform_not_the_host(masked):
  from coulomb_jax import attention  # pylint: disable=g-import-not-at-top
  from coulomb_jax.attention import xla  # pylint: disable=g-import-not-at-top
  q = 0.5 * jax.random.normal(jax.random.key(0), (1, 32, 2, 16))
  omega = jax.random.normal(jax.random.key(1), (2, 64, 16))
  mask = (jnp.arange(32)[None] < 20) if masked else None
  f = lambda q, om: attention.fused_linear_attention(q, q, q, om, key_mask=mask)
  lowered = {p: _lower(f, q, omega, platform=p) for p in ('cuda', 'tpu', 'cpu')}
  assert '__gpu$xla.gpu.triton' in lowered['cuda']
  assert 'triton' not in lowered['tpu'] and 'triton' not in lowered['cpu']
  # Run on a CPU host, 'auto' is the XLA path exactly.
  want = xla.xla_fused_linear_attention(q, q, q, omega, feature_map='favor',
                                        key_mask=mask)
  if ON_CPU:
    assert jnp.array_equal(jax.jit(f)(q, omega), want)
  # A shape the kernels do not take (head dim 8) is XLA for every platform.
  small = lambda q, om: attention.fused_linear_attention(q, q, q, om)
  assert 'triton' not in _lower(small, q[..., :8], omega[..., :8], platform='cuda')
  # A map the kernels do not take (hedgehog) is XLA for every platform, at this shape too,
  # bidirectional and causal.
  for fused in (attention.fused_linear_attention, attention.fused_causal_linear_attention):
    hedgehog = lambda q, om, fused=fused: fused(q, q, q, om, feature_map='hedgehog')
    for p in ('cuda', 'tpu'):
      text = _lower(hedgehog, q, omega, platform=p)
      assert 'func.func public @main' in text and 'triton' not in text


def _qo(dim=16, num=64, length=32):
  q = 0.5 * jax.random.normal(jax.random.key(0), (1, length, 2, dim))
  return q, jax.random.normal(jax.random.key(1), (2, num, dim))


CAUSAL_AUTO = lambda q, om: attention.fused_causal_linear_attention(q, q, q, om,
                                                                    implementation='auto')


def test_causal_auto_is_the_kernel_for_cuda_and_xla_for_cpu_and_tpu():
  q, omega = _qo()
  assert '__gpu$xla.gpu.triton' in _lower(CAUSAL_AUTO, q, omega, platform='cuda')
  for platform in ('cpu', 'tpu'):
    assert 'triton' not in _lower(CAUSAL_AUTO, q, omega, platform=platform)
  # Run on a CPU host, 'auto' is the XLA path exactly, and the default ('xla') is the same.
  on_xla = attention.fused_causal_linear_attention(q, q, q, omega)
  if ON_CPU:
    assert jnp.array_equal(jax.jit(CAUSAL_AUTO)(q, omega), on_xla)
  # A shape the kernel does not take (M = 32, or head dim 8) is XLA for cuda too.
  assert 'triton' not in _lower(CAUSAL_AUTO, q, omega[:, :32], platform='cuda')
  assert 'triton' not in _lower(CAUSAL_AUTO, q[..., :8], omega[..., :8], platform='cuda')


PALLAS = {
    'bidirectional': lambda name: lambda q, om: attention.fused_linear_attention(
        q, q, q, om, feature_map=name, implementation='pallas'),
    'causal': lambda name: lambda q, om: attention.fused_causal_linear_attention(
        q, q, q, om, feature_map=name, implementation='pallas'),
}
TPU_REFUSALS = [   # (path, map, why): the calls without a TPU kernel
    ('bidirectional', 'softmaxfeat', r"the TPU kernels compute \('favor', 'elu', 'softplus', "
                                     r"'sigmoid2', 'cos2', 'porf_softplus'\): softmaxfeat's"),
    ('causal', 'elu', r'the causal kernel is Triton only'),
]


@pytest.mark.parametrize('path', sorted(PALLAS))
def test_pallas_is_compiled_for_cuda_and_interpreted_for_cpu(path):
  f = PALLAS[path]('elu')
  q, omega = _qo()
  assert '__gpu$xla.gpu.triton' in _lower(f, q, omega, platform='cuda')
  assert 'triton' not in _lower(f, q, omega, platform='cpu')      # interpret mode
  # Gradients are the XLA path's: they lower for tpu too.
  grad = jax.grad(lambda q, om: f(q, om).sum(), argnums=(0, 1))
  text = _lower(grad, q, omega, platform='tpu')
  assert 'triton' not in text and 'tpu_custom_call' not in text


def test_pallas_bidirectional_is_the_mosaic_kernels_for_tpu():
  q, omega = _qo()
  for name in pallas.TPU_FEATURE_MAPS:
    text = _lower(PALLAS['bidirectional'](name), q, omega, platform='tpu')
    assert text.count('tpu_custom_call') == 2 and 'triton' not in text, name
  bf16 = _lower(PALLAS['bidirectional']('favor'), q.astype(jnp.bfloat16), omega,
                platform='tpu')
  assert bf16.count('tpu_custom_call') == 2


@pytest.mark.parametrize('path, name, why', TPU_REFUSALS, ids=[r[0] for r in TPU_REFUSALS])
def test_pallas_without_a_tpu_kernel_is_one_error_for_tpu(path, name, why):
  q, omega = _qo()
  call = 'pallas_causal_linear_attention' if path == 'causal' else 'pallas_linear_attention'
  with pytest.raises(ValueError, match=(rf"^{call}\(feature_map='{name}'\): no TPU kernel "
                                        rf"\({why}.*\); use implementation='xla' or 'auto' "
                                        r"\(XLA on TPU\), or interpret=True \(lowering for "
                                        r"tpu\)\.$")):
    _lower(PALLAS[path](name), q, omega, platform='tpu')


def test_interpret_explicit_overrides_the_platform():
  q, omega = _qo()
  call = lambda interpret: lambda q, om: pallas.pallas_linear_attention(
      q, q, q, om, interpret=interpret)
  assert 'triton' not in _lower(call(True), q, omega, platform='cuda', abstract_gpu=False)
  assert 'triton' not in _lower(call(True), q, omega, platform='tpu')
  with pytest.raises(ValueError, match=r'interpret=False compiles the Triton kernels, which '
                                       r'lower only for cuda.*\(lowering for cpu\)'):
    _lower(call(False), q, omega, platform='cpu')
  # Run on a CPU host, the default is interpret mode: the same numbers as interpret=True.
  if ON_CPU:
    assert jnp.array_equal(jax.jit(call(None))(q, omega), jax.jit(call(True))(q, omega))


SMALL = [   # (what, dim, kwargs, the value named)
    ('head dim 8', 8, {}, r'the head dim d of q = 8'),
    ('block_q 8', 16, dict(block_q=8), r'block_q = 8'),
    ('block_k 8', 16, dict(block_k=8), r'block_k = 8'),
    ('block_f 8', 16, dict(block_f=8), r'block_f = 8'),
]


@pytest.mark.parametrize('what, dim, kwargs, named', SMALL, ids=[s[0] for s in SMALL])
def test_shapes_triton_cannot_compile_are_refused_before_lowering(what, dim, kwargs, named):
  del what
  q, omega = _qo(dim)
  rule = named + r' must be a power of two >= 16 for the compiled \(Triton\) kernels'
  with pytest.raises(ValueError, match=r"^pallas_linear_attention\(feature_map='favor'\): "
                     + rule):
    pallas.pallas_linear_attention(q, q, q, omega, interpret=False, **kwargs)
  f = lambda q, om: pallas.pallas_linear_attention(q, q, q, om, **kwargs)
  with pytest.raises(ValueError, match=rule + r'.*\(lowering for cuda\)'):
    _lower(f, q, omega, platform='cuda')
  assert 'triton' not in _lower(f, q, omega, platform='cpu')   # interpret mode: any size
  assert not pallas.shape_supported(q.shape, q.shape, (2, 8, dim), 'favor')


def test_causal_shapes_triton_cannot_compile_are_refused():
  q, omega = _qo(16)
  with pytest.raises(ValueError, match=r"^pallas_causal_linear_attention\(feature_map='elu'\): "
                                       r'chunk_size = 8 must be a power of two >= 16'):
    pallas.pallas_causal_linear_attention(q, q, q, omega, feature_map='elu',
                                          chunk_size=8, interpret=False)
  q8, omega8 = _qo(8)
  with pytest.raises(ValueError, match=r'the head dim d of q = 8 must be a power of two'):
    pallas.pallas_causal_linear_attention(q8, q8, q8, omega8, interpret=False)
  assert not pallas.shape_supported(q8.shape, q8.shape, omega8.shape, 'favor')
  assert pallas.shape_supported(q.shape, q.shape, omega.shape, 'favor')


def _dot_precisions(jaxpr):
  """The ``precision`` of every dot_general in a (closed) jaxpr, sub-jaxprs included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      found.append(eqn.params['precision'])
    for sub in jax_core.jaxprs_in_params(eqn.params):
      found += _dot_precisions(sub)
  return found


@pytest.mark.parametrize('path', ['bidirectional', 'causal'])
def test_precision_reaches_every_product_of_kernels_and_xla(path):
  q, omega = _qo()
  highest = (jax.lax.Precision.HIGHEST,) * 2
  if path == 'bidirectional':
    fns = [lambda q, om, impl=impl: attention.fused_linear_attention(
        q, q, q, om, implementation=impl, precision='highest') for impl in ('xla', 'pallas')]
  else:
    fns = [lambda q, om, impl=impl: attention.fused_causal_linear_attention(
        q, q, q, om, implementation=impl, precision='highest') for impl in ('xla', 'pallas')]
  for fn in fns + [jax.grad(lambda q, om, f=fn: f(q, om).sum()) for fn in fns]:
    precisions = _dot_precisions(jax.make_jaxpr(fn)(q, omega).jaxpr)
    assert len(precisions) >= 3 and all(p == highest for p in precisions), precisions
  text = _lower(fns[0], q, omega, platform='cuda')
  assert text.count('dot_general') == text.count('precision = [HIGHEST, HIGHEST]') > 0
  with pytest.raises(ValueError, match=r"^precision must be None, a jax.lax.Precision or one "
                                       r"of \('default', 'high', 'highest'\), got 'fp32'"):
    attention.fused_linear_attention(q, q, q, omega, precision='fp32')


def test_platform_choice_under_vmap():
  # vmap batches every branch of the platform switch, the refusals included.
  q, omega = _qo()
  qs = jnp.stack([q, 2.0 * q])                                 # [2, B, L, H, d]
  f = jax.vmap(lambda q: pallas.pallas_linear_attention(q, q, q, omega,
                                                        feature_map='elu'))
  want = jax.vmap(lambda q: attention.fused_linear_attention(
      q, q, q, omega, feature_map='elu', implementation='xla'))(qs)
  if ON_CPU:
    assert jnp.allclose(jax.jit(f)(qs), want, rtol=2e-5, atol=2e-6)
  assert '__gpu$xla.gpu.triton' in _lower(f, qs, platform='cuda')
  assert 'tpu_custom_call' in _lower(f, qs, platform='tpu')
  soft = jax.vmap(lambda q: pallas.pallas_linear_attention(
      q, q, q, omega, feature_map='softmaxfeat'))
  with pytest.raises(ValueError, match='no TPU kernel'):
    _lower(soft, qs, platform='tpu')


@pytest.mark.parametrize('fn', ['hamiltonian', 'particle_potentials'])
def test_hamiltonian_precision_reaches_every_product_and_leaves_cpu_values(fn):
  f = getattr(hl, fn)
  call = lambda p: (lambda w: f(w, X, Y, feature_map='favor', lam=0.5, s='coulomb',
                                precision=p))
  for g in (call('highest'), jax.grad(lambda w: call('highest')(w).sum())):
    text = _lower(g, W, platform='tpu')
    assert text.count('dot_general') == text.count('precision = [HIGHEST, HIGHEST]') > 0
  default = _lower(call(None), W, platform='tpu')
  assert 'dot_general' in default and 'HIGHEST' not in default
  if ON_CPU:                                   # exact float32 either way on this backend
    assert jnp.array_equal(call(None)(W), call('highest')(W))
  with pytest.raises(ValueError, match=r"^precision must be None, a jax.lax.Precision or one "
                                       r"of \('default', 'high', 'highest'\), got 'fp32'"):
    call('fp32')(W)


@pytest.mark.parametrize('platform', PLATFORMS)
@pytest.mark.parametrize('devices', [4, 8])
@pytest.mark.parametrize('axis_type', ['Explicit', 'Auto'])
def test_sharded_langevin_step_lowers_on_an_abstract_mesh(devices, axis_type, platform):
  """``langevin_step_on_mesh`` on a mesh of 4 or 8 devices this host does not have: an
  ``AbstractMesh`` and ``ShapeDtypeStruct``s carrying its shardings. The program is
  partitioned over every device, each holds its block of particles in a manual
  (shard_map) region, and the blocks are gathered once for the pairwise repulsion."""
  from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from coulomb_jax import parallel  # pylint: disable=g-import-not-at-top
  mesh = AbstractMesh((devices,), ('p',), axis_types=(getattr(AxisType, axis_type),))
  placed = lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                sharding=NamedSharding(mesh, spec))
  omega = placed(jnp.zeros((2 * devices, 4)), PartitionSpec('p'))      # [N, d], N = 2P
  f = lambda k, w, x, y: parallel.langevin_step_on_mesh(
      k, w, x, y, mesh=mesh, axis_name='p', feature_map='rff', lam=0.5, s='coulomb',
      step_size=0.1, beta=10.0, radius=1.0)
  text = _lower(f, jax.random.key(0), omega, placed(X, PartitionSpec()),
                placed(Y, PartitionSpec()), platform=platform,
                abstract_gpu=False)                  # its own mesh; no Triton kernel in it
  assert f'mhlo.num_partitions = {devices}' in text
  assert 'sdy.manual_computation' in text and 'stablehlo.all_gather' in text


def _layer_step(precision):
  """A Phase A layer step (no encoder forward pass: every product is the Hamiltonian's)."""
  from coulomb_jax import training  # pylint: disable=g-import-not-at-top
  params = {'enc': {'particles': OMEGA}}
  opt = training.phase_a_optimizer(jax.random.key(1), step_size=0.1, beta=10.0, radius=1.0,
                                   clip_norm=10.0)
  step = training.make_phase_a_layer_step(('enc',), opt, feature_map='favor', lam=0.1,
                                          s='coulomb', softening=0.5, precision=precision)
  state = training.TrainState(jnp.int32(0), params, opt.init(params))
  r = jnp.linspace(-1.0, 1.0, 8 * 2 * 4).reshape(8, 2, 4)              # [B, H, D_h]
  return lambda st: step(st, r, jnp.array([0, 1] * 4), jnp.ones(8))[0].params, (state,)


def _sharded_step(precision):
  from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from coulomb_jax import parallel  # pylint: disable=g-import-not-at-top
  mesh = AbstractMesh((4,), ('p',))
  placed = lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                sharding=NamedSharding(mesh, spec))
  f = lambda w, x, y: parallel.langevin_step_on_mesh(
      jax.random.key(0), w, x, y, mesh=mesh, axis_name='p', feature_map='favor', lam=0.5,
      s='coulomb', step_size=0.1, beta=10.0, radius=1.0, precision=precision)
  return f, (placed(jnp.zeros((8, 4)), PartitionSpec('p')), placed(X, PartitionSpec()),
             placed(Y, PartitionSpec()))


PRECISION_STEPS = {
    'phase_a_layer_step': _layer_step,
    'sharded_langevin_step': _sharded_step,
    'mimicry_hamiltonian_grad': lambda p: (jax.grad(lambda w: mimicry.mimicry_hamiltonian(
        w, X, X, feature_map='favor', lam=0.1, precision=p)), (W,)),
}


@pytest.mark.parametrize('name', sorted(PRECISION_STEPS))
def test_precision_reaches_every_product_of_the_particle_steps(name):
  """``precision`` of a Phase A step, the sharded Langevin step and the mimicry Hamiltonian
  is on every dot_general lowered for tpu (where the default would be bf16 passes)."""
  f, args = PRECISION_STEPS[name]('highest')
  text = _lower(f, *args, platform='tpu')
  assert text.count('dot_general') == text.count('precision = [HIGHEST, HIGHEST]') > 0
  f, args = PRECISION_STEPS[name](None)
  default = _lower(f, *args, platform='tpu')
  assert 'dot_general' in default and 'HIGHEST' not in default
