r"""The figure of kernel attention's cost against softmax, from ``benchmarks.attention``'s JSON.

  python -m benchmarks.attention_figure --attention=benchmarks/results/attention.json \
      --out=docs/figures/performance_attention.png

draws time and memory against the sequence length L, one line per implementation
(``experiments.analysis.plots.attention_figure``), and prints the PNG's path.
"""

import json
import sys

from absl import flags

from experiments.analysis import plots
from experiments.common import cli


def main(argv):
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  with open(_ATTENTION.value) as f:
    print(plots.attention_figure(_OUT.value, json.load(f)), file=sys.stdout)


if __name__ == '__main__':
  _ATTENTION = flags.DEFINE_string('attention', 'benchmarks/results/attention.json',
                                   'The JSON of benchmarks.attention.')
  _OUT = flags.DEFINE_string('out', 'docs/figures/performance_attention.png', 'The PNG.')
  cli.run(main, config_flags=())
