r"""The figure of kernel attention's cost against softmax, from ``benchmarks.attention``'s JSON.

  python -m experiments.attention_figure --attention=benchmarks/results/attention.json \
      --out=docs/figures/performance_attention.png

draws time and memory against the sequence length L, one line per implementation
(``experiments.analysis.plots.attention_figure``), and prints the PNG's path.
"""

import json
import os
import sys

if __name__ == '__main__' and not __package__:
  # Launched as a file: make the repository root importable (as experiments/synthetic.py).
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app
from absl import flags

from experiments.analysis import plots


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  with open(_ATTENTION.value) as f:
    print(plots.attention_figure(_OUT.value, json.load(f)), file=sys.stdout)


if __name__ == '__main__':
  _ATTENTION = flags.DEFINE_string('attention', 'benchmarks/results/attention.json',
                                   'The JSON of benchmarks.attention.')
  _OUT = flags.DEFINE_string('out', 'docs/figures/performance_attention.png', 'The PNG.')
  app.run(main)
