"""How long the batched recall programs take to compile and run on this machine.

  python -m benchmarks.recall_compile --method=particles_flow --runs=1

One (128, 8), width-64 program of ``--runs`` runs (``experiments/recall/batched.py``) at a
small size (20 steps, 2,000 training sequences, 256 validation and test sequences): prints
the seconds to its first result, which is mostly compilation. XLA_FLAGS from the caller.
A bad flag value (an unknown ``--method``, ``--runs`` below 1) ends in one line naming the
flag, exit status 2, before anything is computed or written.
"""

import os
import tempfile
import time

from absl import flags

from configs import mqar as mqar_config
from experiments.common import cli
from experiments.recall import batched
from experiments.recall import grid as grid_lib
from experiments.recall import methods

flags.DEFINE_string('method', 'particles_flow', 'A method of experiments/recall/methods.py.')
flags.DEFINE_integer('runs', 1, 'Runs in the program (rates x seeds).')
FLAGS = flags.FLAGS


def check_flags(argv) -> None:
  """Every flag, before anything is computed or written: one ``cli.ConfigError`` naming
  the flag and its value."""
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  if FLAGS.method not in methods.METHODS:
    raise cli.ConfigError(f'--method: unknown {FLAGS.method!r}; known: {methods.METHODS}.')
  if FLAGS.runs < 1:
    raise cli.ConfigError(f'--runs: expected an integer ≥ 1, got {FLAGS.runs}.')


def main(argv):
  check_flags(argv)
  config = grid_lib.apply_overrides(mqar_config.get_config('zoology'), {
      'method': FLAGS.method, 'data.seq_len': 128, 'data.num_pairs': 8, 'model.width': 64,
      'train.steps': 20, 'train.eval_every': 10, 'data.train_examples': 2000,
      'data.num_valid': 256, 'data.num_eval': 256})
  eta = 3e-3 if FLAGS.method in methods.LANGEVIN_METHODS else None
  rates = (1e-2, 2.154e-3, 4.642e-4, 1e-4)
  specs = [batched.Spec(rates[i % 4], i // 4, eta) for i in range(FLAGS.runs)]
  batched.check_program(config, specs)      # before the temporary folder is made
  start = time.time()
  with tempfile.TemporaryDirectory() as workdir:       # removed after the run
    batched.train_program(config, specs, workdir, log=lambda m: None)
  print(f'{FLAGS.method} runs={FLAGS.runs} XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}: '
        f'{time.time() - start:.1f} s', flush=True)


if __name__ == '__main__':
  cli.run(main, config_flags=())
