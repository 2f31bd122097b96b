r"""The synthetic study: learned Coulomb particles against fixed and learned baselines.

  python -m experiments.synthetic --config=configs/synthetic.py --workdir=workdir/synthetic

or, from any folder, ``python path/to/experiments/synthetic.py
--config=path/to/configs/synthetic.py:quick --workdir=...``. A misspelled config
field or variant ends in one line with the suggestion (``experiments.common.cli``).

For every noise level σ and seed it draws train / validation / test sets
(``coulomb_jax.tasks.synthetic``) and evaluates:

* ``logreg``: L2 logistic regression on raw x;
* ``rbf_svm``: an SVM with the RBF kernel, γ = 0.5;
* ``mkl``: an SVM on Σ_j μ_j K_j, Gaussian kernels K_j at several bandwidths with
  μ_j ∝ max(0, centered alignment of K_j with yyᵀ) on the training set (the
  "align" heuristic of Cortes, Mohri & Rostamizadeh 2012);
* per feature budget N, three feature maps, each followed by the *same* linear
  classifier (scikit-learn L2 logistic regression) on 2N features:
  ``rff`` (fixed ω ~ N(0, σ_k⁻² I), features [cos, sin] of N frequencies, σ_k
  chosen on validation), ``importance`` (Sinha & Duchi 2016 from the same σ_k:
  2N cosine features drawn from N_w = factor·N candidates) and ``coulomb`` (the
  N particles moved by projected Langevin from the same initial draw as ``rff``,
  features [cos, sin], for every λ of the ablation).

Every C, bandwidth and (for the "λ*" row of the report) λ is chosen on the
validation split; the test split is only scored.

The methods are ``experiments.study.methods``. Records are appended to
``records.jsonl`` (``experiments.study.record_file``) as each (σ, seed) cell
finishes, so a killed run resumes where it stopped; at the end ``results.json``,
``results.md`` and the figures are written by ``experiments.study.tables``
(``python -m experiments.synthetic_report`` rebuilds them from the records).
Progress lines (``experiments.common.progress``) name the cell and method, with
elapsed time, rate and ETA; "compiling …" precedes each first call of a jitted
function. The first line names the variant that ran (``describe_variant``): the
``quick`` variant (``make run``) is a smoke run whose numbers are not results, said
again when it ends. Every ± the tables print is defined under its table (a 95%
Student-t interval over the n seeds, ``experiments.study.tables.interval_note``).

Given ``--results``, the study also writes there the part of ``results.json`` that
docs/synthetic.md is rendered from (``page_results``: provenance, config, each record's
``PAGE_FIELDS`` and the Langevin history of the energy figure; the committed
``results/synthetic.json``):

  python -m experiments.synthetic --config=configs/synthetic.py --workdir=workdir/synthetic \
      --results=results/synthetic.json

``--page_from_results`` reads ``--results`` alone (default ``results/synthetic.json``) and
rewrites only the ``synthetic`` block of ``--page`` (the run's command, commit, date and
machine, then the tables of its ``results.md``) and the four figures in ``--figures``;
nothing is run and nothing else is written, so the committed page regenerates from the
committed file byte for byte:

  python -m experiments.synthetic --page_from_results

With ``--config``, ``--workdir`` or ``--list_fields`` it is one line (``cli.ConfigError``)
before any write.
"""

import json
import os

from absl import app
from absl import flags
import ml_collections
from ml_collections import config_flags

from coulomb_jax import checks
from coulomb_jax import repulsion
from coulomb_jax.tasks import synthetic
from experiments.analysis import loading
from experiments.common import cli
from experiments.common import outputs
from experiments.common import page_block
from experiments.common import progress as progress_lib
from experiments.common import provenance
from experiments.study import methods
from experiments.study import record_file
from experiments.study import tables


FLAGS = flags.FLAGS
RESULTS = 'results/synthetic.json'
BEGIN = '<!-- synthetic:begin (written by python -m experiments.synthetic --page_from_results) -->'
END = '<!-- synthetic:end -->'
# The fields of a record that the page's tables and figures read (``experiments.study.tables``).
PAGE_FIELDS = ('method', 'noise_index', 'seed', 'budget', 'lam', 'val_accuracy',
               'test_accuracy', 'test_f1', 'seconds')
META = ('command', 'commit', 'date', 'machine', 'record_commits')
# Refused with --page_from_results: the flags of a run.
RUN_FLAGS = ('config', 'workdir', 'list_fields')


def check_config(config):
  """One clear error per bad field, before anything is computed or written."""
  unknown = set(config.methods) - set(methods.METHODS)
  if unknown:
    raise ValueError(f'config.methods: unknown {sorted(unknown)}; known: '
                     f'{list(methods.METHODS)}.')
  d, lcfg, hcfg = config.data, config.langevin, config.hamiltonian
  checks.check_int('config.data.dim', d.dim, synthetic.MIN_DIM)
  checks.check_int('config.num_seeds', config.num_seeds, 1)
  for name in ('num_train', 'num_val', 'num_test'):
    checks.check_int(f'config.data.{name}', d[name], 2)
  for noise in d.noise_levels:
    checks.check_nonnegative('config.data.noise_levels entry', noise)
  checks.check_int('config.report.noise_index', config.report.noise_index, 0,
                    len(d.noise_levels) - 1)
  for n in config.features.budgets:
    checks.check_int('config.features.budgets entry', n, 1)
  if config.report.ablation_budget not in config.features.budgets:
    raise ValueError(f'config.report.ablation_budget must be one of config.features.budgets '
                     f'{list(config.features.budgets)}, got {config.report.ablation_budget}.')
  for name, values in (('config.features.bandwidths', config.features.bandwidths),
                       ('config.classifier.c_grid', config.classifier.c_grid),
                       ('config.rbf_svm.c_grid', config.rbf_svm.c_grid),
                       ('config.mkl.c_grid', config.mkl.c_grid),
                       ('config.mkl.bandwidths', config.mkl.bandwidths)):
    if not values:
      raise ValueError(f'{name} must not be empty, got {values!r}.')
    for v in values:
      checks.check_positive(f'{name} entry', v)
  checks.check_positive('config.rbf_svm.gamma', config.rbf_svm.gamma)
  checks.check_int('config.importance.candidates_factor', config.importance.candidates_factor, 1)
  checks.check_nonnegative('config.importance.rho_factor', config.importance.rho_factor)
  repulsion.resolve_exponent(hcfg.s, d.dim)
  checks.check_nonnegative('config.hamiltonian.softening', hcfg.softening)
  for name in ('step_size', 'beta', 'radius_scale'):
    checks.check_positive(f'config.langevin.{name}', lcfg[name])
  if lcfg.clip_norm is not None:
    checks.check_positive('config.langevin.clip_norm', lcfg.clip_norm)
  checks.check_int('config.langevin.batch_size', lcfg.batch_size, 2, d.num_train)
  checks.check_int('config.langevin.num_epochs', lcfg.num_epochs, 1)
  checks.check_nonnegative('config.langevin.tol', lcfg.tol)


def describe_variant(config, variant=None) -> str:
  """The study's first line: which variant of configs/synthetic.py runs (``variant``: the
  name after ``:`` in --config, '' for none, None when not known) and its size; for a
  smoke-sized config (``report.smoke_run``), that its numbers are not results."""
  name = {None: 'this config', '': 'the default variant'}.get(variant, f"variant '{variant}'")
  d, many = config.data, lambda n, what: f"{n} {what}{'s' * (n != 1)}"
  size = (f'{many(config.num_seeds, "seed")}, {many(len(d.noise_levels), "noise level")}, '
          f'N ∈ {list(config.features.budgets)}, '
          f'λ ∈ {list(config.hamiltonian.lams)}, {config.langevin.num_epochs} Langevin epochs, '
          f'{d.num_test} test points')
  if config.report.smoke_run:
    return (f'{name}: a smoke run ({size}) that checks the pipeline end to end; its numbers '
            'are not results (the study is --config=configs/synthetic.py, no variant).')
  return f'{name}: the study ({size}).'


def config_variant(holder) -> str:
  """The variant of a ``config_flags`` flag: ``configs/synthetic.py:quick`` → ``'quick'``,
  ``configs/synthetic.py`` → ``''``."""
  from experiments.run import train_flags  # pylint: disable=g-import-not-at-top
  name = config_flags.get_config_filename(holder)
  path = train_flags.config_file(holder)
  return name[len(path) + 1:] if name != path else ''


def _fingerprint(config):
  """The config fields that define the records (not the report's choices)."""
  fields = config.to_dict()
  fields.pop('report', None)
  return fields


def page_results(results, histories):
  """The part of ``results`` (``tables.write_report``'s dict) that the page is rendered
  from, for ``--results``: its ``META`` and config, each record's ``PAGE_FIELDS`` (the rest
  of a record, the chosen C and bandwidth, steps, final energies, commit, stays in the
  workdir's ``results.json``) and, of ``histories``, the run the energy figure draws with
  its λ = 0 twin."""
  config = ml_collections.ConfigDict(results['config'])
  kept = {}
  if histories:
    key = tables.energy_key(config, histories)
    twin = f"{key.split(',')[0]},lam=0.0"
    kept = {k: histories[k] for k in (key, twin) if k in histories}
  return {**{k: results[k] for k in META}, 'config': results['config'],
          'contents': 'the part of the results.json of experiments.synthetic that '
                      'docs/synthetic.md is rendered from (python -m experiments.synthetic '
                      '--page_from_results): records keep only the fields the tables and '
                      f'figures read {list(PAGE_FIELDS)}; histories only the run the energy '
                      'figure draws and its λ = 0 twin.',
          'records': [{k: r[k] for k in PAGE_FIELDS if k in r} for r in results['records']],
          'histories': kept}


def results_text(committed) -> str:
  """``committed`` as JSON text: a top-level field per line, a record per line."""
  parts = []
  for k, v in committed.items():
    if k == 'records':
      rows = ',\n'.join('  ' + json.dumps(r) for r in v)
      parts.append(f' {json.dumps(k)}: [\n{rows}\n ]')
    else:
      parts.append(f' {json.dumps(k)}: {json.dumps(v)}')
  return '{\n' + ',\n'.join(parts) + '\n}\n'


def page_config(committed):
  """The study's config from ``committed['config']`` (fields added to configs/synthetic.py
  after the run take their defaults, as ``experiments.synthetic_report`` does)."""
  from configs import synthetic as synthetic_config  # pylint: disable=g-import-not-at-top
  config = synthetic_config.get_config()
  config.update(committed['config'])
  return config


def page_lines(committed, config) -> list:
  """The lines of the page's ``synthetic`` block: the header of the run's ``results.md``
  (its command, commit, date and machine) and its tables (``tables.tables``)."""
  banner = tables.smoke_label(config)
  md = tables.tables(config, tables.with_selected_lambda(committed['records']))
  return (([f'**{banner}**', ''] if banner else [])
          + [f"Command: `{committed['command']}`  ",
             f"Commit: {committed['commit']} (records from: "
             f"{', '.join(committed['record_commits'])})  ",
             f"Date: {committed['date']}  ",
             f"Machine: {json.dumps(committed['machine'])}"] + md.split('\n'))


def write_page(committed, config, page: str, figures_dir: str) -> None:
  """The four figures of ``committed`` in ``figures_dir`` (``tables.figures``, its energy
  figure from ``committed['histories']``) and the ``synthetic`` block of ``page``
  (``page_lines``), each replaced atomically."""
  lines = page_lines(committed, config)
  tables.figures(config, tables.with_selected_lambda(committed['records']), figures_dir,
                 hist=committed['histories'])
  page_block.write_block(page, BEGIN, END, lines)


def run_study(config, workdir, variant=None, results_path=None):
  """Runs (or resumes) the study; returns the results dict written to results.json.

  A bad config value, a workdir that is a file (or under one), a file the study writes
  there (``tables.OUTPUTS``, records, config, histories) that is a folder, or a workdir
  holding records of another config, raises ``cli.ConfigError`` before anything is
  computed or written. ``variant``: the name of the config's variant, for the first line
  (``describe_variant``). ``results_path``: also write ``page_results`` there (JSON,
  ``results_text``).
  """
  try:
    check_config(config)
  except ValueError as e:
    raise cli.ConfigError(str(e)) from None
  loading.check_folder('--workdir', workdir)
  outputs.check_files_in('--workdir', workdir, ('config.json', 'histories.json',
                                                record_file.FILENAME) + tables.OUTPUTS)
  meta = tables.run_metadata()
  config_path = os.path.join(workdir, 'config.json')
  if os.path.exists(config_path):
    if loading.read_json(config_path) != json.loads(json.dumps(_fingerprint(config))):
      raise cli.ConfigError(f'workdir {workdir!r} holds records of a different config '
                            f'(see {config_path}); use a new --workdir.')
  os.makedirs(workdir, exist_ok=True)
  if not os.path.exists(config_path):
    provenance.write_json_atomic(config_path, _fingerprint(config), indent=1)
  path = os.path.join(workdir, record_file.FILENAME)
  records, done = record_file.load_done(path)
  record_file.rewrite_complete(path, records, done)

  noise_levels = config.data.noise_levels
  cells = [(i, s) for i in range(len(noise_levels)) for s in range(config.num_seeds)]
  runs = methods.cell_runs(config)
  # One line per run at most every 2 s; the compilations and cell summaries always print.
  progress = progress_lib.Progress('synthetic', total=len(cells) * len(runs), unit='run',
                                   done=len(done) * len(runs), every=2.0)
  progress.say(describe_variant(config, variant))
  progress.say(f'{len(noise_levels)} noise levels × {config.num_seeds} seeds, {len(runs)} runs '
               f'each ({", ".join(config.methods)}): {progress.total} runs; workdir {workdir}, '
               f'config saved to {config_path}')
  if done:
    progress.say(f'resuming: {len(done)} cells already done')
  trace_cell = (config.report.noise_index, 0)
  warm, first = set(), True
  for noise_index, seed in cells:
    if (noise_index, seed) in done:
      continue
    where = (f'noise {noise_index + 1}/{len(noise_levels)} (σ={noise_levels[noise_index]:.3g}) '
             f'seed {seed + 1}/{config.num_seeds}')
    if first:
      progress.say(f'{where}: drawing the data (the first draw compiles the generator) and '
                   f'fitting {runs[0]} …')
      first = False
    cell_records, cell_hist = methods.run_cell(
        config, seed, noise_index, warm,
        on_run=lambda label: progress.update(f'{where} method {label}'),
        say=lambda text: progress.say(f'{where}: {text}'))
    for r in cell_records:
      r['commit'] = meta['commit']     # a resumed study may hold cells of several commits
    if (noise_index, seed) == trace_cell:
      provenance.write_json_atomic(os.path.join(workdir, 'histories.json'), cell_hist)
    record_file.append_cell(path, cell_records, noise_index, seed)
    records.extend(cell_records)
    progress.say(f'{where} done: {tables.cell_summary(cell_records)}')
  progress.say('writing results.json, the figures and results.md …')
  results = tables.write_report(config, records, workdir, meta)
  if results_path:
    hist_path = os.path.join(workdir, 'histories.json')
    histories = loading.read_json(hist_path) if os.path.exists(hist_path) else {}
    provenance.write_atomic(results_path, results_text(page_results(results, histories)))
    progress.say(f'the part of results.json the page is rendered from: {results_path}')
  banner = tables.smoke_label(config)
  progress.say(f"the tables of {os.path.join(workdir, 'results.md')}"
               + (f' ({banner})' if banner else '') + ':')
  print(results['markdown_summary'])
  progress.say(f'done in {progress_lib.format_duration(progress.elapsed)}; results in {workdir}'
               + (f' — {banner}' if banner else ''))
  return results


def _refuse_run_flags() -> None:
  """One ``cli.ConfigError`` naming the first of ``RUN_FLAGS`` given on the command line
  (``--config`` by its file; a bool given as false aside): ``--page_from_results`` runs
  nothing."""
  if FLAGS['config'].present:
    raise cli.ConfigError(f'--page_from_results writes only the page from --results; drop '
                          f"--config={config_flags.get_config_filename(FLAGS['config'])}.")
  cli.refuse_beside_page_from_results('--results', RUN_FLAGS[1:])


def page_from_results() -> None:
  """``--page_from_results``: reads ``--results`` alone; redraws the four figures in
  ``--figures`` and rewrites ``--page``'s ``synthetic`` block. Every refusal comes before
  the first write."""
  _refuse_run_flags()
  if not os.path.isfile(FLAGS.results):
    raise cli.ConfigError(f'--results: {FLAGS.results!r} is not a file (--page_from_results '
                          'reads it).')
  outputs.check_file('--page', FLAGS.page)
  outputs.check_folder('--figures', FLAGS.figures)
  for name in tables.FIGURES:
    outputs.check_file('--figures', os.path.join(FLAGS.figures, name), folder_must_exist=False)
  committed = loading.read_json(FLAGS.results)
  try:
    config = page_config(committed)
    page_lines(committed, config)
    if committed['histories']:
      tables.energy_key(config, committed['histories'])
  except (AttributeError, KeyError, IndexError, TypeError, ValueError) as e:
    raise cli.ConfigError(f'--results: {FLAGS.results}: not the results file of '
                          f'experiments.synthetic --results ({e!r}); nothing was '
                          'written.') from None
  write_page(committed, config, FLAGS.page, FLAGS.figures)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if FLAGS.page_from_results:
    page_from_results()
    return
  if FLAGS.config is None:
    raise cli.ConfigError('--config: required for a run (configs/synthetic.py; or '
                          '--page_from_results, which reads --results alone).')
  from experiments.run import train_config  # pylint: disable=g-import-not-at-top
  from experiments.run import train_flags  # pylint: disable=g-import-not-at-top
  path = train_flags.config_file(FLAGS['config'])
  comments = train_flags.field_comments(path) if os.path.isfile(path) else {}
  if FLAGS.list_fields:
    print(train_flags.describe_fields(FLAGS.config, comments))
    return
  if not FLAGS.workdir:
    raise cli.ConfigError('--workdir: required (the folder for records, results and '
                          'figures).')
  for name in ('page', 'figures'):
    if FLAGS[name].present:
      raise cli.ConfigError(f'--{name}={FLAGS[name].value}: only with --page_from_results; a '
                            'run would ignore it. Nothing was run or written.')
  results_path = FLAGS.results if FLAGS['results'].present else None
  if results_path:
    outputs.check_file('--results', results_path)
  # The resolved config (defaults, the variant and every override), as a run sees it.
  print('config:\n' + '\n'.join(f'  {k} = {v!r}' for k, v in
                                 train_config.flat(FLAGS.config).items()), flush=True)
  run_study(FLAGS.config, FLAGS.workdir, config_variant(FLAGS['config']), results_path)


if __name__ == '__main__':
  # Flags are defined here, not at import, so other scripts can import this module.
  config_flags.DEFINE_config_file('config', None, 'Study config (configs/synthetic.py, or '
                                  'configs/synthetic.py:quick); override any field with '
                                  '--config.<section>.<field>=value.', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Directory for records, results and figures.')
  flags.DEFINE_bool('list_fields', False, 'Print every field of --config with its value and '
                    'comment, and exit.')
  flags.DEFINE_string('results', RESULTS, 'The committed results file: a run given it also '
                      'writes there the part of results.json the page is rendered from; '
                      '--page_from_results reads it.')
  cli.define_page_flags('synthetic', 'four figures', 'docs/synthetic.md')
  cli.run(main)
