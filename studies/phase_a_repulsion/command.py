r"""Does stronger repulsion keep the particles apart, and what does it do to ρ and accuracy?

  studies/phase_a_repulsion/run.sh          # the runs (Rotten Tomatoes, ~65 min, one core)
  python -m studies.phase_a_repulsion --runs=workdir/repulsion \
      --out=results/phase_a_repulsion.json --docs=docs/phase_a_learning.md

Reads ``<runs>/<setting>/<dataset>/kernel-<map>/seed<s>/`` (``experiments.grid`` runs that
differ only in the repulsion: ``phase_a.relative_lam`` and ``phase_a.riesz_s``) and the
Ball-X controls of the same seeds under ``<runs>/base/<dataset>/ball-<map>/seed<s>/``.
Every Kernel-X run of one setting folder must share its repulsion fields, and every run
of the study all its other Phase A fields (one ``ValueError`` naming the run otherwise).

Per run (the JSON's ``runs``, enough to recompute every table cell): per layer, the
particle diversity of the Phase A stage (``experiments.run.phase_a_report``: the share
of the cloud's variance in its top direction, its effective rank, the smallest pairwise
distance; mean over heads) for the initial, ball-projected and learned particles, the
held-out centered alignment ρ of the learned and ball particles, and the test and
validation accuracy of the run and of its seed's Ball-X run. Per setting and map
(``settings``): the means over seeds. The page block (between the ``repulsion`` markers
of ``--docs``) is the table of those means; the page's words around it are kept. Runs of
``phase_a.target = 'softmax'`` are another study's (``studies.phase_a_repulsion.softmax``). A
file that holds runs the folders no longer give is not replaced (``--allow_fewer``).

Per-run files (``experiments.analysis.run_files``, issue 39 item 6): one
``<runs_out>/<setting>-<dataset>-kernel-<map>-seed<s>.json`` per run (the run's row, its
config digest, machine and its Ball-X control's path, commit and digest), ``--runs_out``
defaulting to ``<folder of --out>/runs/phase_a_repulsion`` (``results/runs/phase_a_repulsion``);
files of other runs are kept. Where the run folders are gone, ``--runs_from_results`` writes
them from the rows of ``--out`` alone (nothing else is written; ``from`` says so, no digest):

  python -m studies.phase_a_repulsion --runs_from_results

``--page_from_results`` rewrites only the page block of ``--docs`` from ``--out`` (its
``settings`` and provenance; nothing is run, no run folder read, nothing else written), so
the committed page regenerates from the committed file alone:

  python -m studies.phase_a_repulsion --page_from_results --docs=docs/phase_a_learning.md
"""

import os
from typing import Dict, List


from absl import flags
import numpy as np

from experiments.analysis import loading
from experiments.analysis import run_files
from experiments.common import cli
from experiments.common import outputs
from experiments.common import page_block
from experiments.common import provenance

FLAGS = flags.FLAGS
STUDY = 'phase_a_repulsion'
BEGIN = '<!-- repulsion:begin (written by python -m studies.phase_a_repulsion) -->'
END = '<!-- repulsion:end -->'
DIVERSITY = ('top_direction_share', 'effective_rank', 'min_pairwise_distance')
KINDS = ('initial', 'ball', 'learned')
# Held-out ρ of the Ball-X particles on Kernel-X's keys ('ball': the layers below learned),
# on Ball-X's own keys ('ball_own_keys': the layers below at Ball-X's particles too), and
# of the learned particles.
RHO_KINDS = ('ball', 'ball_own_keys', 'learned')
REPULSION_FIELDS = ('relative_lam', 'riesz_s')
_SHARED_FIELDS = ('schedule', 'after_b_epochs', 'num_epochs', 'relative_step', 'gibbs_tilt',
                  'softening', 'radius', 'clip_norm', 'batch_size', 'target')
# The flags that choose run folders to read or files besides the page to write: refused
# with --page_from_results (the softmax part adds its own).
RUN_FLAGS = ('runs', 'dataset', 'allow_fewer', 'runs_out', 'runs_from_results')


def stage_row(stage: dict) -> dict:
  """One Phase A stage as ``{layer, diversity: {kind: {field: mean over heads}}, rho}``."""
  diversity = {}
  for kind in KINDS:
    heads = stage['diversity'][kind]
    diversity[kind] = {f: float(np.mean([np.mean(h[f]) for h in heads.values()]))
                       for f in DIVERSITY}
  rho = {k: float(stage['heldout'][k]['centered_alignment']) for k in RHO_KINDS
         if k in stage['heldout']}          # older stage files have no ball_own_keys
  return {'layer': int(stage['layer']), 'diversity': diversity, 'rho': rho}


def run_row(setting: str, run: dict, ball: dict) -> dict:
  """The per-run record of a Kernel-X run and its seed's Ball-X run."""
  pa = run['config']['phase_a']
  return {'setting': setting, 'map': run['variant'].split('-', 1)[1], 'seed': run['seed'],
          'relative_lam': pa['relative_lam'], 'riesz_s': str(pa['riesz_s']),
          'path': run['path'], 'commit': run.get('commit'),
          'layers': [stage_row(s) for s in run['phase_a']['stages']],
          'test_accuracy': run['test']['accuracy'],
          'validation_accuracy': run['validation']['accuracy'],
          'ball_test_accuracy': ball['test']['accuracy'],
          'ball_validation_accuracy': ball['validation']['accuracy']}


def _check_same(runs: List[dict], fields, what: str) -> None:
  first = runs[0]['config']['phase_a']
  for r in runs[1:]:
    diff = [f for f in fields if r['config']['phase_a'].get(f) != first.get(f)]
    if diff:
      raise ValueError(f'{r["path"]}: phase_a {diff} differ from {runs[0]["path"]} ({what}).')


def collect(runs_dir: str, dataset: str) -> List[dict]:
  """Every Kernel-X run of every setting folder under ``runs_dir`` with its Ball-X run."""
  return [row for row, _, _ in collect_runs(runs_dir, dataset)]


def collect_runs(runs_dir: str, dataset: str) -> List[tuple]:
  """``(row, Kernel-X results, {'ball': Ball-X results})`` of every run ``collect`` reads
  (each results dict with its ``path`` under ``runs_dir``)."""
  base, _ = loading.load_runs(os.path.join(runs_dir, 'base'))
  balls = {(r['variant'], r['seed']): r for r in base if r['dataset'] == dataset}
  rows, kernels = [], []
  for setting in sorted(os.listdir(runs_dir)):
    folder = os.path.join(runs_dir, setting)
    if setting == 'base' or not os.path.isdir(os.path.join(folder, dataset)):
      continue
    finished, _ = loading.load_runs(folder)
    mine = [dict(r, path=os.path.join(setting, r['path'])) for r in finished
            if r['dataset'] == dataset and r['variant'].startswith('kernel-')
            and r['config']['phase_a'].get('target', 'labels') == 'labels']
    if not mine:
      continue
    for r in mine:
      stages = (r.get('phase_a') or {}).get('stages') or []
      if any(not isinstance(st.get('layer'), int) for st in stages):
        raise ValueError(f'{r["path"]}: a phase_a.schedule={r["config"]["phase_a"].get("schedule")!r} '
                         'run moves every layer at once (a stage without a layer); this study '
                         "reads layer-by-layer stages ('after_b', 'layerwise', 'alternating').")
    _check_same(mine, REPULSION_FIELDS, f'one repulsion per setting folder {setting!r}')
    for r in mine:
      ball = balls.get(('ball-' + r['variant'].split('-', 1)[1], r['seed']))
      if ball is None:
        raise ValueError(f'{r["path"]}: no Ball-X run of its map and seed under '
                         f'{os.path.join(runs_dir, "base", dataset)}.')
      rows.append((run_row(setting, r, ball), r,
                   {'ball': dict(ball, path=os.path.join('base', ball['path']))}))
    kernels += mine
  if not rows:
    raise ValueError(f'--runs: no kernel-<map> run of {dataset!r} under {runs_dir!r}.')
  _check_same(kernels, _SHARED_FIELDS, 'every setting must share the other Phase A fields')
  return sorted(rows, key=lambda t: (t[0]['relative_lam'], t[0]['riesz_s'], t[0]['map'],
                                     t[0]['seed']))


def run_id(row: dict) -> str:
  """A run's per-run file name: its path with ``-`` for ``/``
  (``lam1_log-rotten_tomatoes-kernel-elu-seed0``)."""
  return row['path'].replace('/', '-')


def folder_records(study: str, runs_dir: str, found: List[tuple], command: str) -> List[dict]:
  """``run_files.study_record`` of each ``(row, run, controls)`` (``collect_runs``): the row,
  the run folder's config digest and machine, each control's path, commit and digest."""
  source = f'run folders under {provenance.relative_path(runs_dir)}'
  out = []
  for row, run, controls in found:
    folder = lambda r: os.path.join(runs_dir, r['path'])
    out.append(run_files.study_record(
        study, run_id(row), row, source, command,
        controls={name: run_files.control_entry(c['path'], folder(c), c)
                  for name, c in controls.items()},
        **run_files.folder_provenance(folder(run), run)))
  return out


def runs_out_path(study: str) -> str:
  """``--runs_out`` (default ``run_files.default_study_runs_out(study, --out)``), checked
  before anything is written: one ``cli.ConfigError`` if it names a file."""
  path = FLAGS.runs_out or run_files.default_study_runs_out(study, FLAGS.out)
  run_files.check_runs_out(path)
  return path


def check_outputs() -> None:
  """``--out`` and ``--docs`` can be written, checked before any run folder is read (issue
  39 item 1): one ``cli.ConfigError`` naming the flag. Shared with the softmax part."""
  outputs.check_file('--out', FLAGS.out, folder_must_exist=False)
  if FLAGS.docs:
    outputs.check_file('--docs', FLAGS.docs)


def write_records(records: list, runs_out: str) -> None:
  run_files.write_study_command_records(records, runs_out)


def write_from_results(study: str, module: str, out: str, runs_out: str, page_flag: str) -> None:
  """``--runs_from_results``: the per-run files of every row of ``out``'s ``runs`` (the run
  folders gone), nothing else. Shared with ``studies.phase_a_repulsion.softmax``."""
  if getattr(FLAGS, page_flag):
    raise cli.ConfigError(f'--runs_from_results writes only the per-run files; drop '
                          f'--{page_flag}.')
  if not os.path.isfile(out):
    raise cli.ConfigError(f'--out: {out!r} is not a file (--runs_from_results reads its rows).')
  table = loading.read_json(out)
  rows = table.get('runs') if isinstance(table, dict) else None
  if not rows or not isinstance(rows, list):
    raise cli.ConfigError(f'--out: {out} holds no runs to write per-run files from.')
  try:
    records = run_files.summary_records(study, out, rows, run_id, run_files.written_by(module),
                                        table.get('machine'))
  except (KeyError, TypeError, ValueError) as e:
    raise cli.ConfigError(f'--out: {out}: a row of its runs cannot name a per-run file '
                          f'({e!r}).') from None
  write_records(records, runs_out)


def summarize(rows: List[dict]) -> List[dict]:
  """Means over seeds per (setting, map, layer)."""
  groups: Dict[tuple, List[dict]] = {}
  for r in rows:
    groups.setdefault((r['setting'], r['map']), []).append(r)
  out = []
  for (setting, fmap), group in groups.items():
    entry = {'setting': setting, 'map': fmap, 'relative_lam': group[0]['relative_lam'],
             'riesz_s': group[0]['riesz_s'], 'seeds': [r['seed'] for r in group],
             'layers': []}
    for i, layer in enumerate(group[0]['layers']):
      mean = lambda get: float(np.mean([get(r['layers'][i]) for r in group]))
      entry['layers'].append({
          'layer': layer['layer'],
          'diversity': {k: {f: mean(lambda l: l['diversity'][k][f]) for f in DIVERSITY}
                        for k in KINDS},
          'rho': {k: mean(lambda l: l['rho'][k]) for k in RHO_KINDS
                  if all(k in r['layers'][i]['rho'] for r in group)}})
    for field in ('test_accuracy', 'ball_test_accuracy', 'validation_accuracy',
                  'ball_validation_accuracy'):
      entry[field] = float(np.mean([r[field] for r in group]))
    entry['kernel_minus_ball_test'] = entry['test_accuracy'] - entry['ball_test_accuracy']
    out.append(entry)
  return out


def _repulsion(entry: dict) -> str:
  s = 'log' if entry['riesz_s'] in ('0', '0.0') else entry['riesz_s']
  return f'{entry["relative_lam"]:g}× · {s}'


def markdown(summary: List[dict], meta: dict) -> List[str]:
  """The page block: one row per setting, map and layer."""
  lines = [
      '| repulsion (λ scale · kernel) | map | layer | top share ball → learned | '
      'effective rank ball → learned | min distance ball → learned | ρ ball | '
      'ρ ball, own keys | ρ learned | test acc. Kernel | Kernel − Ball |',
      '|---|---|---|---|---|---|---|---|---|---|---|']
  for e in summary:
    for layer in e['layers']:
      b, l = layer['diversity']['ball'], layer['diversity']['learned']
      acc = (f'{e["test_accuracy"]:.4f}', f'{e["kernel_minus_ball_test"]:+.4f}') \
          if layer is e['layers'][0] else ('', '')
      own = f'{layer["rho"]["ball_own_keys"]:.3f}' if 'ball_own_keys' in layer['rho'] else '–'
      lines.append(
          f'| {_repulsion(e)} | {e["map"]} | {layer["layer"]} | '
          f'{b["top_direction_share"]:.3f} → {l["top_direction_share"]:.3f} | '
          f'{b["effective_rank"]:.1f} → {l["effective_rank"]:.1f} | '
          f'{b["min_pairwise_distance"]:.2f} → {l["min_pairwise_distance"]:.2f} | '
          f'{layer["rho"]["ball"]:.3f} | {own} | {layer["rho"]["learned"]:.3f} | '
          f'{acc[0]} | {acc[1]} |')
  seeds = sorted({s for e in summary for s in e['seeds']})
  lines += ['', f'Means over seeds {seeds} (per-run values in `{meta["out"]}`). Test '
            'accuracy on the Rotten Tomatoes test split, Kernel − Ball paired by seed. '
            'ρ ball: the ball-projected particles on the keys the learned layers below give; '
            'own keys: with the layers below at Ball-X\'s particles too, as in the Ball-X run '
            '(– for runs made before it was recorded). '
            f'Made by `{meta["command"]}` at {meta["commit"]} on {meta["machine"]}.']
  return lines


def _keys(rows: List[dict]) -> set:
  return {(f'{r["setting"]}/{r["map"]}', int(r['seed'])) for r in rows}


def page_meta(out: str, meta: dict) -> dict:
  """What the page block says of its file: ``out`` as given, and the command, the short
  commit and the machine of ``meta`` (``provenance.run_metadata``'s, or the results file's
  own, which holds the same keys)."""
  machine = meta['machine']
  return {'out': out, 'command': meta['command'], 'commit': meta['commit'][:8],
          'machine': f'{machine["cpu_count"]}-core {machine["platform"]}'}


def run_keys(out: str) -> dict:
  """``{'runs': {(setting/map, seed)}}`` of the JSON ``out`` holds now (empty if none)."""
  return {'runs': _keys(loading.read_json(out).get('runs', []))} if os.path.exists(out) else {}


def write_study(module: str, rows: List[dict], summary: List[dict], markdown_fn, begin: str,
                end: str, records: List[dict] = (), runs_out: str = '') -> None:
  """Writes ``--out`` (metadata, ``settings`` = ``summary``, ``runs`` = ``rows``), the page
  block of ``--docs`` (``markdown_fn(summary, meta)``) and the per-run ``records`` into
  ``runs_out`` (``run_files.write_study_records``; none without ``runs_out``), refusing
  first to replace ``--out`` by fewer runs (``--allow_fewer``). Shared with
  ``studies.phase_a_repulsion.softmax``."""
  loading.check_not_fewer(run_keys(FLAGS.out), {'runs': _keys(rows)}, FLAGS.out,
                          FLAGS.allow_fewer)
  try:
    run_files.check_records(list(records), runs_out or '.')     # refused before any write
  except ValueError as e:
    raise cli.ConfigError(f'--runs_out: {e}') from None
  loading.check_folder('--out', os.path.dirname(FLAGS.out) or '.')
  os.makedirs(os.path.dirname(FLAGS.out) or '.', exist_ok=True)
  meta = provenance.run_metadata(module)
  meta_page = page_meta(FLAGS.out, meta)
  provenance.write_json_atomic(FLAGS.out, dict(meta, dataset=FLAGS.dataset,
                                               settings=summary, runs=rows), indent=1)
  if FLAGS.docs:
    page_block.write_block(FLAGS.docs, begin, end, markdown_fn(summary, meta_page))
  if runs_out:
    write_records(list(records), runs_out)


def page_from_results(markdown_fn, begin: str, end: str, run_flags) -> None:
  """``--page_from_results``: reads ``--out`` alone and rewrites the ``begin``/``end``
  block of ``--docs`` (``markdown_fn(settings, page_meta(--out, --out's metadata))``);
  writes nothing else. Every refusal (``run_flags`` given, no ``--docs``, an ``--out``
  that cannot give the block) comes before the write. Shared with the softmax part."""
  cli.refuse_beside_page_from_results('--out', run_flags)
  if not FLAGS.docs:
    raise cli.ConfigError('--page_from_results needs --docs (the page whose block it '
                          'rewrites).')
  outputs.check_file('--docs', FLAGS.docs)
  if not os.path.isfile(FLAGS.out):
    raise cli.ConfigError(f'--out: {FLAGS.out!r} is not a file (--page_from_results reads '
                          'it).')
  table = loading.read_json(FLAGS.out)
  settings = table.get('settings') if isinstance(table, dict) else None
  if not settings or not isinstance(settings, list):
    raise cli.ConfigError(f'--out: {FLAGS.out} holds no settings to write the page from.')
  try:
    lines = markdown_fn(settings, page_meta(FLAGS.out, table))
  except (KeyError, IndexError, TypeError, ValueError) as e:
    raise cli.ConfigError(f'--out: {FLAGS.out}: its settings cannot give the page block '
                          f'({e!r}).') from None
  page_block.write_block(FLAGS.docs, begin, end, lines)


def check_runs_folder(argv) -> None:
  """One ``cli.ConfigError`` for extra arguments or a ``--runs`` that is not a folder."""
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  if not os.path.isdir(FLAGS.runs):
    raise cli.ConfigError(f'--runs: {FLAGS.runs!r} is not a folder.')


def main(argv):
  module = 'studies.phase_a_repulsion'
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  if FLAGS.page_from_results:
    page_from_results(markdown, BEGIN, END, RUN_FLAGS)
    return
  if FLAGS.runs_from_results:
    write_from_results(STUDY, module, FLAGS.out, runs_out_path(STUDY), 'docs')
    return
  check_runs_folder(argv)
  check_outputs()
  runs_out = runs_out_path(STUDY)
  try:
    found = collect_runs(FLAGS.runs, FLAGS.dataset)
  except (ValueError, FileNotFoundError) as e:
    raise cli.ConfigError(str(e)) from None
  rows = [row for row, _, _ in found]
  records = folder_records(STUDY, FLAGS.runs, found, run_files.written_by(module))
  write_study(module, rows, summarize(rows), markdown, BEGIN, END, records, runs_out)


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.phase_a_repulsion``."""
  flags.DEFINE_string('runs', 'workdir/repulsion', 'The study folder (one sub-folder per '
                      'repulsion setting and base/ with the Ball-X runs).')
  flags.DEFINE_string('dataset', 'rotten_tomatoes', 'Dataset of the runs read.')
  flags.DEFINE_string('out', 'results/phase_a_repulsion.json', 'Per-run and summary JSON.')
  flags.DEFINE_string('docs', '', 'Page whose repulsion block is rewritten (empty: none).')
  flags.DEFINE_bool('allow_fewer', False, 'Replace --out even if it holds runs not found now.')
  define_run_file_flags(STUDY)
  cli.run(main)


def define_run_file_flags(study: str) -> None:
  """``--runs_out``, ``--runs_from_results`` and ``--page_from_results`` (shared with the
  softmax part)."""
  flags.DEFINE_string('runs_out', '', 'Folder of the per-run files <run>.json (empty: '
                      f'<folder of --out>/runs/{study}).')
  flags.DEFINE_bool('runs_from_results', False, 'Only write the per-run files, from the '
                    'rows of --out (for runs whose folders are gone); --out and the page are '
                    'not written.')
  flags.DEFINE_bool('page_from_results', False, 'Only rewrite the block of --docs from '
                    '--out (for runs whose folders are gone); nothing else is read, written '
                    'or run.')
