"""How long the batched recall programs take to compile and run on this machine.

  python -m benchmarks.recall_compile --method=particles_flow --runs=1

One (128, 8), width-64 program of ``--runs`` runs (``experiments/recall/batched.py``) at a
small size (20 steps, 2,000 training sequences, 256 validation and test sequences): prints
the seconds to its first result, which is mostly compilation. XLA_FLAGS from the caller.
"""

import os
import sys
import tempfile
import time

from absl import app
from absl import flags

from configs import mqar as mqar_config
from experiments.recall import batched
from experiments.recall import grid as grid_lib

flags.DEFINE_string('method', 'particles_flow', 'A method of experiments/recall/methods.py.')
flags.DEFINE_integer('runs', 1, 'Runs in the program (rates x seeds).')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  config = grid_lib.apply_overrides(mqar_config.get_config('zoology'), {
      'method': FLAGS.method, 'data.seq_len': 128, 'data.num_pairs': 8, 'model.width': 64,
      'train.steps': 20, 'train.eval_every': 10, 'data.train_examples': 2000,
      'data.num_valid': 256, 'data.num_eval': 256})
  eta = 3e-3 if FLAGS.method.startswith('particles') else None
  rates = (1e-2, 2.154e-3, 4.642e-4, 1e-4)
  specs = [batched.Spec(rates[i % 4], i // 4, eta) for i in range(FLAGS.runs)]
  start = time.time()
  batched.train_program(config, specs, tempfile.mkdtemp(), log=lambda m: None)
  print(f'{FLAGS.method} runs={FLAGS.runs} XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}: '
        f'{time.time() - start:.1f} s', flush=True)


if __name__ == '__main__':
  app.run(main)
