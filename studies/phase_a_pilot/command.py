r"""Which Phase A settings make the particles learn? Chosen on validation data only.

  python -m studies.phase_a_pilot --runs=workdir/learn --out=results \
      --config.dataset=rotten_tomatoes

(settings: ``studies/phase_a_pilot/config.py``; ``--runs``, ``--workdir`` and ``--out``
are where it reads and writes.)

For every attention feature map it takes the finished (or prefix-saved) Vanilla-X
run ``<runs>/<dataset>/vanilla-<map>/seed<config.seed>`` of the ``after_b`` schedule,
starts from its state at the end of the Phase B epochs before Phase A (its
``prefix``: the encoder Kernel-X's Phase A sees) and runs exactly the Phase A
stages of ``experiments.train`` (``run_setup.run_stage``, layer by layer) under each
named setting of ``SETTINGS`` in ``config.py``. It records the stages' diagnostics
(``phase_a_report.phase_a_report``): drift/noise, repulsion/alignment, Gibbs tilt,
displacement against a noise-only walk, the share of particles inside the ball,
and the held-out (validation rows) alignment A and centered alignment ρ of the
initial, ball-projected and learned particles. No test data is read.

The chosen setting maximises the mean over maps of the held-out gain
ρ(learned) − ρ(ball) (a setting that fails on some map, e.g. a rule that finds no
usable force, is listed with its error and not chosen); it is printed and written with the table
(``phase_a_pilot_<dataset>.{json,md}``). The shuffled-label null is off here
(``phase_a.null_run=False``) to halve the cost; the training runs of the chosen
setting record it.

``--page_from_results`` rewrites only the page ``<--out>/phase_a_pilot_<dataset>.md`` from
the JSON beside it (``markdown``: its rows, gains, choice, command, commit, date and
machine): nothing is run, no run folder read, nothing else written, so the committed page
regenerates from the committed file alone:

  python -m studies.phase_a_pilot --page_from_results --config.dataset=rotten_tomatoes
"""

import json
import os

from absl import flags
import ml_collections
from ml_collections import config_flags
import numpy as np

from configs import text as text_config
from experiments.analysis import loading
from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance
from experiments.run import checkpoints
from experiments.run import phase_a_report
from experiments.run import run_folder
from experiments.run import setup as run_setup
from experiments.run import train_config
from studies.phase_a_pilot import config as pilot_settings

# Refused with --page_from_results: the flags that say which runs the pilot reads and where it
# runs them.
RUN_FLAGS = ('runs', 'workdir')

# The flags (``_define_flags``), set when the command is launched.
_CONFIG = None
_RUNS = None
_WORKDIR = None
_OUT = None
_PAGE_FROM_RESULTS = None


def pilot_config(vanilla_dir: str, feature_map: str, setting: dict,
                 phase_a_epochs: int = 0) -> ml_collections.ConfigDict:
  """The Kernel-X config whose Phase B prefix is ``vanilla_dir``'s, with ``setting``."""
  config = ml_collections.ConfigDict(run_folder.with_added_fields(
      run_folder.read_json(os.path.join(vanilla_dir, 'config.json'))))
  config.variant = f'kernel-{feature_map}'
  config.phase_a.enabled = True
  config.phase_a.null_run = False
  for k, v in setting.items():
    config.phase_a[k] = v
  if phase_a_epochs:
    config.phase_a.num_epochs = phase_a_epochs
  config.run.prefix_from = vanilla_dir
  return config


def run_phase_a(config, workdir) -> dict:
  """Runs the Phase A stages that follow the prefix; returns ``phase_a_report.phase_a_report``."""
  if os.path.exists(os.path.join(workdir, phase_a_report.STAGES_FILE)):
    done = phase_a_report.phase_a_report(workdir)
    if len(done['stages']) == config.model.num_layers:
      return done
  meta = provenance.run_metadata('studies.phase_a_pilot')
  with run_folder.RunFolder(workdir) as folder:
    run, _ = run_setup.setup_run(config, folder, meta)
    if int(run.ckpt['step_b']) == 0:
      raise ValueError(f'--runs: {config.run.prefix_from} has not saved its Phase B prefix '
                       'yet.')
    for index in range(int(run.ckpt['stage']), len(run.stages)):
      if run.stages[index].phase != 'a':
        break
      run_setup.run_stage(run, index)
  return phase_a_report.phase_a_report(workdir)


def _row(report):
  h, ba = report['heldout_centered_alignment'], report['heldout_alignment']
  first = report['stages'][0]['settings']
  return {'drift_to_noise': report['drift_to_noise'],
          'repulsion_to_alignment': report['repulsion_to_alignment'],
          'gibbs_tilt': report['gibbs_tilt'], 'displacement': report['displacement'],
          'random_walk_displacement': report['random_walk_displacement'],
          'inside_fraction': report['inside_fraction'],
          'rho_initial': h['initial'], 'rho_ball': h['ball'], 'rho_learned': h['learned'],
          'rho_gain': h['learned'] - h['ball'], 'a_ball': ba['ball'],
          'a_learned': ba['learned'],
          'per_layer': [{'layer': s['layer'], 'steps': s['steps'], **s['settings'],
                         'rho_ball': s['heldout']['ball']['centered_alignment'],
                         'rho_learned': s['heldout']['learned']['centered_alignment']}
                        for s in report['stages']],
          'step_size_layer0': first['step_size']}


def check_config(config) -> None:
  """One ``cli.ConfigError`` naming the field unless ``config`` is a runnable pilot."""
  if config.dataset not in train_config.DATASETS:
    raise cli.ConfigError(f'--config.dataset: expected one of {sorted(train_config.DATASETS)}, '
                     f'got {config.dataset!r}.')
  cli.check_names('settings', config.settings, pilot_settings.SETTINGS)
  cli.check_names('feature_maps', config.feature_maps, text_config.MAPS)
  if not isinstance(config.phase_a_epochs, int) or config.phase_a_epochs < 0:
    raise cli.ConfigError(f'--config.phase_a_epochs: expected an integer >= 0 (0: the run\'s '
                     f'own), got {config.phase_a_epochs!r}.')


def markdown(record: dict) -> str:
  """The page ``phase_a_pilot_<dataset>.md`` from its JSON ``record`` alone: the choice and its
  setting (``chosen``, ``settings``), the command, commit, date and machine it records, one
  row per setting and map (``rows``; a failed one with its error) and the mean gains
  (``mean_gain``)."""
  chosen = record['chosen']
  lines = [f"# Phase A pilot: {record['dataset']} (validation rows only)", '',
           f"Chosen: **{chosen}** ({json.dumps(record['settings'][chosen])}), the largest "
           'mean over maps of the held-out centered-alignment gain ρ(learned) − ρ(ball).', '',
           f"Command: `{record['command']}`  ", f"Commit: {record['commit']}  ",
           f"Date: {record['date']}  ", f"Machine: {json.dumps(record['machine'])}", '',
           'ρ: centered alignment of each head\'s features with the labels on validation '
           'rows (mean over layers and heads); drift/noise and repulsion/alignment: medians '
           'over particles and steps; tilt: β·ΔU; moved: median displacement, next to a '
           'noise-only walk; inside: share of particles not on the sphere.', '',
           '| setting | map | ρ initial | ρ ball | ρ learned | gain | drift/noise | '
           'rep/align | tilt | moved | walk | inside |', '|' + '---|' * 12]
  for name, maps in record['rows'].items():
    for m, r in maps.items():
      if 'failed' in r:
        lines.append(f"| {name} | {m} | failed: {r['failed']} |" + ' |' * 10)
        continue
      lines.append(
          f"| {name} | {m} | {r['rho_initial']:.4f} | {r['rho_ball']:.4f} | "
          f"{r['rho_learned']:.4f} | {r['rho_gain']:+.4f} | {r['drift_to_noise']:.3g} | "
          f"{r['repulsion_to_alignment']:.3g} | {r['gibbs_tilt']:.3g} | "
          f"{r['displacement']:.3g} | {r['random_walk_displacement']:.3g} | "
          f"{r['inside_fraction']:.2f} |")
  lines += ['', '| setting | mean gain over maps |', '|---|---|']
  lines += [f'| {n} | {g:+.4f} |' for n, g in record['mean_gain'].items()]
  return '\n'.join(lines) + '\n'


def page_from_results(config) -> None:
  """``--page_from_results``: reads ``<--out>/phase_a_pilot_<dataset>.json`` alone and
  rewrites the ``.md`` beside it (``markdown``, replaced atomically); writes nothing else.
  Every refusal comes before the write."""
  cli.refuse_beside_page_from_results('--out', RUN_FLAGS, config, pilot_settings.get_config(),
                                      keep=('dataset',))
  stem = f'phase_a_pilot_{config.dataset}'
  loading.rewrite_page_beside(_OUT.value, stem, markdown)


def main(argv):
  del argv
  config = _CONFIG.value
  check_config(config)
  if _PAGE_FROM_RESULTS.value:
    page_from_results(config)
    return
  dataset = config.dataset
  # Every output path before any compute (issue 39 item 1).
  outputs.check_folder('--workdir', _WORKDIR.value)
  outputs.check_folder('--out', _OUT.value)
  outputs.check_files_in('--out', _OUT.value, [f'phase_a_pilot_{dataset}.json',
                                               f'phase_a_pilot_{dataset}.md'])
  vanilla = {m: train_config.run_dir(_RUNS.value, dataset, f'vanilla-{m}', config.seed)
             for m in config.feature_maps}
  for m, d in vanilla.items():
    if not run_folder.RunFolder(d).exists(checkpoints.PREFIX):
      raise cli.ConfigError(f'--runs: {d} has no saved Phase B prefix ({checkpoints.PREFIX}/).')
  rows = {}
  for name in config.settings:
    for m in config.feature_maps:
      run_config = pilot_config(vanilla[m], m, pilot_settings.SETTINGS[name],
                                config.phase_a_epochs)
      workdir = os.path.join(_WORKDIR.value, dataset, name, m)
      try:
        rows.setdefault(name, {})[m] = r = _row(run_phase_a(run_config, workdir))
      except ValueError as e:      # A setting that cannot run here (e.g. no usable force).
        rows.setdefault(name, {})[m] = {'failed': str(e)}
        print(f'{name} {m}: failed: {e}', flush=True)
        continue
      print(f"{name} {m}: ρ ball {r['rho_ball']:.4f} learned {r['rho_learned']:.4f} "
            f"drift/noise {r['drift_to_noise']:.3g} tilt {r['gibbs_tilt']:.3g}", flush=True)
  gains = {name: float(np.mean([r['rho_gain'] for r in maps.values()]))
           for name, maps in rows.items() if all('failed' not in r for r in maps.values())}
  chosen = max(gains, key=gains.get)
  meta = provenance.run_metadata('studies.phase_a_pilot')
  record = dict(meta, dataset=dataset, seed=config.seed, runs=_RUNS.value,
                config=config.to_dict(),
                settings={n: pilot_settings.SETTINGS[n] for n in rows}, mean_gain=gains,
                chosen=chosen, rows=rows)
  text = markdown(record)
  os.makedirs(_OUT.value, exist_ok=True)
  stem = os.path.join(_OUT.value, f'phase_a_pilot_{dataset}')
  provenance.write_json_atomic(stem + '.json', record, indent=1)
  provenance.write_atomic(stem + '.md', text)
  print(text, end='')



def _define_flags() -> None:
  """The command-line flags (defined by ``launch``, not at import: studies import side by side)."""
  global _CONFIG, _RUNS, _WORKDIR, _OUT, _PAGE_FROM_RESULTS  # pylint: disable=global-statement
  _CONFIG = config_flags.DEFINE_config_file('config', 'studies/phase_a_pilot/config.py',
                                            'The pilot\'s settings.', lock_config=True)
  _RUNS = flags.DEFINE_string('runs', 'workdir/learn', 'Grid root of the after_b Vanilla-X runs.')
  _WORKDIR = flags.DEFINE_string('workdir', 'workdir/phase_a_pilot', 'Scratch folder.')
  _OUT = flags.DEFINE_string('out', 'results', 'Output folder.')
  _PAGE_FROM_RESULTS = flags.DEFINE_bool(
      'page_from_results', False, 'Only rewrite the page <out>/phase_a_pilot_<dataset>.md from '
      'the JSON beside it; nothing else is read, written or run.')


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.phase_a_pilot``."""
  _define_flags()
  cli.run(main)
