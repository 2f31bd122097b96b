#!/bin/bash
# Issue 27 item 7: does stronger repulsion keep the particles apart on Rotten Tomatoes?
# Resumable (experiments.grid skips finished runs); ~65 min on one core. Then:
#   python -m experiments.phase_a_repulsion --runs=workdir/repulsion
set -e
cd "$(dirname "$0")/.."
export COULOMB_JAX_DATA=${COULOMB_JAX_DATA:-../shared/data}
PY=${PYTHON:-.venv/bin/python}
COMMON="--config.phase_a.schedule=after_b --config.phase_a.after_b_epochs=3 --config.phase_b.num_epochs=5 --config.phase_a.num_epochs=2 --config.phase_a.relative_step=0.01 --config.phase_a.gibbs_tilt=1000.0"
R=workdir/repulsion
# Vanilla-X (the shared Phase B prefix) and Ball-X.
$PY -m experiments.grid --dataset=rotten_tomatoes --variants=vanilla-elu,vanilla-favor,ball-elu,ball-favor --seeds=0,1 --workdir=$R/base --prefix_root=$R/base -- $COMMON --config.phase_a.relative_lam=1.0 --config.phase_a.riesz_s=0.0
for setting in lam1_log:1.0:0.0 lam10_log:10.0:0.0 lam100_log:100.0:0.0 lam1_coulomb:1.0:coulomb; do
  IFS=: read name lam s <<< "$setting"
  $PY -m experiments.grid --dataset=rotten_tomatoes --variants=kernel-elu,kernel-favor --seeds=0,1 --workdir=$R/$name --prefix_root=$R/base -- $COMMON --config.phase_a.relative_lam=$lam --config.phase_a.riesz_s=$s
done
echo ALL DONE
