r"""Drift against noise in Phase A: how far the alignment pulls a particle per step.

  python -m studies.phase_a_drift --out=results --config.dataset=rotten_tomatoes

(settings: ``studies/phase_a_drift/config.py``; ``--data_dir``, ``--workdir``, ``--out``
and ``--trained_runs`` are where it reads and writes.)

For each attention feature map, the Kernel-X model of ``configs/<dataset>.py`` is
built as ``experiments/train.py`` builds it (same seed, data, tokenizer and
initialisation), and its particles are projected onto the Phase A ball, where
the first Langevin step puts them. On the first ``config.batches`` Phase A batches it
measures, for every particle k of every layer and head, the deterministic part of
one step of ``langevin.langevin_step``

.. math::
   d_k = η·N·‖\mathrm{clip}(∇H)_k‖

(global-norm clip over all particles, as in ``langevin_transform``) against the
noise of one step, σ = √(2η/β)·√D_h (the root-mean-square norm of √(2η/β)ξ,
ξ ~ N(0, I_{D_h})). It reports the median, mean and 90th percentile of d_k, the
per-step ratio median(d)/σ, the Phase A length T (steps at the config's epochs),
the ratio of the drift accumulated over T steps to the noise accumulated over
them, T·median(d) / (σ·√T), and β* = 2η·D_h / median(d)², the β at which drift
and noise per step are equal. The representations are those of the randomly
initialised encoder, as in Phase A. Writes ``phase_a_drift_<dataset>.json`` and
``.md`` with the command, commit and machine.

``--trained_runs=<grid root>`` asks the counterfactual instead: what if Phase A
saw *trained* representations? For each map it takes the finished Vanilla-X run
``<root>/<dataset>/vanilla-<map>/seed<config.trained_seed>`` (its kept,
best-validation parameters and its tokenizer), projects its random particles
onto the ball and measures the same statistics on its encoder. Writes
``phase_a_drift_<dataset>_trained.{json,md}``.

``--page_from_results`` rewrites only the page, ``<--out>/phase_a_drift_<dataset>[_trained].md``
(``_trained`` with ``--trained_runs``, whose folder is then not read), from the JSON beside it
(``markdown``: its numbers, command, commit, date and machine): nothing is computed, no data
or run folder read, nothing else written, so the committed page regenerates from the
committed file alone:

  python -m studies.phase_a_drift --page_from_results --config.dataset=rotten_tomatoes
  python -m studies.phase_a_drift --page_from_results --config.dataset=sst2 \
      --trained_runs=workdir/grid
"""

import json
import os

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from ml_collections import config_flags

from configs import text as text_config
from coulomb_jax import langevin
from coulomb_jax import training
from coulomb_jax.tasks import data
from experiments.analysis import loading
from experiments.common import cli
from experiments.common import outputs
from experiments.common import provenance
from experiments.run import run_folder
from experiments.run import setup as run_setup
from experiments.run import stages
from experiments.run import train_config
from studies.phase_a_drift import config as drift_config

# Refused with --page_from_results: the flags that say where the measurement reads data.
RUN_FLAGS = ('data_dir', 'workdir')

# The flags (``_define_flags``), set when the command is launched.
_CONFIG = None
_DATA_DIR = None
_WORKDIR = None
_OUT = None
_TRAINED_RUNS = None
_PAGE_FROM_RESULTS = None


def _config(dataset, feature_map):
  import importlib  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(train_config.DATASETS[dataset][:-3].replace('/', '.'))
  config = module.get_config(f'kernel-{feature_map}')
  config.data.data_dir = _DATA_DIR.value
  return config


def _check_finished(run_dir):
  if not run_folder.RunFolder(run_dir).exists(run_folder.RESULTS):
    raise cli.ConfigError(f'--trained_runs: {run_dir} has no {run_folder.RESULTS} (not a '
                          'finished run).')


def trained_params(run_dir):
  """The kept (best-validation) parameters of a finished ``experiments.train`` run."""
  _check_finished(run_dir)
  return run_folder.RunFolder(run_dir).latest_checkpoint()['best_params']


def drift_stats(config, encoded, vocab_size, num_batches, params=None):
  """Statistics of d_k over particles × batches (see the module docstring).

  ``params``: the model's parameters (default: ``train.py``'s initialisation);
  their particles are projected onto the ball either way.
  """
  train_config.check_config(config)
  a, d = config.phase_a, config.data
  model = run_setup.make_model(config, vocab_size)
  if params is None:
    init_key = jax.random.split(jax.random.PRNGKey(config.seed), 3)[0]  # As train.py.
    example = next(data.batches(encoded['train'], 2, pad_multiple=d.pad_multiple))
    params = model.init(init_key, example['ids'], example['segments'],
                        example['mask'])['params']
  flat = traverse_util.flatten_dict(params)
  params = traverse_util.unflatten_dict(
      {k: langevin.project_to_ball(v, a.radius) if k[-1] == training.PARTICLES else v
       for k, v in flat.items()})
  riesz_s = a.riesz_s if a.riesz_s == 'coulomb' else float(a.riesz_s)

  @jax.jit
  def drifts(params, batch):
    inputs = training.phase_a_inputs(model, params, batch)
    grads, aux = jax.grad(training.phase_a_objective, has_aux=True)(
        params, inputs, batch['labels'], batch['weights'], feature_map=config.model.feature_map,
        lam=a.lam, s=riesz_s, softening=a.softening)
    grads = {k: v for k, v in traverse_util.flatten_dict(grads).items()
             if k[-1] == training.PARTICLES}
    grads = langevin.clip_by_global_norm(grads, a.clip_norm)
    per_particle = [a.step_size * g.shape[-2] * jnp.linalg.norm(g, axis=-1).ravel()
                    for g in grads.values()]
    return jnp.concatenate(per_particle), aux['alignment']

  n_train = len(encoded['train'].labels)
  steps_per_epoch = data.num_batches(n_train, a.batch_size, drop_remainder=True)
  it = stages.train_batches(encoded['train'], a.batch_size, config.seed, 0, steps_per_epoch, d)
  values, alignments = [], []
  for _, batch in zip(range(num_batches), it):
    dk, align = drifts(params, batch)
    values.append(np.asarray(dk))
    alignments.append(float(align))
  dk = np.concatenate(values)
  head_dim = config.model.width // config.model.num_heads
  sigma = float(np.sqrt(2.0 * a.step_size / a.beta * head_dim))
  median = float(np.median(dk))
  steps = steps_per_epoch * a.num_epochs
  return {'drift_median': median, 'drift_mean': float(dk.mean()),
          'drift_p90': float(np.quantile(dk, 0.9)), 'noise': sigma,
          'ratio_per_step': median / sigma, 'phase_a_steps': steps,
          'ratio_over_phase_a': median * steps / (sigma * np.sqrt(steps)),
          'beta_star': 2.0 * a.step_size * head_dim / max(median ** 2, 1e-30),
          'alignment_mean': float(np.mean(alignments)), 'particles': int(dk.size // num_batches),
          'batches': num_batches}


def check_config(config) -> None:
  """One ``cli.ConfigError`` naming the field unless ``config`` can be measured."""
  if config.dataset not in train_config.DATASETS:
    raise cli.ConfigError(f'--config.dataset: expected one of '
                          f'{sorted(train_config.DATASETS)}, got {config.dataset!r}.')
  cli.check_names('feature_maps', config.feature_maps, text_config.MAPS)
  if not isinstance(config.batches, int) or config.batches < 1:
    raise cli.ConfigError(f'--config.batches: expected an integer >= 1, got '
                          f'{config.batches!r}.')


def _stem(dataset: str, trained: bool) -> str:
  """The name of the JSON and page, without ``.json`` / ``.md``."""
  return f'phase_a_drift_{dataset}' + ('_trained' if trained else '')


def _trained_from(record: dict):
  """``(grid root, seed)`` of the Vanilla-X runs a trained record was measured on, from the
  run folders it names (``train_config.run_dir``: ``<root>/<dataset>/vanilla-<map>/seed<k>``)."""
  run_dir = next(iter(record['trained_runs'].values()))
  root = os.path.dirname(os.path.dirname(os.path.dirname(run_dir)))
  return root, os.path.basename(run_dir)[len('seed'):]


def markdown(record: dict) -> str:
  """The page ``phase_a_drift_<dataset>[_trained].md`` from its JSON ``record`` alone: the
  title and representations (``representations``, the run folders of ``trained_runs``), the
  command, commit, date and machine it records, its settings, the batches (the rows'
  ``batches``) and one table row per map."""
  rows, dataset = record['maps'], record['dataset']
  batches = next(iter(rows.values()))['batches']
  trained = record['representations'] == 'trained'
  if trained:
    root, seed = _trained_from(record)
    where = (f'the trained encoders of the finished Vanilla-X runs (best-validation '
             f'parameters, seed {seed}: `{root}/{dataset}/vanilla-<map>/seed{seed}`), their '
             'random particles projected onto the ball')
  else:
    where = "the initialised encoder (as train.py), particles projected onto the ball"
  title = 'trained encoders' if trained else 'at initialisation'
  lines = [f'# Phase A drift against noise: {dataset}, {title}', '',
           f"Command: `{record['command']}`  ", f"Commit: {record['commit']}  ",
           f"Date: {record['date']}  ", f"Machine: {json.dumps(record['machine'])}", '',
           f"Settings (the config defaults): {json.dumps(record['settings'])}; "
           f'representations: {where}; drift d = η·N·‖clip(∇H)_k‖ per particle over {batches} '
           'Phase A batches; noise σ = √(2η/β)·√D_h per step.', '',
           '| map | median d | mean d | 90% d | σ | median d / σ | T steps | '
           'T·d / (σ·√T) | β* (d = σ) | mean alignment |',
           '|---|---|---|---|---|---|---|---|---|---|']
  for m, r in rows.items():
    lines.append(f"| {m} | {r['drift_median']:.2e} | {r['drift_mean']:.2e} | "
                 f"{r['drift_p90']:.2e} | {r['noise']:.3f} | {r['ratio_per_step']:.2e} | "
                 f"{r['phase_a_steps']} | {r['ratio_over_phase_a']:.2e} | "
                 f"{r['beta_star']:.2e} | {r['alignment_mean']:.4f} |")
  return '\n'.join(lines) + '\n'


def page_from_results(config) -> None:
  """``--page_from_results``: reads ``<--out>/phase_a_drift_<dataset>[_trained].json`` alone
  and rewrites the ``.md`` beside it (``markdown``, replaced atomically); writes nothing
  else. Every refusal comes before the write."""
  cli.refuse_beside_page_from_results('--out', RUN_FLAGS, config, drift_config.get_config(),
                                      keep=('dataset',))
  stem = _stem(config.dataset, bool(_TRAINED_RUNS.value))
  loading.rewrite_page_beside(_OUT.value, stem, markdown)


def main(argv):
  del argv
  config = _CONFIG.value
  check_config(config)
  if _PAGE_FROM_RESULTS.value:
    page_from_results(config)
    return
  dataset = config.dataset
  trained = bool(_TRAINED_RUNS.value)
  run_dirs = {m: train_config.run_dir(_TRAINED_RUNS.value, dataset, f'vanilla-{m}',
                                      config.trained_seed)
              for m in config.feature_maps} if trained else {}
  for run_dir in run_dirs.values():   # Every run is there before anything is computed.
    _check_finished(run_dir)
  # Every output path before any compute (issue 39 item 1).
  outputs.check_folder('--workdir', os.path.join(_WORKDIR.value, dataset))
  outputs.check_folder('--out', _OUT.value)
  stem = _stem(dataset, trained)
  outputs.check_files_in('--out', _OUT.value, [stem + '.json', stem + '.md'])
  workdir = os.path.join(_WORKDIR.value, dataset)
  os.makedirs(workdir, exist_ok=True)
  # The data and tokenizer do not depend on the feature map: load them once (a trained
  # run: its own tokenizer).
  if not trained:
    encoded, vocab_size = run_setup.load_data(_config(dataset, config.feature_maps[0]),
                                         run_folder.RunFolder(workdir))
  rows = {}
  for feature_map in config.feature_maps:
    run_config, params = _config(dataset, feature_map), None
    if trained:
      run_config.seed = config.trained_seed
      folder = run_folder.RunFolder(run_dirs[feature_map])
      encoded, vocab_size = run_setup.load_data(run_config, folder)
      params = trained_params(folder.path)
    rows[feature_map] = drift_stats(run_config, encoded, vocab_size, config.batches, params)
    print(feature_map, json.dumps(rows[feature_map]), flush=True)
  a = _config(dataset, config.feature_maps[0]).phase_a
  settings = {k: a[k] for k in ('step_size', 'beta', 'lam', 'clip_norm', 'radius',
                                'batch_size', 'num_epochs')}
  meta = provenance.run_metadata('studies.phase_a_drift')
  record = dict(meta, dataset=dataset, config=config.to_dict(), settings=settings, maps=rows,
                representations='trained' if trained else 'initialisation',
                trained_runs=run_dirs)
  text = markdown(record)
  os.makedirs(_OUT.value, exist_ok=True)
  stem = os.path.join(_OUT.value, stem)
  provenance.write_json_atomic(stem + '.json', record, indent=1)
  provenance.write_atomic(stem + '.md', text)
  print(text, end='')



def _define_flags() -> None:
  """The command-line flags (defined by ``launch``, not at import: studies import side by side)."""
  global _CONFIG, _DATA_DIR, _WORKDIR, _OUT  # pylint: disable=global-statement
  global _TRAINED_RUNS, _PAGE_FROM_RESULTS  # pylint: disable=global-statement
  _CONFIG = config_flags.DEFINE_config_file('config', 'studies/phase_a_drift/config.py',
                                            'The measurement\'s settings.', lock_config=True)
  _DATA_DIR = flags.DEFINE_string('data_dir', '../shared/data', 'The data folder.')
  _WORKDIR = flags.DEFINE_string('workdir', 'workdir/phase_a_drift',
                                 'Where the tokenizer is trained once and kept.')
  _OUT = flags.DEFINE_string('out', 'results', 'Output folder.')
  _TRAINED_RUNS = flags.DEFINE_string('trained_runs', '', 'A grid root: measure on the trained '
                                      'encoders of its vanilla-<map> runs (see the docstring).')
  _PAGE_FROM_RESULTS = flags.DEFINE_bool(
      'page_from_results', False, 'Only rewrite the page <out>/phase_a_drift_<dataset>'
      '[_trained].md from the JSON beside it (--trained_runs: the _trained one, its folder '
      'not read); nothing else is read, written or computed.')


def launch() -> None:
  """Defines the flags and runs the command: ``python -m studies.phase_a_drift``."""
  _define_flags()
  cli.run(main)
