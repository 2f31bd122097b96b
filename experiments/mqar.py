r"""Multi-query associative recall (MQAR): one causal-LM run, or a grid of them.

  python -m experiments.mqar --config=configs/mqar.py:particles_softmax --workdir=workdir/mqar/one
  python -m experiments.mqar --config=configs/mqar.py --grid=main --workdir=workdir/mqar/main

One run trains ``coulomb_jax.layers.lm.CausalLM`` with the attention method of ``config.method``
(``experiments/recall/methods.py``) and writes ``<workdir>/result.json``
(``experiments/recall/run.py``). With ``--grid``, every run of the plan
(``experiments/recall/grid.py``; Zoology's protocol, ``--grid=zoology*``:
``experiments/recall/zoology.py``) goes to ``<workdir>/<run name>/``; start one worker per
core with the same command (runs are claimed with a lock, finished ones skipped,
unfinished ones resumed), and after each run the worker rewrites ``--results`` from all
finished runs, keeping the runs the file holds that the workdir lacks. ``--collect_only``:
only that rewrite (with ``--page=docs/recall.md``: also
its figure and table, ``experiments/recall/page.py``). The results file never loses a run.
Every output path (``--workdir``, ``--results``, ``--runs_dir``, ``--page``, ``--figure``,
``--archive``) is checked before anything is computed or written, and an output flag the
mode would ignore (``--page`` without ``--collect_only``, ``--results`` for one run) is
refused: one line naming the flag (``check_flags``, ``outputs``).

  python -m experiments.mqar --config=configs/mqar.py:zoology --grid=zoology \
      --workdir=workdir/mqar_zoology          # Zoology's protocol (results/mqar_zoology.json)
  python -m experiments.mqar --config=configs/mqar.py:zoology --grid=zoology_long \
      --workdir=workdir/mqar_zoology_long     # the same at 4x the steps, one cell
  python -m experiments.mqar --config=configs/mqar.py:zoology --grid=zoology_long_l128 \
      --workdir=workdir/mqar_zoology_long_l128  # 4x the steps at (128, 8), one rate

  python -m experiments.mqar --workdir=workdir/mqar/main --collect_only --page=docs/recall.md
  python -m experiments.mqar --workdir=workdir/mqar/long --collect_only \
      --results=results/mqar_long.json --page=docs/recall.md --block=mqar_long \
      --figure=docs/figures/recall_long_accuracy_vs_length.png
"""

import glob
import json
import os
import tarfile
import time

from absl import flags
from ml_collections import config_flags

from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance
from experiments.recall import batched as batched_lib
from experiments.recall import grid as grid_lib
from experiments.recall import methods
from experiments.recall import page as page_lib
from experiments.recall import run as run_lib
from experiments.recall import zoology
from experiments.recall import zoology_page

FLAGS = flags.FLAGS
RUNS_DIR = 'results/runs/mqar_zoology'
ZOOLOGY_RESULTS = ['results/mqar_zoology.json', 'results/mqar_zoology_gpu.json',
                   'results/mqar_zoology_long.json', 'results/mqar_zoology_gpu_long.json',
                   'results/mqar_zoology_long_annealed.json',
                   'results/mqar_zoology_long_l128.json', 'results/mqar_zoology_long_eta1e-2.json',
                   'results/mqar_zoology_long_annealed_eta3e-3.json']
"""The zoology grids' results files the page shows, where they exist (CPU, GPU, CPU long,
GPU long, CPU long with the particles' step annealed, CPU long at (128, 8), CPU long at a
fixed η of 1e-2 with the constant step and of 3e-3 annealed)."""


def _run_key(row: dict) -> tuple:
  return tuple(row[k] for k in ('seq_len', 'num_pairs', 'width', 'method', 'seed'))


def write_results(root: str, path: str, log=run_lib.log_line) -> int:
  """``path`` from every finished run under ``root``, keeping the runs it holds that ``root``
  lacks (a new checkout's empty workdir never erases committed runs); a run in both is
  taken from ``root``. The settings (vocab, num_train) must agree."""
  rows = grid_lib.collect(root)
  if os.path.exists(path):
    with open(path) as f:
      try:
        old = json.load(f)
      except json.JSONDecodeError as e:
        raise cli.ConfigError(f'--results: {path}: not valid JSON ({e}).') from None
    if (not isinstance(old, dict) or not {'vocab', 'num_train'} <= set(old)
        or not isinstance(old.get('runs', []), list)):
      what = (f'an object with keys {sorted(old)}' if isinstance(old, dict)
              else f'a JSON {type(old).__name__}')
      raise cli.ConfigError(f'--results: {path}: not a results file of experiments.mqar '
                            f'(an object with vocab, num_train and a list of runs), but '
                            f'{what}; nothing was written.')
    have = {_run_key(r) for r in rows}
    try:
      kept = [dict(r, vocab=old['vocab'], num_train=old['num_train'])
              for r in old.get('runs', []) if _run_key(r) not in have]
    except (KeyError, TypeError) as e:
      raise cli.ConfigError(f'--results: {path}: a run of its runs list lacks a field of the '
                            f'results file ({e!r}); nothing was written.') from None
    rows = rows + kept
  try:
    table = grid_lib.results_file(grid_lib.sort_rows(rows))
  except ValueError as e:
    raise cli.ConfigError(f'--results: {path}: {e}') from None
  provenance.write_json_atomic(path, table, indent=1)
  log(f'{path}: {len(table["runs"])} runs')
  return len(table['runs'])


def run_grid(config, name: str, root: str, results: str, log=run_lib.log_line) -> int:
  """Every run of ``plan(name)`` not finished or claimed; returns how many this worker made.

  Each result records the command and commit of this worker's start (the code it runs).
  """
  metadata = provenance.run_metadata('experiments.mqar')
  made = 0
  for run_name, overrides in grid_lib.plan(name):
    run_dir = os.path.join(root, run_name)
    if os.path.exists(os.path.join(run_dir, run_lib.RESULT_FILE)):
      continue
    lock = grid_lib.claim(run_dir)
    if lock is None:
      continue
    with lock:
      run_lib.train_and_evaluate(grid_lib.apply_overrides(config, overrides), run_dir, log,
                                 metadata)
    made += 1
    write_results(root, results, log)
  return made


def check_budget(runs, pilots, steps: int, pilot_steps, flag: str, source: str,
                 schedule: str = 'constant', step_size=None, piloted: bool = False) -> None:
  """One ``cli.ConfigError`` naming ``flag`` when a row of ``runs`` (read from ``source``) was
  trained for other than ``steps`` steps, or a pilot for other than ``pilot_steps``, or a
  Langevin row with another particle ``schedule`` (a row without one: 'constant', the only
  one before the field), or, where the grid fixes η (``step_size``), a Langevin row or a
  pilot at another η, or, where the grid's pilots choose η (``piloted``), a Langevin row
  with no pilot beside it (a fixed-η grid's): two grids of one protocol at two budgets,
  schedules or step sizes share run names, so never a folder or a results file."""
  for rows, want in ((runs, steps), (pilots, pilot_steps)):
    for r in rows:
      if r.get('steps') != want:
        raise cli.ConfigError(
            f'{flag}: {source} holds {zoology.zoology_row_name(r)} trained for '
            f'{r.get("steps")} steps, this grid runs {want}: another budget\'s runs (give '
            f'this grid its own {flag}). Nothing was run or written.')
      theirs = r.get('particle_schedule', 'constant')
      if r.get('method') in methods.LANGEVIN_METHODS and theirs != schedule:
        raise cli.ConfigError(
            f'{flag}: {source} holds {zoology.zoology_row_name(r)} with the particles\' '
            f'{theirs!r} schedule, this grid runs {schedule!r}: another schedule\'s runs '
            f'(give this grid its own {flag}). Nothing was run or written.')
      theirs = r.get('particle_step_size')
      if step_size is None or r.get('method') not in methods.LANGEVIN_METHODS:
        continue
      if rows is pilots or theirs != step_size:
        what = ('a pilot, where this grid runs none' if rows is pilots else
                f'at the particles\' step {theirs!r}, where this grid runs {step_size!r}')
        raise cli.ConfigError(
            f'{flag}: {source} holds {zoology.zoology_row_name(r)} {what}: another grid\'s '
            f'runs (give this grid its own {flag}). Nothing was run or written.')
  langevin = [r for r in runs if r.get('method') in methods.LANGEVIN_METHODS]
  if piloted and langevin and not pilots:
    raise cli.ConfigError(
        f'{flag}: {source} holds {zoology.zoology_row_name(langevin[0])} and no pilot, where '
        f'this grid\'s pilots choose the particles\' step: a fixed-η grid\'s runs (give this '
        f'grid its own {flag}). Nothing was run or written.')


def read_zoology_file(path: str):
  """``(runs, pilots, failed programs)`` of a zoology grid's results file; one
  ``cli.ConfigError`` naming ``--results`` if it is not one."""
  try:
    with open(path) as f:
      old = json.load(f)
    if not isinstance(old, dict):
      raise TypeError(f'a JSON {type(old).__name__}, not an object')
    return old['runs'], old.get('pilots', []), old.get('failed_programs', [])
  except (json.JSONDecodeError, KeyError, TypeError) as e:
    raise cli.ConfigError(f'--results: {path}: not a results file of this grid ({e!r}); '
                          'nothing was written.') from None


def check_sources(config, root: str, results: str, grid=None) -> None:
  """``check_budget`` of the finished runs under ``root`` and of those ``results`` holds
  (``grid``: the grid's plan, for its pilots' steps), before a grid restores, runs or
  writes anything."""
  g = grid or zoology.ZOOLOGY
  pilot_steps, step_size = g.get('pilot_steps'), g.get('step_size')
  piloted = bool(g.get('pilot_step_sizes')) and step_size is None   # not a batched grid's
  schedule = config.particles.schedule
  check_budget(*zoology.zoology_rows(root), config.train.steps, pilot_steps, '--workdir',
               root, schedule, step_size, piloted)
  if os.path.exists(results):
    check_budget(*read_zoology_file(results)[:2], config.train.steps, pilot_steps,
                 '--results', results, schedule, step_size, piloted)


def write_zoology(config, root: str, path: str, runs_dir: str, log=run_lib.log_line,
                  grid=None) -> int:
  """``path`` (a zoology grid's results file, e.g. the binding results/mqar_zoology.json) and
  one file per run in ``runs_dir`` from every finished run under ``root``, keeping the runs
  ``path`` holds that ``root`` lacks (a run in both is taken from ``root``); ``grid``: the
  grid's plan (``zoology.ZOOLOGY_GRIDS``, ``batched_lib.BATCHED_GRIDS``; default
  ``zoology.ZOOLOGY``), for the protocol's rates. Rows of another budget are refused
  (``check_sources``)."""
  check_sources(config, root, path, grid)
  runs, pilots = zoology.zoology_rows(root)
  old_failed = []
  if os.path.exists(path):
    old_runs, old_pilots, old_failed = read_zoology_file(path)
    for new, kept in ((runs, old_runs), (pilots, old_pilots)):
      have = {zoology.zoology_key(r) for r in new}
      new.extend(r for r in kept if zoology.zoology_key(r) not in have)
  if not runs and not pilots:
    raise cli.ConfigError(f'--workdir: {root} holds no finished run of this grid, and '
                          f'--results {path} none either.')
  where = '+'.join(sorted({r.get('machine', {}).get('platform', 'cpu') for r in runs + pilots}))
  batched = any('runs_in_program' in r for r in runs)
  table = zoology.zoology_file(runs, pilots,
                                zoology.zoology_protocol(config, where, batched, grid))
  failed = {f['program']: f for f in old_failed}
  for path_ in sorted(glob.glob(os.path.join(root, 'programs', '*', batched_lib.FAILED_FILE))):
    with open(path_) as f:
      entry = json.load(f)
    failed[entry['program']] = entry
  ran = {zoology.zoology_row_name(r).rsplit('-lr', 1)[0] + (
      f'-eta{r["particle_step_size"]:.0e}' if 'runs_in_program' in r and 'particle_step_size' in r
      else '') for r in table['runs']}
  failed = {k: v for k, v in failed.items() if k not in ran}     # a later try succeeded
  if failed:           # programs that stopped with an error (batched grid): kept, never lost
    table['failed_programs'] = [failed[k] for k in sorted(failed)]
  os.makedirs(runs_dir, exist_ok=True)
  for r in table['runs'] + table['pilots']:
    name = zoology.zoology_row_name(r)
    if r in table['pilots']:
      name = f'pilot-{name}-eta{r["particle_step_size"]:.0e}'
    provenance.write_json_atomic(os.path.join(runs_dir, name + '.json'), r, indent=1)
  provenance.write_json_atomic(path, table, indent=1)
  log(f'{path}: {len(table["runs"])} runs, {len(table["pilots"])} pilots; {runs_dir}')
  return len(table['runs'])


def restore_finished(root: str, results: str) -> int:
  """Writes ``<root>/<run>/result.json`` for every run ``results`` holds that ``root`` lacks,
  so a grid restarted on a new machine (its run folders gone) does not run them again."""
  if not os.path.exists(results):
    return 0
  with open(results) as f:
    table = json.load(f)
  made = 0
  for pilot, rows in ((False, table.get('runs', [])), (True, table.get('pilots', []))):
    for r in rows:
      if pilot:
        name = (f'pilot/{r["method"]}-L{r["seq_len"]}-P{r["num_pairs"]}-w{r["width"]}'
                f'-eta{r["particle_step_size"]:.0e}')
      else:
        name = zoology.zoology_row_name(r)
      path = os.path.join(root, name, run_lib.RESULT_FILE)
      if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        provenance.write_json_atomic(path, r, indent=2)
        made += 1
  return made


def run_zoology(config, root: str, results: str, runs_dir: str, log=run_lib.log_line,
                poll_seconds: float = 60.0, grid=None) -> int:
  """Every run of ``zoology.zoology_plan`` (of ``grid``, default ``zoology.ZOOLOGY``) as
  its prerequisites finish; several workers share ``root`` (runs claimed by lock). Returns
  how many this worker made."""
  check_sources(config, root, results, grid)
  metadata = provenance.run_metadata('experiments.mqar')
  restored = restore_finished(root, results)
  if restored:
    log(f'{root}: {restored} finished runs restored from {results}')
  made = 0
  while True:
    runnable, waiting = zoology.zoology_plan(root, grid)
    todo = [(n, o) for n, o in runnable
            if not os.path.exists(os.path.join(root, n, run_lib.RESULT_FILE))]
    done_one = False
    for name, overrides in todo:
      run_dir = os.path.join(root, name)
      lock = grid_lib.claim(run_dir)
      if lock is None:
        continue
      with lock:
        run_lib.train_and_evaluate(grid_lib.apply_overrides(config, overrides), run_dir, log,
                                   metadata)
      made += 1
      write_zoology(config, root, results, runs_dir, log, grid)
      done_one = True
      break                                  # a finished run may unlock others: re-plan
    if done_one:
      continue
    if not todo and not waiting:
      return made
    log(f'{root}: {len(todo)} runs held by other workers, {waiting} waiting on them; '
        f'checking again in {poll_seconds:.0f} s')
    time.sleep(poll_seconds)


def archive_runs(root: str, path: str) -> None:
  """``path`` (a .tar.gz, written atomically): every ``<run>/result.json`` and
  ``programs/<program>/failed.json`` under ``root`` (the GPU grid's way home: a device
  returns a few files, not one per run)."""
  found = sorted(glob.glob(os.path.join(root, '*', run_lib.RESULT_FILE)) +
                 glob.glob(os.path.join(root, 'programs', '*', batched_lib.FAILED_FILE)))
  tmp = f'{path}.{os.getpid()}.tmp'
  with tarfile.open(tmp, 'w:gz') as tar:
    for f in found:
      tar.add(f, arcname=os.path.relpath(f, root))
  os.replace(tmp, path)


def run_batched(config, programs, root: str, results: str, runs_dir: str, budget_s: float,
                archive: str, log=run_lib.log_line, grid=None) -> int:
  """A batched grid's ``programs`` (``batched_lib.batched_programs``) in order until
  ``budget_s`` − 60 s, none training past ``budget_s``; after each program ``--results``,
  the per-run files and, if given, ``archive`` are rewritten."""
  start = time.time()
  check_sources(config, root, results, grid)
  restored = restore_finished(root, results)
  if restored:
    log(f'{root}: {restored} finished runs restored from {results}')
  limits = {}
  if budget_s:
    limits = {'stop_starting_at': start + budget_s - 60, 'deadline': start + budget_s}

  def after():
    write_zoology(config, root, results, runs_dir, log, grid)
    if archive:
      archive_runs(root, archive)
  return batched_lib.run_programs(config, root, programs, log, after_program=after, **limits)


def check_outputs(**paths) -> None:
  """Every output path (``--<name>=path``) can be written, before any is: its folder
  exists and it is not a folder itself (``outputs.check_file``). One ``cli.ConfigError``
  naming the flag."""
  for flag, path in paths.items():
    outputs.check_file(flag, path)


# The flags that name what one mode writes: given to a mode that does not write it, it
# would be ignored without a word (a page not redrawn, results not where asked).
_MODE_FLAGS = {
    'page': ('--collect_only', lambda collect, grid: collect),
    'figure': ('--collect_only', lambda collect, grid: collect),
    'block': ('--collect_only', lambda collect, grid: collect),
    'results': ('--grid or --collect_only (a single run writes <workdir>/result.json)',
                lambda collect, grid: collect or grid),
    'runs_dir': ('--grid=<a zoology grid> (zoology.ZOOLOGY_GRIDS) or a batched grid',
                 lambda collect, grid: (grid in zoology.ZOOLOGY_GRIDS
                                        or grid in batched_lib.BATCHED_GRIDS)),
    'archive': ('a batched grid, without --collect_only',
                lambda collect, grid: grid in batched_lib.BATCHED_GRIDS and not collect),
}


def check_flags() -> None:
  """The workdir and the flags of outputs the mode does not write, before anything is
  read, computed or written: one ``cli.ConfigError`` naming the flag and its value."""
  for flag, (where, used) in _MODE_FLAGS.items():
    if FLAGS[flag].present and not used(FLAGS.collect_only, FLAGS.grid):
      raise cli.ConfigError(f'--{flag}={FLAGS[flag].value}: only with {where}; this command '
                            'would ignore it. Nothing was run or written.')
  outputs.check_folder('--workdir', FLAGS.workdir)


def check_collect_source(workdir: str, results: str) -> None:
  """``--collect_only`` with neither runs nor results to collect: one line naming
  ``--workdir`` (a missing workdir is fine when ``--results`` holds the runs: a new
  checkout regenerates its page from the committed file)."""
  if not os.path.isdir(workdir) and not os.path.exists(results):
    raise cli.ConfigError(f'--workdir: {workdir} does not exist, and --results {results} '
                          'does not exist either: no finished run to collect; nothing was '
                          'written.')


def main(argv):
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  if not FLAGS.workdir:
    raise cli.ConfigError('--workdir is required.')
  check_flags()
  config = FLAGS.config
  batched = FLAGS.grid in batched_lib.BATCHED_GRIDS
  if FLAGS.grid in zoology.ZOOLOGY_GRIDS or batched:
    if batched:
      grid = batched_lib.BATCHED_GRIDS[FLAGS.grid]
      overrides, default = grid.get('overrides', {}), grid['results']
    else:
      grid, overrides, default = zoology.ZOOLOGY_GRIDS[FLAGS.grid]
    given = FLAGS['config'].override_values
    for field in overrides:           # the grid's own budget: never silently replaced
      if field in given:
        raise cli.ConfigError(f'--config.{field}={given[field]}: the grid {FLAGS.grid} sets '
                              f'{field} = {overrides[field]} itself; drop the flag. Nothing '
                              'was run or written.')
    config = grid_lib.apply_overrides(config, overrides)
    results = FLAGS.results if FLAGS.results != 'results/mqar.json' else default
    if not FLAGS['runs_dir'].present:             # <results' folder>/runs/<results' name>
      FLAGS.runs_dir = os.path.join(os.path.dirname(results), 'runs',
                                    os.path.splitext(os.path.basename(results))[0])
    check_outputs(results=results)
    outputs.check_folder('--runs_dir', FLAGS.runs_dir)
    if FLAGS.collect_only:
      figure = FLAGS.figure if FLAGS['figure'].present else zoology_page.FIGURE
      if FLAGS.page:
        check_outputs(page=FLAGS.page, figure=figure)
        check_outputs(figure=zoology_page.state_figure_path(figure))
        check_outputs(figure=zoology_page.curve_figure_path(figure))
      check_collect_source(FLAGS.workdir, results)
      write_zoology(config, FLAGS.workdir, results, FLAGS.runs_dir, grid=grid)
      if FLAGS.page:
        files = [f for f in ZOOLOGY_RESULTS if os.path.exists(f)]
        if results not in files:
          files.append(results)
        zoology_page.write(files, FLAGS.page, figure)
      return
    if batched:
      if FLAGS.archive:
        check_outputs(archive=FLAGS.archive)
      programs = batched_lib.batched_programs(grid)
      for _, overrides, specs in programs:                          # before any compute
        batched_lib.check_program(grid_lib.apply_overrides(config, overrides),
                                  [batched_lib.Spec(*s) for s in specs])
      run_batched(config, programs, FLAGS.workdir, results, FLAGS.runs_dir, FLAGS.budget_s,
                  FLAGS.archive, grid=grid)
      return
    for _, overrides in zoology.zoology_plan(FLAGS.workdir, grid)[0]:   # before any compute
      run_lib.check_config(grid_lib.apply_overrides(config, overrides))
    run_zoology(config, FLAGS.workdir, results, FLAGS.runs_dir, grid=grid)
    return
  if FLAGS.collect_only:
    try:
      page_lib.markers(FLAGS.block)
    except ValueError as e:
      raise cli.ConfigError(str(e)) from None
    check_outputs(results=FLAGS.results, **(
        {'page': FLAGS.page, 'figure': FLAGS.figure} if FLAGS.page else {}))
    check_collect_source(FLAGS.workdir, FLAGS.results)
    write_results(FLAGS.workdir, FLAGS.results)
    if FLAGS.page:
      page_lib.write_page(FLAGS.results, FLAGS.page, FLAGS.figure, FLAGS.block)
    return
  if not FLAGS.grid:
    run_lib.train_and_evaluate(config, FLAGS.workdir)
    return
  try:
    plan = grid_lib.plan(FLAGS.grid)
  except ValueError as e:
    raise cli.ConfigError(str(e)) from None
  for _, overrides in plan:                       # every run's config, before any compute
    run_lib.check_config(grid_lib.apply_overrides(config, overrides))
  check_outputs(results=FLAGS.results)            # rewritten after each run
  run_grid(config, FLAGS.grid, FLAGS.workdir, FLAGS.results)


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', 'configs/mqar.py', 'MQAR run config.',
                                  lock_config=False)
  flags.DEFINE_string('workdir', None, 'Run folder (with --grid: the grid folder).')
  grids = (sorted(grid_lib.GRIDS) + sorted(zoology.ZOOLOGY_GRIDS)
           + sorted(batched_lib.BATCHED_GRIDS))
  flags.DEFINE_string('grid', '', f'Run a grid of {grids} '
                      'instead of one run (zoology*: with --config=configs/mqar.py:zoology; '
                      'zoology_batched: every (cell, width, method) as one vmapped program, '
                      'for a GPU).')
  flags.DEFINE_string('runs_dir', RUNS_DIR,
                      'With a zoology grid (ZOOLOGY_GRIDS or a batched one): the folder '
                      'of one JSON per finished run (default: <--results\' folder>/runs/'
                      '<--results\' name>; results/runs/mqar_zoology for --grid=zoology).')
  flags.DEFINE_float('budget_s', 0.0, 'With --grid=zoology_batched: no program starts after '
                     'budget_s - 60 s and none trains past budget_s (0: no limit).')
  flags.DEFINE_string('archive', '', 'With --grid=zoology_batched: a .tar.gz of every run\'s '
                      'result.json, rewritten after each program (the GPU\'s way home).')
  flags.DEFINE_string('results', 'results/mqar.json', 'Results file the grid rewrites.')
  flags.DEFINE_bool('collect_only', False, 'Only rewrite --results from the finished runs.')
  flags.DEFINE_string('page', '', 'With --collect_only: also redraw the figure and table of '
                      'this page (docs/recall.md); with a zoology grid (ZOOLOGY_GRIDS or a '
                      'batched one), its '
                      'mqar_zoology block from every results file of ZOOLOGY_RESULTS there is.')
  flags.DEFINE_string('figure', 'docs/figures/recall_accuracy_vs_length.png',
                      'The figure --page draws (zoology grids: ' + zoology_page.FIGURE +
                      ' unless given).')
  flags.DEFINE_string('block', 'mqar', 'The page block --page rewrites (another grid\'s '
                      'table goes to its own block, e.g. mqar_long).')
  cli.run(main)
