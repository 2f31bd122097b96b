#!/bin/bash
# Issue 27 item 7: does stronger repulsion keep the particles apart on Rotten Tomatoes?
# Issue 24: and what does Phase A on the softmax target do inside the same encoders?
# Resumable (experiments.grid skips finished runs); ~65 min on one core for the repulsion
# part, ~25 min for the softmax part. Then:
#   python -m studies.phase_a_repulsion --runs=$SETTINGS_DIR
#   python -m studies.phase_a_repulsion.softmax --runs=workdir/repulsion
# SETTINGS_DIR (default workdir/repulsion): where the repulsion settings' Kernel-X runs go;
# they continue the Phase B prefixes of workdir/repulsion/base either way (a rerun of the
# settings in a fresh folder keeps the earlier runs).
set -e
cd "$(dirname "$0")/../.."
export COULOMB_JAX_DATA=${COULOMB_JAX_DATA:-../shared/data}
PY=${PYTHON:-.venv/bin/python}
COMMON="--config.phase_a.schedule=after_b --config.phase_a.after_b_epochs=3 --config.phase_b.num_epochs=5 --config.phase_a.num_epochs=2 --config.phase_a.relative_step=0.01 --config.phase_a.gibbs_tilt=1000.0"
R=workdir/repulsion
S=${SETTINGS_DIR:-$R}
# Vanilla-X (the shared Phase B prefix) and Ball-X.
$PY -m experiments.grid --dataset=rotten_tomatoes --variants=vanilla-elu,vanilla-favor,ball-elu,ball-favor --seeds=0,1 --workdir=$R/base --prefix_root=$R/base -- $COMMON --config.phase_a.relative_lam=1.0 --config.phase_a.riesz_s=0.0
if [ "$S" != "$R" ]; then mkdir -p "$S" && ln -sfn "$(realpath --relative-to="$S" "$R/base")" "$S/base"; fi
for setting in lam1_log:1.0:0.0 lam1_coulomb:1.0:coulomb lam10_log:10.0:0.0 lam100_log:100.0:0.0; do
  IFS=: read name lam s <<< "$setting"
  $PY -m experiments.grid --dataset=rotten_tomatoes --variants=kernel-elu,kernel-favor --seeds=0,1 --workdir=$S/$name --prefix_root=$R/base -- $COMMON --config.phase_a.relative_lam=$lam --config.phase_a.riesz_s=$s
done
# The softmax target (phase_a.target=softmax), repulsion at 1x: on the paper's ball (radius
# 1.5, Coulomb s = D - 2) and on the radius the mimicry study needs (12; the N(0, I) draw, of
# norm ~8 in D_h = 64, lies inside it, so there Ball-X is Vanilla-X). At radius 12 the
# Coulomb force r^-62 underflows to 0 in float32 (one error), so that setting uses the log.
for setting in softmax_coulomb:1.5:coulomb softmax_log_r12:12.0:0.0; do
  IFS=: read name radius s <<< "$setting"
  $PY -m experiments.grid --dataset=rotten_tomatoes --variants=kernel-elu,kernel-favor --seeds=0,1 --workdir=$R/$name --prefix_root=$R/base -- $COMMON --config.phase_a.relative_lam=1.0 --config.phase_a.riesz_s=$s --config.phase_a.target=softmax --config.phase_a.radius=$radius
done
echo ALL DONE
