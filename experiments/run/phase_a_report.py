"""``results.json['phase_a']``: a run's Phase A stage summaries (``phase_a_stages.json``,
written by ``experiments.run.phase_a``) and their aggregates."""

import os
from typing import Optional

import numpy as np

from coulomb_jax import diagnostics
from coulomb_jax import langevin_diagnostics as ld
from experiments.run import run_folder
from experiments.run import run_identity

STAGES_FILE = run_identity.STAGES


def phase_a_report(workdir: str) -> Optional[dict]:
  """``results.json['phase_a']``: the stage summaries and their aggregates (None if none).

  ``drift_to_noise`` / ``repulsion_to_alignment``: medians over every particle and
  step of every stage (the stages' histograms added); held-out statistics: means
  over the stages (``heldout_alignment`` and ``heldout_centered_alignment``; for the
  softmax target ``heldout_kl`` and ``target: 'softmax'``); ``gibbs_tilt`` and
  displacements: medians over the stages; ``diversity``: each statistic of
  ``diagnostics.particle_diversity`` for the initial, ball and learned particles, the
  mean over stages, layers and heads (per head in each stage's ``diversity``).
  """
  path = os.path.join(workdir, STAGES_FILE)
  if not os.path.exists(path):
    return None
  stages = [s for _, s in sorted(run_folder.read_json(path).items(), key=lambda kv: int(kv[0]))]
  hist = {k: ld.LogHistogram(counts=np.sum([s['histograms'][k] for s in stages], axis=0))
          for k in ('drift_to_noise', 'repulsion_to_alignment')}
  which = [k for k in ('initial', 'ball', 'ball_own_keys', 'learned', 'null')
           if all(k in s['heldout'] for s in stages)]
  mean = lambda k, stat: float(np.mean([s['heldout'][k][stat] for s in stages]))
  med = lambda field: float(np.median([s[field] for s in stages]))
  report = {'drift_to_noise': hist['drift_to_noise'].median(),
            'repulsion_to_alignment': hist['repulsion_to_alignment'].median(),
            'gibbs_tilt': med('gibbs_tilt'), 'displacement': med('displacement'),
            'random_walk_displacement': med('random_walk_displacement'),
            'inside_fraction': float(np.mean([s['inside_fraction'] for s in stages]))}
  if 'kl' in stages[0]['heldout'][which[0]]:       # The softmax target (stage 'target').
    report.update(target='softmax', heldout_kl={k: mean(k, 'kl') for k in which})
  else:
    report.update(heldout_alignment={k: mean(k, 'alignment') for k in which},
                  heldout_centered_alignment={k: mean(k, 'centered_alignment')
                                              for k in which})
  if 'diversity' in stages[0]:      # stage files written before the diversity had none
    report['diversity'] = {
        name: {stat: float(np.mean([x for s in stages for head in s['diversity'][name].values()
                                    for x in head[stat]]))
               for stat in diagnostics.DIVERSITY_STATISTICS}
        for name in ('initial', 'ball', 'learned')}
  report['stages'] = [{k: v for k, v in s.items() if k != 'histograms'} for s in stages]
  return report
