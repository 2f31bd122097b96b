r"""Does Phase A learn inside the Transformer, and does it help? The decisive comparison.

  python -m studies.phase_a_learning --runs=workdir/learn --pilots=results \
      --out=results/phase_a_learning.json --docs=docs/phase_a_learning.md

Reads a grid of ``experiments.train`` runs (``experiments.grid``) in which each
map has Kernel-X (Phase A in the learning regime), Ball-X (the same schedule and
ball, no Langevin) and Vanilla-X (random particles) for the same seeds, all with
the same Phase B epochs, and writes per dataset and map:

* the Phase A diagnostics of the Kernel-X runs (``results.json['phase_a']``,
  see ``experiments/run/phase_a.py``): medians over seeds of drift/noise,
  repulsion/alignment, Gibbs tilt and displacements; means over seeds of the
  held-out alignment A and centered alignment ρ of the initial, ball-projected,
  learned and shuffled-label (null) particles;
* Kernel − Ball and Kernel − Vanilla test-metric differences paired by seed,
  with two 95% Student-t intervals each (``experiments.analysis.intervals``): over
  the seeds (``ci95``; for all maps at once, over each seed's mean over maps) and
  with the variance pooled within maps (``ci95_pooled``, ``df_pooled``; for all maps
  ``pooled``); the page says which is wider and what the wider one allows;
* the settings (the Kernel-X runs' Phase A and schedule fields, and the pilot
  that chose them, ``results/phase_a_pilot_<dataset>.json``).

``--runs_out`` (default ``<folder of --out>/runs/<grid>``, ``<grid>`` the basename of
``--runs``: ``results/runs/<grid>`` for the default ``--out``) gets one small
JSON per finished run (``experiments.analysis.run_files``); files of runs not read are kept.
A run whose ``results.json`` names another config than its ``config.json`` is refused.
``--keep_others`` keeps the entries of ``--out`` for datasets with no runs under
``--runs`` (their runs gone; each entry names the command that made it, ``generated``);
``--train_subsets`` accepts runs trained on one fixed subset of the training rows
(``data.max_train_examples``, recorded in the settings): the committed file was made
with both (SST-2 on 8,530 rows, Rotten Tomatoes kept from an earlier run).

Also two figures per dataset in ``docs/figures/``: held-out ρ against Phase A step
(learned, with the initial and ball levels of each stage; seed 0) and a forest
plot of the paired differences. The markdown page keeps its hand-written
analysis block (between the ``report`` markers) and regenerates the rest.

``--page_from_results`` rewrites only the page (``page.page_markdown``; the analysis block
kept) and redraws the paired figures from ``--out`` alone: nothing is computed, no run or
pilot read, ``--out`` and the per-run files not written, so the committed page regenerates
from the committed file alone:

  python -m studies.phase_a_learning --page_from_results

Its provenance is the file's (command, commit, date, machine; per dataset its
``generated``: an entry made by another command than the file's is named as kept); the
per-run files' folder, which the file does not hold, is the one its command wrote them to
(``recorded_runs_out``). The alignment figures need the runs' ``history.jsonl``: they are
not redrawn, and the page shows those there.
"""

import json
import os
from typing import Dict, List, Optional

from absl import flags
import numpy as np

from configs import text
from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance
from experiments.analysis import loading
from experiments.analysis import pages
from experiments.analysis import plots
from experiments.analysis import run_files
from experiments.analysis import tables
from studies.phase_a_learning import page as page_lib

METRICS = page_lib.METRICS      # the test metrics compared (the page's columns)
_SETTING_FIELDS = ('schedule', 'after_b_epochs', 'num_epochs', 'relative_step', 'gibbs_tilt',
                   'relative_lam', 'riesz_s', 'softening', 'radius', 'clip_norm', 'step_size',
                   'beta', 'lam', 'batch_size', 'null_run', 'calibration_rows', 'heldout_rows')
DIAGNOSTICS = ('drift_to_noise', 'repulsion_to_alignment', 'gibbs_tilt', 'displacement',
               'random_walk_displacement', 'inside_fraction')
_PROVENANCE = ('command', 'commit', 'date', 'machine')
# Refused with --page_from_results: the flags that choose the runs and pilots read and the
# files besides the page and its paired figures written.
RUN_FLAGS = ('runs', 'pilots', 'keep_others', 'train_subsets', 'runs_out', 'allow_fewer')


def paired_diff(treated: Dict[int, dict], base: Dict[int, dict]) -> Dict[str, dict]:
  """``{metric: {mean, ci95: [lo, hi], n, seeds}}`` of treated − base test metrics by seed."""
  seeds = sorted(set(treated) & set(base))
  out = {}
  for k in METRICS:
    d = [treated[s]['test'][k] - base[s]['test'][k] for s in seeds]
    summary = tables.summarize(d) if d else {'mean': None, 'std': None, 'n': 0}
    mean, half = plots.t_interval(summary)
    out[k] = {'mean': summary['mean'], 'std': summary['std'], 'n': len(d),
              'ci95': [mean - half, mean + half] if np.isfinite(half) else None,
              'seeds': seeds}
  return out


def map_summary(kernel: Dict[int, dict], ball: Dict[int, dict],
                vanilla: Dict[int, dict]) -> dict:
  """One map's entry of the binding JSON (see the module docstring)."""
  reports = [r['phase_a'] for _, r in sorted(kernel.items()) if 'phase_a' in r]
  out = {'seeds': {'kernel': sorted(kernel), 'ball': sorted(ball), 'vanilla': sorted(vanilla)}}
  for field in DIAGNOSTICS:
    values = [p[field] for p in reports if p.get(field) is not None]
    out[field] = float(np.median(values)) if values else None
  for field in ('heldout_alignment', 'heldout_centered_alignment'):
    kinds = [k for k in ('initial', 'ball', 'learned', 'null')
             if reports and all(k in p[field] for p in reports)]
    out[field] = {k: float(np.mean([p[field][k] for p in reports])) for k in kinds}
  out['paired_kernel_minus_ball'] = paired_diff(kernel, ball)
  out['paired_kernel_minus_vanilla'] = paired_diff(kernel, vanilla)
  out['test'] = {kind: {k: tables.summarize([r['test'][k] for r in runs.values()])
                        for k in METRICS}
                 for kind, runs in (('kernel', kernel), ('ball', ball), ('vanilla', vanilla))}
  return out


def all_maps_diff(by: Dict[str, Dict[int, dict]], base_kind: str) -> dict:
  """Kernel − ``base_kind`` over all maps at once: per seed, the mean over maps of the
  test metrics, for the seeds that every map has both runs of; then paired by seed as
  ``paired_diff`` (the seed is the unit: n = number of such seeds)."""
  maps = [m for m in text.MAPS if by.get(f'kernel-{m}')]
  seeds = sorted(set.intersection(*[set(by[f'kernel-{m}']) & set(by.get(f'{base_kind}-{m}', {}))
                                     for m in maps])) if maps else []
  mean = lambda kind, s: {'test': {k: float(np.mean([by[f'{kind}-{m}'][s]['test'][k]
                                                      for m in maps])) for k in METRICS}}
  out = paired_diff({s: mean('kernel', s) for s in seeds}, {s: mean(base_kind, s) for s in seeds})
  out['maps'] = maps
  return out


def dataset_summary(runs: List[dict], pilot: Optional[dict]) -> dict:
  by = {}
  for r in runs:
    by.setdefault(r['variant'], {})[r['seed']] = r
  kernels = [r for v, group in by.items() if v.startswith('kernel-') for r in group.values()]
  if not kernels:
    raise ValueError('no finished kernel-<map> run in this dataset')
  first = kernels[0]['config']
  settings = {f'phase_a.{k}': first['phase_a'].get(k) for k in _SETTING_FIELDS}
  settings['phase_b.num_epochs'] = first['phase_b']['num_epochs']
  settings['data.validation_rule'] = first['data'].get('validation_rule')
  if first['data'].get('max_train_examples'):
    settings['data.max_train_examples'] = first['data']['max_train_examples']
  for r in kernels:   # One setting per dataset: every Kernel-X run must have it.
    mine = {f'phase_a.{k}': r['config']['phase_a'].get(k) for k in _SETTING_FIELDS}
    diff = [k for k in mine if mine[k] != settings[k]]
    if diff:
      raise ValueError(f'{r["path"]}: Phase A settings {diff} differ from the other '
                       'Kernel-X runs of this dataset.')
  if pilot is not None:
    settings['chosen_by'] = {'pilot': pilot['command'], 'commit': pilot['commit'],
                             'setting': pilot['chosen'], 'pilot_dataset': pilot['dataset'],
                             'rule': 'largest mean held-out ρ(learned) − ρ(ball) over maps, '
                                     f"{pilot['dataset']} validation rows of seed "
                                     f"{pilot['seed']}"}
  maps = {m: map_summary(by.get(f'kernel-{m}', {}), by.get(f'ball-{m}', {}),
                         by.get(f'vanilla-{m}', {}))
          for m in text.MAPS if by.get(f'kernel-{m}')}
  maps, all_maps = page_lib.pooled(maps, {key: all_maps_diff(by, key.rsplit('_', 1)[-1])
                                           for key, _ in page_lib.COMPARISONS})
  return {'settings': settings, 'maps': maps, 'all_maps': all_maps,
          'commits': sorted({s['commit'] for r in runs for s in r.get('sessions', [])}),
          'prefix_commits': sorted({s['commit'] for r in runs
                                    for s in r.get('prefix', {}).get('sessions', [])}),
          'runs': len(runs)}


def _pilot_for(pilots_dir: str, dataset: str, runs: List[dict]) -> Optional[dict]:
  """The pilot that chose this dataset's settings: its own, else another dataset's pilot
  whose chosen setting the Kernel-X runs use (settings transferred, not re-chosen)."""
  pilots = {}
  if os.path.isdir(pilots_dir):
    for name in sorted(os.listdir(pilots_dir)):
      if name.startswith('phase_a_pilot_') and name.endswith('.json'):
        with open(os.path.join(pilots_dir, name)) as f:
          pilots[name[len('phase_a_pilot_'):-len('.json')]] = json.load(f)
  if dataset in pilots:
    return pilots[dataset]
  kernel = next((r for r in runs if r['variant'].startswith('kernel-')), None)
  for pilot in pilots.values():
    chosen = pilot['settings'][pilot['chosen']]
    if kernel and all(kernel['config']['phase_a'].get(k) == v for k, v in chosen.items()):
      return pilot
  return None


def alignment_curves(run_dir: str, phase_a: dict) -> List[dict]:
  """Per Phase A stage of one Kernel-X run: the held-out ρ against the run's Phase A step
  (``history.jsonl``) and the stage's initial / ball / null levels."""
  with open(os.path.join(run_dir, 'history.jsonl')) as f:
    records = [json.loads(line) for line in f if line.strip()]
  curves, offset = [], 0
  for stage in phase_a['stages']:
    points = [(offset + r['phase_a_step'], r['heldout']['centered_alignment'])
              for r in records if r.get('stage') == stage['stage'] and 'phase_a_step' in r]
    h = stage['heldout']
    curves.append({'layer': stage['layer'], 'start': offset, 'end': offset + stage['steps'],
                   'steps': [p[0] for p in points], 'rho': [p[1] for p in points],
                   **{k: h[k]['centered_alignment'] for k in h}})
    offset += stage['steps']
  return curves


def curves_figure(path: str, title: str, curves: Dict[str, List[dict]]) -> str:
  """One panel per map: learned ρ (line), initial (dotted), ball (dashed), null (×)."""
  plt = plots.pyplot()
  maps = list(curves)
  cols = 4
  rows = -(-len(maps) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.5 * rows), squeeze=False)
  for ax in axes.ravel()[len(maps):]:
    ax.axis('off')
  for ax, m in zip(axes.ravel(), maps):
    for i, c in enumerate(curves[m]):
      label = (lambda s: s) if i == 0 else (lambda s: None)
      ax.plot([c['start']] + c['steps'], [c['initial']] + c['rho'], '-', color='C3',
              label=label('learned'))
      ax.hlines(c['ball'], c['start'], c['end'], colors='C0', linestyles='--',
                label=label('ball (Ball-X)'))
      ax.hlines(c['initial'], c['start'], c['end'], colors='gray', linestyles=':',
                label=label('initial'))
      if 'null' in c:
        ax.plot([c['end']], [c['null']], 'x', color='k', label=label('shuffled labels'))
      ax.axvline(c['start'], color='lightgray', lw=0.6)
      ax.text(c['start'], 1.0, f" layer {c['layer']}", fontsize=6, va='top',
              transform=ax.get_xaxis_transform())
    ax.set_title(m, fontsize=9)
    ax.set_xlabel('Phase A step', fontsize=7)
    ax.set_ylabel('held-out ρ', fontsize=7)
    ax.tick_params(labelsize=6)
  axes[0][0].legend(fontsize=6, loc='best')
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  return plots.save(fig, path)


def _kept(out: str, fresh: List[str]) -> Dict[str, dict]:
  """The datasets of an earlier ``out`` that have no runs now, each with the provenance
  (``generated``) of the command that summarised it."""
  if not os.path.exists(out):
    return {}
  with open(out) as f:
    old = json.load(f)
  made = {k: old.get(k) for k in ('command', 'commit', 'date', 'machine')}
  return {d: {**s, 'generated': s.get('generated', made)}
          for d, s in old.get('datasets', {}).items() if d not in fresh}


def _entry_run_keys(entry) -> set:
  """``{(variant, seed)}`` of one dataset's entry in the written JSON."""
  return {(f'{kind}-{m}', int(seed)) for m, s in entry.get('maps', {}).items()
          for kind, seeds in s.get('seeds', {}).items() for seed in seeds}


def _old_run_keys(out: str) -> dict:
  """``{dataset: {(variant, seed)}}`` of the JSON ``out`` holds now (empty if none)."""
  if not os.path.exists(out):
    return {}
  return {d: _entry_run_keys(s)
          for d, s in loading.read_json(out).get('datasets', {}).items()}


def write(runs_dir: str, pilots_dir: str, out: str, docs: str, figures_dir: str,
          meta: dict, keep_others: bool = False, train_subsets: bool = False,
          allow_fewer: bool = False, runs_out: Optional[str] = None) -> dict:
  """Writes ``out``, ``docs``, the figures and (``runs_out``; none when None) the per-run
  files (``run_files``) from the runs under ``runs_dir``.

  ``keep_others``: datasets of the existing ``out`` that have no runs under ``runs_dir``
  (a grid run one dataset at a time, the earlier runs gone) keep their entry, its
  ``generated`` provenance and their figures; the page names where each came from.
  ``train_subsets``: accept runs trained on fixed training rows (``loading.load_runs``);
  the settings record ``data.max_train_examples``. Like ``experiments.report.write_report``,
  nothing is written when the runs hold fewer datasets or (variant, seed) pairs than ``out``
  (or none), unless ``allow_fewer``."""
  analysis = pages.read_analysis(docs)           # fails before anything is written
  finished, _ = loading.load_runs(runs_dir, train_subsets)
  fresh = [d for d in loading.SPLIT_NAMES if any(r['dataset'] == d for r in finished)]
  kept = _kept(out, fresh) if keep_others else {}
  new = loading.run_keys(finished)
  new.update({d: _entry_run_keys(s) for d, s in kept.items()})
  loading.check_not_fewer(_old_run_keys(out), new, f'{out} and {docs}', allow_fewer)
  records = run_files.run_records(runs_dir, finished) if runs_out else []
  generated = {k: meta[k] for k in _PROVENANCE}
  docs_dir = os.path.dirname(docs) or '.'
  result = {'datasets': {}}
  figures = {}
  for dataset in (d for d in loading.SPLIT_NAMES if d in kept or d in fresh):
    stem = page_lib.figure_stem(figures_dir, dataset)
    if dataset in kept:
      result['datasets'][dataset] = kept[dataset]
      figures[dataset] = page_lib.existing_figures(figures_dir, dataset, docs_dir)
      continue
    runs = [r for r in finished if r['dataset'] == dataset]
    s = dataset_summary(runs, _pilot_for(pilots_dir, dataset, runs))
    s['generated'] = generated
    result['datasets'][dataset] = s
    curves = {}
    for m in s['maps']:
      seed0 = [r for r in runs if r['variant'] == f'kernel-{m}' and 'phase_a' in r]
      if seed0:
        r = min(seed0, key=lambda r: r['seed'])
        curves[m] = alignment_curves(os.path.join(runs_dir, r['path']), r['phase_a'])
    figs = {'curves': curves_figure(stem + '_alignment.png', f'{dataset}: held-out centered '
                                    'alignment during Phase A (Kernel-X, lowest seed)', curves),
            'paired': page_lib.paired_figure(stem + '_paired.png', dataset, s)}
    figures[dataset] = {k: os.path.relpath(v, docs_dir) for k, v in figs.items()}
  result.update(generated)
  os.makedirs(os.path.dirname(out) or '.', exist_ok=True)
  provenance.write_json_atomic(out, result, indent=1)
  if runs_out:
    run_files.write_records(records, runs_out)
  provenance.write_atomic(docs, page_lib.page_markdown(result, analysis, figures, list(kept),
                                                         runs_out))
  return result


def recorded_runs_out(command: str) -> str:
  """The folder the run of ``command`` (a written JSON's ``command``, paths from the
  repository root) wrote its per-run files to, as ``main`` chooses it: its ``--runs_out``,
  else ``<folder of --out>/runs/<basename of --runs>`` (each flag's default where it gave
  none); an absolute path."""
  args, given = command.split(), {}
  for i, arg in enumerate(args):
    name, sep, value = arg.partition('=')
    if name in ('--runs', '--out', '--runs_out'):
      given[name[2:]] = value if sep else (args[i + 1] if i + 1 < len(args) else '')
  out = given.get('out', flags.FLAGS['out'].default)
  runs_out = given.get('runs_out') or run_files.default_runs_out(
      given.get('runs', flags.FLAGS['runs'].default),
      root=os.path.join(os.path.dirname(out) or '.', 'runs'))
  return os.path.join(provenance.REPO_ROOT, runs_out)


def _paired_path(figures_dir: str, dataset: str) -> str:
  return page_lib.figure_stem(figures_dir, dataset) + '_paired.png'


def _check_paired_figures(datasets, figures_dir: str) -> None:
  """The paired figures of ``datasets`` in ``figures_dir`` can be written: one
  ``cli.ConfigError`` naming ``--figures`` otherwise."""
  outputs.check_folder('--figures', figures_dir)
  for dataset in datasets:
    outputs.check_file('--figures', _paired_path(figures_dir, dataset), folder_must_exist=False)


def page_from_results(out: str, docs: str, figures_dir: str) -> None:
  """``--page_from_results``: reads ``out`` (and ``docs``' analysis block) alone; redraws
  each dataset's paired figure in ``figures_dir`` and rewrites ``docs``
  (``page.page_markdown``: the datasets whose ``generated`` is not the file's own named as kept,
  the per-run files' folder ``recorded_runs_out``), each file replaced atomically; writes
  nothing else. Every refusal comes before the first write."""
  cli.refuse_beside_page_from_results('--out', RUN_FLAGS)
  if not os.path.isfile(out):
    raise cli.ConfigError(f'--out: {out!r} is not a file (--page_from_results reads it).')
  outputs.check_file('--docs', docs)
  result = loading.read_json(out)
  analysis = pages.read_analysis(docs)
  docs_dir = os.path.dirname(docs) or '.'
  try:
    own = {k: result[k] for k in _PROVENANCE}
    datasets = dict(result['datasets'])
    kept = [d for d, s in datasets.items() if s.get('generated', own) != own]
    figures = {d: dict(page_lib.existing_figures(figures_dir, d, docs_dir),
                       paired=os.path.relpath(_paired_path(figures_dir, d), docs_dir))
               for d in datasets}
    page = page_lib.page_markdown(result, analysis, figures, kept,
                                  recorded_runs_out(own['command']))
  except (AttributeError, KeyError, IndexError, TypeError, ValueError) as e:
    raise cli.ConfigError(f'--out: {out}: it cannot give the page ({e!r}).') from None
  _check_paired_figures(datasets, figures_dir)
  for dataset, s in datasets.items():
    page_lib.paired_figure(_paired_path(figures_dir, dataset), dataset, s)
  provenance.write_atomic(docs, page)


def main(argv):
  del argv
  fl = flags.FLAGS
  if fl.page_from_results:
    page_from_results(fl.out, fl.docs, fl.figures)
    return
  write(fl.runs, fl.pilots, fl.out, fl.docs, fl.figures,
        provenance.run_metadata('studies.phase_a_learning'), keep_others=fl.keep_others,
        train_subsets=fl.train_subsets, allow_fewer=fl.allow_fewer,
        runs_out=fl.runs_out or run_files.default_runs_out(
            fl.runs, root=os.path.join(os.path.dirname(fl.out) or '.', 'runs')))


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.phase_a_learning``."""
  # Flags are defined here, not at import, so that tests can import this module next to
  # others that define flags of the same names.
  flags.DEFINE_string('runs', 'workdir/learn', 'Grid root (experiments.grid).')
  flags.DEFINE_string('pilots', 'results', 'Folder of phase_a_pilot_<dataset>.json.')
  flags.DEFINE_string('out', 'results/phase_a_learning.json', 'The binding JSON.')
  flags.DEFINE_string('docs', 'docs/phase_a_learning.md', 'The markdown page.')
  flags.DEFINE_string('figures', 'docs/figures', 'Figure folder.')
  flags.DEFINE_bool('keep_others', False, 'Keep the entries (and figures) of --out for the '
                    'datasets that have no runs under --runs, instead of dropping them.')
  flags.DEFINE_bool('train_subsets', False, 'Accept runs trained on a fixed subset of the '
                    'training rows (data.max_train_examples); the settings record it.')
  flags.DEFINE_string('runs_out', None, 'Folder for the per-run files <dataset>/<variant>/'
                      'seed<k>.json (default <folder of --out>/runs/<basename of --runs>: '
                      'results/runs/... for the default --out); files of runs not read are kept.')
  flags.DEFINE_bool('allow_fewer', False, 'Write even when the runs found hold fewer '
                    'datasets, variants or seeds than --out (or none): refused by default.')
  flags.DEFINE_bool('page_from_results', False, 'Only rewrite --docs (its analysis block '
                    'kept) and redraw the paired figures in --figures from --out; nothing '
                    'else is read, written or computed.')
  cli.run(main, config_flags=())
