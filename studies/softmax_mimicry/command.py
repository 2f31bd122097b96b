r"""Softmax mimicry: how close each feature map gets to trained softmax attention, and what
converting a trained softmax encoder to it keeps.

  python -m studies.softmax_mimicry --runs=workdir/softmax --workdir=workdir/softmax_mimicry \
      --out=results/softmax_mimicry.json --page=docs/softmax_mimicry.md

``--runs`` holds finished softmax encoders ``<runs>/<dataset>/softmax/seed<k>`` (trained
by ``python -m experiments.grid --variants=softmax``; docs/softmax_mimicry.md has the
command). For every dataset and seed it runs the parts of ``studies/softmax_mimicry/study.py``
(the pilot once, then fidelity and conversion per encoder), each kept in ``--workdir``
and skipped when done, so the same command resumes. Then it writes ``--out`` (the binding
schema of issue 24: ``fidelity`` and ``conversion``, plus ``headline``, ``settings``,
``pilot`` and provenance) from every part file there, and, with ``--page``, redraws the
page's figures and tables between its markers (``studies/softmax_mimicry/page.py``).
``--collect_only``: only that last step. Every argument is checked before any compute.

Per-run files (``experiments.analysis.run_files``, issue 39 item 6): one
``<runs_out>/<part>-<dataset>-seed<k>.json`` per part file of ``--workdir``
(``collect.run_records``), ``--runs_out`` defaulting to
``<folder of --out>/runs/softmax_mimicry``; files of other runs are kept. Where the workdir
is gone, ``--runs_from_results`` writes them from ``--out`` alone (what it keeps per seed;
nothing else is written or run):

  python -m studies.softmax_mimicry --runs_from_results

``--page_from_results`` redraws only the page's two figures in ``--figures`` and its block
of ``--page`` from ``--out`` (nothing is run, no workdir or encoder read, nothing else
written), so the committed page regenerates from the committed file alone:

  python -m studies.softmax_mimicry --page_from_results --page=docs/softmax_mimicry.md
"""

import os

from absl import flags
from ml_collections import config_flags

from experiments.analysis import loading
from experiments.analysis import run_files
from experiments.common import cli
from experiments.common import outputs
from studies.softmax_mimicry import collect
from studies.softmax_mimicry import encoders
from studies.softmax_mimicry import page as page_lib
from studies.softmax_mimicry import study

FLAGS = flags.FLAGS
MODULE = 'studies.softmax_mimicry'
DATASETS = ('rotten_tomatoes', 'sst2')
PARTS = ('fidelity', 'conversion')
# Refused with --page_from_results: the flags that choose encoders, parts or per-run files.
RUN_FLAGS = ('runs', 'datasets', 'seeds', 'parts', 'workdir', 'collect_only', 'runs_out',
             'runs_from_results')


def check_config(config) -> None:
  """The study's config, before any compute: one ``cli.ConfigError`` naming the field."""
  ns = tuple(config.num_features)
  if not ns or any(not isinstance(n, int) or n < 2 or n % 2 for n in ns):
    raise cli.ConfigError(f'config.num_features: even integers >= 2 (hedgehog uses N/2 rows), '
                          f'got {ns}.')
  bad = [n for n in config.conversion_features if n not in ns]
  if bad:
    raise cli.ConfigError(f'config.conversion_features: {bad} not in config.num_features {ns}.')
  for name in ('fit_rows', 'heldout_rows', 'batch_size', 'pad_multiple'):
    if not isinstance(config.data[name], int) or config.data[name] < 1:
      raise cli.ConfigError(f'config.data.{name}: an integer >= 1, got {config.data[name]!r}.')
  if not isinstance(config.fit.steps, int) or config.fit.steps < 1:
    raise cli.ConfigError(f'config.fit.steps: an integer >= 1, got {config.fit.steps!r}.')
  for name in ('radius', 'clip_norm', 'step_size', 'beta', 'flow_step_size',
               'labels_step_size', 'hedgehog_learning_rate'):
    value = config.fit[name]
    if not isinstance(value, (int, float)) or not value > 0:
      raise cli.ConfigError(f'config.fit.{name}: a number > 0, got {value!r}.')
  if config.pilot.dataset not in DATASETS:
    raise cli.ConfigError(f'config.pilot.dataset: one of {DATASETS}, got '
                          f'{config.pilot.dataset!r}.')
  c = config.conversion
  if not c.learning_rate > 0 or c.batch_size < 1 or c.finetune_rows < c.batch_size:
    raise cli.ConfigError(f'config.conversion: learning_rate > 0, batch_size >= 1 and '
                          f'finetune_rows >= batch_size, got {c.learning_rate}, '
                          f'{c.batch_size}, {c.finetune_rows}.')


def _parse(argv):
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  datasets = FLAGS.datasets
  bad = [d for d in datasets if d not in DATASETS]
  if bad or not datasets:
    raise cli.ConfigError(f'--datasets: names from {DATASETS}, got {datasets}.')
  try:
    seeds = [int(s) for s in FLAGS.seeds]
  except ValueError:
    raise cli.ConfigError(f'--seeds: integers, got {FLAGS.seeds}.') from None
  if not seeds or min(seeds) < 0:
    raise cli.ConfigError(f'--seeds: integers >= 0, got {FLAGS.seeds}.')
  parts = FLAGS.parts
  if any(p not in PARTS for p in parts):
    raise cli.ConfigError(f'--parts: names from {PARTS}, got {parts}.')
  return datasets, seeds, parts


def check_outputs() -> None:
  """Every path the command writes, before any compute (issue 39 item 1): ``--workdir``,
  ``--out``, and with ``--page`` the page and its two figures in ``--figures``. One
  ``cli.ConfigError`` naming the flag."""
  outputs.check_folder('--workdir', FLAGS.workdir)
  outputs.check_file('--out', FLAGS.out, folder_must_exist=False)
  if FLAGS.page:
    check_page_outputs()


def check_page_outputs() -> None:
  """``--page`` and its two figures in ``--figures`` can be written: one ``cli.ConfigError``
  naming the flag otherwise (also ``--page_from_results``' check)."""
  outputs.check_file('--page', FLAGS.page)
  outputs.check_folder('--figures', FLAGS.figures)
  for name in (page_lib.FIDELITY_FIGURE, page_lib.CONVERSION_FIGURE):
    outputs.check_file('--figures', os.path.join(FLAGS.figures, name),
                       folder_must_exist=False)


def _write_records(records: list, runs_out: str) -> None:
  run_files.write_study_command_records(records, runs_out)


def runs_from_results(runs_out: str) -> None:
  """``--runs_from_results``: the per-run files of every part ``--out`` lists, nothing else."""
  if FLAGS.page:
    raise cli.ConfigError('--runs_from_results writes only the per-run files; drop --page.')
  if not os.path.isfile(FLAGS.out):
    raise cli.ConfigError(f'--out: {FLAGS.out!r} is not a file (--runs_from_results reads it).')
  table = loading.read_json(FLAGS.out)
  if not isinstance(table, dict) or not table.get('parts'):
    raise cli.ConfigError(f'--out: {FLAGS.out} lists no parts to write per-run files from.')
  try:
    records = collect.summary_run_records(table, FLAGS.out, run_files.written_by(MODULE))
    run_files.check_records(records, runs_out)
  except (KeyError, IndexError, TypeError, ValueError) as e:
    raise cli.ConfigError(f'--out: {FLAGS.out}: its parts cannot give per-run files '
                          f'({e!r}).') from None
  _write_records(records, runs_out)


def _check_page_table(table) -> None:
  """``--out``'s table can give every line of the page block (``page_lib``'s own
  functions): one ``cli.ConfigError`` naming ``--out`` otherwise, before any write."""
  if not isinstance(table, dict) or not table.get('fidelity'):
    raise cli.ConfigError(f'--out: {FLAGS.out} holds no fidelity results to write the page '
                          'from.')
  try:
    page_lib.fidelity_lines(table)
    if table['conversion']:
      page_lib.conversion_lines(table)
    page_lib.provenance_lines(table)
  except (KeyError, IndexError, TypeError, ValueError) as e:
    raise cli.ConfigError(f'--out: {FLAGS.out}: its results cannot give the page block '
                          f'({e!r}).') from None


def page_from_results() -> None:
  """``--page_from_results``: reads ``--out`` alone; redraws the two figures in
  ``--figures`` and rewrites ``--page``'s block (``page_lib.write_page``), each file
  replaced atomically; writes nothing else. Every refusal comes before the first write."""
  cli.refuse_beside_page_from_results('--out', RUN_FLAGS)
  if not FLAGS.page:
    raise cli.ConfigError('--page_from_results needs --page (the page whose block it '
                          'rewrites).')
  if not os.path.isfile(FLAGS.out):
    raise cli.ConfigError(f'--out: {FLAGS.out!r} is not a file (--page_from_results reads '
                          'it).')
  check_page_outputs()
  table = loading.read_json(FLAGS.out)
  _check_page_table(table)
  page_lib.write_page(table, FLAGS.page, FLAGS.figures)


def main(argv):
  if FLAGS.page_from_results:
    if len(argv) > 1:
      raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
    page_from_results()
    return
  runs_out = FLAGS.runs_out or run_files.default_study_runs_out(collect.STUDY, FLAGS.out)
  run_files.check_runs_out(runs_out)
  if FLAGS.runs_from_results:
    if len(argv) > 1:
      raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
    runs_from_results(runs_out)
    return
  datasets, seeds, parts = _parse(argv)
  config = FLAGS.config
  check_config(config)
  check_outputs()
  if not FLAGS.collect_only:
    runs = {(d, s): encoders.run_dir(FLAGS.runs, d, s) for d in datasets for s in seeds}
    pilot_run = encoders.run_dir(FLAGS.runs, config.pilot.dataset, config.pilot.seed)
    for path in list(runs.values()) + [pilot_run]:   # every encoder is there before compute
      encoders.check_run(path)
    log = lambda line: print(line, flush=True)
    os.makedirs(FLAGS.workdir, exist_ok=True)
    pilot = study.run_pilot(config, encoders.load_encoder(pilot_run),
                            os.path.join(FLAGS.workdir, 'pilot.json'), log)
    for part in parts:                    # every encoder's fidelity first: the headline
      for (dataset, seed), path in runs.items():
        out_dir = study.part_dir(FLAGS.workdir, dataset, seed)
        if os.path.exists(os.path.join(out_dir, f'{part}.json')):
          continue
        encoder = encoders.load_encoder(path)
        if part == 'fidelity':
          study.run_fidelity(config, pilot, encoder, seed, out_dir, log)
        else:
          study.run_conversion(config, encoder, seed, out_dir, log)
  records = collect.run_records(FLAGS.workdir, run_files.written_by(MODULE))
  try:
    run_files.check_records(records, runs_out)
  except ValueError as e:
    raise cli.ConfigError(f'--runs_out: {e}') from None
  table = collect.write_results(config, FLAGS.workdir, FLAGS.out)
  if FLAGS.page:
    page_lib.write_page(table, FLAGS.page, FLAGS.figures)
  _write_records(records, runs_out)


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.softmax_mimicry``."""
  config_flags.DEFINE_config_file('config', 'studies/softmax_mimicry/config.py', 'The study config.',
                                  lock_config=False)
  flags.DEFINE_string('runs', 'workdir/softmax', 'Root of the trained softmax encoders.')
  flags.DEFINE_list('datasets', list(DATASETS), f'Datasets, from {DATASETS}.')
  flags.DEFINE_list('seeds', ['0', '1', '2'], 'Encoder seeds.')
  flags.DEFINE_list('parts', list(PARTS), f'Parts to run, from {PARTS}.')
  flags.DEFINE_string('workdir', 'workdir/softmax_mimicry', 'Where each part is kept.')
  flags.DEFINE_string('out', 'results/softmax_mimicry.json', 'The results file.')
  flags.DEFINE_string('page', '', 'Also redraw this page (docs/softmax_mimicry.md).')
  flags.DEFINE_string('figures', 'docs/figures', 'Folder of the page\'s figures.')
  flags.DEFINE_bool('collect_only', False, 'Only write --out (and --page) from --workdir.')
  flags.DEFINE_string('runs_out', '', 'Folder of the per-run files <part>-<dataset>-seed<k>.json '
                      f'(empty: <folder of --out>/runs/{collect.STUDY}).')
  flags.DEFINE_bool('runs_from_results', False, 'Only write the per-run files, from --out (for '
                    'a workdir that is gone); nothing else is written or run.')
  flags.DEFINE_bool('page_from_results', False, 'Only redraw --page\'s block and its two '
                    'figures in --figures from --out (for a workdir that is gone); nothing '
                    'else is read, written or run.')
  cli.run(main)
