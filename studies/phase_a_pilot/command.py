r"""Which Phase A settings make the particles learn? Chosen on validation data only.

  python -m studies.phase_a_pilot --runs=workdir/learn --dataset=rotten_tomatoes \
      --out=results/phase_a_pilot

For every attention feature map it takes the finished (or prefix-saved) Vanilla-X
run ``<runs>/<dataset>/vanilla-<map>/seed<--seed>`` of the ``after_b`` schedule,
starts from its state at the end of the Phase B epochs before Phase A (its
``prefix``: the encoder Kernel-X's Phase A sees) and runs exactly the Phase A
stages of ``experiments.train`` (``run_setup.run_stage``, layer by layer) under each
named setting of ``SETTINGS``. It records the stages' diagnostics
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
"""

import json
import os

from absl import flags
import ml_collections
import numpy as np

from configs import text as text_config
from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance
from experiments.run import checkpoints
from experiments.run import phase_a_report
from experiments.run import run_folder
from experiments.run import setup as run_setup
from experiments.run import train_config

# Named settings: config.phase_a overrides on top of the Vanilla-X run's config.
_LEARN = dict(relative_step=0.01, gibbs_tilt=1e3, relative_lam=0.0)
SETTINGS = {
    # The paper's fixed η = 2e-3, β = 50, λ = 1e-3, s = d − 2 (as the config defaults).
    'paper': dict(relative_step=0.0, gibbs_tilt=0.0, relative_lam=0.0),
    'learn': _LEARN,
    'step_0.003': dict(_LEARN, relative_step=0.003),
    'step_0.03': dict(_LEARN, relative_step=0.03),
    'tilt_1e2': dict(_LEARN, gibbs_tilt=1e2),
    'tilt_1e4': dict(_LEARN, gibbs_tilt=1e4),
    'repel_log': dict(_LEARN, relative_lam=1.0, riesz_s='0.0'),
    'repel_s1': dict(_LEARN, relative_lam=1.0, riesz_s='1.0'),
    'repel_coulomb': dict(_LEARN, relative_lam=1.0, riesz_s='coulomb'),
    'radius_3': dict(_LEARN, radius=3.0),
}

# The flags (``_define_flags``), set when the command is launched.
_RUNS = None
_DATASET = None
_SEED = None
_MAPS = None
_SETTINGS = None
_EPOCHS = None
_WORKDIR = None
_OUT = None


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


def main(argv):
  del argv
  dataset = _DATASET.value
  if dataset not in train_config.DATASETS:
    raise ValueError(f'--dataset: expected one of {sorted(train_config.DATASETS)}, got {dataset!r}.')
  bad = [s for s in _SETTINGS.value if s not in SETTINGS]
  if bad:
    raise ValueError(f'--settings: {bad} not in {list(SETTINGS)}.')
  bad = [m for m in _MAPS.value if m not in text_config.MAPS]
  if bad:
    raise ValueError(f'--feature_maps: {bad} not in {text_config.MAPS}.')
  # Every output path before any compute (issue 39 item 1).
  outputs.check_folder('--workdir', _WORKDIR.value)
  outputs.check_folder('--out', _OUT.value)
  outputs.check_files_in('--out', _OUT.value, [f'phase_a_pilot_{dataset}.json',
                                               f'phase_a_pilot_{dataset}.md'])
  vanilla = {m: train_config.run_dir(_RUNS.value, dataset, f'vanilla-{m}', _SEED.value)
             for m in _MAPS.value}
  for m, d in vanilla.items():
    if not run_folder.RunFolder(d).exists(checkpoints.PREFIX):
      raise ValueError(f'--runs: {d} has no saved Phase B prefix ({checkpoints.PREFIX}/).')
  rows = {}
  for name in _SETTINGS.value:
    for m in _MAPS.value:
      config = pilot_config(vanilla[m], m, SETTINGS[name], _EPOCHS.value)
      workdir = os.path.join(_WORKDIR.value, dataset, name, m)
      try:
        rows.setdefault(name, {})[m] = r = _row(run_phase_a(config, workdir))
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
  record = dict(meta, dataset=dataset, seed=_SEED.value, runs=_RUNS.value,
                settings={n: SETTINGS[n] for n in rows}, mean_gain=gains, chosen=chosen,
                rows=rows)
  lines = [f'# Phase A pilot: {dataset} (validation rows only)', '',
           f'Chosen: **{chosen}** ({json.dumps(SETTINGS[chosen])}), the largest mean over maps '
           'of the held-out centered-alignment gain ρ(learned) − ρ(ball).', '',
           f"Command: `{meta['command']}`  ", f"Commit: {meta['commit']}  ",
           f"Date: {meta['date']}  ", f"Machine: {json.dumps(meta['machine'])}", '',
           'ρ: centered alignment of each head\'s features with the labels on validation '
           'rows (mean over layers and heads); drift/noise and repulsion/alignment: medians '
           'over particles and steps; tilt: β·ΔU; moved: median displacement, next to a '
           'noise-only walk; inside: share of particles not on the sphere.', '',
           '| setting | map | ρ initial | ρ ball | ρ learned | gain | drift/noise | '
           'rep/align | tilt | moved | walk | inside |', '|' + '---|' * 12]
  for name, maps in rows.items():
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
  lines += [f'| {n} | {g:+.4f} |' for n, g in gains.items()]
  os.makedirs(_OUT.value, exist_ok=True)
  stem = os.path.join(_OUT.value, f'phase_a_pilot_{dataset}')
  provenance.write_json_atomic(stem + '.json', record, indent=1)
  provenance.write_atomic(stem + '.md', '\n'.join(lines) + '\n')
  print('\n'.join(lines))



def _define_flags() -> None:
  """The command-line flags (defined by ``launch``, not at import: studies import side by side)."""
  global _RUNS, _DATASET, _SEED, _MAPS, _SETTINGS, _EPOCHS, _WORKDIR, _OUT  # pylint: disable=global-statement
  _RUNS = flags.DEFINE_string('runs', 'workdir/learn', 'Grid root of the after_b Vanilla-X runs.')
  _DATASET = flags.DEFINE_string('dataset', 'rotten_tomatoes', f'One of {sorted(train_config.DATASETS)}.')
  _SEED = flags.DEFINE_integer('seed', 0, 'Seed of the Vanilla-X runs.')
  _MAPS = flags.DEFINE_list('feature_maps', list(text_config.MAPS), 'Maps.')
  _SETTINGS = flags.DEFINE_list('settings', list(SETTINGS), f'From {list(SETTINGS)}.')
  _EPOCHS = flags.DEFINE_integer('phase_a_epochs', 0, 'Phase A epochs per layer (0: the '
                                 "Vanilla-X run's config value).")
  _WORKDIR = flags.DEFINE_string('workdir', 'workdir/phase_a_pilot', 'Scratch folder.')
  _OUT = flags.DEFINE_string('out', 'results', 'Output folder.')


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.phase_a_pilot``."""
  _define_flags()
  cli.run(main, config_flags=())
