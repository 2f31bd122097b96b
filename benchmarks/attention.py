r"""Linear attention with a feature map against softmax attention, vs sequence length.

  python -m benchmarks.attention --out=benchmarks/results            # CPU sizes
  python -m benchmarks.attention --lengths=1024,4096,16384,65536,262144 --softmax_max_len=65536

For each L and dtype: the median wall time (after one warm-up call, each call
ended by ``block_until_ready``) of the forward and of forward+backward (grad of
a sum w.r.t. q, k, v) of

* ``linear``: FAVOR+ features (``features.favor``, stabilised: per query row, and
  per (batch, head) for keys) of M particles, then ``attention.linear_attention``;
* ``softmax``: ``jax.nn.dot_product_attention`` (XLA; cuDNN flash on GPU when the
  backend picks it), skipped above ``--softmax_max_len``.

Shapes B × L × H × D (defaults B = 4, H = 8, D = 64, M = 256). Learned and fixed
particles run the same code on different values, so one timing covers both.
Peak device memory is reported where the backend exposes it (GPU), else null.
Writes ``attention.json`` and ``attention.md``.
"""

import datetime
import json
import os

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from coulomb_jax import attention
from coulomb_jax import features
from benchmarks.timing import median_seconds
from experiments import provenance

_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output directory.')
_LENGTHS = flags.DEFINE_list('lengths', ['512', '1024', '2048', '4096', '8192', '16384'],
                             'Sequence lengths L.')
_DTYPES = flags.DEFINE_list('dtypes', ['float32', 'bfloat16'], 'Input dtypes.')
_BATCH = flags.DEFINE_integer('batch', 4, 'Batch size B.')
_HEADS = flags.DEFINE_integer('heads', 8, 'Heads H.')
_HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'Head dimension D.')
_FEATURES = flags.DEFINE_integer('num_features', 256, 'Particles / features M per head.')
_SOFTMAX_MAX = flags.DEFINE_integer('softmax_max_len', 4096,
                                    'Skip softmax attention above this L (O(L²)).')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per case (median reported).')


def linear(omega, q, k, v):
  scale = q.shape[-1] ** -0.25                      # exp(q·k/√D) as in FAVOR+
  qf = features.favor(q * scale, omega, stabilize=True)
  kf = features.favor(k * scale, omega, stabilize=(-3, -1))
  return attention.linear_attention(qf, kf, v)


def softmax(omega, q, k, v):
  del omega
  return jax.nn.dot_product_attention(q, k, v)


def peak_bytes():
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('peak_bytes_in_use')


def main(argv):
  del argv
  key = jax.random.key(0)
  omega = features.sample_orthogonal(jax.random.fold_in(key, 1), _FEATURES.value,
                                     _HEAD_DIM.value)
  rows = []
  for dtype in _DTYPES.value:
    for length in map(int, _LENGTHS.value):
      shape = (_BATCH.value, length, _HEADS.value, _HEAD_DIM.value)
      q, k, v = (jax.random.normal(jax.random.fold_in(key, 10 + i), shape, dtype)
                 for i in range(3))
      for name, fn in (('linear', linear), ('softmax', softmax)):
        if name == 'softmax' and length > _SOFTMAX_MAX.value:
          continue
        fwd = jax.jit(fn)
        bwd = jax.jit(jax.grad(lambda o, a, b, c, f=fn: jnp.sum(f(o, a, b, c).astype(
            jnp.float32)), argnums=(1, 2, 3)))
        row = {'impl': name, 'dtype': dtype, 'L': length,
               'forward_ms': 1e3 * median_seconds(fwd, omega, q, k, v,
                                                  repeats=_REPEATS.value),
               'forward_backward_ms': 1e3 * median_seconds(bwd, omega, q, k, v,
                                                           repeats=_REPEATS.value),
               'peak_bytes': peak_bytes()}
        rows.append(row)
        print(json.dumps(row), flush=True)

  lines = ['| dtype | L | linear fwd (ms) | softmax fwd (ms) | linear fwd+bwd (ms) | '
           'softmax fwd+bwd (ms) |', '|---|---|---|---|---|---|']
  index = {(r['impl'], r['dtype'], r['L']): r for r in rows}
  fmt = lambda r, f: f'{r[f]:.2f}' if r else '–'
  for dtype in _DTYPES.value:
    for length in map(int, _LENGTHS.value):
      lin, soft = index.get(('linear', dtype, length)), index.get(('softmax', dtype, length))
      lines.append(f'| {dtype} | {length} | {fmt(lin, "forward_ms")} | '
                   f'{fmt(soft, "forward_ms")} | {fmt(lin, "forward_backward_ms")} | '
                   f'{fmt(soft, "forward_backward_ms")} |')
  table = '\n'.join(lines)
  print(table)
  flag_text = ' '.join(f'--{f.name}={",".join(f.value) if isinstance(f.value, list) else f.value}'
                       for f in (_LENGTHS, _DTYPES, _BATCH, _HEADS, _HEAD_DIM, _FEATURES,
                                 _SOFTMAX_MAX, _REPEATS))
  record = {'benchmark': 'attention', 'command': f'python -m benchmarks.attention {flag_text}',
            'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            'commit': provenance.git_commit(), 'machine': provenance.machine(), 'rows': rows}
  os.makedirs(_OUT.value, exist_ok=True)
  stem = os.path.join(_OUT.value, 'attention')
  with open(stem + '.json', 'w') as f:
    json.dump(record, f, indent=1)
  with open(stem + '.md', 'w') as f:
    f.write(f"# Linear vs softmax attention\n\nCommand: `{record['command']}`  \n"
            f"Date: {record['date']}  \nCommit: {record['commit']}  \n"
            f"Machine: {json.dumps(record['machine'])}  \n"
            f'B={_BATCH.value}, H={_HEADS.value}, D={_HEAD_DIM.value}, '
            f'M={_FEATURES.value} FAVOR+ features\n\n{table}\n')


if __name__ == '__main__':
  app.run(main)
