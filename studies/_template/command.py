r"""<One paragraph: what the study measures, how, what it writes.>

  python -m studies._template --config=studies/_template/config.py --workdir=/tmp/template

Writes ``<workdir>/result.json`` (the config, what was measured, the command, commit and
machine). A study imports the library and the tools' parts (``experiments.common``,
``experiments.analysis``, ...), never another study's command.
"""

import os

import jax
from absl import flags
from ml_collections import config_flags

from coulomb_jax import features
from coulomb_jax import repulsion
from experiments.common import cli
from experiments.common import provenance


def run(config, workdir: str) -> dict:
  """The measurement: here, the Riesz energy of N orthogonal draws in 2-D."""
  omega = features.sample_orthogonal(jax.random.key(config.seed), config.num_particles, 2)
  energy = float(repulsion.riesz_energy(omega, s=1.0))
  result = dict(provenance.run_metadata('studies._template'), config=config.to_dict(),
                energy=energy)
  os.makedirs(workdir, exist_ok=True)
  provenance.write_json_atomic(os.path.join(workdir, 'result.json'), result, indent=1)
  return result


def main(argv):
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  result = run(flags.FLAGS.config, flags.FLAGS.workdir)
  print(f'energy {result["energy"]:.4f}')


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies._template``."""
  config_flags.DEFINE_config_file('config', 'studies/_template/config.py', 'Study config.')
  flags.DEFINE_string('workdir', '/tmp/template', 'Folder for result.json.')
  cli.run(main)
