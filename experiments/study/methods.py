r"""The methods of the synthetic study, fitted and scored on one (σ, seed) cell.

``run_cell`` draws a cell's train / validation / test sets (``coulomb_jax.tasks.synthetic``)
and runs every method of ``config.methods`` on them (``experiments/synthetic.py``'s
docstring says what each is): the baselines (``logreg``, ``rbf_svm``, ``mkl``) and,
per feature budget N, the feature maps (``rff``, ``importance``, ``coulomb``), each
followed by the same L2 logistic regression with C chosen on validation
(``linear_classifier``). ``cell_runs`` lists the runs of a cell in that order.
"""

import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from sklearn import linear_model
from sklearn import metrics
from sklearn import svm

import coulomb_jax as cj
from coulomb_jax.baselines import importance_sampling
from coulomb_jax.tasks import synthetic
from experiments.study import tables

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


def np_splits(splits, transform=lambda x: x):
  """``{split: (x, y)}`` as numpy arrays, ``x`` through ``transform``."""
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
  runs = [m for m in tables.BASELINES if m in config.methods]
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
  data = np_splits(synthetic.make_splits(data_key, num_train=dcfg.num_train,
                                         num_val=dcfg.num_val, num_test=dcfg.num_test,
                                         dim=dcfg.dim, noise=noise))
  base = {'noise': noise, 'noise_index': noise_index, 'seed': seed}
  records, histories = [], {}

  def add(method, result, **extra):
    records.append({**base, 'method': method, **extra, **result})

  _baselines(config, data, add, on_run)
  if not any(m in config.methods for m in ('rff', 'importance', 'coulomb')):
    return records, histories
  for budget in config.features.budgets:
    _feature_maps(config, data, budget, feat_key, run_key, warm, add, histories, on_run, say)
  return records, histories


def _baselines(config, data, add, on_run):
  """``logreg``, ``rbf_svm`` and ``mkl`` (those in ``config.methods``) on one cell."""
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


def _feature_maps(config, data, budget, feat_key, run_key, warm, add, histories, on_run, say):
  """``rff`` (with its bandwidth search), ``importance`` and ``coulomb`` at one budget N."""
  x_tr, y_tr = (jnp.asarray(a) for a in data['train'])
  dim = config.data.dim
  z = cj.sample_gaussian(jax.random.fold_in(feat_key, budget), budget, dim)
  # Fixed RFF: the bandwidth (and C) with the best validation accuracy.
  best = None
  for bw in config.features.bandwidths:
    res = linear_classifier(config, np_splits(data, lambda x: cj.features.rff(x, z / bw)))
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
    feats = np_splits(data, lambda x: importance_sampling.cosine_features(x, w, b))
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
      feats = np_splits(data, lambda x: cj.features.rff(x, omega))
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
