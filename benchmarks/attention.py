r"""Kernel (linear) attention against softmax attention, vs sequence length.

  python -m benchmarks.attention --out=benchmarks/results            # CPU sizes
  python -m benchmarks.attention --lengths=1024,4096,16384,65536,262144 --softmax_max_len=65536
  python -m benchmarks.attention --page_from_results --out=benchmarks/results  # page from JSON

For each L, dtype and feature map: the median wall time (after one warm-up call,
each call ended by ``block_until_ready``) of the forward and of forward+backward
(grad of a sum w.r.t. q, k, v) of

* ``materialized``: the per-head feature map (``favor`` stabilised per query
  row and per (batch, head) for keys, as ``models.KernelAttention`` does), then
  ``attention.linear_attention``: the ``[B, L, H, M]`` features are stored;
* ``fused``: ``attention.fused_linear_attention(implementation='xla')`` (chunks
  of ``--chunk_size`` tokens, features computed inside each chunk, never stored);
* ``pallas``: ``fused_linear_attention(implementation='pallas')``: the two
  kernels of ``coulomb_jax.attention.pallas`` forward, the XLA path under
  ``grad`` (so its fwd+bwd is the fused one's plus nothing); Pallas interpret
  mode off the GPU, so only meaningful on a GPU (``--impls`` to add it);
* ``softmax``: ``jax.nn.dot_product_attention(implementation='xla')`` (the L × L logits
  materialised), skipped above ``--softmax_max_len``;
* ``cudnn``: ``jax.nn.dot_product_attention(implementation='cudnn')``, cuDNN's flash
  attention (GPU only, 16-bit inputs; elsewhere the row records the error), skipped
  above ``--cudnn_max_len``;
* ``causal`` (stored features, then ``attention.causal_linear_attention``) and
  ``pallas_causal`` (``pallas.pallas_causal_linear_attention``): the
  causal (decoder) form, for ``--impls`` to add; ``fused_causal``
  (``attention.fused_causal_linear_attention``, the model's causal path, exact at
  any input scale for every map).

``vanilla`` particles are an orthogonal N(0, I) draw; ``learned`` ones are the
same draw after Langevin-like moves (projected onto the radius-1.5 ball and
perturbed), i.e. what Phase A hands to the model: the code is the same, the
values differ, and the table's learned ÷ vanilla column is the ratio of their
fwd+bwd medians, or, with ``--pairs=N``, the median [quartiles] of N
interleaved paired ratios (``timing.paired_ratio``; robust to a shared
machine's drift).
Memory: ``temp_mb`` is XLA's compiled temporary-buffer size of the
forward+backward (``memory_analysis``, any backend: it is what grows with L
beyond inputs and outputs), ``peak_mb`` the device's peak where the backend
exposes it (GPU; cumulative over the process, so it never decreases), else null. Shapes B × L × H × D (defaults B = 4, H = 8,
D = 64, M = 256). Writes ``attention.json`` and ``attention.md``, and each row to
``attention_rows.jsonl`` as it finishes (with the commit: ``provenance.git_commit``, or
``$COULOMB_JAX_COMMIT`` on a copy without ``.git``); the page is ``markdown(record)`` of the
JSON alone, so ``--page_from_results`` rewrites it from a committed JSON, measuring nothing. ``--max_seconds`` stops starting new
cases after that long, so the summary is written inside an outer ``timeout``. Each case
compiles its forward and its forward+backward once (``lower().compile()``: the timed
programs and the memory analysis are the same executables). A bad flag value (an unknown
implementation, map or dtype, a size below 1, an ``--out`` that is a file) ends in one line
naming the flag, exit status 2, before anything is computed or written.
"""

import datetime
import functools
import json
import os
import time

from absl import flags
import jax
import jax.numpy as jnp

from benchmarks import flag_checks
from benchmarks import pages
from benchmarks.timing import median_seconds, paired_ratio
from coulomb_jax import attention
from coulomb_jax import features
from coulomb_jax import langevin
from coulomb_jax.attention import pallas
from coulomb_jax.attention.pallas import causal as causal_kernel
from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance

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
_CUDNN_MAX = flags.DEFINE_integer('cudnn_max_len', 262144,
                                  'Skip cuDNN flash attention above this L (O(L²) time).')
_MAX_SECONDS = flags.DEFINE_float('max_seconds', 0.0, 'Start no new case after this many '
                                  'seconds (0: no limit); the summary is still written.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per case (median reported).')
_MAPS = flags.DEFINE_list('feature_maps', ['favor'], 'Feature maps of kernel attention.')
_IMPLS = flags.DEFINE_list('impls', ['materialized', 'fused', 'softmax'], 'Implementations.')
_CHUNK = flags.DEFINE_integer('chunk_size', 1024, 'Chunk length of the fused path.')
_LEARNED = flags.DEFINE_bool('learned', True, 'Also time learned particles (same code).')
_PAGE_FROM_RESULTS = flags.DEFINE_bool(
    'page_from_results', False, 'Only rewrite <--out>/attention.md from <--out>/attention.json '
    '(nothing measured; refused beside a flag that changes what is measured).')
_PAIRS = flags.DEFINE_integer('pairs', 0, 'Also time learned ÷ vanilla fwd+bwd in this many '
                              'interleaved pairs (timing.paired_ratio; 0: off).')


def materialized(feature_map, omega, q, k, v):
  """omega: [H, M, D]. Features per head, stored, then linear_attention."""
  scale = q.shape[-1] ** -0.25                      # exp(q·k/√D) as in FAVOR+
  per_head = lambda f, a: jax.vmap(f, in_axes=(2, 0), out_axes=2)(a * scale, omega)
  if feature_map == 'favor':                        # as models.KernelAttention
    pair = lambda qh, kh, w: features.favor_pair(qh * scale, kh * scale, w)
    qf, kf = jax.vmap(pair, in_axes=(2, 2, 0), out_axes=2)(q, k, omega)
  else:
    fm = features.get_feature_map(feature_map)
    qf, kf = per_head(fm, q), per_head(fm, k)
  return attention.linear_attention(qf, kf, v)


def fused(feature_map, omega, q, k, v, implementation='xla'):
  scale = q.shape[-1] ** -0.25
  return attention.fused_linear_attention(q * scale, k * scale, v, omega,
                                          feature_map=feature_map, chunk_size=_CHUNK.value,
                                          implementation=implementation)


def softmax(feature_map, omega, q, k, v, implementation='xla'):
  del feature_map, omega
  return jax.nn.dot_product_attention(q, k, v, implementation=implementation)


def causal(feature_map, omega, q, k, v):
  """Causal: per-head features stored, then the chunked ``causal_linear_attention``."""
  scale = q.shape[-1] ** -0.25
  return causal_kernel._causal_reference(  # pylint: disable=protected-access
      q * scale, k * scale, v, omega, None, name=feature_map, eps=attention.DEFAULT_EPS)


def fused_causal(feature_map, omega, q, k, v):
  """Causal from the particles, exact at any scale (``fused_causal_linear_attention``)."""
  scale = q.shape[-1] ** -0.25
  return attention.fused_causal_linear_attention(q * scale, k * scale, v, omega,
                                                 feature_map=feature_map)


def pallas_causal(feature_map, omega, q, k, v):
  scale = q.shape[-1] ** -0.25
  return pallas.pallas_causal_linear_attention(q * scale, k * scale, v, omega,
                                              feature_map=feature_map)


IMPLS = {'materialized': materialized, 'fused': fused,
         'pallas': functools.partial(fused, implementation='pallas'), 'softmax': softmax,
         'cudnn': functools.partial(softmax, implementation='cudnn'),
         'causal': causal, 'fused_causal': fused_causal, 'pallas_causal': pallas_causal}


def peak_mb():
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get('peak_bytes_in_use')
  return None if peak is None else peak / 2**20


def temp_mb(compiled):
  try:
    return compiled.memory_analysis().temp_size_in_bytes / 2**20
  except Exception:  # pylint: disable=broad-except
    return None


SOFTMAX_IMPLS = ('softmax', 'cudnn')   # no feature map, no particles


def measure(fn, omega, q, k, v, repeats):
  """Forward and forward+backward: each compiled once, timed, its memory analysed."""
  loss = lambda o, a, b, c: jnp.sum(fn(o, a, b, c).astype(jnp.float32))
  fwd = jax.jit(fn).lower(omega, q, k, v).compile()
  bwd = jax.jit(jax.grad(loss, argnums=(1, 2, 3))).lower(omega, q, k, v).compile()
  return bwd, dict(forward_ms=1e3 * median_seconds(fwd, omega, q, k, v, repeats=repeats),
                   forward_backward_ms=1e3 * median_seconds(bwd, omega, q, k, v,
                                                            repeats=repeats),
                   temp_mb=temp_mb(bwd), peak_mb=peak_mb())


def cases(lengths, sets):
  """(L, impl, map, particles kind) in the order run: lengths outer, as given."""
  for length in lengths:
    for impl in _IMPLS.value:
      if ((impl == 'softmax' and length > _SOFTMAX_MAX.value)
          or (impl == 'cudnn' and length > _CUDNN_MAX.value)):
        continue
      for fmap in ['-'] if impl in SOFTMAX_IMPLS else _MAPS.value:
        for kind in sets:
          if impl not in SOFTMAX_IMPLS or kind == 'vanilla':
            yield length, impl, fmap, kind


def particles(key, learned):
  """[H, M, D] orthogonal draws; learned: projected on the 1.5-ball and perturbed."""
  keys = jax.random.split(key, _HEADS.value)
  omega = jax.vmap(lambda k: features.sample_orthogonal(k, _FEATURES.value,
                                                        _HEAD_DIM.value))(keys)
  if learned:
    omega = langevin.project_to_ball(
        omega + 0.1 * jax.random.normal(jax.random.fold_in(key, 7), omega.shape), 1.5)
  return omega


OUTPUTS = ('attention.json', 'attention.md', 'attention_rows.jsonl')
# Refused with --page_from_results: the flags that say what is measured.
RUN_FLAGS = ('lengths', 'dtypes', 'batch', 'heads', 'head_dim', 'num_features',
             'softmax_max_len', 'cudnn_max_len', 'max_seconds', 'repeats', 'feature_maps',
             'impls', 'chunk_size', 'learned', 'pairs')


def markdown(record: dict) -> str:
  """The page of a record (``attention.json``): its provenance and one row per dtype, map
  and L of the command's flags, '–' where a case was not measured."""
  settings = pages.command_flags(record['command'])
  impls, dtypes = settings['impls'].split(','), settings['dtypes'].split(',')
  index = {(r['impl'], r['feature_map'], r['particles'], r['dtype'], r['L']): r
           for r in record['rows']}
  num = lambda r, f, p=2: '–' if r is None or r.get(f) is None else f'{r[f]:.{p}f}'
  kernel_impls = [i for i in impls if i not in SOFTMAX_IMPLS]
  lines = ['| dtype | map | L | ' + ' | '.join(f'{i} fwd / fwd+bwd (ms)' for i in impls)
           + ' | temp MB ' + ' / '.join(impls) + ' | learned ÷ vanilla (fwd+bwd) '
           + ' / '.join(kernel_impls) + ' |', '|---' * (len(impls) + 5) + '|']
  for dtype in dtypes:
    for fmap in settings['feature_maps'].split(','):
      for length in map(int, settings['lengths'].split(',')):
        get = lambda i, kind='vanilla': index.get(
            (i, '-' if i in SOFTMAX_IMPLS else fmap, kind, dtype, length))
        ratios = []
        for impl in kernel_impls:
          lr, va = get(impl, 'learned'), get(impl)
          paired = lr and lr.get('learned_over_vanilla_paired')
          if paired:
            ratios.append(f"{paired['median']:.3f} [{paired['q25']:.3f}, {paired['q75']:.3f}]")
          elif lr and va and lr['forward_backward_ms'] and va['forward_backward_ms']:
            ratios.append(f"{lr['forward_backward_ms'] / va['forward_backward_ms']:.3f}")
          else:
            ratios.append('–')
        times = ' | '.join(f'{num(get(i), "forward_ms")} / {num(get(i), "forward_backward_ms")}'
                           for i in impls)
        mem = ' / '.join(num(get(i), 'temp_mb', 0) for i in impls)
        lines.append(f'| {dtype} | {fmap} | {length} | {times} | {mem} | '
                     f'{" / ".join(ratios)} |')
  table = '\n'.join(lines)
  return (f"# Kernel attention vs softmax attention\n\nCommand: `{record['command']}`  \n"
          f"Date: {record['date']}  \nCommit: {record['commit']}  \n"
          f"Machine: {json.dumps(record['machine'])}  \n"
          f"B={settings['batch']}, H={settings['heads']}, D={settings['head_dim']}, "
          f"M={settings['num_features']}.\n\n{table}\n")


def check_flags(argv) -> None:
  """Every flag, before anything is computed or written: one ``cli.ConfigError`` naming
  the flag and its value."""
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  unknown = sorted(set(_IMPLS.value) - set(IMPLS))
  if unknown or not _IMPLS.value:
    raise cli.ConfigError(f'--impls: unknown {unknown or "(none given)"}; known: '
                          f'{sorted(IMPLS)}.')
  maps = features.names()
  unknown = sorted(set(_MAPS.value) - set(maps))
  if unknown or not _MAPS.value:
    raise cli.ConfigError(f'--feature_maps: unknown {unknown or "(none given)"}; known: '
                          f'{sorted(maps)}.')
  for name in _DTYPES.value:
    try:
      floating = jnp.issubdtype(jnp.dtype(name), jnp.floating)
    except TypeError:
      floating = False
    if not floating:
      raise cli.ConfigError(f'--dtypes: expected floating dtypes (float32, bfloat16, ...), '
                            f'got {name!r}.')
  if not _DTYPES.value:
    raise cli.ConfigError('--dtypes: expected floating dtypes (float32, bfloat16, ...), got '
                          'none.')
  flag_checks.check_ints(_LENGTHS, 1)
  for flag, low in ((_BATCH, 1), (_HEADS, 1), (_HEAD_DIM, 1), (_FEATURES, 1), (_CHUNK, 1),
                    (_REPEATS, 1), (_PAIRS, 0)):
    if flag.value < low:
      raise cli.ConfigError(f'--{flag.name}: expected an integer ≥ {low}, got {flag.value}.')
  if not _MAX_SECONDS.value >= 0:
    raise cli.ConfigError(f'--max_seconds: expected a number ≥ 0 (0: no limit), got '
                          f'{_MAX_SECONDS.value}.')
  outputs.check_folder('--out', _OUT.value)
  outputs.check_files_in('--out', _OUT.value, OUTPUTS)


def main(argv):
  if _PAGE_FROM_RESULTS.value:
    if len(argv) > 1:
      raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
    print(pages.rewrite_page(_OUT.value, 'attention', markdown, RUN_FLAGS))
    return
  check_flags(argv)
  # The commit of the code that runs, taken before this run writes anything: its
  # attention_rows.jsonl (tracked) would otherwise mark every run '-dirty'.
  commit = provenance.git_commit()
  start = time.perf_counter()
  key = jax.random.key(0)
  os.makedirs(_OUT.value, exist_ok=True)
  sets = {'vanilla': particles(jax.random.fold_in(key, 1), False)}
  if _LEARNED.value:
    sets['learned'] = particles(jax.random.fold_in(key, 1), True)
  rows = []
  for dtype in _DTYPES.value:
    inputs = {}
    for length, impl, fmap, kind in cases(map(int, _LENGTHS.value), sets):
      if _MAX_SECONDS.value and time.perf_counter() - start > _MAX_SECONDS.value:
        print(f'--max_seconds={_MAX_SECONDS.value} reached: no new case.', flush=True)
        break
      if length not in inputs:
        shape = (_BATCH.value, length, _HEADS.value, _HEAD_DIM.value)
        inputs = {length: [jax.random.normal(jax.random.fold_in(key, 10 + i), shape, dtype)
                           for i in range(3)]}
      q, k, v = inputs[length]
      omega = sets[kind]
      row = {'impl': impl, 'feature_map': fmap, 'particles': kind, 'dtype': dtype,
             'L': length, 'commit': commit}
      try:
        bwd, timings = measure(functools.partial(IMPLS[impl], fmap), omega, q, k, v,
                               _REPEATS.value)
        row.update(timings)
        if kind == 'learned' and _PAIRS.value:
          row['learned_over_vanilla_paired'] = paired_ratio(
              bwd, (sets['vanilla'], q, k, v), (omega, q, k, v), pairs=_PAIRS.value)
      except Exception as e:  # pylint: disable=broad-except
        # Out of memory at large L (softmax), no cuDNN off the GPU: keep the row, say why.
        row.update(forward_ms=None, forward_backward_ms=None, temp_mb=None,
                   peak_mb=peak_mb(), error=f'{type(e).__name__}: {str(e)[:200]}')
      rows.append(row)
      print(json.dumps(row), flush=True)
      # One line per case as it finishes, so a killed run keeps what it measured.
      with open(os.path.join(_OUT.value, 'attention_rows.jsonl'), 'a') as f:
        f.write(json.dumps(row) + '\n')

  flag_text = ' '.join(f'--{f.name}={",".join(f.value) if isinstance(f.value, list) else f.value}'
                       for f in (_LENGTHS, _DTYPES, _BATCH, _HEADS, _HEAD_DIM, _FEATURES,
                                 _SOFTMAX_MAX, _CUDNN_MAX, _REPEATS, _MAPS, _IMPLS, _CHUNK,
                                 _LEARNED, _PAIRS, _MAX_SECONDS))
  record = {'benchmark': 'attention', 'command': f'python -m benchmarks.attention {flag_text}',
            'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            'commit': commit, 'machine': provenance.machine(), 'rows': rows}
  pages.write_record(_OUT.value, 'attention', record, markdown)


if __name__ == '__main__':
  cli.run(main, config_flags=())
