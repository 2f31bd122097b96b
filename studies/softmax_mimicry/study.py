r"""The three parts of the mimicry study, each a resumable JSON file of the workdir.

* ``pilot`` (``<workdir>/pilot.json``): on one encoder (``config.pilot``), every fitted
  method at every N with each candidate step size, scored by the mean
  held-out KL on *training* rows disjoint from the fit rows; the lowest wins. The
  fidelity and conversion use each N's winners (``settings_from``).
* ``fidelity`` (``<workdir>/<dataset>/seed<k>/fidelity.json``): every method × N fitted
  on ``data.fit_rows`` training rows and measured on ``data.heldout_rows`` validation rows
  (``fidelity.heldout_fidelity``), per layer and head; with the fit's first and last
  loss, its seconds and the rows' diversity (``diagnostics.particle_diversity``). The
  rows of the conversion's N are kept as ``rows_<method>_<N>.npy``.
* ``conversion`` (``<workdir>/<dataset>/seed<k>/conversion.json``): the softmax encoder
  and, for every method at each N of ``conversion_features``, the converted encoder on
  the test split, zero-shot and after one fine-tuning epoch (``conversion``); the softmax
  encoder fine-tuned the same way is the control of that extra epoch.

A part whose file exists is not redone (each file is written atomically once complete).
Each part file records the commit and machine it was made at.
Keys: encoder seed k draws every method's rows with ``fold_in(PRNGKey(k), N)`` (shared by
favor_iid, ball and the particles) and fits with ``fold_in(PRNGKey(k + 1000), N)``.
"""

import copy
import json
import os
import time
from typing import Callable

import jax
import numpy as np

from coulomb_jax import diagnostics
from experiments.common import cli
from experiments.common import provenance
from studies.softmax_mimicry import conversion
from studies.softmax_mimicry import encoders
from studies.softmax_mimicry import fidelity
from studies.softmax_mimicry import fit

PILOT_FIELDS = fit.STEP_FIELD   # particles_softmax first: it sets R for the others


def _read(path):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def part_dir(workdir, dataset, seed):
  return os.path.join(workdir, dataset, f'seed{seed}')


def _keys(seed, num_features):
  return (jax.random.fold_in(jax.random.PRNGKey(seed), num_features),
          jax.random.fold_in(jax.random.PRNGKey(seed + 1000), num_features))


def _fit_one(method, encoder, batches, settings, steps, num_features, seed):
  init_key, fit_key = _keys(seed, num_features)
  omega0 = fit.initial(method, init_key, encoders.num_groups(encoder), num_features,
                       encoders.head_dim(encoder), settings.radius)
  return fit.fit(method, fit_key, omega0, batches, settings, steps)


def _fit_batches(config, encoder, seed):
  d = config.data
  rows = encoders.split_rows(encoder, 'train', d.fit_rows, seed)
  return encoders.head_batches(encoder, rows, d.batch_size, d.pad_multiple, seed=seed)


def _candidates(p, method, chosen):
  """The pilot's settings of ``method``: dicts of fields (particles_softmax also R)."""
  field = PILOT_FIELDS[method]
  if method == 'particles_softmax':
    return [{'radius': r, field: v} for r in p.radius for v in p[field]]
  return [dict(chosen, **{field: v}) for v in p[field]]


def run_pilot(config, encoder, path, log: Callable = print) -> dict:
  """``pilot.json``: the held-out KL of every candidate at every N; returns it (existing: read).

  At each N of ``num_features`` separately (a step size that is stable at one N need not
  be at another), particles_softmax goes first and sets R (``pilot.radius``) with its
  step size; the other methods are piloted inside that ball. ``chosen[N]`` holds the
  winners.
  """
  done = _read(path)
  if done is not None:
    return done
  p, d = config.pilot, config.data
  batches = _fit_batches(config, encoder, p.seed)
  rows = encoders.split_rows(encoder, 'train', p.heldout_rows, p.seed, skip=d.fit_rows)
  heldout = encoders.head_batches(encoder, rows, d.batch_size, d.pad_multiple)
  scores, chosen = {}, {}
  for n in config.num_features:
    scores[str(n)], best_n = {}, {}
    for method in PILOT_FIELDS:
      rows_scored = scores[str(n)][method] = []
      for fields in _candidates(p, method, {'radius': best_n.get('radius', config.fit.radius)}):
        settings = copy.deepcopy(config.fit)
        settings.update(fields)
        try:
          omega, _ = _fit_one(method, encoder, batches, settings, config.fit.steps, n, p.seed)
        except FloatingPointError as e:     # a candidate that diverges is never chosen
          rows_scored.append(dict(fields, heldout_kl=None, diverged=str(e)))
          log(f'pilot N={n} {method} {fields}: diverged ({e})')
          continue
        kl = float(np.mean(fidelity.heldout_fidelity(omega, fit.feature_map(method),
                                                     heldout)['kl']))
        rows_scored.append(dict(fields, heldout_kl=kl))
        log(f'pilot N={n} {method} {fields}: held-out KL {kl:.4f}')
      finite = [row for row in rows_scored if row['heldout_kl'] is not None]
      if not finite:
        raise FloatingPointError(f'pilot N={n}: every {method} candidate diverged; lower '
                                 f'config.pilot.{PILOT_FIELDS[method]}.')
      best = min(finite, key=lambda row: row['heldout_kl'])
      best_n.update({k: v for k, v in best.items() if k not in ('heldout_kl', 'diverged')})
    chosen[str(n)] = best_n
  out = {'commit': provenance.git_commit(), 'dataset': p.dataset, 'seed': p.seed,
         'heldout': f'{p.heldout_rows} training rows after the {d.fit_rows} fit rows',
         'scores': scores, 'chosen': chosen}
  provenance.write_json_atomic(path, out, indent=1)
  return out


def settings_from(config, pilot: dict, num_features: int):
  """``config.fit`` with the pilot's choices at ``num_features``."""
  settings = copy.deepcopy(config.fit)
  for field, value in pilot['chosen'][str(num_features)].items():
    settings[field] = value
  return settings


def _diversity(omega):
  """``diagnostics.particle_diversity`` per group of ``omega: [G, M, d]`` (hedgehog: W's rows)."""
  div = diagnostics.particle_diversity(omega)
  return {k: [float(x) for x in np.asarray(v)] for k, v in div.items()}


def run_fidelity(config, pilot, encoder, seed, out_dir, log: Callable = print) -> dict:
  """``fidelity.json`` of one encoder (existing: read)."""
  path = os.path.join(out_dir, 'fidelity.json')
  done = _read(path)
  if done is not None:
    return done
  os.makedirs(out_dir, exist_ok=True)
  d = config.data
  batches = _fit_batches(config, encoder, seed)
  rows = encoders.split_rows(encoder, 'validation', d.heldout_rows, seed)
  heldout = encoders.head_batches(encoder, rows, d.batch_size, d.pad_multiple)
  table = {}
  for method in fit.METHODS:
    table[method] = {}
    for n in config.num_features:
      start = time.time()
      settings = settings_from(config, pilot, n)
      omega, losses = _fit_one(method, encoder, batches, settings, config.fit.steps, n, seed)
      seconds = time.time() - start
      got = fidelity.heldout_fidelity(omega, fit.feature_map(method), heldout)
      table[method][str(n)] = {
          'kl': [float(x) for x in got['kl']],
          'output_error': [float(x) for x in got['output_error']],
          'fit_loss': ([float(np.mean(losses[0])), float(np.mean(losses[-1]))]
                       if len(losses) else None),
          'fit_seconds': seconds, 'rows': int(omega.shape[1]),
          'diversity': _diversity(omega)}
      if n in config.conversion_features:
        np.save(os.path.join(out_dir, f'rows_{method}_{n}.npy'), np.asarray(omega))
      log(f'{encoder.run_dir} {method} N={n}: KL {np.mean(got["kl"]):.4f} output error '
          f'{np.mean(got["output_error"]):.4f} ({seconds:.1f} s)')
  out = {'commit': provenance.git_commit(), 'machine': provenance.machine(),
         'run_dir': provenance.relative_path(encoder.run_dir), 'seed': seed,
         'encoder_commit': encoder.results.get('commit'), 'groups': 'layer * num_heads + head',
         'fit_rows': d.fit_rows, 'heldout_rows': d.heldout_rows, 'methods': table}
  provenance.write_json_atomic(path, out, indent=1)
  return out


def run_conversion(config, encoder, seed, out_dir, log: Callable = print) -> dict:
  """``conversion.json`` of one encoder (needs its ``fidelity.json`` rows; existing: read)."""
  path = os.path.join(out_dir, 'conversion.json')
  done = _read(path)
  if done is not None:
    return done
  missing = [f'rows_{m}_{n}.npy' for m in fit.METHODS for n in config.conversion_features
             if not os.path.isfile(os.path.join(out_dir, f'rows_{m}_{n}.npy'))]
  if missing:
    raise cli.ConfigError(f'{out_dir}: no {missing[0]} (and {len(missing) - 1} more): run '
                          'the fidelity part first (--parts=fidelity,conversion).')
  c = config.conversion
  test = encoder.encoded['test']
  if c.test_rows:
    test = encoders.split_rows(encoder, 'test', min(c.test_rows, len(test.labels)), seed)
  train_rows = encoders.split_rows(
      encoder, 'train', min(c.finetune_rows, len(encoder.encoded['train'].labels)), seed)
  key = jax.random.PRNGKey(seed + 2000)

  def both(model):
    zero = conversion.evaluate(model, encoder.params, test)
    tuned = conversion.finetune(key, model, encoder.params, train_rows, seed=seed,
                                batch_size=c.batch_size, learning_rate=c.learning_rate,
                                pad_multiple=c.pad_multiple)
    return {'zero_shot': zero, 'finetuned': conversion.evaluate(model, tuned, test)}

  start = time.time()
  out = {'commit': provenance.git_commit(), 'machine': provenance.machine(),
         'encoder_commit': encoder.results.get('commit'),
         'run_dir': provenance.relative_path(encoder.run_dir), 'seed': seed,
         'test_rows': len(test.labels), 'finetune_rows': len(train_rows.labels),
         'softmax': both(encoder.model), 'methods': {}}
  log(f'{encoder.run_dir} softmax: {out["softmax"]} ({time.time() - start:.0f} s)')
  for method in fit.METHODS:
    out['methods'][method] = {}
    for n in config.conversion_features:
      start = time.time()
      omega = np.load(os.path.join(out_dir, f'rows_{method}_{n}.npy'))
      model = conversion.converted_model(encoder, omega, fit.feature_map(method))
      out['methods'][method][str(n)] = got = both(model)
      log(f'{encoder.run_dir} {method} N={n}: zero-shot {got["zero_shot"]["accuracy"]:.4f} '
          f'finetuned {got["finetuned"]["accuracy"]:.4f} ({time.time() - start:.0f} s)')
  provenance.write_json_atomic(path, out, indent=1)
  return out
