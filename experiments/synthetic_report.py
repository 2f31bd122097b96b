r"""Rebuild the synthetic study's tables and figures from its records.

  python -m experiments.synthetic_report --workdir=workdir/synthetic

(re-)builds ``results.json``, ``results.md`` and ``fig_*.png`` from
``records.jsonl`` (and ``histories.json``) in ``--workdir``
(``experiments.study.tables``), keeping the command, commit, date and machine of
the study that made the records. Means are over seeds with 95% Student-t
intervals; "Δ" columns are paired differences (same data set and initial draw)
between two methods. A missing or damaged input, or an output path that is a folder,
ends in one line before anything is written (``read_study``).
"""

import os

from absl import app
from absl import flags

from configs import synthetic as synthetic_config
from experiments.analysis import loading
from experiments.common import cli
from experiments.common import outputs
from experiments.study import record_file
from experiments.study import tables

META = ('command', 'commit', 'date', 'machine')


def read_study(workdir: str):
  """``(config, meta, records)`` of the study in ``workdir``, checked before anything is
  written: the folder, its ``results.json`` (an object with ``config`` and ``META``), its
  finished cells in ``records.jsonl``, and that no file the report writes
  (``tables.OUTPUTS``) is a folder. One ``cli.ConfigError`` naming the flag or file."""
  outputs.check_folder('--workdir', workdir, must_exist=True)
  path = os.path.join(workdir, 'results.json')
  if not os.path.isfile(path):
    raise cli.ConfigError(f'--workdir: {workdir!r} holds no results.json (python -m '
                          'experiments.synthetic writes it with the records); nothing to '
                          'rebuild from.')
  previous = loading.read_json(path)
  missing = [k for k in ('config',) + META if not isinstance(previous, dict) or k not in previous]
  if missing:
    raise cli.ConfigError(f'{path}: not the results.json of experiments.synthetic (it lacks '
                          f'{missing}).')
  # Fields added to the config after a study was run take their defaults.
  config = synthetic_config.get_config()
  try:
    config.update(previous['config'])
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    raise cli.ConfigError(f'{path}: its config does not fit configs/synthetic.py '
                          f'({cli.one_line(e)}).') from None
  # record_commits is recomputed from the records themselves.
  records, _ = record_file.load_done(os.path.join(workdir, record_file.FILENAME))
  if not records:
    raise cli.ConfigError(f'--workdir: {os.path.join(workdir, record_file.FILENAME)} holds no '
                          'finished cell (records followed by their cell_done line); nothing '
                          'to rebuild from.')
  outputs.check_files_in('--workdir', workdir, tables.OUTPUTS)
  return config, {k: previous[k] for k in META}, records


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  config, meta, records = read_study(flags.FLAGS.workdir)
  print(tables.write_report(config, records, flags.FLAGS.workdir, meta)['markdown_summary'])


if __name__ == '__main__':
  flags.DEFINE_string('workdir', None, 'Directory holding records.jsonl and results.json.')
  flags.mark_flags_as_required(['workdir'])
  cli.run(main, config_flags=())
