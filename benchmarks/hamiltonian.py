r"""Time of one jitted H + ∇H: the O(n·F) alignment against the naive n×n form.

  python -m benchmarks.hamiltonian --out=benchmarks/results
  python -m benchmarks.hamiltonian --page_from_results --feature_map=favor  # page from JSON

For each n (samples) and N (particles), d = 64, a feature map (``--feature_map``,
default random Fourier features), λ = 0.5, s = "coulomb": the median wall time of
``jax.value_and_grad`` of

* fast:  the library's ``hamiltonian`` (A via ‖Φᵀy‖², never an n×n matrix);
* naive: the same H with the alignment computed from the kernel matrix K = ΦΦᵀ,
  A = (yᵀKy − Σ_i y_i² K_ii) / (n(n−1)).

Prints a markdown table and writes ``hamiltonian_<map>.json`` and
``hamiltonian_<map>.md`` (``markdown`` of the JSON alone, so ``--page_from_results`` rewrites
it from a committed JSON) into ``--out``, each replaced atomically. Times are after one warm-up call, each call ended by
``block_until_ready``. A bad flag value (an unknown ``--feature_map``, n below 2, a size
below 1, an ``--out`` that is a file) ends in one line naming the flag, exit status 2,
before anything is computed or written.
"""

import datetime
import json

from absl import flags
import jax
import jax.numpy as jnp

from benchmarks import flag_checks
from benchmarks import pages
from benchmarks.timing import median_seconds
import coulomb_jax as cj
from coulomb_jax import hamiltonian as hl
from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance

_OUT = flags.DEFINE_string('out', 'benchmarks/results', 'Output directory.')
_NS = flags.DEFINE_list('n', ['1000', '2000', '4000', '8000'], 'Numbers of samples.')
_NUMS = flags.DEFINE_list('num_particles', ['64', '256', '1024'], 'Numbers of particles.')
_DIM = flags.DEFINE_integer('dim', 64, 'Input and particle dimension d.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per case (median reported).')
_NAIVE_MAX_N = flags.DEFINE_integer('naive_max_n', 8000, 'Skip the naive form above this n.')
_MAP = flags.DEFINE_string('feature_map', 'rff', 'Feature map name (coulomb_jax.features).')
_PAGE_FROM_RESULTS = flags.DEFINE_bool(
    'page_from_results', False, 'Only rewrite <--out>/hamiltonian_<map>.md from the JSON beside '
    'it (nothing measured; refused beside a flag that changes what is measured).')
# Refused with --page_from_results: the flags that say what is measured (--feature_map picks
# the page).
RUN_FLAGS = ('n', 'num_particles', 'dim', 'repeats', 'naive_max_n')

LAM, S = 0.5, 'coulomb'


def naive_hamiltonian(omega, x, y):
  """H with the alignment from the explicit n×n kernel matrix."""
  phi = cj.get_feature_map(_MAP.value)(x, omega)
  k = phi @ phi.T
  n = x.shape[0]
  a = (y @ k @ y - jnp.sum(jnp.square(y) * jnp.diag(k))) / (n * (n - 1))
  return -a + LAM * cj.riesz_energy(omega, S)


def fast_hamiltonian(omega, x, y):
  return hl.hamiltonian(omega, x, y, feature_map=_MAP.value, lam=LAM, s=S)


def markdown(record: dict) -> str:
  """The page of a record (``hamiltonian_<map>.json``): its provenance and one row per
  (N, n), '–' where the naive form was skipped."""
  lines = ['| N | n | fast H+∇H (ms) | naive H+∇H (ms) | speed-up |', '|---|---|---|---|---|']
  for r in record['rows']:
    naive_ms = f"{1e3 * r['naive_s']:.2f}" if 'naive_s' in r else '–'
    speedup = f"{r['speedup']:.1f}×" if 'speedup' in r else '–'
    lines.append(f"| {r['num_particles']} | {r['n']} | {1e3 * r['fast_s']:.2f} | {naive_ms} "
                 f'| {speedup} |')
  table = '\n'.join(lines)
  return (f"# H + ∇H benchmark ({record['feature_map']})\n\nCommand: `{record['command']}`  \n"
          f"Date: {record['date']}  \nCommit: {record['commit']}  \n"
          f"Machine: {json.dumps(record['machine'])}\n\n{table}\n")


def check_map() -> None:
  """One ``cli.ConfigError`` naming ``--feature_map`` unless the library knows the map."""
  if _MAP.value not in cj.FEATURE_MAPS:
    raise cli.ConfigError(f'--feature_map: unknown {_MAP.value!r}; known: '
                          f'{sorted(cj.FEATURE_MAPS)}.')


def check_flags(argv) -> None:
  """Every flag, before anything is computed or written: one ``cli.ConfigError`` naming
  the flag and its value."""
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  check_map()
  flag_checks.check_ints(_NS, 2)                      # the alignment pairs distinct samples: n ≥ 2
  flag_checks.check_ints(_NUMS, 1)
  for flag in (_DIM, _REPEATS):
    if flag.value < 1:
      raise cli.ConfigError(f'--{flag.name}: expected an integer ≥ 1, got {flag.value}.')
  outputs.check_folder('--out', _OUT.value)
  outputs.check_files_in('--out', _OUT.value, [f'hamiltonian_{_MAP.value}.json',
                                               f'hamiltonian_{_MAP.value}.md'])


def main(argv):
  if _PAGE_FROM_RESULTS.value:
    if len(argv) > 1:
      raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
    check_map()
    print(pages.rewrite_page(_OUT.value, f'hamiltonian_{_MAP.value}', markdown, RUN_FLAGS))
    return
  check_flags(argv)
  fast = jax.jit(jax.value_and_grad(fast_hamiltonian))
  naive = jax.jit(jax.value_and_grad(naive_hamiltonian))
  rows = []
  for num in map(int, _NUMS.value):
    for n in map(int, _NS.value):
      kx, ko = jax.random.split(jax.random.fold_in(jax.random.key(0), n * 10_000 + num))
      x = jax.random.normal(kx, (n, _DIM.value)) / jnp.sqrt(_DIM.value)
      y = jnp.sign(x[:, 0])
      omega = cj.sample_gaussian(ko, num, _DIM.value)
      row = {'n': n, 'num_particles': num, 'dim': _DIM.value,
             'fast_s': median_seconds(fast, omega, x, y, repeats=_REPEATS.value)}
      if n <= _NAIVE_MAX_N.value:
        row['naive_s'] = median_seconds(naive, omega, x, y, repeats=_REPEATS.value)
        row['speedup'] = row['naive_s'] / row['fast_s']
      rows.append(row)
      print(json.dumps(row), flush=True)

  record = {'benchmark': 'hamiltonian', 'feature_map': _MAP.value,
            'command': 'python -m benchmarks.hamiltonian '
            + ' '.join(f'--{k}={v}' for k, v in (('feature_map', _MAP.value),
                                                  ('n', ','.join(_NS.value)),
                                                  ('num_particles', ','.join(_NUMS.value)),
                                                  ('dim', _DIM.value),
                                                  ('repeats', _REPEATS.value),
                                                  ('naive_max_n', _NAIVE_MAX_N.value))),
            'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            'commit': provenance.git_commit(), 'machine': provenance.machine(), 'rows': rows}
  pages.write_record(_OUT.value, f'hamiltonian_{_MAP.value}', record, markdown)


if __name__ == '__main__':
  cli.run(main, config_flags=())
