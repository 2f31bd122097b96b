r"""Convert trained softmax MQAR models to linear attention: fit the features, then fine-tune.

  python -m studies.mqar_convert --teachers=workdir/mqar/main \
      --workdir=workdir/mqar/convert --results=results/mqar_conversion.json \
      --page=docs/recall.md

The settings are a config (``--config``, default ``studies/mqar_convert/config.py``: the
methods, fit and fine-tuning steps, the fits' step sizes; ``--config.fit_steps=50``
changes one). Every finished ``softmax-*`` run under ``--teachers`` (``experiments.mqar``)
is converted with each of ``config.methods`` (``studies/mqar_convert/convert.py``: the
teacher's weights copied in, the features fitted to the teacher's attention or left
random, zero-shot accuracy, then ``config.finetune_steps`` with the features frozen) into
``<workdir>/<method>-<teacher run>/``; finished conversions are skipped, so a killed
command resumes. ``--results`` is rewritten from every finished conversion under
``--workdir`` (never from fewer rows than it holds), ``--page`` gets the table between
its ``mqar_conversion`` markers.

Per-run files (``experiments.analysis.run_files``, issue 39 item 6): one
``<runs_out>/<method>-<teacher run>.json`` per conversion (its row: settings, teacher,
every accuracy and loss, commit, machine), ``--runs_out`` defaulting to
``<folder of --results>/runs/mqar_conversion``; files of other runs are kept. A
conversion folder holds its result.json only, so no config digest. Where the conversion
folders are gone, ``--runs_from_results`` writes the files from the rows of ``--results``
alone (nothing else is written, no conversion is run):

  python -m studies.mqar_convert --runs_from_results

``--page_from_results`` rewrites only ``--page``'s block from the rows of ``--results``
(nothing run, no folder read, nothing else written): the committed page regenerates from the
committed file alone:

  python -m studies.mqar_convert --page_from_results --page=docs/recall.md
"""

import glob
import os

from absl import flags
from ml_collections import config_flags

from experiments.analysis import loading
from experiments.analysis import run_files
from experiments.common import cli
from experiments.common import page_block
from experiments.common import provenance
from experiments.recall import grid as grid_lib
from experiments.recall import run as run_lib
from studies.mqar_convert import convert

FLAGS = flags.FLAGS
STUDY = 'mqar_conversion'
MODULE = 'studies.mqar_convert'
NO_DIGEST = 'none: a conversion folder holds its result.json only (no config.json)'
BEGIN = '<!-- mqar_conversion:begin (written by python -m studies.mqar_convert) -->'
END = '<!-- mqar_conversion:end -->'


def teachers(root: str):
  """The finished softmax runs under ``root``, shortest sequences first."""
  if not os.path.isdir(root):
    raise cli.ConfigError(f'--teachers: {root!r} is not a folder.')
  found = []
  for path in sorted(glob.glob(os.path.join(root, 'softmax-*', run_lib.RESULT_FILE))):
    row = loading.read_json(path)
    found.append((row['seq_len'], os.path.dirname(path)))
  if not found:
    raise cli.ConfigError(f'--teachers: no finished softmax-* run under {root!r}.')
  return [d for _, d in sorted(found)]


def collect(root: str, results: str) -> list:
  """Every finished conversion under ``root``; refuses to replace ``results`` by fewer."""
  rows = []
  for path in sorted(glob.glob(os.path.join(root, '*', convert.RESULT_FILE))):
    rows.append(loading.read_json(path))
  rows = grid_lib.sort_rows(rows)
  if os.path.exists(results):
    old = loading.read_json(results).get('runs', [])
    if len(old) > len(rows):
      raise cli.ConfigError(f'--results: {results} holds {len(old)} conversions, '
                            f'{root} only {len(rows)}; refusing to replace them by fewer.')
  return rows


def table(rows: list) -> list:
  lines = ['| L | pairs | width | method | N | seed | teacher | zero-shot | fine-tuned | '
           'fit steps | fine-tune steps |', '|---|---|---|---|---|---|---|---|---|---|---|']
  for r in rows:
    lines.append(f'| {r["seq_len"]} | {r["num_pairs"]} | {r["width"]} | {r["method"]} | '
                 f'{r["num_features"]} | {r["seed"]} | {r["teacher_accuracy"]:.4f} | '
                 f'{r["zero_shot_accuracy"]:.4f} | {r["finetuned_accuracy"]:.4f} | '
                 f'{r["fit_steps"]} | {r["finetune_steps"]} |')
  commits = sorted({r.get('commit', 'unknown') for r in rows})
  commands = sorted({r.get('command', '') for r in rows})
  return lines + ['', f'Commits of the runs: {", ".join(commits)}.',
                  'Commands: ' + '; '.join(f'`{c}`' for c in commands) + '.']


def run_id(row: dict) -> str:
  """A conversion's per-run file name, its folder's: ``<method>-<teacher run folder>``."""
  return f'{row["method"]}-{os.path.basename(os.path.normpath(row["teacher"]))}'


def records(rows: list, root: str) -> list:
  """``run_files.study_record`` of every conversion row read from the folders under ``root``."""
  source = f'run folders under {provenance.relative_path(root)}'
  return [run_files.study_record(STUDY, run_id(r), r, source, run_files.written_by(MODULE),
                                 None, NO_DIGEST, machine_from='the row') for r in rows]


def write_records(records: list, runs_out: str) -> None:
  run_files.write_study_command_records(records, runs_out)


def _results_rows(mode: str, what: str) -> list:
  """The rows of ``--results`` that ``mode`` writes ``what`` from: one ``cli.ConfigError``
  naming ``--results`` when it is not a file or holds no runs."""
  if not os.path.isfile(FLAGS.results):
    raise cli.ConfigError(f'--results: {FLAGS.results!r} is not a file ({mode} reads its rows).')
  held = loading.read_json(FLAGS.results)
  rows = held.get('runs') if isinstance(held, dict) else None
  if not rows or not isinstance(rows, list):
    raise cli.ConfigError(f'--results: {FLAGS.results} holds no runs to write {what} from.')
  return rows


def runs_from_results(runs_out: str) -> None:
  """``--runs_from_results``: the per-run files of every row of ``--results``, nothing else."""
  if FLAGS.page:
    raise cli.ConfigError('--runs_from_results writes only the per-run files; drop --page.')
  rows = _results_rows('--runs_from_results', 'per-run files')
  try:
    recs = run_files.summary_records(STUDY, FLAGS.results, rows, run_id,
                                     run_files.written_by(MODULE))
    run_files.check_records(recs, runs_out)
  except (KeyError, TypeError, ValueError) as e:
    raise cli.ConfigError(f'--results: {FLAGS.results}: a row cannot name a per-run file '
                          f'({e!r}).') from None
  write_records(recs, runs_out)


def page_from_results() -> None:
  """``--page_from_results``: ``--page``'s block from the rows of ``--results``, nothing else."""
  cli.refuse_beside_page_from_results('--results', ('runs_from_results', 'collect_only',
                                                   'workdir', 'runs_out'))
  if not FLAGS.page:
    raise cli.ConfigError('--page_from_results needs --page (the page whose block it rewrites).')
  rows = _results_rows('--page_from_results', 'the page')
  try:
    lines = table(rows)
  except (KeyError, TypeError, ValueError) as e:
    raise cli.ConfigError(f'--results: {FLAGS.results}: a row cannot be written to the page '
                          f'({e!r}).') from None
  page_block.write_block(FLAGS.page, BEGIN, END, lines)


def check_config(config) -> None:
  """The study's settings, before any compute: one ``cli.ConfigError`` naming the field."""
  methods = list(config.methods)
  bad = [m for m in methods if m not in convert.CONVERT_METHODS]
  if bad or not methods:
    raise cli.ConfigError(f'config.methods: names from {convert.CONVERT_METHODS}, got '
                          f'{methods}.')
  for name, low in (('fit_steps', 0), ('finetune_steps', 0)):
    value = config[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
      raise cli.ConfigError(f'config.{name}: an integer >= {low}, got {value!r}.')
  for name in ('hedgehog_learning_rate', 'particle_step_size'):
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float('inf'):
      raise cli.ConfigError(f'config.{name}: a finite number > 0, got {value!r}.')


def main(argv):
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  if FLAGS.page_from_results:
    page_from_results()
    return
  runs_out = FLAGS.runs_out or run_files.default_study_runs_out(STUDY, FLAGS.results)
  run_files.check_runs_out(runs_out)
  if FLAGS.runs_from_results:
    runs_from_results(runs_out)
    return
  if not FLAGS.workdir:
    raise cli.ConfigError('--workdir is required.')
  config = FLAGS.config
  check_config(config)
  found = teachers(FLAGS.teachers)
  metadata = provenance.run_metadata(MODULE)
  if not FLAGS.collect_only:
    for teacher in found:
      for method in config.methods:
        out = os.path.join(FLAGS.workdir, f'{method}-{os.path.basename(teacher)}')
        convert.convert(teacher, method, out, config.fit_steps, config.finetune_steps,
                        config.hedgehog_learning_rate, config.particle_step_size,
                        metadata=metadata)
  rows = collect(FLAGS.workdir, FLAGS.results)
  if not rows:
    raise cli.ConfigError(f'--workdir: no finished conversion under {FLAGS.workdir!r}.')
  try:
    recs = records(rows, FLAGS.workdir)
    run_files.check_records(recs, runs_out)
  except (KeyError, ValueError) as e:
    raise cli.ConfigError(f'--runs_out: {e!r}') from None
  provenance.write_json_atomic(FLAGS.results, {'runs': rows}, indent=1)
  if FLAGS.page:
    page_block.write_block(FLAGS.page, BEGIN, END, table(rows))
  write_records(recs, runs_out)


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.mqar_convert``."""
  flags.DEFINE_string('teachers', 'workdir/mqar/main', 'Folder of finished softmax MQAR runs.')
  flags.DEFINE_string('workdir', None, 'Folder of the conversions (one sub-folder each).')
  config_flags.DEFINE_config_file('config', 'studies/mqar_convert/config.py',
                                  'The study\'s settings (methods, steps, step sizes).',
                                  lock_config=False)
  flags.DEFINE_string('results', 'results/mqar_conversion.json', 'Results file rewritten.')
  flags.DEFINE_string('page', '', 'Page whose mqar_conversion block is rewritten.')
  flags.DEFINE_bool('collect_only', False, 'Only rewrite --results (and --page).')
  flags.DEFINE_string('runs_out', '', 'Folder of the per-run files <run>.json (empty: '
                      f'<folder of --results>/runs/{STUDY}).')
  flags.DEFINE_bool('runs_from_results', False, 'Only write the per-run files, from the rows '
                    'of --results (for conversions whose folders are gone); nothing else is '
                    'written or run.')
  flags.DEFINE_bool('page_from_results', False, 'Only rewrite --page\'s block from the rows '
                    'of --results; nothing else is read, written or run.')
  cli.run(main)
