r"""Rebuild the synthetic study's tables and figures from its records.

  python -m experiments.synthetic_report --workdir=workdir/synthetic

(re-)builds ``results.json``, ``results.md`` and ``fig_*.png`` from
``records.jsonl`` (and ``histories.json``) in ``--workdir``
(``experiments.study.tables``), keeping the command, commit, date and machine of
the study that made the records. Means are over seeds with 95% Student-t
intervals; "Δ" columns are paired differences (same data set and initial draw)
between two methods.
"""

import json
import os

from absl import app
from absl import flags

from configs import synthetic as synthetic_config
from experiments.study import record_file
from experiments.study import tables


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  workdir = flags.FLAGS.workdir
  with open(os.path.join(workdir, 'results.json')) as f:
    previous = json.load(f)
  # Fields added to the config after a study was run take their defaults.
  config = synthetic_config.get_config()
  config.update(previous['config'])
  meta = {k: previous[k] for k in ('command', 'commit', 'date', 'machine')}
  # record_commits is recomputed from the records themselves.
  records, _ = record_file.load_done(os.path.join(workdir, record_file.FILENAME))
  print(tables.write_report(config, records, workdir, meta)['markdown_summary'])


if __name__ == '__main__':
  flags.DEFINE_string('workdir', None, 'Directory holding records.jsonl and results.json.')
  flags.mark_flags_as_required(['workdir'])
  app.run(main)
