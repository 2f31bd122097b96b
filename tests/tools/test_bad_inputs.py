"""Bad inputs to the library: each raises its own error type with a one-line message that
names the argument and the offending value (issue 16, item 5).

Each case is ``(call, error type, regex)``; ``call(tmp)`` gets a fresh directory for the
cases that need files. The regexes include the value itself (``'0.1'``, ``nan``, the
wrong shape, the file name), so a message that only says "invalid input" fails.
"""

import fcntl
import json
import math
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from coulomb_jax import alignment
from coulomb_jax import attention
from coulomb_jax import features
from coulomb_jax import hamiltonian
from coulomb_jax import langevin
from coulomb_jax import parallel
from coulomb_jax.attention import pallas
from coulomb_jax.layers import lm
from coulomb_jax.layers import models
from coulomb_jax.tasks import data
from experiments.analysis import loading
from experiments.common import cli
from experiments.run import train_config

KEY = jax.random.key(0)
W = jnp.ones((4, 3))                                      # [N, d] particles
X = jnp.linspace(-1.0, 1.0, 18).reshape(6, 3)            # [n, d]
Y = jnp.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
STEP = dict(step_size=0.1, beta=1.0, radius=1.0)
RUN = dict(STEP, feature_map='rff', lam=0.5)
Q = jnp.ones((2, 5, 1, 3))                                # [B, L, H, d]
V = jnp.ones((2, 5, 1, 4))
OMEGA_H = jnp.ones((1, 16, 3))                            # [H, M, d]
FEAT = jnp.ones((2, 5, 1, 8))                             # [B, L, H, F]
IDS = jnp.ones((2, 6), jnp.int32)


def _with(a, index, value):
  return jnp.asarray(a).at[index].set(value)


def _step(**kw):
  args = dict(STEP)
  args.update(kw)
  omega, grad = args.pop('omega', W), args.pop('grad', W)
  return langevin.langevin_step(KEY, omega, grad, **args)


def _run(**kw):
  args = dict(RUN)
  args.update(kw)
  omega, x, y = args.pop('omega', W), args.pop('x', X), args.pop('y', Y)
  return langevin.run_langevin(KEY, omega, x, y, **args)


def _transform_update(params, **kw):
  tx = langevin.langevin_transform(KEY, **dict(STEP, **kw))
  return tx.update(jnp.zeros((4, 3)), tx.init(params), params)


def _on_mesh(axis_name='p', omega=W, **kw):
  mesh = jax.make_mesh((1,), ('p',))
  return parallel.langevin_step_on_mesh(KEY, omega, X, Y, mesh=mesh, axis_name=axis_name,
                                        **dict(RUN, **kw))


def _abstract_mesh_step(omega):
  mesh = jax.sharding.AbstractMesh((3,), ('p',))
  return parallel.langevin_step_on_mesh(KEY, omega, X, Y, mesh=mesh, axis_name='p', **RUN)


def _encoder(ids=IDS, segments=IDS, mask=None, **kw):
  model = models.EncoderClassifier(vocab_size=10, max_length=32, width=8, num_heads=2,
                                   ffn_dim=8, num_features=4, **kw)
  mask = jnp.ones(ids.shape, bool) if mask is None else mask
  return model.init(KEY, ids, segments, mask)


def _kernel_attention(x=jnp.ones((2, 5, 4)), mask=None, **kw):
  return models.KernelAttention(**dict(dict(num_heads=2, num_features=4), **kw)).init(
      KEY, x, mask)


def _other_vocab_encoder():
  """Params of a vocab-10 encoder given to a vocab-20 one (was flax's ScopeParamShapeError)."""
  mask = jnp.ones(IDS.shape, bool)
  make = lambda v: models.EncoderClassifier(vocab_size=v, max_length=32, width=8, num_heads=2,
                                            ffn_dim=8, num_features=4)
  return make(20).apply(make(10).init(KEY, IDS, IDS, mask), IDS, IDS, mask)


def _lm(**kw):
  return lm.CausalLM(**dict(dict(vocab_size=10, max_len=8, width=8, num_layers=1, num_heads=2,
                                 num_features=4, attention='kernel', feature_map='elu'), **kw))


def _other_vocab_lm():
  return jax.jit(_lm(vocab_size=20).apply)(_lm().init(KEY, IDS), IDS)


class _ParticlesOf(nn.Module):
  num_features: int

  @nn.compact
  def __call__(self, x):
    return models.particles_param(self, 2, self.num_features, 4)


def _mr(tmp, num_pos):
  directory = os.path.join(tmp, 'rotten_tomatoes')
  os.makedirs(directory, exist_ok=True)
  for name, num in (('rt-polarity.pos', num_pos), ('rt-polarity.neg', 300)):
    with open(os.path.join(directory, name), 'w', encoding='latin-1') as f:
      f.write(''.join(f'sentence {i} .\n' for i in range(num)))
  return tmp


def _sst2_dev(tmp, content):
  directory = os.path.join(tmp, 'glue', 'SST-2')
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'dev.tsv'), 'wb') as f:
    f.write(content)
  return tmp


def _tokenizer():
  return data.train_tokenizer(['a cat sat', 'a dog sat'] * 3, 50, min_frequency=1)


def _corrupt_tokenizer(tmp):
  path = os.path.join(tmp, 'tokenizer.json')
  with open(path, 'w', encoding='utf-8') as f:
    f.write('{"version": "1.0", "truncation": nu')
  return data.load_tokenizer(path)


def _write(tmp, name, content):
  path = os.path.join(tmp, name)
  with open(path, 'wb') as f:
    f.write(content)
  return path


def _npz_without_probs(tmp):
  path = os.path.join(tmp, 'predictions_test.npz')
  np.savez(path, labels=np.zeros(3, np.int64))
  return loading.load_predictions(path)


def _bad_vocab(tmp):
  path = os.path.join(tmp, 'vocab.txt')
  with open(path, 'wb') as f:
    f.write(b'[PAD]\n\xff\xfe\n')
  return data.load_vocab_tokenizer(path)


NUMBER = r'must be a number, got the string'
# features.KERNEL_ATTENTION_MAPS: the paper's seven and hedgehog.
ATTENTION_MAPS = r"\('favor', 'elu', 'softplus', 'sigmoid2', 'cos2', 'softmaxfeat', " \
                 r"'porf_softplus', 'hedgehog'\)"

CASES = [
    # ----------------------------------------------------------------------- features
    ('favor stabilize str', lambda t: features.favor(X, W, stabilize='yes'),
     ValueError, r"^stabilize must be True, False, an axis or a tuple of axes, got 'yes'\.$"),
    ('favor stabilize float', lambda t: features.favor(X, W, stabilize=1.5),
     ValueError, r'^stabilize must be .*, got 1\.5\.$'),
    ('feature map x NaN', lambda t: features.favor(_with(X, (1, 2), jnp.nan), W),
     ValueError, r'^x must be finite, got nan at index \(1, 2\) \(1 of 18 entries'),
    ('feature map omega inf', lambda t: features.rff(X, _with(W, (0, 0), jnp.inf)),
     ValueError, r'^omega must be finite, got inf at index \(0, 0\)'),
    ('unknown map name', lambda t: features.get_feature_map('relu'),
     ValueError, r"^feature_map: unknown name 'relu'; known names: \["),
    ('attention_pair rff', lambda t: features.attention_pair(X, X, W, 'rff'),
     ValueError, rf"^feature_map must be one of the attention maps {ATTENTION_MAPS}, got 'rff'"),
    ('attention_pair mask shape',
     lambda t: features.attention_pair(X, X, W, 'elu', jnp.ones(5, bool)),
     ValueError, r'^key_mask must have shape \(6,\) \(k without its last axis\), got \(5,\)'),
    ('last dims differ', lambda t: features.softplus(X[:, :2], W),
     ValueError, r'^last dimensions differ: x has shape \(6, 2\), omega has shape \(4, 3\)'),
    ('hamiltonian lam < 0',
     lambda t: hamiltonian.hamiltonian(W, X, Y, feature_map='rff', lam=-0.5),
     ValueError, r'^lam must be >= 0, got -0\.5\.$'),
    ('num_particles 0', lambda t: features.sample_gaussian(KEY, 0, 3),
     ValueError, r'^num_particles must be an integer >= 1, got 0\.$'),
    ('dim str', lambda t: features.sample_orthogonal(KEY, 4, '3'),
     ValueError, r"^dim must be an integer >= 1, got '3'\.$"),
    # ---------------------------------------------------------------------- attention
    ('q_feat rank', lambda t: attention.linear_attention(FEAT[0], FEAT, V),
     ValueError, r'^q_feat must have rank 4, got shape \(5, 1, 8\) \(rank 3\)'),
    ('key_mask length', lambda t: attention.linear_attention(FEAT, FEAT, V,
                                                             jnp.ones((2, 4), bool)),
     ValueError, r'^key_mask must have shape \[B, L\] = \(2, 5\), got \(2, 4\)'),
    ('eps str', lambda t: attention.linear_attention(FEAT, FEAT, V, eps='1e-6'),
     ValueError, rf"^eps {NUMBER} '1e-6'"),
    ('causal chunk 0', lambda t: attention.causal_linear_attention(FEAT, FEAT, V, chunk_size=0),
     ValueError, r'^chunk_size must be an integer >= 1, got 0\.$'),
    ('fused causal chunk 0', lambda t: attention.fused_causal_linear_attention(
        Q, Q, V, OMEGA_H, chunk_size=0),
     ValueError, r'^chunk_size must be an integer >= 1, got 0\.$'),
    ('fused causal rff', lambda t: attention.fused_causal_linear_attention(
        Q, Q, V, OMEGA_H, feature_map='rff'),
     ValueError, rf"^feature_map must be one of {ATTENTION_MAPS}, got 'rff'"),
    ('fused implementation', lambda t: attention.fused_linear_attention(
        Q, Q, V, OMEGA_H, implementation='triton'),
     ValueError, r"^implementation must be one of \('auto', 'xla', 'pallas'\), got 'triton'"),
    ('fused rff', lambda t: attention.fused_linear_attention(Q, Q, V, OMEGA_H, feature_map='rff'),
     ValueError, rf"^feature_map must be one of {ATTENTION_MAPS}, got 'rff'"),
    ('fused eps < 0', lambda t: attention.fused_linear_attention(Q, Q, V, OMEGA_H, eps=-1.0),
     ValueError, r'^eps must be > 0, got -1\.0\.$'),
    ('fused chunk str', lambda t: attention.fused_linear_attention(Q, Q, V, OMEGA_H,
                                                                   chunk_size='8'),
     ValueError, r"^chunk_size must be an integer >= 1, got '8'\.$"),
    ('fused omega heads', lambda t: attention.fused_linear_attention(Q, Q, V, W[None, :, :2]),
     ValueError, r'^omega must be \[H, M, d\] = \[1, M, 3\], got \(1, 4, 2\)'),
    ('pallas block_q', lambda t: pallas.pallas_linear_attention(Q, Q, V, OMEGA_H,
                                                                block_q=24),
ValueError, r'^block_q must be a power of two \(Triton block shapes\), got 24\.$'),
    ('pallas num_splits', lambda t: pallas.pallas_linear_attention(
        Q, Q, V, OMEGA_H, num_splits=0),
     ValueError, r'^num_splits must be an integer >= 1, got 0\.$'),
    ('pallas causal eps nan', lambda t: pallas.pallas_causal_linear_attention(
        Q, Q, V, OMEGA_H, eps=math.nan),
     ValueError, r'^eps must be > 0, got nan\.$'),
    # ----------------------------------------------------------------------- langevin
    ('step_size str', lambda t: _step(step_size='0.1'),
     ValueError, rf"^step_size {NUMBER} '0\.1'\.$"),
    ('beta NaN', lambda t: _step(beta=math.nan), ValueError, r'^beta must be > 0, got nan\.$'),
    ('beta None', lambda t: _step(beta=None), ValueError, r'^beta must be a number, got None\.$'),
    ('radius < 0', lambda t: _step(radius=-1), ValueError, r'^radius must be > 0, got -1\.$'),
    ('clip_norm 0', lambda t: _step(clip_norm=0), ValueError, r'^clip_norm must be > 0, got 0\.$'),
    ('step_size array', lambda t: _step(step_size=np.array([0.1, 0.2])),
     ValueError, r'^step_size must be a scalar, got shape \(2,\)\.$'),
    ('grad shape', lambda t: _step(grad=W[:3]),
     ValueError, r'^grad must have the shape of omega \(4, 3\), got \(3, 3\)\.$'),
    ('omega NaN', lambda t: _step(omega=_with(W, (0, 1), jnp.nan)),
     ValueError, r'^omega must be finite, got nan at index \(0, 1\)'),
    ('grad -inf', lambda t: _step(grad=_with(W, (3, 2), -jnp.inf)),
     ValueError, r'^grad must be finite, got -inf at index \(3, 2\)'),
    ('run n = 0', lambda t: _run(x=X[:0], y=Y[:0]),
     ValueError, r'^x must hold at least 2 samples .*, got 0 \(shape \(0, 3\)\)\.$'),
    ('run lam < 0', lambda t: _run(lam=-1), ValueError, r'^lam must be >= 0, got -1\.$'),
    ('run lam NaN', lambda t: _run(lam=math.nan), ValueError, r'^lam must be >= 0, got nan\.$'),
    ('run lam str', lambda t: _run(lam='0.5'), ValueError, rf"^lam {NUMBER} '0\.5'\.$"),
    ('run batch_size 1', lambda t: _run(batch_size=1),
     ValueError, r'^batch_size must be an integer in \[2, 6\], got 1\.$'),
    ('run num_epochs 0', lambda t: _run(num_epochs=0),
     ValueError, r'^num_epochs must be an integer >= 1, got 0\.$'),
    ('run tol < 0', lambda t: _run(tol=-1e-3), ValueError, r'^tol must be >= 0, got -0\.001\.$'),
    ('run softening < 0', lambda t: _run(softening=-0.5),
     ValueError, r'^softening must be >= 0, got -0\.5\.$'),
    ('run x NaN', lambda t: _run(x=_with(X, (2, 0), jnp.nan)),
     ValueError, r'^x must be finite, got nan at index \(2, 0\)'),
    ('run y length', lambda t: _run(y=Y[1:]),
     ValueError, r'^y has 5 labels but x has 6 samples'),
    ('gibbs num_samples 0', lambda t: langevin.gibbs_resample(
        KEY, W, X, Y, 0, beta=1.0, feature_map='rff', lam=0.1),
     ValueError, r'^num_samples must be an integer >= 1, got 0\.$'),
    ('gibbs lam < 0', lambda t: langevin.gibbs_resample(
        KEY, W, X, Y, 2, beta=1.0, feature_map='rff', lam=-0.5),
     ValueError, r'^lam must be >= 0, got -0\.5\.$'),
    ('transform step_size str', lambda t: langevin.langevin_transform(
        KEY, step_size='0.1', beta=1.0, radius=1.0),
     ValueError, rf"^step_size {NUMBER} '0\.1'\.$"),
    ('transform int params', lambda t: _transform_update(jnp.ones((4, 3), jnp.int32)),
     ValueError, r'^params leaf of shape \(4, 3\) has dtype int32: particles must be floating'),
    ('transform params None', lambda t: _transform_update(None),
     ValueError, r'^params: langevin_transform needs the particles \(params\), got None\.$'),
    # ----------------------------------------------------------------------- parallel
    ('mesh axis missing', lambda t: _on_mesh(axis_name='q'),
     ValueError, r"^axis_name 'q' is not an axis of mesh; its axes are \('p',\)\.$"),
    ('sharded step outside pmap', lambda t: parallel.sharded_langevin_step(
        KEY, W, X, Y, axis_name='p', **RUN),
     ValueError, r"^axis_name 'p' is not bound here: sharded_langevin_step must run inside "
                 r'jax\.pmap or jax\.shard_map'),
    ('mesh does not divide', lambda t: _abstract_mesh_step(jnp.ones((5, 3))),
     ValueError, r"^omega has 5 particles, not divisible by the 3 devices of mesh axis 'p'"),
    ('mesh lam < 0', lambda t: _on_mesh(lam=-1.0), ValueError, r'^lam must be >= 0, got -1\.0\.$'),
    ('mesh omega NaN', lambda t: _on_mesh(omega=_with(W, (2, 2), jnp.nan)),
     ValueError, r'^omega must be finite, got nan at index \(2, 2\)'),
    # ------------------------------------------------------------------------- models
    ('encoder mask length', lambda t: _encoder(mask=jnp.ones((2, 5), bool)),
     ValueError, r'^mask must have shape \[B, L\] = \(2, 6\) \(one entry per token\), got '
                 r'\(2, 5\)\.$'),
    ('encoder segments shape', lambda t: _encoder(segments=IDS[:, :5]),
     ValueError, r'^segments must have the shape of ids \(2, 6\), got \(2, 5\)\.$'),
    ('encoder too long', lambda t: _encoder(ids=jnp.ones((1, 40), jnp.int32),
                                            segments=jnp.ones((1, 40), jnp.int32)),
     ValueError, r'^ids: length 40 exceeds max_length=32\.$'),
    ('encoder id = vocab', lambda t: _encoder(ids=IDS.at[1, 3].set(10)),
     ValueError, r'^ids must lie in \[0, 10\), got 10 at index \(1, 3\) \(1 such entries\)\.$'),
    ('encoder negative id', lambda t: _encoder(ids=IDS.at[0, 0].set(-1)),
     ValueError, r'^ids must lie in \[0, 10\), got -1 at index \(0, 0\)'),
    ('encoder float ids', lambda t: _encoder(ids=IDS.astype(jnp.float32)),
     ValueError, r'^ids must be integers, got dtype float32\.$'),
    ('encoder segment 2', lambda t: _encoder(segments=IDS.at[0, 2].set(2)),
     ValueError, r'^segments must lie in \[0, 2\), got 2 at index \(0, 2\)'),
    ('encoder attention kind', lambda t: _encoder(attention='bogus'),
     ValueError, r"^attention must be one of \('kernel', 'softmax', 'linformer'\), got 'bogus'"),
    ('kernel attention rff', lambda t: _kernel_attention(feature_map='rff'),
     ValueError, r"^feature_map: 'rff' is not non-negative"),
    ('kernel attention unknown map', lambda t: _kernel_attention(feature_map='relu'),
     ValueError, rf"^feature_map must be one of {ATTENTION_MAPS[:-2]}, 'taylor'\), "
                 r"got 'relu'\.$"),
    ('encoder params of another vocabulary', lambda t: _other_vocab_encoder(),
     ValueError, r'^params: tokens/embedding has shape \(10, 8\), but this model '
                 r'\(vocab_size=20, max_length=32, width=8\) expects \(20, 8\): params of '
                 r'another model; build the model with the fields the params were made with\.$'),
    ('lm params of another vocabulary (jit)', lambda t: _other_vocab_lm(),
     ValueError, r'^params: embed/embedding has shape \(10, 8\), but this model '
                 r'\(vocab_size=20, max_len=8, width=8\) expects \(20, 8\)'),
    ('lm num_features 0', lambda t: _lm(num_features=0).init(KEY, IDS),
     ValueError, r'^num_features must be an integer >= 1, got 0\.$'),
    ('particles_param num_features 0', lambda t: _ParticlesOf(0).init(KEY, jnp.ones(3)),
     ValueError, r'^num_features must be an integer >= 1, got 0\.$'),
    ('kernel attention qk_mode', lambda t: _kernel_attention(qk_mode='both'),
     ValueError, r"^qk_mode must be one of \('shared', 'projected'\), got 'both'\.$"),
    ('kernel attention width', lambda t: _kernel_attention(x=jnp.ones((2, 5, 5))),
     ValueError, r'^input width 5 is not divisible by num_heads=2\.$'),
    ('kernel attention mask', lambda t: _kernel_attention(mask=jnp.ones((2, 4), bool)),
     ValueError, r'^mask must have shape \[B, L\] = \(2, 5\)'),
    # --------------------------------------------------------------------------- data
    ('task name', lambda t: data.load_split('sst-2', t, 'train'),
     ValueError, r"^task must be one of \('sst2', 'rotten_tomatoes', 'qqp_subset', 'qqp'\), "
                 r"got 'sst-2'\.$"),
    ('min_class_share str', lambda t: data.load_split('sst2', t, 'train', min_class_share='0.01'),
     ValueError, rf"^min_class_share {NUMBER} '0\.01'\.$"),
    ('min_class_share > 0.5', lambda t: data.load_split('sst2', t, 'train', min_class_share=0.7),
     ValueError, r'^min_class_share must be in \[0, 0\.5\] \(two classes\), got 0\.7\.$'),
    ('validation_size < 0', lambda t: data.load_split('sst2', t, 'train', validation_size=-1),
     ValueError, r'^validation_size must be an integer >= 0, got -1\.$'),
    ('empty rt-polarity.pos', lambda t: data.load_split('rotten_tomatoes', _mr(t, 0), 'test'),
     ValueError, r"^rotten_tomatoes 'test' split of .*rt-polarity\.pos, .*rt-polarity\.neg: "
                 r'class counts \{0: 30, 1: 0\} \(30 rows\): class 1 is missing'),
    ('truncated rt-polarity.pos', lambda t: data.load_split('rotten_tomatoes', _mr(t, 1),
                                                            'train'),
     ValueError, r"^rotten_tomatoes 'train' split of .*rt-polarity\.pos, .*: class counts "
                 r'\{0: 240, 1: 1\} \(241 rows\): class 1 holds 0\.41%; every class must hold '
                 r'at least 1% of a split \(min_class_share=0\.01\)'),
    ('non-UTF-8 GLUE file', lambda t: data.load_split(
        'sst2', _sst2_dev(t, b'sentence\tlabel\nok\t1\n\xe9t\xe9\t0\n'), 'test'),
     ValueError, r'glue/SST-2/dev\.tsv:3: not valid UTF-8: byte 0xe9 at offset 20'),
    ('GLUE header', lambda t: data.load_split('sst2', _sst2_dev(t, b'text\tlabel\n'), 'test'),
     ValueError, r"dev\.tsv: expected the header \"sentence\\tlabel\", got 'text\\tlabel'"),
    ('corrupt tokenizer.json', _corrupt_tokenizer,
     ValueError, r'^tokenizer file .*tokenizer\.json is not a valid tokenizers JSON file \('),
    ('unreadable vocab.txt', _bad_vocab,
     ValueError, r'^vocab_file .*vocab\.txt is not a readable vocab\.txt \('),
    ('class balance one class', lambda t: data.check_class_balance(np.zeros(7, int), 'dev.tsv'),
     ValueError, r'^dev\.tsv: class counts \{0: 7, 1: 0\} \(7 rows\): class 1 is missing'),
    ('fingerprint str', lambda t: data.fingerprint('tokenizer.json'),
     ValueError, r"^paths must be a sequence of file paths, got the string 'tokenizer\.json'"),
    ('fingerprint missing file', lambda t: data.fingerprint([os.path.join(t, 'gone.tsv')]),
     FileNotFoundError, r'^data file .*gone\.tsv not found\.$'),
    ('fingerprint changed', lambda t: data.check_fingerprint({'a.tsv': 'f' * 64},
                                                             {'a.tsv': '0' * 64}),
     ValueError, r'^the data changed since this fingerprint was stored: a\.tsv \(sha256 '
                 r'ffffffffffff… now 000000000000…\)\.$'),
    ('source_files task', lambda t: data.source_files('mnli', t),
     ValueError, r"^task must be one of .*, got 'mnli'\.$"),
    ('encode max_length', lambda t: data.encode(
        _tokenizer(), data.Examples(['a cat'], None, np.array([1])), 1),
     ValueError, r'^max_length must be an integer >= 2, got 1\.$'),
    ('batches batch_size', lambda t: next(data.batches(
        data.Encoded([np.array([2, 3])], [np.array([0, 0])], np.array([1])), 0)),
     ValueError, r'^batch_size must be an integer >= 1, got 0\.$'),
    ('vocab_size', lambda t: data.train_tokenizer(['a b'], 3),
     ValueError, r'^vocab_size must be an integer >= 6, got 3\.$'),
    ('fused length 0', lambda t: attention.fused_linear_attention(
        Q[:, :0], Q[:, :0], V[:, :0], OMEGA_H),
     ValueError, r'^q and omega must hold at least one position and one particle \(L >= 1, '
                 r'M >= 1\), got q \(2, 0, 1, 3\)'),
    ('causal length 0', lambda t: attention.fused_causal_linear_attention(
        Q[:, :0], Q[:, :0], V[:, :0], OMEGA_H),
     ValueError, r'^q and omega must hold at least one position .* got q \(2, 0, 1, 3\)'),
    ('langevin key int', lambda t: langevin.langevin_step(0, W, W, **STEP),
     TypeError, r'^key must be a JAX PRNG key \(jax\.random\.key\(seed\)\), got 0 \(int\)\.$'),
    ('run_langevin key str', lambda t: langevin.run_langevin('a', W, X, Y, **RUN),
     TypeError, r"^key must be a JAX PRNG key .*, got 'a' \(str\)\.$"),
    ('sample_gaussian key None', lambda t: features.sample_gaussian(None, 4, 3),
     TypeError, r'^key must be a JAX PRNG key .*, got None \(NoneType\)\.$'),
    ('labels 0/1', lambda t: alignment.target_alignment(X, (Y > 0).astype(jnp.float32)),
     ValueError, r'^y: two-class labels must be ±1, got values \[0\.0, 1\.0\]; map them'),
    ('labels 3/7', lambda t: hamiltonian.hamiltonian(W, X, jnp.where(Y > 0, 7, 3),
                                                      feature_map='rff', lam=0.5),
     ValueError, r'^y: two-class labels must be ±1, got values \[3\.0, 7\.0\]'),
    ('labels NaN', lambda t: alignment.target_alignment(X, Y.at[2].set(jnp.nan)),
     ValueError, r'^y must be finite, got nan at index \(2,\)'),
    ('labels strings', lambda t: alignment.target_alignment(X, np.array(['a', 'b'] * 3)),
     ValueError, r'^y must hold numbers \(±1 for two classes\), got dtype <U1\.$'),
    ('corrupt results.json', lambda t: loading.read_json(
        _write(t, 'results.json', b'{"test": {"accuracy": 0.7')),
     cli.ConfigError, r'^.*results\.json: not valid JSON \(Expecting'),
    ('corrupt predictions npz', lambda t: loading.load_predictions(
        _write(t, 'predictions_test.npz', b'PK\x03\x04 not a zip')),
     cli.ConfigError, r'^.*predictions_test\.npz: not a readable predictions \.npz with '
                      r'arrays labels and probs \('),
    ('predictions npz without probs', _npz_without_probs,
     cli.ConfigError, r'^.*predictions_test\.npz: not a readable predictions \.npz .*KeyError'),
    ('labels bool', lambda t: alignment.target_alignment(X, np.asarray(Y) > 0),
     ValueError, r'^y must hold numbers \(±1 for two classes\), got dtype bool\.$'),
]


_JAX_FOOTER = '\n--------------------\nFor simplicity, JAX has removed its internal frames'


@pytest.mark.parametrize('call, error, match', [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_bad_input_raises_one_line_naming_the_value(call, error, match, tmp_path):
  with pytest.raises(error) as info:
    call(str(tmp_path))
  assert info.type is error                     # not a subclass that happens to match
  # Errors raised while jax traces (flax's init, shard_map) get jax's footer appended.
  message = str(info.value).split(_JAX_FOOTER)[0]
  assert re.search(match, message), (match, message)
  assert '\n' not in message                    # one line


def test_enough_cases():
  assert len(CASES) >= 45
  assert len({c[0] for c in CASES}) == len(CASES)


# ----------------------------------------------------------------------------- command lines
# experiments/train.py and experiments/grid.py command lines (issue 16 item 5, issue 17
# item 4): each mistake ends in exit status 2 and one line '<program>: error: ...' on
# standard error that names the value, before anything is computed. The flags are parsed
# and main called as cli.run does, in this process, on fresh absl FlagValues.

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_RT = os.path.join(_REPO, 'configs', 'rotten_tomatoes.py')


def _train_args(t, *extra, variant='kernel-elu,quick'):
  """A valid train.py command line on a generated Rotten Tomatoes folder ``t``, plus ``extra``."""
  return [f'--config={_RT}:{variant}', f'--workdir={os.path.join(t, "w")}',
          f'--config.data.data_dir={_mr(t, 300)}', *extra]


def _workdir_file(name, content):
  """The train.py arguments for a run folder that holds ``name`` with ``content`` (str or
  a callable of the data folder)."""
  def args(t):
    argv = _train_args(t)
    os.makedirs(os.path.join(t, 'w'), exist_ok=True)
    with open(os.path.join(t, 'w', name), 'w', encoding='utf-8') as f:
      f.write(content(t) if callable(content) else content)
    return argv
  return args


def _changed_data_fingerprint(t):
  files = data.fingerprint(data.source_files('rotten_tomatoes', _mr(t, 300)), root=t)
  files['rotten_tomatoes/rt-polarity.pos'] = 'f' * 64
  return '{"files": %s}' % json.dumps(files)


def _busy(t):
  """The workdir's lock held by another open file (as another process would)."""
  os.makedirs(os.path.join(t, 'w'))
  holder = open(os.path.join(t, 'w', 'lock'), 'w', encoding='utf-8')  # pylint: disable=consider-using-with
  holder.write('pid 4242 on host elsewhere since 2026-01-01T00:00:00+00:00\n')
  holder.flush()
  fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
  _LOCK_HOLDERS.append(holder)           # Held until the test ends (closed by the fixture).
  return _train_args(t)


_LOCK_HOLDERS = []
_GRID = lambda t, *a: ['--dataset=sst2', f'--workdir={os.path.join(t, "g")}', *a]
_OVERRIDE = lambda t, *a: _GRID(t, '--variants=softmax', '--', f'--config.data.data_dir={t}', *a)

CLI_CASES = [
    # --------------------------------------------------------------------- train.py: flags
    ('train misspelled field', 'train',
     lambda t: _train_args(t, '--config.phase_a.lamb=0.1'),
     r"^--config\.phase_a\.lamb=0\.1: unknown config field 'lamb'\. Did you mean \"lam\""),
    ('train misspelled section', 'train',
     lambda t: _train_args(t, '--config.phse_b.learning_rate=0.1'),
     r"^--config\.phse_b\.learning_rate=0\.1: unknown config field 'phse_b'\. Did you mean "
     r'"phase_b"'),
    ('train unknown variant', 'train', lambda t: _train_args(t, variant='kernel-rff'),
     r"variant: expected one of .* plus modifiers \('quick', 'learn'\), got 'kernel-rff'\.$"),
    ('train string for a float', 'train',
     lambda t: _train_args(t, '--config.phase_a.lam=small'),
     r"^flag --config\.phase_a\.lam=small: could not convert string to float: 'small'$"),
    ('train string for an int', 'train',
     lambda t: _train_args(t, '--config.phase_b.batch_size=sixteen'),
     r"--config\.phase_b\.batch_size=sixteen: .*'sixteen'"),
    ('train float for an int', 'train',
     lambda t: _train_args(t, '--config.phase_b.num_epochs=2.5'),
     r'--config\.phase_b\.num_epochs=2\.5: .*2\.5'),
    ('train negative lambda', 'train', lambda t: _train_args(t, '--config.phase_a.lam=-1'),
     r'^config\.phase_a\.lam: expected a finite number ≥ 0, got -1\.0\.$'),
    ('train NaN lambda', 'train', lambda t: _train_args(t, '--config.phase_a.lam=nan'),
     r'^config\.phase_a\.lam: expected a finite number ≥ 0, got nan\.$'),
    ('train inf step size', 'train', lambda t: _train_args(t, '--config.phase_a.step_size=inf'),
     r'^config\.phase_a\.step_size: expected a finite number > 0, got inf\.$'),
    ('train negative learning rate', 'train',
     lambda t: _train_args(t, '--config.phase_b.learning_rate=-0.001'),
     r'^config\.phase_b\.learning_rate: expected a finite number > 0, got -0\.001\.$'),
    ('train NaN dropout', 'train', lambda t: _train_args(t, '--config.model.dropout_rate=nan'),
     r'^config\.model\.dropout_rate: expected a number in \[0, 1\), got nan\.$'),
    ('train riesz_s not a number', 'train',
     lambda t: _train_args(t, '--config.phase_a.riesz_s=two'),
     r"^config\.phase_a\.riesz_s: expected 'coulomb' or a number ≥ 0 .*, got 'two'\.$"),
    ('train batch size 0', 'train', lambda t: _train_args(t, '--config.phase_b.batch_size=0'),
     r'^config\.phase_b\.batch_size: expected an integer ≥ 1, got 0\.$'),
    ('train missing data folder', 'train',
     lambda t: _train_args(t, f'--config.data.data_dir={os.path.join(t, "nowhere")}'),
     r"^config\.data\.data_dir: expected an existing folder with the data, got '.*nowhere'\.$"),
    ('train bad process_id', 'train',
     lambda t: _train_args(t, '--jax_distributed', '--coordinator_address=127.0.0.1:1234',
                           '--num_processes=2', '--process_id=2'),
     r'^--process_id: expected 0 \.\. 1 \(for --num_processes=2\), got 2\.$'),
    ('train coordinator without jax_distributed', 'train',
     lambda t: _train_args(t, '--coordinator_address=127.0.0.1:1234', '--num_processes=2',
                           '--process_id=0'),
     r'^--coordinator_address=127\.0\.0\.1:1234: needs --jax_distributed\.$'),
    ('train coordinator without a port', 'train',
     lambda t: _train_args(t, '--jax_distributed', '--coordinator_address=localhost',
                           '--num_processes=2', '--process_id=0'),
     r"^--coordinator_address: expected HOST:PORT, got 'localhost'\.$"),
    ('train distributed_timeout 0', 'train',
     lambda t: _train_args(t, '--jax_distributed', '--distributed_timeout=0'),
     r'^--distributed_timeout: expected an integer ≥ 1 \(seconds\), got 0\.$'),
    ('train stop_after_steps 0', 'train', lambda t: _train_args(t, '--stop_after_steps=0'),
     r'^--stop_after_steps: expected an integer ≥ 1, got 0\.$'),
    ('train no workdir', 'train', lambda t: [f'--config={_RT}:softmax'],
     r'^--workdir: required'),
    # -------------------------------------------------------------- train.py: the workdir
    ('train corrupt config.json', 'train', _workdir_file('config.json', '{"seed": 0,'),
     r'/w/config\.json is not valid JSON \(Expecting .*\): the file is damaged'),
    ('train config.json of another run', 'train', _workdir_file('config.json', '{"seed": 5}'),
     r"^workdir: '.*/w' holds a run with a different config \(.*/w/config\.json\)"),
    ('train corrupt history.jsonl', 'train',
     _workdir_file('history.jsonl', '{"epoch": 0, "t": \n{"epoch": 1, "t": 8}\n'),
     r'/w/history\.jsonl:1 is not valid JSON \(.*\): the file is damaged'),
    ('train corrupt tokenizer.json', 'train', _workdir_file('tokenizer.json', '{"version": '),
     r'^tokenizer file .*/w/tokenizer\.json is not a valid tokenizers JSON file'),
    ('train corrupt fingerprint.json', 'train', _workdir_file('fingerprint.json', '[1, 2'),
     r'/w/fingerprint\.json is not valid JSON'),
    ('train data changed', 'train', _workdir_file('fingerprint.json', _changed_data_fingerprint),
     r"^the data of the run in '.*/w' changed since this fingerprint was stored: "
     r'rotten_tomatoes/rt-polarity\.pos \(sha256 ffffffffffff… now [0-9a-f]{12}…\)\. Restore'),
    ('train busy workdir', 'train', _busy,
     r"^workdir '.*/w' is in use by pid 4242 on host elsewhere since 2026-01-01T00:00:00\+00:00 "
     r'\(lock .*/w/lock\)'),
    # ---------------------------------------------------------------------------- grid.py
    ('grid unknown dataset', 'grid', lambda t: ['--dataset=sst3'],
     r"^--dataset: expected names in \['qqp_subset', 'rotten_tomatoes', 'sst2'\], got 'sst3'\.$"),
    ('grid seeds not integers', 'grid', lambda t: _GRID(t, '--seeds=0,one'),
     r"^--seeds: expected integers ≥ 0, got 'one' in '0,one'\.$"),
    ('grid negative seed', 'grid', lambda t: _GRID(t, '--seeds=-1'),
     r"^--seeds: expected integers ≥ 0, got '-1'\.$"),
    ('grid unknown variant', 'grid', lambda t: _GRID(t, '--variants=softmax,kernel-rff'),
     r"^--variants: 'kernel-rff' is not a variant"),
    ('grid jobs 0', 'grid', lambda t: _GRID(t, '--jobs=0'),
     r'^--jobs: expected an integer ≥ 1, got 0\.$'),
    ('grid misspelled flag', 'grid', lambda t: ['--datset=sst2'],
     r"^Unknown command line flag 'datset'\. Did you mean: dataset \?$"),
    ('grid misspelled config field', 'grid', lambda t: _OVERRIDE(t, '--config.phase_a.lamb=1'),
     r"^sst2 softmax: --config\.phase_a\.lamb=1: unknown config field 'lamb'\. Did you mean "
     r'"lam"'),
    ('grid NaN config value', 'grid', lambda t: _OVERRIDE(t, '--config.phase_b.clip_norm=nan'),
     r'^sst2 softmax: config\.phase_b\.clip_norm: expected a finite number > 0, got nan\.$'),
    ('grid string config value', 'grid', lambda t: _OVERRIDE(t, '--config.seed=one'),
     r"^sst2 softmax: flag --config\.seed=one: .*'one'"),
]


@pytest.fixture
def _release_locks():
  yield
  while _LOCK_HOLDERS:
    _LOCK_HOLDERS.pop().close()


@pytest.mark.parametrize('program, argv, match',
                         [pytest.param(*c[1:], id=c[0]) for c in CLI_CASES])
def test_bad_command_line_ends_in_one_line_naming_the_value(program, argv, match, tmp_path,
                                                            monkeypatch, capsys, _release_locks):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from experiments.common import cli  # pylint: disable=g-import-not-at-top
  from experiments import grid  # pylint: disable=g-import-not-at-top
  from experiments import train  # pylint: disable=g-import-not-at-top
  from experiments.run import train_flags  # pylint: disable=g-import-not-at-top
  module = {'train': train, 'grid': grid}[program]
  define_flags = {'train': train_flags.define_flags, 'grid': grid.define_flags}[program]
  monkeypatch.delenv('COULOMB_JAX_DATA', raising=False)
  args = argv(str(tmp_path))
  monkeypatch.setattr(sys, 'argv', [f'{program}.py'] + args)   # config_flags reads sys.argv
  fv = flags.FlagValues()
  define_flags(fv)
  with pytest.raises(SystemExit) as info:                     # what cli.run does
    rest = cli.parse_flags(sys.argv, flag_values=fv)
    try:
      module.main(rest, fv)
    except (cli.ConfigError, cli.StorageError) as e:
      cli.fail(str(e))
  assert info.value.code == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and err.startswith(f'{program}: error: '), err
  message = err[len(f'{program}: error: '):].rstrip('\n')
  assert re.search(match, message), (match, message)
  assert not os.path.exists(os.path.join(str(tmp_path), 'w', 'results.json'))


def test_unset_data_folder_names_where_it_looked(tmp_path, monkeypatch):
  from configs import rotten_tomatoes  # pylint: disable=g-import-not-at-top
  config = rotten_tomatoes.get_config('softmax')
  assert config.data.data_dir == ''
  monkeypatch.setenv('COULOMB_JAX_DATA', str(tmp_path / 'missing'))
  with pytest.raises(ValueError, match=r"^config\.data\.data_dir: not set, and "
                     r"\$COULOMB_JAX_DATA='.*missing' is not a folder; set "
                     r'--config\.data\.data_dir=FOLDER or COULOMB_JAX_DATA=FOLDER'):
    train_config.check_config(config)
  monkeypatch.delenv('COULOMB_JAX_DATA')
  monkeypatch.setattr(train_config, 'DEFAULT_DATA_DIR', str(tmp_path / 'shared' / 'data'))
  with pytest.raises(ValueError, match=r'^config\.data\.data_dir: not set, and '
                     r'\$COULOMB_JAX_DATA is not set and \.\./shared/data next to the '
                     r'repository \(.*/shared/data\) is not a folder'):
    train_config.check_config(config)


def test_enough_cli_cases():
  assert len(CLI_CASES) >= 15
  assert len({c[0] for c in CLI_CASES}) == len(CLI_CASES)


def test_padded_slots_may_hold_any_id():
  """Padding changes nothing even when a padded slot holds id = vocab_size or segment 2."""
  model = models.EncoderClassifier(vocab_size=10, max_length=32, width=8, num_heads=2,
                                   ffn_dim=8, num_features=4)
  mask = jnp.ones(IDS.shape, bool).at[:, 4:].set(False)
  params = model.init(KEY, IDS, IDS, mask)
  clean = model.apply(params, IDS, IDS, mask)
  odd = model.apply(params, IDS.at[:, 4:].set(10), IDS.at[:, 4:].set(2), mask)
  assert np.all(np.isfinite(np.asarray(odd)))
  np.testing.assert_array_equal(np.asarray(odd), np.asarray(clean))


@pytest.mark.slow
@pytest.mark.parametrize('process_id, says', [
    (1, r'process 1 of 2: no coordinator answered at 127\.0\.0\.1:\d+'),
    (0, r'process 0 \(the coordinator, at 127\.0\.0\.1:\d+\): the other 1 process\(es\) did '
        r'not connect'),
])
def test_distributed_without_peers_ends_in_one_line_not_an_abort(process_id, says, tmp_path):
  """jaxlib aborts (SIGABRT, a C++ trace) when the processes do not all connect; the
  watchdog of ``train_flags.init_distributed`` gives one line and status 2 first, and
  nothing is written to the run folder."""
  import socket  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:                              # a port nobody listens on
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  argv = _train_args(str(tmp_path), '--jax_distributed', f'--coordinator_address=127.0.0.1:{port}',
                     '--num_processes=2', f'--process_id={process_id}', '--distributed_timeout=2')
  env = dict(os.environ, JAX_PLATFORMS='cpu', TF_CPP_MIN_LOG_LEVEL='3')
  proc = subprocess.run([sys.executable, os.path.join(_REPO, 'experiments', 'train.py'), *argv],
                        capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  errors = [l for l in proc.stderr.splitlines() if l.startswith('train: error: ')]
  assert len(errors) == 1 and 'Aborted' not in proc.stderr and '@     0x' not in proc.stderr
  assert re.search(r'^train: error: --jax_distributed: ' + says + r' within '
                   r'--distributed_timeout=2 s \(are all 2 processes started', errors[0]), errors
  assert not os.path.exists(os.path.join(str(tmp_path), 'w', 'results.json'))


@pytest.mark.slow
def test_a_disk_too_small_for_the_checkpoints_is_one_line_before_any_compute(
    tmp_path, monkeypatch, capsys):
  """Disk full, up front (train.py): ``checkpoints.check_free_space`` before any step. A
  disk that fills mid-run, and atomic writes on a full disk: tests/tools/test_storage.py."""
  import collections  # pylint: disable=g-import-not-at-top
  usage = collections.namedtuple('usage', 'total used free')
  monkeypatch.setattr('shutil.disk_usage', lambda _: usage(2**30, 2**30 - 2**15, 2**15))
  test_bad_command_line_ends_in_one_line_naming_the_value(
      'train', _train_args, r"^workdir '.*/w': 0\.0 MiB free on its filesystem, but this "
      r"run's checkpoints need about \d+\.\d MiB \(2 kept plus one being written, \d+\.\d MiB "
      r'each\); free some space or choose another --workdir\.$', tmp_path, monkeypatch, capsys,
      None)
  assert not os.path.exists(os.path.join(str(tmp_path), 'w', 'checkpoints', '0'))
