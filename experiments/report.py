r"""Tables of the text-classification grid: per-dataset JSON and docs/results.md.

  python -m experiments.report --runs=workdir/grid --out=results --docs=docs/results.md

reads every ``results.json`` under ``--runs`` (``experiments.grid`` lays them
out as ``<dataset>/<variant>/seed<s>/``) and writes

* ``<out>/<dataset>.json``: ``{dataset, split, command, commit, date, machine,
  variants: {variant: {metric: {mean, std, n}}}, paired, paired_ball, paired_ball_vanilla,
  runs, run_commands,
  unfinished, reference}``. Metrics are those of the test split (the
  evaluation split named by ``split``) plus ``train_seconds``,
  ``phase_a_seconds`` and ``phase_b_seconds``; ``std`` is the sample standard
  deviation (ddof = 1) over seeds, ``null`` when n = 1. A variant without a
  finished run is left out. ``paired`` holds Kernel-X − Vanilla-X per feature
  map, per seed both variants have, summarised the same way; ``paired_ball`` the
  same for Kernel-X − Ball-X (the control), ``paired_ball_vanilla`` for
  Ball-X − Vanilla-X (what the projection alone does). ``reference`` is
  the TF-IDF row of ``studies.tfidf_baseline`` (``<out>/tfidf/<dataset>.json``)
  when that file exists.
* ``--docs``: one table per dataset (variants in the order of
  ``configs.text.VARIANTS``, then the reference), the commands, commits,
  machines and dates of the runs, the paired tables and the two figures below.
  The block between ``<!-- analysis -->`` and ``<!-- /analysis -->`` of an
  existing file is kept verbatim; everything else is rewritten.
* ``<figures>/<dataset>_paired.png`` (``--figures``, default ``figures/`` next to
  ``--docs``; for a docs file other than ``results.md`` the names start with its
  stem, e.g. ``results_paper_length_sst2_paired.png``): a forest plot of the
  paired differences Kernel-X − Vanilla-X and Kernel-X − Ball-X per feature map,
  accuracy and ECE, mean with its 95% Student-t interval over seeds
  (mean ± t₀.₉₇₅,ₙ₋₁ · std/√n; a point without interval when n = 1).
* ``<figures>/<dataset>_reliability.png``: reliability diagrams, one panel per
  feature map with Kernel-X, Vanilla-X and Ball-X, plus softmax and the TF-IDF
  row in every panel, from the per-example test predictions: each run's
  ``predictions_test.npz`` (arrays ``labels``, int 0/1, and ``probs``, float
  P(class 1), in the order of the test split; ``save_predictions`` writes it),
  and the reference's ``<tfidf>/<dataset>[_<rule>]_predictions_test.npz``. The
  seeds of a variant are pooled. Drawn only when some run has predictions.

Runs directories with a ``config.json`` but no ``results.json`` are listed as
unfinished and left out of the means; one whose ``results.json`` names another config
than its ``config.json`` is refused (``loading.check_config``). Two results for the same (dataset,
variant, seed), or seeds of one variant trained with different settings, are
refused rather than averaged.

What cannot be right ends in one line naming the file or flag, before anything is
written (``check_paths``, ``check_files``, ``check_inputs``, ``loading``): a folder flag
that names a file, a file it would write (a summary, a figure, a per-run file) that is a folder,
a ``results.json`` without its ``test`` section or one of its metrics, a damaged
``history.jsonl``, a predictions file with a probability that is not finite or not in
[0, 1], a label other than 0/1, a row count other than the test split's
(``loading.TEST_ROWS``) or other test labels than the dataset's other predictions.

  python -m experiments.report --from_summaries --out=results --docs=docs/results.md

redraws the page and its paired figures from the ``<out>/<dataset>.json`` already
there, without the runs (once their folder is gone): the tables and their
provenance stay those of the summaries, a last line names the redraw's command (no
date or commit: the same summaries redraw the same page and figures, byte for byte).
Summaries of several report runs redraw when the latest ran with ``--keep_others``
(the page it wrote names the summaries it kept); a reliability diagram the page showed
is kept, not redrawn (it needs the runs' predictions).
"""

import os
import sys
from typing import Optional

import numpy as np

from experiments.analysis import loading
from experiments.analysis import pages
from experiments.analysis import run_files
from experiments.analysis import tables
from experiments.common import cli
from experiments.common import outputs
from experiments.common import progress as progress_lib
from experiments.common import provenance


def write_report(runs_dir: str, out_dir: str, docs_path: str, *,
                 tfidf_dir: Optional[str] = None, meta: Optional[dict] = None,
                 figures_dir: Optional[str] = None, draw: bool = True,
                 keep_others: bool = False, train_subsets: bool = False,
                 allow_fewer: bool = False, runs_out: Optional[str] = None) -> dict:
  """Writes ``<out_dir>/<dataset>.json``, ``docs_path``, (``draw``) the figures in
  ``figures_dir`` (default ``figures/`` next to ``docs_path``) and (``runs_out``) the
  per-run files of the runs read (``run_files``; none when None); returns
  ``{dataset: summary}``.

  ``keep_others``: a dataset without runs under ``runs_dir`` whose ``<out_dir>/<dataset>.json``
  exists keeps that summary and its figures on the page (a grid run one dataset at a time,
  after the earlier dataset's runs are gone); the page names the command and commit each
  kept summary came from. ``train_subsets``: see ``load_runs``. Results are never replaced
  by fewer (``check_not_fewer``): with no finished run, or with fewer datasets, variants or
  seeds than the summaries in ``out_dir``, nothing is written unless ``allow_fewer``."""
  tfidf_dir = os.path.join(out_dir, 'tfidf') if tfidf_dir is None else tfidf_dir
  docs_dir = os.path.dirname(docs_path)
  figures_dir = os.path.join(docs_dir, 'figures') if figures_dir is None else figures_dir
  loading.check_folder('--runs', runs_dir, must_exist=True)
  check_paths(out_dir, docs_path, figures_dir if draw else None, tfidf_dir, runs_out)
  analysis = pages.read_analysis(docs_path)          # fails before anything is written
  progress = progress_lib.Progress('report', total=0, unit='dataset')
  progress.say(f'reading the runs under {runs_dir} …')
  finished, unfinished = loading.load_runs(runs_dir, train_subsets)
  old, new = loading.summary_run_keys(out_dir), loading.run_keys(finished)
  if keep_others:
    new.update({d: keys for d, keys in old.items() if d not in new})
  loading.check_not_fewer(old, new, f'{out_dir}/<dataset>.json and {docs_path}', allow_fewer)
  records = run_files.run_records(runs_dir, finished) if runs_out else []
  # The datasets with runs; with none at all, those with a reference row.
  datasets = ({r['dataset'] for r in finished + unfinished}
              or {d for d in loading.SPLIT_NAMES if tables.load_reference(tfidf_dir, d)})
  unknown = datasets - set(loading.SPLIT_NAMES)
  if unknown:
    raise cli.ConfigError(f'--runs: datasets {sorted(unknown)} under {runs_dir!r}: expected '
                          f'ones of {sorted(loading.SPLIT_NAMES)}.')
  order = [d for d in loading.SPLIT_NAMES if d in datasets]
  references = {d: os.path.join(tfidf_dir, loading.reference_predictions_file(
      d, tables.dataset_rule(finished, d))) for d in order}
  check_inputs(runs_dir, finished, references if draw else {})
  check_files(docs_path, figures_dir if draw else None, order, records, runs_out)
  meta = meta or provenance.run_metadata('experiments.report')   # after the checks: it starts jax
  progress.total = len(datasets)
  summaries, figures = {}, {}
  for d in order:                 # every table first: a refused one leaves no figure behind
    runs, rule = [r for r in finished if r['dataset'] == d], tables.dataset_rule(finished, d)
    summaries[d] = tables.dataset_summary(d, runs,
                                          [u for u in unfinished if u['dataset'] == d],
                                          tables.load_reference(tfidf_dir, d, rule), meta)
  for d in order:
    runs = [r for r in finished if r['dataset'] == d]
    if draw:
      progress.say(f'{d}: {len(runs)} runs; drawing the paired and reliability figures …')
      drawn = pages.draw_figures(summaries[d], runs, figures_dir,
                                 pages.figure_names(docs_path, d), references[d])
      figures[d] = {k: v and os.path.relpath(v, docs_dir or '.') for k, v in drawn.items()}
    progress.update(f'{d}: {len(runs)} runs, {len(summaries[d]["variants"])} variants')
  fresh = list(summaries)
  kept = []
  for d in loading.SPLIT_NAMES if keep_others else ():
    path = os.path.join(out_dir, f'{d}.json')
    if d not in summaries and os.path.exists(path):
      summaries[d] = loading.read_json(path)
      kept.append(d)
      names = pages.figure_names(docs_path, d)
      figures[d] = {k: (os.path.relpath(os.path.join(figures_dir, v), docs_dir or '.')
                        if os.path.exists(os.path.join(figures_dir, v)) else None)
                    for k, v in names.items()}
  summaries = {d: summaries[d] for d in loading.SPLIT_NAMES if d in summaries}
  os.makedirs(out_dir, exist_ok=True)
  for d in fresh:
    provenance.write_json_atomic(os.path.join(out_dir, f'{d}.json'), summaries[d], indent=1)
  if docs_dir:
    os.makedirs(docs_dir, exist_ok=True)
  if runs_out:
    run_files.write_records(records, runs_out)
  provenance.write_atomic(docs_path, pages.markdown(summaries, analysis, meta,
                                                    figures if draw else None, kept=kept,
                                                    runs_out=runs_out))
  return summaries


def check_paths(out_dir: str, docs_path: str, figures_dir: Optional[str] = None,
                tfidf_dir: Optional[str] = None, runs_out: Optional[str] = None) -> None:
  """One ``cli.ConfigError`` naming the flag when a folder it names is a file (or lies
  under one), or when ``--docs`` or a summary ``<out>/<dataset>.json`` is a folder; None
  skips a check."""
  if os.path.isdir(docs_path):
    raise cli.ConfigError(f'--docs: {docs_path!r} is a folder, not a markdown file.')
  for flag, path in (('--out', out_dir), ('--docs', os.path.dirname(docs_path) or None),
                     ('--figures', figures_dir), ('--tfidf', tfidf_dir),
                     ('--runs_out', runs_out)):
    if path is not None:
      loading.check_folder(flag, path)
  for d in loading.SPLIT_NAMES:                 # the summaries, read and written
    outputs.check_file('--out', os.path.join(out_dir, f'{d}.json'), folder_must_exist=False)


def check_files(docs_path: str, figures_dir: Optional[str], datasets, records=(),
                runs_out: Optional[str] = None) -> None:
  """Every file the report will write, before it writes any (``check_paths`` has checked the
  folders and the summaries): the figures of ``datasets`` (``figures_dir`` None: no
  figures) and the per-run files of ``records`` under ``runs_out``. One ``cli.ConfigError``
  naming the flag when one is a folder or lies under a file."""
  for d in datasets:
    if figures_dir is not None:
      for name in pages.figure_names(docs_path, d).values():
        outputs.check_file('--figures', os.path.join(figures_dir, name),
                           folder_must_exist=False)
  for r in records:
    outputs.check_file('--runs_out', run_files.run_file(runs_out, r['dataset'], r['variant'],
                                                        r['seed']), folder_must_exist=False)


def check_inputs(runs_dir: str, finished, references: dict) -> None:
  """What the tables and figures read, checked before anything is written: every metric
  of ``loading.METRICS`` in each run's ``test`` section, and each predictions file (the
  runs' and ``references``, ``{dataset: path}``, where it exists) through
  ``loading.load_predictions`` (finite P(class 1) in [0, 1], labels 0/1, the test split's
  row count), with the same test labels within a dataset. One ``cli.ConfigError`` naming
  the file."""
  first = {}
  for r in finished:
    missing = [k for k in loading.METRICS if k not in r['test']]
    if missing:
      raise cli.ConfigError(
          f"{os.path.join(runs_dir, r['path'], loading.RESULTS)}: its 'test' section lacks "
          f'{missing} (every metric of coulomb_jax.metrics.classification_metrics is a '
          'column of the table).')
  paths = [(r['dataset'], r['predictions']) for r in finished if r.get('predictions')]
  paths += [(d, p) for d, p in references.items() if os.path.isfile(p)]
  for dataset, path in paths:
    labels, _ = loading.load_predictions(path, dataset)
    if dataset not in first:
      first[dataset] = (labels, path)
    elif not np.array_equal(labels, first[dataset][0]):
      raise cli.ConfigError(f'{path}: other test labels than {first[dataset][1]} (same '
                            f'dataset {dataset}); the reliability diagrams pool predictions '
                            'on one test split.')


def redraw_command(out_dir: str, docs_path: str, figures_dir: Optional[str] = None) -> str:
  """The command that redraws ``docs_path`` from the summaries in ``out_dir``, paths as
  given: what a redrawn page names (the command ``main`` ran, made relative to the
  repository root, when run from the command line)."""
  figures = f' --figures={figures_dir}' if figures_dir is not None else ''
  return (f'python -m experiments.report --from_summaries --out={out_dir} '
          f'--docs={docs_path}{figures}')


def _keeps_others(command: str) -> bool:
  """Whether a report ``command`` ran with ``--keep_others`` (absl's spellings of true)."""
  return any(a in ('--keep_others', '--keep_others=true', '--keep_others=True',
                   '--keep_others=1') for a in command.split())


def redraw_from_summaries(out_dir: str, docs_path: str, *, figures_dir: Optional[str] = None,
                          command: Optional[str] = None) -> dict:
  """Rewrites ``docs_path`` and its paired-difference figures from the summaries
  ``write_report`` left in ``out_dir`` (``<dataset>.json``), without the runs (e.g.
  once their folder is gone). Returns ``{dataset: summary}``.

  The page depends only on the summaries and the page's analysis block: the same files
  give the same page and figures, byte for byte. Its tables and Provenance keep the
  summaries' commands, commits and dates; a last line names the redraw by ``command``
  (default ``redraw_command`` of the arguments) and nothing else, no date or commit of
  its own. Summaries from several report runs are accepted when the latest of them ran
  with ``--keep_others``: that is the page it wrote, which names the summaries it kept
  and the run each came from; otherwise one page names one report run and the redraw is
  refused. Reliability diagrams need the runs' predictions and are not redrawn: a
  dataset shows the one the page embedded before, where that file is still in
  ``figures_dir``, and says it has none otherwise."""
  docs_dir = os.path.dirname(docs_path)
  figures_dir_arg = figures_dir
  figures_dir = os.path.join(docs_dir, 'figures') if figures_dir is None else figures_dir
  check_paths(out_dir, docs_path, figures_dir)
  analysis = pages.read_analysis(docs_path)          # fails before anything is written
  summaries = {}
  for d in loading.SPLIT_NAMES:
    path = os.path.join(out_dir, f'{d}.json')
    if os.path.exists(path):
      summaries[d] = loading.read_json(path)
  if not summaries:
    raise cli.ConfigError(f'--out: {out_dir!r} holds no summary (<dataset>.json for a dataset '
                          f'of {sorted(loading.SPLIT_NAMES)}) to redraw from.')
  for d in summaries:                                # the figures it redraws
    for name in pages.figure_names(docs_path, d).values():
      outputs.check_file('--figures', os.path.join(figures_dir, name), folder_must_exist=False)
  made = {d: (s['command'], s['commit'], s['date']) for d, s in summaries.items()}
  latest = max(made.values(), key=lambda m: (m[2], m[0], m[1]))
  if len(set(made.values())) > 1 and not _keeps_others(latest[0]):
    raise cli.ConfigError(
        f'--out: the summaries in {out_dir!r} come from {len(set(made.values()))} different '
        f'report runs {sorted(set(made.values()))} and the latest, `{latest[0]}`, did not keep '
        'the others on its page (--keep_others); one page names one report run, or one run '
        'and the summaries it kept.')
  old_page = ''
  if os.path.exists(docs_path):
    with open(docs_path) as f:
      old_page = f.read()
  figures, kept_reliability = {}, False
  for d, s in summaries.items():
    drawn = pages.draw_figures(s, [], figures_dir, pages.figure_names(docs_path, d))
    figures[d] = {k: v and os.path.relpath(v, docs_dir or '.') for k, v in drawn.items()}
    reliability = os.path.join(figures_dir, pages.figure_names(docs_path, d)['reliability'])
    shown = os.path.relpath(reliability, docs_dir or '.')
    if os.path.isfile(reliability) and f']({shown})' in old_page:
      figures[d]['reliability'] = shown
      kept_reliability = True
  meta = dict(zip(('command', 'commit', 'date'), latest))
  kept = [d for d in summaries if made[d] != latest]
  command = command or redraw_command(out_dir, docs_path, figures_dir_arg)
  provenance.write_atomic(docs_path, pages.markdown(
      summaries, analysis, meta, figures, kept=kept,
      redrawn={'command': command, 'kept_reliability': kept_reliability}))
  return summaries


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top

  _RUNS = flags.DEFINE_string('runs', 'workdir/grid', 'Root of the runs (experiments.grid).')
  _OUT = flags.DEFINE_string('out', 'results', 'Folder for <dataset>.json.')
  _DOCS = flags.DEFINE_string('docs', 'docs/results.md', 'Markdown tables.')
  _TFIDF = flags.DEFINE_string('tfidf', None, 'Folder of the TF-IDF rows (default <out>/tfidf).')
  _FIGURES = flags.DEFINE_string('figures', None, 'Folder for the figures (default figures/ '
                                 'next to --docs).')

  _FROM_SUMMARIES = flags.DEFINE_bool(
      'from_summaries', False, 'Redraw --docs and its paired figures from the summaries '
      'already in --out (<dataset>.json) instead of reading --runs (tables unchanged; the '
      'reliability diagrams need the runs: those the page showed are kept, not redrawn).')

  _KEEP_OTHERS = flags.DEFINE_bool(
      'keep_others', False, 'Keep on the page the summaries (<out>/<dataset>.json) and '
      'figures of datasets that have no runs under --runs (instead of dropping them).')

  _TRAIN_SUBSETS = flags.DEFINE_bool(
      'train_subsets', False, 'Accept runs trained on a fixed subset of the training rows '
      '(data.max_train_examples, the same in every run); the page says so.')

  _ALLOW_FEWER = flags.DEFINE_bool(
      'allow_fewer', False, 'Write even when the runs found hold fewer datasets, variants or '
      'seeds than the summaries in --out (or none): by default that is refused.')

  _RUNS_OUT = flags.DEFINE_string(
      'runs_out', None, 'Folder for the per-run files <dataset>/<variant>/seed<k>.json '
      '(default <--out>/runs/<basename of --runs>: results/runs/... for the default --out); '
      'files of runs not read are kept.')

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    if _FROM_SUMMARIES.value:
      command = ' '.join(['python', '-m', 'experiments.report']
                         + provenance.relative_args(sys.argv[1:]))
      summaries = redraw_from_summaries(_OUT.value, _DOCS.value, figures_dir=_FIGURES.value,
                                        command=command)
      print(f'redrew {_DOCS.value} from {sorted(summaries)}', flush=True)
      return
    summaries = write_report(_RUNS.value, _OUT.value, _DOCS.value, tfidf_dir=_TFIDF.value,
                             figures_dir=_FIGURES.value, keep_others=_KEEP_OTHERS.value,
                             train_subsets=_TRAIN_SUBSETS.value,
                             allow_fewer=_ALLOW_FEWER.value,
                             runs_out=(_RUNS_OUT.value or run_files.default_runs_out(
                                 _RUNS.value, root=os.path.join(_OUT.value, 'runs'))))
    for d, s in summaries.items():
      print(f"{d}: {len(s['runs'])} runs, {len(s['variants'])} variants, "
            f"{len(s['unfinished'])} unfinished", flush=True)

  cli.run(main, config_flags=())
