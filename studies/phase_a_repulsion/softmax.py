r"""Phase A on the softmax target inside the encoder: closer to softmax, and more accurate?

  studies/phase_a_repulsion/run.sh      # the runs: its softmax-target part
  python -m studies.phase_a_repulsion.softmax --runs=workdir/repulsion \
      --settings=softmax_coulomb,softmax_log_r12 --labels_setting=lam1_coulomb \
      --out=results/phase_a_softmax.json --docs=docs/softmax_mimicry.md

Reads the Kernel-X runs of each ``--settings`` folder under ``--runs``
(``<runs>/<setting>/<dataset>/kernel-<map>/seed<s>/``, ``phase_a.target = 'softmax'``),
the Kernel-X runs of the label target with the same repulsion (``--labels_setting``), and
the controls of the same seeds under ``<runs>/base/``: Ball-X (the random draw projected
onto the ball of radius 1.5) and Vanilla-X (the draw itself; at a radius the draw lies
inside, it is also that radius' Ball-X). All of them continue one Phase B prefix per map
and seed (``run.prefix_from``), so every difference is Phase A's.

Per run (the JSON's ``runs``, enough to recompute every cell): per layer, the held-out
attention KL(softmax ‖ linear) of the initial, ball and learned particles on each head's
own queries and keys of validation rows, and the median drift/noise ratio of the stage;
the test and validation accuracy of the run and of its controls. Per setting and map
(``settings``): the means over seeds. The page block (between the ``phase-a-softmax``
markers of ``--docs``) is the table of those means; the words around it are kept. A
file that holds runs the folders no longer give is not replaced (``--allow_fewer``).

Per-run files, as ``studies.phase_a_repulsion``'s (``<setting>-<dataset>-kernel-<map>-seed<s>.json``,
with the Ball-X, Vanilla-X and label-target controls): ``--runs_out`` defaults to
``<folder of --out>/runs/phase_a_softmax``; ``--runs_from_results`` writes them from the
rows of ``--out`` alone, where the run folders are gone:

  python -m studies.phase_a_repulsion.softmax --runs_from_results

``--page_from_results`` rewrites only the ``phase-a-softmax`` block of ``--docs`` from
``--out`` (nothing is run, no run folder read, nothing else written), so the committed page
regenerates from the committed file alone:

  python -m studies.phase_a_repulsion.softmax --page_from_results --docs=docs/softmax_mimicry.md
"""

import os
from typing import Dict, List


from absl import flags
import numpy as np

from studies.phase_a_repulsion import command as phase_a_repulsion
from experiments.analysis import loading
from experiments.analysis import run_files
from experiments.common import cli

FLAGS = flags.FLAGS
STUDY = 'phase_a_softmax'
BEGIN = '<!-- phase-a-softmax:begin (written by python -m studies.phase_a_repulsion.softmax) -->'
END = '<!-- phase-a-softmax:end -->'
KL_KINDS = ('initial', 'ball', 'learned')
CONTROLS = ('ball', 'vanilla', 'labels')
# Refused with --page_from_results: the flags that choose run folders or other files.
RUN_FLAGS = phase_a_repulsion.RUN_FLAGS + ('settings', 'labels_setting')


def _by_key(runs: List[dict], dataset: str) -> Dict[tuple, dict]:
  return {(r['variant'].split('-', 1)[1], r['seed']): r for r in runs
          if r['dataset'] == dataset}


def _load(runs_dir: str, setting: str, dataset: str, target: str) -> Dict[tuple, dict]:
  """``{(map, seed): results}`` of the Kernel-X runs of one setting folder."""
  folder = os.path.join(runs_dir, setting)
  finished, _ = loading.load_runs(folder)
  runs = [dict(r, path=os.path.join(setting, r['path'])) for r in finished
          if r['variant'].startswith('kernel-')]
  for r in runs:
    if r['config']['phase_a'].get('target', 'labels') != target:
      raise ValueError(f'{r["path"]}: phase_a.target is '
                       f'{r["config"]["phase_a"].get("target", "labels")!r}, expected '
                       f'{target!r} in {setting!r}.')
  return _by_key(runs, dataset)


def run_row(setting: str, run: dict, controls: Dict[str, dict]) -> dict:
  """The per-run record of a softmax-target Kernel-X run and its controls."""
  pa = run['config']['phase_a']
  layers = [{'layer': int(s['layer']), 'drift_to_noise': float(s['drift_to_noise']),
             'kl': {k: float(s['heldout'][k]['kl']) for k in KL_KINDS}}
            for s in run['phase_a']['stages']]
  row = {'setting': setting, 'map': run['variant'].split('-', 1)[1], 'seed': run['seed'],
         'radius': pa['radius'], 'relative_lam': pa['relative_lam'],
         'riesz_s': str(pa['riesz_s']), 'path': run['path'], 'commit': run.get('commit'),
         'layers': layers, 'test_accuracy': run['test']['accuracy'],
         'validation_accuracy': run['validation']['accuracy']}
  for name, c in controls.items():
    row[f'{name}_test_accuracy'] = c['test']['accuracy']
    row[f'{name}_validation_accuracy'] = c['validation']['accuracy']
  return row


def collect(runs_dir: str, settings: List[str], labels_setting: str, dataset: str) -> List[dict]:
  """Every softmax-target run of ``settings`` with its controls (ValueError if one lacks)."""
  return [row for row, _, _ in collect_runs(runs_dir, settings, labels_setting, dataset)]


def collect_runs(runs_dir: str, settings: List[str], labels_setting: str,
                 dataset: str) -> List[tuple]:
  """``(row, results, {control: results})`` of every run ``collect`` reads (each results
  dict with its ``path`` under ``runs_dir``)."""
  base, _ = loading.load_runs(os.path.join(runs_dir, 'base'))
  base = [dict(r, path=os.path.join('base', r['path'])) for r in base]
  ball = _by_key([r for r in base if r['variant'].startswith('ball-')], dataset)
  vanilla = _by_key([r for r in base if r['variant'].startswith('vanilla-')], dataset)
  labels = _load(runs_dir, labels_setting, dataset, 'labels')
  rows = []
  for setting in settings:
    for key, run in sorted(_load(runs_dir, setting, dataset, 'softmax').items()):
      controls = {'ball': ball.get(key), 'vanilla': vanilla.get(key), 'labels': labels.get(key)}
      missing = [n for n, c in controls.items() if c is None]
      if missing:
        raise ValueError(f'{run["path"]}: no {missing} control run of map {key[0]!r} seed '
                         f'{key[1]} (base/ and {labels_setting}/ under {runs_dir!r}).')
      rows.append((run_row(setting, run, controls), run, controls))
  if not rows:
    raise ValueError(f'--settings: no finished softmax-target run of {dataset!r} in '
                     f'{settings} under {runs_dir!r}.')
  return rows


def summarize(rows: List[dict]) -> List[dict]:
  """Means over seeds per (setting, map): held-out KL per layer, accuracies, gains."""
  groups: Dict[tuple, List[dict]] = {}
  for r in rows:
    groups.setdefault((r['setting'], r['map']), []).append(r)
  out = []
  for (setting, fmap), group in groups.items():
    mean = lambda get: float(np.mean([get(r) for r in group]))
    entry = {'setting': setting, 'map': fmap, 'radius': group[0]['radius'],
             'seeds': [r['seed'] for r in group],
             'layers': [{'layer': layer['layer'],
                         'drift_to_noise': mean(lambda r, i=i: r['layers'][i]['drift_to_noise']),
                         'kl': {k: mean(lambda r, i=i, k=k: r['layers'][i]['kl'][k])
                                for k in KL_KINDS}}
                        for i, layer in enumerate(group[0]['layers'])]}
    entry['test_accuracy'] = mean(lambda r: r['test_accuracy'])
    for name in CONTROLS:
      entry[f'{name}_test_accuracy'] = mean(lambda r, n=name: r[f'{n}_test_accuracy'])
      entry[f'minus_{name}_test'] = entry['test_accuracy'] - entry[f'{name}_test_accuracy']
    out.append(entry)
  return sorted(out, key=lambda e: (e['radius'], e['map']))


def markdown(summary: List[dict], meta: dict) -> List[str]:
  """The page block: one row per setting, map and layer."""
  lines = ['| radius | map | layer | KL initial | KL ball | KL learned | drift/noise | '
           'test acc. | − Ball-X (1.5) | − Vanilla-X | − labels target |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
  for e in summary:
    for layer in e['layers']:
      first = layer is e['layers'][0]
      acc = ([f'{e["test_accuracy"]:.4f}'] + [f'{e[f"minus_{n}_test"]:+.4f}' for n in CONTROLS]
             if first else [''] * 4)
      kl = layer['kl']
      lines.append(f'| {e["radius"]:g} | {e["map"]} | {layer["layer"]} | {kl["initial"]:.3f} | '
                   f'{kl["ball"]:.3f} | {kl["learned"]:.3f} | {layer["drift_to_noise"]:.3g} | '
                   + ' | '.join(acc) + ' |')
  seeds = sorted({s for e in summary for s in e['seeds']})
  lines += ['', f'Means over seeds {seeds} (per-run values in `{meta["out"]}`). KL: held-out '
            'attention KL(softmax ‖ linear) of each head on its own queries and keys, mean '
            'over heads and real query tokens of validation rows. Test accuracy on the Rotten '
            'Tomatoes test split; the differences are paired by seed, against runs that share '
            f'the Phase B prefix. Made by `{meta["command"]}` at {meta["commit"]} on '
            f'{meta["machine"]}.']
  return lines




def main(argv):
  module = 'studies.phase_a_repulsion.softmax'
  if len(argv) > 1:
    raise cli.ConfigError(f'unexpected arguments {argv[1:]}.')
  if FLAGS.page_from_results:
    phase_a_repulsion.page_from_results(markdown, BEGIN, END, RUN_FLAGS)
    return
  if FLAGS.runs_from_results:
    phase_a_repulsion.write_from_results(STUDY, module, FLAGS.out,
                                         phase_a_repulsion.runs_out_path(STUDY), 'docs')
    return
  phase_a_repulsion.check_runs_folder(argv)
  phase_a_repulsion.check_outputs()
  runs_out = phase_a_repulsion.runs_out_path(STUDY)
  try:
    found = collect_runs(FLAGS.runs, FLAGS.settings, FLAGS.labels_setting, FLAGS.dataset)
  except (ValueError, FileNotFoundError) as e:
    raise cli.ConfigError(str(e)) from None
  rows = [row for row, _, _ in found]
  records = phase_a_repulsion.folder_records(STUDY, FLAGS.runs, found,
                                             run_files.written_by(module))
  phase_a_repulsion.write_study(module, rows, summarize(rows), markdown, BEGIN, END, records,
                                runs_out)


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.phase_a_repulsion.softmax``."""
  flags.DEFINE_string('runs', 'workdir/repulsion', 'The study folder (setting sub-folders '
                      'and base/ with the Ball-X and Vanilla-X runs).')
  flags.DEFINE_list('settings', ['softmax_coulomb', 'softmax_log_r12'],
                    'Setting folders of the softmax-target runs.')
  flags.DEFINE_string('labels_setting', 'lam1_coulomb', 'Setting folder of the label-target '
                      'runs with the same repulsion.')
  flags.DEFINE_string('dataset', 'rotten_tomatoes', 'Dataset of the runs read.')
  flags.DEFINE_string('out', 'results/phase_a_softmax.json', 'Per-run and summary JSON.')
  flags.DEFINE_string('docs', '', 'Page whose phase-a-softmax block is rewritten (empty: none).')
  flags.DEFINE_bool('allow_fewer', False, 'Replace --out even if it holds runs not found now.')
  phase_a_repulsion.define_run_file_flags(STUDY)
  cli.run(main)


if __name__ == '__main__':
  launch()
