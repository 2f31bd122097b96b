r"""The synthetic study: learned Coulomb particles against fixed and learned baselines.

  python -m experiments.synthetic --config=configs/synthetic.py --workdir=workdir/synthetic

or, from any folder, ``python path/to/experiments/synthetic.py
--config=path/to/configs/synthetic.py:quick --workdir=...``. A misspelled config
field or variant ends in one line with the suggestion (``experiments.common.cli``).

For every noise level σ and seed it draws train / validation / test sets
(``coulomb_jax.synthetic``) and evaluates:

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

Records are appended to ``records.jsonl`` (``experiments.synthetic_records``) as
each (σ, seed) cell finishes, so a killed run resumes where it stopped; at the
end ``results.json``, ``results.md`` and the figures are written by
``experiments.synthetic_report``. Progress lines (``experiments.common.progress``) name
the cell and method, with elapsed time, rate and ETA; "compiling …" precedes
each first call of a jitted function.
"""

import json
import math
import os
import sys
import time

if __name__ == '__main__' and not __package__:
  # Launched as a file (python path/to/experiments/synthetic.py): the repository root
  # must be importable for `experiments`, `configs` and (uninstalled) `coulomb_jax`.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np
from sklearn import linear_model
from sklearn import metrics
from sklearn import svm

import coulomb_jax as cj
from coulomb_jax import _checks
from coulomb_jax import importance_sampling
from coulomb_jax import repulsion
from coulomb_jax import synthetic
from experiments.common import cli
from experiments.common import progress as progress_lib
from experiments.common import provenance
from experiments import synthetic_records
from experiments import synthetic_report

METHODS = ('logreg', 'rbf_svm', 'mkl', 'rff', 'importance', 'coulomb')


def _scores(predict, split):
  x, y = split
  pred = predict(x)
  return (float(metrics.accuracy_score(y, pred)),
          float(metrics.f1_score(y, pred, pos_label=1, zero_division=0)))


def select_on_validation(make_model, c_grid, train, val, test):
  """Fits one model per C on train, keeps the best validation accuracy, scores test."""
  best = None
  for c in c_grid:
    model = make_model(c).fit(*train)
    val_acc = float(metrics.accuracy_score(val[1], model.predict(val[0])))
    if best is None or val_acc > best[0]:
      best = (val_acc, c, model)
  val_acc, c, model = best
  test_acc, test_f1 = _scores(model.predict, test)
  return {'C': c, 'val_accuracy': val_acc, 'test_accuracy': test_acc, 'test_f1': test_f1}


def linear_classifier(config, feats):
  """L2 logistic regression on features ``feats = {split: (F, y)}``, C on validation."""
  make = lambda c: linear_model.LogisticRegression(C=c, max_iter=config.classifier.max_iter)
  return select_on_validation(make, config.classifier.c_grid, feats['train'], feats['val'],
                              feats['test'])


def _np_splits(splits, transform=lambda x: x):
  return {k: (np.asarray(transform(x)), np.asarray(y)) for k, (x, y) in splits.items()}


def gaussian_kernel(a, b, bandwidth):
  sq = np.sum(a ** 2, 1)[:, None] + np.sum(b ** 2, 1)[None, :] - 2 * a @ b.T
  return np.exp(-np.maximum(sq, 0) / (2 * bandwidth ** 2))


def run_mkl(config, data):
  """Alignment-weighted sum of Gaussian kernels + SVM (precomputed kernel)."""
  x_tr, y_tr = data['train']
  ktr = [gaussian_kernel(x_tr, x_tr, b) for b in config.mkl.bandwidths]
  rho = np.array([float(cj.centered_alignment(k, np.outer(y_tr, y_tr))) for k in ktr])
  mu = np.maximum(rho, 0)
  mu = mu / mu.sum() if mu.sum() > 0 else np.full(len(mu), 1 / len(mu))
  combine = lambda x: sum(m * gaussian_kernel(x, x_tr, b)
                          for m, b in zip(mu, config.mkl.bandwidths))
  feats = {k: (combine(x), y) for k, (x, y) in data.items()}
  make = lambda c: svm.SVC(kernel='precomputed', C=c)
  out = select_on_validation(make, config.mkl.c_grid, feats['train'], feats['val'],
                             feats['test'])
  out['weights'] = [float(m) for m in mu]
  return out


def _timed(fn, warm, shape_key, say, what):
  """(fn(), seconds); the first call per ``shape_key`` compiles (``say`` tells) and is not timed."""
  if shape_key not in warm:
    say(f'compiling {what} …')
    jax.block_until_ready(fn())
    warm.add(shape_key)
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - start


def cell_runs(config):
  """The labels of the runs of one (σ, seed) cell, in the order ``run_cell`` does them.

  A run is one method fitted and scored (for the feature maps: at one budget N, and
  for ``coulomb`` at one λ); ``rff`` includes the bandwidth search that the other
  maps start from, so it is run (and counted) whenever a feature map is.
  """
  runs = [m for m in synthetic_report.BASELINES if m in config.methods]
  if any(m in config.methods for m in ('rff', 'importance', 'coulomb')):
    for n in config.features.budgets:
      runs.append(f'rff N={n}')
      if 'importance' in config.methods:
        runs.append(f'importance N={n}')
      if 'coulomb' in config.methods:
        runs += [f'coulomb N={n} λ={lam:g}' for lam in config.hamiltonian.lams]
  return runs


def run_cell(config, seed, noise_index, warm, on_run=lambda label: None, say=lambda text: None):
  """All methods on one (σ, seed) data set. Returns (records, Langevin histories).

  ``on_run(label)`` is called after each run of ``cell_runs(config)``; ``say(text)``
  before each compilation.
  """
  noise = config.data.noise_levels[noise_index]
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), seed), noise_index)
  data_key, feat_key, run_key = jax.random.split(key, 3)
  dcfg = config.data
  data = _np_splits(synthetic.make_splits(data_key, num_train=dcfg.num_train,
                                          num_val=dcfg.num_val, num_test=dcfg.num_test,
                                          dim=dcfg.dim, noise=noise))
  base = {'noise': noise, 'noise_index': noise_index, 'seed': seed}
  records, histories = [], {}

  def add(method, result, **extra):
    records.append({**base, 'method': method, **extra, **result})

  if 'logreg' in config.methods:
    add('logreg', linear_classifier(config, data))
    on_run('logreg')
  if 'rbf_svm' in config.methods:
    make = lambda c: svm.SVC(kernel='rbf', gamma=config.rbf_svm.gamma, C=c)
    add('rbf_svm', select_on_validation(make, config.rbf_svm.c_grid, data['train'],
                                        data['val'], data['test']))
    on_run('rbf_svm')
  if 'mkl' in config.methods:
    add('mkl', run_mkl(config, data))
    on_run('mkl')
  if not any(m in config.methods for m in ('rff', 'importance', 'coulomb')):
    return records, histories

  x_tr, y_tr = (jnp.asarray(a) for a in data['train'])
  dim = dcfg.dim
  for budget in config.features.budgets:
    z = cj.sample_gaussian(jax.random.fold_in(feat_key, budget), budget, dim)
    # Fixed RFF: the bandwidth (and C) with the best validation accuracy.
    best = None
    for bw in config.features.bandwidths:
      res = linear_classifier(config, _np_splits(data, lambda x: cj.features.rff(x, z / bw)))
      if best is None or res['val_accuracy'] > best[1]['val_accuracy']:
        best = (bw, res)
    bw, res = best
    if 'rff' in config.methods:
      add('rff', res, budget=budget, bandwidth=bw, seconds=0.0)
    on_run(f'rff N={budget}')
    if 'importance' in config.methods:
      nw = config.importance.candidates_factor * budget
      sample = lambda: importance_sampling.importance_sample(
          jax.random.fold_in(run_key, budget), x_tr, y_tr, 2 * budget, num_candidates=nw,
          scale=1.0 / bw, rho=config.importance.rho_factor * nw)
      (w, b, _), secs = _timed(sample, warm, ('importance', budget), say,
                               f'importance sampling (N={budget}, {nw} candidates)')
      feats = _np_splits(data, lambda x: importance_sampling.cosine_features(x, w, b))
      add('importance', linear_classifier(config, feats), budget=budget, bandwidth=bw,
          seconds=secs)
      on_run(f'importance N={budget}')
    if 'coulomb' in config.methods:
      lcfg, hcfg = config.langevin, config.hamiltonian
      omega0 = z / bw
      for lam in hcfg.lams:
        run = lambda: cj.run_langevin(
            jax.random.fold_in(run_key, 1000 + budget), omega0, x_tr, y_tr,
            feature_map='rff', lam=lam, s=hcfg.s, softening=hcfg.softening,
            step_size=lcfg.step_size, beta=lcfg.beta,
            radius=lcfg.radius_scale * math.sqrt(dim) / bw, clip_norm=lcfg.clip_norm,
            batch_size=lcfg.batch_size, num_epochs=lcfg.num_epochs, tol=lcfg.tol)
        (omega, hist), secs = _timed(run, warm, ('coulomb', budget), say,
                                     f'the Langevin run (N={budget} particles)')
        feats = _np_splits(data, lambda x: cj.features.rff(x, omega))
        _, terms = cj.hamiltonian_terms(omega, x_tr, y_tr, feature_map='rff', lam=lam,
                                        s=hcfg.s, softening=hcfg.softening)
        add('coulomb', linear_classifier(config, feats), budget=budget, bandwidth=bw,
            lam=lam, seconds=secs, steps=int(hist.active.sum()),
            final_alignment=float(terms['alignment']),
            final_repulsion=float(terms['repulsion']))
        histories[f'N={budget},lam={lam}'] = {
            k: np.asarray(v).tolist() for k, v in hist._asdict().items()
            if k in ('hamiltonian', 'alignment', 'repulsion', 'max_move')}
        on_run(f'coulomb N={budget} λ={lam:g}')
  return records, histories


def check_config(config):
  """One clear error per bad field, before anything is computed or written."""
  unknown = set(config.methods) - set(METHODS)
  if unknown:
    raise ValueError(f'config.methods: unknown {sorted(unknown)}; known: {list(METHODS)}.')
  d, lcfg, hcfg = config.data, config.langevin, config.hamiltonian
  _checks.check_int('config.data.dim', d.dim, synthetic.MIN_DIM)
  _checks.check_int('config.num_seeds', config.num_seeds, 1)
  for name in ('num_train', 'num_val', 'num_test'):
    _checks.check_int(f'config.data.{name}', d[name], 2)
  for noise in d.noise_levels:
    _checks.check_nonnegative('config.data.noise_levels entry', noise)
  _checks.check_int('config.report.noise_index', config.report.noise_index, 0,
                    len(d.noise_levels) - 1)
  for n in config.features.budgets:
    _checks.check_int('config.features.budgets entry', n, 1)
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
      _checks.check_positive(f'{name} entry', v)
  _checks.check_positive('config.rbf_svm.gamma', config.rbf_svm.gamma)
  _checks.check_int('config.importance.candidates_factor', config.importance.candidates_factor, 1)
  _checks.check_nonnegative('config.importance.rho_factor', config.importance.rho_factor)
  repulsion.resolve_exponent(hcfg.s, d.dim)
  _checks.check_nonnegative('config.hamiltonian.softening', hcfg.softening)
  for name in ('step_size', 'beta', 'radius_scale'):
    _checks.check_positive(f'config.langevin.{name}', lcfg[name])
  if lcfg.clip_norm is not None:
    _checks.check_positive('config.langevin.clip_norm', lcfg.clip_norm)
  _checks.check_int('config.langevin.batch_size', lcfg.batch_size, 2, d.num_train)
  _checks.check_int('config.langevin.num_epochs', lcfg.num_epochs, 1)
  _checks.check_nonnegative('config.langevin.tol', lcfg.tol)


def _fingerprint(config):
  """The config fields that define the records (not the report's choices)."""
  fields = config.to_dict()
  fields.pop('report', None)
  return fields


def run_study(config, workdir):
  """Runs (or resumes) the study; returns the results dict written to results.json.

  A bad config value, or a workdir holding records of another config, raises
  ``cli.ConfigError`` before anything is computed or written.
  """
  try:
    check_config(config)
  except ValueError as e:
    raise cli.ConfigError(str(e)) from None
  meta = synthetic_report.run_metadata()
  config_path = os.path.join(workdir, 'config.json')
  if os.path.exists(config_path):
    with open(config_path) as f:
      if json.load(f) != json.loads(json.dumps(_fingerprint(config))):
        raise cli.ConfigError(f'workdir {workdir!r} holds records of a different config '
                              f'(see {config_path}); use a new --workdir.')
  os.makedirs(workdir, exist_ok=True)
  if not os.path.exists(config_path):
    provenance.write_json_atomic(config_path, _fingerprint(config), indent=1)
  path = os.path.join(workdir, synthetic_records.FILENAME)
  records, done = synthetic_records.load_done(path)
  synthetic_records.rewrite_complete(path, records, done)

  noise_levels = config.data.noise_levels
  cells = [(i, s) for i in range(len(noise_levels)) for s in range(config.num_seeds)]
  runs = cell_runs(config)
  # One line per run at most every 2 s; the compilations and cell summaries always print.
  progress = progress_lib.Progress('synthetic', total=len(cells) * len(runs), unit='run',
                                   done=len(done) * len(runs), every=2.0)
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
    cell_records, cell_hist = run_cell(
        config, seed, noise_index, warm,
        on_run=lambda label: progress.update(f'{where} method {label}'),
        say=lambda text: progress.say(f'{where}: {text}'))
    for r in cell_records:
      r['commit'] = meta['commit']     # a resumed study may hold cells of several commits
    if (noise_index, seed) == trace_cell:
      provenance.write_json_atomic(os.path.join(workdir, 'histories.json'), cell_hist)
    synthetic_records.append_cell(path, cell_records, noise_index, seed)
    records.extend(cell_records)
    progress.say(f'{where} done: {synthetic_report.cell_summary(cell_records)}')
  progress.say('writing results.json, results.md and the figures …')
  results = synthetic_report.write_report(config, records, workdir, meta)
  print(results['markdown_summary'])
  progress.say(f'done in {progress_lib.format_duration(progress.elapsed)}; results in {workdir}')
  return results


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  from experiments.run import train_config  # pylint: disable=g-import-not-at-top
  from experiments.run import train_flags  # pylint: disable=g-import-not-at-top
  path = train_flags.config_file(flags.FLAGS['config'])
  comments = train_flags.field_comments(path) if os.path.isfile(path) else {}
  if flags.FLAGS.list_fields:
    print(train_flags.describe_fields(flags.FLAGS.config, comments))
    return
  if not flags.FLAGS.workdir:
    raise cli.ConfigError('--workdir: required (the folder for records, results and '
                          'figures).')
  # The resolved config (defaults, the variant and every override), as a run sees it.
  print('config:\n' + '\n'.join(f'  {k} = {v!r}' for k, v in
                                 train_config.flat(flags.FLAGS.config).items()), flush=True)
  run_study(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == '__main__':
  # Flags are defined here, not at import, so other scripts can import this module.
  config_flags.DEFINE_config_file('config', None, 'Study config (configs/synthetic.py, or '
                                  'configs/synthetic.py:quick); override any field with '
                                  '--config.<section>.<field>=value.', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Directory for records, results and figures.')
  flags.DEFINE_bool('list_fields', False, 'Print every field of --config with its value and '
                    'comment, and exit.')
  flags.mark_flags_as_required(['config'])
  cli.run(main)
