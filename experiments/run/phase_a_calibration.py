"""The calibration of a Phase A stage at its start (``calibrate``): λ, β and η from the fixed
config values or from the rules ``phase_a.relative_lam``, ``gibbs_tilt`` and
``relative_step``, and each head's potential range ΔU; with the helpers the stage's
held-out statistics share (each stage's key, the objective's settings, means over token
batches). ``experiments.run.phase_a`` runs the stage.
"""

import jax
import jax.numpy as jnp
import numpy as np

from coulomb_jax import langevin_diagnostics as ld
from coulomb_jax import training
from coulomb_jax.tasks import data
from coulomb_jax.training import phase_a_mimicry
from experiments.common import cli
from experiments.run import evaluation
from experiments.run import stages

# Probe points (besides the particles) where the one-particle potential's range is read.
NUM_PROBES = 1024
# The offset of the key the probes draw (never the dynamics' own keys).
_PROBE_KEY = 1 << 20


def stage_key(run: stages.Run, stage) -> jax.Array:
  """The Langevin noise key of a Phase A stage: the run's key for the joint stage,
  ``fold_in(key, layer + cycle·L)`` for one layer (layer l of the first pass:
  ``fold_in(key, l)``, as the layer-wise schedule always had)."""
  if stage.layer is None:
    return run.langevin_key
  return jax.random.fold_in(run.langevin_key, stage.layer + stage.cycle * len(run.paths))


def objective_settings(config, lam):
  a = config.phase_a
  riesz_s = a.riesz_s if a.riesz_s == 'coulomb' else float(a.riesz_s)
  return dict(feature_map=config.model.feature_map, lam=lam, s=riesz_s, softening=a.softening)


def softmax_target(config) -> bool:
  return config.phase_a.target == 'softmax'


def token_batches(rows, config):
  """Padded token batches of ``rows`` of ``phase_a.batch_size`` (fixed order and padding)."""
  d = config.data
  return data.batches(rows, config.phase_a.batch_size, seed=0, pad_multiple=d.pad_multiple,
                      bucket_size=d.bucket_size)


def token_mean(run, rows, fn, params):
  """``fn(params, batch) -> (tree, n)`` averaged over the batches of ``rows`` with weights n
  (the real query tokens), on the host."""
  total, count = None, 0.0
  for batch in token_batches(rows, run.config):
    tree, n = jax.device_get(fn(params, run.sharder.batch(batch)))
    tree = jax.tree.map(lambda x: np.asarray(x, np.float64) * float(n), tree)
    total = tree if total is None else jax.tree.map(np.add, total, tree)
    count += float(n)
  return jax.tree.map(lambda x: (x / max(count, 1.0)).astype(np.float32), total)


def mimicry_fn(run, paths, statistic):
  """Jitted ``(params, batch) -> (statistic(params, inputs, mask), Σ mask)`` on the queries
  and keys of ``paths`` (``phase_a_mimicry.mimicry_inputs``; the layers above are not computed)."""
  paths = [tuple(p) for p in paths]

  def fn(params, batch):
    inputs = phase_a_mimicry.mimicry_inputs(run.model, params, batch)
    mask = phase_a_mimicry.token_mask(batch)
    return statistic(params, {p: inputs[p] for p in paths}, mask), jnp.sum(mask)

  return jax.jit(fn)


def _calibrate_softmax(run, stage, params, rows) -> dict:
  """``calibrate`` for the softmax target: forces and potentials averaged over token batches."""
  a, fm = run.config.phase_a, run.config.model.feature_map
  only = stages.only_path(run, stage)
  kw = objective_settings(run.config, 1.0)
  probe_key = jax.random.fold_in(stage_key(run, stage), _PROBE_KEY)

  def statistic(p, inputs, mask):
    forces = phase_a_mimicry.phase_a_mimicry_forces(p, inputs, mask, only=only, **kw)
    potentials = phase_a_mimicry.phase_a_mimicry_potentials(
        probe_key, p, inputs, mask, feature_map=fm, radius=a.radius, num_probes=NUM_PROBES,
        only=only)
    return {k: forces[k] for k in ('cross_entropy', 'repulsion')}, potentials

  unit, potentials = token_mean(run, rows, mimicry_fn(run, stages.stage_paths(run, stage),
                                                        statistic), params)
  lam = _relative_lam(a, unit['repulsion'], unit['cross_entropy'])
  grad_h = {p: unit['cross_entropy'][p] + lam * unit['repulsion'][p] for p in unit['repulsion']}
  ranges = {'/'.join(p): [float(x) for x in np.asarray(ld.potential_range(u))]
            for p, u in potentials.items()}
  return {'lam': lam, 'ranges': ranges, 'grad_h': grad_h}


def calibrate(run: stages.Run, index: int, stage, params) -> dict:
  """λ, β, η of the stage and each head's potential range ΔU, at ``params`` projected.

  On ``phase_a.calibration_rows`` fixed training rows (deterministic, so a resumed
  stage recomputes the same values). Fixed config values unless a rule is on:
  λ = relative_lam·median‖∇A_k‖/median‖∇W_k‖; β = gibbs_tilt / median ΔU;
  η such that the median drift is relative_step·R. The softmax target: ∇CE in place of
  ∇A and the first variation of CE as the potential, on token batches of
  ``phase_a.batch_size`` (``_calibrate_softmax``).
  """
  a = run.config.phase_a
  paths = stages.stage_paths(run, stage)
  only = stages.only_path(run, stage)
  params = stages.projected(params, paths, a.radius)
  rows = evaluation.subset(run.encoded['train'], a.calibration_rows, seed=run.config.seed)
  if softmax_target(run.config):
    soft = _calibrate_softmax(run, stage, params, rows)
    lam, ranges, grad_h = soft['lam'], soft['ranges'], soft['grad_h']
  else:
    inputs = evaluation.pooled_keys(run.inputs_fn, params, rows, paths, run.sharder,
                                    run.config)
    labels = np.asarray(rows.labels, np.int32)
    weights = np.ones(len(labels), np.float32)
    forces = jax.jit(lambda p, lam: training.phase_a_forces(
        p, inputs, labels, weights, only=only, **objective_settings(run.config, lam)))
    unit = forces(params, 1.0)
    lam = _relative_lam(a, unit['repulsion'], unit['alignment'])
    ranges = training.phase_a_potential_range(
        jax.random.fold_in(stage_key(run, stage), _PROBE_KEY), params, inputs, labels,
        feature_map=run.config.model.feature_map, radius=a.radius, num_probes=NUM_PROBES,
        only=only)
    ranges = {'/'.join(p): [float(x) for x in np.asarray(v)] for p, v in ranges.items()}
    grad_h = forces(params, lam)['hamiltonian'] if lam != 1.0 else unit['hamiltonian']
  median_range = float(np.median(np.concatenate([np.asarray(v) for v in ranges.values()])))
  beta = ld.tilt_beta(median_range, a.gibbs_tilt) if a.gibbs_tilt else float(a.beta)
  step_size = (ld.relative_step_size(grad_h, fraction=a.relative_step, radius=a.radius,
                                     clip_norm=a.clip_norm)
               if a.relative_step else float(a.step_size))
  return {'step_size': step_size, 'beta': beta, 'lam': lam, 'potential_range': ranges,
          'median_potential_range': median_range}


def _relative_lam(a, repulsion, data) -> float:
  """λ: ``phase_a.lam``, or by ``relative_lam`` from the forces (no repulsion force, e.g.
  r^−s underflowing at s = 62 on a ball of radius 12: one ``cli.ConfigError``)."""
  if not a.relative_lam:
    return float(a.lam)
  try:
    return ld.relative_lam(repulsion, data, a.relative_lam)
  except ValueError as e:
    raise cli.ConfigError(
        f'phase_a.relative_lam={a.relative_lam}: no repulsion force to scale at the stage '
        f'start ({e}) with phase_a.riesz_s={a.riesz_s!r} and phase_a.radius={a.radius}: '
        'r^-s underflows for particles this far apart; use phase_a.riesz_s=0.0 (log) or a '
        'smaller s, or a fixed phase_a.lam with relative_lam=0.') from None
